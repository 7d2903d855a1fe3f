//! `kubectl get` prints the same tables for kumo as for kube-apiserver v1.37.2: the same
//! objects are created on both (the reference started by `scripts/reference up`, kumo's API
//! server in process), then every resource is listed with `-o wide` and with `-A`, and the
//! outputs are compared line by line. Only what depends on when each side ran or on a random
//! generator is masked (ages, `CREATED AT` timestamps, generated uids); cluster IPs and node
//! ports are fixed in the manifest so they match.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::{Command, Stdio};

use kumo_apiserver::{ApiServer, ApiServerConfig};
use kumo_e2e::ReferenceCluster;

const MANIFEST: &str = r#"
apiVersion: v1
kind: ServiceAccount
metadata: {name: default, namespace: default}
---
apiVersion: v1
kind: Namespace
metadata: {name: tables, labels: {t: tables}}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: cm, namespace: default, labels: {t: tables}}
data: {a: "1", b: "2"}
---
apiVersion: v1
kind: Secret
metadata: {name: s, namespace: default, labels: {t: tables}}
stringData: {user: admin}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default, labels: {t: tables}}
spec:
  clusterIP: 10.96.10.10
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 8080}, {name: https, port: 443}]
---
apiVersion: v1
kind: Service
metadata: {name: np, namespace: default, labels: {t: tables}}
spec:
  type: NodePort
  clusterIP: 10.96.10.11
  selector: {app: web}
  ports: [{port: 80, nodePort: 30080}]
---
apiVersion: v1
kind: Service
metadata: {name: headless, namespace: default, labels: {t: tables}}
spec: {clusterIP: None, selector: {app: db}, ports: [{port: 5432}]}
---
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: default, labels: {t: tables, app: web}}
spec:
  containers: [{name: web, image: nginx:1.29}, {name: side, image: busybox:1.37}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default, labels: {t: tables}}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {containers: [{name: web, image: nginx:1.29}]}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db, namespace: default, labels: {t: tables}}
spec:
  serviceName: headless
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec: {containers: [{name: db, image: postgres:17}]}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent, namespace: default, labels: {t: tables}}
spec:
  selector: {matchLabels: {app: agent}}
  template:
    metadata: {labels: {app: agent}}
    spec:
      nodeSelector: {kubernetes.io/os: linux}
      containers: [{name: agent, image: busybox:1.37}]
---
apiVersion: batch/v1
kind: Job
metadata: {name: once, namespace: default, labels: {t: tables}}
spec:
  template:
    spec:
      restartPolicy: Never
      containers: [{name: c, image: busybox:1.37, command: [date]}]
---
apiVersion: batch/v1
kind: CronJob
metadata: {name: tick, namespace: default, labels: {t: tables}}
spec:
  schedule: "*/5 * * * *"
  jobTemplate:
    spec:
      template:
        spec:
          restartPolicy: OnFailure
          containers: [{name: c, image: busybox:1.37}]
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: web, namespace: default, labels: {t: tables}}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: web}
  minReplicas: 1
  maxReplicas: 5
  metrics: [{type: Resource, resource: {name: cpu, target: {type: Utilization, averageUtilization: 50}}}]
---
apiVersion: coordination.k8s.io/v1
kind: Lease
metadata: {name: l, namespace: default, labels: {t: tables}}
spec: {holderIdentity: node-1, leaseDurationSeconds: 40}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: reader, namespace: default, labels: {t: tables}}
rules: [{apiGroups: [""], resources: [pods], verbs: [get, list]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: reader, namespace: default, labels: {t: tables}}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: reader}
subjects:
- {kind: User, name: alice, apiGroup: rbac.authorization.k8s.io}
- {kind: ServiceAccount, name: default, namespace: default}
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: high, labels: {t: tables}}
value: 1000
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: fast
  labels: {t: tables}
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: example.com/fast
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: pv1, labels: {t: tables}}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteOnce]
  hostPath: {path: /tmp/pv1}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data, namespace: default, labels: {t: tables}}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web, namespace: default, labels: {t: tables}}
spec: {minAvailable: 1, selector: {matchLabels: {app: web}}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: web, namespace: default, labels: {t: tables}}
spec:
  rules:
  - host: web.example.com
    http:
      paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny, namespace: default, labels: {t: tables}}
spec: {podSelector: {}, policyTypes: [Ingress]}
---
apiVersion: v1
kind: LimitRange
metadata: {name: lr, namespace: default, labels: {t: tables}}
spec: {limits: [{type: Container, default: {cpu: 500m}}]}
---
apiVersion: v1
kind: ResourceQuota
metadata: {name: rq, namespace: default, labels: {t: tables}}
spec: {hard: {pods: "10"}}
---
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {name: runc, labels: {t: tables}}
handler: runc
---
apiVersion: v1
kind: Node
metadata: {name: node-1, labels: {t: tables, node-role.kubernetes.io/control-plane: ""}}
"#;

/// Resources listed on both sides (all with the `t=tables` label selector).
const RESOURCES: &[&str] = &[
    "namespaces",
    "configmaps",
    "secrets",
    "services",
    "pods",
    "deployments",
    "statefulsets",
    "daemonsets",
    "jobs",
    "cronjobs",
    "horizontalpodautoscalers",
    "leases",
    "roles",
    "rolebindings",
    "priorityclasses",
    "storageclasses",
    "persistentvolumes",
    "persistentvolumeclaims",
    "poddisruptionbudgets",
    "ingresses",
    "networkpolicies",
    "limitranges",
    "resourcequotas",
    "runtimeclasses",
    "nodes",
];

fn kubectl(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> String {
    let mut child = Command::new("kubectl")
        .env_remove("KUBECONFIG")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut input = child.stdin.take().unwrap();
        if let Some(s) = stdin {
            input.write_all(s.as_bytes()).unwrap();
        }
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "kubectl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Masks ages (`5s`, `2m3s`), timestamps and uids, which differ with timing or chance only.
fn mask(table: &str) -> String {
    let stamp = regex::Regex::new(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ").unwrap();
    let uid =
        regex::Regex::new(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}").unwrap();
    let padding = regex::Regex::new(r" {2,}").unwrap();
    let table = stamp.replace_all(table, "<timestamp>");
    let table = uid.replace_all(&table, "<uid>");
    table
        .lines()
        .map(|l| {
            l.split_inclusive(' ')
                .map(|tok| {
                    let t = tok.trim_end();
                    let is_age = !t.is_empty()
                        && t.chars().all(|c| c.is_ascii_digit() || "smhdy".contains(c))
                        && t.chars().next().is_some_and(|c| c.is_ascii_digit())
                        && t.chars().last().is_some_and(|c| "smhdy".contains(c));
                    if is_age {
                        format!("{:<width$}", "<age>", width = tok.len().max(5))
                    } else {
                        tok.to_owned()
                    }
                })
                .collect::<String>()
        })
        // Column padding follows the widest cell, and ages differ in width between the two
        // sides when one is slower (99s vs 100s): compare cells, not padding. kubectl pads
        // with at least three spaces, so single spaces inside a cell are kept.
        .map(|l| padding.replace_all(l.trim_end(), "   ").into_owned())
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_tables_match_the_reference() {
    let tmp = tempfile::tempdir().unwrap();
    let ref_dir = tmp.path().join("ref");
    let reference =
        tokio::task::spawn_blocking(move || ReferenceCluster::up(&ref_dir, false).unwrap())
            .await
            .unwrap();
    let mut cfg = ApiServerConfig::new(tmp.path().join("kumo"));
    cfg.bind = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
    let kumo = ApiServer::start(cfg).await.unwrap();
    let sides = [
        ("reference", reference.kubeconfig().to_path_buf()),
        ("kumo", kumo.admin_kubeconfig.clone()),
    ];
    let outputs = tokio::task::spawn_blocking(move || {
        let mut outputs: Vec<Vec<(String, String)>> = Vec::new();
        for (_, kc) in &sides {
            kubectl(kc, &["create", "-f", "-"], Some(MANIFEST));
        }
        for (_, kc) in &sides {
            let mut tables = Vec::new();
            for r in RESOURCES {
                for extra in [&["-o", "wide"][..], &["-A"][..]] {
                    let mut args = vec!["get", r, "-l", "t=tables"];
                    args.extend_from_slice(extra);
                    tables.push((args.join(" "), mask(&kubectl(kc, &args, None))));
                }
            }
            outputs.push(tables);
        }
        outputs
    })
    .await
    .unwrap();
    let mut differences = Vec::new();
    for ((cmd, want), (_, got)) in outputs[0].iter().zip(&outputs[1]) {
        if want != got {
            differences.push(format!(
                "kubectl {cmd}\n--- reference\n{want}\n--- kumo\n{got}\n"
            ));
        }
    }
    // The tables are not empty: every resource printed its object.
    for (cmd, table) in &outputs[1] {
        assert!(
            table.lines().count() >= 2,
            "kubectl {cmd} printed no rows:\n{table}"
        );
    }
    let _ = tokio::task::spawn_blocking(move || reference.down()).await;
    assert!(
        differences.is_empty(),
        "{} of {} tables differ:\n{}",
        differences.len(),
        outputs[0].len(),
        differences.join("\n")
    );
}
