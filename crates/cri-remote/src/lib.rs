//! The kubelet's CRI v1 client (upstream's kuberuntime over cri-client): kumo-cri's
//! [`Runtime`] driven over gRPC against containerd, or any CRI v1 runtime, on its Unix
//! socket. It does the kubelet's side of what the CRI leaves to it: the pods' log
//! directories, the files of their volumes on the node's disk (ConfigMap, Secret, downward
//! API and projected volumes written under the pod's directory, emptyDirs made there), the
//! termination-message files, the `/etc/hosts` it manages, and the pods' cgroups when they
//! end. The pod network ([`network::NetnsNetwork`]) is the node's network namespace, where
//! the runtime's CNI plugins gave each sandbox its address.
//!
//! The kubelet's pod workers call the runtime synchronously; the gRPC calls run on a
//! small tokio runtime of the client's own and the caller waits for their answer (off its
//! async executor when it has several threads).

pub mod netns;
pub mod network;
mod streaming;
mod volumes;

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use k8s_cri::v1 as cri;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use kumo_cri::{
    ContainerConfig, ContainerStats, ContainerStatus, ExecStep, NodeRuntime, Runtime, RuntimeError,
    RuntimeFactory, SandboxConfig, State, Stream,
};
use tonic::transport::{Channel, Endpoint, Uri};

/// What goes wrong connecting to a runtime.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("starting the CRI client's runtime: {0}")]
    Io(#[from] std::io::Error),
    #[error("connecting to the container runtime at {endpoint}: {reason}")]
    Connect { endpoint: String, reason: String },
    #[error("the container runtime at {endpoint} does not speak CRI v1: {reason}")]
    Version { endpoint: String, reason: String },
}

/// Where the node keeps what the kubelet manages beside the runtime.
#[derive(Clone, Debug)]
pub struct Options {
    /// The runtime's socket (`--container-runtime-endpoint`, without `unix://`).
    pub socket: PathBuf,
    /// The kubelet's root directory (`--root-dir`): `pods/<uid>/` holds each pod's volumes.
    pub root_dir: PathBuf,
    /// Where the pods' logs go (`/var/log/pods` upstream).
    pub pod_logs_dir: PathBuf,
    /// The network namespace the runtime puts its pods' networks in (where the node's
    /// probes, hooks and port-forwards dial from); `None`: this process's own.
    pub netns: Option<PathBuf>,
}

/// What the kubelet remembers of a sandbox it created: the CRI wants the sandbox's config
/// again with every container created in it.
struct Sandbox {
    config: cri::PodSandboxConfig,
    uid: String,
    cgroup_parent: String,
    ip: Option<IpAddr>,
}

/// What the kubelet remembers of a container it created.
#[derive(Clone)]
struct Created {
    /// The node-side file mounted at its terminationMessagePath.
    termination_file: PathBuf,
    fallback_to_logs_on_error: bool,
    uid: String,
    name: String,
    /// Its attempt (restart count when created).
    attempt: u32,
}

/// How many exited instances of one container of a pod are kept (upstream's
/// MaxPerPodContainer): the last one, for `kubectl logs --previous`.
const KEEP_EXITED: usize = 1;

/// A CRI v1 runtime over gRPC.
pub struct RemoteRuntime {
    exec: Option<tokio::runtime::Runtime>,
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
    options: Options,
    name: String,
    version: String,
    sandboxes: Mutex<HashMap<String, Sandbox>>,
    containers: Mutex<HashMap<String, Created>>,
}

impl Drop for RemoteRuntime {
    fn drop(&mut self) {
        // Dropping a runtime blocks; the client may be dropped on an async executor.
        if let Some(rt) = self.exec.take() {
            rt.shutdown_background();
        }
    }
}

/// A gRPC status as Go's grpc prints it (`rpc error: code = NotFound desc = ...`), which
/// is what upstream's events and container statuses show.
fn rpc(status: tonic::Status) -> RuntimeError {
    let code = match status.code() {
        tonic::Code::Ok => "OK",
        tonic::Code::Cancelled => "Canceled",
        tonic::Code::Unknown => "Unknown",
        tonic::Code::InvalidArgument => "InvalidArgument",
        tonic::Code::DeadlineExceeded => "DeadlineExceeded",
        tonic::Code::NotFound => "NotFound",
        tonic::Code::AlreadyExists => "AlreadyExists",
        tonic::Code::PermissionDenied => "PermissionDenied",
        tonic::Code::ResourceExhausted => "ResourceExhausted",
        tonic::Code::FailedPrecondition => "FailedPrecondition",
        tonic::Code::Aborted => "Aborted",
        tonic::Code::OutOfRange => "OutOfRange",
        tonic::Code::Unimplemented => "Unimplemented",
        tonic::Code::Internal => "Internal",
        tonic::Code::Unavailable => "Unavailable",
        tonic::Code::DataLoss => "DataLoss",
        tonic::Code::Unauthenticated => "Unauthenticated",
    };
    RuntimeError::Rpc {
        code: code.into(),
        message: status.message().to_owned(),
    }
}

fn nanos(t: i64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_nanos(t.max(0) as u64)
}

/// The CRI's CPU shares for a request in millicores (upstream's MilliCPUToShares: 1024
/// per core, at least 2).
pub fn cpu_shares(millis: Option<u64>) -> i64 {
    match millis {
        Some(m) if m > 0 => ((m * 1024) / 1000).max(2) as i64,
        _ => 2,
    }
}

/// The CFS quota for a limit in millicores over a period of 100 ms (upstream's
/// MilliCPUToQuota: at least 1 ms).
pub fn cpu_quota(millis: u64) -> (i64, i64) {
    const PERIOD: u64 = 100_000;
    ((millis * PERIOD / 1000).max(1000) as i64, PERIOD as i64)
}

impl RemoteRuntime {
    /// Connects to the runtime at `options.socket` and checks that it serves CRI v1 (the
    /// kubelet's version handshake).
    pub fn connect(options: Options) -> Result<RemoteRuntime, Error> {
        let exec = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("cri-client")
            .enable_all()
            .build()?;
        let socket = options.socket.clone();
        let endpoint = format!("unix://{}", socket.display());
        let channel = {
            let _guard = exec.enter();
            Endpoint::from_static("http://cri.invalid")
                .connect_timeout(Duration::from_secs(5))
                .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
                    let socket = socket.clone();
                    async move {
                        Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                            tokio::net::UnixStream::connect(socket).await?,
                        ))
                    }
                }))
        };
        let client = RuntimeServiceClient::new(channel.clone());
        // On a thread of its own: the caller may be on an async executor, where blocking
        // on another runtime is refused.
        let mut asking = client.clone();
        let answer = std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    exec.block_on(async {
                        tokio::time::timeout(
                            Duration::from_secs(10),
                            asking.version(cri::VersionRequest {
                                version: "v1".into(),
                            }),
                        )
                        .await
                    })
                })
                .join()
        })
        .map_err(|_| Error::Connect {
            endpoint: endpoint.clone(),
            reason: "the version handshake's thread panicked".into(),
        })?;
        let version = answer
            .map_err(|_| Error::Connect {
                endpoint: endpoint.clone(),
                reason: "no answer within 10s".into(),
            })?
            .map_err(|e| match e.code() {
                tonic::Code::Unimplemented => Error::Version {
                    endpoint: endpoint.clone(),
                    reason: e.message().to_owned(),
                },
                _ => Error::Connect {
                    endpoint: endpoint.clone(),
                    reason: e.to_string(),
                },
            })?
            .into_inner();
        if version.runtime_api_version != "v1" {
            return Err(Error::Version {
                endpoint,
                reason: format!("it serves {}", version.runtime_api_version),
            });
        }
        Ok(RemoteRuntime {
            exec: Some(exec),
            runtime: client,
            images: ImageServiceClient::new(channel),
            options,
            name: version.runtime_name,
            version: version.runtime_version,
            sandboxes: Mutex::default(),
            containers: Mutex::default(),
        })
    }

    /// The options it was made with.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// Runs `f` on the client's runtime and waits for it (`None`: the client is shutting
    /// down). On a multi-threaded executor the waiting thread is handed back to it
    /// meanwhile.
    pub(crate) fn run<T: Send + 'static>(
        &self,
        f: impl Future<Output = T> + Send + 'static,
    ) -> Option<T> {
        let exec = self.exec.as_ref()?;
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        exec.spawn(async move {
            let _ = tx.send(f.await);
        });
        let wait = move || rx.recv().ok();
        match tokio::runtime::Handle::try_current() {
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(wait)
            }
            _ => wait(),
        }
    }

    /// [`Self::run`] for a call that may fail.
    fn block<T: Send + 'static>(
        &self,
        f: impl Future<Output = Result<T, RuntimeError>> + Send + 'static,
    ) -> Result<T, RuntimeError> {
        self.run(f)
            .unwrap_or_else(|| Err(RuntimeError::Exec("the CRI client is shutting down".into())))
    }

    /// Spawns `f` on the client's runtime without waiting.
    fn spawn(&self, f: impl Future<Output = ()> + Send + 'static) {
        if let Some(exec) = &self.exec {
            exec.spawn(f);
        }
    }

    fn rt(&self) -> RuntimeServiceClient<Channel> {
        self.runtime.clone()
    }

    /// The pod's directory under the kubelet's root.
    fn pod_dir(&self, uid: &str) -> PathBuf {
        self.options.root_dir.join("pods").join(uid)
    }

    /// Hands the node's pod range to the runtime (the CRI's UpdateRuntimeConfig), which
    /// writes its CNI configuration from it.
    pub fn update_pod_cidr(&self, cidr: &str) -> Result<(), RuntimeError> {
        let mut rt = self.rt();
        let req = cri::UpdateRuntimeConfigRequest {
            runtime_config: Some(cri::RuntimeConfig {
                network_config: Some(cri::NetworkConfig {
                    pod_cidr: cidr.to_owned(),
                }),
            }),
        };
        self.block(async move { rt.update_runtime_config(req).await.map(|_| ()).map_err(rpc) })
    }

    /// The sandboxes and containers the runtime has (for cleaning a node up, and for what
    /// the image garbage collection must keep).
    pub fn list(&self) -> Result<(Vec<cri::PodSandbox>, Vec<cri::Container>), RuntimeError> {
        let mut rt = self.rt();
        self.block(async move {
            let pods = rt
                .list_pod_sandbox(cri::ListPodSandboxRequest::default())
                .await
                .map_err(rpc)?
                .into_inner()
                .items;
            let containers = rt
                .list_containers(cri::ListContainersRequest::default())
                .await
                .map_err(rpc)?
                .into_inner()
                .containers;
            Ok((pods, containers))
        })
    }

    /// Stops and removes every sandbox the runtime has (what a node that goes away does
    /// with its pods), so no container, shim, mount or network namespace is left.
    pub fn remove_all(&self) -> Result<(), RuntimeError> {
        let (pods, _) = self.list()?;
        for p in pods {
            self.remove_pod_sandbox(&p.id);
        }
        Ok(())
    }

    fn status_raw(&self, id: &str) -> Result<cri::ContainerStatus, RuntimeError> {
        let mut rt = self.rt();
        let req = cri::ContainerStatusRequest {
            container_id: id.to_owned(),
            verbose: false,
        };
        let id = id.to_owned();
        self.block(async move {
            match rt.container_status(req).await {
                Ok(r) => r.into_inner().status.ok_or(RuntimeError::NotFound(id)),
                Err(e) if e.code() == tonic::Code::NotFound => Err(RuntimeError::NotFound(id)),
                Err(e) => Err(rpc(e)),
            }
        })
    }

    /// The termination message of an exited container: its file, or with
    /// FallbackToLogsOnError and a failure, the end of its log (upstream: 2048 bytes, 80
    /// lines).
    fn termination_message(&self, id: &str, exit_code: i32, log_path: &str) -> Option<String> {
        let created = self.lock_containers().get(id).cloned()?;
        let mut text = std::fs::read(&created.termination_file)
            .map(|b| String::from_utf8_lossy(&b[..b.len().min(4096)]).into_owned())
            .unwrap_or_default();
        if text.is_empty() && created.fallback_to_logs_on_error && exit_code != 0 {
            let log = std::fs::read_to_string(log_path).unwrap_or_default();
            let lines: Vec<&str> = log
                .lines()
                .filter_map(|l| l.splitn(4, ' ').nth(3))
                .collect();
            let tail = lines[lines.len().saturating_sub(80)..].join("\n");
            let start = tail.len().saturating_sub(2048);
            let start = (start..=tail.len())
                .find(|&i| tail.is_char_boundary(i))
                .unwrap_or(tail.len());
            text = tail[start..].to_owned();
        }
        (!text.is_empty()).then_some(text)
    }

    fn lock_containers(&self) -> std::sync::MutexGuard<'_, HashMap<String, Created>> {
        self.containers.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_sandboxes(&self) -> std::sync::MutexGuard<'_, HashMap<String, Sandbox>> {
        self.sandboxes.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn stop_request(id: &str, grace: Duration) -> cri::StopContainerRequest {
        cri::StopContainerRequest {
            container_id: id.to_owned(),
            timeout: grace.as_secs() as i64,
        }
    }
}

impl Runtime for RemoteRuntime {
    fn version(&self) -> (String, String) {
        (self.name.clone(), self.version.clone())
    }

    fn not_ready(&self) -> Option<String> {
        let mut rt = self.rt();
        let status = self
            .run(async move {
                rt.status(cri::StatusRequest { verbose: false })
                    .await
                    .ok()
                    .and_then(|r| r.into_inner().status)
            })
            .flatten();
        let Some(status) = status else {
            return Some("container runtime status check may not have completed yet".into());
        };
        // As the kubelet words it: the runtime first, then its network.
        for (kind, what) in [
            ("RuntimeReady", "runtime"),
            ("NetworkReady", "runtime network"),
        ] {
            match status.conditions.iter().find(|c| c.r#type == kind) {
                Some(c) if c.status => {}
                Some(c) => {
                    return Some(format!(
                        "container {what} not ready: {}={} reason:{} message:{}",
                        c.r#type, c.status, c.reason, c.message
                    ))
                }
                None => return Some(format!("container {what} not ready: no {kind} condition")),
            }
        }
        None
    }

    fn image_status(&self, image: &str) -> Option<String> {
        self.image(image).map(|i| i.id)
    }

    fn image_size(&self, image: &str) -> Option<u64> {
        self.image(image).map(|i| i.size)
    }

    fn pull_image(
        &self,
        image: &str,
        auth: Option<&kumo_cri::PullAuth>,
        _annotations: &BTreeMap<String, String>,
        _container: &str,
    ) -> Result<String, RuntimeError> {
        let mut images = self.images.clone();
        let req = cri::PullImageRequest {
            image: Some(cri::ImageSpec {
                image: image.to_owned(),
                ..Default::default()
            }),
            auth: auth.map(|a| cri::AuthConfig {
                username: a.username.clone(),
                password: a.password.clone(),
                auth: a.auth.clone(),
                server_address: a.server_address.clone(),
                ..Default::default()
            }),
            sandbox_config: None,
        };
        self.block(async move {
            images
                .pull_image(req)
                .await
                .map(|r| r.into_inner().image_ref)
                .map_err(rpc)
        })
    }

    fn run_pod_sandbox(&self, config: &SandboxConfig) -> Result<String, RuntimeError> {
        let log_directory = self.options.pod_logs_dir.join(format!(
            "{}_{}_{}",
            config.namespace, config.name, config.uid
        ));
        std::fs::create_dir_all(&log_directory).map_err(|e| {
            RuntimeError::Exec(format!("creating {}: {e}", log_directory.display()))
        })?;
        let mode = |host: bool| {
            if host {
                cri::NamespaceMode::Node as i32
            } else {
                cri::NamespaceMode::Pod as i32
            }
        };
        let cfg = cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: config.name.clone(),
                uid: config.uid.clone(),
                namespace: config.namespace.clone(),
                attempt: config.attempt,
            }),
            hostname: config.hostname.clone(),
            log_directory: log_directory.display().to_string(),
            dns_config: config.dns.as_ref().map(|d| cri::DnsConfig {
                servers: d.servers.clone(),
                searches: d.searches.clone(),
                options: d.options.clone(),
            }),
            port_mappings: config
                .port_mappings
                .iter()
                .map(|p| cri::PortMapping {
                    protocol: match p.protocol.as_str() {
                        "UDP" => cri::Protocol::Udp as i32,
                        "SCTP" => cri::Protocol::Sctp as i32,
                        _ => cri::Protocol::Tcp as i32,
                    },
                    container_port: p.container_port.into(),
                    host_port: p.host_port.into(),
                    host_ip: p.host_ip.clone(),
                })
                .collect(),
            labels: config.labels.clone().into_iter().collect(),
            annotations: config.annotations.clone().into_iter().collect(),
            linux: Some(cri::LinuxPodSandboxConfig {
                cgroup_parent: config.cgroup_parent.clone(),
                security_context: Some(cri::LinuxSandboxSecurityContext {
                    namespace_options: Some(cri::NamespaceOption {
                        network: mode(config.host_network),
                        pid: if config.host_pid {
                            cri::NamespaceMode::Node as i32
                        } else {
                            cri::NamespaceMode::Container as i32
                        },
                        ipc: mode(config.host_ipc),
                        ..Default::default()
                    }),
                    privileged: config.privileged,
                    ..Default::default()
                }),
                sysctls: config.sysctls.clone().into_iter().collect(),
                ..Default::default()
            }),
            windows: None,
        };
        let mut rt = self.rt();
        let req = cri::RunPodSandboxRequest {
            config: Some(cfg.clone()),
            runtime_handler: String::new(),
        };
        let uid = config.uid.clone();
        let (id, ip) = self.block(async move {
            let id = match rt.run_pod_sandbox(req).await {
                Ok(r) => r.into_inner().pod_sandbox_id,
                Err(e) => {
                    // A sandbox whose network failed stays in the runtime, not ready, and
                    // keeps its name: it goes, so that the next attempt can have the name
                    // (upstream's kubelet kills and removes it on its next sync).
                    remove_unready_sandboxes(&mut rt, &uid).await;
                    return Err(rpc(e));
                }
            };
            let status = rt
                .pod_sandbox_status(cri::PodSandboxStatusRequest {
                    pod_sandbox_id: id.clone(),
                    verbose: false,
                })
                .await
                .map_err(rpc)?
                .into_inner()
                .status;
            let ip = status
                .and_then(|s| s.network)
                .and_then(|n| n.ip.parse::<IpAddr>().ok());
            Ok::<_, RuntimeError>((id, ip))
        })?;
        tracing::debug!(pod = %config.name, sandbox = %id, ?ip, "sandbox created");
        self.lock_sandboxes().insert(
            id.clone(),
            Sandbox {
                config: cfg,
                uid: config.uid.clone(),
                cgroup_parent: config.cgroup_parent.clone(),
                ip,
            },
        );
        Ok(id)
    }

    fn slow_sandboxes(&self) -> bool {
        true
    }

    fn pod_sandbox_ip(&self, id: &str) -> Option<IpAddr> {
        self.lock_sandboxes().get(id).and_then(|s| s.ip)
    }

    fn remove_pod_sandbox(&self, sandbox: &str) {
        let mut rt = self.rt();
        let id = sandbox.to_owned();
        let removed = self.block(async move {
            rt.stop_pod_sandbox(cri::StopPodSandboxRequest {
                pod_sandbox_id: id.clone(),
            })
            .await
            .map_err(rpc)?;
            rt.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: id })
                .await
                .map_err(rpc)?;
            Ok(())
        });
        if let Err(e) = removed {
            tracing::warn!(sandbox, error = %e, "removing the pod's sandbox");
        }
        let gone = self.lock_sandboxes().remove(sandbox);
        self.lock_containers()
            .retain(|_, c| gone.as_ref().is_none_or(|s| s.uid != c.uid));
        if let Some(s) = gone {
            // The pod's cgroup (runc made it for the containers and leaves it) and its
            // directory go with it.
            volumes::remove_cgroup(&s.cgroup_parent);
            let dir = self.pod_dir(&s.uid);
            volumes::remove_pod_dir(&dir);
        }
    }

    fn create_container(
        &self,
        sandbox: &str,
        config: &ContainerConfig,
        image_ref: &str,
    ) -> Result<String, RuntimeError> {
        let (sandbox_config, uid) = {
            let sandboxes = self.lock_sandboxes();
            let s = sandboxes
                .get(sandbox)
                .ok_or_else(|| RuntimeError::NotFound(sandbox.to_owned()))?;
            (s.config.clone(), s.uid.clone())
        };
        let pod_dir = self.pod_dir(&uid);
        let prepared = volumes::prepare(&pod_dir, config).map_err(|e| {
            if e.kind() == std::io::ErrorKind::InvalidInput {
                RuntimeError::Config(format!(
                    "failed to prepare subPath for volumeMount of container {:?}: {e}",
                    config.name
                ))
            } else {
                RuntimeError::Exec(format!("preparing the volumes: {e}"))
            }
        })?;
        let mut labels: HashMap<String, String> = HashMap::new();
        if let Some(m) = &sandbox_config.metadata {
            labels.insert("io.kubernetes.pod.name".into(), m.name.clone());
            labels.insert("io.kubernetes.pod.namespace".into(), m.namespace.clone());
            labels.insert("io.kubernetes.pod.uid".into(), m.uid.clone());
        }
        labels.insert("io.kubernetes.container.name".into(), config.name.clone());
        let annotations: HashMap<String, String> = [
            (
                "io.kubernetes.container.restartCount".to_owned(),
                config.attempt.to_string(),
            ),
            (
                "io.kubernetes.container.terminationMessagePath".to_owned(),
                config.termination_message_path.clone(),
            ),
        ]
        .into_iter()
        .collect();
        let (quota, period) = match config.cpu_limit_millis {
            Some(m) => cpu_quota(m),
            None => (0, 0),
        };
        let cfg = cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: config.name.clone(),
                attempt: config.attempt,
            }),
            image: Some(cri::ImageSpec {
                image: if image_ref.is_empty() {
                    config.image.clone()
                } else {
                    image_ref.to_owned()
                },
                user_specified_image: config.image.clone(),
                ..Default::default()
            }),
            command: config.command.clone(),
            args: config.args.clone(),
            working_dir: config.working_dir.clone(),
            envs: config
                .env
                .iter()
                .map(|(k, v)| cri::KeyValue {
                    key: k.clone(),
                    value: v.clone(),
                })
                .collect(),
            mounts: prepared
                .mounts
                .iter()
                .map(|m| cri::Mount {
                    container_path: m.container_path.clone(),
                    host_path: m.host_path.display().to_string(),
                    readonly: m.read_only,
                    ..Default::default()
                })
                .collect(),
            labels,
            annotations,
            log_path: format!("{}/{}.log", config.name, config.attempt),
            stdin: config.stdin,
            stdin_once: config.stdin_once,
            tty: config.tty,
            linux: Some(cri::LinuxContainerConfig {
                resources: Some(cri::LinuxContainerResources {
                    cpu_period: period,
                    cpu_quota: quota,
                    cpu_shares: cpu_shares(config.cpu_request_millis),
                    memory_limit_in_bytes: config.memory_limit_bytes.unwrap_or(0) as i64,
                    ..Default::default()
                }),
                security_context: Some(cri::LinuxContainerSecurityContext {
                    capabilities: Some(cri::Capability {
                        add_capabilities: config.capabilities_add.clone(),
                        drop_capabilities: config.capabilities_drop.clone(),
                        ..Default::default()
                    }),
                    privileged: config.privileged,
                    run_as_user: config.user.map(|(u, _)| cri::Int64Value { value: u }),
                    run_as_group: config
                        .user
                        .and_then(|(_, g)| g)
                        .map(|g| cri::Int64Value { value: g }),
                    readonly_rootfs: config.read_only_root_filesystem,
                    supplemental_groups: config
                        .fs_group
                        .into_iter()
                        .chain(config.supplemental_groups.iter().copied())
                        .collect(),
                    no_new_privs: config.no_new_privs,
                    namespace_options: sandbox_config
                        .linux
                        .as_ref()
                        .and_then(|l| l.security_context.as_ref())
                        .and_then(|s| s.namespace_options.clone()),
                    ..Default::default()
                }),
            }),
            ..Default::default()
        };
        let mut rt = self.rt();
        let req = cri::CreateContainerRequest {
            pod_sandbox_id: sandbox.to_owned(),
            config: Some(cfg),
            sandbox_config: Some(sandbox_config),
        };
        let id = self.block(async move {
            rt.create_container(req)
                .await
                .map(|r| r.into_inner().container_id)
                .map_err(rpc)
        })?;
        self.lock_containers().insert(
            id.clone(),
            Created {
                termination_file: prepared.termination_file,
                fallback_to_logs_on_error: config.fallback_to_logs_on_error,
                uid: uid.clone(),
                name: config.name.clone(),
                attempt: config.attempt,
            },
        );
        self.collect_garbage(&uid, &config.name, &id);
        Ok(id)
    }

    fn start_container(&self, id: &str) -> Result<(), RuntimeError> {
        let mut rt = self.rt();
        let req = cri::StartContainerRequest {
            container_id: id.to_owned(),
        };
        self.block(async move { rt.start_container(req).await.map(|_| ()).map_err(rpc) })
    }

    fn stop_container(&self, id: &str, grace: Duration) -> Result<(), RuntimeError> {
        // StopContainer returns once the container stopped, up to the grace period; the
        // kubelet goes on meanwhile and reads the state on its next passes.
        let mut rt = self.rt();
        let req = Self::stop_request(id, grace);
        let id = id.to_owned();
        self.spawn(async move {
            if let Err(e) = rt.stop_container(req).await {
                tracing::debug!(container = %id, error = %e, "stopping the container");
            }
        });
        Ok(())
    }

    fn kill_container(&self, id: &str) -> Result<(), RuntimeError> {
        let mut rt = self.rt();
        let req = Self::stop_request(id, Duration::ZERO);
        self.block(async move { rt.stop_container(req).await.map(|_| ()).map_err(rpc) })
    }

    fn container_status(&self, id: &str) -> Result<ContainerStatus, RuntimeError> {
        let s = self.status_raw(id)?;
        let state = match cri::ContainerState::try_from(s.state) {
            Ok(cri::ContainerState::ContainerRunning) => State::Running {
                started_at: nanos(s.started_at),
            },
            Ok(cri::ContainerState::ContainerExited) => State::Exited {
                exit_code: s.exit_code,
                started_at: nanos(s.started_at),
                finished_at: nanos(s.finished_at),
            },
            Ok(cri::ContainerState::ContainerUnknown) if s.finished_at > 0 => State::Exited {
                exit_code: s.exit_code,
                started_at: nanos(s.started_at),
                finished_at: nanos(s.finished_at),
            },
            _ => State::Created,
        };
        let exited = matches!(state, State::Exited { .. });
        let name = s
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .or_else(|| self.lock_containers().get(id).map(|c| c.name.clone()))
            .unwrap_or_default();
        Ok(ContainerStatus {
            id: s.id.clone(),
            name,
            attempt: s.metadata.as_ref().map_or(0, |m| m.attempt),
            image: s
                .image
                .as_ref()
                .map(|i| i.image.clone())
                .unwrap_or_default(),
            image_ref: s.image_ref.clone(),
            state,
            message: if exited {
                self.termination_message(id, s.exit_code, &s.log_path)
            } else {
                None
            },
            reason: (exited && !s.reason.is_empty()).then(|| s.reason.clone()),
        })
    }

    fn container_stats(&self, id: &str) -> Option<ContainerStats> {
        let mut rt = self.rt();
        let req = cri::ContainerStatsRequest {
            container_id: id.to_owned(),
        };
        self.run(async move {
            let stats = rt.container_stats(req).await.ok()?.into_inner().stats?;
            let cpu = stats.cpu?;
            let memory = stats.memory?;
            Some(ContainerStats {
                timestamp: nanos(cpu.timestamp),
                cpu_usage_core_nano_seconds: cpu.usage_core_nano_seconds?.value,
                memory_working_set_bytes: memory.working_set_bytes.map_or(0, |v| v.value),
            })
        })
        .flatten()
    }

    fn update_container_resources(
        &self,
        id: &str,
        config: &ContainerConfig,
    ) -> Result<(), RuntimeError> {
        let (quota, period) = match config.cpu_limit_millis {
            Some(m) => cpu_quota(m),
            None => (0, 0),
        };
        let mut rt = self.rt();
        let req = cri::UpdateContainerResourcesRequest {
            container_id: id.to_owned(),
            linux: Some(cri::LinuxContainerResources {
                cpu_period: period,
                cpu_quota: quota,
                cpu_shares: cpu_shares(config.cpu_request_millis),
                memory_limit_in_bytes: config.memory_limit_bytes.unwrap_or(0) as i64,
                ..Default::default()
            }),
            ..Default::default()
        };
        self.block(async move {
            rt.update_container_resources(req)
                .await
                .map(|_| ())
                .map_err(rpc)
        })
    }

    fn read_logs(&self, id: &str) -> Result<String, RuntimeError> {
        let s = self.status_raw(id)?;
        match std::fs::read(&s.log_path) {
            Ok(b) => Ok(String::from_utf8_lossy(&b).into_owned()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
            Err(e) => Err(RuntimeError::Exec(format!("reading {}: {e}", s.log_path))),
        }
    }

    fn exec(
        &self,
        id: &str,
        cmd: &[String],
        stdin: Option<Vec<u8>>,
    ) -> Result<Vec<ExecStep>, RuntimeError> {
        if stdin.is_some_and(|s| !s.is_empty()) {
            return Err(RuntimeError::Exec(
                "exec with stdin is not supported on the containerd runtime yet".into(),
            ));
        }
        let r = self.exec_sync(id, cmd, Duration::ZERO)?;
        let mut steps = Vec::new();
        if !r.stdout.is_empty() {
            steps.push(ExecStep::Out(
                Stream::Stdout,
                String::from_utf8_lossy(&r.stdout).into_owned(),
            ));
        }
        if !r.stderr.is_empty() {
            steps.push(ExecStep::Out(
                Stream::Stderr,
                String::from_utf8_lossy(&r.stderr).into_owned(),
            ));
        }
        steps.push(ExecStep::Exit(r.exit_code));
        Ok(steps)
    }

    fn exec_reads_stdin(&self, _cmd: &[String]) -> bool {
        false
    }

    fn stream(
        &self,
        id: &str,
        cmd: Option<&[String]>,
        streams: kumo_cri::StreamRequest,
    ) -> Option<Result<kumo_cri::LiveStream, RuntimeError>> {
        let mut rt = self.rt();
        let netns = self.options.netns.clone();
        let id = id.to_owned();
        let cmd = cmd.map(<[String]>::to_vec);
        let live = self.block(async move {
            let url = match cmd {
                Some(cmd) => {
                    rt.exec(cri::ExecRequest {
                        container_id: id,
                        cmd,
                        tty: streams.tty,
                        stdin: streams.stdin,
                        stdout: streams.stdout,
                        // With a TTY the terminal carries both.
                        stderr: streams.stderr && !streams.tty,
                    })
                    .await
                    .map_err(rpc)?
                    .into_inner()
                    .url
                }
                None => {
                    rt.attach(cri::AttachRequest {
                        container_id: id,
                        stdin: streams.stdin,
                        tty: streams.tty,
                        stdout: streams.stdout,
                        stderr: streams.stderr && !streams.tty,
                    })
                    .await
                    .map_err(rpc)?
                    .into_inner()
                    .url
                }
            };
            streaming::connect(url, netns).await
        });
        Some(live.map(|mut l| {
            if !streams.stdin {
                l.stdin = None;
            }
            if !streams.tty {
                l.resize = None;
            }
            l
        }))
    }

    fn probe_exec(
        &self,
        id: &str,
        cmd: &[String],
        _at: SystemTime,
        timeout: Duration,
    ) -> Option<bool> {
        // A probe that cannot run (the container is gone) fails, as upstream's does.
        Some(
            self.exec_sync(id, cmd, timeout)
                .is_ok_and(|r| r.exit_code == 0),
        )
    }

    fn refresh_volumes(&self, id: &str, config: &ContainerConfig) {
        let Some(uid) = self.lock_containers().get(id).map(|c| c.uid.clone()) else {
            return;
        };
        if let Err(e) = volumes::refresh(&self.pod_dir(&uid), config) {
            tracing::warn!(container = %config.name, error = %e, "updating the volumes' files");
        }
    }
}

impl RemoteRuntime {
    /// The runtime's ImageStatus of `image`, when it has it.
    fn image(&self, image: &str) -> Option<cri::Image> {
        let mut images = self.images.clone();
        let req = cri::ImageStatusRequest {
            image: Some(cri::ImageSpec {
                image: image.to_owned(),
                ..Default::default()
            }),
            verbose: false,
        };
        self.run(async move { images.image_status(req).await.ok()?.into_inner().image })
            .flatten()
    }

    /// The kubelet's image garbage collection (upstream's image GC manager, with its
    /// thresholds as percentages of the image filesystem): when the images take more than
    /// `high` % of the node's `capacity` bytes (its ephemeral storage: nodes on one machine
    /// share its disk, so the runtime's own usage counts, not the disk's), images no
    /// container uses (the sandbox image aside) are removed, the largest first, until they
    /// take `low` % or less. Returns the images removed.
    pub fn collect_images(
        &self,
        high: u8,
        low: u8,
        capacity: u64,
    ) -> Result<Vec<String>, RuntimeError> {
        let mut images = self.images.clone();
        let (_, containers) = self.list()?;
        let (fs, listed) = self.block(async move {
            let fs = images
                .image_fs_info(cri::ImageFsInfoRequest {})
                .await
                .map_err(rpc)?
                .into_inner()
                .image_filesystems;
            let listed = images
                .list_images(cri::ListImagesRequest { filter: None })
                .await
                .map_err(rpc)?
                .into_inner()
                .images;
            Ok((fs, listed))
        })?;
        let capacity = capacity.max(1) as f64;
        // The runtime's figure for its image filesystem is refreshed every few seconds;
        // the images' own sizes count at once.
        let mut used = fs
            .iter()
            .filter_map(|f| f.used_bytes.as_ref())
            .map(|u| u.value as f64)
            .sum::<f64>()
            .max(listed.iter().map(|i| i.size as f64).sum());
        if used * 100.0 / capacity <= f64::from(high) {
            return Ok(Vec::new());
        }
        let in_use: std::collections::HashSet<&str> = containers
            .iter()
            .flat_map(|c| {
                [
                    c.image_ref.as_str(),
                    c.image.as_ref().map_or("", |i| i.image.as_str()),
                ]
            })
            .collect();
        let mut unused: Vec<&cri::Image> = listed
            .iter()
            .filter(|i| !i.pinned && !in_use.contains(i.id.as_str()))
            .filter(|i| !i.repo_tags.iter().any(|t| t.contains("/pause:")))
            .collect();
        unused.sort_by_key(|i| std::cmp::Reverse(i.size));
        let mut removed = Vec::new();
        for image in unused {
            if used * 100.0 / capacity <= f64::from(low) {
                break;
            }
            let mut images = self.images.clone();
            let req = cri::RemoveImageRequest {
                image: Some(cri::ImageSpec {
                    image: image.id.clone(),
                    ..Default::default()
                }),
            };
            self.block(async move { images.remove_image(req).await.map_err(rpc) })?;
            used -= image.size as f64;
            removed.push(
                image
                    .repo_tags
                    .first()
                    .cloned()
                    .unwrap_or_else(|| image.id.clone()),
            );
        }
        if !removed.is_empty() {
            tracing::info!(images = ?removed, "image garbage collection");
        }
        Ok(removed)
    }

    /// Removes the exited instances of container `name` of pod `uid` beyond the last
    /// [`KEEP_EXITED`] (the kubelet's container garbage collection); `current` stays.
    fn collect_garbage(&self, uid: &str, name: &str, current: &str) {
        let mut older: Vec<(u32, String)> = self
            .lock_containers()
            .iter()
            .filter(|(id, c)| c.uid == uid && c.name == name && id.as_str() != current)
            .map(|(id, c)| (c.attempt, id.clone()))
            .collect();
        older.sort();
        let excess = older.len().saturating_sub(KEEP_EXITED);
        for (_, id) in older.into_iter().take(excess) {
            let mut rt = self.rt();
            let req = cri::RemoveContainerRequest {
                container_id: id.clone(),
            };
            match self.block(async move { rt.remove_container(req).await.map_err(rpc) }) {
                Ok(_) => {
                    self.lock_containers().remove(&id);
                }
                Err(e) => tracing::debug!(container = %id, error = %e, "removing a dead container"),
            }
        }
    }

    /// The CRI's ExecSync: runs `cmd` in container `id` to its end (or `timeout`, when
    /// not zero).
    pub fn exec_sync(
        &self,
        id: &str,
        cmd: &[String],
        timeout: Duration,
    ) -> Result<cri::ExecSyncResponse, RuntimeError> {
        let mut rt = self.rt();
        let req = cri::ExecSyncRequest {
            container_id: id.to_owned(),
            cmd: cmd.to_vec(),
            timeout: timeout.as_secs() as i64,
        };
        self.block(async move { rt.exec_sync(req).await.map(|r| r.into_inner()).map_err(rpc) })
    }
}

/// The ephemeral storage a node reports (its image filesystem's size for image GC).
pub const NODE_EPHEMERAL_STORAGE: u64 = 100 << 30;

/// A node on the runtime at `options.socket`: its CRI client and the pod network of its
/// namespace (the same client for every kubelet start).
pub fn factory(runtime: Arc<RemoteRuntime>) -> RuntimeFactory {
    // Image garbage collection every 5 minutes (upstream's ImageGCPeriod) at 85 % / 80 %
    // (imageGCHighThresholdPercent, imageGCLowThresholdPercent), for as long as the client
    // lives.
    let weak = Arc::downgrade(&runtime);
    let _ = std::thread::Builder::new()
        .name("image-gc".into())
        .spawn(move || loop {
            std::thread::sleep(Duration::from_secs(300));
            let Some(rt) = weak.upgrade() else { return };
            if let Err(e) = rt.collect_images(85, 80, NODE_EPHEMERAL_STORAGE) {
                tracing::warn!(error = %e, "image garbage collection");
            }
        });
    RuntimeFactory(Arc::new(move || {
        let network = Arc::new(network::NetnsNetwork::new(runtime.clone()));
        NodeRuntime {
            runtime: runtime.clone(),
            network,
        }
    }))
}

/// `unix:///path` (upstream's `--container-runtime-endpoint`) or a bare path: the socket.
pub fn socket_of(endpoint: &str) -> &Path {
    Path::new(endpoint.strip_prefix("unix://").unwrap_or(endpoint))
}

/// Stops and removes pod `uid`'s sandboxes that are not ready.
async fn remove_unready_sandboxes(rt: &mut RuntimeServiceClient<Channel>, uid: &str) {
    let filter = cri::PodSandboxFilter {
        label_selector: [("io.kubernetes.pod.uid".to_owned(), uid.to_owned())].into(),
        ..Default::default()
    };
    let Ok(list) = rt
        .list_pod_sandbox(cri::ListPodSandboxRequest {
            filter: Some(filter),
        })
        .await
    else {
        return;
    };
    for sb in list.into_inner().items {
        if sb.state == cri::PodSandboxState::SandboxReady as i32 {
            continue;
        }
        let id = sb.id;
        let _ = rt
            .stop_pod_sandbox(cri::StopPodSandboxRequest {
                pod_sandbox_id: id.clone(),
            })
            .await;
        let _ = rt
            .remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: id })
            .await;
    }
}
