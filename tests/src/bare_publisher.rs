//! [`BarePublisher`]: what a plain client could publish through a cluster during a fault,
//! beside the relay, so that a test holds the relay's pause to the cluster's own rather
//! than to a number picked for the machine.

use chrono::{DateTime, Utc};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Confirmation, Connection, ConnectionProperties};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The `app_id` of its messages, for a reader of the queue to leave them out.
pub const APP_ID: &str = "bare-publisher";

/// How long it waits for a confirm before it takes the node for lost: the relay's
/// `publish_timeout` in the cluster test.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(2);

/// Between two publishes: a pause is known to within this.
const EVERY: Duration = Duration::from_millis(20);

/// One message at a time to a queue, each awaiting its confirm; on a nack, a timeout or a
/// lost connection it connects again, to the next node of its list, as a client with a
/// list of nodes would. Stops when dropped.
pub struct BarePublisher {
    /// When each confirm arrived.
    acked: Arc<Mutex<Vec<DateTime<Utc>>>>,
    running: Rc<AtomicBool>,
}

impl BarePublisher {
    /// Starts publishing to `queue` (through the default exchange), through `urls` in turn.
    pub fn start(urls: Vec<String>, queue: String) -> Self {
        let acked: Arc<Mutex<Vec<DateTime<Utc>>>> = Arc::default();
        let running = Rc::new(AtomicBool::new(true));
        let (recording, going) = (Arc::clone(&acked), Rc::clone(&running));
        actix_rt::spawn(async move {
            let mut next = 0;
            while going.load(Ordering::SeqCst) {
                let url = &urls[next % urls.len()];
                next += 1;
                let connecting = Connection::connect(url, ConnectionProperties::default());
                let Ok(Ok(connection)) = tokio::time::timeout(CONFIRM_TIMEOUT, connecting).await
                else {
                    continue;
                };
                while going.load(Ordering::SeqCst) && publish(&connection, &queue).await {
                    recording.lock().unwrap().push(Utc::now());
                    tokio::time::sleep(EVERY).await;
                }
                // A hung node may never answer the close.
                let closing = connection.close(200, "next node".into());
                let _ = tokio::time::timeout(Duration::from_millis(200), closing).await;
            }
        });
        Self { acked, running }
    }

    /// The longest stretch without a confirm between `from` and `until`.
    pub fn paused(&self, from: DateTime<Utc>, until: DateTime<Utc>) -> Duration {
        let acked = self.acked.lock().unwrap();
        let mut last = from;
        let mut longest = chrono::Duration::zero();
        for &at in acked.iter().filter(|at| **at > from && **at <= until) {
            longest = longest.max(at - last);
            last = at;
        }
        longest = longest.max(until - last);
        longest.to_std().unwrap_or_default()
    }
}

/// One publish and its confirm on a channel of `connection`: whether it was acked in time.
async fn publish(connection: &Connection, queue: &str) -> bool {
    let attempt = async {
        let channel = connection.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        let confirm = channel
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                b"bare",
                BasicProperties::default().with_app_id(APP_ID.into()),
            )
            .await?
            .await?;
        let _ = channel.close(200, "published".into()).await;
        Ok::<_, lapin::Error>(matches!(confirm, Confirmation::Ack(None)))
    };
    matches!(
        tokio::time::timeout(CONFIRM_TIMEOUT, attempt).await,
        Ok(Ok(true))
    )
}

impl Drop for BarePublisher {
    fn drop(&mut self) {
        self.running.store(false, Ordering::SeqCst);
    }
}
