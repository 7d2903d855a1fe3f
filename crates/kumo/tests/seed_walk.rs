//! The hands-on of seeds 000, 001 and 003, command for command, as a user types them: the real
//! `kumo up -d` in the background, which merges its context into the user's kubeconfig (here
//! `$KUBECONFIG`, a file of the test's), then the real kubectl and `kumo cloud`,
//! `kumo doctor` with no flag telling them which cluster: they follow the current context.
//!
//! With the whole cloud-controller-manager, a LoadBalancer Service gets its EXTERNAL-IP
//! within 2 s, with EnsuringLoadBalancer then EnsuredLoadBalancer; with
//! `--cloud-controllers=cloud-node,cloud-node-lifecycle` (the seeds' environment: a CCM
//! without its service controller) the Service stays `<pending>` with no events while
//! ClusterIP, NodePort and EndpointSlices are there.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The user's kubeconfig of a test: beside the data directory, never the developer's.
fn user_kubeconfig(dir: &Path) -> PathBuf {
    dir.with_file_name("user.conf")
}

fn kumo(args: &[&str], dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kumo"))
        .args(args)
        .arg("--data-dir")
        .arg(dir)
        .env("KUBECONFIG", user_kubeconfig(dir))
        .output()
        .expect("kumo runs")
}

/// `kumo ARGS` as the user types it after `kumo up`: no --data-dir.
fn kumo_plain(args: &[&str], dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kumo"))
        .args(args)
        .env("KUBECONFIG", user_kubeconfig(dir))
        .env_remove("KUMO_CLOUD_DATA_DIR")
        .output()
        .expect("kumo runs")
}

/// Stops the background kumo when the test ends, even on a failed assertion.
struct Down(PathBuf);

impl Drop for Down {
    fn drop(&mut self) {
        let _ = kumo(&["down"], &self.0);
    }
}

/// A kumo running in the background and the kubeconfig it printed.
struct Up {
    dir: PathBuf,
    kubeconfig: String,
    _down: Down,
    _tmp: tempfile::TempDir,
}

fn up(extra: &[&str]) -> Up {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("kumo");
    let mut args = vec!["up", "-d", "--port", "0"];
    args.extend_from_slice(extra);
    let t = Instant::now();
    let out = kumo(&args, &dir);
    let down = Down(dir.clone());
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "kumo up -d: {stdout}\n{}",
        text(&out.stderr)
    );
    eprintln!("kumo up -d {extra:?} returned in {:?}", t.elapsed());
    // No export to type: the context is merged and current.
    assert!(
        stdout.contains("kumo: context kumo-kumo set in "),
        "{stdout}"
    );
    let kubeconfig = user_kubeconfig(&dir).display().to_string();
    Up {
        dir,
        kubeconfig,
        _down: down,
        _tmp: tmp,
    }
}

impl Up {
    /// kubectl as the user types it: (ok, stdout, stderr).
    fn k(&self, args: &[&str]) -> (bool, String, String) {
        let out = Command::new("kubectl")
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .output()
            .unwrap();
        (out.status.success(), text(&out.stdout), text(&out.stderr))
    }

    fn ok(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.k(args);
        assert!(ok, "kubectl {args:?}: {err}");
        out
    }

    fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut a = args.to_vec();
        a.extend_from_slice(&["-o", "json"]);
        serde_json::from_str(&self.ok(&a)).unwrap()
    }

    /// `kumo cloud ...`: the current context's cluster's cloud, found with no flag.
    fn cloud(&self, args: &[&str]) -> String {
        let out = kumo_plain(&[&["cloud"], args].concat(), &self.dir);
        assert!(
            out.status.success(),
            "kumo cloud {args:?}: {}",
            text(&out.stderr)
        );
        text(&out.stdout)
    }
}

/// Polls `f` every 100 ms until it returns Some, failing after `secs`.
fn eventually<T>(secs: u64, what: &str, f: impl FnMut() -> Option<T>) -> T {
    eventually_or(secs, what, f, String::new)
}

/// [`eventually`], with what `diagnose` finds in the failure's message.
fn eventually_or<T>(
    secs: u64,
    what: &str,
    mut f: impl FnMut() -> Option<T>,
    diagnose: impl FnOnce() -> String,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {secs} s: {what}\n{}", diagnose());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The last lines of every `name` file under `dir`, each headed by its path.
fn tails(dir: &Path, name: &str, lines: usize) -> String {
    let mut out = String::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() && !p.is_symlink() {
                stack.push(p);
            } else if p.file_name().is_some_and(|n| n == name) {
                let t = std::fs::read_to_string(&p).unwrap_or_default();
                let v: Vec<&str> = t.lines().collect();
                out += &format!(
                    "== {}\n{}\n",
                    p.display(),
                    v[v.len().saturating_sub(lines)..].join("\n")
                );
            }
        }
    }
    out
}

/// Waits until every node is Ready and initialized by the cloud node controller.
fn wait_nodes(u: &Up, n: usize) -> serde_json::Value {
    eventually(30, "nodes Ready and initialized", || {
        let nodes = u.json(&["get", "nodes"]);
        let items = nodes["items"].as_array()?;
        let done = items.len() == n
            && items.iter().all(|node| {
                let ready = node["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True");
                let initialized = !node["spec"]["taints"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|t| t["key"] == "node.cloudprovider.kubernetes.io/uninitialized");
                // The addresses come in a second write, after the taint is lifted.
                let addressed = node["status"]["addresses"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|a| a["type"] == "Hostname"));
                ready && initialized && addressed && node["spec"]["providerID"].is_string()
            });
        done.then_some(nodes)
    })
}

#[test]
fn seed_001_the_service_controller_fills_external_ip() {
    let u = up(&["--nodes", "1"]);
    let nodes = wait_nodes(&u, 2);

    // kubectl get node -o jsonpath='{range .items[*]}{.metadata.name}{"\t"}{.spec.providerID}{"\n"}{end}'
    let ids = u.ok(&[
        "get",
        "node",
        "-o",
        r#"jsonpath={range .items[*]}{.metadata.name}{"\t"}{.spec.providerID}{"\n"}{end}"#,
    ]);
    let lines: Vec<&str> = ids.lines().collect();
    assert_eq!(lines.len(), 2, "{ids}");
    for l in &lines {
        let (name, id) = l.split_once('\t').unwrap();
        assert!(
            id.starts_with("kumo://kumo-1") && id.contains("/i-"),
            "{name}: {id}"
        );
    }
    // Addresses and labels written by the cloud node controller.
    let node = &nodes["items"][0];
    let addrs = node["status"]["addresses"].as_array().unwrap();
    assert!(addrs
        .iter()
        .any(|a| a["type"] == "InternalIP" && a["address"].as_str().unwrap().starts_with("10.0.")));
    assert!(addrs.iter().any(|a| a["type"] == "Hostname"));
    let labels = &node["metadata"]["labels"];
    assert_eq!(labels["topology.kubernetes.io/region"], "kumo-1");
    assert!(labels["topology.kubernetes.io/zone"]
        .as_str()
        .unwrap()
        .starts_with("kumo-1"));
    assert!(labels["node.kubernetes.io/instance-type"].is_string());

    // kubectl create deployment web --image=nginx:1.29 --port=80
    // kubectl expose deployment web --type=LoadBalancer --port=80
    u.ok(&[
        "create",
        "deployment",
        "web",
        "--image=nginx:1.29",
        "--port=80",
    ]);
    let t = Instant::now();
    u.ok(&[
        "expose",
        "deployment",
        "web",
        "--type=LoadBalancer",
        "--port=80",
    ]);
    // kubectl get svc web: EXTERNAL-IP filled within 2 s.
    let vip = eventually(10, "EXTERNAL-IP", || {
        let s = u.json(&["get", "svc", "web"]);
        s["status"]["loadBalancer"]["ingress"][0]["ip"]
            .as_str()
            .map(str::to_owned)
    });
    let took = t.elapsed();
    eprintln!("EXTERNAL-IP {vip} after {took:?}");
    assert!(took < Duration::from_secs(2), "EXTERNAL-IP after {took:?}");
    let row = u.ok(&["get", "svc", "web", "--no-headers"]);
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cols[1], "LoadBalancer", "{row}");
    assert_eq!(cols[3], vip, "{row}");
    assert!(
        cols[4].starts_with("80:") && cols[4].ends_with("/TCP"),
        "{row}"
    );

    // kubectl get events -A --field-selector reason=EnsuringLoadBalancer
    let ev = u.ok(&[
        "get",
        "events",
        "-A",
        "--field-selector",
        "reason=EnsuringLoadBalancer",
    ]);
    assert!(ev.contains("service/web"), "{ev}");
    let ev = eventually(10, "EnsuredLoadBalancer", || {
        let ev = u.ok(&["describe", "svc", "web"]);
        ev.contains("EnsuredLoadBalancer").then_some(ev)
    });
    let ensuring = ev.find("EnsuringLoadBalancer").unwrap();
    let ensured = ev.find("EnsuredLoadBalancer").unwrap();
    assert!(ensuring < ensured, "{ev}");
    assert!(ev.contains("service-controller"), "{ev}");

    // The cloud has the balancer with that VIP.
    let lbs = u.cloud(&["lbs", "list"]);
    assert!(lbs.contains(&vip), "{lbs}");

    // The leases of the control plane, the CCM's among them.
    let leases = u.ok(&["-n", "kube-system", "get", "lease"]);
    for l in [
        "cloud-controller-manager",
        "kube-controller-manager",
        "kube-scheduler",
    ] {
        assert!(leases.contains(l), "{leases}");
    }

    // kubectl delete svc web: the cloud's balancer goes with it.
    u.ok(&["delete", "svc", "web"]);
    eventually(20, "the balancer deleted", || {
        (!u.cloud(&["lbs", "list"]).contains(&vip)).then_some(())
    });
    u.ok(&["delete", "deployment", "web"]);
}

#[test]
fn seed_000_without_the_service_controller_the_service_stays_pending() {
    let u = up(&[
        "--nodes",
        "1",
        "--cloud-controllers",
        "cloud-node,cloud-node-lifecycle",
    ]);
    let nodes = wait_nodes(&u, 2);
    // The node controller's fingerprints: providerID set, no uninitialized taint.
    let name = nodes["items"][0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    let taints = u.ok(&["get", "node", &name, "-o", "jsonpath={.spec.taints}"]);
    assert!(!taints.contains("uninitialized"), "{taints}");

    u.ok(&[
        "create",
        "deployment",
        "hello",
        "--image=nginx:1.29",
        "--port=80",
    ]);
    let manifest = "apiVersion: v1\nkind: Service\nmetadata:\n  name: hello\nspec:\n  type: LoadBalancer\n  selector:\n    app: hello\n  ports:\n    - port: 80\n      targetPort: 80\n";
    let out = Command::new("kubectl")
        .args(["apply", "-f", "-"])
        .env("KUBECONFIG", &u.kubeconfig)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(manifest.as_bytes())?;
            c.wait_with_output()
        })
        .unwrap();
    assert!(out.status.success());

    // kubectl get svc hello -w & sleep 5; kill %1 → one line only.
    let mut watch = Command::new("kubectl")
        .args(["get", "svc", "hello", "-w"])
        .env("KUBECONFIG", &u.kubeconfig)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(5));
    let _ = watch.kill();
    let out = watch.wait_with_output().unwrap();
    let printed = text(&out.stdout);
    let lines: Vec<&str> = printed.lines().collect();
    assert_eq!(lines.len(), 2, "header and one row only: {printed}");
    assert!(lines[1].contains("<pending>"), "{printed}");
    let cols: Vec<&str> = lines[1].split_whitespace().collect();
    let ip: std::net::Ipv4Addr = cols[2].parse().expect("a ClusterIP");
    let [a, b, ..] = ip.octets();
    assert!(
        a == 10 && (96..112).contains(&b),
        "ClusterIP in 10.96.0.0/12: {printed}"
    );
    assert!(cols[4].starts_with("80:3"), "NodePort: {printed}");

    // kubectl get events --field-selector involvedObject.name=hello,involvedObject.kind=Service
    let (ok, out, err) = u.k(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=hello,involvedObject.kind=Service",
    ]);
    assert!(ok, "{err}");
    assert!(out.is_empty(), "{out}");
    assert!(
        err.contains("No resources found in default namespace."),
        "{err}"
    );
    // kubectl get svc hello -o jsonpath='{.status}'
    let status = u.ok(&["get", "svc", "hello", "-o", "jsonpath={.status}"]);
    assert_eq!(status, r#"{"loadBalancer":{}}"#);
    // kubectl get endpointslices -l kubernetes.io/service-name=hello
    let slices = eventually(20, "an EndpointSlice with the pod", || {
        let s = u.ok(&[
            "get",
            "endpointslices",
            "-l",
            "kubernetes.io/service-name=hello",
        ]);
        s.contains("10.244.").then_some(s)
    });
    assert!(slices.contains("IPv4"), "{slices}");

    // kumo doctor names the missing service controller (the cluster and its cloud found
    // through the current context).
    let out = kumo_plain(&["doctor", "service", "hello"], &u.dir);
    let report = text(&out.stdout);
    assert!(!out.status.success(), "{report}");
    assert!(report.contains("service controller"), "{report}");

    u.ok(&["delete", "svc", "hello"]);
    u.ok(&["delete", "deployment", "hello"]);
}

#[test]
fn cloud_instances_drive_the_nodes() {
    let u = up(&["--nodes", "2"]);
    wait_nodes(&u, 3);
    let id_of = |node: &str| {
        let p = u.ok(&["get", "node", node, "-o", "jsonpath={.spec.providerID}"]);
        p.rsplit('/').next().unwrap().to_owned()
    };
    let (gone, stopped) = ("kumo-worker", "kumo-worker2");
    let (gone_id, stopped_id) = (id_of(gone), id_of(stopped));

    // Both kubelets stop posting status; after the node monitor grace period (50 s) the
    // node-lifecycle controller marks them NotReady, then the cloud node-lifecycle
    // controller deletes the terminated one and taints the stopped one.
    u.cloud(&["instance", "terminate", &gone_id]);
    u.cloud(&["instance", "stop", &stopped_id]);
    eventually(120, "the terminated instance's node deleted", || {
        let (ok, _, _) = u.k(&["get", "node", gone]);
        (!ok).then_some(())
    });
    let ev = u.ok(&[
        "get",
        "events",
        "-A",
        "--field-selector",
        "reason=DeletingNode",
    ]);
    assert!(ev.contains(gone), "{ev}");
    eventually(60, "the shutdown taint", || {
        let t = u.ok(&["get", "node", stopped, "-o", "jsonpath={.spec.taints}"]);
        t.contains("node.cloudprovider.kubernetes.io/shutdown")
            .then_some(())
    });

    // start → Ready again, the taint gone.
    u.cloud(&["instance", "start", &stopped_id]);
    eventually(60, "Ready without the shutdown taint", || {
        let n = u.json(&["get", "node", stopped]);
        let ready = n["status"]["conditions"]
            .as_array()?
            .iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        let tainted = n["spec"]["taints"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|t| t["key"] == "node.cloudprovider.kubernetes.io/shutdown");
        (ready && !tainted).then_some(())
    });
}

#[test]
fn seed_003_control_plane_static_pods_and_mirror_pods() {
    let u = up(&["--nodes", "1"]);
    wait_nodes(&u, 2);
    let cp = "kumo-control-plane";

    // kubectl -n kube-system get lease: the elected components, held from the node.
    let leases = u.ok(&["-n", "kube-system", "get", "lease"]);
    for l in ["kube-controller-manager", "kube-scheduler"] {
        let row = leases
            .lines()
            .find(|r| r.starts_with(&format!("{l} ")))
            .unwrap_or_else(|| panic!("{l} in {leases}"));
        assert!(row.split_whitespace().nth(1).is_some(), "{row}");
    }

    // kubectl -n kube-system get pods -o wide: the control plane's static pods, named
    // after the node, Ready once their probes of the real endpoints pass (kubeadm's
    // startup probes wait 10 s first).
    let wide = eventually(60, "control-plane pods Ready", || {
        let out = u.ok(&["-n", "kube-system", "get", "pods", "-o", "wide"]);
        let ready = [
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
        ]
        .iter()
        .all(|c| {
            out.lines().any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.first() == Some(&format!("{c}-{cp}").as_str())
                    && f.get(1) == Some(&"1/1")
                    && f.get(2) == Some(&"Running")
                    && f.get(6) == Some(&cp)
            })
        });
        ready.then_some(out)
    });
    eprintln!("{wide}");
    // kubeadm's addons beside them: CoreDNS (a Deployment, behind kube-dns) and
    // kube-proxy (a DaemonSet, one per node), with random suffixes.
    let addons = eventually(60, "coredns and kube-proxy Running", || {
        let out = u.ok(&["-n", "kube-system", "get", "pods", "-o", "wide"]);
        let running = |prefix: &str| {
            out.lines()
                .filter(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    f.first().is_some_and(|n| n.starts_with(prefix))
                        && f.get(1) == Some(&"1/1")
                        && f.get(2) == Some(&"Running")
                })
                .count()
        };
        (running("coredns-") == 2 && running("kube-proxy-") == 2).then_some(out)
    });
    eprintln!("{addons}");
    let dns = u.ok(&[
        "-n",
        "kube-system",
        "get",
        "svc",
        "kube-dns",
        "-o",
        "jsonpath={.spec.clusterIP}",
    ]);
    assert_eq!(dns, "10.96.0.10");
    // Their probes are kubeadm's, against where the components really serve.
    let api = u.json(&[
        "-n",
        "kube-system",
        "get",
        "pod",
        &format!("kube-apiserver-{cp}"),
    ]);
    let c = &api["spec"]["containers"][0];
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz", "{c}");
    assert_eq!(c["startupProbe"]["httpGet"]["scheme"], "HTTPS", "{c}");
    assert_eq!(api["metadata"]["labels"]["tier"], "control-plane");
    assert_eq!(api["spec"]["priorityClassName"], "system-node-critical");
    // kubectl get --raw='/readyz?verbose'
    let readyz = u.ok(&["get", "--raw", "/readyz?verbose"]);
    assert!(readyz.ends_with("readyz check passed\n"), "{readyz}");
    // The node proxy reaches the kubelet, by default and on 10250 (its well-known port,
    // wherever kumo's kubelet listens); a port of the node no kubelet holds is refused as
    // the simulated network refuses it, never dialed from the host.
    let path = format!("/api/v1/nodes/{cp}/proxy/healthz");
    assert_eq!(u.ok(&["get", "--raw", &path]), "ok");
    let path = format!("/api/v1/nodes/{cp}:10250/proxy/pods");
    let pods = u.ok(&["get", "--raw", &path]);
    assert!(pods.contains("\"kind\":\"PodList\""), "{pods}");
    let path = format!("/api/v1/nodes/{cp}:10255/proxy/pods");
    let (ok, _, err) = u.k(&["get", "--raw", &path]);
    assert!(
        !ok && err.contains("error dialing backend: dial tcp 10.0.")
            && err.contains("connection refused"),
        "{err}"
    );

    // A static pod on the worker: its mirror pod is owned by the Node and comes back
    // when deleted; removing the manifest removes the pod.
    let manifests = u.dir.join("nodes").join("kumo-worker").join("manifests");
    std::fs::write(
        manifests.join("static-web.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: static-web\n  labels:\n    role: static\nspec:\n  containers:\n    - name: web\n      image: nginx:1.27\n",
    )
    .unwrap();
    let mirror = "static-web-kumo-worker";
    eventually(40, "the mirror pod Running", || {
        let out = u.ok(&["get", "pod", "-o", "wide"]);
        out.lines()
            .any(|l| l.starts_with(mirror) && l.contains("Running") && l.contains("kumo-worker"))
            .then_some(())
    });
    let owner = u.ok(&[
        "get",
        "pod",
        mirror,
        "-o",
        "jsonpath={.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}",
    ]);
    assert_eq!(owner, "Node/kumo-worker");
    let uid = u.ok(&["get", "pod", mirror, "-o", "jsonpath={.metadata.uid}"]);
    u.ok(&["delete", "pod", mirror]);
    eventually(40, "the mirror pod recreated", || {
        let (ok, new_uid, _) = u.k(&["get", "pod", mirror, "-o", "jsonpath={.metadata.uid}"]);
        (ok && !new_uid.is_empty() && new_uid != uid).then_some(())
    });
    std::fs::remove_file(manifests.join("static-web.yaml")).unwrap();
    eventually(40, "the pod gone with its manifest", || {
        let (ok, _, err) = u.k(&["get", "pod", mirror]);
        (!ok && err.contains("NotFound")).then_some(())
    });
}

#[test]
fn without_a_ccm_nodes_stay_uninitialized_and_pods_pending() {
    // `--cloud-controllers=`: the kubelets still run with --cloud-provider=external, but
    // nobody initializes their nodes.
    let u = up(&["--nodes", "1", "--cloud-controllers="]);
    let nodes = eventually(30, "both nodes Ready", || {
        let nodes = u.json(&["get", "nodes"]);
        let items = nodes["items"].as_array()?;
        let ready = items.len() == 2
            && items.iter().all(|n| {
                n["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            });
        ready.then_some(nodes)
    });
    for n in nodes["items"].as_array().unwrap() {
        assert!(n["spec"]["providerID"].is_null(), "{n}");
        let taints: Vec<String> = n["spec"]["taints"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| {
                format!(
                    "{}={}:{}",
                    t["key"].as_str().unwrap(),
                    t["value"].as_str().unwrap_or(""),
                    t["effect"].as_str().unwrap()
                )
            })
            .collect();
        assert!(
            taints.contains(
                &"node.cloudprovider.kubernetes.io/uninitialized=true:NoSchedule".to_owned()
            ),
            "{taints:?}"
        );
    }
    assert!(u
        .ok(&["-n", "kube-system", "get", "lease"])
        .lines()
        .all(|l| !l.starts_with("cloud-controller-manager ")));

    // kubectl create deployment web --image=nginx:1.29: its pod stays Pending, with the
    // scheduler's own words.
    u.ok(&["create", "deployment", "web", "--image=nginx:1.29"]);
    let msg = eventually(30, "FailedScheduling", || {
        let out = u.ok(&[
            "get",
            "events",
            "--field-selector",
            "reason=FailedScheduling",
            "-o",
            "jsonpath={.items[*].message}",
        ]);
        (!out.is_empty()).then_some(out)
    });
    assert!(
        msg.starts_with("0/2 nodes are available: 2 node(s) had untolerated taint(s). preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling."),
        "{msg}"
    );
    let phase = u.ok(&[
        "get",
        "pods",
        "-l",
        "app=web",
        "-o",
        "jsonpath={.items[0].status.phase}",
    ]);
    assert_eq!(phase, "Pending");
}

/// Seed 000's CSI lines and the volume life cycle on the simulator: each node registers
/// the cloud's CSI driver (the Node's `csi.volume.kubernetes.io/nodeid`, the CSINode's
/// driver); a claim of the default class waits for its first consumer, is provisioned in
/// that pod's zone, attached, mounted; its data is there for the next pod on another node
/// of the zone; it grows; reclaim Delete removes the cloud's volume and Retain keeps it;
/// a deny policy on AttachVolume and a volume quota show as upstream's events; a generic
/// ephemeral volume's claim comes and goes with its pod.
#[test]
fn seed_000_csi_registration_and_volumes() {
    let u = up(&["--nodes", "4"]);
    let nodes = wait_nodes(&u, 5);
    let instances = u.cloud(&["instances", "list", "-o", "json"]);
    let instances: serde_json::Value = serde_json::from_str(&instances).unwrap();
    for node in nodes["items"].as_array().unwrap() {
        let name = node["metadata"]["name"].as_str().unwrap();
        // kubectl get node "$NODE" -o jsonpath='{.metadata.annotations}' | jq ... csi
        let annotations = u.ok(&[
            "get",
            "node",
            name,
            "-o",
            "jsonpath={.metadata.annotations}",
        ]);
        let annotations: serde_json::Value = serde_json::from_str(&annotations).unwrap();
        let ids: serde_json::Value = serde_json::from_str(
            annotations["csi.volume.kubernetes.io/nodeid"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        let instance = instances
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["name"] == name)
            .unwrap();
        assert_eq!(
            ids,
            serde_json::json!({"disk.csi.kumo.dev": instance["id"]})
        );
        // kubectl get csinodes "$NODE" -o jsonpath='{.spec.drivers[*].name}'
        let drivers = eventually(10, "the CSINode's driver", || {
            let d = u.ok(&[
                "get",
                "csinodes",
                name,
                "-o",
                "jsonpath={.spec.drivers[*].name}",
            ]);
            (!d.is_empty()).then_some(d)
        });
        assert_eq!(drivers, "disk.csi.kumo.dev");
    }
    let classes = u.ok(&["get", "storageclass"]);
    assert!(classes.contains("standard (default)"), "{classes}");
    assert!(classes.contains("WaitForFirstConsumer"), "{classes}");

    let apply = |manifest: &str| {
        let out = Command::new("kubectl")
            .args(["apply", "-f", "-"])
            .env("KUBECONFIG", &u.kubeconfig)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                use std::io::Write;
                c.stdin.take().unwrap().write_all(manifest.as_bytes())?;
                c.wait_with_output()
            })
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
    };
    let pod = |name: &str, node: &str, claim: &str, cmd: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  nodeSelector: {{kubernetes.io/hostname: {node}}}\n  containers:\n  - name: c\n    image: busybox:1.37\n    command: [sh, -c, '{cmd}']\n    volumeMounts: [{{name: d, mountPath: /data}}]\n  volumes: [{{name: d, persistentVolumeClaim: {{claimName: {claim}}}}}]\n"
        )
    };
    let events_of = |name: &str| {
        u.ok(&[
            "get",
            "events",
            "--field-selector",
            &format!("involvedObject.name={name}"),
        ])
    };
    let claim = |name: &str, class: &str| {
        format!("apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: {name}}}\nspec:\n  accessModes: [ReadWriteOnce]\n  storageClassName: {class}\n  resources: {{requests: {{storage: 1Gi}}}}\n")
    };

    // Waits for its first consumer; then provisioned in the consumer's zone (kumo-1b).
    apply(&claim("data", "standard"));
    eventually(20, "WaitForFirstConsumer", || {
        events_of("data")
            .contains("waiting for first consumer to be created before binding")
            .then_some(())
    });
    assert_eq!(
        u.ok(&["get", "pvc", "data", "-o", "jsonpath={.status.phase}"]),
        "Pending"
    );
    apply(&pod(
        "writer",
        "kumo-worker",
        "data",
        "echo hello > /data/greeting; sleep 3600",
    ));
    u.ok(&[
        "wait",
        "--for=condition=Ready",
        "pod/writer",
        "--timeout=60s",
    ]);
    let pv = u.ok(&["get", "pvc", "data", "-o", "jsonpath={.spec.volumeName}"]);
    let pv_json = u.json(&["get", "pv", &pv]);
    assert_eq!(pv_json["spec"]["csi"]["driver"], "disk.csi.kumo.dev");
    assert_eq!(
        pv_json["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0],
        serde_json::json!({"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["kumo-1b"]})
    );
    let handle = pv_json["spec"]["csi"]["volumeHandle"]
        .as_str()
        .unwrap()
        .to_owned();
    let claim_events = events_of("data");
    for reason in [
        "ExternalProvisioning",
        "Provisioning",
        "ProvisioningSucceeded",
    ] {
        assert!(claim_events.contains(reason), "{reason}: {claim_events}");
    }
    let va = u.ok(&[
        "get",
        "volumeattachments",
        "-o",
        "jsonpath={range .items[*]}{.spec.nodeName} {.status.attached}{\"\\n\"}{end}",
    ]);
    assert_eq!(va.trim(), "kumo-worker true");
    assert!(events_of("writer").contains("AttachVolume.Attach succeeded for volume"));
    let volumes = u.cloud(&["volumes", "list"]);
    let writer_instance = instances
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["name"] == "kumo-worker")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let line = volumes
        .lines()
        .find(|l| l.starts_with(&handle))
        .unwrap_or_else(|| panic!("{volumes}"));
    assert!(
        line.contains("in-use") && line.contains(&writer_instance) && line.contains("kumo-1b"),
        "{volumes}"
    );
    assert_eq!(
        u.ok(&["exec", "writer", "--", "cat", "/data/greeting"]),
        "hello\n"
    );

    // The data outlives the pod; another node of the zone mounts it.
    u.ok(&["delete", "pod", "writer"]);
    eventually(30, "detached", || {
        u.cloud(&["volumes", "list"])
            .lines()
            .any(|l| l.starts_with(&handle) && l.contains("available"))
            .then_some(())
    });
    apply(&pod(
        "reader",
        "kumo-worker4",
        "data",
        "cat /data/greeting; sleep 3600",
    ));
    u.ok(&[
        "wait",
        "--for=condition=Ready",
        "pod/reader",
        "--timeout=60s",
    ]);
    assert_eq!(
        eventually(10, "the reader's log", || {
            let l = u.ok(&["logs", "reader"]);
            (!l.is_empty()).then_some(l)
        }),
        "hello\n"
    );

    // Growing the claim grows the volume (the simulator has no file system to grow).
    u.ok(&[
        "patch",
        "pvc",
        "data",
        "-p",
        r#"{"spec":{"resources":{"requests":{"storage":"2Gi"}}}}"#,
    ]);
    eventually(60, "the claim's new capacity", || {
        (u.ok(&[
            "get",
            "pvc",
            "data",
            "-o",
            "jsonpath={.status.capacity.storage}",
        ]) == "2Gi")
            .then_some(())
    });
    let claim_events = events_of("data");
    for reason in [
        "ExternalExpanding",
        "Resizing",
        "FileSystemResizeRequired",
        "FileSystemResizeSuccessful",
    ] {
        assert!(claim_events.contains(reason), "{reason}: {claim_events}");
    }
    assert!(u
        .cloud(&["volumes", "list"])
        .lines()
        .any(|l| l.starts_with(&handle) && l.contains("2Gi")));

    // reclaimPolicy Delete: the claim's deletion deletes the cloud's volume.
    u.ok(&["delete", "pod", "reader"]);
    u.ok(&["delete", "pvc", "data"]);
    eventually(60, "the volume deleted", || {
        (!u.cloud(&["volumes", "list"]).contains(&handle)).then_some(())
    });
    eventually(20, "the PV deleted", || {
        (!u.ok(&["get", "pv"]).contains(&pv)).then_some(())
    });

    // Retain keeps it, Released.
    apply("apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {name: keep}\nprovisioner: disk.csi.kumo.dev\nreclaimPolicy: Retain\nvolumeBindingMode: WaitForFirstConsumer\n");
    apply(&claim("kept", "keep"));
    apply(&pod("keeper", "kumo-worker2", "kept", "sleep 3600"));
    u.ok(&[
        "wait",
        "--for=condition=Ready",
        "pod/keeper",
        "--timeout=60s",
    ]);
    let kept_pv = u.ok(&["get", "pvc", "kept", "-o", "jsonpath={.spec.volumeName}"]);
    let kept_handle = u.ok(&[
        "get",
        "pv",
        &kept_pv,
        "-o",
        "jsonpath={.spec.csi.volumeHandle}",
    ]);
    u.ok(&["delete", "pod", "keeper"]);
    u.ok(&["delete", "pvc", "kept"]);
    eventually(30, "Released", || {
        (u.ok(&["get", "pv", &kept_pv, "-o", "jsonpath={.status.phase}"]) == "Released")
            .then_some(())
    });
    std::thread::sleep(Duration::from_secs(2));
    assert!(u.cloud(&["volumes", "list"]).contains(&kept_handle));

    // A deny policy on AttachVolume: FailedAttachVolume with the cloud's message, retried
    // until allowed.
    u.cloud(&["policy", "deny", "AttachVolume"]);
    apply(&claim("denied", "standard"));
    apply(&pod("blocked", "kumo-worker3", "denied", "sleep 3600"));
    let ev = eventually(60, "FailedAttachVolume", || {
        let e = events_of("blocked");
        e.contains("FailedAttachVolume").then_some(e)
    });
    assert!(ev.contains("AttachVolume.Attach failed for volume"), "{ev}");
    assert!(ev.contains("AccessDenied"), "{ev}");
    assert_eq!(
        u.ok(&["get", "pod", "blocked", "-o", "jsonpath={.status.phase}"]),
        "Pending"
    );
    u.cloud(&["policy", "allow", "AttachVolume"]);
    u.ok(&[
        "wait",
        "--for=condition=Ready",
        "pod/blocked",
        "--timeout=120s",
    ]);

    // A volume quota: ProvisioningFailed with the cloud's code.
    u.cloud(&["quotas", "set", "--max-volumes", "0"]);
    apply(&claim("over", "standard"));
    apply(&pod("over", "kumo-worker3", "over", "sleep 3600"));
    let ev = eventually(60, "ProvisioningFailed", || {
        let e = events_of("over");
        e.contains("ProvisioningFailed").then_some(e)
    });
    assert!(ev.contains("VolumeLimitExceeded"), "{ev}");
    u.cloud(&["quotas", "set", "--max-volumes", "1024"]);
    u.ok(&["delete", "pod", "over", "--wait=false"]);

    // A StatefulSet's claim templates: a claim per ordinal, bound and mounted; scaling
    // down deletes the claim the retention policy says to.
    apply("apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: db}\nspec:\n  serviceName: db\n  replicas: 2\n  selector: {matchLabels: {app: db}}\n  persistentVolumeClaimRetentionPolicy: {whenScaled: Delete, whenDeleted: Retain}\n  template:\n    metadata: {labels: {app: db}}\n    spec:\n      terminationGracePeriodSeconds: 1\n      containers:\n      - name: c\n        image: busybox:1.37\n        command: [sh, -c, 'echo $HOSTNAME > /var/lib/db/owner; sleep 3600']\n        volumeMounts: [{name: data, mountPath: /var/lib/db}]\n  volumeClaimTemplates:\n  - metadata: {name: data}\n    spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}\n");
    eventually(90, "both replicas Ready", || {
        (u.ok(&[
            "get",
            "statefulset",
            "db",
            "-o",
            "jsonpath={.status.readyReplicas}",
        ]) == "2")
            .then_some(())
    });
    for ordinal in ["0", "1"] {
        let claim = format!("data-db-{ordinal}");
        assert_eq!(
            u.ok(&["get", "pvc", &claim, "-o", "jsonpath={.status.phase}"]),
            "Bound"
        );
        // Ready (no probe) says the container started, not that its first command ran:
        // the file is looked for until it is there, as on a real node.
        let want = format!("db-{ordinal}\n");
        eventually(20, "the replica's file on its volume", || {
            let (_, out, _) = u.k(&[
                "exec",
                &format!("db-{ordinal}"),
                "--",
                "cat",
                "/var/lib/db/owner",
            ]);
            (out == want).then_some(())
        });
    }
    u.ok(&["scale", "statefulset", "db", "--replicas=1"]);
    eventually(60, "data-db-1 deleted on scale-down", || {
        let (_, out, err) = u.k(&["get", "pvc", "data-db-1"]);
        (out.is_empty() && err.contains("NotFound")).then_some(())
    });
    assert_eq!(
        u.ok(&["get", "pvc", "data-db-0", "-o", "jsonpath={.status.phase}"]),
        "Bound"
    );
    u.ok(&["delete", "statefulset", "db"]);

    // A generic ephemeral volume: its claim made for the pod, gone with it.
    apply("apiVersion: v1\nkind: Pod\nmetadata: {name: scratch}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: busybox:1.37\n    command: [sh, -c, 'echo x > /scratch/x; sleep 3600']\n    volumeMounts: [{name: work, mountPath: /scratch}]\n  volumes:\n  - name: work\n    ephemeral:\n      volumeClaimTemplate:\n        spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}\n");
    u.ok(&[
        "wait",
        "--for=condition=Ready",
        "pod/scratch",
        "--timeout=60s",
    ]);
    let owner = u.ok(&[
        "get",
        "pvc",
        "scratch-work",
        "-o",
        "jsonpath={.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}",
    ]);
    assert_eq!(owner, "Pod/scratch");
    u.ok(&["delete", "pod", "scratch"]);
    eventually(60, "the ephemeral claim gone", || {
        let (_, out, err) = u.k(&["get", "pvc", "scratch-work"]);
        (out.is_empty() && err.contains("NotFound")).then_some(())
    });
}

/// Whether a Node (JSON) has Ready True.
fn node_ready(node: &serde_json::Value) -> bool {
    node["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// The management side of seed 000: the course platform applies a Cluster (a
/// KubeadmControlPlane of one and a MachineDeployment of two, on the kumo cloud) in the
/// learner's `handson-<user>` namespace; Cluster API's controllers and the kumo provider
/// turn it into instances that run kubeadm; the kubeconfig lands in `<cluster>-kubeconfig`.
/// With it, the tenant's kubectl sees three Ready nodes named by their instances; the real
/// `clusterctl describe` shows the tree Available; scaling adds a worker; a terminated
/// worker is replaced through a MachineHealthCheck; deleting the Cluster removes every
/// machine, instance, load balancer and Secret.
#[test]
fn seed_000_cluster_api_hands_out_a_cluster() {
    let clusterctl = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.reference/bin/clusterctl");
    assert!(
        clusterctl.exists(),
        "{} is missing: `scripts/reference build` builds it (the test command does)",
        clusterctl.display()
    );
    let u = up(&["--cluster-api", "--nodes", "0"]);
    let ns = "handson-alice";
    u.ok(&["create", "namespace", ns]);
    let manifest =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/examples/cluster-api.yaml");
    let t = Instant::now();
    u.ok(&["apply", "-n", ns, "-f", manifest.to_str().unwrap()]);

    // The kubeconfig Secret, as Cluster API writes it, and the cluster's certificates.
    let secret = eventually(30, "the demo-kubeconfig Secret", || {
        let (ok, out, _) = u.k(&["get", "secret", "-n", ns, "demo-kubeconfig", "-o", "json"]);
        ok.then(|| serde_json::from_str::<serde_json::Value>(&out).unwrap())
    });
    eprintln!("Cluster applied → kubeconfig Secret in {:?}", t.elapsed());
    assert_eq!(secret["type"], "cluster.x-k8s.io/secret");
    assert_eq!(
        secret["metadata"]["labels"]["cluster.x-k8s.io/cluster-name"],
        "demo"
    );
    for suffix in ["ca", "etcd", "proxy", "sa"] {
        let s = u.json(&["get", "secret", "-n", ns, &format!("demo-{suffix}")]);
        assert_eq!(s["type"], "cluster.x-k8s.io/secret", "demo-{suffix}");
        assert!(
            s["data"]["tls.crt"].is_string() && s["data"]["tls.key"].is_string(),
            "demo-{suffix}"
        );
    }
    use base64::Engine;
    let value = base64::engine::general_purpose::STANDARD
        .decode(secret["data"]["value"].as_str().unwrap())
        .unwrap();
    let tenant_kc = u.dir.with_file_name("demo.kubeconfig");
    std::fs::write(&tenant_kc, value).unwrap();
    let tk = |args: &[&str]| -> (bool, String, String) {
        let out = Command::new("kubectl")
            .args(args)
            .env("KUBECONFIG", &tenant_kc)
            .output()
            .unwrap();
        (out.status.success(), text(&out.stdout), text(&out.stderr))
    };
    // The workload cluster's nodes, if every one is Ready with a providerID.
    let all_ready = || {
        let (ok, out, _) = tk(&["get", "nodes", "-o", "json"]);
        let nodes: serde_json::Value = serde_json::from_str(&out).ok().filter(|_| ok)?;
        let items = nodes["items"].as_array()?.clone();
        items
            .iter()
            .all(|node| node_ready(node) && node["spec"]["providerID"].is_string())
            .then_some(items)
    };
    let ready_nodes = |n: usize| {
        eventually(
            60,
            &format!("{n} Ready nodes in the workload cluster"),
            || all_ready().filter(|items| items.len() == n),
        )
    };
    let nodes = ready_nodes(3);
    eprintln!("Cluster applied → 3 Ready nodes in {:?}", t.elapsed());
    // The Cluster's pod range (clusterNetwork.pods, through kubeadm's podSubnet) is the
    // one the workload cluster's controller-manager hands its nodes' ranges from, with the
    // cluster's name, as its static pod shows.
    eventually(30, "every node's spec.podCIDR in 192.168.0.0/16", || {
        let (ok, out, _) = tk(&["get", "nodes", "-o", "jsonpath={.items[*].spec.podCIDR}"]);
        let cidrs: Vec<&str> = out.split_whitespace().collect();
        (ok && cidrs.len() == 3 && cidrs.iter().all(|c| c.starts_with("192.168."))).then_some(())
    });
    let (ok, cm, err) = tk(&[
        "get",
        "pods",
        "-n",
        "kube-system",
        "-l",
        "component=kube-controller-manager",
        "-o",
        "jsonpath={.items[0].spec.containers[0].command}",
    ]);
    assert!(ok, "{err}");
    for flag in [
        "--cluster-cidr=192.168.0.0/16",
        "--cluster-name=demo",
        "--service-cluster-ip-range=10.128.0.0/12",
    ] {
        assert!(cm.contains(flag), "{flag} not in {cm}");
    }
    // Its Service range (clusterNetwork.services, kubeadm's serviceSubnet): the
    // `kubernetes` Service on its first address, the cluster DNS on its 10th, which the
    // kubelets (the joined workers' from kube-system/kubelet-config) give their pods.
    let ip_of = |ns: &str, svc: &str| {
        let (ok, out, err) = tk(&[
            "get",
            "svc",
            "-n",
            ns,
            svc,
            "-o",
            "jsonpath={.spec.clusterIP}",
        ]);
        assert!(ok, "{err}");
        out
    };
    assert_eq!(ip_of("default", "kubernetes"), "10.128.0.1");
    assert_eq!(ip_of("kube-system", "kube-dns"), "10.128.0.10");
    let (ok, _, err) = tk(&[
        "run",
        "resolv",
        "--image=busybox",
        "--restart=Never",
        "--",
        "cat",
        "/etc/resolv.conf",
    ]);
    assert!(ok, "{err}");
    let resolv = eventually(60, "the pod's resolv.conf in its log", || {
        let (ok, out, _) = tk(&["logs", "resolv"]);
        (ok && out.contains("nameserver")).then_some(out)
    });
    assert!(resolv.contains("nameserver 10.128.0.10\n"), "{resolv}");
    tk(&["delete", "pod", "resolv", "--wait=false"]);
    let instances: serde_json::Value =
        serde_json::from_str(&u.cloud(&["instances", "list", "-o", "json"])).unwrap();
    for node in &nodes {
        let pid = node["spec"]["providerID"].as_str().unwrap();
        let (zone, id) = pid
            .strip_prefix("kumo://")
            .unwrap()
            .split_once('/')
            .unwrap();
        let inst = instances
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["id"] == id)
            .unwrap_or_else(|| panic!("{pid} names no instance"));
        assert_eq!(inst["zone"], zone);
        assert_eq!(inst["state"], "running");
        assert_eq!(inst["name"], node["metadata"]["name"]);
    }
    let (_, wide, _) = tk(&["get", "nodes"]);
    assert!(wide.contains("control-plane"), "{wide}");
    // The tenant's credentials open nothing of the management cluster.
    let mgmt: serde_json::Value =
        serde_json::from_str(&u.ok(&["config", "view", "--minify", "-o", "json"])).unwrap();
    let mgmt_server = mgmt["clusters"][0]["cluster"]["server"].as_str().unwrap();
    let (ok, _, err) = tk(&[
        "--server",
        mgmt_server,
        "--insecure-skip-tls-verify",
        "get",
        "namespaces",
    ]);
    assert!(
        !ok && (err.contains("Unauthorized") || err.contains("must be logged in")),
        "{err}"
    );

    // clusterctl reads the tree.
    let described = eventually(30, "clusterctl describe: Available", || {
        let out = Command::new(&clusterctl)
            .args(["describe", "cluster", "demo", "-n", ns])
            .env("KUBECONFIG", &u.kubeconfig)
            .output()
            .unwrap();
        let s = text(&out.stdout);
        let line = s
            .lines()
            .find(|l| l.starts_with("Cluster handson-alice/demo"))?
            .to_owned();
        (line.contains("True")
            && line.contains("Available")
            && s.contains("MachineDeployment handson-alice/demo-md-0"))
        .then_some(s)
    });
    eprintln!("{described}");
    let (_, cols, _) = u.k(&["get", "machines", "-n", ns]);
    assert!(
        cols.lines()
            .skip(1)
            .all(|l| l.contains("True") && l.contains("Running")),
        "{cols}"
    );

    // Scaling the MachineDeployment adds a worker.
    u.ok(&[
        "scale",
        "-n",
        ns,
        "machinedeployment",
        "demo-md-0",
        "--replicas",
        "3",
    ]);
    let nodes = ready_nodes(4);

    // A new machine template rolls the workers over: a new MachineSet grows by the surge
    // (1) while the old one shrinks only as machines become available, then goes.
    let old_workers: Vec<String> = nodes
        .iter()
        .map(|n| n["metadata"]["name"].as_str().unwrap().to_owned())
        .filter(|n| !n.contains("control-plane"))
        .collect();
    let apply_text = |yaml: &str| {
        let mut child = Command::new("kubectl")
            .args(["apply", "-n", ns, "-f", "-"])
            .env("KUBECONFIG", &u.kubeconfig)
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(yaml.as_bytes())
            .unwrap();
        assert!(child.wait().unwrap().success());
    };
    apply_text("apiVersion: infrastructure.cluster.x-k8s.io/v1beta2\nkind: KumoMachineTemplate\nmetadata: {name: demo-md-0-v2}\nspec: {template: {spec: {instanceType: k1.small}}}\n");
    u.ok(&[
        "patch",
        "-n",
        ns,
        "machinedeployment",
        "demo-md-0",
        "--type=merge",
        "-p",
        r#"{"spec":{"template":{"spec":{"infrastructureRef":{"name":"demo-md-0-v2"}}}}}"#,
    ]);
    let t = Instant::now();
    eventually(120, "the workers rolled over to the new template", || {
        let (ok, out, _) = tk(&["get", "nodes", "-o", "json"]);
        let list: serde_json::Value = serde_json::from_str(&out).ok().filter(|_| ok)?;
        let nodes = list["items"].as_array()?.clone();
        let ready = nodes.iter().all(node_ready);
        let rolled = nodes.len() == 4
            && ready
            && nodes.iter().all(|n| {
                !old_workers
                    .iter()
                    .any(|o| n["metadata"]["name"] == o.as_str())
            });
        let (_, sets, _) = u.k(&["get", "machinesets", "-n", ns, "-o", "name"]);
        (rolled && sets.lines().count() == 1).then_some(())
    });
    eprintln!("rolled 3 workers to a new template in {:?}", t.elapsed());
    let events = u.ok(&[
        "get",
        "events",
        "-n",
        ns,
        "-o",
        "custom-columns=REASON:.reason,MESSAGE:.message",
    ]);
    assert!(events.contains("SuccessfulScaleDown"), "{events}");

    let scale_control_plane = |n: &str| {
        u.ok(&[
            "scale",
            "-n",
            ns,
            "kubeadmcontrolplane",
            "demo-control-plane",
            "--replicas",
            n,
        ])
    };
    // Three control-plane replicas: each new machine joins the stacked etcd
    // (`kubeadm join --control-plane`), one at a time, spread over the zones.
    scale_control_plane("3");
    let t = Instant::now();
    // kubeadm labels a control-plane node after its kubelet registers it (and it may be
    // Ready before): wait for the labels too.
    let nodes = eventually(
        60,
        "6 Ready nodes, 3 of them labelled control plane",
        || {
            all_ready().filter(|items| {
                let cps = items
                    .iter()
                    .filter(|n| {
                        n["metadata"]["labels"]["node-role.kubernetes.io/control-plane"].is_string()
                    })
                    .count();
                items.len() == 6 && cps == 3
            })
        },
    );
    eprintln!("control plane scaled 1 → 3 in {:?}", t.elapsed());
    let cp_nodes: Vec<&serde_json::Value> = nodes
        .iter()
        .filter(|n| n["metadata"]["labels"]["node-role.kubernetes.io/control-plane"].is_string())
        .collect();
    assert_eq!(cp_nodes.len(), 3, "{nodes:?}");
    let zones: std::collections::BTreeSet<&str> = cp_nodes
        .iter()
        .map(|n| {
            n["metadata"]["labels"]["topology.kubernetes.io/zone"]
                .as_str()
                .unwrap_or("")
        })
        .collect();
    assert_eq!(
        zones.len(),
        3,
        "one control-plane machine per zone: {zones:?}"
    );
    // Every machine shows its etcd member as kubeadm's static pod, and every API server
    // is an endpoint of the `kubernetes` Service (the master leases).
    let mut last_seen = String::new();
    let etcd_pods = |format: &str| {
        tk(&[
            "get",
            "pods",
            "-n",
            "kube-system",
            "-l",
            "component=etcd",
            "-o",
            format,
        ])
    };
    let diagnose = || {
        let (_, pods, _) = etcd_pods("yaml");
        let (_, events, _) = tk(&["get", "events", "-n", "kube-system"]);
        format!(
            "{pods}\n{events}\n{}",
            tails(u.dir.parent().unwrap_or(&u.dir), "etcd.log", 15)
        )
    };
    eventually_or(
        60,
        "3 etcd pods Ready and 3 kubernetes endpoints",
        || {
            let (ok, out, _) = etcd_pods("json");
            let pods: serde_json::Value = serde_json::from_str(&out).ok().filter(|_| ok)?;
            let ready = pods["items"]
                .as_array()?
                .iter()
                .filter(|p| p["status"]["containerStatuses"][0]["ready"] == true)
                .count();
            let (_, eps, _) = tk(&[
                "get",
                "endpointslice",
                "kubernetes",
                "-o",
                "jsonpath={.endpoints[*].addresses[0]}",
            ]);
            // The control-plane nodes' addresses as they are now: a node can be Ready
            // with its provider ID (the kubelet's flag) before the cloud node controller
            // has written its addresses.
            let (_, ips, _) = tk(&[
                "get",
                "nodes",
                "-l",
                "node-role.kubernetes.io/control-plane",
                "-o",
                r#"jsonpath={range .items[*]}{.status.addresses[?(@.type=="InternalIP")].address}{" "}{end}"#,
            ]);
            let mut want: Vec<&str> = ips.split_whitespace().collect();
            want.sort_unstable();
            let mut have: Vec<&str> = eps.split_whitespace().collect();
            have.sort_unstable();
            // What was seen, each time it changes: a timeout then says which half was missing.
            let seen = format!("{ready} etcd pods Ready; endpoints {have:?}, want {want:?}");
            if seen != last_seen {
                eprintln!("{:?}: {seen}", t.elapsed());
                // And the probes that failed so far (the etcd pods' readiness is probed).
                let (_, events, _) = tk(&[
                    "get",
                    "events",
                    "-n",
                    "kube-system",
                    "--field-selector",
                    "reason=Unhealthy",
                ]);
                eprintln!("{events}");
                last_seen = seen;
            }
            (ready == 3 && have == want).then_some(())
        },
        diagnose,
    );

    // Health checks on the workers and on the control plane: a worker whose instance is
    // terminated (its Node deleted by the cluster's cloud node-lifecycle controller), a
    // worker and a control-plane machine whose instances are stopped (their kubelets
    // stop: Ready Unknown) are all replaced; the control plane's leaves etcd first.
    let mhc = "apiVersion: cluster.x-k8s.io/v1beta2\nkind: MachineHealthCheck\nmetadata: {name: demo-md-0}\nspec:\n  clusterName: demo\n  selector: {matchLabels: {cluster.x-k8s.io/deployment-name: demo-md-0}}\n  checks:\n    unhealthyNodeConditions:\n    - {type: Ready, status: Unknown, timeoutSeconds: 5}\n";
    apply_text(mhc);
    let cp_mhc = mhc.replace(
        "{name: demo-md-0}\nspec:\n  clusterName: demo\n  selector: {matchLabels: {cluster.x-k8s.io/deployment-name: demo-md-0}}",
        "{name: demo-control-plane}\nspec:\n  clusterName: demo\n  selector: {matchLabels: {cluster.x-k8s.io/control-plane: \"\"}}",
    );
    assert_ne!(cp_mhc, mhc);
    apply_text(&cp_mhc);
    let instance_of = |n: &serde_json::Value| -> (String, String) {
        let name = n["metadata"]["name"].as_str().unwrap().to_owned();
        let id = n["spec"]["providerID"]
            .as_str()
            .unwrap()
            .rsplit('/')
            .next()
            .unwrap()
            .to_owned();
        (name, id)
    };
    let workers: Vec<(String, String)> = nodes
        .iter()
        .filter(|n| !n["metadata"]["labels"]["node-role.kubernetes.io/control-plane"].is_string())
        .map(instance_of)
        .collect();
    let (terminated, terminated_id) = workers[0].clone();
    let (stopped, stopped_id) = workers[1].clone();
    let (stopped_cp, stopped_cp_id) = instance_of(cp_nodes[0]);
    u.cloud(&["instance", "terminate", &terminated_id]);
    u.cloud(&["instance", "stop", &stopped_id]);
    u.cloud(&["instance", "stop", &stopped_cp_id]);
    let t = Instant::now();
    let victims = [terminated.clone(), stopped.clone(), stopped_cp.clone()];
    eventually(180, "the three unhealthy machines replaced", || {
        let (ok, out, _) = tk(&["get", "nodes", "-o", "json"]);
        let nodes: serde_json::Value = serde_json::from_str(&out).ok().filter(|_| ok)?;
        let items = nodes["items"].as_array()?;
        let ready = items.iter().filter(|n| node_ready(n));
        (items.len() == 6
            && ready.count() == 6
            && !items
                .iter()
                .any(|n| victims.iter().any(|v| n["metadata"]["name"] == v.as_str())))
        .then_some(())
    });
    eprintln!(
        "terminated worker, stopped worker and stopped control plane replaced in {:?}",
        t.elapsed()
    );
    let events = u.ok(&[
        "get",
        "events",
        "-n",
        ns,
        "-o",
        "custom-columns=REASON:.reason,MESSAGE:.message",
    ]);
    for v in &victims {
        assert!(
            events.contains(&format!("Machine {ns}/{v} has been marked as unhealthy")),
            "{v}: {events}"
        );
    }
    assert!(
        events.contains(&format!("Machine {stopped_cp} deleted by remediation")),
        "{events}"
    );

    // Scaling the control plane down: the machines leave etcd, the last one serves alone.
    scale_control_plane("1");
    ready_nodes(4);

    // A new machine template rolls the control plane over as upstream's KCP does: a new
    // machine joins beside the outdated one (maxSurge 1), then the outdated one leaves
    // etcd and goes; the machines' UpToDate conditions say why.
    let cp_machines = || -> Vec<serde_json::Value> {
        let list = u.json(&[
            "get",
            "machines",
            "-n",
            ns,
            "-l",
            "cluster.x-k8s.io/control-plane",
        ]);
        list["items"].as_array().unwrap().clone()
    };
    let before: Vec<String> = cp_machines()
        .iter()
        .map(|m| m["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(before.len(), 1, "{before:?}");
    apply_text("apiVersion: infrastructure.cluster.x-k8s.io/v1beta2\nkind: KumoMachineTemplate\nmetadata: {name: demo-control-plane-v2}\nspec: {template: {spec: {instanceType: k1.small}}}\n");
    u.ok(&[
        "patch",
        "-n",
        ns,
        "kubeadmcontrolplane",
        "demo-control-plane",
        "--type=merge",
        "-p",
        r#"{"spec":{"machineTemplate":{"spec":{"infrastructureRef":{"name":"demo-control-plane-v2"}}}}}"#,
    ]);
    let t = Instant::now();
    let kcp_condition = |type_: &str| {
        u.ok(&[
            "get",
            "kubeadmcontrolplane",
            "-n",
            ns,
            "demo-control-plane",
            "-o",
            &format!("jsonpath={{.status.conditions[?(@.type==\"{type_}\")].status}}/{{.status.conditions[?(@.type==\"{type_}\")].message}}"),
        ])
    };
    let rolling = eventually(30, "the control plane rolling out", || {
        let c = kcp_condition("RollingOut");
        c.starts_with("True/").then_some(c)
    });
    assert_eq!(
        rolling,
        "True/Rolling out 1 not up-to-date replicas\n* KumoMachine is not up-to-date"
    );
    let outdated = u.ok(&[
        "get",
        "machine",
        "-n",
        ns,
        &before[0],
        "-o",
        "jsonpath={.status.conditions[?(@.type==\"UpToDate\")].reason}",
    ]);
    assert_eq!(outdated, "NotUpToDate");
    eventually(120, "the control plane rolled over", || {
        let machines = cp_machines();
        let rolled = machines.len() == 1
            && machines[0]["metadata"]["name"] != before[0].as_str()
            && machines[0]["status"]["conditions"]
                .as_array()?
                .iter()
                .any(|c| c["type"] == "UpToDate" && c["status"] == "True");
        (rolled && kcp_condition("RollingOut") == "False/").then_some(())
    });
    let nodes = ready_nodes(4);
    eprintln!(
        "control plane rolled over to a new template in {:?}",
        t.elapsed()
    );
    let cp = nodes
        .iter()
        .find(|n| n["metadata"]["labels"]["node-role.kubernetes.io/control-plane"].is_string())
        .unwrap();
    assert_eq!(
        cp["metadata"]["labels"]["node.kubernetes.io/instance-type"], "k1.small",
        "{cp}"
    );
    let kcp = u.json(&["get", "kubeadmcontrolplane", "-n", ns, "demo-control-plane"]);
    assert_eq!(kcp["status"]["upToDateReplicas"], 1, "{kcp}");

    // Deleting the Cluster removes everything it made.
    u.ok(&["delete", "cluster", "-n", ns, "demo", "--wait=false"]);
    eventually(60, "the cluster and its machines gone", || {
        let (_, out, _) = u.k(&[
            "get",
            "cluster,machines,kumomachines,kubeadmconfigs,secrets",
            "-n",
            ns,
            "-o",
            "name",
        ]);
        out.trim().is_empty().then_some(())
    });
    let instances: serde_json::Value =
        serde_json::from_str(&u.cloud(&["instances", "list", "-o", "json"])).unwrap();
    for i in instances.as_array().unwrap() {
        if i["name"].as_str().unwrap().starts_with("demo-") {
            assert!(
                i["state"] == "terminated" || i["state"] == "shutting-down",
                "{i}"
            );
        }
    }
    let lbs = u.cloud(&["lbs", "list"]);
    assert_eq!(lbs.lines().count(), 1, "{lbs}");
}

/// A real headless browser (Chromium from Debian) driven over the DevTools protocol.
struct Browser {
    child: std::process::Child,
    ws: tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>,
    session: String,
    next: u64,
    _profile: tempfile::TempDir,
}

impl Browser {
    async fn start() -> Browser {
        use std::io::BufRead;
        let profile = tempfile::tempdir().unwrap();
        // The program itself: Debian's /usr/bin wrapper runs it without exec, and the
        // browser must be killed by its own PID.
        let bin = [
            "/usr/lib/chromium/chromium-headless-shell",
            "/usr/lib/chromium/headless_shell",
            "chromium-headless-shell",
        ]
            .into_iter()
            .find(|b| Command::new(b).arg("--version").output().is_ok_and(|o| o.status.success()))
            .expect("chromium-headless-shell (apt-get install chromium-headless-shell; the test command does)");
        use std::os::unix::process::CommandExt;
        let mut child = Command::new(bin)
            // A process group of its own: its helpers (zygotes, renderers) go with it.
            .process_group(0)
            .args([
                "--no-sandbox",
                "--ignore-certificate-errors",
                "--remote-debugging-port=0",
                "--window-size=1600,900",
                "--disable-gpu",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stderr(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let url = std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .find_map(|l| l.split("DevTools listening on ").nth(1).map(str::to_owned))
            .expect("the browser's DevTools address");
        let addr = url
            .trim_start_matches("ws://")
            .split('/')
            .next()
            .unwrap()
            .to_owned();
        let tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let (ws, _) = tokio_tungstenite::client_async(url.as_str(), tcp)
            .await
            .unwrap();
        let mut b = Browser {
            child,
            ws,
            session: String::new(),
            next: 1,
            _profile: profile,
        };
        let target = b
            .call(
                "Target.createTarget",
                serde_json::json!({"url": "about:blank"}),
                false,
            )
            .await;
        let attached = b
            .call(
                "Target.attachToTarget",
                serde_json::json!({"targetId": target["targetId"], "flatten": true}),
                false,
            )
            .await;
        b.session = attached["sessionId"].as_str().unwrap().to_owned();
        b
    }

    async fn call(
        &mut self,
        method: &str,
        params: serde_json::Value,
        in_page: bool,
    ) -> serde_json::Value {
        use futures::{SinkExt, StreamExt};
        use tokio_tungstenite::tungstenite::Message;
        let id = self.next;
        self.next += 1;
        let mut msg = serde_json::json!({"id": id, "method": method, "params": params});
        if in_page {
            msg["sessionId"] = self.session.clone().into();
        }
        self.ws
            .send(Message::Text(msg.to_string().into()))
            .await
            .unwrap();
        loop {
            let Some(Ok(Message::Text(t))) = self.ws.next().await else {
                panic!("the browser went away")
            };
            let v: serde_json::Value = serde_json::from_str(&t).unwrap();
            if v["id"] == id {
                assert!(v.get("error").is_none(), "{method}: {v}");
                return v["result"].clone();
            }
        }
    }

    async fn goto(&mut self, url: &str) {
        self.call("Page.navigate", serde_json::json!({"url": url}), true)
            .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    /// Evaluates `js` in the page; its value.
    async fn eval(&mut self, js: &str) -> serde_json::Value {
        let r = self
            .call(
                "Runtime.evaluate",
                serde_json::json!({"expression": js, "returnByValue": true}),
                true,
            )
            .await;
        r["result"]["value"].clone()
    }

    async fn until(&mut self, secs: u64, what: &str, js: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            if let Some(s) = self.eval(js).await.as_str().filter(|s| !s.is_empty()) {
                return s.to_owned();
            }
            if Instant::now() >= deadline {
                let page = self.eval("document.body.innerText").await;
                panic!(
                    "timed out after {secs} s: {what}; the page shows:\n{}",
                    page.as_str().unwrap_or_default()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn screenshot(&mut self, path: &Path) {
        use base64::Engine;
        let r = self
            .call(
                "Page.captureScreenshot",
                serde_json::json!({"format": "png"}),
                true,
            )
            .await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(r["data"].as_str().unwrap())
            .unwrap();
        std::fs::write(path, png).unwrap();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // The browser's process group (its PID), then the browser itself.
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.child.id())])
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The classroom: two learners sign in (in a real browser), each gets a cluster; the web
/// terminal's kubectl answers with the user's own nodes, and the shell sees none of the
/// host's files or processes; one user cannot read the other's map; bad sign-ins are
/// refused without saying which part was wrong; the instructor sees both clusters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_000_the_classroom_gives_each_user_a_cluster_and_a_terminal() {
    let u = tokio::task::spawn_blocking(|| up(&["--cluster-api", "--nodes", "0"]))
        .await
        .unwrap();
    let pw = |name: &str, extra: &[&str]| {
        let out = kumo(&[&["classroom", "add-user", name], extra].concat(), &u.dir);
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout).trim().to_owned()
    };
    let (alice, bob, teacher) = (
        pw("alice", &[]),
        pw("bob", &[]),
        pw("teacher", &["--instructor"]),
    );
    let mut serve = Command::new(env!("CARGO_BIN_EXE_kumo"))
        .args(["classroom", "serve", "--port", "0", "--data-dir"])
        .arg(&u.dir)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let url = {
        use std::io::BufRead;
        let out = serve.stdout.take().unwrap();
        let line = std::io::BufReader::new(out)
            .lines()
            .next()
            .unwrap()
            .unwrap();
        line.split_whitespace()
            .find(|w| w.starts_with("https://"))
            .unwrap()
            .trim_end_matches('/')
            .to_owned()
    };
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _serve = Kill(serve);
    // Bad sign-ins: the same answer whichever part was wrong.
    let curl = |args: &[&str]| -> String {
        let out = Command::new("curl")
            .args(["-sk", "-o", "/dev/null", "-w", "%{http_code}"])
            .args(args)
            .output()
            .unwrap();
        text(&out.stdout)
    };
    assert_eq!(curl(&[&format!("{url}/api/map")]), "401");
    let wrong_password = Command::new("curl")
        .args([
            "-sk",
            "-d",
            "user=alice&password=nope",
            &format!("{url}/signin"),
        ])
        .output()
        .unwrap();
    let no_user = Command::new("curl")
        .args([
            "-sk",
            "-d",
            "user=mallory&password=nope",
            &format!("{url}/signin"),
        ])
        .output()
        .unwrap();
    assert_eq!(wrong_password.stdout, no_user.stdout);
    assert!(text(&wrong_password.stdout).contains("Wrong user name or password."));

    let mut b = Browser::start().await;
    let sign_in = |user: &str, password: &str| {
        format!(
            "document.querySelector('input[name=user]').value={user:?};document.querySelector('input[name=password]').value={password:?};document.forms[0].submit();"
        )
    };
    for (user, password) in [("alice", &alice), ("bob", &bob)] {
        b.goto(&format!("{url}/signin")).await;
        b.eval(&sign_in(user, password)).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let status = b
            .until(90, "the cluster ready in the page", "(function(){var s=document.getElementById('status');return s&&s.textContent.indexOf('is ready')>=0?s.textContent:'';})()")
            .await;
        assert!(status.contains("demo"), "{status}");
        // kubectl in the web terminal answers with this user's nodes.
        b.until(30, "the shell's prompt", &format!("(function(){{var t=document.getElementById('term').innerText.replace(/\\u00a0/g,' ');return t.indexOf('{user}@handson')>=0?t:'';}})()")).await;
        // Run until the workers have joined too (the page opens the terminal once the
        // first node is there).
        let mut shown = String::new();
        for _ in 0..30 {
            b.eval("window.kumoTerminal.send('clear; kubectl get nodes -o wide\\r')")
                .await;
            tokio::time::sleep(Duration::from_secs(1)).await;
            shown = b
                .eval("document.getElementById('term').innerText.replace(/\\u00a0/g,' ')")
                .await
                .as_str()
                .unwrap_or_default()
                .to_owned();
            if shown.split(" Ready ").count() >= 4 {
                break;
            }
        }
        assert!(shown.split(" Ready ").count() >= 4, "{shown}");
        assert!(shown.contains("demo-control-plane-"), "{shown}");
        // The shell is confined: no host files, its own processes only, not root.
        b.eval("window.kumoTerminal.send('ls /work /root; ps -e | wc -l; id -u\\r')")
            .await;
        let confined = b
            .until(20, "the confinement checks", "(function(){var t=document.getElementById('term').innerText.replace(/\\u00a0/g,' ');return t.indexOf('65534')>=0?t:'';})()")
            .await;
        assert!(confined.contains("No such file or directory"), "{confined}");
        if user == "alice" {
            // Kept after the test (cargo's directory for integration tests' files).
            let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("classroom-alice.png");
            b.screenshot(&shot).await;
            eprintln!("screenshot of alice's classroom page: {}", shot.display());
        }
    }
    // bob (signed in last in this browser) cannot read alice's namespace.
    let cookie = b
        .call(
            "Network.getCookies",
            serde_json::json!({"urls": [url.clone()]}),
            true,
        )
        .await;
    let bob_cookie = cookie["cookies"][0]["value"].as_str().unwrap().to_owned();
    let bob_map = Command::new("curl")
        .args([
            "-sk",
            "-H",
            &format!("Cookie: kumo-classroom={bob_cookie}"),
            &format!("{url}/api/map"),
        ])
        .output()
        .unwrap();
    let bob_map: serde_json::Value = serde_json::from_slice(&bob_map.stdout).unwrap();
    assert_eq!(bob_map["namespace"], "handson-bob");
    // The instructor's view lists both clusters.
    b.goto(&format!("{url}/signin")).await;
    b.eval(&sign_in("teacher", &teacher)).await;
    let table = b
        .until(30, "the instructor's table", "(function(){var t=document.getElementById('users');return t&&t.innerText.indexOf('handson-bob')>=0&&t.innerText.indexOf('handson-alice')>=0?t.innerText:'';})()")
        .await;
    assert!(table.contains("True"), "{table}");
    // Each learner's cluster got a pod range of its own (they share the cloud's network).
    let range = |ns: &str| {
        let (ok, out, err) = u.k(&[
            "get",
            "cluster",
            "demo",
            "-n",
            ns,
            "-o",
            "jsonpath={.spec.clusterNetwork.pods.cidrBlocks}",
        ]);
        assert!(ok, "{err}");
        out
    };
    let (a, b) = (range("handson-alice"), range("handson-bob"));
    assert!(
        a.starts_with("[\"172.16.") && b.starts_with("[\"172.16."),
        "{a} {b}"
    );
    assert_ne!(a, b);
}
