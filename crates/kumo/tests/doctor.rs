//! `kumo doctor service` against a real cluster (kumo::cluster::start in this process, the
//! kumo cloud and the cloud-controller-manager next to it as `kumo up` lays them out in the
//! data directory): the verdict names who is not there, or what the cloud refused.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kumo::cluster::{self, ClusterConfig};
use kumo_cloud_provider::ccm::{CloudControllerManager, Config};
use kumo_cloud_provider::kumo::KumoCloud;
use kumo_testkit::kubectl::{k, k_in};

/// A cluster on a fresh data directory: the API server alone (the Services here need no
/// pods, the nodes are registered by hand), no cloud-controller-manager.
async fn cluster(dir: &Path) -> cluster::Cluster {
    let mut cfg = ClusterConfig::new(dir);
    cfg.port = 0;
    cfg.controller_manager = false;
    cfg.scheduler = false;
    cfg.kubelet = false;
    cluster::start(cfg).await.expect("cluster starts")
}

/// The kumo cloud in `<dir>/cloud`, where `kumo up` keeps it.
async fn cloud(dir: &Path) -> kumo_cloud::CloudServer {
    kumo_cloud::CloudServer::start(kumo_cloud::CloudConfig::new(dir.join("cloud")))
        .await
        .expect("cloud starts")
}

/// A cloud-controller-manager as `kumo up` runs it (its own identity, leader election on
/// kube-system/cloud-controller-manager) with `controllers`.
async fn ccm(
    dir: &Path,
    cloud: &kumo_cloud::CloudServer,
    controllers: &str,
) -> CloudControllerManager {
    let admin = kube_client(&dir.join("admin.conf")).await;
    kumo_cloud_provider::ccm::rbac::ensure(&admin)
        .await
        .unwrap();
    let mut cfg = Config::new(dir.join("cloud-controller-manager.conf"));
    cfg.controllers = vec![controllers.to_owned()];
    cfg.serve = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
    cfg.identity = Some("doctor-test_ccm".into());
    let provider = Arc::new(KumoCloud::new(cloud.client().unwrap()));
    let mut m = CloudControllerManager::start(cfg, provider).await.unwrap();
    tokio::time::timeout(Duration::from_secs(30), m.wait_leading())
        .await
        .expect("the CCM leads");
    m
}

async fn kube_client(path: &Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(path).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(cfg).unwrap()
}

/// `kumo doctor ARGS --data-dir DIR`: (exit code, stdout).
async fn doctor(dir: &Path, args: &[&str]) -> (i32, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_kumo"))
        .arg("doctor")
        .args(args)
        .arg("--data-dir")
        .arg(dir)
        .output()
        .await
        .expect("kumo doctor runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        !stdout.is_empty(),
        "kumo doctor {args:?} printed nothing: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), stdout)
}

/// Runs the doctor until its first line contains every needle (30 s).
async fn doctor_until(dir: &Path, args: &[&str], needles: &[&str]) -> (i32, String) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (code, out) = doctor(dir, args).await;
        let first = out.lines().next().unwrap_or_default();
        if needles.iter().all(|n| first.contains(n)) {
            return (code, out);
        }
        assert!(
            Instant::now() < deadline,
            "the verdict never named {needles:?}:\n{out}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Registers a Node as a kubelet with `--cloud-provider=external` does (the uninitialized
/// taint, no providerID) and makes it Ready.
async fn register_node(admin: &Path, name: &str) {
    let manifest = format!(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n  labels:\n    kubernetes.io/hostname: {name}\nspec:\n  taints:\n  - key: node.cloudprovider.kubernetes.io/uninitialized\n    value: \"true\"\n    effect: NoSchedule\n"
    );
    apply(admin, &manifest).await;
    let now = k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ");
    let patch = format!(
        r#"{{"status":{{"conditions":[{{"type":"Ready","status":"True","reason":"KubeletReady","message":"kubelet is posting ready status","lastHeartbeatTime":"{now}","lastTransitionTime":"{now}"}}]}}}}"#
    );
    let out = k(
        admin,
        &[
            "patch",
            "node",
            name,
            "--subresource=status",
            "--type=merge",
            "-p",
            &patch,
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
}

async fn apply(admin: &Path, manifest: &str) {
    let out = k_in(admin, &["apply", "-f", "-"], Some(manifest)).await;
    assert!(out.ok, "{}", out.stderr);
}

fn lb_service(name: &str, class: Option<&str>) -> String {
    let class = class
        .map(|c| format!("\n  loadBalancerClass: {c}"))
        .unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\nspec:\n  type: LoadBalancer{class}\n  selector:\n    app: {name}\n  ports:\n  - port: 80\n    targetPort: 80\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_ccm_and_a_foreign_class_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let c = cluster(dir).await;
    let admin = c.api.admin_kubeconfig.clone();

    apply(&admin, &lb_service("web", None)).await;
    let (code, out) = doctor(dir, &["service", "web"]).await;
    assert_eq!(code, 1, "{out}");
    let first = out.lines().next().unwrap();
    assert!(
        first.starts_with("PROBLEM: no cloud-controller-manager is running"),
        "{out}"
    );
    assert!(
        out.contains("finalizer service.kubernetes.io/load-balancer-cleanup: absent"),
        "{out}"
    );
    assert!(out.contains("events: none"), "{out}");
    assert!(out.contains("EXTERNAL-IP <pending>"), "{out}");
    assert!(
        out.contains("Lease kube-system/cloud-controller-manager: none"),
        "{out}"
    );
    assert!(out.contains("cloud: no cloud in"), "{out}");

    apply(
        &admin,
        &lb_service("internal", Some("example.com/internal-lb")),
    )
    .await;
    let (code, out) = doctor(dir, &["service", "internal", "-n", "default"]).await;
    assert_eq!(code, 1, "{out}");
    let first = out.lines().next().unwrap();
    assert!(
        first.contains("spec.loadBalancerClass is \"example.com/internal-lb\""),
        "{out}"
    );

    // A ClusterIP Service has no external address to wait for: healthy.
    let out = k(
        &admin,
        &["create", "service", "clusterip", "plain", "--tcp=80:80"],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let (code, out) = doctor(dir, &["service", "plain"]).await;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.starts_with("OK: Service default/plain is of type ClusterIP"),
        "{out}"
    );

    // A Service that is not there.
    let (code, out) = doctor(dir, &["service", "nope"]).await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("Service default/nope does not exist"), "{out}");

    // A node registered with --cloud-provider=external and nobody to initialize it.
    register_node(&admin, "w1").await;
    let (code, out) = doctor(dir, &["node", "w1"]).await;
    assert_eq!(code, 1, "{out}");
    assert!(
        out.starts_with("PROBLEM: no cloud-controller-manager is running: nobody initializes w1"),
        "{out}"
    );
    assert!(
        out.contains("taints: node.cloudprovider.kubernetes.io/uninitialized:NoSchedule"),
        "{out}"
    );
    assert!(out.contains("spec.providerID: <none>"), "{out}");
    let (code, out) = doctor(dir, &["node", "ghost"]).await;
    assert_eq!(code, 1, "{out}");
    assert!(
        out.starts_with("PROBLEM: Node ghost does not exist"),
        "{out}"
    );
}

/// The seeds' environment: a CCM with only the node controllers; nobody reconciles the
/// Service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ccm_without_its_service_controller_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let c = cluster(dir).await;
    let cloud = cloud(dir).await;
    let m = ccm(dir, &cloud, "cloud-node,cloud-node-lifecycle").await;
    apply(&c.api.admin_kubeconfig, &lb_service("hello", None)).await;
    let (code, out) = doctor_until(
        dir,
        &["service", "hello"],
        &[
            "runs without its service controller",
            "--controllers=cloud-node,cloud-node-lifecycle",
        ],
    )
    .await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("holder doctor-test_ccm"), "{out}");
    assert!(
        out.contains("fresh, a cloud-controller-manager is running"),
        "{out}"
    );
    assert!(out.contains("cloud: no load balancer named a"), "{out}");
    assert!(
        out.contains("controllers seen at work (events, cluster-wide): none"),
        "{out}"
    );

    // The node controller of this CCM initializes a node whose instance exists...
    let client = cloud.client().unwrap();
    let req = kumo_cloud::RunInstanceRequest {
        name: Some("w2".into()),
        ..Default::default()
    };
    let i = client.run_instance(&req).await.unwrap();
    client
        .wait_for_instance_state(
            &i.id,
            kumo_cloud::InstanceState::Running,
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    register_node(&c.api.admin_kubeconfig, "w2").await;
    let (code, out) = doctor_until(
        dir,
        &["node", "w2"],
        &["OK: w2 is initialized by the cloud"],
    )
    .await;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(&format!("spec.providerID: kumo://{}/{}", i.zone, i.id)),
        "{out}"
    );
    assert!(out.contains("Synced"), "{out}");
    // ... and now it has been seen at work, while the service controller still has not.
    let (_, out) = doctor(dir, &["service", "hello"]).await;
    assert!(
        out.contains("controllers seen at work (events, cluster-wide): cloud-node-controller\n"),
        "{out}"
    );
    // A node without an instance stays uninitialized.
    register_node(&c.api.admin_kubeconfig, "orphan").await;
    let (code, out) = doctor(dir, &["node", "orphan"]).await;
    assert_eq!(code, 1, "{out}");
    assert!(
        out.starts_with("PROBLEM: the cloud has no instance for orphan"),
        "{out}"
    );
    assert!(out.contains("cloud: no instance named orphan"), "{out}");
    m.shutdown().await.unwrap();
}

/// A deny policy on CreateLoadBalancer: the verdict quotes the cloud's AccessDenied and
/// names the policy; once it is lifted the address is decided and the doctor says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deny_policy_is_quoted_then_lifted() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let c = cluster(dir).await;
    let cloud = cloud(dir).await;
    let client = cloud.client().unwrap();
    let policy = client.deny("CreateLoadBalancer", None).await.unwrap();
    let m = ccm(dir, &cloud, "*").await;
    apply(&c.api.admin_kubeconfig, &lb_service("web", None)).await;
    let (code, out) = doctor_until(
        dir,
        &["service", "web"],
        &[
            "the cloud refused the load balancer",
            "AccessDenied",
            &policy.id,
        ],
    )
    .await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("SyncLoadBalancerFailed"), "{out}");
    assert!(out.contains("EnsuringLoadBalancer"), "{out}");
    assert!(
        out.contains("finalizer service.kubernetes.io/load-balancer-cleanup: present"),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "cloud: deny policy {} Deny CreateLoadBalancer",
            policy.id
        )),
        "{out}"
    );

    client.allow("CreateLoadBalancer", None).await.unwrap();
    // The controller retries with back-off (5 s, then 10 s, ...).
    let deadline = Instant::now() + Duration::from_secs(60);
    let out = loop {
        let (code, out) = doctor(dir, &["service", "web"]).await;
        if code == 0 {
            break out;
        }
        assert!(Instant::now() < deadline, "never decided:\n{out}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(out.starts_with("OK: EXTERNAL-IP is "), "{out}");
    assert!(out.contains("cloud: load balancer a"), "{out}");
    m.shutdown().await.unwrap();
}
