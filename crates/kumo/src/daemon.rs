//! `kumo up -d` and `kumo down`: the same `kumo up` run in the background, in its own
//! process group, with its output in `<data-dir>/kumo.log` and its pid in
//! `<data-dir>/kumo.pid`; `kumo down` stops it with SIGTERM (SIGKILL after a timeout).
//! A foreground `kumo up` claims the pid file too and exits cleanly on SIGTERM/SIGINT.

use std::ffi::OsString;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// The pid file in the data directory.
pub const PID_FILE: &str = "kumo.pid";
/// The components' log, and the background process's stdout and stderr.
pub const LOG_FILE: &str = "kumo.log";

/// The components' log of a foreground `kumo up`, opened for appending (a background one's
/// stdout and stderr go to the same file).
pub fn log_file(dir: &Path) -> Result<std::fs::File> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(LOG_FILE);
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))
}
/// How long `kumo up -d` waits for the cluster to answer.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long `kumo down` waits after SIGTERM before SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);
/// The line `kumo up` prints last, once it is usable (the tests and users rely on it).
pub const READY_MARKER: &str = "kumo: ready";
/// The prefix of the one line a failed `kumo up` prints (on stderr) before it exits.
pub const ERROR_PREFIX: &str = "kumo: error: ";
/// The API server's port when nothing else is asked for or known, as kubeadm's.
const DEFAULT_PORT: u16 = 6443;

/// `--data-dir` when given, else `$HOME/.kumo/<name>` (`$HOME/.kumo/default` for the
/// default name `kumo`), as `kumo up` picks it.
pub fn data_dir(given: Option<PathBuf>, name: Option<&str>) -> Result<PathBuf> {
    match (given, name) {
        (Some(d), _) => Ok(d),
        (None, Some(n)) if n != "kumo" => {
            if n.is_empty() || n.contains('/') || n.starts_with('.') {
                bail!("--name {n:?}: not a name (letters, digits and '-')");
            }
            let home = std::env::var_os("HOME")
                .ok_or_else(|| anyhow::anyhow!("HOME is not set; pass --data-dir"))?;
            Ok(PathBuf::from(home).join(".kumo").join(n))
        }
        (None, _) => kumo::kubeconfig::default_data_dir()
            .map_err(|_| anyhow::anyhow!("HOME is not set; pass --data-dir")),
    }
}

/// The API server's port and, when it is not the one asked for or had before, why.
pub struct PortChoice {
    pub port: u16,
    pub note: Option<String>,
}

fn free(port: u16) -> bool {
    std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, port)).is_ok()
}

/// The port the data directory's admin kubeconfig names, if any (a restart keeps it).
fn previous_port(dir: &Path) -> Option<u16> {
    let text = std::fs::read_to_string(dir.join("admin.conf")).ok()?;
    let server = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: "))?;
    server
        .rsplit(':')
        .next()?
        .trim_end_matches('/')
        .parse()
        .ok()
}

/// Who holds `port` on 127.0.0.1: a kumo cluster whose data directory the user's
/// kubeconfig knows, or another program.
fn holder(port: u16) -> String {
    let mut dirs: Vec<PathBuf> = kumo::kubeconfig::default_data_dir().into_iter().collect();
    if let Ok(Some(kc)) = kube::config::Kubeconfig::from_env().map(|k| {
        k.or_else(|| {
            let home = std::env::var_os("HOME")?;
            kube::config::Kubeconfig::read_from(PathBuf::from(home).join(".kube/config")).ok()
        })
    }) {
        for c in kc.clusters.iter().filter_map(|c| c.cluster.as_ref()) {
            for e in c.extensions.iter().flatten() {
                if e.name == kumo::kubeconfig::EXTENSION {
                    if let Some(d) = e.extension.get("dataDir").and_then(|d| d.as_str()) {
                        dirs.push(PathBuf::from(d));
                    }
                }
            }
        }
    }
    for d in dirs {
        if previous_port(&d) == Some(port) {
            if let Some(pid) = running(&d) {
                return format!("the kumo cluster on {} (pid {pid})", d.display());
            }
        }
    }
    "another program".into()
}

/// The API server's port: `--port` (refused in one line when taken; 0 picks a free
/// one), else the one the data directory had, else 6443, else a free one, as kind picks a
/// port for a second cluster.
pub fn api_port(dir: &Path, asked: Option<u16>) -> Result<PortChoice> {
    if let Some(p) = asked {
        if p != 0 && !free(p) {
            bail!(
                "port {p} on 127.0.0.1 is held by {}; pick another with --port, or leave \
                 --port out to take a free one",
                holder(p)
            );
        }
        return Ok(PortChoice {
            port: p,
            note: None,
        });
    }
    let wanted = previous_port(dir).unwrap_or(DEFAULT_PORT);
    if free(wanted) {
        return Ok(PortChoice {
            port: wanted,
            note: None,
        });
    }
    let port = std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .context("finding a free port for the API server")?
        .port();
    Ok(PortChoice {
        port,
        note: Some(format!(
            "port {wanted} is held by {}; the API server takes {port}",
            holder(wanted)
        )),
    })
}

/// Merges the cluster's context into the user's kubeconfig (not when that is the data
/// directory's own admin kubeconfig); Some(file) when done, a line saying why not
/// otherwise.
pub fn merge_kubeconfig(admin: &Path, name: &str, dir: &Path) -> Option<PathBuf> {
    let target = match kumo::kubeconfig::user_kubeconfig() {
        Ok(t) => t,
        Err(e) => {
            println!("kumo: kubeconfig not updated: {e:#}");
            return None;
        }
    };
    let abs = |p: &Path| std::path::absolute(p).ok();
    if abs(&target).is_some() && abs(&target) == abs(admin) {
        // $KUBECONFIG is this cluster's own admin.conf: nothing to merge.
        return None;
    }
    match kumo::kubeconfig::merge(admin, name, dir, &target) {
        Ok(()) => Some(target),
        Err(e) => {
            println!("kumo: kubeconfig not updated: {e:#}");
            None
        }
    }
}

/// Takes the cluster's context out of the kubeconfig `kumo up` merged it into.
fn unmerge(dir: &Path) {
    match kumo::kubeconfig::remove(dir) {
        Ok(Some((file, ctx))) => println!("kumo: context {ctx} removed from {}", file.display()),
        Ok(None) => {}
        Err(e) => println!("kumo: kubeconfig not cleaned up: {e:#}"),
    }
}

/// What `kumo up` merged for `dir` (file, context), as recorded.
fn merged(dir: &Path) -> Option<(String, String)> {
    let text = std::fs::read_to_string(dir.join(kumo::kubeconfig::RECORD)).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    Some((
        v.get("kubeconfig")?.as_str()?.to_owned(),
        v.get("context")?.as_str()?.to_owned(),
    ))
}

/// Whether `pid` is a live process (a zombie is not).
fn alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the parenthesised command name, which may itself hold ')'.
    stat.rsplit_once(')')
        .map(|(_, rest)| !matches!(rest.trim_start().chars().next(), Some('Z' | 'X') | None))
        .unwrap_or(false)
}

/// Whether `pid` runs `kumo up` (guards against a reused pid).
fn is_kumo_up(pid: u32) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    let exe_is_kumo = args
        .first()
        .map(|a| String::from_utf8_lossy(a).contains("kumo"))
        .unwrap_or(false);
    exe_is_kumo && args.iter().skip(1).any(|a| *a == b"up")
}

fn read_pid(dir: &Path) -> Option<u32> {
    std::fs::read_to_string(dir.join(PID_FILE))
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

/// The pid of the `kumo up` running on `dir`, if one is.
pub fn running(dir: &Path) -> Option<u32> {
    read_pid(dir).filter(|p| alive(*p) && is_kumo_up(*p))
}

fn write_pid(dir: &Path, pid: u32) -> Result<()> {
    let path = dir.join(PID_FILE);
    std::fs::write(&path, format!("{pid}\n")).with_context(|| format!("writing {}", path.display()))
}

/// Removes the pid file if it still names `pid`.
fn release(dir: &Path, pid: u32) {
    if read_pid(dir) == Some(pid) {
        let _ = std::fs::remove_file(dir.join(PID_FILE));
    }
}

fn already_running(dir: &Path, pid: u32) -> anyhow::Error {
    anyhow::anyhow!(
        "kumo is already running on {} (pid {pid}); `kumo down --data-dir {}` stops it",
        dir.display(),
        dir.display()
    )
}

/// At the start of a foreground `kumo up`: refuses when another kumo runs on the data
/// directory, writes this process's pid, and exits with 0 on SIGTERM or SIGINT (the
/// components are in-process, so ending the process stops them all).
pub fn foreground(dir: &Path) -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let dir = dir.to_owned();
    let me = std::process::id();
    if let Some(pid) = running(&dir).filter(|p| *p != me) {
        return Err(already_running(&dir, pid));
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    write_pid(&dir, me)?;
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        println!("kumo: {name} received, stopping");
        // Real nodes' machines (containerd, their pods, namespaces) do not end with this
        // process: they are taken down first.
        let machines = dir.clone();
        let _ = tokio::task::spawn_blocking(move || kumo::machine::power_off_all(&machines)).await;
        unmerge(&dir);
        release(&dir, me);
        std::process::exit(0);
    });
    Ok(())
}

/// The last `lines` lines of the file.
fn tail(path: &Path, lines: usize) -> String {
    let mut text = String::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let _ = f.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
        let mut bytes = Vec::new();
        let _ = f.read_to_end(&mut bytes);
        text = String::from_utf8_lossy(&bytes).into_owned();
    }
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Whether a log line is the tracing subscriber's (a timestamp, maybe in colour) rather
/// than one of `kumo up`'s own lines.
fn is_tracing_line(line: &str) -> bool {
    let mut plain = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // An ANSI escape: skip up to its final letter.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            plain.push(c);
        }
    }
    let b = plain.as_bytes();
    b.len() > 20 && b[..4].iter().all(u8::is_ascii_digit) && b[4] == b'-' && b[10] == b'T'
}

/// `kumo up -d`: starts `kumo up` with the same flags (without `-d`) in the background and
/// returns once the cluster answers, after printing what the foreground one printed.
pub async fn up_detached(dir: &Path) -> Result<()> {
    let dir = dir.to_owned();
    if let Some(pid) = running(&dir) {
        return Err(already_running(&dir, pid));
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let log_path = dir.join(LOG_FILE);
    std::fs::File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
    // Appending: the child's logger appends to the same file (see `log_file`).
    let log = std::fs::OpenOptions::new()
        .append(true)
        .open(&log_path)
        .with_context(|| format!("opening {}", log_path.display()))?;
    let args: Vec<OsString> = std::env::args_os()
        .skip(1)
        .filter(|a| a != "-d" && a != "--detach")
        .collect();
    let exe = std::env::current_exe().context("finding the kumo binary")?;
    let mut child = Command::new(exe)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        // Its own process group: a Ctrl-C in this terminal does not reach it.
        .process_group(0)
        .spawn()
        .context("starting kumo up in the background")?;
    let pid = child.id();
    write_pid(&dir, pid)?;
    let admin = dir.join("admin.conf");
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Some(status) = child.try_wait()? {
            release(&dir, pid);
            // Its own one-line error when it printed one, else the end of the log.
            let printed = std::fs::read_to_string(&log_path).unwrap_or_default();
            if let Some(e) = printed
                .lines()
                .rev()
                .find_map(|l| l.strip_prefix(ERROR_PREFIX))
            {
                bail!("{e} (log: {})", log_path.display());
            }
            bail!(
                "kumo up exited ({status}) before the cluster was ready; the end of {}:\n{}",
                log_path.display(),
                tail(&log_path, 30)
            );
        }
        let printed = std::fs::read_to_string(&log_path).unwrap_or_default();
        if printed.contains(READY_MARKER) && admin.exists() {
            if let Ok((client, _)) = crate::status::admin_client(&dir).await {
                if crate::status::readyz(&client).await.is_ok() {
                    break;
                }
            }
        }
        if Instant::now() > deadline {
            let _ = Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
            release(&dir, pid);
            bail!(
                "the cluster did not answer within {} s; stopped it. The end of {}:\n{}",
                READY_TIMEOUT.as_secs(),
                log_path.display(),
                tail(&log_path, 30)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The lines after the marker are printed in the same write; give stragglers a moment.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let printed = std::fs::read_to_string(&log_path).unwrap_or_default();
    for line in printed.lines().filter(|l| !is_tracing_line(l)) {
        println!("{line}");
    }
    println!(
        "kumo: running in the background (pid {pid}); log in {}; `kumo down --data-dir {}` stops it",
        log_path.display(),
        dir.display()
    );
    Ok(())
}

/// `kumo down`: SIGTERM to the `kumo up` of the data directory, SIGKILL if it is still
/// there after a while; removes the pid file.
pub fn down(dir: &Path) -> Result<()> {
    let dir = dir.to_owned();
    let Some(pid) = read_pid(&dir) else {
        println!("kumo is not running on {} (no {PID_FILE})", dir.display());
        kumo::machine::power_off_all(&dir);
        unmerge(&dir);
        return Ok(());
    };
    if !alive(pid) || !is_kumo_up(pid) {
        kumo::machine::power_off_all(&dir);
        unmerge(&dir);
        let _ = std::fs::remove_file(dir.join(PID_FILE));
        println!(
            "kumo is not running on {} (removed the stale {PID_FILE} of pid {pid})",
            dir.display()
        );
        return Ok(());
    }
    // The process takes its context out itself as it stops; say so here too.
    let was_merged = merged(&dir);
    signal(pid, "TERM")?;
    let mut deadline = Instant::now() + STOP_TIMEOUT;
    let mut killed = false;
    while alive(pid) {
        if Instant::now() > deadline {
            if killed {
                bail!("pid {pid} is still there after SIGKILL");
            }
            eprintln!(
                "kumo: pid {pid} did not stop within {} s; sending SIGKILL",
                STOP_TIMEOUT.as_secs()
            );
            signal(pid, "KILL")?;
            killed = true;
            deadline = Instant::now() + Duration::from_secs(5);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    release(&dir, pid);
    // What a killed kumo could not take down itself: its nodes' machines.
    kumo::machine::power_off_all(&dir);
    if merged(&dir).is_some() {
        unmerge(&dir);
    } else if let Some((file, ctx)) = was_merged {
        println!("kumo: context {ctx} removed from {file}");
    }
    println!("kumo: stopped (pid {pid}) on {}", dir.display());
    Ok(())
}

fn signal(pid: u32, sig: &str) -> Result<()> {
    let status = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .context("running kill")?;
    if !status.success() && alive(pid) {
        bail!("kill -{sig} {pid} failed ({status})");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracing_lines_are_told_from_kumo_lines() {
        assert!(is_tracing_line(
            "2026-12-03T09:44:52.123456Z  WARN kumo::cluster: scheduler stopped"
        ));
        assert!(is_tracing_line(
            "\x1b[2m2026-12-03T09:44:52.123456Z\x1b[0m \x1b[33m WARN\x1b[0m x"
        ));
        assert!(!is_tracing_line(
            "kumo: API server ready at https://127.0.0.1:6443"
        ));
        assert!(!is_tracing_line("  export KUBECONFIG=/tmp/x/admin.conf"));
        assert!(!is_tracing_line(READY_MARKER));
    }

    #[test]
    fn a_held_port_gives_way_to_a_free_one() {
        let dir = tempfile::tempdir().unwrap();
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = held.local_addr().unwrap().port();
        // The port this data directory had before is taken by someone else now.
        std::fs::write(
            dir.path().join("admin.conf"),
            format!("clusters:\n- cluster:\n    server: https://127.0.0.1:{port}\n"),
        )
        .unwrap();
        let got = api_port(dir.path(), None).unwrap();
        assert_ne!(got.port, port);
        assert_eq!(
            got.note.unwrap(),
            format!(
                "port {port} is held by another program; the API server takes {}",
                got.port
            )
        );
        // Asked for by name, it is refused in one line.
        let e = api_port(dir.path(), Some(port)).err().unwrap().to_string();
        assert!(
            e.starts_with(&format!(
                "port {port} on 127.0.0.1 is held by another program"
            )),
            "{e}"
        );
        // Free again: kept.
        drop(held);
        assert_eq!(api_port(dir.path(), None).unwrap().port, port);
    }

    #[test]
    fn this_process_is_alive_and_a_bogus_pid_is_not() {
        assert!(alive(std::process::id()));
        assert!(!alive(u32::MAX - 1));
    }
}
