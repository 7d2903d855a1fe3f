//! kumo's offline images, packed here from the machine's own files so that a node runs pods
//! with no registry: an OCI image layout in a tar (oci-layout, index.json, blobs) with one
//! uncompressed layer, a config, a manifest and one index entry per name the image answers
//! to (containerd's `io.containerd.image.name`), as `ctr images import` takes it.
//!
//! - `pause.tar`: the sandbox image under upstream's name (registry.k8s.io/pause:3.10.2).
//!   Not upstream's pause binary: busybox's shell as PID 1, which waits and exits on SIGTERM
//!   or SIGINT as pause does.
//! - `busybox.tar`: Debian's busybox-static (1.35) with its applets, under the names the
//!   e2e suite and `kubectl run --image=busybox` use; its `sh` is the machine's bash (in
//!   POSIX mode), which passes on every environment variable as busybox 1.37's does.

use std::io;
use std::path::{Path, PathBuf};

/// Where Debian's busybox-static puts its binary.
pub const BUSYBOX: &str = "/bin/busybox";
/// The shell the busybox image's `sh` is when the machine has it.
const BASH: &str = "/usr/bin/bash";
/// The machine's curl, packed as the curl image.
const CURL: &str = "/usr/bin/curl";
/// The machine's nginx (Debian's nginx-light), packed as the nginx image.
const NGINX: &str = "/usr/sbin/nginx";

/// The nginx image's configuration: the welcome page on port 80, logs to the container's
/// output, temporary files under /var/lib/nginx.
const NGINX_CONF: &str = "user nobody nobody;
worker_processes 1;
error_log /dev/stderr notice;
pid /run/nginx.pid;
events { worker_connections 1024; }
http {
    include /etc/nginx/mime.types;
    default_type application/octet-stream;
    access_log /dev/stdout;
    client_body_temp_path /var/lib/nginx/body;
    proxy_temp_path /var/lib/nginx/proxy;
    sendfile on;
    keepalive_timeout 65;
    server {
        listen 80 default_server;
        root /usr/share/nginx/html;
        index index.html;
    }
}
";

/// nginx's welcome page.
const NGINX_INDEX: &str = "<!DOCTYPE html>
<html>
<head><title>Welcome to nginx!</title></head>
<body>
<h1>Welcome to nginx!</h1>
<p>If you see this page, the nginx web server is successfully installed and working.</p>
</body>
</html>
";

/// One file of an image's layer (paths relative to its root).
#[derive(Clone, Debug)]
pub enum Entry {
    Dir(String, u32),
    File(String, Vec<u8>, u32),
    Symlink(String, String),
}

impl Entry {
    fn path(&self) -> &str {
        match self {
            Entry::Dir(p, _) | Entry::File(p, _, _) | Entry::Symlink(p, _) => p,
        }
    }
}

/// An image to pack: its layer's entries, entrypoint and cmd, and its names.
#[derive(Clone, Debug, Default)]
pub struct Image {
    pub entries: Vec<Entry>,
    pub entrypoint: Option<Vec<String>>,
    pub cmd: Option<Vec<String>>,
    pub names: Vec<String>,
}

impl Image {
    /// Adds the host's file `src` at `dst`, with its mode.
    pub fn add_host_file(&mut self, src: &Path, dst: &str) -> io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let data = std::fs::read(src)
            .map_err(|e| io::Error::new(e.kind(), format!("reading {}: {e}", src.display())))?;
        let mode = std::fs::metadata(src)?.permissions().mode() & 0o7777;
        self.put(Entry::File(
            dst.trim_start_matches('/').to_owned(),
            data,
            mode,
        ));
        Ok(())
    }

    /// Adds this machine's `program` at the same path, with the shared libraries it loads
    /// and its loader (as `ldd` lists them).
    pub fn add_program(&mut self, program: &Path) -> io::Result<()> {
        for f in with_libraries(program)? {
            self.add_host_file(&f, &f.to_string_lossy())?;
        }
        Ok(())
    }

    /// Adds `entry`, replacing one at the same path (a later file wins, as in a layer
    /// on top).
    pub fn put(&mut self, entry: Entry) {
        // Paths in a layer are relative to its root.
        let rel = |p: String| p.trim_matches('/').to_owned();
        let entry = match entry {
            Entry::Dir(p, m) => Entry::Dir(rel(p), m),
            Entry::File(p, d, m) => Entry::File(rel(p), d, m),
            Entry::Symlink(p, t) => Entry::Symlink(rel(p), t),
        };
        let path = entry.path().to_owned();
        self.entries.retain(|e| e.path().trim_matches('/') != path);
        self.entries.push(entry);
    }
}

fn sha256(data: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, data);
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

fn header(kind: tar::EntryType, path: &str, mode: u32, size: u64) -> io::Result<tar::Header> {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_path(path)?;
    h.set_mode(mode);
    h.set_size(size);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_cksum();
    Ok(h)
}

/// The layer: a reproducible tar of the entries.
fn layer(entries: &[Entry]) -> io::Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        match e {
            Entry::Dir(path, mode) => {
                let h = header(tar::EntryType::Directory, &format!("{path}/"), *mode, 0)?;
                b.append(&h, io::empty())?;
            }
            Entry::File(path, data, mode) => {
                let h = header(tar::EntryType::Regular, path, *mode, data.len() as u64)?;
                b.append(&h, data.as_slice())?;
            }
            Entry::Symlink(path, target) => {
                let mut h = header(tar::EntryType::Symlink, path, 0o777, 0)?;
                h.set_link_name(target)?;
                h.set_cksum();
                b.append(&h, io::empty())?;
            }
        }
    }
    b.into_inner()
}

/// The OCI archive of `image`.
pub fn archive(image: &Image) -> io::Result<Vec<u8>> {
    archive_all(std::slice::from_ref(image))
}

/// One OCI archive of all `images` (one `ctr images import` loads them all; a blob two
/// images share is in it once).
pub fn archive_all(images: &[Image]) -> io::Result<Vec<u8>> {
    let mut blobs: Vec<(String, Vec<u8>)> = Vec::new();
    let mut manifests = Vec::new();
    let mut keep = |digest: &str, data: Vec<u8>| {
        if !blobs.iter().any(|(d, _)| d == digest) {
            blobs.push((digest.to_owned(), data));
        }
    };
    for image in images {
        let layer = layer(&image.entries)?;
        let layer_digest = sha256(&layer);
        let config = serde_json::json!({
            "architecture": "amd64",
            "os": "linux",
            "config": {
                "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                "Entrypoint": image.entrypoint,
                "Cmd": image.cmd,
                "WorkingDir": "/",
            },
            "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{layer_digest}")]},
            "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "kumo"}],
        })
        .to_string()
        .into_bytes();
        let config_digest = sha256(&config);
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": format!("sha256:{config_digest}"),
                "size": config.len(),
            },
            "layers": [{
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": format!("sha256:{layer_digest}"),
                "size": layer.len(),
            }],
        })
        .to_string()
        .into_bytes();
        let manifest_digest = sha256(&manifest);
        manifests.extend(image.names.iter().map(|name| {
            serde_json::json!({
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": format!("sha256:{manifest_digest}"),
                "size": manifest.len(),
                "annotations": {
                    "io.containerd.image.name": name,
                    "org.opencontainers.image.ref.name": name.rsplit(':').next().unwrap_or(name),
                },
            })
        }));
        keep(&layer_digest, layer);
        keep(&config_digest, config);
        keep(&manifest_digest, manifest);
    }
    let index = serde_json::json!({"schemaVersion": 2, "manifests": manifests})
        .to_string()
        .into_bytes();
    let mut b = tar::Builder::new(Vec::new());
    let mut add = |path: &str, data: &[u8]| -> io::Result<()> {
        let h = header(tar::EntryType::Regular, path, 0o644, data.len() as u64)?;
        b.append(&h, data)
    };
    add("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    add("index.json", &index)?;
    for (digest, data) in &blobs {
        add(&format!("blobs/sha256/{digest}"), data)?;
    }
    b.into_inner()
}

/// `program` and the shared libraries it loads, as `ldd` resolves them (the loader
/// included), with symbolic links followed to the files.
pub fn with_libraries(program: &Path) -> io::Result<Vec<PathBuf>> {
    let out = std::process::Command::new("ldd").arg(program).output()?;
    let mut files = vec![program.to_owned()];
    // "libz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)"
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let path = match line.split_once("=>") {
            Some((_, right)) => right.split_whitespace().next(),
            None => line
                .split_whitespace()
                .next()
                .filter(|p| p.starts_with('/')),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            files.push(PathBuf::from(p));
        }
    }
    Ok(files)
}

/// Whether an ELF64 executable names a program interpreter (is dynamically linked).
fn has_interpreter(elf: &[u8]) -> bool {
    let u16_at = |o: usize| elf.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u64_at = |o: usize| {
        elf.get(o..o + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
    };
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38))
    else {
        return false;
    };
    (0..usize::from(phnum)).any(|i| {
        let at = phoff as usize + i * usize::from(phentsize);
        elf.get(at..at + 4) == Some(&3u32.to_le_bytes()[..])
    })
}

/// A minimal root file system around Debian's static busybox.
pub fn busybox_entries() -> io::Result<Vec<Entry>> {
    let busybox = std::fs::read(BUSYBOX).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("reading {BUSYBOX} (apt-get install busybox-static): {e}"),
        )
    })?;
    // A dynamically linked busybox (Debian's `busybox` package) would find no libc in
    // the image.
    if has_interpreter(&busybox) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{BUSYBOX} is dynamically linked: apt-get install busybox-static"),
        ));
    }
    let list = std::process::Command::new(BUSYBOX).arg("--list").output()?;
    let dir = |p: &str, mode| Entry::Dir(p.into(), mode);
    let mut entries = vec![
        dir("bin", 0o755),
        dir("dev", 0o755),
        dir("etc", 0o755),
        dir("home", 0o755),
        dir("proc", 0o555),
        dir("root", 0o700),
        dir("sys", 0o555),
        dir("tmp", 0o1777),
        dir("var", 0o755),
        Entry::File("bin/busybox".into(), busybox, 0o755),
        Entry::File(
            "etc/passwd".into(),
            b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/home:/bin/false\n"
                .to_vec(),
            0o644,
        ),
        Entry::File(
            "etc/group".into(),
            b"root:x:0:\nnobody:x:65534:\n".to_vec(),
            0o644,
        ),
    ];
    for applet in String::from_utf8_lossy(&list.stdout).split_whitespace() {
        if applet != "busybox" && !applet.contains('/') {
            entries.push(Entry::Symlink(format!("bin/{applet}"), "busybox".into()));
        }
    }
    Ok(entries)
}

/// The images kumo packs.
fn offline_images() -> io::Result<Vec<Image>> {
    let mut pause = busybox_entries()?;
    // PID 1 gets no default signal handlers: the traps make SIGTERM and SIGINT end it.
    pause.push(Entry::File(
        "pause".into(),
        b"#!/bin/sh\ntrap 'exit 0' TERM INT\nwhile :; do sleep 3600 & wait $!; done\n".to_vec(),
        0o755,
    ));
    let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let mut busybox = Image {
        entries: busybox_entries()?,
        entrypoint: None,
        cmd: Some(strings(&["sh"])),
        names: strings(&[
            "registry.k8s.io/e2e-test-images/busybox:1.37.0-2",
            "docker.io/library/busybox:1.37",
            "docker.io/library/busybox:latest",
        ]),
    };
    // Debian's busybox 1.35 `sh` drops environment variables whose names are not shell
    // identifiers (`data-1`, which Kubernetes allows and busybox 1.37 passes on); bash in
    // POSIX mode passes them, so it is the image's `sh` when the machine has it.
    if busybox.add_program(Path::new(BASH)).is_ok() {
        busybox.put(Entry::Symlink("bin/sh".into(), BASH.into()));
    }
    let mut images = vec![busybox];
    // curl as the seeds run it (`kubectl run probe --image=curlimages/curl:8.11.0 -- curl
    // ...`): the machine's own curl (Debian's, whatever its version) with its libraries
    // and busybox around it, under the image's name, with its entrypoint's behaviour
    // (arguments starting with `-` go to curl, anything else runs as given).
    if Path::new(CURL).is_file() {
        let mut curl = Image {
            entries: busybox_entries()?,
            entrypoint: Some(strings(&["/entrypoint.sh"])),
            cmd: Some(strings(&["curl"])),
            names: strings(&[
                "docker.io/curlimages/curl:8.11.0",
                "docker.io/curlimages/curl:latest",
            ]),
        };
        curl.add_program(Path::new(CURL))?;
        curl.put(Entry::File(
            "entrypoint.sh".into(),
            b"#!/bin/sh\nif [ \"${1#-}\" != \"$1\" ]; then set -- curl \"$@\"; fi\nexec \"$@\"\n"
                .to_vec(),
            0o755,
        ));
        images.push(curl);
    }
    // nginx as the seeds and the e2e suite run it: Debian's nginx with its libraries,
    // serving its welcome page on port 80 in the foreground.
    if Path::new(NGINX).is_file() {
        let mut nginx = Image {
            entries: busybox_entries()?,
            entrypoint: None,
            cmd: Some(strings(&["nginx", "-g", "daemon off;"])),
            names: strings(&[
                "docker.io/library/nginx:latest",
                "docker.io/library/nginx:1.29",
                "docker.io/library/nginx:1.27",
                "registry.k8s.io/e2e-test-images/nginx:1.27.0-2",
                "registry.k8s.io/e2e-test-images/nginx:1.28.0-2",
            ]),
        };
        nginx.add_program(Path::new(NGINX))?;
        if Path::new("/etc/nginx/mime.types").is_file() {
            nginx.add_host_file(Path::new("/etc/nginx/mime.types"), "/etc/nginx/mime.types")?;
        }
        nginx.put(Entry::Symlink("usr/bin/nginx".into(), NGINX.into()));
        for d in [
            "var/log/nginx",
            "var/lib/nginx",
            "run",
            "usr/share/nginx/html",
        ] {
            nginx.put(Entry::Dir(d.into(), 0o755));
        }
        nginx.put(Entry::File(
            "etc/nginx/nginx.conf".into(),
            NGINX_CONF.as_bytes().to_vec(),
            0o644,
        ));
        nginx.put(Entry::File(
            "usr/share/nginx/html/index.html".into(),
            NGINX_INDEX.as_bytes().to_vec(),
            0o644,
        ));
        images.push(nginx);
    }
    images.push(Image {
        entries: pause,
        entrypoint: Some(strings(&["/pause"])),
        cmd: None,
        names: strings(&[crate::PAUSE_IMAGE]),
    });
    Ok(images)
}

/// One packs at a time in this process (nodes boot in parallel and each packs the
/// images before it imports them).
static PACKING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The files [`build`] packs kumo's offline images into: the sandbox image alone (every
/// pod needs it, so a machine imports it as it boots), and the others (pulled from the
/// node's registry mirror when a pod first asks for them, as a node pulls).
pub const PAUSE_ARCHIVE: &str = "pause.tar";
pub const OFFLINE_ARCHIVE: &str = "kumo-images.tar";

/// The archives this process has packed (see [`write_once`]).
static PACKED: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

/// Writes the archive `make` packs as `dir/file` once per process (kumo's images are the
/// same for every machine of the process, and packing tens of MB took a second and more in
/// a debug build, for every machine that booted); again only if the file has gone.
pub fn write_once(
    dir: &Path,
    file: &str,
    make: impl FnOnce() -> io::Result<Vec<u8>>,
) -> io::Result<PathBuf> {
    let mut packed = PACKED.lock().unwrap_or_else(|e| e.into_inner());
    let path = dir.join(file);
    if packed.contains(&path) && path.is_file() {
        return Ok(path);
    }
    let written = write_bytes(dir, file, &make()?)?;
    packed.push(written.clone());
    Ok(written)
}

/// Packs kumo's offline images into `dir` (once per process: [`write_once`]) and returns
/// their archives.
pub fn build(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut split: Option<(Vec<Image>, Vec<Image>)> = None;
    let mut part = |pause: bool| -> io::Result<Vec<u8>> {
        if split.is_none() {
            split = Some(
                offline_images()?
                    .into_iter()
                    .partition(|i| i.names.iter().any(|n| n == crate::PAUSE_IMAGE)),
            );
        }
        match &split {
            Some((p, o)) => archive_all(if pause { p } else { o }),
            None => Ok(Vec::new()),
        }
    };
    let pause = write_once(dir, PAUSE_ARCHIVE, || part(true))?;
    let others = write_once(dir, OFFLINE_ARCHIVE, || part(false))?;
    Ok(vec![pause, others])
}

/// Writes `image` as the archive `dir/file`. A temporary name of its own keeps another
/// process's packing from renaming a half-written file into place.
pub fn write(dir: &Path, file: &str, image: &Image) -> io::Result<PathBuf> {
    write_bytes(dir, file, &archive(image)?)
}

/// Writes the archive `bytes` as `dir/file` (see [`write`]).
fn write_bytes(dir: &Path, file: &str, bytes: &[u8]) -> io::Result<PathBuf> {
    let _one = PACKING.lock().unwrap_or_else(|e| e.into_inner());
    std::fs::create_dir_all(dir)?;
    let path = dir.join(file);
    let tmp = dir.join(format!(".{file}.{}.tmp", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// An image to run the dynamically linked `program` in without holding it: its shared
/// libraries, a passwd and group file, and an empty file at `mount_at` for the program
/// to be bind-mounted onto (a hostPath volume).
pub fn program_image(program: &Path, mount_at: &str, names: Vec<String>) -> io::Result<Image> {
    let mut image = Image {
        entries: vec![
            Entry::Dir("etc".into(), 0o755),
            Entry::Dir("tmp".into(), 0o1777),
            Entry::File(
                "etc/passwd".into(),
                b"root:x:0:0:root:/root:/bin/false\nnobody:x:65534:65534:nobody:/:/bin/false\n"
                    .to_vec(),
                0o644,
            ),
            Entry::File(
                "etc/group".into(),
                b"root:x:0:\nnobody:x:65534:\n".to_vec(),
                0o644,
            ),
        ],
        entrypoint: Some(vec![mount_at.to_owned()]),
        cmd: None,
        names,
    };
    for lib in with_libraries(program)?.into_iter().skip(1) {
        image.add_host_file(&lib, &lib.to_string_lossy())?;
    }
    if let Some(parent) = Path::new(mount_at.trim_start_matches('/')).parent() {
        if !parent.as_os_str().is_empty() {
            image.put(Entry::Dir(parent.to_string_lossy().into_owned(), 0o755));
        }
    }
    image.put(Entry::File(
        mount_at.trim_start_matches('/').to_owned(),
        Vec::new(),
        0o755,
    ));
    Ok(image)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dynamically_linked_program_is_told_from_a_static_one() {
        let ls = std::fs::read("/bin/ls").unwrap();
        assert!(has_interpreter(&ls));
        if let Ok(b) = std::fs::read(BUSYBOX) {
            assert!(!has_interpreter(&b), "{BUSYBOX} should be busybox-static");
        }
        assert!(!has_interpreter(b"not an elf"));
    }

    #[test]
    fn an_archive_is_an_oci_layout_whose_digests_hold() {
        let mut image = Image {
            entries: vec![
                Entry::Dir("bin".into(), 0o755),
                Entry::File("bin/x".into(), b"old".to_vec(), 0o755),
            ],
            entrypoint: Some(vec!["/bin/x".into()]),
            cmd: None,
            names: vec!["example.com/x:1".into(), "example.com/x:latest".into()],
        };
        image.put(Entry::File("/bin/x".into(), b"hi".to_vec(), 0o755));
        assert_eq!(image.entries.len(), 2);
        let bytes = archive(&image).unwrap();
        let mut files = std::collections::BTreeMap::new();
        let mut a = tar::Archive::new(bytes.as_slice());
        for e in a.entries().unwrap() {
            let mut e = e.unwrap();
            let path = e.path().unwrap().display().to_string();
            let mut data = Vec::new();
            io::Read::read_to_end(&mut e, &mut data).unwrap();
            files.insert(path, data);
        }
        for (path, data) in &files {
            if let Some(d) = path.strip_prefix("blobs/sha256/") {
                assert_eq!(sha256(data), d, "{path}");
            }
        }
        let index: serde_json::Value = serde_json::from_slice(&files["index.json"]).unwrap();
        let names: Vec<&str> = index["manifests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                m["annotations"]["io.containerd.image.name"]
                    .as_str()
                    .unwrap()
            })
            .collect();
        assert_eq!(names, ["example.com/x:1", "example.com/x:latest"]);
        // The same input packs to the same bytes.
        assert_eq!(archive(&image).unwrap(), bytes);
    }

    #[test]
    fn one_archive_holds_several_images_and_their_shared_blobs_once() {
        let image = |name: &str, content: &[u8]| Image {
            entries: vec![Entry::File("bin/x".into(), content.to_vec(), 0o755)],
            entrypoint: Some(vec!["/bin/x".into()]),
            cmd: None,
            names: vec![name.into()],
        };
        let images = [
            image("example.com/a:1", b"a"),
            image("example.com/b:1", b"b"),
            image("example.com/a2:1", b"a"),
        ];
        let bytes = archive_all(&images).unwrap();
        let mut blobs = Vec::new();
        let mut index = None;
        let mut a = tar::Archive::new(bytes.as_slice());
        for e in a.entries().unwrap() {
            let mut e = e.unwrap();
            let path = e.path().unwrap().to_string_lossy().into_owned();
            let mut data = Vec::new();
            io::Read::read_to_end(&mut e, &mut data).unwrap();
            if path == "index.json" {
                index = Some(serde_json::from_slice::<serde_json::Value>(&data).unwrap());
            } else if path.starts_with("blobs/") {
                blobs.push(path);
            }
        }
        let index = index.unwrap();
        let manifests = index["manifests"].as_array().unwrap();
        assert_eq!(manifests.len(), 3);
        // a and a2 have the same layer, config and manifest: 2 images' worth of blobs.
        assert_eq!(blobs.len(), 6, "{blobs:?}");
        assert_eq!(manifests[0]["digest"], manifests[2]["digest"]);
        assert_ne!(manifests[0]["digest"], manifests[1]["digest"]);
    }
}
