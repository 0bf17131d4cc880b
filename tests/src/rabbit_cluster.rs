//! A RabbitMQ cluster of the test's own: nodes on this machine beside its broker, each
//! with its own node name, AMQP and distribution ports, data and log directories, run as
//! the `rabbitmq` user (whose Erlang cookie they share), clustered with `join_cluster`,
//! and stopped and deleted when dropped, also when the test fails. The machine's own
//! broker is not touched. Where `OUTBOX_TEST_RABBITMQ_SERVER` names another
//! `rabbitmq-server` (`scripts/rabbitmq4 server`, RabbitMQ 4), the nodes are started with
//! it, as the caller, and `OUTBOX_TEST_RABBITMQCTL` is the `rabbitmqctl` that reaches them
//! (`services::rabbitmq_server_command`). Its own settings file (the machine's pins the
//! listener to 5672) lets `guest` in from loopback only, as RabbitMQ's default does,
//! handles partitions by `pause_minority`, and counts a silent peer as gone after 18 to
//! 30 s (`net_ticktime` 24 s, against 45 to 75 s by default), so that a partition
//! completes within a test.
//!
//! A partition ([`RabbitCluster::partition`]) drops one node's distribution traffic on the
//! loopback interface with `tc` (root, `CAP_NET_ADMIN`): each node connects to the others
//! from a loopback address of its own, so its traffic is told apart by address and port.

use crate::output::stderr;
use crate::{unique_name, OutputInTime as _};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How long a node may take to start (about 15 s on this machine; more under load).
const START_DEADLINE: Duration = Duration::from_secs(90);

/// One node.
#[derive(Debug)]
pub struct RabbitNode {
    /// `rabbit-…@localhost`.
    pub name: String,
    /// Its AMQP port on 127.0.0.1.
    pub amqp_port: u16,
    /// Its Erlang distribution port.
    dist_port: u16,
    /// The loopback address it connects to the other nodes from.
    dist_from: Ipv4Addr,
    /// Its settings, data and logs.
    dir: PathBuf,
}

/// Three (or more) clustered nodes.
#[derive(Debug)]
pub struct RabbitCluster {
    /// The nodes, the first the one the others joined.
    pub nodes: Vec<RabbitNode>,
    /// Whether [`RabbitCluster::partition`] holds now (healed when dropped).
    partitioned: AtomicBool,
}

/// A port nothing listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

/// Runs `rabbitmqctl -n node args`; its stdout, or the failure's output.
pub fn rabbitmqctl_on(node: &str, args: &[&str]) -> Result<String, String> {
    let output = crate::services::rabbitmqctl_command()
        .args(["-n", node])
        .args(args)
        .output_in_time()
        .map_err(|error| format!("rabbitmqctl runs: {error}"))?;
    match output.status.success() {
        true => Ok(String::from_utf8_lossy(&output.stdout).into_owned()),
        false => Err(format!(
            "rabbitmqctl -n {node} {args:?}: {}",
            stderr(&output)
        )),
    }
}

impl RabbitNode {
    fn new(prefix: &str, n: usize) -> Self {
        let name = format!("{prefix}-{n}@localhost");
        let dir = std::env::temp_dir().join(format!("{prefix}-{n}"));
        Self {
            name,
            amqp_port: free_port(),
            dist_port: free_port(),
            dist_from: Ipv4Addr::new(127, 0, 0, 10 + n as u8),
            dir,
        }
    }

    /// Its AMQP URL as `guest`.
    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.amqp_port)
    }

    /// Writes its settings and starts it, detached; [`RabbitNode::await_startup`] waits.
    fn launch(&self) {
        for sub in ["mnesia", "log"] {
            std::fs::create_dir_all(self.dir.join(sub)).expect("node directories");
        }
        std::fs::write(
            self.dir.join("rabbitmq.conf"),
            format!(
                "listeners.tcp.local = 127.0.0.1:{}\n\
                 cluster_partition_handling = pause_minority\n\
                 net_ticktime = 24\n",
                self.amqp_port
            ),
        )
        .expect("node settings");
        std::fs::write(self.dir.join("enabled_plugins"), "").expect("no plugins");
        let dir = self.dir.display();
        let variables = [
            ("RABBITMQ_NODENAME", self.name.clone()),
            ("RABBITMQ_CONFIG_FILE", format!("{dir}/rabbitmq")),
            (
                "RABBITMQ_ENABLED_PLUGINS_FILE",
                format!("{dir}/enabled_plugins"),
            ),
            ("RABBITMQ_MNESIA_BASE", format!("{dir}/mnesia")),
            ("RABBITMQ_LOG_BASE", format!("{dir}/log")),
            ("RABBITMQ_DIST_PORT", self.dist_port.to_string()),
            (
                "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS",
                format!(
                    "-kernel inet_dist_connect_options [{{ip,{{{}}}}}]",
                    self.dist_from
                        .octets()
                        .map(|octet| octet.to_string())
                        .join(",")
                ),
            ),
        ];
        let mut server = match crate::services::rabbitmq_server_command() {
            Some(mut server) => {
                server.envs(variables);
                server
            }
            None => {
                // The machine's broker runs as `rabbitmq`, whose cookie the machine's
                // `rabbitmqctl` uses: so do these nodes.
                let chown = Command::new("chown")
                    .args(["-R", "rabbitmq:rabbitmq"])
                    .arg(&self.dir)
                    .output_in_time()
                    .expect("chown runs");
                assert!(chown.status.success(), "chown: {}", stderr(&chown));
                let mut server = Command::new("runuser");
                server
                    .args(["-u", "rabbitmq", "--", "env", "HOME=/var/lib/rabbitmq"])
                    .args(variables.map(|(name, value)| format!("{name}={value}")))
                    .arg("rabbitmq-server");
                server
            }
        };
        let output = server
            .arg("-detached")
            .output_in_time()
            .expect("rabbitmq-server runs (RabbitMQ's package installed, run as root)");
        assert!(
            output.status.success(),
            "rabbitmq-server {}: {}",
            self.name,
            stderr(&output)
        );
    }

    /// Waits until it has started (it registers with epmd a moment after `-detached`).
    fn await_startup(&self) {
        let until = Instant::now() + START_DEADLINE;
        loop {
            match rabbitmqctl_on(&self.name, &["await_startup", "--timeout", "30"]) {
                Ok(_) => return,
                Err(error) if Instant::now() > until => {
                    panic!(
                        "node {} did not start within {START_DEADLINE:?}: {error}",
                        self.name
                    )
                }
                Err(_) => std::thread::sleep(Duration::from_millis(500)),
            }
        }
    }

    /// Sends `signal` to its runtime's process.
    fn signal(&self, pid: u32, signal: &str) {
        Command::new("kill")
            .args([&format!("-{signal}"), &pid.to_string()])
            .succeeds("procps");
    }
}

impl RabbitCluster {
    /// Starts `size` nodes and clusters them. Blocking: call it off the test's runtime
    /// (`spawn_blocking`) if a proxy the nodes need runs there.
    pub fn start(size: usize) -> Self {
        let prefix = unique_name("rabbit-e2e").replace('_', "-");
        let nodes: Vec<RabbitNode> = (1..=size).map(|n| RabbitNode::new(&prefix, n)).collect();
        let cluster = Self {
            nodes,
            partitioned: AtomicBool::new(false),
        };
        for node in &cluster.nodes {
            node.launch();
        }
        for node in &cluster.nodes {
            node.await_startup();
        }
        let first = cluster.nodes[0].name.clone();
        for node in &cluster.nodes[1..] {
            for args in [
                vec!["stop_app"],
                vec!["join_cluster", first.as_str()],
                vec!["start_app"],
            ] {
                rabbitmqctl_on(&node.name, &args).unwrap_or_else(|error| panic!("{error}"));
            }
        }
        cluster
    }

    /// Every node's URL as `guest`, in order: what `amqp.url` takes.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RabbitNode::url).collect()
    }

    /// The index of the node where the one connection named `connection_name` is open (by
    /// the port it came in on: `list_connections` lists the whole cluster's), asked of the
    /// first node that answers. `None` while there is none, or more than one: a connection
    /// the client left on a node that stopped answering stays listed until that node
    /// closes it, and the client is then on another node.
    pub fn connected_node(&self, connection_name: &str) -> Option<usize> {
        let listing = self.nodes.iter().find_map(|node| {
            rabbitmqctl_on(
                &node.name,
                &["list_connections", "port", "client_properties", "-s"],
            )
            .ok()
        })?;
        let mut named = (listing.lines()).filter(|line| line.contains(connection_name));
        let (Some(line), None) = (named.next(), named.next()) else {
            return None;
        };
        let port: u16 = line.split_whitespace().next()?.parse().ok()?;
        self.nodes.iter().position(|node| node.amqp_port == port)
    }

    /// `kill -9` of node `index`'s runtime.
    pub fn kill(&self, index: usize) {
        let node = &self.nodes[index];
        node.signal(node.pid_from_file().expect("the node's pid file"), "KILL");
    }

    /// Starts node `index` again (after [`RabbitCluster::kill`] or a stop), on its own data.
    pub fn restart(&self, index: usize) {
        let node = &self.nodes[index];
        node.launch();
        node.await_startup();
    }

    /// A graceful stop of node `index`.
    pub fn stop(&self, index: usize) {
        let node = &self.nodes[index];
        rabbitmqctl_on(&node.name, &["stop"]).unwrap_or_else(|error| panic!("{error}"));
    }

    /// Suspends node `index`'s runtime (`SIGSTOP`): it keeps its connections open and
    /// answers nothing, as a stalled VM or a long pause would.
    pub fn suspend(&self, index: usize) {
        let node = &self.nodes[index];
        node.signal(node.pid_from_file().expect("the node's pid file"), "STOP");
    }

    /// Resumes a node [`RabbitCluster::suspend`] stopped.
    pub fn resume(&self, index: usize) {
        let node = &self.nodes[index];
        node.signal(node.pid_from_file().expect("the node's pid file"), "CONT");
    }

    /// Moves the leadership of quorum queue `queue` (vhost `/`) to node `index`, as
    /// RabbitMQ's own maintenance mode moves it off a node, and waits until it leads.
    pub fn lead(&self, queue: &str, index: usize) {
        let node = &self.nodes[index];
        let moved = rabbitmqctl_on(
            &node.name,
            &[
                "eval",
                &format!(
                    "{{ok, Q}} = rabbit_amqqueue:lookup(rabbit_misc:r(<<\"/\">>, queue, \
                     <<\"{queue}\">>)), rabbit_quorum_queue:transfer_leadership(Q, node())."
                ),
            ],
        );
        let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while self.leader(queue, index) != Some(index) {
            assert!(
                std::time::Instant::now() < until,
                "node {index} does not lead {queue} 30 s after the transfer ({moved:?})"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    /// The index of the node that leads quorum queue `queue`, asked of node `asked`.
    pub fn leader(&self, queue: &str, asked: usize) -> Option<usize> {
        let listing = rabbitmqctl_on(
            &self.nodes[asked].name,
            &["list_queues", "name", "leader", "-s"],
        )
        .ok()?;
        let leader = (listing.lines())
            .find_map(|line| line.strip_prefix(queue)?.split_whitespace().next())?
            .to_owned();
        self.nodes.iter().position(|node| node.name == leader)
    }
}

impl RabbitCluster {
    /// Cuts node `index` off from the others: every packet to or from its distribution
    /// port or the address it connects to them from is dropped, until
    /// [`RabbitCluster::heal`]. Its AMQP listener still takes clients, as a minority
    /// node's does until it notices and pauses. `rabbitmqctl` cannot reach it meanwhile.
    pub fn partition(&self, index: usize) {
        let node = &self.nodes[index];
        let before = tc(&["qdisc", "show", "dev", "lo"]);
        assert!(
            before.contains("noqueue"),
            "the loopback interface has a queueing discipline that a partition would replace: {before}"
        );
        self.partitioned.store(true, Ordering::SeqCst);
        // Everything through a class as fast as loopback, but what matches a filter through
        // one with no room in its queue.
        tc(&[
            "qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb", "default", "1",
        ]);
        for (class, rate) in [("1:1", "100gbit"), ("1:2", "8bit")] {
            tc(&[
                "class", "add", "dev", "lo", "parent", "1:", "classid", class, "htb", "rate", rate,
            ]);
        }
        tc(&[
            "qdisc", "add", "dev", "lo", "parent", "1:2", "pfifo", "limit", "0",
        ]);
        let port = node.dist_port.to_string();
        let address = format!("{}/32", node.dist_from);
        for (field, value) in [
            ("sport", &port),
            ("dport", &port),
            ("src", &address),
            ("dst", &address),
        ] {
            let mask: &[&str] = if field.ends_with("port") {
                &["0xffff"]
            } else {
                &[]
            };
            let args = [
                &[
                    "filter", "add", "dev", "lo", "parent", "1:", "protocol", "ip", "prio", "1",
                ],
                &["u32", "match", "ip", field, value][..],
                mask,
                &["flowid", "1:2"],
            ]
            .concat();
            tc(&args);
        }
    }

    /// Ends a [`RabbitCluster::partition`]: the loopback interface as it was.
    pub fn heal(&self) {
        if self.partitioned.swap(false, Ordering::SeqCst) {
            tc(&["qdisc", "del", "dev", "lo", "root"]);
        }
    }

    /// Whether node `index` takes AMQP connections (a node paused by `pause_minority`, or
    /// stopped, refuses them).
    pub fn takes_clients(&self, index: usize) -> bool {
        let address = (Ipv4Addr::LOCALHOST, self.nodes[index].amqp_port).into();
        std::net::TcpStream::connect_timeout(&address, Duration::from_secs(1)).is_ok()
    }

    /// Waits until node `index` runs again (after a pause, a stop or a restart).
    pub fn await_running(&self, index: usize) {
        self.nodes[index].await_startup();
    }
}

/// Runs `tc args` (iproute2, as root); its stdout.
fn tc(args: &[&str]) -> String {
    Command::new("tc")
        .args(args)
        .succeeds("iproute2; a partition needs root and CAP_NET_ADMIN")
}

impl RabbitNode {
    /// Its runtime's process id from the pid file it writes at start, if it runs.
    fn pid_from_file(&self) -> Option<u32> {
        let file = self.dir.join("mnesia").join(format!("{}.pid", self.name));
        std::fs::read_to_string(file).ok()?.trim().parse().ok()
    }
}

impl Drop for RabbitCluster {
    /// Heals a partition, kills every node (resumed first, should one be suspended) and
    /// deletes its files: nothing of theirs is worth a graceful stop, and a stop could wait
    /// on a hung node.
    fn drop(&mut self) {
        if self.partitioned.swap(false, Ordering::SeqCst) {
            crate::succeeds_quietly_within(
                Command::new("tc").args(["qdisc", "del", "dev", "lo", "root"]),
                Duration::from_secs(5),
            );
        }
        for node in &self.nodes {
            if let Some(pid) = node.pid_from_file() {
                for signal in ["-CONT", "-KILL"] {
                    crate::succeeds_quietly_within(
                        Command::new("kill").args([signal, &pid.to_string()]),
                        Duration::from_secs(5),
                    );
                }
            }
        }
        for node in &self.nodes {
            let _ = std::fs::remove_dir_all(&node.dir);
        }
    }
}
