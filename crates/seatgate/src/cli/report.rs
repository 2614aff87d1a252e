//! `seatgate report`: usage per license over a period, from the events and
//! the daily rollups (`seatgate::views::usage`).

use std::process::ExitCode;

use clap::Args;

use seatgate::config::Settings;
use seatgate::error::Error;
use seatgate::views::usage::{self, When};

use super::check_license;

/// `seatgate report`'s flags.
#[derive(Debug, Args)]
pub(super) struct ReportArgs {
    /// Only this license.
    #[arg(long)]
    license: Option<String>,
    /// Start of the period: a duration ago (7d, 12h), a UTC date or time
    /// (2026-11-01, 2026-11-01T08:00:00Z) or unix ms. Default: everything
    /// kept (events.retention ago).
    #[arg(long, value_name = "WHEN")]
    since: Option<When>,
    /// End of the period (exclusive), the same forms. Default: now.
    #[arg(long, value_name = "WHEN")]
    until: Option<When>,
    /// Output: a table for people, CSV (one row per figure) or JSON.
    #[arg(long, value_enum, default_value_t = ReportFormat::Table)]
    format: ReportFormat,
}

/// `seatgate report --format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum ReportFormat {
    /// A block per license, for people.
    Table,
    /// `license,metric,key,value` rows, for spreadsheets.
    Csv,
    /// The whole report as one JSON object.
    Json,
}

/// Builds the report and prints it in the format asked.
pub(super) async fn report(settings: &Settings, args: ReportArgs) -> Result<ExitCode, Error> {
    check_license(args.license.as_deref())?;
    let mut con = seatgate::connect(settings).await?;
    let query = usage::Query {
        license: args.license,
        since: args.since,
        until: args.until,
    };
    let report = usage::usage(&mut con, settings, &query).await?;
    match args.format {
        ReportFormat::Table => print!("{}", usage::render_table(&report)),
        ReportFormat::Csv => print!("{}", usage::render_csv(&report)?),
        ReportFormat::Json => println!("{}", serde_json::to_string(&report).unwrap_or_default()),
    }
    Ok(ExitCode::SUCCESS)
}
