//! CEL validation rules (`x-kubernetes-validations`) of CustomResourceDefinitions, driven by
//! the real kubectl; the expected messages were taken from kube-apiserver v1.37.2.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

mod common;
use common::*;

const CRD: &str = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: crontabs.stable.example.com
spec:
  group: stable.example.com
  scope: Namespaced
  names: {plural: crontabs, singular: crontab, kind: CronTab}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        x-kubernetes-validations:
        - rule: "self.metadata.name.startsWith('c')"
          message: "name must start with c"
        properties:
          spec:
            type: object
            x-kubernetes-validations:
            - rule: "self.minReplicas <= self.replicas"
            - rule: "self.replicas <= self.maxReplicas"
              messageExpression: "'replicas above max for ' + self.image"
            - rule: "!has(self.image) || self.image.size() > 3"
              message: "image too short"
              fieldPath: ".image"
              reason: FieldValueForbidden
            properties:
              image: {type: string, maxLength: 20}
              replicas: {type: integer}
              minReplicas: {type: integer}
              maxReplicas: {type: integer}
              immutable:
                type: string
                x-kubernetes-validations:
                - rule: "self == oldSelf"
                  message: "immutable is immutable"
              tags:
                type: array
                maxItems: 10
                items: {type: string, maxLength: 10}
                x-kubernetes-validations:
                - rule: "self.all(t, t.size() < 5)"
              ratio: {type: number}
              mode:
                type: string
                x-kubernetes-validations:
                - rule: "self in ['a','b']"
"#;

const BAD: &str = r#"apiVersion: stable.example.com/v1
kind: CronTab
metadata: {name: ctab}
spec: {replicas: 5, minReplicas: 6, maxReplicas: 4, image: "ab", immutable: "x", tags: ["toolong"], mode: "c"}
"#;

const GOOD: &str = r#"apiVersion: stable.example.com/v1
kind: CronTab
metadata: {name: ctab}
spec: {replicas: 5, minReplicas: 1, maxReplicas: 7, image: "abcd", immutable: "x", tags: ["a"], mode: "a", ratio: 2}
"#;

async fn create(kc: &Path, yaml: &str) -> Out {
    k_in(None, kc, &["create", "-f", "-"], Some(yaml)).await
}

/// The error lines of kubectl's answer, sorted: upstream walks properties in Go's map
/// order, so the order of several errors varies from one request to the next.
fn lines(s: &str) -> Vec<String> {
    let mut l: Vec<String> = s.lines().map(str::to_owned).collect();
    l.sort();
    l
}

async fn served(kc: &Path) {
    for _ in 0..50 {
        if k(kc, &["get", "crontabs"]).await.ok {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("crontabs never served");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_accept_reject_and_transition() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    let out = create(&kc, CRD).await;
    assert!(out.ok, "{}", out.stderr);
    served(&kc).await;

    // Every failing rule, with its message, messageExpression, fieldPath and reason.
    let out = create(&kc, BAD).await;
    assert!(!out.ok);
    assert_eq!(
        lines(&out.stderr),
        lines(
            "The CronTab \"ctab\" is invalid: \n\
             * spec: Invalid value: failed rule: self.minReplicas <= self.replicas\n\
             * spec: Invalid value: replicas above max for ab\n\
             * spec.image: Forbidden: image too short\n\
             * spec.mode: Invalid value: \"c\": failed rule: self in ['a','b']\n\
             * spec.tags: Invalid value: failed rule: self.all(t, t.size() < 5)"
        )
    );

    // A rule on the root sees metadata.name; its error is at <nil>.
    let out = create(&kc, &GOOD.replace("ctab", "xtab")).await;
    assert!(!out.ok);
    assert_eq!(
        out.stderr.trim_end(),
        "The CronTab \"xtab\" is invalid: <nil>: Invalid value: name must start with c"
    );

    // Schema errors that block the rules.
    let out = create(
        &kc,
        "apiVersion: stable.example.com/v1\nkind: CronTab\nmetadata: {name: cbad}\n\
         spec: {replicas: \"x\", minReplicas: 6, maxReplicas: 4}\n",
    )
    .await;
    assert_eq!(
        out.stderr.trim_end(),
        "The CronTab \"cbad\" is invalid: \n\
         * spec.replicas: Invalid value: \"string\": spec.replicas in body must be of type integer: \"string\"\n\
         * <nil>: Invalid value: null: some validation rules were not checked because the object was invalid; correct the existing errors to complete validation"
    );

    let out = create(&kc, GOOD).await;
    assert!(out.ok, "{}", out.stderr);

    // Transition rule: oldSelf on update.
    let out = k(
        &kc,
        &[
            "patch",
            "crontab",
            "ctab",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"immutable":"y"}}"#,
        ],
    )
    .await;
    assert!(!out.ok);
    assert_eq!(
        out.stderr.trim_end(),
        "The CronTab \"ctab\" is invalid: spec.immutable: Invalid value: \"y\": immutable is immutable"
    );
    let out = k(
        &kc,
        &[
            "patch",
            "crontab",
            "ctab",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"replicas":6}}"#,
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let out = k(
        &kc,
        &[
            "patch",
            "crontab",
            "ctab",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"replicas":9}}"#,
        ],
    )
    .await;
    assert_eq!(
        out.stderr.trim_end(),
        "The CronTab \"ctab\" is invalid: spec: Invalid value: replicas above max for abcd"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_rules_are_rejected_with_the_definition() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    let with = |rule: &str| CRD.replace("self.minReplicas <= self.replicas", rule);

    let out = create(&kc, &with("foo == 1")).await;
    assert!(!out.ok);
    assert_eq!(
        out.stderr.trim_end(),
        r#"The CustomResourceDefinition "crontabs.stable.example.com" is invalid: spec.validation.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule: Invalid value: {"Rule":"foo == 1","Message":"","MessageExpression":"","Reason":null,"FieldPath":"","OptionalOldSelf":null}: compilation failed: ERROR: <input>:1:1: undeclared reference to 'foo' (in container '')
 | foo == 1
 | ^"#
    );

    let out = create(&kc, &with("self.nosuch > 1")).await;
    assert_eq!(
        out.stderr.trim_end(),
        r#"The CustomResourceDefinition "crontabs.stable.example.com" is invalid: spec.validation.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule: Invalid value: {"Rule":"self.nosuch \u003e 1","Message":"","MessageExpression":"","Reason":null,"FieldPath":"","OptionalOldSelf":null}: compilation failed: ERROR: <input>:1:5: undefined field 'nosuch'
 | self.nosuch > 1
 | ....^"#
    );

    let out = create(&kc, &with("self.replicas >")).await;
    assert!(
        out.stderr.contains(
            "x-kubernetes-validations[0].rule: Invalid value: {\"Rule\":\"self.replicas \\u003e\",\
             \"Message\":\"\",\"MessageExpression\":\"\",\"Reason\":null,\"FieldPath\":\"\",\
             \"OptionalOldSelf\":null}: compilation failed: ERROR: <input>:1:16: Syntax error: mismatched input '<EOF>'"
        ),
        "{}",
        out.stderr
    );
    // Nothing was created.
    let out = k(&kc, &["get", "crd", "-o", "name"]).await;
    assert_eq!(out.stdout, "");
}

/// The rules of the conformance suite's CustomResourceValidationRules schema.
const BIG: &str = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: bigs.stable.example.com}
spec:
  group: stable.example.com
  scope: Namespaced
  names: {plural: bigs, singular: big, kind: Big}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            x-kubernetes-validations:
            - rule: "self.x + self.y > 0"
            - rule: "self.firstArray.isSorted() && self.secondArray.isSorted() && ((self.firstArray.sum() + self.secondArray.sum()) % 2 == 0)"
            - rule: "self.largeArray.all(x, self.largeArray.all(y, y == x))"
            properties:
              x: {type: integer}
              "y": {type: integer}
              firstArray: {type: array, maxItems: 1000, items: {type: integer}}
              secondArray: {type: array, maxItems: 1000, items: {type: integer}}
              largeArray: {type: array, maxItems: 725, items: {type: integer}}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn costs_are_bounded() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();

    // A rule over every element of an unbounded list inside another: rejected by its
    // estimated cost.
    let expensive = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: es.stable.example.com}
spec:
  group: stable.example.com
  scope: Namespaced
  names: {plural: es, singular: e, kind: E}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              x:
                type: array
                items:
                  type: array
                  items: {type: string}
                  x-kubernetes-validations:
                  - rule: "self.all(s, s == 'string constant')"
"#;
    let out = create(&kc, expensive).await;
    assert_eq!(
        out.stderr.trim_end(),
        "The CustomResourceDefinition \"es.stable.example.com\" is invalid: \n\
         * spec.validation.openAPIV3Schema.properties[spec].properties[x].items.x-kubernetes-validations[0].rule: Forbidden: estimated rule cost exceeds budget by factor of more than 100x (try simplifying the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, and strings are declared)\n\
         * spec.validation.openAPIV3Schema.properties[spec].properties[x].items.x-kubernetes-validations[0].rule: Forbidden: contributed to estimated rule cost total exceeding cost limit for entire OpenAPIv3 schema\n\
         * spec.validation.openAPIV3Schema: Forbidden: x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 schema exceeds budget by factor of more than 100x (try simplifying the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, and strings are declared)"
    );

    let out = create(&kc, BIG).await;
    assert!(out.ok, "{}", out.stderr);
    for _ in 0..50 {
        if k(&kc, &["get", "bigs"]).await.ok {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let large: Vec<String> = (0..725).map(|_| "20".to_owned()).collect();
    let b1 = format!(
        r#"{{"apiVersion":"stable.example.com/v1","kind":"Big","metadata":{{"name":"b1"}},"spec":{{"largeArray":[{}]}}}}"#,
        large.join(",")
    );
    let out = create(&kc, &b1).await;
    assert_eq!(
        out.stderr.trim_end(),
        "The Big \"b1\" is invalid: \n\
         * spec: Invalid value: \"object\": no such key: x evaluating rule: self.x + self.y > 0\n\
         * spec: Invalid value: \"object\": no such key: firstArray evaluating rule: self.firstArray.isSorted() && self.secondArray.isSorted() && ((self.firstArray.sum() + self.secondArray.sum()) % 2 == 0)\n\
         * spec: Invalid value: \"object\": 'operation cancelled: actual cost limit exceeded': no further validation rules will be run due to call cost exceeds limit for rule: self.largeArray.all(x, self.largeArray.all(y, y == x))"
    );
    let out = create(
        &kc,
        r#"{"apiVersion":"stable.example.com/v1","kind":"Big","metadata":{"name":"b2"},"spec":{"x":1,"y":0,"firstArray":[3,4],"secondArray":[5,10],"largeArray":[2,2]}}"#,
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
}

const POLICIES: &str = r#"apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: replicas.example.com}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - apiGroups: ["apps"]
      apiVersions: ["v1"]
      operations: ["CREATE", "UPDATE"]
      resources: ["deployments"]
  variables:
  - name: replicas
    expression: "object.spec.replicas"
  validations:
  - expression: "variables.replicas <= 5"
    messageExpression: "'replicas must be at most 5, got ' + string(variables.replicas)"
  - expression: "object.metadata.name != 'forbidden'"
    message: "name is forbidden"
    reason: Forbidden
  - expression: "namespaceObject.metadata.name != 'blocked'"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: replicas-binding}
spec:
  policyName: replicas.example.com
  validationActions: [Deny]
  matchResources:
    namespaceSelector:
      matchLabels: {vap: "on"}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: warn.example.com}
spec:
  matchConstraints:
    resourceRules:
    - apiGroups: [""]
      apiVersions: ["v1"]
      operations: ["CREATE"]
      resources: ["configmaps"]
  validations:
  - expression: "has(object.data) && 'key' in object.data"
    message: "configmaps should have a key"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: warn-binding}
spec:
  policyName: warn.example.com
  validationActions: [Warn]
  matchResources:
    namespaceSelector:
      matchLabels: {vap: "on"}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validating_admission_policies_deny_and_warn() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    let out = create(&kc, POLICIES).await;
    assert!(out.ok, "{}", out.stderr);
    for ns in ["vapns", "blocked"] {
        assert!(k(&kc, &["create", "ns", ns]).await.ok);
        assert!(k(&kc, &["label", "ns", ns, "vap=on"]).await.ok);
    }
    let deploy = |ns: &'static str, name: &'static str, replicas: &'static str| {
        let kc = kc.clone();
        async move {
            k(
                &kc,
                &[
                    "-n",
                    ns,
                    "create",
                    "deployment",
                    name,
                    "--image=nginx",
                    &format!("--replicas={replicas}"),
                ],
            )
            .await
        }
    };

    // The watch cache delivers the binding within moments.
    let mut out = deploy("vapns", "d1", "7").await;
    for _ in 0..50 {
        if !out.ok {
            break;
        }
        k(&kc, &["-n", "vapns", "delete", "deployment", "d1"]).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        out = deploy("vapns", "d1", "7").await;
    }
    assert_eq!(
        out.stderr.trim_end(),
        "error: failed to create deployment: deployments.apps \"d1\" is forbidden: ValidatingAdmissionPolicy 'replicas.example.com' with binding 'replicas-binding' denied request: replicas must be at most 5, got 7"
    );
    let out = k(
        &kc,
        &[
            "-n",
            "vapns",
            "create",
            "deployment",
            "d1",
            "--image=nginx",
            "--replicas=7",
            "-o",
            "json",
            "--dry-run=server",
            "-v=0",
        ],
    )
    .await;
    assert!(!out.ok);

    let out = deploy("vapns", "forbidden", "1").await;
    assert_eq!(
        out.stderr.trim_end(),
        "error: failed to create deployment: deployments.apps \"forbidden\" is forbidden: ValidatingAdmissionPolicy 'replicas.example.com' with binding 'replicas-binding' denied request: name is forbidden"
    );
    let out = deploy("blocked", "b", "1").await;
    assert_eq!(
        out.stderr.trim_end(),
        "error: failed to create deployment: deployments.apps \"b\" is forbidden: ValidatingAdmissionPolicy 'replicas.example.com' with binding 'replicas-binding' denied request: failed expression: namespaceObject.metadata.name != 'blocked'"
    );

    // Allowed: within the policy, outside the bound namespaces, or through a
    // subresource the rules do not name.
    assert!(deploy("vapns", "ok", "2").await.ok);
    assert!(deploy("default", "big", "9").await.ok);
    let out = k(
        &kc,
        &["-n", "vapns", "scale", "deployment", "ok", "--replicas=9"],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let out = k(&kc, &["-n", "vapns", "delete", "deployment", "ok"]).await;
    assert!(out.ok, "{}", out.stderr);

    // Warn: admitted with a warning.
    let out = k(
        &kc,
        &[
            "-n",
            "vapns",
            "create",
            "configmap",
            "c1",
            "--from-literal=a=b",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(
        out.stderr.trim_end(),
        "Warning: Validation failed for ValidatingAdmissionPolicy 'warn.example.com' with binding 'warn-binding': configmaps should have a key"
    );
    let out = k(
        &kc,
        &[
            "-n",
            "default",
            "create",
            "configmap",
            "c2",
            "--from-literal=a=b",
        ],
    )
    .await;
    assert_eq!(out.stderr, "");
}

const MUTATING: &str = r#"apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicy
metadata: {name: replicas.mutate.example.com}
spec:
  failurePolicy: Fail
  reinvocationPolicy: Never
  matchConstraints:
    resourceRules:
    - apiGroups: [apps]
      apiVersions: [v1]
      operations: [CREATE, UPDATE]
      resources: [deployments]
  matchConditions:
  - name: not-skipped
    expression: "!has(object.metadata.labels) || !('skip' in object.metadata.labels)"
  mutations:
  - patchType: ApplyConfiguration
    applyConfiguration:
      expression: >
        Object{metadata: Object.metadata{annotations: {"mutated-by": "admission-policy"}},
               spec: Object.spec{replicas: object.spec.replicas * 2}}
  - patchType: JSONPatch
    jsonPatch:
      expression: >
        [JSONPatch{op: "add", path: "/metadata/labels/doubled", value: string(object.spec.replicas)}]
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicyBinding
metadata: {name: replicas-mutate-binding}
spec:
  policyName: replicas.mutate.example.com
  matchResources:
    namespaceSelector:
      matchLabels: {map: "on"}
"#;

/// MutatingAdmissionPolicy: an ApplyConfiguration merged into the object, then a
/// JSONPatch that sees the first mutation's result; match conditions and the binding's
/// namespace selector limit where it applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutating_admission_policies_mutate() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    let out = create(&kc, MUTATING).await;
    assert!(out.ok, "{}", out.stderr);
    assert!(k(&kc, &["create", "ns", "mapns"]).await.ok);
    assert!(k(&kc, &["label", "ns", "mapns", "map=on"]).await.ok);
    let get = |name: &'static str| {
        let kc = kc.clone();
        async move {
            let out = k(
                &kc,
                &["-n", "mapns", "get", "deployment", name, "-o",
                  "jsonpath={.spec.replicas} {.metadata.annotations.mutated-by} {.metadata.labels.doubled}"],
            )
            .await;
            out.stdout
        }
    };
    // The watch cache delivers the binding within moments.
    let mut seen = String::new();
    for i in 0..50 {
        let name = format!("d{i}");
        let out = k(
            &kc,
            &[
                "-n",
                "mapns",
                "create",
                "deployment",
                &name,
                "--image=nginx",
                "--replicas=3",
            ],
        )
        .await;
        assert!(out.ok, "{}", out.stderr);
        let got = k(
            &kc,
            &[
                "-n",
                "mapns",
                "get",
                "deployment",
                &name,
                "-o",
                "jsonpath={.spec.replicas}",
            ],
        )
        .await;
        if got.stdout == "6" {
            seen = name;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!seen.is_empty(), "the policy never took effect");
    let out = k(
        &kc,
        &[
            "-n",
            "mapns",
            "create",
            "deployment",
            "web",
            "--image=nginx",
            "--replicas=2",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(get("web").await, "4 admission-policy 4");
    // A match condition that does not hold, or a namespace outside the binding: untouched.
    let skip = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: labeled, namespace: mapns, labels: {skip: \"yes\", app: l}}\nspec:\n  replicas: 2\n  selector: {matchLabels: {app: l}}\n  template:\n    metadata: {labels: {app: l}}\n    spec: {containers: [{name: c, image: nginx}]}\n";
    let out = create(&kc, skip).await;
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(get("labeled").await, "2  ");
    let out = k(
        &kc,
        &[
            "-n",
            "default",
            "create",
            "deployment",
            "outside",
            "--image=nginx",
            "--replicas=2",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let out = k(
        &kc,
        &[
            "-n",
            "default",
            "get",
            "deployment",
            "outside",
            "-o",
            "jsonpath={.spec.replicas}",
        ],
    )
    .await;
    assert_eq!(out.stdout, "2");
}

/// POSTs the YAML `object(i)` to the default namespace's `plural`, i = 0, 1, ..., 100 ms
/// apart, until one is refused (a new policy binding reaches the admission chain within
/// moments): i and the answer.
async fn first_refusal(
    dir: &Path,
    kc: &Path,
    plural: &str,
    object: impl Fn(usize) -> String,
) -> (usize, Http) {
    for i in 0..50 {
        let answer = curl(
            dir,
            kc,
            "POST",
            &format!("/api/v1/namespaces/default/{plural}"),
            Some(("application/yaml", &object(i))),
        );
        if answer.code != 201 {
            return (i, answer);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no {plural} was refused: the binding never took effect");
}

/// Two policies whose mutation fails at run time (a key the object lacks): one fails
/// closed, one is ignored. Each binding selects ConfigMaps by a label.
const FAILING_MUTATIONS: &str = r#"apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicy
metadata: {name: fail.mutate.example.com}
spec:
  failurePolicy: Fail
  reinvocationPolicy: Never
  matchConstraints:
    resourceRules:
    - {apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [configmaps]}
  mutations:
  - patchType: ApplyConfiguration
    applyConfiguration:
      expression: 'Object{data: {"copy": object.data.missing}}'
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicy
metadata: {name: ignore.mutate.example.com}
spec:
  failurePolicy: Ignore
  reinvocationPolicy: Never
  matchConstraints:
    resourceRules:
    - {apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [configmaps]}
  mutations:
  - patchType: ApplyConfiguration
    applyConfiguration:
      expression: 'Object{data: {"copy": object.data.missing}}'
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicyBinding
metadata: {name: fail-binding}
spec:
  policyName: fail.mutate.example.com
  matchResources:
    objectSelector:
      matchLabels: {policy: fail}
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicyBinding
metadata: {name: ignore-binding}
spec:
  policyName: ignore.mutate.example.com
  matchResources:
    objectSelector:
      matchLabels: {policy: ignore}
"#;

/// A mutation that fails: under failurePolicy Fail the write is refused as upstream's
/// policy dispatcher refuses it (403, reason Invalid, the message naming the policy, the
/// binding and the expression's error, repeated as a cause) and nothing is stored; under
/// Ignore the object is stored as sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutating_admission_policy_failures_follow_the_failure_policy() {
    let (server, dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    let out = create(&kc, FAILING_MUTATIONS).await;
    assert!(out.ok, "{}", out.stderr);
    let cm = |name: &str, policy: &str| {
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}, namespace: default, labels: {{policy: {policy}}}}}\ndata: {{k: v}}\n"
        )
    };
    let message = "policy 'fail.mutate.example.com' with binding 'fail-binding' denied request: expression 'Object{data: {\"copy\": object.data.missing}}' resulted in error: no such key: missing";
    let (i, answer) = first_refusal(dir.path(), &kc, "configmaps", |i| {
        cm(&format!("f{i}"), "fail")
    })
    .await;
    let name = format!("f{i}");
    // Upstream keeps admission.NewForbidden's code with the policy error's reason.
    let status = answer.body;
    assert_eq!(answer.code, 403, "{status}");
    assert_eq!(status["reason"], "Invalid");
    assert_eq!(status["message"], message);
    assert_eq!(status["details"]["name"], name.as_str());
    assert_eq!(status["details"]["kind"], "configmaps");
    assert_eq!(
        status["details"]["causes"],
        serde_json::json!([{"message": message}])
    );
    assert!(
        !k(&kc, &["get", "cm", &name]).await.ok,
        "a refused object is not stored"
    );
    let out = create(&kc, &cm("by-kubectl", "fail")).await;
    assert!(!out.ok);
    assert!(out.stderr.contains(message), "{}", out.stderr);

    // Ignored: stored as sent.
    let out = create(&kc, &cm("ignored", "ignore")).await;
    assert!(out.ok, "{}", out.stderr);
    let out = k(&kc, &["get", "cm", "ignored", "-o", "jsonpath={.data}"]).await;
    assert_eq!(out.stdout, r#"{"k":"v"}"#);
}

/// A policy with a paramKind: one binding whose params are missing (Deny when not found,
/// although the binding only warns), one with no paramRef (validates with null params).
const PARAM_POLICIES: &str = r#"apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: params.example.com}
spec:
  failurePolicy: Fail
  paramKind: {apiVersion: v1, kind: ConfigMap}
  matchConstraints:
    resourceRules:
    - {apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [secrets]}
  validations:
  - expression: "params == null || object.metadata.name != params.data.forbidden"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: missing-params}
spec:
  policyName: params.example.com
  validationActions: [Warn]
  paramRef: {name: no-such-config, namespace: default, parameterNotFoundAction: Deny}
  matchResources:
    objectSelector:
      matchLabels: {params: missing}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: no-param-ref}
spec:
  policyName: params.example.com
  validationActions: [Deny]
  matchResources:
    objectSelector:
      matchLabels: {params: none}
"#;

/// Configuration errors are Deny decisions whatever the binding's actions (upstream's
/// addConfigError): 422 Invalid, "failed to configure binding: ...". A binding without a
/// paramRef validates with null params.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validating_admission_policy_configuration_errors_deny() {
    let (server, dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    let out = create(&kc, PARAM_POLICIES).await;
    assert!(out.ok, "{}", out.stderr);
    let secret = |name: &str, label: &str| {
        format!("apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, namespace: default, labels: {{params: {label}}}}}\n")
    };
    let message = "ValidatingAdmissionPolicy 'params.example.com' with binding 'missing-params' denied request: failed to configure binding: no params found for policy binding with `Deny` parameterNotFoundAction";
    let (_, answer) = first_refusal(dir.path(), &kc, "secrets", |i| {
        secret(&format!("s{i}"), "missing")
    })
    .await;
    assert_eq!(answer.code, 422, "{}", answer.body);
    assert_eq!(answer.body["reason"], "Invalid");
    assert_eq!(
        answer.body["message"],
        format!(
            "secrets \"{}\" is forbidden: {message}",
            answer.body["details"]["name"].as_str().unwrap()
        )
    );
    assert_eq!(
        answer.body["details"]["causes"],
        serde_json::json!([{"message": message}])
    );
    // No paramRef: the expression sees null params and allows.
    let out = create(&kc, &secret("plain", "none")).await;
    assert!(out.ok, "{}", out.stderr);
}
