//! The `seatgate` command line: `run`, `check-config`, the `acquire` / `release` / `heartbeat`
//! client, `license` provisioning, the administrator's `revoke`, and the
//! `status`, `events`, `report` and `audit` views. Errors come out as one line.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Args, Parser, Subcommand};

use seatgate::config::Settings;
use seatgate::error::Error;
use seatgate::service::{run as service, telemetry};
use seatgate::views::usage::{self, When};
use seatgate::views::{self, printable};
use seatgate_client::{Call, Reply, Revoke, SeatOp};
use seatgate_core::license::{self, LicenseChange, LicenseInfo, StoredRecord};
use seatgate_core::policy::{LicensePolicy, RequestPolicy};
use seatgate_core::protocol::Lease;
use seatgate_core::provision;
use seatgate_core::status::Status;

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
    Acquire(ClientArgs),
    /// Give a seat back.
    Release(ClientArgs),
    /// Keep a seat alive.
    Heartbeat(ClientArgs),
    /// Take a session's seat (or its place in the queue) away, as an
    /// administrator: the seat goes to the next waiter, and the session is
    /// told SESSION_REVOKED with the reason. Exits 0 when revoked, 1 when the
    /// session neither holds a seat nor waits.
    Revoke(RevokeArgs),
    /// Provision licenses.
    #[command(subcommand)]
    License(LicenseCommand),
    /// Follow the seat events of every shard (acquired, released, evicted, queued, granted, ...).
    Events {
        /// Start from the beginning of the streams instead of new events only.
        #[arg(long)]
        from_start: bool,
        /// Print each event as a JSON line.
        #[arg(long)]
        json: bool,
    },
    /// Usage per license over a period, from the events (and daily rollups
    /// for older days): seat-hours, capacity and utilisation, peaks per hour
    /// and day, time at 100 %, denials and queue waits, per user and group.
    Report {
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
    },
    /// Check the settings (the built-in defaults, --config FILE and the
    /// SEATGATE__* variables) without connecting to Redis: prints one line
    /// and exits 0 when they are valid, 3 with the reason when not.
    CheckConfig,
    /// Show seats in use, holders and queues per license (like lmstat).
    Status {
        /// Only this license.
        #[arg(long)]
        license: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Replay the events against the seat rules and the state in Redis:
    /// prints every violation, one line each, and a summary; exits 0 when
    /// there is none, 1 when there is one (docs/reports.md, "Audit").
    Audit {
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
    },
}

/// `seatgate report --format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ReportFormat {
    /// A block per license, for people.
    Table,
    /// `license,metric,key,value` rows, for spreadsheets.
    Csv,
    /// The whole report as one JSON object.
    Json,
}

#[derive(Debug, Args)]
struct ClientArgs {
    /// License id.
    #[arg(long)]
    license: String,
    /// Session id (one per running copy of the product).
    #[arg(long)]
    session: String,
    /// Session metadata, a JSON object (acquire only).
    #[arg(long, value_name = "JSON")]
    meta: Option<String>,
    /// Wait this long in the license's queue when no seat is free (acquire only), e.g. 30s.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    wait: Option<Duration>,
    /// The lease the seat is bound to, as `acquire` printed it (`lease=…`):
    /// heartbeat and release must send it. With acquire: bind the seat to
    /// this one instead of a new random one (to re-send an acquire).
    /// A lease may start with `-` (its charset has it): taken as the value.
    #[arg(long, value_name = "LEASE", allow_hyphen_values = true)]
    lease: Option<String>,
    /// The user the seat counts for, under the license's max_per_user (acquire only).
    #[arg(long, value_name = "ID")]
    user: Option<String>,
    /// The group the seat counts for, under the license's group_max and group_reserve (acquire only).
    #[arg(long, value_name = "ID")]
    group: Option<String>,
    /// Place in the queue, 0-9: higher goes first, capped by the license's max_priority (acquire only).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=9))]
    priority: u8,
    /// Borrow the seat: hold it this long without heartbeats, e.g. 3d (acquire only;
    /// at most the license's max_borrow).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    borrow: Option<Duration>,
    /// How long to wait for the reply, e.g. 5s.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// The request is decided within this long of reaching Redis or not at
    /// all (answered REQUEST_EXPIRED), e.g. 5s; sent as `ttl_ms`. Default:
    /// the `client.ttl_ms` setting.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    ttl: Option<Duration>,
    /// Print the reply as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct RevokeArgs {
    /// License id.
    #[arg(long)]
    license: String,
    /// The session to revoke.
    #[arg(long)]
    session: String,
    /// Why (told to the session and published in the `revoked` event); at most 512 bytes.
    #[arg(long)]
    reason: String,
    /// Who revokes, for the audit trail (default: your OS user name).
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

/// `license put`'s policy flags, one per policy field (docs/protocol.md, "Policies").
#[derive(Debug, Args)]
struct PolicyArgs {
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
    /// omitting `user` escapes no per-user limit; `license unset L
    /// require_user` lifts it.
    #[arg(long)]
    require_user: bool,
    /// One user has at most N sessions waiting in the queue
    /// (queue_max_per_user); one more is refused NO_SEATS_AVAILABLE.
    #[arg(long, value_name = "N")]
    queue_max_per_user: Option<u64>,
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
        }
    }
}

/// `GROUP=N` of `--group-max` and `--group-reserve`.
fn group_count(s: &str) -> Result<(String, u64), String> {
    let (group, n) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: use GROUP=N, like cad=3"))?;
    if !seatgate_core::protocol::valid_id(group) {
        return Err(format!(
            "group {group:?} must be 1 to 128 characters of A-Z a-z 0-9 . _ - : @"
        ));
    }
    let n = n
        .parse()
        .map_err(|_| format!("{s:?}: N must be a whole number"))?;
    Ok((group.to_owned(), n))
}

#[derive(Debug, Subcommand)]
enum LicenseCommand {
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
        /// (a new license: never).
        #[arg(long)]
        expires: Option<String>,
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
    /// `license_deleted`) and every waiter gets LICENSE_NOT_FOUND.
    Delete {
        /// License id.
        license: String,
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
enum GroupsCommand {
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
        Command::Acquire(args) => client_call(&settings, SeatOp::Acquire, args).await,
        Command::Release(args) => client_call(&settings, SeatOp::Release, args).await,
        Command::Heartbeat(args) => client_call(&settings, SeatOp::Heartbeat, args).await,
        Command::Revoke(args) => revoke(&settings, args).await,
        Command::License(cmd) => license_cmd(&settings, cmd).await,
        Command::Events { from_start, json } => {
            follow_events(&settings, from_start, json).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Report {
            license,
            since,
            until,
            format,
        } => {
            if let Some(l) = &license {
                if !seatgate_core::protocol::valid_id(l) {
                    return Err(Error::Usage(format!("--license {l:?} is not a valid license id")));
                }
            }
            let mut con = seatgate::connect(&settings).await?;
            let query = usage::Query {
                license,
                since,
                until,
            };
            let report = usage::usage(&mut con, &settings, &query).await?;
            match format {
                ReportFormat::Table => print!("{}", usage::render_table(&report)),
                ReportFormat::Csv => print!("{}", usage::render_csv(&report)?),
                ReportFormat::Json => println!("{}", serde_json::to_string(&report).unwrap_or_default()),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::CheckConfig => check_config(&settings, cli.config.as_deref()),
        Command::Status { license, json } => {
            if let Some(l) = &license {
                if !seatgate_core::protocol::valid_id(l) {
                    return Err(Error::Usage(format!("--license {l:?} is not a valid license id")));
                }
            }
            let mut con = seatgate::connect(&settings).await?;
            let keys = settings.seat_keys();
            let status = views::status::status(&mut con, &keys, license.as_deref()).await?;
            if let (Some(l), true) = (&license, status.licenses.is_empty()) {
                // A refusal, as `license show` of a missing license: no
                // "0 of 0 seats" a script would read as a license without seats.
                eprintln!("seatgate: license {l} does not exist");
                return Ok(ExitCode::from(EXIT_REFUSED));
            }
            if json {
                println!("{}", serde_json::to_string(&status).unwrap_or_default());
            } else {
                print!("{}", views::status::render(&status));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Audit { license, since, json } => {
            if let Some(l) = &license {
                if !seatgate_core::protocol::valid_id(l) {
                    return Err(Error::Usage(format!("--license {l:?} is not a valid license id")));
                }
            }
            let mut con = seatgate::connect(&settings).await?;
            let query = views::audit::Query { license, since };
            let report = views::audit::audit(&mut con, &settings, &query).await?;
            if json {
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
    }
}

/// `seatgate check-config`: `settings` loaded and validated as `seatgate run`
/// would start with them (an invalid one never gets here: `fail` prints it,
/// exit 3), and the Redis client they describe built without connecting
/// (password and TLS files read).
fn check_config(settings: &Settings, file: Option<&std::path::Path>) -> Result<ExitCode, Error> {
    seatgate_core::db::Db::check(&settings.redis)?;
    let source = file.map_or_else(|| "the built-in defaults".to_owned(), |f| f.display().to_string());
    let target = if settings.redis.is_cluster() {
        format!(
            "a Redis Cluster of {} seed(s)",
            settings.redis.cluster_nodes().len()
        )
    } else {
        "one Redis".to_owned()
    };
    println!(
        "seatgate: settings OK ({source}): {target}, {} shard(s)",
        settings.stream.shards
    );
    Ok(ExitCode::SUCCESS)
}

async fn client_call(settings: &Settings, op: SeatOp, args: ClientArgs) -> Result<ExitCode, Error> {
    let meta = match &args.meta {
        Some(meta) => {
            let parsed: serde_json::Value = serde_json::from_str(meta)
                .map_err(|e| Error::Usage(format!("--meta is not valid JSON: {e}")))?;
            if !parsed.is_object() {
                return Err(Error::Usage(
                    "--meta must be a JSON object, like '{\"user_email\":\"a@b.c\"}'".into(),
                ));
            }
            Some(parsed)
        }
        None => None,
    };
    let lease = match &args.lease {
        Some(text) => Some(Lease::parse(text).ok_or_else(|| {
            Error::Usage(
                "--lease must be 16 to 128 characters of A-Z a-z 0-9 _ -, as acquire printed it".into(),
            )
        })?),
        None => None,
    };
    let wait_ms = args.wait.map(|d| d.as_millis() as u64).unwrap_or(0);
    if args.ttl == Some(Duration::ZERO) {
        return Err(Error::Usage("--ttl must be longer than 0".into()));
    }
    let call = Call {
        op,
        license: args.license,
        session: args.session,
        meta,
        wait_ms,
        lease,
        policy: RequestPolicy {
            user: args.user,
            group: args.group,
            priority: args.priority,
            borrow_ms: args.borrow.map_or(0, |d| d.as_millis() as u64),
        },
        ttl_ms: None,
    }
    .with_ttl(args.ttl.unwrap_or(Duration::from_millis(settings.client.ttl_ms)));
    let client = settings.client().connect().await?;
    let result = async {
        let mut pending = client.request(&call).await?;
        let first = pending.reply(args.timeout).await?;
        if first.is_final() {
            return Ok(first);
        }
        print_reply(&first, args.json);
        // The final answer (GRANTED or QUEUE_TIMEOUT) carries the same id. A
        // queued acquire may wait for it as long as it asked to; its
        // QUEUE_TIMEOUT may come up to a reaper period (or a slow pass) late.
        let wait = Duration::from_millis(wait_ms);
        pending
            .final_reply(args.timeout + wait + Duration::from_secs(30))
            .await
    }
    .await;
    let _ = client.close().await;
    let reply = result?;
    print_reply(&reply, args.json);
    Ok(if reply.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_REFUSED)
    })
}

/// `seatgate revoke`: one request on the admin stream, answered like a client call.
async fn revoke(settings: &Settings, args: RevokeArgs) -> Result<ExitCode, Error> {
    let actor = match args.actor {
        Some(actor) => actor,
        None => whoami::username()
            .ok()
            .filter(|name| !name.is_empty())
            .ok_or_else(|| {
                Error::Usage("cannot tell your user name for the audit trail; pass --actor NAME".into())
            })?,
    };
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
    let reply = result?;
    print_reply(&reply, args.json);
    Ok(if reply.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_REFUSED)
    })
}

fn print_reply(reply: &Reply, json: bool) {
    if json {
        println!("{}", serde_json::to_string(reply).unwrap_or_default());
        return;
    }
    let get = |field: &str| printable(reply.get(field)).into_owned();
    let mut line = format!(
        "{}  license={} session={} seats={}/{}",
        get("status"),
        get("license"),
        get("session"),
        get("seats_used"),
        get("seats_total")
    );
    for field in [
        "heartbeats",
        "position",
        "waited_ms",
        "priority",
        "linger_ms",
        "borrowed_until_ms",
        "heartbeat_timeout_ms",
    ] {
        if reply.fields.contains_key(field) {
            line.push_str(&format!(" {field}={}", get(field)));
        }
    }
    // The seat (or place) is bound to the lease: later heartbeats and the
    // release need it (`--lease`). A lease is A-Z a-z 0-9 _ -, safe to print.
    let holds = matches!(
        reply.status(),
        Status::Acquired | Status::AlreadyActive | Status::Queued | Status::Granted
    );
    if let (true, Some(lease)) = (holds, reply.lease()) {
        line.push_str(&format!(" lease={}", lease.as_str()));
    }
    if reply.fields.contains_key("error") {
        line.push_str(&format!("  ({})", get("error")));
    }
    println!("{line}");
}

async fn license_cmd(settings: &Settings, cmd: LicenseCommand) -> Result<ExitCode, Error> {
    let mut con = seatgate::connect(settings).await?;
    let keys = settings.seat_keys();
    match cmd {
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
        } => {
            let change = LicenseChange {
                replace,
                seats_total: seats,
                expires_at_ms: expires.as_deref().map(parse_expiry).transpose()?,
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
            let changed = provision::change(&mut con, &keys, &license, &change).await?;
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
            Some(info) => println!("{}", describe(&info)),
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
                    println!("{}", describe(info));
                }
            }
        }
        LicenseCommand::Delete { license } => {
            let deleted = seatgate::runtime::reaper::Reaper::new(con.clone(), settings)
                .delete_license(&license)
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
                provision::set_group(&mut con, &keys, &license, &user, &group).await?;
                println!("license {license}: user {user} is in group {group}");
            }
            GroupsCommand::Unset { user } => {
                if !provision::unset_group(&mut con, &keys, &license, &user).await? {
                    eprintln!("seatgate: user {user} is not in license {license}'s group map");
                    return Ok(ExitCode::from(EXIT_REFUSED));
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
                        println!("{user} {group}");
                    }
                }
            }
        },
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints the events of every events stream shard as they come (one read
/// loop per shard: on a cluster a blocking read may name one slot only).
async fn follow_events(settings: &Settings, from_start: bool, json: bool) -> Result<(), Error> {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<BTreeMap<String, String>>(1024);
    for stream in settings.events_streams() {
        let tx = tx.clone();
        let mut con =
            seatgate_core::db::Db::connect_blocking(&settings.redis, Duration::from_secs(5)).await?;
        let mut last = if from_start {
            "0".to_owned()
        } else {
            "$".to_owned()
        };
        tokio::spawn(async move {
            loop {
                let read: redis::RedisResult<redis::streams::StreamReadReply> = redis::cmd("XREAD")
                    .arg("COUNT")
                    .arg(500)
                    .arg("BLOCK")
                    .arg(2000)
                    .arg("STREAMS")
                    .arg(&stream)
                    .arg(&last)
                    .query_async(&mut con)
                    .await;
                let Ok(read) = read else {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                };
                for key in read.keys {
                    for entry in key.ids {
                        last = entry.id.clone();
                        let mut fields: BTreeMap<String, String> = entry
                            .map
                            .into_iter()
                            .map(|(k, v)| (k, redis::from_redis_value::<String>(v).unwrap_or_default()))
                            .collect();
                        fields.insert("id".into(), entry.id);
                        if tx.send(fields).await.is_err() {
                            return;
                        }
                    }
                }
            }
        });
    }
    drop(tx);
    let stop = service::shutdown_signal();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => return Ok(()),
            event = rx.recv() => {
                let Some(e) = event else { return Ok(()) };
                if json {
                    println!("{}", serde_json::to_string(&e).unwrap_or_default());
                } else {
                    let get = |k: &str| printable(e.get(k).map(String::as_str).unwrap_or("")).into_owned();
                    let at = get("at_ms").parse::<u64>().map(|ms| humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()).unwrap_or_default();
                    let reason = match (e.get("actor"), e.get("reason")) {
                        (Some(actor), Some(r)) => format!(" (by {}: {})", printable(actor), printable(r)),
                        (None, Some(r)) => format!(" ({})", printable(r)),
                        _ => String::new(),
                    };
                    println!("{at}  {:<13} license={} session={} seats={}/{}{reason}", get("type"), get("license"), get("session"), get("seats_used"), get("seats_total"));
                }
            }
        }
    }
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
        line.push_str(&format!("  expires {}", humantime::format_rfc3339_seconds(at)));
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

/// "never", unix ms, or an RFC 3339 time → unix ms (0 = never).
fn parse_expiry(s: &str) -> Result<u64, Error> {
    if s == "never" {
        return Ok(0);
    }
    if let Ok(ms) = s.parse::<u64>() {
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
    }
}
