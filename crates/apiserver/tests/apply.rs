//! `metadata.managedFields` and server-side apply, driven by the real kubectl. The expected
//! FieldsV1 sets are what kube-apiserver v1.37.2 recorded for the same commands.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{json, Value};

mod common;
use common::*;

/// The managed fields of an object by manager (and subresource), each entry without its
/// time, after checking that every entry that changed something carries an RFC 3339 time.
async fn managed(kc: &Path, what: &str, name: &str) -> BTreeMap<String, Value> {
    let out = k(
        kc,
        &["get", what, name, "-o", "json", "--show-managed-fields"],
    )
    .await;
    let obj = out_json(&out);
    let mut by = BTreeMap::new();
    for e in obj["metadata"]["managedFields"]
        .as_array()
        .cloned()
        .unwrap_or_default()
    {
        let mut e = e.clone();
        if let Some(t) = e.as_object_mut().unwrap().remove("time") {
            let t = t.as_str().unwrap();
            assert!(
                t.len() == 20 && t.ends_with('Z') && t.as_bytes()[10] == b'T',
                "time {t}"
            );
        }
        let key = match e.get("subresource").and_then(Value::as_str) {
            Some(s) => format!("{}/{s}", e["manager"].as_str().unwrap()),
            None => e["manager"].as_str().unwrap().to_owned(),
        };
        by.insert(key, e);
    }
    by
}

fn entry(manager: &str, operation: &str, api_version: &str, fields: Value) -> Value {
    json!({
        "manager": manager,
        "operation": operation,
        "apiVersion": api_version,
        "fieldsType": "FieldsV1",
        "fieldsV1": fields,
    })
}

fn ok(out: &Out) {
    assert!(out.ok, "kubectl failed: {}{}", out.stdout, out.stderr);
}

const CSA: &str = "apiVersion: v1
kind: ConfigMap
metadata:
  name: csa
  labels: {app: web}
data:
  key: one
  other: x
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn updates_record_their_managers() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();

    // kubectl create, then kubectl label: one Update entry each, named after the
    // User-Agent.
    ok(&k(
        &kc,
        &["create", "configmap", "made", "--from-literal=key=one"],
    )
    .await);
    ok(&k(&kc, &["label", "configmap", "made", "tier=a"]).await);
    let create = entry(
        "kubectl-create",
        "Update",
        "v1",
        json!({"f:data": {".": {}, "f:key": {}}}),
    );
    let label = entry(
        "kubectl-label",
        "Update",
        "v1",
        json!({"f:metadata": {"f:labels": {".": {}, "f:tier": {}}}}),
    );
    let m = managed(&kc, "configmap", "made").await;
    assert_eq!(m.len(), 2, "{m:?}");
    assert_eq!(m["kubectl-create"], create);
    assert_eq!(m["kubectl-label"], label);

    // An edit-style PUT takes over what it changes: data.key leaves kubectl-create, whose
    // entry keeps the data map itself.
    let mut obj = out_json(&k(&kc, &["get", "configmap", "made", "-o", "json"]).await);
    obj["data"]["key"] = json!("edited");
    obj["metadata"]["labels"]["x"] = json!("y");
    ok(&k_in(None, &kc, &["replace", "-f", "-"], Some(&obj.to_string())).await);
    let m = managed(&kc, "configmap", "made").await;
    assert_eq!(
        m["kubectl-create"],
        entry("kubectl-create", "Update", "v1", json!({"f:data": {}}))
    );
    assert_eq!(m["kubectl-label"], label);
    assert_eq!(
        m["kubectl-replace"],
        entry(
            "kubectl-replace",
            "Update",
            "v1",
            json!({"f:data": {"f:key": {}}, "f:metadata": {"f:labels": {"f:x": {}}}})
        )
    );

    // Managed fields sent with an update are kept when valid...
    let mut obj = out_json(&k(&kc, &["get", "configmap", "made", "-o", "json"]).await);
    obj["metadata"]["managedFields"] = json!([{
        "manager": "fake", "operation": "Update", "apiVersion": "v1",
        "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {"f:key": {}}},
    }]);
    obj["data"]["new"] = json!("1");
    ok(&k_in(None, &kc, &["replace", "-f", "-"], Some(&obj.to_string())).await);
    let m = managed(&kc, "configmap", "made").await;
    assert_eq!(m.keys().collect::<Vec<_>>(), ["fake", "kubectl-replace"]);
    assert_eq!(
        m["kubectl-replace"]["fieldsV1"],
        json!({"f:data": {"f:new": {}}})
    );
    // ...and invalid ones are ignored for the live ones.
    let mut obj = out_json(&k(&kc, &["get", "configmap", "made", "-o", "json"]).await);
    obj["metadata"]["managedFields"] =
        json!([{"manager": "bad", "operation": "Nope", "apiVersion": "v1"}]);
    obj["data"]["new"] = json!("2");
    ok(&k_in(None, &kc, &["replace", "-f", "-"], Some(&obj.to_string())).await);
    let m = managed(&kc, "configmap", "made").await;
    assert_eq!(m.keys().collect::<Vec<_>>(), ["fake", "kubectl-replace"]);

    // A list of one empty entry (or an empty list) clears them.
    ok(&k(
        &kc,
        &[
            "patch",
            "configmap",
            "made",
            "--type=merge",
            "-p",
            r#"{"metadata":{"managedFields":[{}]}}"#,
        ],
    )
    .await);
    assert!(managed(&kc, "configmap", "made").await.is_empty());

    // Client-side apply: kubectl-client-side-apply, with the annotation it keeps.
    ok(&k_in(None, &kc, &["apply", "-f", "-"], Some(CSA)).await);
    let m = managed(&kc, "configmap", "csa").await;
    assert_eq!(m.len(), 1);
    assert_eq!(
        m["kubectl-client-side-apply"],
        entry(
            "kubectl-client-side-apply",
            "Update",
            "v1",
            json!({
                "f:data": {".": {}, "f:key": {}, "f:other": {}},
                "f:metadata": {
                    "f:annotations": {".": {}, "f:kubectl.kubernetes.io/last-applied-configuration": {}},
                    "f:labels": {".": {}, "f:app": {}},
                },
            })
        )
    );

    // A manager name longer than 128 bytes is refused.
    let long = "x".repeat(130);
    let out = k(
        &kc,
        &[
            "create",
            "configmap",
            "long",
            "--from-literal=a=b",
            &format!("--field-manager={long}"),
        ],
    )
    .await;
    assert!(!out.ok);
    assert_eq!(
        out.stderr.trim(),
        "error: failed to create configmap: CreateOptions.meta.k8s.io \"\" is invalid: fieldManager: Too long: may not be more than 128 bytes"
    );
    let out = k(
        &kc,
        &[
            "patch",
            "configmap",
            "made",
            "--type=merge",
            "-p",
            r#"{"data":{"a":"b"}}"#,
            &format!("--field-manager={long}"),
        ],
    )
    .await;
    assert!(!out.ok);
    assert_eq!(
        out.stderr.trim(),
        "The PatchOptions \"\" is invalid: fieldManager: Too long: may not be more than 128 bytes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_side_apply() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    let apply = |yaml: &'static str, extra: &'static [&'static str]| {
        let kc = kc.clone();
        async move {
            let mut args = vec!["apply", "--server-side", "-f", "-"];
            args.extend_from_slice(extra);
            k_in(None, &kc, &args, Some(yaml)).await
        }
    };

    // Apply creates the object; the Apply entry holds exactly what was applied (no `.`
    // members for maps).
    let first = "apiVersion: v1
kind: ConfigMap
metadata:
  name: ssa
  labels: {app: web}
data:
  key: one
  other: x
";
    let out = apply(first, &[]).await;
    ok(&out);
    assert_eq!(out.stdout.trim(), "configmap/ssa serverside-applied");
    let m = managed(&kc, "configmap", "ssa").await;
    assert_eq!(
        m["kubectl"],
        entry(
            "kubectl",
            "Apply",
            "v1",
            json!({"f:data": {"f:key": {}, "f:other": {}}, "f:metadata": {"f:labels": {"f:app": {}}}})
        )
    );

    // Applying again without `other` and the label removes them from the object.
    let second = "apiVersion: v1
kind: ConfigMap
metadata:
  name: ssa
data:
  key: two
";
    ok(&apply(second, &[]).await);
    let obj = out_json(&k(&kc, &["get", "configmap", "ssa", "-o", "json"]).await);
    assert_eq!(obj["data"], json!({"key": "two"}));
    assert!(obj["metadata"].get("labels").is_none(), "{obj}");
    let m = managed(&kc, "configmap", "ssa").await;
    assert_eq!(
        m["kubectl"],
        entry("kubectl", "Apply", "v1", json!({"f:data": {"f:key": {}}}))
    );

    // Fields the schema does not declare, and values of the wrong type, are refused.
    let unknown = "apiVersion: v1
kind: ConfigMap
metadata:
  name: unk
  bogus: 1
data:
  a: 1
spec:
  x: 1
";
    let out = apply(unknown, &[]).await;
    assert!(!out.ok);
    assert_eq!(
        out.stderr.trim(),
        "Error from server: failed to create typed patch object (default/unk; /v1, Kind=ConfigMap): errors:\n  \
         .data.a: expected string, got &value.valueUnstructured{Value:1}\n  \
         .metadata.bogus: field not declared in schema\n  \
         .spec: field not declared in schema"
    );

    // Changing a field another manager set is a conflict...
    ok(&k(
        &kc,
        &["create", "configmap", "made", "--from-literal=key=one"],
    )
    .await);
    let change = "apiVersion: v1
kind: ConfigMap
metadata:
  name: made
data:
  key: two
";
    let out = apply(change, &[]).await;
    assert!(!out.ok);
    assert!(
        out.stderr.starts_with(
            "error: Apply failed with 1 conflict: conflict with \"kubectl-create\" using v1: .data.key\n\
             Please review the fields above--they currently have other managers."
        ),
        "{}",
        out.stderr
    );
    let obj = out_json(&k(&kc, &["get", "configmap", "made", "-o", "json"]).await);
    assert_eq!(obj["data"]["key"], "one");

    // ...that --force-conflicts resolves by taking the field over.
    ok(&apply(change, &["--force-conflicts"]).await);
    let obj = out_json(&k(&kc, &["get", "configmap", "made", "-o", "json"]).await);
    assert_eq!(obj["data"]["key"], "two");
    let m = managed(&kc, "configmap", "made").await;
    assert_eq!(
        m["kubectl"],
        entry("kubectl", "Apply", "v1", json!({"f:data": {"f:key": {}}}))
    );
    assert_eq!(
        m["kubectl-create"],
        entry("kubectl-create", "Update", "v1", json!({"f:data": {}}))
    );

    // An object client-side applied moves to server-side apply without conflicts where
    // its annotation still describes the values; kubectl then applies the annotation as
    // kubectl-last-applied, a no-op that records no time.
    ok(&k_in(None, &kc, &["apply", "-f", "-"], Some(CSA)).await);
    let changed = CSA.replace("key: one", "key: changed");
    let out = k_in(
        None,
        &kc,
        &["apply", "--server-side", "-f", "-"],
        Some(&changed),
    )
    .await;
    ok(&out);
    let obj = out_json(
        &k(
            &kc,
            &[
                "get",
                "configmap",
                "csa",
                "-o",
                "json",
                "--show-managed-fields",
            ],
        )
        .await,
    );
    assert_eq!(obj["data"]["key"], "changed");
    assert_eq!(
        obj["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"],
        "{\"apiVersion\":\"v1\",\"data\":{\"key\":\"changed\",\"other\":\"x\"},\"kind\":\"ConfigMap\",\"metadata\":{\"labels\":{\"app\":\"web\"},\"name\":\"csa\",\"namespace\":\"default\"}}\n"
    );
    let entries = obj["metadata"]["managedFields"].as_array().unwrap();
    assert_eq!(entries.len(), 2, "{entries:?}");
    // Entries without a time sort first.
    assert_eq!(entries[0]["manager"], "kubectl-last-applied");
    assert!(entries[0].get("time").is_none());
    assert_eq!(
        entries[0]["fieldsV1"],
        json!({"f:metadata": {"f:annotations": {"f:kubectl.kubernetes.io/last-applied-configuration": {}}}})
    );
    assert_eq!(entries[1]["manager"], "kubectl");
    assert_eq!(
        entries[1]["fieldsV1"],
        json!({"f:data": {"f:key": {}, "f:other": {}}, "f:metadata": {"f:labels": {"f:app": {}}}})
    );
}

const D1: &str = "apiVersion: apps/v1
kind: Deployment
metadata:
  name: sd
  labels: {a: b}
spec:
  replicas: 2
  selector:
    matchLabels: {app: sd}
  template:
    metadata:
      labels: {app: sd}
    spec:
      containers:
      - name: a
        image: nginx
        env:
        - {name: X, value: \"1\"}
      - name: b
        image: busybox
        args: [\"sleep\", \"1\"]
";

const D2: &str = "apiVersion: apps/v1
kind: Deployment
metadata:
  name: sd
spec:
  selector:
    matchLabels: {app: sd}
  template:
    metadata:
      labels: {app: sd}
    spec:
      containers:
      - name: a
        image: nginx:2
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_merges_by_schema() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();

    // Associative lists are owned item by item (`k:`), atomic ones (args) and atomic maps
    // (the selector) as a whole.
    ok(&k_in(None, &kc, &["apply", "--server-side", "-f", "-"], Some(D1)).await);
    let m = managed(&kc, "deployment", "sd").await;
    assert_eq!(
        m["kubectl"],
        entry(
            "kubectl",
            "Apply",
            "apps/v1",
            json!({
                "f:metadata": {"f:labels": {"f:a": {}}},
                "f:spec": {
                    "f:replicas": {},
                    "f:selector": {},
                    "f:template": {
                        "f:metadata": {"f:labels": {"f:app": {}}},
                        "f:spec": {"f:containers": {
                            "k:{\"name\":\"a\"}": {
                                ".": {},
                                "f:env": {"k:{\"name\":\"X\"}": {".": {}, "f:name": {}, "f:value": {}}},
                                "f:image": {},
                                "f:name": {},
                            },
                            "k:{\"name\":\"b\"}": {".": {}, "f:args": {}, "f:image": {}, "f:name": {}},
                        }},
                    },
                },
            })
        )
    );

    // Another applier changing a container's image conflicts with kubectl, path by key.
    let out = k_in(
        None,
        &kc,
        &["apply", "--server-side", "--field-manager=other", "-f", "-"],
        Some(D2),
    )
    .await;
    assert!(!out.ok);
    assert!(
        out.stderr.starts_with(
            "error: Apply failed with 1 conflict: conflict with \"kubectl\": .spec.template.spec.containers[name=\"a\"].image\n"
        ),
        "{}",
        out.stderr
    );
    ok(&k_in(
        None,
        &kc,
        &[
            "apply",
            "--server-side",
            "--field-manager=other",
            "--force-conflicts",
            "-f",
            "-",
        ],
        Some(D2),
    )
    .await);
    // kubectl now applies the smaller configuration: container b, the env and the
    // replicas it no longer applies go; what `other` co-owns stays.
    ok(&k_in(None, &kc, &["apply", "--server-side", "-f", "-"], Some(D2)).await);
    let obj = out_json(&k(&kc, &["get", "deployment", "sd", "-o", "json"]).await);
    let containers = obj["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap();
    assert_eq!(containers.len(), 1, "{containers:?}");
    assert_eq!(containers[0]["name"], "a");
    assert_eq!(containers[0]["image"], "nginx:2");
    assert!(containers[0].get("env").is_none(), "{:?}", containers[0]);
    assert!(obj["metadata"].get("labels").is_none());
    let shared = json!({"f:spec": {
        "f:selector": {},
        "f:template": {
            "f:metadata": {"f:labels": {"f:app": {}}},
            "f:spec": {"f:containers": {"k:{\"name\":\"a\"}": {".": {}, "f:image": {}, "f:name": {}}}},
        },
    }});
    let m = managed(&kc, "deployment", "sd").await;
    assert_eq!(m.len(), 2, "{m:?}");
    assert_eq!(
        m["kubectl"],
        entry("kubectl", "Apply", "apps/v1", shared.clone())
    );
    assert_eq!(m["other"], entry("other", "Apply", "apps/v1", shared));

    // kubectl create records the defaults too; a scale records a `scale` subresource entry
    // that takes spec.replicas over.
    ok(&k(
        &kc,
        &["create", "deployment", "web", "--image=nginx", "--port=80"],
    )
    .await);
    ok(&k(&kc, &["scale", "deployment", "web", "--replicas=3"]).await);
    let m = managed(&kc, "deployment", "web").await;
    assert_eq!(
        m["kubectl/scale"],
        json!({
            "manager": "kubectl", "operation": "Update", "apiVersion": "apps/v1",
            "subresource": "scale", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:spec": {"f:replicas": {}}},
        })
    );
    // Writes to the status subresource are recorded per subresource, applies included,
    // and conflicts name the subresource.
    let status = "apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
status:
  replicas: 5
  conditions:
  - type: Progressing
    status: \"True\"
";
    ok(&k_in(
        None,
        &kc,
        &[
            "apply",
            "--server-side",
            "--subresource=status",
            "--field-manager=ctl",
            "-f",
            "-",
        ],
        Some(status),
    )
    .await);
    ok(&k(
        &kc,
        &[
            "patch",
            "deployment",
            "web",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"replicas":4,"readyReplicas":1}}"#,
        ],
    )
    .await);
    let m = managed(&kc, "deployment", "web").await;
    assert_eq!(
        m["ctl/status"],
        json!({
            "manager": "ctl", "operation": "Apply", "apiVersion": "apps/v1",
            "subresource": "status", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:status": {"f:conditions": {
                "k:{\"type\":\"Progressing\"}": {".": {}, "f:status": {}, "f:type": {}},
            }}},
        })
    );
    assert_eq!(
        m["kubectl-patch/status"]["fieldsV1"],
        json!({"f:status": {"f:readyReplicas": {}, "f:replicas": {}}})
    );
    let replicas = "apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 7
";
    let out = k_in(
        None,
        &kc,
        &["apply", "--server-side", "--field-manager=ctl2", "-f", "-"],
        Some(replicas),
    )
    .await;
    assert!(
        out.stderr.starts_with(
            "error: Apply failed with 1 conflict: conflict with \"kubectl\" with subresource \"scale\" using apps/v1: .spec.replicas\n"
        ),
        "{}",
        out.stderr
    );

    assert_eq!(
        m["kubectl-create"]["fieldsV1"],
        json!({
            "f:metadata": {"f:labels": {".": {}, "f:app": {}}},
            "f:spec": {
                "f:progressDeadlineSeconds": {},
                "f:revisionHistoryLimit": {},
                "f:selector": {},
                "f:strategy": {
                    "f:rollingUpdate": {".": {}, "f:maxSurge": {}, "f:maxUnavailable": {}},
                    "f:type": {},
                },
                "f:template": {
                    "f:metadata": {"f:labels": {".": {}, "f:app": {}}},
                    "f:spec": {
                        "f:containers": {"k:{\"name\":\"nginx\"}": {
                            ".": {},
                            "f:image": {},
                            "f:imagePullPolicy": {},
                            "f:name": {},
                            "f:ports": {
                                ".": {},
                                "k:{\"containerPort\":80,\"protocol\":\"TCP\"}": {
                                    ".": {}, "f:containerPort": {}, "f:protocol": {},
                                },
                            },
                            "f:resources": {},
                            "f:terminationMessagePath": {},
                            "f:terminationMessagePolicy": {},
                        }},
                        "f:dnsPolicy": {},
                        "f:restartPolicy": {},
                        "f:schedulerName": {},
                        "f:securityContext": {},
                        "f:terminationGracePeriodSeconds": {},
                    },
                },
            },
        })
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_managers_are_capped() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    ok(&k(
        &kc,
        &["create", "configmap", "capped", "--from-literal=a=b"],
    )
    .await);
    for i in 1..=11 {
        let label = format!("l{i}=v");
        let manager = format!("--field-manager=m{i}");
        ok(&k(&kc, &["label", "configmap", "capped", &label, &manager]).await);
    }
    // Twelve updaters: the three oldest share one `ancient-changes` entry, which holds the
    // creator's fields (the oldest of all).
    let m = managed(&kc, "configmap", "capped").await;
    assert_eq!(m.len(), 10, "{:?}", m.keys());
    let ancient = &m["ancient-changes"];
    assert_eq!(ancient["operation"], "Update");
    assert_eq!(ancient["fieldsV1"]["f:data"], json!({".": {}, "f:a": {}}));
    let labels = ancient["fieldsV1"]["f:metadata"]["f:labels"]
        .as_object()
        .unwrap();
    assert_eq!(labels.len(), 3, "{labels:?}");
    assert!(m.contains_key("m11"));
}

/// What admission (ServiceAccount, DefaultTolerationSeconds), the strategies'
/// PrepareForCreate and the Service IP allocation set is not owned by the creating
/// manager, as kube-apiserver records the request before those steps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_records_the_request_not_admission() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    // The default account may already exist; the pods below need it.
    let _ = k(&kc, &["create", "serviceaccount", "default"]).await;
    ok(&k(&kc, &["create", "serviceaccount", "sa1"]).await);

    ok(&k(&kc, &["run", "p1", "--image=nginx"]).await);
    let m = managed(&kc, "pod", "p1").await;
    let container = json!({
        ".": {}, "f:image": {}, "f:imagePullPolicy": {}, "f:name": {}, "f:resources": {},
        "f:terminationMessagePath": {}, "f:terminationMessagePolicy": {},
    });
    let pod_spec = json!({
        "f:containers": {"k:{\"name\":\"p1\"}": container},
        "f:dnsPolicy": {}, "f:enableServiceLinks": {}, "f:restartPolicy": {},
        "f:schedulerName": {}, "f:securityContext": {}, "f:terminationGracePeriodSeconds": {},
    });
    assert_eq!(
        m["kubectl-run"],
        entry(
            "kubectl-run",
            "Update",
            "v1",
            json!({"f:metadata": {"f:labels": {".": {}, "f:run": {}}}, "f:spec": pod_spec}),
        )
    );
    // Admission still ran.
    let pod = out_json(&k(&kc, &["get", "pod", "p1", "-o", "json"]).await);
    assert_eq!(pod["spec"]["serviceAccountName"], "default");
    assert_eq!(pod["spec"]["serviceAccount"], "default");
    assert_eq!(pod["spec"]["tolerations"].as_array().unwrap().len(), 2);

    // Fields the request names are its own, even those admission also touches.
    let out = k_in(
        None,
        &kc,
        &["create", "-f", "-"],
        Some(
            "apiVersion: v1
kind: Pod
metadata: {name: p2}
spec:
  serviceAccountName: sa1
  tolerations: [{key: a, operator: Exists}]
  containers: [{name: c, image: nginx}]
",
        ),
    )
    .await;
    ok(&out);
    let m = managed(&kc, "pod", "p2").await;
    let spec = m["kubectl-create"]["fieldsV1"]["f:spec"]
        .as_object()
        .unwrap();
    for f in ["f:serviceAccount", "f:serviceAccountName", "f:tolerations"] {
        assert!(spec.contains_key(f), "{f} missing from {spec:?}");
    }

    ok(&k(
        &kc,
        &["create", "service", "clusterip", "s1", "--tcp=80:80"],
    )
    .await);
    let m = managed(&kc, "service", "s1").await;
    let port = json!({".": {}, "f:name": {}, "f:port": {}, "f:protocol": {}, "f:targetPort": {}});
    assert_eq!(
        m["kubectl-create"],
        entry(
            "kubectl-create",
            "Update",
            "v1",
            json!({
                "f:metadata": {"f:labels": {".": {}, "f:app": {}}},
                "f:spec": {
                    "f:internalTrafficPolicy": {},
                    "f:ports": {".": {}, "k:{\"port\":80,\"protocol\":\"TCP\"}": port},
                    "f:selector": {}, "f:sessionAffinity": {}, "f:type": {},
                },
            }),
        )
    );
    let svc = out_json(&k(&kc, &["get", "service", "s1", "-o", "json"]).await);
    assert_eq!(svc["spec"]["ipFamilies"], json!(["IPv4"]));
    assert_eq!(svc["spec"]["ipFamilyPolicy"], "SingleStack");
    // Allocated from the service CIDR, 10.96.0.0/12.
    let ip: std::net::Ipv4Addr = svc["spec"]["clusterIP"].as_str().unwrap().parse().unwrap();
    assert!(
        ip.octets()[0] == 10 && (96..112).contains(&ip.octets()[1]),
        "{ip}"
    );

    // Headless: clusterIPs is normalised from clusterIP after the record.
    ok(&k(
        &kc,
        &["create", "service", "clusterip", "s2", "--clusterip=None"],
    )
    .await);
    let m = managed(&kc, "service", "s2").await;
    let spec = m["kubectl-create"]["fieldsV1"]["f:spec"]
        .as_object()
        .unwrap();
    assert!(spec.contains_key("f:clusterIP"), "{spec:?}");
    assert!(!spec.contains_key("f:clusterIPs"), "{spec:?}");

    // A namespace's spec.finalizers is PrepareForCreate's.
    ok(&k(&kc, &["create", "namespace", "n1"]).await);
    let m = managed(&kc, "namespace", "n1").await;
    assert!(
        m["kubectl-create"]["fieldsV1"].get("f:spec").is_none(),
        "{m:?}"
    );
    let ns = out_json(&k(&kc, &["get", "namespace", "n1", "-o", "json"]).await);
    assert_eq!(ns["spec"]["finalizers"], json!(["kubernetes"]));
}
