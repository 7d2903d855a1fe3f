#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The API server identity Lease (with its garbage collector and health check names) and
//! the typed round trip that drops empty `omitempty` fields, through the real kubectl.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use common::{k, k_in, out_json, start};
use kumo_apiserver::negotiate::Accept;
use kumo_apiserver::registry::Registry;
use kumo_apiserver::rest::{Request, Rest};
use kumo_storage::embedded::{EmbeddedConfig, EmbeddedStore};
use kumo_storage::Store;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_lease_is_kept_and_renewed() {
    let (server, _dir) = start().await;
    let kc = &server.admin_kubeconfig;
    let name = kumo_apiserver::identity::lease_name(&kumo_apiserver::identity::hostname());
    // The controller writes it right after start.
    let mut lease = serde_json::Value::Null;
    for _ in 0..50 {
        let out = k(
            kc,
            &[
                "-n",
                "kube-system",
                "get",
                "lease",
                &name,
                "-o",
                "json",
                "--show-managed-fields",
            ],
        )
        .await;
        if out.ok {
            lease = out_json(&out);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(lease["metadata"]["name"], json!(name));
    let labels = &lease["metadata"]["labels"];
    assert_eq!(labels["apiserver.kubernetes.io/identity"], "kube-apiserver");
    assert_eq!(
        labels["kubernetes.io/hostname"],
        json!(kumo_apiserver::identity::hostname())
    );
    assert_eq!(
        lease["metadata"]["annotations"]["kubernetes.io/peer-advertise-address"],
        json!(server.local_addr.to_string())
    );
    let holder = lease["spec"]["holderIdentity"].as_str().unwrap().to_owned();
    let uuid = holder.strip_prefix(&format!("{name}_")).unwrap();
    assert_eq!(uuid.len(), 36, "{holder}");
    assert_eq!(lease["spec"]["leaseDurationSeconds"], 3600);
    let renewed = lease["spec"]["renewTime"].as_str().unwrap().to_owned();
    assert_eq!(
        renewed.len(),
        "2026-01-01T00:00:00.000000Z".len(),
        "{renewed}"
    );
    let managers = &lease["metadata"]["managedFields"];
    assert_eq!(managers[0]["manager"], "kube-apiserver");
    assert_eq!(managers[0]["operation"], "Update");

    // Listed by selector as on a kubeadm cluster.
    let out = k(
        kc,
        &[
            "-n",
            "kube-system",
            "get",
            "lease",
            "-l",
            "apiserver.kubernetes.io/identity=kube-apiserver",
            "-o",
            "name",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(
        out.stdout.trim(),
        format!("lease.coordination.k8s.io/{name}")
    );

    for endpoint in ["/readyz?verbose", "/livez?verbose"] {
        let out = k(kc, &["get", "--raw", endpoint]).await;
        assert!(out.ok, "{}", out.stderr);
        for hook in kumo_apiserver::identity::HOOKS {
            assert!(
                out.stdout.contains(&format!("[+]{hook} ok")),
                "{}",
                out.stdout
            );
        }
    }

    // Renewed every 10 seconds by the same holder.
    tokio::time::sleep(Duration::from_secs(11)).await;
    let again = out_json(
        &k(
            kc,
            &["-n", "kube-system", "get", "lease", &name, "-o", "json"],
        )
        .await,
    );
    assert_eq!(again["spec"]["holderIdentity"], json!(holder));
    assert_ne!(again["spec"]["renewTime"], json!(renewed));
    assert_ne!(
        again["metadata"]["resourceVersion"],
        lease["metadata"]["resourceVersion"]
    );
}

#[tokio::test]
async fn garbage_collector_deletes_expired_identity_leases_only() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = EmbeddedStore::open(EmbeddedConfig::new(dir.path().join("s")))
        .await
        .unwrap();
    let rest = Rest::new(store);
    let registry = Registry::builtin();
    let ns_res = registry.find("", "v1", "namespaces").unwrap();
    let leases = registry
        .find("coordination.k8s.io", "v1", "leases")
        .unwrap();
    let query = BTreeMap::new();
    let req = |body: &'static str| Request {
        query: &query,
        accept: Accept::OBJECT,
        content_type: Some("application/json"),
        body: body.as_bytes(),
    };
    rest.create(
        &ns_res,
        None,
        &req(r#"{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"kube-system"}}"#),
    )
    .await
    .unwrap();
    let bodies: [&'static str; 4] = [
        // Expired an hour ago.
        r#"{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{"name":"apiserver-old","labels":{"apiserver.kubernetes.io/identity":"kube-apiserver"}},"spec":{"holderIdentity":"x","leaseDurationSeconds":3600,"renewTime":"2020-01-01T00:00:00.000000Z"}}"#,
        // Without a renew time: invalid, collected.
        r#"{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{"name":"apiserver-norenew","labels":{"apiserver.kubernetes.io/identity":"kube-apiserver"}},"spec":{"leaseDurationSeconds":3600}}"#,
        // Live.
        r#"{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{"name":"apiserver-live","labels":{"apiserver.kubernetes.io/identity":"kube-apiserver"}},"spec":{"leaseDurationSeconds":3600,"renewTime":"2099-01-01T00:00:00.000000Z"}}"#,
        // Expired but not an identity lease.
        r#"{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{"name":"other"},"spec":{"leaseDurationSeconds":15,"renewTime":"2020-01-01T00:00:00.000000Z"}}"#,
    ];
    for body in bodies {
        rest.create(&leases, Some("kube-system"), &req(body))
            .await
            .unwrap();
    }
    let mut deleted = kumo_apiserver::identity::collect_once(&rest, &leases).await;
    deleted.sort();
    assert_eq!(deleted, ["apiserver-norenew", "apiserver-old"]);
    for (name, kept) in [
        ("apiserver-live", true),
        ("other", true),
        ("apiserver-old", false),
    ] {
        let found = rest
            .get(&leases, Some("kube-system"), name, &req(""))
            .await
            .is_ok();
        assert_eq!(found, kept, "{name}");
    }
}

/// `kubectl get -o json` of one object.
async fn get_json(kc: &std::path::Path, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["get"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["-o", "json"]);
    out_json(&k(kc, &all).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emptied_omitempty_fields_are_not_stored() {
    let (server, _dir) = start().await;
    let kc = &server.admin_kubeconfig;
    let out = k_in(
        None,
        kc,
        &["create", "-f", "-"],
        Some(
            r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x","labels":{"a":"1"},"annotations":{},"finalizers":["example.com/f"]},"data":{},"immutable":false}"#,
        ),
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let cm = get_json(kc, &["cm", "x"]).await;
    assert!(cm["metadata"].get("annotations").is_none(), "{cm}");
    assert!(cm.get("data").is_none(), "{cm}");
    // A *bool keeps its false.
    assert_eq!(cm["immutable"], false);

    let out = k(
        kc,
        &[
            "patch",
            "cm",
            "x",
            "--type=merge",
            "-p",
            r#"{"metadata":{"labels":{"a":null}}}"#,
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let cm = get_json(kc, &["cm", "x"]).await;
    assert!(cm["metadata"].get("labels").is_none(), "{cm}");

    let out = k(
        kc,
        &[
            "patch",
            "cm",
            "x",
            "--type=json",
            "-p",
            r#"[{"op":"remove","path":"/metadata/finalizers/0"}]"#,
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let cm = get_json(kc, &["cm", "x"]).await;
    assert!(cm["metadata"].get("finalizers").is_none(), "{cm}");

    // Only emptying fields that are already absent: a no-op, nothing written.
    let rv = cm["metadata"]["resourceVersion"].clone();
    let out = k(
        kc,
        &[
            "patch",
            "cm",
            "x",
            "--type=merge",
            "-p",
            r#"{"metadata":{"labels":{},"annotations":{}},"data":{}}"#,
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let cm = get_json(kc, &["cm", "x"]).await;
    assert_eq!(cm["metadata"]["resourceVersion"], rv);

    // Nested: a pod template's labels and a container's empty fields.
    let out = k_in(
        None,
        kc,
        &["create", "-f", "-"],
        Some(
            r#"{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"d"},"spec":{"selector":{"matchLabels":{"app":"d"}},"template":{"metadata":{"labels":{"app":"d","extra":"1"}},"spec":{"containers":[{"name":"c","image":"nginx","args":[],"workingDir":"","stdin":false}],"hostNetwork":false,"automountServiceAccountToken":false}}}}"#,
        ),
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let d = get_json(kc, &["deploy", "d"]).await;
    let spec = &d["spec"]["template"]["spec"];
    let c = &spec["containers"][0];
    assert!(
        c.get("args").is_none() && c.get("workingDir").is_none() && c.get("stdin").is_none(),
        "{c}"
    );
    assert!(spec.get("hostNetwork").is_none(), "{spec}");
    assert_eq!(spec["automountServiceAccountToken"], false);
    let out = k(
        kc,
        &[
            "patch",
            "deploy",
            "d",
            "--type=json",
            "-p",
            r#"[{"op":"remove","path":"/spec/template/metadata/labels/extra"}]"#,
            "--dry-run=server",
            "-o",
            "json",
        ],
    )
    .await;
    let dry = out_json(&out);
    assert_eq!(
        dry["spec"]["template"]["metadata"]["labels"],
        json!({"app": "d"})
    );
    // The template's annotations, set then removed: no empty map is left behind.
    for patch in [
        r#"[{"op":"add","path":"/spec/template/metadata/annotations","value":{"a":"b"}}]"#,
        r#"[{"op":"remove","path":"/spec/template/metadata/annotations/a"}]"#,
    ] {
        let out = k(kc, &["patch", "deploy", "d", "--type=json", "-p", patch]).await;
        assert!(out.ok, "{}", out.stderr);
    }
    let d = get_json(kc, &["deploy", "d"]).await;
    assert!(
        d["spec"]["template"]["metadata"]
            .get("annotations")
            .is_none(),
        "{}",
        d["spec"]["template"]["metadata"]
    );
}
