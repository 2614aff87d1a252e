//! `seatgate token`: gateway tokens, as an administrator issues, lists and
//! revokes them (seatgate-gateway's `tokens`). A token is printed once;
//! Redis keeps only its SHA-256.

use std::process::ExitCode;
use std::time::Duration;

use clap::Subcommand;

use seatgate::config::Settings;
use seatgate::error::Error;
use seatgate_core::db::Db;
use seatgate_gateway::tokens::{NewToken, TokenRecord, TokenStore};

#[derive(Debug, Subcommand)]
pub(crate) enum TokenCommand {
    /// Issue a token for one application (and user, and group): printed
    /// once, stored only as its hash.
    Issue {
        /// The application its caller belongs to (one of stream.applications when that is set).
        #[arg(long)]
        app: String,
        /// The user it authenticates (its seats count for this user).
        #[arg(long)]
        user: Option<String>,
        /// The user's group.
        #[arg(long)]
        group: Option<String>,
        /// How long it works, e.g. 30d (default: until revoked).
        #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
        expires: Option<Duration>,
        /// Who issues it (default: SEATGATE_ACTOR, else your OS user name).
        #[arg(long)]
        actor: Option<String>,
        /// A note shown by `token list`.
        #[arg(long, default_value = "")]
        note: String,
    },
    /// List the issued tokens (ids, never the tokens).
    List {
        /// As JSON, one object per line.
        #[arg(long)]
        json: bool,
    },
    /// Revoke a token by its id: every gateway refuses it within
    /// gateway.token_cache_ms.
    Revoke {
        /// The token's id (`token list`).
        id: String,
        /// Who revokes it, for the trail (default: SEATGATE_ACTOR, else your OS user name).
        #[arg(long)]
        actor: Option<String>,
    },
    /// The tokens' admin trail: every issue and revoke, oldest first, with
    /// who did it and what the token names.
    Trail {
        /// As JSON, one object per line.
        #[arg(long)]
        json: bool,
    },
}

pub(super) async fn token(settings: &Settings, cmd: TokenCommand) -> Result<ExitCode, Error> {
    let store = TokenStore::new(&settings.keys.prefix);
    let mut db = Db::connect(&settings.redis).await?;
    match cmd {
        TokenCommand::Issue {
            app,
            user,
            group,
            expires,
            actor,
            note,
        } => {
            let apps = &settings.stream.applications;
            if !apps.is_empty() && !apps.contains(&app) {
                return Err(Error::Usage(format!(
                    "--app {app:?} is not one of stream.applications ({}): a gateway serves only those",
                    apps.join(", ")
                )));
            }
            let issued_by = super::actor(actor)?;
            let new = NewToken {
                app,
                user,
                group,
                expires_in: expires,
                issued_by,
                note,
            };
            let (token, record) = store.issue(&mut db, &new).await?;
            println!("{token}");
            eprintln!("{}", describe(&record));
            eprintln!(
                "shown once: keep it secret; `seatgate token revoke {}` ends it",
                record.id
            );
            Ok(ExitCode::SUCCESS)
        }
        TokenCommand::List { json } => {
            for record in store.list(&mut db).await? {
                if json {
                    println!(
                        "{}",
                        serde_json::json!({
                            "id": record.id, "app": record.app, "user": record.user, "group": record.group,
                            "expires_at_ms": record.expires_at_ms, "issued_by": record.issued_by,
                            "issued_at_ms": record.issued_at_ms, "note": record.note,
                        })
                    );
                } else {
                    println!("{}", describe(&record));
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        TokenCommand::Revoke { id, actor } => {
            if store.revoke(&mut db, &id, &super::actor(actor)?).await? {
                println!("revoked {id}");
                Ok(ExitCode::SUCCESS)
            } else {
                eprintln!("seatgate: no token with id {id:?} (see `seatgate token list`)");
                Ok(ExitCode::from(super::EXIT_REFUSED))
            }
        }
        TokenCommand::Trail { json } => {
            for entry in store.trail(&mut db).await? {
                if json {
                    println!("{}", serde_json::to_string(&entry).unwrap_or_default());
                } else {
                    println!("{}", trail_line(&entry));
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// One trail entry as a line: when, what, which token, by whom, before → after.
fn trail_line(e: &std::collections::HashMap<String, String>) -> String {
    let get = |k: &str| seatgate::views::printable(e.get(k).map(String::as_str).unwrap_or(""));
    let when = e
        .get("at_ms")
        .and_then(|ms| ms.parse::<u64>().ok())
        .map(|ms| {
            humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + Duration::from_millis(ms)).to_string()
        })
        .unwrap_or_default();
    format!(
        "{when} {} {} by {}: {} -> {}",
        get("type"),
        get("token"),
        get("actor"),
        get("before"),
        get("after")
    )
}

fn describe(r: &TokenRecord) -> String {
    let when = |ms: u64| {
        humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_millis(ms)).to_string()
    };
    let expires = if r.expires_at_ms == 0 {
        "never expires".to_owned()
    } else {
        format!("expires {}", when(r.expires_at_ms))
    };
    let text = seatgate::views::printable;
    format!(
        "{} app={} user={} group={} {} issued {} by {}{}",
        r.id,
        text(&r.app),
        text(r.user.as_deref().unwrap_or("-")),
        text(r.group.as_deref().unwrap_or("-")),
        expires,
        when(r.issued_at_ms),
        text(&r.issued_by),
        if r.note.is_empty() {
            String::new()
        } else {
            format!(" note={}", text(&r.note))
        }
    )
}
