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
/// The background process's stdout and stderr.
pub const LOG_FILE: &str = "kumo.log";
/// How long `kumo up -d` waits for the cluster to answer.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long `kumo down` waits after SIGTERM before SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);
/// The line `kumo up` prints once it is usable (the tests and users rely on it).
const READY_MARKER: &str = "export KUBECONFIG=";

/// `--data-dir` when given, else `$HOME/.kumo/default` (as `kumo up` picks it).
pub fn data_dir(given: Option<PathBuf>) -> Result<PathBuf> {
    match given {
        Some(d) => Ok(d),
        None => {
            let home = std::env::var_os("HOME")
                .ok_or_else(|| anyhow::anyhow!("HOME is not set; pass --data-dir"))?;
            Ok(PathBuf::from(home).join(".kumo").join("default"))
        }
    }
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
pub fn foreground(given: Option<PathBuf>) -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let dir = data_dir(given)?;
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
pub async fn up_detached(given: Option<PathBuf>) -> Result<()> {
    let dir = data_dir(given)?;
    if let Some(pid) = running(&dir) {
        return Err(already_running(&dir, pid));
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let log_path = dir.join(LOG_FILE);
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
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
pub fn down(given: Option<PathBuf>) -> Result<()> {
    let dir = data_dir(given)?;
    let Some(pid) = read_pid(&dir) else {
        println!("kumo is not running on {} (no {PID_FILE})", dir.display());
        return Ok(());
    };
    if !alive(pid) || !is_kumo_up(pid) {
        let _ = std::fs::remove_file(dir.join(PID_FILE));
        println!(
            "kumo is not running on {} (removed the stale {PID_FILE} of pid {pid})",
            dir.display()
        );
        return Ok(());
    }
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
    }

    #[test]
    fn this_process_is_alive_and_a_bogus_pid_is_not() {
        assert!(alive(std::process::id()));
        assert!(!alive(u32::MAX - 1));
    }
}
