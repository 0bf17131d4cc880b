//! `outbox-relay demo`: seed synthetic room events and relay them, with progress and a
//! summary. A temporary queue bound to the exchange receives what the relay publishes, so
//! the summary measures the whole path: producer insert → relay → broker → consumer.

use crate::cli::DemoArgs;
use crate::settings::Config;
use crate::startup::{open_broker, open_store, start_relay};
use anyhow::{bail, Context as _};
use futures_lite::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use outbox_amqp::{Tap, TapQueue};
use outbox_core::OutboxStore;
use outbox_store::{insert_events, NewEvent};
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Rows per producer transaction.
const SEED_BATCH: u64 = 100;
const EVENT_TYPES: [&str; 3] = [
    "room.message.posted",
    "room.member.joined",
    "room.topic.changed",
];

/// What the consumer saw.
#[derive(Debug, Default)]
pub struct DemoSummary {
    /// Events seeded.
    pub events: u64,
    /// Distinct events delivered.
    pub delivered: u64,
    /// Deliveries beyond the first of an event.
    pub duplicates: u64,
    /// First insert to last delivery.
    pub elapsed: Duration,
    /// Insert → delivery, sorted.
    pub latencies: Vec<Duration>,
}

impl DemoSummary {
    /// Events per second over the whole run.
    pub fn rate(&self) -> f64 {
        self.delivered as f64 / self.elapsed.as_secs_f64().max(f64::EPSILON)
    }

    /// The `q` quantile (0..=1) of the end-to-end latency.
    pub fn latency(&self, q: f64) -> Duration {
        if self.latencies.is_empty() {
            return Duration::ZERO;
        }
        let rank =
            ((q * self.latencies.len() as f64).ceil() as usize).clamp(1, self.latencies.len());
        self.latencies[rank - 1]
    }
}

/// Seeds `args.events` events over `args.rooms` rooms, relays them, prints a summary.
pub async fn demo(config: Config, args: DemoArgs) -> anyhow::Result<()> {
    if args.events == 0 || args.rooms == 0 {
        bail!("--events and --rooms must be at least 1");
    }
    if !matches!(config.amqp.exchange_type.as_str(), "topic" | "fanout") {
        bail!(
            "the demo binds a temporary queue with \"#\", which needs a topic or fanout exchange; amqp.exchange_type is {:?}",
            config.amqp.exchange_type
        );
    }
    let store = open_store(&config, config.database.migrate_on_start).await?;
    let broker = open_broker(&config).await?;

    let tap = Tap::declare(broker.open_channel().await?, TapQueue::Temporary)
        .await
        .context("cannot declare the demo's queue")?;
    for exchange in outbox_amqp::broker::exchanges(&config.amqp.router) {
        tap.bind(exchange, "#")
            .await
            .with_context(|| format!("cannot bind the demo's queue to exchange {exchange:?}"))?;
    }
    let mut consumer = tap.consume("outbox-relay-demo").await?;

    let run = format!("demo-{}", chrono::Utc::now().timestamp_millis());
    let inserted: Rc<RefCell<HashMap<String, Instant>>> = Rc::default();
    let progress = ProgressBar::new(args.events).with_style(
        ProgressStyle::with_template(
            "{spinner} relayed {pos}/{len} events [{bar:40}] {per_sec} {elapsed}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    let seeding = {
        let inserted = Rc::clone(&inserted);
        let db = store.connection().clone();
        let table = config.database.table.clone();
        let run = run.clone();
        let (events, rooms) = (args.events, args.rooms);
        let rate = if args.prefill { 0 } else { args.rate };
        // At a steady rate: a batch per tick, each tick's events inserted together.
        let batch_size = if rate == 0 {
            SEED_BATCH
        } else {
            (rate / 100).clamp(1, SEED_BATCH)
        };
        let mut ticks = (rate > 0).then(|| {
            let mut ticks =
                tokio::time::interval(Duration::from_secs_f64(batch_size as f64 / rate as f64));
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks
        });
        async move {
            let mut next = 0;
            while next < events {
                if let Some(ticks) = ticks.as_mut() {
                    ticks.tick().await;
                }
                let batch: Vec<NewEvent> = (next..(next + batch_size).min(events))
                    .map(|n| synthetic_event(&run, n, rooms))
                    .collect();
                let at = Instant::now();
                inserted
                    .borrow_mut()
                    .extend(batch.iter().map(|event| (event.event_id.clone(), at)));
                insert_events(&db, &table, &batch).await?;
                next += batch.len() as u64;
            }
            anyhow::Ok(())
        }
    };
    let (relay, started, seeder) = if args.prefill {
        seeding.await.context("seeding failed")?;
        // A backlog: measure from the relay's start, not from the inserts.
        let started = Instant::now();
        for at in inserted.borrow_mut().values_mut() {
            *at = started;
        }
        (start_relay(&config, &store, &broker).await?, started, None)
    } else {
        let relay = start_relay(&config, &store, &broker).await?;
        // Live traffic starts once the relay runs: the latency is the relay's, not its start's.
        (relay, Instant::now(), Some(actix_rt::spawn(seeding)))
    };

    let deadline = Duration::from_secs(60).max(Duration::from_millis(args.events * 10));
    let mut summary = DemoSummary {
        events: args.events,
        ..DemoSummary::default()
    };
    let mut seen = HashSet::new();
    let receiving = async {
        while summary.delivered < args.events {
            let Some(delivery) = consumer.next().await else {
                break;
            };
            let delivery = delivery?;
            let Some(id) = delivery
                .properties
                .message_id()
                .as_ref()
                .map(|id| id.to_string())
            else {
                continue;
            };
            let Some(at) = inserted.borrow().get(&id).copied() else {
                continue;
            };
            if seen.insert(id) {
                summary.latencies.push(at.elapsed());
                summary.delivered += 1;
                progress.inc(1);
            } else {
                summary.duplicates += 1;
            }
        }
        anyhow::Ok(())
    };
    let received = tokio::time::timeout(deadline, receiving).await;
    summary.elapsed = started.elapsed();
    progress.finish_and_clear();
    let seeded = match seeder {
        Some(seeder) => seeder.await.context("the seeding task failed")?,
        None => Ok(()),
    };

    relay.shutdown().await?;
    tap.close().await;
    broker.close().await;

    seeded.context("seeding failed")?;
    match received {
        Ok(result) => result.context("the demo's consumer failed")?,
        Err(_) => bail!(
            "only {} of {} events arrived within {:?}; see `outbox-relay status` and the log above",
            summary.delivered,
            args.events,
            deadline
        ),
    }
    summary.latencies.sort_unstable();
    let stats = store.stats().await?;
    say!(
        "demo: {} events over {} rooms relayed in {:.2} s: {:.0} events/s, end-to-end latency p50 {:.1} ms, p99 {:.1} ms, duplicates {}",
        summary.delivered,
        args.rooms,
        summary.elapsed.as_secs_f64(),
        summary.rate(),
        summary.latency(0.50).as_secs_f64() * 1e3,
        summary.latency(0.99).as_secs_f64() * 1e3,
        summary.duplicates,
    )?;
    say!(
        "outbox {}: {} published, {} pending, {} dead",
        config.database.table,
        stats.published,
        stats.pending,
        stats.dead
    )?;
    Ok(())
}

/// Event `n` of a demo run: rooms in turn, a ~512-byte JSON envelope.
fn synthetic_event(run: &str, n: u64, rooms: u64) -> NewEvent {
    let room_id = format!("room-{}", n % rooms);
    let event_type = EVENT_TYPES[(n % EVENT_TYPES.len() as u64) as usize];
    let event_id = format!("{run}-{n:08}");
    let mut envelope = format!(
        r#"{{"event_id":"{event_id}","room_id":"{room_id}","type":"{event_type}","seq":{n},"text":""#
    );
    let padding = 512usize.saturating_sub(envelope.len() + 2);
    envelope.push_str(&"x".repeat(padding));
    envelope.push_str("\"}");
    NewEvent {
        event_id,
        event_type: event_type.into(),
        room_id,
        envelope,
        headers: None,
        available_at: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_are_512_bytes_of_json() {
        let event = synthetic_event("demo-1", 42, 10);
        assert_eq!(event.envelope.len(), 512);
        assert_eq!(event.room_id, "room-2");
        assert!(event.envelope.starts_with('{') && event.envelope.ends_with('}'));
    }

    #[test]
    fn latency_quantiles_pick_by_rank() {
        let summary = DemoSummary {
            latencies: (1..=100).map(Duration::from_millis).collect(),
            ..DemoSummary::default()
        };
        assert_eq!(summary.latency(0.5), Duration::from_millis(50));
        assert_eq!(summary.latency(0.99), Duration::from_millis(99));
    }
}
