//! Calls seatgate's seat scripts exactly as the benchmark's direct path and
//! the worker call them, for ops/callgrind.sh: that script counts what the
//! calls cost a `redis-server` running under `valgrind --tool=callgrind`.
//!
//! ```sh
//! cargo run --example script_calls -- URL setup
//! cargo run --example script_calls -- URL MODE CALLS
//! ```
//!
//! `setup` loads the scripts and provisions the license (1,000 seats; with
//! `HOLDERS=N` in the environment, N sessions take seats of it). Each
//! MODE makes CALLS script calls, pipelined 100 deep, on fresh sessions of
//! that one license, and checks every answer:
//!   direct     acquire, release, acquire, ... (no dedupe, no limits: the
//!              benchmark's direct path)
//!   worker     the same with a stream entry id each, as the worker calls
//!              them: the redelivery lookup and record (rate limits off, as
//!              the benchmark's workers run)
//!   limits     worker, with both rate limits on (never reached)
//!   heartbeat  heartbeats of sessions holding a seat (direct)
//!   reap       reaper steps of the license (10 holders, nothing to do)
//!   floor      the direct path's calls, each sent to the function of the
//!              op in examples/floor.lua (loaded here, once): the
//!              same commands, arguments and reply size, no decision
//!   floor-worker the same for the worker's calls (with the redelivery
//!              lookup and record)
//!   handover   the hot license's seat changing hands, as the worker calls
//!              it: on a license whose 10 seats are held and 20 sessions
//!              wait (set up by the first run), the oldest holder releases
//!              (its seat granted to the queue's head in the same call, the
//!              GRANTED reply written by the script) and asks again with a
//!              wait (queued at the tail): release, acquire, ...
//!   grouped    direct acquires and releases of group eng on a license of
//!              group_max cad=1 whose one cad seat is held, nobody waiting
//!   grouped-blocked  the same with 1,000 cad waiters ahead, each blocked
//!              by cad's group_max (set up by the first run): what the
//!              queue by group (lua/includes/queue.lua) makes them cost
//!   e2e        CALLS requests end to end, not script calls: 50 users of one
//!              multiplexed client, acquire, release, ..., through a worker
//!              in this process (its own startup commands are counted too,
//!              a few dozen); CALLS a multiple of 100

use std::collections::VecDeque;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use seatgate::config::Settings;
use seatgate_bench::{bench_settings, cycle_call, Fleet};
use seatgate_core::keys::Keys;
use seatgate_core::policy::RequestPolicy;
use seatgate_core::request::{session, AcquireArgs};
use seatgate_core::request::{Guard, GuardPolicy};
use seatgate_core::scripts::{
    is_already_loaded, OutboxCursor, ReapArgs, ScriptName, Scripts, SeatCall, SessionArgs,
};
use seatgate_core::status::Status;

/// The license every call is about.
const LICENSE: &str = "callgrind";
/// The benchmark's ~60-byte session metadata.
const META: &str = r#"{"user_email":"user1234@example.com","hardware_id":"hw-5f3a9c"}"#;
/// The service's default heartbeat timeout (config/default.toml).
const HEARTBEAT_TIMEOUT_MS: u64 = 90_000;
/// Calls per pipeline.
const DEPTH: usize = 100;

type Failure = Box<dyn std::error::Error>;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Failure> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (url, mode) = match (args.first(), args.get(1)) {
        (Some(url), Some(mode)) => (url.as_str(), mode.as_str()),
        _ => return Err("usage: script_calls URL setup | URL MODE CALLS".into()),
    };
    let client = redis::Client::open(url)?;
    // No response timeout: under valgrind a pipeline of 100 calls takes
    // longer than redis-rs's default 500 ms.
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
    let mut con = client
        .get_multiplexed_async_connection_with_config(&config)
        .await?;
    let scripts = Scripts::get();
    // As the service's: the events recorded (and trimmed) where its scripts record them.
    let keys = Settings::load(None)?.seat_keys();
    // LICENSES=N: direct, worker and limits spread their calls over N
    // licenses (`LICENSE` and `LICENSE-1` .. `LICENSE-<N-1>`), as a service
    // with many licenses in use does.
    let spread = env_count("LICENSES").unwrap_or(1).max(1);
    if mode == "setup" {
        scripts.load_all(&mut con).await?;
        for n in 0..spread {
            redis::cmd("HSET")
                .arg(keys.license(&license_name(n)).license)
                .arg("seats_total")
                .arg(1000)
                .arg("active")
                .arg(1)
                .exec_async(&mut con)
                .await?;
        }
        // HOLDERS=N: N sessions hold seats through every mode after, as on a
        // busy license (the per-session hashes and ZSETs at that size).
        for n in 0..env_count("HOLDERS").unwrap_or(0) {
            take_seat(&mut con, scripts, &keys, LICENSE, &format!("b-{n}")).await?;
        }
        return Ok(());
    }
    let calls: usize = args
        .get(2)
        .and_then(|n| n.parse().ok())
        .ok_or("CALLS: a number of calls")?;
    if mode == "e2e" {
        return end_to_end(url, calls).await;
    }
    let run = std::process::id();
    let now_ms = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() as u64;
    if mode == "handover" {
        return handover(&mut con, &keys, calls, format!("{now_ms}-{run}")).await;
    }
    // A call's guard: none on the direct path; else the worker's, entry `i`.
    let guard = |license: &str, session: &str, i: usize| -> Guard {
        let limit = match mode {
            "worker" | "floor-worker" => 0,
            "limits" => 1_000_000_000,
            _ => return Guard::none(&keys, license, session),
        };
        let entry = format!("{now_ms}-{}", run as usize * 1_000_000 + i);
        worker_guard(&keys, &entry, license, session, limit)
    };
    let floor = mode.starts_with("floor");
    if floor {
        load_floor(&mut con).await?;
    }
    // The grouped modes' license and who asks: group eng.
    let eng = RequestPolicy {
        group: Some("eng".to_owned()),
        ..RequestPolicy::NONE
    };
    let grouped = match mode {
        "grouped" => Some(format!("{LICENSE}-gm")),
        "grouped-blocked" => Some(format!("{LICENSE}-gm-blocked")),
        _ => None,
    };
    if let Some(license) = &grouped {
        set_up_grouped(&mut con, &keys, license, mode == "grouped-blocked").await?;
    }
    let expect = match mode {
        "direct" | "worker" | "limits" | "floor" | "floor-worker" | "grouped" | "grouped-blocked" => {
            ["ACQUIRED", "RELEASED"]
        }
        "heartbeat" => ["HEARTBEAT_UPDATED"; 2],
        "reap" => ["", ""],
        _ => return Err(format!("unknown mode {mode:?}").into()),
    };
    let mut held = Vec::new();
    if mode == "heartbeat" || mode == "reap" {
        for n in 0..10 {
            let session: &'static str = format!("h{run}-{n}").leak();
            take_seat(&mut con, scripts, &keys, LICENSE, session).await?;
            held.push(session);
        }
    }
    let cursor = OutboxCursor::start();
    let mut done = 0;
    while done < calls {
        let batch = DEPTH.min(calls - done);
        let mut pipe = redis::pipe();
        let mut decoders = Vec::with_capacity(batch);
        for i in done..done + batch {
            let session: &'static str = match mode {
                "heartbeat" | "reap" => held[i % held.len()],
                _ => format!("s{run}-{}", i / 2).leak(),
            };
            // An acquire and its release go to the same license.
            let license = match (mode, &grouped) {
                ("heartbeat" | "reap", _) => LICENSE.to_owned(),
                (_, Some(license)) => license.clone(),
                _ => license_name((i / 2) % spread),
            };
            let lk = keys.license(&license);
            let g = guard(&license, session, i);
            if mode == "reap" {
                let step = scripts.reap(
                    &lk,
                    &ReapArgs {
                        default_timeout_ms: HEARTBEAT_TIMEOUT_MS,
                        default_claim_ms: 10_000,
                        limit: 100,
                        redeliver_after_ms: 30_000,
                        outbox: &cursor,
                        outage: Default::default(),
                    },
                );
                pipe.add_command(step.cmd());
                decoders.push(None);
                continue;
            }
            let call = match (mode, i % 2) {
                ("heartbeat", _) => {
                    session::call(ScriptName::Heartbeat, scripts, &lk, &g, &session_args(session))
                }
                (_, 0) if grouped.is_some() => AcquireArgs {
                    who: &eng,
                    ..acquire_args(session)
                }
                .call(scripts, &lk, &g),
                (_, 0) => acquire_args(session).call(scripts, &lk, &g),
                _ => session::call(ScriptName::Release, scripts, &lk, &g, &session_args(session)),
            };
            if floor {
                pipe.add_command(floor_cmd(&call.cmd())?);
                decoders.push(None);
                continue;
            }
            pipe.add_command(call.cmd());
            decoders.push(Some((call, expect[i % 2])));
        }
        send_checked(&mut con, pipe, decoders, mode).await?;
        done += batch;
    }
    Ok(())
}

/// Sends `pipe` and checks each answer: a seat call's status is the one
/// paired with it, and a command sent unchecked (a reaper step, a floor
/// call) did not fail.
async fn send_checked(
    con: &mut redis::aio::MultiplexedConnection,
    pipe: redis::Pipeline,
    checks: Vec<Option<(SeatCall<'_>, &str)>>,
    mode: &str,
) -> Result<(), Failure> {
    let replies: Vec<redis::Value> = pipe.query_async(con).await?;
    for (reply, check) in replies.into_iter().zip(checks) {
        if let Some((call, want)) = check {
            let got = call.decode(Ok(reply))?;
            if got.status().as_str() != want {
                return Err(format!("{}: {} instead of {want}", call.name(), got.status().as_str()).into());
            }
        } else if let redis::Value::ServerError(e) = reply {
            return Err(format!("{mode}: {e:?}").into());
        }
    }
    Ok(())
}

/// A session's arguments as the benchmark's calls send them: no lease.
fn session_args(session: &str) -> SessionArgs<'_> {
    SessionArgs {
        session,
        lease: None,
        default_heartbeat_timeout_ms: HEARTBEAT_TIMEOUT_MS,
        default_claim_ms: 10_000,
    }
}

/// Loads examples/floor.lua unless it is loaded (a plain `FUNCTION LOAD`
/// answers "already exists" without compiling, so the counted run compiles
/// nothing).
async fn load_floor(con: &mut redis::aio::MultiplexedConnection) -> Result<(), Failure> {
    let loaded: redis::RedisResult<String> = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(include_str!("floor.lua"))
        .query_async(con)
        .await;
    match loaded {
        Err(e) if !is_already_loaded(&e) => Err(e.into()),
        _ => Ok(()),
    }
}

/// `cmd`, an `FCALL` of seatgate's library, calling the function of the
/// same name in examples/floor.lua instead, with the same keys and arguments.
fn floor_cmd(cmd: &redis::Cmd) -> Result<redis::Cmd, Failure> {
    let mut floor = redis::Cmd::new();
    for (i, arg) in cmd.args_iter().enumerate() {
        let redis::Arg::Simple(bytes) = arg else {
            return Err("an FCALL argument that is no plain string".into());
        };
        if i == 1 {
            let name = std::str::from_utf8(bytes)?;
            let op = name.rsplit('_').next().ok_or("a function name without an op")?;
            floor.arg(format!("seatgate_floor_{op}"));
        } else {
            floor.arg(bytes);
        }
    }
    Ok(floor)
}

/// The number in environment variable `name`, if it holds one.
fn env_count(name: &str) -> Option<usize> {
    std::env::var(name).ok().and_then(|n| n.parse().ok())
}

/// The worker's guard of stream entry `entry`: the redelivery lookup and
/// record, both rate limits at `limit` (0 = off, as the benchmark's workers run).
fn worker_guard(keys: &Keys, entry: &str, license: &str, session: &str, limit: u64) -> Guard {
    let policy = GuardPolicy {
        dedupe_window_ms: 60_000,
        session_limit: limit,
        license_limit: limit,
        rate_window_ms: 10_000,
        application: Default::default(),
    };
    let mut g = Guard::for_entry(&policy, keys, entry, license, session);
    g.redelivery = true;
    g
}

/// `session` takes a seat of `license` on the direct path, for a mode's setup.
async fn take_seat(
    con: &mut redis::aio::MultiplexedConnection,
    scripts: &Scripts,
    keys: &Keys,
    license: &str,
    session: &str,
) -> Result<(), Failure> {
    let outcome = acquire_args(session)
        .call(
            scripts,
            &keys.license(license),
            &Guard::none(keys, license, session),
        )
        .run(con)
        .await?;
    match outcome.status().as_str() {
        "ACQUIRED" => Ok(()),
        other => Err(format!("setup acquire: {other}").into()),
    }
}

/// The grouped modes' `license`: 1,000 seats, `group_max:cad` 1, its cad
/// seat held; with `blocked`, 1,000 cad waiters queued behind it (each
/// blocked by the group's limit). Done once: later runs find it so.
async fn set_up_grouped(
    con: &mut redis::aio::MultiplexedConnection,
    keys: &Keys,
    license: &str,
    blocked: bool,
) -> Result<(), Failure> {
    let scripts = Scripts::get();
    let lk = keys.license(license);
    let exists: bool = redis::cmd("EXISTS").arg(&lk.license).query_async(con).await?;
    if exists {
        return Ok(());
    }
    redis::cmd("HSET")
        .arg(&lk.license)
        .arg(&[
            "seats_total",
            "1000",
            "active",
            "1",
            "group_max:cad",
            "1",
            "queue_max",
            "5000",
        ])
        .exec_async(con)
        .await?;
    let cad = RequestPolicy {
        group: Some("cad".to_owned()),
        ..RequestPolicy::NONE
    };
    let holder = AcquireArgs {
        who: &cad,
        ..acquire_args("cad-holder")
    }
    .call(scripts, &lk, &Guard::none(keys, license, "cad-holder"))
    .run(con)
    .await?;
    if holder.status() != Status::Acquired {
        return Err(format!("setup cad holder: {}", holder.status()).into());
    }
    for n in 0..if blocked { 1000 } else { 0 } {
        let session = format!("cad-w{n}");
        let o = AcquireArgs {
            who: &cad,
            ..waiting_acquire(&session, "")
        }
        .call(scripts, &lk, &Guard::none(keys, license, &session))
        .run(con)
        .await?;
        if o.status() != Status::Queued {
            return Err(format!("setup cad waiter: {}", o.status()).into());
        }
    }
    Ok(())
}

/// An acquire of `session` that waits for a seat, as a queued user's: its
/// request id and a reply stream inside `replies.prefix`, so that the call
/// that grants it writes its GRANTED itself (one Redis node).
fn waiting_acquire<'a>(session: &'a str, reply_to: &'a str) -> AcquireArgs<'a> {
    AcquireArgs {
        wait_ms: 3_600_000,
        request_id: session,
        reply_to,
        ..acquire_args(session)
    }
}

/// The `handover` mode: `calls` worker calls (entries `<run>-<i>`) on
/// `HOT`, release and acquire in turn, each release granting the queue's
/// head and each acquire queuing the session that released. The first run
/// on a fresh server sets the license up; each run reads who holds and who
/// waits, in order, and follows the hand-overs from there.
async fn handover(
    con: &mut redis::aio::MultiplexedConnection,
    keys: &Keys,
    calls: usize,
    run: String,
) -> Result<(), Failure> {
    const HOT: &str = "callgrind-hot";
    const SEATS: usize = 10;
    const WAITERS: usize = 20;
    if calls % 2 != 0 {
        return Err("handover: CALLS must be even (release, acquire)".into());
    }
    let scripts = Scripts::get();
    let lk = keys.license(HOT);
    // On one node the scripts write a waiter's GRANTED to a reply stream
    // inside replies.prefix themselves, as the service's do.
    let prefix = lk
        .events
        .queue_replies
        .as_ref()
        .map(|q| q.prefix.clone())
        .ok_or("handover: the settings name no replies.prefix for the scripts (a cluster?)")?;
    let reply_to = |session: &str| format!("{prefix}callgrind-{session}");
    let exists: bool = redis::cmd("EXISTS").arg(&lk.license).query_async(con).await?;
    if !exists {
        redis::cmd("HSET")
            .arg(&lk.license)
            .arg("seats_total")
            .arg(SEATS)
            .arg("active")
            .arg(1)
            .exec_async(con)
            .await?;
        for n in 0..SEATS {
            take_seat(con, scripts, keys, HOT, &format!("hot-h{n}")).await?;
        }
        for n in 0..WAITERS {
            let session = format!("hot-w{n}");
            let to = reply_to(&session);
            let g = Guard::none(keys, HOT, &session);
            let got = waiting_acquire(&session, &to)
                .call(scripts, &lk, &g)
                .run(con)
                .await?;
            if got.status() != Status::Queued {
                return Err(format!("handover setup: {} instead of QUEUED", got.status()).into());
            }
        }
    }
    let read = |key: &str| redis::cmd("ZRANGE").arg(key.to_owned()).arg(0).arg(-1).to_owned();
    let holders: Vec<String> = read(&lk.holders).query_async(con).await?;
    let queue: Vec<String> = read(&lk.queue).query_async(con).await?;
    let (mut holders, mut queue) = (VecDeque::from(holders), VecDeque::from(queue));
    if (holders.len(), queue.len()) != (SEATS, WAITERS) {
        return Err(format!("handover: {} holders and {} waiting", holders.len(), queue.len()).into());
    }
    let mut done = 0;
    while done < calls {
        let batch = DEPTH.min(calls - done);
        let mut pipe = redis::pipe();
        let mut decoders = Vec::with_capacity(batch);
        for i in done..done + batch {
            let entry = format!("{run}-{i}");
            let (call, want) = if i % 2 == 0 {
                let session = holders.pop_front().ok_or("handover: no holder")?;
                let granted = queue.pop_front().ok_or("handover: nobody waiting")?;
                holders.push_back(granted);
                queue.push_back(session.clone());
                let session: &'static str = session.leak();
                let g = worker_guard(keys, &entry, HOT, session, 0);
                (
                    session::call(ScriptName::Release, scripts, &lk, &g, &session_args(session)),
                    "RELEASED",
                )
            } else {
                let session: &'static str = queue.back().ok_or("handover: nobody waiting")?.clone().leak();
                let to: &'static str = reply_to(session).leak();
                let g = worker_guard(keys, &entry, HOT, session, 0);
                (waiting_acquire(session, to).call(scripts, &lk, &g), "QUEUED")
            };
            pipe.add_command(call.cmd());
            decoders.push(Some((call, want)));
        }
        send_checked(con, pipe, decoders, "handover").await?;
        done += batch;
    }
    Ok(())
}

/// License `n` of a run spread over several (`LICENSES`): the first is `LICENSE`.
fn license_name(n: usize) -> String {
    if n == 0 {
        LICENSE.to_owned()
    } else {
        format!("{LICENSE}-{n}")
    }
}

/// An acquire that does not wait, as the benchmark's direct path sends it.
fn acquire_args(session: &str) -> AcquireArgs<'_> {
    AcquireArgs {
        session,
        lease: None,
        meta: META,
        wait_ms: 0,
        request_id: "",
        reply_to: "",
        default_queue_max: u64::MAX,
        default_heartbeat_timeout_ms: HEARTBEAT_TIMEOUT_MS,
        default_claim_ms: 10_000,
        who: &RequestPolicy::NONE,
    }
}

/// `calls` requests through the streams: `USERS` users share one
/// multiplexed client, each running the benchmark's acquire → release cycle
/// on a session of its own, decided by a worker in this process set up as
/// the benchmark's are, as `seatgate bench --only seatgate` sends them.
async fn end_to_end(url: &str, calls: usize) -> Result<(), Failure> {
    const USERS: usize = 50;
    if calls % (2 * USERS) != 0 {
        return Err(format!("e2e: CALLS must be a multiple of {}", 2 * USERS).into());
    }
    let mut settings = bench_settings(&Settings::load(None)?);
    settings.redis.url = url.to_owned();
    // Under valgrind a batch's pipeline takes seconds, not the default's 5.
    settings.redis.response_timeout_ms = 600_000;
    let fleet = Fleet::start(&settings, 1).await?;
    let client = settings.client().connect().await?;
    let run = std::process::id();
    let mut users = Vec::new();
    for u in 0..USERS {
        let client = client.clone();
        users.push(tokio::spawn(async move {
            let session = format!("e{run}-{u}");
            for i in 0..calls / USERS {
                let acquire = i % 2 == 0;
                let want = if acquire {
                    Status::Acquired
                } else {
                    Status::Released
                };
                let call = cycle_call(acquire, LICENSE, &session);
                let reply = client.call(&call, Duration::from_secs(600)).await;
                let got = reply.map_err(|e| format!("e2e: {e}"))?.status();
                if got != want {
                    return Err(format!("e2e: {got} instead of {want}"));
                }
            }
            Ok(())
        }));
    }
    for user in users {
        user.await??;
    }
    client.close().await?;
    fleet.stop().await;
    Ok(())
}
