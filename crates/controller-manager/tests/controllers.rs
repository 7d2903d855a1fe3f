//! The controller-manager against an in-process `kumo apiserver`, driven with kubectl.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use kumo_controller_manager::controllers::rootca::DESCRIPTION;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn namespaces_get_default_serviceaccount_and_root_ca() {
    let (server, dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    let cm = start_cm(&kc, &["*"]).await;
    let ca = std::fs::read_to_string(dir.path().join("pki/ca.crt")).unwrap();

    assert!(k(&kc, &["create", "namespace", "team-a"]).await.ok);
    let sa = eventually(20, "default ServiceAccount", || {
        get(&kc, &["sa", "default", "-n", "team-a"])
    })
    .await;
    let cm_obj = eventually(20, "kube-root-ca.crt", || {
        get(&kc, &["configmap", "kube-root-ca.crt", "-n", "team-a"])
    })
    .await;
    assert_eq!(cm_obj["data"]["ca.crt"], ca.as_str());
    assert_eq!(
        cm_obj["metadata"]["annotations"]["kubernetes.io/description"],
        DESCRIPTION
    );
    // The namespaces that existed before the start get them too.
    eventually(20, "default SA in kube-public", || {
        get(&kc, &["sa", "default", "-n", "kube-public"])
    })
    .await;
    eventually(20, "root CA in kube-system", || {
        get(&kc, &["configmap", "kube-root-ca.crt", "-n", "kube-system"])
    })
    .await;

    // A deleted ServiceAccount is created again (a new object).
    let uid = sa["metadata"]["uid"].as_str().unwrap().to_owned();
    assert!(
        k(&kc, &["delete", "sa", "default", "-n", "team-a"])
            .await
            .ok
    );
    eventually(20, "default SA recreated", || async {
        get(&kc, &["sa", "default", "-n", "team-a"])
            .await
            .filter(|s| s["metadata"]["uid"] != uid.as_str())
    })
    .await;

    // A changed CA bundle is put back; so is a removed annotation.
    let out = k(
        &kc,
        &[
            "patch", "configmap", "kube-root-ca.crt", "-n", "team-a", "--type=merge", "-p",
            r#"{"data":{"ca.crt":"bogus"},"metadata":{"annotations":{"kubernetes.io/description":null}}}"#,
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    eventually(20, "root CA restored", || async {
        get(&kc, &["configmap", "kube-root-ca.crt", "-n", "team-a"])
            .await
            .filter(|c| {
                c["data"]["ca.crt"] == ca.as_str()
                    && c["metadata"]["annotations"]["kubernetes.io/description"] == DESCRIPTION
            })
    })
    .await;
    // A deleted one is created again.
    assert!(
        k(
            &kc,
            &["delete", "configmap", "kube-root-ca.crt", "-n", "team-a"]
        )
        .await
        .ok
    );
    eventually(20, "root CA recreated", || {
        get(&kc, &["configmap", "kube-root-ca.crt", "-n", "team-a"])
    })
    .await;

    // /healthz on the secure port (self-signed HTTPS).
    let addr = cm.healthz_addr.expect("serving");
    let out = tokio::process::Command::new("curl")
        .args(["-sk", &format!("https://{addr}/healthz")])
        .output()
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok");
    let out = tokio::process::Command::new("curl")
        .args(["-sk", &format!("https://{addr}/healthz?verbose")])
        .output()
        .await
        .unwrap();
    let body = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(body.starts_with("[+]leaderElection ok\n"), "{body}");
    for c in [
        "clusterrole-aggregation-controller",
        "namespace-controller",
        "root-ca-certificate-publisher-controller",
        "serviceaccount-controller",
    ] {
        assert!(body.contains(&format!("[+]{c} ok\n")), "{body}");
    }
    assert!(body.ends_with("healthz check passed\n"), "{body}");
    // /readyz and /livez (kubeadm's scheduler probes) answer the same checks in their
    // own names; anything else is not found.
    for (path, want) in [
        ("/readyz?verbose", "readyz check passed\n"),
        ("/livez/leaderElection", "ok"),
        ("/livez/nope", "404 page not found\n"),
        // Anything beyond health is for whom the API server allows, not for anonymous.
        (
            "/healthzz",
            r#""message":"forbidden: User \"system:anonymous\" cannot get path \"/healthzz\"","reason":"Forbidden","details":{},"code":403}"#,
        ),
    ] {
        let out = tokio::process::Command::new("curl")
            .args(["-sk", &format!("https://{addr}{path}")])
            .output()
            .await
            .unwrap();
        let body = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(body.ends_with(want), "{path}: {body}");
    }
    // /metrics under delegated authentication and authorization, as a Prometheus
    // scraper or the e2e MetricsGrabber reads it: the admin's client certificate may,
    // anonymous may not, a bad token is refused.
    let metrics = |token: Option<&str>| {
        let kc = kc.clone();
        let token = token.map(str::to_owned);
        async move {
            let kubeconfig = kube::config::Kubeconfig::read_from(&kc).unwrap();
            let mut cfg = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .unwrap();
            cfg.cluster_url = format!("https://{addr}").parse().unwrap();
            cfg.accept_invalid_certs = true;
            cfg.root_cert = None;
            if let Some(t) = token {
                cfg.auth_info = kube::config::AuthInfo {
                    token: Some(t.into()),
                    ..Default::default()
                };
            }
            let client = kube::Client::try_from(cfg).unwrap();
            let req = http::Request::get("/metrics").body(Vec::new()).unwrap();
            client.request_text(req).await
        }
    };
    let text = metrics(None).await.expect("the admin reads /metrics");
    assert!(
        text.contains("workqueue_adds_total{name=\"serviceaccount\"} "),
        "{text}"
    );
    assert!(
        text.contains("leader_election_master_status{name=\"kube-controller-manager\"} 1\n"),
        "{text}"
    );
    match metrics(Some("bogus")).await {
        Err(kube::Error::Api(s)) => assert_eq!((s.code, s.reason.as_str()), (401, "Unauthorized")),
        other => panic!("a bad token: {other:?}"),
    }
    let out = tokio::process::Command::new("curl")
        .args(["-sk", &format!("https://{addr}/metrics")])
        .output()
        .await
        .unwrap();
    let body = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        body.contains(r#"forbidden: User \"system:anonymous\" cannot get path \"/metrics\""#),
        "{body}"
    );
    cm.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn aggregated_clusterroles_get_their_rules() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    // The bootstrap policy stores the aggregated roles without rules.
    let view = get(&kc, &["clusterrole", "view"]).await.unwrap();
    assert!(
        view["rules"].as_array().is_none_or(|r| r.is_empty()),
        "{view}"
    );

    let cm = start_cm(&kc, &["*"]).await;
    let view = eventually(20, "view has rules", || async {
        get(&kc, &["clusterrole", "view"])
            .await
            .filter(|v| v["rules"].as_array().is_some_and(|r| !r.is_empty()))
    })
    .await;
    let rules = view["rules"].as_array().unwrap();
    // system:aggregate-to-view's first rule comes first.
    assert!(
        rules.iter().any(|r| r["resources"]
            .as_array()
            .is_some_and(|res| res.iter().any(|x| x == "pods"))),
        "{view}"
    );
    let shown = get(&kc, &["clusterrole", "view", "--show-managed-fields"])
        .await
        .unwrap();
    let managers: Vec<&str> = shown["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["manager"].as_str())
        .collect();
    assert!(
        managers.contains(&"clusterrole-aggregation-controller"),
        "{managers:?}"
    );
    for role in ["admin", "edit"] {
        eventually(20, "admin/edit have rules", || async {
            get(&kc, &["clusterrole", role])
                .await
                .filter(|v| v["rules"].as_array().is_some_and(|r| !r.is_empty()))
        })
        .await;
    }

    // A new role labelled for view is aggregated into view, and taken out again on delete.
    let role = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: widgets-view
  labels:
    rbac.authorization.k8s.io/aggregate-to-view: "true"
rules:
- apiGroups: ["example.com"]
  resources: ["widgets"]
  verbs: ["get", "list", "watch"]
"#;
    let out = k_in(&kc, &["apply", "-f", "-"], Some(role)).await;
    assert!(out.ok, "{}", out.stderr);
    let has_widgets = |v: &serde_json::Value| {
        v["rules"].as_array().is_some_and(|r| {
            r.iter()
                .any(|x| x["resources"] == serde_json::json!(["widgets"]))
        })
    };
    let before = rules.len();
    let view = eventually(20, "widgets in view", || async {
        get(&kc, &["clusterrole", "view"]).await.filter(has_widgets)
    })
    .await;
    assert_eq!(view["rules"].as_array().unwrap().len(), before + 1);
    assert!(k(&kc, &["delete", "clusterrole", "widgets-view"]).await.ok);
    eventually(20, "widgets gone from view", || async {
        get(&kc, &["clusterrole", "view"])
            .await
            .filter(|v| !has_widgets(v) && v["rules"].as_array().is_some_and(|r| r.len() == before))
    })
    .await;
    cm.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deleting_a_namespace_removes_its_content() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    let cm = start_cm(&kc, &["*"]).await;
    assert!(k(&kc, &["create", "namespace", "doomed"]).await.ok);
    assert!(
        k(
            &kc,
            &[
                "create",
                "configmap",
                "settings",
                "-n",
                "doomed",
                "--from-literal=a=b"
            ]
        )
        .await
        .ok
    );
    let out = k(
        &kc,
        &[
            "create",
            "deployment",
            "web",
            "-n",
            "doomed",
            "--image=nginx",
            "--replicas=2",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);

    let started = Instant::now();
    // kubectl waits until the namespace is gone.
    let out = k(&kc, &["delete", "namespace", "doomed", "--timeout=60s"]).await;
    assert!(out.ok, "{}", out.stderr);
    let took = started.elapsed();
    assert!(took < Duration::from_secs(30), "took {took:?}");
    let out = k(&kc, &["get", "namespace", "doomed"]).await;
    assert!(!out.ok);
    assert!(
        out.stderr.contains("NotFound") || out.stderr.contains("not found"),
        "{}",
        out.stderr
    );
    // Its content went with it: a namespace of the same name starts empty.
    assert!(k(&kc, &["create", "namespace", "doomed"]).await.ok);
    let out = k(
        &kc,
        &[
            "get",
            "deployments,configmap/settings",
            "-n",
            "doomed",
            "-o",
            "name",
        ],
    )
    .await;
    assert!(
        !out.stdout.contains("deployment.apps/web"),
        "{}",
        out.stdout
    );
    assert!(!out.stdout.contains("configmap/settings"), "{}", out.stdout);
    cm.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn namespace_conditions_report_finalizers_remaining() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    let cm = start_cm(&kc, &["*"]).await;
    assert!(k(&kc, &["create", "namespace", "held"]).await.ok);
    let held = r#"
apiVersion: v1
kind: ConfigMap
metadata:
  name: held
  namespace: held
  finalizers: ["example.com/hold"]
"#;
    assert!(k_in(&kc, &["apply", "-f", "-"], Some(held)).await.ok);
    assert!(
        k(&kc, &["delete", "namespace", "held", "--wait=false"])
            .await
            .ok
    );

    let ns = eventually(30, "finalizers-remaining condition", || async {
        get(&kc, &["namespace", "held"]).await.filter(|n| {
            n["status"]["conditions"].as_array().is_some_and(|c| {
                c.iter()
                    .any(|c| c["type"] == "NamespaceFinalizersRemaining" && c["status"] == "True")
            })
        })
    })
    .await;
    assert_eq!(ns["status"]["phase"], "Terminating");
    let conds = ns["status"]["conditions"].as_array().unwrap();
    let by_type = |t: &str| conds.iter().find(|c| c["type"] == t).cloned().unwrap();
    let c = by_type("NamespaceFinalizersRemaining");
    assert_eq!(c["reason"], "SomeFinalizersRemain");
    assert_eq!(
        c["message"],
        "Some content in the namespace has finalizers remaining: example.com/hold in 1 resource instances"
    );
    let c = by_type("NamespaceContentRemaining");
    assert_eq!(c["reason"], "SomeResourcesRemain");
    assert_eq!(
        c["message"],
        "Some resources are remaining: configmaps. has 1 resource instances"
    );
    let c = by_type("NamespaceDeletionDiscoveryFailure");
    assert_eq!(c["status"], "False");
    assert_eq!(c["reason"], "ResourcesDiscovered");
    assert_eq!(c["message"], "All resources successfully discovered");
    let c = by_type("NamespaceDeletionContentFailure");
    assert_eq!(c["reason"], "ContentDeleted");
    let c = by_type("NamespaceDeletionGroupVersionParsingFailure");
    assert_eq!(c["reason"], "ParsedGroupVersions");

    // Releasing the finalizer lets the namespace go.
    let out = k(
        &kc,
        &[
            "patch",
            "configmap",
            "held",
            "-n",
            "held",
            "--type=merge",
            "-p",
            r#"{"metadata":{"finalizers":null}}"#,
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    eventually(40, "namespace gone", || async {
        get(&kc, &["namespace", "held"])
            .await
            .is_none()
            .then_some(())
    })
    .await;
    cm.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn controllers_flag_switches_one_off() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    let cm = start_cm(&kc, &["*", "-serviceaccount"]).await;
    assert!(k(&kc, &["create", "namespace", "quiet"]).await.ok);
    // The other controllers run ...
    eventually(20, "kube-root-ca.crt", || {
        get(&kc, &["configmap", "kube-root-ca.crt", "-n", "quiet"])
    })
    .await;
    // ... but no ServiceAccount appears.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(get(&kc, &["sa", "default", "-n", "quiet"]).await.is_none());
    cm.shutdown().await.unwrap();

    // An unknown name is refused with upstream's message.
    let err = kumo_controller_manager::ControllerManager::start(cm_config(&kc, &["*", "-nope"]))
        .await
        .err()
        .expect("unknown controller refused");
    assert_eq!(
        err.to_string(),
        "\"nope\" is not in the list of known controllers"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn standby_waits_for_the_lease_then_takes_over() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    // The leader runs everything but the serviceaccount controller; the standby runs all.
    let mut first = start_cm(&kc, &["*", "-serviceaccount"]).await;
    first.wait_leading().await;
    let lease = get(
        &kc,
        &["lease", "kube-controller-manager", "-n", "kube-system"],
    )
    .await
    .unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], first.identity.as_str());
    assert_eq!(lease["spec"]["leaseDurationSeconds"], 15);
    assert!(first.identity.contains('_'), "{}", first.identity);
    let second = start_cm(&kc, &["*"]).await;

    assert!(k(&kc, &["create", "namespace", "standby"]).await.ok);
    eventually(20, "kube-root-ca.crt from the leader", || {
        get(&kc, &["configmap", "kube-root-ca.crt", "-n", "standby"])
    })
    .await;
    // The standby holds back: no ServiceAccount, and the lease keeps its holder (renewed).
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!second.is_leader());
    assert!(get(&kc, &["sa", "default", "-n", "standby"])
        .await
        .is_none());
    let again = get(
        &kc,
        &["lease", "kube-controller-manager", "-n", "kube-system"],
    )
    .await
    .unwrap();
    assert_eq!(again["spec"]["holderIdentity"], first.identity.as_str());
    assert_ne!(again["spec"]["renewTime"], lease["spec"]["renewTime"]);

    // The leader stops without releasing; the standby takes over once the lease expires.
    first.shutdown().await.unwrap();
    let stopped = Instant::now();
    eventually(40, "standby leads", || async {
        get(
            &kc,
            &["lease", "kube-controller-manager", "-n", "kube-system"],
        )
        .await
        .filter(|l| l["spec"]["holderIdentity"] == second.identity.as_str())
    })
    .await;
    assert!(
        stopped.elapsed() >= Duration::from_secs(10),
        "took over too early"
    );
    let lease = get(
        &kc,
        &["lease", "kube-controller-manager", "-n", "kube-system"],
    )
    .await
    .unwrap();
    assert_eq!(lease["spec"]["leaseTransitions"], 1);
    eventually(20, "default SA from the new leader", || {
        get(&kc, &["sa", "default", "-n", "standby"])
    })
    .await;
    assert!(second.is_leader());
    // The LeaderElection events name each holder.
    let events = json(
        &k(
            &kc,
            &[
                "get",
                "events",
                "-n",
                "kube-system",
                "--field-selector",
                "reason=LeaderElection",
                "-o",
                "json",
            ],
        )
        .await,
    );
    let msgs: Vec<&str> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["message"].as_str())
        .collect();
    assert!(
        msgs.contains(&format!("{} became leader", second.identity).as_str()),
        "{msgs:?}"
    );
    second.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn controllers_act_as_their_service_accounts() {
    let (server, dir) = start_apiserver().await;
    let admin = server.admin_kubeconfig.clone();
    // kubeadm's identity (system:kube-controller-manager) with per-controller credentials.
    let own = dir.path().join("controller-manager.conf");
    assert!(
        own.exists(),
        "the API server writes controller-manager.conf"
    );
    let mut cfg = cm_config(&own, &["*"]);
    cfg.use_service_account_credentials = true;
    let cm = kumo_controller_manager::ControllerManager::start(cfg)
        .await
        .unwrap();

    assert!(k(&admin, &["create", "namespace", "sa-creds"]).await.ok);
    eventually(30, "default SA", || {
        get(&admin, &["sa", "default", "-n", "sa-creds"])
    })
    .await;
    eventually(30, "kube-root-ca.crt", || {
        get(&admin, &["configmap", "kube-root-ca.crt", "-n", "sa-creds"])
    })
    .await;
    eventually(30, "view has rules", || async {
        get(&admin, &["clusterrole", "view"])
            .await
            .filter(|v| v["rules"].as_array().is_some_and(|r| !r.is_empty()))
    })
    .await;
    // Each controller got its ServiceAccount in kube-system, as upstream names them.
    for sa in [
        "service-account-controller",
        "root-ca-cert-publisher",
        "clusterrole-aggregation-controller",
        "namespace-controller",
    ] {
        assert!(
            get(&admin, &["sa", sa, "-n", "kube-system"])
                .await
                .is_some(),
            "{sa}"
        );
    }
    // (system:kube-controller-manager itself may not create ConfigMaps nor patch
    // ClusterRoles, so the writes above were made with the controllers' tokens.)
    // Namespace deletion works under namespace-controller's role.
    assert!(
        k(
            &admin,
            &[
                "create",
                "configmap",
                "c",
                "-n",
                "sa-creds",
                "--from-literal=a=b"
            ]
        )
        .await
        .ok
    );
    let out = k(
        &admin,
        &["delete", "namespace", "sa-creds", "--timeout=60s"],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    cm.shutdown().await.unwrap();
}
