//! `seatgate audit`: the events replayed against the seat rules and the
//! state in Redis (`seatgate::views::audit`).

use std::process::ExitCode;

use clap::Args;

use seatgate::config::Settings;
use seatgate::error::Error;
use seatgate::views;
use seatgate::views::usage::When;

use super::{check_license, EXIT_REFUSED};

/// `seatgate audit`'s flags.
#[derive(Debug, Args)]
pub(super) struct AuditArgs {
    /// Only this license.
    #[arg(long)]
    license: Option<String>,
    /// Start of the window: a duration ago (7d, 12h), a UTC date or time
    /// or unix ms. Default: everything kept (events.retention ago).
    #[arg(long, value_name = "WHEN")]
    since: Option<When>,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
}

/// Audits and prints the report; exit 1 when it found a violation.
pub(super) async fn audit(settings: &Settings, args: AuditArgs) -> Result<ExitCode, Error> {
    check_license(args.license.as_deref())?;
    let mut con = seatgate::connect(settings).await?;
    let query = views::audit::Query {
        license: args.license,
        since: args.since,
    };
    let report = views::audit::audit(&mut con, settings, &query).await?;
    if args.json {
        println!("{}", serde_json::to_string(&report).unwrap_or_default());
    } else {
        print!("{}", views::audit::render(&report));
    }
    Ok(if report.is_clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_REFUSED)
    })
}
