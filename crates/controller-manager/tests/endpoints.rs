//! endpointslice-controller and endpoints-controller against an in-process API server,
//! driven with kubectl. No kubelet runs: pods get their IPs and Ready condition by
//! patching their status.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use serde_json::Value;

async fn apply(kc: &Path, body: &str) {
    let out = k_in(kc, &["apply", "-f", "-"], Some(body)).await;
    assert!(out.ok, "{}", out.stderr);
}

/// A pod on node n1 labelled app=web whose container port `http` is `port`.
async fn pod(kc: &Path, name: &str, port: u16) {
    apply(
        kc,
        &format!(
            r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"{name}","namespace":"default","labels":{{"app":"web"}}}},
            "spec":{{"nodeName":"n1","containers":[{{"name":"c","image":"nginx","ports":[{{"name":"http","containerPort":{port}}}]}}]}}}}"#
        ),
    )
    .await;
}

/// What a kubelet would report: Running with `ip`, Ready or not.
async fn set_status(kc: &Path, name: &str, ip: &str, ready: bool) {
    let now = k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let status = if ready { "True" } else { "False" };
    let patch = format!(
        r#"{{"status":{{"phase":"Running","podIP":"{ip}","podIPs":[{{"ip":"{ip}"}}],
        "conditions":[{{"type":"Ready","status":"{status}","lastTransitionTime":"{now}"}}]}}}}"#
    );
    let out = k(
        kc,
        &[
            "patch",
            "pod",
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

async fn web_slices(kc: &Path) -> Vec<Value> {
    let v = get(
        kc,
        &["endpointslices", "-l", "kubernetes.io/service-name=web"],
    )
    .await
    .expect("list");
    v["items"].as_array().cloned().unwrap_or_default()
}

/// Every endpoint of the web slices: ip → (ready, serving, terminating, port of its slice).
async fn web_endpoints(kc: &Path) -> Vec<(String, bool, bool, bool, i64)> {
    let mut out = Vec::new();
    for s in web_slices(kc).await {
        let port = s["ports"][0]["port"].as_i64().unwrap_or(-1);
        for e in s["endpoints"].as_array().into_iter().flatten() {
            let c = &e["conditions"];
            out.push((
                e["addresses"][0].as_str().unwrap().to_owned(),
                c["ready"] == true,
                c["serving"] == true,
                c["terminating"] == true,
                port,
            ));
        }
    }
    out.sort();
    out
}

fn ips(list: &Value) -> Vec<String> {
    let mut v: Vec<String> = list
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| a["ip"].as_str().unwrap().to_owned())
        .collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn services_get_endpointslices_and_endpoints() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    let cm = start_cm(&kc, &["endpointslice", "endpoint", "serviceaccount"]).await;
    // Pods need the namespace's default ServiceAccount.
    eventually(20, "default ServiceAccount", || {
        get(&kc, &["sa", "default", "-n", "default"])
    })
    .await;

    apply(
        &kc,
        r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"n1","labels":{"topology.kubernetes.io/zone":"zone-a"}}}"#,
    )
    .await;
    pod(&kc, "web-0", 8080).await;
    pod(&kc, "web-1", 8080).await;
    set_status(&kc, "web-0", "10.244.0.10", true).await;
    set_status(&kc, "web-1", "10.244.0.11", true).await;
    // A named targetPort, resolved against each pod's container ports.
    apply(
        &kc,
        r#"{"apiVersion":"v1","kind":"Service","metadata":{"name":"web","namespace":"default","labels":{"team":"a"}},
        "spec":{"selector":{"app":"web"},"ports":[{"name":"http","port":80,"targetPort":"http"}]}}"#,
    )
    .await;
    let svc = get(&kc, &["service", "web"]).await.unwrap();
    let svc_uid = svc["metadata"]["uid"].as_str().unwrap().to_owned();

    let slice = eventually(20, "a slice with both pods", || async {
        let s = web_slices(&kc).await;
        (s.len() == 1 && s[0]["endpoints"].as_array().map(Vec::len) == Some(2))
            .then(|| s[0].clone())
    })
    .await;
    let name = slice["metadata"]["name"].as_str().unwrap();
    assert!(name.starts_with("web-") && name.len() == 9, "{name}");
    assert_eq!(slice["metadata"]["generateName"], "web-");
    assert_eq!(slice["addressType"], "IPv4");
    let labels = &slice["metadata"]["labels"];
    assert_eq!(
        labels["endpointslice.kubernetes.io/managed-by"],
        "endpointslice-controller.k8s.io"
    );
    assert_eq!(labels["kubernetes.io/service-name"], "web");
    assert_eq!(labels["team"], "a");
    let owner = &slice["metadata"]["ownerReferences"][0];
    assert_eq!(owner["kind"], "Service");
    assert_eq!(owner["apiVersion"], "v1");
    assert_eq!(owner["name"], "web");
    assert_eq!(owner["uid"], svc_uid.as_str());
    assert_eq!(owner["controller"], true);
    assert_eq!(owner["blockOwnerDeletion"], true);
    assert_eq!(
        slice["ports"],
        serde_json::json!([{"name": "http", "port": 8080, "protocol": "TCP"}])
    );
    assert!(
        slice["metadata"]["annotations"]["endpoints.kubernetes.io/last-change-trigger-time"]
            .is_string()
    );
    let e0 = slice["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["addresses"][0] == "10.244.0.10")
        .expect("web-0's endpoint");
    assert_eq!(
        e0["conditions"],
        serde_json::json!({"ready": true, "serving": true, "terminating": false})
    );
    assert_eq!(e0["nodeName"], "n1");
    assert_eq!(e0["zone"], "zone-a");
    assert_eq!(e0["targetRef"]["kind"], "Pod");
    assert_eq!(e0["targetRef"]["name"], "web-0");
    assert_eq!(e0["targetRef"]["namespace"], "default");
    let rv = slice["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();

    // The legacy Endpoints agree.
    let ep = eventually(20, "Endpoints web", || async {
        get(&kc, &["endpoints", "web"])
            .await
            .filter(|e| ips(&e["subsets"][0]["addresses"]).len() == 2)
    })
    .await;
    assert_eq!(
        ips(&ep["subsets"][0]["addresses"]),
        ["10.244.0.10", "10.244.0.11"]
    );
    assert_eq!(ep["subsets"][0]["ports"][0]["port"], 8080);
    assert_eq!(ep["subsets"][0]["ports"][0]["name"], "http");
    assert_eq!(ep["subsets"][0]["addresses"][0]["nodeName"], "n1");
    assert_eq!(
        ep["subsets"][0]["addresses"][0]["targetRef"]["name"],
        "web-0"
    );
    assert_eq!(
        ep["metadata"]["labels"]["endpoints.kubernetes.io/managed-by"],
        "endpoint-controller"
    );
    assert_eq!(ep["metadata"]["labels"]["team"], "a");
    assert!(
        ep["metadata"]["annotations"]["endpoints.kubernetes.io/last-change-trigger-time"]
            .is_string()
    );
    let out = k(&kc, &["get", "endpoints", "web", "--no-headers"]).await;
    assert!(
        out.stdout.contains("10.244.0.10:8080,10.244.0.11:8080"),
        "{}",
        out.stdout
    );

    // Nothing changed: nothing is written again.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let again = web_slices(&kc).await;
    assert_eq!(again[0]["metadata"]["resourceVersion"], rv.as_str());

    // A pod becoming unready flips its conditions.
    set_status(&kc, "web-1", "10.244.0.11", false).await;
    eventually(20, "web-1 not ready in the slice", || async {
        let e = web_endpoints(&kc).await;
        (e == [
            ("10.244.0.10".into(), true, true, false, 8080),
            ("10.244.0.11".into(), false, false, false, 8080),
        ])
        .then_some(())
    })
    .await;
    eventually(20, "web-1 under notReadyAddresses", || async {
        let e = get(&kc, &["endpoints", "web"]).await?;
        (ips(&e["subsets"][0]["addresses"]) == ["10.244.0.10"]
            && ips(&e["subsets"][0]["notReadyAddresses"]) == ["10.244.0.11"])
        .then_some(())
    })
    .await;

    // More pods: one whose `http` port is another number goes to a slice of its own.
    pod(&kc, "web-2", 9090).await;
    set_status(&kc, "web-2", "10.244.0.12", true).await;
    eventually(20, "web-2 in a slice with port 9090", || async {
        let e = web_endpoints(&kc).await;
        (web_slices(&kc).await.len() == 2
            && e.contains(&("10.244.0.12".into(), true, true, false, 9090)))
        .then_some(())
    })
    .await;
    eventually(20, "Endpoints with two subsets", || async {
        let e = get(&kc, &["endpoints", "web"]).await?;
        let subsets = e["subsets"].as_array()?;
        let p9090 = subsets.iter().find(|s| s["ports"][0]["port"] == 9090)?;
        (subsets.len() == 2 && ips(&p9090["addresses"]) == ["10.244.0.12"]).then_some(())
    })
    .await;

    // publishNotReadyAddresses: the unready pod counts as ready.
    let out = k(
        &kc,
        &[
            "patch",
            "service",
            "web",
            "--type=merge",
            "-p",
            r#"{"spec":{"publishNotReadyAddresses":true}}"#,
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    eventually(20, "web-1 published while not ready", || async {
        let e = web_endpoints(&kc).await;
        e.contains(&("10.244.0.11".into(), true, false, false, 8080))
            .then_some(())
    })
    .await;
    eventually(20, "web-1 under addresses", || async {
        let e = get(&kc, &["endpoints", "web"]).await?;
        let s = e["subsets"]
            .as_array()?
            .iter()
            .find(|s| s["ports"][0]["port"] == 8080)?
            .clone();
        (ips(&s["addresses"]) == ["10.244.0.10", "10.244.0.11"]).then_some(())
    })
    .await;

    // Fewer pods: the endpoint goes, and the slice it emptied too.
    let out = k(
        &kc,
        &["delete", "pod", "web-2", "--grace-period=0", "--force"],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    eventually(20, "web-2 gone", || async {
        let e = web_endpoints(&kc).await;
        (web_slices(&kc).await.len() == 1 && e.len() == 2).then_some(())
    })
    .await;
    eventually(20, "web-2 gone from Endpoints", || async {
        let e = get(&kc, &["endpoints", "web"]).await?;
        (e["subsets"].as_array()?.len() == 1).then_some(())
    })
    .await;

    // Services without a selector are left alone, and so is `kubernetes`.
    apply(
        &kc,
        r#"{"apiVersion":"v1","kind":"Service","metadata":{"name":"manual","namespace":"default"},
        "spec":{"ports":[{"port":80}]}}"#,
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let manual = get(
        &kc,
        &["endpointslices", "-l", "kubernetes.io/service-name=manual"],
    )
    .await
    .unwrap();
    assert_eq!(manual["items"].as_array().map(Vec::len), Some(0));
    assert!(get(&kc, &["endpoints", "manual"]).await.is_none());
    let kube = get(
        &kc,
        &[
            "endpointslices",
            "-l",
            "kubernetes.io/service-name=kubernetes",
        ],
    )
    .await
    .unwrap();
    let items = kube["items"].as_array().unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["metadata"]["name"], "kubernetes");
    assert!(items[0]["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"].is_null());
    let kep = get(&kc, &["endpoints", "kubernetes"]).await.unwrap();
    assert!(kep["metadata"]["labels"]["endpoints.kubernetes.io/managed-by"].is_null());

    // A Service with no ready pods still has one (empty) slice.
    apply(
        &kc,
        r#"{"apiVersion":"v1","kind":"Service","metadata":{"name":"empty","namespace":"default"},
        "spec":{"selector":{"app":"none"},"ports":[{"port":80}]}}"#,
    )
    .await;
    eventually(20, "placeholder slice", || async {
        let v = get(
            &kc,
            &["endpointslices", "-l", "kubernetes.io/service-name=empty"],
        )
        .await?;
        let items = v["items"].as_array()?;
        (items.len() == 1 && items[0]["endpoints"].as_array().is_none_or(Vec::is_empty))
            .then_some(())
    })
    .await;

    // Deleting the Service deletes its Endpoints (its slices go by their ownerReference).
    assert!(k(&kc, &["delete", "service", "web"]).await.ok);
    eventually(20, "Endpoints web deleted", || async {
        get(&kc, &["endpoints", "web"])
            .await
            .is_none()
            .then_some(())
    })
    .await;
    cm.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exposed_pod_and_terminating_endpoints() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    // Each controller acts as its own ServiceAccount: the bootstrap roles must let it.
    let mut cfg = cm_config(&kc, &["endpointslice", "endpoint", "serviceaccount"]);
    cfg.use_service_account_credentials = true;
    let cm = kumo_controller_manager::ControllerManager::start(cfg)
        .await
        .unwrap();
    eventually(20, "default ServiceAccount", || {
        get(&kc, &["sa", "default", "-n", "default"])
    })
    .await;
    apply(
        &kc,
        r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"n1"}}"#,
    )
    .await;
    pod(&kc, "web-0", 8080).await;
    set_status(&kc, "web-0", "10.244.1.10", true).await;
    let out = k(
        &kc,
        &[
            "expose",
            "pod",
            "web-0",
            "--name=web",
            "--port=80",
            "--target-port=8080",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    eventually(20, "the exposed pod's endpoint", || async {
        let e = web_endpoints(&kc).await;
        (e == [("10.244.1.10".into(), true, true, false, 8080)]).then_some(())
    })
    .await;
    let out = k(
        &kc,
        &[
            "get",
            "endpointslices",
            "-l",
            "kubernetes.io/service-name=web",
            "--no-headers",
        ],
    )
    .await;
    let cols: Vec<&str> = out.stdout.split_whitespace().collect();
    assert_eq!(
        cols[1..4],
        ["IPv4", "8080", "10.244.1.10"],
        "{}",
        out.stdout
    );
    // No zone label on the node: no zone.
    let s = web_slices(&kc).await;
    assert!(s[0]["endpoints"][0]["zone"].is_null());

    // A headless Service without ports; a pod whose subdomain names it publishes its
    // hostname.
    apply(
        &kc,
        r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"db-0","namespace":"default","labels":{"app":"db"}},
        "spec":{"nodeName":"n1","hostname":"db-0","subdomain":"db","containers":[{"name":"c","image":"db"}]}}"#,
    )
    .await;
    set_status(&kc, "db-0", "10.244.1.20", true).await;
    apply(
        &kc,
        r#"{"apiVersion":"v1","kind":"Service","metadata":{"name":"db","namespace":"default"},
        "spec":{"clusterIP":"None","selector":{"app":"db"}}}"#,
    )
    .await;
    let db = eventually(20, "the headless Service's slice", || async {
        let v = get(
            &kc,
            &["endpointslices", "-l", "kubernetes.io/service-name=db"],
        )
        .await?;
        let items = v["items"].as_array()?;
        (items.len() == 1 && !items[0]["endpoints"].is_null()).then(|| items[0].clone())
    })
    .await;
    assert_eq!(
        db["metadata"]["labels"]["service.kubernetes.io/headless"],
        ""
    );
    assert_eq!(db["endpoints"][0]["hostname"], "db-0");
    assert!(db["ports"].as_array().is_none_or(Vec::is_empty), "{db}");
    let ep = eventually(20, "the headless Service's Endpoints", || {
        get(&kc, &["endpoints", "db"])
    })
    .await;
    assert_eq!(
        ep["metadata"]["labels"]["service.kubernetes.io/headless"],
        ""
    );
    assert_eq!(ep["subsets"][0]["addresses"][0]["ip"], "10.244.1.20");
    assert_eq!(ep["subsets"][0]["addresses"][0]["hostname"], "db-0");
    assert!(ep["subsets"][0]["ports"].is_null(), "{ep}");

    // A pod being deleted (no kubelet finishes it) stays in the slice as terminating,
    // serving while Ready but not ready; the Endpoints drop it.
    let out = k(&kc, &["delete", "pod", "web-0", "--wait=false"]).await;
    assert!(out.ok, "{}", out.stderr);
    eventually(20, "terminating endpoint", || async {
        let e = web_endpoints(&kc).await;
        (e == [("10.244.1.10".into(), false, true, true, 8080)]).then_some(())
    })
    .await;
    eventually(20, "Endpoints without the terminating pod", || async {
        let e = get(&kc, &["endpoints", "web"]).await?;
        e["subsets"].is_null().then_some(())
    })
    .await;
    cm.shutdown().await.unwrap();
}

/// The Endpoints of a Service without a selector are mirrored into an EndpointSlice,
/// followed through updates, and the slice goes with the Endpoints.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn custom_endpoints_are_mirrored() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    let _cm = start_cm(&kc, &["endpointslice-mirroring-controller"]).await;
    let doc = |ip: &str| {
        format!(
            r#"
apiVersion: v1
kind: Service
metadata: {{name: ext, namespace: default}}
spec: {{ports: [{{name: example, port: 80}}]}}
---
apiVersion: v1
kind: Endpoints
metadata: {{name: ext, namespace: default, labels: {{team: a}}}}
subsets: [{{addresses: [{{ip: "{ip}"}}], notReadyAddresses: [{{ip: "10.1.2.9"}}], ports: [{{name: example, port: 80}}]}}]
"#
        )
    };
    let mirrored = |kc: std::path::PathBuf| async move {
        let list = get(
            &kc,
            &["endpointslices", "-l", "kubernetes.io/service-name=ext"],
        )
        .await?;
        let items = list["items"].as_array()?.clone();
        (items.len() == 1).then(|| items[0].clone())
    };
    apply(&kc, &doc("10.1.2.3")).await;
    let s = eventually(20, "the mirrored slice", || mirrored(kc.clone())).await;
    assert_eq!(s["addressType"], "IPv4");
    assert_eq!(
        s["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"],
        "endpointslicemirroring-controller.k8s.io"
    );
    assert_eq!(s["metadata"]["labels"]["team"], "a");
    assert_eq!(s["metadata"]["ownerReferences"][0]["kind"], "Endpoints");
    assert_eq!(s["ports"][0]["port"], 80);
    assert_eq!(s["ports"][0]["protocol"], "TCP");
    assert_eq!(s["endpoints"][0]["addresses"][0], "10.1.2.3");
    assert_eq!(s["endpoints"][0]["conditions"]["ready"], true);
    assert_eq!(s["endpoints"][1]["addresses"][0], "10.1.2.9");
    assert_eq!(s["endpoints"][1]["conditions"]["ready"], false);

    apply(&kc, &doc("10.2.3.4")).await;
    eventually(20, "the slice to follow the update", || async {
        let s = mirrored(kc.clone()).await?;
        (s["endpoints"][0]["addresses"][0] == "10.2.3.4").then_some(())
    })
    .await;

    let out = k(&kc, &["delete", "endpoints", "ext"]).await;
    assert!(out.ok, "{}", out.stderr);
    eventually(20, "the slice to go", || async {
        let list = get(
            &kc,
            &["endpointslices", "-l", "kubernetes.io/service-name=ext"],
        )
        .await?;
        list["items"].as_array()?.is_empty().then_some(())
    })
    .await;
}
