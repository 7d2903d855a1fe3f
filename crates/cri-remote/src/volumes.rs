//! The node-side files of a container's mounts (the kubelet's volume manager, for the
//! volumes it makes itself): emptyDirs under the pod's directory, the files of ConfigMap,
//! Secret, downward API and projected volumes written there, the managed `/etc/hosts`
//! and the termination-message file; and the cleanup when the pod ends.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use kumo_cri::{ContainerConfig, Source};

/// One bind mount of a container.
pub struct HostMount {
    pub container_path: String,
    pub host_path: PathBuf,
    pub read_only: bool,
}

/// What a container's mounts need on the node.
pub struct Prepared {
    pub mounts: Vec<HostMount>,
    /// The file mounted at its terminationMessagePath.
    pub termination_file: PathBuf,
}

/// The directory of a `Source::Files` mount: one per container and mount path, so a
/// refresh writes where the container reads.
fn files_dir(pod_dir: &Path, container: &str, mount_path: &str) -> PathBuf {
    let key: String = mount_path
        .trim_matches('/')
        .chars()
        .map(|c| if c == '/' { '~' } else { c })
        .collect();
    pod_dir
        .join("volumes")
        .join("kumo.dev~files")
        .join(container)
        .join(key)
}

/// Writes `files` (relative path → (content, mode)) into `dir`, removing what is not
/// among them.
fn write_files(dir: &Path, files: &kumo_cri::Files) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for (rel, (content, mode)) in files {
        let rel = rel.trim_start_matches('/');
        if rel.split('/').any(|p| p == "..") {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("file path {rel:?} leaves its volume"),
            ));
        }
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        // Written beside and renamed, so a reader never sees half a file.
        let tmp = path.with_extension("kumo-tmp");
        std::fs::write(&tmp, content)?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(*mode))?;
        std::fs::rename(&tmp, &path)?;
    }
    // Files that left the volume go.
    let keep: std::collections::HashSet<PathBuf> = files
        .keys()
        .map(|r| dir.join(r.trim_start_matches('/')))
        .collect();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d)?.flatten() {
            let p = entry.path();
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(p);
            } else if !keep.contains(&p) {
                let _ = std::fs::remove_file(&p);
            }
        }
    }
    Ok(())
}

fn join_sub_path(base: PathBuf, sub_path: &str) -> io::Result<PathBuf> {
    if sub_path.is_empty() {
        return Ok(base);
    }
    if sub_path.starts_with('/') || sub_path.split('/').any(|p| p == "..") {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("subPath {sub_path:?} leaves its volume"),
        ));
    }
    // Symbolic links in the volume may not lead out of it (what a container wrote there
    // could point anywhere on the node): each part that exists must resolve inside it.
    let root = std::fs::canonicalize(&base).unwrap_or_else(|_| base.clone());
    let mut p = base.clone();
    for part in sub_path.split('/').filter(|s| !s.is_empty() && *s != ".") {
        p.push(part);
        if std::fs::symlink_metadata(&p).is_err() {
            break;
        }
        let resolved = match std::fs::canonicalize(&p) {
            Ok(r) => r,
            // A link to nothing: where it points, read lexically.
            Err(_) => lexical_target(&p)?,
        };
        if !resolved.starts_with(&root) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("subpath {:?} not within volume path {:?}", resolved, root),
            ));
        }
    }
    Ok(base.join(sub_path))
}

/// Where the link at `link` points, its `..` resolved without the file system (for a link
/// whose target does not exist).
fn lexical_target(link: &Path) -> io::Result<PathBuf> {
    let target = std::fs::read_link(link)?;
    let full = match link.parent() {
        Some(dir) if target.is_relative() => dir.join(target),
        _ => target,
    };
    let mut out = PathBuf::new();
    for c in full.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    Ok(out)
}

/// The directory of `sub_path` in the volume at `base`, made if it is not there yet (as
/// upstream's kubelet makes it). Any failure, a read-only volume's included, is the mount's
/// configuration error (`InvalidInput`: CreateContainerConfigError).
fn sub_path_dir(base: PathBuf, sub_path: &str) -> io::Result<PathBuf> {
    let p = join_sub_path(base, sub_path)?;
    if !sub_path.is_empty() && std::fs::symlink_metadata(&p).is_err() {
        std::fs::create_dir_all(&p).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("error creating subPath directory {}: {e}", p.display()),
            )
        })?;
    }
    Ok(p)
}

/// Makes what `config`'s mounts need under `pod_dir`.
pub fn prepare(pod_dir: &Path, config: &ContainerConfig) -> io::Result<Prepared> {
    let mut mounts = Vec::new();
    for m in &config.mounts {
        // readOnlyRootFilesystem is the container's flag, not a mount.
        if m.path == "/" {
            continue;
        }
        let host_path = match &m.source {
            Source::EmptyDir(name) => {
                let dir = pod_dir
                    .join("volumes")
                    .join("kubernetes.io~empty-dir")
                    .join(name);
                std::fs::create_dir_all(&dir)?;
                // medium: Memory is a tmpfs of its own.
                if m.tmpfs && !is_mount_point(&dir) {
                    nix::mount::mount(
                        Some("tmpfs"),
                        &dir,
                        Some("tmpfs"),
                        nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
                        None::<&str>,
                    )
                    .map_err(io::Error::from)?;
                }
                std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777))?;
                if let Some(gid) = config.fs_group {
                    set_ownership(&dir, gid, false)?;
                }
                sub_path_dir(dir, &m.sub_path)?
            }
            // A disk is where its driver published it for this pod.
            Source::HostPath(p) | Source::Disk { path: p, .. } => {
                sub_path_dir(PathBuf::from(p), &m.sub_path)?
            }
            Source::Files(files) => {
                let dir = files_dir(pod_dir, &config.name, &m.path);
                write_files(&dir, files)?;
                if let Some(gid) = config.fs_group {
                    set_ownership(&dir, gid, true)?;
                }
                let p = join_sub_path(dir, &m.sub_path)?;
                if !m.sub_path.is_empty() && !p.exists() {
                    std::fs::create_dir_all(&p)?;
                }
                p
            }
            Source::Image(image) => {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!("image volume {image:?}: the runtime mounts no image volumes"),
                ));
            }
        };
        mounts.push(HostMount {
            container_path: m.path.clone(),
            host_path,
            read_only: m.read_only,
        });
    }
    // The /etc/hosts the kubelet manages (the pod's names, or the node's for host
    // network); the other files of the config are the simulator's.
    if let Some(hosts) = config.files.get("/etc/hosts") {
        let path = pod_dir.join("etc-hosts");
        std::fs::create_dir_all(pod_dir)?;
        std::fs::write(&path, hosts)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))?;
        if !mounts.iter().any(|m| m.container_path == "/etc/hosts") {
            mounts.push(HostMount {
                container_path: "/etc/hosts".into(),
                host_path: path,
                read_only: false,
            });
        }
    }
    let dir = pod_dir.join("containers").join(&config.name);
    std::fs::create_dir_all(&dir)?;
    let termination_file = dir.join(config.attempt.to_string());
    std::fs::write(&termination_file, "")?;
    std::fs::set_permissions(&termination_file, std::fs::Permissions::from_mode(0o666))?;
    if !config.termination_message_path.is_empty() {
        mounts.push(HostMount {
            container_path: config.termination_message_path.clone(),
            host_path: termination_file.clone(),
            read_only: false,
        });
    }
    Ok(Prepared {
        mounts,
        termination_file,
    })
}

/// Whether `dir` is a mount point (in this process's mount namespace).
fn is_mount_point(dir: &Path) -> bool {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let want = dir.to_string_lossy();
    text.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|p| p == want)
}

/// fsGroup's ownership of a volume (upstream's SetVolumeOwnership): every file and
/// directory in the group, readable (and, unless `read_only`, writable) by it,
/// directories searchable and setgid so that new files join the group.
fn set_ownership(dir: &Path, gid: i64, read_only: bool) -> io::Result<()> {
    let gid = nix::unistd::Gid::from_raw(
        u32::try_from(gid).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "fsGroup"))?,
    );
    let mask = if read_only { 0o440 } else { 0o660 };
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        let meta = std::fs::symlink_metadata(&p)?;
        if meta.file_type().is_symlink() {
            continue;
        }
        nix::unistd::chown(&p, None, Some(gid)).map_err(io::Error::from)?;
        let mut mode = meta.permissions().mode() & 0o7777 | mask;
        if meta.is_dir() {
            mode |= 0o2000 | 0o110;
            for e in std::fs::read_dir(&p)?.flatten() {
                stack.push(e.path());
            }
        }
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

/// Writes the current content of `config`'s file volumes where its container reads them.
pub fn refresh(pod_dir: &Path, config: &ContainerConfig) -> io::Result<()> {
    for m in &config.mounts {
        if let Source::Files(files) = &m.source {
            // A subPath mount is a copy taken at start, as upstream's: not updated.
            if m.sub_path.is_empty() && m.path != "/" {
                let dir = files_dir(pod_dir, &config.name, &m.path);
                write_files(&dir, files)?;
                if let Some(gid) = config.fs_group {
                    set_ownership(&dir, gid, true)?;
                }
            }
        }
    }
    Ok(())
}

/// Removes cgroup `path` (e.g. `/kumo/n1/kubepods/besteffort/pod<uid>`) from every
/// hierarchy, deepest first; a cgroup with processes left stays.
pub fn remove_cgroup(path: &str) {
    let rel = path.trim_matches('/');
    if rel.is_empty() {
        return;
    }
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return;
    };
    for h in hierarchies.flatten() {
        remove_cgroup_tree(&h.path().join(rel));
    }
}

/// rmdir of a cgroup directory and the cgroups below it.
pub fn remove_cgroup_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&e.path());
            }
        }
        let _ = std::fs::remove_dir(dir);
    }
}

/// Removes a pod's directory (its volumes' files, hosts and termination files), its
/// tmpfs volumes unmounted first.
pub fn remove_pod_dir(dir: &Path) {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut mounts: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| Path::new(p).starts_with(dir))
        .collect();
    mounts.sort_by_key(|p| std::cmp::Reverse(p.len()));
    let mut stuck = false;
    for m in mounts {
        if let Err(e) = nix::mount::umount2(m, nix::mount::MntFlags::MNT_DETACH) {
            tracing::warn!(mount = m, error = %e, "unmounting a pod volume");
            stuck = true;
        }
    }
    if stuck {
        // Removing the tree would descend into what is still mounted (a persistent
        // volume's data): it is left for the next try.
        tracing::warn!(dir = %dir.display(), "keeping the pod's directory: a mount under it remains");
        return;
    }
    if let Err(e) = std::fs::remove_dir_all(dir) {
        if e.kind() != io::ErrorKind::NotFound {
            tracing::warn!(dir = %dir.display(), error = %e, "removing the pod's directory");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kumo_cri::Mount;
    use std::collections::BTreeMap;

    #[test]
    fn a_sub_path_may_not_leave_its_volume_through_a_link() {
        let tmp = tempfile::tempdir().expect("tmp");
        let vol = tmp.path().join("vol");
        std::fs::create_dir_all(vol.join("inside/dir")).expect("dirs");
        std::os::unix::fs::symlink("/bin", vol.join("out")).expect("link out");
        std::os::unix::fs::symlink("inside", vol.join("in")).expect("link in");
        assert!(join_sub_path(vol.clone(), "inside/dir").is_ok());
        assert!(join_sub_path(vol.clone(), "in/dir").is_ok());
        assert!(join_sub_path(vol.clone(), "not/yet").is_ok());
        let e = join_sub_path(vol.clone(), "out").expect_err("leaves");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("not within volume path"), "{e}");
        std::os::unix::fs::symlink("/bin/not-there", vol.join("dangling")).expect("dangling");
        let e = join_sub_path(vol.clone(), "dangling").expect_err("leaves to nothing");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(join_sub_path(vol.clone(), "../x").is_err());
        assert!(join_sub_path(vol, "/etc").is_err());
    }

    #[test]
    fn file_volumes_are_written_refreshed_and_kept_inside_their_directory() {
        let pod = tempfile_dir("files");
        let mut files = BTreeMap::new();
        files.insert("a".to_owned(), (b"1".to_vec(), 0o644));
        files.insert("d/b".to_owned(), (b"2".to_vec(), 0o600));
        // Bytes that are not text (a ConfigMap's binaryData) are written as they are.
        let bin = vec![0xde, 0xca, 0xfe, 0xba, 0xd0, 0xfe, 0xff];
        files.insert("dump.bin".to_owned(), (bin.clone(), 0o644));
        let mut config = ContainerConfig {
            name: "c".into(),
            termination_message_path: "/dev/termination-log".into(),
            mounts: vec![Mount {
                path: "/etc/config".into(),
                source: Source::Files(files.clone()),
                read_only: true,
                sub_path: String::new(),
                tmpfs: false,
            }],
            ..Default::default()
        };
        let p = prepare(&pod, &config).expect("prepare");
        let dir = &p.mounts[0].host_path;
        assert_eq!(std::fs::read_to_string(dir.join("d/b")).unwrap(), "2");
        assert_eq!(std::fs::read(dir.join("dump.bin")).unwrap(), bin);
        let mode = std::fs::metadata(dir.join("d/b"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(p.mounts[1].container_path, "/dev/termination-log");
        files.remove("a");
        files.insert("d/b".to_owned(), (b"3".to_vec(), 0o600));
        config.mounts[0].source = Source::Files(files);
        refresh(&pod, &config).expect("refresh");
        assert!(!dir.join("a").exists());
        assert_eq!(std::fs::read_to_string(dir.join("d/b")).unwrap(), "3");
        config.mounts[0].source = Source::Files([("../x".to_owned(), (Vec::new(), 0o644))].into());
        assert!(prepare(&pod, &config).is_err());
        remove_pod_dir(&pod);
        assert!(!pod.exists());
    }

    fn tempfile_dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("kumo-cri-remote-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }
}
