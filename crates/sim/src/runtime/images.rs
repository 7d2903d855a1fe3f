//! The image catalogue: what the simulator knows of each image — its entrypoint and cmd
//! ([`image_config`]), the files it ships ([`image_files`]), the page its server answers
//! ([`page_of`]), the CPU a request costs it ([`cpu_per_request`]) — and which images'
//! programs the simulated runtime has a model of ([`emulated`]). A
//! container is simulated faithfully when its command line starts with a program of the
//! sim's shell (busybox's utilities), is an agnhost subcommand the sim emulates, or is the
//! default program of an image emulated as a whole (a web server, the pause container, or
//! a control-plane image whose pod stands for an in-process component). Anything else
//! (`python -c ...`, a database) runs doing nothing until it is stopped, and the kubelet
//! says so with a Warning event.

use std::time::Duration;

use serde_json::Value;

/// agnhost subcommands the simulator emulates: in the shell (programs that print, exit or
/// read files) or as servers answering on their ports.
const AGNHOST: &[&str] = &[
    "pause",
    "entrypoint-tester",
    "logs-generator",
    "mounttest",
    "mtlsclient",
    "mtlsserver",
    "dns-suffix",
    "dns-server-list",
    "etc-hosts",
    "netexec",
    "serve-hostname",
    "test-webserver",
    "porter",
    "liveness",
    "webhook",
    "crd-conversion-webhook",
    "nettest",
    "guestbook",
    "grpc-health-checking",
    "fake-gitserver",
];

/// Images emulated as a whole when they run their own entrypoint: web servers with their
/// page, the pause container, the e2e `nonewprivs` image, the sample API server, and the
/// control-plane images whose pods stand for kumo's in-process components (their probe
/// endpoints answer: see `servers::page_of`).
const WHOLE: &[&str] = &[
    "pause",
    "nginx",
    "httpd",
    "hpa-example",
    "nonewprivs",
    "sample-apiserver",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kube-proxy",
    "coredns",
    "metrics-server",
    "etcd",
];

/// The last path segment of an image's repository (`registry.k8s.io/pause:3.10` →
/// `pause`).
pub fn image_name(image: &str) -> &str {
    let repo = image.split('@').next().unwrap_or(image);
    let repo = repo
        .rsplit_once(':')
        .filter(|(_, t)| !t.contains('/'))
        .map_or(repo, |(r, _)| r);
    repo.rsplit('/').next().unwrap_or(repo)
}

/// Whether the simulator has a model of container `argv` (its command line after the
/// image's entrypoint and cmd were merged in) of `image`; `own_command` says the spec
/// gave no command (the image's entrypoint runs).
pub fn emulated(image: &str, argv: &[String], own_command: bool) -> bool {
    let name = image_name(image);
    let Some(first) = argv.first() else {
        return WHOLE.contains(&name);
    };
    let program = first.rsplit('/').next().unwrap_or(first);
    if matches!(program, "agnhost" | "agnhost-2") {
        return argv
            .get(1)
            .is_none_or(|sub| AGNHOST.contains(&sub.as_str()));
    }
    super::shell::knows(program)
        || (WHOLE.contains(&name) && (own_command || program == name))
        || program == "pause"
}

/// The image config the sim knows of `image`: (entrypoint, cmd).
pub fn image_config(image: &str) -> (Vec<String>, Vec<String>) {
    let repo = image.split(['@']).next().unwrap_or(image);
    let repo = repo
        .rsplit_once(':')
        .filter(|(_, t)| !t.contains('/'))
        .map_or(repo, |(r, _)| r);
    let name = repo.rsplit('/').next().unwrap_or(repo);
    let v = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    match name {
        "agnhost" => (v(&["/agnhost"]), v(&["pause"])),
        // The update-demo images: agnhost serving their files.
        "nautilus" | "kitten" => (v(&["/agnhost"]), v(&["test-webserver"])),
        "busybox" => (Vec::new(), v(&["sh"])),
        "pause" => (v(&["/pause"]), Vec::new()),
        // The e2e image whose setuid-root `nnp` prints its effective uid.
        "nonewprivs" => (Vec::new(), v(&["nnp"])),
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

/// Files of an image's root filesystem the sim provides: agnhost's `/localhost.crt` and
/// `/localhost.key` (a self-signed pair for `localhost`, made once per process: its
/// `porter` and `grpc-health-checking` serve TLS with them; the StatefulSet e2e tests
/// probe the first through `test-webserver`), and the update-demo images' `/data.json`
/// (nautilus and kitten are agnhost with a picture and that file), and the
/// `/etc/os-release` of these Alpine-based images. Image volumes show the same files.
pub fn image_files(image: &str) -> Vec<(String, String)> {
    let repo = image.split('@').next().unwrap_or(image);
    let repo = repo
        .rsplit_once(':')
        .filter(|(_, t)| !t.contains('/'))
        .map_or(repo, |(r, _)| r);
    let name = repo.rsplit('/').next().unwrap_or(repo);
    let mut files = Vec::new();
    if matches!(name, "agnhost" | "nautilus" | "kitten") {
        let (cert, key) = localhost_pair();
        files.push(("/localhost.crt".to_owned(), cert.clone()));
        files.push(("/localhost.key".to_owned(), key.clone()));
        files.push((
            "/etc/os-release".to_owned(),
            "NAME=\"Alpine Linux\"\nID=alpine\nVERSION_ID=3.21.3\nPRETTY_NAME=\"Alpine Linux v3.21\"\nHOME_URL=\"https://alpinelinux.org/\"\nBUG_REPORT_URL=\"https://gitlab.alpinelinux.org/alpine/aports/-/issues\"\n".to_owned(),
        ));
    }
    if matches!(name, "nautilus" | "kitten") {
        files.push((
            "/data.json".to_owned(),
            format!("{{\n  \"image\": \"{name}.jpg\"\n}}\n"),
        ));
        files.push((format!("/{name}.jpg"), String::new()));
    }
    files
}

/// The self-signed certificate and key for `localhost` the agnhost image ships.
fn localhost_pair() -> &'static (String, String) {
    static PAIR: std::sync::OnceLock<(String, String)> = std::sync::OnceLock::new();
    PAIR.get_or_init(|| {
        let made = rcgen::KeyPair::generate().and_then(|key| {
            let params = rcgen::CertificateParams::new(vec![
                "localhost".to_owned(),
                "127.0.0.1".to_owned(),
            ])?;
            Ok((params.self_signed(&key)?.pem(), key.serialize_pem()))
        });
        made.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "generating agnhost's localhost certificate");
            (String::new(), String::new())
        })
    })
}

/// CPU time a server of `image` spends per request: registry.k8s.io/hpa-example (the
/// HorizontalPodAutoscaler walkthrough's php-apache, a loop of square roots per request)
/// about 100 ms, anything else 1 ms.
pub fn cpu_per_request(image: &str) -> Duration {
    let repo = image.split([':', '@']).next().unwrap_or(image);
    if repo.ends_with("/hpa-example") || repo == "hpa-example" {
        Duration::from_millis(100)
    } else {
        Duration::from_millis(1)
    }
}
/// The page a catalogued image serves on `port` (container spec `c`): its `Server` header
/// and body. Web servers on 80; CoreDNS's health (8080) and ready (8181) endpoints;
/// metrics-server's `/readyz` and `/livez` on its `--secure-port` (the requests that
/// matter, the API server's, reach the in-process metrics server through the network).
pub fn page_of(image_name: &str, c: &Value, port: u16) -> Option<(&'static str, &'static str)> {
    match (image_name, port) {
        ("httpd", 80) => Some((
            "Apache/2.4.38 (Unix)",
            "<html><body><h1>It works!</h1></body></html>\n",
        )),
        // registry.k8s.io/hpa-example: php-apache whose index.php computes and says OK.
        ("hpa-example", 80) => Some(("Apache/2.4.10 (Debian)", "OK!")),
        ("coredns", 8080 | 8181) => Some(("", "OK")),
        ("metrics-server", p) => {
            let secure = c["args"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .find_map(|a| a.strip_prefix("--secure-port="))
                .and_then(|v| v.parse::<u16>().ok())
                .unwrap_or(10250);
            (p == secure).then_some(("", "ok"))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn the_catalogue_knows_what_it_emulates() {
        assert!(emulated("busybox", &argv(&["sh", "-c", "sleep 1"]), false));
        assert!(emulated(
            "registry.k8s.io/e2e-test-images/agnhost:2.55",
            &argv(&["/agnhost", "netexec"]),
            true
        ));
        assert!(!emulated(
            "registry.k8s.io/e2e-test-images/agnhost:2.55",
            &argv(&["/agnhost", "no-such"]),
            true
        ));
        assert!(emulated("nginx:1.27", &[], true));
        assert!(emulated(
            "registry.k8s.io/pause:3.10",
            &argv(&["/pause"]),
            true
        ));
        assert!(!emulated(
            "python:3.12",
            &argv(&["python", "-c", "print(1)"]),
            false
        ));
        assert!(!emulated("postgres:17", &[], true));
        // kubeadm's static pod runs the component by name.
        assert!(emulated(
            "registry.k8s.io/kube-apiserver:v1.37.0",
            &argv(&["kube-apiserver", "--secure-port=6443"]),
            false
        ));
        // nginx's image with a command the sim has no model of.
        assert!(!emulated(
            "nginx:1.27",
            &argv(&["nginx-debug", "-g", "daemon off;"]),
            false
        ));
    }
}
