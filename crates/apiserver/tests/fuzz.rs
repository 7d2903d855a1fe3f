//! Fuzzing of what the API server decodes from the network: request bodies (JSON, YAML and
//! Kubernetes protobuf) through create and update, and patches (JSON patch, merge patch,
//! strategic merge patch) through patch, for every served resource, with `dryRun=All`.
//!
//! Inputs are mutated from valid seeds (one object per resource, and the protobuf bodies
//! kubectl sent, captured in crates/apimachinery/tests/data/protobuf): byte-level mutations
//! for the decoders and structure-aware ones (wrong types, deep nesting, odd numbers, huge
//! strings, nulls) for the strategies behind them. Each run is bounded in time:
//! `KUMO_FUZZ_SECONDS` per target (default 6), seeded by `KUMO_FUZZ_SEED` (default: random,
//! printed). The oracle: no panic, and never a 500 — bad input must get a 4xx Status.
//! A failing input is written to `$CARGO_TARGET_TMPDIR/fuzz-failures/`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use kumo_apiserver::negotiate::Accept;
use kumo_apiserver::registry::{Registry, Resource};
use kumo_apiserver::rest::{Request, Rest};
use kumo_storage::embedded::{EmbeddedConfig, EmbeddedStore};
use kumo_storage::Store;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

fn budget() -> Duration {
    let secs = std::env::var("KUMO_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(6.0);
    Duration::from_secs_f64(secs)
}

fn rng(target: &str) -> StdRng {
    let seed = std::env::var("KUMO_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or_else(|| rand::rng().random());
    eprintln!("fuzz {target}: KUMO_FUZZ_SEED={seed}");
    StdRng::seed_from_u64(seed)
}

/// Every served resource.
fn resources(registry: &Registry) -> Vec<Arc<Resource>> {
    let mut out: Vec<Arc<Resource>> = registry.in_group_version("", "v1").collect();
    for (g, versions) in registry.groups() {
        for v in versions {
            out.extend(registry.in_group_version(g, v));
        }
    }
    out
}

fn seed_object(res: &Resource, name: &str) -> Value {
    let mut obj = json!({
        "apiVersion": res.api_version(),
        "kind": res.kind,
        "metadata": {"name": name, "labels": {"app": "fuzz"}, "annotations": {"a": "b"}},
    });
    if res.namespaced {
        obj["metadata"]["namespace"] = json!("default");
    }
    // Shapes the common resources expect, so mutations reach their deeper validation.
    let template = json!({
        "metadata": {"labels": {"app": "fuzz"}},
        "spec": {"containers": [{"name": "c", "image": "nginx:1.29", "ports": [{"containerPort": 80}],
                                 "env": [{"name": "A", "value": "1"}],
                                 "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]},
    });
    match res.kind {
        "Pod" => obj["spec"] = template["spec"].clone(),
        "ConfigMap" => obj["data"] = json!({"k": "v"}),
        "Secret" => obj["stringData"] = json!({"k": "v"}),
        "Deployment" | "ReplicaSet" | "StatefulSet" | "DaemonSet" | "ReplicationController" => {
            obj["spec"] = json!({"replicas": 2, "selector": {"matchLabels": {"app": "fuzz"}}, "template": template});
            if res.kind == "ReplicationController" {
                obj["spec"]["selector"] = json!({"app": "fuzz"});
            }
        }
        "Job" => {
            let mut t = template.clone();
            t["spec"]["restartPolicy"] = json!("Never");
            obj["spec"] = json!({"template": t});
        }
        "Service" => {
            obj["spec"] = json!({"selector": {"app": "fuzz"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]})
        }
        "Event" => {
            obj["involvedObject"] = json!({"kind": "Pod", "name": "p", "namespace": "default"});
            obj["reason"] = json!("Fuzz");
        }
        "Lease" => obj["spec"] = json!({"holderIdentity": "x", "leaseDurationSeconds": 15}),
        "Node" => obj["status"] = json!({"conditions": [{"type": "Ready", "status": "True"}]}),
        _ => {}
    }
    obj
}

/// A random JSON value, up to `depth` levels deep.
fn random_value(rng: &mut StdRng, depth: usize) -> Value {
    match rng.random_range(0..if depth == 0 { 8 } else { 10 }) {
        0 => Value::Null,
        1 => json!(rng.random::<bool>()),
        2 => json!(rng.random_range(-3i64..3)),
        3 => json!([i64::MAX, i64::MIN, 1 << 53, -1, 0, 65536, 2147483648][rng.random_range(0..7)]),
        4 => json!([1e308, -0.5, 1.5, 3.0][rng.random_range(0..4)]),
        5 => json!(
            [
                "",
                "a",
                "A_b",
                "-",
                "1Gi",
                "100m",
                "default",
                "é\u{0}",
                "${x}",
                "kube-system"
            ][rng.random_range(0..10)]
        ),
        6 => json!("x".repeat(rng.random_range(0..300))),
        7 => json!(
            [
                "Always",
                "Never",
                "TCP",
                "ClusterIP",
                "NodePort",
                "None",
                "LoadBalancer"
            ][rng.random_range(0..7)]
        ),
        8 => Value::Array(
            (0..rng.random_range(0..4))
                .map(|_| random_value(rng, depth - 1))
                .collect(),
        ),
        _ => {
            let keys = [
                "name",
                "spec",
                "metadata",
                "items",
                "ports",
                "port",
                "containers",
                "image",
                "selector",
                "matchLabels",
                "labels",
                "template",
                "type",
                "value",
                "key",
                "status",
                "conditions",
                "replicas",
                "finalizers",
                "ownerReferences",
                "$patch",
                "$retainKeys",
                "$setElementOrder/containers",
                "$deleteFromPrimitiveList/finalizers",
            ];
            Value::Object(
                (0..rng.random_range(0..4))
                    .map(|_| {
                        (
                            keys[rng.random_range(0..keys.len())].to_owned(),
                            random_value(rng, depth - 1),
                        )
                    })
                    .collect(),
            )
        }
    }
}

/// Every node of `v`, as JSON pointers.
fn pointers(v: &Value, at: String, out: &mut Vec<String>) {
    out.push(at.clone());
    match v {
        Value::Object(m) => {
            for (k, c) in m {
                pointers(
                    c,
                    format!("{at}/{}", k.replace('~', "~0").replace('/', "~1")),
                    out,
                )
            }
        }
        Value::Array(a) => {
            for (i, c) in a.iter().enumerate() {
                pointers(c, format!("{at}/{i}"), out)
            }
        }
        _ => {}
    }
}

/// A structure-aware mutation: replace, delete, duplicate or deepen one node.
fn mutate_value(rng: &mut StdRng, v: &mut Value) {
    let mut ptrs = Vec::new();
    pointers(v, String::new(), &mut ptrs);
    let p = ptrs[rng.random_range(0..ptrs.len())].clone();
    let choice = rng.random_range(0..6);
    if p.is_empty() && choice != 5 {
        if let Value::Object(m) = v {
            m.insert("spec".into(), random_value(rng, 3));
        }
        return;
    }
    match choice {
        0 | 1 => {
            if let Some(n) = v.pointer_mut(&p) {
                *n = random_value(rng, 3);
            }
        }
        2 => {
            // Remove the node from its parent.
            let (parent, last) = p.rsplit_once('/').unwrap();
            match v.pointer_mut(parent) {
                Some(Value::Object(m)) => {
                    m.remove(&last.replace("~1", "/").replace("~0", "~"));
                }
                Some(Value::Array(a)) => {
                    if let Ok(i) = last.parse::<usize>() {
                        if i < a.len() {
                            a.remove(i);
                        }
                    }
                }
                _ => {}
            }
        }
        3 => {
            // Duplicate an array element (duplicate merge keys, ports, names).
            if let Some(Value::Array(a)) = v.pointer_mut(&p) {
                if let Some(first) = a.first().cloned() {
                    a.push(first);
                }
            }
        }
        4 => {
            if let Some(Value::Object(m)) = v.pointer_mut(&p) {
                m.insert(
                    ["spec", "status", "metadata", "data", "x"][rng.random_range(0..5)].into(),
                    random_value(rng, 2),
                );
            }
        }
        _ => {
            // Deep nesting under one node.
            if let Some(n) = v.pointer_mut(&p) {
                let mut deep = json!(1);
                for _ in 0..rng.random_range(50..140) {
                    deep = json!({"a": [deep]});
                }
                *n = deep;
            }
        }
    }
}

/// A byte-level mutation.
fn mutate_bytes(rng: &mut StdRng, b: &mut Vec<u8>) {
    for _ in 0..rng.random_range(1..6) {
        if b.is_empty() {
            b.push(rng.random());
            continue;
        }
        let i = rng.random_range(0..b.len());
        match rng.random_range(0..6) {
            0 => b[i] ^= 1 << rng.random_range(0..8),
            1 => b[i] = [0, 0xff, 0x7f, 0x80, b'{', b'"', b'\\', b':'][rng.random_range(0..8)],
            2 => {
                let end = (i + rng.random_range(1..16)).min(b.len());
                b.drain(i..end);
            }
            3 => {
                let end = (i + rng.random_range(1..32)).min(b.len());
                let chunk = b[i..end].to_vec();
                let at = rng.random_range(0..=b.len());
                b.splice(at..at, chunk);
            }
            4 => b.truncate(i),
            _ => {
                let n = rng.random::<u8>();
                b.insert(i, n);
            }
        }
    }
}

struct Harness {
    rest: Rest,
    registry: Registry,
    _dir: tempfile::TempDir,
    failures: Vec<String>,
    runs: usize,
}

impl Harness {
    async fn new() -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = EmbeddedStore::open(EmbeddedConfig::new(dir.path().join("s")))
            .await
            .unwrap();
        let rest = Rest::new(store);
        let registry = Registry::builtin();
        // The namespace objects live in.
        let ns = registry.find("", "v1", "namespaces").unwrap();
        let body =
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}})
                .to_string();
        let _ = rest
            .create(
                &ns,
                None,
                &request(&BTreeMap::new(), Some("application/json"), body.as_bytes()),
            )
            .await;
        Harness {
            rest,
            registry,
            _dir: dir,
            failures: Vec::new(),
            runs: 0,
        }
    }

    /// Runs one verb on one input; records a panic or a 500.
    async fn one(
        &mut self,
        verb: &str,
        res: &Resource,
        name: &str,
        content_type: &str,
        body: &[u8],
    ) {
        self.runs += 1;
        let query: BTreeMap<String, String> = [("dryRun".to_owned(), "All".to_owned())].into();
        let req = request(&query, Some(content_type), body);
        let ns = res.namespaced.then_some("default");
        let fut = async {
            match verb {
                "create" => self.rest.create(res, ns, &req).await,
                "update" => self.rest.update(res, ns, name, None, &req).await,
                _ => self.rest.patch(res, ns, name, None, &req).await,
            }
        };
        let outcome = AssertUnwindSafe(fut).catch_unwind().await;
        let problem = match outcome {
            Err(p) => Some(format!(
                "panic: {}",
                p.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default()
            )),
            Ok(Err(e)) if e.code >= 500 => Some(format!("{} {}", e.code, e.to_status())),
            _ => None,
        };
        if let Some(problem) = problem {
            let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fuzz-failures");
            std::fs::create_dir_all(&dir).unwrap();
            let file = dir.join(format!("{}-{}-{}", verb, res.plural, self.failures.len()));
            std::fs::write(&file, body).unwrap();
            let shown = String::from_utf8_lossy(&body[..body.len().min(400)]).into_owned();
            self.failures.push(format!(
                "{verb} {} ({content_type}): {problem}\n  input ({}): {shown}",
                res.plural,
                file.display()
            ));
        }
    }

    fn finish(self, target: &str) {
        eprintln!("fuzz {target}: {} inputs", self.runs);
        assert!(self.runs > 100, "too few inputs ran: {}", self.runs);
        assert!(
            self.failures.is_empty(),
            "{} failing inputs:\n{}",
            self.failures.len(),
            self.failures[..self.failures.len().min(10)].join("\n")
        );
    }
}

fn request<'a>(
    query: &'a BTreeMap<String, String>,
    content_type: Option<&'a str>,
    body: &'a [u8],
) -> Request<'a> {
    Request {
        query,
        accept: Accept::OBJECT,
        content_type,
        body,
    }
}

/// The protobuf bodies kubectl sent (captured fixtures).
fn protobuf_seeds() -> Vec<Vec<u8>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../apimachinery/tests/data/protobuf");
    let mut out = Vec::new();
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "pb") {
            out.push(std::fs::read(p).unwrap());
        }
    }
    assert!(!out.is_empty(), "no protobuf fixtures in {}", dir.display());
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_never_panic_or_fail_internally() {
    let mut h = Harness::new().await;
    let mut rng = rng("bodies");
    let all = resources(&h.registry);
    let pb = protobuf_seeds();
    let deadline = Instant::now() + budget();
    while Instant::now() < deadline {
        let res = all[rng.random_range(0..all.len())].clone();
        let verb = if rng.random_bool(0.7) {
            "create"
        } else {
            "update"
        };
        let mut obj = seed_object(&res, "fuzzed");
        for _ in 0..rng.random_range(0..4) {
            mutate_value(&mut rng, &mut obj);
        }
        let (ct, mut body) = match rng.random_range(0..5) {
            0 | 1 => ("application/json", serde_json::to_vec(&obj).unwrap()),
            2 => (
                "application/yaml",
                serde_yaml::to_string(&obj).unwrap().into_bytes(),
            ),
            3 => (
                "application/vnd.kubernetes.protobuf",
                pb[rng.random_range(0..pb.len())].clone(),
            ),
            _ => ("application/json", serde_json::to_vec(&obj).unwrap()),
        };
        if ct.contains("protobuf") || rng.random_bool(0.3) {
            mutate_bytes(&mut rng, &mut body);
        }
        h.one(verb, &res, "fuzzed", ct, &body).await;
    }
    h.finish("bodies");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patches_never_panic_or_fail_internally() {
    let mut h = Harness::new().await;
    let mut rng = rng("patches");
    // One stored object per resource that accepts its seed.
    let mut targets = Vec::new();
    for res in resources(&h.registry) {
        let obj = seed_object(&res, "target");
        let body = obj.to_string();
        let ns = res.namespaced.then_some("default");
        let empty = BTreeMap::new();
        if h.rest
            .create(
                &res,
                ns,
                &request(&empty, Some("application/json"), body.as_bytes()),
            )
            .await
            .is_ok()
        {
            targets.push((res, obj));
        }
    }
    assert!(
        targets.len() > 5,
        "only {} resources took their seed",
        targets.len()
    );
    let deadline = Instant::now() + budget();
    while Instant::now() < deadline {
        let (res, obj) = &targets[rng.random_range(0..targets.len())];
        let (ct, body) = match rng.random_range(0..3) {
            0 => {
                // A JSON patch over real and made-up paths.
                let mut ptrs = Vec::new();
                pointers(obj, String::new(), &mut ptrs);
                ptrs.extend([
                    "/spec/-".to_owned(),
                    "/x/y".to_owned(),
                    "/metadata/labels/a~1b".to_owned(),
                    "".to_owned(),
                ]);
                let ops: Vec<Value> = (0..rng.random_range(1..4))
                    .map(|_| {
                        let path = ptrs[rng.random_range(0..ptrs.len())].clone();
                        let op = ["add", "remove", "replace", "move", "copy", "test", "bogus"]
                            [rng.random_range(0..7)];
                        let mut o =
                            json!({"op": op, "path": path, "value": random_value(&mut rng, 2)});
                        if op == "move" || op == "copy" {
                            o["from"] = json!(ptrs[rng.random_range(0..ptrs.len())]);
                        }
                        if rng.random_bool(0.1) {
                            mutate_value(&mut rng, &mut o);
                        }
                        o
                    })
                    .collect();
                (
                    "application/json-patch+json",
                    serde_json::to_vec(&ops).unwrap(),
                )
            }
            n => {
                let mut patch = obj.clone();
                for _ in 0..rng.random_range(1..4) {
                    mutate_value(&mut rng, &mut patch);
                }
                let ct = if n == 1 {
                    "application/merge-patch+json"
                } else {
                    "application/strategic-merge-patch+json"
                };
                (ct, serde_json::to_vec(&patch).unwrap())
            }
        };
        let mut body = body;
        if rng.random_bool(0.1) {
            mutate_bytes(&mut rng, &mut body);
        }
        h.one("patch", res, "target", ct, &body).await;
    }
    h.finish("patches");
}
