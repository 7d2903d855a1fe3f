//! The web terminal's shell: bash with kubectl and the user's kubeconfig, confined. It runs
//! in namespaces of its own (mount, PID, IPC, UTS) under a root of its own: a tmpfs with the
//! system's `/usr` read-only, kubectl, a home holding only the kubeconfig, a fresh `/proc`
//! (its own processes only) and `/dev/pts`; as `nobody`, with no capabilities and no new
//! privileges. The host's files (the data directories, the management cluster's
//! credentials) are not in its root; its processes see none of the host's. `script` gives
//! it a terminal; its output is the WebSocket's.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use crate::Error;

/// What runs the shell, as a `sh -c` script: the root, then the chroot and the drop of
/// privileges. `$1` the root directory, `$2` the kubeconfig, `$3` kubectl, `$4` the user.
const SETUP: &str = r#"set -eu
R=$1; KC=$2; KUBECTL=$3; U=$4
mount -t tmpfs -o mode=755,size=64m tmpfs "$R"
mkdir -p "$R/usr" "$R/proc" "$R/tmp" "$R/dev/pts" "$R/etc" "$R/opt/kubectl" "$R/home/$U/.kube"
mount --bind /usr "$R/usr"
mount -o remount,bind,ro "$R/usr"
for d in bin lib lib64 sbin; do [ -e "/$d" ] && ln -s "usr/$d" "$R/$d"; done
touch "$R/opt/kubectl/kubectl"
mount --bind "$KUBECTL" "$R/opt/kubectl/kubectl"
mount -o remount,bind,ro "$R/opt/kubectl/kubectl"
cp "$KC" "$R/home/$U/.kube/config"
chown -R 65534:65534 "$R/home/$U" "$R/tmp"
chmod 700 "$R/home/$U"
chmod 1777 "$R/tmp"
for f in null zero urandom random tty; do touch "$R/dev/$f"; mount --bind "/dev/$f" "$R/dev/$f"; done
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts "$R/dev/pts"
ln -s pts/ptmx "$R/dev/ptmx"
mount -t proc -o nosuid,nodev,noexec proc "$R/proc"
printf 'root:x:0:0::/root:/bin/false\n%s:x:65534:65534::/home/%s:/bin/bash\n' "$U" "$U" > "$R/etc/passwd"
printf 'root:x:0:\n%s:x:65534:\n' "$U" > "$R/etc/group"
printf 'PS1='"'"'%s@handson:\\w$ '"'"'\nalias k=kubectl\n' "$U" > "$R/etc/bash.bashrc"
hostname handson
cd "$R"
exec chroot "$R" /usr/bin/setpriv --reuid=65534 --regid=65534 --clear-groups --no-new-privs \
  --inh-caps=-all --bounding-set=-all \
  /usr/bin/env -i HOME="/home/$U" USER="$U" TERM=xterm-256color LANG=C.UTF-8 \
  PATH=/opt/kubectl:/usr/local/bin:/usr/bin:/bin KUBECONFIG="/home/$U/.kube/config" \
  /usr/bin/script -qfec "cd /home/$U; exec /bin/bash --rcfile /etc/bash.bashrc -i" /dev/null
"#;

/// The kubectl the shell gets: the one on this machine's PATH, resolved.
pub fn find_kubectl() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("kubectl"))
        .find(|p| p.is_file())
        .and_then(|p| std::fs::canonicalize(p).ok())
}

/// A running shell: its process (the namespaces' first, killed by PID with all in them) and
/// its root directory (removed when it ends).
pub struct Shell {
    pub child: tokio::process::Child,
    pub root: PathBuf,
}

impl Shell {
    /// Starts the confined shell of `user` with `kubeconfig` (root under `work`).
    pub fn start(work: &Path, user: &str, kubeconfig: &Path) -> Result<Shell, Error> {
        let kubectl = find_kubectl().ok_or_else(|| Error::Invalid("no kubectl on PATH".into()))?;
        let id: u64 = rand::random();
        let root = work.join(format!("{user}-{id:016x}"));
        std::fs::create_dir_all(&root).map_err(|e| Error::Io(root.display().to_string(), e))?;
        let child = tokio::process::Command::new("unshare")
            .args([
                "--mount",
                "--propagation",
                "private",
                "--pid",
                "--ipc",
                "--uts",
                "--fork",
                "--kill-child",
            ])
            .args(["sh", "-c", SETUP, "setup"])
            .arg(&root)
            .arg(kubeconfig)
            .arg(&kubectl)
            .arg(user)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| Error::Io("unshare".into(), e))?;
        Ok(Shell { child, root })
    }
}

impl Drop for Shell {
    fn drop(&mut self) {
        // The namespaces' first process: with it every process of the shell goes
        // (`--kill-child`), and the root's mounts with its mount namespace.
        let _ = self.child.start_kill();
        let _ = std::fs::remove_dir(&self.root);
    }
}
