//! `seatgate events`: follow the seat events of every shard.

use std::collections::BTreeMap;
use std::time::{Duration, UNIX_EPOCH};

use clap::Args;

use seatgate::config::Settings;
use seatgate::error::Error;
use seatgate::service::run as service;
use seatgate::views::printable;
use seatgate_core::db::Db;

/// How long one read blocks.
const BLOCK: Duration = Duration::from_secs(2);

/// The id of the last entry of `stream` now ("0-0" when it has none).
async fn last_id(con: &mut Db, stream: &str) -> Result<String, Error> {
    let last: redis::streams::StreamRangeReply = redis::cmd("XREVRANGE")
        .arg(stream)
        .arg("+")
        .arg("-")
        .arg("COUNT")
        .arg(1)
        .query_async(con)
        .await
        .map_err(seatgate_core::Error::from)?;
    Ok(last
        .ids
        .first()
        .map(|e| e.id.clone())
        .unwrap_or_else(|| "0-0".into()))
}

/// `seatgate events`'s flags.
#[derive(Debug, Args)]
pub(super) struct EventsArgs {
    /// Start from the beginning of the streams instead of new events only.
    #[arg(long)]
    from_start: bool,
    /// Print each event as a JSON line.
    #[arg(long)]
    json: bool,
}

/// Prints the events of every events stream shard as they come (one read
/// loop per shard: on a cluster a blocking read may name one slot only).
/// A read that fails (Redis restarted, a failover) is said once on stderr;
/// the loop connects again and resumes after the last event it printed, so
/// nothing written meanwhile is missed.
pub(super) async fn follow_events(settings: &Settings, args: EventsArgs) -> Result<(), Error> {
    let EventsArgs { from_start, json } = args;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<BTreeMap<String, String>>(1024);
    for stream in settings.events_streams() {
        let tx = tx.clone();
        let redis = settings.redis.clone();
        let mut con = Db::connect_blocking(&redis, BLOCK + Duration::from_secs(3)).await?;
        // A concrete id from the start, not `$`: a read resumed after a
        // reconnect must not skip what came in between.
        let mut last = if from_start {
            "0-0".to_owned()
        } else {
            last_id(&mut con, &stream).await?
        };
        tokio::spawn(async move {
            let mut lost = false;
            loop {
                let read: redis::RedisResult<redis::streams::StreamReadReply> = redis::cmd("XREAD")
                    .arg("COUNT")
                    .arg(500)
                    .arg("BLOCK")
                    .arg(BLOCK.as_millis() as u64)
                    .arg("STREAMS")
                    .arg(&stream)
                    .arg(&last)
                    .query_async(&mut con)
                    .await;
                let read = match read {
                    Ok(read) => read,
                    Err(e) => {
                        if !std::mem::replace(&mut lost, true) {
                            eprintln!("seatgate events: cannot read {stream} from Redis ({e}); reconnecting, and resuming after {last}");
                        }
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        if let Ok(again) = Db::connect_blocking(&redis, BLOCK + Duration::from_secs(3)).await
                        {
                            con = again;
                        }
                        continue;
                    }
                };
                if std::mem::replace(&mut lost, false) {
                    eprintln!("seatgate events: reading {stream} again, after {last}");
                }
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
                    let reason = match (e.get("actor"), e.get("reason"), e.get("before"), e.get("after")) {
                        (Some(actor), Some(r), _, _) => format!(" (by {}: {})", printable(actor), printable(r)),
                        (None, Some(r), _, _) => format!(" ({})", printable(r)),
                        // An admin event: who, and what changed.
                        (Some(actor), None, Some(before), Some(after)) => {
                            format!(" (by {}: {} -> {})", printable(actor), printable(before), printable(after))
                        }
                        _ => String::new(),
                    };
                    println!("{at}  {:<13} license={} session={} seats={}/{}{reason}", get("type"), get("license"), get("session"), get("seats_used"), get("seats_total"));
                }
            }
        }
    }
}
