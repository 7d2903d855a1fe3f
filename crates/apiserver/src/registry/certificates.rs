//! certificates.k8s.io/v1 CertificateSigningRequests, with the `status` and `approval`
//! subresources (`kubectl certificate approve` updates `approval`).

use base64::Engine;
use kumo_apimachinery::validation::{FieldError, Path};
use serde_json::{json, Value};

use super::printing::{arr, col, keep_field, keep_status, path_segment_name, set};
use super::{age_of, name_of, str_at, Column, Resource, Strategy};

pub(super) fn resources() -> Vec<Resource> {
    vec![
        Resource {
            group: "certificates.k8s.io",
            version: "v1",
            kind: "CertificateSigningRequest",
            plural: "certificatesigningrequests",
            singular: "certificatesigningrequest",
            namespaced: false,
            short_names: &["csr"],
            categories: &[],
            subresources: &["approval", "status"],
            strategy: Box::new(CertificateSigningRequests),
        },
        Resource {
            group: "certificates.k8s.io",
            version: "v1",
            kind: "ClusterTrustBundle",
            plural: "clustertrustbundles",
            singular: "clustertrustbundle",
            namespaced: false,
            short_names: &[],
            categories: &[],
            subresources: &[],
            strategy: Box::new(ClusterTrustBundles),
        },
    ]
}

/// Who the requestor is: kube-apiserver records the authenticated user of the create
/// request in `spec.username`, `uid`, `groups` and `extra` (the last three only when set).
fn requesting_user() -> Value {
    let user = crate::auth::current_user();
    let mut spec = serde_json::Map::new();
    spec.insert("username".into(), json!(user.name));
    if !user.uid.is_empty() {
        spec.insert("uid".into(), json!(user.uid));
    }
    if !user.groups.is_empty() {
        spec.insert("groups".into(), json!(user.groups));
    }
    if !user.extra.is_empty() {
        spec.insert("extra".into(), json!(user.extra));
    }
    Value::Object(spec)
}

const USAGES: [&str; 23] = [
    "any",
    "cert sign",
    "client auth",
    "code signing",
    "content commitment",
    "crl sign",
    "data encipherment",
    "decipher only",
    "digital signature",
    "email protection",
    "encipher only",
    "ipsec end system",
    "ipsec tunnel",
    "ipsec user",
    "key agreement",
    "key encipherment",
    "microsoft sgc",
    "netscape sgc",
    "ocsp signing",
    "s/mime",
    "server auth",
    "signing",
    "timestamping",
];

/// The condition types only one of which may be present, and that no update may remove.
const APPROVAL_TYPES: [&str; 2] = ["Approved", "Denied"];
const STICKY_TYPES: [&str; 3] = ["Approved", "Denied", "Failed"];

struct CertificateSigningRequests;

/// The PEM block of `spec.request` (base64 in JSON) must be a CERTIFICATE REQUEST.
fn request_is_csr_pem(obj: &Value) -> bool {
    let Ok(der) = base64::engine::general_purpose::STANDARD.decode(str_at(obj, "/spec/request"))
    else {
        return false;
    };
    let text = String::from_utf8_lossy(&der);
    text.contains("-----BEGIN CERTIFICATE REQUEST-----")
        && text.contains("-----END CERTIFICATE REQUEST-----")
}

fn conditions(obj: &Value) -> Vec<Value> {
    arr(obj, "/status/conditions").to_vec()
}

fn has_type(conds: &[Value], t: &str) -> bool {
    conds.iter().any(|c| str_at(c, "/type") == t)
}

/// Condition timestamps: the update time when absent, the
/// transition time carried over while the status of that type does not change.
fn populate_conditions(new: &mut Value, old: Option<&Value>) {
    let now = crate::time::now_rfc3339();
    let old_conds = old.map(conditions).unwrap_or_default();
    let Some(conds) = new
        .pointer_mut("/status/conditions")
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    for c in conds.iter_mut().filter(|c| c.is_object()) {
        if str_at(c, "/lastUpdateTime").is_empty() {
            c["lastUpdateTime"] = json!(now);
        }
        if str_at(c, "/lastTransitionTime").is_empty() {
            let before = old_conds
                .iter()
                .find(|o| str_at(o, "/type") == str_at(c, "/type"));
            c["lastTransitionTime"] = match before {
                Some(o)
                    if str_at(o, "/status") == str_at(c, "/status")
                        && !str_at(o, "/lastTransitionTime").is_empty() =>
                {
                    json!(str_at(o, "/lastTransitionTime"))
                }
                _ => json!(now),
            };
        }
    }
}

/// Conditions of `types` a subresource may not change: each one present in `new` is the
/// stored instance again (one missing stays missing, which validation refuses).
fn keep_conditions(new: &mut Value, old: &Value, types: &[&str]) {
    let old_conds = conditions(old);
    let Some(conds) = new
        .pointer_mut("/status/conditions")
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    for c in conds.iter_mut() {
        let t = str_at(c, "/type").to_owned();
        if !types.contains(&t.as_str()) {
            continue;
        }
        if let Some(o) = old_conds.iter().find(|o| str_at(o, "/type") == t) {
            *c = o.clone();
        }
    }
}

fn validate_conditions(obj: &Value, errs: &mut Vec<FieldError>) {
    let path = Path::new("status").child("conditions");
    let conds = conditions(obj);
    let mut seen = Vec::new();
    for (i, c) in conds.iter().enumerate() {
        let t = str_at(c, "/type");
        let cp = path.index(i);
        if t.is_empty() {
            errs.push(FieldError::required(&cp.child("type"), ""));
        }
        let status = str_at(c, "/status");
        if status.is_empty() {
            errs.push(FieldError::required(&cp.child("status"), ""));
        }
        if STICKY_TYPES.contains(&t) {
            if seen.contains(&t) {
                errs.push(FieldError::duplicate(&cp.child("type"), t));
            }
            seen.push(t);
            if !status.is_empty() && status != "True" {
                errs.push(FieldError::not_supported(
                    &cp.child("status"),
                    status,
                    &["True"],
                ));
            }
        }
    }
    if APPROVAL_TYPES.iter().all(|t| has_type(&conds, t)) {
        let quoted: Vec<String> = APPROVAL_TYPES
            .iter()
            .map(|t| format!("conditions[{{\"type\": \"{t}\"}}]"))
            .collect();
        errs.push(FieldError::invalid(
            &path,
            format!("{{{}}}", quoted.join(", ")),
            format!(
                "must specify at most one of: {}",
                quoted
                    .iter()
                    .map(|q| format!("`{q}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
}

impl Strategy for CertificateSigningRequests {
    // Upstream does not care what certificate requests are called (kubelets name theirs
    // `node-csr-<base64url digest>`): only what a path segment cannot hold is refused.
    fn validate_name(&self, name: &str) -> Vec<String> {
        path_segment_name(name)
    }

    fn prepare_create(&self, obj: &mut Value) {
        set(obj, "status", json!({}));
        if !obj.get("spec").is_some_and(Value::is_object) {
            set(obj, "spec", json!({}));
        }
        let spec = &mut obj["spec"];
        for k in ["username", "uid", "groups", "extra"] {
            if let Some(o) = spec.as_object_mut() {
                o.remove(k);
            }
        }
        if let (Some(s), Value::Object(user)) = (spec.as_object_mut(), requesting_user()) {
            s.extend(user);
        }
    }

    fn prepare_update(&self, new: &mut Value, old: &Value) {
        // The spec never changes; status and approval change through their subresources.
        keep_field(new, old, "spec");
        keep_status(new, old);
    }

    fn prepare_status_update(&self, new: &mut Value, old: &Value) {
        keep_conditions(new, old, &APPROVAL_TYPES);
        populate_conditions(new, Some(old));
    }

    fn prepare_subresource_update(&self, sub: &str, new: &mut Value, old: &Value) {
        if sub != "approval" {
            return self.prepare_update(new, old);
        }
        // Approval changes the conditions only (validation keeps the sticky ones).
        keep_field(new, old, "spec");
        let certificate = old.pointer("/status/certificate").cloned();
        if let Some(s) = new.get_mut("status").and_then(Value::as_object_mut) {
            match certificate {
                Some(c) => s.insert("certificate".into(), c),
                None => s.remove("certificate"),
            };
        }
        populate_conditions(new, Some(old));
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let spec = Path::new("spec");
        if !request_is_csr_pem(obj) {
            errs.push(FieldError::invalid(
                &spec.child("request"),
                str_at(obj, "/spec/request"),
                "PEM block type must be CERTIFICATE REQUEST",
            ));
        }
        let usages = arr(obj, "/spec/usages");
        if usages.is_empty() {
            errs.push(FieldError::required(&spec.child("usages"), ""));
        }
        for (i, u) in usages.iter().enumerate() {
            let u = u.as_str().unwrap_or("");
            if !USAGES.contains(&u) {
                errs.push(FieldError::not_supported(
                    &spec.child("usages").index(i),
                    u,
                    &USAGES,
                ));
            }
        }
        let signer = str_at(obj, "/spec/signerName");
        if signer.is_empty() {
            errs.push(FieldError::required(&spec.child("signerName"), ""));
        } else if signer == "kubernetes.io/legacy-unknown" {
            errs.push(FieldError::invalid(
                &spec.child("signerName"),
                signer,
                "the legacy signerName is not allowed via this API version",
            ));
        } else if !signer.contains('/') {
            errs.push(FieldError::invalid(
                &spec.child("signerName"),
                signer,
                "must be a fully qualified domain and path of the form 'example.com/signer-name'",
            ));
        }
        if let Some(secs) = obj
            .pointer("/spec/expirationSeconds")
            .and_then(Value::as_i64)
        {
            if secs < 600 {
                errs.push(FieldError::invalid(
                    &spec.child("expirationSeconds"),
                    secs,
                    "may not specify a duration less than 600 seconds (10 minutes)",
                ));
            }
        }
        validate_conditions(obj, &mut errs);
        errs
    }

    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        validate_conditions(new, &mut errs);
        let (old_conds, new_conds) = (conditions(old), conditions(new));
        for t in STICKY_TYPES {
            if has_type(&old_conds, t) && !has_type(&new_conds, t) {
                errs.push(FieldError::forbidden(
                    &Path::new("status").child("conditions"),
                    format!("updates may not remove a condition of type \"{t}\""),
                ));
            }
        }
        errs
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            Column::NAME,
            Column::AGE,
            col(
                "SignerName",
                "string",
                "The signer asked to sign the request.",
            ),
            col("Requestor", "string", "The user who created the request."),
            col(
                "RequestedDuration",
                "string",
                "The requested validity of the certificate.",
            ),
            col(
                "Condition",
                "string",
                "Conditions applied to the request, such as approval or denial.",
            ),
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let conds = conditions(obj);
        let mut condition = if has_type(&conds, "Denied") {
            "Denied"
        } else if has_type(&conds, "Approved") {
            "Approved"
        } else {
            "Pending"
        }
        .to_owned();
        if has_type(&conds, "Failed") {
            condition.push_str(",Failed");
        }
        if !str_at(obj, "/status/certificate").is_empty() {
            condition.push_str(",Issued");
        }
        let duration = match obj
            .pointer("/spec/expirationSeconds")
            .and_then(Value::as_i64)
        {
            Some(s) => crate::time::human_duration(s),
            None => "<none>".to_owned(),
        };
        vec![
            json!(name_of(obj)),
            json!(age_of(obj)),
            json!(str_at(obj, "/spec/signerName")),
            json!(str_at(obj, "/spec/username")),
            json!(duration),
            json!(condition),
        ]
    }

    fn selectable_fields(&self, obj: &Value) -> Vec<(&'static str, String)> {
        vec![(
            "spec.signerName",
            str_at(obj, "/spec/signerName").to_owned(),
        )]
    }
}

/// ClusterTrustBundles: PEM trust anchors, named after their signer.
struct ClusterTrustBundles;

impl Strategy for ClusterTrustBundles {
    fn validate_name(&self, name: &str) -> Vec<String> {
        path_segment_name(name)
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let name = name_of(obj);
        let name_path = Path::new("metadata").child("name");
        match str_at(obj, "/spec/signerName") {
            "" if name.contains(':') => errs.push(FieldError::invalid(
                &name_path,
                name,
                "ClusterTrustBundle without signer name must not have \":\" in its name",
            )),
            "" => {}
            signer => {
                let prefix = format!("{}:", signer.replace('/', ":"));
                if !name.starts_with(&prefix) {
                    errs.push(FieldError::invalid(
                        &name_path,
                        name,
                        format!("ClusterTrustBundle for signerName {signer} must be named with prefix {prefix}"),
                    ));
                }
            }
        }
        let bundle = str_at(obj, "/spec/trustBundle");
        if !(bundle.contains("-----BEGIN CERTIFICATE-----")
            && bundle.contains("-----END CERTIFICATE-----"))
        {
            errs.push(FieldError::invalid(
                &Path::new("spec").child("trustBundle"),
                "<value omitted>",
                "at least one trust anchor must be provided",
            ));
        }
        errs
    }

    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errs = self.validate(new);
        if new.pointer("/spec/signerName") != old.pointer("/spec/signerName") {
            errs.push(FieldError::invalid(
                &Path::new("spec").child("signerName"),
                str_at(new, "/spec/signerName"),
                "field is immutable",
            ));
        }
        errs
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            Column::NAME,
            col(
                "SignerName",
                "string",
                "The signer whose trust anchors the bundle holds.",
            ),
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let signer = match str_at(obj, "/spec/signerName") {
            "" => "<none>",
            s => s,
        };
        vec![json!(name_of(obj)), json!(signer)]
    }

    fn selectable_fields(&self, obj: &Value) -> Vec<(&'static str, String)> {
        vec![(
            "spec.signerName",
            str_at(obj, "/spec/signerName").to_owned(),
        )]
    }
}
