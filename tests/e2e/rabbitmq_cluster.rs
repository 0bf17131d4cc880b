//! A real RabbitMQ cluster: three nodes started by the test beside the machine's broker
//! (`outbox_tests::rabbit_cluster`), a quorum queue bound to the relay's exchange, a
//! producer inserting throughout, and a fault a cluster operator meets. Each asserts
//! every committed event in the queue, first deliveries in room order, duplicates within
//! the in-flight window, and publishing going on within seconds of the fault.

use futures_lite::StreamExt as _;
use lapin::options::{
    BasicConsumeOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ConnectionProperties, ExchangeKind};
use outbox_tests::rabbit_cluster::RabbitCluster;
use outbox_tests::{unique_name, Backend, Load, Received, RelayProcess, TestApp};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

/// How long the queue must stay quiet before it counts as drained.
const SETTLE: Duration = Duration::from_secs(2);

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
    /// The node the relay is connected to now.
    fn relays_node(&self, cluster: &RabbitCluster) -> usize {
        cluster
            .connected_node(&self.connection_name)
            .expect("the relay is connected to a node of the cluster")
    }
}

/// A fault a cluster operator meets, run off the test's runtime (its steps are blocking
/// `rabbitmqctl` calls): the node it struck and when.
type Fault = fn(&RabbitCluster, &Target) -> (usize, chrono::DateTime<chrono::Utc>);

/// What one fault cost, from the queue drained after it.
struct Phase {
    events: usize,
    deliveries: usize,
    lost: Vec<String>,
    violations: Vec<String>,
    duplicates: usize,
    /// From the fault to the first confirm of an event inserted after it began.
    resumed: Duration,
}

/// The relay publishing a producer's events through the cluster: once 500 of this phase
/// are published, `fault` runs, the producer inserts 1,500 more, and the queue is drained
/// (through the first node that answers) once every event is published.
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
    let load = Load::named(name, &app.database, 10, Duration::from_millis(10));
    let ours = |row: &outbox_store::OutboxRow| row.event_id.starts_with(name);
    outbox_tests::eventually("500 events published", Duration::from_secs(60), || async {
        let rows = app.database.rows().await;
        rows.iter()
            .filter(|row| ours(row) && row.status == "published")
            .count()
            >= 500
    })
    .await;
    let on = Arc::clone(cluster);
    let (struck, faulted_at) = actix_rt::task::spawn_blocking(move || fault(&on, &target))
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
    let resumed = (rows.iter())
        .filter(|row| row.created_at > faulted_at)
        .filter_map(|row| row.published_at)
        .min()
        .expect("events inserted after the fault were published");
    let received = drain_any(cluster, queue).await;
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
        resumed: (resumed - faulted_at).to_std().unwrap_or_default(),
    };
    eprintln!(
        "{name} (node {struck}): {} events, {} deliveries, {} lost, {} out of \
         order, {} duplicates, first confirm of a later event {:?} after the fault",
        phase.events,
        phase.deliveries,
        phase.lost.len(),
        phase.violations.len(),
        phase.duplicates,
        phase.resumed
    );
    phase
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

/// `kill -9` of the relay's node, then started again.
fn kill_9(cluster: &RabbitCluster, target: &Target) -> (usize, chrono::DateTime<chrono::Utc>) {
    let node = target.relays_node(cluster);
    let at = chrono::Utc::now();
    cluster.kill(node);
    cluster.restart(node);
    (node, at)
}

/// A graceful stop of the node leading the quorum queue, then started again.
fn stop_the_leader(
    cluster: &RabbitCluster,
    target: &Target,
) -> (usize, chrono::DateTime<chrono::Utc>) {
    let asked = target.relays_node(cluster);
    let leader = cluster
        .leader(&target.queue, asked)
        .expect("the queue's leader");
    let at = chrono::Utc::now();
    cluster.stop(leader);
    cluster.restart(leader);
    (leader, at)
}

/// The relay's node hangs for 15 s (suspended): its connections stay open, nothing
/// answers. The node must not lead the queue, whose publishes would wait for it wherever
/// the relay went (RabbitMQ replaces a leader it cannot reach only once it counts the
/// node as gone): a leader there is first moved by a restart.
fn hang_15s(cluster: &RabbitCluster, target: &Target) -> (usize, chrono::DateTime<chrono::Utc>) {
    let mut node = target.relays_node(cluster);
    if cluster.leader(&target.queue, node) == Some(node) {
        cluster.stop(node);
        cluster.restart(node);
        node = target.relays_node(cluster);
    }
    let at = chrono::Utc::now();
    cluster.suspend(node);
    // The fault itself: the node stays hung this long.
    std::thread::sleep(Duration::from_secs(15));
    cluster.resume(node);
    (node, at)
}

/// Every node stopped and started again, one at a time, as in an upgrade.
fn rolling_restart(cluster: &RabbitCluster, _: &Target) -> (usize, chrono::DateTime<chrono::Utc>) {
    let at = chrono::Utc::now();
    for node in 0..cluster.nodes.len() {
        cluster.stop(node);
        cluster.restart(node);
    }
    (0, at)
}

#[actix_rt::test]
async fn node_loss_leader_stop_hang_and_rolling_restart_lose_nothing() {
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

    let faults: [(&'static str, Fault, Duration); 4] = [
        ("kill-9", kill_9, Duration::from_secs(5)),
        ("leader-stop", stop_the_leader, Duration::from_secs(5)),
        // Three publish timeouts (2 s, in flight together), then the next node.
        ("hang-15s", hang_15s, Duration::from_secs(5)),
        ("rolling-restart", rolling_restart, Duration::from_secs(5)),
    ];
    for (name, fault, bound) in faults {
        let phase = phase(&app, &cluster, &queue, name, fault).await;
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
        assert!(
            phase.duplicates <= window,
            "{name}: {} duplicates, more than the in-flight window of {window}",
            phase.duplicates
        );
        outbox_tests::assert_within(&format!("{name}: publishing again"), phase.resumed, bound);
    }
    relay.stop(Duration::from_secs(30)).await;
    app.teardown().await;
}
