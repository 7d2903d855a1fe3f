//! End-to-end tests, driving the repository's own commands as a person would.
//!
//! Today they check the reference harness (docs/REFERENCE.md): `scripts/reference up` starts
//! the real kube-apiserver v1.37.2 with its controllers, and `scripts/conformance` runs the
//! official conformance binary against it (`tests/reference_harness.rs`). The helpers here are
//! small: where the repository is, [`run`] to run a command and keep its output, and
//! [`ReferenceCluster`], which runs `scripts/reference up --dir D` and `down --dir D` when
//! dropped.
//!
//! The reference binaries are built by `scripts/reference build` (scripts/test runs it before
//! `cargo test`); the tests fail, saying so, when they are missing, and never pass silently.

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};

use anyhow::{bail, Context, Result};

/// The binaries the reference harness tests need in `.reference/bin`.
pub const REFERENCE_BINARIES: &[&str] = &[
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "e2e.test",
];

/// The repository's root directory (two levels above this crate).
pub fn repo_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .nth(2)
        .unwrap_or(manifest)
        .to_path_buf()
}

/// The test names a list under the repository root holds (one a line; comments and blank
/// lines skipped), as `scripts/conformance --list` reads it.
pub fn listed_in(file: &str) -> Vec<String> {
    std::fs::read_to_string(repo_root().join(file))
        .unwrap_or_default()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect()
}

/// Runs `scripts/conformance --list LIST` against the cluster of `kubeconfig` (`parallel`
/// ginkgo processes, reports in `out`) and checks that all `count` tests passed.
pub fn conformance_list_passes(
    list: &Path,
    count: usize,
    kubeconfig: &Path,
    out: &Path,
    parallel: u32,
) -> Result<()> {
    let result = run(Command::new(repo_root().join("scripts/conformance"))
        .arg("--list")
        .arg(list)
        .arg("--parallel")
        .arg(parallel.to_string())
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--out")
        .arg(out))?;
    let last = result.stdout.lines().last().unwrap_or("");
    if !result.status.success() || !last.starts_with(&format!("{count} passed, 0 failed")) {
        anyhow::bail!(
            "a recorded test regressed ({last}):\n{}\n{}",
            result.stdout,
            result.stderr
        );
    }
    Ok(())
}

/// `.reference/bin`, where `scripts/reference build` puts the reference binaries.
pub fn reference_bin_dir() -> PathBuf {
    repo_root().join(".reference").join("bin")
}

fn is_executable(path: &Path) -> bool {
    path.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Fails, naming the command that builds them, if any of `names` is not in `.reference/bin`.
pub fn require_reference_binaries(names: &[&str]) -> Result<()> {
    let dir = reference_bin_dir();
    let missing: Vec<&str> = names
        .iter()
        .copied()
        .filter(|name| !is_executable(&dir.join(name)))
        .collect();
    if !missing.is_empty() {
        bail!(
            "reference binaries missing from {}: {}. Run `scripts/reference build` first \
             (about 14 minutes from an empty Go cache; scripts/test runs it before cargo test)",
            dir.display(),
            missing.join(", ")
        );
    }
    Ok(())
}

/// Fails if `name` is not an executable on `PATH`.
pub fn require_command(name: &str) -> Result<()> {
    let found = std::env::var_os("PATH")
        .map(|dirs| std::env::split_paths(&dirs).any(|dir| is_executable(&dir.join(name))))
        .unwrap_or(false);
    if !found {
        bail!("`{name}` is not on PATH; the reference harness tests need it");
    }
    Ok(())
}

/// What a finished command printed, and how it ended.
#[derive(Debug)]
pub struct CmdOutput {
    /// The command line, for messages.
    pub command: String,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl CmdOutput {
    /// The standard output if the command succeeded, else an error with all of its output.
    pub fn ok(self) -> Result<String> {
        if self.status.success() {
            Ok(self.stdout)
        } else {
            bail!("{self}")
        }
    }
}

impl std::fmt::Display for CmdOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "`{}` ended with {}", self.command, self.status)?;
        writeln!(f, "----- stdout -----\n{}", self.stdout.trim_end())?;
        write!(f, "----- stderr -----\n{}", self.stderr.trim_end())
    }
}

/// Runs `cmd` to completion (stdin closed) and captures its output.
pub fn run(cmd: &mut Command) -> Result<CmdOutput> {
    let command = std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(OsStr::to_string_lossy)
        .collect::<Vec<_>>()
        .join(" ");
    let out = cmd
        .stdin(std::process::Stdio::null())
        .output()
        .with_context(|| format!("running `{command}`"))?;
    Ok(CmdOutput {
        command,
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// A reference control plane started by `scripts/reference up --dir D`; stopped (and D
/// deleted) by `scripts/reference down --dir D` on [`ReferenceCluster::down`] or drop.
#[derive(Debug)]
pub struct ReferenceCluster {
    dir: PathBuf,
    kubeconfig: PathBuf,
    up_output: String,
    running: bool,
}

impl ReferenceCluster {
    /// Starts etcd and kube-apiserver (and, with `with_controllers`, kube-controller-manager
    /// and kube-scheduler) with their state in `dir`, which must not exist yet. Fails if the
    /// binaries are not built: `up` would otherwise spend minutes building them.
    pub fn up(dir: &Path, with_controllers: bool) -> Result<Self> {
        let mut needed = vec!["etcd", "kube-apiserver"];
        if with_controllers {
            needed.extend(["kube-controller-manager", "kube-scheduler"]);
        }
        require_reference_binaries(&needed)?;
        let mut cmd = Command::new(repo_root().join("scripts/reference"));
        cmd.arg("up").arg("--dir").arg(dir);
        if with_controllers {
            cmd.arg("--with-controllers");
        }
        let out = run(&mut cmd)?;
        let mut cluster = Self {
            dir: dir.to_path_buf(),
            kubeconfig: dir.join("admin.kubeconfig"),
            up_output: out.stdout.clone(),
            // `up` stops what it started when it fails, but leaves the directory: let
            // `down` (on drop) remove it in every case.
            running: true,
        };
        if !out.status.success() {
            cluster.running = false;
            let _ = cluster.stop();
            bail!("scripts/reference up failed:\n{out}");
        }
        if !cluster.kubeconfig.is_file() {
            bail!(
                "scripts/reference up succeeded but wrote no {}:\n{out}",
                cluster.kubeconfig.display()
            );
        }
        Ok(cluster)
    }

    /// The admin kubeconfig (`D/admin.kubeconfig`).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The state directory D.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// What `scripts/reference up` printed.
    pub fn up_output(&self) -> &str {
        &self.up_output
    }

    /// Runs the `kubectl` on PATH against this cluster; its stdout, or an error with its
    /// output if it fails.
    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        run(Command::new("kubectl")
            .env_remove("KUBECONFIG")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--request-timeout=30s")
            .args(args))?
        .ok()
    }

    /// Stops everything and deletes the directory.
    pub fn down(mut self) -> Result<()> {
        self.running = false;
        self.stop()
    }

    fn stop(&self) -> Result<()> {
        run(Command::new(repo_root().join("scripts/reference"))
            .arg("down")
            .arg("--dir")
            .arg(&self.dir))?
        .ok()
        .map(drop)
    }
}

impl Drop for ReferenceCluster {
    fn drop(&mut self) {
        if self.running {
            self.running = false;
            if let Err(e) = self.stop() {
                eprintln!(
                    "stopping the reference cluster in {}: {e:#}",
                    self.dir.display()
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_reference_binary_fails_naming_the_build_command() {
        let err = require_reference_binaries(&["no-such-reference-binary"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("no-such-reference-binary"), "{err}");
        assert!(err.contains("scripts/reference build"), "{err}");
    }

    #[test]
    fn repo_root_is_the_workspace() {
        assert!(repo_root().join("scripts/reference").is_file());
        assert!(repo_root().join("crates/e2e/Cargo.toml").is_file());
    }
}
