//! `seatgate license …`: provisioning (put, show, list, delete, the group
//! map), each change checked and written atomically (`seatgate_core::provision`).

use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Args, Subcommand};

use seatgate::config::Settings;
use seatgate::error::Error;
use seatgate::views::printable;
use seatgate_core::license::{self, LicenseChange, LicenseInfo, StoredRecord};
use seatgate_core::policy::LicensePolicy;
use seatgate_core::provision;

use super::EXIT_REFUSED;

/// `license put`'s policy flags, one per policy field (docs/protocol.md, "Policies").
#[derive(Debug, Args)]
pub(super) struct PolicyArgs {
    /// One user holds at most this many seats (max_per_user).
    #[arg(long, value_name = "N")]
    max_per_user: Option<u64>,
    /// A group holds at most N seats (group_max:<group>); repeat per group.
    #[arg(long, value_name = "GROUP=N", value_parser = group_count)]
    group_max: Vec<(String, u64)>,
    /// N seats are kept for a group (group_reserve:<group>); repeat per group.
    #[arg(long, value_name = "GROUP=N", value_parser = group_count)]
    group_reserve: Vec<(String, u64)>,
    /// The highest queue priority an acquire gets, 0-9 (max_priority).
    #[arg(long, value_name = "P", value_parser = clap::value_parser!(u8).range(0..=9))]
    max_priority: Option<u8>,
    /// A released seat stays with its session this long, e.g. 10m (linger_ms).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    linger: Option<Duration>,
    /// Allow borrowing a seat for up to this long, e.g. 7d (max_borrow_ms).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    max_borrow: Option<Duration>,
    /// Refuse an acquire that names no user (require_user 1), so that
    /// omitting `user` escapes no per-user limit; `license put L --unset
    /// require_user` lifts it.
    #[arg(long)]
    require_user: bool,
    /// One user has at most N sessions waiting in the queue
    /// (queue_max_per_user); one more is refused NO_SEATS_AVAILABLE.
    #[arg(long, value_name = "N")]
    queue_max_per_user: Option<u64>,
    /// One group has at most N sessions waiting in the queue
    /// (queue_max_per_group); one more is refused NO_SEATS_AVAILABLE, so
    /// one group cannot fill the queue ahead of the others.
    #[arg(long, value_name = "N")]
    queue_max_per_group: Option<u64>,
    /// Only these applications (stream.applications) may use the license
    /// (application:<app> 1 each), e.g. billing,cad; an acquire of any
    /// other, or of the shared stream, is refused LIMIT_REACHED.
    /// `--unset application:<app>` takes one off the list.
    #[arg(long, value_name = "APP,...", value_delimiter = ',', value_parser = application_name)]
    applications: Vec<String>,
}

/// One name of `--applications`.
fn application_name(s: &str) -> Result<String, String> {
    if seatgate_core::tenancy::valid_application(s) {
        Ok(s.to_owned())
    } else {
        Err(format!(
            "application {s:?} must be 1 to 64 characters of A-Z a-z 0-9 . _ -"
        ))
    }
}

impl PolicyArgs {
    fn policy(&self) -> LicensePolicy {
        LicensePolicy {
            max_per_user: self.max_per_user,
            group_max: self.group_max.iter().cloned().collect(),
            group_reserve: self.group_reserve.iter().cloned().collect(),
            max_priority: self.max_priority,
            linger_ms: self.linger.map(|d| d.as_millis() as u64),
            max_borrow_ms: self.max_borrow.map(|d| d.as_millis() as u64),
            require_user: self.require_user.then_some(true),
            queue_max_per_user: self.queue_max_per_user,
            queue_max_per_group: self.queue_max_per_group,
            applications: self.applications.iter().map(|app| (app.clone(), true)).collect(),
        }
    }
}

/// `GROUP=N` of `--group-max` and `--group-reserve`.
fn group_count(s: &str) -> Result<(String, u64), String> {
    let (group, n) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: use GROUP=N, like cad=3"))?;
    if !seatgate_core::tenancy::valid_stored_id(group) {
        return Err(format!(
            "group {group:?} must be {}",
            seatgate_core::tenancy::STORED_ID_RULE
        ));
    }
    let n = n
        .parse()
        .map_err(|_| format!("{s:?}: N must be a whole number"))?;
    Ok((group.to_owned(), n))
}

/// `seatgate license [--actor NAME] …`.
#[derive(Debug, Args)]
pub(super) struct LicenseArgs {
    /// Who makes the change, for the admin trail (each change's event names
    /// its `actor`): default SEATGATE_ACTOR, else your OS user name.
    #[arg(long, global = true, value_name = "NAME")]
    actor: Option<String>,
    #[command(subcommand)]
    command: LicenseCommand,
}

#[derive(Debug, Subcommand)]
pub(super) enum LicenseCommand {
    /// Create a license, or change the fields given and keep every other
    /// (docs/protocol.md, "Provisioning"): `license put L --seats 8` changes
    /// the seat count alone. `--unset FIELD` removes one field; `--replace`
    /// writes the whole record as given.
    Put {
        /// License id.
        license: String,
        /// Seats that may be held at once (required to create a license).
        #[arg(long)]
        seats: Option<u64>,
        /// When the license expires: RFC 3339 time, unix ms, or "never"
        /// (a new license: never). A time already past needs --force.
        #[arg(long)]
        expires: Option<String>,
        /// Write an --expires that is already past (the license is then
        /// expired at once: every acquire is refused LICENSE_EXPIRED).
        #[arg(long)]
        force: bool,
        /// Deactivate it (acquires refused).
        #[arg(long, conflicts_with = "active")]
        inactive: bool,
        /// Activate it again (a new license is active).
        #[arg(long)]
        active: bool,
        /// Heartbeat timeout for this license, e.g. 90s (absent: the service's).
        #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
        heartbeat_timeout: Option<Duration>,
        /// The license's policies; each flag sets its field and keeps the others.
        #[command(flatten)]
        policy: PolicyArgs,
        /// Remove a field of the record, by its name: heartbeat_timeout_ms,
        /// queue_max, max_per_user, group_max:GROUP, linger_ms, …; repeat per field.
        #[arg(long, value_name = "FIELD")]
        unset: Vec<String>,
        /// Write the whole record as given: every field not given (its
        /// policies, heartbeat timeout, queue_max) is removed, the expiry is
        /// never unless given, and --seats is required.
        #[arg(long)]
        replace: bool,
    },
    /// Show one license.
    Show {
        /// License id.
        license: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// List every license.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete a license: every seat on it ends (an `evicted` event, reason
    /// `license_deleted`; a holder's next heartbeat or release is told the
    /// license was deleted) and every waiter gets LICENSE_NOT_FOUND. Asks
    /// first on a terminal; elsewhere needs --yes.
    Delete {
        /// License id.
        license: String,
        /// Delete without asking.
        #[arg(long, short = 'y')]
        yes: bool,
        /// Print what would be deleted (the record, its holders and
        /// waiters) and change nothing.
        #[arg(long, conflicts_with = "yes")]
        dry_run: bool,
    },
    /// The license's group map (FlexNet's GROUP lines): while it holds
    /// anyone, a request's group is its user's there (none for a user not
    /// in it) and a request claiming another is refused.
    Groups {
        /// License id.
        license: String,
        #[command(subcommand)]
        change: GroupsCommand,
    },
}

/// `seatgate license groups L …`.
#[derive(Debug, Subcommand)]
pub(super) enum GroupsCommand {
    /// Put USER in GROUP (creating the map).
    Set {
        /// The user, as acquires send it in `user`.
        user: String,
        /// Its group.
        group: String,
    },
    /// Take USER out of the map (the last one out removes the map).
    Unset {
        /// The user.
        user: String,
    },
    /// Print the map, one `USER GROUP` a line.
    Show {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Runs `license <cmd>`.
pub(super) async fn license_cmd(settings: &Settings, args: LicenseArgs) -> Result<ExitCode, Error> {
    let mut con = seatgate::connect(settings).await?;
    let keys = settings.seat_keys();
    let actor = || super::actor(args.actor.clone());
    let relay = seatgate::runtime::relay::Relay::new(&keys);
    match args.command {
        LicenseCommand::Put {
            license,
            seats,
            expires,
            inactive,
            active,
            heartbeat_timeout,
            policy,
            unset,
            replace,
            force,
        } => {
            let expires_at_ms = expires.as_deref().map(parse_expiry).transpose()?;
            if let (Some(at), false) = (expires_at_ms, force) {
                if at > 0 && at <= now_ms() {
                    return Err(Error::Usage(format!(
                        "--expires {:?} is already past: the license would be expired at once; pass --force to write it anyway",
                        expires.unwrap_or_default()
                    )));
                }
            }
            let change = LicenseChange {
                replace,
                seats_total: seats,
                expires_at_ms,
                active: match (active, inactive) {
                    (true, _) => Some(true),
                    (_, true) => Some(false),
                    _ => None,
                },
                heartbeat_timeout_ms: heartbeat_timeout.map(|d| d.as_millis() as u64),
                policy: policy.policy(),
                unset,
            };
            // Checked and written in one step: a refused change writes nothing.
            let changed = provision::change(&mut con, &keys, &license, &change, &actor()?).await?;
            if let Some(relay) = &relay {
                relay.licenses(&con, [license.as_str()]).await;
            }
            let record = StoredRecord::from_map(&changed.record);
            let spec = record.spec();
            println!(
                "license {license}: {} seats{}{}",
                spec.seats_total,
                if spec.active { "" } else { " (inactive)" },
                if changed.existed { "" } else { " (created)" }
            );
        }
        LicenseCommand::Show { license, json } => match license::show(&mut con, &keys, &license).await? {
            Some(info) if json => println!("{}", serde_json::to_string(&info).unwrap_or_default()),
            Some(info) => println!("{}", printable(&describe(&info))),
            None => {
                eprintln!("seatgate: license {license} does not exist");
                return Ok(ExitCode::from(EXIT_REFUSED));
            }
        },
        LicenseCommand::List { json } => {
            let all = license::list(&mut con, &keys).await?;
            if json {
                println!("{}", serde_json::to_string(&all).unwrap_or_default());
            } else if all.is_empty() {
                println!("no licenses");
            } else {
                for info in &all {
                    println!("{}", printable(&describe(info)));
                }
            }
        }
        LicenseCommand::Delete {
            license,
            yes,
            dry_run,
        } => {
            license::check_id(&license)?;
            let doomed = Doomed::read(&mut con, &keys, &license).await?;
            if dry_run {
                print!("{}", doomed.describe(&license));
                return Ok(ExitCode::from(if doomed.exists() { 0 } else { EXIT_REFUSED }));
            }
            if !yes && !confirm(&license, &doomed)? {
                eprintln!("seatgate: license {license} not deleted");
                return Ok(ExitCode::from(EXIT_REFUSED));
            }
            let deleted = seatgate::runtime::reaper::Reaper::new(con.clone(), settings)
                .delete_license(&license, &actor()?)
                .await?;
            if deleted.existed || deleted.seats + deleted.waits > 0 {
                println!(
                    "license {license} deleted; ended {} seats and {} waits",
                    deleted.seats, deleted.waits
                );
            } else {
                eprintln!("seatgate: license {license} does not exist");
                return Ok(ExitCode::from(EXIT_REFUSED));
            }
        }
        LicenseCommand::Groups { license, change } => match change {
            GroupsCommand::Set { user, group } => {
                provision::set_group(&mut con, &keys, &license, &user, &group, &actor()?).await?;
                if let Some(relay) = &relay {
                    relay.licenses(&con, [license.as_str()]).await;
                }
                println!("license {license}: user {user} is in group {group}");
            }
            GroupsCommand::Unset { user } => {
                if !provision::unset_group(&mut con, &keys, &license, &user, &actor()?).await? {
                    eprintln!("seatgate: user {user} is not in license {license}'s group map");
                    return Ok(ExitCode::from(EXIT_REFUSED));
                }
                if let Some(relay) = &relay {
                    relay.licenses(&con, [license.as_str()]).await;
                }
                println!("license {license}: user {user} is in no group");
            }
            GroupsCommand::Show { json } => {
                let map = provision::groups(&mut con, &keys, &license).await?;
                if json {
                    println!("{}", serde_json::to_string(&map).unwrap_or_default());
                } else if map.is_empty() {
                    println!("license {license} has no group map: acquires say their own group");
                } else {
                    for (user, group) in &map {
                        println!("{} {}", printable(user), printable(group));
                    }
                }
            }
        },
    }
    Ok(ExitCode::SUCCESS)
}

/// What `license delete` would end: the record, its holders and waiters.
struct Doomed {
    record: std::collections::BTreeMap<String, String>,
    holders: Vec<String>,
    waiters: Vec<String>,
}

impl Doomed {
    async fn read(
        con: &mut seatgate_core::db::Db,
        keys: &seatgate_core::keys::Keys,
        license: &str,
    ) -> Result<Doomed, Error> {
        let k = keys.license(license);
        // One MULTI of the license's slot: the three as of one moment.
        let (record, holders, waiters) = redis::pipe()
            .atomic()
            .hgetall(&k.license)
            .zrange(&k.holders, 0, -1)
            .zrange(&k.queue, 0, -1)
            .query_async(con)
            .await
            .map_err(seatgate_core::Error::from)?;
        Ok(Doomed {
            record,
            holders,
            waiters,
        })
    }

    fn exists(&self) -> bool {
        !self.record.is_empty() || !self.holders.is_empty() || !self.waiters.is_empty()
    }

    /// The dry run's lines.
    fn describe(&self, license: &str) -> String {
        if !self.exists() {
            return format!("license {license} does not exist: nothing would be deleted\n");
        }
        let list = |ids: &[String]| {
            if ids.is_empty() {
                "none".to_owned()
            } else {
                ids.iter().map(|id| printable(id)).collect::<Vec<_>>().join(" ")
            }
        };
        let record: Vec<String> = self
            .record
            .iter()
            .map(|(f, v)| format!("{}={}", printable(f), printable(v)))
            .collect();
        format!(
            "would delete license {license} ({}), nothing changed (--dry-run)\n  {} holders whose seats would end: {}\n  {} waiters who would get LICENSE_NOT_FOUND: {}\n",
            record.join(" "),
            self.holders.len(),
            list(&self.holders),
            self.waiters.len(),
            list(&self.waiters)
        )
    }
}

/// Asks on the terminal whether to delete `license`; without a terminal,
/// refuses (the caller passes --yes).
fn confirm(license: &str, doomed: &Doomed) -> Result<bool, Error> {
    use std::io::{BufRead, IsTerminal, Write};
    if !std::io::stdin().is_terminal() {
        return Err(Error::Usage(format!(
            "license delete {license} asks for confirmation on a terminal: pass --yes to delete without asking, or --dry-run to see what it would delete"
        )));
    }
    eprint!(
        "delete license {license}: end {} seats and {} waits? [y/N] ",
        doomed.holders.len(),
        doomed.waiters.len()
    );
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes"))
}

fn describe(info: &LicenseInfo) -> String {
    let s = &info.spec;
    let mut line = format!("{}  seats {}/{}", info.license, info.seats_used, s.seats_total);
    if let Some(bad) = &info.invalid {
        // The value as stored, escaped: it may hold anything.
        line.push_str(&format!("  [INVALID: {}=\"{}\"]", bad.field, bad.shown_value()));
    }
    if !s.active {
        line.push_str("  INACTIVE");
    }
    if s.expires_at_ms > 0 {
        let at = UNIX_EPOCH + Duration::from_millis(s.expires_at_ms);
        let word = if s.expires_at_ms <= now_ms() {
            "EXPIRED"
        } else {
            "expires"
        };
        line.push_str(&format!("  {word} {}", humantime::format_rfc3339_seconds(at)));
    }
    if let Some(ms) = s.heartbeat_timeout_ms {
        line.push_str(&format!(
            "  heartbeat timeout {}",
            humantime::format_duration(Duration::from_millis(ms))
        ));
    }
    if !info.policy.is_empty() {
        line.push_str(&format!("  policy: {}", info.policy.describe()));
    }
    line
}

/// Unix ms now.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// 2001-01-01T00:00:00Z in unix ms: an expiry below it given as a number is
/// taken for seconds, not milliseconds.
const YEAR_2001_MS: u64 = 978_307_200_000;

/// "never", unix ms, or an RFC 3339 time → unix ms (0 = never).
fn parse_expiry(s: &str) -> Result<u64, Error> {
    if s == "never" {
        return Ok(0);
    }
    if let Ok(ms) = s.parse::<u64>() {
        if ms > 0 && ms < YEAR_2001_MS {
            return Err(Error::Usage(format!(
                "--expires {s}: as unix milliseconds that is before 2001; if it is seconds, give {}",
                ms.saturating_mul(1000)
            )));
        }
        return Ok(ms);
    }
    humantime::parse_rfc3339_weak(s)
        .ok()
        .and_then(|t: SystemTime| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_millis() as u64)
        .ok_or_else(|| {
            Error::Usage(format!(
                "--expires {s:?}: use \"never\", unix milliseconds or a time like 2027-01-31T00:00:00Z"
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_accepts_never_ms_and_rfc3339() {
        assert_eq!(parse_expiry("never").unwrap(), 0);
        assert_eq!(parse_expiry("1700000000000").unwrap(), 1_700_000_000_000);
        assert_eq!(parse_expiry("2027-01-01T00:00:00Z").unwrap(), 1_798_761_600_000);
        assert!(parse_expiry("soon").is_err());
        // Seconds mistaken for milliseconds: refused with the milliseconds.
        let e = parse_expiry("1893456000").unwrap_err().to_string();
        assert!(e.contains("1893456000000"), "{e}");
    }
}
