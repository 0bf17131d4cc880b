//! [`Publisher`]: publishes records on one confirm channel with many confirms in flight.

use crate::flight::Flight;
use crate::instruments::ConfirmTimes;
use crate::marker::Outcome;
use crate::waiters::Waiters;
use actix::prelude::*;
use outbox_core::{EventPublisher, Ordering, OutboxRecord, OutcomeKind, PublishError};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::warn;

/// Publish this record (from the Fetcher).
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct Publish(pub OutboxRecord);

/// `count` failures or releases of `key` are written: the key's hold shrinks by that
/// much (from the Fetcher, which forwards the Marker's [`crate::Marked`]).
#[derive(Message, Debug, Clone, PartialEq, Eq)]
#[rtype(result = "()")]
pub struct Unhold {
    /// The ordering key.
    pub key: String,
    /// Outcomes of the key now written.
    pub count: usize,
}

/// Finish what is in flight, release what has not started, then stop. Answered when done.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct Drain;

/// A publish's end, sent back by the flight.
struct Finished {
    /// The publish's start number.
    start: u64,
    /// The record, without its body once handed off.
    record: OutboxRecord,
    result: Result<(), PublishError>,
    /// From the start of the hand-off to the confirm.
    took: Duration,
}

/// One publisher of the pool: one confirm channel (the [`EventPublisher`] port), many
/// publishes in flight, carried by one task on the actor's thread (its `Flight`,
/// flight.rs) that reports each end through one stream of the actor
/// (docs/design/publishing.md#the-publisher-and-its-flight: why not `ctx.spawn`, why not a task per publish).
/// Under `per_room` ordering a key has one unconfirmed message at a time, and a failure
/// releases the key's waiting records and holds the key until [`Unhold`] says its
/// outcomes are written, so no later row overtakes them. See
/// docs/design/claims.md#the-per-room-rule.
pub struct Publisher {
    /// The confirm channel.
    port: Arc<dyn EventPublisher>,
    /// Where every outcome goes.
    marker: Recipient<Outcome>,
    /// Per-key order (`per_room`) or none.
    ordering: Ordering,
    /// Under `per_room`: keys with a publish in flight, and their waiting records.
    keys: HashMap<String, VecDeque<OutboxRecord>>,
    /// Under `per_room`: keys held back, with their failures and releases not yet written.
    held: HashMap<String, usize>,
    /// Publishes awaiting their confirm, by start number: their record without its
    /// body, and the body's size when claimed.
    in_flight: HashMap<u64, (OutboxRecord, usize)>,
    /// The task that carries them; started with the first publish.
    flight: Option<Flight<Finished>>,
    /// Where the flight reports each publish's end, and (until the actor starts) the
    /// stream the actor reads them from.
    finished: mpsc::UnboundedSender<Finished>,
    finishes: Option<mpsc::UnboundedReceiver<Finished>>,
    /// Start number of the next publish.
    next_start: u64,
    /// Set by [`Drain`]: answered once `in_flight` is empty.
    drained: Waiters,
    /// Draining: nothing new starts.
    draining: bool,
    /// How long a drain waits for the publishes in flight before it abandons them and
    /// releases their rows (`publish_timeout`: a publish held by a broker that blocks
    /// publishers has no deadline of its own). `None`: as long as they take.
    drain_limit: Option<Duration>,
    /// `outbox_publish_confirm_seconds`, `outbox_commit_to_confirm_seconds`.
    times: ConfirmTimes,
}

impl Publisher {
    /// A publisher of outbox `outbox` on `port`, reporting to `marker`.
    pub fn new(
        outbox: &str,
        port: Arc<dyn EventPublisher>,
        marker: Recipient<Outcome>,
        ordering: Ordering,
    ) -> Self {
        let (finished, finishes) = mpsc::unbounded_channel();
        Self {
            port,
            marker,
            ordering,
            keys: HashMap::new(),
            held: HashMap::new(),
            in_flight: HashMap::new(),
            flight: None,
            finished,
            finishes: Some(finishes),
            next_start: 0,
            drained: Waiters::default(),
            draining: false,
            drain_limit: None,
            times: ConfirmTimes::new(outbox),
        }
    }

    /// A drain waits at most `limit` for the publishes in flight, then abandons them and
    /// releases their rows: the shutdown bound, even while the broker blocks publishers.
    pub fn with_drain_limit(mut self, limit: Duration) -> Self {
        self.drain_limit = Some(limit);
        self
    }

    /// Tells the Marker what became of `record`, whose envelope was `bytes` long when
    /// claimed.
    fn report(&mut self, record: OutboxRecord, kind: OutcomeKind, bytes: usize) {
        if self.ordering == Ordering::PerRoom && kind != OutcomeKind::Published {
            *self.held.entry(record.key.clone()).or_default() += 1;
        }
        self.marker.do_send(Outcome {
            record,
            kind,
            bytes,
        });
    }

    /// [`Publisher::report`] for a record not attempted: given back to the table.
    fn release(&mut self, record: OutboxRecord) {
        let bytes = record.envelope.len();
        self.report(record, OutcomeKind::Released, bytes);
    }

    fn start(&mut self, record: OutboxRecord) {
        let start = self.next_start;
        self.next_start += 1;
        let port = Arc::clone(&self.port);
        let bytes = record.envelope.len();
        // What a drain needs to release the row if it abandons the publish: the record
        // without its body (the task owns that, and drops it once the broker's client has
        // its own copy).
        let kept = OutboxRecord {
            id: record.id,
            event_id: record.event_id.clone(),
            event_type: record.event_type.clone(),
            key: record.key.clone(),
            envelope: Vec::new(),
            headers: record.headers.clone(),
            retry_count: record.retry_count,
            created_at: record.created_at,
            columns: Vec::new(),
        };
        let leg = async move {
            let mut record = record;
            let handed_off = std::time::Instant::now();
            let result = match port.publish(&record).await {
                Ok(confirm) => {
                    // The broker's client has its own copy of the body now, and a row that
                    // fails is read again from the table: holding ours until the confirm
                    // would keep the bytes twice while large rows are in flight.
                    record.envelope = Vec::new();
                    confirm.await
                }
                Err(error) => Err(error),
            };
            Finished {
                start,
                record,
                result,
                took: handed_off.elapsed(),
            }
        };
        let finished = &self.finished;
        self.flight
            .get_or_insert_with(|| Flight::start(finished.clone()))
            .launch(leg);
        self.in_flight.insert(start, (kept, bytes));
    }

    /// The drain's limit passed: the publishes still in flight are abandoned (a broker that
    /// blocks publishers holds them) and their rows released, unchanged, for a later run.
    fn abandon(&mut self, ctx: &mut Context<Self>) {
        if self.in_flight.is_empty() {
            return;
        }
        warn!(
            abandoned = self.in_flight.len(),
            "publishes still unconfirmed when the shutdown's bound passed: abandoned, their rows released"
        );
        // Dropping the flight abandons every publish in it.
        self.flight = None;
        let abandoned: Vec<_> = self.in_flight.drain().map(|(_, entry)| entry).collect();
        for (record, bytes) in abandoned {
            self.keys.remove(&record.key);
            self.report(record, OutcomeKind::Released, bytes);
        }
        self.stop_if_drained(ctx);
    }

    fn finish(
        &mut self,
        record: OutboxRecord,
        bytes: usize,
        result: Result<(), PublishError>,
        ctx: &mut Context<Self>,
    ) {
        // Under `per_room`: the key's next record, or (failed: hold the key back;
        // draining; nothing waiting) the rest of the key, given back after this outcome
        // so that its next claim comes after it.
        let (next, rest) = match self.ordering {
            Ordering::None => (None, None),
            Ordering::PerRoom => {
                let next = match self.keys.get_mut(&record.key) {
                    Some(queue) if result.is_ok() && !self.draining => queue.pop_front(),
                    _ => None,
                };
                let rest = match next {
                    Some(_) => None,
                    None => self.keys.remove(&record.key),
                };
                (next, rest)
            }
        };
        self.report(
            record,
            match result {
                Ok(()) => OutcomeKind::Published,
                Err(error) => OutcomeKind::Failed(error),
            },
            bytes,
        );
        if let Some(next) = next {
            self.start(next);
        }
        for waiting in rest.unwrap_or_default() {
            self.release(waiting);
        }
        self.stop_if_drained(ctx);
    }

    fn stop_if_drained(&mut self, ctx: &mut Context<Self>) {
        if self.draining && self.in_flight.is_empty() {
            self.drained.answer(());
            ctx.stop();
        }
    }
}

impl Actor for Publisher {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        if let Some(mut finishes) = self.finishes.take() {
            ctx.add_stream(futures_lite::stream::poll_fn(move |cx| {
                finishes.poll_recv(cx)
            }));
        }
    }

    fn stopping(&mut self, _: &mut Self::Context) -> Running {
        // Confirms still due are outcomes the Marker must hear about.
        if !self.in_flight.is_empty() {
            Running::Continue
        } else {
            Running::Stop
        }
    }
}

impl StreamHandler<Finished> for Publisher {
    fn handle(&mut self, finished: Finished, ctx: &mut Self::Context) {
        let Finished {
            start,
            record,
            result,
            took,
        } = finished;
        let Some((_, bytes)) = self.in_flight.remove(&start) else {
            return; // abandoned by a drain meanwhile
        };
        if result.is_ok() {
            self.times.acked(took, record.created_at);
        }
        self.finish(record, bytes, result, ctx);
    }

    /// Never: the actor holds a sender of the stream itself.
    fn finished(&mut self, _: &mut Self::Context) {}
}

impl Handler<Publish> for Publisher {
    type Result = ();

    fn handle(&mut self, Publish(record): Publish, _: &mut Self::Context) {
        if self.draining || self.held.contains_key(&record.key) {
            self.release(record);
            return;
        }
        if self.ordering == Ordering::PerRoom {
            if let Some(queue) = self.keys.get_mut(&record.key) {
                queue.push_back(record);
                return;
            }
            self.keys.insert(record.key.clone(), VecDeque::new());
        }
        self.start(record);
    }
}

impl Handler<Unhold> for Publisher {
    type Result = ();

    fn handle(&mut self, Unhold { key, count }: Unhold, _: &mut Self::Context) {
        if let Some(held) = self.held.get_mut(&key) {
            *held = held.saturating_sub(count);
            if *held == 0 {
                self.held.remove(&key);
            }
        }
    }
}

impl Handler<Drain> for Publisher {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, _: Drain, ctx: &mut Self::Context) -> Self::Result {
        self.draining = true;
        let waiting: Vec<OutboxRecord> = self
            .keys
            .values_mut()
            .flat_map(|queue| queue.drain(..))
            .collect();
        for record in waiting {
            self.release(record);
        }
        let drained = self.drained.wait();
        if let Some(limit) = self.drain_limit {
            ctx.run_later(limit, Self::abandon);
        }
        self.stop_if_drained(ctx);
        drained
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fakes::{
        eventually, record, Barrier, Collector, FakePublisher, OutcomeList, Outcomes,
    };
    use std::time::Duration;

    fn publisher(port: Arc<FakePublisher>, ordering: Ordering) -> (Addr<Publisher>, Outcomes) {
        let (collector, outcomes) = Collector::start();
        let publisher =
            Publisher::new("room_outbox", port, collector.recipient(), ordering).start();
        (publisher, outcomes)
    }

    #[actix_rt::test]
    async fn an_outcome_carries_the_claimed_size_but_not_the_envelope() {
        let port = FakePublisher::failing(&["a2"]);
        let (publisher, outcomes) = publisher(Arc::clone(&port), Ordering::PerRoom);
        for id in 1..=3 {
            let mut record = record(id, "a");
            record.envelope = vec![b'x'; 1_000];
            publisher.do_send(Publish(record));
        }
        let seen = outcomes.wait_for(3, Duration::from_secs(5)).await;
        assert_eq!(seen.kind_of("a1"), "published");
        assert_eq!(seen.kind_of("a3"), "released");
        for outcome in &seen {
            assert_eq!(outcome.bytes, 1_000, "{}", outcome.record.event_id);
        }
        // Handed to the broker's client: let go of. Released: never handed over.
        assert!(seen[0].record.envelope.is_empty());
        assert_eq!(seen[2].record.envelope.len(), 1_000);
    }

    #[actix_rt::test]
    async fn failed_event_holds_back_its_key() {
        let port = FakePublisher::failing(&["a1"]);
        let (publisher, outcomes) = publisher(Arc::clone(&port), Ordering::PerRoom);
        for (id, key) in [(1, "a"), (2, "a"), (3, "a"), (4, "b"), (5, "b")] {
            publisher.do_send(Publish(record(id, key)));
        }
        let seen = outcomes.wait_for(5, Duration::from_secs(5)).await;
        assert_eq!(seen.kind_of("a1"), "failed");
        assert_eq!(seen.kind_of("a2"), "released");
        assert_eq!(seen.kind_of("a3"), "released");
        assert_eq!(seen.kind_of("b4"), "published");
        assert_eq!(seen.kind_of("b5"), "published");
        assert_eq!(
            port.attempted(),
            vec!["a1", "b4", "b5"],
            "held-back events never reach the broker"
        );
    }

    #[actix_rt::test]
    async fn a_failed_key_stays_held_until_its_outcomes_are_written() {
        let port = FakePublisher::failing(&["a1"]);
        let (publisher, outcomes) = publisher(Arc::clone(&port), Ordering::PerRoom);
        publisher.do_send(Publish(record(1, "a")));
        publisher.do_send(Publish(record(2, "a")));
        outcomes.wait_for(2, Duration::from_secs(5)).await;
        // Claimed before the failure was written: must not overtake a2.
        publisher.do_send(Publish(record(3, "a")));
        let seen = outcomes.wait_for(3, Duration::from_secs(5)).await;
        assert_eq!(seen.kind_of("a3"), "released");
        publisher.do_send(Unhold {
            key: "a".into(),
            count: 2,
        });
        publisher.do_send(Publish(record(4, "a")));
        let seen = outcomes.wait_for(4, Duration::from_secs(5)).await;
        assert_eq!(
            seen.kind_of("a4"),
            "released",
            "a3's release is not written yet"
        );
        publisher.do_send(Unhold {
            key: "a".into(),
            count: 2,
        });
        publisher.do_send(Publish(record(5, "a")));
        let seen = outcomes.wait_for(5, Duration::from_secs(5)).await;
        assert_eq!(
            seen.kind_of("a5"),
            "published",
            "everything written: the key moves on"
        );
        assert_eq!(port.attempted(), vec!["a1", "a5"]);
    }

    #[actix_rt::test]
    async fn a_key_has_one_unconfirmed_message_at_a_time() {
        let port = FakePublisher::held();
        let (publisher, outcomes) = publisher(Arc::clone(&port), Ordering::PerRoom);
        for (id, key) in [(1, "a"), (2, "a"), (3, "b")] {
            publisher.do_send(Publish(record(id, key)));
        }
        port.wait_for_attempts(2, Duration::from_secs(5)).await;
        assert_eq!(
            port.attempted(),
            vec!["a1", "b3"],
            "a2 waits for a1's confirm"
        );
        port.confirm_all();
        port.wait_for_attempts(3, Duration::from_secs(5)).await;
        assert_eq!(
            port.attempted(),
            vec!["a1", "b3", "a2"],
            "a2 goes once a1 is confirmed"
        );
        port.confirm_all();
        let seen = outcomes.wait_for(3, Duration::from_secs(5)).await;
        assert_eq!(seen.ids_with("published").len(), 3);
    }

    #[actix_rt::test]
    async fn without_ordering_a_failure_holds_nothing_back() {
        let port = FakePublisher::failing(&["a1"]);
        let (publisher, outcomes) = publisher(Arc::clone(&port), Ordering::None);
        for (id, key) in [(1, "a"), (2, "a"), (3, "a")] {
            publisher.do_send(Publish(record(id, key)));
        }
        let seen = outcomes.wait_for(3, Duration::from_secs(5)).await;
        assert_eq!(seen.kind_of("a1"), "failed");
        assert_eq!(seen.kind_of("a2"), "published");
        assert_eq!(seen.kind_of("a3"), "published");
    }

    #[actix_rt::test]
    async fn drain_finishes_in_flight_publishes_and_releases_the_rest() {
        let port = FakePublisher::held();
        let (publisher, outcomes) = publisher(Arc::clone(&port), Ordering::PerRoom);
        for (id, key) in [(1, "a"), (2, "a"), (3, "b")] {
            publisher.do_send(Publish(record(id, key)));
        }
        port.wait_for_attempts(2, Duration::from_secs(5)).await;
        let drained = publisher.send(Drain);
        let seen = outcomes.wait_for(1, Duration::from_secs(5)).await;
        assert_eq!(
            seen.kind_of("a2"),
            "released",
            "not started, so given back at once"
        );
        port.confirm_all();
        drained.await.expect("drain answered");
        let seen = outcomes.wait_for(3, Duration::from_secs(5)).await;
        assert_eq!(seen.ids_with("published"), vec!["a1", "b3"]);
        eventually("the publisher to stop", Duration::from_secs(5), || {
            !publisher.connected()
        })
        .await;
    }

    #[actix_rt::test]
    async fn drain_abandons_publishes_held_past_its_limit_and_releases_their_rows() {
        // A broker that blocks publishers holds them with no deadline: the fake never
        // confirms unless told to.
        let port = FakePublisher::held();
        let (collector, outcomes) = Collector::start();
        let publisher = Publisher::new(
            "room_outbox",
            Arc::clone(&port) as Arc<dyn EventPublisher>,
            collector.clone().recipient(),
            Ordering::PerRoom,
        )
        .with_drain_limit(Duration::from_millis(200))
        .start();
        for (id, key) in [(1, "a"), (2, "a"), (3, "b")] {
            publisher.do_send(Publish(record(id, key)));
        }
        port.wait_for_attempts(2, Duration::from_secs(5)).await;
        let asked = std::time::Instant::now();
        tokio::time::timeout(Duration::from_secs(5), publisher.send(Drain))
            .await
            .expect("the drain ends at its limit")
            .expect("drain answered");
        assert!(
            asked.elapsed() >= Duration::from_millis(200),
            "waited for the limit"
        );
        let seen = outcomes.wait_for(3, Duration::from_secs(5)).await;
        assert_eq!(
            seen.ids_with("released").first().map(String::as_str),
            Some("a2"),
            "not started: released at the drain's start"
        );
        for id in ["a1", "a2", "b3"] {
            assert_eq!(seen.kind_of(id), "released", "{id}: released, not failed");
        }
        port.confirm_all();
        eventually("the publisher to stop", Duration::from_secs(5), || {
            !publisher.connected()
        })
        .await;
        // The publisher has stopped; once the collector answers the barrier, every
        // outcome it sent is counted.
        collector.send(Barrier).await.expect("collector answers");
        assert_eq!(outcomes.now().len(), 3, "a late confirm adds no outcome");
    }
}
