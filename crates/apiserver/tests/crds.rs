//! CustomResourceDefinitions and their custom resources, driven by the real kubectl; the
//! expected outputs were taken from kube-apiserver v1.37.2.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

mod common;
use common::*;

/// Upstream's CronTab example, with status and scale subresources and printer columns.
const CRD: &str = "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: crontabs.stable.example.com
spec:
  group: stable.example.com
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
              cronSpec:
                type: string
              image:
                type: string
              replicas:
                type: integer
                minimum: 1
                maximum: 10
          status:
            type: object
            properties:
              replicas:
                type: integer
              labelSelector:
                type: string
    subresources:
      status: {}
      scale:
        specReplicasPath: .spec.replicas
        statusReplicasPath: .status.replicas
        labelSelectorPath: .status.labelSelector
    additionalPrinterColumns:
    - name: Spec
      type: string
      description: The cron spec defining the interval a CronJob is run
      jsonPath: .spec.cronSpec
    - name: Replicas
      type: integer
      description: The number of jobs launched by the CronJob
      jsonPath: .spec.replicas
    - name: Age
      type: date
      jsonPath: .metadata.creationTimestamp
  scope: Namespaced
  names:
    plural: crontabs
    singular: crontab
    kind: CronTab
    shortNames:
    - ct
";

const CRONTAB: &str = "apiVersion: stable.example.com/v1
kind: CronTab
metadata:
  name: my-new-cron-object
spec:
  cronSpec: \"* * * * */5\"
  image: my-awesome-cron-image
  replicas: 2
  junk: 1
";

async fn create(kc: &Path, yaml: &str, extra: &[&str]) -> Out {
    let mut args = vec!["create", "-f", "-"];
    args.extend_from_slice(extra);
    k_in(None, kc, &args, Some(yaml)).await
}

/// Runs `args` until it succeeds (discovery follows a new definition within moments).
async fn eventually(kc: &Path, args: &[&str]) -> Out {
    for _ in 0..50 {
        let out = k(kc, args).await;
        if out.ok {
            return out;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("kubectl {args:?} kept failing");
}

/// The line of `kubectl api-resources` for `plural`, as words.
async fn api_resource(kc: &Path, plural: &str) -> Option<Vec<String>> {
    let out = k(kc, &["api-resources"]).await;
    assert!(out.ok, "{}", out.stderr);
    out.stdout
        .lines()
        .find(|l| l.split_whitespace().next() == Some(plural))
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_resources_follow_their_definition() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();

    let out = create(&kc, CRD, &[]).await;
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(
        out.stdout,
        "customresourcedefinition.apiextensions.k8s.io/crontabs.stable.example.com created\n"
    );
    eventually(&kc, &["get", "--raw", "/apis/stable.example.com/v1"]).await;

    // The definition: its table, defaults and the status the controllers set.
    let out = k(&kc, &["get", "crd", "-o", "wide"]).await;
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(
        lines[0],
        "NAME                          SCOPE        VERSIONS      CREATED AT             GROUP                KIND      SHORTNAMES   ESTABLISHED"
    );
    let row: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(
        [row[0], row[1], row[2], row[4], row[5], row[6], row[7]],
        [
            "crontabs.stable.example.com",
            "Namespaced",
            "v1(storage)",
            "stable.example.com",
            "CronTab",
            "ct",
            "true"
        ]
    );
    let crd = out_json(
        &k(
            &kc,
            &["get", "crd", "crontabs.stable.example.com", "-o", "json"],
        )
        .await,
    );
    assert_eq!(crd["spec"]["conversion"]["strategy"], "None");
    assert_eq!(crd["spec"]["names"]["listKind"], "CronTabList");
    assert_eq!(crd["metadata"]["generation"], 1);
    assert_eq!(crd["status"]["acceptedNames"]["shortNames"][0], "ct");
    assert_eq!(crd["status"]["storedVersions"], serde_json::json!(["v1"]));
    let conds: Vec<(&str, &str, &str)> = crd["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["type"].as_str().unwrap(),
                c["status"].as_str().unwrap(),
                c["reason"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        conds,
        [
            ("NamesAccepted", "True", "NoConflicts"),
            ("Established", "True", "InitialNamesAccepted")
        ]
    );

    // Discovery lists the custom resource, aggregated discovery included.
    assert_eq!(
        api_resource(&kc, "crontabs").await.unwrap(),
        ["crontabs", "ct", "stable.example.com/v1", "true", "CronTab"]
    );
    let out = k(&kc, &["api-resources", "-o", "wide"]).await;
    let wide: Vec<&str> = out
        .stdout
        .lines()
        .find(|l| l.starts_with("crontabs "))
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(
        wide[5],
        "delete,deletecollection,get,list,patch,create,update,watch"
    );
    let list = out_json(&k(&kc, &["get", "--raw", "/apis/stable.example.com/v1"]).await);
    let names: Vec<&str> = list["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["crontabs", "crontabs/scale", "crontabs/status"]);

    // The schema is published in OpenAPI v3, for kubectl explain.
    let out = k(&kc, &["explain", "crontabs.spec.replicas"]).await;
    assert!(
        out.stdout.contains("FIELD: replicas <integer>"),
        "{}{}",
        out.stdout,
        out.stderr
    );

    // Unknown fields: refused by strict field validation, else pruned.
    let out = create(&kc, CRONTAB, &[]).await;
    assert!(!out.ok);
    assert_eq!(
        out.stderr,
        "Error from server (BadRequest): error when creating \"STDIN\": CronTab in version \"v1\" cannot be handled as a CronTab: strict decoding error: unknown field \"spec.junk\"\n"
    );
    let out = create(&kc, CRONTAB, &["--validate=false"]).await;
    assert_eq!(
        out.stdout, "crontab.stable.example.com/my-new-cron-object created\n",
        "{}",
        out.stderr
    );
    let ct = out_json(&k(&kc, &["get", "ct", "my-new-cron-object", "-o", "json"]).await);
    assert_eq!(
        ct["spec"],
        serde_json::json!({"cronSpec": "* * * * */5", "image": "my-awesome-cron-image", "replicas": 2})
    );
    assert_eq!(ct["metadata"]["generation"], 1);
    // List items keep their kind, as upstream's unstructured lists.
    let list = out_json(
        &k(
            &kc,
            &["get", "--raw", "/apis/stable.example.com/v1/crontabs"],
        )
        .await,
    );
    assert_eq!(list["kind"], "CronTabList");
    assert_eq!(list["items"][0]["kind"], "CronTab");
    assert_eq!(list["items"][0]["apiVersion"], "stable.example.com/v1");

    // The printer columns.
    let out = k(&kc, &["get", "ct"]).await;
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(
        lines[0],
        "NAME                 SPEC          REPLICAS   AGE"
    );
    assert!(
        lines[1].starts_with("my-new-cron-object   * * * * */5   2          "),
        "{}",
        out.stdout
    );
    assert!(lines[1].ends_with('s'), "{}", out.stdout);

    // Schema validation, with upstream's messages.
    let bad = CRONTAB
        .replace("my-new-cron-object", "x")
        .replace("replicas: 2", "replicas: 20")
        .replace("  junk: 1\n", "");
    let out = create(&kc, &bad, &[]).await;
    assert_eq!(
        out.stderr,
        "The CronTab \"x\" is invalid: spec.replicas: Invalid value: 20: spec.replicas in body should be less than or equal to 10\n"
    );
    let bad = bad.replace("replicas: 20", "replicas: 0");
    let out = create(&kc, &bad, &[]).await;
    assert_eq!(
        out.stderr,
        "The CronTab \"x\" is invalid: spec.replicas: Invalid value: 0: spec.replicas in body should be greater than or equal to 1\n"
    );
    let bad = bad.replace("\"* * * * */5\"", "5");
    let out = create(&kc, &bad, &[]).await;
    assert!(
        out.stderr
            .contains("* spec.cronSpec: Invalid value: \"integer\": spec.cronSpec in body must be of type string: \"integer\"\n"),
        "{}",
        out.stderr
    );

    // The scale subresource.
    let out = k(&kc, &["scale", "ct", "my-new-cron-object", "--replicas=3"]).await;
    assert_eq!(
        out.stdout, "crontab.stable.example.com/my-new-cron-object scaled\n",
        "{}",
        out.stderr
    );
    let scale = out_json(
        &k(
            &kc,
            &[
                "get",
                "--raw",
                "/apis/stable.example.com/v1/namespaces/default/crontabs/my-new-cron-object/scale",
            ],
        )
        .await,
    );
    assert_eq!(scale["kind"], "Scale");
    assert_eq!(scale["spec"]["replicas"], 3);

    // The status subresource changes only the status; the main resource, all but it.
    let out = k(
        &kc,
        &[
            "patch",
            "ct",
            "my-new-cron-object",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"replicas":5,"labelSelector":"a=b"},"spec":{"replicas":7}}"#,
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let out = k(
        &kc,
        &[
            "patch",
            "ct",
            "my-new-cron-object",
            "--type=merge",
            "-p",
            r#"{"status":{"replicas":9},"spec":{"image":"b"}}"#,
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let ct = out_json(&k(&kc, &["get", "ct", "my-new-cron-object", "-o", "json"]).await);
    assert_eq!(
        ct["spec"],
        serde_json::json!({"cronSpec": "* * * * */5", "image": "b", "replicas": 3})
    );
    assert_eq!(
        ct["status"],
        serde_json::json!({"replicas": 5, "labelSelector": "a=b"})
    );
    assert_eq!(ct["metadata"]["generation"], 3);
    let scale = out_json(
        &k(
            &kc,
            &[
                "get",
                "--raw",
                "/apis/stable.example.com/v1/namespaces/default/crontabs/my-new-cron-object/scale",
            ],
        )
        .await,
    );
    assert_eq!(
        scale["status"],
        serde_json::json!({"replicas": 5, "selector": "a=b"})
    );

    // ... and in OpenAPI v2 (paths and the definition), as kube-apiserver publishes it.
    let v2 = out_json(&k(&kc, &["get", "--raw", "/openapi/v2"]).await);
    let def = &v2["definitions"]["com.example.stable.v1.CronTab"];
    assert_eq!(
        def["x-kubernetes-group-version-kind"][0]["kind"], "CronTab",
        "{def}"
    );
    assert!(
        def["properties"]["spec"]["properties"]["replicas"].is_object(),
        "{def}"
    );
    assert!(v2["paths"]
        .get("/apis/stable.example.com/v1/namespaces/{namespace}/crontabs")
        .is_some());
    // Deleting the definition removes the resource from discovery, and its objects.
    let out = k(&kc, &["delete", "crd", "crontabs.stable.example.com"]).await;
    assert_eq!(
        out.stdout,
        "customresourcedefinition.apiextensions.k8s.io \"crontabs.stable.example.com\" deleted\n",
        "{}",
        out.stderr
    );
    assert_eq!(api_resource(&kc, "crontabs").await, None);
    let index = out_json(&k(&kc, &["get", "--raw", "/openapi/v3"]).await);
    assert!(index["paths"].get("apis/stable.example.com/v1").is_none());
    let v2 = out_json(&k(&kc, &["get", "--raw", "/openapi/v2"]).await);
    assert!(v2["definitions"]
        .get("com.example.stable.v1.CronTab")
        .is_none());
    let out = k(&kc, &["get", "ct"]).await;
    assert_eq!(
        out.stderr,
        "error: the server doesn't have a resource type \"ct\"\n"
    );
    let out = create(&kc, CRD, &[]).await;
    assert!(out.ok, "{}", out.stderr);
    let out = eventually(&kc, &["get", "ct"]).await;
    assert_eq!(out.stderr, "No resources found in default namespace.\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn definitions_are_validated() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    let bad = CRD
        .replace(
            "name: crontabs.stable.example.com",
            "name: foo.stable.example.com",
        )
        .replace("scope: Namespaced", "scope: Global");
    let out = create(&kc, &bad, &[]).await;
    assert_eq!(
        out.stderr,
        "The CustomResourceDefinition \"foo.stable.example.com\" is invalid: \n\
         * metadata.name: Invalid value: \"foo.stable.example.com\": must be spec.names.plural+\".\"+spec.group\n\
         * spec.scope: Unsupported value: \"Global\": supported values: \"Cluster\", \"Namespaced\"\n"
    );
}

/// A cluster-scoped definition without printer columns: enum, required, defaults,
/// preserved unknown fields and categories.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_scoped_resources_with_defaults_and_categories() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    let crd = "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.acme.io
spec:
  group: acme.io
  scope: Cluster
  names:
    plural: widgets
    kind: Widget
    categories: [gadgets]
  versions:
  - name: v1alpha1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [size]
            properties:
              size:
                type: string
                enum: [small, large]
              color:
                type: string
                default: blue
              extra:
                type: object
                x-kubernetes-preserve-unknown-fields: true
";
    let out = create(&kc, crd, &[]).await;
    assert!(out.ok, "{}", out.stderr);
    eventually(&kc, &["get", "--raw", "/apis/acme.io/v1alpha1"]).await;
    assert_eq!(
        api_resource(&kc, "widgets").await.unwrap(),
        ["widgets", "acme.io/v1alpha1", "false", "Widget"]
    );
    let widget = |name: &str, spec: &str| {
        format!(
            "apiVersion: acme.io/v1alpha1\nkind: Widget\nmetadata:\n  name: {name}\nspec:\n{spec}"
        )
    };
    let out = create(
        &kc,
        &widget("w1", "  size: small\n  extra: {anything: [1, 2]}\n"),
        &[],
    )
    .await;
    assert_eq!(out.stdout, "widget.acme.io/w1 created\n", "{}", out.stderr);
    let w = out_json(&k(&kc, &["get", "widget", "w1", "-o", "json"]).await);
    assert_eq!(
        w["spec"],
        serde_json::json!({"color": "blue", "extra": {"anything": [1, 2]}, "size": "small"})
    );
    assert!(w["metadata"].get("namespace").is_none());
    let out = create(&kc, &widget("w2", "  size: medium\n"), &[]).await;
    assert_eq!(
        out.stderr,
        "The Widget \"w2\" is invalid: spec.size: Unsupported value: \"medium\": supported values: \"small\", \"large\"\n"
    );
    let out = create(&kc, &widget("w3", "  color: red\n"), &[]).await;
    assert_eq!(
        out.stderr,
        "The Widget \"w3\" is invalid: spec.size: Required value\n"
    );
    // Without printer columns the table is Name and Age; the category finds the kind.
    let out = k(&kc, &["get", "gadgets"]).await;
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines[0], "NAME   AGE", "{}", out.stderr);
    assert!(lines[1].starts_with("w1     "), "{}", out.stdout);
}

const WIDGETS: &str = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  names: {plural: widgets, singular: widget, kind: Widget}
  scope: Namespaced
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
              size: {type: integer, default: 1}
              color: {type: string}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defaults_apply_on_write_and_on_read() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    let out = create(&kc, WIDGETS, &[]).await;
    assert!(out.ok, "{}", out.stderr);
    let w =
        "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: w1\nspec:\n  color: red\n";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let out = create(&kc, w, &[]).await;
        if out.ok {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{}", out.stderr);
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let out = k(&kc, &["get", "widget", "w1", "-o", "jsonpath={.spec.size}"]).await;
    assert_eq!(out.stdout, "1");
    // A default added later shows on objects stored before it.
    let out = k(
        &kc,
        &["patch", "crd", "widgets.example.com", "--type=json", "-p",
          r#"[{"op":"add","path":"/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/shape","value":{"type":"string","default":"round"}}]"#],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let out = k(
            &kc,
            &["get", "widget", "w1", "-o", "jsonpath={.spec.shape}"],
        )
        .await;
        if out.stdout == "round" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{} {}",
            out.stdout,
            out.stderr
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let out = k(
        &kc,
        &["get", "widgets", "-o", "jsonpath={.items[0].spec.shape}"],
    )
    .await;
    assert_eq!(out.stdout, "round");
}

/// A definition shaped as upstream's field validation conformance tests make them: a
/// typed `spec` with a list-map and an embedded resource, and a second version that keeps
/// unknown fields.
const NOXU: &str = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: noxus.fv.example.com}
spec:
  group: fv.example.com
  scope: Cluster
  names: {plural: noxus, singular: noxu, kind: Noxu, listKind: NoxuList}
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
              foo: {type: string}
              ports:
                type: array
                x-kubernetes-list-type: map
                x-kubernetes-list-map-keys: [containerPort, protocol]
                items:
                  type: object
                  required: [containerPort, protocol]
                  properties:
                    containerPort: {type: integer, format: int32}
                    protocol: {type: string}
                    name: {type: string}
              template:
                type: object
                x-kubernetes-embedded-resource: true
                x-kubernetes-preserve-unknown-fields: true
  - name: v2
    served: true
    storage: false
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            x-kubernetes-preserve-unknown-fields: true
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_side_apply_types_custom_resources_with_their_schema() {
    let (server, dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    assert!(create(&kc, NOXU, &[]).await.ok);
    eventually(&kc, &["get", "--raw", "/apis/fv.example.com/v1"]).await;
    let apply = |version: &str, query: &str, body: &str| {
        let path = format!("/apis/fv.example.com/{version}/noxus/mytest?fieldManager=m{query}");
        let r = tokio::task::block_in_place(|| {
            curl(
                dir.path(),
                &kc,
                "PATCH",
                &path,
                Some(("application/apply-patch+yaml", body)),
            )
        });
        (r.code, r.body, r.warnings)
    };

    // Fields the schema does not declare fail the typed conversion, whatever the
    // directive, with upstream's bare 500 (the texts the conformance tests look for).
    let unknown_root = "apiVersion: fv.example.com/v1\nkind: Noxu\nmetadata:\n  name: mytest\nunknownField: unknown\nspec:\n  foo: foo1\n";
    for query in ["&fieldValidation=Strict", "&fieldValidation=Ignore"] {
        let (code, answer, _) = apply("v1", query, unknown_root);
        assert_eq!(code, 500, "{answer}");
        assert_eq!(
            answer["message"],
            "failed to create typed patch object (/mytest; fv.example.com/v1, Kind=Noxu): .unknownField: field not declared in schema"
        );
        assert_eq!(answer["reason"], serde_json::Value::Null, "{answer}");
    }
    // The root's metadata and an embedded resource's are ObjectMeta.
    let unknown_meta = "apiVersion: fv.example.com/v1\nkind: Noxu\nmetadata:\n  name: mytest\n  unknownMeta: unknown\nspec:\n  template:\n    apiVersion: foo/v1\n    kind: Sub\n    metadata:\n      unknownSubMeta: unknown\n      name: subobject\n    anything: kept\n";
    let (code, answer, _) = apply("v1", "&fieldValidation=Strict", unknown_meta);
    assert_eq!(code, 500, "{answer}");
    assert_eq!(
        answer["message"],
        "failed to create typed patch object (/mytest; fv.example.com/v1, Kind=Noxu): errors:\n  .metadata.unknownMeta: field not declared in schema\n  .spec.template.metadata.unknownSubMeta: field not declared in schema"
    );

    // A valid apply: the list-map is keyed by its key fields in managedFields, and the
    // embedded resource's unknown fields are kept.
    let valid = "apiVersion: fv.example.com/v1\nkind: Noxu\nmetadata:\n  name: mytest\nspec:\n  foo: foo1\n  ports:\n  - name: x\n    containerPort: 80\n    protocol: TCP\n  template:\n    apiVersion: foo/v1\n    kind: Sub\n    anything: kept\n";
    let (code, obj, _) = apply("v1", "&fieldValidation=Strict", valid);
    assert_eq!(code, 201, "{obj}");
    assert_eq!(obj["spec"]["template"]["anything"], "kept");
    let fields = &obj["metadata"]["managedFields"][0]["fieldsV1"]["f:spec"];
    assert!(
        fields["f:ports"]
            .get(r#"k:{"containerPort":80,"protocol":"TCP"}"#)
            .is_some(),
        "{fields}"
    );

    // A repeated key: the last value is applied; Strict refuses the body with yaml.v2's
    // line (the leading blank line counts), Warn passes it with the line as a warning.
    let dup = "\napiVersion: fv.example.com/v2\nkind: Noxu\nmetadata:\n  name: mytest\nspec:\n  unknown: uk1\n  foo: foo1\n  foo: foo2\n";
    let (code, answer, _) = apply("v2", "&fieldValidation=Strict", dup);
    assert_eq!(code, 400, "{answer}");
    assert_eq!(
        answer["message"],
        "error strict decoding patch: error converting YAML to JSON: yaml: unmarshal errors:\n  line 9: key \"foo\" already set in map"
    );
    let (code, obj, warnings) = apply("v2", "&fieldValidation=Warn&force=true", dup);
    assert_eq!(code, 200, "{obj}");
    assert_eq!(obj["spec"]["foo"], "foo2");
    assert!(
        warnings
            .iter()
            .any(|w| w.contains(r#"line 9: key \"foo\" already set in map"#)
                || w.contains(r#"line 9: key "foo" already set in map"#)),
        "{warnings:?}"
    );
}

/// A definition's status conditions as (type, status, reason, message).
async fn conditions(kc: &Path, name: &str) -> Vec<(String, String, String, String)> {
    let crd = out_json(&k(kc, &["get", "crd", name, "-o", "json"]).await);
    crd["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            let s = |f: &str| c[f].as_str().unwrap_or("").to_owned();
            (s("type"), s("status"), s("reason"), s("message"))
        })
        .collect()
}

fn named(plural: &str, kind: &str, short: &str) -> String {
    format!(
        "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: {plural}.names.example.com
spec:
  group: names.example.com
  scope: Namespaced
  names: {{plural: {plural}, kind: {kind}, shortNames: [{short}]}}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema: {{type: object, x-kubernetes-preserve-unknown-fields: true}}
"
    )
}

/// The naming and establishing controllers: a definition is written with no names
/// accepted, then accepted and Established; one whose kind another definition of the group
/// holds is not accepted nor served until that one is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_in_use_are_not_accepted() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    let out = k_in(
        None,
        &kc,
        &["create", "-f", "-", "-o", "json"],
        Some(&named("alphas", "Alpha", "al")),
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    // The create answer is what upstream's strategy writes, before any controller acts.
    let created = out_json(&out);
    assert_eq!(
        created["status"],
        serde_json::json!({"acceptedNames": {"plural": "", "kind": ""}, "conditions": null, "storedVersions": ["v1"]})
    );
    eventually(&kc, &["get", "alphas"]).await;
    let accepted = [
        ("NamesAccepted", "True", "NoConflicts", "no conflicts found"),
        (
            "Established",
            "True",
            "InitialNamesAccepted",
            "the initial names have been accepted",
        ),
    ];
    let owned = |c: &[(&str, &str, &str, &str)]| -> Vec<(String, String, String, String)> {
        c.iter()
            .map(|(a, b, c, d)| (a.to_string(), b.to_string(), c.to_string(), d.to_string()))
            .collect()
    };
    assert_eq!(
        conditions(&kc, "alphas.names.example.com").await,
        owned(&accepted)
    );

    // The same kind (so list kind) and short name: the last conflict checked is reported.
    let out = create(&kc, &named("betas", "Alpha", "al"), &[]).await;
    assert!(out.ok, "{}", out.stderr);
    let refused = [
        (
            "NamesAccepted",
            "False",
            "ListKindConflict",
            "\"AlphaList\" is already in use",
        ),
        (
            "Established",
            "False",
            "NotAccepted",
            "not all names are accepted",
        ),
    ];
    let mut got = Vec::new();
    for _ in 0..50 {
        got = conditions(&kc, "betas.names.example.com").await;
        if got == owned(&refused) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(got, owned(&refused));
    let crd = out_json(
        &k(
            &kc,
            &["get", "crd", "betas.names.example.com", "-o", "json"],
        )
        .await,
    );
    assert_eq!(crd["status"]["acceptedNames"]["plural"], "betas");
    assert!(crd["status"]["acceptedNames"].get("shortNames").is_none());
    let out = k(
        &kc,
        &[
            "get",
            "--raw",
            "/apis/names.example.com/v1/namespaces/default/betas",
        ],
    )
    .await;
    assert!(
        !out.ok,
        "a definition whose names are not accepted is not served"
    );

    // Once the holder is gone, its names are free.
    let out = k(&kc, &["delete", "crd", "alphas.names.example.com"]).await;
    assert!(out.ok, "{}", out.stderr);
    eventually(&kc, &["get", "betas"]).await;
    assert_eq!(
        conditions(&kc, "betas.names.example.com").await,
        owned(&accepted)
    );
    let crd = out_json(
        &k(
            &kc,
            &["get", "crd", "betas.names.example.com", "-o", "json"],
        )
        .await,
    );
    assert_eq!(
        crd["status"]["acceptedNames"]["shortNames"],
        serde_json::json!(["al"])
    );
}

/// Each served version of a definition gets a Local APIService (kube-apiserver's
/// crdRegistrationController), which goes with the version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn served_versions_get_automanaged_api_services() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    let two_versions = CRD.replacen(
        "  versions:\n",
        "  versions:\n  - name: v2\n    served: false\n    storage: false\n    schema:\n      openAPIV3Schema: {type: object}\n",
        1,
    );
    let out = create(&kc, &two_versions, &[]).await;
    assert!(out.ok, "{}", out.stderr);
    let out = eventually(
        &kc,
        &["get", "apiservice", "v1.stable.example.com", "-o", "json"],
    )
    .await;
    let svc = out_json(&out);
    assert_eq!(
        svc["metadata"]["labels"],
        serde_json::json!({"kube-aggregator.kubernetes.io/automanaged": "true"})
    );
    assert_eq!(
        svc["spec"],
        serde_json::json!({"group": "stable.example.com", "version": "v1",
            "groupPriorityMinimum": 1000, "versionPriority": 100})
    );
    let cond = &svc["status"]["conditions"][0];
    assert_eq!(
        (
            &cond["type"],
            &cond["status"],
            &cond["reason"],
            &cond["message"]
        ),
        (
            &serde_json::json!("Available"),
            &serde_json::json!("True"),
            &serde_json::json!("Local"),
            &serde_json::json!("Local APIServices are always available")
        )
    );
    // Not served, no APIService.
    let out = k(&kc, &["get", "apiservice", "v2.stable.example.com"]).await;
    assert!(!out.ok);
    let out = k(&kc, &["get", "apiservices"]).await;
    assert!(
        out.stdout
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>()[..3]
                == ["v1.stable.example.com", "Local", "True"]),
        "{}",
        out.stdout
    );

    let out = k(&kc, &["delete", "crd", "crontabs.stable.example.com"]).await;
    assert!(out.ok, "{}", out.stderr);
    for _ in 0..50 {
        if !k(&kc, &["get", "apiservice", "v1.stable.example.com"])
            .await
            .ok
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("v1.stable.example.com outlived its definition");
}
