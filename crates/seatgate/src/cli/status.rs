//! `seatgate status`: seats in use, holders and queues per license
//! (`seatgate::views::status`, the status page's reading too), with totals,
//! a sort order and filters for a fleet of licenses.

use std::process::ExitCode;

use clap::Args;
use serde::Serialize;

use seatgate::config::Settings;
use seatgate::error::Error;
use seatgate::views;
use seatgate::views::status::{Order, Selection, Status, Totals};

use super::{check_license, EXIT_REFUSED};

/// `seatgate status`'s flags.
#[derive(Debug, Args)]
pub(super) struct StatusArgs {
    /// Only this license.
    #[arg(long)]
    license: Option<String>,
    /// Only licenses whose id matches: a glob (`*`, `?`; quote it) when it
    /// has either, else a substring, e.g. `--filter 'cad-*'` or `--filter cad`.
    #[arg(long, value_name = "PATTERN")]
    filter: Option<String>,
    /// Only full licenses: no seat free, or sessions waiting.
    #[arg(long)]
    full_only: bool,
    /// Order of the licenses (ties by name): name, most seats used, fewest
    /// free, most sessions waiting, soonest expiry.
    #[arg(long, value_enum, default_value_t = SortBy::Name)]
    sort: SortBy,
    /// Print JSON: `at_ms`, `licenses` and `totals`.
    #[arg(long)]
    json: bool,
}

/// `seatgate status --sort`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum SortBy {
    /// By license id.
    Name,
    /// Most seats in use first.
    Used,
    /// Fewest seats free first.
    Free,
    /// Most sessions waiting first.
    Queued,
    /// Soonest expiry first; never-expiring licenses last.
    Expiry,
}

impl From<SortBy> for Order {
    fn from(by: SortBy) -> Order {
        match by {
            SortBy::Name => Order::Name,
            SortBy::Used => Order::Used,
            SortBy::Free => Order::Free,
            SortBy::Queued => Order::Queued,
            SortBy::Expiry => Order::Expiry,
        }
    }
}

/// `--json`'s object: the status and its totals.
#[derive(Serialize)]
struct WithTotals<'a> {
    #[serde(flatten)]
    status: &'a Status,
    totals: Totals,
}

/// Reads every license (or one), keeps those asked for in the order asked,
/// and prints them with their totals.
pub(super) async fn status(settings: &Settings, args: StatusArgs) -> Result<ExitCode, Error> {
    check_license(args.license.as_deref())?;
    let mut con = seatgate::connect(settings).await?;
    let keys = settings.seat_keys();
    let mut status = views::status::status(&mut con, &keys, args.license.as_deref()).await?;
    if let (Some(l), true) = (&args.license, status.licenses.is_empty()) {
        // A refusal, as `license show` of a missing license: no
        // "0 of 0 seats" a script would read as a license without seats.
        eprintln!("seatgate: license {l} does not exist");
        return Ok(ExitCode::from(EXIT_REFUSED));
    }
    let read = status.licenses.len();
    Selection {
        filter: args.filter,
        full_only: args.full_only,
        order: args.sort.into(),
    }
    .apply(&mut status);
    let totals = Totals::of(&status, read);
    if args.json {
        let out = WithTotals {
            status: &status,
            totals,
        };
        println!("{}", serde_json::to_string(&out).unwrap_or_default());
    } else {
        print!("{}{}", views::status::render(&status), totals.render());
    }
    Ok(ExitCode::SUCCESS)
}
