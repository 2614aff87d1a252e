//! seatgate-testkit: a private redis-server, started on a free loopback port with its own temp
//! dir, stopped on drop, optionally TLS-only with a throwaway CA; and private
//! Redis Clusters made of them. The benchmark uses them, and so do the tests.
//!
//! Every wait here is async (tokio's timer, async connections): the callers
//! are tokio tasks, and a blocking sleep would stall the runtime thread that
//! also drives their workers and clients.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;

use seatgate_core::db::RedisSettings;

/// Why a private redis-server or cluster could not be started, stopped or
/// changed: one line naming what failed (a missing `redis-server` binary, a
/// port, a node that would not join).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error(pub String);

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "local redis-server: {}", self.0)
    }
}

impl std::error::Error for Error {}

impl From<redis::RedisError> for Error {
    fn from(e: redis::RedisError) -> Error {
        Error(format!("redis error: {e}"))
    }
}

impl From<seatgate_core::Error> for Error {
    fn from(e: seatgate_core::Error) -> Error {
        Error(e.to_string())
    }
}

impl From<tokio::task::JoinError> for Error {
    fn from(e: tokio::task::JoinError) -> Error {
        Error(format!("a helper task failed: {e}"))
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Error {
        Error(e.to_string())
    }
}

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
    /// The certificates of a TLS-only server (`port` is then its TLS port);
    /// shared by the nodes of a cluster, which trust one CA.
    tls: Option<TlsServer>,
    /// Whose session the server runs in, kept for restarts.
    session: Session,
}

/// Which session (and so which scheduler group) a server process runs in.
///
/// Linux's autogroup shares the CPU fairly between sessions, then between
/// the threads of one session. A server in its caller's session competes
/// thread for thread with the caller's runtime, as no deployed Redis does
/// (a service manager gives it a group of its own); on the benchmark's two
/// cores that cost the contention row a tenth of its grants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Session {
    /// The caller's session: a terminal's Ctrl-C stops the server with it.
    Caller,
    /// A session of its own (`setsid`), as a service: stopped on drop, so
    /// its owner must drop it on Ctrl-C too (`seatgate bench` does).
    Own,
}

/// Whether a TLS server asks clients for a certificate (`--tls-auth-clients`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// No client certificate is asked for.
    No,
    /// A client may present one; if it does, it must be valid.
    Optional,
    /// A client without a valid certificate is refused.
    Required,
}

impl ClientAuth {
    fn flag(self) -> &'static str {
        match self {
            ClientAuth::No => "no",
            ClientAuth::Optional => "optional",
            ClientAuth::Required => "yes",
        }
    }
}

/// A throwaway CA, a server certificate for 127.0.0.1 and localhost, and a
/// client certificate, all PEM, made with the `openssl` CLI in their own temp
/// dir (the files outlive any one server, so restarts keep them).
pub struct TlsFiles {
    /// Holds every key and certificate; removed on drop.
    dir: tempfile::TempDir,
}

impl TlsFiles {
    /// Makes a CA and the two certificates it signs (ECDSA P-256, valid a
    /// week). The openssl runs take a moment: off the runtime's threads.
    pub async fn generate() -> Result<TlsFiles, Error> {
        tokio::task::spawn_blocking(Self::generate_blocking).await?
    }

    fn generate_blocking() -> Result<TlsFiles, Error> {
        let files = TlsFiles {
            dir: tempfile::tempdir()?,
        };
        std::fs::write(files.dir.path().join("openssl.cnf"), OPENSSL_CNF)?;
        for name in ["ca", "server", "client"] {
            files.openssl(&[
                "genpkey",
                "-algorithm",
                "EC",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-out",
                &format!("{name}.key"),
            ])?;
        }
        files.openssl(&[
            "req",
            "-config",
            "openssl.cnf",
            "-x509",
            "-new",
            "-key",
            "ca.key",
            "-subj",
            "/CN=seatgate test CA",
            "-extensions",
            "ca",
            "-days",
            "7",
            "-out",
            "ca.crt",
        ])?;
        for (name, cn) in [("server", "localhost"), ("client", "seatgate test client")] {
            files.openssl(&[
                "req",
                "-config",
                "openssl.cnf",
                "-new",
                "-key",
                &format!("{name}.key"),
                "-subj",
                &format!("/CN={cn}"),
                "-out",
                &format!("{name}.csr"),
            ])?;
            files.openssl(&[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "7",
                "-extfile",
                "openssl.cnf",
                "-extensions",
                name,
                "-out",
                &format!("{name}.crt"),
            ])?;
        }
        Ok(files)
    }

    fn openssl(&self, args: &[&str]) -> Result<(), Error> {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .output()
            .map_err(|e| {
                Error(format!(
                    "cannot run openssl ({e}); install it: apt-get install openssl"
                ))
            })?;
        if !out.status.success() {
            return Err(Error(format!(
                "openssl {} failed: {}",
                args.first().unwrap_or(&""),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(())
    }

    /// The CA certificate (PEM): what clients set as `redis.tls_ca_file`.
    pub fn ca_cert(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// The server's certificate (PEM), for 127.0.0.1 and localhost.
    pub fn server_cert(&self) -> PathBuf {
        self.dir.path().join("server.crt")
    }

    /// The server's private key (PEM).
    pub fn server_key(&self) -> PathBuf {
        self.dir.path().join("server.key")
    }

    /// A client certificate (PEM) the CA signed: `redis.tls_cert_file`.
    pub fn client_cert(&self) -> PathBuf {
        self.dir.path().join("client.crt")
    }

    /// The client certificate's private key (PEM): `redis.tls_key_file`.
    pub fn client_key(&self) -> PathBuf {
        self.dir.path().join("client.key")
    }

    /// Points `redis`'s TLS settings at these files (the CA and the client
    /// certificate, which a server also accepts when it does not ask for one).
    pub fn apply(&self, redis: &mut RedisSettings) {
        redis.tls_ca_file = self.ca_cert().to_string_lossy().into_owned();
        redis.tls_cert_file = self.client_cert().to_string_lossy().into_owned();
        redis.tls_key_file = self.client_key().to_string_lossy().into_owned();
    }

    /// The same files as `SEATGATE__REDIS__TLS_*` variables, for a child process.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        let path = |p: PathBuf| p.to_string_lossy().into_owned();
        vec![
            ("SEATGATE__REDIS__TLS_CA_FILE", path(self.ca_cert())),
            ("SEATGATE__REDIS__TLS_CERT_FILE", path(self.client_cert())),
            ("SEATGATE__REDIS__TLS_KEY_FILE", path(self.client_key())),
        ]
    }

    /// What a client of these files presents: the CA and the client certificate.
    fn certificates(&self) -> Result<redis::TlsCertificates, Error> {
        Ok(redis::TlsCertificates {
            client_tls: Some(redis::ClientTlsConfig {
                client_cert: std::fs::read(self.client_cert())?,
                client_key: std::fs::read(self.client_key())?,
            }),
            root_cert: Some(std::fs::read(self.ca_cert())?),
        })
    }
}

/// How a TLS-only server is set up; kept for restarts.
#[derive(Clone)]
struct TlsServer {
    /// Its certificates and the CA clients trust.
    files: Arc<TlsFiles>,
    /// Whether it asks clients for a certificate.
    auth: ClientAuth,
}

/// Extensions of the test certificates: a CA that may sign, a server
/// certificate for loopback (rustls checks the IP or name in the URL against
/// subjectAltName, never the CN), and a client certificate. The server's is
/// for client authentication too: cluster nodes and replicas present it when
/// they connect to each other, and a node that checks client certificates
/// refuses one that is for servers only.
const OPENSSL_CNF: &str = "\
[req]
distinguished_name = dn
[dn]
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth, clientAuth
subjectAltName = IP:127.0.0.1, DNS:localhost
[client]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
";

fn free_port() -> Result<u16, Error> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Starts redis-server on `port`: plain, or with `tls` TLS-only (no plain port).
fn spawn(
    port: u16,
    dir: &Path,
    extra: &[String],
    tls: Option<&TlsServer>,
    session: Session,
) -> Result<Child, Error> {
    let mut listen: Vec<std::ffi::OsString> = Vec::new();
    match tls {
        None => listen.extend(["--port".into(), port.to_string().into()]),
        Some(TlsServer { files, auth }) => {
            listen.extend([
                "--port".into(),
                "0".into(),
                "--tls-port".into(),
                port.to_string().into(),
            ]);
            listen.extend(["--tls-cert-file".into(), files.server_cert().into()]);
            listen.extend(["--tls-key-file".into(), files.server_key().into()]);
            listen.extend(["--tls-ca-cert-file".into(), files.ca_cert().into()]);
            listen.extend(["--tls-auth-clients".into(), auth.flag().into()]);
        }
    }
    // setsid(1) (util-linux) execs the server in place: a child of ours is
    // no process group leader, so it does not fork and the pid stays the server's.
    let mut command = match session {
        Session::Caller => Command::new("redis-server"),
        Session::Own => {
            let mut c = Command::new("setsid");
            c.arg("redis-server");
            c
        }
    };
    command
        .args(listen)
        .args(["--bind", "127.0.0.1", "--save", ""])
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
            Error(format!(
                "cannot start redis-server ({e}); install it: apt-get install redis-server"
            ))
        })
}

impl LocalRedis {
    /// Starts a server with no persistence, plus `extra` `--name value` arguments.
    pub async fn start(extra: &[&str]) -> Result<LocalRedis, Error> {
        Self::start_inner(extra, None, Session::Caller).await
    }

    /// Like [`start`](Self::start), in a session of its own, as a deployed
    /// Redis runs (its own scheduler group under autogroup): for measurements. Stopped on drop like
    /// any other; a Ctrl-C of the terminal does not reach it.
    pub async fn start_as_service(extra: &[&str]) -> Result<LocalRedis, Error> {
        Self::start_inner(extra, None, Session::Own).await
    }

    /// Starts a TLS-only server (no plain port) with a fresh throwaway CA
    /// ([`TlsFiles`]); `auth` says whether it asks clients for a certificate.
    /// Its [`url`](Self::url) is rediss://.
    pub async fn start_tls(auth: ClientAuth, extra: &[&str]) -> Result<LocalRedis, Error> {
        let files = Arc::new(TlsFiles::generate().await?);
        Self::start_inner(extra, Some(TlsServer { files, auth }), Session::Caller).await
    }

    async fn start_inner(
        extra: &[&str],
        tls: Option<TlsServer>,
        session: Session,
    ) -> Result<LocalRedis, Error> {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        for _attempt in 0..5 {
            let mut server = Self::spawn_at(free_port()?, extra.clone(), tls.clone(), session)?;
            if server.wait_ready(Duration::from_secs(5)).await {
                return Ok(server);
            }
            // Lost the port to someone else, or failed to start: try another port.
            let _ = server.child.kill();
            let _ = server.child.wait();
        }
        Err(Error("redis-server did not start; see its log".into()))
    }

    /// Spawns a server on `port` in a new temp dir, without waiting for it.
    fn spawn_at(
        port: u16,
        extra: Vec<String>,
        tls: Option<TlsServer>,
        session: Session,
    ) -> Result<LocalRedis, Error> {
        let dir = tempfile::tempdir()?;
        let child = spawn(port, dir.path(), &extra, tls.as_ref(), session)?;
        Ok(LocalRedis {
            child,
            port,
            dir,
            extra,
            tls,
            session,
        })
    }

    /// Waits until the server answers PING; false if it exits or `within` passes.
    async fn wait_ready(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            if let Some(mut con) = self.con().await {
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

    /// The server's URL: redis://, or rediss:// for a TLS-only server.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "rediss" } else { "redis" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// The TLS files of a TLS-only server: the CA to trust, a client certificate.
    pub fn tls(&self) -> Option<&TlsFiles> {
        self.tls.as_ref().map(|t| &*t.files)
    }

    /// A redis-rs client for this server; over TLS it trusts the server's CA
    /// and presents the client certificate.
    pub fn client(&self) -> Result<redis::Client, Error> {
        let certs = self.tls().map(TlsFiles::certificates).transpose()?;
        Ok(seatgate_core::db::node_client(self.url(), certs)?)
    }

    /// A fresh connection for the harness's own commands, or None while the
    /// server does not answer.
    async fn con(&self) -> Option<MultiplexedConnection> {
        self.client().ok()?.get_multiplexed_async_connection().await.ok()
    }

    /// What `ROLE` says the server is (master, slave), or None while it
    /// does not answer.
    async fn role(&self) -> Option<String> {
        let mut con = self.con().await?;
        let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(&mut con).await.ok()?;
        redis::from_redis_value(role.first()?.clone()).ok()
    }

    /// Whether this replica's link to its master is up (its first sync done).
    async fn link_up(&self) -> bool {
        let Some(mut con) = self.con().await else {
            return false;
        };
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut con)
            .await
            .unwrap_or_default();
        info.lines().any(|l| l.trim() == "master_link_status:up")
    }

    /// The server process's id (for SIGSTOP / SIGCONT).
    pub fn pid(&self) -> u32 {
        self.child.id()
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
        if let Some(mut con) = self.con().await {
            // The server closes the connection instead of answering.
            let _: redis::RedisResult<()> = redis::cmd("SHUTDOWN").query_async(&mut con).await;
        }
        while let Ok(None) = self.child.try_wait() {
            tokio::time::sleep(POLL).await;
        }
    }

    /// Starts the server again on the same port with the same data directory.
    pub async fn restart(&mut self) -> Result<(), Error> {
        self.child = spawn(
            self.port,
            self.dir.path(),
            &self.extra,
            self.tls.as_ref(),
            self.session,
        )?;
        if self.wait_ready(Duration::from_secs(10)).await {
            Ok(())
        } else {
            Err(Error("redis-server did not restart".into()))
        }
    }

    /// Starts the server again on the same port and data directory with
    /// other `--name value` arguments than it was started with, kept for
    /// later restarts (a restore that loads an RDB with `appendonly no`).
    pub async fn restart_with(&mut self, extra: &[&str]) -> Result<(), Error> {
        self.extra = extra.iter().map(|s| s.to_string()).collect();
        self.restart().await
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
    Err(Error("no free port pair for a cluster node".into()))
}

impl LocalCluster {
    /// Starts `masters` masters and as many replicas, and creates the cluster.
    pub async fn start(masters: usize) -> Result<LocalCluster, Error> {
        Self::start_with(masters, 1).await
    }

    /// Starts `masters` masters (at least 3: `redis-cli --cluster create`'s
    /// minimum) with `replicas` replicas each.
    pub async fn start_with(masters: usize, replicas: usize) -> Result<LocalCluster, Error> {
        Self::start_inner(masters, replicas, None).await
    }

    /// Like [`start_with`](Self::start_with), but every node is TLS-only,
    /// for clients, replication and the cluster bus, with one throwaway CA
    /// ([`TlsFiles`]); the nodes announce their TLS ports, so clients
    /// discover rediss:// nodes.
    pub async fn start_tls(masters: usize, replicas: usize, auth: ClientAuth) -> Result<LocalCluster, Error> {
        let files = Arc::new(TlsFiles::generate().await?);
        Self::start_inner(masters, replicas, Some(TlsServer { files, auth })).await
    }

    async fn start_inner(
        masters: usize,
        replicas: usize,
        tls: Option<TlsServer>,
    ) -> Result<LocalCluster, Error> {
        let mut nodes = Vec::new();
        for _ in 0..masters * (1 + replicas) {
            let tls_flags: &[&str] = match tls {
                Some(_) => &["--tls-cluster", "yes", "--tls-replication", "yes"],
                None => &[],
            };
            let extra: Vec<String> = tls_flags
                .iter()
                .chain(
                    [
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
                    .iter(),
                )
                .map(|s| s.to_string())
                .collect();
            let port = free_cluster_port()?;
            let mut node = LocalRedis::spawn_at(port, extra, tls.clone(), Session::Caller)?;
            if !node.wait_ready(Duration::from_secs(5)).await {
                return Err(Error(format!("cluster node on port {port} did not start")));
            }
            nodes.push(node);
        }
        let mut create = Command::new("redis-cli");
        if let Some(TlsServer { files, .. }) = &tls {
            create.arg("--tls").arg("--cacert").arg(files.ca_cert());
            create.arg("--cert").arg(files.client_cert());
            create.arg("--key").arg(files.client_key());
        }
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
            .map_err(|e| Error(format!("cannot run redis-cli --cluster create: {e}")))?;
        if !created.status.success() {
            return Err(Error(format!(
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
                return Err(Error("the cluster's replicas did not attach".into()));
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
                let Some(mut con) = n.con().await else {
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
                return Err(Error("the cluster did not reach cluster_state:ok".into()));
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
            let Some(mut con) = n.con().await else {
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
            let Some(mut con) = n.con().await else {
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

    /// After the master on `old` was killed: waits until another node owns
    /// `key`'s slot (a replica took over by itself, after the node timeout)
    /// and the live nodes report `cluster_state:ok`. Returns its port.
    pub async fn taken_over(&self, key: &str, old: u16, within: Duration) -> Result<u16, Error> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(port) = self.master_of(key).await.filter(|p| *p != old) {
                self.wait_ok(deadline.saturating_duration_since(Instant::now()))
                    .await?;
                return Ok(port);
            }
            if Instant::now() > deadline {
                return Err(Error(format!(
                    "no replica took over from the master killed on port {old}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Starts the killed node on `port` again (same port, its data
    /// directory and `nodes.conf`) and waits until it is a replica of the
    /// master on `master` with its link up, and the cluster is ok.
    pub async fn rejoin(&mut self, port: u16, master: u16, within: Duration) -> Result<(), Error> {
        let deadline = Instant::now() + within;
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.port == port)
            .ok_or_else(|| Error(format!("no node of the cluster on port {port}")))?;
        node.restart().await?;
        loop {
            if self.replicas_of(master).await.contains(&port) && self.link_up(port).await {
                return self
                    .wait_ok(deadline.saturating_duration_since(Instant::now()))
                    .await;
            }
            if Instant::now() > deadline {
                return Err(Error(format!(
                    "the node on port {port} did not rejoin as a replica of port {master}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Whether the node on `port` is a replica whose link to its master is up.
    async fn link_up(&self, port: u16) -> bool {
        match self.node(port) {
            Some(n) => n.link_up().await,
            None => false,
        }
    }

    /// The node on `port`, if it is one of the cluster's.
    pub fn node(&self, port: u16) -> Option<&LocalRedis> {
        self.nodes.iter().find(|n| n.port == port)
    }

    /// The ports of `master`'s replicas that are not failing, as the first
    /// live node sees them (`CLUSTER NODES`).
    pub async fn replicas_of(&self, master: u16) -> Vec<u16> {
        for n in &self.nodes {
            let Some(mut con) = n.con().await else {
                continue;
            };
            let Ok(text) = redis::cmd("CLUSTER")
                .arg("NODES")
                .query_async::<String>(&mut con)
                .await
            else {
                continue;
            };
            // <id> <ip:port@bus> <flags> <master id or -> ...
            let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split_whitespace().collect()).collect();
            let port_of = |row: &Vec<&str>| -> Option<u16> {
                row.get(1)?.split('@').next()?.rsplit(':').next()?.parse().ok()
            };
            let Some(id) = rows
                .iter()
                .find(|r| port_of(r) == Some(master))
                .and_then(|r| r.first())
            else {
                return Vec::new();
            };
            return rows
                .iter()
                .filter(|r| r.get(3) == Some(id))
                .filter(|r| {
                    r.get(2)
                        .is_some_and(|f| f.contains("slave") && !f.contains("fail"))
                })
                .filter_map(port_of)
                .collect();
        }
        Vec::new()
    }

    /// A coordinated failover of the master on `master`: `CLUSTER FAILOVER`
    /// on one of its replicas, once that replica's link to it is up. The
    /// master stops its clients until the replica has every write it
    /// acknowledged, then the replica takes its slots, so no acknowledged
    /// write is lost (unlike the failover after a crash, which promotes a
    /// replica that may lag). Waits until the replica says it is master,
    /// the old master that it is a replica, and every node reports
    /// `cluster_state:ok`; a manual failover that times out (Redis gives
    /// it 5 s) is asked for again. Returns the new master's port.
    pub async fn failover(&self, master: u16, within: Duration) -> Result<u16, Error> {
        let deadline = Instant::now() + within;
        let fail = |why: String| Error(format!("failover of the master on port {master}: {why}"));
        loop {
            for port in self.replicas_of(master).await {
                if self.link_up(port).await {
                    return self.failover_to(master, port, deadline).await;
                }
            }
            if Instant::now() > deadline {
                return Err(fail("no replica in sync with it".into()));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// [`failover`](Self::failover) once `replica`, in sync with `master`, is chosen.
    async fn failover_to(&self, master: u16, replica: u16, deadline: Instant) -> Result<u16, Error> {
        let fail = |why: String| Error(format!("failover of the master on port {master}: {why}"));
        let (Some(node), Some(old)) = (self.node(replica), self.node(master)) else {
            return Err(fail("no such node".into()));
        };
        while Instant::now() < deadline {
            let mut con = node
                .con()
                .await
                .ok_or_else(|| fail(format!("the replica on port {replica} does not answer")))?;
            let _: () = redis::cmd("CLUSTER")
                .arg("FAILOVER")
                .query_async(&mut con)
                .await
                .map_err(|e| fail(format!("CLUSTER FAILOVER on port {replica}: {e}")))?;
            let asked = Instant::now();
            while asked.elapsed() < Duration::from_secs(7) && Instant::now() < deadline {
                if node.role().await.as_deref() == Some("master")
                    && old.role().await.as_deref() == Some("slave")
                {
                    self.wait_ok(deadline.saturating_duration_since(Instant::now()))
                        .await?;
                    return Ok(replica);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Err(fail(format!("the replica on port {replica} did not take over")))
    }
}

/// A private Redis Sentinel deployment: one master, `replicas` replicas of
/// it, and `sentinels` redis-sentinel processes (`redis-server --sentinel`)
/// monitoring it as [`LocalSentinel::MASTER_NAME`] with a quorum of a
/// majority, all on free loopback ports, stopped on drop. The Sentinels
/// call a master down after 1 s without an answer, so a failover takes a
/// few seconds.
pub struct LocalSentinel {
    /// The data nodes, the first master at the start (failovers change roles).
    pub nodes: Vec<LocalRedis>,
    /// The Sentinel processes.
    sentinels: Vec<SentinelProcess>,
}

/// One redis-sentinel process, killed on drop.
struct SentinelProcess {
    child: Child,
    port: u16,
    /// Its config file (Sentinel rewrites it) and log.
    dir: tempfile::TempDir,
}

impl Drop for SentinelProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            if let Ok(log) = std::fs::read_to_string(self.dir.path().join("sentinel.log")) {
                eprintln!("--- redis-sentinel log (port {}) ---\n{log}", self.port);
            }
        }
    }
}

impl LocalSentinel {
    /// The name the Sentinels monitor the master by.
    pub const MASTER_NAME: &'static str = "seatgate";

    /// Starts a master, `replicas` replicas and `sentinels` Sentinels, and
    /// waits until every Sentinel knows the master, its replicas and the
    /// other Sentinels (so a failover can be agreed on at once).
    pub async fn start(replicas: usize, sentinels: usize) -> Result<LocalSentinel, Error> {
        // No 5 s wait for more replicas before the first full sync.
        let master = LocalRedis::start(&["--repl-diskless-sync-delay", "0"]).await?;
        let master_port = master.port().to_string();
        let mut nodes = vec![master];
        for _ in 0..replicas {
            nodes.push(LocalRedis::start(&["--replicaof", "127.0.0.1", &master_port]).await?);
        }
        let quorum = sentinels / 2 + 1;
        let mut procs = Vec::new();
        for _ in 0..sentinels {
            procs.push(Self::spawn_sentinel(&master_port, quorum)?);
        }
        let deployment = LocalSentinel {
            nodes,
            sentinels: procs,
        };
        deployment
            .wait_known(replicas, sentinels, Duration::from_secs(20))
            .await?;
        Ok(deployment)
    }

    fn spawn_sentinel(master_port: &str, quorum: usize) -> Result<SentinelProcess, Error> {
        let dir = tempfile::tempdir()?;
        let port = free_port()?;
        let name = Self::MASTER_NAME;
        let conf = format!(
            "port {port}\nbind 127.0.0.1\nprotected-mode yes\ndir {dir}\nlogfile {log}\n\
             sentinel monitor {name} 127.0.0.1 {master_port} {quorum}\n\
             sentinel down-after-milliseconds {name} 1000\n\
             sentinel failover-timeout {name} 10000\n\
             sentinel parallel-syncs {name} 1\n",
            dir = dir.path().display(),
            log = dir.path().join("sentinel.log").display(),
        );
        let path = dir.path().join("sentinel.conf");
        std::fs::write(&path, conf)?;
        let child = Command::new("redis-server")
            .arg(&path)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                Error(format!(
                    "cannot start redis-server --sentinel ({e}); install it: apt-get install redis-server redis-sentinel"
                ))
            })?;
        Ok(SentinelProcess { child, port, dir })
    }

    /// The Sentinels' URLs, for `redis.sentinel.urls`.
    pub fn urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| format!("redis://127.0.0.1:{}", s.port))
            .collect()
    }

    /// `[redis]` settings for this deployment: Sentinel mode, the master's name.
    pub fn apply(&self, redis: &mut RedisSettings) {
        redis.sentinel.urls = self.urls();
        redis.sentinel.master_name = Self::MASTER_NAME.to_owned();
    }

    async fn sentinel_con(&self, port: u16) -> Option<MultiplexedConnection> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?;
        let cfg = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(1)))
            .set_response_timeout(Some(Duration::from_secs(1)));
        client
            .get_multiplexed_async_connection_with_config(&cfg)
            .await
            .ok()
    }

    /// The master's port as Sentinel `port` names it now.
    async fn named_by(&self, port: u16) -> Option<u16> {
        let mut con = self.sentinel_con(port).await?;
        let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(Self::MASTER_NAME)
            .query_async(&mut con)
            .await
            .ok()?;
        addr.map(|(_, p)| p)
    }

    async fn wait_known(&self, replicas: usize, sentinels: usize, within: Duration) -> Result<(), Error> {
        let deadline = Instant::now() + within;
        loop {
            let mut ready = true;
            for s in &self.sentinels {
                let Some(mut con) = self.sentinel_con(s.port).await else {
                    ready = false;
                    break;
                };
                let master: redis::RedisResult<std::collections::HashMap<String, String>> =
                    redis::cmd("SENTINEL")
                        .arg("MASTER")
                        .arg(Self::MASTER_NAME)
                        .query_async(&mut con)
                        .await;
                let count = |m: &std::collections::HashMap<String, String>, k: &str| {
                    m.get(k).and_then(|v| v.parse::<usize>().ok()).unwrap_or(0)
                };
                match master {
                    Ok(m)
                        if count(&m, "num-slaves") >= replicas
                            && count(&m, "num-other-sentinels") + 1 >= sentinels => {}
                    _ => ready = false,
                }
            }
            for replica in &self.nodes[1..] {
                ready &= replica.link_up().await;
            }
            if ready {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error("the Sentinels did not find the master, its replicas and each other in time, or a replica did not sync".into()));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The master's port as the Sentinels name it (the first that answers).
    pub async fn master_port(&self) -> Option<u16> {
        for s in &self.sentinels {
            if let Some(port) = self.named_by(s.port).await {
                return Some(port);
            }
        }
        None
    }

    /// The data node on `port`.
    pub fn node(&self, port: u16) -> Option<&LocalRedis> {
        self.nodes.iter().find(|n| n.port() == port)
    }

    /// SIGKILL of the data node on `port`.
    pub fn kill9(&mut self, port: u16) {
        if let Some(node) = self.nodes.iter_mut().find(|n| n.port() == port) {
            node.kill9();
        }
    }

    /// Waits until every Sentinel names a master other than `old` and that
    /// node says it is a master; returns its port.
    pub async fn promoted(&self, old: u16, within: Duration) -> Result<u16, Error> {
        let deadline = Instant::now() + within;
        loop {
            let mut named = Vec::new();
            for s in &self.sentinels {
                named.push(self.named_by(s.port).await);
            }
            if let Some(Some(new)) = named.first().copied() {
                let agreed = named.iter().all(|p| *p == Some(new));
                let is_master = match self.node(new) {
                    Some(node) => node.role().await.as_deref() == Some("master"),
                    None => false,
                };
                if new != old && agreed && is_master {
                    return Ok(new);
                }
            }
            if Instant::now() > deadline {
                return Err(Error(format!(
                    "no replica of :{old} was promoted in time (the Sentinels name {named:?})"
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
