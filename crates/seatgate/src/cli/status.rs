//! `seatgate status`: seats in use, holders and queues per license
//! (`seatgate::views::status`, the status page's reading too).

use std::process::ExitCode;

use clap::Args;

use seatgate::config::Settings;
use seatgate::error::Error;
use seatgate::views;

use super::{check_license, EXIT_REFUSED};

/// `seatgate status`'s flags.
#[derive(Debug, Args)]
pub(super) struct StatusArgs {
    /// Only this license.
    #[arg(long)]
    license: Option<String>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Reads every license (or one) and prints it.
pub(super) async fn status(settings: &Settings, args: StatusArgs) -> Result<ExitCode, Error> {
    check_license(args.license.as_deref())?;
    let mut con = seatgate::connect(settings).await?;
    let keys = settings.seat_keys();
    let status = views::status::status(&mut con, &keys, args.license.as_deref()).await?;
    if let (Some(l), true) = (&args.license, status.licenses.is_empty()) {
        // A refusal, as `license show` of a missing license: no
        // "0 of 0 seats" a script would read as a license without seats.
        eprintln!("seatgate: license {l} does not exist");
        return Ok(ExitCode::from(EXIT_REFUSED));
    }
    if args.json {
        println!("{}", serde_json::to_string(&status).unwrap_or_default());
    } else {
        print!("{}", views::status::render(&status));
    }
    Ok(ExitCode::SUCCESS)
}
