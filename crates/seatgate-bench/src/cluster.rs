//! The cluster scenario: seatgate and the direct path on private Redis
//! Clusters of each master count, beside a single node.

use std::time::{Duration, Instant};

use super::harness::{provision, Fleet, Window};
use super::throughput::{closed_loop, Path};
use super::{Bench, Row};
use crate::Error;
use seatgate::config::Settings;
use seatgate_core::db::Db;
use seatgate_core::keys::Keys;
use seatgate_testkit::{LocalCluster, LocalRedis};

/// `cluster`: it brings its own servers; the measured Redis is not used.
pub(super) async fn run(b: &mut Bench<'_>) -> Result<(), Error> {
    let masters = b.opts.cluster_masters.clone();
    for r in cluster_run(&b.settings, &masters, b.opts.warmup, b.opts.duration).await? {
        b.emit(r);
    }
    Ok(())
}

/// seatgate end to end (64 clients, 2 workers) and the direct path on Redis
/// Cluster with each master count (no replicas: a benchmark of masters), with
/// 4 request shards per master; a single node beside them for reference.
/// `base` gives everything but where Redis is and the shards.
async fn cluster_run(
    base: &Settings,
    masters: &[usize],
    warmup: Duration,
    d: Duration,
) -> Result<Vec<Row>, Error> {
    let mut rows = Vec::new();
    let single = LocalRedis::start(&["--hash-max-listpack-value", "256"]).await?;
    let mut runs: Vec<(String, Settings, Option<LocalCluster>)> = Vec::new();
    let mut s = base.clone();
    s.redis.url = single.url();
    runs.push(("1 node (not a cluster)".into(), s, None));
    for &m in masters {
        let cluster = LocalCluster::start_with(m, 0).await?;
        let mut s = base.clone();
        s.redis.cluster_urls = cluster.urls();
        s.stream.shards = 4 * m;
        runs.push((
            format!("cluster, {m} masters, {} shards", 4 * m),
            s,
            Some(cluster),
        ));
    }
    for (label, s, cluster) in runs {
        let mut con = Db::connect(&s.redis).await?;
        provision(&mut con, &Keys::new(s.keys.prefix.clone())).await?;
        let w = Window::new(Instant::now(), warmup, d);
        let mut direct = closed_loop(&s, 64, w, Path::Direct).await?;
        direct.scenario = "cluster".into();
        direct.variant = format!("{label}: direct, clients=64");
        rows.push(direct);
        let fleet = Fleet::start(&s, 2).await?;
        let w = Window::new(Instant::now(), warmup, d);
        let mut r = closed_loop(&s, 64, w, Path::Seatgate).await?;
        fleet.stop().await;
        r.scenario = "cluster".into();
        r.variant = format!("{label}: seatgate, clients=64 workers=2");
        rows.push(r);
        drop(cluster);
    }
    Ok(rows)
}
