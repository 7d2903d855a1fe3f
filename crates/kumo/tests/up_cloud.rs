//! `kumo up` with the cloud: the nodes are the cloud's instances (a control plane labelled
//! and tainted as kubeadm's, and kind-named workers), each a kubelet with
//! `--cloud-provider=external` that the cloud-controller-manager initializes; the API
//! server reaches their kubelets on loopback, never at their (unroutable) InternalIPs;
//! a restart reuses the instances; terminating one deletes its Node.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use kumo::cluster::{CloudSettings, ClusterConfig};
use kumo_cloud::{InstanceFilter, InstanceState};
use kumo_testkit::kubectl::{eventually, get, k, k_in};

fn cloud_config(dir: &Path, name: &str, workers: usize, controllers: &[&str]) -> ClusterConfig {
    let mut cfg = ClusterConfig::with_cloud(dir.join("kumo"));
    cfg.port = 0;
    cfg.cloud = Some(CloudSettings {
        name: name.into(),
        workers,
        controllers: controllers.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    });
    cfg
}

fn labels(node: &serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
    node["metadata"]["labels"]
        .as_object()
        .cloned()
        .unwrap_or_default()
}

fn taint_keys(node: &serde_json::Value) -> Vec<String> {
    node["spec"]["taints"]
        .as_array()
        .map(|ts| {
            ts.iter()
                .map(|t| {
                    format!(
                        "{}:{}",
                        t["key"].as_str().unwrap(),
                        t["effect"].as_str().unwrap()
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The whole system: nodes Ready in seconds, kubeadm's control-plane marks, the cloud
/// node controller's providerID/addresses/topology, pods scheduled on workers with
/// `kubectl logs`/`exec` through the loopback dial, and a LoadBalancer Service's
/// EXTERNAL-IP from the cloud.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cloud_nodes_join_initialized_and_serve_pods() {
    let dir = tempfile::tempdir().unwrap();
    let started = std::time::Instant::now();
    let cluster = kumo::cluster::start(cloud_config(dir.path(), "ta", 2, &["*"]))
        .await
        .unwrap();
    let kc = cluster.api.admin_kubeconfig.clone();
    let kc = kc.as_path();
    let nodes = cluster.node_names();
    assert_eq!(nodes, ["ta-control-plane", "ta-worker", "ta-worker2"]);
    cluster
        .wait_nodes_ready(&nodes, Duration::from_secs(20), |_| {})
        .await
        .unwrap();
    eprintln!("nodes Ready {:?} after start", started.elapsed());
    // A node that never comes is named in the error with what was seen of it.
    let err = cluster
        .wait_nodes_ready(
            &["ta-worker".to_owned(), "ta-ghost".to_owned()],
            Duration::from_millis(300),
            |_| {},
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("ta-ghost (not registered)") && !err.contains("ta-worker"),
        "{err}"
    );

    // The instances behind them, one per zone, launched with the cluster's tags.
    let cloud = cluster.cloud.as_ref().unwrap();
    let filter = InstanceFilter {
        tags: [("kumo.io/cluster".to_owned(), "ta".to_owned())].into(),
        ..Default::default()
    };
    let mut instances = cloud.client.list_instances(&filter).await.unwrap();
    instances.sort_by(|a, b| a.name.cmp(&b.name));
    let names: Vec<&str> = instances.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["ta-control-plane", "ta-worker", "ta-worker2"]);
    assert!(instances.iter().all(|i| i.state == InstanceState::Running));
    let zones: Vec<&str> = instances.iter().map(|i| i.zone.as_str()).collect();
    assert_eq!(zones, ["kumo-1a", "kumo-1b", "kumo-1c"]);
    assert_eq!(instances[0].tags["kumo.io/role"], "control-plane");
    assert_eq!(instances[1].tags["kumo.io/role"], "worker");

    // The workers joined as `kubeadm join` does: a bootstrap token (in a 0600
    // bootstrap-kubelet.conf), a CSR the controller-manager approved and signed. The
    // control plane's kubelet.conf comes from the cluster's PKI, as `kubeadm init` writes it.
    use std::os::unix::fs::PermissionsExt;
    let nodes_dir = dir.path().join("kumo").join("nodes");
    for w in ["ta-worker", "ta-worker2"] {
        let conf = nodes_dir.join(w).join("bootstrap-kubelet.conf");
        let mode = std::fs::metadata(&conf).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{}", conf.display());
        assert!(nodes_dir.join(w).join("kubelet.conf").exists());
    }
    assert!(!nodes_dir
        .join("ta-control-plane")
        .join("bootstrap-kubelet.conf")
        .exists());
    let csrs = get(kc, &["csr"]).await.unwrap();
    let joined: Vec<&serde_json::Value> = csrs["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| {
            c["spec"]["username"]
                .as_str()
                .is_some_and(|u| u.starts_with("system:bootstrap:"))
        })
        .collect();
    assert_eq!(joined.len(), 2, "{csrs}");
    for c in joined {
        assert_eq!(
            c["spec"]["signerName"],
            "kubernetes.io/kube-apiserver-client-kubelet"
        );
        let approved = c["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["type"] == "Approved" && x["reason"] == "AutoApproved");
        assert!(approved, "{c}");
        assert!(
            c["status"]["certificate"]
                .as_str()
                .is_some_and(|s| !s.is_empty()),
            "{c}"
        );
    }
    let token = k(
        kc,
        &[
            "get",
            "secrets",
            "-n",
            "kube-system",
            "--field-selector=type=bootstrap.kubernetes.io/token",
            "-o",
            "name",
        ],
    )
    .await;
    assert_eq!(token.stdout.lines().count(), 1, "{}", token.stdout);

    // kubeadm's control plane: role and exclusion labels, the NoSchedule taint.
    let cp = get(kc, &["node", "ta-control-plane"]).await.unwrap();
    let l = labels(&cp);
    assert_eq!(l["node-role.kubernetes.io/control-plane"], "");
    assert_eq!(
        l["node.kubernetes.io/exclude-from-external-load-balancers"],
        ""
    );
    assert!(
        taint_keys(&cp).contains(&"node-role.kubernetes.io/control-plane:NoSchedule".into()),
        "{cp}"
    );
    assert_eq!(
        cp["metadata"]["annotations"]["alpha.kubernetes.io/provided-node-ip"],
        instances[0].private_ip.as_str()
    );
    let w = get(kc, &["node", "ta-worker"]).await.unwrap();
    assert!(!labels(&w).contains_key("node-role.kubernetes.io/control-plane"));
    assert!(!labels(&w).contains_key("node.kubernetes.io/exclude-from-external-load-balancers"));
    // The machine's size is its instance type's.
    assert_eq!(w["status"]["capacity"]["cpu"], instances[1].cpu.to_string());

    // The cloud node controller initializes every node from its instance.
    for i in &instances {
        let node = eventually(20, &format!("{} initialized", i.name), || async {
            let n = get(kc, &["node", &i.name]).await?;
            let init = n["spec"]["providerID"].is_string()
                && !taint_keys(&n)
                    .iter()
                    .any(|t| t.starts_with("node.cloudprovider.kubernetes.io/uninitialized"))
                // The addresses come in a second write, after the taint is lifted.
                && n["status"]["addresses"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|a| a["type"] == "InternalIP"));
            init.then_some(n)
        })
        .await;
        assert_eq!(
            node["spec"]["providerID"],
            format!("kumo://{}/{}", i.zone, i.id)
        );
        let l = labels(&node);
        assert_eq!(l["topology.kubernetes.io/zone"], i.zone.as_str());
        assert_eq!(l["topology.kubernetes.io/region"], "kumo-1");
        assert_eq!(
            l["node.kubernetes.io/instance-type"],
            i.instance_type.as_str()
        );
        let addresses = node["status"]["addresses"].as_array().unwrap();
        let addr = |t: &str| {
            addresses
                .iter()
                .find(|a| a["type"] == t)
                .map(|a| a["address"].as_str().unwrap().to_owned())
        };
        assert_eq!(addr("InternalIP").as_deref(), Some(i.private_ip.as_str()));
        assert_eq!(
            addr("Hostname").as_deref(),
            Some(i.private_dns_name.as_str())
        );
        assert!(i.private_ip.starts_with("10.0."), "{}", i.private_ip);
    }

    // The route controller: a cloud route per node range, to the node's instance.
    for i in &instances {
        let cidr = eventually(20, &format!("{}'s podCIDR", i.name), || async {
            let n = get(kc, &["node", &i.name]).await?;
            n["spec"]["podCIDR"].as_str().map(str::to_owned)
        })
        .await;
        eventually(20, &format!("route {cidr} to {}", i.id), || async {
            let t = cloud.client.main_route_table().await.ok()?;
            t.routes
                .iter()
                .any(|r| r.destination_cidr == cidr && r.instance_id == i.id)
                .then_some(())
        })
        .await;
    }

    // A pod on a worker: logs and exec reach its kubelet on loopback (its InternalIP
    // 10.0.x.x does not route from here).
    let pod = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"talker"},"spec":{
      "nodeSelector":{"kubernetes.io/hostname":"ta-worker2"},
      "containers":[{"name":"main","image":"busybox:1.37","command":["sh","-c","echo hello from the cloud; sleep 3600"]}]}}"#;
    eventually(30, "talker created", || async {
        k_in(kc, &["apply", "-f", "-"], Some(pod))
            .await
            .ok
            .then_some(())
    })
    .await;
    eventually(30, "talker running on ta-worker2", || async {
        let p = get(kc, &["pod", "talker"]).await?;
        (p["spec"]["nodeName"] == "ta-worker2" && p["status"]["phase"] == "Running").then_some(())
    })
    .await;
    let logs = eventually(20, "talker's logs", || async {
        let o = k(kc, &["logs", "talker"]).await;
        (o.ok && !o.stdout.is_empty()).then_some(o.stdout)
    })
    .await;
    assert_eq!(logs, "hello from the cloud\n");
    let o = k(kc, &["exec", "talker", "--", "echo", "through", "loopback"]).await;
    assert!(o.ok, "{}", o.stderr);
    assert_eq!(o.stdout, "through loopback\n");

    // A LoadBalancer Service: the cloud's load balancer, its VIP as EXTERNAL-IP, the
    // workers (not the excluded control plane) as targets.
    for args in [
        &[
            "create",
            "deployment",
            "web",
            "--image=nginx:1.29",
            "--port=80",
        ][..],
        &[
            "expose",
            "deployment",
            "web",
            "--port=80",
            "--type=LoadBalancer",
        ][..],
    ] {
        let o = k(kc, args).await;
        assert!(o.ok, "{}", o.stderr);
    }
    let ip = eventually(20, "EXTERNAL-IP", || async {
        let s = get(kc, &["service", "web"]).await?;
        s["status"]["loadBalancer"]["ingress"][0]["ip"]
            .as_str()
            .map(str::to_owned)
    })
    .await;
    let lbs = cloud.client.list_load_balancers().await.unwrap();
    assert_eq!(lbs.len(), 1, "{lbs:?}");
    assert_eq!(lbs[0].vip, ip);
    let mut targets: Vec<&str> = lbs[0]
        .targets
        .iter()
        .map(|t| t.instance_id.as_str())
        .collect();
    targets.sort();
    let mut workers = vec![instances[1].id.as_str(), instances[2].id.as_str()];
    workers.sort();
    assert_eq!(targets, workers);
    let o = k(
        kc,
        &[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=web,involvedObject.kind=Service",
            "-o",
            "jsonpath={.items[*].reason}",
        ],
    )
    .await;
    assert!(
        o.stdout.contains("EnsuringLoadBalancer") && o.stdout.contains("EnsuredLoadBalancer"),
        "{}",
        o.stdout
    );

    // `--kubeconfig-update`: a kumo-<name> context merged into the user's kubeconfig
    // (twice: replaced, not duplicated), the rest kept.
    let user = dir.path().join("user.conf");
    std::fs::write(&user, "apiVersion: v1\nkind: Config\nclusters:\n- name: other\n  cluster:\n    server: https://192.0.2.1:6443\ncontexts:\n- name: other\n  context:\n    cluster: other\n    user: other\nusers:\n- name: other\n  user:\n    token: abc\ncurrent-context: other\n").unwrap();
    kumo::kubeconfig::merge(kc, "ta", dir.path(), &user).unwrap();
    kumo::kubeconfig::merge(kc, "ta", dir.path(), &user).unwrap();
    let o = k(&user, &["config", "get-contexts", "-o", "name"]).await;
    assert_eq!(o.stdout, "kumo-ta\nother\n");
    let o = k(&user, &["config", "current-context"]).await;
    assert_eq!(o.stdout, "kumo-ta\n");
    let o = k(&user, &["get", "node", "ta-worker", "-o", "name"]).await;
    assert_eq!(o.stdout, "node/ta-worker\n", "{}", o.stderr);

    // The CCM acts in the cloud with an access key of its own: denying load balancers
    // to that credential fails the next Service with the cloud's refusal, until allowed.
    let key = cloud.ccm_access_key_id.clone().unwrap();
    let keys = cloud.client.list_access_keys().await.unwrap();
    assert!(keys
        .iter()
        .any(|k| k.access_key_id == key && k.name == "cloud-controller-manager"));
    cloud
        .client
        .deny("CreateLoadBalancer", Some(&key))
        .await
        .unwrap();
    let o = k(
        kc,
        &[
            "expose",
            "deployment",
            "web",
            "--name=web2",
            "--port=81",
            "--target-port=80",
            "--type=LoadBalancer",
        ],
    )
    .await;
    assert!(o.ok, "{}", o.stderr);
    let failed = eventually(20, "SyncLoadBalancerFailed", || async {
        let o = k(
            kc,
            &[
                "get",
                "events",
                "--field-selector",
                "involvedObject.name=web2,reason=SyncLoadBalancerFailed",
                "-o",
                "jsonpath={.items[0].message}",
            ],
        )
        .await;
        (!o.stdout.is_empty()).then_some(o.stdout)
    })
    .await;
    assert!(failed.contains("AccessDenied"), "{failed}");
    cloud
        .client
        .allow("CreateLoadBalancer", Some(&key))
        .await
        .unwrap();
    eventually(30, "web2's EXTERNAL-IP once allowed", || async {
        let s = get(kc, &["service", "web2"]).await?;
        s["status"]["loadBalancer"]["ingress"][0]["ip"]
            .as_str()
            .map(|_| ())
    })
    .await;
}

/// Without the service controller (the seeds' environment), a LoadBalancer Service stays
/// pending with no events; terminating an instance with the CLI halts its kubelet, and the
/// node-lifecycle controller deletes its Node once it is no longer Ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn terminated_instance_loses_its_node_and_no_lb_without_service_controller() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = kumo::cluster::start(cloud_config(
        dir.path(),
        "tb",
        2,
        &["cloud-node", "cloud-node-lifecycle"],
    ))
    .await
    .unwrap();
    let kc = cluster.api.admin_kubeconfig.clone();
    let kc = kc.as_path();
    cluster
        .wait_nodes_ready(&cluster.node_names(), Duration::from_secs(20), |_| {})
        .await
        .unwrap();
    let cloud = cluster.cloud.as_ref().unwrap();
    let worker = cloud.instances[1].instance.clone();
    assert_eq!(worker.name, "tb-worker");

    // The CLI, as a user runs it against `kumo up`'s cloud directory.
    let out = Command::new(env!("CARGO_BIN_EXE_kumo"))
        .args(["cloud", "--data-dir"])
        .arg(cluster.config.cloud_dir())
        .args(["instance", "terminate", &worker.id])
        .env_remove("KUMO_CLOUD_DATA_DIR")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    cloud
        .client
        .wait_for_instance_state(
            &worker.id,
            InstanceState::Terminated,
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    assert_eq!(
        cloud.hypervisor.running_nodes(),
        ["tb-control-plane", "tb-worker2"]
    );

    // Stop and start another: its kubelet is halted, then boots again and renews its
    // Lease (quickly enough that the node never goes NotReady).
    let other = cloud.instances[2].instance.clone();
    let lease = || async {
        k(
            kc,
            &[
                "-n",
                "kube-node-lease",
                "get",
                "lease",
                "tb-worker2",
                "-o",
                "jsonpath={.spec.renewTime}",
            ],
        )
        .await
        .stdout
    };
    let before = lease().await;
    cloud.client.stop_instance(&other.id).await.unwrap();
    cloud
        .client
        .wait_for_instance_state(&other.id, InstanceState::Stopped, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(cloud.hypervisor.running_nodes(), ["tb-control-plane"]);
    cloud.client.start_instance(&other.id).await.unwrap();
    cloud
        .client
        .wait_for_instance_state(&other.id, InstanceState::Running, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(
        cloud.hypervisor.running_nodes(),
        ["tb-control-plane", "tb-worker2"]
    );
    eventually(
        20,
        "tb-worker2's lease renewed after the restart",
        || async { (lease().await != before).then_some(()) },
    )
    .await;

    // Meanwhile: no service controller, so the Service stays <pending>.
    for args in [
        &[
            "create",
            "deployment",
            "web",
            "--image=nginx:1.29",
            "--port=80",
        ][..],
        &[
            "expose",
            "deployment",
            "web",
            "--port=80",
            "--type=LoadBalancer",
        ][..],
    ] {
        let o = k(kc, args).await;
        assert!(o.ok, "{}", o.stderr);
    }

    // The Node goes once its heartbeats are stale (grace period) and the cloud says the
    // instance is gone.
    eventually(100, "tb-worker deleted", || async {
        get(kc, &["node", "tb-worker"])
            .await
            .is_none()
            .then_some(())
    })
    .await;
    let o = k(
        kc,
        &[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=tb-worker,reason=DeletingNode",
            "-o",
            "jsonpath={.items[*].message}",
        ],
    )
    .await;
    assert_eq!(
        o.stdout,
        "Deleting node tb-worker because it does not exist in the cloud provider"
    );
    let svc = get(kc, &["service", "web"]).await.unwrap();
    assert_eq!(svc["status"], serde_json::json!({"loadBalancer": {}}));
    let o = k(
        kc,
        &[
            "get",
            "events",
            "--field-selector",
            "involvedObject.kind=Service",
            "-o",
            "name",
        ],
    )
    .await;
    assert_eq!(o.stdout, "");
    assert!(cloud.client.list_load_balancers().await.unwrap().is_empty());
    let w2 = get(kc, &["node", "tb-worker2"]).await.unwrap();
    let ready = w2["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap()["status"]
        .clone();
    assert_eq!(ready, "True");
}

/// Kills the `kumo up` child when the test ends, even on a failed assertion.
struct Up(Child);

impl Drop for Up {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `kumo up` and returns it with what it printed up to its ready line.
fn kumo_up(dir: &Path, extra: &[&str]) -> (Up, Vec<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kumo"))
        .args(["up", "--port", "0", "--data-dir"])
        .arg(dir)
        .args(extra)
        // Never the developer's own kubeconfig.
        .env("KUBECONFIG", dir.join("user.conf"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let up = Up(child);
    let mut lines = BufReader::new(stdout).lines();
    let mut printed = Vec::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        let done = line == "kumo: ready";
        printed.push(line);
        if done {
            break;
        }
    }
    // Keep draining so kumo never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    (up, printed)
}

/// The instance ids `kumo up` printed, with what it did with each.
fn instance_lines(printed: &[String]) -> Vec<(String, String, String)> {
    printed
        .iter()
        .filter_map(|l| l.strip_prefix("kumo: instance "))
        .map(|l| {
            let mut w = l.split_whitespace();
            let id = w.next().unwrap().to_owned();
            let name = w.next().unwrap().to_owned();
            let what = w.next().unwrap().trim_end_matches(':').to_owned();
            (id, name, what)
        })
        .collect()
}

/// The `kumo up` binary: it waits for the nodes before printing how to use the cluster;
/// started again on the same data directory, it finds its instances (the cloud booted them
/// again) instead of launching new ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kumo_up_restarts_on_its_instances() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["--name", "tc", "--nodes", "1"];
    let (up, printed) = kumo_up(dir.path(), &[&args[..], &["--kubeconfig-update"]].concat());
    let first = instance_lines(&printed);
    let names: Vec<&str> = first.iter().map(|(_, n, _)| n.as_str()).collect();
    assert_eq!(names, ["tc-control-plane", "tc-worker"], "{printed:#?}");
    assert!(
        first.iter().all(|(_, _, w)| w == "launched"),
        "{printed:#?}"
    );
    for n in ["tc-control-plane", "tc-worker"] {
        assert!(
            printed.contains(&format!("kumo: node {n} Ready")),
            "{printed:#?}"
        );
    }
    let cloud_dir = dir.path().join("cloud");
    let kc = dir.path().join("admin.conf");
    let user = dir.path().join("user.conf");
    assert!(
        printed.contains(&format!(
            "kumo: context kumo-tc set in {} (now current)",
            user.display()
        )),
        "{printed:#?}"
    );
    let o = k(&user, &["get", "node", "tc-worker", "-o", "name"]).await;
    assert_eq!(o.stdout, "node/tc-worker\n", "{}", o.stderr);
    assert!(
        printed.iter().any(|l| l
            .contains("cloud-controller-manager started (controllers: *), cloud access key KKIA")),
        "{printed:#?}"
    );
    let renewed = |kc: std::path::PathBuf| async move {
        let o = k(
            &kc,
            &[
                "-n",
                "kube-node-lease",
                "get",
                "lease",
                "tc-worker",
                "-o",
                "jsonpath={.spec.renewTime}",
            ],
        )
        .await;
        o.stdout
    };
    let before = renewed(kc.clone()).await;
    assert!(!before.is_empty());
    drop(up);

    let (_up, printed) = kumo_up(dir.path(), &args);
    let second = instance_lines(&printed);
    let same: Vec<(String, String, String)> = first
        .iter()
        .map(|(id, n, _)| (id.clone(), n.clone(), "found".to_owned()))
        .collect();
    assert_eq!(second, same, "{printed:#?}");
    let all = kumo_cloud::Client::from_data_dir(&cloud_dir)
        .unwrap()
        .list_instances(&InstanceFilter::default())
        .await
        .unwrap();
    assert_eq!(all.len(), 2, "{all:?}");
    assert!(all.iter().all(|i| i.state == InstanceState::Running));
    let o = k(
        &kc,
        &["get", "nodes", "-o", "jsonpath={.items[*].metadata.name}"],
    )
    .await;
    assert_eq!(o.stdout, "tc-control-plane tc-worker");
    // The worker's kubelet is back: it renews its Lease again.
    eventually(20, "tc-worker's lease renewed", || {
        let (kc, before) = (kc.clone(), before.clone());
        async move { (renewed(kc).await != before).then_some(()) }
    })
    .await;
    // It kept the certificate it joined with (re-pointed at the new port): no second CSR.
    let o = k(
        &kc,
        &["get", "csr", "-o", "jsonpath={.items[*].spec.username}"],
    )
    .await;
    let joins = o
        .stdout
        .split_whitespace()
        .filter(|u| u.starts_with("system:bootstrap:"))
        .count();
    assert_eq!(joins, 1, "{}", o.stdout);
    let cli = Command::new(env!("CARGO_BIN_EXE_kumo"))
        .args(["cloud", "instances", "list"])
        .env("KUMO_CLOUD_DATA_DIR", &cloud_dir)
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&cli.stdout);
    for (id, _, _) in &first {
        assert!(listed.contains(id.as_str()), "{listed}");
    }
}
