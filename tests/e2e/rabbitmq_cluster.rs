//! A real RabbitMQ cluster: three nodes started by the test beside the machine's broker
//! (`outbox_tests::rabbit_cluster`), a quorum queue bound to the relay's exchange, a
//! producer inserting over 200 rooms throughout, and a fault a cluster operator meets,
//! with the queue's leader on the node struck or elsewhere. Each asserts every committed
//! event in the queue, first deliveries in room order, duplicates within the in-flight
//! window, and publishing going on within 2 s of a bare client's being able to (2.5 s
//! where the relay's own node stops confirming: the relay leaves it after one
//! `publish_timeout`, 2 s here).

use futures_lite::StreamExt as _;
use lapin::options::{
    BasicConsumeOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ConnectionProperties, ExchangeKind};
use outbox_tests::bare_publisher::{self, BarePublisher};
use outbox_tests::rabbit_cluster::RabbitCluster;
use outbox_tests::{unique_name, Backend, Load, Received, RelayProcess, TestApp};
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

/// How long the queue must stay quiet before it counts as drained.
const SETTLE: Duration = Duration::from_secs(2);

/// A stretch without a confirm that a phase lists: with 1,000 events/s inserted over 200
/// rooms, the relay marks confirms every few milliseconds.
const NOTABLE_PAUSE: Duration = Duration::from_millis(500);

/// Declares a durable topic `exchange` and a quorum `queue` bound to it for every key,
/// through the node at `url`.
async fn quorum_queue(url: &str, exchange: &str, queue: &str) {
    let connection = Connection::connect(url, ConnectionProperties::default())
        .await
        .expect("the cluster's first node");
    let channel = connection.create_channel().await.expect("a channel");
    let durable = ExchangeDeclareOptions {
        durable: true,
        ..ExchangeDeclareOptions::default()
    };
    channel
        .exchange_declare(
            exchange.into(),
            ExchangeKind::Topic,
            durable,
            FieldTable::default(),
        )
        .await
        .expect("the exchange");
    let mut arguments = FieldTable::default();
    arguments.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    let options = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .queue_declare(queue.into(), options, arguments)
        .await
        .expect("the quorum queue");
    channel
        .queue_bind(
            queue.into(),
            exchange.into(),
            "#".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("the binding");
    let _ = connection.close(200, "declared".into()).await;
}

/// Everything in `queue`, read through the node at `url` until it stays quiet for
/// [`SETTLE`], in arrival order.
async fn drain(url: &str, queue: &str) -> Vec<Received> {
    let connection = Connection::connect(url, ConnectionProperties::default())
        .await
        .expect("a live node");
    let channel = connection.create_channel().await.expect("a channel");
    let mut consumer = channel
        .basic_consume(
            queue.into(),
            "e2e-drain".into(),
            BasicConsumeOptions {
                no_ack: true,
                ..BasicConsumeOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("consuming");
    let mut received = Vec::new();
    while let Ok(Some(delivery)) = tokio::time::timeout(SETTLE, consumer.next()).await {
        received.push(Received::from(&delivery.expect("a delivery")));
    }
    let _ = connection.close(200, "drained".into()).await;
    received
}

/// Where a fault strikes: the relay's connection, and the quorum queue.
struct Target {
    connection_name: String,
    queue: String,
}

impl Target {
    /// The node the relay is connected to, once it is connected to one and the cluster
    /// lists no other connection of the relay's (one it left on a node that stopped
    /// answering closes once that node answers again).
    fn relays_node(&self, cluster: &RabbitCluster) -> usize {
        settled(
            "the relay has one connection, to a node of the cluster",
            Duration::from_secs(30),
            || cluster.connected_node(&self.connection_name),
        )
    }

    /// The relay's node, having moved the queue's leadership to it (`leads`) or away from
    /// it, to the node after it.
    fn relays_node_leading(&self, cluster: &RabbitCluster, leads: bool) -> usize {
        let node = self.relays_node(cluster);
        let leader = match leads {
            true => node,
            false => (node + 1) % cluster.nodes.len(),
        };
        cluster.lead(&self.queue, leader);
        node
    }

    /// The node leading the queue, once it has a leader (asked of node `asked`).
    fn leader(&self, cluster: &RabbitCluster, asked: usize) -> usize {
        settled(
            "the quorum queue has a leader",
            Duration::from_secs(30),
            || cluster.leader(&self.queue, asked),
        )
    }
}

/// What `answer` gives once it gives something, asked again every 100 ms until `deadline`
/// (a reconnection or a leader election under way answers nothing for a moment).
fn settled<T>(what: &str, deadline: Duration, mut answer: impl FnMut() -> Option<T>) -> T {
    let until = std::time::Instant::now() + deadline;
    loop {
        if let Some(found) = answer() {
            return found;
        }
        assert!(
            std::time::Instant::now() < until,
            "{what}: not within {deadline:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A fault a cluster operator meets, run off the test's runtime (its steps are blocking
/// `rabbitmqctl` calls): what it struck.
type Fault = fn(&RabbitCluster, &Target) -> Struck;

/// The node a fault struck, whether it led the quorum queue then, and when.
struct Struck {
    node: usize,
    led: bool,
    at: chrono::DateTime<chrono::Utc>,
}

/// What one fault cost, from the queue drained after it.
struct Phase {
    events: usize,
    deliveries: usize,
    lost: Vec<String>,
    violations: Vec<String>,
    /// Deliveries of this phase's events already delivered.
    duplicates: usize,
    /// Copies of earlier phases' events that a fault stranded on a node and that the queue
    /// took only after that phase's drain: their phase's duplicates, outside this phase's
    /// order.
    late: Vec<String>,
    /// The longest stretch without a confirm, from the fault until the phase's last event
    /// was published: how long the fault stopped publishing. (The first confirm of an
    /// event inserted after the fault would count the backlog queued ahead of it in its
    /// room too, which on a loaded machine outlasts the fault by tens of seconds.)
    paused: Duration,
    /// Every stretch without a confirm of [`NOTABLE_PAUSE`] or more, as (its start after
    /// the fault, its length): where a long pause came from, when one fails the bound.
    pauses: Vec<(Duration, Duration)>,
    /// The longest stretch without a confirm of a bare client's publishes over the same
    /// time: how long the cluster itself took no message from a client that reconnects.
    bare_paused: Duration,
    /// Events inserted before the fault and published after it: the backlog it met.
    behind: usize,
    /// Events whose publish failed (unconfirmed in time, on a connection that dropped,
    /// nacked) and that were published later, by kind: `last_error` stays on a published
    /// row.
    retried: BTreeMap<&'static str, usize>,
    /// The most attempts one event was counted (`retry_count`): none of these faults is an
    /// event's own failure, so a nack, a timeout or a lost channel must count none.
    attempts: i32,
    /// Whether that node led the quorum queue when the phase's fault began.
    led: bool,
}

/// The relay publishing a producer's events through the cluster: once 500 of this phase
/// are published, `fault` runs, the producer inserts 1,500 more, and the queue is drained
/// (through the first node that answers) once every event is published. A bare client
/// publishes to the queue throughout.
async fn phase(
    app: &TestApp,
    cluster: &Arc<RabbitCluster>,
    queue: &str,
    name: &'static str,
    fault: Fault,
) -> Phase {
    let target = Target {
        connection_name: format!("outbox-relay {}", app.settings.relay.node_id),
        queue: queue.to_owned(),
    };
    let load = Load::named(name, &app.database, 200, Duration::from_millis(200));
    let ours = |row: &outbox_store::OutboxRow| of_phase(&row.event_id, name);
    outbox_tests::eventually("500 events published", Duration::from_secs(60), || async {
        let rows = app.database.rows().await;
        rows.iter()
            .filter(|row| ours(row) && row.status == "published")
            .count()
            >= 500
    })
    .await;
    let bare = BarePublisher::start(cluster.urls(), queue.to_owned());
    let on = Arc::clone(cluster);
    let Struck {
        node: struck,
        led,
        at: faulted_at,
    } = actix_rt::task::spawn_blocking(move || fault(&on, &target))
        .await
        .expect("the fault ran");
    let inserted = load.inserted();
    outbox_tests::eventually(
        "1,500 more events inserted",
        Duration::from_secs(60),
        || std::future::ready(load.inserted() >= inserted + 1_500),
    )
    .await;
    drop(load);
    app.database
        .wait_all_published(Duration::from_secs(90))
        .await;

    let rows: Vec<_> = app.database.rows().await.into_iter().filter(ours).collect();
    let last_confirm = rows.iter().filter_map(|row| row.published_at).max();
    let bare_paused = bare.paused(faulted_at, last_confirm.unwrap_or(faulted_at));
    drop(bare);
    // `published_at` is when the confirm was marked: a confirm received just before the
    // fault may be marked just after it, which only moves the pause's start.
    let mut confirms: Vec<Duration> = (rows.iter())
        .filter_map(|row| (row.published_at? - faulted_at).to_std().ok())
        .filter(|since| !since.is_zero())
        .collect();
    confirms.sort_unstable();
    assert!(
        !confirms.is_empty(),
        "{name}: nothing published after the fault"
    );
    // Each stretch without a confirm: its start after the fault, its length.
    let gaps: Vec<(Duration, Duration)> = (confirms.into_iter())
        .scan(Duration::ZERO, |last, at| {
            let start = std::mem::replace(last, at);
            Some((start, at - start))
        })
        .collect();
    let mut received = drain_any(cluster, queue).await;
    received.retain(|message| message.app_id != bare_publisher::APP_ID);
    let (mine, late): (Vec<_>, Vec<_>) =
        (received.into_iter()).partition(|message| of_phase(&message.message_id, name));
    let received = mine;
    let order = outbox_tests::room_order(&received);
    let delivered: HashSet<&str> = received.iter().map(|r| r.message_id.as_str()).collect();
    let phase = Phase {
        events: rows.len(),
        deliveries: received.len(),
        lost: (rows.iter())
            .filter(|row| !delivered.contains(row.event_id.as_str()))
            .map(|row| row.event_id.clone())
            .collect(),
        violations: order.violations,
        duplicates: order.duplicates,
        late: late.into_iter().map(|message| message.message_id).collect(),
        paused: gaps.iter().map(|(_, gap)| *gap).max().unwrap_or_default(),
        pauses: (gaps.into_iter())
            .filter(|(_, gap)| *gap >= NOTABLE_PAUSE)
            .collect(),
        bare_paused,
        behind: (rows.iter())
            .filter(|row| row.created_at <= faulted_at)
            .filter(|row| row.published_at.is_some_and(|at| at > faulted_at))
            .count(),
        retried: (rows.iter())
            .filter_map(|row| row.last_error.as_deref())
            .fold(BTreeMap::new(), |mut kinds, error| {
                *kinds.entry(failure_kind(error)).or_insert(0) += 1;
                kinds
            }),
        attempts: rows.iter().map(|row| row.retry_count).max().unwrap_or(0),
        led,
    };
    eprintln!(
        "{name} (node {struck}, leading the queue: {}): {} events, {} deliveries, {} lost, \
         {} out of order, {} duplicates ({} late copies of earlier phases'), failed publishes retried {:?} (at most {} attempts \
         counted on one), publishing paused at most {:?} (pauses from the fault: {:?}; a bare \
         client's at most {:?}), {} events behind at the fault",
        phase.led,
        phase.events,
        phase.deliveries,
        phase.lost.len(),
        phase.violations.len(),
        phase.duplicates,
        phase.late.len(),
        phase.retried,
        phase.attempts,
        phase.paused,
        phase.pauses,
        phase.bare_paused,
        phase.behind
    );
    phase
}

/// Whether `event_id` is one of phase `name`'s (`{name}-{tick}-{room}`), not of a phase
/// whose name begins with it.
fn of_phase(event_id: &str, name: &str) -> bool {
    (event_id.strip_prefix(name))
        .and_then(|rest| rest.strip_prefix('-'))
        .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
}

/// The kind of a publish failure from its `last_error` (`PublishError`'s messages).
fn failure_kind(error: &str) -> &'static str {
    match error {
        _ if error.starts_with("no confirm") => "timeout",
        _ if error.starts_with("nacked") => "nacked",
        _ if error.starts_with("broker channel error") => "channel",
        _ => "other",
    }
}

/// Everything in `queue`, through the first node of `cluster` that answers.
async fn drain_any(cluster: &RabbitCluster, queue: &str) -> Vec<Received> {
    for node in &cluster.nodes {
        if Connection::connect(&node.url(), ConnectionProperties::default())
            .await
            .is_ok()
        {
            return drain(&node.url(), queue).await;
        }
    }
    panic!("no node of the cluster answers");
}

/// `kill -9` of the relay's node, not leading the queue, then started again.
fn kill_9(cluster: &RabbitCluster, target: &Target) -> Struck {
    let node = target.relays_node_leading(cluster, false);
    let at = chrono::Utc::now();
    cluster.kill(node);
    cluster.restart(node);
    Struck {
        node,
        led: false,
        at,
    }
}

/// `kill -9` of node `node`, kept down for `down` (the fault itself), then started again;
/// when the kill struck.
fn kill_9_kept_down(cluster: &RabbitCluster, node: usize, down: Duration) -> Struck {
    let at = chrono::Utc::now();
    cluster.kill(node);
    std::thread::sleep(down);
    cluster.restart(node);
    Struck {
        node,
        led: true,
        at,
    }
}

/// `kill -9` of the relay's node while it leads the quorum queue, kept down 20 s: the
/// other two elect a leader, and publishing goes on through them without waiting for the
/// killed node's return.
fn kill_9_the_leader_kept_down(cluster: &RabbitCluster, target: &Target) -> Struck {
    let node = target.relays_node_leading(cluster, true);
    kill_9_kept_down(cluster, node, Duration::from_secs(20))
}

/// `kill -9` of the node leading the quorum queue while the relay is on another, kept down
/// 10 s.
fn kill_9_the_leader_elsewhere(cluster: &RabbitCluster, target: &Target) -> Struck {
    let relays = target.relays_node_leading(cluster, false);
    kill_9_kept_down(
        cluster,
        target.leader(cluster, relays),
        Duration::from_secs(10),
    )
}

/// A graceful stop of the node leading the quorum queue, then started again.
fn stop_the_leader(cluster: &RabbitCluster, target: &Target) -> Struck {
    let leader = target.leader(cluster, target.relays_node(cluster));
    let at = chrono::Utc::now();
    cluster.stop(leader);
    cluster.restart(leader);
    Struck {
        node: leader,
        led: true,
        at,
    }
}

/// The relay's node (leading the queue: `leads`) hangs for 15 s (suspended): its
/// connections stay open, nothing answers. Not leading, the relay moves on to another node,
/// and the pause counts from the hang. Leading, nobody can publish to the queue meanwhile
/// (RabbitMQ replaces a leader it cannot reach only once it counts the node as gone, after
/// more than 15 s), so the pause counts from the node's resumption: how long publishing
/// takes to go on once the cluster can take messages again.
fn hang_15s_leading(cluster: &RabbitCluster, target: &Target, leads: bool) -> Struck {
    let node = target.relays_node_leading(cluster, leads);
    cluster.suspend(node);
    let hung = chrono::Utc::now();
    // The fault itself: the node stays hung this long.
    std::thread::sleep(Duration::from_secs(15));
    cluster.resume(node);
    Struck {
        node,
        led: leads,
        at: if leads { chrono::Utc::now() } else { hung },
    }
}

/// [`hang_15s_leading`] of the relay's node, another leading the queue.
fn hang_15s(cluster: &RabbitCluster, target: &Target) -> Struck {
    hang_15s_leading(cluster, target, false)
}

/// [`hang_15s_leading`] of the relay's node leading the queue.
fn hang_the_leader_15s(cluster: &RabbitCluster, target: &Target) -> Struck {
    hang_15s_leading(cluster, target, true)
}

/// The relay's node (leading the queue: `leads`) cut off from the other two: its
/// distribution traffic dropped, its AMQP listener open, so the relay's publishes there go
/// unconfirmed (the queue's majority is on the other side). Under `pause_minority` the
/// node pauses once it counts the others gone (18 to 30 s), closing its clients'
/// connections; then the partition heals and it runs again.
fn partition_leading(cluster: &RabbitCluster, target: &Target, leads: bool) -> Struck {
    let node = target.relays_node_leading(cluster, leads);
    cluster.partition(node);
    // From the moment the cut is complete: `tc` takes a few milliseconds to set it up,
    // during which publishes still go through.
    let at = chrono::Utc::now();
    settled(
        "the cut-off node pauses (pause_minority)",
        Duration::from_secs(60),
        || (!cluster.takes_clients(node)).then_some(()),
    );
    cluster.heal();
    cluster.await_running(node);
    Struck {
        node,
        led: leads,
        at,
    }
}

/// [`partition_leading`] of the relay's node, another leading the queue.
fn partition(cluster: &RabbitCluster, target: &Target) -> Struck {
    partition_leading(cluster, target, false)
}

/// [`partition_leading`] of the relay's node leading the queue.
fn partition_the_leader(cluster: &RabbitCluster, target: &Target) -> Struck {
    partition_leading(cluster, target, true)
}

/// Every node stopped and started again, one at a time, as in an upgrade.
fn rolling_restart(cluster: &RabbitCluster, target: &Target) -> Struck {
    let led = target.leader(cluster, target.relays_node(cluster)) == 0;
    let at = chrono::Utc::now();
    for node in 0..cluster.nodes.len() {
        cluster.stop(node);
        cluster.restart(node);
    }
    Struck { node: 0, led, at }
}

/// A fault and what the docs promise of it.
struct Case {
    name: &'static str,
    fault: Fault,
    /// The longest publishing may pause after the fault, unless a bare client paused
    /// longer: the cluster itself took no message meanwhile.
    pauses_at_most: Duration,
    /// How much longer than a bare client's the relay's pause may be.
    behind_a_bare_client: Duration,
    /// Whether the relay's publishes in flight are certain to go unconfirmed.
    strands_publishes: bool,
}

/// How much longer than a bare client's the relay's pause may be, mostly: a bare client
/// publishes on a new channel each time; the relay replaces a channel after three nacks in a
/// row, and probes one on a new channel every half second while nothing is confirmed.
const BEHIND_A_BARE_CLIENT: Duration = Duration::from_secs(2);

/// The same where the relay's own node stops confirming (hung, or cut off from the
/// queue's leader): the relay leaves it once its publishes get no confirm within
/// `publish_timeout` (2 s here), while a bare client may have been on another node.
const BEHIND_ON_A_SILENT_NODE: Duration = Duration::from_millis(2_500);

const CASES: [Case; 9] = [
    Case {
        name: "kill-9",
        fault: kill_9,
        pauses_at_most: Duration::from_secs(5),
        behind_a_bare_client: BEHIND_A_BARE_CLIENT,
        strands_publishes: false,
    },
    // The relay reconnects to another node at once, before the election: nacks until a
    // new channel knows the new leader (docs/design/broker.md#nacks).
    Case {
        name: "kill-9-leader-kept-down",
        fault: kill_9_the_leader_kept_down,
        pauses_at_most: Duration::from_secs(5),
        // Events arrive 200 at a time every 200 ms: the kill may fall between two.
        behind_a_bare_client: BEHIND_A_BARE_CLIENT,
        strands_publishes: false,
    },
    Case {
        name: "kill-9-leader-elsewhere",
        fault: kill_9_the_leader_elsewhere,
        pauses_at_most: Duration::from_secs(5),
        behind_a_bare_client: BEHIND_A_BARE_CLIENT,
        strands_publishes: false,
    },
    Case {
        name: "leader-stop",
        fault: stop_the_leader,
        pauses_at_most: Duration::from_secs(5),
        behind_a_bare_client: BEHIND_A_BARE_CLIENT,
        strands_publishes: false,
    },
    // Three publish timeouts (2 s, in flight together), then the next node.
    Case {
        name: "hang-15s",
        fault: hang_15s,
        pauses_at_most: Duration::from_secs(5),
        behind_a_bare_client: BEHIND_ON_A_SILENT_NODE,
        strands_publishes: true,
    },
    // Counted from the node's resumption (see `hang_15s_leading`).
    Case {
        name: "hang-the-leader-15s",
        fault: hang_the_leader_15s,
        pauses_at_most: Duration::from_secs(5),
        behind_a_bare_client: BEHIND_A_BARE_CLIENT,
        strands_publishes: false,
    },
    Case {
        name: "partition",
        fault: partition,
        pauses_at_most: Duration::from_secs(5),
        behind_a_bare_client: BEHIND_ON_A_SILENT_NODE,
        strands_publishes: true,
    },
    // The leader cut off is replaced by an election on the majority side, which
    // publishes through the other nodes wait for (8 to 10 s measured,
    // docs/operations/rabbitmq-cluster.md).
    Case {
        name: "partition-of-the-leader",
        fault: partition_the_leader,
        pauses_at_most: Duration::from_secs(12),
        behind_a_bare_client: BEHIND_ON_A_SILENT_NODE,
        strands_publishes: true,
    },
    Case {
        name: "rolling-restart",
        fault: rolling_restart,
        pauses_at_most: Duration::from_secs(5),
        behind_a_bare_client: BEHIND_A_BARE_CLIENT,
        strands_publishes: false,
    },
];

#[actix_rt::test]
async fn node_loss_leader_stop_hang_partition_and_rolling_restart_lose_nothing() {
    let cluster = Arc::new(
        actix_rt::task::spawn_blocking(|| RabbitCluster::start(3))
            .await
            .expect("the cluster starts"),
    );
    let exchange = unique_name("e2e.cluster");
    let queue = unique_name("e2e.quorum");
    quorum_queue(&cluster.nodes[0].url(), &exchange, &queue).await;
    let urls = cluster.urls().join(",");
    let app = TestApp::on(Backend::Postgres)
        .settings(|settings| {
            settings.amqp.url = urls;
            settings.amqp.exchange = exchange.clone();
            settings.relay.publish_timeout = "2s".into();
        })
        .build()
        .await;
    let window = 4 * app.settings.relay.batch_size as usize;
    let relay = RelayProcess::spawn(crate::RELAY, &app.settings);

    // Each phase's duplicates, its late copies counted once they arrive.
    let mut duplicates: BTreeMap<&str, usize> = BTreeMap::new();
    let count_late = |duplicates: &mut BTreeMap<&str, usize>, late: &[String]| {
        for event_id in late {
            let case = (CASES.iter())
                .find(|case| of_phase(event_id, case.name))
                .unwrap_or_else(|| panic!("{event_id}: of no phase"));
            *duplicates.entry(case.name).or_default() += 1;
        }
    };
    for case in CASES {
        let name = case.name;
        let phase = phase(&app, &cluster, &queue, name, case.fault).await;
        *duplicates.entry(name).or_default() += phase.duplicates;
        count_late(&mut duplicates, &phase.late);
        assert!(
            phase.lost.is_empty(),
            "{name}: lost {:?}",
            &phase.lost[..phase.lost.len().min(5)]
        );
        assert!(
            phase.violations.is_empty(),
            "{name}: {:?}",
            phase.violations.first()
        );
        assert_eq!(
            phase.attempts, 0,
            "{name}: a nack, a timeout or a lost channel counted as an event's attempt"
        );
        // Publishes the cluster could not confirm were retried, not marked published (an
        // event marked without reaching the queue would be counted lost above).
        assert!(
            !case.strands_publishes || !phase.retried.is_empty(),
            "{name}: no publish failed, so the fault struck none in flight"
        );
        outbox_tests::assert_within(
            &format!(
                "{name}: publishing paused (a bare client's {:?})",
                phase.bare_paused
            ),
            phase.paused,
            case.pauses_at_most.max(phase.bare_paused),
        );
        outbox_tests::assert_within(
            &format!(
                "{name}: publishing paused beyond a bare client's {:?}",
                phase.bare_paused
            ),
            phase.paused.saturating_sub(phase.bare_paused),
            case.behind_a_bare_client,
        );
    }
    relay.stop(Duration::from_secs(30)).await;
    // Whatever is left is a late copy: every event was delivered in its phase.
    let left: Vec<String> = (drain_any(&cluster, &queue).await.into_iter())
        .filter(|message| message.app_id != bare_publisher::APP_ID)
        .map(|message| message.message_id)
        .collect();
    eprintln!("{} late copies after the last phase", left.len());
    count_late(&mut duplicates, &left);
    eprintln!("duplicates by phase, late copies included: {duplicates:?}");
    for case in CASES {
        let name = case.name;
        let copies = duplicates.get(name).copied().unwrap_or(0);
        assert!(
            copies <= window,
            "{name}: {copies} duplicates, more than the in-flight window of {window}"
        );
    }
    app.teardown().await;
}
