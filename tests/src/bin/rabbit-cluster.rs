//! `rabbit-cluster`: a three-node RabbitMQ cluster of its own on this machine, beside its
//! broker (`outbox_tests::rabbit_cluster`), for running `outbox-bench` against a quorum
//! queue (BENCHMARKS.md, "A quorum queue on a cluster"). Run it as root: the nodes run as
//! the `rabbitmq` user. With `OUTBOX_TEST_RABBITMQ_SERVER` and `OUTBOX_TEST_RABBITMQCTL`
//! set as `scripts/test` sets them, its nodes are RabbitMQ 4 (`scripts/rabbitmq4`).
//!
//! ```sh
//! cargo run -p outbox-tests --bin rabbit-cluster     # prints OUTBOX_BENCH_AMQP_URL=…
//! # in another terminal, with the line it printed:
//! OUTBOX_BENCH_AMQP_URL=… OUTBOX_BENCH_QUEUE_TYPE=quorum cargo run --release -p outbox-bench -- \
//!     drain --backend postgres --events 50000 --rooms 1000
//! ```
//!
//! Once the nodes are up it prints that one line (the nodes' URLs, comma-separated) and
//! keeps them until its standard input ends (Ctrl-D) or it gets SIGINT, SIGTERM or SIGHUP;
//! then it kills them and deletes their files. A signal while the nodes start is acted on
//! once they are up. Its standard input must stay open meanwhile: `&` in a script gives it
//! `/dev/null`, which ends it at once (run it as a `coproc`, or behind a pipe).

use outbox_tests::rabbit_cluster::RabbitCluster;
use std::io::Write as _;
use std::os::unix::fs::MetadataExt as _;
use std::process::ExitCode;
use tokio::signal::unix::{signal, SignalKind};

fn main() -> ExitCode {
    // The owner of /proc/self is the process's effective user.
    if !std::fs::metadata("/proc/self").is_ok_and(|me| me.uid() == 0) {
        eprintln!("rabbit-cluster: run it as root (it starts the nodes as the `rabbitmq` user)");
        return ExitCode::FAILURE;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    // Handled from here on: none of these signals ends the process before the nodes are
    // killed, not even one sent while they start.
    let stops = [
        SignalKind::interrupt(),
        SignalKind::terminate(),
        SignalKind::hangup(),
    ];
    let mut stops =
        runtime.block_on(async { stops.map(|kind| signal(kind).expect("a signal handler")) });
    let cluster = RabbitCluster::start(3);
    println!("OUTBOX_BENCH_AMQP_URL={}", cluster.urls().join(","));
    let _ = std::io::stdout().flush();
    let (ended, stdin_ended) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
        let _ = ended.send(());
    });
    runtime.block_on(async {
        let [interrupt, terminate, hangup] = &mut stops;
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
            _ = hangup.recv() => {}
            _ = stdin_ended => {}
        }
    });
    drop(cluster);
    eprintln!("rabbit-cluster: the nodes are killed and their files deleted");
    ExitCode::SUCCESS
}
