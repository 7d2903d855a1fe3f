//! What a `sim` container does: its command line run by a small simulated shell. The
//! shell reads a POSIX `sh` subset ([`parse`]): lists with `;`, `&&`, `||` and `&`,
//! pipes, `if`/`while`/`until`/`for`/`case`, functions, `$VAR`/`${VAR:-x}`, `$(...)`,
//! `$((...))`, quoting, redirections (`>`, `>>`, `<`, `2>&1`, here-documents), `[ ]` and
//! `[[ ]]`; and busybox's common utilities (`echo`, `printf`, `cat`, `grep`, `wc`, `ls`,
//! `mkdir`, `touch`, `rm`, `awk '{print $N}'`, `sleep`, ...) over the container's
//! simulated files ([`super::fs`]). Nothing runs on the host. Time is simulated: a script
//! is run ahead to the end (or to a budget: a loop that never ends runs until stopped),
//! and its output and file writes are stamped with the moment they happen. A command
//! line it does not understand (an image's own entrypoint) runs until the container is
//! stopped, silently.

mod curl;
mod dns;
mod mtls;
pub mod parse;

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parse::{AndOr, Cmd, List, Part, Pipeline, Redir, Word};

use super::fs::{self, Node, View};
pub use kumo_cri::Stream;

/// One step of a simulated process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Writes bytes to a stream.
    Out(Stream, String),
    Sleep(Duration),
    /// The process ends with this code.
    Exit(i32),
    /// The process runs until it is stopped.
    Forever,
    /// Writes a file (`> path`, or `>> path` when appending); already applied to the
    /// files, told so the runtime can read the termination message.
    Write {
        path: String,
        text: String,
        append: bool,
    },
    /// The process reached a network observation later than [`Context::observe_until`]:
    /// its simulation stops here, to be run again with this when the clock gets there.
    Suspend(Resume),
}

/// What a network command (`curl`, `dig`, ...) printed and returned, so that running a
/// program again replays it instead of asking the network a second time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observation {
    out: String,
    err: String,
    code: i32,
    took: Duration,
}

/// How a suspended program resumes: a run from the start that replays the observations
/// made so far and skips the effects (output, file changes) already made.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resume {
    pub observations: Vec<Observation>,
    pub effects: usize,
}

/// What the process can see.
#[derive(Clone, Default)]
pub struct Context {
    pub hostname: String,
    pub pod_ip: String,
    /// The container's environment, in order.
    pub env: Vec<(String, String)>,
    /// What is written to its stdin (exec), if anything.
    pub stdin: Option<Vec<u8>>,
    /// Its files (without: only the runtime's own, `/etc/hostname` and the like).
    pub fs: Option<View>,
    /// When it starts (file writes are stamped from it); now if unset.
    pub start: Option<SystemTime>,
    /// The cluster network `curl` and `wget` reach (without: unreachable).
    pub net: Option<Arc<crate::net::Dataplane>>,
    /// The uid (and gid) its processes run as; root when unset.
    pub user: Option<(i64, Option<i64>)>,
    /// Whether it runs privileged (may change the network devices).
    pub privileged: bool,
    /// `allowPrivilegeEscalation: false`: setuid executables do not raise the uid.
    pub no_new_privs: bool,
    /// For a container's program: the real time up to which its network commands are
    /// run against the network as it is now. One at a later simulated time suspends
    /// the run ([`Step::Suspend`]), so programs see the cluster change as they go.
    /// `None`: never suspend (an exec, which runs now).
    pub observe_until: Option<SystemTime>,
    /// A suspended run being resumed.
    pub resume: Option<Resume>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("hostname", &self.hostname)
            .field("pod_ip", &self.pod_ip)
            .field("env", &self.env)
            .finish_non_exhaustive()
    }
}

impl Context {
    /// The environment a process sees (`env`): the container's, then the runtime's.
    fn environ(&self) -> Vec<(String, String)> {
        let mut all = vec![
            (
                "PATH".to_owned(),
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_owned(),
            ),
            ("HOSTNAME".to_owned(), self.hostname.clone()),
        ];
        for (k, v) in &self.env {
            all.retain(|(n, _)| n != k);
            all.push((k.clone(), v.clone()));
        }
        if !all.iter().any(|(k, _)| k == "HOME") {
            all.push(("HOME".to_owned(), "/root".to_owned()));
        }
        all
    }

    /// The files the runtime makes in every container.
    fn fixed_files(&self) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        m.insert("/etc/hostname".to_owned(), format!("{}\n", self.hostname));
        m.insert(
            "/etc/hosts".to_owned(),
            format!(
                "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n{}\t{}\n",
                self.pod_ip, self.hostname
            ),
        );
        m.insert(
            "/etc/resolv.conf".to_owned(),
            "search default.svc.cluster.local svc.cluster.local cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n".into(),
        );
        m
    }

    /// The view of the files this process has.
    fn view(&self) -> View {
        let mut v = self.fs.clone().unwrap_or_else(|| View {
            store: Arc::new(fs::Store::default()),
            mounts: Vec::new(),
            sandbox: String::new(),
            container: String::new(),
            fixed: BTreeMap::new(),
        });
        for (k, text) in self.fixed_files() {
            v.fixed.entry(k).or_insert(text);
        }
        v
    }
}

/// A Go duration such as `20s`, `1m30s`, `500ms`.
fn go_duration(s: &str) -> Option<Duration> {
    let mut total = 0f64;
    let mut rest = s.trim();
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
        let (n, tail) = rest.split_at(digits);
        let n: f64 = n.parse().ok()?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        total += n * match unit {
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = tail;
    }
    Duration::try_from_secs_f64(total).ok()
}

/// Go-like `printf`: `%s`, `%d`, `%%` and the backslash escapes `\n`, `\t`, `\\`.
fn printf(fmt: &str, args: &[String]) -> String {
    let mut out = String::new();
    let mut args = args.iter();
    let mut chars = fmt.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('n') => out.push('\n'),
                Some('r') => out.push('\r'),
                Some('t') => out.push('\t'),
                Some('\\') => out.push('\\'),
                Some(o) => {
                    out.push('\\');
                    out.push(o);
                }
                None => out.push('\\'),
            },
            '%' => match chars.next() {
                Some('%') => out.push('%'),
                Some('s' | 'd' | 'v') => out.push_str(args.next().map_or("", String::as_str)),
                Some(o) => {
                    out.push('%');
                    out.push(o);
                }
                None => out.push('%'),
            },
            c => out.push(c),
        }
    }
    out
}

/// The program a container's command line runs (`argv` is command + args). `None` when
/// the sim does not understand it: the container then runs until stopped.
pub fn container_program(argv: &[String], ctx: &Context) -> Option<Vec<Step>> {
    let first = argv.first()?;
    if !known(basename(first)) {
        return None;
    }
    Some(run(argv, ctx, false))
}

/// What `kubectl exec` of `argv` does. An executable the sim does not know fails as
/// runc's exec does (`Err` with its message).
pub fn exec_program(argv: &[String], ctx: &Context) -> Result<Vec<Step>, String> {
    let Some(first) = argv.first() else {
        return Err("exec: \"\": executable file not found in $PATH".into());
    };
    if !known(basename(first)) {
        return Err(format!(
            "OCI runtime exec failed: exec failed: unable to start container process: exec: \"{first}\": executable file not found in $PATH: unknown"
        ));
    }
    Ok(run(argv, ctx, true))
}

/// Whether `argv` reads its stdin (so exec waits for it): `cat` without files, a shell
/// without a script.
pub fn reads_stdin(argv: &[String]) -> bool {
    match argv.first().map(|a| basename(a)) {
        Some("cat") => argv.len() == 1,
        Some("tar") => argv
            .get(1)
            .is_some_and(|a| a.trim_start_matches('-').contains('x')),
        Some(sh) if is_shell(sh) => !argv.iter().any(|a| a == "-c") && argv.len() == 1,
        _ => false,
    }
}

/// Whether a shell reading `input` from its stdin has come to an `exit` (an interactive
/// session ends there without its stdin being closed).
pub fn stdin_complete(argv: &[String], input: &[u8]) -> bool {
    if !argv.first().is_some_and(|a| is_shell(basename(a))) {
        return false;
    }
    let text = String::from_utf8_lossy(input);
    let complete = match text.rfind('\n') {
        Some(i) => &text[..i],
        None => return false,
    };
    complete
        .lines()
        .any(|l| l.trim() == "exit" || l.trim().starts_with("exit "))
}

fn basename(s: &str) -> &str {
    s.rsplit('/').next().unwrap_or(s)
}

fn is_shell(s: &str) -> bool {
    matches!(s, "sh" | "bash" | "ash" | "dash")
}

/// The utilities the sim has (busybox's, as far as the sim goes).
const UTILITIES: &[&str] = &[
    "echo",
    "tar",
    "printf",
    "cat",
    "sleep",
    "true",
    "false",
    "exit",
    "hostname",
    "env",
    "printenv",
    "pwd",
    "whoami",
    "nnp",
    ":",
    "agnhost",
    "agnhost-2",
    "date",
    "uname",
    "sysctl",
    "ip",
    "id",
    "test",
    "[",
    "[[",
    "ls",
    "mkdir",
    "touch",
    "rm",
    "cp",
    "mv",
    "chmod",
    "wc",
    "grep",
    "egrep",
    "fgrep",
    "head",
    "tail",
    "awk",
    "cut",
    "seq",
    "expr",
    "basename",
    "dirname",
    "tee",
    "sort",
    "uniq",
    "tr",
    "stat",
    "timeout",
    "nohup",
    "kill",
    "wait",
    "trap",
    "export",
    "unset",
    "set",
    "shift",
    "read",
    "cd",
    "exec",
    "hexdump",
    "xxd",
    "od",
    "eval",
    "local",
    "readonly",
    "return",
    "break",
    "continue",
    "source",
    ".",
    "mount",
    "ln",
    "usleep",
    "yes",
    "rmdir",
    "readlink",
    "realpath",
    "md5sum",
    "curl",
    "wget",
    "dig",
    "nslookup",
    "getent",
    "nc",
];

/// Whether the sim's shell has program `cmd` (a shell, or one of busybox's utilities as
/// far as the sim goes).
pub fn knows(cmd: &str) -> bool {
    known(cmd)
}

fn known(cmd: &str) -> bool {
    is_shell(cmd) || UTILITIES.contains(&cmd)
}

/// Most commands one process runs before the sim calls it endless.
const BUDGET: usize = 20_000;
/// How far ahead a process is simulated.
const HORIZON: Duration = Duration::from_secs(6 * 3600);

/// Runs `argv` to its end (or the budget) and returns its steps.
fn run(argv: &[String], ctx: &Context, exec: bool) -> Vec<Step> {
    let mut sh = Sh::new(ctx, exec);
    let io = Io {
        out: Sink::Stream(Stream::Stdout),
        err: Sink::Stream(Stream::Stderr),
        input: ctx
            .stdin
            .as_ref()
            .map(|b| Rc::new(RefCell::new(String::from_utf8_lossy(b).into_owned()))),
    };
    let end = match sh.command(argv, &io) {
        Ok(code) | Err(Flow::Exit(code)) | Err(Flow::Return(code)) => {
            End::Exit(sh.exit_trap(&io, code))
        }
        Err(Flow::Break(_)) | Err(Flow::Continue(_)) => End::Exit(sh.exit_trap(&io, 0)),
        Err(Flow::Forever) => End::Forever,
        Err(Flow::Suspend) => End::Suspend,
    };
    sh.steps(end)
}

/// How control leaves a command other than by finishing.
#[derive(Debug)]
enum Flow {
    Exit(i32),
    Return(i32),
    Break(u32),
    Continue(u32),
    /// The process never ends (or runs past the simulation's budget).
    Forever,
    /// The simulation stops at a network observation still to come (see [`Step::Suspend`]).
    Suspend,
}

/// How a run ended.
enum End {
    Exit(i32),
    Forever,
    Suspend,
}

type R = Result<i32, Flow>;

/// Where a file descriptor writes.
#[derive(Clone)]
enum Sink {
    Stream(Stream),
    Buf(Rc<RefCell<String>>),
    File(String),
    Null,
}

/// A command's standard streams.
#[derive(Clone)]
struct Io {
    out: Sink,
    err: Sink,
    /// What is left to read of its stdin.
    input: Option<Rc<RefCell<String>>>,
}

impl Io {
    fn with_input(&self, text: String) -> Io {
        Io {
            input: Some(Rc::new(RefCell::new(text))),
            ..self.clone()
        }
    }

    /// Takes all of stdin.
    fn read_all(&self) -> String {
        self.input
            .as_ref()
            .map(|i| std::mem::take(&mut *i.borrow_mut()))
            .unwrap_or_default()
    }

    /// Takes one line of stdin (without its newline); `None` at its end.
    fn read_line(&self) -> Option<String> {
        let input = self.input.as_ref()?;
        let mut input = input.borrow_mut();
        if input.is_empty() {
            return None;
        }
        let (line, rest) = match input.find('\n') {
            Some(i) => (input[..i].to_owned(), input[i + 1..].to_owned()),
            None => (input.clone(), String::new()),
        };
        *input = rest;
        Some(line)
    }
}

/// The shell's state.
struct Sh<'a> {
    ctx: &'a Context,
    view: View,
    start: SystemTime,
    vars: HashMap<String, String>,
    exported: Vec<String>,
    funcs: HashMap<String, Rc<Cmd>>,
    positional: Vec<String>,
    status: i32,
    /// Simulated time since start.
    now: Duration,
    /// Output and writes, stamped.
    events: Vec<(Duration, Step)>,
    budget: usize,
    cwd: String,
    exec: bool,
    errexit: bool,
    /// Inside a condition (`if`, `while`, `&&`), where `set -e` does not apply.
    cond: u32,
    /// When the last background job ends.
    bg_end: Duration,
    traps: HashMap<String, String>,
    rng: u64,
    /// How the shell was invoked (`/bin/sh`): its messages start with it.
    argv0: String,
    /// The network observations of this run (replayed ones first), and the next's index.
    observations: Vec<Observation>,
    observed: usize,
    /// Effects (output, file changes) made so far, and how many a resumed run skips.
    effects: usize,
    skip_effects: usize,
}

impl<'a> Sh<'a> {
    fn new(ctx: &'a Context, exec: bool) -> Sh<'a> {
        let view = ctx.view();
        let start = ctx.start.unwrap_or_else(SystemTime::now);
        view.prepare(start);
        let mut vars: HashMap<String, String> = ctx.environ().into_iter().collect();
        vars.insert("PWD".into(), "/".into());
        vars.insert("IFS".into(), " \t\n".into());
        let seed = ctx.hostname.bytes().fold(0x9e37_79b9_7f4a_7c15u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
        Sh {
            ctx,
            view,
            start,
            exported: ctx.environ().into_iter().map(|(k, _)| k).collect(),
            vars,
            funcs: HashMap::new(),
            positional: Vec::new(),
            status: 0,
            now: Duration::ZERO,
            events: Vec::new(),
            budget: BUDGET,
            cwd: "/".into(),
            exec,
            errexit: false,
            cond: 0,
            bg_end: Duration::ZERO,
            traps: HashMap::new(),
            rng: seed,
            argv0: "sh".into(),
            observations: ctx
                .resume
                .as_ref()
                .map(|r| r.observations.clone())
                .unwrap_or_default(),
            observed: 0,
            effects: 0,
            skip_effects: ctx.resume.as_ref().map_or(0, |r| r.effects),
        }
    }

    /// The steps of what ran: output and writes in time order with sleeps between them,
    /// then the exit (or forever).
    fn steps(mut self, end: End) -> Vec<Step> {
        self.events.sort_by_key(|(t, _)| *t);
        let mut steps = Vec::new();
        let mut at = Duration::ZERO;
        for (t, step) in std::mem::take(&mut self.events) {
            if t > at {
                steps.push(Step::Sleep(t - at));
                at = t;
            }
            steps.push(step);
        }
        match end {
            End::Exit(code) => {
                if self.now > at {
                    steps.push(Step::Sleep(self.now - at));
                }
                steps.push(Step::Exit(code));
            }
            End::Forever => steps.push(Step::Forever),
            End::Suspend => {
                if self.now > at {
                    steps.push(Step::Sleep(self.now - at));
                }
                steps.push(Step::Suspend(Resume {
                    observations: self.observations,
                    effects: self.effects,
                }));
            }
        }
        steps
    }

    /// Counts an effect (an output or a file change); `false` when a resumed run made it
    /// already and skips it.
    fn effect(&mut self) -> bool {
        self.effects += 1;
        self.effects > self.skip_effects
    }

    /// Changes the files with `f`, unless a resumed run made the change already.
    fn gated(
        &mut self,
        f: impl FnOnce(&View) -> Result<(), fs::FsError>,
    ) -> Result<(), fs::FsError> {
        if self.effect() {
            f(&self.view)
        } else {
            Ok(())
        }
    }

    /// Whether the last effect counted was made (not skipped by a resumed run).
    fn applied(&self) -> bool {
        self.effects > self.skip_effects
    }

    /// Records `step` at the current time, unless a resumed run skips it.
    fn emit(&mut self, step: Step) {
        if self.effect() {
            self.events.push((self.now, step));
        }
    }

    /// Runs network command `run` as an observation: replayed when a resumed run has it,
    /// suspending when it comes later than the run may look, else run and recorded.
    fn observe(&mut self, io: &Io, run: impl FnOnce(&mut Self, &Io) -> R) -> R {
        let i = self.observed;
        self.observed += 1;
        let replay = |sh: &mut Self, o: &Observation| {
            sh.now += o.took;
            sh.out(io, &o.out);
            sh.err(io, &o.err);
            o.code
        };
        if let Some(o) = self.observations.get(i).cloned() {
            return Ok(replay(self, &o));
        }
        let Some(until) = self.ctx.observe_until else {
            return run(self, io);
        };
        if self.at() > until {
            return Err(Flow::Suspend);
        }
        let (out, err) = (
            Rc::new(RefCell::new(String::new())),
            Rc::new(RefCell::new(String::new())),
        );
        let captured = Io {
            out: Sink::Buf(out.clone()),
            err: Sink::Buf(err.clone()),
            input: io.input.clone(),
        };
        let start = self.now;
        let code = run(self, &captured)?;
        let o = Observation {
            out: std::mem::take(&mut *out.borrow_mut()),
            err: std::mem::take(&mut *err.borrow_mut()),
            code,
            took: self.now.saturating_sub(start),
        };
        self.now = start;
        self.observations.push(o.clone());
        Ok(replay(self, &o))
    }

    fn at(&self) -> SystemTime {
        self.start + self.now
    }

    fn exit_trap(&mut self, io: &Io, code: i32) -> i32 {
        let trap = self.traps.remove("EXIT").or_else(|| self.traps.remove("0"));
        if let Some(script) = trap {
            self.status = code;
            if let Ok(list) = parse::parse(&script) {
                if let Err(Flow::Exit(c)) = self.list(&list, io) {
                    return c;
                }
            }
        }
        code
    }

    fn var(&mut self, name: &str) -> Option<String> {
        match name {
            "?" => Some(self.status.to_string()),
            "$" => Some("1".into()),
            "!" => Some("2".into()),
            "#" => Some(self.positional.len().to_string()),
            "@" | "*" => Some(self.positional.join(" ")),
            "-" => Some(String::new()),
            "0" => Some("sh".into()),
            "RANDOM" => {
                self.rng ^= self.rng << 13;
                self.rng ^= self.rng >> 7;
                self.rng ^= self.rng << 17;
                Some((self.rng % 32768).to_string())
            }
            n if n.chars().all(|c| c.is_ascii_digit()) => n
                .parse::<usize>()
                .ok()
                .and_then(|i| self.positional.get(i.wrapping_sub(1)).cloned()),
            n => self.vars.get(n).cloned(),
        }
    }

    fn write(&mut self, sink: &Sink, text: &str) {
        if text.is_empty() {
            return;
        }
        match sink {
            Sink::Stream(s) => self.emit(Step::Out(*s, text.to_owned())),
            Sink::Buf(b) => b.borrow_mut().push_str(text),
            Sink::File(path) => {
                let at = self.at();
                if !self.effect() {
                    return;
                }
                if self.view.write(path, text, true, at).is_ok() {
                    self.events.push((
                        self.now,
                        Step::Write {
                            path: path.clone(),
                            text: text.to_owned(),
                            append: true,
                        },
                    ));
                }
            }
            Sink::Null => {}
        }
    }

    fn out(&mut self, io: &Io, text: &str) {
        let sink = io.out.clone();
        self.write(&sink, text);
    }

    fn err(&mut self, io: &Io, text: &str) {
        let sink = io.err.clone();
        self.write(&sink, text);
    }

    /// An absolute, normalized path.
    fn path(&self, p: &str) -> String {
        let full = if p.starts_with('/') {
            p.to_owned()
        } else {
            format!("{}/{p}", self.cwd.trim_end_matches('/'))
        };
        let mut parts: Vec<&str> = Vec::new();
        for seg in full.split('/') {
            match seg {
                "" | "." => {}
                ".." => {
                    parts.pop();
                }
                s => parts.push(s),
            }
        }
        format!("/{}", parts.join("/"))
    }

    fn tick(&mut self) -> Result<(), Flow> {
        if self.budget == 0 || self.now > HORIZON {
            return Err(Flow::Forever);
        }
        self.budget -= 1;
        Ok(())
    }

    // ---- execution ----

    fn list(&mut self, list: &List, io: &Io) -> R {
        let mut status = self.status;
        for ao in list {
            if ao.background {
                self.background(ao, io)?;
                status = 0;
                self.status = 0;
            } else {
                status = self.and_or(ao, io)?;
            }
        }
        Ok(status)
    }

    /// Runs `ao` as a background job: from now, on its own clock and budget.
    fn background(&mut self, ao: &AndOr, io: &Io) -> Result<(), Flow> {
        let (now, budget, vars) = (self.now, self.budget, self.vars.clone());
        self.budget = budget.min(BUDGET / 4);
        let r = self.and_or(ao, io);
        let used = BUDGET / 4 - self.budget.min(BUDGET / 4);
        let end = match r {
            Err(Flow::Suspend) => return Err(Flow::Suspend),
            Err(Flow::Forever) => HORIZON,
            _ => self.now,
        };
        self.bg_end = self.bg_end.max(end);
        self.now = now;
        self.budget = budget.saturating_sub(used);
        self.vars = vars;
        Ok(())
    }

    fn and_or(&mut self, ao: &AndOr, io: &Io) -> R {
        let last = ao.rest.len();
        self.cond += u32::from(last > 0);
        let mut status = self.pipeline(&ao.first, io);
        let mut ran_last = last == 0;
        for (k, (and, p)) in ao.rest.iter().enumerate() {
            let s = match status {
                Ok(s) => s,
                Err(_) => break,
            };
            if *and == (s == 0) {
                if k + 1 == last {
                    self.cond -= 1;
                    ran_last = true;
                }
                status = self.pipeline(p, io);
            }
        }
        if !ran_last {
            self.cond -= 1;
        }
        let status = status?;
        if self.errexit && self.cond == 0 && status != 0 && ran_last {
            let neg = ao.rest.last().map_or(ao.first.neg, |(_, p)| p.neg);
            if !neg {
                return Err(Flow::Exit(status));
            }
        }
        Ok(status)
    }

    fn pipeline(&mut self, p: &Pipeline, io: &Io) -> R {
        let mut status;
        if p.cmds.len() == 1 {
            status = self.cmd(&p.cmds[0], io)?;
        } else {
            let mut input = io.input.clone();
            let n = p.cmds.len();
            status = 0;
            for (k, c) in p.cmds.iter().enumerate() {
                let last = k + 1 == n;
                let buf = Rc::new(RefCell::new(String::new()));
                let sub = Io {
                    out: if last {
                        io.out.clone()
                    } else {
                        Sink::Buf(buf.clone())
                    },
                    err: io.err.clone(),
                    input: input.clone(),
                };
                // Every part of a pipeline is a subshell.
                let vars = self.vars.clone();
                status = match self.cmd(c, &sub) {
                    Ok(s) | Err(Flow::Exit(s)) => s,
                    Err(Flow::Forever) => return Err(Flow::Forever),
                    Err(Flow::Suspend) => return Err(Flow::Suspend),
                    Err(_) => 0,
                };
                if !last {
                    self.vars = vars;
                }
                let text = std::mem::take(&mut *buf.borrow_mut());
                input = Some(Rc::new(RefCell::new(text)));
            }
        }
        if p.neg {
            status = i32::from(status == 0);
        }
        self.status = status;
        Ok(status)
    }

    /// `io` with `redirs` applied; `Err` with the shell's message when one fails.
    fn redirect(&mut self, redirs: &[Redir], io: &Io) -> Result<Io, Result<String, Flow>> {
        let mut io = io.clone();
        for r in redirs {
            let target = self.expand_one(&r.target).map_err(Err)?;
            match r.op.as_str() {
                ">" | ">>" => {
                    let sink = match target.as_str() {
                        "/dev/null" => Sink::Null,
                        "/dev/stdout" => io.out.clone(),
                        "/dev/stderr" => io.err.clone(),
                        _ => {
                            let path = self.path(&target);
                            let at = self.at();
                            let append = r.op == ">>";
                            if let Err(e) = self.gated(|v| v.write(&path, "", append, at)) {
                                let why = match e {
                                    fs::FsError::NotFound => "nonexistent directory",
                                    e => e.message(),
                                };
                                return Err(Ok(format!(
                                    "{}: can't create {target}: {why}\n",
                                    self.argv0
                                )));
                            }
                            if !append && self.applied() {
                                self.events.push((
                                    self.now,
                                    Step::Write {
                                        path: path.clone(),
                                        text: String::new(),
                                        append: false,
                                    },
                                ));
                            }
                            Sink::File(path)
                        }
                    };
                    if r.fd == 2 {
                        io.err = sink;
                    } else {
                        io.out = sink;
                    }
                }
                ">&" | "<&" => {
                    let sink = match target.as_str() {
                        "1" => io.out.clone(),
                        "2" => io.err.clone(),
                        "-" => Sink::Null,
                        _ => continue,
                    };
                    match r.fd {
                        1 => io.out = sink,
                        2 => io.err = sink,
                        _ => {}
                    }
                }
                "<" => {
                    let path = self.path(&target);
                    let at = self.at();
                    match self.view.read(&path, at) {
                        Ok(text) => io = io.with_input(text),
                        Err(e) => {
                            return Err(Ok(format!(
                                "{}: can't open '{target}': {}\n",
                                self.argv0,
                                e.message()
                            )))
                        }
                    }
                }
                "<<" => io = io.with_input(target),
                _ => {}
            }
        }
        Ok(io)
    }

    fn with_redirs(&mut self, redirs: &[Redir], io: &Io) -> Result<Result<Io, i32>, Flow> {
        match self.redirect(redirs, io) {
            Ok(io) => Ok(Ok(io)),
            Err(Ok(msg)) => {
                self.err(io, &msg);
                self.status = 1;
                Ok(Err(1))
            }
            Err(Err(flow)) => Err(flow),
        }
    }

    fn in_cond(&mut self, list: &List, io: &Io) -> R {
        self.cond += 1;
        let r = self.list(list, io);
        self.cond -= 1;
        r
    }

    /// Runs a loop body; `Some` when the loop ends with that flow.
    fn body(&mut self, body: &List, io: &Io) -> Result<Option<i32>, Flow> {
        match self.list(body, io) {
            Ok(s) => {
                self.status = s;
                Ok(None)
            }
            Err(Flow::Break(n)) if n > 1 => Err(Flow::Break(n - 1)),
            Err(Flow::Break(_)) => Ok(Some(0)),
            Err(Flow::Continue(n)) if n > 1 => Err(Flow::Continue(n - 1)),
            Err(Flow::Continue(_)) => Ok(None),
            Err(f) => Err(f),
        }
    }

    fn cmd(&mut self, cmd: &Cmd, io: &Io) -> R {
        self.tick()?;
        let status = match cmd {
            Cmd::Simple {
                assigns,
                words,
                redirs,
            } => {
                let mut argv = Vec::new();
                for w in words {
                    argv.extend(self.expand(w)?);
                }
                let mut values = Vec::new();
                self.status = 0;
                for (k, v) in assigns {
                    values.push((k.clone(), self.expand_one(v)?));
                }
                let io = match self.with_redirs(redirs, io)? {
                    Ok(io) => io,
                    Err(code) => return Ok(code),
                };
                if argv.is_empty() {
                    for (k, v) in values {
                        self.vars.insert(k, v);
                    }
                    self.status
                } else {
                    // `NAME=value cmd`: for that command only.
                    let saved: Vec<(String, Option<String>)> = values
                        .iter()
                        .map(|(k, _)| (k.clone(), self.vars.get(k).cloned()))
                        .collect();
                    for (k, v) in values {
                        if !self.exported.contains(&k) {
                            self.exported.push(k.clone());
                        }
                        self.vars.insert(k, v);
                    }
                    let r = self.command(&argv, &io);
                    for (k, old) in saved {
                        match old {
                            Some(v) => {
                                self.vars.insert(k, v);
                            }
                            None => {
                                self.vars.remove(&k);
                            }
                        }
                    }
                    r?
                }
            }
            Cmd::If { arms, els, redirs } => {
                let io = match self.with_redirs(redirs, io)? {
                    Ok(io) => io,
                    Err(code) => return Ok(code),
                };
                let mut status = 0;
                let mut done = false;
                for (cond, body) in arms {
                    if self.in_cond(cond, &io)? == 0 {
                        status = self.list(body, &io)?;
                        done = true;
                        break;
                    }
                }
                if !done {
                    if let Some(e) = els {
                        status = self.list(e, &io)?;
                    }
                }
                status
            }
            Cmd::Loop {
                until,
                cond,
                body,
                redirs,
            } => {
                let io = match self.with_redirs(redirs, io)? {
                    Ok(io) => io,
                    Err(code) => return Ok(code),
                };
                let mut status = 0;
                loop {
                    self.tick()?;
                    let c = self.in_cond(cond, &io)?;
                    if (c == 0) == *until {
                        break;
                    }
                    if self.body(body, &io)?.is_some() {
                        break;
                    }
                    status = self.status;
                }
                status
            }
            Cmd::For {
                var,
                items,
                body,
                redirs,
            } => {
                let io = match self.with_redirs(redirs, io)? {
                    Ok(io) => io,
                    Err(code) => return Ok(code),
                };
                let values = match items {
                    Some(words) => {
                        let mut v = Vec::new();
                        for w in words {
                            v.extend(self.expand(w)?);
                        }
                        v
                    }
                    None => self.positional.clone(),
                };
                let mut status = 0;
                for v in values {
                    self.tick()?;
                    self.vars.insert(var.clone(), v);
                    if self.body(body, &io)?.is_some() {
                        break;
                    }
                    status = self.status;
                }
                status
            }
            Cmd::Case { word, arms, redirs } => {
                let io = match self.with_redirs(redirs, io)? {
                    Ok(io) => io,
                    Err(code) => return Ok(code),
                };
                let subject = self.expand_one(word)?;
                let mut status = 0;
                'arms: for (pats, body) in arms {
                    for p in pats {
                        let pat = self.expand_pattern(p)?;
                        if glob_match(&pat, &subject) {
                            status = self.list(body, &io)?;
                            break 'arms;
                        }
                    }
                }
                status
            }
            Cmd::Group {
                body,
                subshell,
                redirs,
            } => {
                let io = match self.with_redirs(redirs, io)? {
                    Ok(io) => io,
                    Err(code) => return Ok(code),
                };
                if *subshell {
                    let saved = (self.vars.clone(), self.cwd.clone(), self.funcs.clone());
                    let r = self.list(body, &io);
                    (self.vars, self.cwd, self.funcs) = saved;
                    match r {
                        Ok(s) | Err(Flow::Exit(s)) => s,
                        Err(f) => return Err(f),
                    }
                } else {
                    self.list(body, &io)?
                }
            }
            Cmd::Func { name, body } => {
                self.funcs.insert(name.clone(), body.clone());
                0
            }
        };
        self.status = status;
        Ok(status)
    }

    /// Runs a script text (`sh -c`, `eval`, a trap).
    fn script(&mut self, text: &str, io: &Io) -> R {
        match parse::parse(text) {
            Ok(list) => self.list(&list, io),
            Err(e) => {
                let msg = format!("{}: {}\n", self.argv0, e.0);
                self.err(io, &msg);
                Ok(2)
            }
        }
    }

    // ---- expansion ----

    /// The text of `${...}`.
    fn param(&mut self, inner: &str) -> Result<String, Flow> {
        if let Some(name) = inner.strip_prefix('#') {
            if !name.is_empty() {
                return Ok(self
                    .var(name)
                    .unwrap_or_default()
                    .chars()
                    .count()
                    .to_string());
            }
        }
        let end = inner
            .char_indices()
            .find(|(i, c)| {
                !(c.is_ascii_alphanumeric() || *c == '_' || (*i == 0 && "?$#@*!-".contains(*c)))
            })
            .map_or(inner.len(), |(i, _)| i);
        let (name, op) = inner.split_at(end);
        let value = self.var(name);
        let word = |sh: &mut Self, w: &str| -> Result<String, Flow> {
            match parse::quoted_word(w) {
                Ok(w) => sh.expand_one(&w),
                Err(_) => Ok(w.to_owned()),
            }
        };
        let unset_or_empty = value.as_deref().is_none_or(str::is_empty);
        Ok(match op {
            "" => value.unwrap_or_default(),
            _ if op.starts_with(":-") => {
                if unset_or_empty {
                    word(self, &op[2..])?
                } else {
                    value.unwrap_or_default()
                }
            }
            _ if op.starts_with(":=") => {
                if unset_or_empty {
                    let v = word(self, &op[2..])?;
                    self.vars.insert(name.to_owned(), v.clone());
                    v
                } else {
                    value.unwrap_or_default()
                }
            }
            _ if op.starts_with(":+") => {
                if unset_or_empty {
                    String::new()
                } else {
                    word(self, &op[2..])?
                }
            }
            _ if op.starts_with(":?") => value.unwrap_or_default(),
            _ if op.starts_with('-') => match value {
                Some(v) => v,
                None => word(self, &op[1..])?,
            },
            _ if op.starts_with('+') => match value {
                Some(_) => word(self, &op[1..])?,
                None => String::new(),
            },
            _ if op.starts_with("%%") || op.starts_with('%') => {
                let longest = op.starts_with("%%");
                let pat = word(self, op.trim_start_matches('%'))?;
                let v = value.unwrap_or_default();
                let cuts: Vec<usize> = (0..=v.len()).filter(|i| v.is_char_boundary(*i)).collect();
                let found = if longest {
                    cuts.iter().find(|i| glob_match(&pat, &v[**i..]))
                } else {
                    cuts.iter().rev().find(|i| glob_match(&pat, &v[**i..]))
                };
                found.map_or(v.clone(), |i| v[..*i].to_owned())
            }
            _ if op.starts_with('#') => {
                let longest = op.starts_with("##");
                let pat = word(self, op.trim_start_matches('#'))?;
                let v = value.unwrap_or_default();
                let cuts: Vec<usize> = (0..=v.len()).filter(|i| v.is_char_boundary(*i)).collect();
                let found = if longest {
                    cuts.iter().rev().find(|i| glob_match(&pat, &v[..**i]))
                } else {
                    cuts.iter().find(|i| glob_match(&pat, &v[..**i]))
                };
                found.map_or(v.clone(), |i| v[*i..].to_owned())
            }
            _ => value.unwrap_or_default(),
        })
    }

    /// The output of `$(script)`, trailing newlines removed.
    fn substitute(&mut self, script: &str) -> Result<String, Flow> {
        let buf = Rc::new(RefCell::new(String::new()));
        let io = Io {
            out: Sink::Buf(buf.clone()),
            err: Sink::Stream(Stream::Stderr),
            input: None,
        };
        let saved = (self.vars.clone(), self.cwd.clone());
        let status = match self.script(script, &io) {
            Ok(s) | Err(Flow::Exit(s)) => s,
            Err(Flow::Forever) => return Err(Flow::Forever),
            Err(Flow::Suspend) => return Err(Flow::Suspend),
            Err(_) => 0,
        };
        (self.vars, self.cwd) = saved;
        self.status = status;
        let mut out = std::mem::take(&mut *buf.borrow_mut());
        while out.ends_with('\n') {
            out.pop();
        }
        Ok(out)
    }

    fn part(&mut self, p: &Part) -> Result<(String, bool), Flow> {
        Ok(match p {
            Part::Lit(s) => (s.clone(), true),
            Part::Quoted(s) => (s.clone(), true),
            Part::Var(n, q) => (self.var(n).unwrap_or_default(), *q),
            Part::Param(inner, q) => (self.param(inner)?, *q),
            Part::Cmd(script, q) => (self.substitute(script)?, *q),
            Part::Arith(expr, q) => {
                let text = match parse::quoted_word(expr) {
                    Ok(w) => self.expand_one(&w)?,
                    Err(_) => expr.clone(),
                };
                let v = arith(&text, &mut |n| {
                    self.vars.get(n).and_then(|v| v.trim().parse().ok())
                })
                .unwrap_or(0);
                (v.to_string(), *q)
            }
        })
    }

    /// A word's fields: unquoted expansions are split on blanks, unquoted globs matched
    /// against the files.
    fn expand(&mut self, w: &Word) -> Result<Vec<String>, Flow> {
        let mut fields = Vec::new();
        let mut cur = String::new();
        let mut have = false;
        let mut glob = false;
        for p in w {
            let (text, keep) = self.part(p)?;
            if keep {
                if matches!(p, Part::Lit(_)) && text.contains(['*', '?']) {
                    glob = true;
                }
                cur.push_str(&text);
                have = true;
                continue;
            }
            for c in text.chars() {
                if c.is_whitespace() {
                    if have {
                        fields.push(std::mem::take(&mut cur));
                        have = false;
                    }
                } else {
                    cur.push(c);
                    have = true;
                }
            }
        }
        if have {
            fields.push(cur);
        }
        if glob && fields.len() == 1 {
            let matches = self.glob(&fields[0]);
            if !matches.is_empty() {
                return Ok(matches);
            }
        }
        Ok(fields)
    }

    /// A word as one string (assignments, redirection targets, `case`).
    fn expand_one(&mut self, w: &Word) -> Result<String, Flow> {
        let mut s = String::new();
        for p in w {
            s.push_str(&self.part(p)?.0);
        }
        Ok(s)
    }

    /// A `case` pattern: quoted parts match literally.
    fn expand_pattern(&mut self, w: &Word) -> Result<String, Flow> {
        let mut s = String::new();
        for p in w {
            let (text, _) = self.part(p)?;
            if matches!(p, Part::Lit(_)) {
                s.push_str(&text);
            } else {
                for c in text.chars() {
                    if "*?[\\".contains(c) {
                        s.push('\\');
                    }
                    s.push(c);
                }
            }
        }
        Ok(s)
    }

    /// The paths matching a glob in its last component (sorted), relative as written.
    fn glob(&mut self, pattern: &str) -> Vec<String> {
        let (dir, pat) = match pattern.rfind('/') {
            Some(i) => (&pattern[..=i], &pattern[i + 1..]),
            None => ("", pattern),
        };
        if dir.contains(['*', '?']) {
            return Vec::new();
        }
        let at = self.at();
        let abs = self.path(if dir.is_empty() { "." } else { dir });
        let Ok(names) = self.view.list(&abs, at) else {
            return Vec::new();
        };
        names
            .into_iter()
            .filter(|n| !n.starts_with('.') || pat.starts_with('.'))
            .filter(|n| glob_match(pat, n))
            .map(|n| format!("{dir}{n}"))
            .collect()
    }
}

/// Whether `text` matches shell pattern `pat` (`*`, `?`, `[...]`, `\x`).
fn glob_match(pat: &str, text: &str) -> bool {
    let p: Vec<char> = pat.chars().collect();
    let t: Vec<char> = text.chars().collect();
    fn m(p: &[char], t: &[char]) -> bool {
        match p.first() {
            None => t.is_empty(),
            Some('*') => (0..=t.len()).any(|i| m(&p[1..], &t[i..])),
            Some('?') => !t.is_empty() && m(&p[1..], &t[1..]),
            Some('[') => {
                let Some(close) = p.iter().skip(2).position(|c| *c == ']').map(|i| i + 2) else {
                    return t.first() == Some(&'[') && m(&p[1..], &t[1..]);
                };
                let Some(&c) = t.first() else { return false };
                let set = &p[1..close];
                let (neg, set) = match set.first() {
                    Some('!' | '^') => (true, &set[1..]),
                    _ => (false, set),
                };
                let mut hit = false;
                let mut k = 0;
                while k < set.len() {
                    if k + 2 < set.len() && set[k + 1] == '-' {
                        hit |= set[k] <= c && c <= set[k + 2];
                        k += 3;
                    } else {
                        hit |= set[k] == c;
                        k += 1;
                    }
                }
                hit != neg && m(&p[close + 1..], &t[1..])
            }
            Some('\\') if p.len() > 1 => t.first() == Some(&p[1]) && m(&p[2..], &t[1..]),
            Some(c) => t.first() == Some(c) && m(&p[1..], &t[1..]),
        }
    }
    m(&p, &t)
}

/// Evaluates shell arithmetic (`$((...))`, `expr`-like): integers, variables, `+ - * / %`,
/// comparisons, `&& || !`, parentheses.
fn arith(text: &str, var: &mut dyn FnMut(&str) -> Option<i64>) -> Option<i64> {
    #[derive(Clone, Debug, PartialEq)]
    enum T {
        N(i64),
        Op(String),
    }
    let mut toks = Vec::new();
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_digit() {
            let s = i;
            while i < chars.len() && chars[i].is_ascii_alphanumeric() {
                i += 1;
            }
            let lit: String = chars[s..i].iter().collect();
            let n = if let Some(h) = lit.strip_prefix("0x") {
                i64::from_str_radix(h, 16).ok()?
            } else if lit.len() > 1 && lit.starts_with('0') {
                i64::from_str_radix(&lit[1..], 8).ok()?
            } else {
                lit.parse().ok()?
            };
            toks.push(T::N(n));
        } else if c.is_ascii_alphabetic() || c == '_' {
            let s = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let name: String = chars[s..i].iter().collect();
            toks.push(T::N(var(&name).unwrap_or(0)));
        } else {
            let two: String = chars[i..(i + 2).min(chars.len())].iter().collect();
            if ["==", "!=", "<=", ">=", "&&", "||", "<<", ">>"].contains(&two.as_str()) {
                toks.push(T::Op(two));
                i += 2;
            } else {
                toks.push(T::Op(c.to_string()));
                i += 1;
            }
        }
    }
    fn prec(op: &str) -> Option<u8> {
        Some(match op {
            "||" => 1,
            "&&" => 2,
            "==" | "!=" => 3,
            "<" | ">" | "<=" | ">=" => 4,
            "<<" | ">>" => 5,
            "+" | "-" => 6,
            "*" | "/" | "%" => 7,
            _ => return None,
        })
    }
    fn unary(t: &[T], i: &mut usize) -> Option<i64> {
        match t.get(*i)? {
            T::N(n) => {
                *i += 1;
                Some(*n)
            }
            T::Op(o) if o == "-" => {
                *i += 1;
                Some(unary(t, i)?.wrapping_neg())
            }
            T::Op(o) if o == "+" => {
                *i += 1;
                unary(t, i)
            }
            T::Op(o) if o == "!" => {
                *i += 1;
                Some(i64::from(unary(t, i)? == 0))
            }
            T::Op(o) if o == "(" => {
                *i += 1;
                let v = binary(t, i, 0)?;
                if t.get(*i) != Some(&T::Op(")".into())) {
                    return None;
                }
                *i += 1;
                Some(v)
            }
            _ => None,
        }
    }
    fn binary(t: &[T], i: &mut usize, min: u8) -> Option<i64> {
        let mut lhs = unary(t, i)?;
        while let Some(T::Op(op)) = t.get(*i) {
            let Some(p) = prec(op) else { break };
            if p < min {
                break;
            }
            let op = op.clone();
            *i += 1;
            let rhs = binary(t, i, p + 1)?;
            lhs = match op.as_str() {
                "+" => lhs.wrapping_add(rhs),
                "-" => lhs.wrapping_sub(rhs),
                "*" => lhs.wrapping_mul(rhs),
                "/" => lhs.checked_div(rhs)?,
                "%" => lhs.checked_rem(rhs)?,
                "<<" => lhs.wrapping_shl(rhs as u32),
                ">>" => lhs.wrapping_shr(rhs as u32),
                "==" => i64::from(lhs == rhs),
                "!=" => i64::from(lhs != rhs),
                "<" => i64::from(lhs < rhs),
                ">" => i64::from(lhs > rhs),
                "<=" => i64::from(lhs <= rhs),
                ">=" => i64::from(lhs >= rhs),
                "&&" => i64::from(lhs != 0 && rhs != 0),
                "||" => i64::from(lhs != 0 || rhs != 0),
                _ => return None,
            };
        }
        Some(lhs)
    }
    if toks.is_empty() {
        return Some(0);
    }
    let mut i = 0;
    let v = binary(&toks, &mut i, 0)?;
    (i == toks.len()).then_some(v)
}

/// Parses leading `-xyz` flags of `args` (up to `--` or the first operand) into a set of
/// letters; flags in `with_value` take the next word (or the rest of theirs).
fn flags<'x>(
    args: &'x [String],
    with_value: &str,
) -> (Vec<char>, HashMap<char, String>, &'x [String]) {
    let mut set = Vec::new();
    let mut values = HashMap::new();
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        if a == "--" {
            i += 1;
            break;
        }
        if !a.starts_with('-') || a.len() == 1 || a[1..].starts_with(|c: char| c.is_ascii_digit()) {
            break;
        }
        let letters: Vec<char> = a[1..].chars().collect();
        for (k, c) in letters.iter().enumerate() {
            if with_value.contains(*c) {
                let rest: String = letters[k + 1..].iter().collect();
                if rest.is_empty() {
                    i += 1;
                    values.insert(*c, args.get(i).cloned().unwrap_or_default());
                } else {
                    values.insert(*c, rest);
                }
                break;
            }
            set.push(*c);
        }
        i += 1;
    }
    (set, values, &args[i.min(args.len())..])
}

/// Go's `os.FileMode` string of a mode (`-rw-r--r--`, `drwxrwxrwx`).
fn mode_string(mode: u32, dir: bool) -> String {
    let mut s = String::from(if dir { "d" } else { "-" });
    for shift in [6, 3, 0] {
        let b = (mode >> shift) & 7;
        s.push(if b & 4 != 0 { 'r' } else { '-' });
        s.push(if b & 2 != 0 { 'w' } else { '-' });
        s.push(if b & 1 != 0 { 'x' } else { '-' });
    }
    s
}

impl Sh<'_> {
    fn read_file(&self, path: &str) -> Result<String, fs::FsError> {
        self.view.read(&self.path(path), self.at())
    }

    fn stat(&self, path: &str) -> Option<Node> {
        self.view.stat(&self.path(path), self.at())
    }

    /// The text a filter reads: its files (`-` is stdin), or stdin.
    fn inputs(&mut self, name: &str, files: &[String], io: &Io) -> (String, i32) {
        if files.is_empty() {
            return (io.read_all(), 0);
        }
        let mut text = String::new();
        let mut code = 0;
        for f in files {
            if f == "-" {
                text.push_str(&io.read_all());
                continue;
            }
            match self.read_file(f) {
                Ok(t) => text.push_str(&t),
                Err(fs::FsError::IsDir) => {
                    self.err(io, &format!("{name}: read error: Is a directory\n"));
                    code = 1;
                }
                Err(e) => {
                    self.err(io, &format!("{name}: can't open '{f}': {}\n", e.message()));
                    code = 1;
                }
            }
        }
        (text, code)
    }

    /// `test`, `[` and `[[`.
    fn test(&mut self, args: &[String], double: bool) -> Option<bool> {
        fn primary(sh: &mut Sh, a: &[String], i: &mut usize, double: bool) -> Option<bool> {
            let tok = a.get(*i)?.as_str();
            if tok == "!" {
                *i += 1;
                return Some(!primary(sh, a, i, double)?);
            }
            if tok == "(" {
                *i += 1;
                let v = or(sh, a, i, double)?;
                if a.get(*i).map(String::as_str) != Some(")") {
                    return None;
                }
                *i += 1;
                return Some(v);
            }
            // Binary operators.
            if let (Some(op), Some(rhs)) = (a.get(*i + 1), a.get(*i + 2)) {
                let lhs = tok;
                let num = |s: &str| s.trim().parse::<i64>().ok();
                let r = match op.as_str() {
                    "=" | "==" => Some(if double {
                        glob_match(rhs, lhs)
                    } else {
                        lhs == rhs
                    }),
                    "!=" => Some(if double {
                        !glob_match(rhs, lhs)
                    } else {
                        lhs != rhs
                    }),
                    "<" => Some(lhs < rhs.as_str()),
                    ">" => Some(lhs > rhs.as_str()),
                    "=~" => Some(regex::Regex::new(rhs).is_ok_and(|re| re.is_match(lhs))),
                    "-eq" | "-ne" | "-lt" | "-le" | "-gt" | "-ge" => {
                        let (x, y) = (num(lhs)?, num(rhs)?);
                        Some(match op.as_str() {
                            "-eq" => x == y,
                            "-ne" => x != y,
                            "-lt" => x < y,
                            "-le" => x <= y,
                            "-gt" => x > y,
                            _ => x >= y,
                        })
                    }
                    _ => None,
                };
                if let Some(r) = r {
                    *i += 3;
                    return Some(r);
                }
            }
            if tok.len() == 2 && tok.starts_with('-') && a.get(*i + 1).is_some() {
                let arg = a[*i + 1].clone();
                let node = sh.stat(&arg);
                let r = match &tok[1..] {
                    "n" => !arg.is_empty(),
                    "z" => arg.is_empty(),
                    "e" | "r" | "w" => node.is_some(),
                    "x" => match &node {
                        Some(Node::Dir { .. }) => true,
                        Some(Node::File { mode, .. }) => mode & 0o111 != 0,
                        None => false,
                    },
                    "f" => matches!(node, Some(Node::File { .. })),
                    "d" => matches!(node, Some(Node::Dir { .. })),
                    "s" => {
                        matches!(node, Some(Node::File { ref content, .. }) if !content.is_empty())
                    }
                    "L" | "h" | "p" | "S" | "b" | "c" => false,
                    "t" => false,
                    _ => return None,
                };
                *i += 2;
                return Some(r);
            }
            *i += 1;
            Some(!tok.is_empty())
        }
        fn and(sh: &mut Sh, a: &[String], i: &mut usize, double: bool) -> Option<bool> {
            let mut v = primary(sh, a, i, double)?;
            while let Some(op) = a.get(*i) {
                if op == "-a" || (double && op == "&&") {
                    *i += 1;
                    let r = primary(sh, a, i, double)?;
                    v = v && r;
                } else {
                    break;
                }
            }
            Some(v)
        }
        fn or(sh: &mut Sh, a: &[String], i: &mut usize, double: bool) -> Option<bool> {
            let mut v = and(sh, a, i, double)?;
            while let Some(op) = a.get(*i) {
                if op == "-o" || (double && op == "||") {
                    *i += 1;
                    let r = and(sh, a, i, double)?;
                    v = v || r;
                } else {
                    break;
                }
            }
            Some(v)
        }
        if args.is_empty() {
            return Some(false);
        }
        let mut i = 0;
        let v = or(self, args, &mut i, double)?;
        (i == args.len()).then_some(v)
    }

    /// Runs one command (function, builtin or utility) with its arguments expanded.
    fn command(&mut self, argv: &[String], io: &Io) -> R {
        let Some(first) = argv.first() else {
            return Ok(0);
        };
        let args = &argv[1..];
        if let Some(body) = self.funcs.get(first).cloned() {
            let saved = std::mem::replace(&mut self.positional, args.to_vec());
            let r = self.cmd(&body, io);
            self.positional = saved;
            return match r {
                Err(Flow::Return(c)) => Ok(c),
                r => r,
            };
        }
        let name = basename(first);
        if matches!(name, "agnhost" | "agnhost-2") {
            return self.agnhost(argv, io);
        }
        let code_of = |a: Option<&String>, default: i32| {
            a.and_then(|s| s.parse::<i32>().ok())
                .map_or(default, |c| c & 0xff)
        };
        let code = match name {
            _ if is_shell(name) => {
                let (set, _, rest) = flags(args, "");
                let script = if set.contains(&'c') {
                    let Some(s) = rest.first() else {
                        self.err(io, "sh: -c requires an argument\n");
                        return Ok(2);
                    };
                    s.clone()
                } else if let Some(file) = rest.first() {
                    match self.read_file(file) {
                        Ok(s) => s,
                        Err(e) => {
                            self.err(io, &format!("sh: can't open '{file}': {}\n", e.message()));
                            return Ok(2);
                        }
                    }
                } else {
                    io.read_all()
                };
                let positional = if set.contains(&'c') {
                    rest.get(2..).unwrap_or(&[]).to_vec()
                } else {
                    rest.get(1..).unwrap_or(&[]).to_vec()
                };
                let saved = (
                    self.vars.clone(),
                    self.cwd.clone(),
                    self.funcs.clone(),
                    std::mem::replace(&mut self.positional, positional),
                    self.errexit,
                    self.cond,
                    std::mem::replace(&mut self.argv0, first.clone()),
                );
                self.errexit = set.contains(&'e');
                self.cond = 0;
                let r = self.script(&script, io);
                let r = match r {
                    Ok(c) | Err(Flow::Exit(c)) | Err(Flow::Return(c)) => Ok(self.exit_trap(io, c)),
                    Err(Flow::Break(_)) | Err(Flow::Continue(_)) => Ok(0),
                    Err(Flow::Forever) => Err(Flow::Forever),
                    Err(Flow::Suspend) => Err(Flow::Suspend),
                };
                (
                    self.vars,
                    self.cwd,
                    self.funcs,
                    self.positional,
                    self.errexit,
                    self.cond,
                    self.argv0,
                ) = saved;
                r?
            }
            "exit" => return Err(Flow::Exit(code_of(args.first(), self.status))),
            "return" => return Err(Flow::Return(code_of(args.first(), self.status))),
            "break" => return Err(Flow::Break(code_of(args.first(), 1).max(1) as u32)),
            "continue" => return Err(Flow::Continue(code_of(args.first(), 1).max(1) as u32)),
            "true" | ":" => 0,
            "false" => 1,
            "exec" => {
                if args.is_empty() {
                    0
                } else {
                    let r = self.command(args, io);
                    return match r {
                        Ok(c) => Err(Flow::Exit(c)),
                        r => r,
                    };
                }
            }
            "eval" => {
                let text = args.join(" ");
                self.script(&text, io)?
            }
            "source" | "." => match args.first().map(|f| self.read_file(f)) {
                Some(Ok(text)) => self.script(&text, io)?,
                Some(Err(e)) => {
                    self.err(
                        io,
                        &format!("{}: {}: {}\n", self.argv0, args[0], e.message()),
                    );
                    1
                }
                None => 0,
            },
            "export" | "local" | "readonly" => {
                for a in args.iter().filter(|a| !a.starts_with('-')) {
                    let (k, v) = match a.split_once('=') {
                        Some((k, v)) => (k.to_owned(), Some(v.to_owned())),
                        None => (a.clone(), None),
                    };
                    if let Some(v) = v {
                        self.vars.insert(k.clone(), v);
                    }
                    if !self.exported.contains(&k) {
                        self.exported.push(k);
                    }
                }
                0
            }
            "unset" => {
                for a in args.iter().filter(|a| !a.starts_with('-')) {
                    self.vars.remove(a);
                    self.funcs.remove(a);
                }
                0
            }
            "set" => {
                let mut rest = Vec::new();
                let mut positional = false;
                for a in args {
                    if positional {
                        rest.push(a.clone());
                    } else if a == "--" {
                        positional = true;
                    } else if let Some(f) = a.strip_prefix('-') {
                        if f.contains('e') {
                            self.errexit = true;
                        }
                    } else if let Some(f) = a.strip_prefix('+') {
                        if f.contains('e') {
                            self.errexit = false;
                        }
                    } else {
                        positional = true;
                        rest.push(a.clone());
                    }
                }
                if positional {
                    self.positional = rest;
                }
                0
            }
            "shift" => {
                let n = code_of(args.first(), 1).max(0) as usize;
                if n > self.positional.len() {
                    1
                } else {
                    self.positional.drain(..n);
                    0
                }
            }
            "cd" => {
                let target = args
                    .iter()
                    .find(|a| !a.starts_with('-'))
                    .cloned()
                    .unwrap_or_else(|| "/root".into());
                let path = self.path(&target);
                if matches!(self.stat(&path), Some(Node::Dir { .. })) {
                    self.cwd = path.clone();
                    self.vars.insert("PWD".into(), path);
                    0
                } else {
                    let msg = format!(
                        "{}: cd: can't cd to {target}: No such file or directory\n",
                        self.argv0
                    );
                    self.err(io, &msg);
                    2
                }
            }
            "read" => {
                let names: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
                match io.read_line() {
                    Some(line) => {
                        let mut words = line.split_whitespace();
                        for (k, n) in names.iter().enumerate() {
                            let v = if k + 1 == names.len() {
                                words.by_ref().collect::<Vec<_>>().join(" ")
                            } else {
                                words.next().unwrap_or("").to_owned()
                            };
                            self.vars.insert((*n).clone(), v);
                        }
                        if names.is_empty() {
                            self.vars.insert("REPLY".into(), line);
                        }
                        0
                    }
                    None => {
                        for n in names {
                            self.vars.insert(n.clone(), String::new());
                        }
                        1
                    }
                }
            }
            "trap" => {
                if let Some((action, signals)) = args.split_first() {
                    for s in signals {
                        let s = s.trim_start_matches("SIG").to_owned();
                        if action == "-" {
                            self.traps.remove(&s);
                        } else {
                            self.traps.insert(s, action.clone());
                        }
                    }
                }
                0
            }
            "wait" => {
                if self.bg_end >= HORIZON {
                    return Err(Flow::Forever);
                }
                self.now = self.now.max(self.bg_end);
                0
            }
            "kill" => 0,
            "timeout" | "nohup" => {
                let rest = match name {
                    "timeout" => {
                        let (_, _, rest) = flags(args, "sk");
                        rest.get(1..).unwrap_or(&[])
                    }
                    _ => args,
                };
                if rest.is_empty() {
                    1
                } else {
                    self.command(rest, io)?
                }
            }
            "test" => match self.test(args, false) {
                Some(v) => i32::from(!v),
                None => 2,
            },
            "[" => {
                if args.last().map(String::as_str) != Some("]") {
                    self.err(io, "sh: missing ]\n");
                    2
                } else {
                    match self.test(&args[..args.len() - 1], false) {
                        Some(v) => i32::from(!v),
                        None => 2,
                    }
                }
            }
            "[[" => {
                if args.last().map(String::as_str) != Some("]]") {
                    self.err(io, "sh: syntax error: missing ]]\n");
                    2
                } else {
                    match self.test(&args[..args.len() - 1], true) {
                        Some(v) => i32::from(!v),
                        None => 2,
                    }
                }
            }
            "sleep" | "usleep" => {
                let total = if name == "usleep" {
                    args.first()
                        .and_then(|a| a.parse::<f64>().ok())
                        .map(|us| us / 1e6)
                } else {
                    let mut total = 0f64;
                    let mut ok = !args.is_empty();
                    for a in args {
                        if a == "infinity" {
                            return Err(Flow::Forever);
                        }
                        let (n, mult) = match a.chars().last() {
                            Some('s') => (&a[..a.len() - 1], 1.0),
                            Some('m') => (&a[..a.len() - 1], 60.0),
                            Some('h') => (&a[..a.len() - 1], 3600.0),
                            Some('d') => (&a[..a.len() - 1], 86400.0),
                            _ => (a.as_str(), 1.0),
                        };
                        match n.parse::<f64>() {
                            Ok(v) if v.is_finite() && v >= 0.0 => total += v * mult,
                            _ => ok = false,
                        }
                    }
                    ok.then_some(total)
                };
                match total {
                    Some(secs) => {
                        if secs > HORIZON.as_secs_f64() {
                            return Err(Flow::Forever);
                        }
                        self.now += Duration::from_secs_f64(secs);
                        if self.now > HORIZON {
                            return Err(Flow::Forever);
                        }
                        0
                    }
                    None => {
                        self.err(io, "sleep: invalid number\n");
                        1
                    }
                }
            }
            "yes" => return Err(Flow::Forever),
            "curl" | "wget" => {
                return self.observe(io, |sh, io| sh.net_client(name, args, io));
            }
            "nc" => return self.observe(io, |sh, io| Ok(sh.nc(args, io))),
            "dig" | "nslookup" | "getent" => {
                return self.observe(io, |sh, io| Ok(sh.dns_tool(name, args, io)));
            }
            _ => return self.utility(name, args, io),
        };
        Ok(code)
    }

    /// The utilities (busybox applets) the sim has.
    fn utility(&mut self, name: &str, args: &[String], io: &Io) -> R {
        let code = match name {
            "echo" => {
                let mut newline = true;
                let mut escapes = false;
                let mut words = args;
                while let Some(f) = words.first() {
                    if f.len() > 1
                        && f.starts_with('-')
                        && f[1..].chars().all(|c| matches!(c, 'n' | 'e' | 'E'))
                    {
                        newline &= !f.contains('n');
                        escapes = f.contains('e');
                        words = &words[1..];
                    } else {
                        break;
                    }
                }
                let mut s = words.join(" ");
                if escapes {
                    s = printf(&s.replace('%', "%%"), &[]);
                }
                if newline {
                    s.push('\n');
                }
                self.out(io, &s);
                0
            }
            "printf" => {
                if let Some(fmt) = args.first() {
                    let s = printf(fmt, &args[1..]);
                    self.out(io, &s);
                }
                0
            }
            "cat" => {
                let files: Vec<String> = args
                    .iter()
                    .filter(|a| *a == "-" || !a.starts_with('-'))
                    .cloned()
                    .collect();
                if files.is_empty() && io.input.is_none() {
                    if self.exec {
                        return Ok(0);
                    }
                    // Waits on a stdin that never ends.
                    return Err(Flow::Forever);
                }
                let (text, code) = self.inputs("cat", &files, io);
                self.out(io, &text);
                code
            }
            "hostname" => {
                let h = format!("{}\n", self.ctx.hostname);
                self.out(io, &h);
                0
            }
            "pwd" => {
                let d = format!("{}\n", self.cwd);
                self.out(io, &d);
                0
            }
            "whoami" => match self.ctx.user {
                Some((uid, _)) if uid != 0 => {
                    self.err(io, &format!("whoami: unknown uid {uid}\n"));
                    1
                }
                _ => {
                    self.out(io, "root\n");
                    0
                }
            },
            "nnp" => {
                // Setuid root: the effective uid is root's unless no_new_privs holds.
                let uid = match self.ctx.user {
                    Some((u, _)) if self.ctx.no_new_privs => u,
                    _ => 0,
                };
                self.out(io, &format!("Effective uid: {uid}\n"));
                0
            }
            "id" => {
                let (set, _, _) = flags(args, "");
                let (uid, gid) = match self.ctx.user {
                    Some((u, g)) => (u, g.unwrap_or(0)),
                    None => (0, 0),
                };
                // busybox names only root (the images' /etc/passwd and /etc/group).
                let name = |n: i64, what: &str| {
                    if n == 0 {
                        format!("0({what})")
                    } else {
                        n.to_string()
                    }
                };
                let text = if set.contains(&'u') {
                    format!("{uid}\n")
                } else if set.contains(&'g') {
                    format!("{gid}\n")
                } else {
                    let groups = if gid == 0 {
                        "0(root),10(wheel)".to_owned()
                    } else {
                        gid.to_string()
                    };
                    format!(
                        "uid={} gid={} groups={groups}\n",
                        name(uid, "root"),
                        name(gid, "root")
                    )
                };
                self.out(io, &text);
                0
            }
            "env" | "printenv" => {
                let mut env = self.ctx.environ();
                for k in &self.exported {
                    if let Some(v) = self.vars.get(k) {
                        env.retain(|(n, _)| n != k);
                        env.push((k.clone(), v.clone()));
                    }
                }
                if name == "printenv" && !args.is_empty() {
                    let mut code = 0;
                    for a in args {
                        match env.iter().find(|(k, _)| k == a) {
                            Some((_, v)) => {
                                let line = format!("{v}\n");
                                self.out(io, &line);
                            }
                            None => code = 1,
                        }
                    }
                    code
                } else if name == "env" && !args.is_empty() && !args[0].contains('=') {
                    return self.command(args, io);
                } else {
                    let text: String = env.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
                    self.out(io, &text);
                    0
                }
            }
            "date" => {
                let secs = self
                    .at()
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map(|d| d.as_secs() as i64)
                    .unwrap_or_default();
                let ts = k8s_openapi::jiff::Timestamp::from_second(secs).unwrap_or_default();
                let text = match args.first().and_then(|a| a.strip_prefix('+')) {
                    Some("%s") => format!("{secs}\n"),
                    Some(fmt) => format!("{}\n", ts.strftime(fmt)),
                    None => ts.strftime("%a %b %e %H:%M:%S UTC %Y\n").to_string(),
                };
                self.out(io, &text);
                0
            }
            // busybox ip: the pod's interfaces; changing them needs privileges.
            "ip" => {
                let words: Vec<&str> = args.iter().map(String::as_str).collect();
                match words.as_slice() {
                    ["link" | "l", "add" | "set" | "del" | "delete", ..]
                    | ["addr" | "address" | "a", "add" | "del", ..]
                    | ["route" | "r", "add" | "del", ..] => {
                        if self.ctx.privileged {
                            0
                        } else {
                            self.err(io, "ip: RTNETLINK answers: Operation not permitted\n");
                            2
                        }
                    }
                    ["addr" | "address" | "a", ..] => {
                        let text = format!(
                            "1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue qlen 1000\n    link/loopback 00:00:00:00:00:00 brd 00:00:00:00:00:00\n    inet 127.0.0.1/8 scope host lo\n       valid_lft forever preferred_lft forever\n2: eth0@if2: <BROADCAST,MULTICAST,UP,LOWER_UP,M-DOWN> mtu 1500 qdisc noqueue\n    link/ether 02:42:0a:f4:00:02 brd ff:ff:ff:ff:ff:ff\n    inet {}/24 brd 0.0.0.0 scope global eth0\n       valid_lft forever preferred_lft forever\n",
                            self.ctx.pod_ip
                        );
                        self.out(io, &text);
                        0
                    }
                    _ => {
                        self.err(io, "BusyBox v1.37.0 multi-call binary.\n\nUsage: ip [OPTIONS] address|route|link|tunnel|neigh|rule [ARGS]\n");
                        1
                    }
                }
            }
            // Reads /proc/sys, where the kubelet put the pod's namespaced sysctls.
            "sysctl" => {
                let value_only = args.iter().any(|a| a == "-n");
                let mut code = 0;
                for key in args.iter().filter(|a| !a.starts_with('-')) {
                    let path = format!("/proc/sys/{}", key.replace('.', "/"));
                    match self.read_file(&path) {
                        Ok(v) => {
                            let v = v.trim_end();
                            let line = if value_only {
                                format!("{v}\n")
                            } else {
                                format!("{key} = {v}\n")
                            };
                            self.out(io, &line);
                        }
                        Err(_) => {
                            self.err(io, &format!("sysctl: error: '{key}' is an unknown key\n"));
                            code = 1;
                        }
                    }
                }
                code
            }
            "uname" => {
                let text = if args.iter().any(|a| a == "-a") {
                    format!("Linux {} sim x86_64 GNU/Linux\n", self.ctx.hostname)
                } else if args.iter().any(|a| a == "-r") {
                    "6.1.0-sim\n".to_owned()
                } else if args.iter().any(|a| a == "-m") {
                    "x86_64\n".to_owned()
                } else {
                    "Linux\n".to_owned()
                };
                self.out(io, &text);
                0
            }
            "tar" => self.tar(args, io),
            "ls" => {
                let (set, _, paths) = flags(args, "");
                let all = set.contains(&'a');
                let long = set.contains(&'l');
                let paths: Vec<String> = if paths.is_empty() {
                    vec![".".into()]
                } else {
                    paths.to_vec()
                };
                let mut code = 0;
                let many = paths.len() > 1;
                for p in &paths {
                    let abs = self.path(p);
                    let at = self.at();
                    match self.view.stat(&abs, at) {
                        None => {
                            self.err(io, &format!("ls: {p}: No such file or directory\n"));
                            code = 1;
                        }
                        Some(Node::File { mode, content }) => {
                            let line = if long {
                                format!(
                                    "{} 1 root root {} Jan  1 00:00 {p}\n",
                                    mode_string(mode, false),
                                    content.len()
                                )
                            } else {
                                format!("{p}\n")
                            };
                            self.out(io, &line);
                        }
                        Some(Node::Dir { .. }) if set.contains(&'d') => {
                            self.out(io, &format!("{p}\n"));
                        }
                        Some(Node::Dir { .. }) => {
                            let mut names = self.view.list(&abs, at).unwrap_or_default();
                            if all {
                                names.insert(0, "..".into());
                                names.insert(0, ".".into());
                            } else {
                                names.retain(|n| !n.starts_with('.'));
                            }
                            let mut text = String::new();
                            if many {
                                text.push_str(&format!("{p}:\n"));
                            }
                            for n in names {
                                if long {
                                    let child = format!("{}/{n}", abs.trim_end_matches('/'));
                                    let (m, d, len) = match self.view.stat(&child, at) {
                                        Some(Node::File { mode, content }) => {
                                            (mode, false, content.len())
                                        }
                                        Some(Node::Dir { mode }) => (mode, true, 4096),
                                        None => (0o755, true, 4096),
                                    };
                                    text.push_str(&format!(
                                        "{} 1 root root {len} Jan  1 00:00 {n}\n",
                                        mode_string(m, d)
                                    ));
                                } else {
                                    text.push_str(&n);
                                    text.push('\n');
                                }
                            }
                            self.out(io, &text);
                        }
                    }
                }
                code
            }
            "mkdir" => {
                let (set, _, paths) = flags(args, "m");
                let mut code = 0;
                for p in paths {
                    let abs = self.path(p);
                    let at = self.at();
                    if let Err(e) = self.gated(|v| v.mkdir(&abs, set.contains(&'p'), at)) {
                        self.err(
                            io,
                            &format!("mkdir: can't create directory '{p}': {}\n", e.message()),
                        );
                        code = 1;
                    }
                }
                code
            }
            "rmdir" | "rm" => {
                let (set, _, paths) = flags(args, "");
                let recursive = set.contains(&'r') || set.contains(&'R') || name == "rmdir";
                let mut code = 0;
                for p in paths {
                    let abs = self.path(p);
                    let at = self.at();
                    match self.gated(|v| v.remove(&abs, recursive, at)) {
                        Ok(()) => {}
                        Err(fs::FsError::NotFound) if set.contains(&'f') => {}
                        Err(e) => {
                            self.err(
                                io,
                                &format!("{name}: can't remove '{p}': {}\n", e.message()),
                            );
                            code = 1;
                        }
                    }
                }
                code
            }
            "touch" => {
                let (_, _, paths) = flags(args, "dtr");
                let mut code = 0;
                for p in paths {
                    let abs = self.path(p);
                    let at = self.at();
                    if let Err(e) = self.gated(|v| v.write(&abs, "", true, at)) {
                        if e != fs::FsError::IsDir {
                            self.err(io, &format!("touch: {p}: {}\n", e.message()));
                            code = 1;
                        }
                    }
                }
                code
            }
            "cp" | "mv" | "ln" => {
                let (_, _, paths) = flags(args, "");
                let [src, dst] = paths else {
                    self.err(io, &format!("{name}: missing operand\n"));
                    return Ok(1);
                };
                match self.read_file(src) {
                    Ok(text) => {
                        let mut to = self.path(dst);
                        if matches!(self.stat(&to), Some(Node::Dir { .. })) {
                            to = format!("{}/{}", to.trim_end_matches('/'), basename(src));
                        }
                        let at = self.at();
                        match self.gated(|v| v.write(&to, &text, false, at)) {
                            Ok(()) => {
                                if name == "mv" {
                                    let from = self.path(src);
                                    let _ = self.gated(|v| v.remove(&from, false, at));
                                }
                                0
                            }
                            Err(e) => {
                                self.err(
                                    io,
                                    &format!("{name}: can't create '{dst}': {}\n", e.message()),
                                );
                                1
                            }
                        }
                    }
                    Err(e) => {
                        self.err(
                            io,
                            &format!("{name}: can't stat '{src}': {}\n", e.message()),
                        );
                        1
                    }
                }
            }
            "chmod" => {
                let (_, _, rest) = flags(args, "");
                let Some((mode, paths)) = rest.split_first() else {
                    return Ok(1);
                };
                let Ok(mode) = u32::from_str_radix(mode, 8) else {
                    return Ok(0);
                };
                let mut code = 0;
                for p in paths {
                    let abs = self.path(p);
                    let at = self.at();
                    if let Err(e) = self.gated(|v| v.chmod(&abs, mode, at)) {
                        self.err(io, &format!("chmod: {p}: {}\n", e.message()));
                        code = 1;
                    }
                }
                code
            }
            "stat" => {
                let (_, values, paths) = flags(args, "c");
                let mut code = 0;
                for p in paths {
                    match self.stat(p) {
                        None => {
                            self.err(
                                io,
                                &format!("stat: can't stat '{p}': No such file or directory\n"),
                            );
                            code = 1;
                        }
                        Some(node) => {
                            let (mode, dir, size) = match &node {
                                Node::File { mode, content } => (*mode, false, content.len()),
                                Node::Dir { mode } => (*mode, true, 4096),
                            };
                            let fmt = values.get(&'c').cloned().unwrap_or_else(|| "%n".into());
                            let text = fmt
                                .replace("%a", &format!("{mode:o}"))
                                .replace("%A", &mode_string(mode, dir))
                                .replace("%s", &size.to_string())
                                .replace("%U", "root")
                                .replace("%G", "root")
                                .replace("%u", "0")
                                .replace("%g", "0")
                                .replace("%F", if dir { "directory" } else { "regular file" })
                                .replace("%n", p);
                            self.out(io, &format!("{text}\n"));
                        }
                    }
                }
                code
            }
            "readlink" | "realpath" => {
                let (_, _, paths) = flags(args, "");
                for p in paths {
                    let abs = format!("{}\n", self.path(p));
                    self.out(io, &abs);
                }
                0
            }
            "mount" => {
                // `mount -t TYPE` lists the mounts of that type only.
                let only = args
                    .iter()
                    .position(|a| a == "-t")
                    .and_then(|i| args.get(i + 1))
                    .cloned();
                let mut text = String::new();
                // The container's cgroup (v2) tree, as runc mounts it.
                text.push_str(
                    "cgroup2 on /sys/fs/cgroup type cgroup2 (rw,nosuid,nodev,noexec,relatime)\n",
                );
                for m in self.view.mounts.clone() {
                    let kind = match &m.source {
                        fs::Source::EmptyDir(_) if m.tmpfs => "tmpfs",
                        fs::Source::Files(_) => "tmpfs",
                        _ => "ext4",
                    };
                    let mode = if m.read_only { "ro" } else { "rw" };
                    text.push_str(&format!(
                        "{kind} on {} type {kind} ({mode},relatime)\n",
                        m.path
                    ));
                }
                if let Some(t) = only {
                    let wanted = format!(" type {t} ");
                    text = text
                        .lines()
                        .filter(|l| l.contains(&wanted))
                        .map(|l| format!("{l}\n"))
                        .collect();
                    if text.is_empty() {
                        return Ok(1);
                    }
                }
                self.out(io, &text);
                0
            }
            "wc" => {
                let (set, _, files) = flags(args, "");
                let (text, code) = self.inputs("wc", files, io);
                let lines = text.matches('\n').count();
                let words = text.split_whitespace().count();
                let bytes = text.len();
                let mut cols = Vec::new();
                if set.is_empty() {
                    cols = vec![lines, words, bytes];
                } else {
                    if set.contains(&'l') {
                        cols.push(lines);
                    }
                    if set.contains(&'w') {
                        cols.push(words);
                    }
                    if set.contains(&'c') || set.contains(&'m') {
                        cols.push(bytes);
                    }
                }
                let mut line = if cols.len() == 1 {
                    cols[0].to_string()
                } else {
                    cols.iter()
                        .map(|c| format!("{c:>7}"))
                        .collect::<Vec<_>>()
                        .join(" ")
                };
                if files.len() == 1 {
                    line.push(' ');
                    line.push_str(&files[0]);
                }
                line.push('\n');
                self.out(io, &line);
                code
            }
            "grep" | "egrep" | "fgrep" => {
                let (set, values, rest) = flags(args, "em");
                let (pattern, files) = match values.get(&'e') {
                    Some(p) => (p.clone(), rest),
                    None => match rest.split_first() {
                        Some((p, f)) => (p.clone(), f),
                        None => {
                            self.err(io, "grep: no pattern\n");
                            return Ok(2);
                        }
                    },
                };
                let fixed = set.contains(&'F') || name == "fgrep";
                let extended = set.contains(&'E') || name == "egrep";
                let mut re = if fixed {
                    regex::escape(&pattern)
                } else if extended {
                    pattern.clone()
                } else {
                    bre_to_ere(&pattern)
                };
                if set.contains(&'x') {
                    re = format!("^(?:{re})$");
                } else if set.contains(&'w') {
                    re = format!(r"\b(?:{re})\b");
                }
                if set.contains(&'i') {
                    re = format!("(?i){re}");
                }
                let Ok(re) = regex::Regex::new(&re) else {
                    self.err(io, &format!("grep: bad regex '{pattern}'\n"));
                    return Ok(2);
                };
                let (text, code) = self.inputs("grep", files, io);
                let invert = set.contains(&'v');
                let mut count = 0;
                let mut out = String::new();
                for (n, line) in text.lines().enumerate() {
                    if re.is_match(line) != invert {
                        count += 1;
                        if set.contains(&'o') && !invert {
                            for m in re.find_iter(line) {
                                out.push_str(m.as_str());
                                out.push('\n');
                            }
                        } else {
                            if set.contains(&'n') {
                                out.push_str(&format!("{}:", n + 1));
                            }
                            out.push_str(line);
                            out.push('\n');
                        }
                    }
                }
                if set.contains(&'c') {
                    out = format!("{count}\n");
                }
                if !set.contains(&'q') {
                    self.out(io, &out);
                }
                if code != 0 {
                    2
                } else {
                    i32::from(count == 0)
                }
            }
            "head" | "tail" => {
                let (set, values, mut files) = flags(args, "nc");
                if name == "tail" && set.contains(&'f') {
                    let (text, _) = self.inputs(name, files, io);
                    let out = text
                        .lines()
                        .rev()
                        .take(10)
                        .collect::<Vec<_>>()
                        .into_iter()
                        .rev()
                        .map(|l| format!("{l}\n"))
                        .collect::<String>();
                    self.out(io, &out);
                    return Err(Flow::Forever);
                }
                let mut n: Option<String> = values.get(&'n').cloned();
                if let Some(f) = files.first().filter(|f| f.starts_with('-') && f.len() > 1) {
                    n = Some(f[1..].to_owned());
                    files = &files[1..];
                }
                let (text, code) = self.inputs(name, files, io);
                let spec = n.unwrap_or_else(|| "10".into());
                let lines: Vec<&str> = text.split_inclusive('\n').collect();
                let out: String = if name == "head" {
                    let k = spec.parse::<usize>().unwrap_or(10);
                    lines.iter().take(k).copied().collect()
                } else if let Some(from) = spec.strip_prefix('+') {
                    let k = from.parse::<usize>().unwrap_or(1).max(1);
                    lines.iter().skip(k - 1).copied().collect()
                } else {
                    let k = spec.parse::<usize>().unwrap_or(10);
                    lines[lines.len().saturating_sub(k)..].concat()
                };
                self.out(io, &out);
                code
            }
            "awk" => {
                let (_, values, rest) = flags(args, "Fv");
                let Some((prog, files)) = rest.split_first() else {
                    return Ok(2);
                };
                let sep = values.get(&'F').cloned();
                let (text, code) = self.inputs("awk", files, io);
                let out = awk(prog, sep.as_deref(), &text);
                self.out(io, &out);
                code
            }
            "cut" => {
                let (_, values, files) = flags(args, "dfc");
                let (text, code) = self.inputs("cut", files, io);
                let delim = values
                    .get(&'d')
                    .and_then(|d| d.chars().next())
                    .unwrap_or('\t');
                let fields: Vec<usize> = values
                    .get(&'f')
                    .map(|f| f.split(',').filter_map(|n| n.parse().ok()).collect())
                    .unwrap_or_default();
                let mut out = String::new();
                for line in text.lines() {
                    let parts: Vec<&str> = line.split(delim).collect();
                    let picked: Vec<&str> = fields
                        .iter()
                        .filter_map(|f| parts.get(f.wrapping_sub(1)).copied())
                        .collect();
                    out.push_str(&picked.join(&delim.to_string()));
                    out.push('\n');
                }
                self.out(io, &out);
                code
            }
            "tr" => {
                let (set, _, rest) = flags(args, "");
                let text = io.read_all();
                let expand_set = |s: &str| -> Vec<char> {
                    let c: Vec<char> = s.chars().collect();
                    let mut out = Vec::new();
                    let mut i = 0;
                    while i < c.len() {
                        if c[i] == '\\' && i + 1 < c.len() {
                            out.push(match c[i + 1] {
                                'n' => '\n',
                                't' => '\t',
                                o => o,
                            });
                            i += 2;
                        } else if i + 2 < c.len() && c[i + 1] == '-' {
                            let (a, b) = (c[i] as u32, c[i + 2] as u32);
                            out.extend((a..=b).filter_map(char::from_u32));
                            i += 3;
                        } else {
                            out.push(c[i]);
                            i += 1;
                        }
                    }
                    out
                };
                let from = expand_set(rest.first().map_or("", String::as_str));
                let out: String = if set.contains(&'d') {
                    text.chars().filter(|c| !from.contains(c)).collect()
                } else {
                    let to = expand_set(rest.get(1).map_or("", String::as_str));
                    text.chars()
                        .map(|c| match from.iter().position(|f| *f == c) {
                            Some(i) => to.get(i).or(to.last()).copied().unwrap_or(c),
                            None => c,
                        })
                        .collect()
                };
                self.out(io, &out);
                0
            }
            "sort" | "uniq" => {
                let (set, _, files) = flags(args, "");
                let (text, code) = self.inputs(name, files, io);
                let mut lines: Vec<&str> = text.lines().collect();
                if name == "sort" {
                    if set.contains(&'n') {
                        lines.sort_by_key(|l| l.trim().parse::<i64>().unwrap_or(0));
                    } else {
                        lines.sort();
                    }
                    if set.contains(&'r') {
                        lines.reverse();
                    }
                }
                if name == "uniq" || set.contains(&'u') {
                    lines.dedup();
                }
                let out: String = lines.iter().map(|l| format!("{l}\n")).collect();
                self.out(io, &out);
                code
            }
            "seq" => {
                let nums: Vec<i64> = args.iter().filter_map(|a| a.parse().ok()).collect();
                let (from, step, to) = match nums.as_slice() {
                    [to] => (1, 1, *to),
                    [from, to] => (*from, 1, *to),
                    [from, step, to] => (*from, *step, *to),
                    _ => return Ok(1),
                };
                let mut out = String::new();
                let mut i = from;
                let mut n = 0;
                while step != 0 && ((step > 0 && i <= to) || (step < 0 && i >= to)) && n < 100_000 {
                    out.push_str(&format!("{i}\n"));
                    i += step;
                    n += 1;
                }
                self.out(io, &out);
                0
            }
            "expr" => {
                let r = expr(args);
                match r {
                    Some(v) => {
                        let zero = v == "0" || v.is_empty();
                        self.out(io, &format!("{v}\n"));
                        i32::from(zero)
                    }
                    None => {
                        self.err(io, "expr: syntax error\n");
                        2
                    }
                }
            }
            "basename" => {
                let b = args.first().map_or("", |a| {
                    let t = a.trim_end_matches('/');
                    t.rsplit('/').next().unwrap_or(t)
                });
                let b = match args.get(1) {
                    Some(suffix) if b.ends_with(suffix.as_str()) && b != suffix => {
                        &b[..b.len() - suffix.len()]
                    }
                    _ => b,
                };
                self.out(io, &format!("{b}\n"));
                0
            }
            "dirname" => {
                let a = args
                    .first()
                    .map_or("", String::as_str)
                    .trim_end_matches('/');
                let d = match a.rfind('/') {
                    Some(0) => "/",
                    Some(i) => &a[..i],
                    None => ".",
                };
                self.out(io, &format!("{d}\n"));
                0
            }
            "tee" => {
                let (set, _, files) = flags(args, "");
                let text = io.read_all();
                let mut code = 0;
                for f in files {
                    let abs = self.path(f);
                    let at = self.at();
                    match self.gated(|v| v.write(&abs, &text, set.contains(&'a'), at)) {
                        Ok(()) if !self.applied() => {}
                        Ok(()) => self.events.push((
                            self.now,
                            Step::Write {
                                path: abs,
                                text: text.clone(),
                                append: set.contains(&'a'),
                            },
                        )),
                        Err(e) => {
                            self.err(io, &format!("tee: {f}: {}\n", e.message()));
                            code = 1;
                        }
                    }
                }
                self.out(io, &text);
                code
            }
            "hexdump" | "xxd" | "od" => {
                let (_, _, files) = flags(args, "");
                let (text, code) = self.inputs(name, files, io);
                let out = hexdump(&file_bytes(&text));
                self.out(io, &out);
                code
            }
            "md5sum" => {
                let (text, code) = self.inputs("md5sum", args, io);
                let d =
                    ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, text.as_bytes());
                let hex: String = d
                    .as_ref()
                    .iter()
                    .take(16)
                    .map(|b| format!("{b:02x}"))
                    .collect();
                self.out(
                    io,
                    &format!("{hex}  {}\n", args.first().map_or("-", String::as_str)),
                );
                code
            }
            _ => {
                let msg = format!("{}: {name}: not found\n", self.argv0);
                self.err(io, &msg);
                127
            }
        };
        Ok(code)
    }

    /// agnhost, the e2e tests' image: `entrypoint-tester` prints its command line,
    /// `pause` says so and waits, `logs-generator` writes klog lines over a duration,
    /// `mounttest` reports on files; its other commands (servers) run until stopped.
    fn agnhost(&mut self, argv: &[String], io: &Io) -> R {
        let flag = |long: &str, short: &str| {
            argv.iter()
                .position(|a| a == long || a == short)
                .and_then(|i| argv.get(i + 1))
                .map(String::as_str)
                .or_else(|| {
                    argv.iter()
                        .find_map(|a| a.strip_prefix(&format!("{long}=")))
                })
        };
        match argv.get(1).map(String::as_str) {
            Some("entrypoint-tester") => {
                let line = format!("[{}]\n", argv.join(" "));
                self.out(io, &line);
                Ok(0)
            }
            Some("pause") | None => {
                self.out(io, "Paused\nSignals registered\n");
                Err(Flow::Forever)
            }
            Some("logs-generator") => {
                let total: u32 = flag("--log-lines-total", "-t")
                    .and_then(|t| t.parse().ok())
                    .ok_or(Flow::Forever)?;
                let duration = flag("--run-duration", "-d")
                    .and_then(go_duration)
                    .ok_or(Flow::Forever)?;
                let delay = duration / total.max(1);
                let methods = ["GET", "POST", "PUT"];
                let namespaces = ["kube-system", "default", "ns"];
                for id in 0..total.min(100_000) {
                    let i = id as usize;
                    let pod: String = (0..3 + i % 2)
                        .map(|k| char::from(b'a' + ((i * 7 + k * 13) % 26) as u8))
                        .collect();
                    let line = format!(
                        "I0000 00:00:00.000000       1 logs_generator.go:76] {id} {} /api/v1/namespaces/{}/pods/{pod} {}\n",
                        methods[i % 3],
                        namespaces[(i / 3 + i) % 3],
                        200 + (i * 37) % 400
                    );
                    self.err(io, &line);
                    self.now += delay;
                }
                Ok(0)
            }
            Some("mounttest") => self.mounttest(argv, io),
            Some("mtlsclient") => {
                let flags: HashMap<String, String> = [
                    "--fetch-url",
                    "--server-trust-bundle",
                    "--client-cred-bundle",
                ]
                .iter()
                .filter_map(|f| Some(((*f).to_owned(), flag(f, f)?.to_owned())))
                .collect();
                self.mtlsclient(|f| flags.get(f).cloned(), io)
            }
            Some(which @ ("dns-suffix" | "dns-server-list")) => {
                // agnhost reads the first line that starts with the keyword.
                let keyword = if which == "dns-suffix" {
                    "search"
                } else {
                    "nameserver"
                };
                let conf = self.read_file("/etc/resolv.conf").unwrap_or_default();
                match conf.lines().find(|l| l.starts_with(keyword)) {
                    Some(line) => {
                        let words: Vec<&str> = line.split(' ').skip(1).collect();
                        self.out(io, &format!("{}\n", words.join(",")));
                        Ok(0)
                    }
                    None => {
                        self.err(io, "panic: Could not find DNS search list!\n");
                        Ok(2)
                    }
                }
            }
            Some("etc-hosts") => match self.read_file("/etc/hosts") {
                Ok(text) => {
                    self.out(io, &text);
                    Ok(0)
                }
                Err(_) => Ok(1),
            },
            _ => Err(Flow::Forever),
        }
    }

    /// busybox `tar` as `kubectl cp` runs it: `tar cf - PATH...` writes an archive of the
    /// paths to stdout (members named without their leading `/`, directories with what
    /// they hold) to copy out of a container; `tar xmf - [-C DIR]` unpacks the archive on
    /// stdin to copy into one.
    fn tar(&mut self, args: &[String], io: &Io) -> i32 {
        let mut create = false;
        let mut extract = false;
        let mut file: Option<String> = None;
        let mut dir: Option<String> = None;
        let mut paths = Vec::new();
        let mut i = 0;
        while i < args.len() {
            let a = &args[i];
            i += 1;
            // The first word's letters are options even without a dash (`tar cf - x`).
            // GNU tar's long options kubectl may add (`--no-same-owner`): no owners here.
            if a.starts_with("--no-same-") {
                continue;
            }
            let letters = match a.strip_prefix('-') {
                Some(l) if !l.is_empty() && !l.starts_with('-') => Some(l),
                None if i == 1 => Some(a.as_str()),
                _ => None,
            };
            let Some(letters) = letters else {
                paths.push(a.clone());
                continue;
            };
            for c in letters.chars() {
                match c {
                    'c' => create = true,
                    'x' => extract = true,
                    'f' => {
                        file = args.get(i).cloned();
                        i += 1;
                    }
                    'C' => {
                        dir = args.get(i).cloned();
                        i += 1;
                    }
                    'v' | 'm' | 'o' | 'p' => {}
                    other => {
                        let msg = format!("tar: invalid option -- '{other}'\n");
                        self.err(io, &msg);
                        return 1;
                    }
                }
            }
        }
        if create == extract || file.as_deref().is_some_and(|f| f != "-") {
            // Archives in files are not simulated.
            self.err(
                io,
                "tar: only 'tar c' to stdout and 'tar x' from stdin are simulated\n",
            );
            return 1;
        }
        if extract {
            let base = dir.map_or_else(|| self.cwd.clone(), |d| self.path(&d));
            return self.untar(&base, io);
        }
        if paths.is_empty() {
            self.err(io, "tar: empty archive\n");
            return 1;
        }
        let base = dir.map_or_else(|| self.cwd.clone(), |d| self.path(&d));
        let at = self.at();
        let mut builder = tar::Builder::new(Vec::new());
        let mut code = 0;
        let mut warned = false;
        for p in &paths {
            let abs = if p.starts_with('/') {
                p.clone()
            } else {
                format!("{}/{p}", base.trim_end_matches('/'))
            };
            let name = if p.starts_with('/') {
                if !warned {
                    self.err(io, "tar: removing leading '/' from member names\n");
                    warned = true;
                }
                p.trim_start_matches('/').to_owned()
            } else {
                p.clone()
            };
            let mut stack = vec![(abs, name)];
            while let Some((abs, name)) = stack.pop() {
                match self.view.stat(&abs, at) {
                    None => {
                        self.err(io, &format!("tar: {name}: No such file or directory\n"));
                        code = 1;
                    }
                    Some(fs::Node::File { content, mode }) => {
                        let mut h = tar::Header::new_ustar();
                        h.set_size(content.len() as u64);
                        h.set_mode(mode);
                        h.set_mtime(
                            at.duration_since(std::time::UNIX_EPOCH)
                                .map_or(0, |d| d.as_secs()),
                        );
                        h.set_entry_type(tar::EntryType::Regular);
                        if builder
                            .append_data(&mut h, &name, content.as_bytes())
                            .is_err()
                        {
                            code = 1;
                        }
                    }
                    Some(fs::Node::Dir { mode }) => {
                        let mut h = tar::Header::new_ustar();
                        h.set_size(0);
                        h.set_mode(mode);
                        h.set_entry_type(tar::EntryType::Directory);
                        let dir_name = format!("{}/", name.trim_end_matches('/'));
                        if builder
                            .append_data(&mut h, &dir_name, std::io::empty())
                            .is_err()
                        {
                            code = 1;
                        }
                        let mut children = self.view.list(&abs, at).unwrap_or_default();
                        children.reverse();
                        for c in children {
                            stack.push((
                                format!("{}/{c}", abs.trim_end_matches('/')),
                                format!("{}/{c}", name.trim_end_matches('/')),
                            ));
                        }
                    }
                }
            }
        }
        match builder.into_inner() {
            Ok(bytes) => {
                // Headers are ASCII and the sim's files are text: the archive is UTF-8.
                let text = String::from_utf8_lossy(&bytes).into_owned();
                self.out(io, &text);
            }
            Err(_) => code = 1,
        }
        code
    }

    /// Unpacks the archive on stdin under `base` (directories made as needed).
    fn untar(&mut self, base: &str, io: &Io) -> i32 {
        let input = io.read_all();
        let mut archive = tar::Archive::new(input.as_bytes());
        let Ok(entries) = archive.entries() else {
            self.err(io, "tar: invalid tar magic\n");
            return 1;
        };
        let at = self.at();
        let mut code = 0;
        for entry in entries {
            let Ok(mut entry) = entry else {
                self.err(io, "tar: short read\n");
                return 1;
            };
            let Ok(name) = entry.path().map(|p| p.display().to_string()) else {
                continue;
            };
            let abs = self.path(&format!("{}/{name}", base.trim_end_matches('/')));
            let kind = entry.header().entry_type();
            let result = if kind.is_dir() {
                self.gated(|v| v.mkdir(&abs, true, at))
            } else if kind.is_file() {
                let mut bytes = Vec::new();
                let _ = std::io::Read::read_to_end(&mut entry, &mut bytes);
                let text = String::from_utf8_lossy(&bytes).into_owned();
                let parent = abs.rsplit_once('/').map_or("/", |(p, _)| p).to_owned();
                self.gated(|v| {
                    if !parent.is_empty() {
                        v.mkdir(&parent, true, at)?;
                    }
                    v.write(&abs, &text, false, at)
                })
            } else {
                Ok(())
            };
            if let Err(e) = result {
                self.err(
                    io,
                    &format!("tar: can't create '{name}': {}\n", e.message()),
                );
                code = 1;
            }
        }
        code
    }

    /// agnhost's `mounttest`, in its order: fs type, new files, mode, perms, owner,
    /// content, content in a loop.
    fn mounttest(&mut self, argv: &[String], io: &Io) -> R {
        let get = |k: &str| -> Option<String> {
            let long = format!("--{k}");
            argv.iter()
                .position(|a| *a == long)
                .and_then(|i| argv.get(i + 1).cloned())
                .or_else(|| {
                    argv.iter()
                        .find_map(|a| a.strip_prefix(&format!("{long}=")).map(str::to_owned))
                })
                .filter(|v| !v.is_empty())
        };
        let mut failed = false;
        if let Some(p) = get("fs_type") {
            let abs = self.path(&p);
            let tmpfs = self
                .view
                .mounts
                .iter()
                .filter(|m| {
                    abs == m.path || abs.starts_with(&format!("{}/", m.path.trim_end_matches('/')))
                })
                .max_by_key(|m| m.path.len())
                .is_some_and(|m| m.tmpfs || matches!(m.source, fs::Source::Files(_)));
            let kind = if tmpfs { "tmpfs" } else { "61267" };
            self.out(io, &format!("mount type of {p:?}: {kind}\n"));
        }
        const INITIAL: &str = "mount-tester new file\n";
        for (flag, mode) in [
            ("new_file_0644", 0o644),
            ("new_file_0666", 0o666),
            ("new_file_0660", 0o660),
            ("new_file_0777", 0o777),
        ] {
            if let Some(p) = get(flag) {
                let abs = self.path(&p);
                let at = self.at();
                match self.gated(|v| v.write(&abs, INITIAL, false, at)) {
                    Ok(()) => {
                        let _ = self.gated(|v| v.chmod(&abs, mode, at));
                        self.out(io, &format!("content of file {p:?}: {INITIAL}\n"));
                    }
                    Err(e) => {
                        self.out(
                            io,
                            &format!(
                                "error writing new file {p:?}: open {p}: {}\n",
                                e.message().to_lowercase()
                            ),
                        );
                        failed = true;
                    }
                }
            }
        }
        for (flag, perm) in [("file_mode", false), ("file_perm", true)] {
            if let Some(p) = get(flag) {
                match self.stat(&p) {
                    Some(node) => {
                        let (mode, dir) = match node {
                            Node::File { mode, .. } => (mode, false),
                            Node::Dir { mode } => (mode, true),
                        };
                        let text = if perm {
                            format!("perms of file {p:?}: {}\n", mode_string(mode, false))
                        } else {
                            format!("mode of file {p:?}: {}\n", mode_string(mode, dir))
                        };
                        self.out(io, &text);
                    }
                    None => {
                        self.out(
                            io,
                            &format!(
                                "error from Stat({p:?}): stat {p}: no such file or directory\n"
                            ),
                        );
                        failed = true;
                    }
                }
            }
        }
        if let Some(p) = get("file_owner") {
            if self.stat(&p).is_some() {
                self.out(
                    io,
                    &format!("owner UID of {p:?}: 0\nowner GID of {p:?}: 0\n"),
                );
            } else {
                failed = true;
            }
        }
        if let Some(p) = get("file_content") {
            match self.read_file(&p) {
                Ok(text) => self.out(io, &format!("content of file {p:?}: {text}\n")),
                Err(e) => {
                    self.out(
                        io,
                        &format!(
                            "error reading file content for {p:?}: open {p}: {}\n",
                            e.message().to_lowercase()
                        ),
                    );
                    failed = true;
                }
            }
        }
        if let Some(p) = get("file_content_in_loop") {
            let retry = get("retry_time")
                .and_then(|r| r.parse::<u64>().ok())
                .unwrap_or(180);
            let break_on = get("break_on_expected_content").is_none_or(|v| v != "false");
            let until = self.now + Duration::from_secs(retry);
            let mut last_err = false;
            while self.now < until {
                self.tick()?;
                match self.read_file(&p) {
                    Ok(text) => {
                        last_err = false;
                        self.out(io, &format!("content of file {p:?}: {text}\n"));
                        if break_on {
                            if text == INITIAL {
                                break;
                            }
                            self.out(
                                io,
                                &format!("Unexpected content. Expected: {INITIAL}. Retrying\n"),
                            );
                        }
                    }
                    Err(e) => {
                        last_err = true;
                        self.out(
                            io,
                            &format!(
                                "Error reading file {p}: open {p}: {}, retrying\n",
                                e.message().to_lowercase()
                            ),
                        );
                    }
                }
                self.now += Duration::from_secs(2);
            }
            failed |= last_err;
        }
        Ok(i32::from(failed))
    }
}

/// The bytes of a simulated file: text is UTF-8, except binary data (chars up to
/// U+00FF with some above U+007F), which is one byte per char.
fn file_bytes(text: &str) -> Vec<u8> {
    let latin1 =
        text.chars().all(|c| (c as u32) <= 0xff) && text.chars().any(|c| (c as u32) >= 0x80);
    if latin1 {
        text.chars().map(|c| c as u8).collect()
    } else {
        text.as_bytes().to_vec()
    }
}

/// `hexdump -C`.
fn hexdump(bytes: &[u8]) -> String {
    let mut out = String::new();
    for (row, chunk) in bytes.chunks(16).enumerate() {
        out.push_str(&format!("{:08x}  ", row * 16));
        for i in 0..16 {
            match chunk.get(i) {
                Some(b) => out.push_str(&format!("{b:02x} ")),
                None => out.push_str("   "),
            }
            if i == 7 {
                out.push(' ');
            }
        }
        out.push_str(" |");
        out.extend(chunk.iter().map(|b| {
            if b.is_ascii_graphic() || *b == b' ' {
                char::from(*b)
            } else {
                '.'
            }
        }));
        out.push_str("|\n");
    }
    if !bytes.is_empty() {
        out.push_str(&format!("{:08x}\n", bytes.len()));
    }
    out
}

/// A basic regular expression (grep's default) as the `regex` crate reads it.
fn bre_to_ere(p: &str) -> String {
    let mut out = String::new();
    let mut chars = p.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(n @ ('(' | ')' | '|' | '{' | '}' | '+' | '?')) => out.push(n),
                Some(n) => {
                    out.push('\\');
                    out.push(n);
                }
                None => out.push_str("\\\\"),
            },
            '(' | ')' | '|' | '{' | '}' | '+' | '?' => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out
}

/// awk programs of the form `{print $1, $3}` / `{print}` / `/re/ {print $2}` /
/// `NR==2 {print}`.
fn awk(prog: &str, sep: Option<&str>, text: &str) -> String {
    let prog = prog.trim();
    let (cond, action) = match prog.find('{') {
        Some(i) => (prog[..i].trim(), prog[i + 1..].trim_end_matches('}').trim()),
        None => (prog, "print"),
    };
    let mut out = String::new();
    for (n, line) in text.lines().enumerate() {
        let fields: Vec<&str> = match sep {
            Some(s) if !s.is_empty() && s != " " => line.split(s).collect(),
            _ => line.split_whitespace().collect(),
        };
        let ok = if cond.is_empty() {
            true
        } else if let Some(re) = cond.strip_prefix('/').and_then(|c| c.strip_suffix('/')) {
            regex::Regex::new(re).is_ok_and(|r| r.is_match(line))
        } else if let Some(k) = cond.strip_prefix("NR==") {
            k.trim().parse::<usize>().ok() == Some(n + 1)
        } else {
            false
        };
        if !ok {
            continue;
        }
        for stmt in action.split(';') {
            let stmt = stmt.trim();
            let Some(rest) = stmt.strip_prefix("print") else {
                continue;
            };
            let rest = rest.trim();
            if rest.is_empty() || rest == "$0" {
                out.push_str(line);
                out.push('\n');
                continue;
            }
            let mut parts = Vec::new();
            for item in rest.split(',') {
                let item = item.trim();
                let v = if item == "NF" {
                    fields.len().to_string()
                } else if item == "NR" {
                    (n + 1).to_string()
                } else if item == "$NF" {
                    fields.last().copied().unwrap_or("").to_owned()
                } else if let Some(k) = item.strip_prefix('$') {
                    match k.parse::<usize>() {
                        Ok(0) => line.to_owned(),
                        Ok(k) => fields.get(k - 1).copied().unwrap_or("").to_owned(),
                        Err(_) => String::new(),
                    }
                } else {
                    item.trim_matches('"').to_owned()
                };
                parts.push(v);
            }
            out.push_str(&parts.join(" "));
            out.push('\n');
        }
    }
    out
}

/// `expr`'s arithmetic, comparisons and `length`.
fn expr(args: &[String]) -> Option<String> {
    match args {
        [a] => Some(a.clone()),
        [op, s] if op == "length" => Some(s.chars().count().to_string()),
        [a, op, b] => {
            let (x, y) = (a.parse::<i64>(), b.parse::<i64>());
            let num = |f: fn(i64, i64) -> Option<i64>| -> Option<String> {
                Some(f(x.clone().ok()?, y.clone().ok()?)?.to_string())
            };
            let cmp = |r: bool| Some(i32::from(r).to_string());
            match op.as_str() {
                "+" => num(|a, b| a.checked_add(b)),
                "-" => num(|a, b| a.checked_sub(b)),
                "*" => num(|a, b| a.checked_mul(b)),
                "/" => num(|a, b| a.checked_div(b)),
                "%" => num(|a, b| a.checked_rem(b)),
                "=" => cmp(a == b),
                "!=" => cmp(a != b),
                "<" | ">" | "<=" | ">=" => {
                    let ord = match (&x, &y) {
                        (Ok(x), Ok(y)) => x.cmp(y),
                        _ => a.cmp(b),
                    };
                    cmp(match op.as_str() {
                        "<" => ord.is_lt(),
                        ">" => ord.is_gt(),
                        "<=" => ord.is_le(),
                        _ => ord.is_ge(),
                    })
                }
                ":" => {
                    let re = regex::Regex::new(&format!("^(?:{})", bre_to_ere(b))).ok()?;
                    Some(match re.captures(a) {
                        Some(c) => match c.get(1) {
                            Some(g) => g.as_str().to_owned(),
                            None => c.get(0).map_or(0, |m| m.as_str().len()).to_string(),
                        },
                        None => "0".into(),
                    })
                }
                _ => None,
            }
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| (*s).to_owned()).collect()
    }

    fn ctx() -> Context {
        Context {
            hostname: "web-0".into(),
            pod_ip: "10.244.0.5".into(),
            env: vec![("GREETING".into(), "hello world".into())],
            ..Default::default()
        }
    }

    #[test]
    fn id_and_whoami_follow_the_security_context() {
        let out = |user: Option<(i64, Option<i64>)>, cmd: &[&str]| {
            let c = Context { user, ..ctx() };
            exec_program(&argv(cmd), &c).unwrap_or_default()
        };
        assert_eq!(
            out(Some((1001, Some(2002))), &["id"]),
            [
                Step::Out(Stream::Stdout, "uid=1001 gid=2002 groups=2002\n".into()),
                Step::Exit(0)
            ]
        );
        assert_eq!(
            out(
                Some((65534, None)),
                &["sh", "-c", "test $(id -u) -eq 65534"]
            ),
            [Step::Exit(0)]
        );
        assert_eq!(
            out(None, &["id"]),
            [
                Step::Out(
                    Stream::Stdout,
                    "uid=0(root) gid=0(root) groups=0(root),10(wheel)\n".into()
                ),
                Step::Exit(0)
            ]
        );
        // The nonewprivs image's setuid-root binary: root, unless no_new_privs.
        let nnp = |no_new_privs: bool| {
            let c = Context {
                user: Some((1000, None)),
                no_new_privs,
                ..ctx()
            };
            let argv = crate::runtime::images::image_argv(
                "registry.k8s.io/e2e-test-images/nonewprivs:1.4",
                &[],
                &[],
            );
            exec_program(&argv, &c).unwrap_or_default()
        };
        assert_eq!(
            nnp(false)[0],
            Step::Out(Stream::Stdout, "Effective uid: 0\n".into())
        );
        assert_eq!(
            nnp(true)[0],
            Step::Out(Stream::Stdout, "Effective uid: 1000\n".into())
        );
        assert_eq!(
            out(None, &["sh", "-c", "ip link add dummy0 type dummy || true"]),
            [
                Step::Out(
                    Stream::Stderr,
                    "ip: RTNETLINK answers: Operation not permitted\n".into()
                ),
                Step::Exit(0)
            ]
        );
        assert_eq!(
            out(Some((7, None)), &["whoami"]),
            [
                Step::Out(Stream::Stderr, "whoami: unknown uid 7\n".into()),
                Step::Exit(1)
            ]
        );
    }

    #[test]
    fn scripts() {
        let c = ctx();
        assert_eq!(
            container_program(&argv(&["echo", "hi", "there"]), &c),
            Some(vec![
                Step::Out(Stream::Stdout, "hi there\n".into()),
                Step::Exit(0)
            ])
        );
        assert_eq!(
            container_program(
                &argv(&[
                    "/bin/sh",
                    "-c",
                    "echo \"$GREETING\"; sleep 2; echo bye >&2; exit 3"
                ]),
                &c
            ),
            Some(vec![
                Step::Out(Stream::Stdout, "hello world\n".into()),
                Step::Sleep(Duration::from_secs(2)),
                Step::Out(Stream::Stderr, "bye\n".into()),
                Step::Exit(3)
            ])
        );
        assert_eq!(
            container_program(&argv(&["sh", "-c", "false && echo no || echo yes"]), &c),
            Some(vec![
                Step::Out(Stream::Stdout, "yes\n".into()),
                Step::Exit(0)
            ])
        );
        assert_eq!(
            container_program(&argv(&["sh", "-c", "while true; do sleep 1; done"]), &c),
            Some(vec![Step::Forever])
        );
        assert_eq!(
            container_program(&argv(&["nginx", "-g", "daemon off;"]), &c),
            None
        );
        assert_eq!(
            container_program(&argv(&["cat", "/etc/hostname"]), &c),
            Some(vec![
                Step::Out(Stream::Stdout, "web-0\n".into()),
                Step::Exit(0)
            ])
        );
        assert_eq!(
            container_program(&argv(&["sleep", "infinity"]), &c),
            Some(vec![Step::Forever])
        );
        assert!(exec_program(&argv(&["nope"]), &c).is_err());
        assert_eq!(
            exec_program(&argv(&["sh", "-c", "exit 3"]), &c),
            Ok(vec![Step::Exit(3)])
        );
        assert_eq!(
            exec_program(&argv(&["printf", "%s-%s\\n", "a", "b"]), &c),
            Ok(vec![
                Step::Out(Stream::Stdout, "a-b\n".into()),
                Step::Exit(0)
            ])
        );
        assert_eq!(
            container_program(
                &argv(&[
                    "/bin/sh",
                    "-c",
                    "/bin/echo -n OK > /dev/termination-log; /bin/echo DONE"
                ]),
                &c
            ),
            Some(vec![
                Step::Write {
                    path: "/dev/termination-log".into(),
                    text: String::new(),
                    append: false
                },
                Step::Write {
                    path: "/dev/termination-log".into(),
                    text: "OK".into(),
                    append: true
                },
                Step::Out(Stream::Stdout, "DONE\n".into()),
                Step::Exit(0)
            ])
        );
        assert_eq!(
            container_program(&argv(&["sh", "-c", "A=b echo \"x\""]), &c),
            Some(vec![Step::Out(Stream::Stdout, "x\n".into()), Step::Exit(0)])
        );
        assert!(reads_stdin(&argv(&["cat"])));
        assert!(stdin_complete(&argv(&["sh"]), b"echo hi\nexit\n"));
        assert!(!stdin_complete(&argv(&["sh"]), b"echo hi\nexi"));
        assert!(!reads_stdin(&argv(&["sh", "-c", "cat"])));
    }

    #[test]
    fn agnhost_and_image_defaults() {
        let c = ctx();
        let merged = crate::runtime::images::image_argv(
            "registry.k8s.io/e2e-test-images/agnhost:2.56",
            &[],
            &argv(&["entrypoint-tester", "override", "arguments"]),
        );
        assert_eq!(
            container_program(&merged, &c),
            Some(vec![
                Step::Out(
                    Stream::Stdout,
                    "[/agnhost entrypoint-tester override arguments]\n".into()
                ),
                Step::Exit(0)
            ])
        );
        let defaults = crate::runtime::images::image_argv(
            "registry.k8s.io/e2e-test-images/agnhost:2.56",
            &[],
            &[],
        );
        assert_eq!(defaults, ["/agnhost", "pause"]);
        let steps = container_program(
            &argv(&[
                "/agnhost",
                "logs-generator",
                "--log-lines-total",
                "3",
                "--run-duration",
                "3s",
            ]),
            &c,
        )
        .unwrap();
        assert_eq!(steps.len(), 7);
        assert_eq!(steps[1], Step::Sleep(Duration::from_secs(1)));
    }

    /// A context whose files are `store`'s, with an emptyDir at /data.
    fn with_files(store: &Arc<fs::Store>, container: &str, env: &[(&str, &str)]) -> Context {
        Context {
            hostname: "job-0".into(),
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            fs: Some(View {
                store: store.clone(),
                mounts: vec![fs::Mount {
                    path: "/data".into(),
                    source: fs::Source::EmptyDir("data".into()),
                    read_only: false,
                    sub_path: String::new(),
                    tmpfs: false,
                }],
                sandbox: "sb".into(),
                container: container.into(),
                fixed: BTreeMap::new(),
            }),
            start: Some(SystemTime::now()),
            ..Default::default()
        }
    }

    fn exit_of(steps: &[Step]) -> Option<i32> {
        match steps.last() {
            Some(Step::Exit(c)) => Some(*c),
            _ => None,
        }
    }

    fn stdout_of(steps: &[Step]) -> String {
        steps
            .iter()
            .filter_map(|s| match s {
                Step::Out(Stream::Stdout, t) => Some(t.as_str()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn job_scripts() {
        let store = Arc::new(fs::Store::default());
        // e2e's failOncePerIndex: fails the first time, succeeds once the marker exists.
        let script = "\n\t\t\tif [[ -r /data/foo-$JOB_COMPLETION_INDEX ]]\n\t\t\tthen\n\t\t\t\texit 0\n\t\t\telse\n\t\t\t\ttouch /data/foo-$JOB_COMPLETION_INDEX\n\t\t\t\texit 42\n\t\t\tfi\n\t\t";
        let argv = argv(&["/bin/sh", "-c", script]);
        let c = with_files(&store, "a", &[("JOB_COMPLETION_INDEX", "1")]);
        assert_eq!(
            exit_of(&container_program(&argv, &c).expect("runs")),
            Some(42)
        );
        let c = with_files(&store, "b", &[("JOB_COMPLETION_INDEX", "1")]);
        assert_eq!(
            exit_of(&container_program(&argv, &c).expect("runs")),
            Some(0)
        );
        let c = with_files(&store, "c", &[("JOB_COMPLETION_INDEX", "2")]);
        assert_eq!(
            exit_of(&container_program(&argv, &c).expect("runs")),
            Some(42)
        );
        // failOddSucceedEven.
        let odd =
            "if [ $(expr ${JOB_COMPLETION_INDEX} % 2) -ne 0 ]; then\n exit 1\nelse\n exit 0\nfi";
        for (index, code) in [("0", 0), ("3", 1)] {
            let c = with_files(&store, "d", &[("JOB_COMPLETION_INDEX", index)]);
            let steps = container_program(&argv_of(&["sh", "-c", odd]), &c).expect("runs");
            assert_eq!(exit_of(&steps), Some(code), "index {index}");
        }
        // Container Runtime's restart-count script: 1, then 0, then forever.
        let restart = "\nf=/data/restartCount\ncount=$(echo 'hello' >> $f ; wc -l $f | awk {'print $1'})\nif [ $count -eq 1 ]; then\n\texit 1\nfi\nif [ $count -eq 2 ]; then\n\texit 0\nfi\nwhile true; do sleep 1; done\n";
        let mut ends = Vec::new();
        for k in 0..3 {
            let c = with_files(&store, &format!("r{k}"), &[]);
            let steps = container_program(&argv_of(&["sh", "-c", restart]), &c).expect("runs");
            ends.push(steps.last().cloned());
        }
        assert_eq!(
            ends,
            [
                Some(Step::Exit(1)),
                Some(Step::Exit(0)),
                Some(Step::Forever)
            ]
        );
    }

    fn argv_of(a: &[&str]) -> Vec<String> {
        argv(a)
    }

    #[test]
    fn shell_language() {
        let store = Arc::new(fs::Store::default());
        let c = with_files(&store, "x", &[("N", "3")]);
        let run = |script: &str| container_program(&argv(&["sh", "-c", script]), &c).expect("runs");
        assert_eq!(
            stdout_of(&run("for i in 1 2 $N; do echo -n $i; done; echo")),
            "123\n"
        );
        assert_eq!(
            stdout_of(&run(
                "i=0; while [ $i -lt 3 ]; do i=$((i+1)); done; echo $i"
            )),
            "3\n"
        );
        assert_eq!(
            stdout_of(&run(
                "i=0; until [ $i -ge 2 ]; do i=$(expr $i + 1); sleep 1; done; echo done $i"
            )),
            "done 2\n"
        );
        let steps = run("echo a; sleep 2; echo b >&2; exit 7");
        assert_eq!(
            steps,
            vec![
                Step::Out(Stream::Stdout, "a\n".into()),
                Step::Sleep(Duration::from_secs(2)),
                Step::Out(Stream::Stderr, "b\n".into()),
                Step::Exit(7)
            ]
        );
        assert_eq!(
            stdout_of(&run("printf 'x\\ny\\nx\\n' | grep -c x; echo hi | wc -c")),
            "2\n3\n"
        );
        assert_eq!(
            stdout_of(&run("mkdir -p /data/d && echo one > /data/d/f && echo two >> /data/d/f; cat /data/d/f; ls /data/d")),
            "one\ntwo\nf\n"
        );
        assert_eq!(
            stdout_of(&run(
                "ls /nope 2>&1 >/dev/null | wc -l; test -d /data && echo dir"
            )),
            "1\ndir\n"
        );
        assert_eq!(
            stdout_of(&run("f() { echo \"in $1\"; return 3; }; f arg; echo $?")),
            "in arg\n3\n"
        );
        assert_eq!(
            stdout_of(&run("case ${N:-0} in 1|2) echo low;; *) echo high;; esac")),
            "high\n"
        );
        assert_eq!(
            stdout_of(&run("x=\"a b\"; set -- $x; echo $# ${#x} ${x%% *}")),
            "2 3 a\n"
        );
        assert_eq!(stdout_of(&run("cat <<EOF\nv=$N\nEOF\n")), "v=3\n");
        assert_eq!(exit_of(&run("set -e; false; echo no")), Some(1));
        assert_eq!(exit_of(&run("trap 'exit 0' TERM; sleep 5 & wait")), Some(0));
        assert_eq!(
            run("while true; do sleep 1; done").last(),
            Some(&Step::Forever)
        );
        assert_eq!(run("tail -f /dev/null").last(), Some(&Step::Forever));
        assert_eq!(
            exit_of(&run(
                "if ! grep -q x /data/none 2>/dev/null; then exit 4; fi"
            )),
            Some(4)
        );
        assert_eq!(exit_of(&run("nonsense-cmd")), Some(127));
        assert_eq!(
            run("if then"),
            vec![
                Step::Out(
                    Stream::Stderr,
                    "sh: syntax error: unexpected \"then\"\n".into()
                ),
                Step::Exit(2)
            ]
        );
    }

    /// `kubectl cp` out of a container runs `tar cf - PATH`: a ustar archive on stdout.
    #[test]
    fn tar_creates_the_archive_kubectl_cp_reads() {
        let c = Context {
            fs: Some(View {
                store: Arc::new(fs::Store::default()),
                mounts: Vec::new(),
                sandbox: "sb".into(),
                container: "c".into(),
                fixed: BTreeMap::new(),
            }),
            ..Default::default()
        };
        let steps = exec_program(
            &argv(&[
                "sh",
                "-c",
                "mkdir -p /root/foo/bar && echo hi > /root/foo/bar/a.txt && tar cf - /root/foo",
            ]),
            &c,
        )
        .expect("runs");
        let archive = stdout_of(&steps);
        let mut names = Vec::new();
        let mut content = String::new();
        let mut a = tar::Archive::new(archive.as_bytes());
        for e in a.entries().unwrap() {
            let mut e = e.unwrap();
            let name = e.path().unwrap().display().to_string();
            if name.ends_with("a.txt") {
                std::io::Read::read_to_string(&mut e, &mut content).unwrap();
            }
            names.push(name);
        }
        assert_eq!(names, ["root/foo/", "root/foo/bar/", "root/foo/bar/a.txt"]);
        assert_eq!(content, "hi\n");
        assert!(steps.contains(&Step::Exit(0)), "{steps:?}");
        let steps = exec_program(&argv(&["tar", "cf", "-", "/nope"]), &c).expect("runs");
        assert!(steps.contains(&Step::Exit(1)), "{steps:?}");
        // `kubectl cp` into the container: the same archive unpacked elsewhere.
        let into = Context {
            stdin: Some(archive.into_bytes()),
            ..c.clone()
        };
        let steps = exec_program(&argv(&["tar", "-xmf", "-", "-C", "/copy"]), &into).expect("runs");
        assert!(steps.contains(&Step::Exit(0)), "{steps:?}");
        let steps = exec_program(&argv(&["cat", "/copy/root/foo/bar/a.txt"]), &c).expect("runs");
        assert_eq!(stdout_of(&steps), "hi\n");
        assert!(reads_stdin(&argv(&["tar", "-xmf", "-"])));
    }

    #[test]
    fn mounttest_and_volumes() {
        let store = Arc::new(fs::Store::default());
        let mut files = BTreeMap::new();
        files.insert("data-1".to_owned(), (b"value-1".to_vec(), 0o400));
        let c = Context {
            fs: Some(View {
                store,
                mounts: vec![fs::Mount {
                    path: "/etc/configmap-volume".into(),
                    source: fs::Source::Files(files),
                    read_only: true,
                    sub_path: String::new(),
                    tmpfs: true,
                }],
                sandbox: "sb".into(),
                container: "c".into(),
                fixed: BTreeMap::new(),
            }),
            ..Default::default()
        };
        let steps = container_program(
            &argv(&[
                "/agnhost",
                "mounttest",
                "--file_content=/etc/configmap-volume/data-1",
                "--file_mode=/etc/configmap-volume/data-1",
            ]),
            &c,
        )
        .expect("runs");
        assert_eq!(
            stdout_of(&steps),
            "mode of file \"/etc/configmap-volume/data-1\": -r--------\ncontent of file \"/etc/configmap-volume/data-1\": value-1\n"
        );
        let steps = container_program(
            &argv(&[
                "sh",
                "-c",
                "cat /etc/configmap-volume/data-1; echo x > /etc/configmap-volume/y",
            ]),
            &c,
        )
        .expect("runs");
        assert_eq!(stdout_of(&steps), "value-1");
        assert_eq!(exit_of(&steps), Some(1));
    }

    #[test]
    fn read_only_root_and_binary_files() {
        let store = Arc::new(fs::Store::default());
        let mut files = BTreeMap::new();
        files.insert(
            "dump.bin".to_owned(),
            (vec![0xde_u8, 0xca, 0xfe, 0xba, 0xd0, 0xfe, 0xff], 0o644),
        );
        let c = Context {
            fs: Some(View {
                store,
                mounts: vec![
                    fs::Mount {
                        path: "/".into(),
                        source: fs::Source::Files(BTreeMap::new()),
                        read_only: true,
                        sub_path: String::new(),
                        tmpfs: false,
                    },
                    fs::Mount {
                        path: "/etc/cm".into(),
                        source: fs::Source::Files(files),
                        read_only: true,
                        sub_path: String::new(),
                        tmpfs: true,
                    },
                ],
                sandbox: "sb".into(),
                container: "c".into(),
                fixed: BTreeMap::new(),
            }),
            ..Default::default()
        };
        let steps = container_program(
            &argv(&[
                "/bin/sh",
                "-c",
                "echo test > /file; echo -n ok > /dev/termination-log; sleep 240",
            ]),
            &c,
        )
        .expect("runs");
        assert_eq!(
            steps[0],
            Step::Out(
                Stream::Stderr,
                "/bin/sh: can't create /file: Read-only file system\n".into()
            )
        );
        assert!(steps.contains(&Step::Write {
            path: "/dev/termination-log".into(),
            text: "ok".into(),
            append: true
        }));
        let steps =
            container_program(&argv(&["hexdump", "-C", "/etc/cm/dump.bin"]), &c).expect("runs");
        assert_eq!(
            stdout_of(&steps),
            "00000000  de ca fe ba d0 fe ff                              |.......|\n00000007\n"
        );
    }
}
