//! A stacked etcd member, as kubeadm runs one on each control-plane machine: the real etcd
//! (Debian's `etcd-server`, or `$KUMO_ETCD`) as a child process of the machine, serving
//! clients and peers over TLS with the certificates of `pki/etcd` (client certificates
//! required on both), its data in the machine's `var/lib/etcd`. The machine's API server
//! is its client with `apiserver-etcd-client`. A joining control-plane machine adds its
//! member to the cluster as a learner and promotes it once it has caught up (kubeadm's
//! default since etcd learner mode went GA).
//!
//! Every machine of this host shares the host's loopback, so a member's URLs are
//! `https://127.0.0.1:<port>` with ports picked free; the static pod manifest shows the
//! same command line the process runs.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use kumo_storage::etcd::EtcdTls;

/// How long a member has to answer after it starts.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// The etcd binary: `$KUMO_ETCD`, else `etcd` on `PATH`, else Debian's.
pub fn binary() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("KUMO_ETCD") {
        return Ok(PathBuf::from(p));
    }
    let on_path = std::env::var_os("PATH")
        .map(|dirs| {
            std::env::split_paths(&dirs)
                .map(|d| d.join("etcd"))
                .find(|c| c.is_file())
        })
        .unwrap_or_default();
    on_path
        .or_else(|| Some(PathBuf::from("/usr/bin/etcd")).filter(|p| p.is_file()))
        .ok_or_else(|| {
            anyhow!(
                "etcd not found: a control-plane machine runs a stacked etcd member; install \
                 Debian's etcd-server (`apt-get install etcd-server`) or set KUMO_ETCD"
            )
        })
}

/// The paths of the member's liveness and readiness checks on its metrics listener:
/// kubeadm probes `/livez` and `/readyz`, which etcd serves since 3.5.11; an older etcd
/// (Debian's 3.4) has only `/health`.
pub fn health_paths() -> (&'static str, &'static str) {
    let version = binary()
        .ok()
        .and_then(|b| Command::new(b).arg("--version").output().ok())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    paths_for(&version)
}

/// [`health_paths`] for the output of `etcd --version`.
fn paths_for(version: &str) -> (&'static str, &'static str) {
    let number: Vec<u32> = version
        .lines()
        .find_map(|l| l.strip_prefix("etcd Version: "))
        .unwrap_or("")
        .trim()
        .split('.')
        .filter_map(|p| p.parse().ok())
        .collect();
    if number.as_slice() >= [3, 5, 11].as_slice() {
        ("/livez", "/readyz")
    } else {
        ("/health", "/health")
    }
}

/// The API server's (and kubeadm's) TLS client of the members under `pki`.
pub fn client_tls(pki: &Path) -> EtcdTls {
    EtcdTls {
        ca_file: pki.join("etcd/ca.crt"),
        cert_file: pki.join("apiserver-etcd-client.crt"),
        key_file: pki.join("apiserver-etcd-client.key"),
    }
}

/// Where one member serves.
#[derive(Clone, Debug)]
pub struct Urls {
    pub client: String,
    pub peer: String,
    pub metrics_port: u16,
}

/// Where members' ports are picked: below the kernel's ephemeral range, which outgoing
/// connections take their local ports from. A port the kernel hands out for `:0` is in
/// that range, and between its release and etcd's bind any connection of this host could
/// take it, and the member would exit; below the range only another bind can.
const PORTS: std::ops::Range<u16> = 20000..30000;

impl Urls {
    /// Three free loopback ports below the ephemeral range (held together while they are
    /// picked).
    pub fn pick() -> Result<Urls> {
        use rand::Rng;
        let mut rng = rand::rng();
        let mut listeners: Vec<std::net::TcpListener> = Vec::new();
        for _ in 0..1000 {
            if listeners.len() == 3 {
                break;
            }
            let port = rng.random_range(PORTS);
            if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port)) {
                listeners.push(l);
            }
        }
        if listeners.len() < 3 {
            bail!(
                "picking ports for etcd: fewer than three free in {}..{}",
                PORTS.start,
                PORTS.end
            );
        }
        let ports: Vec<u16> = listeners
            .iter()
            .map(|l| l.local_addr().map(|a| a.port()))
            .collect::<std::io::Result<_>>()?;
        Ok(Urls {
            client: format!("https://127.0.0.1:{}", ports[0]),
            peer: format!("https://127.0.0.1:{}", ports[1]),
            metrics_port: ports[2],
        })
    }
}

/// What a member is started with.
pub struct MemberSpec<'a> {
    /// The member's name: its node's.
    pub name: &'a str,
    /// The machine's disk (data in `var/lib/etcd`, log in `var/log/etcd.log`).
    pub machine: &'a Path,
    /// `etc/kubernetes/pki` of the machine.
    pub pki: &'a Path,
    /// Where it serves ([`Urls::pick`]; a joining member's peer URL is added first).
    pub urls: Urls,
    /// The members already in the cluster, (name, peer URL); empty for the first.
    pub existing: Vec<(String, String)>,
}

/// A running member; dropping it stops the process (by its PID).
pub struct Member {
    pub name: String,
    pub urls: Urls,
    /// The command line, as the static pod shows it.
    pub command: Vec<String>,
    child: Child,
    pid_file: PathBuf,
}

impl Member {
    /// Starts the member and waits until it serves reads (a joining one: after
    /// [`add_learner`] and before [`promote`]).
    pub async fn start(spec: MemberSpec<'_>) -> Result<Member> {
        let binary = binary()?;
        let urls = spec.urls.clone();
        let data = spec.machine.join("var/lib/etcd");
        std::fs::create_dir_all(&data).with_context(|| format!("creating {}", data.display()))?;
        let log_dir = spec.machine.join("var/log");
        std::fs::create_dir_all(&log_dir)?;
        let etcd_pki = spec.pki.join("etcd");
        let file = |n: &str| etcd_pki.join(n).display().to_string();
        let mut cluster: Vec<String> = spec
            .existing
            .iter()
            .map(|(n, p)| format!("{n}={p}"))
            .collect();
        cluster.push(format!("{}={}", spec.name, urls.peer));
        // kubeadm's flags (its etcd static pod), at this machine's ports.
        let mut command = vec![
            "etcd".to_owned(),
            format!("--advertise-client-urls={}", urls.client),
            format!("--cert-file={}", file("server.crt")),
            "--client-cert-auth=true".into(),
            format!("--data-dir={}", data.display()),
            format!("--initial-advertise-peer-urls={}", urls.peer),
            format!("--initial-cluster={}", cluster.join(",")),
        ];
        if !spec.existing.is_empty() {
            command.push("--initial-cluster-state=existing".into());
        }
        command.extend([
            format!("--key-file={}", file("server.key")),
            format!("--listen-client-urls={}", urls.client),
            format!(
                "--listen-metrics-urls=http://127.0.0.1:{}",
                urls.metrics_port
            ),
            format!("--listen-peer-urls={}", urls.peer),
            format!("--name={}", spec.name),
            format!("--peer-cert-file={}", file("peer.crt")),
            "--peer-client-cert-auth=true".into(),
            format!("--peer-key-file={}", file("peer.key")),
            format!("--peer-trusted-ca-file={}", file("ca.crt")),
            "--snapshot-count=10000".into(),
            format!("--trusted-ca-file={}", file("ca.crt")),
        ]);
        let log_path = log_dir.join("etcd.log");
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("opening {}", log_path.display()))?;
        // Should this process die without powering its machines off, the member goes
        // with it: util-linux's setpriv sets the kernel's parent-death signal and execs
        // etcd (`kumo down` also reads the pid file).
        let mut cmd = Command::new("setpriv");
        cmd.arg("--pdeathsig=KILL").arg("--").arg(&binary);
        // The machine's settings are its flags only.
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("ETCD") {
                cmd.env_remove(k);
            }
        }
        cmd.args(&command[1..])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let pid_file = pid_file(spec.machine);
        if let Some(d) = pid_file.parent() {
            std::fs::create_dir_all(d)?;
        }
        std::fs::write(&pid_file, format!("{}\n", child.id()))
            .with_context(|| format!("writing {}", pid_file.display()))?;
        tracing::info!(member = spec.name, pid = child.id(), client = %urls.client, "etcd member started");
        let mut member = Member {
            name: spec.name.to_owned(),
            urls,
            command,
            child,
            pid_file,
        };
        member.wait_ready(&client_tls(spec.pki), &log_path).await?;
        Ok(member)
    }

    async fn wait_ready(&mut self, tls: &EtcdTls, log: &Path) -> Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        let options = etcd_client::ConnectOptions::new()
            .with_connect_timeout(Duration::from_millis(500))
            .with_timeout(Duration::from_secs(2))
            .with_tls(tls.options()?);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                let tail = std::fs::read_to_string(log).unwrap_or_default();
                let tail: Vec<&str> = tail.lines().rev().take(5).collect();
                bail!(
                    "etcd member {} exited ({status}): {}",
                    self.name,
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                );
            }
            let attempt = async {
                let mut c = etcd_client::Client::connect(
                    [self.urls.client.as_str()],
                    Some(options.clone()),
                )
                .await?;
                // Serializable: a learner serves no linearizable read until promoted.
                c.get(
                    "health",
                    Some(etcd_client::GetOptions::new().with_serializable()),
                )
                .await
                .map(|_| ())
            };
            match attempt.await {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() > deadline => {
                    bail!("etcd member {} did not become ready: {e}", self.name)
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        // Powered off: the process goes with its machine.
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.pid_file);
    }
}

/// Where a machine records its member's process.
fn pid_file(machine: &Path) -> PathBuf {
    machine.join("var/run/etcd.pid")
}

/// Stops the members the machines under `machines` left running (a `kumo` that ended
/// without powering them off): each by the PID its machine recorded, if that process is
/// still an etcd of that machine.
pub fn stop_all(machines: &Path) {
    let Ok(entries) = std::fs::read_dir(machines) else {
        return;
    };
    for machine in entries.flatten().map(|e| e.path()) {
        let file = pid_file(&machine);
        let Some(pid) = std::fs::read_to_string(&file)
            .ok()
            .and_then(|t| t.trim().parse::<i32>().ok())
        else {
            continue;
        };
        let data = format!("--data-dir={}", machine.join("var/lib/etcd").display());
        let ours = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|c| c.split(|b| *b == 0).any(|arg| arg == data.as_bytes()))
            .unwrap_or(false);
        if ours {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            tracing::info!(pid, machine = %machine.display(), "stopped a machine's etcd member");
        }
        let _ = std::fs::remove_file(&file);
    }
}

async fn connect(endpoints: &[String], tls: &EtcdTls) -> Result<etcd_client::Client> {
    let options = etcd_client::ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(Duration::from_secs(5))
        .with_tls(tls.options()?);
    etcd_client::Client::connect(endpoints, Some(options))
        .await
        .context("connecting to etcd")
}

/// A client of the first of `endpoints` that answers: the etcd pods a joining machine
/// reads may include members that are gone (their mirror pods not yet collected).
async fn connect_any(endpoints: &[String], tls: &EtcdTls) -> Result<etcd_client::Client> {
    let mut last = None;
    for e in endpoints {
        match connect(std::slice::from_ref(e), tls).await {
            Ok(mut c) => match c.status().await {
                Ok(_) => return Ok(c),
                Err(err) => last = Some(anyhow!("{e}: {err}")),
            },
            Err(err) => last = Some(err.context(e.clone())),
        }
    }
    Err(last.unwrap_or_else(|| anyhow!("no etcd endpoints")))
}

/// Adds `name` at `peer_url` as a learner through `endpoints`; the members before it,
/// (name, peer URL), for its `--initial-cluster`.
pub async fn add_learner(
    endpoints: &[String],
    tls: &EtcdTls,
    name: &str,
    peer_url: &str,
) -> Result<(u64, Vec<(String, String)>)> {
    let mut c = connect_any(endpoints, tls).await?;
    // A member of this name left over from an earlier try of this machine goes first, and
    // so does a learner that never started (a machine that failed to join: etcd allows
    // one learner at a time, and control-plane machines join one at a time).
    let list = c.member_list().await.context("listing etcd members")?;
    for m in list.members() {
        let stale_learner = m.is_learner() && m.name().is_empty();
        if stale_learner || m.name() == name || m.peer_urls().iter().any(|u| u == peer_url) {
            c.member_remove(m.id())
                .await
                .context("removing a stale etcd member")?;
        }
    }
    // etcd refuses a new member while one it has is not yet connected to the others
    // ("unhealthy cluster", as after another member's join); kubeadm waits and retries.
    let deadline = Instant::now() + START_TIMEOUT;
    let added = loop {
        let options = etcd_client::MemberAddOptions::new().with_is_learner();
        match c.member_add([peer_url.to_owned()], Some(options)).await {
            Ok(a) => break a,
            Err(e) if Instant::now() < deadline && e.to_string().contains("unhealthy cluster") => {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e).context("adding the etcd member"),
        }
    };
    let id = added
        .member()
        .map(|m| m.id())
        .ok_or_else(|| anyhow!("etcd did not say which member it added"))?;
    let existing = added
        .member_list()
        .iter()
        .filter(|m| m.id() != id && !m.name().is_empty())
        .filter_map(|m| Some((m.name().to_owned(), m.peer_urls().first()?.clone())))
        .collect();
    Ok((id, existing))
}

/// Promotes learner `id` once it has caught up (etcd refuses until then).
pub async fn promote(endpoints: &[String], tls: &EtcdTls, id: u64) -> Result<()> {
    let deadline = Instant::now() + START_TIMEOUT;
    let mut c = connect_any(endpoints, tls).await?;
    loop {
        match c.member_promote(id).await {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() > deadline => {
                return Err(e).context("promoting the etcd learner")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_follow_what_the_etcd_serves() {
        assert_eq!(
            paths_for("etcd Version: 3.4.23\nGit SHA: Not provided\n"),
            ("/health", "/health")
        );
        assert_eq!(paths_for("etcd Version: 3.5.11\n"), ("/livez", "/readyz"));
        assert_eq!(paths_for("etcd Version: 3.6.16\n"), ("/livez", "/readyz"));
        assert_eq!(paths_for(""), ("/health", "/health"));
    }

    #[test]
    fn ports_are_three_distinct_ones_below_the_ephemeral_range() {
        let urls = Urls::pick().unwrap();
        let port = |u: &str| u.rsplit(':').next().unwrap().parse::<u16>().unwrap();
        let ports = [port(&urls.client), port(&urls.peer), urls.metrics_port];
        assert!(ports.iter().all(|p| PORTS.contains(p)), "{ports:?}");
        assert!(ports[0] != ports[1] && ports[1] != ports[2] && ports[0] != ports[2]);
    }
}
