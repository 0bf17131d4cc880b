//! The broker's share of serving, without the relay: a bare lapin publisher that sends the
//! relay's exchange, at the offered rate, the persistent messages the relay would send for
//! those events (same size and properties, confirms awaited), on a thread and a runtime of
//! its own. Beside the producers of the *broker-bare* state it makes the broker do on this
//! machine, with its CPU and its disk, what relaying their inserts makes it do.

use anyhow::Context as _;
use lapin::options::ConfirmSelectOptions;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Between two batches: what became due is sent at once, as a claim's rows are.
const BATCH_EVERY: Duration = Duration::from_millis(5);

/// A running publisher; [`Publisher::finish`] stops it.
pub(super) struct Publisher {
    stop: oneshot::Sender<()>,
    done: oneshot::Receiver<anyhow::Result<()>>,
}

impl Publisher {
    /// Publishes `rate` messages/s of `body_bytes` bytes to `exchange` until stopped.
    pub(super) fn start(exchange: String, rate: u64, body_bytes: usize) -> anyhow::Result<Self> {
        let (stop, stopped) = oneshot::channel();
        let (sender, done) = oneshot::channel();
        std::thread::Builder::new()
            .name("broker-load".into())
            .spawn(move || {
                let result = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .context("cannot start the broker load's runtime")
                    .and_then(|runtime| {
                        runtime.block_on(publish(exchange, rate, body_bytes, stopped))
                    });
                let _ = sender.send(result);
            })
            .context("cannot start the broker load's thread")?;
        Ok(Self { stop, done })
    }

    /// Stops it once every message sent is confirmed.
    pub(super) async fn finish(self) -> anyhow::Result<()> {
        let _ = self.stop.send(());
        self.done
            .await
            .context("the broker load's thread ended without a result")?
    }
}

async fn publish(
    exchange: String,
    rate: u64,
    body_bytes: usize,
    mut stopped: oneshot::Receiver<()>,
) -> anyhow::Result<()> {
    let connection = crate::baseline::connect().await?;
    let channel = connection.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let body = vec![b'x'; body_bytes];
    let started = Instant::now();
    let mut sent: u64 = 0;
    let mut tick = tokio::time::interval(BATCH_EVERY);
    let published = async {
        loop {
            tokio::select! {
                _ = &mut stopped => break,
                _ = tick.tick() => {}
            }
            let due = (started.elapsed().as_secs_f64() * rate as f64) as u64;
            let mut confirms = Vec::new();
            while sent < due {
                let n = i64::try_from(sent).unwrap_or(i64::MAX);
                confirms.push(crate::baseline::publish(&channel, &exchange, &body, n).await?);
                sent += 1;
            }
            for confirm in confirms {
                crate::baseline::expect_ack(Some(confirm)).await?;
            }
        }
        anyhow::Ok(())
    }
    .await;
    let _ = connection.close(200, "done".into()).await;
    published
}
