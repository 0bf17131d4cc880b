//! The options of `drain` and of `matrix`, which runs `drain` over a grid of them.

use crate::scenario::Backend;
use clap::Args;

/// `drain` options.
#[derive(Debug, Clone, Args)]
pub struct DrainArgs {
    /// Database backend.
    #[arg(long, value_enum, default_value = "postgres")]
    pub(crate) backend: Backend,
    /// Events to pre-fill.
    #[arg(long, default_value_t = 100_000)]
    pub(crate) events: usize,
    /// Rooms they are spread over (1 or 10 for a hot-room case).
    #[arg(long, default_value_t = 1_000)]
    pub(crate) rooms: usize,
    /// `relay.publishers`.
    #[arg(long, default_value_t = 4)]
    pub(crate) publishers: i64,
    /// `relay.batch_size`.
    #[arg(long, default_value_t = 100)]
    pub(crate) batch_size: i64,
    /// `relay.ordering`: per_room or none.
    #[arg(long, default_value = "per_room")]
    pub(crate) ordering: String,
    /// `relay.published_rows`: keep (marked published) or delete.
    #[arg(long, default_value = "keep")]
    pub(crate) published_rows: String,
    /// Skip the baseline run (no ratio).
    #[arg(long)]
    pub(crate) no_baseline: bool,
    /// Repeat the run this many times and report each run and the medians.
    #[arg(long, default_value_t = 1)]
    pub(crate) runs: usize,
    /// Outbox tables relayed by the one process (`[[outboxes]]`), the events split between
    /// them room by room; each outbox has `--publishers` publishers of its own.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub(crate) outboxes: u16,
    /// Let the consumer read the queue only after the drain (default: while the relay
    /// runs, as a consumer that keeps up would). RabbitMQ confirms a persistent message
    /// nobody has consumed yet only once it is on disk, so confirms come later.
    #[arg(long)]
    pub(crate) consume_after: bool,
    /// Channels the bare publisher spreads its messages over, by room: 1 (the
    /// default) is the plain bare publisher; as many as `--publishers` is the relay's own
    /// channel count.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub(crate) baseline_channels: u16,
    /// Bytes of each pre-filled envelope (at least 64); the lapin baseline publishes
    /// bodies of the same size.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u64).range(64..))]
    pub(crate) envelope_bytes: u64,
    /// `relay.max_inflight_bytes`; default: the setting's default.
    #[arg(long)]
    pub(crate) max_inflight_bytes: Option<i64>,
    /// With a span per event exported over OTLP to a sink process (`telemetry.otlp_endpoint`;
    /// needs `--features otel`): the cost of tracing.
    #[arg(long)]
    pub(crate) otlp: bool,
}

/// `matrix` options: `drain` over publishers × batch sizes.
#[derive(Debug, Args)]
pub struct MatrixArgs {
    /// Database backend.
    #[arg(long, value_enum, default_value = "postgres")]
    pub(crate) backend: Backend,
    /// Events per run.
    #[arg(long, default_value_t = 50_000)]
    pub(crate) events: usize,
    /// Rooms.
    #[arg(long, default_value_t = 1_000)]
    pub(crate) rooms: usize,
    /// Publisher counts to try.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    pub(crate) publishers: Vec<i64>,
    /// Batch sizes to try.
    #[arg(long, value_delimiter = ',', default_value = "100,500")]
    pub(crate) batch_sizes: Vec<i64>,
    /// `relay.ordering`.
    #[arg(long, default_value = "per_room")]
    pub(crate) ordering: String,
    /// Runs per cell (medians are reported).
    #[arg(long, default_value_t = 3)]
    pub(crate) runs: usize,
}
