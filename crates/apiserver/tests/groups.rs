//! The policy, storage, networking, certificates, flowcontrol and admissionregistration
//! groups (and core/v1 volumes and quotas) through the real kubectl: bootstrap objects,
//! defaults, tables and validation errors as kube-apiserver v1.37 answers them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

mod common;
use common::*;

/// A table with every age cell (`0s`, `12s`, ...) masked, so rows compare exactly while
/// keeping kubectl's column widths.
fn mask_ages(table: &str) -> String {
    table
        .lines()
        .map(|line| {
            line.split(' ')
                .map(|w| {
                    let digits = w.trim_end_matches('s');
                    if w.ends_with('s')
                        && !digits.is_empty()
                        && digits.bytes().all(|b| b.is_ascii_digit())
                    {
                        format!("{}s", "N".repeat(digits.len()))
                    } else {
                        w.to_owned()
                    }
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

async fn ok(kc: &Path, args: &[&str]) -> String {
    let out = k(kc, args).await;
    assert!(out.ok, "kubectl {args:?}: {}", out.stderr);
    out.stdout
}

async fn ok_stdin(kc: &Path, args: &[&str], stdin: &str) -> String {
    let out = k_in(None, kc, args, Some(stdin)).await;
    assert!(out.ok, "kubectl {args:?}: {}", out.stderr);
    out.stdout
}

/// The error kubectl prints for a refused request.
async fn err(kc: &Path, args: &[&str], stdin: Option<&str>) -> String {
    let out = k_in(None, kc, args, stdin).await;
    assert!(!out.ok, "kubectl {args:?} succeeded: {}", out.stdout);
    out.stderr.trim_end().to_owned()
}

fn table(lines: &[&str]) -> String {
    lines.join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rbac_bootstrap_policy_tables_and_validation() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();

    // The bootstrap policy: roles and bindings a kube-apiserver creates at start.
    let created = ok(
        &kc,
        &[
            "get",
            "clusterrole",
            "cluster-admin",
            "-o",
            "jsonpath={.metadata.creationTimestamp}",
        ],
    )
    .await;
    assert_eq!(
        ok(&kc, &["get", "clusterroles", "cluster-admin"])
            .await
            .trim_end(),
        table(&[
            "NAME            CREATED AT",
            &format!("cluster-admin   {created}")
        ])
    );
    let admin: serde_json::Value = serde_json::from_str(
        &ok(&kc, &["get", "clusterrole", "cluster-admin", "-o", "json"]).await,
    )
    .unwrap();
    assert_eq!(
        admin["metadata"]["labels"]["kubernetes.io/bootstrapping"],
        "rbac-defaults"
    );
    assert_eq!(
        admin["metadata"]["annotations"]["rbac.authorization.kubernetes.io/autoupdate"],
        "true"
    );
    assert_eq!(
        admin["rules"],
        serde_json::json!([
            {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
            {"nonResourceURLs": ["*"], "verbs": ["*"]},
        ])
    );
    let names = ok(&kc, &["get", "clusterroles", "-o", "name"]).await;
    for role in [
        "admin",
        "edit",
        "view",
        "system:basic-user",
        "system:discovery",
        "system:public-info-viewer",
        "system:node",
        "system:kube-scheduler",
        "system:kube-controller-manager",
        "system:node-proxier",
        "system:controller:deployment-controller",
        "system:controller:namespace-controller",
    ] {
        assert!(
            names
                .lines()
                .any(|l| l == format!("clusterrole.rbac.authorization.k8s.io/{role}")),
            "{role}"
        );
    }
    assert_eq!(
        mask_ages(ok(&kc, &["get", "clusterrolebinding", "cluster-admin", "-o", "wide"]).await.trim_end()),
        table(&[
            "NAME            ROLE                        AGE   USERS   GROUPS           SERVICEACCOUNTS",
            "cluster-admin   ClusterRole/cluster-admin   Ns            system:masters",
        ])
    );
    let subjects = |name: &'static str| {
        let kc = kc.clone();
        async move {
            ok(
                &kc,
                &[
                    "get",
                    "clusterrolebinding",
                    name,
                    "-o",
                    "jsonpath={range .subjects[*]}{.kind}:{.name} {end}",
                ],
            )
            .await
        }
    };
    assert_eq!(
        subjects("system:public-info-viewer").await.trim(),
        "Group:system:authenticated Group:system:unauthenticated"
    );
    assert_eq!(
        subjects("system:kube-scheduler").await.trim(),
        "User:system:kube-scheduler"
    );
    assert_eq!(
        subjects("system:node-proxier").await.trim(),
        "User:system:kube-proxy"
    );
    assert_eq!(
        subjects("kubeadm:cluster-admins").await.trim(),
        "Group:kubeadm:cluster-admins"
    );

    // kubectl create role / rolebinding / clusterrole / clusterrolebinding.
    ok(
        &kc,
        &[
            "create",
            "role",
            "pod-reader",
            "--verb=get,list",
            "--resource=pods",
            "-n",
            "default",
        ],
    )
    .await;
    ok(
        &kc,
        &[
            "create",
            "rolebinding",
            "rb",
            "--role=pod-reader",
            "--user=bob",
            "--group=devs",
            "--serviceaccount=default:sa1",
            "-n",
            "default",
        ],
    )
    .await;
    assert_eq!(
        mask_ages(
            ok(
                &kc,
                &["get", "rolebinding", "rb", "-n", "default", "-o", "wide"]
            )
            .await
            .trim_end()
        ),
        table(&[
            "NAME   ROLE              AGE   USERS   GROUPS   SERVICEACCOUNTS",
            "rb     Role/pod-reader   Ns    bob     devs     default/sa1",
        ])
    );
    assert_eq!(
        mask_ages(
            ok(&kc, &["get", "rolebinding", "rb", "-n", "default"])
                .await
                .trim_end()
        ),
        table(&[
            "NAME   ROLE              AGE",
            "rb     Role/pod-reader   Ns"
        ])
    );
    // Users and groups get the rbac group; a service account's stays empty.
    let rb: serde_json::Value = serde_json::from_str(
        &ok(
            &kc,
            &["get", "rolebinding", "rb", "-n", "default", "-o", "json"],
        )
        .await,
    )
    .unwrap();
    assert_eq!(rb["subjects"][0]["apiGroup"], "rbac.authorization.k8s.io");
    assert!(rb["subjects"][2].get("apiGroup").is_none(), "{rb}");
    ok(
        &kc,
        &[
            "create",
            "clusterrole",
            "cr",
            "--verb=get",
            "--resource=nodes",
        ],
    )
    .await;
    ok(
        &kc,
        &[
            "create",
            "clusterrolebinding",
            "crb",
            "--clusterrole=cr",
            "--group=g1",
        ],
    )
    .await;
    assert_eq!(
        mask_ages(
            ok(&kc, &["get", "clusterrolebinding", "crb", "-o", "wide"])
                .await
                .trim_end()
        ),
        table(&[
            "NAME   ROLE             AGE   USERS   GROUPS   SERVICEACCOUNTS",
            "crb    ClusterRole/cr   Ns            g1",
        ])
    );

    // Validation, with upstream's messages.
    assert_eq!(
        err(
            &kc,
            &[
                "patch",
                "rolebinding",
                "rb",
                "-n",
                "default",
                "--type=merge",
                "-p",
                r#"{"roleRef":{"name":"other"}}"#
            ],
            None
        )
        .await,
        r#"The RoleBinding "rb" is invalid: roleRef: Invalid value: {"APIGroup":"rbac.authorization.k8s.io","Kind":"Role","Name":"other"}: field is immutable"#
    );
    let no_verbs = r#"{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"Role","metadata":{"name":"bad","namespace":"default"},"rules":[{"apiGroups":[""],"resources":["pods"]}]}"#;
    assert_eq!(
        err(&kc, &["create", "-f", "-"], Some(no_verbs)).await,
        r#"The Role "bad" is invalid: rules[0].verbs: Required value"#
    );
    let bad_subjects = r#"{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRoleBinding","metadata":{"name":"bad"},
        "roleRef":{"apiGroup":"rbac.authorization.k8s.io","kind":"Role","name":"x"},
        "subjects":[{"kind":"ServiceAccount","name":"sa"},{"kind":"Robot","name":"r"},{"kind":"User","name":""}]}"#;
    assert_eq!(
        err(&kc, &["create", "-f", "-"], Some(bad_subjects)).await,
        table(&[
            r#"The ClusterRoleBinding "bad" is invalid: "#,
            r#"* roleRef.kind: Unsupported value: "Role": supported values: "ClusterRole""#,
            r#"* subjects[0].namespace: Required value"#,
            r#"* subjects[1].kind: Unsupported value: "Robot": supported values: "ServiceAccount", "User", "Group""#,
            r#"* subjects[2].name: Required value"#,
        ])
    );
}

const STORAGE: &str = r#"
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: standard
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: kumo.io/hostpath
volumeBindingMode: WaitForFirstConsumer
allowVolumeExpansion: true
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: slow}
provisioner: example.com/slow
---
apiVersion: storage.k8s.io/v1
kind: CSINode
metadata: {name: node-1}
spec:
  drivers:
  - {name: a.csi.example.com, nodeID: n1}
  - {name: b.csi.example.com, nodeID: n1}
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: pv1}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteOnce, ReadOnlyMany]
  hostPath: {path: /tmp/pv1}
  storageClassName: standard
  claimRef: {namespace: default, name: data}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data, namespace: default}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
  storageClassName: standard
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: defaulted, namespace: default}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: classless, namespace: default}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
  storageClassName: ""
---
apiVersion: v1
kind: ResourceQuota
metadata: {name: q, namespace: default}
spec:
  hard: {requests.cpu: "1", limits.memory: 1Gi, pods: "10"}
---
apiVersion: v1
kind: LimitRange
metadata: {name: lr, namespace: default}
spec:
  limits:
  - type: Container
    max: {memory: 1Gi}
    min: {cpu: 100m}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduling_storage_and_core_volumes() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();

    // PriorityClasses: the two system classes, kubectl create, the value limit.
    ok(
        &kc,
        &[
            "create",
            "priorityclass",
            "high",
            "--value=1000",
            "--description=x",
            "--preemption-policy=Never",
        ],
    )
    .await;
    assert_eq!(
        mask_ages(ok(&kc, &["get", "priorityclasses"]).await.trim_end()),
        table(&[
            "NAME                      VALUE        GLOBAL-DEFAULT   AGE   PREEMPTIONPOLICY",
            "high                      1000         false            Ns    Never",
            "system-cluster-critical   2000000000   false            Ns    PreemptLowerPriority",
            "system-node-critical      2000001000   false            Ns    PreemptLowerPriority",
        ])
    );
    assert_eq!(
        ok(
            &kc,
            &["get", "pc", "high", "-o", "jsonpath={.metadata.generation}"]
        )
        .await,
        "1"
    );
    assert_eq!(
        err(
            &kc,
            &["create", "priorityclass", "big", "--value=2000000000"],
            None
        )
        .await,
        r#"error: failed to create priorityclass: PriorityClass.scheduling.k8s.io "big" is invalid: value: Forbidden: maximum allowed value of a user defined priority is 1000000000"#
    );
    ok(
        &kc,
        &[
            "create",
            "priorityclass",
            "d1",
            "--value=5",
            "--global-default",
        ],
    )
    .await;
    assert_eq!(
        err(
            &kc,
            &[
                "create",
                "priorityclass",
                "d2",
                "--value=5",
                "--global-default"
            ],
            None
        )
        .await,
        r#"error: failed to create priorityclass: priorityclasses.scheduling.k8s.io "d2" is forbidden: PriorityClass d1 is already marked as default. Only one default can exist"#
    );
    assert_eq!(
        err(
            &kc,
            &[
                "patch",
                "pc",
                "high",
                "--type=merge",
                "-p",
                r#"{"value":5}"#
            ],
            None
        )
        .await,
        r#"The PriorityClass "high" is invalid: value: Forbidden: may not be changed in an update."#
    );

    // Priority admission: a named class gives its value and preemption policy, a pod that
    // names none gets the global default class (d1), an unknown class is refused.
    ok_stdin(
        &kc,
        &["apply", "-f", "-"],
        "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: default\n",
    )
    .await;
    let pod = |name: &str, class: &str| {
        let class = if class.is_empty() {
            String::new()
        } else {
            format!("  priorityClassName: {class}\n")
        };
        format!("apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n{class}  containers:\n  - name: c\n    image: busybox\n")
    };
    let priority = "jsonpath={.spec.priorityClassName} {.spec.priority} {.spec.preemptionPolicy}";
    ok_stdin(&kc, &["create", "-f", "-"], &pod("p-high", "high")).await;
    assert_eq!(
        ok(&kc, &["get", "pod", "p-high", "-o", priority]).await,
        "high 1000 Never"
    );
    ok_stdin(&kc, &["create", "-f", "-"], &pod("p-default", "")).await;
    assert_eq!(
        ok(&kc, &["get", "pod", "p-default", "-o", priority]).await,
        "d1 5 PreemptLowerPriority"
    );
    assert_eq!(
        err(&kc, &["create", "-f", "-"], Some(&pod("p-none", "nope"))).await,
        r#"Error from server (Forbidden): error when creating "STDIN": pods "p-none" is forbidden: no PriorityClass with name nope was found"#
    );

    // StorageClasses from YAML: defaults, the (default) marker; CSINodes; PVs and PVCs.
    ok_stdin(&kc, &["create", "-f", "-"], STORAGE).await;
    assert_eq!(
        mask_ages(ok(&kc, &["get", "sc"]).await.trim_end()),
        table(&[
            "NAME                 PROVISIONER        RECLAIMPOLICY   VOLUMEBINDINGMODE      ALLOWVOLUMEEXPANSION   AGE",
            "slow                 example.com/slow   Delete          Immediate              false                  Ns",
            "standard (default)   kumo.io/hostpath   Delete          WaitForFirstConsumer   true                   Ns",
        ])
    );
    assert_eq!(
        err(
            &kc,
            &[
                "patch",
                "sc",
                "slow",
                "--type=merge",
                "-p",
                r#"{"provisioner":"x.io/y"}"#
            ],
            None
        )
        .await,
        r#"The StorageClass "slow" is invalid: provisioner: Invalid value: null: field is immutable"#
    );
    assert_eq!(
        ok(
            &kc,
            &[
                "get",
                "csinodes",
                "node-1",
                "-o",
                "jsonpath={.spec.drivers[*].name}"
            ]
        )
        .await,
        "a.csi.example.com b.csi.example.com"
    );
    assert_eq!(
        mask_ages(ok(&kc, &["get", "pv", "-o", "wide"]).await.trim_end()),
        table(&[
            "NAME   CAPACITY   ACCESS MODES   RECLAIM POLICY   STATUS    CLAIM          STORAGECLASS   VOLUMEATTRIBUTESCLASS   REASON   AGE   VOLUMEMODE",
            "pv1    1Gi        RWO,ROX        Retain           Pending   default/data   standard       <unset>                          Ns    Filesystem",
        ])
    );
    assert_eq!(
        mask_ages(ok(&kc, &["get", "pvc", "data", "-n", "default"]).await.trim_end()),
        table(&[
            "NAME   STATUS    VOLUME   CAPACITY   ACCESS MODES   STORAGECLASS   VOLUMEATTRIBUTESCLASS   AGE",
            "data   Pending                                      standard       <unset>                 Ns",
        ])
    );
    // DefaultStorageClass admission: only a claim that names no class gets the default.
    let class = |name: &'static str| {
        let kc = kc.clone();
        async move {
            ok(
                &kc,
                &[
                    "get",
                    "pvc",
                    name,
                    "-n",
                    "default",
                    "-o",
                    "jsonpath={.spec.storageClassName}",
                ],
            )
            .await
        }
    };
    assert_eq!(class("defaulted").await, "standard");
    assert_eq!(class("classless").await, "");
    let pvc: serde_json::Value = serde_json::from_str(
        &ok(&kc, &["get", "pvc", "data", "-n", "default", "-o", "json"]).await,
    )
    .unwrap();
    assert_eq!(
        pvc["metadata"]["finalizers"],
        serde_json::json!(["kubernetes.io/pvc-protection"])
    );
    assert_eq!(pvc["spec"]["volumeMode"], "Filesystem");
    // Status changes only through the status subresource.
    ok(
        &kc,
        &[
            "patch",
            "pvc",
            "data",
            "-n",
            "default",
            "--type=merge",
            "-p",
            r#"{"status":{"phase":"Bound"}}"#,
        ],
    )
    .await;
    assert_eq!(
        ok(
            &kc,
            &[
                "get",
                "pvc",
                "data",
                "-n",
                "default",
                "-o",
                "jsonpath={.status.phase}"
            ]
        )
        .await,
        "Pending"
    );
    ok(
        &kc,
        &[
            "patch",
            "pvc",
            "data",
            "-n",
            "default",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"phase":"Bound"}}"#,
        ],
    )
    .await;
    assert_eq!(
        ok(
            &kc,
            &[
                "get",
                "pvc",
                "data",
                "-n",
                "default",
                "-o",
                "jsonpath={.status.phase}"
            ]
        )
        .await,
        "Bound"
    );
    assert_eq!(
        err(&kc, &["create", "-f", "-"], Some(r#"{"apiVersion":"v1","kind":"PersistentVolume","metadata":{"name":"pv0"},"spec":{}}"#)).await,
        table(&[
            r#"The PersistentVolume "pv0" is invalid: "#,
            "* spec.accessModes: Required value",
            "* spec.capacity: Required value",
            r#"* spec.capacity: Unsupported value: null: supported values: "storage""#,
            "* spec: Required value: must specify a volume type",
        ])
    );

    // ResourceQuotas: usage from the status subresource; LimitRange defaults.
    ok(
        &kc,
        &[
            "patch",
            "quota",
            "q",
            "-n",
            "default",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"hard":{"requests.cpu":"1","limits.memory":"1Gi","pods":"10"},"used":{"requests.cpu":"100m","pods":"2"}}}"#,
        ],
    )
    .await;
    assert_eq!(
        mask_ages(ok(&kc, &["get", "quota", "-n", "default"]).await.trim_end()),
        table(&[
            "NAME   REQUEST                            LIMIT                  AGE",
            "q      pods: 2/10, requests.cpu: 100m/1   limits.memory: 0/1Gi   Ns",
        ])
    );
    let lr: serde_json::Value = serde_json::from_str(
        &ok(&kc, &["get", "limits", "lr", "-n", "default", "-o", "json"]).await,
    )
    .unwrap();
    assert_eq!(
        lr["spec"]["limits"][0]["default"],
        serde_json::json!({"memory": "1Gi"})
    );
    assert_eq!(
        lr["spec"]["limits"][0]["defaultRequest"],
        serde_json::json!({"cpu": "100m", "memory": "1Gi"})
    );
}

const ADMISSION: &str = r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {name: vw}
webhooks:
- name: check.example.com
  clientConfig: {service: {namespace: default, name: hook}}
  admissionReviewVersions: [v1]
  sideEffects: None
  rules: [{apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [pods]}]
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: replicas}
spec:
  matchConstraints:
    resourceRules: [{apiGroups: [apps], apiVersions: [v1], operations: [CREATE], resources: [deployments]}]
  validations: [{expression: "object.spec.replicas <= 5"}]
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: replicas}
spec: {policyName: replicas, validationActions: [Deny]}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_networking_certificates_flowcontrol_admission() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();

    // PodDisruptionBudgets and Ingresses through kubectl create.
    ok(
        &kc,
        &[
            "create",
            "pdb",
            "pd",
            "--selector=app=x",
            "--min-available=50%",
            "-n",
            "default",
        ],
    )
    .await;
    assert_eq!(
        mask_ages(ok(&kc, &["get", "pdb", "-n", "default"]).await.trim_end()),
        table(&[
            "NAME   MIN AVAILABLE   MAX UNAVAILABLE   ALLOWED DISRUPTIONS   AGE",
            "pd     50%             N/A               0                     Ns",
        ])
    );
    ok(
        &kc,
        &[
            "create",
            "ingress",
            "ing",
            "--class=nginx",
            "--rule=foo.com/bar*=svc1:8080,tls=mysecret",
            "-n",
            "default",
        ],
    )
    .await;
    assert_eq!(
        mask_ages(ok(&kc, &["get", "ing", "-n", "default"]).await.trim_end()),
        table(&[
            "NAME   CLASS   HOSTS     ADDRESS   PORTS     AGE",
            "ing    nginx   foo.com             80, 443   Ns",
        ])
    );
    assert_eq!(
        err(
            &kc,
            &["create", "-f", "-"],
            Some(r#"{"apiVersion":"networking.k8s.io/v1","kind":"Ingress","metadata":{"name":"i1","namespace":"default"},"spec":{}}"#)
        )
        .await,
        r#"The Ingress "i1" is invalid: spec: Invalid value: null: either `defaultBackend` or `rules` must be specified"#
    );

    // CertificateSigningRequests: the requestor recorded, `kubectl certificate approve`.
    let csr = r#"{"apiVersion":"certificates.k8s.io/v1","kind":"CertificateSigningRequest","metadata":{"name":"jane"},
        "spec":{"request":"LS0tLS1CRUdJTiBDRVJUSUZJQ0FURSBSRVFVRVNULS0tLS0KTUlISk1IRUNBUUF3RHpFTk1Bc0dBMVVFQXd3RWFtRnVaVEJaTUJNR0J5cUdTTTQ5QWdFR0NDcUdTTTQ5QXdFSApBMElBQktxU1plcFd6QzFjTHl2UzFyRkd6ckNNWDByRVgvcjhoL29GbEJmQWNPM2JKbmduV0pUcytsSTExN3FhCk1vNkM5bi9yVk5iVGlsak81RW5xVmZMbjBKNmdBREFLQmdncWhrak9QUVFEQWdOSUFEQkZBaUVBODloVjFCMkQKNUYrL3RBYWQ5alZZRVZBZ0g0RWI4K3AzejBNcFJ5ZHZrUThDSUI4S1pjMzBtS2R2dHpDMGxxMmVaaGlGS2x0Mwp0NUVkNk5NSk10anpzQVU3Ci0tLS0tRU5EIENFUlRJRklDQVRFIFJFUVVFU1QtLS0tLQo=",
        "signerName":"kubernetes.io/kube-apiserver-client","expirationSeconds":86400,"usages":["client auth"]}}"#;
    ok_stdin(&kc, &["create", "-f", "-"], csr).await;
    assert_eq!(
        mask_ages(ok(&kc, &["get", "csr"]).await.trim_end()),
        table(&[
            "NAME   AGE   SIGNERNAME                            REQUESTOR          REQUESTEDDURATION   CONDITION",
            "jane   Ns    kubernetes.io/kube-apiserver-client   kubernetes-admin   24h                 Pending",
        ])
    );
    ok(&kc, &["certificate", "approve", "jane"]).await;
    let approved: serde_json::Value =
        serde_json::from_str(&ok(&kc, &["get", "csr", "jane", "-o", "json"]).await).unwrap();
    let cond = &approved["status"]["conditions"][0];
    assert_eq!(
        (cond["type"].as_str(), cond["status"].as_str()),
        (Some("Approved"), Some("True"))
    );
    assert_eq!(cond["reason"], "KubectlApprove");
    assert!(cond["lastTransitionTime"].is_string() && cond["lastUpdateTime"].is_string());
    assert!(mask_ages(ok(&kc, &["get", "csr", "jane"]).await.trim_end())
        .ends_with("24h                 Approved"));
    // The approval may not be taken back.
    let deny_again = r#"{"status":{"conditions":[]}}"#;
    assert_eq!(
        err(
            &kc,
            &[
                "patch",
                "csr",
                "jane",
                "--subresource=approval",
                "--type=merge",
                "-p",
                deny_again
            ],
            None
        )
        .await,
        r#"The CertificateSigningRequest "jane" is invalid: status.conditions: Forbidden: updates may not remove a condition of type "Approved""#
    );
    assert_eq!(
        err(
            &kc,
            &["create", "-f", "-"],
            Some(r#"{"apiVersion":"certificates.k8s.io/v1","kind":"CertificateSigningRequest","metadata":{"name":"c0"},"spec":{"request":""}}"#)
        )
        .await,
        table(&[
            r#"The CertificateSigningRequest "c0" is invalid: "#,
            r#"* spec.request: Invalid value: "": PEM block type must be CERTIFICATE REQUEST"#,
            "* spec.usages: Required value",
            "* spec.signerName: Required value",
        ])
    );

    // API Priority and Fairness bootstrap configuration, in the printer's order.
    assert_eq!(
        mask_ages(ok(&kc, &["get", "flowschemas", "exempt", "catch-all"]).await.trim_end()),
        table(&[
            "NAME        PRIORITYLEVEL   MATCHINGPRECEDENCE   DISTINGUISHERMETHOD   AGE   MISSINGPL",
            "exempt      exempt          1                    <none>                Ns    False",
            "catch-all   catch-all       10000                ByUser                Ns    False",
        ])
    );
    let order: Vec<String> = ok(&kc, &["get", "flowschemas", "--no-headers"])
        .await
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect();
    assert_eq!(
        order[..3],
        ["exempt", "probes", "system-leader-election"],
        "{order:?}"
    );
    assert_eq!(order.last().map(String::as_str), Some("catch-all"));
    assert_eq!(
        mask_ages(ok(&kc, &["get", "prioritylevelconfigurations", "exempt", "global-default"]).await.trim_end()),
        table(&[
            "NAME             TYPE      NOMINALCONCURRENCYSHARES   QUEUES   HANDSIZE   QUEUELENGTHLIMIT   AGE",
            "exempt           Exempt    <none>                     <none>   <none>     <none>             Ns",
            "global-default   Limited   20                         128      6          50                 Ns",
        ])
    );

    // Admission registration: stored with defaults and printed.
    ok_stdin(&kc, &["create", "-f", "-"], ADMISSION).await;
    let vw: serde_json::Value = serde_json::from_str(
        &ok(
            &kc,
            &["get", "validatingwebhookconfiguration", "vw", "-o", "json"],
        )
        .await,
    )
    .unwrap();
    let hook = &vw["webhooks"][0];
    assert_eq!(
        (
            hook["failurePolicy"].as_str(),
            hook["timeoutSeconds"].as_i64(),
            hook["rules"][0]["scope"].as_str()
        ),
        (Some("Fail"), Some(10), Some("*"))
    );
    assert_eq!(hook["clientConfig"]["service"]["port"], 443);
    let map = r#"{"apiVersion":"admissionregistration.k8s.io/v1","kind":"MutatingAdmissionPolicy","metadata":{"name":"m"},"spec":{}}"#;
    assert_eq!(
        err(&kc, &["create", "-f", "-"], Some(map)).await,
        table(&[
            r#"The MutatingAdmissionPolicy "m" is invalid: "#,
            "* spec.matchConstraints: Required value",
            "* spec.mutations: Required value: mutations must contain at least one item",
            "* spec.reinvocationPolicy: Required value",
        ])
    );
    assert_eq!(
        mask_ages(ok(&kc, &["get", "validatingadmissionpolicies,validatingadmissionpolicybindings"]).await.trim_end()),
        table(&[
            "NAME                                                              VALIDATIONS   PARAMKIND   AGE",
            "validatingadmissionpolicy.admissionregistration.k8s.io/replicas   1             <unset>     Ns",
            "",
            "NAME                                                                     POLICYNAME   PARAMREF   AGE",
            "validatingadmissionpolicybinding.admissionregistration.k8s.io/replicas   replicas     <unset>    Ns",
        ])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_api_services_as_the_aggregator_registers_them() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    let out = k(&kc, &["get", "apiservices"]).await;
    assert!(out.ok, "{}", out.stderr);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert!(
        lines[0].starts_with("NAME") && lines[0].contains("SERVICE   AVAILABLE   AGE"),
        "{}",
        out.stdout
    );
    assert!(
        lines[1].starts_with("v1.     ") && lines[1].contains("Local     True"),
        "{}",
        out.stdout
    );
    let out = k(
        &kc,
        &["get", "apiservice", "v1.apps", "-o", "jsonpath={.spec.groupPriorityMinimum} {.spec.versionPriority} {.metadata.labels.kube-aggregator\\.kubernetes\\.io/automanaged} {.status.conditions[0].reason}"],
    )
    .await;
    assert_eq!(out.stdout, "17800 15 onstart Local");
    // The name must be version.group.
    let bad = "apiVersion: apiregistration.k8s.io/v1\nkind: APIService\nmetadata:\n  name: v1.example.com\nspec:\n  group: other.example.com\n  version: v1\n  groupPriorityMinimum: 100\n  versionPriority: 10\n";
    let out = k_in(None, &kc, &["create", "-f", "-"], Some(bad)).await;
    assert!(
        out.stderr
            .contains("must be `spec.version+\".\"+spec.group`"),
        "{}",
        out.stderr
    );
}

/// storagemigration.k8s.io/v1 StorageVersionMigrations: discovery, the table kube-apiserver
/// prints, the immutable spec, and the status subresource's condition rules.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_version_migrations() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    let versions = ok(&kc, &["api-versions"]).await;
    assert!(
        versions.lines().any(|l| l == "storagemigration.k8s.io/v1"),
        "{versions}"
    );
    ok_stdin(
        &kc,
        &["create", "-f", "-"],
        "apiVersion: storagemigration.k8s.io/v1\nkind: StorageVersionMigration\nmetadata: {name: m1}\nspec:\n  resource: {group: apps, resource: deployments}\nstatus:\n  conditions: [{type: Running, status: \"True\", reason: R, message: m, lastTransitionTime: \"2026-01-01T00:00:00Z\"}]\n",
    )
    .await;
    // Status is not set on create (and shows empty, as Go's struct does).
    assert_eq!(
        ok(
            &kc,
            &[
                "get",
                "storageversionmigration",
                "m1",
                "-o",
                "jsonpath={.status}"
            ]
        )
        .await,
        "{}"
    );
    // So a JSON patch can add conditions to it.
    ok(&kc, &["patch", "storageversionmigration", "m1", "--subresource=status", "--type=json", "-p",
        r#"[{"op": "add", "path": "/status/conditions", "value": [{"type": "Running", "status": "False", "reason": "R", "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}]"#]).await;
    assert_eq!(
        mask_ages(&ok(&kc, &["get", "storageversionmigrations"]).await),
        table(&[
            "NAME   RESOURCE           STATUS",
            "m1     deployments.apps   Unknown"
        ])
    );
    let e = err(
        &kc,
        &[
            "patch",
            "storageversionmigration",
            "m1",
            "--type=merge",
            "-p",
            r#"{"spec":{"resource":{"resource":"pods","group":""}}}"#,
        ],
        None,
    )
    .await;
    assert!(
        e.contains("spec: Invalid value: ") && e.contains("field is immutable"),
        "{e}"
    );
    let e = err(
        &kc,
        &["create", "-f", "-"],
        Some("apiVersion: storagemigration.k8s.io/v1\nkind: StorageVersionMigration\nmetadata: {name: m2}\nspec:\n  resource: {group: apps}\n"),
    )
    .await;
    assert!(
        e.contains("spec.resource.resource: Required value: resource is required to be set"),
        "{e}"
    );
    // Status: conditions are validated, and Succeeded cannot turn back.
    let cond = |t: &str, s: &str| {
        format!(
            r#"{{"status":{{"conditions":[{{"type":"{t}","status":"{s}","reason":"R","message":"m","lastTransitionTime":"2026-01-01T00:00:00Z"}}]}}}}"#
        )
    };
    ok(
        &kc,
        &[
            "patch",
            "storageversionmigration",
            "m1",
            "--subresource=status",
            "--type=merge",
            "-p",
            &cond("Succeeded", "True"),
        ],
    )
    .await;
    assert_eq!(
        mask_ages(&ok(&kc, &["get", "storageversionmigrations"]).await),
        table(&[
            "NAME   RESOURCE           STATUS",
            "m1     deployments.apps   Succeeded"
        ])
    );
    let e = err(
        &kc,
        &[
            "patch",
            "storageversionmigration",
            "m1",
            "--subresource=status",
            "--type=merge",
            "-p",
            &cond("Succeeded", "False"),
        ],
        None,
    )
    .await;
    assert!(
        e.contains("Success condition cannot be set to false once it is true"),
        "{e}"
    );
    let e = err(
        &kc,
        &[
            "patch",
            "storageversionmigration",
            "m1",
            "--subresource=status",
            "--type=merge",
            "-p",
            &cond("Succeeded", "Maybe"),
        ],
        None,
    )
    .await;
    assert!(
        e.contains(r#"status.conditions[0].status: Unsupported value: "Maybe""#),
        "{e}"
    );
}
