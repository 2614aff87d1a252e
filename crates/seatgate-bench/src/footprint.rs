//! What the seat data costs Redis: the reaper's passes over many sessions
//! (wall time, Redis CPU, longest blocking call) and memory per session and
//! per queued waiter. Both build their own data set on a wiped Redis.

use std::time::Instant;

use super::harness::{bench_err, note_row, redis_cpu, row, used_memory, wipe, META};
use super::seat::{Seat, Step};
use super::{Bench, Row};
use crate::Error;
use seatgate::config::Settings;
use seatgate::runtime::due::DueIndex;
use seatgate::runtime::reaper::Reaper;
use seatgate_core::db::Db;
use seatgate_core::license::{self, LicenseSpec};

/// `reaper`: one pass each with no, 1% and 0.1% stale sessions.
pub(super) async fn reaper(b: &mut Bench<'_>) -> Result<(), Error> {
    for r in reaper_run(&b.settings, &mut b.con, b.opts.reaper_sessions).await? {
        b.emit(r);
    }
    Ok(())
}

/// `memory`: bytes per active session and per queued waiter.
pub(super) async fn memory(b: &mut Bench<'_>) -> Result<(), Error> {
    for r in memory_run(&b.settings, &mut b.con).await? {
        b.emit(r);
    }
    Ok(())
}

/// The reaper over `total` licenses of one session each: the data set of a
/// deployment at that scale, filed in the due index as the workers would
/// have filed it. Passes with nothing stale (the steady state: nothing is
/// due), then with 1% and 0.1% of the sessions stale, timing each and
/// Redis's CPU for it, and the longest command Redis timed.
async fn reaper_run(settings: &Settings, con: &mut Db, total: usize) -> Result<Vec<Row>, Error> {
    wipe(con).await?;
    let keys = settings.seat_keys();
    let due = DueIndex::new(settings);
    let (secs, _): (i64, i64) = redis::cmd("TIME").query_async(con).await?;
    let now_ms = secs * 1000;
    let timeout = i64::try_from(settings.sessions.heartbeat_timeout_ms).unwrap_or(i64::MAX);
    let stale_beat = now_ms - 600_000;
    let seeding = Instant::now();
    let mut pipe = redis::pipe();
    for l in 0..total {
        let lic = format!("r{l}");
        let lk = keys.license(&lic);
        pipe.cmd("HSET")
            .arg(&lk.license)
            .arg("seats_total")
            .arg(2)
            .arg("expires_at_ms")
            .arg(0)
            .arg("active")
            .arg(1)
            .ignore();
        pipe.cmd("SADD").arg(keys.license_index()).arg(&lic).ignore();
        pipe.cmd("ZADD").arg(&lk.holders).arg(now_ms).arg("s0").ignore();
        pipe.cmd("HSET")
            .arg(&lk.sessions)
            .arg("s0")
            .arg(format!("{now_ms}:0:{META}"))
            .ignore();
        pipe.add_command(due.file_stale(&lic, now_ms + timeout + 1))
            .ignore();
        if (l + 1) % 1_000 == 0 {
            pipe.query_async::<()>(con).await?;
            pipe = redis::pipe();
        }
    }
    if !pipe.is_empty() {
        pipe.query_async::<()>(con).await?;
    }
    let seeded = seeding.elapsed();
    let reaper = Reaper::new(con.clone(), settings);
    let mut rows = Vec::new();
    let mut aged = 0;
    for (label, stale) in [
        ("none stale", 0usize),
        ("1% stale", total / 100),
        ("0.1% stale", total / 1_000),
    ] {
        // Age `stale` sessions of licenses not aged before, and file them due
        // as a worker would have: time passing, in effect.
        let mut pipe = redis::pipe();
        for l in aged..aged + stale {
            let lic = format!("r{}", l % total);
            pipe.cmd("ZADD")
                .arg(keys.license(&lic).holders)
                .arg("XX")
                .arg(stale_beat)
                .arg("s0")
                .ignore();
            pipe.add_command(due.file_stale(&lic, stale_beat + timeout + 1))
                .ignore();
            if pipe.cmd_iter().count() >= 2_000 {
                pipe.query_async::<()>(con).await?;
                pipe = redis::pipe();
            }
        }
        if !pipe.is_empty() {
            pipe.query_async::<()>(con).await?;
        }
        aged += stale;
        // The slow log keeps every command (a script counts as one) that ran
        // for 500 µs or more, with its time in µs and its name.
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("slowlog-log-slower-than")
            .arg(500)
            .query_async(con)
            .await?;
        let _: () = redis::cmd("SLOWLOG").arg("RESET").query_async(con).await?;
        let cpu0 = redis_cpu(con).await?;
        let started = Instant::now();
        let report = reaper.pass().await?;
        let elapsed = started.elapsed();
        let cpu = redis_cpu(con).await? - cpu0;
        let longest_call = slowest(con).await?;
        let mut r = row(
            "reaper",
            format!("{total} licenses of 1 session, {label}"),
            report.evicted as u64,
            elapsed,
            None,
            format!(
                "one pass: {:.0} ms wall, {:.1} ms Redis CPU, {} licenses reaped, {} evicted, {} swept, longest call {}; seeded in {:.0} s",
                elapsed.as_secs_f64() * 1000.0,
                cpu * 1000.0,
                report.licenses,
                report.evicted,
                report.swept,
                longest_call
                    .map(|(us, name)| format!("{:.1} ms ({name})", us as f64 / 1000.0))
                    .unwrap_or_else(|| "< 0.5 ms".into()),
                seeded.as_secs_f64(),
            ),
        );
        r.ops_per_sec = report.evicted as f64 / elapsed.as_secs_f64();
        rows.push(r);
    }
    Ok(rows)
}

/// The slowest command in Redis's slow log: its time (µs) and its name
/// (for a script, `FCALL` (or the seed's `EVALSHA`) and its first key,
/// which tells reap.lua from the due index scripts).
async fn slowest(con: &mut Db) -> Result<Option<(i64, String)>, Error> {
    let entries: Vec<redis::Value> = redis::cmd("SLOWLOG").arg("GET").arg(128).query_async(con).await?;
    let mut slowest: Option<(i64, String)> = None;
    for entry in entries {
        let redis::Value::Array(parts) = entry else {
            continue;
        };
        let (Some(redis::Value::Int(us)), Some(redis::Value::Array(args))) = (parts.get(2), parts.get(3))
        else {
            continue;
        };
        let arg = |i: usize| {
            args.get(i)
                .and_then(|a| redis::from_redis_value::<String>(a.clone()).ok())
                .unwrap_or_default()
        };
        let mut name = arg(0).to_uppercase();
        if name == "EVALSHA" || name == "FCALL" {
            name = format!("{name} {}", arg(3));
        }
        if slowest.as_ref().is_none_or(|(max, _)| us > max) {
            slowest = Some((*us, name));
        }
    }
    Ok(slowest)
}

/// Bytes of the events streams (`MEMORY USAGE … SAMPLES 0`: every node).
async fn events_bytes(con: &mut Db, settings: &Settings) -> Result<i64, Error> {
    let mut total = 0;
    for stream in settings.events_streams() {
        let bytes: Option<i64> = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(&stream)
            .arg("SAMPLES")
            .arg(0)
            .query_async(con)
            .await?;
        total += bytes.unwrap_or(0);
    }
    Ok(total)
}

/// Bytes of Redis memory per active session (10,000 licenses × 10 sessions,
/// ~60-byte metadata) and per queued waiter: what its seat or place holds,
/// and apart from it what its event (`acquired`, `queued`) adds to the
/// events stream, which keeps events for `events.retention` whether the
/// seat or place still exists or not.
async fn memory_run(settings: &Settings, con: &mut Db) -> Result<Vec<Row>, Error> {
    wipe(con).await?;
    let keys = settings.seat_keys();
    for l in 0..10_000 {
        let spec = LicenseSpec {
            seats_total: 10,
            expires_at_ms: 0,
            active: true,
            heartbeat_timeout_ms: None,
        };
        license::put(con, &keys, &format!("m{l}"), &spec).await?;
    }
    let spec = LicenseSpec {
        seats_total: 0,
        expires_at_ms: 0,
        active: true,
        heartbeat_timeout_ms: None,
    };
    // One long queue, and 100 short ones: a license's queue of up to 128
    // waiters is kept in Redis's compact encodings (docs/performance.md).
    let pools: Vec<String> = (0..100).map(|p| format!("pool{p}")).collect();
    for lic in std::iter::once("waitlist").chain(pools.iter().map(String::as_str)) {
        license::put(con, &keys, lic, &spec).await?;
    }
    let _: () = redis::cmd("HSET")
        .arg(keys.license("waitlist").license)
        .arg("queue_max")
        .arg(100_000)
        .query_async(con)
        .await?;
    let before = used_memory(con).await?;
    let events_before = events_bytes(con, settings).await?;
    let mut pipe = redis::pipe();
    let mut n = 0;
    for l in 0..10_000 {
        let lic = format!("m{l}");
        for s in 0..10 {
            let session = format!("sess-{l}-{s}");
            let meta = format!(
                r#"{{"user_email":"user{:04}@example.com","hardware_id":"hw-{:06x}"}}"#,
                s, l
            );
            pipe.add_command(Seat::new(&keys, &lic, &session).cmd(Step::Acquire { meta: &meta }))
                .ignore();
            n += 1;
        }
        if n >= 2_000 {
            pipe.query_async::<()>(con).await?;
            pipe = redis::pipe();
            n = 0;
        }
    }
    if !pipe.is_empty() {
        pipe.query_async::<()>(con).await?;
    }
    let after_sessions = used_memory(con).await?;
    let events_after_sessions = events_bytes(con, settings).await?;
    let used: i64 = redis::cmd("ZCARD")
        .arg(keys.license("m0").holders)
        .query_async(con)
        .await?;
    if used != 10 {
        return Err(bench_err(format!(
            "memory: expected 10 holders of m0, found {used}"
        )));
    }
    // A reply stream as a client names one: inside the reply namespace.
    let reply_to = format!("{}client-0001", settings.replies.prefix);
    let queue_up = |license: &str, w: usize, pipe: &mut redis::Pipeline| {
        let session = format!("wait-{w}");
        let meta = format!(r#"{{"user_email":"user{w:04}@example.com","hardware_id":"hw-{w:06x}"}}"#);
        let queue = Step::Queue {
            meta: &meta,
            wait_ms: 3_600_000,
            request_id: "req-1796011839633-0",
            reply_to: &reply_to,
        };
        pipe.add_command(Seat::new(&keys, license, &session).cmd(queue))
            .ignore();
    };
    let mut pipe = redis::pipe();
    for w in 0..10_000 {
        queue_up("waitlist", w, &mut pipe);
    }
    pipe.query_async::<()>(con).await?;
    let after_waiters = used_memory(con).await?;
    let events_after_waiters = events_bytes(con, settings).await?;
    // The same 10,000 waiters (sessions, records) again, 100 to a license.
    let mut pipe = redis::pipe();
    for w in 0..10_000 {
        queue_up(&pools[w % 100], w, &mut pipe);
    }
    pipe.query_async::<()>(con).await?;
    let after_short = used_memory(con).await?;
    let events_after_short = events_bytes(con, settings).await?;
    let short_events = (events_after_short - events_after_waiters) as f64 / 10_000.0;
    let per_short = (after_short - after_waiters) as f64 / 10_000.0 - short_events;
    let session_events = (events_after_sessions - events_before) as f64 / 100_000.0;
    let waiter_events = (events_after_waiters - events_after_sessions) as f64 / 10_000.0;
    let per_session = (after_sessions - before) as f64 / 100_000.0 - session_events;
    let per_waiter = (after_waiters - after_sessions) as f64 / 10_000.0 - waiter_events;
    Ok(vec![
        note_row(
            "memory",
            "10,000 licenses x 10 sessions, ~60 B meta".into(),
            format!("{per_session:.0} bytes per active session (+{session_events:.0} for its event)"),
        ),
        note_row(
            "memory",
            "10,000 queued waiters on one license".into(),
            format!("{per_waiter:.0} bytes per queued waiter (+{waiter_events:.0} for its event)"),
        ),
        note_row(
            "memory",
            "10,000 queued waiters, 100 on each of 100 licenses".into(),
            format!("{per_short:.0} bytes per queued waiter (+{short_events:.0} for its event)"),
        ),
    ])
}
