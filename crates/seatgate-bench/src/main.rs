//! `seatgate-bench`: seatgate measured beside the seed's scripts, direct
//! function calls and the Redis ceiling, on a private redis-server (or
//! yours, `--bench-redis`). docs/performance.md says what each row means.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

/// The binary's allocator, as the `seatgate` binary's: the benchmark's
/// in-process workers and clients should allocate as the service does.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Exit code when stopped by Ctrl-C or SIGTERM: 128 + SIGINT, as a shell reports it.
const EXIT_INTERRUPTED: i32 = 130;

/// Measure seatgate beside direct function calls and the Redis ceiling (docs/performance.md).
#[derive(Debug, Parser)]
#[command(name = "seatgate-bench", version, about)]
struct BenchArgs {
    /// Use this Redis instead of starting a private redis-server.
    #[arg(long, value_name = "URL")]
    bench_redis: Option<String>,
    /// Allow FLUSHALL on --bench-redis (needed for the reaper and memory scenarios).
    #[arg(long)]
    flush: bool,
    /// Measured time per scenario, e.g. 5s.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Unmeasured warm-up before each scenario.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    warmup: Duration,
    /// Only these scenarios (seed, ceiling, direct, seatgate, fixed-rate, contention, policy, reaper, memory;
    /// gateway, soak and cluster run only when named here).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Sessions in the reaper scenario.
    #[arg(long, default_value_t = 1_000_000)]
    reaper_sessions: usize,
    /// Master counts for the cluster scenario (run it with --only cluster).
    #[arg(long, value_delimiter = ',', default_value = "3,6")]
    cluster_masters: Vec<usize>,
    /// Length of the soak scenario (run it with --only soak), e.g. 30m.
    #[arg(long, default_value = "30m", value_parser = humantime::parse_duration)]
    soak_duration: Duration,
    /// The `seatgate` binary the gateway scenario runs (default: the one beside this benchmark).
    #[arg(long, value_name = "FILE")]
    seatgate_bin: Option<PathBuf>,
    /// Print the report as JSON (the table still goes to stderr as it runs).
    #[arg(long)]
    json: bool,
    /// An earlier `seatgate bench --json` output: print each figure's change
    /// against it (to stderr with --json, so stdout stays a report).
    #[arg(long, value_name = "FILE.json")]
    baseline: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args = BenchArgs::parse();
    // `warn`: the in-process workers and reaper would otherwise log every
    // start, stop and (in the reaper scenario) each of thousands of
    // evictions between the rows of the table.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("seatgate-bench: error: cannot start the runtime: {e}");
            return ExitCode::from(3);
        }
    };
    match runtime.block_on(bench(args)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("seatgate-bench: error: {e}");
            ExitCode::from(3)
        }
    }
}

async fn bench(args: BenchArgs) -> Result<ExitCode, seatgate_bench::Error> {
    // Read before the run, so a wrong path fails now and not minutes later.
    let baseline = args
        .baseline
        .as_deref()
        .map(seatgate_bench::load_baseline)
        .transpose()?;
    let opts = seatgate_bench::BenchOptions {
        redis_url: args.bench_redis,
        flush: args.flush,
        duration: args.duration,
        warmup: args.warmup,
        only: args.only,
        reaper_sessions: args.reaper_sessions,
        soak: args.soak_duration,
        cluster_masters: args.cluster_masters,
        seatgate_bin: args.seatgate_bin,
    };
    let run = seatgate_bench::run(opts, |row| {
        eprintln!(
            "  {:<11} {:<56} {:>10.0}/s  {}",
            row.scenario, row.variant, row.ops_per_sec, row.note
        )
    });
    // The private redis-server runs in a session of its own, which a
    // terminal's Ctrl-C does not reach: dropping the run stops it (and
    // reaps it). The exit follows at once, before the workers and clients
    // still running could log the server's going as errors of their own.
    let mut run = Box::pin(run);
    let report = tokio::select! {
        report = &mut run => report?,
        _ = seatgate::service::run::shutdown_signal() => {
            eprintln!("seatgate-bench: interrupted; its private redis-server is stopped");
            drop(run);
            std::process::exit(EXIT_INTERRUPTED)
        }
    };
    let against = baseline
        .as_ref()
        .map(|b| seatgate_bench::render_against(&report, b));
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report).unwrap_or_default());
        if let Some(text) = against {
            eprint!("\n{text}");
        }
    } else {
        print!("{}", seatgate_bench::render(&report));
        if let Some(text) = against {
            print!("\n{text}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
