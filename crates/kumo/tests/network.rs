//! The real network of `kumo up --runtime containerd`: nodes in the cloud's VPC, pods on
//! different nodes reaching each other through the route table's routes, Services through
//! each node's nftables kube-proxy, names through the cluster DNS the `coredns` pods
//! serve, NodePorts on every node's address, `externalTrafficPolicy: Local` keeping the
//! client's address; and deleting a route breaking the path until the route controller
//! puts it back. All seen with the stock kubectl and, on the nodes, `nft` and `ip`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod realnode;

use std::path::Path;
use std::process::Command;

use realnode::*;

const OBJECTS: &str = r##"
apiVersion: v1
kind: Pod
metadata: {name: a, labels: {app: web}}
spec:
  nodeName: kumo-worker
  containers:
  - name: c
    image: busybox:1.37
    command: [sh, -c, 'mkdir -p /www; echo hello-from-a > /www/index.html; httpd -f -p 8080 -h /www']
    readinessProbe: {tcpSocket: {port: 8080}, periodSeconds: 1}
---
apiVersion: v1
kind: Pod
metadata: {name: b, labels: {app: web}}
spec:
  nodeName: kumo-worker2
  containers:
  - name: c
    image: busybox:1.37
    command: [sh, -c, 'mkdir -p /www; echo hello-from-b > /www/index.html; httpd -f -p 8080 -h /www']
    readinessProbe: {tcpSocket: {port: 8080}, periodSeconds: 1}
---
apiVersion: v1
kind: Pod
metadata: {name: src, labels: {app: src}}
spec:
  nodeName: kumo-worker
  containers:
  - name: c
    image: busybox:1.37
    command: [sh, -c, 'mkdir -p /www/cgi-bin; printf "#!/bin/sh\necho Content-Type: text/plain\necho\necho \$REMOTE_ADDR\n" > /www/cgi-bin/ip; chmod +x /www/cgi-bin/ip; httpd -f -p 8080 -h /www']
    readinessProbe: {tcpSocket: {port: 8080}, periodSeconds: 1}
---
apiVersion: v1
kind: Service
metadata: {name: hello}
spec:
  type: LoadBalancer
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: src-local}
spec:
  type: LoadBalancer
  externalTrafficPolicy: Local
  selector: {app: src}
  ports: [{port: 80, targetPort: 8080}]
"##;

/// Runs `cmd` on `node` with `kumo node exec`.
fn on_node(data: &Path, node: &str, cmd: &[&str]) -> Out {
    let o = Command::new(env!("CARGO_BIN_EXE_kumo"))
        .args(["node", "exec", "--data-dir"])
        .arg(data)
        .arg(node)
        .arg("--")
        .args(cmd)
        .output()
        .unwrap();
    Out {
        ok: o.status.success(),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// `curl` from the cloud's public side ("the internet").
fn curl_from_internet(data: &Path, url: &str) -> Option<String> {
    let o = Command::new(env!("CARGO_BIN_EXE_kumo"))
        .args(["cloud", "--data-dir"])
        .arg(data.join("cloud"))
        .args(["exec", "--", "curl", "-s", "-m", "3", url])
        .output()
        .unwrap();
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).into_owned())
}

/// `curl` from `node`'s namespace (the machine's curl: the host's namespace is never
/// the one sending).
fn curl_from(data: &Path, node: &str, url: &str) -> Option<String> {
    let o = on_node(data, node, &["curl", "-s", "-m", "3", url]);
    o.ok.then_some(o.stdout)
}

/// Waits until the cluster of `kc` has its two coredns pods ready.
fn coredns_ready(kc: &Path) {
    eventually(120, "the coredns pods ready", || {
        let r = kubectl(
            kc,
            &[
                "get",
                "deploy/coredns",
                "-n",
                "kube-system",
                "-o",
                "jsonpath={.status.readyReplicas}",
            ],
        );
        (r.stdout == "2").then_some(())
    });
}

#[test]
fn pods_services_and_names_travel_over_real_packets() {
    with_real_cluster(&["--nodes", "2"], |kc, data, _printed| {
        let applied = kubectl_in(kc, &["apply", "-f", "-"], Some(OBJECTS));
        assert!(applied.ok, "{}", applied.stderr);
        for pod in ["a", "b", "src"] {
            eventually(90, &format!("pod {pod} ready"), || {
                let r = jsonpath(
                    kc,
                    &format!("pod/{pod}"),
                    "{.status.containerStatuses[0].ready}",
                );
                (r == "true").then_some(())
            });
        }
        // The kubelets live in their machines: each serves on its node's address, port
        // 10250 (what its Node says), and holds its connection to the API server through
        // the VPC, to the control-plane node's address.
        let worker_ip = jsonpath(
            kc,
            "node/kumo-worker",
            "{.status.addresses[?(@.type==\"InternalIP\")].address}",
        );
        let port = jsonpath(
            kc,
            "node/kumo-worker",
            "{.status.daemonEndpoints.kubeletEndpoint.Port}",
        );
        assert_eq!(port, "10250");
        let listening = on_node(data, "kumo-worker", &["ss", "-Htln", "sport", "= :10250"]);
        assert!(
            listening.stdout.contains(&format!("{worker_ip}:10250")),
            "{}{}",
            listening.stdout,
            listening.stderr
        );
        let to_api = on_node(
            data,
            "kumo-worker",
            &["ss", "-Htn", "state", "established", "dst", "10.0.1.4:6443"],
        );
        assert!(!to_api.stdout.trim().is_empty(), "{}", to_api.stderr);
        let b_ip = jsonpath(kc, "pod/b", "{.status.podIP}");
        // Pod to pod across nodes, by address.
        let page = ok(
            kc,
            &[
                "exec",
                "a",
                "--",
                "wget",
                "-qO-",
                &format!("http://{b_ip}:8080/"),
            ],
        );
        assert_eq!(page.trim(), "hello-from-b");
        // The cluster DNS answers the Service's name with its ClusterIP.
        coredns_ready(kc);
        let cluster_ip = jsonpath(kc, "svc/hello", "{.spec.clusterIP}");
        let looked = eventually(30, "nslookup of hello", || {
            let o = kubectl(
                kc,
                &[
                    "exec",
                    "a",
                    "--",
                    "nslookup",
                    "hello.default.svc.cluster.local",
                ],
            );
            o.stdout.contains(&cluster_ip).then_some(o.stdout)
        });
        assert!(looked.contains("Server:\t\t10.96.0.10"), "{looked}");
        // Seed 000's probe: curl by the Service's short name, in a pod of its own.
        // (A command this quick may end while kubectl attaches: the output is then gone,
        // as on any cluster, and the probe is run again.)
        let mut probe = kubectl(kc, &["version", "--client"]);
        for _ in 0..3 {
            probe = kubectl(
                kc,
                &[
                    "run",
                    "probe",
                    "--rm",
                    "-i",
                    "--restart=Never",
                    "--quiet",
                    "--image=curlimages/curl:8.11.0",
                    "--",
                    "curl",
                    "-s",
                    "-o",
                    "/dev/null",
                    "-w",
                    "%{http_code}\n",
                    "http://hello",
                ],
            );
            if !probe.stdout.trim().is_empty() {
                break;
            }
            let _ = kubectl(
                kc,
                &["delete", "pod", "probe", "--ignore-not-found", "--wait"],
            );
        }
        assert_eq!(
            probe.stdout.trim(),
            "200",
            "{}\n{}",
            probe.stderr,
            kubectl(
                kc,
                &[
                    "get",
                    "events",
                    "--field-selector",
                    "involvedObject.name=probe"
                ]
            )
            .stdout
        );
        // Both endpoints answer through the ClusterIP.
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..40 {
            let o = kubectl(kc, &["exec", "a", "--", "wget", "-qO-", "http://hello/"]);
            seen.insert(o.stdout.trim().to_owned());
            if seen.len() == 2 {
                break;
            }
        }
        assert!(
            seen.contains("hello-from-a") && seen.contains("hello-from-b"),
            "{seen:?}"
        );
        // A NodePort answers on every node's address, from another node.
        let np = jsonpath(kc, "svc/hello", "{.spec.ports[0].nodePort}");
        for ip in ["10.0.1.4", "10.0.2.4", "10.0.3.4"] {
            let page = curl_from(data, "kumo-control-plane", &format!("http://{ip}:{np}/"))
                .unwrap_or_default();
            assert!(page.starts_with("hello-from-"), "{ip}:{np}: {page:?}");
        }
        // externalTrafficPolicy: Local keeps the client's address, and only the node
        // with an endpoint answers.
        let local = jsonpath(kc, "svc/src-local", "{.spec.ports[0].nodePort}");
        let seen_as = curl_from(
            data,
            "kumo-control-plane",
            &format!("http://10.0.2.4:{local}/cgi-bin/ip"),
        )
        .unwrap_or_default();
        assert!(seen_as.contains("10.0.1.4"), "{seen_as:?}");
        assert!(
            curl_from(
                data,
                "kumo-control-plane",
                &format!("http://10.0.3.4:{local}/")
            )
            .is_none(),
            "a node without an endpoint drops eTP Local traffic"
        );
        // The load balancers' VIPs answer from the internet, through the targets their
        // health checks find healthy; with eTP Local only the node with an endpoint is
        // healthy (kube-proxy's health check node port) and the pod sees the client.
        let vip = |svc: &str| {
            eventually(60, &format!("{svc}'s external IP"), || {
                let ip = jsonpath(
                    kc,
                    &format!("svc/{svc}"),
                    "{.status.loadBalancer.ingress[0].ip}",
                );
                (!ip.is_empty()).then_some(ip)
            })
        };
        let (hello_vip, src_vip) = (vip("hello"), vip("src-local"));
        let page = eventually(90, "hello's VIP to answer", || {
            curl_from_internet(data, &format!("http://{hello_vip}/"))
                .filter(|p| p.starts_with("hello-from-"))
        });
        assert!(page.starts_with("hello-from-"), "{page}");
        let client = eventually(90, "src-local's VIP to answer", || {
            curl_from_internet(data, &format!("http://{src_vip}/cgi-bin/ip"))
                .filter(|p| !p.trim().is_empty())
        });
        assert!(client.contains("100.64.0.2"), "the pod saw {client:?}");
        let hc = jsonpath(kc, "svc/src-local", "{.spec.healthCheckNodePort}");
        let healthz = curl_from(
            data,
            "kumo-control-plane",
            &format!("http://10.0.2.4:{hc}/"),
        )
        .unwrap_or_default();
        assert!(healthz.contains("\"localEndpoints\":1"), "{healthz}");
        // kube-proxy's own health and metrics, in each node's namespace.
        let proxy_health = curl_from(data, "kumo-control-plane", "http://10.0.2.4:10256/healthz")
            .unwrap_or_default();
        assert!(
            proxy_health.contains("\"nodeEligible\":true"),
            "{proxy_health}"
        );
        let metrics = curl_from(data, "kumo-control-plane", "http://10.0.3.4:10249/metrics")
            .unwrap_or_default();
        assert!(
            metrics.contains("kubeproxy_sync_proxy_rules_duration_seconds_count"),
            "{metrics}"
        );
        // The rules and routes are there to look at.
        let table = on_node(
            data,
            "kumo-worker",
            &["nft", "list", "table", "ip", "kube-proxy"],
        );
        assert!(table.ok, "{}", table.stderr);
        for want in ["chain services", "map service-ips", "default/hello/tcp/"] {
            assert!(table.stdout.contains(want), "{want}: {}", table.stdout);
        }
        let routes = on_node(data, "kumo-worker", &["ip", "route"]);
        assert!(routes.stdout.contains("dev cni0"), "{}", routes.stdout);
        assert!(
            routes.stdout.contains("default via 10.0.2.1"),
            "{}",
            routes.stdout
        );
        // A route deleted in the cloud cuts the path to b's node until the route
        // controller puts it back (which an injected fault holds off until cleared).
        let b_cidr = jsonpath(kc, "node/kumo-worker2", "{.spec.podCIDR}");
        let cloud = |args: &[&str]| {
            let o = Command::new(env!("CARGO_BIN_EXE_kumo"))
                .args(["cloud", "--data-dir"])
                .arg(data.join("cloud"))
                .args(args)
                .output()
                .unwrap();
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        };
        cloud(&[
            "faults",
            "set",
            "--operation",
            "CreateRoute",
            "--error-rate",
            "1",
        ]);
        cloud(&["routes", "delete", &b_cidr]);
        // (busybox's nc with a timeout: Debian's busybox wget crashes on -T.)
        let get_b = format!("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 2 {b_ip} 8080");
        eventually(10, "the path to b to break", || {
            let o = kubectl(kc, &["exec", "a", "--", "sh", "-c", &get_b]);
            (!o.stdout.contains("hello-from-b")).then_some(())
        });
        cloud(&["faults", "clear"]);
        eventually(40, "the route controller to restore the path", || {
            let o = kubectl(kc, &["exec", "a", "--", "sh", "-c", &get_b]);
            o.stdout.contains("hello-from-b").then_some(())
        });
        // Without the Service's pods the VIP stops answering.
        ok(kc, &["delete", "pod", "a", "b", "--wait=false"]);
        eventually(60, "hello's VIP to stop answering", || {
            curl_from_internet(data, &format!("http://{hello_vip}/"))
                .is_none_or(|p| !p.starts_with("hello-from-"))
                .then_some(())
        });
        // The doctor sees it from the internet too, and says why.
        let doctor = Command::new(env!("CARGO_BIN_EXE_kumo"))
            .args(["doctor", "service", "hello", "--data-dir"])
            .arg(data)
            .output()
            .unwrap();
        let report = String::from_utf8_lossy(&doctor.stdout);
        assert!(report.contains("does not answer"), "{report}");
        assert!(report.contains("data plane: "), "{report}");
    });
}

/// The workload cluster of a pod on it: a busybox pod that serves a page on the control
/// plane's machine (pinned there, past the control-plane taint as a DaemonSet is), and one
/// that waits on the worker.
const TENANT_PODS: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: on-cp}
spec:
  nodeName: NODE
  containers:
  - name: c
    image: busybox:1.37
    command: [sh, -c, 'mkdir -p /www; hostname > /www/index.html; httpd -f -p 8080 -h /www']
    readinessProbe: {tcpSocket: {port: 8080}, periodSeconds: 1}
---
apiVersion: v1
kind: Pod
metadata: {name: on-worker}
spec:
  containers:
  - {name: c, image: "busybox:1.37", command: [sleep, "3600"]}
"#;

/// A pod that asks the workload cluster's API server for its health by the `kubernetes`
/// Service's name.
const TO_API: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: to-api}
spec:
  restartPolicy: Never
  containers:
  - {name: c, image: "curlimages/curl:8.11.0", command: [curl, -sSk, "https://kubernetes.default/healthz"]}
"#;

/// `kumo up --runtime containerd --cluster-api`: Cluster API's machines are real machines
/// too — each a namespace with its containerd on the cloud's VPC, its kubelet and nftables
/// kube-proxy in it — so the workload cluster's pods run, reach each other across machines
/// through the VPC's routes (the cluster's own route controller), find names through its
/// own CoreDNS pods and the API through its `kubernetes` Service; deleting the Cluster
/// powers its machines off.
#[test]
fn workload_clusters_run_on_real_machines() {
    with_real_cluster(&["--nodes", "0", "--cluster-api"], |kc, data, _printed| {
        ok(kc, &["create", "namespace", "t0"]);
        let example = include_str!("../../../docs/examples/cluster-api.yaml")
            .replace("replicas: 2", "replicas: 1");
        let applied = kubectl_in(kc, &["apply", "-n", "t0", "-f", "-"], Some(&example));
        assert!(applied.ok, "{}", applied.stderr);
        let out = eventually(60, "the demo-kubeconfig Secret", || {
            let o = kubectl(
                kc,
                &[
                    "get",
                    "secret",
                    "demo-kubeconfig",
                    "-n",
                    "t0",
                    "-o",
                    "jsonpath={.data.value}",
                ],
            );
            (o.ok && !o.stdout.is_empty()).then_some(o.stdout)
        });
        use base64::Engine;
        let text = base64::engine::general_purpose::STANDARD
            .decode(out.trim())
            .unwrap();
        let tkc = data.join("demo.conf");
        std::fs::write(&tkc, text).unwrap();
        let tkc = tkc.as_path();
        let nodes = eventually(180, "2 Ready workload nodes", || {
            let o = kubectl(tkc, &["get", "nodes", "-o", "json"]);
            let v: serde_json::Value = serde_json::from_str(&o.stdout).ok()?;
            let items = v["items"].as_array()?.clone();
            let ready = items
                .iter()
                .filter(|n| {
                    n["status"]["conditions"].as_array().is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c["type"] == "Ready" && c["status"] == "True")
                    })
                })
                .count();
            (items.len() == 2 && ready == 2).then_some(items)
        });
        // Real machines of the cloud: containerd's nodes, with providerIDs naming the
        // instances and addresses of the VPC.
        let mut cp = String::new();
        for n in &nodes {
            let info = &n["status"]["nodeInfo"];
            assert!(
                info["containerRuntimeVersion"]
                    .as_str()
                    .unwrap()
                    .starts_with("containerd://"),
                "{info}"
            );
            assert!(
                n["spec"]["providerID"]
                    .as_str()
                    .unwrap()
                    .starts_with("kumo://kumo-1"),
                "{}",
                n["spec"]
            );
            assert!(
                n["spec"]["podCIDR"]
                    .as_str()
                    .unwrap()
                    .starts_with("192.168."),
                "{}",
                n["spec"]
            );
            if n["metadata"]["labels"]["node-role.kubernetes.io/control-plane"].is_string() {
                cp = n["metadata"]["name"].as_str().unwrap().to_owned();
            }
        }
        assert!(!cp.is_empty(), "a control-plane node: {nodes:?}");
        // The machines are namespaces of their own, not the management cluster's nodes.
        let netns = Command::new("ip").args(["netns", "list"]).output().unwrap();
        let netns = String::from_utf8_lossy(&netns.stdout).into_owned();
        assert!(netns.contains(&cp[..cp.len().min(20)]), "{netns}");
        let pods = TENANT_PODS.replace("NODE", &cp);
        let applied = kubectl_in(tkc, &["apply", "-f", "-"], Some(&pods));
        assert!(applied.ok, "{}", applied.stderr);
        for pod in ["on-cp", "on-worker"] {
            eventually(90, &format!("workload pod {pod} ready"), || {
                let r = jsonpath(
                    tkc,
                    &format!("pod/{pod}"),
                    "{.status.containerStatuses[0].ready}",
                );
                (r == "true").then_some(())
            });
        }
        let cp_ip = jsonpath(tkc, "pod/on-cp", "{.status.podIP}");
        assert!(cp_ip.starts_with("192.168."), "{cp_ip}");
        // Pod to pod, from the worker's machine to the control plane's.
        let page = eventually(30, "on-cp's page from on-worker", || {
            let o = kubectl(
                tkc,
                &[
                    "exec",
                    "on-worker",
                    "--",
                    "wget",
                    "-qO-",
                    &format!("http://{cp_ip}:8080/"),
                ],
            );
            o.ok.then_some(o.stdout)
        });
        assert_eq!(page.trim(), "on-cp");
        // The cluster's own DNS (its Service range's 10th address) and API (its first).
        coredns_ready(tkc);
        let looked = eventually(30, "nslookup of kubernetes.default", || {
            let o = kubectl(
                tkc,
                &[
                    "exec",
                    "on-worker",
                    "--",
                    "nslookup",
                    "kubernetes.default.svc.cluster.local",
                ],
            );
            o.stdout.contains("10.128.0.1").then_some(o.stdout)
        });
        assert!(looked.contains("Server:\t\t10.128.0.10"), "{looked}");
        // The worker's kube-proxy programs the workload cluster's Services in its machine
        // (`kumo node exec` reaches a workload cluster's machines too).
        let worker = nodes
            .iter()
            .map(|n| n["metadata"]["name"].as_str().unwrap())
            .find(|n| *n != cp)
            .unwrap();
        let table = on_node(data, worker, &["nft", "list", "table", "ip", "kube-proxy"]);
        assert!(table.ok, "{}", table.stderr);
        assert!(
            table.stdout.contains("kube-system/kube-dns/udp/dns")
                && table.stdout.contains("10.128.0.10"),
            "{}",
            table.stdout
        );
        let applied = kubectl_in(tkc, &["apply", "-f", "-"], Some(TO_API));
        assert!(applied.ok, "{}", applied.stderr);
        let healthz = eventually(60, "to-api's answer", || {
            let p = jsonpath(
                tkc,
                "pod/to-api",
                "{.status.containerStatuses[0].state.terminated.exitCode}",
            );
            (!p.is_empty()).then(|| (p, kubectl(tkc, &["logs", "to-api"]).stdout))
        });
        assert_eq!(healthz, ("0".to_owned(), "ok".to_owned()));
        // The control plane scaled 1 → 3 → 1: the members join the first one's etcd, and
        // scaling down takes two out of etcd (found through the machines' host: no etcd
        // pod shows them) before their machines go; the API answers on.
        let scale = |replicas: &str| {
            let arg = format!("--replicas={replicas}");
            ok(
                kc,
                &["scale", "kcp", "demo-control-plane", "-n", "t0", &arg],
            );
        };
        scale("3");
        let control_plane_nodes = |tkc: &Path| {
            let o = kubectl(
                tkc,
                &[
                    "get",
                    "nodes",
                    "-l",
                    "node-role.kubernetes.io/control-plane",
                    "--no-headers",
                ],
            );
            o.ok.then(|| {
                let lines: Vec<String> = o.stdout.lines().map(str::to_owned).collect();
                let ready = lines.iter().filter(|l| l.contains(" Ready ")).count();
                (lines.len(), ready)
            })
        };
        eventually(120, "3 Ready control-plane nodes", || {
            (control_plane_nodes(tkc) == Some((3, 3))).then_some(())
        });
        scale("1");
        eventually(90, "the control plane back to 1 machine and node", || {
            let replicas = kubectl(
                kc,
                &[
                    "get",
                    "kcp/demo-control-plane",
                    "-n",
                    "t0",
                    "-o",
                    "jsonpath={.status.replicas}",
                ],
            )
            .stdout;
            (replicas == "1" && control_plane_nodes(tkc) == Some((1, 1))).then_some(())
        });
        let ready = kubectl(tkc, &["get", "--raw", "/readyz"]);
        assert_eq!(ready.stdout.trim(), "ok", "{}", ready.stderr);
        let events = kubectl(
            kc,
            &[
                "get",
                "events",
                "-n",
                "t0",
                "--field-selector",
                "reason=SuccessfulDelete,involvedObject.kind=KubeadmControlPlane",
                "--no-headers",
            ],
        );
        assert_eq!(events.stdout.lines().count(), 2, "{}", events.stdout);
        // Deleting the Cluster powers its machines off: their namespaces go.
        ok(
            kc,
            &["delete", "cluster", "demo", "-n", "t0", "--wait=false"],
        );
        eventually(90, "the workload machines' namespaces to go", || {
            let o = Command::new("ip").args(["netns", "list"]).output().unwrap();
            let list = String::from_utf8_lossy(&o.stdout).into_owned();
            (!list.contains("-demo-")).then_some(())
        });
    });
}
