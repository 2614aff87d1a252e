//! `seatgate check-config`: the settings checked without connecting.

use std::process::ExitCode;

use seatgate::config::Settings;
use seatgate::error::Error;

/// `seatgate check-config`: `settings` loaded and validated as `seatgate run`
/// would start with them (an invalid one never gets here: `fail` prints it,
/// exit 3), and the Redis client they describe built without connecting
/// (password and TLS files read).
pub(super) fn check_config(settings: &Settings, file: Option<&std::path::Path>) -> Result<ExitCode, Error> {
    seatgate_core::db::Db::check(&settings.redis)?;
    let source = file.map_or_else(|| "the built-in defaults".to_owned(), |f| f.display().to_string());
    let target = if settings.redis.is_cluster() {
        format!(
            "a Redis Cluster of {} seed(s)",
            settings.redis.cluster_nodes().len()
        )
    } else if settings.redis.is_sentinel() {
        format!(
            "the master {:?} of {} Sentinel(s)",
            settings.redis.sentinel.master_name.trim(),
            settings.redis.sentinel.nodes().len()
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
