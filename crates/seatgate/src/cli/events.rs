//! `seatgate events`: follow the seat events of every shard.

use std::collections::BTreeMap;
use std::time::{Duration, UNIX_EPOCH};

use clap::Args;

use seatgate::config::Settings;
use seatgate::error::Error;
use seatgate::service::run as service;
use seatgate::views::printable;

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
pub(super) async fn follow_events(settings: &Settings, args: EventsArgs) -> Result<(), Error> {
    let EventsArgs { from_start, json } = args;
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
