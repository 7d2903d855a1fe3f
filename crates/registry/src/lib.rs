//! A read-only registry (the OCI distribution API's pull side) over OCI image-layout
//! archives: what kind's local registry is to its nodes. A node's containerd has it as the
//! mirror of every registry host, so a pull — `imagePullPolicy: Always`, an image without a
//! tag — of an image kumo has (its offline images, those `kumo load image-archive` added)
//! works with no registry on the internet, and one it does not have fails as it would.
//!
//! The archives are the ones `ctr images import` takes: `index.json` naming each manifest
//! with `io.containerd.image.name`, blobs under `blobs/sha256/`. They are indexed when first
//! asked for and again when they change; blobs are streamed from the archive in place.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::Frame;

/// The media type of an image manifest when an index leaves it out.
const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";

/// A byte range of an archive: where a blob's content is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Location {
    pub archive: PathBuf,
    pub offset: u64,
    pub size: u64,
}

/// A manifest an archive names: its media type and digest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    pub media_type: String,
    pub digest: String,
}

/// What one archive holds.
#[derive(Clone, Debug, Default)]
struct Archive {
    /// Image name with tag (`registry.k8s.io/pause:3.10`) → its manifest.
    names: BTreeMap<String, Manifest>,
    /// `sha256:<hex>` → where its content is.
    blobs: BTreeMap<String, Location>,
}

/// What can go wrong reading an archive.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("{0}: {1}")]
    Io(PathBuf, io::Error),
    #[error("{0}: index.json: {1}")]
    Index(PathBuf, String),
}

/// An archive's modification time and size when it was indexed, and its index.
type Indexed = (SystemTime, u64, Arc<Archive>);

/// The archives of some directories, indexed.
pub struct Store {
    dirs: Vec<PathBuf>,
    archives: Mutex<BTreeMap<PathBuf, Indexed>>,
}

impl Store {
    /// A store of the `*.tar` files in `dirs` (those that are OCI image layouts); where two
    /// name the same image, the one in the later directory is served.
    pub fn new(dirs: Vec<PathBuf>) -> Store {
        Store {
            dirs,
            archives: Mutex::new(BTreeMap::new()),
        }
    }

    /// The archives as they are now: new or changed ones indexed, removed ones dropped.
    fn current(&self) -> Vec<Arc<Archive>> {
        let mut files = Vec::new();
        for dir in &self.dirs {
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            for e in entries.flatten() {
                let path = e.path();
                let name = e.file_name();
                let name = name.to_string_lossy();
                // Archives being written are hidden files (`.<name>.<pid>.tmp`).
                if name.starts_with('.') || !name.ends_with(".tar") {
                    continue;
                }
                if let Ok(meta) = e.metadata() {
                    files.push((
                        path,
                        meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                        meta.len(),
                    ));
                }
            }
        }
        let mut known = self.archives.lock().unwrap_or_else(|e| e.into_inner());
        known.retain(|p, _| files.iter().any(|(f, _, _)| f == p));
        let mut out = Vec::new();
        for (path, modified, len) in files {
            match known.get(&path) {
                Some((m, l, a)) if *m == modified && *l == len => out.push(a.clone()),
                _ => match index(&path) {
                    Ok(a) => {
                        let a = Arc::new(a);
                        known.insert(path, (modified, len, a.clone()));
                        out.push(a);
                    }
                    // A docker-save archive or a broken one: not served.
                    Err(e) => tracing::debug!(error = %e, "registry: archive not indexed"),
                },
            }
        }
        out
    }

    /// The manifest of `name` (a full name: host, repository) at `reference` (a tag or a
    /// digest), and where its content is.
    pub fn manifest(&self, name: &str, reference: &str) -> Option<(Manifest, Location)> {
        let archives = self.current();
        // A later directory's archive wins, as a later import does on the node.
        for a in archives.iter().rev() {
            let found = if reference.starts_with("sha256:") {
                a.names
                    .iter()
                    .find(|(n, m)| repository(n) == name && m.digest == reference)
                    .map(|(_, m)| m.clone())
            } else {
                a.names.get(&format!("{name}:{reference}")).cloned()
            };
            if let Some(m) = found {
                if let Some(loc) = a.blobs.get(&m.digest) {
                    return Some((m, loc.clone()));
                }
            }
        }
        None
    }

    /// Where blob `digest` is, in any archive.
    pub fn blob(&self, digest: &str) -> Option<Location> {
        self.current()
            .iter()
            .find_map(|a| a.blobs.get(digest).cloned())
    }
}

/// `host/repo` of `host/repo:tag`.
fn repository(name: &str) -> &str {
    match name.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => repo,
        _ => name,
    }
}

/// Reads an archive's index.json and where each blob is.
fn index(path: &Path) -> Result<Archive, RegistryError> {
    let io_err = |e| RegistryError::Io(path.to_owned(), e);
    let file = std::fs::File::open(path).map_err(io_err)?;
    let mut tar = tar::Archive::new(file);
    let mut archive = Archive::default();
    let mut index_json = None;
    // Seeking past each blob: only the headers and index.json are read.
    for entry in tar.entries_with_seek().map_err(io_err)? {
        let mut entry = entry.map_err(io_err)?;
        let p = entry.path().map_err(io_err)?.to_string_lossy().into_owned();
        let p = p.trim_start_matches("./").to_owned();
        if p == "index.json" {
            let mut text = Vec::new();
            io::Read::read_to_end(&mut entry, &mut text).map_err(io_err)?;
            index_json = Some(text);
        } else if let Some(hex) = p.strip_prefix("blobs/sha256/") {
            archive.blobs.insert(
                format!("sha256:{hex}"),
                Location {
                    archive: path.to_owned(),
                    offset: entry.raw_file_position(),
                    size: entry.size(),
                },
            );
        }
    }
    let text = index_json.ok_or_else(|| RegistryError::Index(path.to_owned(), "missing".into()))?;
    let index: serde_json::Value = serde_json::from_slice(&text)
        .map_err(|e| RegistryError::Index(path.to_owned(), e.to_string()))?;
    for m in index["manifests"].as_array().into_iter().flatten() {
        let (Some(name), Some(digest)) = (
            m.pointer("/annotations/io.containerd.image.name")
                .and_then(|v| v.as_str()),
            m["digest"].as_str(),
        ) else {
            continue;
        };
        archive.names.insert(
            name.to_owned(),
            Manifest {
                media_type: m["mediaType"].as_str().unwrap_or(OCI_MANIFEST).to_owned(),
                digest: digest.to_owned(),
            },
        );
    }
    Ok(archive)
}

type Body = BoxBody<Bytes, io::Error>;

fn full(text: impl Into<Bytes>) -> Body {
    Full::new(text.into())
        .map_err(|never| match never {})
        .boxed()
}

/// The distribution API's error document.
fn error(status: StatusCode, code: &str, message: &str) -> Response<Body> {
    let body = serde_json::json!({"errors": [{"code": code, "message": message}]}).to_string();
    let mut r = Response::new(full(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

/// A blob's bytes, streamed from its archive.
fn stream(loc: &Location) -> Body {
    use futures::StreamExt;
    let (archive, offset, size) = (loc.archive.clone(), loc.offset, loc.size);
    let chunks = futures::stream::unfold((None::<tokio::fs::File>, 0u64), move |(file, sent)| {
        let archive = archive.clone();
        async move {
            use tokio::io::{AsyncReadExt, AsyncSeekExt};
            if sent >= size {
                return None;
            }
            let mut file = match file {
                Some(f) => f,
                None => {
                    let opened = async {
                        let mut f = tokio::fs::File::open(&archive).await?;
                        f.seek(io::SeekFrom::Start(offset)).await?;
                        Ok::<_, io::Error>(f)
                    }
                    .await;
                    match opened {
                        Ok(f) => f,
                        Err(e) => return Some((Err(e), (None, size))),
                    }
                }
            };
            let want = usize::try_from((size - sent).min(256 * 1024)).unwrap_or(256 * 1024);
            let mut buf = vec![0u8; want];
            match file.read(&mut buf).await {
                Ok(0) => Some((
                    Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "archive truncated",
                    )),
                    (None, size),
                )),
                Ok(n) => {
                    buf.truncate(n);
                    Some((Ok(Bytes::from(buf)), (Some(file), sent + n as u64)))
                }
                Err(e) => Some((Err(e), (None, size))),
            }
        }
    });
    BodyExt::boxed(StreamBody::new(chunks.map(|c| c.map(Frame::data))))
}

/// The full name a request means: `ns` (the host the client wanted, which containerd adds
/// when it asks a mirror) and the repository path; without `ns`, Docker Hub's.
fn full_name(repo: &str, ns: Option<&str>) -> String {
    match ns {
        Some(host) => format!("{host}/{repo}"),
        None if repo.contains('/') => format!("docker.io/{repo}"),
        None => format!("docker.io/library/{repo}"),
    }
}

/// Answers one request of the distribution API's pull side.
pub fn answer(store: &Store, req: &Request<impl Sized>) -> Response<Body> {
    let head = req.method() == Method::HEAD;
    if !head && req.method() != Method::GET {
        return error(
            StatusCode::METHOD_NOT_ALLOWED,
            "UNSUPPORTED",
            "this registry only serves pulls",
        );
    }
    let path = req.uri().path();
    let ns = req.uri().query().and_then(|q| {
        q.split('&')
            .find_map(|kv| kv.strip_prefix("ns="))
            .filter(|h| !h.is_empty())
    });
    let Some(rest) = path.strip_prefix("/v2/") else {
        return error(StatusCode::NOT_FOUND, "NAME_UNKNOWN", "not a registry path");
    };
    let with_headers = |mut r: Response<Body>, media: &str, digest: &str, size: u64| {
        let h = r.headers_mut();
        for (k, v) in [
            ("content-type", media.to_owned()),
            ("docker-content-digest", digest.to_owned()),
            ("content-length", size.to_string()),
        ] {
            if let Ok(v) = http::HeaderValue::from_str(&v) {
                h.insert(k, v);
            }
        }
        r
    };
    if rest.is_empty() {
        let mut r = Response::new(full("{}"));
        r.headers_mut().insert(
            "docker-distribution-api-version",
            http::HeaderValue::from_static("registry/2.0"),
        );
        return r;
    }
    if let Some((repo, reference)) = rest.rsplit_once("/manifests/") {
        let name = full_name(repo, ns);
        return match store.manifest(&name, reference) {
            Some((m, loc)) => {
                let body = if head {
                    full(Bytes::new())
                } else {
                    stream(&loc)
                };
                with_headers(Response::new(body), &m.media_type, &m.digest, loc.size)
            }
            None => error(
                StatusCode::NOT_FOUND,
                "MANIFEST_UNKNOWN",
                &format!("manifest unknown: {name}:{reference}"),
            ),
        };
    }
    if let Some((_, digest)) = rest.rsplit_once("/blobs/") {
        return match store.blob(digest) {
            Some(loc) => {
                let body = if head {
                    full(Bytes::new())
                } else {
                    stream(&loc)
                };
                with_headers(
                    Response::new(body),
                    "application/octet-stream",
                    digest,
                    loc.size,
                )
            }
            None => error(
                StatusCode::NOT_FOUND,
                "BLOB_UNKNOWN",
                "blob unknown to registry",
            ),
        };
    }
    error(StatusCode::NOT_FOUND, "NAME_UNKNOWN", "not a registry path")
}

/// Serves `store` on `listener` (plain HTTP, as a node's mirror on its own loopback).
pub async fn serve(listener: tokio::net::TcpListener, store: Arc<Store>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            continue;
        };
        let store = store.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let store = store.clone();
                async move {
                    // Indexing reads archives: off the async threads.
                    let r = tokio::task::spawn_blocking(move || answer(&store, &req)).await;
                    Ok::<_, std::convert::Infallible>(r.unwrap_or_else(|_| {
                        error(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            "UNKNOWN",
                            "internal error",
                        )
                    }))
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An OCI layout archive with one manifest named `name`; returns (manifest, layer) digests.
    fn archive(path: &Path, name: &str, layer: &[u8]) -> (String, String) {
        fn sha(data: &[u8]) -> String {
            // A stand-in digest: the store trusts the archive's names, as containerd's
            // import does not (it checks them); the registry only looks them up.
            format!(
                "sha256:{:064x}",
                data.iter().map(|b| *b as u64).sum::<u64>() + data.len() as u64
            )
        }
        let layer_digest = sha(layer);
        let manifest = serde_json::json!({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
            "layers": [{"digest": layer_digest, "size": layer.len()}]})
        .to_string()
        .into_bytes();
        let manifest_digest = sha(&manifest);
        let index = serde_json::json!({"schemaVersion": 2, "manifests": [{
            "mediaType": OCI_MANIFEST, "digest": manifest_digest, "size": manifest.len(),
            "annotations": {"io.containerd.image.name": name}}]})
        .to_string();
        let mut b = tar::Builder::new(std::fs::File::create(path).unwrap());
        let mut add = |p: &str, data: &[u8]| {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, p, data).unwrap();
        };
        add("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#);
        add("index.json", index.as_bytes());
        add(
            &format!("blobs/sha256/{}", &manifest_digest[7..]),
            &manifest,
        );
        add(&format!("blobs/sha256/{}", &layer_digest[7..]), layer);
        b.finish().unwrap();
        (manifest_digest, layer_digest)
    }

    fn get(store: &Store, method: Method, uri: &str) -> (StatusCode, http::HeaderMap, Vec<u8>) {
        let req = Request::builder().method(method).uri(uri).body(()).unwrap();
        let r = answer(store, &req);
        let (parts, body) = r.into_parts();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let bytes = rt.block_on(body.collect()).unwrap().to_bytes().to_vec();
        (parts.status, parts.headers, bytes)
    }

    #[test]
    fn pulls_are_answered_from_the_archives_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let (m, l) = archive(
            &dir.path().join("agnhost.tar"),
            "registry.k8s.io/e2e-test-images/agnhost:2.66.1",
            b"layer-bytes",
        );
        archive(
            &dir.path().join("busybox.tar"),
            "docker.io/library/busybox:1.37",
            b"layer-bytes",
        );
        // A half-written archive and a file that is no archive are not served.
        std::fs::write(dir.path().join(".x.tar.1.tmp"), b"partial").unwrap();
        std::fs::write(dir.path().join("junk.tar"), b"not a tar").unwrap();
        let store = Store::new(vec![dir.path().to_owned()]);

        let (s, h, _) = get(&store, Method::GET, "/v2/");
        assert_eq!(s, StatusCode::OK);
        assert_eq!(h["docker-distribution-api-version"], "registry/2.0");
        // containerd asks a mirror with the host it wanted as `ns`.
        let (s, h, body) = get(
            &store,
            Method::HEAD,
            "/v2/e2e-test-images/agnhost/manifests/2.66.1?ns=registry.k8s.io",
        );
        assert_eq!(s, StatusCode::OK);
        assert_eq!(h["docker-content-digest"], m.as_str());
        assert_eq!(h["content-type"], OCI_MANIFEST);
        assert!(body.is_empty());
        let (s, _, body) = get(
            &store,
            Method::GET,
            &format!("/v2/e2e-test-images/agnhost/manifests/{m}?ns=registry.k8s.io"),
        );
        assert_eq!(s, StatusCode::OK);
        assert!(String::from_utf8_lossy(&body).contains(&l));
        let (s, h, body) = get(
            &store,
            Method::GET,
            &format!("/v2/e2e-test-images/agnhost/blobs/{l}"),
        );
        assert_eq!(s, StatusCode::OK);
        assert_eq!(body, b"layer-bytes");
        assert_eq!(h["content-length"], "11");
        // Docker Hub's short names.
        let (s, _, _) = get(
            &store,
            Method::HEAD,
            "/v2/library/busybox/manifests/1.37?ns=docker.io",
        );
        assert_eq!(s, StatusCode::OK);
        let (s, _, _) = get(&store, Method::HEAD, "/v2/busybox/manifests/1.37");
        assert_eq!(s, StatusCode::OK);
        // What it does not have is unknown; a push is refused.
        let (s, _, body) = get(
            &store,
            Method::GET,
            "/v2/library/busybox/manifests/9.9?ns=docker.io",
        );
        assert_eq!(s, StatusCode::NOT_FOUND);
        assert!(String::from_utf8_lossy(&body).contains("MANIFEST_UNKNOWN"));
        let (s, _, _) = get(&store, Method::GET, "/v2/x/blobs/sha256:00");
        assert_eq!(s, StatusCode::NOT_FOUND);
        let (s, _, _) = get(&store, Method::PUT, "/v2/x/manifests/1");
        assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED);
        // Paths that name nothing, or try to leave the index, are unknown: nothing is
        // read by a path the request gives.
        for odd in [
            "/v2/../../etc/passwd",
            "/v2//manifests/",
            "/v2/x/manifests/../../index.json",
            "/v2/x/blobs/../../../etc/shadow",
            "/v2/x/blobs/sha256:",
            "/x",
            "/v2/e2e-test-images/agnhost/manifests/2.66.1?ns=",
        ] {
            let (s, _, _) = get(&store, Method::GET, odd);
            assert_eq!(s, StatusCode::NOT_FOUND, "{odd}");
        }
        // An archive removed is no longer served.
        std::fs::remove_file(dir.path().join("busybox.tar")).unwrap();
        let (s, _, _) = get(&store, Method::HEAD, "/v2/busybox/manifests/1.37");
        assert_eq!(s, StatusCode::NOT_FOUND);
    }

    #[test]
    fn a_later_directory_wins_as_a_later_import_does() {
        let (first, second) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let name = "registry.k8s.io/e2e-test-images/busybox:1.37.0-2";
        archive(&first.path().join("busybox.tar"), name, b"kumo's");
        let (m, _) = archive(&second.path().join("busybox.tar"), name, b"upstream's");
        let store = Store::new(vec![first.path().to_owned(), second.path().to_owned()]);
        let (s, h, _) = get(
            &store,
            Method::HEAD,
            "/v2/e2e-test-images/busybox/manifests/1.37.0-2?ns=registry.k8s.io",
        );
        assert_eq!(s, StatusCode::OK);
        assert_eq!(h["docker-content-digest"], m.as_str());
    }
}
