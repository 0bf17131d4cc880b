//! End-to-end tests: real PostgreSQL, SQLite, MariaDB and RabbitMQ, one binary. Each test
//! sets itself up with `outbox_tests::TestApp` (a table, an exchange, settings, a relay).

/// The admin API (`[admin]`) of the real binary: nothing listens unless enabled; tokens,
/// roles and refused attempts (401, 403, 429, logged without the token); outboxes, dead
/// events by page and one event, a dry run and a requeue delivered, on every backend; the
/// security headers, 400s naming the parameter, each action counted on `/metrics`; the
/// tokens file refused at start; `admin-token`.
mod admin;
/// Adopting a live table online: `migrate` waiting out a long transaction without holding
/// up inserts, numbering rows while a producer inserts, `--dry-run`'s `-- locks:` lines;
/// the `worker` log field naming the outbox.
mod adoption;
/// The broker's refusals: a full queue's nacks deferred and never dead, an event over the
/// broker's `max_message_size` dead at once while the other rooms go on, a storm of
/// failing publishes said in a few lines.
mod backpressure;
/// `relay.max_inflight_bytes`: the claim's byte budget on every backend; large rows
/// delivered in room order within the budget plus one row.
mod bytes;
/// `check-config` asks every database and broker what `run` would: refusals exit 2 naming
/// the outbox or broker entry, unreachable addresses are warnings (each host of a database
/// URL's list too, which `run` names when it passes one over), `--offline` asks nothing.
mod check_config;
/// Three nodes, a steady producer and a schedule of kills, SIGTERMs and cuts of the
/// broker and database links: nothing lost, room order kept, no node exits by itself.
mod churn;
/// `--help` and `--version`.
mod cli;
/// `amqp.url` as a list of brokers: starting on the one that answers, failing over; a
/// node refusing the login named at each attempt.
mod cluster;
/// Column mappings and adopted tables: a Debezium-shaped table and the original worker's
/// migrated in place, `plan` as a dry run, `check_columns`' errors.
mod columns;
/// The web console in headless Chromium through chromedriver: its own security policy,
/// signing in and out, pending events' failures grouped with counts, an operator's requeue
/// after the dry run's count delivered, a viewer's refused, a hostile body shown as text, a
/// filter by key among 10,000 dead rows, a phone's width; screenshots for the docs with
/// `UPDATE_SCREENSHOTS=1`.
mod console;
/// `OUTBOX_RELAY_CONFIG`, plain logs off a terminal, `purge --dry-run` and `--json`, the
/// Containerfile's OCI labels.
mod conveniences;
/// `dead list` and `dead requeue`: topic patterns, filters that combine, `--dry-run`,
/// unknown event ids named, `--limit 0`, a list cut by `--limit` saying so, the header row.
mod dead;
/// A Debezium-shaped outbox: routing by `aggregatetype`, typed header columns, a per-row
/// content type, a mapping changed after adoption, unknown columns refused (exit 2).
mod debezium;
/// Every event once, byte for byte, with the contract's properties, in room order.
mod delivery;
/// Failovers on servers the tests own: a PostgreSQL standby behind the moving address, a
/// promotion under load, MariaDB's `read_only` flipped.
mod failover;
/// Unroutable events, hold-back per room, retries and dead events.
mod failures;
/// Broker and database links cut or stalled by a TCP proxy; a channel error costing only
/// its channel; a reconnect declaring a deleted exchange again.
mod faults;
/// Thousands of hostile rows (proptest, a fixed seed) through the binary on every backend:
/// each published byte for byte with the documented headers, or dead naming why; none lost,
/// pending or twice, every room in order.
mod hostile_rows;
/// The documented log lines, each at its level and once per change: outcomes, the
/// database's loss and return, `status=batch_failed`, readiness changes.
mod logs;
/// `/metrics` counts and times a run and carries the build and process series, `/readyz`
/// and `outbox_up` follow the links, `relay.max_pending_age` follows the oldest row, an
/// empty `metrics.listen` serves nothing; the backlog query behind the gauges.
mod metrics;
/// Several relay processes on one table, a killed node, concurrent producers.
mod multinode;
/// One live process per `node_id`: a second one refused, a killed one's successor
/// clearing its leases at once.
mod node_lock;
/// PostgreSQL's notices about skipped `IF NOT EXISTS` statements stay out of the log.
mod notices;
/// A broker away for seconds under load with `relay.max_attempts` set, once and twice in a
/// row: no attempt lost, nothing dead, room order kept, duplicates within the in-flight
/// window, each outage said once with the publishes it caught in flight and kept waiting.
mod outages;
/// Adopted tables and several outboxes through the binary: `migrate --dry-run`, `migrate`
/// and `run` on a Debezium-shaped table and the original worker's; two outboxes in one
/// process; bad mappings refused with exit code 2; on a new table, the dry run's steps
/// exactly those `migrate` applies.
mod outboxes;
/// A least-privilege role on PostgreSQL and MariaDB relays; a missing privilege is named
/// by `check-config` and `run` (exit code 2).
mod privileges;
/// `enqueue` in the caller's transaction, the docs' plain INSERT, the trace context.
mod producer;
/// Promises of the docs no other module keeps: `RUST_LOG` over `log.level`, who
/// requeued, the `node_id` default, `amqp.content_type`, the demo, one-shot commands
/// failing at once.
mod promises;
/// `relay.published_rows = "delete"`: confirmed rows deleted, the held and the dead kept.
mod published_rows;
/// A real three-node RabbitMQ cluster of the test's own, a quorum queue, and a node's
/// loss under load: nothing lost, rooms in order, duplicates within the in-flight window.
mod rabbitmq_cluster;
/// The Janitor (`relay.retention`) and `purge` delete old published rows, and nothing else.
mod retention;
/// Passwords never reach `check-config`, logs (reconnections and shutdown included) or
/// error messages; from the environment they reach RabbitMQ, MariaDB and a PostgreSQL that
/// checks them exactly as written (an outbox's own password too).
mod secrets;
/// Exit codes and messages of the binary for bad settings: a directory or an empty file as
/// the config, `log.level`, every bad value at once, JSON final errors.
mod settings;
/// SIGTERM on the real binary: no duplicates, rows not started released; `/readyz`
/// shutting down; a second signal and `relay.shutdown_timeout` forcing exit 1; the same
/// node clearing its leases at start.
mod shutdown;
/// An outbox whose events all fail: stalled on `/readyz`, in `outbox_stalled`, `status`
/// and one log line with the next step, said once for the whole stall, on every backend;
/// no longer once its events flow.
mod stalls;
/// Starting while the database or the broker is down: waiting with backoff, `/readyz`,
/// SIGTERM, `relay.startup_timeout`, refusals of the settings (exit code 2), `migrate
/// --wait`; on PostgreSQL, MariaDB and SQLite (a directory that appears).
mod startup;
/// The store's own guarantees (last_error trimming, leases, claims, migrations).
mod store;
/// `amqps://` through a TLS proxy with a custom CA, refused for a host its certificate does
/// not name; PostgreSQL's `sslmode` and `PGSSLMODE` on every connection of the relay.
mod tls;
/// `top`: a running relay's published/s and backlog on screen within 2 s in a
/// pseudo-terminal (tmux), `q` quits; `--once` prints the backlog, oldest age and dead
/// events `status` prints, an unreachable node first.
mod top;
/// OpenTelemetry: a producer span per publish at an OTLP receiver, parented to the row's
/// `traceparent`, its context in the message's headers.
mod traces;
/// Transient database failures at start and mid-run on every backend — a genuine
/// deadlock of the start-up lease release on MariaDB, PostgreSQL's `lock_timeout`,
/// SQLite's busy timeout, connections reset — retried: `run` never ends on one.
mod transient_database;
/// PostgreSQL's insert trigger NOTIFYs only a sleeping relay (the wake lock), and
/// `migrate` carries an older trigger over while producers insert.
mod wake_lock;
/// Insert wake-ups per backend: a lone event in milliseconds with a 60 s poll, through an
/// outage of the database, falling back to polling; `database.probe = false`.
mod wakeups;

/// The relay binary, built from the test package (`src/bin/outbox-relay-under-test.rs`).
pub const RELAY: &str = env!("CARGO_BIN_EXE_outbox-relay-under-test");
