//! The stock kubectl (1.32 on PATH, and 1.33 beside it) against `kumo apiserver`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Stdio};
use std::time::Duration;

mod common;
use common::*;

const MANIFEST: &str = "apiVersion: v1
kind: ConfigMap
metadata:
  name: web-config
  labels: {app: web, tier: front}
data:
  a: \"1\"
  b: \"2\"
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: db-config
  labels: {app: db}
data:
  c: \"3\"
---
apiVersion: v1
kind: Secret
metadata:
  name: creds
stringData:
  user: admin
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_drives_the_api_server() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    assert!(server.startup < Duration::from_secs(5));

    let out = k(&kc, &["get", "--raw", "/readyz?verbose"]).await;
    assert!(out.ok, "{}", out.stderr);
    assert!(
        out.stdout.trim_end().ends_with("readyz check passed"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("[+]etcd ok\n[+]informer-sync ok\n"));
    // One check alone, one that does not exist, a check excluded, and the checks' SLIs.
    let out = k(&kc, &["get", "--raw", "/livez/etcd"]).await;
    assert_eq!(
        (out.ok, out.stdout.as_str()),
        (true, "ok"),
        "{}",
        out.stderr
    );
    let out = k(&kc, &["get", "--raw", "/livez/no-such-check"]).await;
    assert!(!out.ok && out.stderr.contains("NotFound"), "{}", out.stderr);
    let out = k(&kc, &["get", "--raw", "/healthz?verbose&exclude=etcd"]).await;
    assert!(
        out.stdout.contains("[+]etcd excluded: ok\n"),
        "{}",
        out.stdout
    );
    // A short request's timeout must be a Go duration (upstream's request deadline).
    let out = k(&kc, &["get", "--raw", "/version?timeout=invalid"]).await;
    assert!(
        !out.ok
            && out.stderr.contains(
                "invalid timeout specified in the request URL - time: invalid duration \"invalid\""
            ),
        "{}",
        out.stderr
    );
    assert!(k(&kc, &["get", "--raw", "/version?timeout=90s"]).await.ok);
    let out = k(&kc, &["get", "--raw", "/metrics/slis"]).await;
    assert!(
        out.stdout
            .contains("kubernetes_healthcheck{name=\"etcd\",type=\"readyz\"} 1\n")
            && out.stdout.contains(
                "kubernetes_healthchecks_total{name=\"etcd\",status=\"success\",type=\"readyz\"}"
            ),
        "{}",
        out.stdout
    );

    let out = k(&kc, &["version", "-o", "json"]).await;
    assert!(out.ok, "{}", out.stderr);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert!(v["serverVersion"]["gitVersion"]
        .as_str()
        .unwrap()
        .starts_with("v1.37.2"));

    // Server-side printing: the namespaces every cluster has, in a table.
    let out = k(&kc, &["get", "namespaces"]).await;
    assert!(out.ok, "{}", out.stderr);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert!(
        lines[0].starts_with("NAME") && lines[0].contains("STATUS") && lines[0].contains("AGE")
    );
    for ns in ["default", "kube-node-lease", "kube-public", "kube-system"] {
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(ns) && l.contains("Active")),
            "{ns}: {}",
            out.stdout
        );
    }

    // Multi-document create (client-side schema validation needs /openapi, not yet served).
    let out = k_in(None, &kc, &["create", "-f", "-"], Some(MANIFEST)).await;
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(
        out.stdout.lines().collect::<Vec<_>>(),
        [
            "configmap/web-config created",
            "configmap/db-config created",
            "secret/creds created"
        ]
    );
    // Creating again: AlreadyExists, with upstream's words.
    let out = k_in(None, &kc, &["create", "-f", "-"], Some(MANIFEST)).await;
    assert!(!out.ok);
    assert!(
        out.stderr.contains("Error from server (AlreadyExists): error when creating \"STDIN\": configmaps \"web-config\" already exists"),
        "{}",
        out.stderr
    );

    let out = k(&kc, &["get", "configmaps"]).await;
    assert!(out.ok, "{}", out.stderr);
    let rows: Vec<Vec<&str>> = out
        .stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows[0], ["NAME", "DATA", "AGE"]);
    assert_eq!(rows[1][..2], ["db-config", "1"]);
    assert_eq!(rows[2][..2], ["web-config", "2"]);

    let out = k(
        &kc,
        &[
            "get",
            "secret",
            "creds",
            "-o",
            "jsonpath={.type} {.data.user}",
        ],
    )
    .await;
    assert_eq!(out.stdout, "Opaque YWRtaW4=", "{}", out.stderr);

    // Selectors, output formats, sorting.
    let out = k(&kc, &["get", "cm", "-l", "app=web", "-o", "name"]).await;
    assert_eq!(out.stdout.trim(), "configmap/web-config", "{}", out.stderr);
    let out = k(
        &kc,
        &[
            "get",
            "cm",
            "-l",
            "app in (web,db),tier!=front",
            "-o",
            "name",
        ],
    )
    .await;
    assert_eq!(out.stdout.trim(), "configmap/db-config", "{}", out.stderr);
    let out = k(
        &kc,
        &[
            "get",
            "cm",
            "--field-selector",
            "metadata.name=db-config",
            "-o",
            "name",
        ],
    )
    .await;
    assert_eq!(out.stdout.trim(), "configmap/db-config", "{}", out.stderr);
    let out = k(&kc, &["get", "cm", "--show-labels"]).await;
    assert!(out.stdout.lines().next().unwrap().ends_with("LABELS"));
    assert!(out.stdout.contains("app=web,tier=front"), "{}", out.stdout);
    let out = k(&kc, &["get", "cm", "--sort-by", "{.data.c}", "-o", "name"]).await;
    assert!(out.ok, "{}", out.stderr);
    let out = k(&kc, &["get", "cm", "-A", "-o", "wide"]).await;
    assert!(
        out.stdout.lines().next().unwrap().starts_with("NAMESPACE"),
        "{}",
        out.stdout
    );
    let out = k(&kc, &["get", "cm", "web-config", "-o", "yaml"]).await;
    assert!(
        out.stdout.contains("resourceVersion:") && out.stdout.contains("uid:"),
        "{}",
        out.stdout
    );
    let out = k(&kc, &["get", "cm", "--field-selector", "data.a=1"]).await;
    assert!(!out.ok);
    assert!(
        out.stderr.contains(
            r#""data.a" is not a known field selector: only "metadata.name", "metadata.namespace""#
        ),
        "{}",
        out.stderr
    );
    let out = k(&kc, &["get", "cm", "-l", "bad key"]).await;
    assert!(!out.ok);
    assert!(out.stderr.contains("BadRequest"), "{}", out.stderr);

    // Label, annotate and the three patch types.
    assert!(k(&kc, &["label", "cm", "web-config", "env=prod"]).await.ok);
    assert!(
        k(&kc, &["annotate", "cm", "web-config", "note=hello"])
            .await
            .ok
    );
    assert!(
        k(
            &kc,
            &[
                "patch",
                "cm",
                "web-config",
                "--type",
                "merge",
                "-p",
                r#"{"data":{"m":"merge"}}"#
            ]
        )
        .await
        .ok
    );
    assert!(
        k(
            &kc,
            &[
                "patch",
                "cm",
                "web-config",
                "--type",
                "json",
                "-p",
                r#"[{"op":"add","path":"/data/j","value":"json"}]"#
            ]
        )
        .await
        .ok
    );
    assert!(
        k(
            &kc,
            &[
                "patch",
                "cm",
                "web-config",
                "-p",
                r#"{"data":{"s":"strategic"}}"#
            ]
        )
        .await
        .ok
    );
    let out = k(&kc, &["get", "cm", "web-config", "-o", "json"]).await;
    let cm: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(cm["metadata"]["labels"]["env"], "prod");
    assert_eq!(cm["metadata"]["annotations"]["note"], "hello");
    assert_eq!(cm["data"]["m"], "merge");
    assert_eq!(cm["data"]["j"], "json");
    assert_eq!(cm["data"]["s"], "strategic");
    // A JSON patch that cannot apply is refused and changes nothing.
    let out = k(
        &kc,
        &[
            "patch",
            "cm",
            "web-config",
            "--type",
            "json",
            "-p",
            r#"[{"op":"replace","path":"/data/nope","value":"x"}]"#,
        ],
    )
    .await;
    assert!(!out.ok);

    // A stale resourceVersion is a Conflict.
    let stale = out_json(&k(&kc, &["get", "cm", "db-config", "-o", "json"]).await);
    assert!(
        k(&kc, &["label", "cm", "db-config", "touched=yes"])
            .await
            .ok
    );
    let out = k_in(None, &kc, &["replace", "-f", "-"], Some(&stale.to_string())).await;
    assert!(!out.ok);
    assert!(
        out.stderr.contains("Operation cannot be fulfilled on configmaps \"db-config\": the object has been modified; please apply your changes to the latest version and try again"),
        "{}",
        out.stderr
    );

    // Validation errors: 422 with the field, as kube-apiserver words it.
    let bad = r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"Bad_Name"},"data":{"bad key":"x"}}"#;
    let out = k_in(None, &kc, &["create", "-f", "-"], Some(bad)).await;
    assert!(!out.ok);
    // kubectl lists the causes of the Status, one per line.
    assert!(out.stderr.contains("The ConfigMap \"Bad_Name\" is invalid: \n* metadata.name: Invalid value: \"Bad_Name\": a lowercase RFC 1123 subdomain"), "{}", out.stderr);
    assert!(out.stderr.contains("\n* data[bad key]: Invalid value: \"bad key\": a valid config key must consist of alphanumeric characters"), "{}", out.stderr);

    // Watch: a change and a delete arrive as events. The changes are made only after the
    // watcher printed the object's ADDED event, so a slow start cannot reorder them.
    let mut watcher = Command::new(kubectl_bin(None))
        .args([
            "get",
            "cm",
            "web-config",
            "-w",
            "--output-watch-events",
            "-o",
            "jsonpath={.type} {.object.metadata.name}{\"\\n\"}",
            "--request-timeout=30s",
        ])
        .env("KUBECONFIG", &kc)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let stdout = watcher.stdout.take().unwrap();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    assert_eq!(next_line(&mut rx).await, "ADDED web-config");
    assert!(
        k(&kc, &["label", "cm", "web-config", "watched=yes"])
            .await
            .ok
    );
    assert_eq!(next_line(&mut rx).await, "MODIFIED web-config");
    let out = k(&kc, &["delete", "cm", "web-config"]).await;
    assert_eq!(
        out.stdout.trim(),
        "configmap \"web-config\" deleted",
        "{}",
        out.stderr
    );
    assert_eq!(next_line(&mut rx).await, "DELETED web-config");
    let _ = watcher.kill();
    let _ = watcher.wait();

    let out = k(&kc, &["get", "cm", "web-config"]).await;
    assert!(!out.ok);
    assert!(
        out.stderr
            .contains("Error from server (NotFound): configmaps \"web-config\" not found"),
        "{}",
        out.stderr
    );

    // Unknown namespace: NotFound for the namespace.
    let out = k_in(
        None,
        &kc,
        &["create", "-n", "nowhere", "-f", "-"],
        Some(
            bad.replace("Bad_Name", "ok")
                .replace("bad key", "k")
                .as_str(),
        ),
    )
    .await;
    assert!(
        out.stderr.contains("namespaces \"nowhere\" not found"),
        "{}",
        out.stderr
    );

    // kubectl 1.33 reads the same server.
    let out = k_in(
        Some("1.33"),
        &kc,
        &["get", "cm", "db-config", "-o", "name"],
        None,
    )
    .await;
    assert_eq!(out.stdout.trim(), "configmap/db-config", "{}", out.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paginated_lists() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    let mut docs = String::new();
    for i in 0..25 {
        docs.push_str(&format!(
            "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm-{i:02}\n  labels: {{parity: \"{}\"}}\n",
            i % 2
        ));
    }
    assert!(
        k_in(None, &kc, &["create", "-f", "-"], Some(&docs))
            .await
            .ok
    );
    // kubectl pages with limit/continue and must see every object once.
    let out = k(&kc, &["get", "cm", "--chunk-size=4", "-o", "name"]).await;
    let names: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(names.len(), 25, "{}", out.stderr);
    let out = k(
        &kc,
        &[
            "get",
            "cm",
            "--chunk-size=3",
            "-l",
            "parity=1",
            "-o",
            "name",
        ],
    )
    .await;
    assert_eq!(out.stdout.lines().count(), 12, "{}", out.stderr);
    // The raw list carries remainingItemCount and a continue token.
    let out = k(
        &kc,
        &[
            "get",
            "--raw",
            "/api/v1/namespaces/default/configmaps?limit=10",
        ],
    )
    .await;
    let list: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(list["kind"], "ConfigMapList");
    assert_eq!(list["items"].as_array().unwrap().len(), 10);
    assert_eq!(list["metadata"]["remainingItemCount"], 15);
    assert!(
        list["items"][0].get("kind").is_none(),
        "list items carry no kind"
    );
    let token = list["metadata"]["continue"].as_str().unwrap();
    let out = k(
        &kc,
        &[
            "get",
            "--raw",
            &format!("/api/v1/namespaces/default/configmaps?limit=10&continue={token}"),
        ],
    )
    .await;
    let page2: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(page2["items"][0]["metadata"]["name"], "cm-10");
    assert_eq!(
        page2["metadata"]["resourceVersion"],
        list["metadata"]["resourceVersion"]
    );
    let out = k(
        &kc,
        &[
            "get",
            "--raw",
            "/api/v1/namespaces/default/configmaps?limit=10&continue=garbage",
        ],
    )
    .await;
    assert!(
        out.stderr.contains("BadRequest") || out.stderr.contains("continue"),
        "{}",
        out.stderr
    );
}

/// `kubectl create <type>` sends protobuf bodies (client-go's typed clients do).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_create_commands_send_protobuf() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    let out = k(&kc, &["create", "namespace", "team-a"]).await;
    assert_eq!(
        out.stdout.trim(),
        "namespace/team-a created",
        "{}",
        out.stderr
    );
    // A namespace's /status takes metadata changes too (upstream's status strategy only
    // resets the spec), as the conformance test's patch of an annotation and a condition.
    let out = k(
        &kc,
        &[
            "patch",
            "namespace",
            "team-a",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"metadata":{"annotations":{"patched":"yes"}},"status":{"conditions":[{"type":"StatusPatch","status":"True","reason":"E2E","message":"m"}]}}"#,
            "-o",
            "jsonpath={.metadata.annotations.patched} {.status.conditions[0].reason} {.status.phase}",
        ],
    )
    .await;
    assert_eq!(out.stdout, "yes E2E Active", "{}", out.stderr);
    let out = k(
        &kc,
        &[
            "-n",
            "team-a",
            "create",
            "configmap",
            "settings",
            "--from-literal=color=blue",
            "--from-literal=size=10",
        ],
    )
    .await;
    assert_eq!(
        out.stdout.trim(),
        "configmap/settings created",
        "{}",
        out.stderr
    );
    let out = k(
        &kc,
        &[
            "-n",
            "team-a",
            "create",
            "secret",
            "generic",
            "pw",
            "--from-literal=password=s3cret",
        ],
    )
    .await;
    assert_eq!(out.stdout.trim(), "secret/pw created", "{}", out.stderr);
    let out = k(
        &kc,
        &[
            "-n",
            "team-a",
            "get",
            "cm",
            "settings",
            "-o",
            "jsonpath={.data.color}/{.data.size}",
        ],
    )
    .await;
    assert_eq!(out.stdout, "blue/10", "{}", out.stderr);
    let out = k(
        &kc,
        &[
            "-n",
            "team-a",
            "get",
            "secret",
            "pw",
            "-o",
            "jsonpath={.type} {.data.password}",
        ],
    )
    .await;
    assert_eq!(out.stdout, "Opaque czNjcmV0", "{}", out.stderr);
    let out = k(
        &kc,
        &[
            "get",
            "ns",
            "team-a",
            "-o",
            "jsonpath={.status.phase} {.metadata.labels}",
        ],
    )
    .await;
    assert_eq!(
        out.stdout, "Active {\"kubernetes.io/metadata.name\":\"team-a\"}",
        "{}",
        out.stderr
    );
    // Validation of a protobuf body reads like any other.
    let out = k(&kc, &["create", "namespace", "Team_B"]).await;
    assert!(!out.ok);
    assert!(
        out.stderr.contains("The Namespace \"Team_B\" is invalid: metadata.name: Invalid value: \"Team_B\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-'"),
        "{}",
        out.stderr
    );
    // Deleting a namespace marks it Terminating (the namespace controller finishes it).
    let out = k(&kc, &["delete", "namespace", "team-a", "--wait=false"]).await;
    assert!(out.ok, "{}", out.stderr);
    let out = k(
        &kc,
        &["get", "ns", "team-a", "-o", "jsonpath={.status.phase}"],
    )
    .await;
    assert_eq!(out.stdout, "Terminating", "{}", out.stderr);
    let out = k(&kc, &["-n", "team-a", "create", "configmap", "late"]).await;
    assert!(
        out.stderr.contains(
            "unable to create new content in namespace team-a because it is being terminated"
        ),
        "{}",
        out.stderr
    );
    // The namespace controller's last step: emptying spec.finalizers through /finalize
    // deletes the namespace.
    let mut ns = out_json(&k(&kc, &["get", "ns", "team-a", "-o", "json"]).await);
    ns["spec"]["finalizers"] = serde_json::json!([]);
    let file = _dir.path().join("ns.json");
    std::fs::write(&file, ns.to_string()).unwrap();
    let out = k(
        &kc,
        &[
            "replace",
            "--raw",
            "/api/v1/namespaces/team-a/finalize",
            "-f",
            file.to_str().unwrap(),
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let out = k(&kc, &["get", "ns", "team-a"]).await;
    assert!(
        out.stderr.contains("namespaces \"team-a\" not found"),
        "{}{}",
        out.stdout,
        out.stderr
    );
}

const POD: &str = "apiVersion: v1
kind: Pod
metadata:
  name: api
  labels: {app: api}
spec:
  containers:
  - name: main
    image: registry.k8s.io/pause:3.10
    ports: [{containerPort: 8080}]
    resources:
      requests: {cpu: 100m, memory: 64Mi}
      limits: {cpu: 100m, memory: 64Mi}
";

/// Pods: defaults and admission, the printed table, validation, field selectors, delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    // The ServiceAccount admission refuses pods until the account exists (the
    // service-account controller makes `default` in a full cluster).
    let out = k(&kc, &["run", "web", "--image=nginx:1.27"]).await;
    assert!(!out.ok);
    assert!(
        out.stderr.contains("error looking up service account default/default: serviceaccount \"default\" not found"),
        "{}",
        out.stderr
    );
    let out = k(&kc, &["create", "serviceaccount", "default"]).await;
    assert!(out.ok, "{}", out.stderr);
    let out = k(&kc, &["run", "web", "--image=nginx:1.27"]).await;
    assert_eq!(out.stdout.trim(), "pod/web created", "{}", out.stderr);
    let out = k_in(None, &kc, &["create", "-f", "-"], Some(POD)).await;
    assert_eq!(out.stdout.trim(), "pod/api created", "{}", out.stderr);

    let out = k(&kc, &["get", "pods"]).await;
    let rows: Vec<Vec<&str>> = out
        .stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows[0],
        ["NAME", "READY", "STATUS", "RESTARTS", "AGE"],
        "{}",
        out.stderr
    );
    assert_eq!(rows[1][..4], ["api", "0/1", "Pending", "0"]);
    assert_eq!(rows[2][..4], ["web", "0/1", "Pending", "0"]);
    let out = k(&kc, &["get", "po", "web", "-o", "wide"]).await;
    let line = out.stdout.lines().nth(1).unwrap_or("").to_owned();
    assert_eq!(
        line.split_whitespace().skip(5).collect::<Vec<_>>(),
        ["<none>", "<none>", "<none>", "<none>"],
        "{}",
        out.stdout
    );

    // Defaults (SetDefaults_*) and admission (ServiceAccount, Priority,
    // DefaultTolerationSeconds).
    let pod = out_json(&k(&kc, &["get", "pod", "web", "-o", "json"]).await);
    let spec = &pod["spec"];
    assert_eq!(spec["restartPolicy"], "Always");
    assert_eq!(spec["dnsPolicy"], "ClusterFirst");
    assert_eq!(spec["terminationGracePeriodSeconds"], 30);
    assert_eq!(spec["schedulerName"], "default-scheduler");
    assert_eq!(spec["serviceAccountName"], "default");
    assert_eq!(spec["priority"], 0);
    assert_eq!(spec["containers"][0]["imagePullPolicy"], "IfNotPresent");
    assert_eq!(
        spec["containers"][0]["terminationMessagePath"],
        "/dev/termination-log"
    );
    assert_eq!(
        spec["containers"][0]["volumeMounts"][0]["mountPath"],
        "/var/run/secrets/kubernetes.io/serviceaccount"
    );
    assert_eq!(pod["status"]["phase"], "Pending");
    assert_eq!(pod["status"]["qosClass"], "BestEffort");
    let out = k(
        &kc,
        &[
            "get",
            "pod",
            "web",
            "-o",
            "jsonpath={.spec.restartPolicy} {.spec.dnsPolicy} {.spec.containers[0].imagePullPolicy} {.spec.tolerations[*].key} {.spec.tolerations[*].tolerationSeconds}",
        ],
    )
    .await;
    assert_eq!(
        out.stdout,
        "Always ClusterFirst IfNotPresent node.kubernetes.io/not-ready node.kubernetes.io/unreachable 300 300",
        "{}",
        out.stderr
    );
    let out = k(
        &kc,
        &[
            "get",
            "pod",
            "api",
            "-o",
            "jsonpath={.status.qosClass} {.spec.containers[0].ports[0].protocol}",
        ],
    )
    .await;
    assert_eq!(out.stdout, "Guaranteed TCP", "{}", out.stderr);

    // Validation, with upstream's fields and messages.
    let bad = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"bad"},"spec":{"restartPolicy":"Sometimes","containers":[{"name":"c"}]}}"#;
    let out = k_in(None, &kc, &["create", "-f", "-"], Some(bad)).await;
    assert!(!out.ok);
    assert!(
        out.stderr.contains("The Pod \"bad\" is invalid: \n* spec.containers[0].image: Required value\n* spec.restartPolicy: Unsupported value: \"Sometimes\": supported values: \"Always\", \"OnFailure\", \"Never\""),
        "{}",
        out.stderr
    );
    // Priority admission computes the priority from the class.
    let out = k_in(
        None,
        &kc,
        &["create", "-f", "-"],
        Some(&bad.replace("\"restartPolicy\":\"Sometimes\"", "\"priority\":5")),
    )
    .await;
    assert!(
        out.stderr.contains("pods \"bad\" is forbidden: the integer value of priority (5) must not be provided in pod spec"),
        "{}",
        out.stderr
    );
    // The spec of a pod is immutable but for a few fields.
    let out = k(
        &kc,
        &[
            "patch",
            "pod",
            "web",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"restartPolicy":"Never"}}"#,
        ],
    )
    .await;
    assert!(
        out.stderr
            .contains("spec: Forbidden: pod updates may not change fields other than"),
        "{}",
        out.stderr
    );
    assert!(
        k(
            &kc,
            &[
                "patch",
                "pod",
                "web",
                "--type",
                "merge",
                "-p",
                r#"{"spec":{"activeDeadlineSeconds":60},"status":{"phase":"Running"}}"#
            ],
        )
        .await
        .ok
    );
    // Status changes only through pods/status.
    let out = k(
        &kc,
        &[
            "get",
            "pod",
            "web",
            "-o",
            "jsonpath={.spec.activeDeadlineSeconds} {.status.phase}",
        ],
    )
    .await;
    assert_eq!(out.stdout, "60 Pending", "{}", out.stderr);
    let out = k(
        &kc,
        &[
            "patch",
            "pod",
            "api",
            "--subresource=status",
            "--type",
            "merge",
            "-p",
            r#"{"status":{"phase":"Running"}}"#,
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);

    // A strategic merge patch merges containers by name: a new image is allowed.
    let out = k(&kc, &["set", "image", "pod/web", "web=nginx:1.28"]).await;
    assert!(out.ok, "{}", out.stderr);
    let out = k(
        &kc,
        &[
            "get",
            "pod",
            "web",
            "-o",
            "jsonpath={.spec.containers[0].image} {.spec.containers[0].imagePullPolicy}",
        ],
    )
    .await;
    assert_eq!(out.stdout, "nginx:1.28 IfNotPresent", "{}", out.stderr);

    // Field selectors.
    let out = k(
        &kc,
        &[
            "get",
            "pods",
            "--field-selector",
            "status.phase=Pending",
            "-o",
            "name",
        ],
    )
    .await;
    assert_eq!(out.stdout.trim(), "pod/web", "{}", out.stderr);
    let out = k(
        &kc,
        &[
            "get",
            "pods",
            "--field-selector",
            "spec.nodeName=,spec.restartPolicy=Always",
            "-o",
            "name",
        ],
    )
    .await;
    assert_eq!(out.stdout.lines().count(), 2, "{}", out.stderr);

    // A pod without a node goes at once; the answer is the pod.
    let out = k(&kc, &["delete", "pod", "web"]).await;
    assert_eq!(out.stdout.trim(), "pod \"web\" deleted", "{}", out.stderr);
    let out = k(&kc, &["get", "pod", "web"]).await;
    assert!(
        out.stderr.contains("pods \"web\" not found"),
        "{}",
        out.stderr
    );
    // A pod on a node is deleted gracefully: marked, the kubelet finishes.
    let on_node = POD
        .replace("name: api", "name: bound")
        .replace("spec:\n", "spec:\n  nodeName: node-1\n");
    assert!(
        k_in(None, &kc, &["create", "-f", "-"], Some(&on_node))
            .await
            .ok
    );
    let out = k(&kc, &["delete", "pod", "bound", "--wait=false"]).await;
    assert!(out.ok, "{}", out.stderr);
    let out = k(
        &kc,
        &[
            "get",
            "pod",
            "bound",
            "-o",
            "jsonpath={.metadata.deletionGracePeriodSeconds}",
        ],
    )
    .await;
    assert_eq!(out.stdout, "30", "{}", out.stderr);
    let out = k(&kc, &["get", "pod", "bound"]).await;
    assert!(out.stdout.contains("Terminating"), "{}", out.stdout);
    let out = k(
        &kc,
        &["delete", "pod", "bound", "--grace-period=0", "--force"],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let out = k(&kc, &["get", "pod", "bound"]).await;
    assert!(out.stderr.contains("not found"), "{}", out.stderr);
}

/// ServiceAccounts (protobuf bodies), Events and Leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_accounts_events_and_leases() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    let out = k(&kc, &["create", "serviceaccount", "x"]).await;
    assert_eq!(
        out.stdout.trim(),
        "serviceaccount/x created",
        "{}",
        out.stderr
    );
    let out = k(&kc, &["get", "sa"]).await;
    let rows: Vec<Vec<&str>> = out
        .stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows[0], ["NAME", "AGE"], "{}", out.stderr);
    assert_eq!(rows[1][0], "x");

    let lease = "apiVersion: coordination.k8s.io/v1
kind: Lease
metadata: {name: node-a, namespace: kube-node-lease}
spec: {holderIdentity: node-a, leaseDurationSeconds: 40}
";
    let out = k_in(None, &kc, &["create", "-f", "-"], Some(lease)).await;
    assert_eq!(
        out.stdout.trim(),
        "lease.coordination.k8s.io/node-a created",
        "{}",
        out.stderr
    );
    let out = k(&kc, &["get", "leases", "-n", "kube-node-lease"]).await;
    let rows: Vec<Vec<&str>> = out
        .stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows[0], ["NAME", "HOLDER", "AGE"], "{}", out.stderr);
    assert_eq!(rows[1][..2], ["node-a", "node-a"]);

    let event = "apiVersion: v1
kind: Event
metadata: {name: web.1}
involvedObject: {kind: Pod, namespace: default, name: web}
reason: Scheduled
message: Successfully assigned default/web to node-1
type: Normal
source: {component: default-scheduler}
";
    let out = k_in(None, &kc, &["create", "-f", "-"], Some(event)).await;
    assert_eq!(out.stdout.trim(), "event/web.1 created", "{}", out.stderr);
    let out = k(&kc, &["get", "events"]).await;
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"],
        "{}",
        out.stderr
    );
    assert!(
        lines[1].contains("Normal")
            && lines[1].contains("pod/web")
            && lines[1].contains("Successfully assigned"),
        "{}",
        out.stdout
    );
    let out = k(
        &kc,
        &[
            "get",
            "ev",
            "--field-selector",
            "involvedObject.kind=Pod,reason=Scheduled",
            "-o",
            "name",
        ],
    )
    .await;
    assert_eq!(out.stdout.trim(), "event/web.1", "{}", out.stderr);
    let out = k(
        &kc,
        &[
            "get",
            "ev",
            "--field-selector",
            "source=nobody",
            "-o",
            "name",
        ],
    )
    .await;
    assert!(
        out.ok && out.stdout.trim().is_empty(),
        "{} {}",
        out.stdout,
        out.stderr
    );
    // The events.k8s.io/v1 view of the same objects.
    let out = out_json(
        &k(
            &kc,
            &["get", "events.v1.events.k8s.io", "web.1", "-o", "json"],
        )
        .await,
    );
    assert_eq!(out["apiVersion"], "events.k8s.io/v1");
    assert_eq!(out["regarding"]["name"], "web");
    assert_eq!(out["note"], "Successfully assigned default/web to node-1");
    assert_eq!(out["deprecatedSource"]["component"], "default-scheduler");
    let new_event = "apiVersion: events.k8s.io/v1
kind: Event
metadata: {name: web.2}
eventTime: \"2026-01-01T00:00:00.000000Z\"
reportingController: kubelet
reportingInstance: node-1
action: Pulling
reason: Pulling
type: Normal
note: pulling image
regarding: {kind: Pod, namespace: default, name: web}
";
    let out = k_in(None, &kc, &["create", "-f", "-"], Some(new_event)).await;
    assert!(out.ok, "{}", out.stderr);
    let out = k(
        &kc,
        &[
            "get",
            "ev",
            "web.2",
            "-o",
            "jsonpath={.involvedObject.name} {.message} {.reportingComponent}",
        ],
    )
    .await;
    assert_eq!(out.stdout, "web pulling image kubelet", "{}", out.stderr);
    let out = k_in(
        None,
        &kc,
        &["create", "-f", "-"],
        Some("{\"apiVersion\":\"events.k8s.io/v1\",\"kind\":\"Event\",\"metadata\":{\"name\":\"bad\"}}"),
    )
    .await;
    assert!(
        out.stderr.contains("* eventTime: Required value"),
        "{}",
        out.stderr
    );
    // Discovery lists the new groups.
    let out = k(
        &kc,
        &[
            "api-resources",
            "--api-group=coordination.k8s.io",
            "-o",
            "name",
        ],
    )
    .await;
    assert_eq!(
        out.stdout.trim(),
        "leases.coordination.k8s.io",
        "{}",
        out.stderr
    );
}

/// An object with finalizers is only marked for deletion; removing the last finalizer
/// deletes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finalizers_hold_deletion() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    let cm = r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"held","finalizers":["example.com/hold"]}}"#;
    assert!(k_in(None, &kc, &["create", "-f", "-"], Some(cm)).await.ok);
    let out = k(&kc, &["delete", "cm", "held", "--wait=false"]).await;
    assert!(out.ok, "{}", out.stderr);
    let out = k(
        &kc,
        &[
            "get",
            "cm",
            "held",
            "-o",
            "jsonpath={.metadata.deletionTimestamp} {.metadata.finalizers}",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    assert!(
        out.stdout.ends_with(" [\"example.com/hold\"]") && out.stdout.len() > 20,
        "{}",
        out.stdout
    );
    let out = k(
        &kc,
        &[
            "patch",
            "cm",
            "held",
            "--type",
            "merge",
            "-p",
            r#"{"metadata":{"finalizers":null}}"#,
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let out = k(&kc, &["get", "cm", "held"]).await;
    assert!(
        out.stderr.contains("configmaps \"held\" not found"),
        "{}{}",
        out.stdout,
        out.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_bind_to_nodes() {
    let (_server, dir) = start().await;
    let kc = dir.path().join("admin.conf");
    for args in [
        vec!["create", "serviceaccount", "default"],
        vec!["run", "p", "--image=nginx:1.29"],
        vec!["run", "q", "--image=nginx:1.29"],
    ] {
        let out = k(&kc, &args).await;
        assert!(out.ok, "{}", out.stderr);
    }
    let post = |pod: &str, body: &str| {
        let file = dir.path().join(format!("binding-{pod}.json"));
        std::fs::write(&file, body).unwrap();
        let path = format!("/api/v1/namespaces/default/pods/{pod}/binding");
        let kc = kc.clone();
        async move {
            k(
                &kc,
                &["create", "--raw", &path, "-f", file.to_str().unwrap()],
            )
            .await
        }
    };
    let binding = r#"{"apiVersion":"v1","kind":"Binding","metadata":{"name":"p","annotations":{"scheduled-by":"test"}},"target":{"kind":"Node","name":"n1"}}"#;
    // The answers, as kube-apiserver v1.37.2 gave them for the same requests.
    let out = post("p", binding).await;
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(
        out.stdout.trim(),
        r#"{"apiVersion":"v1","code":201,"kind":"Status","metadata":{},"status":"Success"}"#
    );
    let pod = out_json(&k(&kc, &["get", "pod", "p", "-o", "json"]).await);
    assert_eq!(pod["spec"]["nodeName"], "n1");
    assert_eq!(pod["metadata"]["annotations"]["scheduled-by"], "test");
    let cond = &pod["status"]["conditions"][0];
    assert_eq!(cond["type"], "PodScheduled");
    assert_eq!(cond["status"], "True");
    assert!(cond["lastTransitionTime"].is_string());
    let out = post("p", binding).await;
    assert!(
        out.stderr.contains(
            r#"Error from server (Conflict): Operation cannot be fulfilled on pods/binding "p": pod p is already assigned to node "n1""#
        ),
        "{}",
        out.stderr
    );
    let out = post("q", binding).await;
    assert!(
        out.stderr.contains(
            "Error from server (BadRequest): name in URL does not match name in Binding object"
        ),
        "{}",
        out.stderr
    );
    let out = post(
        "q",
        r#"{"apiVersion":"v1","kind":"Binding","metadata":{"name":"q"},"target":{"kind":"Pod"}}"#,
    )
    .await;
    assert!(
        out.stderr.contains(
            r#"Error from server: [target.kind: Unsupported value: "Pod": supported values: "Node", "<empty>", target.name: Required value]"#
        ),
        "{}",
        out.stderr
    );
    // Only POST: a PUT is refused as upstream refuses it.
    let file = dir.path().join("binding-p.json");
    let out = k(
        &kc,
        &[
            "replace",
            "--raw",
            "/api/v1/namespaces/default/pods/p/binding",
            "-f",
            file.to_str().unwrap(),
        ],
    )
    .await;
    assert!(
        out.stderr
            .contains("the server does not allow this method on the requested resource"),
        "{}",
        out.stderr
    );
    // Discovery lists pods/binding as a create-only Binding subresource.
    let list = out_json(&k(&kc, &["get", "--raw", "/api/v1"]).await);
    let b = list["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "pods/binding")
        .unwrap();
    assert_eq!(b["kind"], "Binding");
    assert_eq!(b["verbs"], serde_json::json!(["create"]));
    // The older `bindings` collection binds the pod its Binding names, the same way.
    let legacy = |body: &str| {
        let file = dir.path().join("legacy-binding.json");
        std::fs::write(&file, body).unwrap();
        let kc = kc.clone();
        async move {
            k(
                &kc,
                &[
                    "create",
                    "--raw",
                    "/api/v1/namespaces/default/bindings",
                    "-f",
                    file.to_str().unwrap(),
                ],
            )
            .await
        }
    };
    let out = legacy(
        r#"{"apiVersion":"v1","kind":"Binding","metadata":{"name":"q"},"target":{"kind":"Node","name":"n2"}}"#,
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let pod = out_json(&k(&kc, &["get", "pod", "q", "-o", "json"]).await);
    assert_eq!(pod["spec"]["nodeName"], "n2");
    let out = legacy(r#"{"apiVersion":"v1","kind":"Binding","metadata":{},"target":{"kind":"Node","name":"n2"}}"#).await;
    assert!(
        out.stderr
            .contains("Error from server (BadRequest): Name parameter required."),
        "{}",
        out.stderr
    );
    let b = list["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "bindings")
        .unwrap();
    assert_eq!(b["namespaced"], true);
    assert_eq!(b["verbs"], serde_json::json!(["create"]));
}

/// POSTs an Eviction for `pod` named `body_name` in `ns`.
async fn evict(kc: &std::path::Path, ns: &str, pod: &str, body_name: &str) -> Out {
    let body = format!(
        r#"{{"apiVersion":"policy/v1","kind":"Eviction","metadata":{{"name":"{body_name}","namespace":"{ns}"}}}}"#
    );
    let path = format!("/api/v1/namespaces/{ns}/pods/{pod}/eviction");
    k_in(
        None,
        kc,
        &["create", "--raw", &path, "-f", "-"],
        Some(&body),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_evict_through_disruption_budgets() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    let ok = |o: Out| assert!(o.ok, "{}", o.stderr);
    ok(k(&kc, &["create", "ns", "ev"]).await);
    ok(k(&kc, &["-n", "ev", "create", "sa", "default"]).await);
    for p in ["p1", "p2"] {
        ok(k(
            &kc,
            &["-n", "ev", "run", p, "--image=nginx", "--labels=app=web"],
        )
        .await);
        ok(k(
            &kc,
            &[
                "-n",
                "ev",
                "patch",
                "pod",
                p,
                "--subresource=status",
                "--type=merge",
                "-p",
                r#"{"status":{"phase":"Running","conditions":[{"type":"Ready","status":"True"}]}}"#,
            ],
        )
        .await);
    }
    ok(k(
        &kc,
        &[
            "-n",
            "ev",
            "create",
            "pdb",
            "pdb1",
            "--selector=app=web",
            "--min-available=1",
        ],
    )
    .await);
    // The disruption controller has not looked at the budget yet: 429.
    let out = evict(&kc, "ev", "p1", "p1").await;
    assert!(
        out.stderr.contains(
            "(TooManyRequests): Cannot evict pod as it would violate the pod's disruption budget."
        ),
        "{}",
        out.stderr
    );
    ok(k(
        &kc,
        &["-n", "ev", "patch", "pdb", "pdb1", "--subresource=status", "--type=merge", "-p",
          r#"{"status":{"observedGeneration":1,"disruptionsAllowed":0,"currentHealthy":2,"desiredHealthy":1,"expectedPods":2}}"#],
    )
    .await);
    let out = evict(&kc, "ev", "p1", "p1").await;
    assert!(out.stderr.contains("TooManyRequests"), "{}", out.stderr);
    let out = evict(&kc, "ev", "p1", "p2").await;
    assert!(
        out.stderr
            .contains("(BadRequest): name in URL does not match name in Eviction object"),
        "{}",
        out.stderr
    );
    ok(k(
        &kc,
        &[
            "-n",
            "ev",
            "patch",
            "pdb",
            "pdb1",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"disruptionsAllowed":1}}"#,
        ],
    )
    .await);
    let out = evict(&kc, "ev", "p1", "p1").await;
    assert!(out.ok, "{}", out.stderr);
    assert!(
        out.stdout.contains(r#""status":"Success""#),
        "{}",
        out.stdout
    );
    // The budget took the disruption; the pod is gone.
    let out = k(
        &kc,
        &["-n", "ev", "get", "pdb", "pdb1", "-o", "jsonpath={.status.disruptionsAllowed} {.status.conditions[*].reason} {.status.disruptedPods.p1}"],
    )
    .await;
    assert!(
        out.stdout.starts_with("0 InsufficientPods 20"),
        "{}",
        out.stdout
    );
    assert!(!k(&kc, &["-n", "ev", "get", "pod", "p1"]).await.ok);
    // Two budgets for one pod: upstream's 500.
    ok(k(
        &kc,
        &[
            "-n",
            "ev",
            "create",
            "pdb",
            "pdb2",
            "--selector=app=web",
            "--min-available=1",
        ],
    )
    .await);
    let out = evict(&kc, "ev", "p2", "p2").await;
    assert!(out.stderr.contains("This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."), "{}", out.stderr);
    // A pending pod is not protected by any budget.
    ok(k(
        &kc,
        &["-n", "ev", "run", "p3", "--image=nginx", "--labels=app=web"],
    )
    .await);
    assert!(evict(&kc, "ev", "p3", "p3").await.ok);
}

/// `kubectl get componentstatuses` (seed 003): computed from the components' /healthz on
/// their default ports, with upstream's deprecation warning, columns and NotFound. The
/// health itself depends on what runs on this machine, so only the shape is checked; the
/// embedded store is not etcd and is not listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn component_statuses_are_computed_and_deprecated() {
    let (server, _dir) = start().await;
    let kc = &server.admin_kubeconfig;
    let out = k(kc, &["get", "componentstatuses"]).await;
    assert!(out.ok, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("Warning: v1 ComponentStatus is deprecated in v1.19+"),
        "{}",
        out.stderr
    );
    let mut lines = out.stdout.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "STATUS", "MESSAGE", "ERROR"]);
    let mut names: Vec<&str> = lines
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["controller-manager", "scheduler"]);
    let v = out_json(&k(kc, &["get", "cs", "scheduler", "-o", "json"]).await);
    assert_eq!(v["kind"], "ComponentStatus");
    assert_eq!(v["conditions"][0]["type"], "Healthy");
    assert!(v["metadata"].get("creationTimestamp").is_none());
    let out = k(kc, &["get", "cs", "nope"]).await;
    assert!(!out.ok);
    assert!(
        out.stderr
            .contains(r#"Error from server (NotFound): componentstatus "nope" not found"#),
        "{}",
        out.stderr
    );
    // Only get and list: no watch, no writes.
    let out = k(kc, &["delete", "cs", "scheduler"]).await;
    assert!(!out.ok);
    assert!(out.stderr.contains("MethodNotAllowed"), "{}", out.stderr);
}

/// kube-system holds what kube-apiserver keeps there: the client CA for delegated
/// authentication and the legacy token tracking date (YYYY-MM-DD, as upstream writes it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_system_config_maps_are_bootstrapped() {
    let (server, dir) = start().await;
    let kc = &server.admin_kubeconfig;
    let cm = out_json(
        &k(
            kc,
            &[
                "get",
                "configmap",
                "-n",
                "kube-system",
                "extension-apiserver-authentication",
                "-o",
                "json",
            ],
        )
        .await,
    );
    let ca = std::fs::read_to_string(dir.path().join("pki/ca.crt")).unwrap();
    assert_eq!(cm["data"]["client-ca-file"], ca.as_str());
    let cm = out_json(
        &k(
            kc,
            &[
                "get",
                "configmap",
                "-n",
                "kube-system",
                "kube-apiserver-legacy-service-account-token-tracking",
                "-o",
                "json",
            ],
        )
        .await,
    );
    let since = cm["data"]["since"].as_str().unwrap();
    assert_eq!(since.len(), 10, "{since}");
    assert_eq!(&since[4..5], "-");
    assert_eq!(&since[7..8], "-");
}

/// The everyday commands, each checked for what it prints, with kubectl 1.32 and 1.33 in
/// turn (each in its own namespace): api-versions, explain, client-side apply three times
/// (created, configured, unchanged), describe, custom-columns, go-template, --sort-by.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everyday_commands_in_both_kubectl_versions() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    for (version, ns) in [(None, "v132"), (Some("1.33"), "v133")] {
        let kv = |args: Vec<String>, stdin: Option<String>| {
            let kc = kc.clone();
            async move {
                let a: Vec<&str> = args.iter().map(String::as_str).collect();
                k_in(version, &kc, &a, stdin.as_deref()).await
            }
        };
        let args = |s: &str| s.split(' ').map(str::to_owned).collect::<Vec<_>>();
        let ok = |out: Out, what: &str| {
            assert!(out.ok, "{what} ({version:?}): {}", out.stderr);
            out.stdout
        };

        let versions = ok(kv(args("api-versions"), None).await, "api-versions");
        let lines: Vec<&str> = versions.lines().collect();
        for gv in [
            "v1",
            "apps/v1",
            "certificates.k8s.io/v1",
            "rbac.authorization.k8s.io/v1",
        ] {
            assert!(lines.contains(&gv), "{gv} missing: {versions}");
        }
        let mut sorted = lines.clone();
        sorted.sort();
        assert_eq!(lines, sorted, "api-versions is sorted");

        let explain = ok(kv(args("explain pod.spec"), None).await, "explain");
        assert!(explain.contains("KIND:       Pod"), "{explain}");
        assert!(explain.contains("FIELD: spec <PodSpec>"), "{explain}");
        assert!(
            explain.contains("containers\t<[]Container> -required-"),
            "{explain}"
        );

        ok(
            kv(args(&format!("create namespace {ns}")), None).await,
            "ns",
        );
        let manifest = |a: &str| {
            format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app\n  namespace: {ns}\n  labels: {{tier: web}}\ndata:\n  a: \"{a}\"\n"
            )
        };
        let apply = args("apply -f -");
        assert_eq!(
            ok(kv(apply.clone(), Some(manifest("1"))).await, "apply").trim(),
            "configmap/app created"
        );
        assert_eq!(
            ok(kv(apply.clone(), Some(manifest("2"))).await, "apply").trim(),
            "configmap/app configured"
        );
        assert_eq!(
            ok(kv(apply.clone(), Some(manifest("2"))).await, "apply").trim(),
            "configmap/app unchanged"
        );

        let describe = ok(
            kv(args(&format!("describe configmap app -n {ns}")), None).await,
            "describe",
        );
        let d: Vec<&str> = describe.lines().map(str::trim_end).collect();
        assert_eq!(d[0], "Name:         app", "{describe}");
        assert_eq!(d[1], format!("Namespace:    {ns}"), "{describe}");
        assert_eq!(d[2], "Labels:       tier=web", "{describe}");
        // The last-applied annotation is not shown, as upstream's describer skips it.
        assert_eq!(d[3], "Annotations:  <none>", "{describe}");
        let data = d.iter().position(|l| *l == "Data").expect("Data section");
        assert_eq!(&d[data..data + 5], ["Data", "====", "a:", "----", "2"]);
        assert_eq!(d.last().copied(), Some("Events:  <none>"), "{describe}");

        for (name, rank) in [("zeta", "1"), ("alpha", "3"), ("mu", "2")] {
            let m = format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {ns}\n  labels: {{sort: \"yes\"}}\ndata:\n  rank: \"{rank}\"\n"
            );
            ok(kv(args("create -f -"), Some(m)).await, "create");
        }
        let cols = ok(
            kv(
                args(&format!(
                    "get cm -n {ns} -l sort -o custom-columns=NAME:.metadata.name,RANK:.data.rank --sort-by=.metadata.name"
                )),
                None,
            )
            .await,
            "custom-columns",
        );
        let rows: Vec<Vec<&str>> = cols
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            rows,
            [
                vec!["NAME", "RANK"],
                vec!["alpha", "3"],
                vec!["mu", "2"],
                vec!["zeta", "1"]
            ],
            "{cols}"
        );
        let by_rank = ok(
            kv(
                args(&format!(
                    "get cm -n {ns} -l sort -o name --sort-by=.data.rank"
                )),
                None,
            )
            .await,
            "sort-by",
        );
        assert_eq!(
            by_rank.lines().collect::<Vec<_>>(),
            ["configmap/zeta", "configmap/mu", "configmap/alpha"]
        );
        let tmpl = ok(
            kv(
                vec![
                    "get".into(),
                    "cm".into(),
                    "-n".into(),
                    ns.into(),
                    "-l".into(),
                    "sort".into(),
                    "-o".into(),
                    "go-template={{range .items}}{{.metadata.name}}={{.data.rank}};{{end}}".into(),
                ],
                None,
            )
            .await,
            "go-template",
        );
        assert_eq!(tmpl, "alpha=3;mu=2;zeta=1;");
    }
}

/// A /status update takes the request's metadata for the resources whose upstream status
/// strategy resets only the spec (Ingress: the conformance test patches an annotation
/// through /status), all but the labels for Deployments, and none of it for those that
/// reset the metadata too (ServiceCIDR).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_updates_take_metadata_as_upstream_strategies_do() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    let out = k(
        &kc,
        &["create", "ingress", "ing", "--rule=foo.example.com/=svc:80"],
    )
    .await;
    assert_eq!(
        out.stdout.trim(),
        "ingress.networking.k8s.io/ing created",
        "{}",
        out.stderr
    );
    let status_patch = |kind: &'static str, name: &'static str, patch: &'static str| {
        let kc = kc.clone();
        async move {
            k(
                &kc,
                &[
                    "patch",
                    kind,
                    name,
                    "--subresource=status",
                    "--type=merge",
                    "-p",
                    patch,
                    "-o",
                    "jsonpath={.metadata.labels.l}/{.metadata.annotations.a}",
                ],
            )
            .await
        }
    };
    let out = status_patch(
        "ingress",
        "ing",
        r#"{"metadata":{"labels":{"l":"x"},"annotations":{"a":"y"}},"status":{"loadBalancer":{"ingress":[{"ip":"192.0.2.1"}]}}}"#,
    )
    .await;
    assert_eq!(out.stdout, "x/y", "{}", out.stderr);

    let out = k(&kc, &["create", "deployment", "web", "--image=nginx"]).await;
    assert!(out.ok, "{}", out.stderr);
    let out = status_patch(
        "deployment",
        "web",
        r#"{"metadata":{"labels":{"l":"x"},"annotations":{"a":"y"}},"status":{"observedGeneration":1}}"#,
    )
    .await;
    assert_eq!(out.stdout, "/y", "{}", out.stderr);

    let out = status_patch(
        "servicecidr",
        "kubernetes",
        r#"{"metadata":{"labels":{"l":"x"},"annotations":{"a":"y"}}}"#,
    )
    .await;
    assert_eq!(out.stdout, "/", "{}", out.stderr);
}
