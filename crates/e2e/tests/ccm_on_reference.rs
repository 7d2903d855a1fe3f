#![allow(clippy::unwrap_used, clippy::expect_used)]
//! kumo's cloud-controller-manager against the reference kube-apiserver v1.37.2 (issue 8:
//! "the cloud-controller-manager also runs against the reference kube-apiserver (nodes
//! created by `kumo kubelet` there) and does the same"). The CCM acts as the user
//! `system:cloud-controller-manager` (a client certificate signed by the reference's CA)
//! bound to kumo's ClusterRole, so upstream's RBAC judges each request it makes. The kumo
//! cloud runs in process; each node is registered by a kumo kubelet on its instance, with
//! `--cloud-provider=external` and `--node-ip` = the instance's private IP.
//!
//! Needs the reference binaries (`scripts/reference build`), kubectl and openssl on PATH.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use kumo_cloud::{CloudConfig, CloudServer, CreateRouteRequest, Instance, InstanceState};
use kumo_cloud_provider::ccm::{CloudControllerManager, Config};
use kumo_cloud_provider::kumo::KumoCloud;
use kumo_e2e::{require_command, require_reference_binaries, run, ReferenceCluster};
use kumo_testkit::kubectl::{eventually, get, k};
use serde_json::Value;

const UNINITIALIZED: &str = "node.cloudprovider.kubernetes.io/uninitialized";

/// A kubeconfig for the user `system:cloud-controller-manager`: a client certificate
/// signed by the reference cluster's CA, as kubeadm writes `cloud-controller-manager.conf`.
fn ccm_kubeconfig(dir: &Path) -> PathBuf {
    let pki = dir.join("pki");
    let key = pki.join("cloud-controller-manager.key");
    let csr = pki.join("cloud-controller-manager.csr");
    let crt = pki.join("cloud-controller-manager.crt");
    let ext = pki.join("cloud-controller-manager.ext");
    std::fs::write(
        &ext,
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n",
    )
    .unwrap();
    let openssl = |args: &[&str]| {
        run(Command::new("openssl").args(args))
            .unwrap()
            .ok()
            .unwrap_or_else(|e| panic!("{e:#}"));
    };
    let p = |p: &Path| p.to_str().unwrap().to_owned();
    openssl(&["genrsa", "-out", &p(&key), "2048"]);
    openssl(&[
        "req",
        "-new",
        "-key",
        &p(&key),
        "-subj",
        "/CN=system:cloud-controller-manager",
        "-out",
        &p(&csr),
    ]);
    openssl(&[
        "x509",
        "-req",
        "-in",
        &p(&csr),
        "-CA",
        &p(&pki.join("ca.crt")),
        "-CAkey",
        &p(&pki.join("ca.key")),
        "-CAcreateserial",
        "-days",
        "1",
        "-sha256",
        "-extfile",
        &p(&ext),
        "-out",
        &p(&crt),
    ]);
    let admin = std::fs::read_to_string(dir.join("admin.kubeconfig")).unwrap();
    let server = admin
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .expect("server in admin.kubeconfig")
        .to_owned();
    let kc = format!(
        "apiVersion: v1
kind: Config
clusters:
- name: kumo-reference
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: system:cloud-controller-manager
  user:
    client-certificate: {crt}
    client-key: {key}
contexts:
- name: kumo-reference
  context:
    cluster: kumo-reference
    user: system:cloud-controller-manager
current-context: kumo-reference
",
        ca = p(&pki.join("ca.crt")),
        crt = p(&crt),
        key = p(&key),
    );
    let path = dir.join("cloud-controller-manager.conf");
    std::fs::write(&path, kc).unwrap();
    path
}

async fn admin_client(kc: &Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(kc).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(cfg).unwrap()
}

/// Runs an instance named `name` and waits until it runs.
async fn instance(cloud: &kumo_cloud::Client, name: &str) -> Instance {
    let req = kumo_cloud::RunInstanceRequest {
        name: Some(name.into()),
        ..Default::default()
    };
    let i = cloud.run_instance(&req).await.unwrap();
    cloud
        .wait_for_instance_state(&i.id, InstanceState::Running, Duration::from_secs(10))
        .await
        .unwrap()
}

/// The kubelet of instance `i`, as the instance's boot would start it.
fn kubelet(kc: &Path, i: &Instance) {
    let mut cfg = kumo_kubelet::KubeletConfig::new(kc, &i.name);
    cfg.runtime = Some(kumo_sim::factory(None));
    cfg.cloud_provider_external = true;
    cfg.node_ip = Some(i.private_ip.parse().unwrap());
    tokio::spawn(async move {
        if let Err(e) = kumo_kubelet::run(cfg).await {
            eprintln!("kubelet: {e}");
        }
    });
}

fn condition(node: &Value, type_: &str) -> Option<Value> {
    node["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloud_controller_manager_on_the_reference_apiserver() {
    require_reference_binaries(&["etcd", "kube-apiserver"]).unwrap_or_else(|e| panic!("{e:#}"));
    require_command("kubectl").unwrap_or_else(|e| panic!("{e:#}"));
    require_command("openssl").unwrap_or_else(|e| panic!("{e:#}"));
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("reference");
    let cluster = tokio::task::spawn_blocking(move || ReferenceCluster::up(&dir, false))
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{e:#}"));
    let kc = cluster.kubeconfig().to_owned();
    let ccm_kc = ccm_kubeconfig(cluster.dir());
    kumo_cloud_provider::ccm::rbac::ensure(&admin_client(&kc).await)
        .await
        .unwrap();

    let cloud = CloudServer::start(CloudConfig::new(tmp.path().join("cloud")))
        .await
        .unwrap();
    let cloud_client = cloud.client().unwrap();
    let a = instance(&cloud_client, "worker-a").await;
    let b = instance(&cloud_client, "worker-b").await;
    kubelet(&kc, &a);
    kubelet(&kc, &b);
    // node-ipam's part (no kube-controller-manager runs): one pod range per node.
    for (name, cidr) in [("worker-a", "10.244.1.0/24"), ("worker-b", "10.244.2.0/24")] {
        eventually(30, &format!("node {name} registered"), || async {
            get(&kc, &["node", name]).await.map(|_| ())
        })
        .await;
        let patch = format!(r#"{{"spec":{{"podCIDR":"{cidr}","podCIDRs":["{cidr}"]}}}}"#);
        let out = k(&kc, &["patch", "node", name, "-p", &patch]).await;
        assert!(out.ok, "{}", out.stderr);
    }
    // A route this cluster made for a node that is no more, and one that is not the
    // cluster's at all.
    let table = cloud_client.main_route_table().await.unwrap().id;
    for (cidr, name, description) in [
        (
            "10.244.9.0/24",
            "kubernetes-old",
            "Kubernetes cluster kubernetes: pods of node gone",
        ),
        ("192.168.7.0/24", "vpn", "by hand"),
    ] {
        let req = CreateRouteRequest {
            destination_cidr: cidr.into(),
            instance_id: a.id.clone(),
            name: name.into(),
            description: description.into(),
        };
        cloud_client.create_route(&table, &req).await.unwrap();
    }

    let mut cfg = Config::new(&ccm_kc);
    cfg.serve = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
    cfg.allocate_node_cidrs = true;
    cfg.cluster_cidr = Some("10.244.0.0/16".into());
    cfg.route_reconciliation_period = Duration::from_secs(1);
    let ccm = CloudControllerManager::start(
        cfg,
        std::sync::Arc::new(KumoCloud::new(cloud_client.clone())),
    )
    .await
    .unwrap();

    // Leader election on upstream's Lease.
    let holder = eventually(30, "lease cloud-controller-manager", || async {
        let l = get(
            &kc,
            &["lease", "-n", "kube-system", "cloud-controller-manager"],
        )
        .await?;
        l["spec"]["holderIdentity"].as_str().map(str::to_owned)
    })
    .await;
    assert_eq!(holder, ccm.identity);

    // The cloud node controller initializes the nodes.
    for i in [&a, &b] {
        let n = eventually(30, &format!("{} initialized", i.name), || async {
            let n = get(&kc, &["node", &i.name]).await?;
            let tainted = n["spec"]["taints"]
                .as_array()
                .is_some_and(|t| t.iter().any(|t| t["key"] == UNINITIALIZED));
            // Upstream lifts the taint first and fills the addresses with a second
            // write (the status), so wait for both.
            let addressed = n["status"]["addresses"]
                .as_array()
                .is_some_and(|a| !a.is_empty());
            (n["spec"]["providerID"].is_string() && !tainted && addressed).then_some(n)
        })
        .await;
        assert_eq!(
            n["spec"]["providerID"],
            format!("kumo://{}/{}", i.zone, i.id).as_str()
        );
        let labels = &n["metadata"]["labels"];
        assert_eq!(labels["topology.kubernetes.io/zone"], i.zone.as_str());
        assert_eq!(labels["topology.kubernetes.io/region"], i.region.as_str());
        assert_eq!(
            labels["node.kubernetes.io/instance-type"],
            i.instance_type.as_str()
        );
        let addrs = n["status"]["addresses"].as_array().unwrap();
        assert!(
            addrs
                .iter()
                .any(|a| a["type"] == "InternalIP" && a["address"] == i.private_ip.as_str()),
            "{addrs:?}"
        );
    }
    // The Synced event is posted after the writes, by the recorder's own task.
    for name in ["worker-a", "worker-b"] {
        eventually(30, &format!("Synced event for {name}"), || async {
            let events = get(&kc, &["events", "-n", "default"]).await?;
            events["items"]
                .as_array()?
                .iter()
                .any(|e| {
                    e["reason"] == "Synced"
                        && e["involvedObject"]["name"] == name
                        && e["source"]["component"] == "cloud-node-controller"
                })
                .then_some(())
        })
        .await;
    }

    // The route controller: a route per pod CIDR, the stale one gone, the foreign one kept.
    eventually(
        30,
        "routes to both nodes, the stale one deleted",
        || async {
            let routes = cloud_client.main_route_table().await.ok()?.routes;
            let to = |cidr: &str| routes.iter().find(|r| r.destination_cidr == cidr);
            let ok = to("10.244.1.0/24").is_some_and(|r| r.instance_id == a.id)
                && to("10.244.2.0/24").is_some_and(|r| r.instance_id == b.id)
                && to("10.244.9.0/24").is_none()
                && to("192.168.7.0/24").is_some();
            ok.then_some(())
        },
    )
    .await;
    for name in ["worker-a", "worker-b"] {
        let c = eventually(30, &format!("{name} NetworkUnavailable=False"), || async {
            let c = condition(&get(&kc, &["node", name]).await?, "NetworkUnavailable")?;
            (c["status"] == "False").then_some(c)
        })
        .await;
        assert_eq!(c["reason"], "RouteCreated");
        assert_eq!(c["message"], "RouteController created a route");
    }

    // A cloud that refuses routes: FailedToCreateRoute on the node, NetworkUnavailable.
    cloud_client.deny("CreateRoute", None).await.unwrap();
    let c = instance(&cloud_client, "worker-c").await;
    kubelet(&kc, &c);
    eventually(30, "node worker-c registered", || async {
        get(&kc, &["node", "worker-c"]).await.map(|_| ())
    })
    .await;
    let patch = r#"{"spec":{"podCIDR":"10.244.3.0/24","podCIDRs":["10.244.3.0/24"]}}"#;
    let out = k(&kc, &["patch", "node", "worker-c", "-p", patch]).await;
    assert!(out.ok, "{}", out.stderr);
    let ev = eventually(30, "FailedToCreateRoute for worker-c", || async {
        let v = get(&kc, &["events", "-n", "default"]).await?;
        v["items"]
            .as_array()?
            .iter()
            .find(|e| {
                e["reason"] == "FailedToCreateRoute" && e["involvedObject"]["name"] == "worker-c"
            })
            .cloned()
    })
    .await;
    assert_eq!(ev["type"], "Warning");
    assert_eq!(ev["source"]["component"], "route_controller");
    let msg = ev["message"].as_str().unwrap();
    assert!(
        msg.contains("10.244.3.0/24 for node worker-c after ")
            && msg.contains("not authorized to perform: kumo:CreateRoute"),
        "{msg}"
    );
    let cond = eventually(30, "worker-c NetworkUnavailable=True", || async {
        let c = condition(
            &get(&kc, &["node", "worker-c"]).await?,
            "NetworkUnavailable",
        )?;
        (c["status"] == "True").then_some(c)
    })
    .await;
    assert_eq!(cond["reason"], "NoRouteCreated");
    assert_eq!(cond["message"], "RouteController failed to create a route");
    cloud_client.allow("CreateRoute", None).await.unwrap();
    eventually(
        30,
        "worker-c NetworkUnavailable=False once allowed",
        || async {
            let c = condition(
                &get(&kc, &["node", "worker-c"]).await?,
                "NetworkUnavailable",
            )?;
            (c["status"] == "False" && c["reason"] == "RouteCreated").then_some(())
        },
    )
    .await;

    ccm.shutdown().await.unwrap();
    cloud.shutdown().await;
    cluster.down().unwrap();
}
