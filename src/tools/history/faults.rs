//! The processes of a history run (one redis-server with an fsynced AOF,
//! `seatgate run` workers) and the faults a seeded schedule injects into
//! them: kill -9 and SIGSTOP of a worker, kill -9 of Redis (restarted on its
//! port from its AOF), SIGSTOP of Redis, `CLIENT PAUSE WRITE`. License
//! changes and deletes are the administrator's (run.rs), as in production.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::Rng;
use crate::error::Error;
use crate::tools::local_redis::LocalRedis;

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
}

impl FaultKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FaultKind::WorkerKill9 => "worker_kill9",
            FaultKind::WorkerStop => "worker_sigstop",
            FaultKind::RedisKill9 => "redis_kill9_restart",
            FaultKind::RedisStop => "redis_sigstop",
            FaultKind::RedisPause => "redis_client_pause",
        }
    }
}

/// One fault of the schedule.
#[derive(Debug, Clone)]
pub struct Planned {
    /// Offset from the start of the run.
    pub at: Duration,
    pub kind: FaultKind,
    /// The worker, for worker faults.
    pub target: usize,
    /// How long the fault lasts before it heals.
    pub lasts: Duration,
}

/// The faults of a run of `duration` with `workers` workers: one every 3–8 s
/// from 3 s in, none in the last 4 s, never two at once (each heals before
/// the next: the checks then know which gaps were outages).
pub fn schedule(rng: &mut Rng, duration: Duration, workers: usize) -> Vec<Planned> {
    let kinds = [
        FaultKind::WorkerKill9,
        FaultKind::WorkerKill9,
        FaultKind::WorkerStop,
        FaultKind::WorkerStop,
        FaultKind::RedisKill9,
        FaultKind::RedisStop,
        FaultKind::RedisPause,
    ];
    let end = duration.saturating_sub(Duration::from_secs(4));
    let mut at = Duration::from_millis(rng.range(3000, 5000));
    let mut out = Vec::new();
    while at < end {
        let kind = *rng.pick(&kinds);
        let lasts = Duration::from_millis(match kind {
            FaultKind::WorkerKill9 => rng.range(500, 3000),
            FaultKind::WorkerStop => rng.range(1000, 7000),
            FaultKind::RedisKill9 => rng.range(200, 1500),
            FaultKind::RedisStop => rng.range(500, 3000),
            FaultKind::RedisPause => rng.range(500, 3000),
        });
        out.push(Planned {
            at,
            kind,
            target: rng.range(0, workers as u64) as usize,
            lasts,
        });
        at += lasts + Duration::from_millis(rng.range(3000, 8000));
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

/// The processes of a run.
pub struct Fleet {
    pub redis: LocalRedis,
    pub workers: Vec<Worker>,
    binary: PathBuf,
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
        if write!(s, "GET /ready HTTP/1.0\r\nHost: x\r\n\r\n").is_err() {
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
    /// acknowledged write) and `workers` workers with `env` settings.
    pub async fn start(binary: PathBuf, workers: usize, env: Vec<(String, String)>) -> Result<Fleet, Error> {
        let redis = LocalRedis::start(&["--appendonly", "yes", "--appendfsync", "always"]).await?;
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

    pub fn url(&self) -> String {
        self.redis.url()
    }

    fn spawn_worker(&mut self, i: usize) -> Result<(), Error> {
        let w = &mut self.workers[i];
        let mut cmd = Command::new(&self.binary);
        cmd.arg("--redis")
            .arg(self.redis.url())
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

    /// Injects `fault`, waits while it lasts, heals it. Returns an error
    /// only when the fleet cannot be brought back (the run is then void).
    pub async fn inject(&mut self, fault: &Planned) -> Result<(), Error> {
        let i = fault.target.min(self.workers.len().saturating_sub(1));
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
            FaultKind::RedisKill9 => {
                self.redis.kill9();
                tokio::time::sleep(fault.lasts).await;
                self.redis.restart().await?;
            }
            FaultKind::RedisStop => {
                let pid = self.redis.pid();
                signal(pid, "STOP")?;
                tokio::time::sleep(fault.lasts).await;
                signal(pid, "CONT")?;
            }
            FaultKind::RedisPause => {
                let mut con = self.redis.client()?.get_multiplexed_async_connection().await?;
                let _: () = redis::cmd("CLIENT")
                    .arg("PAUSE")
                    .arg(fault.lasts.as_millis() as u64)
                    .arg("WRITE")
                    .query_async(&mut con)
                    .await?;
                tokio::time::sleep(fault.lasts).await;
            }
        }
        Ok(())
    }

    /// Every worker running and not stopped, Redis up: the end of every fault.
    pub async fn heal(&mut self) -> Result<(), Error> {
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
        let _ = signal(self.redis.pid(), "CONT");
    }
}
