//! The admission plugins LimitRanger, ResourceQuota, NodeRestriction, PersistentVolumeClaimResize and
//! TaintNodesByCondition through the real kubectl: defaults and refusals with
//! kube-apiserver's messages, quota usage written back to the ResourceQuota's status, and
//! what a kubelet's identity (`system:node:<name>`) may and may not do.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{k, k_in, out_json, start, Out};
use kumo_apiserver::pki;

/// A kubeconfig for `user` in `groups`, signed by the server's CA.
fn user_kubeconfig(data_dir: &Path, server: &str, user: &str, groups: &[&str]) -> PathBuf {
    let ca = pki::Ca::load_or_create(&data_dir.join("pki")).unwrap();
    let cert = ca.issue_client(user, groups).unwrap();
    let path = data_dir.join(format!("{}.conf", user.replace(':', "_")));
    std::fs::write(
        &path,
        pki::kubeconfig("kumo", server, &ca.cert_pem, user, &cert),
    )
    .unwrap();
    path
}

fn server_url(admin: &Path) -> String {
    let text = std::fs::read_to_string(admin).unwrap();
    text.lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .unwrap()
        .to_owned()
}

async fn apply(kc: &Path, yaml: &str) -> Out {
    k_in(None, kc, &["create", "-f", "-"], Some(yaml)).await
}

async fn must(kc: &Path, yaml: &str) {
    let out = apply(kc, yaml).await;
    assert!(out.ok, "{yaml}: {}", out.stderr);
}

/// Retries `f` until it succeeds (authorizers learn of new objects through watches).
async fn eventually(what: &str, mut f: impl AsyncFnMut() -> Out) -> Out {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = f().await;
        if out.ok || Instant::now() > deadline {
            assert!(out.ok, "{what}: {}", out.stderr);
            return out;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn pod_yaml(name: &str, resources: &str) -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  containers:
  - name: c
    image: busybox
{resources}"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn limit_ranges_default_and_bound_container_resources() {
    let (server, _dir) = start().await;
    let kc = &server.admin_kubeconfig;
    assert!(k(kc, &["create", "namespace", "lr"]).await.ok);
    // What the service account controller would create.
    k(kc, &["create", "serviceaccount", "default", "-n", "lr"]).await;
    let kc_ns = |args: &[&str]| {
        let mut v = vec!["-n", "lr"];
        v.extend_from_slice(args);
        v.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let limits = "apiVersion: v1
kind: LimitRange
metadata:
  name: limits
  namespace: lr
spec:
  limits:
  - type: Container
    default: {cpu: 500m, memory: 128Mi}
    defaultRequest: {cpu: 100m, memory: 64Mi}
    max: {cpu: '1'}
  - type: PersistentVolumeClaim
    max: {storage: 1Gi}
";
    must(kc, limits).await;

    // A container without resources gets the defaults, and the annotation says so.
    let out = k_in(
        None,
        kc,
        &["create", "-n", "lr", "-f", "-"],
        Some(&pod_yaml("plain", "")),
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let args = kc_ns(&["get", "pod", "plain", "-o", "json"]);
    let pod = out_json(&k(kc, &args.iter().map(String::as_str).collect::<Vec<_>>()).await);
    let res = &pod["spec"]["containers"][0]["resources"];
    assert_eq!(res["limits"]["cpu"], "500m");
    assert_eq!(res["limits"]["memory"], "128Mi");
    assert_eq!(res["requests"]["cpu"], "100m");
    assert_eq!(res["requests"]["memory"], "64Mi");
    assert_eq!(
        pod["metadata"]["annotations"]["kubernetes.io/limit-ranger"],
        "LimitRanger plugin set: cpu, memory request for container c; cpu, memory limit for container c"
    );
    assert_eq!(pod["status"]["qosClass"], "Burstable");

    // What the container sets itself stays, only the rest is defaulted.
    let own = "  resources:\n      limits: {cpu: 200m}\n".replace("  resources", "    resources");
    let out = k_in(
        None,
        kc,
        &["create", "-n", "lr", "-f", "-"],
        Some(&pod_yaml("own", &own)),
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let args = kc_ns(&["get", "pod", "own", "-o", "json"]);
    let pod = out_json(&k(kc, &args.iter().map(String::as_str).collect::<Vec<_>>()).await);
    assert_eq!(
        pod["metadata"]["annotations"]["kubernetes.io/limit-ranger"],
        "LimitRanger plugin set: memory request for container c; memory limit for container c"
    );
    let res = &pod["spec"]["containers"][0]["resources"];
    assert_eq!(res["limits"]["cpu"], "200m");
    assert_eq!(res["requests"]["cpu"], "200m");
    assert_eq!(res["limits"]["memory"], "128Mi");

    // Over the max: refused with kube-apiserver's message.
    let big = "    resources:\n      limits: {cpu: '2'}\n";
    let out = k_in(
        None,
        kc,
        &["create", "-n", "lr", "-f", "-"],
        Some(&pod_yaml("big", big)),
    )
    .await;
    assert!(!out.ok);
    assert!(
        out.stderr.contains(
            "Error from server (Forbidden): error when creating \"STDIN\": pods \"big\" is forbidden: maximum cpu usage per Container is 1, but limit is 2"
        ),
        "{}",
        out.stderr
    );
    let args = kc_ns(&["get", "pod", "big"]);
    assert!(
        !k(kc, &args.iter().map(String::as_str).collect::<Vec<_>>())
            .await
            .ok
    );

    // A claim over the PersistentVolumeClaim max.
    let claim = "apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: claim
  namespace: lr
spec:
  accessModes: [ReadWriteOnce]
  resources:
    requests: {storage: 2Gi}
";
    let out = apply(kc, claim).await;
    assert!(
        out.stderr.contains(
            "persistentvolumeclaims \"claim\" is forbidden: maximum storage usage per PersistentVolumeClaim is 1Gi, but request is 2Gi"
        ),
        "{}",
        out.stderr
    );

    // Other namespaces are not limited.
    k(kc, &["create", "serviceaccount", "default"]).await;
    let out = k_in(
        None,
        kc,
        &["create", "-f", "-"],
        Some(&pod_yaml("big", big)),
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn resource_quotas_count_charge_and_refuse() {
    let (server, _dir) = start().await;
    let kc = &server.admin_kubeconfig;
    assert!(k(kc, &["create", "namespace", "rq"]).await.ok);
    k(kc, &["create", "serviceaccount", "default", "-n", "rq"]).await;
    must(
        kc,
        "apiVersion: v1
kind: ResourceQuota
metadata:
  name: q
  namespace: rq
spec:
  hard: {pods: '2', requests.cpu: '1', configmaps: '1'}
",
    )
    .await;
    // The quota controller's first sync: hard copied, usage counted (none yet).
    let out = k(
        kc,
        &[
            "patch", "resourcequota", "q", "-n", "rq", "--subresource=status", "--type=merge", "-p",
            r#"{"status":{"hard":{"pods":"2","requests.cpu":"1","configmaps":"1"},"used":{"pods":"0","requests.cpu":"0","configmaps":"0"}}}"#,
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);

    let used = |out: Out| out_json(&out)["status"]["used"].clone();
    let req = |cpu: &str| format!("    resources:\n      requests: {{cpu: {cpu}}}\n");
    let create = |name: &str, cpu: &str| {
        let yaml = pod_yaml(name, &req(cpu));
        async move { k_in(None, kc, &["create", "-n", "rq", "-f", "-"], Some(&yaml)).await }
    };

    // A pod that does not say what it requests cannot be charged for requests.cpu.
    let out = k_in(
        None,
        kc,
        &["create", "-n", "rq", "-f", "-"],
        Some(&pod_yaml("bare", "")),
    )
    .await;
    assert!(
        out.stderr.contains(
            "pods \"bare\" is forbidden: failed quota: q: must specify requests.cpu for: c"
        ),
        "{}",
        out.stderr
    );

    // A dry run is checked but charges nothing.
    let yaml = pod_yaml("dry", &req("100m"));
    let out = k_in(
        None,
        kc,
        &["create", "-n", "rq", "--dry-run=server", "-f", "-"],
        Some(&yaml),
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let u = used(k(kc, &["get", "resourcequota", "q", "-n", "rq", "-o", "json"]).await);
    assert_eq!(u["pods"], "0");

    assert!(create("a", "300m").await.ok);
    let out = create("b", "800m").await;
    assert!(
        out.stderr.contains(
            "pods \"b\" is forbidden: exceeded quota: q, requested: requests.cpu=800m, used: requests.cpu=300m, limited: requests.cpu=1"
        ),
        "{}",
        out.stderr
    );
    assert!(create("b", "200m").await.ok);
    let u = used(k(kc, &["get", "resourcequota", "q", "-n", "rq", "-o", "json"]).await);
    assert_eq!(u["pods"], "2");
    assert_eq!(u["requests.cpu"], "500m");
    // The usage is kube-apiserver's own status update.
    let q = out_json(
        &k(
            kc,
            &[
                "get",
                "resourcequota",
                "q",
                "-n",
                "rq",
                "-o",
                "json",
                "--show-managed-fields",
            ],
        )
        .await,
    );
    let entry = q["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["manager"] == "kube-apiserver")
        .cloned()
        .unwrap_or_else(|| panic!("{q}"));
    assert_eq!(entry["subresource"], "status");
    assert_eq!(
        entry["fieldsV1"],
        serde_json::json!({"f:status": {"f:used": {"f:pods": {}, "f:requests.cpu": {}}}})
    );
    let out = create("c", "100m").await;
    assert!(!out.ok);
    assert!(
        out.stderr.contains(
            "Error from server (Forbidden): error when creating \"STDIN\": pods \"c\" is forbidden: exceeded quota: q, requested: pods=1, used: pods=2, limited: pods=2"
        ),
        "{}",
        out.stderr
    );

    // Object counts.
    assert!(k(kc, &["create", "configmap", "one", "-n", "rq"]).await.ok);
    let out = k(kc, &["create", "configmap", "two", "-n", "rq"]).await;
    assert!(
        out.stderr.contains(
            "configmaps \"two\" is forbidden: exceeded quota: q, requested: configmaps=1, used: configmaps=1, limited: configmaps=1"
        ),
        "{}",
        out.stderr
    );
    let u = used(k(kc, &["get", "resourcequota", "q", "-n", "rq", "-o", "json"]).await);
    assert_eq!(u["configmaps"], "1");
    // Namespaces without a quota are free.
    assert!(k(kc, &["create", "configmap", "two"]).await.ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn new_nodes_are_tainted_not_ready() {
    let (server, _dir) = start().await;
    let kc = &server.admin_kubeconfig;
    must(
        kc,
        "apiVersion: v1
kind: Node
metadata:
  name: fresh
spec:
  taints:
  - {key: dedicated, value: db, effect: NoExecute}
",
    )
    .await;
    let node = out_json(&k(kc, &["get", "node", "fresh", "-o", "json"]).await);
    assert_eq!(
        node["spec"]["taints"],
        serde_json::json!([
            {"key": "dedicated", "value": "db", "effect": "NoExecute"},
            {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"},
        ])
    );
    // The taint is admission's, not the creator's: kubectl does not own it.
    must(kc, "apiVersion: v1\nkind: Node\nmetadata:\n  name: bare\n").await;
    let bare = out_json(
        &k(
            kc,
            &["get", "node", "bare", "-o", "json", "--show-managed-fields"],
        )
        .await,
    );
    assert_eq!(
        bare["spec"]["taints"][0]["key"],
        "node.kubernetes.io/not-ready"
    );
    assert!(
        !bare["metadata"]["managedFields"]
            .to_string()
            .contains("f:taints"),
        "{bare}"
    );
    // Only at creation: the node lifecycle controller removes it later, and it stays off.
    let out = k(
        kc,
        &[
            "taint",
            "node",
            "fresh",
            "node.kubernetes.io/not-ready:NoSchedule-",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let node = out_json(&k(kc, &["get", "node", "fresh", "-o", "json"]).await);
    assert_eq!(node["spec"]["taints"].as_array().map(Vec::len), Some(1));
}

fn mirror_pod(name: &str, node: &str, node_uid: &str) -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: default
  annotations:
    kubernetes.io/config.mirror: mirror-hash
  ownerReferences:
  - {{apiVersion: v1, kind: Node, name: {node}, uid: {node_uid}, controller: true}}
spec:
  nodeName: {node}
  containers:
  - name: c
    image: busybox
"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nodes_create_only_their_own_mirror_pods() {
    let (server, dir) = start().await;
    let admin = &server.admin_kubeconfig;
    let url = server_url(admin);
    for n in ["n1", "n2"] {
        must(
            admin,
            &format!("apiVersion: v1\nkind: Node\nmetadata:\n  name: {n}\n"),
        )
        .await;
    }
    let uid = |n: &'static str| async move {
        out_json(&k(admin, &["get", "node", n, "-o", "json"]).await)["metadata"]["uid"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let (uid1, uid2) = (uid("n1").await, uid("n2").await);
    k(admin, &["create", "serviceaccount", "default"]).await;
    let node = user_kubeconfig(dir.path(), &url, "system:node:n1", &["system:nodes"]);

    // Not a mirror pod.
    let out = apply(&node, &pod_yaml("p", "")).await;
    assert!(!out.ok);
    assert!(
        out.stderr.contains(
            "pods \"p\" is forbidden: pod does not have \"kubernetes.io/config.mirror\" annotation, node \"n1\" can only create mirror pods"
        ),
        "{}",
        out.stderr
    );
    // A mirror pod for another node.
    let out = apply(&node, &mirror_pod("other", "n2", &uid2)).await;
    assert!(
        out.stderr.contains(
            "pods \"other\" is forbidden: node \"n1\" can only create pods with spec.nodeName set to itself"
        ),
        "{}",
        out.stderr
    );
    // Owned by the wrong node object.
    let wrong = mirror_pod("wrong", "n1", &uid2);
    let out = apply(&node, &wrong).await;
    assert!(
        out.stderr.contains(&format!(
            "pods \"wrong\" is forbidden: node n1 UID mismatch: expected {uid2} got {uid1}"
        )),
        "{}",
        out.stderr
    );
    // Referring to a configmap, or to a claim.
    let cm = mirror_pod("cm", "n1", &uid1).replace(
        "    image: busybox\n",
        "    image: busybox\n    envFrom:\n    - configMapRef: {name: s}\n",
    );
    let out = apply(&node, &cm).await;
    assert!(
        out.stderr.contains(
            "pods \"cm\" is forbidden: node \"n1\" can not create pods that reference configmaps"
        ),
        "{}",
        out.stderr
    );
    let pvc = mirror_pod("pvc", "n1", &uid1).replace(
        "  containers:\n",
        "  volumes:\n  - name: v\n    persistentVolumeClaim: {claimName: c}\n  containers:\n",
    );
    let out = apply(&node, &pvc).await;
    assert!(
        out.stderr.contains("pods \"pvc\" is forbidden: node \"n1\" can not create pods that reference persistentvolumeclaims"),
        "{}",
        out.stderr
    );
    // Without the owner reference.
    let orphan: String = mirror_pod("orphan", "n1", &uid1)
        .lines()
        .filter(|l| !l.contains("ownerReferences") && !l.contains("kind: Node,"))
        .map(|l| format!("{l}\n"))
        .collect();
    let out = apply(&node, &orphan).await;
    assert!(
        out.stderr.contains("pods \"orphan\" is forbidden: node \"n1\" can only create pods with an owner reference set to itself"),
        "{}",
        out.stderr
    );
    // Its own mirror pod: created, without a service account.
    eventually("mirror pod", async || {
        apply(&node, &mirror_pod("mine", "n1", &uid1)).await
    })
    .await;
    let pod = out_json(&k(admin, &["get", "pod", "mine", "-o", "json"]).await);
    assert_eq!(pod["spec"]["nodeName"], "n1");
    assert!(pod["spec"].get("serviceAccountName").is_none(), "{pod}");

    // Its own Node, but not its taints; not another Node.
    let out = k(
        &node,
        &[
            "label",
            "node",
            "n1",
            "node-role.kubernetes.io/control-plane=",
        ],
    )
    .await;
    assert!(
        out.stderr.contains("nodes \"n1\" is forbidden: is not allowed to modify labels: node-role.kubernetes.io/control-plane"),
        "{}",
        out.stderr
    );
    let out = k(
        &node,
        &[
            "taint",
            "node",
            "n1",
            "node.kubernetes.io/not-ready:NoSchedule-",
        ],
    )
    .await;
    assert!(
        out.stderr
            .contains("nodes \"n1\" is forbidden: node \"n1\" is not allowed to modify taints"),
        "{}",
        out.stderr
    );
    let out = k(&node, &["label", "node", "n1", "example.com/disk=ssd"]).await;
    assert!(out.ok, "{}", out.stderr);
    let out = k(&node, &["label", "node", "n2", "example.com/disk=ssd"]).await;
    assert!(!out.ok);
    assert!(out.stderr.contains("Forbidden"), "{}", out.stderr);

    // Deleting: its own pods only.
    must(admin, &mirror_pod("theirs", "n2", &uid2)).await;
    let out = k(&node, &["delete", "pod", "theirs", "--wait=false"]).await;
    assert!(
        out.stderr.contains("Error from server (Forbidden): pods \"theirs\" is forbidden: node \"n1\" can only delete pods with spec.nodeName set to itself"),
        "{}",
        out.stderr
    );
    let out = k(&node, &["delete", "pod", "mine", "--wait=false"]).await;
    assert!(out.ok, "{}", out.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nodes_register_and_renew_only_as_themselves() {
    let (server, dir) = start().await;
    let admin = &server.admin_kubeconfig;
    let url = server_url(admin);
    let node = user_kubeconfig(dir.path(), &url, "system:node:n3", &["system:nodes"]);

    // Registration with labels only the cluster may set.
    let out = apply(
        &node,
        "apiVersion: v1
kind: Node
metadata:
  name: n3
  labels:
    node-role.kubernetes.io/master: ''
    foo.node-restriction.kubernetes.io/a: b
    kubernetes.io/hostname: n3
",
    )
    .await;
    assert!(
        out.stderr.contains(
            "nodes \"n3\" is forbidden: node \"n3\" is not allowed to set the following labels: foo.node-restriction.kubernetes.io/a, node-role.kubernetes.io/master"
        ),
        "{}",
        out.stderr
    );
    let out = eventually("register", async || {
        apply(
            &node,
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: n3\n  labels:\n    kubernetes.io/hostname: n3\n",
        )
        .await
    })
    .await;
    drop(out);
    let n = out_json(&k(admin, &["get", "node", "n3", "-o", "json"]).await);
    assert_eq!(
        n["spec"]["taints"][0]["key"],
        "node.kubernetes.io/not-ready"
    );
    let out = k(
        &node,
        &[
            "patch", "node", "n3", "--type=merge", "-p",
            r#"{"metadata":{"ownerReferences":[{"apiVersion":"v1","kind":"Node","name":"x","uid":"1"}]}}"#,
        ],
    )
    .await;
    assert!(
        out.stderr.contains(
            "nodes \"n3\" is forbidden: node \"n3\" is not allowed to modify ownerReferences"
        ),
        "{}",
        out.stderr
    );
    assert!(k(&node, &["annotate", "node", "n3", "a=b"]).await.ok);

    // Leases: its own, in kube-node-lease.
    let lease = |name: &str, ns: &str| {
        format!(
            "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata: {{name: {name}, namespace: {ns}}}\nspec: {{holderIdentity: {name}}}\n"
        )
    };
    let out = apply(&node, &lease("n4", "kube-node-lease")).await;
    assert!(
        out.stderr.contains(
            "leases.coordination.k8s.io \"n4\" is forbidden: can only access node lease with the same name as the requesting node"
        ),
        "{}",
        out.stderr
    );
    let out = apply(&node, &lease("n3", "kube-node-lease")).await;
    assert!(out.ok, "{}", out.stderr);

    // CSINodes: its own.
    let csinode = |name: &str| {
        format!("apiVersion: storage.k8s.io/v1\nkind: CSINode\nmetadata: {{name: {name}}}\nspec: {{drivers: []}}\n")
    };
    let out = apply(&node, &csinode("n4")).await;
    assert!(
        out.stderr.contains(
            "csinodes.storage.k8s.io \"n4\" is forbidden: can only access CSINode with the same name as the requesting node"
        ),
        "{}",
        out.stderr
    );
    let out = apply(&node, &csinode("n3")).await;
    assert!(out.ok, "{}", out.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quota_holds_under_concurrent_creates() {
    let (server, _dir) = start().await;
    let kc = &server.admin_kubeconfig;
    assert!(k(kc, &["create", "namespace", "race"]).await.ok);
    must(
        kc,
        "apiVersion: v1\nkind: ResourceQuota\nmetadata: {name: cms, namespace: race}\nspec:\n  hard: {count/configmaps: '3'}\n",
    )
    .await;
    let out = k(
        kc,
        &[
            "patch",
            "resourcequota",
            "cms",
            "-n",
            "race",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"hard":{"count/configmaps":"3"},"used":{"count/configmaps":"0"}}}"#,
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    // Eight writers race for three units: the compare-and-swap of the quota's usage lets
    // exactly three through.
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let kc = kc.clone();
            tokio::spawn(async move {
                let name = format!("cm{i}");
                k(&kc, &["create", "configmap", &name, "-n", "race"]).await
            })
        })
        .collect();
    let mut created = 0;
    for t in tasks {
        let out = t.await.unwrap();
        if out.ok {
            created += 1;
        } else {
            assert!(
                out.stderr.contains("exceeded quota: cms, requested: count/configmaps=1, used: count/configmaps=3, limited: count/configmaps=3"),
                "{}",
                out.stderr
            );
        }
    }
    assert_eq!(created, 3);
    let q = out_json(
        &k(
            kc,
            &["get", "resourcequota", "cms", "-n", "race", "-o", "json"],
        )
        .await,
    );
    assert_eq!(q["status"]["used"]["count/configmaps"], "3");
    let cms = out_json(&k(kc, &["get", "configmaps", "-n", "race", "-o", "json"]).await);
    let ours = cms["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["metadata"]["name"].as_str().unwrap().starts_with("cm"))
        .count();
    assert_eq!(ours, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_classes_add_overhead_and_scheduling() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    must(
        &kc,
        "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: default\n",
    )
    .await;
    must(
        &kc,
        "apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata:\n  name: kata\nhandler: kata\noverhead:\n  podFixed:\n    cpu: 250m\n    memory: 120Mi\nscheduling:\n  nodeSelector:\n    runtime: kata\n  tolerations:\n  - key: kata\n    operator: Exists\n    effect: NoSchedule\n",
    )
    .await;
    must(
        &kc,
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  runtimeClassName: kata\n  containers:\n  - name: c\n    image: nginx\n",
    )
    .await;
    let pod = out_json(&k(&kc, &["get", "pod", "p", "-o", "json"]).await);
    assert_eq!(pod["spec"]["overhead"]["cpu"], "250m");
    assert_eq!(pod["spec"]["nodeSelector"]["runtime"], "kata");
    assert!(pod["spec"]["tolerations"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["key"] == "kata"));
    // A class that does not exist: upstream's refusal.
    let out = apply(
        &kc,
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: q\nspec:\n  runtimeClassName: missing\n  containers:\n  - name: c\n    image: nginx\n",
    )
    .await;
    assert!(
        out.stderr
            .contains("pods \"q\" is forbidden: pod rejected: RuntimeClass \"missing\" not found"),
        "{}",
        out.stderr
    );
}

/// PersistentVolumeClaimResize: a claim asks for more only in a class that allows volume
/// expansion; anything else is refused with kube-apiserver's words and the claim is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_grows_only_in_an_expandable_class() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    for (name, expand) in [("fixed", false), ("elastic", true)] {
        must(
            &kc,
            &format!("apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n  name: {name}\nprovisioner: example.com/disk\nallowVolumeExpansion: {expand}\n"),
        )
        .await;
        must(
            &kc,
            &format!("apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: {name}\nspec:\n  storageClassName: {name}\n  accessModes: [ReadWriteOnce]\n  resources:\n    requests: {{storage: 1Gi}}\n"),
        )
        .await;
    }
    let grow = r#"{"spec":{"resources":{"requests":{"storage":"2Gi"}}}}"#;
    let out = k(&kc, &["patch", "pvc", "fixed", "-p", grow]).await;
    assert!(!out.ok);
    assert!(
        out.stderr.contains("persistentvolumeclaims \"fixed\" is forbidden: only dynamically provisioned pvc can be resized and the storageclass that provisions the pvc must support resize"),
        "{}",
        out.stderr
    );
    let kept = k(
        &kc,
        &[
            "get",
            "pvc",
            "fixed",
            "-o",
            "jsonpath={.spec.resources.requests.storage}",
        ],
    )
    .await;
    assert_eq!(kept.stdout, "1Gi");
    let out = k(&kc, &["patch", "pvc", "elastic", "-p", grow]).await;
    assert!(out.ok, "{}", out.stderr);
    let grown = k(
        &kc,
        &[
            "get",
            "pvc",
            "elastic",
            "-o",
            "jsonpath={.spec.resources.requests.storage}",
        ],
    )
    .await;
    assert_eq!(grown.stdout, "2Gi");
}
