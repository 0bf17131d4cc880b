//! `compare`: one scenario run by two builds of `outbox-bench`, interleaved (A B, B A, A B,
//! …, so that the machine's drift hits both), each run a child process whose JSON line is
//! read; for every numeric figure both builds' medians, each round's value, their ratio,
//! and whether the rounds' spread is too large to call the difference
//! (docs/design/tests.md#benchmarks-outbox-bench).

use crate::scenario::{median, round};
use anyhow::{bail, Context as _};
use clap::Args;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

/// `compare` options.
#[derive(Debug, Args)]
pub struct CompareArgs {
    /// The fixed build to compare against: an `outbox-bench` binary (e.g. one built from
    /// an older commit).
    #[arg(long)]
    baseline_bin: PathBuf,
    /// The build compared with it (default: this binary).
    #[arg(long)]
    candidate_bin: Option<PathBuf>,
    /// Rounds; each runs both builds once, the first of the two alternating.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    rounds: u64,
    /// Rounds run first and not counted: the first runs after a pause pay for cold caches
    /// (the database's, the broker's, the page cache) and spread the figures.
    #[arg(long, default_value_t = 0)]
    warmup: u64,
    /// The scenario and its options, after `--`, as either binary takes them
    /// (e.g. `-- drain --backend postgres --events 100000 --rooms 1000`).
    #[arg(last = true, required = true, num_args = 1..)]
    scenario: Vec<String>,
}

/// Which of the two builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Build {
    Baseline,
    Candidate,
}

/// The order of the two builds in round `round` (from 0): A B, then B A, and so on.
fn order(round: u64) -> [Build; 2] {
    match round % 2 {
        0 => [Build::Baseline, Build::Candidate],
        _ => [Build::Candidate, Build::Baseline],
    }
}

/// The fewest rounds for [`Verdict::EveryRound`].
const SIGN_ROUNDS: usize = 6;

/// One round of a comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Round {
    /// A measured round, not a warm-up.
    counted: bool,
    /// Its number among its kind (from 1), and how many of its kind there are.
    number: u64,
    of: u64,
    /// Which build goes first.
    order: [Build; 2],
}

/// `warmup` uncounted rounds, then `measured` counted ones; the builds alternate which
/// goes first across all of them.
fn rounds(warmup: u64, measured: u64) -> impl Iterator<Item = Round> {
    (0..warmup + measured).map(move |round| {
        let (counted, number, of) = match round.checked_sub(warmup) {
            Some(counted) => (true, counted + 1, measured),
            None => (false, round + 1, warmup),
        };
        Round {
            counted,
            number,
            of,
            order: order(round),
        }
    })
}

/// Scenarios whose output is not one result (or that are not scenarios).
const NOT_COMPARABLE: [(&str, &str); 4] = [
    (
        "matrix",
        "it prints one result per cell: compare a `drain` with that cell's --publishers and --batch-size",
    ),
    ("compare", "a comparison of comparisons is not one"),
    ("consume", "it is the drain's consumer, started by it"),
    ("otlp-sink", "it is `drain --otlp`'s receiver, started by it"),
];

/// Runs the rounds and prints the table and the JSON line.
pub async fn run(args: CompareArgs) -> anyhow::Result<()> {
    let scenario = args.scenario[0].as_str();
    if let Some((_, why)) = NOT_COMPARABLE.iter().find(|(name, _)| *name == scenario) {
        bail!("compare cannot run `{scenario}`: {why} (give a scenario after `--`: drain, history, baseline, latency, idle)");
    }
    let candidate = match args.candidate_bin {
        Some(path) => path,
        None => std::env::current_exe().context("finding this binary (the default candidate)")?,
    };
    for (flag, path) in [
        ("--baseline-bin", &args.baseline_bin),
        ("--candidate-bin", &candidate),
    ] {
        if !path.is_file() {
            bail!(
                "{flag} {}: no such file (an `outbox-bench` binary is expected)",
                path.display()
            );
        }
    }
    println!(
        "compare: `{}`, {} round(s) interleaved (A B, B A, …) after {} warm-up round(s)\n  A, baseline:  {}\n  B, candidate: {}",
        args.scenario.join(" "),
        args.rounds,
        args.warmup,
        args.baseline_bin.display(),
        candidate.display()
    );
    let mut records: [Vec<Map<String, Value>>; 2] = [Vec::new(), Vec::new()];
    let mut queues = QueueTypes::default();
    for Round {
        counted,
        number,
        of,
        order,
    } in rounds(args.warmup, args.rounds)
    {
        let kind = if counted { "round" } else { "warm-up" };
        for build in order {
            let (bin, index, label) = match build {
                Build::Baseline => (&args.baseline_bin, 0, "A baseline"),
                Build::Candidate => (&candidate, 1, "B candidate"),
            };
            let started = Instant::now();
            let record = run_child(bin, &args.scenario)
                .with_context(|| format!("{kind} {number} of {of}, {label}"))?;
            queues.check(&record, label)?;
            println!(
                "  {kind} {number}/{of}: {label:<11} {:.1} s",
                started.elapsed().as_secs_f64()
            );
            if counted {
                records[index].push(record);
            }
        }
    }
    let [baseline, candidate_records] = records;
    let comparison = Comparison::of(&baseline, &candidate_records);
    comparison.print();
    let mut json = comparison.json();
    json["scenario"] = "compare".into();
    json["compared"] = args.scenario.clone().into();
    json["rounds"] = args.rounds.into();
    json["warmup_rounds"] = args.warmup.into();
    json["baseline_bin"] = args.baseline_bin.display().to_string().into();
    json["candidate_bin"] = candidate.display().to_string().into();
    if let Some(queue_type) = queues.name() {
        json["queue_type"] = queue_type.into();
    }
    println!("{json}");
    Ok(())
}

/// The queue type the builds' records name (`OUTBOX_BENCH_QUEUE_TYPE`), which must be one:
/// a build older than that variable measures a classic queue whatever it was asked.
#[derive(Debug, Default)]
struct QueueTypes {
    /// The first record's (`classic` when it names none), and which build gave it.
    first: Option<(String, &'static str)>,
    /// Whether a record named one (`idle` and `adopt` declare no queue).
    named: bool,
}

impl QueueTypes {
    /// Fails when `record` names another queue type than an earlier record did; a record
    /// naming none measured a classic queue, or none.
    fn check(&mut self, record: &Map<String, Value>, label: &'static str) -> anyhow::Result<()> {
        let named = record.get("queue_type").and_then(Value::as_str);
        self.named |= named.is_some();
        let named = named.unwrap_or("classic");
        match &self.first {
            None => self.first = Some((named.to_owned(), label)),
            Some((first, by)) if first != named => bail!(
                "{label} measured a {named} queue, {by} a {first} queue: the builds do not \
                 compare (a build whose JSON lines have no `queue_type` ignores \
                 OUTBOX_BENCH_QUEUE_TYPE)"
            ),
            Some(_) => {}
        }
        Ok(())
    }

    /// The queue type, when a record named it.
    fn name(&self) -> Option<&str> {
        self.first
            .as_ref()
            .filter(|_| self.named)
            .map(|(name, _)| name.as_str())
    }
}

/// Runs `bin scenario…` and reads its result; its stderr passes through.
fn run_child(bin: &PathBuf, scenario: &[String]) -> anyhow::Result<Map<String, Value>> {
    let output = Command::new(bin)
        .args(scenario)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("cannot start {}", bin.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        let tail: Vec<&str> = stdout.lines().rev().take(5).collect();
        bail!(
            "{} {} failed ({}); its last output lines:\n{}",
            bin.display(),
            scenario.join(" "),
            output.status,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    record(&stdout).with_context(|| {
        format!(
            "{} {} printed no JSON line",
            bin.display(),
            scenario.join(" ")
        )
    })
}

/// A run's result from its output: the last JSON line that has `runs` (with `--runs N`,
/// the medians' line, after the runs' own), or the last JSON line when none has it; plus
/// the fields of JSON lines printed after it that it lacks (`drain --otlp`'s spans).
fn record(stdout: &str) -> Option<Map<String, Value>> {
    let lines: Vec<Map<String, Value>> = stdout
        .lines()
        .filter_map(|line| match serde_json::from_str(line.trim()) {
            Ok(Value::Object(map)) => Some(map),
            _ => None,
        })
        .collect();
    let chosen = lines
        .iter()
        .rposition(|map| map.contains_key("runs"))
        .or_else(|| lines.len().checked_sub(1))?;
    let mut record = lines[chosen].clone();
    for later in &lines[chosen + 1..] {
        for (key, value) in later {
            record.entry(key.clone()).or_insert_with(|| value.clone());
        }
    }
    Some(record)
}

/// Every numeric field of `value`, nested ones named by their path (`history_cost.0.db_cpu_us_per_event`).
fn flatten(value: &Value, path: &str, into: &mut BTreeMap<String, f64>) {
    let join = |key: &str| match path {
        "" => key.to_owned(),
        _ => format!("{path}.{key}"),
    };
    match value {
        Value::Number(number) => {
            if let Some(n) = number.as_f64() {
                into.insert(path.to_owned(), n);
            }
        }
        Value::Object(map) => {
            for (key, value) in map {
                flatten(value, &join(key), into);
            }
        }
        Value::Array(items) => {
            for (index, value) in items.iter().enumerate() {
                flatten(value, &join(&index.to_string()), into);
            }
        }
        Value::Null | Value::Bool(_) | Value::String(_) => {}
    }
}

/// One figure over the rounds of both builds.
#[derive(Debug, Clone, PartialEq)]
struct Figure {
    baseline: Vec<f64>,
    candidate: Vec<f64>,
    /// Both builds gave the figure in every round, so `baseline[i]` and `candidate[i]`
    /// are round i's (a figure missing from a round is skipped, not held as a gap).
    aligned: bool,
}

/// What the rounds say about a figure's difference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// The same median.
    Same,
    /// A build's rounds spread (max − min) at least as far as the medians differ.
    TooNoisy,
    /// Too noisy by the spread, but in every one of at least [`SIGN_ROUNDS`] rounds the
    /// candidate's value lay on the same side of the baseline's (a sign test: chance alone
    /// does that in at most 2 ÷ 2⁶, about 3 % of comparisons).
    EveryRound,
    /// The medians differ by more than either build's spread.
    Differs,
    /// One round each: no spread to judge by.
    OneRound,
}

impl Verdict {
    fn text(self) -> &'static str {
        match self {
            Self::Same => "same median",
            Self::TooNoisy => "too noisy to call",
            Self::EveryRound => "differs in every round",
            Self::Differs => "differs",
            Self::OneRound => "one round: cannot tell",
        }
    }
}

fn range(values: &[f64]) -> f64 {
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    max - min
}

impl Figure {
    fn medians(&self) -> (f64, f64) {
        (
            median(self.baseline.clone()),
            median(self.candidate.clone()),
        )
    }

    /// Candidate ÷ baseline; `None` when the baseline's median is 0.
    fn ratio(&self) -> Option<f64> {
        let (baseline, candidate) = self.medians();
        (baseline != 0.0).then(|| candidate / baseline)
    }

    /// The larger of the two builds' (max − min) ÷ |median|; `None` with one round each.
    fn spread(&self) -> Option<f64> {
        let relative = |values: &[f64]| {
            let median = median(values.to_vec()).abs();
            (median != 0.0 && values.len() > 1).then(|| range(values) / median)
        };
        match (relative(&self.baseline), relative(&self.candidate)) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (one, other) => one.or(other),
        }
    }

    fn verdict(&self) -> Verdict {
        let (baseline, candidate) = self.medians();
        let difference = (candidate - baseline).abs();
        let noise = range(&self.baseline).max(range(&self.candidate));
        if difference == 0.0 {
            Verdict::Same
        } else if self.baseline.len() < 2 && self.candidate.len() < 2 {
            Verdict::OneRound
        } else if noise >= difference {
            let one_side = self.paired().is_some_and(|ratios| {
                ratios.len() >= SIGN_ROUNDS
                    && (ratios.iter().all(|r| *r < 1.0) || ratios.iter().all(|r| *r > 1.0))
            });
            match one_side {
                true => Verdict::EveryRound,
                false => Verdict::TooNoisy,
            }
        } else {
            Verdict::Differs
        }
    }

    /// Each round's candidate ÷ baseline (the two ran side by side, so the machine's drift
    /// between rounds cancels); `None` unless both builds gave the figure in every round
    /// and no baseline value is 0.
    fn paired(&self) -> Option<Vec<f64>> {
        (self.aligned && self.baseline.iter().all(|a| *a != 0.0)).then(|| {
            self.baseline
                .iter()
                .zip(&self.candidate)
                .map(|(a, b)| b / a)
                .collect()
        })
    }

    /// The median of the paired ratios, and in how many rounds the candidate's value was
    /// lower than the baseline's.
    fn paired_summary(&self) -> Option<(f64, usize, usize)> {
        let ratios = self.paired()?;
        let lower = ratios.iter().filter(|r| **r < 1.0).count();
        let rounds = ratios.len();
        Some((median(ratios), lower, rounds))
    }

    /// The same value in every round of both builds (a parameter, or `duplicates: 0`).
    fn constant(&self) -> Option<f64> {
        let first = *self.baseline.first()?;
        self.baseline
            .iter()
            .chain(&self.candidate)
            .all(|v| *v == first)
            .then_some(first)
    }
}

/// The figures of both builds, by name.
#[derive(Debug, Default)]
struct Comparison {
    figures: BTreeMap<String, Figure>,
    only_baseline: Vec<String>,
    only_candidate: Vec<String>,
}

impl Comparison {
    /// Pairs the figures of the two builds' records: those both have, and the names only
    /// one has (an older build prints fewer).
    fn of(baseline: &[Map<String, Value>], candidate: &[Map<String, Value>]) -> Self {
        let values = |records: &[Map<String, Value>]| {
            let mut by_name: BTreeMap<String, Vec<f64>> = BTreeMap::new();
            for record in records {
                let mut flat = BTreeMap::new();
                flatten(&Value::Object(record.clone()), "", &mut flat);
                for (name, value) in flat {
                    by_name.entry(name).or_default().push(value);
                }
            }
            by_name
        };
        let (mut a, mut b) = (values(baseline), values(candidate));
        let rounds = (baseline.len(), candidate.len());
        let mut comparison = Comparison::default();
        for (name, baseline) in std::mem::take(&mut a) {
            match b.remove(&name) {
                Some(candidate) => {
                    let aligned = baseline.len() == rounds.0 && candidate.len() == rounds.1;
                    comparison.figures.insert(
                        name,
                        Figure {
                            baseline,
                            candidate,
                            aligned,
                        },
                    );
                }
                None => comparison.only_baseline.push(name),
            }
        }
        comparison.only_candidate = b.into_keys().collect();
        comparison
    }

    fn varying(&self) -> impl Iterator<Item = (&String, &Figure)> {
        self.figures.iter().filter(|(_, f)| f.constant().is_none())
    }

    fn print(&self) {
        let list = |values: &[f64]| {
            values
                .iter()
                .map(|v| format_number(*v))
                .collect::<Vec<_>>()
                .join(" ")
        };
        println!(
            "  {:<38} {:>28} {:>28} {:>6} {:>17} {:>7}  verdict",
            "figure", "A median (rounds)", "B median (rounds)", "B ÷ A", "paired", "spread"
        );
        for (name, figure) in self.varying() {
            let (a, b) = figure.medians();
            println!(
                "  {name:<38} {:>28} {:>28} {:>6} {:>17} {:>7}  {}",
                format!("{} ({})", format_number(a), list(&figure.baseline)),
                format!("{} ({})", format_number(b), list(&figure.candidate)),
                figure.ratio().map_or("n/a".into(), |r| format!("{r:.2}")),
                figure
                    .paired_summary()
                    .map_or("n/a".into(), |(r, lower, rounds)| format!(
                        "{r:.2} ({lower}/{rounds} lower)"
                    )),
                figure
                    .spread()
                    .map_or("n/a".into(), |s| format!("{:.0} %", s * 100.0)),
                figure.verdict().text()
            );
        }
        let constant: Vec<String> = self
            .figures
            .iter()
            .filter_map(|(name, f)| Some(format!("{name} {}", format_number(f.constant()?))))
            .collect();
        if !constant.is_empty() {
            println!("  the same in every round: {}", constant.join(", "));
        }
        for (label, names) in [
            ("only A (baseline) has", &self.only_baseline),
            ("only B (candidate) has", &self.only_candidate),
        ] {
            if !names.is_empty() {
                println!("  {label}: {}", names.join(", "));
            }
        }
        println!(
            "  (paired: the median of each round's B ÷ A, and in how many rounds B's value was the \
             lower; spread: the larger of the two builds' (max − min) ÷ median; \"too noisy to \
             call\": a build's rounds spread at least as far as the medians differ; \"differs in \
             every round\": too noisy by that measure, but B was on the same side of A in every \
             one of at least {SIGN_ROUNDS} rounds)"
        );
    }

    fn json(&self) -> Value {
        let figures: Map<String, Value> = self
            .varying()
            .map(|(name, figure)| {
                let (a, b) = figure.medians();
                let paired = figure.paired_summary();
                let value = serde_json::json!({
                    "baseline_median": a, "candidate_median": b,
                    "baseline_rounds": figure.baseline, "candidate_rounds": figure.candidate,
                    "ratio": figure.ratio().map(|r| round(r, 3)),
                    "paired_ratio": paired.map(|(r, _, _)| round(r, 3)),
                    "candidate_lower_rounds": paired.map(|(_, lower, _)| lower),
                    "spread": figure.spread().map(|s| round(s, 3)),
                    "verdict": figure.verdict().text(),
                });
                (name.clone(), value)
            })
            .collect();
        let constant: Map<String, Value> = self
            .figures
            .iter()
            .filter_map(|(name, f)| Some((name.clone(), f.constant()?.into())))
            .collect();
        serde_json::json!({
            "figures": figures, "constant": constant,
            "only_baseline": self.only_baseline, "only_candidate": self.only_candidate,
        })
    }
}

/// A figure as the scenarios print it: whole numbers without a fraction.
fn format_number(value: f64) -> String {
    if value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{value:.0}")
    } else {
        format!("{}", round(value, 3))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(json: Value) -> Map<String, Value> {
        match json {
            Value::Object(map) => map,
            _ => panic!("an object"),
        }
    }

    #[test]
    fn builds_alternate_which_goes_first() {
        use Build::{Baseline as A, Candidate as B};
        let orders: Vec<[Build; 2]> = (0..4).map(order).collect();
        assert_eq!(orders, [[A, B], [B, A], [A, B], [B, A]]);
    }

    #[test]
    fn warm_up_rounds_come_first_and_are_not_counted() {
        use Build::{Baseline as A, Candidate as B};
        let plan: Vec<(bool, u64, u64, [Build; 2])> = rounds(1, 2)
            .map(|r| (r.counted, r.number, r.of, r.order))
            .collect();
        assert_eq!(
            plan,
            [
                (false, 1, 1, [A, B]),
                (true, 1, 2, [B, A]),
                (true, 2, 2, [A, B])
            ]
        );
        assert_eq!(rounds(0, 3).filter(|r| r.counted).count(), 3);
    }

    #[test]
    fn the_record_is_the_medians_line_with_later_lines_added() {
        let stdout = "drain: postgres, …\n\
            {\"scenario\":\"drain\",\"runs\":1,\"events_per_sec\":100,\"seconds\":1.0}\n\
            not json {\n\
            {\"scenario\":\"drain\",\"runs\":2,\"events_per_sec\":150}\n\
            {\"scenario\":\"drain\",\"otlp_spans\":7,\"events\":9}\n\
            [1, 2]\n";
        let record = record(stdout).unwrap();
        assert_eq!(record["runs"], 2);
        assert_eq!(record["events_per_sec"], 150);
        assert_eq!(record["otlp_spans"], 7);
        // The runs' own lines are not mixed in.
        assert!(!record.contains_key("seconds"));
        assert_eq!(
            super::record("{\"scenario\":\"idle\",\"a\":1}\n{\"scenario\":\"idle\",\"a\":2}")
                .unwrap()["a"],
            2
        );
        assert_eq!(super::record("no json here\n"), None);
    }

    #[test]
    fn builds_that_measured_other_queue_types_do_not_compare() {
        let line = |json: &str| super::record(json).unwrap();
        let (quorum, classic) = (line(r#"{"queue_type":"quorum"}"#), line(r#"{"a":1}"#));
        let mut queues = QueueTypes::default();
        queues.check(&classic, "A baseline").unwrap();
        let error = queues.check(&quorum, "B candidate").unwrap_err();
        assert!(
            error
                .to_string()
                .contains("B candidate measured a quorum queue, A baseline a classic"),
            "{error}"
        );
        let mut queues = QueueTypes::default();
        queues.check(&quorum, "A baseline").unwrap();
        queues.check(&quorum, "B candidate").unwrap();
        assert_eq!(queues.name(), Some("quorum"));
        let mut queues = QueueTypes::default();
        queues.check(&classic, "A baseline").unwrap();
        assert_eq!(queues.name(), None, "no record named one (idle)");
    }

    #[test]
    fn nested_numbers_are_named_by_their_path_and_the_rest_skipped() {
        let mut flat = BTreeMap::new();
        let json = serde_json::json!({"rate": 5, "backend": "postgres", "otlp": false,
            "bytes": null, "runs": [1.5, {"cpu": 2}], "cost": {"db": 3.25}});
        flatten(&json, "", &mut flat);
        let expected: BTreeMap<String, f64> = [
            ("rate", 5.0),
            ("runs.0", 1.5),
            ("runs.1.cpu", 2.0),
            ("cost.db", 3.25),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        assert_eq!(flat, expected);
    }

    #[test]
    fn medians_ratio_spread_and_verdict() {
        let clear = Figure {
            baseline: vec![100.0, 95.0, 105.0],
            candidate: vec![80.0, 82.0, 78.0],
            aligned: true,
        };
        assert_eq!(clear.medians(), (100.0, 80.0));
        assert!((clear.ratio().unwrap() - 0.8).abs() < 1e-12);
        // (105 − 95) ÷ 100 against (82 − 78) ÷ 80.
        assert!((clear.spread().unwrap() - 0.1).abs() < 1e-12);
        assert_eq!(clear.verdict(), Verdict::Differs);
        // Rounds paired: 80 ÷ 100, 82 ÷ 95, 78 ÷ 105; lower in all three.
        let (paired, lower, rounds) = clear.paired_summary().unwrap();
        assert!((paired - 0.8).abs() < 1e-12);
        assert_eq!((lower, rounds), (3, 3));

        let noisy = Figure {
            baseline: vec![100.0, 70.0, 130.0],
            candidate: vec![90.0, 95.0, 85.0],
            aligned: true,
        };
        assert_eq!(noisy.verdict(), Verdict::TooNoisy);
        // One wild round spreads the medians' noise past their difference, but every
        // round paired says the same: lower in 6 of 6.
        let outlier = Figure {
            baseline: vec![18.0, 18.3, 17.2, 17.8, 17.4, 19.6],
            candidate: vec![14.0, 13.9, 13.7, 13.9, 14.4, 19.5],
            aligned: true,
        };
        assert_eq!(outlier.verdict(), Verdict::EveryRound);
        let five = Figure {
            baseline: outlier.baseline[..5].to_vec(),
            candidate: vec![14.0, 13.9, 13.7, 13.9, 18.0],
            aligned: true,
        };
        assert_eq!(five.verdict(), Verdict::TooNoisy, "fewer than six rounds");

        let same = Figure {
            baseline: vec![0.0, 0.0],
            candidate: vec![0.0, 0.0],
            aligned: true,
        };
        assert_eq!(same.verdict(), Verdict::Same);
        assert_eq!(same.ratio(), None);
        assert_eq!(same.constant(), Some(0.0));
        assert_eq!(clear.constant(), None);

        let once = Figure {
            baseline: vec![1.0],
            candidate: vec![2.0],
            aligned: true,
        };
        assert_eq!(once.verdict(), Verdict::OneRound);
        assert_eq!(once.spread(), None);
        // A round without the figure: the rounds cannot be paired.
        let gap = Figure {
            baseline: vec![1.0, 2.0],
            candidate: vec![1.0],
            aligned: false,
        };
        assert_eq!(gap.paired_summary(), None);
        assert_eq!(
            Figure {
                baseline: vec![1.0, 2.0, 3.0, 4.0],
                candidate: vec![5.0],
                aligned: false,
            }
            .medians(),
            (2.5, 5.0)
        );
    }

    #[test]
    fn figures_only_one_build_prints_are_listed_apart() {
        let old = [
            map(serde_json::json!({"events_per_sec": 100, "cpu_us_per_event": 30, "events": 9})),
            map(serde_json::json!({"events_per_sec": 120, "cpu_us_per_event": 31, "events": 9})),
        ];
        let new = [
            map(
                serde_json::json!({"events_per_sec": 110, "cpu_us_per_event": 25,
                "db_cpu_us_per_event": 70, "events": 9}),
            ),
            map(
                serde_json::json!({"events_per_sec": 100, "cpu_us_per_event": 26,
                "db_cpu_us_per_event": null, "events": 9}),
            ),
        ];
        let comparison = Comparison::of(&old, &new);
        assert_eq!(comparison.only_baseline, Vec::<String>::new());
        assert_eq!(comparison.only_candidate, ["db_cpu_us_per_event"]);
        let varying: Vec<&String> = comparison.varying().map(|(name, _)| name).collect();
        assert_eq!(varying, ["cpu_us_per_event", "events_per_sec"]);
        let json = comparison.json();
        assert_eq!(json["constant"]["events"], 9.0);
        assert_eq!(
            json["figures"]["cpu_us_per_event"]["candidate_lower_rounds"],
            2
        );
        // A figure B lacks in one round: its rounds are not paired, though both have it.
        let gappy = Comparison::of(
            &[
                map(serde_json::json!({"db": 70})),
                map(serde_json::json!({"db": 80})),
            ],
            &[
                map(serde_json::json!({"db": null})),
                map(serde_json::json!({"db": 60})),
            ],
        );
        assert!(!gappy.figures["db"].aligned);
        assert_eq!(gappy.json()["figures"]["db"]["paired_ratio"], Value::Null);
        assert_eq!(json["figures"]["cpu_us_per_event"]["baseline_median"], 30.5);
        assert_eq!(json["figures"]["cpu_us_per_event"]["ratio"], 0.836);
        assert_eq!(json["figures"]["cpu_us_per_event"]["verdict"], "differs");
        assert_eq!(
            json["figures"]["events_per_sec"]["verdict"],
            "too noisy to call"
        );
    }
}
