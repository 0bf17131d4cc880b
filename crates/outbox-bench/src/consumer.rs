//! The benchmark's consumer, a child process (`outbox-bench consume`) so that the CPU time
//! and peak memory measured in the parent are the relay's alone. It prints `ready` once its
//! queue is bound, then `done <delivered> <duplicates> <out_of_order>` and, when asked,
//! `t <n> <unix nanos>` per event; event `n` (the message id's suffix) is in room
//! `n % rooms` (`scenario::event`), so room order is checked with two flat arrays.

use crate::baseline::{connect, queue_type};
use anyhow::{bail, Context as _};
use clap::Args;
use futures_lite::StreamExt;
use outbox_amqp::tap::declare_topic_exchange;
use outbox_amqp::Tap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;

/// `consume` options (a hidden subcommand: the parent starts it).
#[derive(Debug, Args)]
pub struct ConsumeArgs {
    /// Exchange to bind to; the queue gets the same name (and `OUTBOX_BENCH_QUEUE_TYPE`'s
    /// type).
    #[arg(long)]
    queue: String,
    /// Events expected (ids 0..events).
    #[arg(long)]
    events: usize,
    /// Rooms they are spread over.
    #[arg(long)]
    rooms: usize,
    /// Print each event's delivery time.
    #[arg(long)]
    times: bool,
    /// Bind the queue, then wait for a line on stdin before consuming.
    #[arg(long)]
    hold: bool,
}

/// What the consumer saw.
#[derive(Debug, Default)]
pub struct Report {
    /// Distinct events delivered.
    pub delivered: usize,
    /// Deliveries of an event already seen.
    pub duplicates: usize,
    /// First deliveries that came after a later event of the same room.
    pub out_of_order: usize,
    /// Per event `n`, its delivery time in unix nanoseconds (when asked for).
    pub times: Vec<i64>,
}

/// Unix time in nanoseconds: comparable between the two processes of one machine.
pub fn unix_nanos() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// The child's side: consume until every event arrived, then report on stdout.
pub async fn run(args: ConsumeArgs) -> anyhow::Result<()> {
    let queue_type = queue_type()?;
    let connection = connect().await?;
    let channel = connection.create_channel().await?;
    let queue = args.queue.as_str();
    // The relay declares the same durable topic exchange; declaring it here too lets the
    // queue be bound before the relay starts, so no event can be missed.
    declare_topic_exchange(&channel, queue).await?;
    let tap = Tap::open(channel, queue_type.queue(queue.to_owned()), queue, "#").await?;
    if args.hold {
        println!("ready");
        std::io::stdout().flush()?;
        let mut go = String::new();
        std::io::stdin().read_line(&mut go)?;
    }
    let mut consumer = tap.consume("outbox-bench").await?;
    if !args.hold {
        println!("ready");
        std::io::stdout().flush()?;
    }

    let mut seen = vec![false; args.events];
    // Per room: 1 + the highest event delivered so far (0: none yet).
    let mut last = vec![0usize; args.rooms.max(1)];
    let mut report = Report {
        times: if args.times {
            vec![0; args.events]
        } else {
            Vec::new()
        },
        ..Report::default()
    };
    while report.delivered < args.events {
        let Some(delivery) = consumer.next().await else {
            bail!("the consumer's channel closed");
        };
        let delivery = delivery?;
        let n = delivery
            .properties
            .message_id()
            .as_ref()
            .and_then(|id| id.as_str().rsplit_once('-'))
            .and_then(|(_, n)| n.parse::<usize>().ok())
            .filter(|&n| n < args.events);
        let Some(n) = n else { continue };
        if seen[n] {
            report.duplicates += 1;
            continue;
        }
        seen[n] = true;
        report.delivered += 1;
        if args.times {
            report.times[n] = unix_nanos();
        }
        let room = &mut last[n % args.rooms.max(1)];
        if n + 1 < *room {
            report.out_of_order += 1;
        } else {
            *room = n + 1;
        }
    }
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    writeln!(
        out,
        "done {} {} {}",
        report.delivered, report.duplicates, report.out_of_order
    )?;
    for (n, at) in report.times.iter().enumerate() {
        writeln!(out, "t {n} {at}")?;
    }
    out.flush()?;
    drop(out);
    tap.close().await;
    let _ = connection.close(200, "done".into()).await;
    Ok(())
}

/// When the consumer starts consuming.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Consume {
    /// At once: deliveries are timed as they happen (`latency`).
    Now,
    /// Only after [`ConsumerProcess::release`]: the queue is bound, so nothing is missed,
    /// but the broker does not deliver while the relay (or the baseline's window) is timed
    /// (`drain --consume-after`).
    Later,
}

/// The parent's handle on a consumer child; killed when dropped.
pub struct ConsumerProcess {
    child: Child,
    lines: mpsc::UnboundedReceiver<String>,
    events: usize,
}

impl ConsumerProcess {
    /// Starts `outbox-bench consume` and waits until its queue is bound.
    pub async fn start(
        queue: &str,
        events: usize,
        rooms: usize,
        times: bool,
        consume: Consume,
    ) -> anyhow::Result<Self> {
        let mut command = Command::new(std::env::current_exe()?);
        command
            .args(["consume", "--queue", queue])
            .args(["--events", &events.to_string()])
            .args(["--rooms", &rooms.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        if times {
            command.arg("--times");
        }
        if consume == Consume::Later {
            command.arg("--hold");
        }
        let mut child = command
            .spawn()
            .context("cannot start the consumer process")?;
        let stdout = child.stdout.take().context("consumer stdout")?;
        let (send, lines) = mpsc::unbounded_channel();
        // A plain thread: the pipe is read with blocking I/O, off the relay's runtime.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        let mut consumer = Self {
            child,
            lines,
            events,
        };
        match consumer.next_line(Duration::from_secs(30)).await?.as_str() {
            "ready" => Ok(consumer),
            other => bail!("unexpected line from the consumer: {other:?}"),
        }
    }

    /// Lets a consumer started with [`Consume::Later`] consume.
    pub fn release(&mut self) -> anyhow::Result<()> {
        let stdin = self.child.stdin.as_mut().context("consumer stdin")?;
        stdin.write_all(b"go\n")?;
        stdin.flush()?;
        Ok(())
    }

    async fn next_line(&mut self, deadline: Duration) -> anyhow::Result<String> {
        match tokio::time::timeout(deadline, self.lines.recv()).await {
            Ok(Some(line)) => Ok(line),
            Ok(None) => bail!("the consumer exited early: {:?}", self.child.try_wait()),
            Err(_) => bail!("no word from the consumer within {deadline:?}"),
        }
    }

    /// Waits until every event arrived (at most `deadline`) and returns the report.
    pub async fn finish(mut self, deadline: Duration) -> anyhow::Result<Report> {
        let done = self
            .next_line(deadline)
            .await
            .context("waiting for every delivery")?;
        let numbers: Vec<usize> = done
            .strip_prefix("done ")
            .context("expected `done …` from the consumer")?
            .split(' ')
            .map(str::parse)
            .collect::<Result<_, _>>()?;
        let [delivered, duplicates, out_of_order] = numbers[..] else {
            bail!("malformed consumer report {done:?}");
        };
        let mut report = Report {
            delivered,
            duplicates,
            out_of_order,
            times: Vec::new(),
        };
        while let Ok(Some(line)) =
            tokio::time::timeout(Duration::from_secs(10), self.lines.recv()).await
        {
            let mut parts = line.split(' ').skip(1);
            if let (Some(Ok(n)), Some(Ok(at))) = (
                parts.next().map(str::parse::<usize>),
                parts.next().map(str::parse::<i64>),
            ) {
                if report.times.is_empty() {
                    report.times = vec![0; self.events];
                }
                report.times[n] = at;
            }
        }
        Ok(report)
    }
}

impl Drop for ConsumerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
