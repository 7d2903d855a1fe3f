//! The `sim` runtime's files. Nothing touches the host: a container sees its own root
//! filesystem (gone when the container is), the pod's emptyDir volumes (shared by its
//! containers and kept across restarts until the sandbox goes), hostPath directories
//! (one namespace per node, kept while the runtime lives) and the files the kubelet
//! projects (ConfigMap, Secret, downward API). Every write is stamped with the simulated
//! time it happens at, so a process that is simulated ahead of time (a script that
//! sleeps, then writes) is seen by the others only once that time has come.

use std::collections::{BTreeMap, BTreeSet, HashMap};

pub use kumo_cri::{Mount, Source};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// A file or a directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Node {
    File { content: String, mode: u32 },
    Dir { mode: u32 },
}

/// A path's versions in time order (`None`: removed), each with its writer (a
/// container id, or empty for the kubelet).
type History = Vec<(SystemTime, Option<Node>, String)>;

/// Every simulated file of a runtime, with its history.
#[derive(Default)]
pub struct Store {
    files: Mutex<HashMap<String, History>>,
}

impl Store {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, History>> {
        self.files.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The node at `key` as of `at`.
    pub fn get(&self, key: &str, at: SystemTime) -> Option<Node> {
        let files = self.lock();
        files
            .get(key)?
            .iter()
            .rev()
            .find(|(t, _, _)| *t <= at)
            .and_then(|(_, n, _)| n.clone())
    }

    /// Sets (or, with `None`, removes) the node at `key` from `at` on.
    pub fn put(&self, key: &str, at: SystemTime, node: Option<Node>) {
        self.put_by(key, at, node, "");
    }

    /// [`Store::put`] by container `writer`.
    pub fn put_by(&self, key: &str, at: SystemTime, node: Option<Node>, writer: &str) {
        let mut files = self.lock();
        let history = files.entry(key.to_owned()).or_default();
        let i = history.partition_point(|(t, _, _)| *t <= at);
        history.insert(i, (at, node, writer.to_owned()));
    }

    /// Forgets what container `writer` wrote (before its program is run again).
    pub fn forget_writer(&self, writer: &str) {
        let mut files = self.lock();
        for h in files.values_mut() {
            h.retain(|(_, _, w)| w != writer);
        }
        files.retain(|_, h| !h.is_empty());
    }

    /// The names directly under directory `key` as of `at`.
    pub fn children(&self, key: &str, at: SystemTime) -> BTreeSet<String> {
        let prefix = format!("{}/", key.trim_end_matches('/'));
        let files = self.lock();
        files
            .iter()
            .filter(|(k, _)| k.starts_with(&prefix))
            .filter(|(_, h)| {
                h.iter()
                    .rev()
                    .find(|(t, _, _)| *t <= at)
                    .is_some_and(|(_, n, _)| n.is_some())
            })
            .filter_map(|(k, _)| k[prefix.len()..].split('/').next().map(str::to_owned))
            .collect()
    }

    /// Forgets every key under `prefix` (a sandbox's or a container's files).
    pub fn remove_prefix(&self, prefix: &str) {
        self.lock().retain(|k, _| !k.starts_with(prefix));
    }
}

pub use kumo_cri::NODE_HOSTS;

/// Files of the node itself, by hostPath store key.
fn node_file(key: &str) -> Option<&'static str> {
    match key {
        "host/etc/hosts" => Some(NODE_HOSTS),
        _ => None,
    }
}

/// Directories every image has.
const BASE_DIRS: &[&str] = &[
    "/",
    "/bin",
    "/dev",
    "/etc",
    "/home",
    "/mnt",
    "/opt",
    "/proc",
    "/root",
    "/run",
    "/sbin",
    "/sys",
    "/tmp",
    "/usr",
    "/usr/bin",
    "/usr/local",
    "/var",
    "/var/log",
    "/var/run",
];

/// The simulator's text of a file's bytes: UTF-8 as it is, other bytes one char per
/// byte (Latin-1), which the simulated `hexdump` turns back into the bytes.
pub fn text_of(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(s) => s.to_owned(),
        Err(_) => bytes.iter().copied().map(char::from).collect(),
    }
}

/// Where a path leads.
enum Loc<'a> {
    /// A stored node.
    Key { key: String, read_only: bool },
    /// A projected file or directory (read-only): the mount's files, or, once the
    /// kubelet has updated them, their versions in the store under the last key.
    Projected(std::borrow::Cow<'a, kumo_cri::Files>, String),
}

/// What one process sees of the files.
#[derive(Clone)]
pub struct View {
    pub store: Arc<Store>,
    pub mounts: Vec<Mount>,
    /// The sandbox (pod) and container these files belong to.
    pub sandbox: String,
    pub container: String,
    /// Files the runtime makes (`/etc/hostname`, `/etc/hosts`, ...).
    pub fixed: BTreeMap<String, String>,
}

/// Joins `rel` (relative, may be empty) under `base`.
fn join(base: &str, rel: &str) -> String {
    match (base.is_empty(), rel.is_empty()) {
        (_, true) => base.to_owned(),
        (true, false) => rel.to_owned(),
        _ => format!("{}/{rel}", base.trim_end_matches('/')),
    }
}

/// Why a file operation failed (as busybox says it).
#[derive(Debug, PartialEq, Eq)]
pub enum FsError {
    NotFound,
    ReadOnly,
    IsDir,
    NotDir,
    Exists,
}

impl FsError {
    pub fn message(&self) -> &'static str {
        match self {
            FsError::NotFound => "No such file or directory",
            FsError::ReadOnly => "Read-only file system",
            FsError::IsDir => "Is a directory",
            FsError::NotDir => "Not a directory",
            FsError::Exists => "File exists",
        }
    }
}

/// The files of every simulated disk (a persistent volume's data), by volume id: one store
/// for the whole process, as a disk outlives the pods, kubelets and nodes that mount it and
/// moves between nodes with its claim.
pub fn disks() -> &'static Store {
    static DISKS: std::sync::LazyLock<Store> = std::sync::LazyLock::new(Store::default);
    &DISKS
}

impl View {
    /// The store that holds `key`: the disks' for a disk's files, else the runtime's.
    fn store_of(&self, key: &str) -> &Store {
        if key.starts_with("disk/") {
            disks()
        } else {
            &self.store
        }
    }

    /// The prefix of every key of this sandbox (removed with it).
    pub fn sandbox_prefix(sandbox: &str) -> String {
        format!("pod/{sandbox}/")
    }

    /// The prefix of every key of this container's own root filesystem.
    pub fn container_prefix(container: &str) -> String {
        format!("ctr/{container}/")
    }

    /// Where the kubelet keeps the versions of a projected mount's files (one JSON
    /// object of path → [content, mode] per version).
    pub fn projected_key(container: &str, mount_path: &str) -> String {
        format!("ctr/{container}/..proj{mount_path}")
    }

    fn locate(&self, path: &str, at: SystemTime) -> Loc<'_> {
        let mount = self
            .mounts
            .iter()
            .filter(|m| {
                let mp = m.path.trim_end_matches('/');
                // A read-only root leaves /dev (the termination log) writable.
                if mp.is_empty() && path.starts_with("/dev/") {
                    return false;
                }
                path == mp || path.starts_with(&format!("{mp}/")) || mp.is_empty()
            })
            .max_by_key(|m| m.path.trim_end_matches('/').len());
        let Some(m) = mount else {
            return Loc::Key {
                key: format!("ctr/{}{}", self.container, path),
                read_only: false,
            };
        };
        let mp = m.path.trim_end_matches('/');
        let rel = path[mp.len()..].trim_start_matches('/');
        let rel = join(m.sub_path.trim_matches('/'), rel);
        match &m.source {
            Source::EmptyDir(vol) => Loc::Key {
                key: format!("pod/{}/{}/{}", self.sandbox, vol, rel)
                    .trim_end_matches('/')
                    .to_owned(),
                read_only: m.read_only,
            },
            Source::HostPath(dir) => Loc::Key {
                key: format!("host/{}/{}", dir.trim_matches('/'), rel)
                    .trim_end_matches('/')
                    .to_owned(),
                read_only: m.read_only,
            },
            Source::Disk { id, .. } => Loc::Key {
                key: format!("disk/{id}/{rel}").trim_end_matches('/').to_owned(),
                read_only: m.read_only,
            },
            Source::Files(files) => {
                let key = Self::projected_key(&self.container, &m.path);
                match self.store_of(&key).get(&key, at) {
                    Some(Node::File { content, .. }) => Loc::Projected(
                        std::borrow::Cow::Owned(serde_json::from_str(&content).unwrap_or_default()),
                        rel,
                    ),
                    _ => Loc::Projected(std::borrow::Cow::Borrowed(files), rel),
                }
            }
            // An image volume shows the files the image ships (the image catalogue's).
            Source::Image(reference) => Loc::Projected(
                std::borrow::Cow::Owned(
                    super::images::image_files(reference)
                        .into_iter()
                        .map(|(p, c)| {
                            (
                                p.trim_start_matches('/').to_owned(),
                                (c.into_bytes(), 0o644),
                            )
                        })
                        .collect(),
                ),
                rel,
            ),
        }
    }

    /// Whether `path` is a mount point (always a directory, unless a subPath file).
    fn mount_root(&self, path: &str) -> Option<&Mount> {
        self.mounts
            .iter()
            .find(|m| m.path.trim_end_matches('/') == path.trim_end_matches('/'))
    }

    /// Makes the subPath directories of the container's volume mounts (as the kubelet
    /// does before it starts the container).
    pub fn prepare(&self, at: SystemTime) {
        for m in &self.mounts {
            let base = match &m.source {
                Source::EmptyDir(vol) => format!("pod/{}/{vol}", self.sandbox),
                Source::HostPath(dir) => format!("host/{}", dir.trim_matches('/')),
                Source::Disk { id, .. } => format!("disk/{id}"),
                Source::Files(_) | Source::Image(_) => continue,
            };
            let mut key = base;
            for seg in m.sub_path.split('/').filter(|s| !s.is_empty() && *s != ".") {
                key = format!("{key}/{seg}");
                if self.store_of(&key).get(&key, at).is_none() {
                    self.store_of(&key)
                        .put(&key, at, Some(Node::Dir { mode: 0o755 }));
                }
            }
        }
    }

    /// The node at absolute `path` as of `at`.
    pub fn stat(&self, path: &str, at: SystemTime) -> Option<Node> {
        if let Some(text) = self.fixed.get(path) {
            // A volume mounted over it wins.
            if !self
                .mounts
                .iter()
                .any(|m| m.path.trim_end_matches('/') == path)
            {
                return Some(Node::File {
                    content: text.clone(),
                    mode: 0o644,
                });
            }
        }
        match self.locate(path, at) {
            Loc::Key { key, .. } => {
                if let Some(n) = self.store_of(&key).get(&key, at) {
                    return Some(n);
                }
                if let Some(text) = node_file(&key) {
                    return Some(Node::File {
                        content: text.to_owned(),
                        mode: 0o644,
                    });
                }
                if let Some(m) = self.mount_root(path) {
                    if m.sub_path.is_empty() || matches!(m.source, Source::EmptyDir(_)) {
                        return Some(Node::Dir { mode: 0o777 });
                    }
                }
                if BASE_DIRS.contains(&path) && self.mounts.iter().all(|m| m.path != path) {
                    return Some(Node::Dir { mode: 0o755 });
                }
                // A directory that holds something is there.
                (!self.store_of(&key).children(&key, at).is_empty())
                    .then_some(Node::Dir { mode: 0o755 })
            }
            Loc::Projected(files, rel) => {
                if let Some((content, mode)) = files.get(&rel) {
                    return Some(Node::File {
                        content: text_of(content),
                        mode: *mode,
                    });
                }
                let prefix = format!("{rel}/");
                (rel.is_empty()
                    || files.keys().any(|k| k.starts_with(&prefix))
                    || BASE_DIRS.contains(&path))
                .then_some(Node::Dir { mode: 0o777 })
            }
        }
    }

    /// The names in directory `path`.
    pub fn list(&self, path: &str, at: SystemTime) -> Result<Vec<String>, FsError> {
        match self.stat(path, at) {
            None => return Err(FsError::NotFound),
            Some(Node::File { .. }) => return Err(FsError::NotDir),
            Some(Node::Dir { .. }) => {}
        }
        let mut names: BTreeSet<String> = match self.locate(path, at) {
            Loc::Key { key, .. } => self.store_of(&key).children(&key, at),
            Loc::Projected(files, rel) => {
                let prefix = if rel.is_empty() {
                    String::new()
                } else {
                    format!("{rel}/")
                };
                files
                    .keys()
                    .filter_map(|k| k.strip_prefix(&prefix))
                    .filter_map(|k| k.split('/').next())
                    .map(str::to_owned)
                    .collect()
            }
        };
        // Mount points and fixed files below `path` show up in it.
        let dir = format!("{}/", path.trim_end_matches('/'));
        for p in self
            .mounts
            .iter()
            .map(|m| m.path.as_str())
            .chain(self.fixed.keys().map(String::as_str))
        {
            if let Some(rest) = p.strip_prefix(&dir) {
                if let Some(first) = rest.split('/').next().filter(|s| !s.is_empty()) {
                    names.insert(first.to_owned());
                }
            }
        }
        Ok(names.into_iter().collect())
    }

    /// The content of file `path`.
    pub fn read(&self, path: &str, at: SystemTime) -> Result<String, FsError> {
        match self.stat(path, at) {
            Some(Node::File { content, .. }) => Ok(content),
            Some(Node::Dir { .. }) => Err(FsError::IsDir),
            None => Err(FsError::NotFound),
        }
    }

    fn writable(&self, path: &str) -> Result<String, FsError> {
        match self.locate(path, SystemTime::UNIX_EPOCH) {
            Loc::Key {
                read_only: true, ..
            }
            | Loc::Projected(..) => Err(FsError::ReadOnly),
            Loc::Key { key, .. } => Ok(key),
        }
    }

    fn parent_ok(&self, path: &str, at: SystemTime) -> Result<(), FsError> {
        let parent = match path.rfind('/') {
            Some(0) => "/",
            Some(i) => &path[..i],
            None => return Ok(()),
        };
        match self.stat(parent, at) {
            Some(Node::Dir { .. }) => Ok(()),
            Some(Node::File { .. }) => Err(FsError::NotDir),
            None => Err(FsError::NotFound),
        }
    }

    /// Writes `text` to file `path` (appending or replacing it).
    pub fn write(
        &self,
        path: &str,
        text: &str,
        append: bool,
        at: SystemTime,
    ) -> Result<(), FsError> {
        let key = self.writable(path)?;
        let old = self.stat(path, at);
        let (mut content, mode) = match old {
            Some(Node::Dir { .. }) => return Err(FsError::IsDir),
            Some(Node::File { content, mode }) => {
                (if append { content } else { String::new() }, mode)
            }
            None => {
                self.parent_ok(path, at)?;
                (String::new(), 0o644)
            }
        };
        content.push_str(text);
        self.store_of(&key).put_by(
            &key,
            at,
            Some(Node::File { content, mode }),
            &self.container,
        );
        Ok(())
    }

    /// Makes directory `path` (with its parents when `parents`).
    pub fn mkdir(&self, path: &str, parents: bool, at: SystemTime) -> Result<(), FsError> {
        match self.stat(path, at) {
            Some(Node::Dir { .. }) if parents => return Ok(()),
            Some(_) => return Err(FsError::Exists),
            None => {}
        }
        if parents {
            if let Some(i) = path.rfind('/').filter(|i| *i > 0) {
                self.mkdir(&path[..i], true, at)?;
            }
        } else {
            self.parent_ok(path, at)?;
        }
        let key = self.writable(path)?;
        self.store_of(&key)
            .put_by(&key, at, Some(Node::Dir { mode: 0o755 }), &self.container);
        Ok(())
    }

    /// Removes `path` (a directory only when `recursive`).
    pub fn remove(&self, path: &str, recursive: bool, at: SystemTime) -> Result<(), FsError> {
        let node = self.stat(path, at).ok_or(FsError::NotFound)?;
        if matches!(node, Node::Dir { .. }) {
            if !recursive {
                return Err(FsError::IsDir);
            }
            for name in self.list(path, at)? {
                self.remove(&join(path, &name), true, at)?;
            }
        }
        let key = self.writable(path)?;
        self.store_of(&key).put_by(&key, at, None, &self.container);
        Ok(())
    }

    /// Changes the mode bits of `path`.
    pub fn chmod(&self, path: &str, mode: u32, at: SystemTime) -> Result<(), FsError> {
        let node = self.stat(path, at).ok_or(FsError::NotFound)?;
        let key = self.writable(path)?;
        let node = match node {
            Node::File { content, .. } => Node::File { content, mode },
            Node::Dir { .. } => Node::Dir { mode },
        };
        self.store_of(&key)
            .put_by(&key, at, Some(node), &self.container);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn volumes_and_time() {
        let store = Arc::new(Store::default());
        let mut files = BTreeMap::new();
        files.insert("data-1".to_owned(), (b"value-1".to_vec(), 0o644));
        let view = |c: &str| View {
            store: store.clone(),
            mounts: vec![
                Mount {
                    path: "/data".into(),
                    source: Source::EmptyDir("data".into()),
                    read_only: false,
                    sub_path: String::new(),
                    tmpfs: false,
                },
                Mount {
                    path: "/etc/cm".into(),
                    source: Source::Files(files.clone()),
                    read_only: true,
                    sub_path: String::new(),
                    tmpfs: false,
                },
            ],
            sandbox: "sb".into(),
            container: c.into(),
            fixed: BTreeMap::new(),
        };
        let (a, b) = (view("a"), view("b"));
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
        let t1 = t0 + Duration::from_secs(5);
        a.write("/data/x", "hi\n", false, t1).expect("write");
        a.write("/tmp/own", "mine", false, t0).expect("write");
        assert_eq!(b.read("/data/x", t0), Err(FsError::NotFound));
        assert_eq!(b.read("/data/x", t1).as_deref(), Ok("hi\n"));
        assert_eq!(b.read("/tmp/own", t1), Err(FsError::NotFound));
        assert_eq!(b.read("/etc/cm/data-1", t0).as_deref(), Ok("value-1"));
        assert_eq!(b.write("/etc/cm/x", "", false, t0), Err(FsError::ReadOnly));
        assert_eq!(b.list("/data", t1), Ok(vec!["x".to_owned()]));
        assert_eq!(a.write("/nope/x", "", false, t0), Err(FsError::NotFound));
        store.remove_prefix(&View::sandbox_prefix("sb"));
        assert_eq!(b.read("/data/x", t1), Err(FsError::NotFound));
    }
}
