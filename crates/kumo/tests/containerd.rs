//! `kumo up --runtime containerd`: each node a network namespace of its own with its
//! containerd, the pods real processes in real cgroups, driven by the kubelet through the
//! CRI, and everything seen through the stock kubectl and crictl. The host's network is
//! the same after, and `kumo down` leaves no process, mount, namespace or cgroup.
//! Needs root and Debian's containerd, runc, containernetworking-plugins and
//! busybox-static (scripts/test installs them), and crictl (scripts/reference build).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod realnode;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use realnode::*;

const PODS: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: calc}
spec:
  restartPolicy: Never
  containers:
  - name: c
    image: busybox:1.37
    command: [sh, -c, 'echo "six times seven is $((6*7))"; echo "limit $(cat /sys/fs/cgroup/memory/memory.limit_in_bytes)"; sleep 3600']
    resources: {limits: {memory: 32Mi}}
---
apiVersion: v1
kind: Pod
metadata: {name: oom}
spec:
  restartPolicy: Never
  containers:
  - name: c
    image: busybox:1.37
    command: [sh, -c, 'x=$(head -c 100000000 /dev/zero | tr "\0" a); echo survived']
    resources: {limits: {memory: 32Mi}}
---
apiVersion: v1
kind: Pod
metadata: {name: init}
spec:
  initContainers:
  - {name: fails, image: "busybox:1.37", command: [sh, -c, 'sleep 2; exit 1']}
  containers:
  - {name: c, image: "busybox:1.37", command: [sleep, "3600"]}
---
apiVersion: v1
kind: Pod
metadata: {name: sidecar}
spec:
  initContainers:
  - {name: side, image: "busybox:1.37", restartPolicy: Always, command: [sh, -c, 'while true; do echo beside; sleep 1; done']}
  containers:
  - {name: c, image: "busybox:1.37", command: [sleep, "3600"]}
---
apiVersion: v1
kind: Pod
metadata: {name: privileged}
spec:
  restartPolicy: Never
  containers:
  - name: c
    image: busybox:1.37
    command: [sh, -c, 'mkdir -p /m && mount -t tmpfs none /m && echo mounted; sleep 3600']
    securityContext: {privileged: true}
---
apiVersion: v1
kind: Pod
metadata: {name: missing}
spec:
  containers:
  - {name: c, image: "registry.example.invalid/nothing:1", imagePullPolicy: IfNotPresent}
---
apiVersion: v1
kind: Pod
metadata: {name: web}
spec:
  terminationGracePeriodSeconds: 30
  containers:
  - name: c
    image: busybox:1.37
    command: [sh, -c, 'mkdir -p /www; echo hello-from-the-pod > /www/index.html; httpd -p 8080 -h /www; trap "exit 0" TERM; while true; do sleep 1; done']
    ports: [{containerPort: 8080}]
    readinessProbe: {httpGet: {path: /, port: 8080}, periodSeconds: 1}
    lifecycle: {preStop: {exec: {command: [sleep, "5"]}}}
"#;

#[test]
fn pods_run_as_real_containers_on_containerd() {
    let crictl = crictl();
    with_real_cluster(&["--nodes", "1"], |kc, data, printed| {
        exercise(kc, data, &crictl, printed)
    });
}

fn exercise(kc: &Path, data: &Path, crictl: &Path, printed: &str) {
    // kumo up says what runs where.
    assert!(printed.contains("in the cloud's VPC"), "{printed}");
    // The nodes say what runs their pods.
    let wide = ok(kc, &["get", "nodes", "-o", "wide"]);
    assert!(wide.contains("containerd://1.6."), "{wide}");
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let kernel = kernel.trim();
    let applied = kubectl_in(kc, &["apply", "-f", "-"], Some(PODS));
    assert!(applied.ok, "{}", applied.stderr);
    // A busybox pod's logs are what its shell computed; its cgroup carries its limit.
    let logs = eventually(60, "calc's logs", || {
        let o = kubectl(kc, &["logs", "calc"]);
        (o.ok && o.stdout.contains("limit ")).then_some(o.stdout)
    });
    assert!(logs.contains("six times seven is 42"), "{logs}");
    assert!(logs.contains(&format!("limit {}", 32 << 20)), "{logs}");
    // exec runs in the container, on the machine's kernel.
    let uname = ok(kc, &["exec", "calc", "--", "uname", "-r"]);
    assert_eq!(uname.trim(), kernel);
    // A privileged container may mount (its sandbox is privileged too).
    let mounted = eventually(60, "the privileged pod's logs", || {
        let o = kubectl(kc, &["logs", "privileged"]);
        (o.ok && !o.stdout.is_empty()).then_some(o.stdout)
    });
    assert_eq!(mounted.trim(), "mounted");
    // An interactive exec carries stdin to the process and its exit code back.
    let piped = kubectl_in(
        kc,
        &[
            "exec",
            "-i",
            "calc",
            "--",
            "sh",
            "-c",
            "read line; echo \"got $line\"; exit 7",
        ],
        Some("hello\n"),
    );
    assert!(
        piped.stdout.contains("got hello"),
        "{}{}",
        piped.stdout,
        piped.stderr
    );
    assert!(piped.stderr.contains("exit code 7"), "{}", piped.stderr);
    // Past its limit, a container is OOMKilled.
    let reason = eventually(60, "oom to be killed", || {
        let r = jsonpath(
            kc,
            "pod/oom",
            "{.status.containerStatuses[0].state.terminated.reason}",
        );
        (!r.is_empty()).then_some(r)
    });
    assert_eq!(reason, "OOMKilled");
    // An init container that fails is retried.
    eventually(60, "the init container's retry", || {
        let n = jsonpath(
            kc,
            "pod/init",
            "{.status.initContainerStatuses[0].restartCount}",
        );
        (n.parse::<u32>().unwrap_or(0) >= 1).then_some(())
    });
    let last = jsonpath(
        kc,
        "pod/init",
        "{.status.initContainerStatuses[0].lastState.terminated.exitCode}",
    );
    assert_eq!(last, "1");
    // A sidecar runs beside the main container.
    eventually(60, "the sidecar pod to be ready", || {
        let ready = jsonpath(kc, "pod/sidecar", "{.status.containerStatuses[0].ready}");
        let side = jsonpath(
            kc,
            "pod/sidecar",
            "{.status.initContainerStatuses[0].started}",
        );
        (ready == "true" && side == "true").then_some(())
    });
    let beside = ok(kc, &["logs", "sidecar", "-c", "side"]);
    assert!(beside.contains("beside"), "{beside}");
    // `logs -f` follows the file as the runtime writes it.
    let mut follow = Command::new("kubectl")
        .args(["logs", "-f", "sidecar", "-c", "side", "--since=1s"])
        .env("KUBECONFIG", kc)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = follow.stdout.take().unwrap();
    let lines = std::thread::spawn(move || {
        use std::io::BufRead;
        std::io::BufReader::new(out)
            .lines()
            .take(3)
            .filter_map(Result::ok)
            .collect::<Vec<_>>()
    });
    eventually(20, "three followed lines", || {
        lines.is_finished().then_some(())
    });
    let _ = follow.kill();
    let _ = follow.wait();
    let lines = lines.join().unwrap();
    assert_eq!(lines, ["beside", "beside", "beside"]);
    // A missing image with no registry: ErrImagePull, then ImagePullBackOff, with the
    // runtime's message.
    let events = eventually(60, "image pull back-off events", || {
        let e = kubectl(
            kc,
            &[
                "get",
                "events",
                "--field-selector",
                "involvedObject.name=missing",
            ],
        )
        .stdout;
        (e.contains("Error: ErrImagePull") && e.contains("Back-off pulling image")).then_some(e)
    });
    assert!(
        events.contains("failed to pull and unpack image"),
        "{events}"
    );
    assert!(events.contains("Error: ImagePullBackOff"), "{events}");
    // Seed 003's `kubectl create deploy web --image=nginx`: no tag means `:latest` and
    // imagePullPolicy Always, so the pull goes to a registry — the node's mirror, which
    // serves the images kumo has.
    ok(kc, &["create", "deployment", "latest", "--image=nginx"]);
    eventually(90, "the nginx:latest deployment available", || {
        (jsonpath(kc, "deploy/latest", "{.status.availableReplicas}") == "1").then_some(())
    });
    let pulled = kubectl(kc, &["get", "events", "--field-selector", "reason=Pulled"]).stdout;
    assert!(
        pulled.contains("Successfully pulled image \"nginx\""),
        "{pulled}"
    );
    // With the size the runtime reports, as upstream's event gives it.
    assert!(!pulled.contains("Image size: 0 bytes"), "{pulled}");
    // port-forward reaches the pod's server from the host's loopback.
    eventually(60, "web to be ready", || {
        (jsonpath(kc, "pod/web", "{.status.containerStatuses[0].ready}") == "true").then_some(())
    });
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut forward = Command::new("kubectl")
        .args(["port-forward", "pod/web", &format!("{port}:8080")])
        .env("KUBECONFIG", kc)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let page = eventually(20, "the page through port-forward", || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
        s.write_all(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n").ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).ok()?;
        text.contains("hello-from-the-pod").then_some(text)
    });
    let _ = forward.kill();
    let _ = forward.wait();
    assert!(
        page.starts_with("HTTP/1.") && page.contains(" 200 OK"),
        "{page}"
    );
    // crictl on the node lists the containers, as on a real node.
    let node = jsonpath(kc, "pod/web", "{.spec.nodeName}");
    let ps = Command::new(env!("CARGO_BIN_EXE_kumo"))
        .args(["node", "exec", &node, "--data-dir"])
        .arg(data)
        .arg("--")
        .arg(crictl)
        .arg("ps")
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&ps.stdout);
    assert!(
        ps.status.success(),
        "{}",
        String::from_utf8_lossy(&ps.stderr)
    );
    for name in ["calc", "web", "sidecar"] {
        assert!(listed.contains(name), "{name} not in crictl ps:\n{listed}");
    }
    // Deleting a pod with a 5 s preStop takes at least that, and leaves nothing behind.
    let web_uid = jsonpath(kc, "pod/web", "{.metadata.uid}");
    let started = Instant::now();
    ok(kc, &["delete", "pod", "web", "--wait=true"]);
    let took = started.elapsed();
    assert!(took >= Duration::from_secs(5), "deleted in {took:?}");
    assert!(
        took < Duration::from_secs(25),
        "deleted in {took:?}: SIGTERM was not heeded"
    );
    eventually(20, "web's sandbox to go", || {
        let o = Command::new(env!("CARGO_BIN_EXE_kumo"))
            .args(["node", "exec", &node, "--data-dir"])
            .arg(data)
            .arg("--")
            .arg(crictl)
            .args(["pods", "-q", "--name", "web"])
            .output()
            .ok()?;
        String::from_utf8_lossy(&o.stdout)
            .trim()
            .is_empty()
            .then_some(())
    });
    let cgroups = std::fs::read_dir("/sys/fs/cgroup/memory/kumo")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect::<Vec<_>>();
    for node_root in cgroups {
        let pod_cgroup = node_root
            .join("kubepods")
            .join("besteffort")
            .join(format!("pod{web_uid}"));
        assert!(!pod_cgroup.exists(), "{} left", pod_cgroup.display());
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&web_uid), "web's mounts left");
    volumes(kc, data);
}

const WRITER: &str = r#"
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
---
apiVersion: v1
kind: Pod
metadata: {name: writer}
spec:
  restartPolicy: Never
  containers:
  - name: c
    image: busybox:1.37
    command: [sh, -c, 'echo kept > /data/greeting && sync']
    volumeMounts: [{name: d, mountPath: /data}]
  volumes: [{name: d, persistentVolumeClaim: {claimName: data}}]
"#;

const READER: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: reader}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: busybox:1.37
    command: [sh, -c, 'cat /data/greeting; df -k /data | tail -1; sleep 3600']
    volumeMounts: [{name: d, mountPath: /data}]
  volumes: [{name: d, persistentVolumeClaim: {claimName: data}}]
"#;

/// A claim on the real node: the cloud's volume formatted ext4 on a loop device, mounted
/// into the pod; its data there for the next pod; grown (offline here: this machine does
/// not let a mounted ext4 grow, which the driver says) once the next pod stages it.
fn volumes(kc: &Path, data: &Path) {
    let applied = kubectl_in(kc, &["apply", "-f", "-"], Some(WRITER));
    assert!(applied.ok, "{}", applied.stderr);
    eventually(90, "the writer done", || {
        (jsonpath(kc, "pod/writer", "{.status.phase}") == "Succeeded").then_some(())
    });
    let pv = jsonpath(kc, "pvc/data", "{.spec.volumeName}");
    let handle = jsonpath(kc, &format!("pv/{pv}"), "{.spec.csi.volumeHandle}");
    let file = data
        .join("cloud")
        .join("volumes")
        .join(format!("{handle}.img"));
    assert!(file.is_file(), "{} is the volume", file.display());
    ok(kc, &["delete", "pod", "writer", "--wait=true"]);
    let applied = kubectl_in(kc, &["apply", "-f", "-"], Some(READER));
    assert!(applied.ok, "{}", applied.stderr);
    let first = eventually(90, "the reader's log", || {
        let o = kubectl(kc, &["logs", "reader"]);
        (o.ok && o.stdout.lines().count() >= 2).then_some(o.stdout)
    });
    let mut lines = first.lines();
    assert_eq!(lines.next(), Some("kept"), "{first}");
    let df = lines.next().unwrap_or_default().to_owned();
    assert!(
        df.starts_with("/dev/loop"),
        "an ext4 on a loop device: {df}"
    );
    let kib = |line: &str| -> u64 {
        line.split_whitespace()
            .nth(1)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    assert!(kib(&df) > 900_000 && kib(&df) < 1_100_000, "1 GiB: {df}");
    // Grow to 2Gi: the volume grows at once; the file system when the next pod stages it.
    ok(
        kc,
        &[
            "patch",
            "pvc",
            "data",
            "-p",
            r#"{"spec":{"resources":{"requests":{"storage":"2Gi"}}}}"#,
        ],
    );
    eventually(60, "the cloud's volume grown", || {
        (std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0) == 2 << 30).then_some(())
    });
    ok(kc, &["delete", "pod", "reader", "--wait=true"]);
    let applied = kubectl_in(kc, &["apply", "-f", "-"], Some(READER));
    assert!(applied.ok, "{}", applied.stderr);
    eventually(90, "the claim's new capacity", || {
        (jsonpath(kc, "pvc/data", "{.status.capacity.storage}") == "2Gi").then_some(())
    });
    let second = eventually(90, "the reader's log again", || {
        let o = kubectl(kc, &["logs", "reader"]);
        (o.ok && o.stdout.lines().count() >= 2).then_some(o.stdout)
    });
    assert!(second.starts_with("kept\n"), "{second}");
    let df = second.lines().nth(1).unwrap_or_default().to_owned();
    assert!(kib(&df) > 1_900_000, "grown to 2 GiB: {df}");
    // Deleting the claim deletes the volume and its file.
    ok(kc, &["delete", "pod", "reader", "--wait=true"]);
    ok(kc, &["delete", "pvc", "data", "--wait=true"]);
    eventually(60, "the volume's file gone", || {
        (!file.exists()).then_some(())
    });
}
