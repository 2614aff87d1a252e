//! `--baseline`: this run's figures against those of an earlier
//! `seatgate bench --json`, row by row, as percentage changes.
//!
//! Rows match by scenario and variant (and, should one scenario print the
//! same variant twice, by their order within it). A row only one side has is
//! listed as such rather than dropped, so a renamed or new scenario shows.

use std::collections::HashMap;
use std::path::Path;

use super::{Report, Row};
use crate::Error;

/// Reads an earlier `seatgate bench --json` report.
pub fn load_baseline(path: &Path) -> Result<Report, Error> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Usage(format!("--baseline {}: {e}", path.display())))?;
    serde_json::from_str(&text).map_err(|e| {
        Error::Usage(format!(
            "--baseline {}: not a `seatgate bench --json` report: {e}",
            path.display()
        ))
    })
}

/// The figures compared, in the order they print.
const FIGURES: [&str; 4] = ["ops/s", "p50", "p99", "Redis µs/req"];

/// One row's comparison.
#[derive(Debug, Clone, PartialEq)]
pub enum RowChange {
    /// Both runs have the row: each figure's change (None where either side
    /// has no such figure), in the order of `FIGURES`.
    Both {
        /// Scenario.
        scenario: String,
        /// Variant.
        variant: String,
        /// `+12.3%` and the like, per figure.
        changes: Vec<Option<String>>,
    },
    /// Only this run has it.
    OnlyNow {
        /// Scenario.
        scenario: String,
        /// Variant.
        variant: String,
    },
    /// Only the baseline has it.
    OnlyBaseline {
        /// Scenario.
        scenario: String,
        /// Variant.
        variant: String,
    },
}

/// A row's figures, in the order of `FIGURES` (None where it has none).
fn figures(r: &Row) -> [Option<f64>; 4] {
    let us = |v: Option<u64>| v.map(|v| v as f64);
    [
        (r.ops_per_sec > 0.0).then_some(r.ops_per_sec),
        us(r.p50_us),
        us(r.p99_us),
        r.redis.as_ref().map(|c| c.cpu_us_per_op),
    ]
}

/// `now` against `before` as a signed percentage with one decimal (`+12.3%`,
/// `-4.0%`, `+0.0%`); None when either is missing or the baseline is zero.
pub fn change(now: Option<f64>, before: Option<f64>) -> Option<String> {
    let (now, before) = (now?, before?);
    if before == 0.0 || !now.is_finite() || !before.is_finite() {
        return None;
    }
    let pct = ((now - before) / before * 1000.0).round() / 10.0;
    // -0.0 after rounding reads as a change where there is none.
    let pct = if pct == 0.0 { 0.0 } else { pct };
    Some(format!("{pct:+.1}%"))
}

/// Each row's key: scenario, variant and its occurrence among rows of both.
fn keyed(rows: &[Row]) -> Vec<((&str, &str, usize), &Row)> {
    let mut seen: HashMap<(&str, &str), usize> = HashMap::new();
    rows.iter()
        .map(|r| {
            let n = seen.entry((r.scenario.as_str(), r.variant.as_str())).or_default();
            *n += 1;
            ((r.scenario.as_str(), r.variant.as_str(), *n), r)
        })
        .collect()
}

/// This run's rows against the baseline's: this run's order, then the rows
/// only the baseline has, in its order.
pub fn compare(now: &Report, baseline: &Report) -> Vec<RowChange> {
    let before: HashMap<_, _> = keyed(&baseline.rows).into_iter().collect();
    let current = keyed(&now.rows);
    let mut out: Vec<RowChange> = current
        .iter()
        .map(|(key, r)| match before.get(key) {
            Some(b) => RowChange::Both {
                scenario: r.scenario.clone(),
                variant: r.variant.clone(),
                changes: figures(r)
                    .into_iter()
                    .zip(figures(b))
                    .map(|(n, b)| change(n, b))
                    .collect(),
            },
            None => RowChange::OnlyNow {
                scenario: r.scenario.clone(),
                variant: r.variant.clone(),
            },
        })
        .collect();
    let in_now: std::collections::HashSet<_> = current.iter().map(|(k, _)| *k).collect();
    out.extend(
        keyed(&baseline.rows)
            .into_iter()
            .filter(|(k, _)| !in_now.contains(k))
            .map(|(_, r)| RowChange::OnlyBaseline {
                scenario: r.scenario.clone(),
                variant: r.variant.clone(),
            }),
    );
    out
}

/// `now` against `baseline` as text: every row's changes, then the rows
/// only one side has.
pub fn render_against(now: &Report, baseline: &Report) -> String {
    render(&compare(now, baseline), baseline)
}

/// The comparison as text, under a line saying what the baseline was.
pub fn render(changes: &[RowChange], baseline: &Report) -> String {
    let mut out = format!(
        "against the baseline (Redis {}, {} cores, {:.0} s per scenario):\n\n{:<11} {:<56} {:>9} {:>9} {:>9} {:>13}\n",
        baseline.redis_version, baseline.cores, baseline.duration_s, "scenario", "variant", FIGURES[0], FIGURES[1], FIGURES[2], FIGURES[3]
    );
    for c in changes {
        let line = match c {
            RowChange::Both {
                scenario,
                variant,
                changes,
            } => {
                let f = |i: usize| changes.get(i).cloned().flatten().unwrap_or_else(|| "-".into());
                format!(
                    "{scenario:<11} {variant:<56} {:>9} {:>9} {:>9} {:>13}",
                    f(0),
                    f(1),
                    f(2),
                    f(3)
                )
            }
            RowChange::OnlyNow { scenario, variant } => {
                format!("{scenario:<11} {variant:<56} not in the baseline")
            }
            RowChange::OnlyBaseline { scenario, variant } => {
                format!("{scenario:<11} {variant:<56} not in this run")
            }
        };
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::RedisCost;

    fn row(scenario: &str, variant: &str, ops: f64, p50: u64, p99: u64, cpu: Option<f64>) -> Row {
        Row {
            scenario: scenario.into(),
            variant: variant.into(),
            ops_per_sec: ops,
            p50_us: Some(p50),
            p90_us: None,
            p99_us: Some(p99),
            p999_us: None,
            redis: cpu.map(|cpu_us_per_op| RedisCost {
                cpu_us_per_op,
                ops: 1,
                commands: Vec::new(),
            }),
            note: String::new(),
        }
    }

    fn report(rows: Vec<Row>) -> Report {
        Report {
            redis_version: "7.0.15".into(),
            cores: 2,
            duration_s: 3.0,
            rows,
        }
    }

    #[test]
    fn percentages_are_signed_with_one_decimal() {
        assert_eq!(change(Some(112.3), Some(100.0)).as_deref(), Some("+12.3%"));
        assert_eq!(change(Some(96.0), Some(100.0)).as_deref(), Some("-4.0%"));
        assert_eq!(change(Some(100.0), Some(100.0)).as_deref(), Some("+0.0%"));
        assert_eq!(
            change(Some(99.99), Some(100.0)).as_deref(),
            Some("+0.0%"),
            "no -0.0%"
        );
        assert_eq!(change(Some(300.0), Some(100.0)).as_deref(), Some("+200.0%"));
        assert_eq!(change(Some(5.0), Some(0.0)), None, "no change against nothing");
        assert_eq!(change(None, Some(1.0)), None);
        assert_eq!(change(Some(1.0), None), None);
    }

    #[test]
    fn rows_match_by_scenario_and_variant_whatever_their_order() {
        let baseline = report(vec![
            row("direct", "clients=16", 40_000.0, 400, 600, Some(25.0)),
            row("direct", "clients=1", 10_000.0, 100, 150, Some(30.0)),
        ]);
        let now = report(vec![
            row("direct", "clients=1", 11_230.0, 99, 180, Some(27.0)),
            row("direct", "clients=16", 40_000.0, 400, 600, None),
        ]);
        let c = compare(&now, &baseline);
        let pct = |s: &str| Some(s.to_owned());
        assert_eq!(
            c,
            vec![
                RowChange::Both {
                    scenario: "direct".into(),
                    variant: "clients=1".into(),
                    changes: vec![pct("+12.3%"), pct("-1.0%"), pct("+20.0%"), pct("-10.0%")],
                },
                RowChange::Both {
                    scenario: "direct".into(),
                    variant: "clients=16".into(),
                    changes: vec![pct("+0.0%"), pct("+0.0%"), pct("+0.0%"), None],
                },
            ]
        );
    }

    #[test]
    fn rows_on_one_side_only_are_listed_as_such() {
        let baseline = report(vec![
            row("ceiling", "pipelined", 68_000.0, 0, 0, Some(14.7)),
            row("reaper", "1% stale", 30_000.0, 0, 0, None),
        ]);
        let now = report(vec![
            row("seed", "clients=1", 12_000.0, 80, 120, Some(20.0)),
            row("ceiling", "pipelined", 68_000.0, 0, 0, Some(14.7)),
        ]);
        let c = compare(&now, &baseline);
        assert_eq!(c.len(), 3);
        assert_eq!(
            c[0],
            RowChange::OnlyNow {
                scenario: "seed".into(),
                variant: "clients=1".into()
            }
        );
        assert!(matches!(&c[1], RowChange::Both { scenario, .. } if scenario == "ceiling"));
        assert_eq!(
            c[2],
            RowChange::OnlyBaseline {
                scenario: "reaper".into(),
                variant: "1% stale".into()
            }
        );
        let text = render(&c, &baseline);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("against the baseline (Redis 7.0.15, 2 cores, 3 s"));
        assert!(
            lines[3].starts_with("seed ") && lines[3].ends_with("not in the baseline"),
            "{text}"
        );
        assert!(
            lines[4].starts_with("ceiling ") && lines[4].ends_with("+0.0%"),
            "{text}"
        );
        assert!(
            lines[5].starts_with("reaper ") && lines[5].ends_with("not in this run"),
            "{text}"
        );
    }

    #[test]
    fn a_variant_printed_twice_matches_in_order() {
        let baseline = report(vec![
            row("soak", "m", 100.0, 1, 1, None),
            row("soak", "m", 200.0, 1, 1, None),
        ]);
        let now = report(vec![
            row("soak", "m", 110.0, 1, 1, None),
            row("soak", "m", 180.0, 1, 1, None),
            row("soak", "m", 1.0, 1, 1, None),
        ]);
        let ops: Vec<Option<String>> = compare(&now, &baseline)
            .into_iter()
            .map(|c| match c {
                RowChange::Both { changes, .. } => changes[0].clone(),
                _ => None,
            })
            .collect();
        assert_eq!(ops, [Some("+10.0%".into()), Some("-10.0%".into()), None]);
    }

    #[test]
    fn a_baseline_from_before_the_redis_figures_still_loads() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("old.json");
        std::fs::write(
            &path,
            r#"{"redis_version":"7.0.15","cores":2,"duration_s":3.0,"rows":[
                {"scenario":"direct","variant":"clients=1","ops_per_sec":10216.0,
                 "p50_us":93,"p90_us":120,"p99_us":154,"p999_us":300,"note":""}]}"#,
        )
        .expect("write");
        let old = load_baseline(&path).expect("an older report loads");
        assert_eq!(old.rows[0].redis, None);
        assert_eq!(old.rows[0].p99_us, Some(154));
        std::fs::write(&path, "[1, 2]").expect("write");
        let err = load_baseline(&path).unwrap_err().to_string();
        assert!(err.contains("not a `seatgate bench --json` report"), "{err}");
        let err = load_baseline(&dir.path().join("missing.json"))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("--baseline "), "{err}");
    }
}
