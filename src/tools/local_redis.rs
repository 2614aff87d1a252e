//! A private redis-server: started on a free loopback port with its own temp
//! dir, stopped on drop; and private Redis Clusters made of them. The
//! benchmark uses them, and so do the tests.
//!
//! Every wait here is async (tokio's timer, async connections): the callers
//! are tokio tasks, and a blocking sleep would stall the runtime thread that
//! also drives their workers and clients.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;

use crate::error::Error;

/// How often a wait polls.
const POLL: Duration = Duration::from_millis(20);

/// A redis-server child process, killed on drop. Its log is printed when the
/// thread that owns it panics (a failing test).
pub struct LocalRedis {
    /// The server process; killed and reaped on drop.
    child: Child,
    /// Its loopback port.
    port: u16,
    /// Its data directory (log, AOF), removed on drop.
    dir: tempfile::TempDir,
    /// Extra arguments, kept for restarts.
    extra: Vec<String>,
}

fn free_port() -> Result<u16, Error> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn spawn(port: u16, dir: &Path, extra: &[String]) -> Result<Child, Error> {
    Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", ""])
        .args(["--appendonly", "no", "--protected-mode", "yes"])
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(dir.join("redis.log"))
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| {
            Error::LocalRedis(format!(
                "cannot start redis-server ({e}); install it: apt-get install redis-server"
            ))
        })
}

/// A fresh connection to the node at `url`, or None while it does not answer.
async fn connect(url: &str) -> Option<MultiplexedConnection> {
    let client = redis::Client::open(url).ok()?;
    client.get_multiplexed_async_connection().await.ok()
}

impl LocalRedis {
    /// Starts a server with no persistence, plus `extra` `--name value` arguments.
    pub async fn start(extra: &[&str]) -> Result<LocalRedis, Error> {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        for _attempt in 0..5 {
            let mut server = Self::spawn_at(free_port()?, extra.clone())?;
            if server.wait_ready(Duration::from_secs(5)).await {
                return Ok(server);
            }
            // Lost the port to someone else, or failed to start: try another port.
            let _ = server.child.kill();
            let _ = server.child.wait();
        }
        Err(Error::LocalRedis(
            "redis-server did not start; see its log".into(),
        ))
    }

    /// Spawns a server on `port` in a new temp dir, without waiting for it.
    fn spawn_at(port: u16, extra: Vec<String>) -> Result<LocalRedis, Error> {
        let dir = tempfile::tempdir()?;
        let child = spawn(port, dir.path(), &extra)?;
        Ok(LocalRedis {
            child,
            port,
            dir,
            extra,
        })
    }

    /// Waits until the server answers PING; false if it exits or `within` passes.
    async fn wait_ready(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let url = self.url();
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            if let Some(mut con) = connect(&url).await {
                match redis::cmd("PING").query_async::<String>(&mut con).await {
                    Ok(_) => return true,
                    // Up, and asking for a login (an ACL file or requirepass).
                    Err(e) if e.code() == Some("NOAUTH") => return true,
                    Err(_) => {}
                }
            }
            tokio::time::sleep(POLL).await;
        }
        false
    }

    /// The server's redis:// URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's data directory.
    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_owned()
    }

    /// Stops the server the way an operator does (SHUTDOWN: the AOF, if on,
    /// is flushed) and waits for the process to end.
    pub async fn shutdown(&mut self) {
        if let Some(mut con) = connect(&self.url()).await {
            // The server closes the connection instead of answering.
            let _: redis::RedisResult<()> = redis::cmd("SHUTDOWN").query_async(&mut con).await;
        }
        while let Ok(None) = self.child.try_wait() {
            tokio::time::sleep(POLL).await;
        }
    }

    /// Starts the server again on the same port with the same data directory.
    pub async fn restart(&mut self) -> Result<(), Error> {
        self.child = spawn(self.port, self.dir.path(), &self.extra)?;
        if self.wait_ready(Duration::from_secs(10)).await {
            Ok(())
        } else {
            Err(Error::LocalRedis("redis-server did not restart".into()))
        }
    }

    /// SIGKILL (no chance to hand over anything), and reaps the process.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for LocalRedis {
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() {
            if let Ok(log) = std::fs::read_to_string(self.dir.path().join("redis.log")) {
                eprintln!("--- redis-server log (port {}) ---\n{log}", self.port);
            }
        }
    }
}

/// A private Redis Cluster: `masters` masters with one replica each, every
/// node a [`LocalRedis`] on free loopback ports, created with
/// `redis-cli --cluster create` and ready when every node reports
/// `cluster_state:ok`. Stopped on drop.
pub struct LocalCluster {
    /// The nodes, masters first (as created; failovers may change roles).
    pub nodes: Vec<LocalRedis>,
}

/// A port whose cluster bus port (+10000) is free too.
fn free_cluster_port() -> Result<u16, Error> {
    for _ in 0..50 {
        let port = free_port()?;
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return Ok(port);
        }
    }
    Err(Error::LocalRedis("no free port pair for a cluster node".into()))
}

impl LocalCluster {
    /// Starts `masters` masters and as many replicas, and creates the cluster.
    pub async fn start(masters: usize) -> Result<LocalCluster, Error> {
        Self::start_with(masters, 1).await
    }

    /// Starts `masters` masters (at least 3: `redis-cli --cluster create`'s
    /// minimum) with `replicas` replicas each.
    pub async fn start_with(masters: usize, replicas: usize) -> Result<LocalCluster, Error> {
        let mut nodes = Vec::new();
        for _ in 0..masters * (1 + replicas) {
            let extra: Vec<String> = [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "2000",
                // A test cluster is young: let a replica take over however
                // recently it synced.
                "--cluster-replica-validity-factor",
                "0",
                "--appendonly",
                "yes",
                "--hash-max-listpack-value",
                "256",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            let port = free_cluster_port()?;
            let mut node = LocalRedis::spawn_at(port, extra)?;
            if !node.wait_ready(Duration::from_secs(5)).await {
                return Err(Error::LocalRedis(format!(
                    "cluster node on port {port} did not start"
                )));
            }
            nodes.push(node);
        }
        let mut create = Command::new("redis-cli");
        create
            .arg("--cluster")
            .arg("create")
            .args(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)))
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // redis-cli waits for the nodes to agree: seconds, off the runtime's threads.
        let created = tokio::task::spawn_blocking(move || create.output())
            .await?
            .map_err(|e| Error::LocalRedis(format!("cannot run redis-cli --cluster create: {e}")))?;
        if !created.status.success() {
            return Err(Error::LocalRedis(format!(
                "redis-cli --cluster create failed: {}",
                String::from_utf8_lossy(&created.stderr)
            )));
        }
        let cluster = LocalCluster { nodes };
        cluster.wait_ok(Duration::from_secs(30)).await?;
        // Replicas attach a moment after the slots are assigned.
        let deadline = Instant::now() + Duration::from_secs(30);
        while cluster.master_ports().await.len() != masters {
            if Instant::now() > deadline {
                return Err(Error::LocalRedis("the cluster's replicas did not attach".into()));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(cluster)
    }

    /// Waits until every live node reports `cluster_state:ok`.
    pub async fn wait_ok(&self, within: Duration) -> Result<(), Error> {
        let deadline = Instant::now() + within;
        loop {
            let mut ok = true;
            for n in &self.nodes {
                let Some(mut con) = connect(&n.url()).await else {
                    continue; // a stopped node does not vote
                };
                let info: redis::RedisResult<String> =
                    redis::cmd("CLUSTER").arg("INFO").query_async(&mut con).await;
                if let Ok(info) = info {
                    ok &= info.contains("cluster_state:ok");
                }
            }
            if ok {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::LocalRedis(
                    "the cluster did not reach cluster_state:ok".into(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Seed URLs: every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(LocalRedis::url).collect()
    }

    /// Ports of the current masters (asks the first live node).
    pub async fn master_ports(&self) -> Vec<u16> {
        for n in &self.nodes {
            let Some(mut con) = connect(&n.url()).await else {
                continue;
            };
            let nodes: redis::RedisResult<String> =
                redis::cmd("CLUSTER").arg("NODES").query_async(&mut con).await;
            if let Ok(text) = nodes {
                return text
                    .lines()
                    .filter(|l| {
                        let flags = l.split_whitespace().nth(2).unwrap_or("");
                        flags.contains("master") && !flags.contains("fail")
                    })
                    .filter_map(|l| l.split_whitespace().nth(1))
                    .filter_map(|addr| addr.split('@').next()?.rsplit(':').next()?.parse().ok())
                    .collect();
            }
        }
        Vec::new()
    }

    /// The port of the master that owns `key`'s slot.
    pub async fn master_of(&self, key: &str) -> Option<u16> {
        for n in &self.nodes {
            let Some(mut con) = connect(&n.url()).await else {
                continue;
            };
            let Ok(slot) = redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(key)
                .query_async::<i64>(&mut con)
                .await
            else {
                continue;
            };
            let slots: redis::RedisResult<Vec<Vec<redis::Value>>> =
                redis::cmd("CLUSTER").arg("SLOTS").query_async(&mut con).await;
            if let Ok(ranges) = slots {
                for r in ranges {
                    let int = |i: usize| {
                        r.get(i)
                            .and_then(|v| redis::from_redis_value::<i64>(v.clone()).ok())
                    };
                    let (Some(lo), Some(hi)) = (int(0), int(1)) else {
                        continue;
                    };
                    if (lo..=hi).contains(&slot) {
                        if let Some(redis::Value::Array(master)) = r.get(2) {
                            return master
                                .get(1)
                                .and_then(|v| redis::from_redis_value::<u16>(v.clone()).ok());
                        }
                    }
                }
                return None;
            }
        }
        None
    }

    /// SIGKILLs the node on `port` (no chance to hand over anything).
    pub fn kill9(&mut self, port: u16) {
        if let Some(n) = self.nodes.iter_mut().find(|n| n.port == port) {
            n.kill9();
        }
    }
}
