//! The view's rows: one per outbox and node, figures over the window between two looks
//! at each node, worst first; and the plain table of `top --once`.

use super::scrape::{Look, NodeFigures, OutboxFigures};
use std::cmp::Ordering;

/// How a node is, for the state column; declared worst first.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum State {
    /// Its `/metrics` did not answer, or not as a relay's (the reason).
    Unreachable(String),
    /// `outbox_up` is 0 for these dependencies (`database`, `broker`).
    Down(Vec<&'static str>),
    /// The outbox's events keep failing and none was published (`outbox_stalled`, the
    /// reason).
    Stalled(String),
    /// The broker blocks its publishers (a resource alarm).
    Blocked,
    /// Up, not blocked.
    Up,
}

impl std::fmt::Display for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unreachable(why) => write!(f, "unreachable: {why}"),
            Self::Down(what) => write!(f, "{} down", what.join("+")),
            Self::Stalled(reason) => write!(f, "stalled: {reason}"),
            Self::Blocked => f.write_str("blocked"),
            Self::Up => f.write_str("up"),
        }
    }
}

/// One row of the view.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// The outbox's name (`-` for a node without figures).
    pub outbox: String,
    /// The node's `node_id`, else the target as given.
    pub node: String,
    /// Events published per second over the window.
    pub published_per_s: Option<f64>,
    /// Failed attempts (retried or dead) per second over the window.
    pub failed_per_s: Option<f64>,
    /// Pending rows in the table.
    pub backlog: Option<f64>,
    /// The oldest pending row's age, seconds; `None` when nothing is pending.
    pub oldest_age: Option<f64>,
    /// Events this node marked dead since it started.
    pub dead: Option<f64>,
    /// p99 of commit→confirm over the window, seconds; `None` without acks in it.
    pub p99: Option<f64>,
    /// The node's state.
    pub state: State,
}

/// A node's looks: the first of the window and the latest.
pub struct Window<'a> {
    /// The target as given, for a node that cannot say its `node_id`.
    pub shown: &'a str,
    /// The oldest look kept, when there are two or more.
    pub earlier: Option<&'a Look>,
    /// The latest look.
    pub latest: &'a Look,
}

/// Every node's rows, worst first: unreachable, then a dependency down, then blocked;
/// within a state the oldest pending age, then the backlog, then failures per second.
pub fn rows(windows: &[Window<'_>]) -> Vec<Row> {
    let mut rows = Vec::new();
    for window in windows {
        let now = match &window.latest.figures {
            Ok(figures) => figures,
            Err(why) => {
                rows.push(Row {
                    outbox: "-".into(),
                    node: window.shown.to_owned(),
                    published_per_s: None,
                    failed_per_s: None,
                    backlog: None,
                    oldest_age: None,
                    dead: None,
                    p99: None,
                    state: State::Unreachable(why.clone()),
                });
                continue;
            }
        };
        let before = window
            .earlier
            .and_then(|look| Some((look.at, look.figures.as_ref().ok()?)));
        let node = now
            .node_id
            .clone()
            .unwrap_or_else(|| window.shown.to_owned());
        let state = state(now);
        if now.outboxes.is_empty() {
            rows.push(Row {
                outbox: "-".into(),
                node: node.clone(),
                published_per_s: None,
                failed_per_s: None,
                backlog: None,
                oldest_age: None,
                dead: None,
                p99: None,
                state: state.clone(),
            });
        }
        for (name, figures) in &now.outboxes {
            let earlier = before.and_then(|(at, node)| {
                let seconds = window.latest.at.duration_since(at).as_secs_f64();
                Some((seconds, node.outboxes.get(name)?)).filter(|(s, _)| *s > 0.0)
            });
            let rate = |of: fn(&OutboxFigures) -> f64| {
                earlier.map(|(seconds, then)| increase(of(then), of(figures)) / seconds)
            };
            let pending = figures.pending;
            rows.push(Row {
                outbox: name.clone(),
                node: node.clone(),
                published_per_s: rate(|f| f.published),
                failed_per_s: rate(|f| f.failed),
                backlog: pending,
                // The gauge reads 0 when nothing is pending: shown as `-`, as `status` does.
                oldest_age: figures
                    .oldest_age
                    .filter(|_| pending.is_some_and(|p| p > 0.0)),
                dead: Some(figures.dead),
                p99: earlier.and_then(|(_, then)| quantile(0.99, &then.latency, &figures.latency)),
                // A node whose links are down says that first; else a stalled outbox.
                state: match (&state, &figures.stalled) {
                    (State::Up | State::Blocked, Some(reason)) => State::Stalled(reason.clone()),
                    _ => state.clone(),
                },
            });
        }
    }
    rows.sort_by(worst_first);
    rows
}

fn state(node: &NodeFigures) -> State {
    let down: Vec<&'static str> = [("database", node.database_up), ("broker", node.broker_up)]
        .into_iter()
        .filter(|(_, up)| *up == Some(false))
        .map(|(name, _)| name)
        .collect();
    match (down.is_empty(), node.blocked) {
        (false, _) => State::Down(down),
        (true, Some(true)) => State::Blocked,
        (true, _) => State::Up,
    }
}

fn worst_first(a: &Row, b: &Row) -> Ordering {
    let larger = |x: Option<f64>, y: Option<f64>| y.unwrap_or(-1.0).total_cmp(&x.unwrap_or(-1.0));
    a.state
        .cmp(&b.state)
        .then_with(|| larger(a.oldest_age, b.oldest_age))
        .then_with(|| larger(a.backlog, b.backlog))
        .then_with(|| larger(a.failed_per_s, b.failed_per_s))
        .then_with(|| (&a.outbox, &a.node).cmp(&(&b.outbox, &b.node)))
}

/// A counter's increase from `then` to `now`; a counter that went down was reset (the
/// node restarted with a fixed node_id) and counts from zero.
fn increase(then: f64, now: f64) -> f64 {
    match now >= then {
        true => now - then,
        false => now,
    }
}

/// The `q` quantile of the observations between two readings of cumulative buckets
/// (upper bound, count), interpolated within its bucket as Prometheus'
/// `histogram_quantile` does; `None` without observations in between.
pub fn quantile(q: f64, then: &[(f64, f64)], now: &[(f64, f64)]) -> Option<f64> {
    let counts: Vec<(f64, f64)> = now
        .iter()
        .map(|&(bound, count)| {
            let before = then
                .iter()
                .find(|(b, _)| *b == bound)
                .map_or(0.0, |(_, c)| *c);
            (bound, increase(before, count))
        })
        .collect();
    let total = counts.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let (mut lower, mut below) = (0.0, 0.0);
    for &(bound, count) in &counts {
        if count >= rank {
            if bound.is_infinite() {
                // Beyond the last finite bound: that bound is all that is known.
                return Some(lower);
            }
            let share = match count - below {
                width if width > 0.0 => (rank - below) / width,
                _ => 1.0,
            };
            return Some(lower + (bound - lower) * share);
        }
        (lower, below) = (bound, count);
    }
    Some(lower)
}

/// A rate: `12.3`; `-` when unknown.
pub fn per_second(value: Option<f64>) -> String {
    value.map_or("-".into(), |v| format!("{v:.1}"))
}

/// A count: `42`; `-` when unknown.
pub fn count(value: Option<f64>) -> String {
    value.map_or("-".into(), |v| format!("{v:.0}"))
}

/// Seconds: `7.5s`, `12ms`; `-` when unknown.
pub fn seconds(value: Option<f64>) -> String {
    match value {
        None => "-".into(),
        Some(v) if v < 1.0 => format!("{:.0}ms", v * 1000.0),
        Some(v) => format!("{v:.1}s"),
    }
}

/// The columns' titles, in order.
pub const HEADER: [&str; 9] = [
    "OUTBOX",
    "NODE",
    "PUBLISHED/S",
    "FAILED/S",
    "BACKLOG",
    "OLDEST",
    "DEAD",
    "P99",
    "STATE",
];

/// A row's cells, in [`HEADER`]'s order.
pub fn cells(row: &Row) -> [String; 9] {
    [
        row.outbox.clone(),
        row.node.clone(),
        per_second(row.published_per_s),
        per_second(row.failed_per_s),
        count(row.backlog),
        seconds(row.oldest_age),
        count(row.dead),
        seconds(row.p99),
        row.state.to_string(),
    ]
}

/// `--once`: the rows as a plain table, columns padded with spaces, a header first.
pub fn plain_table(rows: &[Row]) -> String {
    let lines: Vec<[String; 9]> = std::iter::once(HEADER.map(String::from))
        .chain(rows.iter().map(cells))
        .collect();
    let mut widths = [0; 9];
    for line in &lines {
        for (width, cell) in widths.iter_mut().zip(line) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for line in &lines {
        let padded: Vec<String> = line
            .iter()
            .zip(widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        out.push_str(padded.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::time::Instant;

    fn node(id: &str, published: f64, pending: f64, oldest: f64) -> NodeFigures {
        let mut node = NodeFigures {
            node_id: Some(id.into()),
            database_up: Some(true),
            broker_up: Some(true),
            blocked: Some(false),
            ..Default::default()
        };
        node.outboxes.insert(
            "orders".into(),
            OutboxFigures {
                published,
                failed: published / 10.0,
                dead: 1.0,
                pending: Some(pending),
                oldest_age: Some(oldest),
                latency: vec![(0.01, published), (f64::INFINITY, published)],
                stalled: None,
            },
        );
        node
    }

    fn look(at: Instant, figures: Result<NodeFigures, String>) -> Look {
        Look { at, figures }
    }

    #[test]
    fn a_stalled_outbox_says_so_and_comes_before_the_ones_that_move() {
        let at = Instant::now();
        let mut stalled = node("s", 0.0, 50.0, 90.0);
        stalled.outboxes.get_mut("orders").unwrap().stalled = Some("unroutable".into());
        let (s, a) = (
            look(at, Ok(stalled)),
            look(at, Ok(node("a", 10.0, 500.0, 900.0))),
        );
        let windows = [
            Window {
                shown: "a:1",
                earlier: None,
                latest: &a,
            },
            Window {
                shown: "s:1",
                earlier: None,
                latest: &s,
            },
        ];
        let rows = rows(&windows);
        assert_eq!(rows[0].node, "s");
        assert_eq!(rows[0].state.to_string(), "stalled: unroutable");
        assert_eq!(rows[1].state, State::Up);
    }

    #[test]
    fn rates_come_from_two_looks_and_the_worst_rows_come_first() {
        let start = Instant::now();
        let later = start + Duration::from_secs(2);
        let a = [
            look(start, Ok(node("a", 100.0, 5.0, 1.0))),
            look(later, Ok(node("a", 300.0, 5.0, 1.0))),
        ];
        let mut blocked = node("b", 0.0, 9.0, 30.0);
        blocked.blocked = Some(true);
        let b = [look(start, Ok(blocked.clone())), look(later, Ok(blocked))];
        let mut down = node("c", 0.0, 0.0, 0.0);
        down.broker_up = Some(false);
        let c = look(later, Ok(down));
        let gone = look(later, Err("connection refused".into()));
        let windows = [
            Window {
                shown: "a:1",
                earlier: Some(&a[0]),
                latest: &a[1],
            },
            Window {
                shown: "b:1",
                earlier: Some(&b[0]),
                latest: &b[1],
            },
            Window {
                shown: "c:1",
                earlier: None,
                latest: &c,
            },
            Window {
                shown: "d:1",
                earlier: None,
                latest: &gone,
            },
        ];
        let rows = rows(&windows);
        let order: Vec<&str> = rows.iter().map(|row| row.node.as_str()).collect();
        assert_eq!(order, ["d:1", "c", "b", "a"]);
        assert_eq!(rows[0].state.to_string(), "unreachable: connection refused");
        assert_eq!(rows[1].state.to_string(), "broker down");
        assert_eq!(rows[1].published_per_s, None, "one look: no rate yet");
        assert_eq!(rows[1].oldest_age, None, "nothing pending");
        assert_eq!(rows[2].state, State::Blocked);
        let a = &rows[3];
        assert_eq!(a.published_per_s, Some(100.0));
        assert_eq!(a.failed_per_s, Some(10.0));
        assert_eq!(
            (a.backlog, a.oldest_age, a.dead),
            (Some(5.0), Some(1.0), Some(1.0))
        );
        assert_eq!(
            a.p99,
            Some(0.01 * 0.99),
            "200 acks, all in the first bucket"
        );
        let table = plain_table(&rows);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("OUTBOX  NODE"), "{table}");
        assert!(
            lines[4].starts_with(
                "orders  a     100.0        10.0      5        1.0s    1     10ms  up"
            ),
            "{table}"
        );
    }

    #[test]
    fn quantiles_interpolate_within_the_bucket_as_prometheus_does() {
        let then = [(0.1, 0.0), (1.0, 0.0), (f64::INFINITY, 0.0)];
        let now = [(0.1, 50.0), (1.0, 100.0), (f64::INFINITY, 100.0)];
        assert_eq!(quantile(0.5, &then, &now), Some(0.1));
        let p99 = quantile(0.99, &then, &now).unwrap();
        assert!((p99 - (0.1 + 0.9 * 0.98)).abs() < 1e-9, "{p99}");
        assert_eq!(quantile(0.99, &now, &now), None, "nothing in between");
        let beyond = [(0.1, 0.0), (1.0, 0.0), (f64::INFINITY, 10.0)];
        assert_eq!(
            quantile(0.99, &then, &beyond),
            Some(1.0),
            "the last finite bound"
        );
        assert_eq!(seconds(Some(0.0123)), "12ms");
        assert_eq!(seconds(Some(75.0)), "75.0s");
    }
}
