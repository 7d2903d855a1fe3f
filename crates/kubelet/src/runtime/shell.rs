//! What a `sim` container does: its command line read as a tiny shell. Only what pod
//! specs and `kubectl exec` commonly run is understood — `sh -c` scripts of `echo`,
//! `printf`, `cat` of the few files the runtime makes (`/etc/hostname`, `/etc/hosts`,
//! `/etc/resolv.conf`), `hostname`, `env`/`printenv`, `sleep`, `exit`, `true`/`false`,
//! separated by `;`, `&&`, `||` or new lines, with `$VAR`/`${VAR}` expansion, quoting and
//! `>&2`. A command line it does not understand (an image's own entrypoint, a loop) runs
//! until the container is stopped, silently.

use std::time::Duration;

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
    /// Writes a file (`> path`, or `>> path` when appending).
    Write {
        path: String,
        text: String,
        append: bool,
    },
}

/// What the process can see.
#[derive(Clone, Debug, Default)]
pub struct Context {
    pub hostname: String,
    pub pod_ip: String,
    /// The container's environment, in order.
    pub env: Vec<(String, String)>,
    /// What is written to its stdin (exec), if anything.
    pub stdin: Option<Vec<u8>>,
}

impl Context {
    fn var(&self, k: &str) -> String {
        match k {
            "HOSTNAME" if !self.env.iter().any(|(n, _)| n == "HOSTNAME") => {
                return self.hostname.clone()
            }
            "HOME" if !self.env.iter().any(|(n, _)| n == "HOME") => return "/root".into(),
            _ => {}
        }
        self.env
            .iter()
            .rev()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    }

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
        all.push(("HOME".to_owned(), "/root".to_owned()));
        all
    }

    fn file(&self, path: &str) -> Option<String> {
        Some(match path {
            "/etc/hostname" => format!("{}\n", self.hostname),
            "/etc/hosts" => format!(
                "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n{}\t{}\n",
                self.pod_ip, self.hostname
            ),
            "/etc/resolv.conf" => {
                "search default.svc.cluster.local svc.cluster.local cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n".into()
            }
            _ => return None,
        })
    }
}

/// The kubelet's `$(VAR)` expansion of command and args against the container's
/// environment: `$$` is a literal `$`, unknown references stay as written.
pub fn expand(s: &str, env: &[(String, String)]) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(') {
            match inner.find(')') {
                Some(end) => {
                    let name = &inner[..end];
                    match env.iter().rev().find(|(k, _)| k == name) {
                        Some((_, v)) => out.push_str(v),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &inner[end + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = inner;
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// The image config the sim knows of `image`: (entrypoint, cmd).
fn image_config(image: &str) -> (Vec<String>, Vec<String>) {
    let repo = image.split(['@']).next().unwrap_or(image);
    let repo = repo
        .rsplit_once(':')
        .filter(|(_, t)| !t.contains('/'))
        .map_or(repo, |(r, _)| r);
    let name = repo.rsplit('/').next().unwrap_or(repo);
    let v = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    match name {
        "agnhost" => (v(&["/agnhost"]), v(&["pause"])),
        "busybox" => (Vec::new(), v(&["sh"])),
        "pause" => (v(&["/pause"]), Vec::new()),
        _ => (Vec::new(), Vec::new()),
    }
}

/// The command line a container runs: its command and args over the image's entrypoint
/// and cmd, as container runtimes merge them.
pub fn image_argv(image: &str, command: &[String], args: &[String]) -> Vec<String> {
    if !command.is_empty() {
        return command.iter().chain(args).cloned().collect();
    }
    let (entrypoint, cmd) = image_config(image);
    let tail = if args.is_empty() { &cmd } else { args };
    entrypoint.iter().chain(tail).cloned().collect()
}

/// The program a container's command line runs (`argv` is command + args). `None` when
/// the sim does not understand it: the container then runs until stopped.
pub fn container_program(argv: &[String], ctx: &Context) -> Option<Vec<Step>> {
    let first = argv.first()?;
    if !known(basename(first)) {
        return None;
    }
    let steps = run_argv(argv, ctx, false);
    Some(steps)
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
    Ok(run_argv(argv, ctx, true))
}

/// Whether `argv` reads its stdin (so exec waits for it): `cat` without files, a shell
/// without a script.
pub fn reads_stdin(argv: &[String]) -> bool {
    match argv.first().map(|a| basename(a)) {
        Some("cat") => argv.len() == 1,
        Some(sh) if is_shell(sh) => !argv.iter().any(|a| a == "-c"),
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

fn known(cmd: &str) -> bool {
    is_shell(cmd)
        || matches!(
            cmd,
            "echo"
                | "printf"
                | "cat"
                | "sleep"
                | "true"
                | "false"
                | "exit"
                | "hostname"
                | "env"
                | "printenv"
                | "pwd"
                | "whoami"
                | ":"
                | "agnhost"
                | "agnhost-2"
                | "date"
                | "uname"
                | "id"
        )
}

fn run_argv(argv: &[String], ctx: &Context, exec: bool) -> Vec<Step> {
    let cmd = basename(&argv[0]);
    if is_shell(cmd) {
        let script = match argv.iter().position(|a| a == "-c") {
            Some(i) => argv.get(i + 1).cloned().unwrap_or_default(),
            None => ctx
                .stdin
                .as_ref()
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_default(),
        };
        return run_script(&script, ctx, exec);
    }
    let mut steps = Vec::new();
    let code = builtin(argv, ctx, Stream::Stdout, &mut steps, exec);
    steps.push(match code {
        Some(code) => Step::Exit(code),
        None => Step::Forever,
    });
    steps
}

/// Runs one simple command; `None` when it never ends.
fn builtin(
    argv: &[String],
    ctx: &Context,
    out: Stream,
    steps: &mut Vec<Step>,
    exec: bool,
) -> Option<i32> {
    let cmd = basename(&argv[0]);
    let args = &argv[1..];
    let say = |steps: &mut Vec<Step>, s: String| {
        if !s.is_empty() {
            steps.push(Step::Out(out, s));
        }
    };
    Some(match cmd {
        "echo" => {
            let (newline, words) = match args.first().map(String::as_str) {
                Some("-n") => (false, &args[1..]),
                _ => (true, args),
            };
            let mut s = words.join(" ");
            if newline {
                s.push('\n');
            }
            say(steps, s);
            0
        }
        "printf" => {
            if let Some(fmt) = args.first() {
                say(steps, printf(fmt, &args[1..]));
            }
            0
        }
        "cat" => {
            if args.is_empty() {
                if let Some(input) = &ctx.stdin {
                    say(steps, String::from_utf8_lossy(input).into_owned());
                    0
                } else if exec {
                    0
                } else {
                    return None;
                }
            } else {
                let mut code = 0;
                for f in args {
                    match ctx.file(f) {
                        Some(text) => say(steps, text),
                        None => {
                            steps.push(Step::Out(
                                Stream::Stderr,
                                format!("cat: can't open '{f}': No such file or directory\n"),
                            ));
                            code = 1;
                            break;
                        }
                    }
                }
                code
            }
        }
        "hostname" => {
            say(steps, format!("{}\n", ctx.hostname));
            0
        }
        "pwd" => {
            say(steps, "/\n".into());
            0
        }
        "whoami" => {
            say(steps, "root\n".into());
            0
        }
        "env" => {
            let text: String = ctx
                .environ()
                .iter()
                .map(|(k, v)| format!("{k}={v}\n"))
                .collect();
            say(steps, text);
            0
        }
        "printenv" => {
            if args.is_empty() {
                let text: String = ctx
                    .environ()
                    .iter()
                    .map(|(k, v)| format!("{k}={v}\n"))
                    .collect();
                say(steps, text);
                0
            } else {
                let env = ctx.environ();
                let mut code = 0;
                for a in args {
                    match env.iter().find(|(k, _)| k == a) {
                        Some((_, v)) => say(steps, format!("{v}\n")),
                        None => code = 1,
                    }
                }
                code
            }
        }
        "sleep" => {
            let secs = args.first().map(String::as_str).unwrap_or("0");
            if secs == "infinity" {
                return None;
            }
            let n = secs
                .trim_end_matches('s')
                .parse::<f64>()
                .ok()
                .filter(|n| n.is_finite() && *n >= 0.0)
                .unwrap_or(0.0);
            // Days of sleep are forever for a test cluster.
            if n > 1e7 {
                return None;
            }
            steps.push(Step::Sleep(Duration::from_secs_f64(n)));
            0
        }
        "agnhost" | "agnhost-2" => return agnhost(argv, steps),
        "date" => {
            let now = k8s_openapi::jiff::Timestamp::now();
            say(
                steps,
                now.strftime("%a %b %e %H:%M:%S UTC %Y\n").to_string(),
            );
            0
        }
        "uname" => {
            say(
                steps,
                if args.iter().any(|a| a == "-a") {
                    format!("Linux {} sim x86_64 GNU/Linux\n", ctx.hostname)
                } else {
                    "Linux\n".to_owned()
                },
            );
            0
        }
        "id" => {
            say(steps, "uid=0(root) gid=0(root) groups=0(root)\n".into());
            0
        }
        "true" | ":" => 0,
        "false" => 1,
        "exit" => args.first().and_then(|a| a.parse().ok()).unwrap_or(0),
        _ => {
            steps.push(Step::Out(Stream::Stderr, format!("sh: {cmd}: not found\n")));
            127
        }
    })
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

/// agnhost, the e2e tests' image: `entrypoint-tester` prints its command line,
/// `pause` says so and waits, `logs-generator` writes klog lines over a duration; its
/// other commands (servers) run until stopped.
fn agnhost(argv: &[String], steps: &mut Vec<Step>) -> Option<i32> {
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
            steps.push(Step::Out(Stream::Stdout, format!("[{}]\n", argv.join(" "))));
            Some(0)
        }
        Some("pause") | None => {
            steps.push(Step::Out(
                Stream::Stdout,
                "Paused\nSignals registered\n".into(),
            ));
            None
        }
        Some("logs-generator") => {
            let total: u32 = flag("--log-lines-total", "-t")?.parse().ok()?;
            let duration = go_duration(flag("--run-duration", "-d")?)?;
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
                steps.push(Step::Out(Stream::Stderr, line));
                steps.push(Step::Sleep(delay));
            }
            Some(0)
        }
        _ => None,
    }
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

/// A token of a shell command line.
#[derive(Debug, PartialEq)]
enum Token {
    Word(String),
    /// `;`, `&`, or a new line.
    Then,
    And,
    Or,
    /// `>&2`, `1>&2`.
    ToStderr,
    /// `2>&1`, `2> file`: output the sim does not keep.
    Redirect,
    /// `> file`, `>> file`: stdout into a file.
    ToFile(String, bool),
}

fn tokenize(script: &str, ctx: &Context) -> Option<Vec<Token>> {
    let mut tokens = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = script.chars().peekable();
    let flush = |word: &mut String, in_word: &mut bool, tokens: &mut Vec<Token>| {
        if *in_word {
            tokens.push(Token::Word(std::mem::take(word)));
            *in_word = false;
        }
    };
    let var = |chars: &mut std::iter::Peekable<std::str::Chars>| -> String {
        let mut name = String::new();
        if chars.peek() == Some(&'{') {
            chars.next();
            for c in chars.by_ref() {
                if c == '}' {
                    break;
                }
                name.push(c);
            }
        } else if chars.peek() == Some(&'?') {
            chars.next();
            return "0".into();
        } else {
            while let Some(&c) = chars.peek() {
                if c.is_ascii_alphanumeric() || c == '_' {
                    name.push(c);
                    chars.next();
                } else {
                    break;
                }
            }
            if name.is_empty() {
                return "$".into();
            }
        }
        ctx.var(&name)
    };
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' => flush(&mut word, &mut in_word, &mut tokens),
            '\n' | ';' => {
                flush(&mut word, &mut in_word, &mut tokens);
                tokens.push(Token::Then);
            }
            '&' => {
                flush(&mut word, &mut in_word, &mut tokens);
                if chars.peek() == Some(&'&') {
                    chars.next();
                    tokens.push(Token::And);
                } else {
                    tokens.push(Token::Then);
                }
            }
            '|' => {
                flush(&mut word, &mut in_word, &mut tokens);
                if chars.peek() == Some(&'|') {
                    chars.next();
                    tokens.push(Token::Or);
                } else {
                    // Pipes are beyond the sim.
                    return None;
                }
            }
            '>' | '<' => {
                let fd = if in_word && (word == "1" || word == "2") {
                    let fd = std::mem::take(&mut word);
                    in_word = false;
                    fd
                } else {
                    flush(&mut word, &mut in_word, &mut tokens);
                    String::new()
                };
                if c == '<' {
                    return None;
                }
                let append = chars.peek() == Some(&'>');
                if append {
                    chars.next();
                }
                if chars.peek() == Some(&'&') {
                    chars.next();
                    let target = chars.next();
                    tokens.push(if target == Some('2') && fd != "2" {
                        Token::ToStderr
                    } else {
                        Token::Redirect
                    });
                } else {
                    // The file name that follows is not a word of the command.
                    while chars.peek() == Some(&' ') {
                        chars.next();
                    }
                    let mut path = String::new();
                    while let Some(&c) = chars.peek() {
                        if c.is_whitespace() || matches!(c, ';' | '&' | '|') {
                            break;
                        }
                        path.push(c);
                        chars.next();
                    }
                    tokens.push(if fd == "2" {
                        Token::Redirect
                    } else {
                        Token::ToFile(path, append)
                    });
                }
            }
            '\'' => {
                in_word = true;
                for c in chars.by_ref() {
                    if c == '\'' {
                        break;
                    }
                    word.push(c);
                }
            }
            '"' => {
                in_word = true;
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => match chars.next() {
                            Some(n @ ('"' | '\\' | '$' | '`')) => word.push(n),
                            Some(n) => {
                                word.push('\\');
                                word.push(n);
                            }
                            None => {}
                        },
                        '$' => word.push_str(&var(&mut chars)),
                        '`' => return None,
                        c => word.push(c),
                    }
                }
            }
            '\\' => {
                in_word = true;
                if let Some(n) = chars.next() {
                    if n != '\n' {
                        word.push(n);
                    }
                }
            }
            '$' => {
                in_word = true;
                if chars.peek() == Some(&'(') {
                    return None;
                }
                word.push_str(&var(&mut chars));
            }
            '`' | '(' | ')' => return None,
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    flush(&mut word, &mut in_word, &mut tokens);
    Some(tokens)
}

/// Runs a shell script; a script the sim cannot follow runs forever (in a container) or
/// to no effect (in exec).
fn run_script(script: &str, ctx: &Context, exec: bool) -> Vec<Step> {
    let Some(tokens) = tokenize(script, ctx) else {
        return vec![Step::Forever];
    };
    let mut steps = Vec::new();
    let mut last = 0;
    // Whether the next command runs, given the connector before it.
    let mut skip = false;
    let mut i = 0;
    while i < tokens.len() {
        let mut argv = Vec::new();
        let mut stream = Stream::Stdout;
        let mut silenced = false;
        let mut to_file = None;
        while i < tokens.len() {
            match &tokens[i] {
                Token::Word(w) => argv.push(w.clone()),
                Token::ToStderr => stream = Stream::Stderr,
                Token::Redirect => silenced = true,
                Token::ToFile(path, append) => {
                    to_file = Some((path.clone(), *append));
                    if path == "/dev/null" {
                        silenced = true;
                        to_file = None;
                    }
                }
                _ => break,
            }
            i += 1;
        }
        let connector = tokens.get(i);
        i += 1;
        // Leading `NAME=value` words are assignments (the script was expanded already).
        let assignments = argv
            .iter()
            .take_while(|w| {
                w.split_once('=').is_some_and(|(n, _)| {
                    !n.is_empty()
                        && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                        && !n.starts_with(|c: char| c.is_ascii_digit())
                })
            })
            .count();
        argv.drain(..assignments);
        if !skip && !argv.is_empty() {
            let cmd = basename(&argv[0]).to_owned();
            if matches!(
                cmd.as_str(),
                "while" | "for" | "until" | "if" | "trap" | "exec" | "tail"
            ) {
                // Control flow is beyond the sim: the process carries on until stopped.
                steps.push(Step::Forever);
                return steps;
            }
            if cmd == "exit" {
                let code = argv.get(1).and_then(|a| a.parse().ok()).unwrap_or(last);
                steps.push(Step::Exit(code));
                return steps;
            }
            let mut out = Vec::new();
            let code = if is_shell(&cmd) {
                let inner = run_argv(&argv, ctx, exec);
                let mut code = 0;
                for s in inner {
                    match s {
                        Step::Exit(c) => code = c,
                        other => out.push(other),
                    }
                }
                Some(code)
            } else {
                builtin(&argv, ctx, stream, &mut out, exec)
            };
            if let Some((path, append)) = to_file {
                // stdout goes to the file; the first write truncates unless appending.
                let mut append = append;
                for s in out {
                    match s {
                        Step::Out(Stream::Stdout, text) => {
                            steps.push(Step::Write {
                                path: path.clone(),
                                text,
                                append,
                            });
                            append = true;
                        }
                        other => steps.push(other),
                    }
                }
                if !append {
                    steps.push(Step::Write {
                        path,
                        text: String::new(),
                        append: false,
                    });
                }
            } else if !silenced {
                steps.extend(out);
            } else {
                steps.extend(
                    out.into_iter()
                        .filter(|s| !matches!(s, Step::Out(Stream::Stdout, _))),
                );
            }
            match code {
                Some(c) => last = c,
                None => {
                    steps.push(Step::Forever);
                    return steps;
                }
            }
        }
        skip = match connector {
            Some(Token::And) => last != 0,
            Some(Token::Or) => last == 0,
            _ => false,
        };
    }
    steps.push(Step::Exit(last));
    steps
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
            stdin: None,
        }
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
                    text: "OK".into(),
                    append: false
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
        let merged = image_argv(
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
        let defaults = image_argv("registry.k8s.io/e2e-test-images/agnhost:2.56", &[], &[]);
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

    #[test]
    fn kubelet_expansion() {
        let env = vec![("A".to_owned(), "x".to_owned())];
        assert_eq!(expand("$(A)-$$(A)-$(B)-$", &env), "x-$(A)-$(B)-$");
    }
}
