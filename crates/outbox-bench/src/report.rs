//! `outbox-bench report [FILE…]`: the JSON lines the scenarios print, as the Markdown tables
//! of BENCHMARKS.md, one per scenario, one row per line read. `scripts/benchmarks` runs
//! BENCHMARKS.md's commands and pipes their output here; lines that are not a scenario's
//! JSON line are skipped, so a whole run's output can be given as it is.

use anyhow::Context as _;
use serde_json::Value;
use std::io::Read as _;

/// `report` options.
#[derive(Debug, clap::Args)]
pub(crate) struct ReportArgs {
    /// Files of the bench's output; none: standard input.
    files: Vec<std::path::PathBuf>,
}

/// One column: its header, and how a JSON line gives its cell.
struct Column {
    header: &'static str,
    cell: fn(&Value) -> String,
}

/// A scenario's table: which lines it takes, and its columns.
struct Table {
    scenario: &'static str,
    title: &'static str,
    columns: &'static [Column],
}

/// A figure as BENCHMARKS.md writes it: thousands separated, `—` where absent.
fn figure(value: &Value) -> String {
    match value.as_f64() {
        None => "—".into(),
        Some(n) if n.fract() == 0.0 && n.abs() >= 1000.0 => thousands(n as i64),
        Some(n) if n.fract() == 0.0 => format!("{n}"),
        Some(n) => format!("{}", (n * 1000.0).round() / 1000.0),
    }
}

/// `, quorum queue` for a line measured on a queue other than a classic one, else nothing:
/// the tables' first cell says it (lines from before `queue_type` were all classic).
fn queue(line: &Value) -> String {
    match line["queue_type"].as_str() {
        Some(queue_type) if queue_type != "classic" => format!(", {queue_type} queue"),
        _ => String::new(),
    }
}

fn thousands(n: i64) -> String {
    let digits = n.abs().to_string();
    let mut out = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    if n < 0 {
        format!("-{out}")
    } else {
        out
    }
}

macro_rules! column {
    ($header:literal, $key:literal) => {
        Column {
            header: $header,
            cell: |line| figure(&line[$key]),
        }
    };
    // A figure of one state's object (`producers`' `"bare": {…}`).
    ($header:literal, $object:literal, $key:literal) => {
        Column {
            header: $header,
            cell: |line| figure(&line[$object][$key]),
        }
    };
}

const TABLES: &[Table] = &[
    Table {
        scenario: "drain",
        title: "Drain",
        columns: &[
            Column {
                header: "backend, frame",
                cell: |line| {
                    let frame = match line["consume_after"].as_bool() {
                        Some(true) => "`--consume-after`",
                        _ => "consumer beside",
                    };
                    let backend = line["backend"].as_str().unwrap_or("?");
                    format!("{backend}, {frame}{}", queue(line))
                },
            },
            column!("events", "events"),
            column!("events/s", "events_per_sec"),
            column!("rate ÷ bare rate", "ratio"),
            column!("relay CPU µs/event", "cpu_us_per_event"),
            column!("database CPU µs/event", "db_cpu_us_per_event"),
            column!("RabbitMQ CPU µs/msg", "broker_cpu_us_per_message"),
            column!("all in µs/event", "all_in_cpu_us_per_event"),
            column!("all in ÷ bare", "all_in_ratio"),
            column!("peak RSS MiB", "peak_rss_mib"),
            column!("duplicates", "duplicates"),
        ],
    },
    Table {
        scenario: "baseline",
        title: "Baseline: the bare publisher",
        columns: &[
            Column {
                header: "window",
                cell: |line| format!("{}{}", figure(&line["window"]), queue(line)),
            },
            column!("channels", "channels"),
            column!("messages/s", "events_per_sec"),
            column!("CPU µs/message", "cpu_us_per_event"),
            column!("RabbitMQ CPU µs/msg", "broker_cpu_us_per_message"),
            column!("all in µs/msg", "all_in_cpu_us_per_message"),
        ],
    },
    Table {
        scenario: "latency",
        title: "Latency",
        columns: &[
            Column {
                header: "backend, wake-ups",
                cell: |line| {
                    format!(
                        "{}, {}{}",
                        line["backend"].as_str().unwrap_or("?"),
                        line["wake_ups"].as_str().unwrap_or("?"),
                        queue(line)
                    )
                },
            },
            column!("events/s", "rate"),
            column!("p50 ms", "p50_ms"),
            column!("p90 ms", "p90_ms"),
            column!("p99 ms", "p99_ms"),
            column!("worst ms", "max_ms"),
        ],
    },
    Table {
        scenario: "history",
        title: "History: a large table",
        columns: &[
            Column {
                header: "backend",
                cell: |line| format!("{}{}", line["backend"].as_str().unwrap_or("?"), queue(line)),
            },
            column!("published rows kept", "history_rows"),
            column!("empty table events/s", "empty_events_per_sec"),
            Column {
                header: "with the rows, events/s",
                cell: |line| match line["history_events_per_sec"].as_array() {
                    Some(rates) => rates.iter().map(figure).collect::<Vec<_>>().join(" / "),
                    None => "—".into(),
                },
            },
        ],
    },
    Table {
        scenario: "idle",
        title: "Idle cost",
        columns: &[
            Column {
                header: "backend, wake-ups",
                cell: backend_and_wake_ups,
            },
            column!("relay CPU %", "relay_cpu_percent"),
            column!("statements/s", "statements_per_sec"),
            column!("database CPU %", "server_cpu_percent"),
        ],
    },
    Table {
        scenario: "producers",
        title: "Producers: what the relay costs the inserts",
        columns: &[
            Column {
                header: "backend, wake-ups",
                cell: backend_and_wake_ups,
            },
            column!("connections", "connections"),
            column!("bare commits/s", "bare", "commits_per_sec"),
            column!("installed commits/s", "installed", "commits_per_sec"),
            column!("installed ÷ bare", "installed_over_bare"),
            column!("serving-bare p99 ms", "serving_bare", "p99_ms"),
            column!("broker-bare p99 ms", "broker_bare", "p99_ms"),
            column!("serving p99 ms", "serving", "p99_ms"),
            column!("serving ÷ serving-bare p99", "serving_p99_over_bare"),
            column!("serving ÷ broker-bare p99", "serving_p99_over_broker_bare"),
        ],
    },
    Table {
        scenario: "producers_idle",
        title: "Producers: the idle relay",
        columns: &[
            Column {
                header: "backend, wake-ups",
                cell: backend_and_wake_ups,
            },
            column!("relay CPU %", "relay_cpu_percent"),
            column!("statements/s", "statements_per_sec"),
            column!("database CPU %", "server_cpu_percent"),
        ],
    },
];

/// `postgres, notify`; the backend alone in a line that does not say its wake-ups.
fn backend_and_wake_ups(line: &Value) -> String {
    let backend = line["backend"].as_str().unwrap_or("?");
    match line["wake_ups"].as_str() {
        Some(wake_ups) => format!("{backend}, {wake_ups}{}", queue(line)),
        None => format!("{backend}{}", queue(line)),
    }
}

/// The tables of the scenario lines in `text`, in the order of [`TABLES`]; a scenario with
/// no line has no table.
pub(crate) fn tables(text: &str) -> String {
    let lines: Vec<Value> = text
        .lines()
        .filter(|line| line.trim_start().starts_with('{'))
        .filter_map(|line| serde_json::from_str::<Value>(line.trim()).ok())
        .filter(|line| line["scenario"].is_string())
        .collect();
    let mut out = String::new();
    for table in TABLES {
        let rows: Vec<&Value> = lines
            .iter()
            .filter(|line| line["scenario"] == table.scenario)
            .collect();
        if rows.is_empty() {
            continue;
        }
        let headers: Vec<&str> = table.columns.iter().map(|c| c.header).collect();
        out.push_str(&format!(
            "## {}\n\n| {} |\n",
            table.title,
            headers.join(" | ")
        ));
        out.push_str(&format!("|{}\n", "---|".repeat(headers.len())));
        for row in rows {
            let cells: Vec<String> = table.columns.iter().map(|c| (c.cell)(row)).collect();
            out.push_str(&format!("| {} |\n", cells.join(" | ")));
        }
        out.push('\n');
    }
    out
}

/// Prints the tables of the files' (or standard input's) scenario lines.
pub(crate) fn run(args: ReportArgs) -> anyhow::Result<()> {
    let mut text = String::new();
    if args.files.is_empty() {
        std::io::stdin()
            .read_to_string(&mut text)
            .context("cannot read standard input")?;
    }
    for file in &args.files {
        text.push_str(
            &std::fs::read_to_string(file)
                .with_context(|| format!("cannot read {}", file.display()))?,
        );
        text.push('\n');
    }
    print!("{}", tables(&text));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scenario_lines_become_a_table_each_and_other_lines_are_skipped() {
        let output = r#"drain: 100000 events …
{"scenario": "drain", "backend": "postgres", "consume_after": true, "events": 100000, "events_per_sec": 9408.0, "ratio": 0.745, "cpu_us_per_event": 16.45, "db_cpu_us_per_event": 24.7, "broker_cpu_us_per_message": 85.75, "all_in_cpu_us_per_event": 126.75, "all_in_ratio": 1.255, "peak_rss_mib": 27.55, "duplicates": 0}
{"scenario": "latency", "backend": "postgres", "wake_ups": "notify", "rate": 500, "p50_ms": 0.99, "p90_ms": 1.43, "p99_ms": 2.92, "max_ms": 9.4}
"#;
        let tables = tables(output);
        assert!(tables.contains("## Drain\n"), "{tables}");
        assert!(
            tables.contains("| postgres, `--consume-after` | 100,000 | 9,408 | 0.745 | 16.45 | 24.7 | 85.75 | 126.75 | 1.255 | 27.55 | 0 |"),
            "{tables}"
        );
        assert!(
            tables.contains("| postgres, notify | 500 | 0.99 | 1.43 | 2.92 | 9.4 |"),
            "{tables}"
        );
        assert!(!tables.contains("## Idle cost"), "no line, no table");
    }

    #[test]
    fn a_quorum_queue_is_named_in_the_first_cell() {
        let output = r#"{"scenario": "drain", "backend": "postgres", "queue_type": "quorum", "events": 5}
{"scenario": "drain", "backend": "sqlite", "queue_type": "classic", "events": 5}
{"scenario": "baseline", "queue_type": "quorum", "window": 1024}
{"scenario": "latency", "backend": "postgres", "wake_ups": "notify", "queue_type": "quorum"}
"#;
        let tables = tables(output);
        assert!(
            tables.contains("| postgres, consumer beside, quorum queue | 5 |"),
            "{tables}"
        );
        assert!(
            tables.contains("| sqlite, consumer beside | 5 |"),
            "{tables}"
        );
        assert!(tables.contains("| 1,024, quorum queue |"), "{tables}");
        assert!(
            tables.contains("| postgres, notify, quorum queue |"),
            "{tables}"
        );
    }

    #[test]
    fn producers_lines_become_their_two_tables() {
        let output = r#"producers: postgres, connections 16 …
{"scenario": "producers_idle", "backend": "sqlite", "seconds": 10, "statements_per_sec": null, "server_cpu_percent": null, "relay_cpu_percent": 2.0}
{"scenario": "producers", "backend": "postgres", "connections": 16, "seconds": 10, "rounds": 3, "rate": 1000, "bare": {"commits_per_sec": 2817.0, "p50_ms": 4.907, "p99_ms": 17.882}, "installed": {"commits_per_sec": 2750.0, "p50_ms": 5.1, "p99_ms": 18.2}, "serving_bare": {"commits_per_sec": 999.0, "p50_ms": 2.2, "p99_ms": 9.73, "rate_reached": true}, "broker_bare": {"commits_per_sec": 1000.0, "p50_ms": 2.5, "p99_ms": 10.1, "rate_reached": true}, "serving": {"commits_per_sec": 1000.0, "p50_ms": 2.927, "p99_ms": 10.5, "rate_reached": true}, "installed_over_bare": 0.976, "serving_p50_over_bare": 1.33, "serving_p99_over_bare": 1.079, "serving_p50_over_broker_bare": 1.17, "serving_p99_over_broker_bare": 1.04, "errors": 0}
"#;
        let tables = tables(output);
        assert!(
            tables.contains("## Producers: what the relay costs the inserts\n"),
            "{tables}"
        );
        assert!(
            tables.contains(
                "| postgres | 16 | 2,817 | 2,750 | 0.976 | 9.73 | 10.1 | 10.5 | 1.079 | 1.04 |"
            ),
            "{tables}"
        );
        assert!(tables.contains("| sqlite | 2 | — | — |"), "{tables}");
        assert!(
            tables.find("## Producers: what").unwrap()
                < tables.find("## Producers: the idle").unwrap(),
            "in the order of TABLES: {tables}"
        );
    }
}
