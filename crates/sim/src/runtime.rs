//! The container runtime interface the kubelet drives, shaped like the CRI (sandboxes,
//! image pulls, containers and their status), and `sim`, a runtime whose containers only
//! behave as told: by default a container runs until it is stopped; pod annotations make
//! it exit, fail or fail to pull, so every path of the pod lifecycle can be exercised on one
//! machine without images.
//!
//! Annotations read by `sim` (per container `<c>`, or for all containers without the
//! `/<c>` suffix):
//! * `sim.kumo.io/exit-after-seconds[/<c>]`: the container exits after that many seconds;
//! * `sim.kumo.io/exit-code[/<c>]`: with that code (0 by default);
//! * `sim.kumo.io/pull[/<c>]: fail`: pulling the image fails (ErrImagePull);
//! * `sim.kumo.io/probe-fail[/<c>]: readiness,liveness,startup`: those probes fail (the
//!   kubelet reads this one: probes are the kubelet's);
//! * `sim.kumo.io/logs[/<c>]`: text the container writes to stdout when it starts;
//! * `sim.kumo.io/cpu[/<c>]`, `sim.kumo.io/memory[/<c>]`: the CPU (a quantity of cores,
//!   `250m`) and memory working set (`64Mi`) the container uses while it runs, instead of
//!   the model's (see [`Sim::container_stats`]).
//!
//! Without `exit-after-seconds`, what a container does comes from its command line
//! (command + args after the kubelet's `$(VAR)` expansion), run by [`shell`], a
//! simulated `sh` with busybox's common utilities: scripts print, sleep, write files
//! and exit as a real shell would; a command it does not know (an image's own
//! entrypoint) runs until stopped. Its files are [`fs`]'s: its own root filesystem, the
//! pod's emptyDir volumes (shared by its containers, kept across restarts), hostPath
//! directories of the node, and the ConfigMap, Secret and downward API files the
//! kubelet projects. Exec probes run the same way, as of the probe's time. Output is kept as
//! CRI log files are (`<RFC3339Nano> <stream> <F|P> <content>` per line), per container,
//! and the exited containers of a pod stay until its sandbox is removed (the previous
//! attempt's logs). `exec` runs a command line the same way.

pub mod fs;
pub mod images;
pub mod registry;
pub mod shell;

pub use shell::Step;

pub use kumo_cri::{
    cri_time, ContainerConfig, ContainerStats, ContainerStatus, ExecStep, Runtime, RuntimeError,
    SandboxConfig, State, Stream,
};

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

struct SimContainer {
    status: ContainerStatus,
    sandbox: String,
    config: ContainerConfig,
    /// When the process ends after it starts, and with what code (`None`: never).
    exit: Option<(Duration, i32)>,
    /// What it writes: offset after start, stream, text.
    output: Vec<(Duration, Stream, String)>,
    /// Files it writes: offset after start, path, text, append.
    writes: Vec<(Duration, String, String, bool)>,
    /// When it was created (to keep the newest exited containers).
    created: u64,
    /// When its program's simulated time starts (to run it again).
    program_start: SystemTime,
    /// Where its program's simulation stopped, to go on when the clock gets there.
    suspended: Option<(Duration, shell::Resume)>,
    /// Its modelled CPU time so far.
    cpu: CpuMeter,
    /// The command line the simulator has no model of (it runs doing nothing).
    not_simulated: Option<String>,
}

/// The simulated runtime's CPU accounting of one container: time is charged at its rate
/// as the clock passes, plus a cost per connection its pod's servers accepted.
#[derive(Clone, Copy, Debug, Default)]
struct CpuMeter {
    /// Up to when it was charged.
    at: Option<SystemTime>,
    nanos: u64,
    /// The pod's accepted connections already charged.
    requests: u64,
}

/// The modelled CPU of a container doing nothing (1m) and its memory working set (8 MiB).
const IDLE_NANOCORES: u64 = 1_000_000;
const IDLE_MEMORY: u64 = 8 << 20;

impl SimContainer {
    fn context(&self, files: &Arc<fs::Store>, id: &str) -> shell::Context {
        context(files, &self.sandbox, id, &self.config)
    }
}

impl Sim {
    /// A sim runtime whose containers reach the cluster network through `net`.
    pub fn with_dataplane(net: Option<Arc<crate::net::Dataplane>>) -> Sim {
        Sim {
            net,
            ..Sim::default()
        }
    }
}

/// What a process of container `id` sees.
fn context(
    files: &Arc<fs::Store>,
    sandbox: &str,
    id: &str,
    config: &ContainerConfig,
) -> shell::Context {
    shell::Context {
        hostname: config.hostname.clone(),
        pod_ip: config.pod_ip.clone(),
        env: config.env.clone(),
        stdin: None,
        fs: Some(fs::View {
            store: files.clone(),
            mounts: config.mounts.clone(),
            sandbox: sandbox.to_owned(),
            container: id.to_owned(),
            fixed: config.files.clone(),
        }),
        start: Some(SystemTime::now()),
        net: None,
        user: config.user,
        privileged: config.privileged,
        no_new_privs: config.no_new_privs,
        observe_until: None,
        resume: None,
    }
}

/// When a process exits (offset, code), what it writes to its streams, and to files,
/// and where its simulation suspended (offset, how to resume).
type Program = (
    Option<(Duration, i32)>,
    Vec<(Duration, Stream, String)>,
    Vec<(Duration, String, String, bool)>,
    Option<(Duration, shell::Resume)>,
);

/// How far past the real time a program's network commands see the network as it is
/// now; one later than that waits for the clock (see [`shell::Step::Suspend`]).
const OBSERVE_AHEAD: Duration = Duration::from_secs(1);

/// What a container does once started, from its annotations and command line run from
/// `start`: when it exits and with what code, its output and its file writes.
fn program(
    files: &Arc<fs::Store>,
    net: &Option<Arc<crate::net::Dataplane>>,
    sandbox: &str,
    id: &str,
    config: &ContainerConfig,
    start: SystemTime,
    resume: Option<shell::Resume>,
) -> Program {
    let first_run = resume.is_none();
    let a = &config.annotations;
    let exit_after = annotation(a, "sim.kumo.io/exit-after-seconds", &config.name)
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64);
    let exit_code =
        annotation(a, "sim.kumo.io/exit-code", &config.name).and_then(|s| s.parse().ok());
    let mut output = Vec::new();
    if let Some(text) = annotation(a, "sim.kumo.io/logs", &config.name).filter(|_| first_run) {
        let mut text = text.to_owned();
        if !text.ends_with('\n') {
            text.push('\n');
        }
        output.push((Duration::ZERO, Stream::Stdout, text));
    }
    // The command line decides, unless the annotations do.
    let mut ctx = context(files, sandbox, id, config);
    ctx.net = net.clone();
    ctx.start = Some(start);
    ctx.observe_until = Some(SystemTime::now() + OBSERVE_AHEAD);
    ctx.resume = resume;
    let mut suspended = None;
    if let Some(view) = &ctx.fs {
        view.prepare(start);
    }
    let mut exit = None;
    let mut writes = Vec::new();
    let argv = images::image_argv(&config.image, &config.command, &config.args);
    if let Some(steps) = shell::container_program(&argv, &ctx) {
        let mut at = Duration::ZERO;
        for step in steps {
            match step {
                Step::Out(stream, text) => output.push((at, stream, text)),
                Step::Write { path, text, append } => writes.push((at, path, text, append)),
                Step::Sleep(d) => at += d,
                Step::Exit(code) => {
                    exit = Some((at, code));
                    break;
                }
                Step::Forever => break,
                Step::Suspend(r) => {
                    suspended = Some((at, r));
                    break;
                }
            }
        }
    }
    // The annotations win over the command line: exit-after-seconds sets when, and
    // exit-code the code (else the command line's, else 0).
    let program_code = exit.map(|(_, c)| c);
    if let Some(after) = exit_after {
        exit = Some((after, exit_code.or(program_code).unwrap_or(0)));
    } else if let (Some((at, _)), Some(code)) = (exit, exit_code) {
        exit = Some((at, code));
    }
    (exit, output, writes, suspended)
}

/// Exited containers kept per pod and container name (the previous attempt's logs).
const KEEP_EXITED: usize = 2;

/// The simulated runtime.
#[derive(Default)]
pub struct Sim {
    containers: Mutex<HashMap<String, SimContainer>>,
    created: std::sync::atomic::AtomicU64,
    /// The containers' simulated files (emptyDir, hostPath, their own).
    files: Arc<fs::Store>,
    /// The cluster's network, if any.
    net: Option<Arc<crate::net::Dataplane>>,
    /// Log lines written from outside a container's program (a simulated server's
    /// request log), taken into its output when next read: they may come while the
    /// containers' lock is held (an exec whose curl reaches a server of this runtime).
    log_queue: Mutex<Vec<(String, SystemTime, String)>>,
}

fn annotation<'a>(a: &'a BTreeMap<String, String>, key: &str, container: &str) -> Option<&'a str> {
    a.get(&format!("{key}/{container}"))
        .or_else(|| a.get(key))
        .map(String::as_str)
}

/// The cgroup (v2) files of a container, as the kubelet's resource settings make them:
/// `cpu.weight` from the CPU request (shares as upstream converts them, then runc's
/// shares-to-weight conversion), `cpu.max` from the CPU limit (quota over a 100 ms period,
/// 1 ms at least), `memory.max` from the memory limit.
pub fn cgroup_files(config: &ContainerConfig) -> [(String, String); 3] {
    const PERIOD: u64 = 100_000;
    let shares = match config.cpu_request_millis.or(config.cpu_limit_millis) {
        Some(m) => (m * 1024 / 1000).clamp(2, 262_144),
        None => 2,
    };
    let weight = 1 + ((shares - 2) * 9999) / 262_142;
    let max = match config.cpu_limit_millis.filter(|m| *m > 0) {
        Some(m) => format!("{} {PERIOD}", (m * PERIOD / 1000).max(1000)),
        None => format!("max {PERIOD}"),
    };
    let memory = config
        .memory_limit_bytes
        .filter(|b| *b > 0)
        .map_or_else(|| "max".to_owned(), |b| b.to_string());
    [
        ("/sys/fs/cgroup/cpu.weight".into(), format!("{weight}\n")),
        ("/sys/fs/cgroup/cpu.max".into(), format!("{max}\n")),
        ("/sys/fs/cgroup/memory.max".into(), format!("{memory}\n")),
    ]
}

fn digest(image: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, image.as_bytes());
    let hex: String = d.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    let repo = image.split([':', '@']).next().unwrap_or(image);
    let repo = if repo.contains('/') {
        repo.to_owned()
    } else {
        format!("docker.io/library/{repo}")
    };
    format!("{repo}@sha256:{hex}")
}

impl Sim {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, SimContainer>> {
        self.containers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Goes on with container `id`'s suspended program when the clock has come near
    /// where it stopped: it runs again from the start, replaying what it observed and
    /// skipping what it did, and its new output and exit are added. The run happens
    /// outside the lock (its network commands may read other containers' files).
    fn resume_due(&self, id: &str) {
        let (config, sandbox, start, at, resume) = {
            let mut all = self.lock();
            let Some(c) = all.get_mut(id) else { return };
            let due = matches!(c.status.state, State::Running { .. } | State::Created)
                && c.suspended.as_ref().is_some_and(|(at, _)| {
                    SystemTime::now() + OBSERVE_AHEAD >= c.program_start + *at
                });
            if !due {
                return;
            }
            // Taken: one caller resumes it.
            let Some((at, resume)) = c.suspended.take() else {
                return;
            };
            (
                c.config.clone(),
                c.sandbox.clone(),
                c.program_start,
                at,
                resume,
            )
        };
        let (exit, output, writes, suspended) = program(
            &self.files,
            &self.net,
            &sandbox,
            id,
            &config,
            start,
            Some(resume.clone()),
        );
        let mut all = self.lock();
        let Some(c) = all.get_mut(id) else { return };
        if c.program_start != start || c.suspended.is_some() {
            return;
        }
        if !matches!(c.status.state, State::Running { .. } | State::Created) {
            // Stopped meanwhile: what it did up to then stays.
            c.suspended = Some((at, resume));
            return;
        }
        for o in output {
            let i = c.output.partition_point(|(t, _, _)| *t <= o.0);
            c.output.insert(i, o);
        }
        c.writes.extend(writes);
        if c.exit.is_none() {
            c.exit = exit;
        }
        c.suspended = suspended;
    }

    /// The termination message of an exited container: its file's content, else (with
    /// FallbackToLogsOnError after a failure) the end of its logs (80 lines, 2048 bytes),
    /// as the kubelet reads them.
    fn message(
        c: &SimContainer,
        exit_code: i32,
        started: SystemTime,
        finished: SystemTime,
    ) -> Option<String> {
        let path = if c.config.termination_message_path.is_empty() {
            "/dev/termination-log"
        } else {
            c.config.termination_message_path.as_str()
        };
        let mut file: Option<String> = None;
        for (at, p, text, append) in &c.writes {
            if p != path || started + *at > finished {
                continue;
            }
            match (&mut file, append) {
                (Some(f), true) => f.push_str(text),
                _ => file = Some(text.clone()),
            }
        }
        if let Some(f) = file.filter(|f| !f.is_empty()) {
            return Some(f.chars().take(4096).collect());
        }
        if !c.config.fallback_to_logs_on_error || exit_code == 0 {
            return None;
        }
        let text: String = c
            .output
            .iter()
            .filter(|(at, _, _)| started + *at <= finished)
            .map(|(_, _, t)| t.as_str())
            .collect();
        let lines: Vec<&str> = text.split_inclusive('\n').collect();
        let tail: String = lines[lines.len().saturating_sub(80)..].concat();
        let start = tail.len().saturating_sub(2048);
        let start = (start..=tail.len())
            .find(|i| tail.is_char_boundary(*i))
            .unwrap_or(tail.len());
        Some(tail[start..].to_owned()).filter(|m| !m.is_empty())
    }

    /// Containers whose time has come exit on their own.
    fn advance(c: &mut SimContainer) {
        if let (State::Running { started_at }, Some((after, code))) = (&c.status.state, c.exit) {
            let ends = *started_at + after;
            if SystemTime::now() >= ends {
                let started = *started_at;
                c.status.message = Self::message(c, code, started, ends);
                c.status.state = State::Exited {
                    exit_code: code,
                    started_at: started,
                    finished_at: ends,
                };
            }
        }
    }
}

/// Whether the container's first process is one that has no SIGTERM handler: a shell
/// (also busybox's default command) or `sleep`, with no `trap` in its script.
fn ignores_sigterm(config: &ContainerConfig) -> bool {
    let argv0 = match config.command.first().or(config.args.first()) {
        Some(a) => a.as_str(),
        // An image's own entrypoint: busybox's is sh, the others' servers handle SIGTERM.
        None => {
            let repo = config.image.split(['@', ':']).next().unwrap_or("");
            return repo.rsplit('/').next() == Some("busybox");
        }
    };
    let name = argv0.rsplit('/').next().unwrap_or(argv0);
    matches!(name, "sh" | "bash" | "ash" | "dash" | "sleep")
        && !config
            .command
            .iter()
            .chain(&config.args)
            .any(|a| a.contains("trap "))
}

/// The handler a container's shell script sets for SIGTERM as a quoted command
/// (`trap '<handler>' TERM`, also `SIGTERM` or `15`), if any. A bare word (`trap exit
/// TERM`, a function's name) is left to the old rule: the process ends at once.
fn term_trap(config: &ContainerConfig) -> Option<String> {
    static TRAP: std::sync::LazyLock<Option<regex::Regex>> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r#"trap\s+(?:'([^']*)'|"([^"]*)")\s+([A-Za-z0-9 ]+)"#).ok()
    });
    let script = config
        .command
        .iter()
        .chain(&config.args)
        .cloned()
        .collect::<Vec<_>>()
        .join(" ");
    TRAP.as_ref()?.captures_iter(&script).find_map(|c| {
        let on_term = c[3]
            .split_whitespace()
            .any(|s| matches!(s, "TERM" | "SIGTERM" | "15"));
        on_term.then(|| c.get(1).or(c.get(2)).map_or("", |m| m.as_str()).to_owned())
    })
}

impl Sim {
    /// SIGTERM to a running container whose script traps it: the handler runs (in the
    /// container, from now, outside the lock as every program) and the process exits as
    /// the handler does, or runs on to SIGKILL at the end of `grace` if the handler does
    /// not exit or takes longer. False when the container has no such handler.
    fn run_term_trap(&self, id: &str, grace: Duration) -> Result<bool, RuntimeError> {
        let (handler, ctx, started_at) = {
            let mut all = self.lock();
            let c = all
                .get_mut(id)
                .ok_or_else(|| RuntimeError::NotFound(id.into()))?;
            Self::advance(c);
            let State::Running { started_at } = c.status.state else {
                return Ok(false);
            };
            let Some(handler) = term_trap(&c.config) else {
                return Ok(false);
            };
            (handler, c.context(&self.files, id), started_at)
        };
        let now = SystemTime::now();
        let mut ctx = ctx;
        ctx.net = self.net.clone();
        let argv = vec!["sh".to_owned(), "-c".to_owned(), handler];
        let mut took = Duration::ZERO;
        let mut code = None;
        let mut output = Vec::new();
        // A handler the shell cannot run at all leaves SIGTERM as it was.
        let Ok(steps) = shell::exec_program(&argv, &ctx) else {
            return Ok(false);
        };
        for step in steps {
            match step {
                Step::Out(stream, text) => output.push((took, stream, text)),
                Step::Sleep(d) => took += d,
                Step::Exit(c) => {
                    code = Some(c);
                    break;
                }
                Step::Forever | Step::Suspend(_) => {
                    took = grace;
                    break;
                }
                Step::Write { .. } => {}
            }
        }
        let since_start = now.duration_since(started_at).unwrap_or_default();
        let mut all = self.lock();
        let Some(c) = all.get_mut(id) else {
            return Ok(true);
        };
        for (at, stream, text) in output {
            let at = since_start + at;
            // The output is kept in time order (reads stop at the first line to come).
            let i = c.output.partition_point(|(t, _, _)| *t <= at);
            c.output.insert(i, (at, stream, text));
        }
        let exit = match code {
            // A handler that exits in time ends the process with its code.
            Some(code) if took < grace => (since_start + took, code),
            // Else SIGKILL at the deadline.
            _ => (since_start + grace, 137),
        };
        if c.exit.is_none_or(|(at, _)| at > exit.0) {
            c.exit = Some(exit);
        }
        Ok(true)
    }
}

impl Runtime for Sim {
    fn version(&self) -> (String, String) {
        ("sim".into(), "0.1.0".into())
    }

    fn pull_image(
        &self,
        image: &str,
        _auth: Option<&kumo_cri::PullAuth>,
        annotations: &BTreeMap<String, String>,
        container: &str,
    ) -> Result<String, RuntimeError> {
        if annotation(annotations, "sim.kumo.io/pull", container) == Some("fail") {
            return Err(RuntimeError::Pull {
                image: image.to_owned(),
                reason: "not found".into(),
            });
        }
        if let Some(reason) = registry::missing(image) {
            return Err(RuntimeError::Pull {
                image: registry::normalize(image),
                reason,
            });
        }
        Ok(digest(image))
    }

    fn run_pod_sandbox(&self, config: &SandboxConfig) -> Result<String, RuntimeError> {
        Ok(format!("sandbox-{}", config.uid))
    }

    fn remove_pod_sandbox(&self, sandbox: &str) {
        self.lock().retain(|id, c| {
            let keep = c.sandbox != sandbox;
            if !keep {
                self.files.remove_prefix(&fs::View::container_prefix(id));
            }
            keep
        });
        self.files.remove_prefix(&fs::View::sandbox_prefix(sandbox));
    }

    fn create_container(
        &self,
        sandbox: &str,
        config: &ContainerConfig,
        image_ref: &str,
    ) -> Result<String, RuntimeError> {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let program_start = SystemTime::now();
        // The files the image ships that the e2e tests rely on.
        for (path, content) in images::image_files(&config.image) {
            self.files.put(
                &format!(
                    "{}{}",
                    fs::View::container_prefix(&id),
                    path.trim_start_matches('/')
                ),
                program_start,
                Some(fs::Node::File {
                    content,
                    mode: 0o644,
                }),
            );
        }
        let (exit, output, writes, suspended) = program(
            &self.files,
            &self.net,
            sandbox,
            &id,
            config,
            program_start,
            None,
        );
        let argv = images::image_argv(&config.image, &config.command, &config.args);
        let not_simulated = (!images::emulated(&config.image, &argv, config.command.is_empty())
            && annotation(
                &config.annotations,
                "sim.kumo.io/exit-after-seconds",
                &config.name,
            )
            .is_none())
        .then(|| argv.join(" "));
        let created = self
            .created
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut all = self.lock();
        // Older exited attempts of this container go (the kubelet's container GC).
        let mut exited: Vec<(u64, String)> = all
            .iter()
            .filter(|(_, c)| {
                c.sandbox == sandbox
                    && c.config.name == config.name
                    && matches!(c.status.state, State::Exited { .. })
            })
            .map(|(k, c)| (c.created, k.clone()))
            .collect();
        exited.sort();
        let excess = exited.len().saturating_sub(KEEP_EXITED - 1);
        for (_, k) in exited.into_iter().take(excess) {
            all.remove(&k);
            self.files.remove_prefix(&fs::View::container_prefix(&k));
        }
        all.insert(
            id.clone(),
            SimContainer {
                status: ContainerStatus {
                    id: id.clone(),
                    name: config.name.clone(),
                    attempt: config.attempt,
                    image: config.image.clone(),
                    image_ref: image_ref.to_owned(),
                    state: State::Created,
                    message: None,
                    reason: None,
                },
                sandbox: sandbox.to_owned(),
                config: {
                    let mut config = config.clone();
                    config.files.extend(cgroup_files(&config));
                    config
                },
                exit,
                output,
                writes,
                created,
                program_start,
                suspended,
                cpu: CpuMeter::default(),
                not_simulated,
            },
        );
        Ok(id)
    }

    fn start_container(&self, id: &str) -> Result<(), RuntimeError> {
        let mut all = self.lock();
        let c = all
            .get_mut(id)
            .ok_or_else(|| RuntimeError::NotFound(id.into()))?;
        c.status.state = State::Running {
            started_at: SystemTime::now(),
        };
        Ok(())
    }

    fn file_exists(&self, id: &str, path: &str) -> Option<bool> {
        self.resume_due(id);
        let all = self.lock();
        let c = all.get(id)?;
        let view = c.context(&self.files, id).fs?;
        Some(view.stat(path, SystemTime::now()).is_some())
    }

    fn read_file(&self, id: &str, path: &str) -> Option<String> {
        self.resume_due(id);
        let all = self.lock();
        let c = all.get(id)?;
        let view = c.context(&self.files, id).fs?;
        view.read(path, SystemTime::now()).ok()
    }

    fn stop_container(&self, id: &str, grace: Duration) -> Result<(), RuntimeError> {
        if !grace.is_zero() && self.run_term_trap(id, grace)? {
            return Ok(());
        }
        let mut all = self.lock();
        let c = all
            .get_mut(id)
            .ok_or_else(|| RuntimeError::NotFound(id.into()))?;
        Self::advance(c);
        if let State::Running { started_at } = c.status.state {
            let now = SystemTime::now();
            if ignores_sigterm(&c.config) && !grace.is_zero() {
                // A shell or `sleep` as the container's PID 1 without a trap ignores
                // SIGTERM (PID 1 has no default handlers): it runs on until SIGKILL at the
                // end of the grace period, unless its program ends first. The call
                // returns at once; the state shows the exit when it comes.
                let killed = (now + grace).duration_since(started_at).unwrap_or_default();
                if c.exit.is_none_or(|(at, _)| at > killed) {
                    c.exit = Some((killed, 137));
                }
                return Ok(());
            }
            // Any other simulated process honours SIGTERM at once and exits cleanly; with
            // no grace at all it is killed.
            let code = if grace.is_zero() && ignores_sigterm(&c.config) {
                137
            } else {
                0
            };
            c.status.message = Self::message(c, code, started_at, now);
            c.status.state = State::Exited {
                exit_code: code,
                started_at,
                finished_at: now,
            };
        }
        Ok(())
    }

    fn kill_container(&self, id: &str) -> Result<(), RuntimeError> {
        let mut all = self.lock();
        let c = all
            .get_mut(id)
            .ok_or_else(|| RuntimeError::NotFound(id.into()))?;
        Self::advance(c);
        if let State::Running { started_at } = c.status.state {
            let now = SystemTime::now();
            c.status.message = Self::message(c, 137, started_at, now);
            c.status.state = State::Exited {
                exit_code: 137,
                started_at,
                finished_at: now,
            };
        }
        Ok(())
    }

    fn update_container_resources(
        &self,
        id: &str,
        config: &ContainerConfig,
    ) -> Result<(), RuntimeError> {
        let mut all = self.lock();
        let c = all
            .get_mut(id)
            .ok_or_else(|| RuntimeError::NotFound(id.into()))?;
        c.config.cpu_request_millis = config.cpu_request_millis;
        c.config.cpu_limit_millis = config.cpu_limit_millis;
        c.config.memory_limit_bytes = config.memory_limit_bytes;
        let files = cgroup_files(&c.config);
        c.config.files.extend(files);
        Ok(())
    }

    /// The modelled usage of a running container (the simulator has no processes to
    /// measure; `kubectl top` and the HorizontalPodAutoscaler see this model):
    /// * CPU: `sim.kumo.io/cpu` when set, else 1m at rest plus, per connection its pod
    ///   accepted, the image's cost per request ([`cpu_per_request`]); capped by the CPU
    ///   limit, as a cgroup quota throttles;
    /// * memory: `sim.kumo.io/memory` when set, else 8 MiB; capped by the memory limit.
    fn container_stats(&self, id: &str) -> Option<ContainerStats> {
        let now = SystemTime::now();
        let mut all = self.lock();
        let c = all.get_mut(id)?;
        Self::advance(c);
        let State::Running { started_at } = c.status.state else {
            return None;
        };
        let name = c.config.name.clone();
        let quantity = |key: &str| {
            annotation(&c.config.annotations, key, &name)
                .and_then(kumo_apimachinery::quantity::Quantity::parse)
        };
        let rate = quantity("sim.kumo.io/cpu").map(|q| q.milli_value().max(0) as u64 * 1_000_000);
        let memory = quantity("sim.kumo.io/memory")
            .map(|q| q.value().max(0) as u64)
            .unwrap_or(IDLE_MEMORY);
        let requests = match (&self.net, c.config.pod_ip.parse()) {
            (Some(net), Ok(ip)) => net.served(ip),
            _ => 0,
        };
        let since = c.cpu.at.unwrap_or(started_at);
        let elapsed = now.duration_since(since).unwrap_or_default();
        let mut charge = match rate {
            Some(r) => (r as u128 * elapsed.as_nanos() / 1_000_000_000) as u64,
            None => {
                let idle = (IDLE_NANOCORES as u128 * elapsed.as_nanos() / 1_000_000_000) as u64;
                let served = requests.saturating_sub(c.cpu.requests);
                idle + served * images::cpu_per_request(&c.config.image).as_nanos() as u64
            }
        };
        if let Some(limit) = c.config.cpu_limit_millis {
            let most = (limit as u128 * 1_000_000 * elapsed.as_nanos() / 1_000_000_000) as u64;
            charge = charge.min(most);
        }
        c.cpu = CpuMeter {
            at: Some(now),
            nanos: c.cpu.nanos + charge,
            requests,
        };
        Some(ContainerStats {
            timestamp: now,
            cpu_usage_core_nano_seconds: c.cpu.nanos,
            memory_working_set_bytes: c
                .config
                .memory_limit_bytes
                .map_or(memory, |l| memory.min(l)),
        })
    }

    fn container_status(&self, id: &str) -> Result<ContainerStatus, RuntimeError> {
        self.resume_due(id);
        let mut all = self.lock();
        let c = all
            .get_mut(id)
            .ok_or_else(|| RuntimeError::NotFound(id.into()))?;
        Self::advance(c);
        Ok(c.status.clone())
    }

    fn container_state(&self, id: &str) -> Result<State, RuntimeError> {
        self.resume_due(id);
        let mut all = self.lock();
        let c = all
            .get_mut(id)
            .ok_or_else(|| RuntimeError::NotFound(id.into()))?;
        Self::advance(c);
        Ok(c.status.state)
    }

    fn steady_until(&self, id: &str) -> Option<SystemTime> {
        self.resume_due(id);
        let mut all = self.lock();
        let c = all.get_mut(id)?;
        Self::advance(c);
        let far = SystemTime::now() + Duration::from_secs(365 * 24 * 3600);
        let until = match (c.status.state, c.exit) {
            (State::Running { started_at }, Some((after, _))) => started_at + after,
            _ => far,
        };
        // A suspended program goes on at its suspension point.
        let resumes = c.suspended.as_ref().map(|(at, _)| {
            (c.program_start + *at)
                .checked_sub(OBSERVE_AHEAD)
                .unwrap_or(c.program_start)
        });
        Some(resumes.map_or(until, |r| r.min(until)))
    }

    fn not_simulated(&self, id: &str) -> Option<String> {
        self.lock().get(id)?.not_simulated.clone()
    }

    fn write_log(&self, id: &str, text: &str) {
        self.log_queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((id.to_owned(), SystemTime::now(), text.to_owned()));
    }

    fn read_logs(&self, id: &str) -> Result<String, RuntimeError> {
        self.resume_due(id);
        let mut all = self.lock();
        let queued = std::mem::take(&mut *self.log_queue.lock().unwrap_or_else(|e| e.into_inner()));
        for (cid, when, text) in queued {
            let Some(c) = all.get_mut(&cid) else {
                continue;
            };
            let started_at = match c.status.state {
                State::Running { started_at } | State::Exited { started_at, .. } => started_at,
                State::Created => continue,
            };
            let at = when.duration_since(started_at).unwrap_or_default();
            // The output is kept in time order (reads stop at the first line to come).
            let i = c.output.partition_point(|(t, _, _)| *t <= at);
            c.output.insert(i, (at, Stream::Stdout, text));
        }
        let c = all
            .get_mut(id)
            .ok_or_else(|| RuntimeError::NotFound(id.into()))?;
        Self::advance(c);
        let (started, until) = match c.status.state {
            State::Created => return Ok(String::new()),
            State::Running { started_at } => (started_at, SystemTime::now()),
            State::Exited {
                started_at,
                finished_at,
                ..
            } => (started_at, finished_at),
        };
        let mut file = String::new();
        for (at, stream, text) in &c.output {
            let t = started + *at;
            if t > until {
                break;
            }
            let ts = cri_time(t);
            // One CRI record per line: F for a full line, P for a partial one.
            for line in text.split_inclusive('\n') {
                let (content, tag) = match line.strip_suffix('\n') {
                    Some(c) => (c, "F"),
                    None => (line, "P"),
                };
                file.push_str(&format!("{ts} {} {tag} {content}\n", stream.tag()));
            }
        }
        Ok(file)
    }

    fn exec(
        &self,
        id: &str,
        cmd: &[String],
        stdin: Option<Vec<u8>>,
    ) -> Result<Vec<ExecStep>, RuntimeError> {
        let mut ctx = {
            let mut all = self.lock();
            let c = all
                .get_mut(id)
                .ok_or_else(|| RuntimeError::NotFound(id.into()))?;
            Self::advance(c);
            if !matches!(c.status.state, State::Running { .. }) {
                return Err(RuntimeError::NotRunning(id.into()));
            }
            c.context(&self.files, id)
        };
        // Run without the lock: the command may read other containers' files.
        ctx.net = self.net.clone();
        ctx.stdin = stdin;
        let steps = shell::exec_program(cmd, &ctx).map_err(RuntimeError::Exec)?;
        Ok(steps
            .into_iter()
            .filter_map(|s| match s {
                Step::Out(stream, text) => Some(ExecStep::Out(stream, text)),
                Step::Sleep(d) => Some(ExecStep::Sleep(d)),
                Step::Exit(c) => Some(ExecStep::Exit(c)),
                Step::Forever | Step::Suspend(_) => Some(ExecStep::Forever),
                Step::Write { .. } => None,
            })
            .collect())
    }

    fn exec_reads_stdin(&self, cmd: &[String]) -> bool {
        shell::reads_stdin(cmd)
    }

    fn exec_input_complete(&self, cmd: &[String], input: &[u8]) -> bool {
        shell::stdin_complete(cmd, input)
    }

    fn refresh_volumes(&self, id: &str, config: &ContainerConfig) {
        let mut all = self.lock();
        let Some(c) = all.get_mut(id) else {
            return;
        };
        Self::advance(c);
        if !matches!(c.status.state, State::Running { .. }) {
            return;
        }
        let now = SystemTime::now();
        let mut changed = false;
        for m in &config.mounts {
            let fs::Source::Files(new) = &m.source else {
                continue;
            };
            let Some(first) = c.config.mounts.iter().find(|o| o.path == m.path) else {
                continue;
            };
            // The files as the container sees them now: the last version, else the
            // ones it started with.
            let key = fs::View::projected_key(id, &m.path);
            let current = match self.files.get(&key, now) {
                Some(fs::Node::File { content, .. }) => serde_json::from_str(&content).ok(),
                _ => match &first.source {
                    fs::Source::Files(f) => Some(f.clone()),
                    _ => None,
                },
            };
            if current.as_ref() == Some(new) {
                continue;
            }
            let content = serde_json::to_string(new).unwrap_or_default();
            self.files.put(
                &key,
                now,
                Some(fs::Node::File {
                    content,
                    mode: 0o644,
                }),
            );
            changed = true;
        }
        if !changed {
            return;
        }
        // Its process sees the new files from now on: run it again over them, without
        // the lock (the program may read other containers' files).
        self.files.forget_writer(id);
        fs::disks().forget_writer(id);
        let (sandbox, config, start) = (c.sandbox.clone(), c.config.clone(), c.program_start);
        drop(all);
        let (exit, output, writes, suspended) =
            program(&self.files, &self.net, &sandbox, id, &config, start, None);
        let mut all = self.lock();
        let Some(c) = all.get_mut(id) else { return };
        if c.program_start != start || !matches!(c.status.state, State::Running { .. }) {
            return;
        }
        c.exit = exit;
        c.output = output;
        c.writes = writes;
        c.suspended = suspended;
    }

    fn probe_exec(
        &self,
        id: &str,
        cmd: &[String],
        at: SystemTime,
        timeout: Duration,
    ) -> Option<bool> {
        let mut ctx = {
            let mut all = self.lock();
            let c = all.get_mut(id)?;
            Self::advance(c);
            if !matches!(c.status.state, State::Running { .. }) {
                return Some(false);
            }
            c.context(&self.files, id)
        };
        ctx.net = self.net.clone();
        ctx.start = Some(at);
        let Ok(steps) = shell::exec_program(cmd, &ctx) else {
            return Some(false);
        };
        // Passes when it exits 0 within the timeout.
        let mut took = Duration::ZERO;
        for s in steps {
            match s {
                Step::Sleep(d) => took += d,
                Step::Exit(code) => return Some(code == 0 && took <= timeout),
                Step::Forever => return Some(false),
                _ => {}
            }
        }
        Some(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_see_the_network_change_as_their_clock_runs() {
        let dp = crate::net::Dataplane::new();
        crate::net::add_cluster_dns(&dp);
        let sim = Sim::with_dataplane(Some(dp.clone()));
        let sb = sim
            .run_pod_sandbox(&kumo_cri::SandboxConfig {
                uid: "u1".into(),
                ..Default::default()
            })
            .unwrap();
        let mut files = BTreeMap::new();
        files.insert(
            "/etc/resolv.conf".to_owned(),
            "search default.svc.cluster.local svc.cluster.local cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n".to_owned(),
        );
        let config = ContainerConfig {
            name: "q".into(),
            image: "busybox".into(),
            command: vec!["sh".into(), "-c".into()],
            args: vec![
                "echo start; for i in 1 2 3 4 5 6; do dig +short +search web A; sleep 1; done; echo end >> /tmp/done".into(),
            ],
            files,
            ..Default::default()
        };
        let id = sim.create_container(&sb, &config, "busybox").unwrap();
        sim.start_container(&id).expect("start");
        // Found nothing at first; the Service appears while the loop runs.
        std::thread::sleep(Duration::from_millis(1500));
        dp.set_service(
            "default/web",
            crate::net::ServiceEntry {
                rules: Vec::new(),
                records: vec![crate::dns::Rr::new(
                    "web.default.svc.cluster.local",
                    crate::dns::RData::A([10, 96, 0, 7].into()),
                )],
                affinity: None,
            },
        );
        let mut logs = String::new();
        for _ in 0..80 {
            std::thread::sleep(Duration::from_millis(100));
            logs = sim.read_logs(&id).expect("logs");
            if matches!(sim.container_state(&id), Ok(State::Exited { .. })) {
                break;
            }
        }
        let lines: Vec<&str> = logs
            .lines()
            .filter_map(|l| l.splitn(4, ' ').nth(3))
            .collect();
        assert_eq!(lines.first(), Some(&"start"), "{logs}");
        // Later lookups answer; each line once (the resumed runs add only what is new).
        let found = lines.iter().filter(|l| **l == "10.96.0.7").count();
        assert!((2..=5).contains(&found), "{logs}");
        assert_eq!(lines.iter().filter(|l| **l == "start").count(), 1, "{logs}");
        assert!(matches!(
            sim.container_state(&id),
            Ok(State::Exited { exit_code: 0, .. })
        ));
        assert_eq!(sim.read_file(&id, "/tmp/done").as_deref(), Some("end\n"));
    }

    #[test]
    fn sim_containers_behave_as_annotated() {
        let sim = Sim::default();
        let mut a = BTreeMap::new();
        a.insert(
            "sim.kumo.io/exit-after-seconds/job".to_owned(),
            "0".to_owned(),
        );
        a.insert("sim.kumo.io/exit-code/job".to_owned(), "3".to_owned());
        let sb = sim
            .run_pod_sandbox(&kumo_cri::SandboxConfig {
                uid: "u1".into(),
                ..Default::default()
            })
            .unwrap();
        let image = sim.pull_image("nginx:1.29", None, &a, "web").expect("pull");
        assert!(image.starts_with("docker.io/library/nginx@sha256:"));
        let web = sim
            .create_container(
                &sb,
                &ContainerConfig {
                    name: "web".into(),
                    image: "nginx".into(),
                    annotations: a.clone(),
                    ..Default::default()
                },
                &image,
            )
            .unwrap();
        let job = sim
            .create_container(
                &sb,
                &ContainerConfig {
                    name: "job".into(),
                    image: "busybox".into(),
                    annotations: a.clone(),
                    ..Default::default()
                },
                &image,
            )
            .unwrap();
        sim.start_container(&web).expect("start");
        sim.start_container(&job).expect("start");
        assert!(matches!(
            sim.container_status(&web).expect("status").state,
            State::Running { .. }
        ));
        assert!(matches!(
            sim.container_status(&job).expect("status").state,
            State::Exited { exit_code: 3, .. }
        ));
        sim.stop_container(&web, Duration::from_secs(30))
            .expect("stop");
        assert!(matches!(
            sim.container_status(&web).expect("status").state,
            State::Exited { exit_code: 0, .. }
        ));
        a.insert("sim.kumo.io/pull".to_owned(), "fail".to_owned());
        assert!(sim.pull_image("nginx", None, &a, "web").is_err());
        sim.remove_pod_sandbox(&sb);
        assert!(sim.container_status(&web).is_err());
    }

    #[test]
    fn sysctl_reads_the_sysctls_the_kubelet_wrote() {
        let sim = Sim::default();
        let sb = sim
            .run_pod_sandbox(&kumo_cri::SandboxConfig {
                uid: "u3".into(),
                ..Default::default()
            })
            .unwrap();
        let mut files = BTreeMap::new();
        files.insert(
            "/proc/sys/kernel/shm_rmid_forced".to_owned(),
            "1\n".to_owned(),
        );
        let c = sim
            .create_container(
                &sb,
                &ContainerConfig {
                    name: "c".into(),
                    image: "busybox".into(),
                    command: vec!["sleep".into(), "infinity".into()],
                    files,
                    ..Default::default()
                },
                "busybox",
            )
            .unwrap();
        sim.start_container(&c).expect("start");
        let run = |args: &[&str]| {
            let cmd: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
            sim.exec(&c, &cmd, None).expect("exec")
        };
        assert_eq!(
            run(&["/bin/sysctl", "kernel.shm_rmid_forced"]),
            [
                ExecStep::Out(Stream::Stdout, "kernel.shm_rmid_forced = 1\n".into()),
                ExecStep::Exit(0)
            ]
        );
        assert_eq!(
            run(&["sysctl", "-n", "kernel/shm_rmid_forced"]),
            [
                ExecStep::Out(Stream::Stdout, "1\n".into()),
                ExecStep::Exit(0)
            ]
        );
        assert_eq!(
            run(&["sysctl", "kernel.nope"]),
            [
                ExecStep::Out(
                    Stream::Stderr,
                    "sysctl: error: 'kernel.nope' is an unknown key\n".into()
                ),
                ExecStep::Exit(1)
            ]
        );
    }

    #[test]
    fn agnhost_ships_its_certificate_and_pid1_shells_die_by_sigkill() {
        let sim = Sim::default();
        let sb = sim
            .run_pod_sandbox(&kumo_cri::SandboxConfig {
                uid: "u2".into(),
                ..Default::default()
            })
            .unwrap();
        let agnhost = "registry.k8s.io/e2e-test-images/agnhost:2.55";
        let web = sim
            .create_container(
                &sb,
                &ContainerConfig {
                    name: "webserver".into(),
                    image: agnhost.into(),
                    args: vec!["test-webserver".into()],
                    ..Default::default()
                },
                agnhost,
            )
            .unwrap();
        sim.start_container(&web).expect("start");
        assert_eq!(sim.file_exists(&web, "/localhost.crt"), Some(true));
        // What the StatefulSet e2e tests do to break the readiness probe.
        let cmd: Vec<String> = ["/bin/sh", "-x", "-c", "mv -v /localhost.crt /tmp/ || true"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        sim.exec(&web, &cmd, None).expect("exec");
        assert_eq!(sim.file_exists(&web, "/localhost.crt"), Some(false));
        assert_eq!(sim.file_exists(&web, "/tmp/localhost.crt"), Some(true));
        assert_eq!(sim.file_exists("nope", "/localhost.crt"), None);

        let sleeper = sim
            .create_container(
                &sb,
                &ContainerConfig {
                    name: "sleeper".into(),
                    image: "busybox".into(),
                    command: vec!["sh".into(), "-c".into(), "sleep 3600".into()],
                    ..Default::default()
                },
                "busybox",
            )
            .unwrap();
        sim.start_container(&sleeper).expect("start");
        // SIGTERM is ignored: it runs to the end of the grace period, then SIGKILL.
        sim.stop_container(&sleeper, Duration::from_millis(300))
            .expect("stop");
        assert!(matches!(
            sim.container_status(&sleeper).expect("status").state,
            State::Running { .. }
        ));
        std::thread::sleep(Duration::from_millis(400));
        assert!(matches!(
            sim.container_status(&sleeper).expect("status").state,
            State::Exited { exit_code: 137, .. }
        ));
        // A process that handles SIGTERM (agnhost) stops at once.
        sim.stop_container(&web, Duration::from_secs(30))
            .expect("stop");
        assert!(matches!(
            sim.container_status(&web).expect("status").state,
            State::Exited { exit_code: 0, .. }
        ));
    }

    #[test]
    fn a_term_trap_runs_its_handler_within_the_grace_period() {
        let sim = Sim::default();
        let sb = sim
            .run_pod_sandbox(&kumo_cri::SandboxConfig {
                uid: "trap".into(),
                ..Default::default()
            })
            .unwrap();
        let make = |name: &str, script: &str| {
            let id = sim
                .create_container(
                    &sb,
                    &ContainerConfig {
                        name: name.into(),
                        image: "busybox".into(),
                        command: vec!["sh".into(), "-c".into(), script.into()],
                        ..Default::default()
                    },
                    "busybox",
                )
                .unwrap();
            sim.start_container(&id).expect("start");
            id
        };
        // A handler that says goodbye and exits: the process ends at once with its code.
        let bye = make("bye", "trap 'echo bye; exit 3' TERM; sleep 3600");
        sim.stop_container(&bye, Duration::from_secs(30))
            .expect("stop");
        assert!(matches!(
            sim.container_status(&bye).expect("status").state,
            State::Exited { exit_code: 3, .. }
        ));
        assert!(sim.read_logs(&bye).expect("logs").contains("bye"));
        // A handler that takes its time: still running until it is done.
        let slow = make("slow", "trap \"sleep 1; exit 0\" SIGTERM; sleep 3600");
        sim.stop_container(&slow, Duration::from_secs(30))
            .expect("stop");
        assert!(matches!(
            sim.container_status(&slow).expect("status").state,
            State::Running { .. }
        ));
        std::thread::sleep(Duration::from_millis(1100));
        assert!(matches!(
            sim.container_status(&slow).expect("status").state,
            State::Exited { exit_code: 0, .. }
        ));
        // Longer than the grace period: SIGKILL at its end.
        let late = make("late", "trap 'sleep 60; exit 0' TERM; sleep 3600");
        sim.stop_container(&late, Duration::from_millis(200))
            .expect("stop");
        std::thread::sleep(Duration::from_millis(300));
        assert!(matches!(
            sim.container_status(&late).expect("status").state,
            State::Exited { exit_code: 137, .. }
        ));
    }
}
