//! The image catalogue: which images' programs the simulated runtime has a model of. A
//! container is simulated faithfully when its command line starts with a program of the
//! sim's shell (busybox's utilities), is an agnhost subcommand the sim emulates, or is the
//! default program of an image emulated as a whole (a web server, the pause container, or
//! a control-plane image whose pod stands for an in-process component). Anything else
//! (`python -c ...`, a database) runs doing nothing until it is stopped, and the kubelet
//! says so with a Warning event.

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
