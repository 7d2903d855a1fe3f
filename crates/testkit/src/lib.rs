//! Helpers for tests and benchmarks: real etcd clusters on loopback.
//!
//! [`EtcdCluster::start`] runs one or three `etcd` processes (the binary from
//! [`etcd_binary`]) with their data under one temporary directory, client and peer URLs on
//! `127.0.0.1` with free ports, default durability (the WAL is fsynced) and quiet logging.
//! Each member's stdout and stderr go to `member-N.log` in that directory. Dropping the
//! cluster kills every member and deletes the directory.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! let cluster = kumo_testkit::EtcdCluster::start(3).await?;
//! let endpoints = cluster.endpoints(); // ["http://127.0.0.1:PORT", ...]
//! # Ok(()) }
//! ```

pub mod certs;
pub mod kubectl;

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use tempfile::TempDir;

/// How long [`EtcdCluster::start`] waits for every member to answer.
pub const START_TIMEOUT: Duration = Duration::from_secs(20);

/// Largest request the test members accept. etcd's default (1.5 MiB) is exactly kumo's
/// default value limit, so a value at the limit plus its key would be refused by etcd
/// instead of by `Limits::check`; the members get some headroom.
const MAX_REQUEST_BYTES: usize = 4 * 1024 * 1024;

/// The etcd binary to run: `$KUMO_ETCD` if set, else `etcd` on `PATH`.
pub fn etcd_binary() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("KUMO_ETCD") {
        let path = PathBuf::from(path);
        if !path.is_file() {
            bail!(
                "KUMO_ETCD is set to {}, which is not a file; point it at an etcd binary",
                path.display()
            );
        }
        return Ok(path);
    }
    if let Some(dirs) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&dirs) {
            let candidate = dir.join("etcd");
            if is_executable(&candidate) {
                return Ok(candidate);
            }
        }
    }
    bail!(
        "etcd not found: set KUMO_ETCD to an etcd binary or install Debian's etcd-server \
         package (`apt-get install -y etcd-server`; scripts/test does it)"
    )
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, then released).
pub fn free_port() -> u16 {
    free_ports(1).first().copied().unwrap_or(0)
}

/// `n` distinct free ports: every listener is held until all are chosen.
fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..n)
        .filter_map(|_| TcpListener::bind("127.0.0.1:0").ok())
        .collect();
    listeners
        .iter()
        .filter_map(|l| l.local_addr().ok().map(|a| a.port()))
        .collect()
}

/// One etcd process of an [`EtcdCluster`].
struct Member {
    name: String,
    client_url: String,
    peer_url: String,
    data_dir: PathBuf,
    log_path: PathBuf,
    child: Option<Child>,
}

impl Member {
    /// Kills the process (SIGKILL) and reaps it.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The last lines of the member's log, for error messages.
    fn log_tail(&self) -> String {
        log_tail(&self.log_path, 30)
    }
}

fn log_tail(path: &Path, lines: usize) -> String {
    let mut text = String::new();
    if let Ok(mut f) = File::open(path) {
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let _ = f.seek(SeekFrom::Start(len.saturating_sub(16 * 1024)));
        let mut buf = Vec::new();
        let _ = f.read_to_end(&mut buf);
        text = String::from_utf8_lossy(&buf).into_owned();
    }
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A running etcd cluster of 1 or 3 members on loopback, bootstrapped statically.
///
/// Dropping it kills every member (SIGKILL) and removes their data.
pub struct EtcdCluster {
    members: Vec<Member>,
    binary: PathBuf,
    initial_cluster: String,
    token: String,
    // Dropped last: the processes are killed before their directory goes away.
    dir: TempDir,
}

impl EtcdCluster {
    /// Starts `members` (1 or 3) etcd processes and waits (up to [`START_TIMEOUT`]) until
    /// every member serves a linearizable read.
    pub async fn start(members: usize) -> anyhow::Result<EtcdCluster> {
        if members != 1 && members != 3 {
            bail!("an EtcdCluster has 1 or 3 members, not {members}");
        }
        let binary = etcd_binary()?;
        // A port picked by `free_ports` can be taken by someone else before etcd binds it;
        // such a start is retried with new ports.
        let mut last_err = None;
        for _ in 0..3 {
            match Self::try_start(&binary, members).await {
                Ok(cluster) => return Ok(cluster),
                Err(e) if format!("{e:#}").contains("address already in use") => {
                    tracing::warn!(error = %format!("{e:#}"), "etcd port taken, retrying");
                    last_err = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last_err.unwrap_or_else(|| anyhow!("etcd did not start")))
    }

    async fn try_start(binary: &Path, n: usize) -> anyhow::Result<EtcdCluster> {
        let dir = tempfile::Builder::new()
            .prefix("kumo-etcd-")
            .tempdir()
            .context("creating the etcd temp dir")?;
        let ports = free_ports(2 * n);
        if ports.len() != 2 * n {
            bail!("could not find {} free ports on 127.0.0.1", 2 * n);
        }
        let members: Vec<Member> = (0..n)
            .map(|i| Member {
                name: format!("m{i}"),
                client_url: format!("http://127.0.0.1:{}", ports[2 * i]),
                peer_url: format!("http://127.0.0.1:{}", ports[2 * i + 1]),
                data_dir: dir.path().join(format!("m{i}.etcd")),
                log_path: dir.path().join(format!("member-{i}.log")),
                child: None,
            })
            .collect();
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url))
            .collect::<Vec<_>>()
            .join(",");
        let token = format!(
            "kumo-{}-{}",
            std::process::id(),
            dir.path()
                .file_name()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default()
        );
        let mut cluster = EtcdCluster {
            members,
            binary: binary.to_path_buf(),
            initial_cluster,
            token,
            dir,
        };
        for i in 0..n {
            cluster.spawn_member(i)?;
        }
        cluster.wait_healthy().await?;
        Ok(cluster)
    }

    /// Launches member `i`'s process (its data dir decides whether it bootstraps or
    /// rejoins).
    fn spawn_member(&mut self, i: usize) -> anyhow::Result<()> {
        let binary = self.binary.clone();
        let initial_cluster = self.initial_cluster.clone();
        let token = self.token.clone();
        let m = self
            .members
            .get_mut(i)
            .ok_or_else(|| anyhow!("no member {i}"))?;
        let log = File::options()
            .create(true)
            .append(true)
            .open(&m.log_path)
            .with_context(|| format!("creating {}", m.log_path.display()))?;
        let log_err = log.try_clone()?;
        let mut cmd = Command::new(&binary);
        // Settings from the environment (ETCD_*) would silently change the cluster.
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("ETCD") {
                cmd.env_remove(k);
            }
        }
        cmd.arg("--name")
            .arg(&m.name)
            .arg("--data-dir")
            .arg(&m.data_dir)
            .arg("--listen-client-urls")
            .arg(&m.client_url)
            .arg("--advertise-client-urls")
            .arg(&m.client_url)
            .arg("--listen-peer-urls")
            .arg(&m.peer_url)
            .arg("--initial-advertise-peer-urls")
            .arg(&m.peer_url)
            .arg("--initial-cluster")
            .arg(&initial_cluster)
            .arg("--initial-cluster-state")
            .arg("new")
            .arg("--initial-cluster-token")
            .arg(&token)
            .arg("--max-request-bytes")
            .arg(MAX_REQUEST_BYTES.to_string())
            .arg("--logger")
            .arg("zap")
            .arg("--log-outputs")
            .arg("stderr")
            .arg("--log-level")
            .arg("error")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        tracing::debug!(member = %m.name, pid = child.id(), url = %m.client_url, "etcd started");
        m.child = Some(child);
        Ok(())
    }

    /// Waits until every running member answers a linearizable read.
    async fn wait_healthy(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        for i in 0..self.members.len() {
            if self.members[i].child.is_some() {
                self.wait_member_healthy(i, deadline).await?;
            }
        }
        Ok(())
    }

    async fn wait_member_healthy(&mut self, i: usize, deadline: Instant) -> anyhow::Result<()> {
        let url = self.members[i].client_url.clone();
        let opts = etcd_client::ConnectOptions::new()
            .with_connect_timeout(Duration::from_millis(500))
            .with_timeout(Duration::from_secs(2));
        loop {
            let m = &mut self.members[i];
            if let Some(child) = m.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    m.child = None;
                    bail!(
                        "etcd member {} exited during start-up ({status}); log tail:\n{}",
                        m.name,
                        m.log_tail()
                    );
                }
            }
            let attempt = async {
                let mut client = etcd_client::Client::connect([url.as_str()], Some(opts.clone()))
                    .await
                    .map_err(|e| e.to_string())?;
                // A linearizable read needs a leader and a quorum.
                client
                    .get("health", None)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok::<(), String>(())
            };
            let last_err = match tokio::time::timeout(Duration::from_secs(3), attempt).await {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(e)) => e,
                Err(_) => String::from("health check timed out"),
            };
            if Instant::now() >= deadline {
                let m = &self.members[i];
                bail!(
                    "etcd member {} ({}) not healthy after {:?}: {last_err}; log tail:\n{}",
                    m.name,
                    m.client_url,
                    START_TIMEOUT,
                    m.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Number of members (running or killed).
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the cluster has no members (never true for a started cluster).
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Client URLs of every member (`http://127.0.0.1:PORT`), killed ones included.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.client_url.clone()).collect()
    }

    /// Kills member `i` with SIGKILL and waits for it to exit. Does nothing if it is not
    /// running (or does not exist).
    pub fn kill_member(&mut self, i: usize) {
        if let Some(m) = self.members.get_mut(i) {
            tracing::debug!(member = %m.name, "killing etcd member");
            m.kill();
        }
    }

    /// Restarts a killed member `i` on its old data and ports, and waits until it serves
    /// reads again. Does nothing if it is running.
    pub async fn restart_member(&mut self, i: usize) -> anyhow::Result<()> {
        let m = self
            .members
            .get(i)
            .ok_or_else(|| anyhow!("no member {i}"))?;
        if m.child.is_some() {
            return Ok(());
        }
        self.spawn_member(i)?;
        self.wait_member_healthy(i, Instant::now() + START_TIMEOUT)
            .await
    }

    /// The process id of member `i`, or `None` if it is not running.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members.get(i)?.child.as_ref().map(|c| c.id())
    }

    /// The directory holding every member's data and log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Member `i`'s log file (its stdout and stderr).
    pub fn log_path(&self, i: usize) -> Option<&Path> {
        self.members.get(i).map(|m| m.log_path.as_path())
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for m in &mut self.members {
            m.kill();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_distinct() {
        let mut ports = free_ports(6);
        assert_eq!(ports.len(), 6);
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), 6);
        assert_ne!(free_port(), 0);
    }

    #[test]
    fn log_tail_keeps_the_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        std::fs::write(&path, "a\nb\nc\nd\n").unwrap();
        assert_eq!(log_tail(&path, 2), "c\nd");
        assert_eq!(log_tail(&dir.path().join("missing"), 2), "");
    }
}
