//! Logs (tracing) and the Prometheus exporter the metrics are recorded into.
//! The metric names and recorders live in `runtime::metrics`.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use metrics_process::Collector;

use crate::config::LogFormat;
use crate::runtime::metrics::{self, QUEUE_WAIT};

const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Waits in a queue last seconds to hours.
const WAIT_BUCKETS: &[f64] = &[
    0.1, 0.5, 1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 14400.0, 86400.0,
];

/// Sets up the log subscriber on stderr in `format`: `RUST_LOG` filters,
/// else `default` (a level such as `info`). A second call (tests,
/// embedding) keeps the first subscriber.
pub fn init_tracing(format: LogFormat, default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init(),
        // Flattened: a shipper sees `message`, `level`, `target` and each field at the top.
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// Installs the Prometheus recorder once per process, describes every
/// metric and creates the closed label sets at 0 (`runtime::metrics::init`),
/// and returns its handle. `license_series_limit` bounds per-license labels.
pub fn install_metrics(license_series_limit: usize) -> Result<PrometheusHandle, String> {
    static HANDLE: OnceLock<Result<PrometheusHandle, String>> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            // No idle timeout: series that must vanish (per-license, shared
            // state) are not in this recorder but written at each scrape by
            // `render`, and the rest must stay, even when idle.
            let handle = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Full(QUEUE_WAIT.into()), WAIT_BUCKETS)
                .map_err(|e| e.to_string())?
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
                .map_err(|e| e.to_string())?
                .install_recorder()
                .map_err(|e| e.to_string())?;
            metrics::init(license_series_limit);
            process_collector().describe();
            Ok(handle)
        })
        .clone()
}

/// The standard `process_*` series (CPU seconds, resident and virtual
/// memory, open and maximum fds, start time, threads), read from /proc into
/// the installed recorder at each scrape.
fn process_collector() -> &'static Collector {
    static COLLECTOR: OnceLock<Collector> = OnceLock::new();
    COLLECTOR.get_or_init(Collector::default)
}

/// The `/metrics` page: the `process_*` series read now, the process series from the installed recorder,
/// then the snapshot series (denials, and the shared state while this
/// process leads the reaper), written into a recorder made for this scrape
/// only. The `metrics` crate cannot delete a series; a fresh recorder per
/// scrape shows exactly the series that exist now, so a license that left the
/// top N, or a process that stopped leading, stops exporting at the next scrape.
pub fn render(handle: &PrometheusHandle, ready: bool) -> String {
    metrics::ready(ready);
    process_collector().collect();
    let mut page = handle.render();
    let scrape = PrometheusBuilder::new().build_recorder();
    ::metrics::with_local_recorder(&scrape, metrics::record_snapshots);
    page.push_str(&scrape.handle().render());
    page
}
