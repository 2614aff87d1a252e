//! `seatgate revoke`: an administrator takes a session's seat (or place in
//! the queue) away, through the admin stream.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use seatgate::config::Settings;
use seatgate::error::Error;
use seatgate_client::Revoke;

use super::request::answered;

#[derive(Debug, Args)]
pub(super) struct RevokeArgs {
    /// License id.
    #[arg(long)]
    license: String,
    /// The session to revoke.
    #[arg(long)]
    session: String,
    /// Why (told to the session and published in the `revoked` event); at most 512 bytes.
    #[arg(long)]
    reason: String,
    /// Who revokes, for the audit trail (default: SEATGATE_ACTOR, else your OS user name).
    #[arg(long)]
    actor: Option<String>,
    /// Refuse the session's acquires this long afterwards, e.g. 10m (default: none).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    cooldown: Option<Duration>,
    /// The cooldown binds the session's user too (cooldown_scope=user): that
    /// user's acquires are refused whatever their session id. Needs --cooldown.
    #[arg(long, requires = "cooldown")]
    user_wide: bool,
    /// How long to wait for the reply, e.g. 5s.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// Print the reply as JSON.
    #[arg(long)]
    json: bool,
}

/// `seatgate revoke`: one request on the admin stream, answered like a client call.
pub(super) async fn revoke(settings: &Settings, args: RevokeArgs) -> Result<ExitCode, Error> {
    let actor = super::actor(args.actor)?;
    let revoke = Revoke {
        license: args.license,
        session: args.session,
        reason: args.reason,
        actor,
        cooldown_ms: args
            .cooldown
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0),
        user_wide: args.user_wide,
    };
    let client = settings.client().connect_admin().await?;
    let result = client.revoke(&revoke, args.timeout).await;
    let _ = client.close().await;
    Ok(answered(&result?, args.json))
}
