//! OpenAPI, server-side field validation and aggregated discovery, driven by the stock
//! kubectl against `kumo apiserver`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::Path;

mod common;
use common::*;

const MANIFESTS: &str = "apiVersion: v1
kind: ConfigMap
metadata:
  name: app-config
  labels: {app: web}
data:
  a: \"1\"
---
apiVersion: coordination.k8s.io/v1
kind: Lease
metadata:
  name: leader
spec:
  holderIdentity: node-a
  leaseDurationSeconds: 15
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: default
---
apiVersion: v1
kind: Pod
metadata:
  name: web
spec:
  nodeName: node-a
  containers:
  - name: web
    image: nginx
    ports:
    - containerPort: 80
";

const UNKNOWN_FIELD: &str = "apiVersion: coordination.k8s.io/v1
kind: Lease
metadata:
  name: odd
spec:
  holderIdentity: node-b
  foo: 1
";

/// kubectl with its own discovery and HTTP cache, so each run sees this server only.
async fn kc(kubeconfig: &Path, cache: &Path, args: &[&str], stdin: Option<&str>) -> Out {
    let cache_arg = format!("--cache-dir={}", cache.display());
    let mut all = vec![cache_arg.as_str()];
    all.extend_from_slice(args);
    k_in(None, kubeconfig, &all, stdin).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_and_apply_validate_fields_on_the_server() {
    let (server, dir) = start().await;
    let kcfg = server.admin_kubeconfig.clone();
    let cache = dir.path().join("kube-cache");

    // The default --validate=strict: kubectl finds fieldValidation in the OpenAPI v3
    // document and leaves validation to the server.
    let out = kc(&kcfg, &cache, &["create", "-f", "-"], Some(MANIFESTS)).await;
    assert!(out.ok, "{}", out.stderr);
    assert!(
        out.stdout.contains("configmap/app-config created")
            && out
                .stdout
                .contains("lease.coordination.k8s.io/leader created")
            && out.stdout.contains("pod/web created"),
        "{}",
        out.stdout
    );

    // Strict: refused with upstream's message, nothing stored.
    let out = kc(&kcfg, &cache, &["create", "-f", "-"], Some(UNKNOWN_FIELD)).await;
    assert!(!out.ok);
    assert!(
        out.stderr.contains(
            "Error from server (BadRequest): error when creating \"STDIN\": Lease in version \"v1\" cannot be handled as a Lease: strict decoding error: unknown field \"spec.foo\""
        ),
        "{}",
        out.stderr
    );
    let out = kc(&kcfg, &cache, &["get", "lease", "odd"], None).await;
    assert!(!out.ok && out.stderr.contains("NotFound"), "{}", out.stderr);

    // Warn: created, the warning printed, the unknown field dropped as upstream drops it.
    let out = kc(
        &kcfg,
        &cache,
        &["create", "--validate=warn", "-f", "-"],
        Some(UNKNOWN_FIELD),
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    assert!(
        out.stderr.contains("Warning: unknown field \"spec.foo\""),
        "{}",
        out.stderr
    );
    let lease = out_json(&kc(&kcfg, &cache, &["get", "lease", "odd", "-o", "json"], None).await);
    assert_eq!(lease["spec"]["holderIdentity"], "node-b");
    assert!(lease["spec"].get("foo").is_none(), "{lease}");

    // Ignore: no warning.
    let out = kc(
        &kcfg,
        &cache,
        &["create", "--validate=false", "--dry-run=server", "-f", "-"],
        Some(&UNKNOWN_FIELD.replace("odd", "odd2")),
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    assert!(!out.stderr.contains("unknown field"), "{}", out.stderr);

    // apply to an existing object sends a patch with fieldValidation=Strict.
    let out = kc(
        &kcfg,
        &cache,
        &["apply", "-f", "-"],
        Some(&UNKNOWN_FIELD.replace("  foo: 1\n", "")),
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let out = kc(
        &kcfg,
        &cache,
        &["apply", "-f", "-"],
        Some(&UNKNOWN_FIELD.replace("foo: 1", "bar: 2")),
    )
    .await;
    assert!(!out.ok);
    assert!(
        out.stderr
            .contains("strict decoding error: unknown field \"spec.bar\""),
        "{}",
        out.stderr
    );
    let out = kc(
        &kcfg,
        &cache,
        &["apply", "--validate=warn", "-f", "-"],
        Some(&UNKNOWN_FIELD.replace("foo: 1", "bar: 2")),
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    assert!(
        out.stderr.contains("Warning: unknown field \"spec.bar\""),
        "{}",
        out.stderr
    );

    // A `kind: List` is validated by kubectl itself, against the protobuf /openapi/v2.
    let list = "apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: in-list}
  data: {a: b}
- apiVersion: coordination.k8s.io/v1
  kind: Lease
  metadata: {name: in-list}
  spec: {holderIdentity: x}
";
    let out = kc(&kcfg, &cache, &["create", "-f", "-"], Some(list)).await;
    assert!(out.ok, "{}", out.stderr);
    assert!(
        out.stdout
            .contains("lease.coordination.k8s.io/in-list created"),
        "{}",
        out.stdout
    );
    let bad = list
        .replace("in-list", "in-list-2")
        .replace("holderIdentity: x", "holderIdentity: x, foo: 1");
    let out = kc(&kcfg, &cache, &["create", "-f", "-"], Some(&bad)).await;
    assert!(!out.ok);
    assert!(
        out.stderr.contains(
            "error validating data: ValidationError(Lease.spec): unknown field \"foo\" in io.k8s.api.coordination.v1.LeaseSpec"
        ),
        "{}",
        out.stderr
    );

    // kubectl 1.33 takes the same path.
    let cache_arg = format!(
        "--cache-dir={}",
        dir.path().join("kube-cache-133").display()
    );
    let out = k_in(
        Some("1.33"),
        &kcfg,
        &[&cache_arg, "create", "-f", "-"],
        Some(&UNKNOWN_FIELD.replace("odd", "odd3")),
    )
    .await;
    assert!(!out.ok);
    assert!(
        out.stderr
            .contains("strict decoding error: unknown field \"spec.foo\""),
        "{}",
        out.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_reads_the_openapi_v3_documents() {
    let (server, dir) = start().await;
    let kcfg = server.admin_kubeconfig.clone();
    let cache = dir.path().join("kube-cache");

    let out = kc(&kcfg, &cache, &["explain", "pod.spec.nodeName"], None).await;
    assert!(out.ok, "{}", out.stderr);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(
        lines[..4],
        [
            "KIND:       Pod",
            "VERSION:    v1",
            "",
            "FIELD: nodeName <string>"
        ],
        "{}",
        out.stdout
    );

    let out = kc(&kcfg, &cache, &["explain", "lease.spec"], None).await;
    assert!(out.ok, "{}", out.stderr);
    for want in [
        "GROUP:      coordination.k8s.io",
        "KIND:       Lease",
        "VERSION:    v1",
        "FIELD: spec <LeaseSpec>",
        "FIELDS:",
        "  acquireTime\t<string>",
        "  holderIdentity\t<string>",
        "  leaseDurationSeconds\t<integer>",
    ] {
        assert!(
            out.stdout.lines().any(|l| l == want),
            "{want:?} in\n{}",
            out.stdout
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openapi_documents_carry_the_kubernetes_extensions() {
    let (server, dir) = start().await;
    let kcfg = server.admin_kubeconfig.clone();
    let cache = dir.path().join("kube-cache");
    let raw = |path: String| {
        let (kcfg, cache) = (kcfg.clone(), cache.clone());
        async move { out_json(&kc(&kcfg, &cache, &["get", "--raw", &path], None).await) }
    };

    let index = raw("/openapi/v3".into()).await;
    let paths = index["paths"].as_object().unwrap();
    // One document per served group version and per group, as discovery lists them, and
    // those of the other paths kube-apiserver's index has.
    let groups = raw("/apis".into()).await;
    let mut served: BTreeSet<String> = [
        "api",
        "api/v1",
        "apis",
        "version",
        ".well-known/openid-configuration",
        "openid/v1/jwks",
    ]
    .map(str::to_owned)
    .into();
    for g in groups["groups"].as_array().unwrap() {
        served.insert(format!("apis/{}", g["name"].as_str().unwrap()));
        for v in g["versions"].as_array().unwrap() {
            served.insert(format!("apis/{}", v["groupVersion"].as_str().unwrap()));
        }
    }
    assert_eq!(paths.keys().cloned().collect::<BTreeSet<_>>(), served);
    // A group's document: its one GET, as upstream names it.
    let url = paths["apis/rbac.authorization.k8s.io"]["serverRelativeURL"]
        .as_str()
        .unwrap();
    let doc = raw(url.to_owned()).await;
    let get = &doc["paths"]["/apis/rbac.authorization.k8s.io/"]["get"];
    assert_eq!(get["operationId"], "getRbacAuthorizationAPIGroup");
    assert_eq!(get["tags"], serde_json::json!(["rbacAuthorization"]));
    assert!(
        doc["components"]["schemas"]["io.k8s.apimachinery.pkg.apis.meta.v1.APIGroup"].is_object()
    );

    let url = paths["apis/coordination.k8s.io/v1"]["serverRelativeURL"]
        .as_str()
        .unwrap();
    assert!(url.contains("?hash="), "{url}");
    let doc = raw(url.to_owned()).await;
    let item = &doc["paths"]["/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"];
    let patch = &item["patch"];
    assert_eq!(patch["x-kubernetes-action"], "patch");
    assert_eq!(
        patch["x-kubernetes-group-version-kind"],
        serde_json::json!({"group": "coordination.k8s.io", "version": "v1", "kind": "Lease"})
    );
    assert!(patch["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["name"] == "fieldValidation" && p["in"] == "query"));
    let lease = &doc["components"]["schemas"]["io.k8s.api.coordination.v1.Lease"];
    assert_eq!(
        lease["x-kubernetes-group-version-kind"][0]["kind"], "Lease",
        "{lease}"
    );
    // Upstream's descriptions (k8s-openapi's, added at build time).
    assert!(
        lease["description"]
            .as_str()
            .is_some_and(|d| d.starts_with("Lease defines a lease concept.")),
        "{lease}"
    );

    let core = raw(paths["api/v1"]["serverRelativeURL"]
        .as_str()
        .unwrap()
        .to_owned())
    .await;
    let containers =
        &core["components"]["schemas"]["io.k8s.api.core.v1.PodSpec"]["properties"]["containers"];
    assert_eq!(containers["x-kubernetes-patch-strategy"], "merge");
    assert_eq!(containers["x-kubernetes-patch-merge-key"], "name");
    assert_eq!(containers["x-kubernetes-list-map-keys"][0], "name");
    let served: BTreeSet<&str> = core["paths"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert!(served.contains("/api/v1/namespaces/{namespace}/pods/{name}/status"));
    assert!(served.contains("/api/v1/namespaces/{name}/finalize"));

    // A stale hash redirects to the current document (kubectl follows the redirect).
    let stale = raw("/openapi/v3/api/v1?hash=0".into()).await;
    assert_eq!(stale, core);

    // v2 in JSON, with the same facts in v2 form.
    let v2 = raw("/openapi/v2".into()).await;
    assert_eq!(v2["swagger"], "2.0");
    assert_eq!(
        v2["definitions"]["io.k8s.api.core.v1.Pod"]["properties"]["spec"]["$ref"],
        "#/definitions/io.k8s.api.core.v1.PodSpec"
    );
    assert_eq!(
        v2["paths"]["/api/v1/namespaces/{namespace}/pods/{name}"]["patch"]
            ["x-kubernetes-group-version-kind"]["kind"],
        "Pod"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_uses_aggregated_discovery() {
    let (server, dir) = start().await;
    let kcfg = server.admin_kubeconfig.clone();
    let cache = dir.path().join("kube-cache");

    // kubectl logs the response headers at -v=8: the answer to /api and /apis is the
    // aggregated document.
    let out = kc(&kcfg, &cache, &["api-resources", "-v=8"], None).await;
    assert!(out.ok, "{}", out.stderr);
    let aggregated = out
        .stderr
        .lines()
        .filter(|l| {
            l.contains("Content-Type: application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList")
        })
        .count();
    assert_eq!(aggregated, 2, "{}", out.stderr);
    assert!(
        !out.stderr
            .lines()
            .any(|l| l.contains("GET https://") && l.contains("/api/v1")),
        "no per-group-version requests: {}",
        out.stderr
    );

    // The resources kubectl lists are exactly those the (legacy) discovery lists.
    let out = kc(&kcfg, &cache, &["api-resources", "-o", "name"], None).await;
    assert!(out.ok, "{}", out.stderr);
    let listed: BTreeSet<String> = out.stdout.lines().map(str::to_owned).collect();
    let mut served = BTreeSet::new();
    let groups = out_json(&kc(&kcfg, &cache, &["get", "--raw", "/apis"], None).await);
    let mut gvs = vec![("".to_owned(), "/api/v1".to_owned())];
    for g in groups["groups"].as_array().unwrap() {
        let name = g["name"].as_str().unwrap().to_owned();
        let gv = g["preferredVersion"]["groupVersion"].as_str().unwrap();
        gvs.push((name, format!("/apis/{gv}")));
    }
    for (group, path) in gvs {
        let list = out_json(&kc(&kcfg, &cache, &["get", "--raw", &path], None).await);
        for r in list["resources"].as_array().unwrap() {
            let name = r["name"].as_str().unwrap();
            if name.contains('/') {
                continue;
            }
            served.insert(if group.is_empty() {
                name.to_owned()
            } else {
                format!("{name}.{group}")
            });
        }
    }
    assert_eq!(listed, served);

    // Wide output: short names, API version, namespaced, kind, verbs from the aggregated
    // document.
    let out = kc(&kcfg, &cache, &["api-resources", "-o", "wide"], None).await;
    assert!(out.ok, "{}", out.stderr);
    let pods = out
        .stdout
        .lines()
        .find(|l| l.starts_with("pods "))
        .unwrap_or_else(|| panic!("{}", out.stdout));
    let cols: Vec<&str> = pods.split_whitespace().collect();
    assert_eq!(cols[..5], ["pods", "po", "v1", "true", "Pod"], "{pods}");
    assert_eq!(
        cols[5..],
        [
            "create,delete,deletecollection,get,list,patch,update,watch",
            "all"
        ],
        "{pods}"
    );
}
