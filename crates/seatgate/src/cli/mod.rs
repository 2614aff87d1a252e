//! The `seatgate` command line, one file per subcommand (as mini-redis keeps
//! `cmd/`): `run` (the service: `seatgate::service::run`), `check-config`,
//! the `acquire` / `release` / `heartbeat` client (request.rs), `license`
//! provisioning, the administrator's `revoke`, and the `status`, `events`,
//! `report` and `audit` views, the HTTPS `gateway` and its `token`s.
//! Errors come out as one line.

mod audit;
mod check_config;
mod events;
mod gateway;
mod license;
mod report;
mod request;
mod revoke;
mod status;
mod token;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use seatgate::config::Settings;
use seatgate::error::Error;
use seatgate::service::{run as service, telemetry};
use seatgate_client::SeatOp;

/// Exit code when the request was answered but not granted (e.g. NO_SEATS_AVAILABLE).
pub const EXIT_REFUSED: u8 = 1;
/// Exit code for errors: Redis unreachable, no reply in time, bad configuration.
pub const EXIT_ERROR: u8 = 3;

/// Floating-license seats on Redis.
#[derive(Debug, Parser)]
#[command(name = "seatgate", version, about)]
pub struct Cli {
    /// Settings file (TOML) layered over the built-in defaults.
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Redis URL; overrides `redis.url`. Other users of the machine can read a
    /// command line: give the password in SEATGATE__REDIS__PASSWORD or
    /// `redis.password_file`, not here.
    #[arg(long, global = true, value_name = "URL")]
    redis: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a worker: consume seat requests until SIGINT/SIGTERM.
    Run,
    /// Ask for a seat; exits 0 when the session holds one.
    Acquire(request::ClientArgs),
    /// Give a seat back.
    Release(request::ClientArgs),
    /// Keep a seat alive.
    Heartbeat(request::ClientArgs),
    /// Take a session's seat (or its place in the queue) away, as an
    /// administrator: the seat goes to the next waiter, and the session is
    /// told SESSION_REVOKED with the reason. Exits 0 when revoked, 1 when the
    /// session neither holds a seat nor waits.
    Revoke(revoke::RevokeArgs),
    /// Provision licenses; every change is written with an event naming
    /// who made it (the admin trail).
    License(license::LicenseArgs),
    /// Follow the seat events of every shard (acquired, released, evicted, queued, granted, ...).
    Events(events::EventsArgs),
    /// Usage per license over a period, from the events (and daily rollups
    /// for older days): seat-hours, capacity and utilisation, peaks per hour
    /// and day, time at 100 %, denials and queue waits, per user and group.
    Report(report::ReportArgs),
    /// Check the settings (the built-in defaults, --config FILE and the
    /// SEATGATE__* variables) without connecting to Redis: prints one line
    /// and exits 0 when they are valid, 3 with the reason when not.
    CheckConfig,
    /// Show seats in use, holders and queues per license (like lmstat).
    Status(status::StatusArgs),
    /// The HTTPS gateway: seats for desktops and any language, with
    /// server-decided identity (docs/gateway.md).
    Gateway(gateway::GatewayArgs),
    /// Gateway tokens: issue, list, revoke.
    #[command(subcommand)]
    Token(token::TokenCommand),
    /// Replay the events against the seat rules and the state in Redis:
    /// prints every violation, one line each, and a summary; exits 0 when
    /// there is none, 1 when there is one (docs/reports.md, "Audit").
    Audit(audit::AuditArgs),
}

/// Parses the command line and runs it; the process's exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return fail(&Error::Io(e)),
    };
    match runtime.block_on(dispatch(cli)) {
        Ok(code) => code,
        Err(e) => fail(&e),
    }
}

fn fail(e: &Error) -> ExitCode {
    eprintln!("seatgate: error: {e}");
    ExitCode::from(match e {
        Error::Usage(_)
        | Error::Core(
            seatgate_core::Error::Usage(_)
            | seatgate_core::Error::InvalidId { .. }
            | seatgate_core::Error::InvalidLicense(_),
        ) => 2,
        _ => EXIT_ERROR,
    })
}

async fn dispatch(cli: Cli) -> Result<ExitCode, Error> {
    let mut settings = Settings::load(cli.config.as_deref())?;
    telemetry::init_tracing(settings.log.format, "info");
    if let Some(url) = cli.redis {
        settings.redis.url = url;
    }
    match cli.command {
        Command::Run => {
            service::run(settings, service::shutdown_signal(), |_| {}).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Acquire(args) => request::client_call(&settings, SeatOp::Acquire, args).await,
        Command::Release(args) => request::client_call(&settings, SeatOp::Release, args).await,
        Command::Heartbeat(args) => request::client_call(&settings, SeatOp::Heartbeat, args).await,
        Command::Revoke(args) => revoke::revoke(&settings, args).await,
        Command::License(cmd) => license::license_cmd(&settings, cmd).await,
        Command::Events(args) => {
            events::follow_events(&settings, args).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Report(args) => report::report(&settings, args).await,
        Command::CheckConfig => check_config::check_config(&settings, cli.config.as_deref()),
        Command::Status(args) => status::status(&settings, args).await,
        Command::Audit(args) => audit::audit(&settings, args).await,
        Command::Gateway(args) => gateway::gateway(settings, args).await,
        Command::Token(cmd) => token::token(&settings, cmd).await,
    }
}

/// Who an administrator's change is by, for the admin trail: `explicit`
/// (`--actor`), else `SEATGATE_ACTOR` (a wrapper or a billing system's job
/// names its person or itself), else the OS user running the command.
fn actor(explicit: Option<String>) -> Result<String, Error> {
    explicit
        .or_else(|| std::env::var("SEATGATE_ACTOR").ok())
        .filter(|a| !a.trim().is_empty())
        .or_else(|| whoami::username().ok().filter(|name| !name.is_empty()))
        .ok_or_else(|| {
            Error::Usage(
                "cannot tell your user name for the admin trail; pass --actor NAME or set SEATGATE_ACTOR"
                    .into(),
            )
        })
}

/// A `--license` given to a view must be a valid license id.
fn check_license(license: Option<&str>) -> Result<(), Error> {
    match license {
        Some(l) if !seatgate_core::protocol::valid_id(l) => {
            Err(Error::Usage(format!("--license {l:?} is not a valid license id")))
        }
        _ => Ok(()),
    }
}
