//! The seed design's own seat scripts (`seed/*.lua`), called the way the seed
//! called them: the yardstick of the least Redis work a correct seat decision
//! needs (a SET and a HASH per license, no queue, no dedupe, no streams).
//! Bench only: nothing outside the benchmark runs them.

use std::sync::OnceLock;

use redis::{Script, Value};

use crate::Error;
use seatgate_core::db::Db;

use super::harness::bench_err;

/// `seats_total` every seed acquire passes: more than any run takes, as for
/// the benchmark's seatgate licenses (the seed read it from its database).
const SEATS_TOTAL: u64 = 1_000_000;

/// The two scripts, embedded and hashed once.
struct SeedScripts {
    /// seed/acquire_seat.lua.
    acquire: Script,
    /// seed/release_seat.lua.
    release: Script,
}

fn scripts() -> &'static SeedScripts {
    static SCRIPTS: OnceLock<SeedScripts> = OnceLock::new();
    SCRIPTS.get_or_init(|| SeedScripts {
        acquire: Script::new(include_str!("seed/acquire_seat.lua")),
        release: Script::new(include_str!("seed/release_seat.lua")),
    })
}

/// Loads both scripts: pipelines send EVALSHA and do not re-load on NOSCRIPT.
pub(super) async fn load(con: &mut Db) -> Result<(), Error> {
    let s = scripts();
    s.acquire.prepare_invoke().load_async(con).await?;
    s.release.prepare_invoke().load_async(con).await?;
    Ok(())
}

/// What to ask of a [`SeedSeat`].
#[derive(Clone, Copy)]
pub(super) enum SeedStep<'a> {
    /// acquire_seat.lua, storing `meta`.
    Acquire {
        /// Session metadata (JSON object).
        meta: &'a str,
    },
    /// release_seat.lua.
    Release,
}

/// One session of one license under the seed's data model.
pub(super) struct SeedSeat {
    /// SET of the license's active session ids.
    active: String,
    /// HASH of session id -> JSON metadata.
    metadata: String,
    /// The session id.
    session: String,
}

impl SeedSeat {
    /// The seed's keys (`license:<id>:active_sessions`, `…:session_metadata`)
    /// under the benchmark's prefix, so that they stay inside seatgate's key
    /// space (and its ACL pattern), with the license id as hash tag so that
    /// both land in one cluster slot. These are the seed's names, not
    /// seatgate's, which is why they are built here and not in `engine::keys`.
    pub(super) fn new(prefix: &str, license: &str, session: &str) -> SeedSeat {
        SeedSeat {
            active: format!("{prefix}:seed:{{{license}}}:active_sessions"),
            metadata: format!("{prefix}:seed:{{{license}}}:session_metadata"),
            session: session.to_owned(),
        }
    }

    /// The script call `step` makes: the one place the seed's arguments are bound.
    fn invocation(&self, step: SeedStep<'_>) -> redis::ScriptInvocation<'static> {
        let s = scripts();
        let mut call = match step {
            SeedStep::Acquire { .. } => s.acquire.prepare_invoke(),
            SeedStep::Release => s.release.prepare_invoke(),
        };
        call.key(&self.active) // KEYS[1]
            .key(&self.metadata) // KEYS[2]
            .arg(&self.session); // ARGV[1]
        if let SeedStep::Acquire { meta } = step {
            call.arg(SEATS_TOTAL) // ARGV[2]
                .arg(meta); // ARGV[3]
        }
        call
    }

    /// Adds `step` to `pipe` as EVALSHA (pipelines do not re-load: [`load`] first).
    pub(super) fn add_to(&self, pipe: &mut redis::Pipeline, step: SeedStep<'_>) {
        pipe.invoke_script(&self.invocation(step));
    }

    /// `step` on its own (EVALSHA, re-loading the script on NOSCRIPT): the
    /// seed's status word, or an error when the seed refused.
    pub(super) async fn run(&self, con: &mut Db, step: SeedStep<'_>) -> Result<String, Error> {
        let reply: Vec<Value> = self.invocation(step).invoke_async(con).await?;
        decode(reply)
    }
}

/// The seed's reply `{1|0, status, ...}`: the status when the first element
/// is 1, else an error naming it.
fn decode(reply: Vec<Value>) -> Result<String, Error> {
    let mut it = reply.into_iter();
    let ok = it.next().and_then(|v| redis::from_redis_value::<i64>(v).ok());
    let status = it
        .next()
        .and_then(|v| redis::from_redis_value::<String>(v).ok())
        .unwrap_or_default();
    match ok {
        Some(1) => Ok(status),
        _ => Err(bench_err(format!("seed script refused: {status}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::{cost, Snapshot};
    use seatgate::config::Settings;
    use seatgate_testkit::LocalRedis;

    const META: &str = r#"{"user_email":"a@example.com","hardware_id":"hw-1"}"#;

    /// The ported scripts keep the seed's answers and data, called alone and
    /// pipelined, and the cost probe sees exactly the calls made.
    #[tokio::test]
    async fn the_seed_scripts_answer_as_the_adr_says_and_the_probe_counts_them() {
        let redis = LocalRedis::start(&[]).await.expect("redis-server");
        let mut settings = Settings::load(None).expect("default settings");
        settings.redis.url = redis.url();
        let mut con = Db::connect(&settings.redis).await.expect("connect");
        // Run alone, EVALSHA re-loads on NOSCRIPT: no load needed first.
        let seat = SeedSeat::new("t", "lic-1", "s1");
        let before = Snapshot::take(&mut con).await.expect("snapshot");
        assert_eq!(
            seat.run(&mut con, SeedStep::Acquire { meta: META })
                .await
                .expect("acquire"),
            "ACQUIRED"
        );
        assert_eq!(
            seat.run(&mut con, SeedStep::Acquire { meta: META })
                .await
                .expect("again"),
            "ALREADY_ACTIVE"
        );
        let members: Vec<String> = redis::cmd("SMEMBERS")
            .arg("t:seed:{lic-1}:active_sessions")
            .query_async(&mut con)
            .await
            .expect("smembers");
        assert_eq!(members, ["s1"]);
        let record: String = redis::cmd("HGET")
            .arg("t:seed:{lic-1}:session_metadata")
            .arg("s1")
            .query_async(&mut con)
            .await
            .expect("hget");
        let record: serde_json::Value = serde_json::from_str(&record).expect("JSON metadata");
        assert_eq!(record["user_email"], "a@example.com");
        assert!(record["acquired_at"].as_i64().is_some_and(|t| t > 1_700_000_000));
        assert_eq!(record["acquired_at"], record["last_heartbeat"]);
        assert_eq!(
            seat.run(&mut con, SeedStep::Release).await.expect("release"),
            "RELEASED"
        );
        let err = seat
            .run(&mut con, SeedStep::Release)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("SESSION_NOT_FOUND"), "{err}");
        let exists: i64 = redis::cmd("EXISTS")
            .arg("t:seed:{lic-1}:active_sessions")
            .arg("t:seed:{lic-1}:session_metadata")
            .query_async(&mut con)
            .await
            .expect("exists");
        assert_eq!(exists, 0, "release leaves nothing behind");

        // Pipelined, after loading: 10 acquire/release pairs.
        load(&mut con).await.expect("load");
        let mut pipe = redis::pipe();
        for i in 0..10 {
            let seat = SeedSeat::new("t", "lic-2", &format!("p{i}"));
            seat.add_to(&mut pipe, SeedStep::Acquire { meta: META });
            seat.add_to(&mut pipe, SeedStep::Release);
        }
        let replies: Vec<Vec<Value>> = pipe.query_async(&mut con).await.expect("pipeline");
        let statuses: Vec<String> = replies.into_iter().map(|r| decode(r).expect("ok")).collect();
        assert_eq!(statuses.iter().filter(|s| *s == "ACQUIRED").count(), 10);
        assert_eq!(statuses.iter().filter(|s| *s == "RELEASED").count(), 10);

        let after = Snapshot::take(&mut con).await.expect("snapshot");
        // 4 alone + 20 pipelined script calls; the reads above are not requests.
        let c = cost(&before, &after, 24).expect("requests were made");
        let calls = |name: &str| c.commands.iter().find(|k| k.command == name).map(|k| k.calls);
        // The first call of each script met NOSCRIPT (counted, failed) and went again.
        assert_eq!(calls("evalsha"), Some(26));
        assert_eq!(calls("script|load"), Some(4));
        assert_eq!(
            calls("sadd"),
            Some(11),
            "the script's own commands are counted too"
        );
        assert_eq!(calls("srem"), Some(11));
        assert_eq!(calls("info"), None, "the probe's own INFO is left out");
        assert!(c.cpu_us_per_op > 0.0);
    }
}
