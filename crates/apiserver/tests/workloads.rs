//! The workload resources (apps/v1, batch/v1, core/v1 ReplicationControllers and
//! PodTemplates, autoscaling/v2) driven by the real kubectl: upstream's defaults, validation
//! messages, tables and the `scale` and `status` subresources.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;

mod common;
use common::*;

/// `kubectl get -o json` of one object.
async fn get_json(kc: &std::path::Path, what: &[&str]) -> Value {
    let mut args = vec!["get"];
    args.extend_from_slice(what);
    args.extend_from_slice(&["-o", "json"]);
    out_json(&k(kc, &args).await)
}

/// The header and the whitespace-separated cells of the first row of a kubectl table.
fn table(out: &Out) -> (String, Vec<String>) {
    assert!(out.ok, "{}", out.stderr);
    let mut lines = out.stdout.lines();
    let header = lines.next().unwrap_or("").trim_end().to_owned();
    let row = lines
        .next()
        .unwrap_or("")
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    (header, row)
}

/// An age cell as kubectl prints it (`0s`, `12s`, `2m3s`).
fn is_age(s: &str) -> bool {
    s.ends_with('s') && s.chars().next().is_some_and(|c| c.is_ascii_digit())
}

const BAD_DEPLOYMENT: &str = "apiVersion: apps/v1
kind: Deployment
metadata: {name: bad}
spec:
  selector: {matchLabels: {app: v}}
  template:
    metadata: {labels: {app: w}}
    spec:
      containers: [{name: c, image: \"\"}]
";

const BAD_DEPLOYMENT_2: &str = "apiVersion: apps/v1
kind: Deployment
metadata: {name: bad2}
spec:
  replicas: -1
  revisionHistoryLimit: -2
  minReadySeconds: -1
  strategy: {type: Recreate, rollingUpdate: {maxSurge: 1}}
  template:
    metadata: {labels: {app: w}}
    spec:
      restartPolicy: Never
      containers: [{name: c, image: x}]
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployments_defaults_scale_status_and_table() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();

    let out = k(
        &kc,
        &[
            "create",
            "deployment",
            "web",
            "--image=nginx:1.29",
            "--port=80",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(out.stdout.trim(), "deployment.apps/web created");

    // Upstream's defaults, the template's pod defaults and an empty status.
    let d = get_json(&kc, &["deploy", "web"]).await;
    assert_eq!(d["metadata"]["generation"], 1);
    let spec = &d["spec"];
    assert_eq!(spec["replicas"], 1);
    assert_eq!(spec["revisionHistoryLimit"], 10);
    assert_eq!(spec["progressDeadlineSeconds"], 600);
    assert_eq!(spec["strategy"]["type"], "RollingUpdate");
    assert_eq!(spec["strategy"]["rollingUpdate"]["maxSurge"], "25%");
    assert_eq!(spec["strategy"]["rollingUpdate"]["maxUnavailable"], "25%");
    assert_eq!(spec["selector"]["matchLabels"]["app"], "web");
    let pod = &spec["template"]["spec"];
    assert_eq!(pod["restartPolicy"], "Always");
    assert_eq!(pod["dnsPolicy"], "ClusterFirst");
    assert_eq!(pod["schedulerName"], "default-scheduler");
    assert_eq!(pod["terminationGracePeriodSeconds"], 30);
    assert_eq!(pod["securityContext"], serde_json::json!({}));
    let c = &pod["containers"][0];
    assert_eq!(c["imagePullPolicy"], "IfNotPresent");
    assert_eq!(c["terminationMessagePath"], "/dev/termination-log");
    assert_eq!(c["ports"][0]["protocol"], "TCP");
    // Pod-only defaults and admission stay off templates.
    assert!(pod.get("enableServiceLinks").is_none(), "{pod}");
    assert!(pod.get("tolerations").is_none(), "{pod}");
    assert!(pod.get("serviceAccountName").is_none(), "{pod}");
    assert_eq!(d["status"], serde_json::json!({}));

    let out = k(
        &kc,
        &["create", "deploy", "web2", "--image=nginx", "--replicas=2"],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let d2 = get_json(&kc, &["deploy", "web2"]).await;
    assert_eq!(d2["spec"]["replicas"], 2);
    assert_eq!(
        d2["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"],
        "Always"
    );

    // kubectl scale patches deployments/scale: spec.replicas changes, generation bumps.
    let out = k(&kc, &["scale", "deploy", "web", "--replicas=3"]).await;
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(out.stdout.trim(), "deployment.apps/web scaled");
    let d = get_json(&kc, &["deploy", "web"]).await;
    assert_eq!(d["spec"]["replicas"], 3);
    assert_eq!(d["metadata"]["generation"], 2);

    let scale_path = "/apis/apps/v1/namespaces/default/deployments/web/scale";
    let scale = out_json(&k(&kc, &["get", "--raw", scale_path]).await);
    assert_eq!(scale["kind"], "Scale");
    assert_eq!(scale["apiVersion"], "autoscaling/v1");
    assert_eq!(scale["metadata"]["name"], "web");
    assert_eq!(scale["metadata"]["uid"], d["metadata"]["uid"]);
    assert_eq!(
        scale["metadata"]["resourceVersion"],
        d["metadata"]["resourceVersion"]
    );
    assert_eq!(scale["spec"]["replicas"], 3);
    assert_eq!(scale["status"]["replicas"], 0);
    assert_eq!(scale["status"]["selector"], "app=web");

    // The Scale's own table.
    let (header, row) = table(&k(&kc, &["get", "deploy", "web", "--subresource=scale"]).await);
    assert_eq!(header, "NAME   DESIRED   AVAILABLE   AGE");
    assert_eq!(&row[..3], ["web", "3", "0"]);

    // PUT of a Scale; a stale resourceVersion conflicts.
    let dir = tempfile::tempdir().unwrap();
    let put = dir.path().join("scale.json");
    std::fs::write(
        &put,
        r#"{"apiVersion":"autoscaling/v1","kind":"Scale","metadata":{"name":"web","namespace":"default"},"spec":{"replicas":4}}"#,
    )
    .unwrap();
    let out = k(
        &kc,
        &["replace", "--raw", scale_path, "-f", put.to_str().unwrap()],
    )
    .await;
    let scale = out_json(&out);
    assert_eq!(scale["kind"], "Scale");
    assert_eq!(scale["spec"]["replicas"], 4);
    std::fs::write(
        &put,
        r#"{"apiVersion":"autoscaling/v1","kind":"Scale","metadata":{"name":"web","namespace":"default","resourceVersion":"1"},"spec":{"replicas":5}}"#,
    )
    .unwrap();
    let out = k(
        &kc,
        &["replace", "--raw", scale_path, "-f", put.to_str().unwrap()],
    )
    .await;
    assert!(!out.ok);
    assert!(
        out.stderr
            .contains("Operation cannot be fulfilled on deployments.apps \"web\""),
        "{}",
        out.stderr
    );
    let out = k(
        &kc,
        &[
            "patch",
            "deploy",
            "web",
            "--subresource=scale",
            "--type=merge",
            "-p",
            r#"{"spec":{"replicas":-1}}"#,
        ],
    )
    .await;
    assert!(!out.ok);
    assert_eq!(
        out.stderr.trim(),
        "The Scale \"web\" is invalid: spec.replicas: Invalid value: -1: must be greater than or equal to 0"
    );
    let d = get_json(&kc, &["deploy", "web"]).await;
    assert_eq!(d["spec"]["replicas"], 4);
    assert_eq!(d["metadata"]["generation"], 3);

    // Status changes only through deployments/status, without a new generation.
    let out = k(
        &kc,
        &[
            "patch",
            "deploy",
            "web",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"replicas":4,"readyReplicas":2,"updatedReplicas":3,"availableReplicas":1}}"#,
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let out = k(
        &kc,
        &[
            "patch",
            "deploy",
            "web",
            "--type=merge",
            "-p",
            r#"{"status":{"replicas":9}}"#,
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let d = get_json(&kc, &["deploy", "web"]).await;
    assert_eq!(d["status"]["replicas"], 4);
    assert_eq!(d["metadata"]["generation"], 3);
    // An annotation is copied to ReplicaSets, so it counts as a change.
    let out = k(&kc, &["annotate", "deploy", "web", "team=a"]).await;
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(
        get_json(&kc, &["deploy", "web"]).await["metadata"]["generation"],
        4
    );

    // The table, upstream's columns and cells.
    let (header, row) = table(&k(&kc, &["get", "deploy", "web"]).await);
    assert_eq!(header, "NAME   READY   UP-TO-DATE   AVAILABLE   AGE");
    assert_eq!(&row[..4], ["web", "2/4", "3", "1"]);
    assert!(is_age(&row[4]), "{row:?}");
    let (header, row) = table(&k(&kc, &["get", "deploy", "web", "-o", "wide"]).await);
    assert_eq!(
        header,
        "NAME   READY   UP-TO-DATE   AVAILABLE   AGE   CONTAINERS   IMAGES       SELECTOR"
    );
    assert_eq!(&row[5..], ["nginx", "nginx:1.29", "app=web"]);

    // Validation, with upstream's paths and messages.
    let out = k_in(None, &kc, &["create", "-f", "-"], Some(BAD_DEPLOYMENT)).await;
    assert!(!out.ok);
    assert_eq!(
        out.stderr.trim_end(),
        "The Deployment \"bad\" is invalid: \n\
         * spec.template.metadata.labels: Invalid value: {\"app\":\"w\"}: `selector` does not match template `labels`\n\
         * spec.template.spec.containers[0].image: Required value"
    );
    let out = k_in(None, &kc, &["create", "-f", "-"], Some(BAD_DEPLOYMENT_2)).await;
    assert!(!out.ok);
    assert_eq!(
        out.stderr.trim_end(),
        "The Deployment \"bad2\" is invalid: \n\
         * spec.replicas: Invalid value: -1: must be greater than or equal to 0\n\
         * spec.selector: Required value\n\
         * spec.template.metadata.labels: Invalid value: {\"app\":\"w\"}: `selector` does not match template `labels`\n\
         * spec.template.spec.restartPolicy: Unsupported value: \"Never\": supported values: \"Always\"\n\
         * spec.strategy.rollingUpdate: Forbidden: may not be specified when strategy `type` is 'Recreate'\n\
         * spec.minReadySeconds: Invalid value: -1: must be greater than or equal to 0\n\
         * spec.revisionHistoryLimit: Invalid value: -2: must be greater than or equal to 0"
    );
    // The selector is immutable.
    let out = k(
        &kc,
        &[
            "patch",
            "deploy",
            "web",
            "--type=merge",
            "-p",
            r#"{"spec":{"selector":{"matchLabels":{"app":"x"}},"template":{"metadata":{"labels":{"app":"x"}}}}}"#,
        ],
    )
    .await;
    assert!(!out.ok);
    assert_eq!(
        out.stderr.trim(),
        "The Deployment \"web\" is invalid: spec.selector: Invalid value: {\"matchLabels\":{\"app\":\"x\"}}: field is immutable"
    );

    let out = k(&kc, &["delete", "deployment", "web"]).await;
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(out.stdout.trim(), "deployment.apps \"web\" deleted");
    let out = k(&kc, &["get", "deploy", "web"]).await;
    assert!(!out.ok);
    assert!(
        out.stderr.contains("deployments.apps \"web\" not found"),
        "{}",
        out.stderr
    );
}

const APPS: &str = "apiVersion: apps/v1
kind: ReplicaSet
metadata: {name: rs1}
spec:
  selector: {matchLabels: {app: rs1}}
  template:
    metadata: {labels: {app: rs1}}
    spec: {containers: [{name: c, image: nginx}]}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: sts1}
spec:
  selector: {matchLabels: {app: sts1}}
  template:
    metadata: {labels: {app: sts1}}
    spec: {containers: [{name: c, image: nginx}]}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: ds1}
spec:
  selector: {matchLabels: {app: ds1}}
  template:
    metadata: {labels: {app: ds1}}
    spec: {nodeSelector: {disk: ssd}, containers: [{name: c, image: nginx}]}
---
apiVersion: apps/v1
kind: ControllerRevision
metadata:
  name: sts1-1
  ownerReferences: [{apiVersion: apps/v1, kind: StatefulSet, name: sts1, uid: u, controller: true}]
data: {a: 1}
revision: 3
---
apiVersion: v1
kind: ReplicationController
metadata: {name: rc1}
spec:
  template:
    metadata: {labels: {app: rc1}}
    spec: {containers: [{name: c, image: nginx}]}
---
apiVersion: v1
kind: PodTemplate
metadata: {name: pt1}
template:
  metadata: {labels: {app: pt1}}
  spec: {containers: [{name: c, image: nginx}]}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_sets_stateful_sets_daemon_sets_and_core_workloads() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    let out = k_in(None, &kc, &["create", "-f", "-"], Some(APPS)).await;
    assert!(out.ok, "{}", out.stderr);

    let rs = get_json(&kc, &["rs", "rs1"]).await;
    assert_eq!(rs["spec"]["replicas"], 1);
    assert_eq!(rs["status"], serde_json::json!({"replicas": 0}));
    assert_eq!(rs["metadata"]["generation"], 1);

    let sts = get_json(&kc, &["sts", "sts1"]).await;
    assert_eq!(sts["spec"]["podManagementPolicy"], "OrderedReady");
    assert_eq!(
        sts["spec"]["updateStrategy"],
        serde_json::json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 0, "maxUnavailable": 1}})
    );
    assert_eq!(
        sts["spec"]["persistentVolumeClaimRetentionPolicy"],
        serde_json::json!({"whenDeleted": "Retain", "whenScaled": "Retain"})
    );
    assert_eq!(sts["spec"]["serviceName"], "");
    assert_eq!(sts["spec"]["revisionHistoryLimit"], 10);
    assert_eq!(
        sts["status"],
        serde_json::json!({"replicas": 0, "availableReplicas": 0})
    );

    let ds = get_json(&kc, &["ds", "ds1"]).await;
    assert_eq!(
        ds["spec"]["updateStrategy"],
        serde_json::json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}})
    );
    assert_eq!(
        ds["metadata"]["annotations"]["deprecated.daemonset.template.generation"],
        "1"
    );
    assert_eq!(ds["status"]["desiredNumberScheduled"], 0);

    // A ReplicationController takes its selector and labels from its template.
    let rc = get_json(&kc, &["rc", "rc1"]).await;
    assert_eq!(rc["spec"]["selector"], serde_json::json!({"app": "rc1"}));
    assert_eq!(rc["metadata"]["labels"], serde_json::json!({"app": "rc1"}));
    assert_eq!(rc["spec"]["replicas"], 1);

    let pt = get_json(&kc, &["podtemplate", "pt1"]).await;
    assert_eq!(pt["template"]["spec"]["restartPolicy"], "Always");
    assert_eq!(pt["metadata"]["generation"], 1);

    // scale through the subresource, for each resource that has one.
    for (what, path) in [
        (
            "rs/rs1",
            "/apis/apps/v1/namespaces/default/replicasets/rs1/scale",
        ),
        (
            "sts/sts1",
            "/apis/apps/v1/namespaces/default/statefulsets/sts1/scale",
        ),
        (
            "rc/rc1",
            "/api/v1/namespaces/default/replicationcontrollers/rc1/scale",
        ),
    ] {
        let out = k(&kc, &["scale", what, "--replicas=5"]).await;
        assert!(out.ok, "{what}: {}", out.stderr);
        let scale = out_json(&k(&kc, &["get", "--raw", path]).await);
        assert_eq!(scale["spec"]["replicas"], 5, "{what}");
        let app = what.split('/').nth(1).unwrap();
        assert_eq!(scale["status"]["selector"], format!("app={app}"), "{what}");
        assert_eq!(get_json(&kc, &[what]).await["spec"]["replicas"], 5);
    }
    // DaemonSets have no scale.
    let out = k(&kc, &["scale", "ds/ds1", "--replicas=2"]).await;
    assert!(!out.ok);

    // A template change counts in the DaemonSet's template generation.
    let out = k(&kc, &["set", "image", "ds/ds1", "c=nginx:2"]).await;
    assert!(out.ok, "{}", out.stderr);
    let ds = get_json(&kc, &["ds", "ds1"]).await;
    assert_eq!(
        ds["metadata"]["annotations"]["deprecated.daemonset.template.generation"],
        "2"
    );
    assert_eq!(ds["metadata"]["generation"], 2);

    // StatefulSets refuse changes to their immutable fields.
    let out = k(
        &kc,
        &[
            "patch",
            "sts",
            "sts1",
            "--type=merge",
            "-p",
            r#"{"spec":{"serviceName":"other"}}"#,
        ],
    )
    .await;
    assert!(!out.ok);
    assert_eq!(
        out.stderr.trim(),
        "The StatefulSet \"sts1\" is invalid: spec.serviceName: Invalid value: \"other\": field is immutable"
    );

    // Tables.
    let (header, row) = table(&k(&kc, &["get", "rs", "-o", "wide"]).await);
    assert_eq!(
        header,
        "NAME   DESIRED   CURRENT   READY   AGE   CONTAINERS   IMAGES   SELECTOR"
    );
    assert_eq!(&row[..4], ["rs1", "5", "0", "0"]);
    assert_eq!(&row[5..], ["c", "nginx", "app=rs1"]);
    let (header, row) = table(&k(&kc, &["get", "sts", "-o", "wide"]).await);
    assert_eq!(header, "NAME   READY   AGE   CONTAINERS   IMAGES");
    assert_eq!(row[..2], ["sts1", "0/5"]);
    let (header, row) = table(&k(&kc, &["get", "ds", "-o", "wide"]).await);
    assert_eq!(
        header,
        "NAME   DESIRED   CURRENT   READY   UP-TO-DATE   AVAILABLE   NODE SELECTOR   AGE   CONTAINERS   IMAGES    SELECTOR"
    );
    assert_eq!(&row[..7], ["ds1", "0", "0", "0", "0", "0", "disk=ssd"]);
    assert_eq!(&row[8..], ["c", "nginx:2", "app=ds1"]);
    let (header, row) = table(&k(&kc, &["get", "controllerrevisions"]).await);
    assert_eq!(header, "NAME     CONTROLLER              REVISION   AGE");
    assert_eq!(&row[..3], ["sts1-1", "statefulset.apps/sts1", "3"]);
    let (header, row) = table(&k(&kc, &["get", "rc", "-o", "wide"]).await);
    assert_eq!(
        header,
        "NAME   DESIRED   CURRENT   READY   AGE   CONTAINERS   IMAGES   SELECTOR"
    );
    assert_eq!(&row[5..], ["c", "nginx", "app=rc1"]);
    let (header, row) = table(&k(&kc, &["get", "podtemplates"]).await);
    assert_eq!(header, "NAME   CONTAINERS   IMAGES   POD LABELS");
    assert_eq!(row, ["pt1", "c", "nginx", "app=pt1"]);

    // Status updates are validated on their own.
    let out = k(
        &kc,
        &[
            "patch",
            "sts",
            "sts1",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"replicas":1,"currentReplicas":2,"availableReplicas":1}}"#,
        ],
    )
    .await;
    assert!(!out.ok);
    assert_eq!(
        out.stderr.trim_end(),
        "The StatefulSet \"sts1\" is invalid: \n\
         * status.currentReplicas: Invalid value: 2: cannot be greater than status.replicas\n\
         * status.availableReplicas: Invalid value: 1: cannot be greater than status.readyReplicas"
    );
    let out = k(
        &kc,
        &[
            "patch",
            "rc",
            "rc1",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"replicas":2,"readyReplicas":2}}"#,
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    // ReplicationControllers select on status.replicas.
    let out = k(
        &kc,
        &[
            "get",
            "rc",
            "--field-selector",
            "status.replicas=2",
            "-o",
            "name",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(out.stdout.trim(), "replicationcontroller/rc1");
    let out = k(
        &kc,
        &[
            "get",
            "rc",
            "--field-selector",
            "status.replicas=0",
            "-o",
            "name",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(out.stdout.trim(), "");

    // A controller revision's data never changes.
    let out = k(
        &kc,
        &[
            "patch",
            "controllerrevision",
            "sts1-1",
            "--type=merge",
            "-p",
            r#"{"data":{"b":2}}"#,
        ],
    )
    .await;
    assert!(!out.ok);
    assert!(
        out.stderr.contains("data: Invalid value") && out.stderr.contains("field is immutable"),
        "{}",
        out.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_cron_jobs_and_autoscalers() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();

    let out = k(
        &kc,
        &["create", "job", "j1", "--image=busybox", "--", "echo", "hi"],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(out.stdout.trim(), "job.batch/j1 created");
    let j = get_json(&kc, &["job", "j1"]).await;
    let uid = j["metadata"]["uid"].as_str().unwrap().to_owned();
    let spec = &j["spec"];
    assert_eq!(spec["completions"], 1);
    assert_eq!(spec["parallelism"], 1);
    assert_eq!(spec["backoffLimit"], 6);
    assert_eq!(spec["completionMode"], "NonIndexed");
    assert_eq!(spec["suspend"], false);
    assert_eq!(spec["manualSelector"], false);
    assert_eq!(spec["podReplacementPolicy"], "TerminatingOrFailed");
    // The generated selector, and the labels that go with it.
    assert_eq!(
        spec["selector"],
        serde_json::json!({"matchLabels": {"batch.kubernetes.io/controller-uid": uid}})
    );
    let labels = serde_json::json!({
        "batch.kubernetes.io/controller-uid": uid,
        "batch.kubernetes.io/job-name": "j1",
        "controller-uid": uid,
        "job-name": "j1",
    });
    assert_eq!(spec["template"]["metadata"]["labels"], labels);
    assert_eq!(j["metadata"]["labels"], labels);
    assert_eq!(spec["template"]["spec"]["restartPolicy"], "Never");
    assert_eq!(j["status"], serde_json::json!({}));

    let (header, row) = table(&k(&kc, &["get", "jobs", "-o", "wide"]).await);
    assert_eq!(
        header,
        "NAME   STATUS    COMPLETIONS   DURATION   AGE   CONTAINERS   IMAGES    SELECTOR"
    );
    assert_eq!(&row[..3], ["j1", "Running", "0/1"]);
    assert_eq!(
        row[row.len() - 1],
        format!("batch.kubernetes.io/controller-uid={uid}")
    );

    // A job's pods must not restart in place.
    let job = out_json(
        &k(
            &kc,
            &[
                "create",
                "job",
                "j2",
                "--image=busybox",
                "--dry-run=client",
                "-o",
                "json",
            ],
        )
        .await,
    );
    let mut bad = job.clone();
    bad["spec"]["template"]["spec"]["restartPolicy"] = "Always".into();
    let out = k_in(None, &kc, &["create", "-f", "-"], Some(&bad.to_string())).await;
    assert!(!out.ok);
    assert_eq!(
        out.stderr.trim(),
        "The Job \"j2\" is invalid: spec.template.spec.restartPolicy: Required value: valid values: \"OnFailure\", \"Never\""
    );
    // A selector the server did not generate is refused unless manualSelector is set.
    let mut manual = job.clone();
    manual["spec"]["selector"] = serde_json::json!({"matchLabels": {"a": "b"}});
    manual["spec"]["template"]["metadata"]["labels"] = serde_json::json!({"a": "b"});
    let out = k_in(None, &kc, &["create", "-f", "-"], Some(&manual.to_string())).await;
    assert!(!out.ok);
    assert!(
        out.stderr.contains("`selector` not auto-generated"),
        "{}",
        out.stderr
    );
    manual["spec"]["manualSelector"] = true.into();
    let out = k_in(None, &kc, &["create", "-f", "-"], Some(&manual.to_string())).await;
    assert!(out.ok, "{}", out.stderr);
    let j2 = get_json(&kc, &["job", "j2"]).await;
    assert_eq!(
        j2["spec"]["selector"],
        serde_json::json!({"matchLabels": {"a": "b"}})
    );
    // Pod failure policies: each rule needs exit codes or pod conditions.
    let pfp = "apiVersion: batch/v1
kind: Job
metadata: {name: j3}
spec:
  podFailurePolicy:
    rules:
    - {action: Ignore}
    - {action: Count, onExitCodes: {operator: In, values: [2, 1]}}
  template:
    spec: {restartPolicy: Never, containers: [{name: c, image: busybox}]}
";
    let out = k_in(None, &kc, &["create", "-f", "-"], Some(pfp)).await;
    assert!(!out.ok);
    assert_eq!(
        out.stderr.trim_end(),
        "The Job \"j3\" is invalid: \n\
         * spec.podFailurePolicy.rules[0]: Invalid value: specifying one of OnExitCodes and OnPodConditions is required\n\
         * spec.podFailurePolicy.rules[1].onExitCodes.values: Invalid value: [2,1]: must be ordered"
    );

    // completions of a NonIndexed job never change.
    let out = k(
        &kc,
        &[
            "patch",
            "job",
            "j1",
            "--type=merge",
            "-p",
            r#"{"spec":{"completions":3}}"#,
        ],
    )
    .await;
    assert!(!out.ok);
    assert_eq!(
        out.stderr.trim(),
        "The Job \"j1\" is invalid: spec.completions: Invalid value: 3: field is immutable"
    );

    let out = k(
        &kc,
        &[
            "create",
            "cronjob",
            "cj1",
            "--image=busybox",
            "--schedule=*/5 * * * *",
            "--",
            "echo",
            "hi",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let cj = get_json(&kc, &["cronjob", "cj1"]).await;
    assert_eq!(cj["spec"]["concurrencyPolicy"], "Allow");
    assert_eq!(cj["spec"]["suspend"], false);
    assert_eq!(cj["spec"]["successfulJobsHistoryLimit"], 3);
    assert_eq!(cj["spec"]["failedJobsHistoryLimit"], 1);
    assert_eq!(
        cj["spec"]["jobTemplate"]["spec"]["template"]["spec"]["restartPolicy"],
        "OnFailure"
    );
    assert_eq!(cj["metadata"]["generation"], 1);
    let (header, row) = table(&k(&kc, &["get", "cronjobs"]).await);
    assert_eq!(
        header,
        "NAME   SCHEDULE      TIMEZONE   SUSPEND   ACTIVE   LAST SCHEDULE   AGE"
    );
    assert_eq!(
        &row[..8],
        ["cj1", "*/5", "*", "*", "*", "*", "<none>", "False"]
    );
    for (schedule, msg) in [
        ("61 * * * *", "end of range (61) above maximum (59): 61"),
        ("hello", "expected exactly 5 fields, found 1: [hello]"),
        (
            "TZ=UTC * * * * *",
            "cannot use TZ or CRON_TZ in schedule, use timeZone field instead",
        ),
    ] {
        let out = k(
            &kc,
            &[
                "create",
                "cronjob",
                "cj2",
                "--image=busybox",
                &format!("--schedule={schedule}"),
            ],
        )
        .await;
        assert!(!out.ok);
        assert_eq!(
            out.stderr.trim(),
            format!(
                "error: failed to create cronjob: CronJob.batch \"cj2\" is invalid: spec.schedule: Invalid value: \"{schedule}\": {msg}"
            )
        );
    }

    // autoscaling/v2 HorizontalPodAutoscalers.
    let hpa = "apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: web}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: web}
  maxReplicas: 5
";
    let out = k_in(None, &kc, &["create", "-f", "-"], Some(hpa)).await;
    assert!(out.ok, "{}", out.stderr);
    let h = get_json(&kc, &["hpa", "web"]).await;
    assert_eq!(h["spec"]["minReplicas"], 1);
    assert_eq!(
        h["spec"]["metrics"],
        serde_json::json!([{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}])
    );
    let (header, row) = table(&k(&kc, &["get", "hpa"]).await);
    assert_eq!(
        header,
        "NAME   REFERENCE        TARGETS              MINPODS   MAXPODS   REPLICAS   AGE"
    );
    assert_eq!(
        &row[..7],
        [
            "web",
            "Deployment/web",
            "cpu:",
            "<unknown>/80%",
            "1",
            "5",
            "0"
        ]
    );
    let out = k(
        &kc,
        &[
            "patch",
            "hpa",
            "web",
            "--type=merge",
            "-p",
            r#"{"spec":{"minReplicas":0,"maxReplicas":0}}"#,
        ],
    )
    .await;
    assert!(!out.ok);
    assert_eq!(
        out.stderr.trim_end(),
        "The HorizontalPodAutoscaler \"web\" is invalid: \n\
         * spec.metrics: Forbidden: must specify at least one Object or External metric to support scaling to zero replicas\n\
         * spec.maxReplicas: Required value"
    );

    // kubectl autoscale writes autoscaling/v1, read back as autoscaling/v2.
    let out = k(&kc, &["create", "deploy", "api", "--image=nginx"]).await;
    assert!(out.ok, "{}", out.stderr);
    let out = k(
        &kc,
        &["autoscale", "deploy", "api", "--max=4", "--cpu-percent=50"],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let h = get_json(&kc, &["hpa", "api"]).await;
    assert_eq!(h["apiVersion"], "autoscaling/v2");
    assert_eq!(
        h["spec"]["metrics"],
        serde_json::json!([{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}}}])
    );
    assert_eq!(
        h["status"],
        serde_json::json!({"currentMetrics": null, "desiredReplicas": 0})
    );
    let v1_path = "/apis/autoscaling/v1/namespaces/default/horizontalpodautoscalers";
    let v1 = out_json(&k(&kc, &["get", "--raw", &format!("{v1_path}/api")]).await);
    assert_eq!(v1["apiVersion"], "autoscaling/v1");
    assert_eq!(v1["spec"]["targetCPUUtilizationPercentage"], 50);
    assert_eq!(v1["spec"]["minReplicas"], 1);
    assert_eq!(
        v1["status"],
        serde_json::json!({"currentReplicas": 0, "desiredReplicas": 0})
    );
    // What v1 has no field for travels in annotations, and survives a v1 update.
    let multi = "apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: multi}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: web}
  maxReplicas: 5
  metrics:
  - {type: Resource, resource: {name: cpu, target: {type: Utilization, averageUtilization: 60}}}
  - {type: Pods, pods: {metric: {name: qps}, target: {type: AverageValue, averageValue: 1k}}}
";
    let out = k_in(None, &kc, &["create", "-f", "-"], Some(multi)).await;
    assert!(out.ok, "{}", out.stderr);
    let mut v1 = out_json(&k(&kc, &["get", "--raw", &format!("{v1_path}/multi")]).await);
    assert_eq!(v1["spec"]["targetCPUUtilizationPercentage"], 60);
    assert_eq!(
        v1["metadata"]["annotations"]["autoscaling.alpha.kubernetes.io/metrics"],
        r#"[{"type":"Pods","pods":{"metricName":"qps","targetAverageValue":"1k"}}]"#
    );
    v1["spec"]["maxReplicas"] = 7.into();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hpa.json");
    std::fs::write(&file, v1.to_string()).unwrap();
    let out = k(
        &kc,
        &[
            "replace",
            "--raw",
            &format!("{v1_path}/multi"),
            "-f",
            file.to_str().unwrap(),
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let h = get_json(&kc, &["hpa", "multi"]).await;
    assert_eq!(h["spec"]["maxReplicas"], 7);
    assert_eq!(h["metadata"]["generation"], 2);
    assert!(h["metadata"].get("annotations").is_none(), "{h}");
    assert_eq!(
        h["spec"]["metrics"],
        serde_json::json!([
            {"type": "Pods", "pods": {"metric": {"name": "qps"}, "target": {"type": "AverageValue", "averageValue": "1k"}}},
            {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 60}}},
        ])
    );
}

/// A DELETE without a propagation policy orphans the dependents of core/v1
/// ReplicationControllers and batch/v1 Jobs (upstream keeps that default for
/// compatibility, and warns for Jobs); other kinds delete them; events take no
/// garbage-collection finalizer at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_garbage_collection_policies() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    let manifest = r#"
apiVersion: v1
kind: ReplicationController
metadata: {name: rc, namespace: default}
spec:
  replicas: 0
  selector: {app: rc}
  template:
    metadata: {labels: {app: rc}}
    spec: {containers: [{name: c, image: busybox}]}
---
apiVersion: batch/v1
kind: Job
metadata: {name: job, namespace: default}
spec:
  suspend: true
  template:
    spec:
      restartPolicy: Never
      containers: [{name: c, image: busybox}]
---
apiVersion: apps/v1
kind: ReplicaSet
metadata: {name: rs, namespace: default}
spec:
  replicas: 0
  selector: {matchLabels: {app: rs}}
  template:
    metadata: {labels: {app: rs}}
    spec: {containers: [{name: c, image: busybox}]}
"#;
    let out = k_in(None, &kc, &["create", "-f", "-"], Some(manifest)).await;
    assert!(out.ok, "{}", out.stderr);
    let finalizers = |what: &'static str| {
        let kc = kc.clone();
        async move {
            let o = k(&kc, &["get", what, "-o", "jsonpath={.metadata.finalizers}"]).await;
            o.stdout
        }
    };
    let out = k(
        &kc,
        &[
            "delete",
            "--raw",
            "/api/v1/namespaces/default/replicationcontrollers/rc",
        ],
    )
    .await;
    assert!(out.ok && !out.stderr.contains("Warning"), "{}", out.stderr);
    assert_eq!(finalizers("rc/rc").await, r#"["orphan"]"#);
    let out = k(
        &kc,
        &[
            "delete",
            "--raw",
            "/apis/batch/v1/namespaces/default/jobs/job",
        ],
    )
    .await;
    assert!(
        out.stderr
            .contains("Warning: child pods are preserved by default when jobs are deleted"),
        "{}",
        out.stderr
    );
    assert!(finalizers("job/job").await.contains("orphan"));
    // A ReplicaSet's dependents go: no finalizer, it is deleted at once.
    let out = k(
        &kc,
        &[
            "delete",
            "--raw",
            "/apis/apps/v1/namespaces/default/replicasets/rs",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    assert!(!k(&kc, &["get", "rs/rs"]).await.ok);
}
