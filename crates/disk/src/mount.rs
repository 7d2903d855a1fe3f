//! What staging and publishing a volume does on an instance.

use std::path::{Path, PathBuf};
use std::process::Command;

use nix::mount::{MntFlags, MsFlags};

/// A mount step that failed.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// The volume's disk is not on this instance.
    #[error("the volume {0} has no disk on this instance")]
    NoDisk(String),
    /// A file system type this driver does not make.
    #[error("file system type {0:?} is not supported (ext4 and xfs are)")]
    FsType(String),
    /// Growing a mounted file system is not possible here.
    #[error("{0}")]
    NotOnline(String),
    /// A command failed.
    #[error("{command}: {detail}")]
    Command {
        /// What ran.
        command: String,
        /// Its error output or exit status.
        detail: String,
    },
    /// A system call failed.
    #[error("{what} {path}: {source}")]
    Sys {
        /// What was done.
        what: &'static str,
        /// On what.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// A volume's usage in bytes and inodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Bytes in all.
    pub bytes_total: u64,
    /// Bytes used.
    pub bytes_used: u64,
    /// Bytes available.
    pub bytes_available: u64,
    /// Inodes in all.
    pub inodes_total: u64,
    /// Inodes used.
    pub inodes_used: u64,
    /// Inodes free.
    pub inodes_free: u64,
}

/// How a volume gets onto an instance and into its pods. Calls block (run them off the
/// async runtime) and are idempotent, as the CSI calls they serve.
pub trait Mounter: Send + Sync + 'static {
    /// Makes the volume's file system available at `staging` (a directory the node may
    /// create), formatting it with `fs_type` first if it has none.
    fn stage(&self, volume_id: &str, staging: &Path, fs_type: &str) -> Result<(), MountError>;
    /// Undoes [`Mounter::stage`].
    fn unstage(&self, volume_id: &str, staging: &Path) -> Result<(), MountError>;
    /// Makes the staged file system visible at `target` (for one pod).
    fn publish(&self, staging: &Path, target: &Path, readonly: bool) -> Result<(), MountError>;
    /// Undoes [`Mounter::publish`] and removes `target`.
    fn unpublish(&self, target: &Path) -> Result<(), MountError>;
    /// The file system's usage at `path`; `None` where there is no file system to measure.
    fn usage(&self, path: &Path) -> Result<Option<Usage>, MountError>;
    /// Grows the staged file system to its disk's new size; the new size in bytes, `None`
    /// where there is no file system.
    fn expand(&self, volume_id: &str, staging: &Path) -> Result<Option<u64>, MountError>;
}

fn sys<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> MountError + 'a {
    move |source| MountError::Sys {
        what,
        path: path.to_path_buf(),
        source,
    }
}

fn errno<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(nix::Error) -> MountError + 'a {
    move |e| MountError::Sys {
        what,
        path: path.to_path_buf(),
        source: std::io::Error::from(e),
    }
}

/// A simulated instance's mounts: the directories a mount makes, and no file system (the
/// simulator keeps the volume's files, by volume id).
#[derive(Clone, Copy, Debug, Default)]
pub struct Directories;

impl Mounter for Directories {
    fn stage(&self, _: &str, staging: &Path, fs_type: &str) -> Result<(), MountError> {
        check_fs_type(fs_type)?;
        std::fs::create_dir_all(staging).map_err(sys("creating", staging))
    }

    fn unstage(&self, _: &str, staging: &Path) -> Result<(), MountError> {
        remove_dir(staging)
    }

    fn publish(&self, _: &Path, target: &Path, _: bool) -> Result<(), MountError> {
        std::fs::create_dir_all(target).map_err(sys("creating", target))
    }

    fn unpublish(&self, target: &Path) -> Result<(), MountError> {
        remove_dir(target)
    }

    fn usage(&self, _: &Path) -> Result<Option<Usage>, MountError> {
        Ok(None)
    }

    fn expand(&self, _: &str, _: &Path) -> Result<Option<u64>, MountError> {
        Ok(None)
    }
}

/// The file system a new disk gets: `fs_type`, ext4 when none is asked for.
fn check_fs_type(fs_type: &str) -> Result<&'static str, MountError> {
    match fs_type {
        "" | "ext4" => Ok("ext4"),
        "xfs" => Ok("xfs"),
        other => Err(MountError::FsType(other.to_owned())),
    }
}

/// The file system on `dev` (`None`: none; blkid exits 2 then).
fn fs_on(dev: &str) -> Result<Option<String>, MountError> {
    let found = Command::new("blkid")
        .args(["-p", "-s", "TYPE", "-o", "value", dev])
        .output()
        .map_err(|e| MountError::Command {
            command: format!("blkid {dev}"),
            detail: e.to_string(),
        })?;
    let t = String::from_utf8_lossy(&found.stdout).trim().to_owned();
    Ok((!t.is_empty()).then_some(t))
}

/// Whether the ext4 file system on `dev` is smaller than the device (its disk grew).
fn ext4_smaller_than_device(dev: &str) -> Result<bool, MountError> {
    let header = run(Command::new("dumpe2fs").args(["-h", dev]))?;
    let field = |name: &str| -> Option<u64> {
        header
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
    };
    let (Some(blocks), Some(size)) = (field("Block count:"), field("Block size:")) else {
        return Ok(false);
    };
    let device: u64 = run(Command::new("blockdev").args(["--getsize64", dev]))?
        .trim()
        .parse()
        .unwrap_or(0);
    Ok(blocks * size + size <= device)
}

fn remove_dir(path: &Path) -> Result<(), MountError> {
    match std::fs::remove_dir(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(sys("removing", path)(e)),
        _ => Ok(()),
    }
}

/// A real instance's mounts: the volume's file (the cloud's disk, see
/// `kumo_cloud::server::volume_file`) as a loop device with an ext4 file system, mounted at
/// the staging path and bind-mounted into each pod's target.
#[derive(Clone, Debug)]
pub struct Loop {
    cloud_dir: PathBuf,
}

impl Loop {
    /// Disks are the volume files of the cloud whose data directory is `cloud_dir`.
    pub fn new(cloud_dir: impl Into<PathBuf>) -> Loop {
        Loop {
            cloud_dir: cloud_dir.into(),
        }
    }

    fn disk(&self, volume_id: &str) -> Result<PathBuf, MountError> {
        let valid = volume_id
            .strip_prefix("vol-")
            .is_some_and(|h| !h.is_empty() && h.bytes().all(|b| b.is_ascii_hexdigit()));
        let file = kumo_cloud::server::volume_file(&self.cloud_dir, volume_id);
        if !valid || !file.is_file() {
            return Err(MountError::NoDisk(volume_id.to_owned()));
        }
        Ok(file)
    }

    /// The loop devices backed by `file`.
    fn devices(file: &Path) -> Result<Vec<String>, MountError> {
        let out = run(Command::new("losetup").arg("-j").arg(file))?;
        // "/dev/loop3: [2049]:1234 (/path/vol-x.img)"
        Ok(out
            .lines()
            .filter_map(|l| l.split(':').next())
            .filter(|d| d.starts_with("/dev/loop"))
            .map(str::to_owned)
            .collect())
    }

    fn device(file: &Path) -> Result<String, MountError> {
        if let Some(d) = Self::devices(file)?.into_iter().next() {
            return Ok(d);
        }
        Ok(
            run(Command::new("losetup").args(["--find", "--show"]).arg(file))?
                .trim()
                .to_owned(),
        )
    }
}

fn run(cmd: &mut Command) -> Result<String, MountError> {
    let shown = format!("{cmd:?}").replace('"', "");
    let out = cmd.output().map_err(|e| MountError::Command {
        command: shown.clone(),
        detail: e.to_string(),
    })?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr).trim().to_owned();
        return Err(MountError::Command {
            command: shown,
            detail: if err.is_empty() {
                out.status.to_string()
            } else {
                err
            },
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether `path` is a mount point (its own line in this process's mountinfo).
pub fn is_mount_point(path: &Path) -> bool {
    let Ok(canon) = std::fs::canonicalize(path) else {
        return false;
    };
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|m| Path::new(&unescape(m)) == canon)
}

/// mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn unmount(path: &Path) -> Result<(), MountError> {
    while is_mount_point(path) {
        nix::mount::umount2(path, MntFlags::empty()).map_err(errno("unmounting", path))?;
    }
    Ok(())
}

impl Mounter for Loop {
    fn stage(&self, volume_id: &str, staging: &Path, fs_type: &str) -> Result<(), MountError> {
        let file = self.disk(volume_id)?;
        std::fs::create_dir_all(staging).map_err(sys("creating", staging))?;
        if is_mount_point(staging) {
            return Ok(());
        }
        let fs_type = check_fs_type(fs_type)?;
        let dev = Self::device(&file)?;
        // A new disk is formatted once; a disk keeps the file system it has.
        let fs = match fs_on(&dev)? {
            None => {
                match fs_type {
                    "xfs" => run(Command::new("mkfs.xfs").args(["-q", &dev]))?,
                    _ => run(Command::new("mkfs.ext4").args(["-q", "-F", &dev]))?,
                };
                fs_type.to_owned()
            }
            Some(fs) => {
                check_fs_type(&fs)?;
                fs
            }
        };
        // A disk that grew while unmounted gets its file system grown before the mount
        // (ext4's offline resize, after the check it requires).
        if fs == "ext4" && ext4_smaller_than_device(&dev)? {
            let check = Command::new("e2fsck")
                .args(["-f", "-p", &dev])
                .status()
                .map_err(|e| MountError::Command {
                    command: format!("e2fsck -f -p {dev}"),
                    detail: e.to_string(),
                })?;
            // 0: clean, 1: errors corrected.
            if !matches!(check.code(), Some(0 | 1)) {
                return Err(MountError::Command {
                    command: format!("e2fsck -f -p {dev}"),
                    detail: check.to_string(),
                });
            }
            run(Command::new("resize2fs").arg(&dev))?;
        }
        nix::mount::mount(
            Some(dev.as_str()),
            staging,
            Some(fs.as_str()),
            MsFlags::empty(),
            None::<&str>,
        )
        .map_err(errno("mounting", staging))?;
        if fs == "xfs" {
            run(Command::new("xfs_growfs").arg(staging))?;
        }
        Ok(())
    }

    fn unstage(&self, volume_id: &str, staging: &Path) -> Result<(), MountError> {
        unmount(staging)?;
        remove_dir(staging)?;
        if let Ok(file) = self.disk(volume_id) {
            for d in Self::devices(&file)? {
                run(Command::new("losetup").args(["-d", &d]))?;
            }
        }
        Ok(())
    }

    fn publish(&self, staging: &Path, target: &Path, readonly: bool) -> Result<(), MountError> {
        if !is_mount_point(staging) {
            return Err(MountError::Sys {
                what: "publishing from",
                path: staging.to_path_buf(),
                source: std::io::Error::other("the volume is not staged there"),
            });
        }
        std::fs::create_dir_all(target).map_err(sys("creating", target))?;
        if is_mount_point(target) {
            return Ok(());
        }
        nix::mount::mount(
            Some(staging),
            target,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(errno("bind-mounting", target))?;
        if readonly {
            nix::mount::mount(
                None::<&str>,
                target,
                None::<&str>,
                MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
                None::<&str>,
            )
            .map_err(errno("remounting read-only", target))?;
        }
        Ok(())
    }

    fn unpublish(&self, target: &Path) -> Result<(), MountError> {
        unmount(target)?;
        remove_dir(target)
    }

    fn usage(&self, path: &Path) -> Result<Option<Usage>, MountError> {
        let s = nix::sys::statvfs::statvfs(path).map_err(errno("measuring", path))?;
        let frag = s.fragment_size();
        Ok(Some(Usage {
            bytes_total: s.blocks() * frag,
            bytes_used: (s.blocks() - s.blocks_free()) * frag,
            bytes_available: s.blocks_available() * frag,
            inodes_total: s.files(),
            inodes_used: s.files() - s.files_free(),
            inodes_free: s.files_free(),
        }))
    }

    fn expand(&self, volume_id: &str, staging: &Path) -> Result<Option<u64>, MountError> {
        let file = self.disk(volume_id)?;
        let dev = Self::device(&file)?;
        // The loop device learns its file's new size, then the file system grows online.
        run(Command::new("losetup").args(["-c", &dev]))?;
        match fs_on(&dev)?.as_deref() {
            Some("xfs") => {
                run(Command::new("xfs_growfs").arg(staging))?;
            }
            _ => {
                if ext4_smaller_than_device(&dev)? {
                    if let Err(e) = run(Command::new("resize2fs").arg(&dev)) {
                        // The kernel grows a mounted ext4 only for CAP_SYS_RESOURCE.
                        if e.to_string().contains("Permission denied") {
                            return Err(MountError::NotOnline(format!(
                                "growing the mounted ext4 file system needs CAP_SYS_RESOURCE, which this machine does not grant: it grows to its disk's size when the volume is next staged (once no pod on this node uses it); xfs volumes grow online ({e})"
                            )));
                        }
                        return Err(e);
                    }
                }
            }
        }
        Ok(self.usage(staging)?.map(|u| u.bytes_total))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_read() {
        assert_eq!(unescape(r"/a\040b"), "/a b");
        assert_eq!(unescape(r"/plain"), "/plain");
        assert_eq!(unescape(r"/x\04"), r"/x\04");
    }
}
