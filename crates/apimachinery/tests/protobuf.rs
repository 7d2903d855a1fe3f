//! Kubernetes protobuf: the bodies the stock kubectl sends (captured by
//! `scripts/capture-kubectl-protobuf` into tests/data/protobuf), the special JSON forms,
//! round trips, errors, and a randomized no-panic run.

use std::path::{Path, PathBuf};

use kumo_apimachinery::protobuf::{decode, decode_with_defaults, encode, ProtobufError, MAGIC};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/protobuf")
}

/// Drops `"creationTimestamp": null` everywhere: kubectl 1.32 prints it (its apimachinery
/// predates `omitzero` on ObjectMeta.creationTimestamp); v0.37.2's encoding/json leaves the
/// zero time out.
fn normalise_kubectl(v: &mut Value) {
    match v {
        Value::Object(map) => {
            if map.get("creationTimestamp") == Some(&Value::Null) {
                map.remove("creationTimestamp");
            }
            map.values_mut().for_each(normalise_kubectl);
        }
        Value::Array(items) => items.iter_mut().for_each(normalise_kubectl),
        _ => {}
    }
}

struct Fixture {
    name: String,
    body: Vec<u8>,
    expected: Value,
}

fn fixtures() -> Vec<Fixture> {
    let dir = data_dir();
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("fixture directory")
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.strip_suffix(".pb").map(str::to_string)
        })
        .collect();
    names.sort();
    assert!(names.len() >= 7, "fixtures missing in {}", dir.display());
    names
        .into_iter()
        .map(|name| {
            let body = std::fs::read(dir.join(format!("{name}.pb"))).expect("body");
            let hand = dir.join(format!("{name}.json"));
            let expected = if hand.exists() {
                serde_json::from_slice(&std::fs::read(hand).expect("json")).expect("json")
            } else {
                let path = dir.join(format!("{name}.kubectl.json"));
                let mut v: Value =
                    serde_json::from_slice(&std::fs::read(path).expect("kubectl json"))
                        .expect("kubectl json");
                normalise_kubectl(&mut v);
                v
            };
            Fixture {
                name,
                body,
                expected,
            }
        })
        .collect()
}

#[test]
fn kubectl_bodies_decode_to_kubectl_json() {
    for f in fixtures() {
        assert!(f.body.starts_with(&MAGIC), "{}", f.name);
        let got = decode(&f.body).unwrap_or_else(|e| panic!("{}: {e}", f.name));
        assert_eq!(
            got,
            f.expected,
            "{}:\n got {}\nwant {}",
            f.name,
            serde_json::to_string_pretty(&got).unwrap_or_default(),
            serde_json::to_string_pretty(&f.expected).unwrap_or_default()
        );
    }
}

/// gogo-protobuf's output is deterministic, and `encode` writes what it writes: encoding the
/// JSON gives back kubectl's bytes exactly.
#[test]
fn kubectl_json_encodes_to_kubectl_bytes() {
    for f in fixtures() {
        let bytes = encode(&f.expected).unwrap_or_else(|e| panic!("{}: {e}", f.name));
        assert_eq!(bytes, f.body, "{}", f.name);
        assert_eq!(decode(&bytes).as_ref(), Ok(&f.expected), "{}", f.name);
    }
}

fn round_trip(obj: Value) -> Value {
    let bytes = encode(&obj).unwrap_or_else(|e| panic!("encode {obj}: {e}"));
    let back = decode(&bytes).unwrap_or_else(|e| panic!("decode {obj}: {e}"));
    // And the bytes are stable.
    assert_eq!(encode(&back).as_ref(), Ok(&bytes));
    back
}

#[test]
fn pod_special_types_round_trip() {
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "namespace": "default",
            "uid": "0d4691ed-659b-4935-a832-355f77ee47cc",
            "resourceVersion": "42",
            "generation": 3,
            "creationTimestamp": "2024-05-06T07:08:09Z",
            "deletionTimestamp": "2024-05-06T07:09:09Z",
            "deletionGracePeriodSeconds": 30,
            "labels": {"app": "web", "tier": "front"},
            "annotations": {"a": ""},
            "finalizers": ["x/y"],
            "ownerReferences": [{
                "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs",
                "uid": "u", "controller": true, "blockOwnerDeletion": true
            }],
            "managedFields": [{
                "manager": "kubectl", "operation": "Update", "apiVersion": "v1",
                "time": "2024-05-06T07:08:09Z", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:app": {}}}}
            }]
        },
        "spec": {
            "containers": [{
                "name": "c",
                "image": "nginx",
                "args": ["-v", ""],
                "ports": [{"containerPort": 80, "protocol": "TCP", "name": "http"}],
                "resources": {
                    "limits": {"cpu": "500m", "memory": "1Gi"},
                    "requests": {"cpu": "250m"}
                },
                "livenessProbe": {
                    "httpGet": {"path": "/", "port": "http", "scheme": "HTTP"},
                    "periodSeconds": 10
                },
                "readinessProbe": {"tcpSocket": {"port": 8080}},
                "env": [{"name": "A", "value": "1"}, {"name": "EMPTY"}],
                "securityContext": {"runAsUser": 0, "privileged": false}
            }],
            "volumes": [
                {"name": "data", "emptyDir": {"sizeLimit": "1Gi"}},
                {"name": "cfg", "configMap": {"name": "c", "defaultMode": 420}}
            ],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "nodeSelector": {"disk": "ssd"},
            "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 5}],
            "overhead": {"cpu": "0"}
        },
        "status": {
            "phase": "Running",
            "podIP": "10.0.0.5",
            "startTime": "2024-05-06T07:08:10Z",
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": null}],
            "containerStatuses": [{
                "name": "c", "ready": true, "restartCount": 0, "image": "nginx",
                "imageID": "", "state": {"running": {"startedAt": "2024-05-06T07:08:11Z"}},
                "lastState": {}
            }]
        }
    });
    let mut want = pod.clone();
    // A zero Time without omitzero is written as null.
    want["status"]["conditions"][0]["lastProbeTime"] = Value::Null;
    assert_eq!(round_trip(pod), want);
}

#[test]
fn times_quantities_intorstring_bytes() {
    // MicroTime keeps microseconds; Time keeps seconds.
    let lease = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "l"},
        "spec": {"holderIdentity": "me", "leaseDurationSeconds": 15,
                 "acquireTime": "2024-01-02T03:04:05.123456Z",
                 "renewTime": "2024-01-02T03:04:05.000000Z"}
    });
    assert_eq!(round_trip(lease.clone()), lease);
    let mut precise = lease.clone();
    precise["spec"]["renewTime"] = json!("2024-01-02T04:04:05.1234567+01:00");
    assert_eq!(
        round_trip(precise)["spec"]["renewTime"],
        json!("2024-01-02T03:04:05.123456Z")
    );
    let mut cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": "c", "creationTimestamp": "2024-01-02T04:04:05.9+01:00"}});
    assert_eq!(
        round_trip(cm.clone())["metadata"]["creationTimestamp"],
        json!("2024-01-02T03:04:05Z")
    );
    // Binary data: base64 both ways, empty values kept.
    cm["binaryData"] = json!({"bin": "AAEC/w==", "empty": ""});
    assert_eq!(round_trip(cm.clone())["binaryData"], cm["binaryData"]);
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
                        "type": "Opaque", "data": {"k": "c2VjcmV0"}, "immutable": false});
    assert_eq!(round_trip(secret.clone()), secret);

    // IntOrString both ways, in a Deployment strategy and a Service.
    let dep = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "d"},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"a": "b"}},
            "template": {"metadata": {"labels": {"a": "b"}},
                         "spec": {"containers": [{"name": "c", "image": "i", "resources": {}}]}},
            "strategy": {"type": "RollingUpdate",
                         "rollingUpdate": {"maxUnavailable": 0, "maxSurge": "25%"}}
        },
        "status": {}
    });
    assert_eq!(round_trip(dep.clone()), dep);
    let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
        "spec": {"ports": [{"port": 80, "targetPort": "http", "protocol": "TCP"},
                           {"port": 81, "targetPort": 8081, "protocol": "TCP", "nodePort": 30081}],
                 "type": "NodePort", "clusterIPs": ["10.96.0.10"], "clusterIP": "10.96.0.10",
                 "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
                 "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 10800}}},
        "status": {"loadBalancer": {}}});
    assert_eq!(round_trip(svc.clone()), svc);

    // Quantities pass through as strings; numbers in JSON become strings.
    let quota = json!({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "q"},
                       "spec": {"hard": {"cpu": 2, "memory": "1.5Gi"}}});
    assert_eq!(
        round_trip(quota)["spec"]["hard"],
        json!({"cpu": "2", "memory": "1.5Gi"})
    );
}

#[test]
fn embedded_json_and_slice_types() {
    // RawExtension: ControllerRevision.data.
    let rev = json!({"apiVersion": "apps/v1", "kind": "ControllerRevision",
        "metadata": {"name": "r"}, "revision": 2,
        "data": {"spec": {"template": {"x": [1, "2", null, true, {"y": 1.5}]}}}});
    assert_eq!(round_trip(rev.clone()), rev);

    // Go slice types as map values (ExtraValue) and extra fields of authentication.
    let review = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
        "metadata": {},
        "spec": {"token": "t", "audiences": ["a"]},
        "status": {"authenticated": true,
                   "user": {"username": "u", "uid": "1", "groups": ["g"],
                            "extra": {"scopes": ["a", "b"], "none": []}}}});
    assert_eq!(round_trip(review.clone()), review);

    // Certificates: []byte fields.
    let csr = json!({"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
        "metadata": {"name": "csr"},
        "spec": {"request": "LS0tLS1CRUdJTg==", "signerName": "kubernetes.io/kube-apiserver-client",
                 "usages": ["client auth"], "expirationSeconds": 3600},
        "status": {"certificate": "Y2VydA==",
                   "conditions": [{"type": "Approved", "status": "True", "reason": "r",
                                   "message": "m", "lastUpdateTime": "2024-01-01T00:00:00Z",
                                   "lastTransitionTime": "2024-01-01T00:00:00Z"}]}});
    assert_eq!(round_trip(csr.clone()), csr);

    // Events: MicroTime and an embedded ObjectReference.
    let event = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "e", "namespace": "default"},
        "eventTime": "2024-01-01T00:00:00.000001Z", "reportingController": "c",
        "reportingInstance": "i", "action": "A", "reason": "R", "type": "Normal",
        "regarding": {"kind": "Pod", "name": "p", "namespace": "default"},
        "deprecatedFirstTimestamp": "2024-01-01T00:00:00Z", "deprecatedCount": 2});
    let mut want = event.clone();
    // Non-pointer structs without omitzero are always written: a zero Time as null.
    want["deprecatedLastTimestamp"] = Value::Null;
    want["deprecatedSource"] = json!({});
    assert_eq!(round_trip(event), want);
}

#[test]
fn custom_resource_definition_round_trips() {
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget",
                      "listKind": "WidgetList", "shortNames": ["wd"]},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "description": "A widget.",
                    "properties": {
                        "spec": {
                            "type": "object",
                            "required": ["size"],
                            "properties": {
                                "size": {"type": "integer", "minimum": 1, "maximum": 10.5,
                                         "default": 3, "format": "int32"},
                                "mode": {"type": "string", "enum": ["a", "b"],
                                         "x-kubernetes-validations": [{"rule": "self != 'c'", "message": "no c"}]},
                                "port": {"x-kubernetes-int-or-string": true,
                                         "anyOf": [{"type": "integer"}, {"type": "string"}]},
                                "items": {"type": "array",
                                          "items": {"type": "string"},
                                          "x-kubernetes-list-type": "set"},
                                "tuple": {"type": "array",
                                          "items": [{"type": "string"}, {"type": "integer"}]},
                                "free": {"type": "object",
                                         "x-kubernetes-preserve-unknown-fields": true},
                                "labels": {"type": "object",
                                           "additionalProperties": {"type": "string"}},
                                "closed": {"type": "object", "additionalProperties": false},
                                "deps": {"type": "object",
                                         "dependencies": {"a": ["b", "c"], "d": {"required": ["e"]}}},
                                "ref": {"$ref": "#/definitions/x", "$schema": "http://json-schema.org/schema#"},
                                "example": {"type": "object", "example": {"k": [1, 2]},
                                            "nullable": true}
                            }
                        },
                        "status": {"type": "object", "not": {"required": ["x"]}}
                    }
                }},
                "subresources": {"status": {},
                                 "scale": {"specReplicasPath": ".spec.replicas",
                                           "statusReplicasPath": ".status.replicas"}},
                "additionalPrinterColumns": [{"name": "Size", "type": "integer",
                                              "jsonPath": ".spec.size", "priority": 0}]
            }],
            "conversion": {"strategy": "None"}
        },
        "status": {
            "conditions": [{"type": "Established", "status": "True",
                            "lastTransitionTime": "2024-01-01T00:00:00Z"}],
            "acceptedNames": {"plural": "widgets", "kind": "Widget"},
            "storedVersions": ["v1"]
        }
    });
    let mut want = crd.clone();
    // encoding/json omits a zero int32 with omitempty (priority) and writes the status
    // subresource as an empty object.
    want["spec"]["versions"][0]["additionalPrinterColumns"][0]
        .as_object_mut()
        .map(|c| c.remove("priority"));
    assert_eq!(round_trip(crd), want);
}

#[test]
fn meta_kinds_status_list_and_watch_event() {
    for gv in ["v1", "apps/v1", "meta.k8s.io/v1"] {
        let opts = json!({"apiVersion": gv, "kind": "DeleteOptions",
                          "propagationPolicy": "Background", "gracePeriodSeconds": 0,
                          "preconditions": {"uid": "u"}, "dryRun": ["All"]});
        assert_eq!(round_trip(opts.clone()), opts);
    }
    let status = json!({"apiVersion": "v1", "kind": "Status", "metadata": {},
        "status": "Failure", "message": "pods \"x\" not found", "reason": "NotFound",
        "details": {"name": "x", "kind": "pods",
                    "causes": [{"reason": "FieldValueRequired", "message": "Required value",
                                "field": "spec.containers[0].image"}]},
        "code": 404});
    assert_eq!(round_trip(status.clone()), status);

    // Discovery: Verbs is a Go slice type, written when non-nil; `[]` and null survive.
    let resources = json!({"apiVersion": "v1", "kind": "APIResourceList", "groupVersion": "v1",
    "resources": [
        {"name": "pods", "singularName": "pod", "namespaced": true, "kind": "Pod",
         "verbs": ["get", "list"], "shortNames": ["po"], "categories": ["all"]},
        {"name": "bindings", "singularName": "", "namespaced": true, "kind": "Binding",
         "verbs": []},
        {"name": "x", "singularName": "", "namespaced": false, "kind": "X", "verbs": null}
    ]});
    assert_eq!(round_trip(resources.clone()), resources);

    // A v1 List: items are RawExtensions holding JSON.
    let list = json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "9"},
        "items": [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}}]});
    assert_eq!(round_trip(list.clone()), list);
    // ... or Kubernetes protobuf, as a Go client writes a List of typed objects.
    let item = encode(&list["items"][0]).expect("encode item");
    let mut raw_ext = Vec::new();
    push_bytes(&mut raw_ext, 1, &item);
    let mut list_raw = Vec::new();
    push_bytes(&mut list_raw, 2, &raw_ext);
    assert_eq!(
        decode(&envelope("v1", "List", &list_raw)),
        Ok(json!({"apiVersion": "v1", "kind": "List", "metadata": {},
                  "items": [list["items"][0].clone()]}))
    );

    // A watch event whose object is itself Kubernetes protobuf, as in a protobuf watch.
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"},
                    "data": {"k": "v"}});
    let inner = encode(&cm).expect("encode configmap");
    let mut ev = Vec::new();
    ev.extend_from_slice(b"\x0a\x05ADDED");
    ev.push(0x12);
    let mut raw = vec![0x0a];
    push_varint(&mut raw, inner.len() as u64);
    raw.extend_from_slice(&inner);
    push_varint(&mut ev, raw.len() as u64);
    ev.extend_from_slice(&raw);
    let body = envelope("v1", "WatchEvent", &ev);
    assert_eq!(
        decode(&body),
        Ok(json!({"apiVersion": "v1", "kind": "WatchEvent", "type": "ADDED", "object": cm}))
    );

    // The frame of a protobuf watch stream: a length, then the raw WatchEvent (upstream's
    // stream serializer writes no magic and no envelope around it), which is exactly `ev`.
    let frame =
        kumo_apimachinery::protobuf::encode_watch_frame(&json!({"type": "ADDED", "object": cm}))
            .expect("encode frame");
    assert_eq!(frame[..4], (ev.len() as u32).to_be_bytes());
    assert_eq!(frame[4..], ev[..]);
}

fn push_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn push_bytes(out: &mut Vec<u8>, field: u8, payload: &[u8]) {
    out.push(field << 3 | 2);
    push_varint(out, payload.len() as u64);
    out.extend_from_slice(payload);
}

/// A body with the given envelope and raw message.
fn envelope(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
    let mut tm = Vec::new();
    push_bytes(&mut tm, 1, api_version.as_bytes());
    push_bytes(&mut tm, 2, kind.as_bytes());
    let mut out = MAGIC.to_vec();
    push_bytes(&mut out, 1, &tm);
    push_bytes(&mut out, 2, raw);
    out
}

#[test]
fn decodes_exactly_what_go_would() {
    // A Namespace with every non-pointer ObjectMeta field written as its zero value, the
    // way gogo-protobuf writes it: none of them appear in the JSON.
    let body = std::fs::read(data_dir().join("namespace.pb")).expect("namespace fixture");
    assert_eq!(
        decode(&body),
        Ok(json!({"apiVersion": "v1", "kind": "Namespace",
                  "metadata": {"name": "x"}, "spec": {}, "status": {}}))
    );
    // An empty raw message: structs without omitempty still appear; Pod's spec.containers
    // (no omitempty) is null.
    assert_eq!(
        decode(&envelope("v1", "Pod", &[])),
        Ok(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {},
                  "spec": {"containers": null}, "status": {}}))
    );
    // Pointers: present exactly when on the wire, even when zero (replicas: 0).
    let spec = [0x08, 0x00]; // replicas = 0
    let mut dep = Vec::new();
    push_bytes(&mut dep, 2, &spec);
    let got = decode(&envelope("apps/v1", "Deployment", &dep)).expect("decode");
    assert_eq!(got["spec"]["replicas"], json!(0));
    assert_eq!(
        got["spec"]["selector"],
        Value::Null,
        "selector has no omitempty"
    );
    // Unknown fields are skipped; a repeated singular message field merges.
    let mut meta = Vec::new();
    push_bytes(&mut meta, 1, b"a");
    meta.extend_from_slice(&[0xf8, 0x0f, 0x01]); // field 255, varint
    let mut cm = Vec::new();
    push_bytes(&mut cm, 1, &meta);
    let mut meta2 = Vec::new();
    push_bytes(&mut meta2, 3, b"ns");
    push_bytes(&mut cm, 1, &meta2);
    assert_eq!(
        decode(&envelope("v1", "ConfigMap", &cm)),
        Ok(json!({"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": "a", "namespace": "ns"}}))
    );
    // Defaults for an envelope without apiVersion and kind.
    let body = envelope("", "", &cm);
    assert!(matches!(
        decode(&body),
        Err(ProtobufError::MissingKind { .. })
    ));
    assert_eq!(
        decode_with_defaults(&body, "v1", "ConfigMap")
            .expect("decode")
            .get("kind"),
        Some(&json!("ConfigMap"))
    );
}

#[test]
fn errors() {
    let good = std::fs::read(data_dir().join("configmap.pb")).expect("configmap fixture");
    assert_eq!(decode(b""), Err(ProtobufError::BadMagic));
    assert_eq!(decode(b"{\"kind\":\"Pod\"}"), Err(ProtobufError::BadMagic));
    assert!(matches!(
        decode(&MAGIC),
        Err(ProtobufError::MissingKind { .. })
    ));
    // Cutting the body inside the raw object is an error (cutting between the envelope's
    // fields is not: the fields after the cut are simply absent).
    let raw_start = 4 + 2 + usize::from(good[5]);
    assert_eq!(good[raw_start], 0x12, "raw follows typeMeta");
    for n in raw_start + 1..good.len() - 4 {
        assert!(decode(&good[..n]).is_err(), "prefix of {n} bytes decoded");
    }
    // Unknown kinds name the apiVersion and kind.
    let err = decode(&envelope("example.com/v1", "Widget", &[])).expect_err("unknown");
    assert_eq!(
        err,
        ProtobufError::UnknownKind {
            api_version: "example.com/v1".into(),
            kind: "Widget".into()
        }
    );
    let text = err.to_string();
    assert!(
        text.contains("example.com/v1") && text.contains("Widget"),
        "{text}"
    );
    assert!(decode(&envelope("v1", "PodSpec", &[])).is_err());
    assert!(encode(&json!({"apiVersion": "example.com/v1", "kind": "Widget"})).is_err());

    // Invalid UTF-8 in a string field.
    let mut meta = Vec::new();
    push_bytes(&mut meta, 1, b"\xff\xfe");
    let mut cm = Vec::new();
    push_bytes(&mut cm, 1, &meta);
    assert_eq!(
        decode(&envelope("v1", "ConfigMap", &cm)),
        Err(ProtobufError::InvalidUtf8 {
            message: "k8s.io.apimachinery.pkg.apis.meta.v1.ObjectMeta",
            field: "name"
        })
    );
    // A wire type that does not match the field.
    let mut cm = vec![0x08, 0x01]; // metadata as a varint
    assert!(matches!(
        decode(&envelope("v1", "ConfigMap", &cm)),
        Err(ProtobufError::WireTypeMismatch {
            field: "metadata",
            found: 0,
            expected: 2,
            ..
        })
    ));
    cm.clear();
    cm.extend_from_slice(&[0x2a, 0x01]); // truncated length-delimited
    assert!(matches!(
        decode(&envelope("v1", "ConfigMap", &cm)),
        Err(ProtobufError::TruncatedLength { .. })
    ));
    // An impossible IntOrString type.
    let port = [0x08, 0x07];
    let mut sp = Vec::new();
    push_bytes(&mut sp, 4, &port); // ServicePort.targetPort
    let mut spec = Vec::new();
    push_bytes(&mut spec, 1, &sp);
    let mut svc = Vec::new();
    push_bytes(&mut svc, 2, &spec);
    assert!(matches!(
        decode(&envelope("v1", "Service", &svc)),
        Err(ProtobufError::InvalidValue { .. })
    ));
    // Encoding type errors name the path.
    let err = encode(&json!({"apiVersion": "v1", "kind": "Pod",
                             "spec": {"containers": [{"name": 5}]}}))
    .expect_err("bad type");
    assert!(err.to_string().contains("spec.containers[0].name"), "{err}");
}

#[test]
fn nesting_deeper_than_100_is_rejected() {
    // JSONSchemaProps.not nests without bound: build a CRD whose schema nests `depth` times.
    let crd = |depth: usize| {
        let mut schema = json!({"type": "object"});
        for _ in 0..depth {
            schema = json!({"not": schema});
        }
        json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
               "metadata": {"name": "a.b"},
               "spec": {"versions": [{"name": "v1", "schema": {"openAPIV3Schema": schema}}]}})
    };
    // CRD → spec → versions → schema → openAPIV3Schema is 5 levels.
    assert!(round_trip(crd(90)).is_object());
    assert_eq!(encode(&crd(120)), Err(ProtobufError::TooDeep));

    // Hand-built 200-deep nesting of JSONSchemaProps.not on the wire.
    let mut msg: Vec<u8> = Vec::new();
    for _ in 0..200 {
        let mut outer = vec![0xe2, 0x01]; // key: field 28, wire type 2
        push_varint(&mut outer, msg.len() as u64);
        outer.extend_from_slice(&msg);
        msg = outer;
    }
    let mut validation = Vec::new();
    push_bytes(&mut validation, 1, &msg); // CustomResourceValidation.openAPIV3Schema
    let mut version = Vec::new();
    push_bytes(&mut version, 4, &validation); // CustomResourceDefinitionVersion.schema
    let mut spec = Vec::new();
    push_bytes(&mut spec, 7, &version); // CustomResourceDefinitionSpec.versions
    let mut crd_raw = Vec::new();
    push_bytes(&mut crd_raw, 2, &spec);
    assert_eq!(
        decode(&envelope(
            "apiextensions.k8s.io/v1",
            "CustomResourceDefinition",
            &crd_raw
        )),
        Err(ProtobufError::TooDeep)
    );
}

fn without_null_members(v: &Value) -> Value {
    match v {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), without_null_members(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(without_null_members).collect()),
        other => other.clone(),
    }
}

fn random_message(rng: &mut StdRng, depth: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..rng.random_range(0..6) {
        let field: u64 = rng.random_range(1..16);
        match rng.random_range(0..8) {
            0 | 1 => {
                push_varint(&mut out, field << 3);
                let v: u64 = if rng.random() {
                    rng.random_range(0..3)
                } else {
                    rng.random()
                };
                push_varint(&mut out, v);
            }
            2 => {
                push_varint(&mut out, field << 3 | 1);
                out.extend_from_slice(&rng.random::<u64>().to_le_bytes());
            }
            3 => {
                push_varint(&mut out, field << 3 | 5);
                out.extend_from_slice(&rng.random::<u32>().to_le_bytes());
            }
            4 => {
                let text: &[u8] = [&b"{}"[..], b"[1]", b"null", b"abc", b"1Gi", b"", b"\xff"]
                    [rng.random_range(0..7)];
                push_varint(&mut out, field << 3 | 2);
                push_varint(&mut out, text.len() as u64);
                out.extend_from_slice(text);
            }
            _ => {
                let inner = if depth < 8 {
                    random_message(rng, depth + 1)
                } else {
                    Vec::new()
                };
                push_varint(&mut out, field << 3 | 2);
                push_varint(&mut out, inner.len() as u64);
                out.extend_from_slice(&inner);
            }
        }
    }
    out
}

/// 100 000 mutated, truncated and random inputs: errors are fine, panics are not.
#[test]
fn random_inputs_never_panic() {
    let seeds: Vec<Vec<u8>> = fixtures().into_iter().map(|f| f.body).collect();
    let mut rng = StdRng::seed_from_u64(0x6b38_7300);
    let start = std::time::Instant::now();
    let mut ok = 0usize;
    for i in 0..100_000u32 {
        let mut body = seeds[rng.random_range(0..seeds.len())].clone();
        match i % 5 {
            // Flip a few bytes after the magic.
            0 | 1 => {
                for _ in 0..rng.random_range(1..4) {
                    let at = rng.random_range(4..body.len());
                    body[at] = rng.random();
                }
            }
            // Truncate.
            2 => body.truncate(rng.random_range(0..body.len())),
            // Splice in random bytes.
            3 => {
                let at = rng.random_range(4..body.len());
                let n = rng.random_range(1..16);
                let junk: Vec<u8> = (0..n).map(|_| rng.random()).collect();
                body.splice(at..at, junk);
            }
            // A well-formed but random message tree as one of several kinds: exercises wire
            // type mismatches, merging and the special types far more than byte noise.
            4 if i % 10 == 4 => {
                const KINDS: [(&str, &str); 8] = [
                    ("v1", "Pod"),
                    ("v1", "Service"),
                    ("v1", "List"),
                    ("v1", "WatchEvent"),
                    ("apps/v1", "Deployment"),
                    ("batch/v1", "CronJob"),
                    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"),
                    ("coordination.k8s.io/v1", "Lease"),
                ];
                let (gv, kind) = KINDS[rng.random_range(0..KINDS.len())];
                body = envelope(gv, kind, &random_message(&mut rng, 0));
            }
            // Pure noise behind the magic.
            _ => {
                let n = rng.random_range(0..64);
                body.truncate(4);
                body.extend((0..n).map(|_| rng.random::<u8>()));
            }
        }
        if let Ok(v) = decode(&body) {
            ok += 1;
            // Whatever decodes encodes, and decodes back to the same JSON up to null members
            // (a non-nil pointer to a zero Time is `null`, which reads back as nil, in Go
            // too); from there on the round trip is exact.
            let again = encode(&v).unwrap_or_else(|e| panic!("{v}: {e}"));
            let v2 = decode(&again).unwrap_or_else(|e| panic!("{v}: {e}"));
            assert_eq!(
                without_null_members(&v2),
                without_null_members(&v),
                "{body:?}"
            );
            let again2 = encode(&v2).unwrap_or_else(|e| panic!("{v2}: {e}"));
            assert_eq!(again2, again, "{body:?}");
        }
    }
    eprintln!(
        "random inputs: {ok} of 100000 decoded in {:?}",
        start.elapsed()
    );
    assert!(ok > 0);
    assert!(
        start.elapsed() < std::time::Duration::from_secs(10),
        "took {:?}",
        start.elapsed()
    );
}
