//! A node's machine on this host: the network namespace kumo makes for it and the
//! containerd that runs its pods there, configured under the node's directory (root,
//! state, socket, CNI configuration), with kumo's offline images imported. Everything the
//! node's pods need on the network (bridge, veths, addresses, routes) is made by the CNI
//! plugins inside that namespace; the host's own namespace gets none of it.
//!
//! What a node leaves behind is found again from its directory (`node.json`): a `kumo
//! down` after a crash stops the same containerd and shims and removes the same namespace,
//! mounts and cgroups.

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

pub mod images;

/// What goes wrong starting or stopping a node's machine.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the containerd runtime needs {what}: {hint}")]
    Missing { what: String, hint: String },
    #[error("{action}: {source}")]
    Io {
        action: String,
        #[source]
        source: io::Error,
    },
    #[error("{command} failed: {output}")]
    Command { command: String, output: String },
    #[error("containerd of node {node} did not come up within {secs} s; its log ({log}) ends with:\n{tail}")]
    NotUp {
        node: String,
        secs: u64,
        log: String,
        tail: String,
    },
}

fn io_err(action: impl Into<String>) -> impl FnOnce(io::Error) -> Error {
    let action = action.into();
    move |source| Error::Io { action, source }
}

/// Where the CNI plugins are (Debian's containernetworking-plugins).
pub const CNI_BIN_DIR: &str = "/usr/lib/cni";
/// The sandbox image, as upstream's kubelet names it by default.
pub const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10.2";
/// The Debian packages the real runtime needs.
pub const PACKAGES: &str =
    "containerd runc containernetworking-plugins nftables conntrack procps mount e2fsprogs xfsprogs";

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|d| d.join(program).is_file()))
}

/// Checks what the containerd runtime needs here, saying what is missing and how to get it.
pub fn prerequisites() -> Result<(), Error> {
    if !nix::unistd::geteuid().is_root() {
        return Err(Error::Missing {
            what: "root".into(),
            hint: "it makes network namespaces, mounts and cgroups; run kumo up as root, or use --runtime sim".into(),
        });
    }
    // nft, conntrack and sysctl for the nodes' network (kube-proxy's table and stale UDP
    // flows, forwarding).
    let missing: Vec<&str> = [
        "containerd",
        "runc",
        "ctr",
        "nsenter",
        "ip",
        "nft",
        "conntrack",
        "sysctl",
        // The disks' loop devices and file systems (the CSI driver's node plugin).
        "losetup",
        "mkfs.ext4",
        "mkfs.xfs",
        "xfs_growfs",
    ]
    .into_iter()
    .filter(|p| !on_path(p))
    .collect();
    let plugins: Vec<&str> = ["bridge", "host-local", "loopback", "portmap"]
        .into_iter()
        .filter(|p| !Path::new(CNI_BIN_DIR).join(p).is_file())
        .collect();
    if !missing.is_empty() || !plugins.is_empty() {
        let mut what = missing.join(", ");
        if !plugins.is_empty() {
            if !what.is_empty() {
                what.push_str(", ");
            }
            what.push_str(&format!(
                "the CNI plugins {} in {CNI_BIN_DIR}",
                plugins.join(", ")
            ));
        }
        return Err(Error::Missing {
            what,
            hint: format!("apt-get install {PACKAGES} (the README's run command does)"),
        });
    }
    Ok(())
}

/// What a node's machine is made from.
#[derive(Clone, Debug)]
pub struct NodeSpec {
    /// The node's name.
    pub name: String,
    /// Its directory (`<data-dir>/nodes/<name>`).
    pub dir: PathBuf,
    /// Image archives to import before pods run (the pause image among them).
    pub images: Vec<PathBuf>,
}

/// What is recorded of a running node's machine in its directory.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Record {
    pub name: String,
    /// The network namespace's name (`/run/netns/<netns>`).
    pub netns: String,
    /// containerd's process.
    pub containerd_pid: Option<u32>,
    /// The cgroup the node's pods go under (the kubelet's `--cgroup-root`).
    pub cgroup_root: String,
}

/// A node's running machine.
#[derive(Debug)]
pub struct NodeHost {
    dir: PathBuf,
    record: Record,
}

/// A short name unique to the node's directory: namespaces of two clusters on one
/// machine do not meet, and a name stays within what `ip netns` takes.
fn netns_name(dir: &Path, node: &str) -> String {
    let mut hash: u32 = 0x811c_9dc5;
    for b in dir.as_os_str().as_encoded_bytes() {
        hash ^= u32::from(*b);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    let short: String = node.chars().take(24).collect();
    format!("kumo-{hash:08x}-{short}")
}

fn run(cmd: &mut Command) -> Result<String, Error> {
    let shown = format!("{cmd:?}");
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(io_err(format!("running {shown}")))?;
    if !out.status.success() {
        return Err(Error::Command {
            command: shown,
            output: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl NodeHost {
    /// Makes the node's namespace, starts its containerd in it and imports the images.
    /// Whatever an earlier run of the same node left is taken down first.
    pub fn start(spec: &NodeSpec) -> Result<NodeHost, Error> {
        prerequisites()?;
        teardown(&spec.dir)?;
        Self::bring_up(spec).inspect_err(|_| {
            // A machine that did not come up leaves nothing running behind it.
            if let Err(e) = teardown(&spec.dir) {
                tracing::warn!(node = %spec.name, error = %e, "tearing down a failed start");
            }
        })
    }

    fn bring_up(spec: &NodeSpec) -> Result<NodeHost, Error> {
        let netns = netns_name(&spec.dir, &spec.name);
        let record = Record {
            name: spec.name.clone(),
            netns: netns.clone(),
            containerd_pid: None,
            cgroup_root: format!("/kumo/{netns}"),
        };
        let ctrd = spec.dir.join("containerd");
        std::fs::create_dir_all(&ctrd).map_err(io_err(format!("creating {}", ctrd.display())))?;
        let mut host = NodeHost {
            dir: spec.dir.clone(),
            record,
        };
        host.save()?;
        run(Command::new("ip").args(["netns", "add", &netns]))?;
        run(Command::new("ip").args(["-n", &netns, "link", "set", "lo", "up"]))?;
        std::fs::write(ctrd.join("config.toml"), containerd_config(&ctrd))
            .map_err(io_err("writing containerd's configuration"))?;
        std::fs::write(ctrd.join("cni-template.json"), cni_template(&ctrd))
            .map_err(io_err("writing the CNI template"))?;
        // crictl's configuration, as /etc/crictl.yaml on a real node.
        let endpoint = format!("unix://{}", host.socket().display());
        std::fs::write(
            spec.dir.join("crictl.yaml"),
            format!("runtime-endpoint: {endpoint}\nimage-endpoint: {endpoint}\ntimeout: 10\n"),
        )
        .map_err(io_err("writing crictl.yaml"))?;
        let log = std::fs::File::create(ctrd.join("containerd.log"))
            .map_err(io_err("creating containerd's log"))?;
        let err = log
            .try_clone()
            .map_err(io_err("opening containerd's log"))?;
        // nsenter enters only the network namespace: `ip netns exec` would also remount
        // /sys, hiding the cgroup hierarchies from containerd.
        let child = Command::new("nsenter")
            .arg(format!("--net={}", host.netns_path().display()))
            .arg("containerd")
            .arg("--config")
            .arg(ctrd.join("config.toml"))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(io_err("starting containerd"))?;
        host.record.containerd_pid = Some(child.id());
        host.save()?;
        // The child is reaped by whoever waits; containerd outlives this handle.
        std::thread::spawn(move || {
            let mut child = child;
            let _ = child.wait();
        });
        let socket = host.socket();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !socket.exists() || !version_answers(&socket) {
            if Instant::now() > deadline {
                let log = ctrd.join("containerd.log");
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                return Err(Error::NotUp {
                    node: spec.name.clone(),
                    secs: 20,
                    log: log.display().to_string(),
                    tail: lines[lines.len().saturating_sub(10)..].join("\n"),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        for image in &spec.images {
            host.import(image)?;
        }
        tracing::info!(node = %spec.name, netns = %host.record.netns, "containerd is up");
        Ok(host)
    }

    fn save(&self) -> Result<(), Error> {
        let text = serde_json::to_string_pretty(&self.record).unwrap_or_default();
        std::fs::write(self.dir.join("node.json"), text).map_err(io_err("writing node.json"))
    }

    /// containerd's socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.join("containerd").join("containerd.sock")
    }

    /// The node's network namespace.
    pub fn netns_path(&self) -> PathBuf {
        Path::new("/run/netns").join(&self.record.netns)
    }

    /// The node's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// What is recorded of it.
    pub fn record(&self) -> &Record {
        &self.record
    }

    /// Imports an image archive (OCI layout or docker save) into the node's runtime, in
    /// the CRI's namespace where the kubelet's pods find it.
    pub fn import(&self, archive: &Path) -> Result<(), Error> {
        import(&self.socket(), archive)
    }
}

/// Imports `archive` into the containerd at `socket`.
pub fn import(socket: &Path, archive: &Path) -> Result<(), Error> {
    run(Command::new("ctr")
        .arg("--address")
        .arg(socket)
        .args(["--namespace", "k8s.io", "images", "import", "--no-unpack"])
        .arg(archive))?;
    Ok(())
}

/// Whether containerd answers on `socket` (its `version`).
fn version_answers(socket: &Path) -> bool {
    Command::new("ctr")
        .arg("--address")
        .arg(socket)
        .arg("version")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The CNI configuration containerd writes when the kubelet hands it the node's pod range
/// (UpdateRuntimeConfig): a bridge in the node's namespace with host-local addresses from
/// the range, host ports by portmap.
fn cni_template(dir: &Path) -> String {
    CNI_TEMPLATE.replace("@IPAM_DIR@", &dir.join("ipam").display().to_string())
}

const CNI_TEMPLATE: &str = r#"{
  "cniVersion": "0.4.0",
  "name": "kumo",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "@IPAM_DIR@",
        "ranges": [{{range $i, $range := .PodCIDRRanges}}{{if $i}}, {{end}}[{"subnet": "{{$range}}"}]{{end}}],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
"#;

/// The port of the node's registry mirror on its own loopback (the registry's usual one).
pub const REGISTRY_MIRROR_PORT: u16 = 5000;

/// The registry hosts whose pulls go to the node's mirror first (then to the host itself,
/// as containerd does after its mirrors); `*` is every other host.
const MIRRORED: [&str; 8] = [
    "docker.io",
    "registry.k8s.io",
    "k8s.gcr.io",
    "gcr.io",
    "quay.io",
    "ghcr.io",
    "kumo.dev",
    "*",
];

/// containerd's configuration for a node whose files are under `dir`. The settings
/// this machine needs: no OOM score below what the bounding set allows, no AppArmor,
/// cgroupfs, the sandboxes' network namespaces under the state directory, the sandbox
/// image already imported; and the node's registry mirror (kind's local registry: kumo
/// serves the images it has there, so a pull of one of them needs no internet).
fn containerd_config(dir: &Path) -> String {
    let d = dir.display();
    let mut mirrors = String::new();
    for host in MIRRORED {
        mirrors.push_str(&format!(
            "    [plugins.\"io.containerd.grpc.v1.cri\".registry.mirrors.\"{host}\"]\n      endpoint = [\"http://127.0.0.1:{REGISTRY_MIRROR_PORT}\"]\n"
        ));
    }
    format!(
        r#"version = 2
root = "{d}/root"
state = "{d}/state"

[grpc]
  address = "{d}/containerd.sock"

[ttrpc]
  address = "{d}/containerd.sock.ttrpc"

[plugins."io.containerd.grpc.v1.cri"]
  disable_apparmor = true
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  tolerate_missing_hugetlb_controller = true
  sandbox_image = "{PAUSE_IMAGE}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{d}/cni"
    conf_template = "{d}/cni-template.json"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".registry]
{mirrors}"#
    )
}

/// The record of the machine whose directory is `dir`, if one runs there.
pub fn read_record(dir: &Path) -> Option<Record> {
    let text = std::fs::read_to_string(dir.join("node.json")).ok()?;
    serde_json::from_str(&text).ok()
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// The processes in network namespace `netns` (what `ip netns pids` lists).
fn pids_in(netns: &str) -> Vec<u32> {
    run(Command::new("ip").args(["netns", "pids", netns]))
        .map(|out| out.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

fn kill(pid: u32, signal: nix::sys::signal::Signal) {
    if let Ok(p) = i32::try_from(pid) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), signal);
    }
}

/// Whether `pid` runs containerd with the configuration under `dir` (a recorded pid may
/// have been reused by another process since).
fn is_our_containerd(pid: u32, dir: &Path) -> bool {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let text = String::from_utf8_lossy(&cmdline);
    let config = dir.join("containerd").join("config.toml");
    text.contains("containerd") && text.contains(&*config.to_string_lossy())
}

/// The mount points under `dir`, deepest first.
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut found: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(p.replace("\\040", " ")))
        .filter(|p| p.starts_with(dir))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found.dedup();
    found
}

/// The loop devices mounted somewhere under `dir` (mountinfo's source after the ` - `).
fn loop_devices_under(dir: &Path) -> Vec<String> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut found: Vec<String> = text
        .lines()
        .filter(|l| {
            l.split(' ')
                .nth(4)
                .is_some_and(|p| Path::new(&p.replace("\\040", " ")).starts_with(dir))
        })
        .filter_map(|l| l.split(" - ").nth(1)?.split(' ').nth(1).map(str::to_owned))
        .filter(|s| s.starts_with("/dev/loop"))
        .collect();
    found.sort();
    found.dedup();
    found
}

/// Stops what the node of directory `dir` runs: its pods (through the CRI, while
/// containerd answers, so each shim ends with its container), then containerd, then any
/// process left in its namespace; unmounts what is mounted under `dir`, removes the
/// namespace and the node's cgroups. Nothing to do when the node never ran.
pub fn teardown(dir: &Path) -> Result<(), Error> {
    let Some(record) = read_record(dir) else {
        return Ok(());
    };
    let socket = dir.join("containerd").join("containerd.sock");
    let ours = record
        .containerd_pid
        .filter(|&p| alive(p) && is_our_containerd(p, dir));
    if ours.is_some() && socket.exists() {
        remove_pods(&socket, dir);
    }
    if let Some(pid) = ours {
        kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while alive(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        if alive(pid) {
            kill(pid, nix::sys::signal::Signal::SIGKILL);
        }
    }
    let netns = Path::new("/run/netns").join(&record.netns);
    if netns.exists() {
        // Shims and containers that outlived containerd (a crash): everything in the
        // node's namespace is the node's.
        for pid in pids_in(&record.netns) {
            kill(pid, nix::sys::signal::Signal::SIGKILL);
        }
    }
    // The node's disks (the CSI driver's loop devices) are let go with their mounts.
    let loops = loop_devices_under(dir);
    for m in mounts_under(dir) {
        if let Err(e) = nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH) {
            tracing::warn!(mount = %m.display(), error = %e, "unmounting");
        }
    }
    for d in loops {
        // Freed now, or (still busy with a lazily detached mount) when its last user goes.
        if let Err(e) = run(Command::new("losetup").args(["-d", &d])) {
            tracing::warn!(device = %d, error = %e, "freeing a loop device");
        }
    }
    if netns.exists() {
        run(Command::new("ip").args(["netns", "delete", &record.netns]))?;
    }
    remove_cgroups(&record.cgroup_root);
    let _ = std::fs::remove_file(dir.join("node.json"));
    Ok(())
}

/// Stops and removes every pod sandbox through the CRI (the network torn down by the CNI,
/// each shim ending with its containers, their mounts gone).
fn remove_pods(socket: &Path, dir: &Path) {
    let options = kumo_cri_remote::Options {
        socket: socket.to_owned(),
        root_dir: dir.join("kubelet"),
        pod_logs_dir: dir.join("pods-logs"),
        netns: None,
    };
    match kumo_cri_remote::RemoteRuntime::connect(options) {
        Ok(rt) => {
            if let Err(e) = rt.remove_all() {
                tracing::warn!(error = %e, "removing the node's pods");
            }
        }
        Err(e) => tracing::warn!(error = %e, "reaching the node's containerd"),
    }
}

/// Removes the cgroups under `root` in every hierarchy, deepest first.
fn remove_cgroups(root: &str) {
    let rel = root.trim_matches('/');
    if rel.is_empty() {
        return;
    }
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return;
    };
    for h in hierarchies.flatten() {
        remove_tree(&h.path().join(rel));
        // The shared /kumo parent goes when no node is left in it.
        if let Some(parent) = h.path().join(rel).parent() {
            let _ = std::fs::remove_dir(parent);
        }
    }
}

fn remove_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&e.path());
            }
        }
        let _ = std::fs::remove_dir(dir);
    }
}

/// Tears the node machine of its directory down when dropped, so that a test or a
/// benchmark that fails halfway leaves nothing behind.
pub struct TeardownGuard(pub PathBuf);

impl Drop for TeardownGuard {
    fn drop(&mut self) {
        if let Err(e) = teardown(&self.0) {
            tracing::warn!(node = %self.0.display(), error = %e, "tearing the node's machine down");
        }
    }
}

/// The network namespace of the node machine recorded in `dir`.
pub fn netns_of(dir: &Path) -> Option<PathBuf> {
    read_record(dir).map(|r| Path::new("/run/netns").join(r.netns))
}

/// The nodes recorded under `nodes_dir` (`<data-dir>/nodes`): their directories.
pub fn recorded(nodes_dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(nodes_dir) else {
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("node.json").is_file())
        .collect();
    dirs.sort();
    dirs
}

/// The command that runs `argv` on the node of directory `dir` as `ssh` to it would: in
/// its network namespace, with its containerd socket as the CRI endpoint (for `crictl`)
/// and containerd's address (for `ctr`).
pub fn exec_command(dir: &Path, argv: &[String]) -> Result<Command, Error> {
    let record = read_record(dir).ok_or_else(|| Error::Missing {
        what: format!("a running node in {}", dir.display()),
        hint: "start the cluster with kumo up --runtime containerd".into(),
    })?;
    let socket = dir.join("containerd").join("containerd.sock");
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--net=/run/netns/{}", record.netns))
        .arg("--")
        .args(argv)
        .env(
            "CONTAINER_RUNTIME_ENDPOINT",
            format!("unix://{}", socket.display()),
        )
        .env(
            "IMAGE_SERVICE_ENDPOINT",
            format!("unix://{}", socket.display()),
        )
        .env("CRI_CONFIG_FILE", dir.join("crictl.yaml"))
        .env("CONTAINERD_ADDRESS", &socket)
        .env("CONTAINERD_NAMESPACE", "k8s.io");
    Ok(cmd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_names_are_short_and_differ_per_directory() {
        let a = netns_name(Path::new("/tmp/a/nodes/n1"), "n1");
        let b = netns_name(Path::new("/tmp/b/nodes/n1"), "n1");
        assert_ne!(a, b);
        assert!(a.starts_with("kumo-") && a.ends_with("-n1"));
        let long = netns_name(Path::new("/x"), &"n".repeat(100));
        assert!(long.len() <= 5 + 8 + 1 + 24);
    }

    #[test]
    fn the_configuration_carries_the_settings_this_machine_needs() {
        let c = containerd_config(Path::new("/d/n1/containerd"));
        for s in [
            "restrict_oom_score_adj = true",
            "disable_apparmor = true",
            "SystemdCgroup = false",
            "netns_mounts_under_state_dir = true",
            "address = \"/d/n1/containerd/containerd.sock\"",
            "sandbox_image = \"registry.k8s.io/pause:3.10.2\"",
        ] {
            assert!(c.contains(s), "{s} missing from\n{c}");
        }
    }
}
