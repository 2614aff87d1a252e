//! One history run: the fleet (faults.rs), concurrent wire-level clients, an
//! administrator, a sampler and the fault schedule, all seeded; then the
//! quiesce (faults healed, every request answered, the reaper caught up) and
//! the collection of the events and the final state.
//!
//! The clients speak the wire protocol by hand (XADD / XREAD), not through
//! `seatgate_client`, so that the record is exactly what went over the wire and
//! a request id can be sent again on purpose.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::cluster::{ClusterClient, ClusterConfig};
use redis::AsyncConnectionConfig;
use tokio_util::sync::CancellationToken;

use super::faults::{self, Fleet};
use super::record::{
    entry_ms, AdminAction, AdminKind, Event, Fault, FinalLicense, History, Hold, HoldEnd, LicenseSetup,
    Received, Sample, Sent,
};
use super::{Options, Rng};
use crate::Error;
use seatgate::config::Settings;
use seatgate::views::usage::UsageReport;
use seatgate_core::db::Db;
use seatgate_core::keys::Keys;

/// The heartbeat timeout of every license of a run, ms: short, so that the
/// reaper's work (and its mistakes) show within a short run.
const HEARTBEAT_TIMEOUT_MS: u64 = 4000;
/// The reaper runs every second.
const REAPER_PERIOD_MS: u64 = 1000;
/// How long a client waits for a reply before it sends the request again.
const REPLY_TIMEOUT: Duration = Duration::from_secs(6);
/// The `ttl_ms` every request carries.
const TTL_MS: u64 = 5000;
/// Users the sessions name (a small pool, so per-user limits bind).
const USERS: [&str; 4] = ["ada", "bob", "cyd", "dee"];
/// Requests and events shards on a cluster: 2 per master, so that the
/// licenses' streams lie on several masters (each of the 4 licenses' slots
/// and shards: docs/testing.md, "History checker").
const CLUSTER_SHARDS: usize = 6;

/// The shard count every `seatgate` process of a cluster run is given.
fn shards_env(cluster: bool) -> Vec<(String, String)> {
    if cluster {
        vec![("SEATGATE__STREAM__SHARDS".to_owned(), CLUSTER_SHARDS.to_string())]
    } else {
        Vec::new()
    }
}

/// The settings the workers run with (besides the defaults).
fn worker_env() -> Vec<(String, String)> {
    [
        ("SEATGATE__REAPER__SCHEDULE", "* * * * * *"),
        ("SEATGATE__REAPER__LOCK_MS", "3000"),
        ("SEATGATE__REAPER__REDELIVER_AFTER_MS", "1500"),
        ("SEATGATE__STREAM__CLAIM_IDLE_MS", "3000"),
        ("SEATGATE__STREAM__BLOCK_MS", "200"),
        ("SEATGATE__REDIS__RESPONSE_TIMEOUT_MS", "2000"),
        ("SEATGATE__REDIS__CONNECT_TIMEOUT_MS", "1000"),
        // Denial sampling within reach of a short run: past 3 denials of a
        // license in 2 s, a denial is folded into the next recorded one's
        // `folded` (or the reaper's aggregate), which the checks count.
        ("SEATGATE__EVENTS__DENIALS_WINDOW_MS", "2000"),
        ("SEATGATE__EVENTS__DENIALS_PER_WINDOW", "3"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

/// The licenses of a run: each policy the protocol documents that changes
/// who holds a seat, on its own license.
fn licenses() -> Vec<LicenseSetup> {
    let base = |name: &str, seats| LicenseSetup {
        name: name.to_owned(),
        seats,
        max_per_user: None,
        max_priority: None,
        linger_ms: None,
        heartbeat_timeout_ms: HEARTBEAT_TIMEOUT_MS,
    };
    vec![
        base("h-tight", 2),
        LicenseSetup {
            max_per_user: Some(1),
            max_priority: Some(2),
            ..base("h-user", 3)
        },
        LicenseSetup {
            linger_ms: Some(1500),
            ..base("h-linger", 2)
        },
        base("h-churn", 3),
    ]
}

/// `seatgate license put` arguments that create `l` as set up.
fn put_args(l: &LicenseSetup, seats: u64) -> Vec<String> {
    let mut args = vec![
        "license".to_owned(),
        "put".to_owned(),
        l.name.clone(),
        "--seats".to_owned(),
        seats.to_string(),
        "--heartbeat-timeout".to_owned(),
        format!("{}ms", l.heartbeat_timeout_ms),
    ];
    if let Some(n) = l.max_per_user {
        args.extend(["--max-per-user".to_owned(), n.to_string()]);
    }
    if let Some(p) = l.max_priority {
        args.extend(["--max-priority".to_owned(), p.to_string()]);
    }
    if let Some(ms) = l.linger_ms {
        args.extend(["--linger".to_owned(), format!("{ms}ms")]);
    }
    args
}

/// Where the run's Redis is, for the harness's own connections.
#[derive(Debug, Clone)]
struct Target {
    /// The node's URL (on a cluster, a seed's: unused).
    url: String,
    /// A cluster's seed URLs; empty for one node.
    cluster: Vec<String>,
}

/// What every task of a run shares.
pub struct Ctx {
    target: Target,
    binary: std::path::PathBuf,
    /// What every `seatgate` CLI process is given besides `--redis`: on a
    /// cluster its seeds ([`Fleet::redis_env`]) and the shard count.
    env: Vec<(String, String)>,
    /// The defaults, on a cluster with its seeds and [`CLUSTER_SHARDS`]:
    /// which shard a license's requests and events use.
    settings: Settings,
    keys: Keys,
    licenses: Vec<LicenseSetup>,
    stop: CancellationToken,
}

/// Runs `opts`'s history and returns it, ready for [`super::check`].
pub async fn run(opts: &Options) -> Result<History, Error> {
    let root = Rng::new(opts.seed);
    let mut env = worker_env();
    env.extend(shards_env(opts.cluster));
    let mut fleet = Fleet::start(opts.binary.clone(), opts.workers.max(1), env, opts.cluster).await?;
    let mut settings = Settings::load(None)?;
    settings.redis.cluster_urls = fleet.cluster_urls();
    if opts.cluster {
        settings.stream.shards = CLUSTER_SHARDS;
    }
    let ctx = Arc::new(Ctx {
        target: Target {
            url: fleet.url(),
            cluster: fleet.cluster_urls(),
        },
        binary: opts.binary.clone(),
        env: fleet
            .redis_env()
            .into_iter()
            .chain(shards_env(opts.cluster))
            .collect(),
        keys: settings.seat_keys(),
        settings,
        licenses: licenses(),
        stop: CancellationToken::new(),
    });
    for l in &ctx.licenses {
        cli(&ctx, put_args(l, l.seats)).await?;
    }
    let mut history = History {
        seed: opts.seed,
        cluster: opts.cluster,
        licenses: ctx.licenses.clone(),
        reaper_period_ms: REAPER_PERIOD_MS,
        ..History::default()
    };
    // What a cluster fault aims at: the master of a license's slot.
    let aims: Vec<(String, String)> = ctx
        .licenses
        .iter()
        .map(|l| (l.name.clone(), ctx.keys.license(&l.name).license))
        .collect();

    let start = Instant::now();
    let mut clients = Vec::new();
    for i in 0..opts.clients {
        let (ctx, rng) = (ctx.clone(), root.fork(i as u64 + 1));
        clients.push(tokio::spawn(async move { client_task(ctx, i, rng).await }));
    }
    let admin = {
        let (ctx, rng, me) = (ctx.clone(), root.fork(1000), opts_admin_id(opts));
        tokio::spawn(async move { admin_task(ctx, me, rng).await })
    };
    let samples = Arc::new(Mutex::new(Vec::new()));
    let sampler = {
        let (ctx, samples) = (ctx.clone(), samples.clone());
        tokio::spawn(async move { sampler_task(ctx, samples).await })
    };

    // The faults, one after another, on this task (it owns the processes).
    let plan = if opts.faults {
        let aimed = if opts.cluster { aims.len() } else { 0 };
        faults::schedule(
            &mut root.fork(2000),
            opts.duration,
            opts.workers.max(1),
            aimed,
            opts.master_kill9,
        )
    } else {
        Vec::new()
    };
    for planned in plan {
        let at = start + planned.at;
        tokio::time::sleep_until(at.into()).await;
        let began = Instant::now();
        let detail = fleet.inject(&planned, &aims).await?;
        history.faults.push(Fault {
            kind: planned.kind,
            target: Some(planned.target),
            at: planned.at,
            lasted: began.elapsed(),
            detail,
        });
    }
    tokio::time::sleep_until((start + opts.duration).into()).await;

    // Quiesce: clients stop (releasing what they hold, but for the seats
    // they abandon), every fault healed, every request answered.
    ctx.stop.cancel();
    fleet.heal().await?;
    let mut tails = Vec::new();
    for c in clients {
        let (h, tail) = c
            .await
            .map_err(|e| Error::History(format!("a client task failed: {e}")))?;
        history.absorb(h);
        tails.push(tail);
    }
    let (h, tail) = admin
        .await
        .map_err(|e| Error::History(format!("the admin task failed: {e}")))?;
    history.absorb(h);
    tails.push(tail);
    let mut con = connect(&ctx.target, Some(Duration::from_secs(5))).await?;
    (history.pending_at_end, history.pending_where) =
        wait_answered(&ctx, &mut con, Duration::from_secs(60)).await?;
    // The reaper's turn: abandoned seats time out, lingering ones end.
    let linger = ctx.licenses.iter().filter_map(|l| l.linger_ms).max().unwrap_or(0);
    let settle = Duration::from_millis(HEARTBEAT_TIMEOUT_MS + linger + 4 * REAPER_PERIOD_MS + 1500);
    tokio::time::sleep(settle).await;
    // A little longer while something is left (within the outage rule's
    // bound after the last fault): the check judges what stays.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        history.final_state = final_state(&ctx, &mut con).await?;
        let busy = history
            .final_state
            .values()
            .any(|f| !f.holders.is_empty() || !f.waiting.is_empty() || f.outbox > 0 || f.unrelayed > 0);
        if !busy || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    sampler.abort();
    history.samples = std::mem::take(&mut *samples.lock().unwrap_or_else(|p| p.into_inner()));
    // Replies that came after their client stopped reading.
    for (client, stream, last) in tails {
        for (entry, fields) in xrange(&mut con, &stream, &format!("({last}")).await? {
            history.received.push(Received {
                client,
                entry,
                fields,
            });
        }
    }
    // Every events shard (one on one node). On a cluster the relay has
    // moved each license's events from its log by now: the wait above
    // lasted more than one reaper period (the relay's promise) after the
    // last reply, and ends early only once no log holds an entry.
    for events in ctx.settings.events_streams() {
        for (entry, fields) in xrange(&mut con, &events, "-").await? {
            history.events.push(Event {
                stream: events.clone(),
                entry,
                fields,
            });
        }
    }
    history.audit = Some(external_audit(&ctx).await);
    history.report = Some(external_report(&ctx).await);
    Ok(history)
}

/// Runs `seatgate --redis <the run's Redis> <args>` and returns its stdout
/// when it exits 0 (`Err` with its exit and output otherwise, or why it
/// could not start).
async fn seatgate(ctx: &Ctx, args: &[&str]) -> Result<String, String> {
    let (binary, url, env) = (ctx.binary.clone(), ctx.target.url.clone(), ctx.env.clone());
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let what = format!("seatgate {}", args.join(" "));
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(binary)
            .arg("--redis")
            .arg(url)
            .args(args)
            .envs(env)
            .env("RUST_LOG", "error")
            .output()
    })
    .await
    .map_err(|e| format!("{what}: {e}"))?
    .map_err(|e| format!("{what} did not start: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        Ok(stdout)
    } else {
        Err(format!(
            "{what} exited {:?}: {}{}",
            out.status.code(),
            stdout.trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// `seatgate audit` over the run's Redis (issue 22: the history checker
/// holds the audit to the same history): `Err` with its output when it
/// found a violation (exit 1) or failed.
pub async fn external_audit(ctx: &Ctx) -> Result<(), String> {
    seatgate(ctx, &["audit"]).await.map(|_| ())
}

/// `seatgate report --format json` over the run's Redis, everything kept
/// (the run's whole life): what the `report` check compares with the
/// history's own totals.
pub async fn external_report(ctx: &Ctx) -> Result<UsageReport, String> {
    let json = seatgate(ctx, &["report", "--format", "json"]).await?;
    serde_json::from_str(json.trim()).map_err(|e| format!("seatgate report --format json: not a report: {e}"))
}

/// The administrator's client number: one past the clients'.
fn opts_admin_id(opts: &Options) -> usize {
    opts.clients
}

/// A connection to the run's Redis; `response` None for blocking reads.
/// On a cluster, redis-rs's cluster connection: each command goes to the
/// master that owns its key's slot (a transaction of one license's keys
/// and `TIME` to that license's master), following `MOVED` after a
/// failover.
async fn connect(target: &Target, response: Option<Duration>) -> Result<Db, Error> {
    let connect = Duration::from_secs(1);
    if !target.cluster.is_empty() {
        let client = ClusterClient::builder(target.cluster.clone()).build()?;
        // Blocking reads are bounded by the callers' own timeouts.
        let cfg = ClusterConfig::new()
            .set_connection_timeout(connect)
            .set_response_timeout(response.unwrap_or(Duration::from_secs(30)));
        return Ok(Db::Cluster(client.get_async_connection_with_config(cfg).await?));
    }
    let client = seatgate_core::db::node_client(target.url.as_str(), None)?;
    let cfg = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(connect))
        .set_response_timeout(response);
    Ok(Db::Plain(
        client.get_multiplexed_async_connection_with_config(&cfg).await?,
    ))
}

/// Runs the `seatgate` CLI against the run's Redis; Err when it fails.
async fn cli(ctx: &Ctx, args: Vec<String>) -> Result<(), Error> {
    let (binary, url, env) = (ctx.binary.clone(), ctx.target.url.clone(), ctx.env.clone());
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(binary)
            .arg("--redis")
            .arg(url)
            .args(&args)
            .envs(env)
            .env("RUST_LOG", "error")
            .output()
    })
    .await
    .map_err(|e| Error::History(e.to_string()))??;
    if out.status.success() {
        Ok(())
    } else {
        Err(Error::History(format!(
            "seatgate CLI failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

type Fields = BTreeMap<String, String>;

/// `XRANGE stream start +`, every entry, paged.
async fn xrange(con: &mut Db, stream: &str, start: &str) -> Result<Vec<(String, Fields)>, Error> {
    let mut out = Vec::new();
    let mut from = start.to_owned();
    loop {
        let page: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
            .arg(stream)
            .arg(&from)
            .arg("+")
            .arg("COUNT")
            .arg(1000)
            .query_async(con)
            .await?;
        let n = page.len();
        for (id, fields) in page {
            from = format!("({id}");
            out.push((id, fields.into_iter().collect()));
        }
        if n < 1000 {
            return Ok(out);
        }
    }
}

/// Redis's clock, unix ms.
async fn redis_ms(con: &mut Db) -> Result<u64, Error> {
    let (s, us): (u64, u64) = bounded(redis::cmd("TIME").query_async(con)).await?;
    Ok(s * 1000 + us / 1000)
}

/// `fut`, or an error after 3 s. The sampler's and the administrator's
/// commands are bounded from outside: on a cluster a transaction sent to a
/// master SIGSTOPped meanwhile once hung for good despite the connection's
/// response timeout (a 5-minute run's samples stopped at 75 s, at such a
/// stop), and the task with it.
async fn bounded<T>(fut: impl std::future::Future<Output = redis::RedisResult<T>>) -> redis::RedisResult<T> {
    tokio::time::timeout(Duration::from_secs(3), fut)
        .await
        .unwrap_or_else(|_| Err((redis::ErrorKind::Io, "timed out").into()))
}

/// Waits (up to `within`) until no request waits in the group, on every
/// requests stream (each shard) and the admin stream: none pending, none
/// after the group's last-delivered-id. Returns how many still do, and
/// where.
///
/// Unread entries are counted by XRANGE after the last-delivered-id, not
/// taken from XINFO GROUPS' `lag`: a replica promoted by a failover does
/// not have its master's count of the entries the group read (Redis 7.0
/// replicates no `entries-read`), and its `lag` can then name entries that
/// were read and answered long ago (each stream's `lag` is in the detail
/// when something waits).
async fn wait_answered(ctx: &Ctx, con: &mut Db, within: Duration) -> Result<(u64, Vec<String>), Error> {
    let deadline = Instant::now() + within;
    let mut streams = ctx.settings.read_streams();
    streams.push(ctx.settings.stream.admin_requests.clone());
    let group = &ctx.settings.stream.group;
    loop {
        let mut left = 0u64;
        let mut at = Vec::new();
        for stream in &streams {
            let groups: Vec<HashMap<String, redis::Value>> = redis::cmd("XINFO")
                .arg("GROUPS")
                .arg(stream)
                .query_async(con)
                .await
                .unwrap_or_default();
            let text = |g: &HashMap<String, redis::Value>, k: &str| {
                g.get(k)
                    .and_then(|v| redis::from_redis_value::<Option<String>>(v.clone()).ok())
                    .flatten()
                    .unwrap_or_default()
            };
            let Some(ours) = groups.iter().find(|g| text(g, "name") == *group) else {
                continue;
            };
            let pending: u64 = text(ours, "pending").parse().unwrap_or(0);
            let last = text(ours, "last-delivered-id");
            let unread = xrange(con, stream, &format!("({last}")).await?.len() as u64;
            if pending + unread > 0 {
                left += pending + unread;
                at.push(format!(
                    "{stream} pending {pending} unread {unread} (XINFO: last-delivered-id {last} entries-read {:?} lag {:?})",
                    text(ours, "entries-read"),
                    text(ours, "lag")
                ));
            }
        }
        if left == 0 || Instant::now() > deadline {
            return Ok((left, at));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Every license's holders, waiters, outbox and events not yet relayed
/// (its own log: on one node always empty), as stored.
async fn final_state(ctx: &Ctx, con: &mut Db) -> Result<BTreeMap<String, FinalLicense>, Error> {
    let mut out = BTreeMap::new();
    for l in &ctx.licenses {
        let k = ctx.keys.license(&l.name);
        let log = ctx.keys.event_keys(&l.name).log;
        type Read = (Vec<String>, Vec<String>, u64, bool, u64);
        let (holders, waiting, outbox, exists, unrelayed): Read = redis::pipe()
            .atomic()
            .cmd("ZRANGE")
            .arg(&k.holders)
            .arg(0)
            .arg(-1)
            .cmd("ZRANGE")
            .arg(&k.queue)
            .arg(0)
            .arg(-1)
            .cmd("HLEN")
            .arg(&k.outbox)
            .cmd("EXISTS")
            .arg(&k.license)
            .cmd("XLEN")
            .arg(&log)
            .query_async(con)
            .await?;
        out.insert(
            l.name.clone(),
            FinalLicense {
                holders,
                waiting,
                outbox,
                exists,
                unrelayed,
            },
        );
    }
    Ok(out)
}

/// Samples every license's holders and seats (one transaction each, with
/// Redis's clock) every 150 ms until aborted; skips while Redis is away.
async fn sampler_task(ctx: Arc<Ctx>, samples: Arc<Mutex<Vec<Sample>>>) {
    let mut con: Option<Db> = None;
    loop {
        tokio::time::sleep(Duration::from_millis(150)).await;
        if con.is_none() {
            con = tokio::time::timeout(
                Duration::from_secs(3),
                connect(&ctx.target, Some(Duration::from_secs(1))),
            )
            .await
            .ok()
            .and_then(Result::ok);
        }
        let Some(c) = con.as_mut() else { continue };
        for l in &ctx.licenses {
            let k = ctx.keys.license(&l.name);
            let mut pipe = redis::pipe();
            pipe.atomic()
                .cmd("ZCARD")
                .arg(&k.holders)
                .cmd("HGET")
                .arg(&k.license)
                .arg("seats_total")
                .cmd("TIME");
            let read: redis::RedisResult<(u64, Option<u64>, (u64, u64))> = bounded(pipe.query_async(c)).await;
            match read {
                Ok((holders, seats_total, (s, us))) => {
                    let sample = Sample {
                        license: l.name.clone(),
                        at_ms: s * 1000 + us / 1000,
                        holders,
                        seats_total,
                    };
                    samples.lock().unwrap_or_else(|p| p.into_inner()).push(sample);
                }
                Err(_) => {
                    con = None;
                    break;
                }
            }
        }
    }
}

/// One client's (or the administrator's) side of the wire: its reply
/// stream, what it read and not yet used, and its record.
struct Wire {
    me: usize,
    target: Target,
    con: Option<Db>,
    reply_to: String,
    last: String,
    inbox: HashMap<String, VecDeque<Received>>,
    next_id: u64,
    hist: History,
}

/// A request's outcome: its first reply (None: none in time, after every
/// re-send), and the entry times of the XADDs that reached the stream.
struct Outcome {
    reply: Option<Received>,
    id: String,
    sent_ms: Vec<u64>,
}

impl Outcome {
    fn status(&self) -> &str {
        self.reply.as_ref().map(|r| r.get("status")).unwrap_or("")
    }

    /// When its last XADD reached the stream (0: none did).
    fn last_sent_ms(&self) -> u64 {
        self.sent_ms.last().copied().unwrap_or(0)
    }

    /// When its reply was written (the reply's entry id); without one, when
    /// it was last sent.
    fn answered_ms(&self) -> u64 {
        self.reply
            .as_ref()
            .map_or_else(|| self.last_sent_ms(), |r| entry_ms(&r.entry))
    }
}

impl Wire {
    fn new(ctx: &Ctx, me: usize, name: &str) -> Wire {
        Wire {
            me,
            target: ctx.target.clone(),
            con: None,
            reply_to: format!("{}history:{name}", ctx.settings.replies.prefix),
            last: "0".to_owned(),
            inbox: HashMap::new(),
            next_id: 0,
            hist: History::default(),
        }
    }

    async fn con(&mut self) -> Option<&mut Db> {
        if self.con.is_none() {
            self.con = connect(&self.target, None).await.ok();
        }
        self.con.as_mut()
    }

    /// XADDs `fields` under `id` to `stream`; the entry id, or why not.
    async fn xadd(&mut self, stream: &str, id: &str, fields: &[(String, String)]) -> Result<String, String> {
        let mut cmd = redis::cmd("XADD");
        cmd.arg(stream)
            .arg("*")
            .arg("id")
            .arg(id)
            .arg("reply_to")
            .arg(&self.reply_to);
        for (k, v) in fields {
            cmd.arg(k).arg(v);
        }
        let Some(con) = self.con().await else {
            return Err("no connection".into());
        };
        match tokio::time::timeout(Duration::from_secs(3), cmd.query_async::<String>(con)).await {
            Ok(Ok(entry)) => Ok(entry),
            Ok(Err(e)) => {
                self.con = None;
                Err(e.to_string())
            }
            Err(_) => {
                self.con = None;
                Err("XADD timed out".into())
            }
        }
    }

    /// One blocking read of the reply stream; every entry is recorded.
    async fn read(&mut self, block_ms: u64) {
        let (stream, last) = (self.reply_to.clone(), self.last.clone());
        let Some(con) = self.con().await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            return;
        };
        let mut cmd = redis::cmd("XREAD");
        cmd.arg("COUNT")
            .arg(100)
            .arg("BLOCK")
            .arg(block_ms)
            .arg("STREAMS")
            .arg(&stream)
            .arg(&last);
        let read = cmd.query_async::<Option<Vec<(String, Vec<(String, Vec<(String, String)>)>)>>>(con);
        match tokio::time::timeout(Duration::from_millis(block_ms + 2000), read).await {
            Ok(Ok(Some(streams))) => {
                for (_, entries) in streams {
                    for (entry, fields) in entries {
                        self.last = entry.clone();
                        let r = Received {
                            client: self.me,
                            entry,
                            fields: fields.into_iter().collect(),
                        };
                        self.inbox
                            .entry(r.get("id").to_owned())
                            .or_default()
                            .push_back(r.clone());
                        self.hist.received.push(r);
                    }
                }
            }
            Ok(Ok(None)) => {}
            Ok(Err(_)) | Err(_) => {
                self.con = None;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }

    /// The next unread reply to `id` before `deadline`.
    async fn next_reply(&mut self, id: &str, deadline: Instant) -> Option<Received> {
        loop {
            if let Some(r) = self.inbox.get_mut(id).and_then(VecDeque::pop_front) {
                return Some(r);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            self.read((left.as_millis() as u64).clamp(1, 500)).await;
        }
    }

    /// Sends `fields` as request `id`, XADDing again (same id) while the
    /// XADD fails; sometimes twice at once on purpose (an ambiguous XADD).
    async fn send(
        &mut self,
        stream: &str,
        id: &str,
        fields: &[(String, String)],
        resend: bool,
        rng: &mut Rng,
        sent_ms: &mut Vec<u64>,
    ) {
        let get = |name: &str| {
            fields
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        let copies = if rng.chance(0.08) { 2 } else { 1 };
        let mut resend = resend;
        for _ in 0..copies {
            for attempt in 0..20 {
                let result = self.xadd(stream, id, fields).await;
                let ok = result.is_ok();
                if let Ok(entry) = &result {
                    sent_ms.push(entry_ms(entry));
                }
                self.hist.sent.push(Sent {
                    client: self.me,
                    id: id.to_owned(),
                    op: get("op"),
                    license: get("license"),
                    session: get("session"),
                    entry: result.as_ref().ok().cloned(),
                    xadd_error: result.err(),
                    resend: resend || attempt > 0,
                });
                if ok {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            resend = true;
        }
    }

    /// A request and its first reply; without one in time it is sent
    /// again, under the same id or (as the protocol advises after a
    /// timeout) a new one, at most three times.
    async fn request(&mut self, stream: &str, fields: Vec<(String, String)>, rng: &mut Rng) -> Outcome {
        let mut id = self.new_id();
        let mut sent_ms = Vec::new();
        let mut resend = false;
        for _ in 0..3 {
            self.send(stream, &id, &fields, resend, rng, &mut sent_ms).await;
            if let Some(reply) = self.next_reply(&id, Instant::now() + REPLY_TIMEOUT).await {
                return Outcome {
                    reply: Some(reply),
                    id,
                    sent_ms,
                };
            }
            if rng.chance(0.5) {
                resend = true;
            } else {
                id = self.new_id();
                resend = false;
            }
        }
        Outcome {
            reply: None,
            id,
            sent_ms,
        }
    }

    fn new_id(&mut self) -> String {
        self.next_id += 1;
        format!("h{}-{}", self.me, self.next_id)
    }
}

fn field(k: &str, v: impl ToString) -> (String, String) {
    (k.to_owned(), v.to_string())
}

/// A client: one session at a time on a random license, acquiring (now or
/// waiting), heartbeating, releasing, sometimes leaving the queue, sometimes
/// abandoning its seat; on stop it releases what it holds. Returns its
/// record and its reply stream's tail (for the last replies).
async fn client_task(ctx: Arc<Ctx>, me: usize, mut rng: Rng) -> (History, (usize, String, String)) {
    let mut w = Wire::new(&ctx, me, &format!("c{me}"));
    let mut k = 0;
    while !ctx.stop.is_cancelled() {
        k += 1;
        let l = rng.pick(&ctx.licenses).clone();
        // The license's shard (the one stream on one node).
        let requests = ctx.settings.request_stream_for(&l.name);
        let session = format!("c{me}-s{k}");
        let lease = rng.lease();
        let user = rng.pick(&USERS).to_string();
        w.hist.users.insert(session.clone(), user.clone());
        let wait_ms = if rng.chance(0.4) { rng.range(1000, 5000) } else { 0 };
        let mut acquire = vec![
            field("op", "acquire"),
            field("license", &l.name),
            field("session", &session),
            field("lease", &lease),
            field("user", &user),
            field("ttl_ms", TTL_MS),
        ];
        if wait_ms > 0 {
            acquire.push(field("wait_ms", wait_ms));
        }
        let priority = rng.range(0, 4);
        if priority > 0 {
            acquire.push(field("priority", priority));
        }
        let base = [
            field("license", &l.name),
            field("session", &session),
            field("lease", &lease),
            field("ttl_ms", TTL_MS),
        ];
        let with_op = |op: &str| {
            let mut f = vec![field("op", op)];
            f.extend(base.iter().cloned());
            f
        };
        let mut out = w.request(&requests, acquire.clone(), &mut rng).await;
        if out.status() == "QUEUED" {
            let leave_after = rng
                .chance(0.15)
                .then(|| Duration::from_millis(rng.range(300, wait_ms)));
            let deadline = Instant::now() + Duration::from_millis(wait_ms) + Duration::from_secs(10);
            let leave_at = leave_after.map(|d| Instant::now() + d);
            let id = out.id.clone();
            // A waiter shows it is alive every quarter of the timeout, or
            // the reaper drops it (docs/protocol.md, "Waiter liveness").
            let every = Duration::from_millis(l.heartbeat_timeout_ms / 4);
            let mut beat_at = Instant::now() + every;
            loop {
                let until = leave_at
                    .unwrap_or(deadline)
                    .min(deadline)
                    .min(beat_at)
                    .min(Instant::now() + Duration::from_millis(500));
                if let Some(r) = w.next_reply(&id, until).await {
                    if r.get("status") != "QUEUED" {
                        out.reply = Some(r);
                        break;
                    }
                    continue;
                }
                let leave = leave_at.is_some_and(|t| Instant::now() >= t)
                    || Instant::now() >= deadline
                    || ctx.stop.is_cancelled();
                if leave {
                    // Leave the queue; a grant that came first is given back.
                    let left = w.request(&requests, with_op("release"), &mut rng).await;
                    out.reply = None;
                    if left.status() == "RELEASED" || left.status() == "LEFT_QUEUE" {
                        w.inbox.remove(&id);
                    }
                    break;
                }
                if Instant::now() >= beat_at {
                    // QUEUED while it waits; a grant's answer is the acquire's reply.
                    w.request(&requests, with_op("heartbeat"), &mut rng).await;
                    beat_at = Instant::now() + every;
                }
            }
        }
        let status = out.status().to_owned();
        if matches!(status.as_str(), "ACQUIRED" | "GRANTED" | "ALREADY_ACTIVE") {
            hold(&ctx, &mut w, &mut rng, &l, &session, &user, out, &with_op).await;
        } else {
            tokio::time::sleep(Duration::from_millis(rng.range(50, 400))).await;
        }
        w.inbox.clear();
    }
    let tail = (me, w.reply_to.clone(), w.last.clone());
    (w.hist, tail)
}

/// Holds the seat `granted` gave: heartbeats every quarter of its timeout
/// for a while, now and then asking for the seat again as a restarted
/// client would (a new request id, the same session and lease: the seat is
/// still its own, ALREADY_ACTIVE), then releases it (under linger,
/// sometimes takes it back and holds again) or abandons it.
#[allow(clippy::too_many_arguments)]
async fn hold(
    ctx: &Ctx,
    w: &mut Wire,
    rng: &mut Rng,
    l: &LicenseSetup,
    session: &str,
    user: &str,
    granted: Outcome,
    with_op: &(dyn Fn(&str) -> Vec<(String, String)> + Sync),
) {
    let requests = ctx.settings.request_stream_for(&l.name);
    let mut granted = granted;
    loop {
        let Some(reply) = granted.reply.as_ref() else {
            return;
        };
        let start_ms = reply
            .get("held_since_ms")
            .parse()
            .unwrap_or_else(|_| entry_ms(&reply.entry));
        let timeout_ms = reply
            .get("heartbeat_timeout_ms")
            .parse()
            .unwrap_or(l.heartbeat_timeout_ms);
        let mut h = Hold {
            client: w.me,
            license: l.name.clone(),
            session: session.to_owned(),
            user: user.to_owned(),
            start_ms,
            timeout_ms,
            heartbeats: Vec::new(),
            end: HoldEnd::Unknown,
        };
        let until = Instant::now() + Duration::from_millis(rng.range(500, 7000));
        let period = Duration::from_millis(timeout_ms / 4);
        let mut lost = false;
        // A seat the client was given instead of the one it held (asked
        // again and answered ACQUIRED: the old one was gone).
        let mut next = None;
        while Instant::now() < until && !ctx.stop.is_cancelled() {
            tokio::select! {
                _ = tokio::time::sleep(period) => {}
                _ = ctx.stop.cancelled() => break,
            }
            if rng.chance(0.1) {
                let mut again = with_op("acquire");
                again.push(field("user", user));
                let asked = w.request(&requests, again, rng).await;
                match asked.status() {
                    // Its own still; ALREADY_ACTIVE does not restart the
                    // heartbeat clock, so it heartbeats at once (below), as
                    // docs/protocol.md tells a client to.
                    "ALREADY_ACTIVE" | "RATE_LIMITED" | "REQUEST_EXPIRED" | "ERROR" | "" => {}
                    other => {
                        h.end = HoldEnd::Lost(asked.last_sent_ms(), asked.answered_ms(), other.to_owned());
                        lost = true;
                        if other == "QUEUED" {
                            let left = w.request(&requests, with_op("release"), rng).await;
                            if left.status() == "RELEASED" || left.status() == "LEFT_QUEUE" {
                                w.inbox.remove(&asked.id);
                            }
                        } else if other == "ACQUIRED" {
                            next = Some(asked);
                        }
                        break;
                    }
                }
            }
            let hb = w.request(&requests, with_op("heartbeat"), rng).await;
            match hb.status() {
                // Decided no earlier than its first XADD: a sign of life then.
                "HEARTBEAT_UPDATED" => h.heartbeats.extend(hb.sent_ms.iter().min()),
                "RATE_LIMITED" | "REQUEST_EXPIRED" | "ERROR" | "" => {}
                other => {
                    h.end = HoldEnd::Lost(hb.last_sent_ms(), hb.answered_ms(), other.to_owned());
                    lost = true;
                    break;
                }
            }
        }
        if lost {
            w.hist.holds.push(h);
            match next {
                Some(seat) => {
                    granted = seat;
                    continue;
                }
                None => return,
            }
        }
        if !ctx.stop.is_cancelled() && rng.chance(0.1) {
            h.end = HoldEnd::Abandoned(h.heartbeats.last().copied().unwrap_or(h.start_ms));
            w.hist.holds.push(h);
            return;
        }
        let rel = w.request(&requests, with_op("release"), rng).await;
        h.end = match (rel.status(), rel.reply.as_ref()) {
            ("RELEASED", Some(r)) => HoldEnd::Released(entry_ms(&r.entry)),
            ("", _) => HoldEnd::Unknown,
            (other, _) => HoldEnd::Lost(rel.last_sent_ms(), rel.answered_ms(), other.to_owned()),
        };
        let lingers = rel
            .reply
            .as_ref()
            .is_some_and(|r| r.fields.contains_key("linger_ms"));
        w.hist.holds.push(h);
        if !(lingers && !ctx.stop.is_cancelled() && rng.chance(0.4)) {
            return;
        }
        // Take the lingering seat back (same session, same lease).
        tokio::time::sleep(Duration::from_millis(rng.range(50, 800))).await;
        let mut again = with_op("acquire");
        again.push(field("user", user));
        granted = w.request(&requests, again, rng).await;
        if granted.status() != "ACQUIRED" {
            return;
        }
    }
}

/// The administrator: now and then revokes a holder, changes a license's
/// seats, or deletes `h-churn` while in use and creates it again.
async fn admin_task(ctx: Arc<Ctx>, me: usize, mut rng: Rng) -> (History, (usize, String, String)) {
    let mut w = Wire::new(&ctx, me, "admin");
    let admin_stream = ctx.settings.stream.admin_requests.clone();
    let mut con: Option<Db> = None;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(rng.range(1500, 4500))) => {}
            _ = ctx.stop.cancelled() => break,
        }
        if con.is_none() {
            con = tokio::time::timeout(
                Duration::from_secs(3),
                connect(&ctx.target, Some(Duration::from_secs(2))),
            )
            .await
            .ok()
            .and_then(Result::ok);
        }
        let Some(c) = con.as_mut() else { continue };
        let l = rng.pick(&ctx.licenses).clone();
        let k = ctx.keys.license(&l.name);
        let roll = rng.range(0, 100);
        if roll < 40 {
            let holders: Vec<String> =
                match bounded(redis::cmd("ZRANGE").arg(&k.holders).arg(0).arg(-1).query_async(c)).await {
                    Ok(h) => h,
                    Err(_) => {
                        con = None;
                        continue;
                    }
                };
            if holders.is_empty() {
                continue;
            }
            let session = rng.pick(&holders).clone();
            let fields = vec![
                field("op", "revoke"),
                field("license", &l.name),
                field("session", &session),
                field("reason", "history"),
                field("actor", "history"),
                field("ttl_ms", TTL_MS),
            ];
            w.request(&admin_stream, fields, &mut rng).await;
        } else {
            let Ok(start_ms) = redis_ms(c).await else {
                con = None;
                continue;
            };
            let (what, args) = if roll < 80 || l.name != "h-churn" {
                let from: u64 = bounded(
                    redis::cmd("HGET")
                        .arg(&k.license)
                        .arg("seats_total")
                        .query_async::<Option<u64>>(c),
                )
                .await
                .ok()
                .flatten()
                .unwrap_or(0);
                if from == 0 {
                    continue;
                }
                let to = rng.range(1, 5);
                (AdminKind::Seats { from, to }, put_args(&l, to))
            } else {
                (
                    AdminKind::Delete,
                    vec![
                        "license".to_owned(),
                        "delete".to_owned(),
                        l.name.clone(),
                        "--yes".to_owned(),
                    ],
                )
            };
            let ok = cli(&ctx, args).await.is_ok();
            let end_ms = redis_ms(c).await.unwrap_or(start_ms);
            let deleted = what == AdminKind::Delete;
            w.hist.admin.push(AdminAction {
                license: l.name.clone(),
                what,
                start_ms,
                end_ms,
                ok,
            });
            if deleted {
                tokio::time::sleep(Duration::from_millis(rng.range(200, 1500))).await;
                let start_ms = redis_ms(c).await.unwrap_or(end_ms);
                let ok = cli(&ctx, put_args(&l, l.seats)).await.is_ok();
                let end_ms = redis_ms(c).await.unwrap_or(start_ms);
                w.hist.admin.push(AdminAction {
                    license: l.name.clone(),
                    what: AdminKind::Create { seats: l.seats },
                    start_ms,
                    end_ms,
                    ok,
                });
            }
        }
    }
    // A deleted license is put back for good.
    for l in &ctx.licenses {
        let k = ctx.keys.license(&l.name);
        if let Some(c) = con.as_mut() {
            let exists: bool = bounded(redis::cmd("EXISTS").arg(&k.license).query_async(c))
                .await
                .unwrap_or(true);
            if !exists {
                let _ = cli(&ctx, put_args(l, l.seats)).await;
            }
        }
    }
    let tail = (me, w.reply_to.clone(), w.last.clone());
    (w.hist, tail)
}
