//! The processes of a history run (one redis-server with an fsynced AOF, or
//! a Redis Cluster of 3 masters with a replica each; `seatgate run` workers)
//! and the faults a seeded schedule injects into them: kill -9 and SIGSTOP
//! of a worker; on one node kill -9 of Redis (restarted on its port from its
//! AOF), SIGSTOP of Redis, `CLIENT PAUSE WRITE`; on a cluster a coordinated
//! master failover, and a short SIGSTOP or `CLIENT PAUSE WRITE` of the
//! master that holds a license, and only when asked for a kill -9 of such a
//! master (an unplanned failover). License changes and deletes are the
//! administrator's (run.rs), as in production.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::Rng;
use crate::Error;
use seatgate_testkit::{LocalCluster, LocalRedis};

/// How long a cluster failover may take before the run is void.
const FAILOVER_WITHIN: Duration = Duration::from_secs(30);

/// A kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FaultKind {
    /// SIGKILL a worker, start it again after a while.
    WorkerKill9,
    /// SIGSTOP a worker for a while, then SIGCONT.
    WorkerStop,
    /// SIGKILL redis-server, start it again on its port from its AOF.
    RedisKill9,
    /// SIGSTOP redis-server for a while (every client hangs), then SIGCONT.
    RedisStop,
    /// `CLIENT PAUSE <ms> WRITE`: reads go on, writes wait.
    RedisPause,
    /// On a cluster: `CLUSTER FAILOVER` on a replica of the master that
    /// holds a license's slot (a coordinated failover: no acknowledged
    /// write is lost).
    ClusterFailover,
    /// On a cluster, only when asked for ([`super::Options::master_kill9`]):
    /// SIGKILL the master that holds a license's slot; a replica takes over
    /// by itself after the node timeout (an unplanned failover, which can
    /// lose writes the master acknowledged last), then the killed node
    /// starts again from its AOF and rejoins as a replica.
    MasterKill9,
}

impl FaultKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FaultKind::WorkerKill9 => "worker_kill9",
            FaultKind::WorkerStop => "worker_sigstop",
            FaultKind::RedisKill9 => "redis_kill9_restart",
            FaultKind::RedisStop => "redis_sigstop",
            FaultKind::RedisPause => "redis_client_pause",
            FaultKind::ClusterFailover => "cluster_failover",
            FaultKind::MasterKill9 => "cluster_master_kill9",
        }
    }
}

/// One fault of the schedule.
#[derive(Debug, Clone)]
pub struct Planned {
    /// Offset from the start of the run.
    pub at: Duration,
    pub kind: FaultKind,
    /// The worker, for worker faults; on a cluster, for Redis faults, the
    /// license (index) whose master is hit.
    pub target: usize,
    /// How long the fault lasts before it heals.
    pub lasts: Duration,
}

/// The faults of a run of `duration` with `workers` workers: one every 3–8 s
/// from 3 s in, none in the last 4 s, never two at once (each heals before
/// the next: the checks then know which gaps were outages).
///
/// On a cluster (`licenses` > 0: the Redis faults hit the master of one of
/// them) Redis is never killed: a master killed -9 fails over to a replica
/// that may lack its last acknowledged writes (replication is asynchronous),
/// which is Redis's documented loss, not seatgate's to answer for
/// (docs/running.md, "The failover window"). Its faults are instead a
/// coordinated failover, at least one per run, and a SIGSTOP of a master
/// shorter than the cluster's node timeout (2 s): a longer one is an
/// unplanned failover too, the master going on, once resumed, to accept
/// writes that its promoted replica never sees. With `master_kill9` a
/// cluster's schedule has that fault too (a run to look at, not a pass or
/// fail: see [`FaultKind::MasterKill9`]).
pub fn schedule(
    rng: &mut Rng,
    duration: Duration,
    workers: usize,
    licenses: usize,
    master_kill9: bool,
) -> Vec<Planned> {
    let cluster = licenses > 0;
    let mut kinds: Vec<FaultKind> = if cluster {
        vec![
            FaultKind::WorkerKill9,
            FaultKind::WorkerKill9,
            FaultKind::WorkerStop,
            FaultKind::WorkerStop,
            FaultKind::ClusterFailover,
            FaultKind::ClusterFailover,
            FaultKind::RedisStop,
            FaultKind::RedisPause,
        ]
    } else {
        vec![
            FaultKind::WorkerKill9,
            FaultKind::WorkerKill9,
            FaultKind::WorkerStop,
            FaultKind::WorkerStop,
            FaultKind::RedisKill9,
            FaultKind::RedisStop,
            FaultKind::RedisPause,
        ]
    };
    if cluster && master_kill9 {
        kinds.push(FaultKind::MasterKill9);
    }
    let end = duration.saturating_sub(Duration::from_secs(4));
    let mut at = Duration::from_millis(rng.range(3000, 5000));
    let mut out = Vec::new();
    while at < end {
        let kind = *rng.pick(&kinds);
        let lasts = Duration::from_millis(match kind {
            FaultKind::WorkerKill9 => rng.range(500, 3000),
            FaultKind::WorkerStop => rng.range(1000, 7000),
            FaultKind::RedisKill9 => rng.range(200, 1500),
            FaultKind::RedisStop if cluster => rng.range(300, 1200),
            FaultKind::RedisStop => rng.range(500, 3000),
            FaultKind::RedisPause => rng.range(500, 3000),
            // As long as the replica takes to catch up and take over.
            FaultKind::ClusterFailover => 0,
            // How long the killed node stays down once its replica took over.
            FaultKind::MasterKill9 => rng.range(500, 2000),
        });
        let target = match kind {
            FaultKind::WorkerKill9 | FaultKind::WorkerStop => rng.range(0, workers as u64),
            _ => rng.range(0, licenses.max(workers) as u64),
        };
        out.push(Planned {
            at,
            kind,
            target: target as usize,
            lasts,
        });
        at += lasts + Duration::from_millis(rng.range(3000, 8000));
    }
    // Every cluster run fails a master over at least once.
    if cluster && !out.iter().any(|p| p.kind == FaultKind::ClusterFailover) {
        let mid = out.len() / 2;
        if let Some(p) = out.get_mut(mid) {
            p.kind = FaultKind::ClusterFailover;
            p.target = rng.range(0, licenses as u64) as usize;
        }
    }
    out
}

/// A `seatgate run` child process.
pub struct Worker {
    child: Option<Child>,
    /// Its /metrics, /live and /ready port.
    port: u16,
    /// Its consumer name (kept across restarts: a restarted process takes
    /// over its own pending entries at once, as a systemd restart does).
    name: String,
    stopped: bool,
}

/// The Redis of a run.
pub enum Backend {
    /// One redis-server, AOF fsynced on every write.
    Node(LocalRedis),
    /// 3 masters with a replica each.
    Cluster(LocalCluster),
}

/// The processes of a run.
pub struct Fleet {
    pub redis: Backend,
    pub workers: Vec<Worker>,
    binary: PathBuf,
    /// The workers' settings: the run's, and on a cluster its seeds.
    env: Vec<(String, String)>,
}

fn free_port() -> Result<u16, Error> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// `kill -<sig> <pid>`.
fn signal(pid: u32, sig: &str) -> Result<(), Error> {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(Error::History(format!("kill -{sig} {pid} failed")))
    }
}

/// Whether GET /ready on `port` answers 200.
async fn ready(port: u16) -> bool {
    tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        if write!(s, "GET /ready HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n").is_err() {
            return false;
        }
        let mut body = String::new();
        let _ = s.read_to_string(&mut body);
        body.split_whitespace().nth(1) == Some("200")
    })
    .await
    .unwrap_or(false)
}

impl Fleet {
    /// Starts redis-server (AOF, fsync on every write: a kill -9 loses no
    /// acknowledged write), or with `cluster` a [`LocalCluster`] of 3
    /// masters and 3 replicas, and `workers` workers with `env` settings.
    pub async fn start(
        binary: PathBuf,
        workers: usize,
        env: Vec<(String, String)>,
        cluster: bool,
    ) -> Result<Fleet, Error> {
        let redis = if cluster {
            Backend::Cluster(LocalCluster::start(3).await?)
        } else {
            Backend::Node(LocalRedis::start(&["--appendonly", "yes", "--appendfsync", "always"]).await?)
        };
        let mut env = env;
        env.extend(redis_env(&redis));
        let mut fleet = Fleet {
            redis,
            workers: Vec::new(),
            binary,
            env,
        };
        for i in 0..workers {
            let worker = Worker {
                child: None,
                port: free_port()?,
                name: format!("history-{i}"),
                stopped: false,
            };
            fleet.workers.push(worker);
            fleet.spawn_worker(i)?;
        }
        for i in 0..workers {
            fleet.wait_ready(i).await?;
        }
        Ok(fleet)
    }

    /// The URL `--redis` names: the node's, or a cluster's first seed
    /// (which the cluster settings, [`Fleet::redis_env`], override).
    pub fn url(&self) -> String {
        match &self.redis {
            Backend::Node(r) => r.url(),
            Backend::Cluster(c) => c.urls().first().cloned().unwrap_or_default(),
        }
    }

    /// A cluster's seed URLs; empty for one node.
    pub fn cluster_urls(&self) -> Vec<String> {
        match &self.redis {
            Backend::Node(_) => Vec::new(),
            Backend::Cluster(c) => c.urls(),
        }
    }

    /// What every `seatgate` process of the run needs to find Redis
    /// besides `--redis`: on a cluster, `SEATGATE__REDIS__CLUSTER_URLS`.
    pub fn redis_env(&self) -> Vec<(String, String)> {
        redis_env(&self.redis)
    }

    fn spawn_worker(&mut self, i: usize) -> Result<(), Error> {
        let url = self.url();
        let w = &mut self.workers[i];
        let mut cmd = Command::new(&self.binary);
        cmd.arg("--redis")
            .arg(url)
            .arg("run")
            .env("SEATGATE__METRICS__LISTEN", format!("127.0.0.1:{}", w.port))
            .env("SEATGATE__STREAM__CONSUMER", &w.name)
            .env("RUST_LOG", "error")
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        w.child = Some(
            cmd.spawn()
                .map_err(|e| Error::History(format!("cannot start {}: {e}", self.binary.display())))?,
        );
        w.stopped = false;
        Ok(())
    }

    async fn wait_ready(&mut self, i: usize) -> Result<(), Error> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !ready(self.workers[i].port).await {
            if Instant::now() > deadline {
                return Err(Error::History(format!("worker {i} did not become ready")));
            }
            if let Some(child) = self.workers[i].child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(Error::History(format!("worker {i} exited: {status}")));
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    fn kill_worker(&mut self, i: usize) {
        if let Some(mut child) = self.workers[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn worker_pid(&self, i: usize) -> Option<u32> {
        self.workers[i].child.as_ref().map(Child::id)
    }

    /// Injects `fault`, waits while it lasts, heals it; `licenses` are each
    /// license's name and a key of it (on a cluster a Redis fault hits the
    /// master of `licenses[fault.target]`). Returns what it hit when that is worth
    /// recording (a failover: from which master to which). Returns an error
    /// only when the fleet cannot be brought back (the run is then void).
    pub async fn inject(
        &mut self,
        fault: &Planned,
        licenses: &[(String, String)],
    ) -> Result<Option<String>, Error> {
        let i = fault.target.min(self.workers.len().saturating_sub(1));
        if let Backend::Cluster(cluster) = &mut self.redis {
            if !matches!(fault.kind, FaultKind::WorkerKill9 | FaultKind::WorkerStop) {
                return inject_cluster(cluster, fault, licenses).await.map(Some);
            }
        }
        match fault.kind {
            FaultKind::WorkerKill9 => {
                self.kill_worker(i);
                tokio::time::sleep(fault.lasts).await;
                self.spawn_worker(i)?;
            }
            FaultKind::WorkerStop => {
                if let Some(pid) = self.worker_pid(i) {
                    signal(pid, "STOP")?;
                    self.workers[i].stopped = true;
                    tokio::time::sleep(fault.lasts).await;
                    signal(pid, "CONT")?;
                    self.workers[i].stopped = false;
                }
            }
            FaultKind::RedisKill9
            | FaultKind::RedisStop
            | FaultKind::RedisPause
            | FaultKind::ClusterFailover
            | FaultKind::MasterKill9 => {
                let Backend::Node(redis) = &mut self.redis else {
                    return Ok(None);
                };
                match fault.kind {
                    FaultKind::RedisKill9 => {
                        redis.kill9();
                        tokio::time::sleep(fault.lasts).await;
                        redis.restart().await?;
                    }
                    FaultKind::RedisStop => stop_for(redis, fault.lasts).await?,
                    FaultKind::RedisPause => pause_writes_for(redis, fault.lasts).await?,
                    // A single node has no replica to fail over to.
                    _ => return Ok(None),
                }
            }
        }
        Ok(None)
    }

    /// Every worker running and not stopped, Redis up (a cluster ok): the
    /// end of every fault.
    pub async fn heal(&mut self) -> Result<(), Error> {
        if let Backend::Cluster(c) = &self.redis {
            c.wait_ok(FAILOVER_WITHIN).await?;
        }
        for i in 0..self.workers.len() {
            if self.workers[i].stopped {
                if let Some(pid) = self.worker_pid(i) {
                    signal(pid, "CONT")?;
                }
                self.workers[i].stopped = false;
            }
            let dead = match self.workers[i].child.as_mut() {
                None => true,
                Some(child) => matches!(child.try_wait(), Ok(Some(_))),
            };
            if dead {
                self.spawn_worker(i)?;
            }
            self.wait_ready(i).await?;
        }
        Ok(())
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for i in 0..self.workers.len() {
            if let Some(pid) = self.worker_pid(i) {
                let _ = signal(pid, "CONT");
            }
            self.kill_worker(i);
        }
        match &self.redis {
            Backend::Node(r) => {
                let _ = signal(r.pid(), "CONT");
            }
            Backend::Cluster(c) => {
                for n in &c.nodes {
                    let _ = signal(n.pid(), "CONT");
                }
            }
        }
    }
}

/// See [`Fleet::redis_env`].
fn redis_env(redis: &Backend) -> Vec<(String, String)> {
    match redis {
        Backend::Node(_) => Vec::new(),
        Backend::Cluster(c) => vec![("SEATGATE__REDIS__CLUSTER_URLS".to_owned(), c.urls().join(","))],
    }
}

/// SIGSTOP `redis` for `lasts`, then SIGCONT: every client of it hangs.
async fn stop_for(redis: &LocalRedis, lasts: Duration) -> Result<(), Error> {
    let pid = redis.pid();
    signal(pid, "STOP")?;
    tokio::time::sleep(lasts).await;
    signal(pid, "CONT")
}

/// `CLIENT PAUSE <lasts> WRITE` on `redis`: reads go on, writes wait.
async fn pause_writes_for(redis: &LocalRedis, lasts: Duration) -> Result<(), Error> {
    let mut con = redis.client()?.get_multiplexed_async_connection().await?;
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(lasts.as_millis() as u64)
        .arg("WRITE")
        .query_async(&mut con)
        .await?;
    tokio::time::sleep(lasts).await;
    Ok(())
}

/// A Redis fault on a cluster, on the master that holds
/// `licenses[fault.target]`'s slot: a coordinated failover to one of its
/// replicas (waiting until it took over and the cluster is ok), a SIGSTOP,
/// a `CLIENT PAUSE WRITE`, or (asked for only) a kill -9. Returns what it hit.
async fn inject_cluster(
    cluster: &mut LocalCluster,
    fault: &Planned,
    licenses: &[(String, String)],
) -> Result<String, Error> {
    let (license, key) = licenses
        .get(fault.target % licenses.len().max(1))
        .ok_or_else(|| Error::History("a cluster fault needs a license to aim at".into()))?;
    let Some(master) = cluster.master_of(key).await else {
        return Err(Error::History(format!("no master owns {license}'s slot")));
    };
    if fault.kind == FaultKind::MasterKill9 {
        cluster.kill9(master);
        let to = cluster.taken_over(key, master, FAILOVER_WITHIN).await?;
        tokio::time::sleep(fault.lasts).await;
        cluster.rejoin(master, to, FAILOVER_WITHIN).await?;
        return Ok(format!("{license}: master {master} killed -> {to}"));
    }
    let node = cluster
        .node(master)
        .ok_or_else(|| Error::History(format!("no node of the cluster on port {master}")))?;
    match fault.kind {
        FaultKind::ClusterFailover => {
            let to = cluster.failover(master, FAILOVER_WITHIN).await?;
            Ok(format!("{license}: master {master} -> {to}"))
        }
        FaultKind::RedisStop => {
            stop_for(node, fault.lasts).await?;
            Ok(format!("{license}: master {master} stopped"))
        }
        FaultKind::RedisPause => {
            pause_writes_for(node, fault.lasts).await?;
            Ok(format!("{license}: master {master} paused"))
        }
        // Kept out of a cluster's schedule (see `schedule`).
        FaultKind::RedisKill9 | FaultKind::WorkerKill9 | FaultKind::WorkerStop | FaultKind::MasterKill9 => {
            Err(Error::History(format!(
                "{} is no cluster fault",
                fault.kind.as_str()
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(plan: &[Planned]) -> Vec<FaultKind> {
        plan.iter().map(|p| p.kind).collect()
    }

    /// One node: no cluster fault. A cluster: at least one coordinated
    /// failover, no kill -9 of Redis, and kill -9 of a master only when
    /// asked for; cluster faults aim at one of the licenses.
    #[test]
    fn a_cluster_schedule_fails_over_and_kills_a_master_only_when_asked() {
        let secs = Duration::from_secs(35);
        let mut asked_and_killed = 0;
        for seed in 0..200 {
            let node = kinds(&schedule(&mut Rng::new(seed), secs, 3, 0, false));
            assert!(
                !node
                    .iter()
                    .any(|k| matches!(k, FaultKind::ClusterFailover | FaultKind::MasterKill9)),
                "seed {seed}: {node:?}"
            );
            let plan = schedule(&mut Rng::new(seed), secs, 3, 4, false);
            let cluster = kinds(&plan);
            assert!(
                cluster.contains(&FaultKind::ClusterFailover),
                "seed {seed}: {cluster:?}"
            );
            assert!(
                !cluster
                    .iter()
                    .any(|k| matches!(k, FaultKind::RedisKill9 | FaultKind::MasterKill9)),
                "seed {seed}: {cluster:?}"
            );
            assert!(plan.iter().all(|p| p.target < 4), "seed {seed}: {plan:?}");
            let killing = kinds(&schedule(&mut Rng::new(seed), secs, 3, 4, true));
            asked_and_killed += usize::from(killing.contains(&FaultKind::MasterKill9));
        }
        assert!(
            asked_and_killed > 0,
            "no schedule with master_kill9 killed a master"
        );
    }
}
