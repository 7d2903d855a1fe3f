//! The container runtime interface kumo's kubelet drives, shaped like the CRI
//! (k8s.io/cri-api): pod sandboxes, image pulls, containers with their status, stats,
//! logs and exec, and ([`network`]) the pod network it reaches pods through. The kubelet
//! knows only this; a runtime implements it: the simulator (kumo-sim), or any CRI v1
//! runtime over gRPC (kumo-cri-remote: containerd).

pub mod network;

pub use network::{DialError, PodNetwork};

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

/// What a container is to run.
#[derive(Clone, Debug, Default)]
pub struct ContainerConfig {
    pub name: String,
    pub image: String,
    /// The pod's annotations (the sim runtime's instructions).
    pub annotations: BTreeMap<String, String>,
    /// The container's command (the image's entrypoint when empty) and args (the
    /// image's cmd when both are empty), `$(VAR)` already expanded by the kubelet.
    pub command: Vec<String>,
    pub args: Vec<String>,
    /// The environment, in order.
    pub env: Vec<(String, String)>,
    /// The pod's host name and IP (what `/etc/hostname` and `/etc/hosts` say).
    pub hostname: String,
    pub pod_ip: String,
    /// How many times this container was started before (the CRI's attempt).
    pub attempt: u32,
    /// Where the container writes its termination message (`terminationMessagePath`).
    pub termination_message_path: String,
    /// `terminationMessagePolicy: FallbackToLogsOnError`.
    pub fallback_to_logs_on_error: bool,
    /// Its volume mounts (what its simulated files show).
    pub mounts: Vec<Mount>,
    /// Files the kubelet manages in the container (`/etc/hosts`): path → content.
    pub files: BTreeMap<String, String>,
    /// The user and group its processes run as (`runAsUser`/`runAsGroup`, the
    /// container's over the pod's); root when unset.
    pub user: Option<(i64, Option<i64>)>,
    /// The pod's `fsGroup`: the group its volumes' files belong to (and the container's
    /// processes are in).
    pub fs_group: Option<i64>,
    /// The pod's `supplementalGroups`.
    pub supplemental_groups: Vec<i64>,
    /// `securityContext.privileged`.
    pub privileged: bool,
    /// `securityContext.allowPrivilegeEscalation: false` (the no_new_privs bit).
    pub no_new_privs: bool,
    /// `resources.requests.cpu` in millicores (the cgroup's CPU weight).
    pub cpu_request_millis: Option<u64>,
    /// `resources.limits.cpu` in millicores (a cgroup's CPU quota caps its usage).
    pub cpu_limit_millis: Option<u64>,
    /// `resources.limits.memory` in bytes.
    pub memory_limit_bytes: Option<u64>,
    /// `workingDir` (the image's when empty).
    pub working_dir: String,
    /// `securityContext.readOnlyRootFilesystem`.
    pub read_only_root_filesystem: bool,
    /// `securityContext.capabilities`: added and dropped, as written (`NET_ADMIN`, `ALL`).
    pub capabilities_add: Vec<String>,
    pub capabilities_drop: Vec<String>,
    /// `stdin`, `stdinOnce` and `tty`.
    pub stdin: bool,
    pub stdin_once: bool,
    pub tty: bool,
}

/// A registry credential for a pull (the CRI's AuthConfig).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PullAuth {
    pub username: String,
    pub password: String,
    /// `base64(username:password)`, as docker config files keep it.
    pub auth: String,
    /// The registry it is for.
    pub server_address: String,
}

/// What a pod sandbox is made with (the CRI's PodSandboxConfig, as the kubelet fills it).
#[derive(Clone, Debug, Default)]
pub struct SandboxConfig {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub attempt: u32,
    /// The pod's host name; empty for a host-network pod (which keeps the node's).
    pub hostname: String,
    /// The resolver configuration (from the pod's dnsPolicy and dnsConfig); `None` for the
    /// node's own (host network with the default policy).
    pub dns: Option<DnsConfig>,
    /// The containers' `hostPort`s.
    pub port_mappings: Vec<PortMapping>,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub host_network: bool,
    pub host_pid: bool,
    pub host_ipc: bool,
    /// Some container of the pod is privileged (the runtime then lets the sandbox be).
    pub privileged: bool,
    /// `securityContext.sysctls`.
    pub sysctls: BTreeMap<String, String>,
    /// The pod's cgroup (`<cgroup root>/kubepods/<qos>/pod<uid>`).
    pub cgroup_parent: String,
}

/// A sandbox's resolver configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DnsConfig {
    pub servers: Vec<String>,
    pub searches: Vec<String>,
    pub options: Vec<String>,
}

impl DnsConfig {
    /// Reads a resolv.conf's `nameserver`, `search` and `options` lines.
    pub fn from_resolv_conf(text: &str) -> Self {
        let mut dns = DnsConfig::default();
        for line in text.lines() {
            let mut words = line.split_whitespace();
            match words.next() {
                Some("nameserver") => dns.servers.extend(words.map(str::to_owned)),
                Some("search") => dns.searches.extend(words.map(str::to_owned)),
                Some("options") => dns.options.extend(words.map(str::to_owned)),
                _ => {}
            }
        }
        dns
    }
}

/// A host port mapped to a container port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortMapping {
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: String,
    pub container_port: u16,
    pub host_port: u16,
    pub host_ip: String,
}

/// A running container's resource usage, as the CRI's ContainerStats gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContainerStats {
    /// When the figures were taken.
    pub timestamp: SystemTime,
    /// CPU time used since the container started, in nanoseconds of one core.
    pub cpu_usage_core_nano_seconds: u64,
    /// The memory working set, in bytes.
    pub memory_working_set_bytes: u64,
}

/// A container's state, as the CRI reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Created,
    Running {
        started_at: SystemTime,
    },
    Exited {
        exit_code: i32,
        started_at: SystemTime,
        finished_at: SystemTime,
    },
}

/// One container's status.
#[derive(Clone, Debug)]
pub struct ContainerStatus {
    pub id: String,
    pub name: String,
    pub attempt: u32,
    pub image: String,
    pub image_ref: String,
    pub state: State,
    /// Once exited: the termination message (from its file, or the end of its logs).
    pub message: Option<String>,
    /// Once exited: why, when the runtime knows (`OOMKilled`, `Completed`, `Error`).
    pub reason: Option<String>,
}

/// Errors a runtime reports.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("failed to pull and unpack image \"{image}\": {reason}")]
    Pull { image: String, reason: String },
    #[error("no such container {0}")]
    NotFound(String),
    #[error("container {0} is not running")]
    NotRunning(String),
    /// The command could not be started (runc's message).
    #[error("{0}")]
    Exec(String),
    /// The container's configuration cannot be made (a subPath that leaves its volume):
    /// upstream's CreateContainerConfigError.
    #[error("{0}")]
    Config(String),
    /// A call to a remote runtime failed: gRPC's status, as Go's grpc prints it.
    #[error("rpc error: code = {code} desc = {message}")]
    Rpc { code: String, message: String },
}

/// The CRI-shaped runtime interface (a subset: what the kubelet's pod workers use).
pub trait Runtime: Send + Sync {
    /// `(runtime name, runtime version)`, e.g. `("sim", "0.1.0")`.
    fn version(&self) -> (String, String);
    /// Why the runtime cannot run pods now (the CRI's Status: RuntimeReady or NetworkReady
    /// false), in upstream's words; `None`: ready.
    fn not_ready(&self) -> Option<String> {
        None
    }
    /// Pulls an image (with `auth`, a registry credential of the pod's imagePullSecrets);
    /// returns its digest reference.
    fn pull_image(
        &self,
        image: &str,
        auth: Option<&PullAuth>,
        annotations: &BTreeMap<String, String>,
        container: &str,
    ) -> Result<String, RuntimeError>;
    /// The reference of `image` when the runtime has it (the CRI's ImageStatus), so that an
    /// `IfNotPresent` image is not pulled again; `None`: not present, or the runtime keeps
    /// no images (the kubelet then pulls).
    fn image_status(&self, _image: &str) -> Option<String> {
        None
    }
    /// The size in bytes of image `image` on the node (ImageStatus's `size`), if known:
    /// what the kubelet's Pulled event reports.
    fn image_size(&self, _image: &str) -> Option<u64> {
        None
    }
    /// Creates a pod sandbox (with its network, where the runtime sets it up); returns its id.
    fn run_pod_sandbox(&self, config: &SandboxConfig) -> Result<String, RuntimeError>;
    /// Whether making a sandbox takes this runtime long (a network namespace, the CNI
    /// plugins, a shim: hundreds of milliseconds), so the kubelet makes new pods' sandboxes
    /// in the background, side by side, rather than one after another in its pass.
    fn slow_sandboxes(&self) -> bool {
        false
    }
    /// The address the runtime's network gave sandbox `id` (its PodSandboxStatus); `None`
    /// when the runtime leaves the pod network to the kubelet's [`PodNetwork`].
    fn pod_sandbox_ip(&self, _id: &str) -> Option<std::net::IpAddr> {
        None
    }
    /// Stops and removes a sandbox with every container in it.
    fn remove_pod_sandbox(&self, sandbox: &str);
    fn create_container(
        &self,
        sandbox: &str,
        config: &ContainerConfig,
        image_ref: &str,
    ) -> Result<String, RuntimeError>;
    fn start_container(&self, id: &str) -> Result<(), RuntimeError>;
    /// Stops a container: SIGTERM now, SIGKILL when `grace` has passed. Returns without
    /// waiting for the exit, which the container's state shows once it happened (a
    /// process may stop at once or run to the end of the grace period).
    fn stop_container(&self, id: &str, grace: Duration) -> Result<(), RuntimeError>;
    fn container_status(&self, id: &str) -> Result<ContainerStatus, RuntimeError>;
    /// A running container's resource usage (None: not running, or no figures).
    fn container_stats(&self, _id: &str) -> Option<ContainerStats> {
        None
    }
    /// Applies new CPU and memory requests and limits to a running container (the CRI's
    /// UpdateContainerResources, for an in-place resize); `config` carries them.
    fn update_container_resources(
        &self,
        _id: &str,
        _config: &ContainerConfig,
    ) -> Result<(), RuntimeError> {
        Ok(())
    }
    /// Only the state of a container: what a pass asks of every pod each second, so a
    /// runtime may answer it without building the whole status.
    fn container_state(&self, id: &str) -> Result<State, RuntimeError> {
        self.container_status(id).map(|s| s.state)
    }
    /// Until when the container's state stays as it is unless the kubelet acts on it (a
    /// simulated process knows when it exits). `None` when the runtime cannot tell: the
    /// kubelet then reads the state on every pass.
    fn steady_until(&self, _id: &str) -> Option<SystemTime> {
        None
    }
    /// Kills a container at once (SIGKILL: exit code 137), as after a failed liveness probe.
    fn kill_container(&self, id: &str) -> Result<(), RuntimeError>;
    /// Whether `path` exists in container `id`'s files now (what a file server in it
    /// answers); `None` when the runtime cannot tell.
    fn file_exists(&self, _id: &str, _path: &str) -> Option<bool> {
        None
    }
    /// The content of file `path` in container `id` now, when the runtime can read it
    /// (a simulated server loads its certificate this way).
    fn read_file(&self, _id: &str, _path: &str) -> Option<String> {
        None
    }
    /// Adds `text` to what running container `id` wrote to stdout, now (a simulated
    /// server logging the requests it serves).
    fn write_log(&self, _id: &str, _text: &str) {}
    /// The container's log file, in the CRI log format (what ReadLogs reads).
    fn read_logs(&self, id: &str) -> Result<String, RuntimeError>;
    /// Runs `cmd` in a running container (the CRI's Exec), with `stdin` when the command
    /// reads it; returns the process's steps for the caller to play out.
    fn exec(
        &self,
        id: &str,
        cmd: &[String],
        stdin: Option<Vec<u8>>,
    ) -> Result<Vec<ExecStep>, RuntimeError>;
    /// Whether `cmd` reads its stdin (so an exec collects it first).
    fn exec_reads_stdin(&self, cmd: &[String]) -> bool;
    /// Starts `cmd` in container `id` as a live process whose streams are carried while it
    /// runs (the CRI's Exec through the runtime's streaming server), or with `cmd` `None`
    /// attaches to the container's own process (Attach). `None`: the runtime has no live
    /// streams; the kubelet then plays [`Self::exec`]'s steps out.
    fn stream(
        &self,
        _id: &str,
        _cmd: Option<&[String]>,
        _streams: StreamRequest,
    ) -> Option<Result<LiveStream, RuntimeError>> {
        None
    }
    /// Whether an interactive exec of `cmd` has read all it will with `input` so far (a
    /// shell that came to `exit`), so the exec may run without its stdin being closed.
    fn exec_input_complete(&self, _cmd: &[String], _input: &[u8]) -> bool {
        false
    }
    /// Gives a running container the current content of its ConfigMap, Secret and
    /// downward API volumes (`config` is its config as the kubelet builds it now).
    fn refresh_volumes(&self, _id: &str, _config: &ContainerConfig) {}
    /// The result of exec probe `cmd` in container `id` as of `at`: `Some(passed)`, or
    /// `None` when the runtime cannot tell (the probe then counts as passing).
    fn probe_exec(
        &self,
        _id: &str,
        _cmd: &[String],
        _at: SystemTime,
        _timeout: Duration,
    ) -> Option<bool> {
        None
    }
    /// What a runtime that only simulates could not do of container `id` as asked (it
    /// has no model of the command), for the kubelet to tell the user; `None` from a
    /// runtime that runs what it is given.
    fn not_simulated(&self, _id: &str) -> Option<String> {
        None
    }
}

/// The `/etc/hosts` of a node that has no file of its own (what host-network pods, and
/// hostPath mounts of it, show).
pub const NODE_HOSTS: &str = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n";

/// One step of what an exec'd process did, for the caller to play out in time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExecStep {
    /// Writes to a stream.
    Out(Stream, String),
    Sleep(Duration),
    /// The process ends with this code.
    Exit(i32),
    /// The process runs until it is stopped.
    Forever,
}

/// Which streams a live exec or attach carries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamRequest {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

/// A live exec or attach: bytes in and out while the process runs, then how it ended.
pub struct LiveStream {
    /// Bytes for the process's stdin (when asked for); dropping it closes stdin.
    pub stdin: Option<tokio::sync::mpsc::Sender<Vec<u8>>>,
    /// The terminal's size as `(width, height)` (with a TTY).
    pub resize: Option<tokio::sync::mpsc::Sender<(u16, u16)>>,
    /// What the process writes, in order.
    pub output: tokio::sync::mpsc::Receiver<(Stream, Vec<u8>)>,
    /// How it ended: its exit code, or why the stream broke.
    pub exit: tokio::sync::oneshot::Receiver<Result<i32, String>>,
}

/// Where a line of output goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    /// The CRI log file's stream tag.
    pub fn tag(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// The files of a kubelet-written volume: relative path → (content, mode). Content is
/// bytes: a Secret's or a ConfigMap's binaryData need not be text.
pub type Files = BTreeMap<String, (Vec<u8>, u32)>;

/// What a volume mount shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// The pod's emptyDir volume of this name.
    EmptyDir(String),
    /// A directory of the node (hostPath).
    HostPath(String),
    /// Files the kubelet writes (ConfigMap, Secret, downward API, projected). Read-only.
    Files(Files),
    /// An image volume: the files of the image with this reference, read-only.
    Image(String),
    /// A persistent volume a storage driver published for the pod: at `path` on the node
    /// (where a runtime with a host file system bind-mounts it from); `id` names its data
    /// for a runtime without one (the simulator keeps a disk's files by it, shared by every
    /// node, as a disk moves between instances).
    Disk {
        /// The volume's id (its CSI volume handle).
        id: String,
        /// Where the driver published it on the node.
        path: String,
    },
}

/// One volume mount of a container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mount {
    /// Where it is mounted in the container.
    pub path: String,
    pub source: Source,
    pub read_only: bool,
    /// `subPath`: the part of the volume mounted (empty: all of it).
    pub sub_path: String,
    /// Memory-backed (an emptyDir with `medium: Memory`, projected files).
    pub tmpfs: bool,
}

/// A time as the CRI log format writes it (RFC 3339 with nanoseconds, UTC).
pub fn cri_time(t: SystemTime) -> String {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let base = k8s_openapi::jiff::Timestamp::from_second(secs)
        .map(|ts| ts.strftime("%Y-%m-%dT%H:%M:%S").to_string())
        .unwrap_or_default();
    format!("{base}.{:09}Z", d.subsec_nanos())
}

/// What one node runs on: its container runtime and its pod network.
#[derive(Clone)]
pub struct NodeRuntime {
    pub runtime: std::sync::Arc<dyn Runtime>,
    pub network: std::sync::Arc<dyn PodNetwork>,
}

/// Makes a node's [`NodeRuntime`], anew for each node (the nodes of a simulated fleet in
/// one process each get their own).
#[derive(Clone)]
pub struct RuntimeFactory(pub std::sync::Arc<dyn Fn() -> NodeRuntime + Send + Sync>);

impl RuntimeFactory {
    /// A node's runtime and network.
    pub fn make(&self) -> NodeRuntime {
        (self.0)()
    }
}

impl std::fmt::Debug for RuntimeFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RuntimeFactory")
    }
}
