//! certificates.k8s.io/v1 PodCertificateRequests, with the `status` subresource: a
//! kubelet's request for a certificate to mount into a pod, which a signer answers
//! through `status` (Issued, Denied or Failed).

use base64::Engine;
use kumo_apimachinery::validation::{
    is_dns1123_label, is_dns1123_subdomain, is_qualified_name, name_is_dns_subdomain, BadValue,
    FieldError, Path,
};
use serde_json::{json, Map, Value};
use x509_parser::prelude::FromDer;

use super::printing::{arr, col, keep_status};
use super::{default_field, name_of, str_at, Column, Resource, Strategy};

pub(super) fn resources() -> Vec<Resource> {
    vec![Resource {
        group: "certificates.k8s.io",
        version: "v1",
        kind: "PodCertificateRequest",
        plural: "podcertificaterequests",
        singular: "podcertificaterequest",
        namespaced: true,
        short_names: &[],
        categories: &[],
        subresources: &["status"],
        strategy: Box::new(PodCertificateRequests),
    }]
}

/// Limits of upstream's certificates API.
const MAX_STUB_PKCS10_REQUEST_SIZE: usize = 10 * 1024;
const MAX_CERTIFICATE_CHAIN_SIZE: usize = 100 * 1024;
const MIN_MAX_EXPIRATION_SECONDS: i64 = 60 * 60;
const MAX_MAX_EXPIRATION_SECONDS: i64 = 91 * 24 * 60 * 60;
const KUBERNETES_MAX_MAX_EXPIRATION_SECONDS: i64 = 24 * 60 * 60;
const DEFAULT_MAX_EXPIRATION_SECONDS: i64 = 86400;
const MAX_UID_LEN: i64 = 128;
const TOTAL_ANNOTATION_SIZE_LIMIT: usize = 256 * 1024;

/// The terminal condition types, at most one of which a request carries.
const TERMINAL_TYPES: [&str; 3] = ["Issued", "Denied", "Failed"];

/// Named curves a stub CSR's elliptic key may use: P-256, P-384, P-521.
const EC_CURVES: [&str; 3] = ["1.2.840.10045.3.1.7", "1.3.132.0.34", "1.3.132.0.35"];
const OID_ED25519: &str = "1.3.101.112";

struct PodCertificateRequests;

fn spec() -> Path {
    Path::new("spec")
}

fn status() -> Path {
    Path::new("status")
}

/// Upstream's IsKubernetesSignerName: the domain is kubernetes.io or below it.
fn is_kubernetes_signer(signer: &str) -> bool {
    let host = signer.split('/').next().unwrap_or("");
    host == "kubernetes.io" || host.ends_with(".kubernetes.io")
}

/// A pod's projected `podCertificate` source, as upstream's validateProjectionSources
/// checks it: the signer name, the key type, the lifetime bounds (24 h at most for the
/// kubernetes.io signers, 91 days for others), and at least one path.
pub(super) fn validate_projection(source: &Value, path: &Path, errs: &mut Vec<FieldError>) {
    validate_signer_name(
        &path.child("signerName"),
        str_at(source, "/signerName"),
        errs,
    );
    let key_type = str_at(source, "/keyType");
    const KEY_TYPES: [&str; 6] = [
        "RSA3072",
        "RSA4096",
        "ECDSAP256",
        "ECDSAP384",
        "ECDSAP521",
        "ED25519",
    ];
    if !KEY_TYPES.contains(&key_type) {
        errs.push(FieldError::not_supported(
            &path.child("keyType"),
            key_type,
            &KEY_TYPES,
        ));
    }
    if let Some(secs) = source.get("maxExpirationSeconds").and_then(Value::as_i64) {
        let p = path.child("maxExpirationSeconds");
        if secs < MIN_MAX_EXPIRATION_SECONDS {
            errs.push(FieldError::invalid(
                &p,
                secs,
                "if provided, maxExpirationSeconds must be >= 3600",
            ));
        }
        let most = if is_kubernetes_signer(str_at(source, "/signerName")) {
            KUBERNETES_MAX_MAX_EXPIRATION_SECONDS
        } else {
            MAX_MAX_EXPIRATION_SECONDS
        };
        if secs > most {
            errs.push(FieldError::invalid(
                &p,
                secs,
                format!("if provided, maxExpirationSeconds must be <= {most}"),
            ));
        }
    }
    let paths = ["credentialBundlePath", "keyPath", "certificateChainPath"];
    if paths
        .iter()
        .all(|k| str_at(source, &format!("/{k}")).is_empty())
    {
        errs.push(FieldError::required(
            path,
            "specify at least one of credentialBundlePath, keyPath, and certificateChainPath",
        ));
    }
}

/// Upstream's ValidateSignerName: `<domain>/<path>`, each made of DNS names.
fn validate_signer_name(path: &Path, signer: &str, errs: &mut Vec<FieldError>) {
    if signer.is_empty() {
        errs.push(FieldError::required(path, ""));
        return;
    }
    let segments: Vec<&str> = signer.split('/').collect();
    let [domain, rest] = segments[..] else {
        errs.push(FieldError::invalid(
            path,
            signer,
            "must be a fully qualified domain and path of the form 'example.com/signer-name'",
        ));
        return;
    };
    if domain.len() > 253 {
        errs.push(FieldError::too_long(path, 253));
    }
    let labels: Vec<&str> = domain.split('.').collect();
    for lbl in &labels {
        let problems = is_dns1123_label(lbl);
        if !problems.is_empty() {
            for p in problems {
                errs.push(FieldError::invalid(
                    path,
                    domain,
                    format!("validating label {}: {p}", go_quote(lbl)),
                ));
            }
            break;
        }
    }
    if labels.len() < 2 {
        errs.push(FieldError::invalid(
            path,
            domain,
            "should be a domain with at least two segments separated by dots",
        ));
    }
    for lbl in rest.split('.') {
        let problems = is_dns1123_subdomain(lbl);
        if !problems.is_empty() {
            for p in problems {
                errs.push(FieldError::invalid(
                    path,
                    rest,
                    format!("validating label {}: {p}", go_quote(lbl)),
                ));
            }
            break;
        }
    }
    let max = 253 + (253 + 63 + 1) + 1;
    if signer.len() > max {
        errs.push(FieldError::too_long(path, max as i64));
    }
}

fn go_quote(s: &str) -> String {
    kumo_apimachinery::validation::go_quote(s)
}

/// Upstream's ValidateUserAnnotations: every key a domain-prefixed label key, the whole
/// map small.
fn validate_user_annotations(annotations: &Map<String, Value>, errs: &mut Vec<FieldError>) {
    let path = spec().child("unverifiedUserAnnotations");
    let mut size = 0;
    for (k, v) in annotations {
        size += k.len() + v.as_str().map_or(0, str::len);
        let key = k.to_lowercase();
        if key.is_empty() {
            errs.push(FieldError::required(&path, ""));
            continue;
        }
        let problems = is_qualified_name(&key);
        if !problems.is_empty() {
            for p in problems {
                errs.push(FieldError::invalid(&path, key.as_str(), p));
            }
            continue;
        }
        if key.split('/').count() != 2 {
            errs.push(FieldError::invalid(
                &path,
                key.as_str(),
                "must be a domain-prefixed key (such as \"acme.io/foo\")",
            ));
        }
    }
    if size > TOTAL_ANNOTATION_SIZE_LIMIT {
        errs.push(FieldError::too_long(
            &path,
            TOTAL_ANNOTATION_SIZE_LIMIT as i64,
        ));
    }
}

/// The spec as Go's JSON encoding of the internal type shows it in an immutability error.
fn go_spec(spec: &Value) -> String {
    let go = kumo_apimachinery::validation::go_json;
    let s = |k: &str| go(&json!(str_at(spec, &format!("/{k}"))));
    let max = spec
        .get("maxExpirationSeconds")
        .and_then(Value::as_i64)
        .map_or("null".to_owned(), |m| m.to_string());
    let stub = match str_at(spec, "/stubPKCS10Request") {
        "" => "null".to_owned(),
        b => go(&json!(b)),
    };
    let annotations = match spec.get("unverifiedUserAnnotations") {
        Some(a @ Value::Object(_)) => go(a),
        _ => "null".to_owned(),
    };
    format!(
        "{{\"SignerName\":{},\"PodName\":{},\"PodUID\":{},\"ServiceAccountName\":{},\"ServiceAccountUID\":{},\"NodeName\":{},\"NodeUID\":{},\"MaxExpirationSeconds\":{max},\"PKIXPublicKey\":null,\"ProofOfPossession\":null,\"StubPKCS10Request\":{stub},\"UnverifiedUserAnnotations\":{annotations}}}",
        s("signerName"),
        s("podName"),
        s("podUID"),
        s("serviceAccountName"),
        s("serviceAccountUID"),
        s("nodeName"),
        s("nodeUID"),
    )
}

/// A required identifier (`podUID`, ...): non-empty and at most 128 bytes.
fn validate_uid(obj: &Value, field: &str, errs: &mut Vec<FieldError>) {
    let path = spec().child(field);
    let v = str_at(obj, &format!("/spec/{field}"));
    if v.is_empty() {
        errs.push(FieldError::invalid(&path, v, "must not be empty"));
    }
    if v.len() as i64 > MAX_UID_LEN {
        errs.push(FieldError::too_long(&path, MAX_UID_LEN));
    }
}

/// A required name (`podName`, ...): a DNS subdomain.
fn validate_dns_name(obj: &Value, field: &str, errs: &mut Vec<FieldError>) {
    let v = str_at(obj, &format!("/spec/{field}"));
    for msg in name_is_dns_subdomain(v, false) {
        errs.push(FieldError::invalid(&spec().child(field), v, msg));
    }
}

/// The DER bytes of a base64 `bytes` field (JSON carries bytes as base64).
fn bytes_at(obj: &Value, pointer: &str) -> Option<Vec<u8>> {
    let s = str_at(obj, pointer);
    base64::engine::general_purpose::STANDARD.decode(s).ok()
}

/// The checks of upstream's validateStubPKCS10Request on the stub CSR's DER.
fn validate_stub_csr(der: &[u8]) -> Option<FieldError> {
    let path = spec().child("stubPKCS10Request");
    if der.len() > MAX_STUB_PKCS10_REQUEST_SIZE {
        return Some(FieldError::too_long(
            &path,
            MAX_STUB_PKCS10_REQUEST_SIZE as i64,
        ));
    }
    let invalid = |detail: &str| Some(FieldError::invalid(&path, BadValue::Omitted, detail));
    let parsed = x509_parser::certification_request::X509CertificationRequest::from_der(der);
    let Ok((rest, req)) = parsed else {
        return invalid("must be a valid PKCS#10 CSR");
    };
    if !rest.is_empty() {
        return invalid("must be a valid PKCS#10 CSR");
    }
    let spki = &req.certification_request_info.subject_pki;
    let alg = spki.algorithm.algorithm.to_id_string();
    match spki.parsed() {
        Ok(x509_parser::public_key::PublicKey::EC(_)) => {
            let curve = spki
                .algorithm
                .parameters
                .as_ref()
                .and_then(|p| p.as_oid().ok())
                .map(|o| o.to_id_string())
                .unwrap_or_default();
            if !EC_CURVES.contains(&curve.as_str()) {
                return Some(FieldError::invalid(
                    &path,
                    format!("curve {}", curve_name(&curve)),
                    "elliptic public keys must use curve P256, P384, or P521",
                ));
            }
        }
        Ok(x509_parser::public_key::PublicKey::RSA(rsa)) => {
            let modulus = rsa.modulus;
            let significant = modulus.iter().skip_while(|b| **b == 0).count();
            let bits = significant * 8;
            if bits != 3072 && bits != 4096 {
                return Some(FieldError::invalid(
                    &path,
                    format!("{bits}-bit modulus"),
                    "RSA keys must have modulus size 3072 or 4096",
                ));
            }
        }
        Ok(_) if alg == OID_ED25519 => {}
        _ => {
            return invalid("unknown public key type; supported types are Ed25519, ECDSA, and RSA")
        }
    }
    if req.verify_signature().is_err() {
        return invalid("invalid signature");
    }
    None
}

/// Go's name for a named curve, as its error shows it.
fn curve_name(oid: &str) -> &str {
    match oid {
        "1.2.840.10045.3.1.1" => "P-192",
        "1.3.132.0.33" => "P-224",
        other => other,
    }
}

/// Whether `obj` has the condition `t` with status True.
fn has_true(obj: &Value, t: &str) -> bool {
    arr(obj, "/status/conditions")
        .iter()
        .any(|c| str_at(c, "/type") == t && str_at(c, "/status") == "True")
}

fn is_terminal(obj: &Value) -> bool {
    TERMINAL_TYPES.iter().any(|t| has_true(obj, t))
}

/// A status as Go's semantic equality sees it: empty strings, lists and nulls are the
/// same as absent fields.
fn normalized(v: Option<&Value>) -> Value {
    fn norm(v: &Value) -> Option<Value> {
        match v {
            Value::Null => None,
            Value::String(s) if s.is_empty() => None,
            Value::Array(a) if a.is_empty() => None,
            Value::Array(a) => Some(Value::Array(
                a.iter().map(|x| norm(x).unwrap_or(Value::Null)).collect(),
            )),
            Value::Object(o) => {
                let m: Map<String, Value> = o
                    .iter()
                    .filter_map(|(k, v)| norm(v).map(|v| (k.clone(), v)))
                    .collect();
                Some(Value::Object(m))
            }
            other => Some(other.clone()),
        }
    }
    v.and_then(norm).unwrap_or_else(|| json!({}))
}

/// An Invalid error whose value Go prints as it is (the JSON of a struct).
fn invalid_raw(path: &Path, raw: &str, detail: &str) -> FieldError {
    FieldError::invalid(path, BadValue::Omitted, format!("{raw}: {detail}"))
}

/// Upstream's ValidateConditions for metav1.Conditions at `path`.
pub(super) fn validate_metav1_conditions(conds: &[Value], path: &Path, errs: &mut Vec<FieldError>) {
    let mut seen: Vec<&str> = Vec::new();
    for (i, c) in conds.iter().enumerate() {
        let cp = path.index(i);
        let t = str_at(c, "/type");
        if seen.contains(&t) {
            errs.push(FieldError::duplicate(&cp, t));
        } else {
            seen.push(t);
        }
        if t.is_empty() {
            errs.push(FieldError::required(&cp.child("type"), "is required"));
        } else {
            for p in is_qualified_name(t) {
                errs.push(FieldError::invalid(&cp.child("type"), t, p));
            }
        }
        let s = str_at(c, "/status");
        if s.is_empty() {
            errs.push(FieldError::required(&cp.child("status"), ""));
        } else if !["False", "True", "Unknown"].contains(&s) {
            errs.push(FieldError::not_supported(
                &cp.child("status"),
                s,
                &["False", "True", "Unknown"],
            ));
        }
        if let Some(g) = c.get("observedGeneration").and_then(Value::as_i64) {
            if g < 0 {
                errs.push(FieldError::invalid(
                    &cp.child("observedGeneration"),
                    g,
                    "must be greater than or equal to zero",
                ));
            }
        }
        if str_at(c, "/lastTransitionTime").is_empty() {
            errs.push(FieldError::required(&cp.child("lastTransitionTime"), ""));
        }
        let reason = str_at(c, "/reason");
        if reason.is_empty() {
            errs.push(FieldError::required(&cp.child("reason"), ""));
        } else {
            if !valid_reason(reason) {
                errs.push(FieldError::invalid(
                    &cp.child("reason"),
                    reason,
                    "a condition reason must start with alphabetic character, optionally followed by a string of alphanumeric characters or '_,:', and must end with an alphanumeric character or '_' (e.g. 'my_name',  or 'MY_NAME',  or 'MyName',  or 'ReasonA,ReasonB',  or 'ReasonA:ReasonB', regex used for validation is '[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?')",
                ));
            }
            if reason.len() > 1024 {
                errs.push(FieldError::too_long(&cp.child("reason"), 1024));
            }
        }
        if str_at(c, "/message").len() > 32 * 1024 {
            errs.push(FieldError::too_long(&cp.child("message"), 32 * 1024));
        }
    }
}

/// `[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?`
fn valid_reason(r: &str) -> bool {
    let b = r.as_bytes();
    let Some((first, rest)) = b.split_first() else {
        return false;
    };
    if !first.is_ascii_alphabetic() {
        return false;
    }
    if let Some(last) = rest.last() {
        if !(last.is_ascii_alphanumeric() || *last == b'_') {
            return false;
        }
    }
    rest.iter()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b',' | b':'))
}

/// The PEM blocks of a chain in order, each (label, DER), up to the first text that is
/// not a PEM block.
fn pem_blocks(chain: &str) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut rest = chain.as_bytes();
    while let Ok((pem, r)) = x509_parser::pem::Pem::read(std::io::Cursor::new(rest)) {
        out.push((pem.label, pem.contents));
        rest = &rest[r.min(rest.len())..];
        if rest.is_empty() {
            break;
        }
    }
    out
}

/// The checks of an Issued status (upstream's rules for the leaf certificate, the
/// timestamps and the rest of the chain).
fn validate_issued(new: &Value, old: &Value) -> Vec<FieldError> {
    let chain_path = status().child("certificateChain");
    let chain = str_at(new, "/status/certificateChain");
    if chain.len() > MAX_CERTIFICATE_CHAIN_SIZE {
        return vec![FieldError::too_long(
            &chain_path,
            MAX_CERTIFICATE_CHAIN_SIZE as i64,
        )];
    }
    let blocks = pem_blocks(chain);
    let Some((label, leaf_der)) = blocks.first() else {
        return vec![FieldError::invalid(
            &chain_path,
            chain,
            "issued certificate chain must contain at least one certificate",
        )];
    };
    if label != "CERTIFICATE" {
        return vec![FieldError::invalid(
            &chain_path,
            chain,
            "issued certificate chain must consist entirely of CERTIFICATE PEM blocks",
        )];
    }
    let Ok((_, leaf)) = x509_parser::parse_x509_certificate(leaf_der) else {
        return vec![FieldError::invalid(
            &chain_path,
            chain,
            "leaf certificate does not parse as valid X.509",
        )];
    };
    let mut errs = Vec::new();
    if let Ok(Some(san)) = leaf.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                x509_parser::extensions::GeneralName::DNSName(dns) => {
                    if dns.is_empty() {
                        errs.push(FieldError::invalid(
                            &chain_path,
                            *dns,
                            "leaf certificate should not contain empty DNSName",
                        ));
                    }
                    if dns.contains("..") {
                        errs.push(FieldError::invalid(
                            &chain_path,
                            *dns,
                            "leaf certificate's DNSName should not contain '..'",
                        ));
                    }
                    if dns.starts_with('.') || dns.ends_with('.') {
                        errs.push(FieldError::invalid(
                            &chain_path,
                            *dns,
                            "leaf certificate's DNSName should not start or end with '.'",
                        ));
                    }
                }
                x509_parser::extensions::GeneralName::RFC822Name(mail) => {
                    let ok = mail
                        .split_once('@')
                        .is_some_and(|(l, d)| !l.is_empty() && !d.is_empty());
                    if !ok {
                        errs.push(FieldError::invalid(
                            &chain_path,
                            *mail,
                            "leaf certificate should not contain invalid EmailAddress",
                        ));
                    }
                }
                _ => {}
            }
        }
    }

    // The leaf must certify the key of the stub CSR.
    let csr_der = bytes_at(old, "/spec/stubPKCS10Request").unwrap_or_default();
    let parsed = x509_parser::certification_request::X509CertificationRequest::from_der(&csr_der);
    let Ok((_, csr)) = parsed else {
        errs.push(FieldError::invalid(
            &spec().child("stubPKCS10Request"),
            BadValue::Omitted,
            "must be a valid PKCS#10 CSR",
        ));
        return errs;
    };
    if csr.certification_request_info.subject_pki.raw != leaf.public_key().raw {
        errs.push(FieldError::invalid(
            &chain_path,
            chain,
            "leaf certificate was not issued to the requested public key",
        ));
        return errs;
    }

    let nb_path = status().child("notBefore");
    let na_path = status().child("notAfter");
    let br_path = status().child("beginRefreshAt");
    let time_at = |p: &str| crate::time::parse_rfc3339(str_at(new, p));
    let (nb, na, br) = (
        time_at("/status/notBefore"),
        time_at("/status/notAfter"),
        time_at("/status/beginRefreshAt"),
    );
    if nb.is_none() {
        errs.push(FieldError::required(
            &nb_path,
            "must be present and consistent with the issued certificate",
        ));
    }
    if na.is_none() {
        errs.push(FieldError::required(
            &na_path,
            "must be present and consistent with the issued certificate",
        ));
    }
    if br.is_none() {
        errs.push(FieldError::required(
            &br_path,
            "must be present and in the range [notbefore+10min, notafter-10min]",
        ));
    }
    let (Some(nb), Some(na), Some(br), true) = (nb, na, br, errs.is_empty()) else {
        return errs;
    };
    let validity = leaf.validity();
    let (leaf_nb, leaf_na) = (
        validity.not_before.timestamp(),
        validity.not_after.timestamp(),
    );
    if nb != leaf_nb {
        return vec![FieldError::invalid(
            &nb_path,
            crate::time::format_rfc3339(nb),
            "must be set to the NotBefore time encoded in the leaf certificate",
        )];
    }
    let now = crate::time::now_secs();
    if !(nb > now - 300 && nb < now + 300) {
        return vec![FieldError::invalid(
            &nb_path,
            crate::time::format_rfc3339(nb),
            "must be set to within 5 minutes of kube-apiserver's current time",
        )];
    }
    if na != leaf_na {
        return vec![FieldError::invalid(
            &na_path,
            crate::time::format_rfc3339(na),
            "must be set to the NotAfter time encoded in the leaf certificate",
        )];
    }
    let lifetime = leaf_na - leaf_nb;
    // Go shows a time.Duration value as its nanoseconds.
    let lifetime_ns = lifetime.saturating_mul(1_000_000_000);
    if lifetime < 3600 {
        return vec![FieldError::invalid(
            &chain_path,
            lifetime_ns,
            "leaf certificate lifetime must be >= 1 hour",
        )];
    }
    let max = new
        .pointer("/spec/maxExpirationSeconds")
        .and_then(Value::as_i64)
        .unwrap_or(DEFAULT_MAX_EXPIRATION_SECONDS);
    if lifetime > max {
        return vec![FieldError::invalid(
            &chain_path,
            lifetime_ns,
            format!("leaf certificate lifetime must be <= spec.maxExpirationSeconds ({max})"),
        )];
    }
    if br < nb + 600 {
        return vec![FieldError::invalid(
            &br_path,
            crate::time::format_rfc3339(br),
            "must be at least 10 minutes after status.notBefore",
        )];
    }
    if br > na - 600 {
        return vec![FieldError::invalid(
            &br_path,
            crate::time::format_rfc3339(br),
            "must be at least 10 minutes before status.notAfter",
        )];
    }
    for (label, der) in &blocks[1..] {
        if label != "CERTIFICATE" {
            // Upstream's message spells it this way.
            return vec![FieldError::invalid(
                &chain_path,
                chain,
                "issued certificate chain must consist entirely of CERTFICATE PEM blocks",
            )];
        }
        if x509_parser::parse_x509_certificate(der).is_err() {
            return vec![FieldError::invalid(
                &chain_path,
                chain,
                "intermediate certificate does not parse as valid X.509",
            )];
        }
    }
    errs
}

impl Strategy for PodCertificateRequests {
    // Upstream's status strategy resets the metadata (ResetObjectMetaForStatus or its
    // equivalent): only the status changes through /status.
    fn status_keeps_metadata(&self) -> bool {
        false
    }

    fn prepare_create(&self, obj: &mut Value) {
        // Signers write the status; a new request starts without one.
        if let Some(o) = obj.as_object_mut() {
            o.insert("status".into(), json!({}));
        }
        if let Some(s) = obj.get_mut("spec") {
            default_field(
                s,
                "maxExpirationSeconds",
                json!(DEFAULT_MAX_EXPIRATION_SECONDS),
            );
        }
    }

    fn prepare_update(&self, new: &mut Value, old: &Value) {
        keep_status(new, old);
        if let Some(s) = new.get_mut("spec") {
            default_field(
                s,
                "maxExpirationSeconds",
                json!(DEFAULT_MAX_EXPIRATION_SECONDS),
            );
        }
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let signer = str_at(obj, "/spec/signerName");
        validate_signer_name(&spec().child("signerName"), signer, &mut errs);
        if let Some(a) = obj
            .pointer("/spec/unverifiedUserAnnotations")
            .and_then(Value::as_object)
        {
            validate_user_annotations(a, &mut errs);
        }
        validate_dns_name(obj, "podName", &mut errs);
        validate_uid(obj, "podUID", &mut errs);
        validate_dns_name(obj, "serviceAccountName", &mut errs);
        validate_uid(obj, "serviceAccountUID", &mut errs);
        validate_dns_name(obj, "nodeName", &mut errs);
        validate_uid(obj, "nodeUID", &mut errs);

        let max_path = spec().child("maxExpirationSeconds");
        let Some(max) = obj
            .pointer("/spec/maxExpirationSeconds")
            .and_then(Value::as_i64)
        else {
            errs.push(FieldError::required(&max_path, "must be set"));
            return errs;
        };
        let hi = if is_kubernetes_signer(signer) {
            KUBERNETES_MAX_MAX_EXPIRATION_SECONDS
        } else {
            MAX_MAX_EXPIRATION_SECONDS
        };
        if !(MIN_MAX_EXPIRATION_SECONDS..=hi).contains(&max) {
            errs.push(FieldError::invalid(
                &max_path,
                max,
                format!("must be in the range [{MIN_MAX_EXPIRATION_SECONDS}, {hi}]"),
            ));
        }

        // v1 has only the stub CSR (the deprecated pkixPublicKey and proofOfPossession
        // of v1beta1 are not served here).
        match bytes_at(obj, "/spec/stubPKCS10Request") {
            Some(der) if !der.is_empty() => errs.extend(validate_stub_csr(&der)),
            Some(_) => errs.push(FieldError::invalid(
                &spec(),
                BadValue::Omitted,
                "exactly one of (stubPKCS10Request) or (pkixPublicKey, proofOfPossession) must be set",
            )),
            None => errs.push(FieldError::invalid(
                &spec().child("stubPKCS10Request"),
                BadValue::Omitted,
                "must be a valid PKCS#10 CSR",
            )),
        }
        errs
    }

    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        // Everything in the spec is immutable; only metadata changes.
        if normalized(new.get("spec")) != normalized(old.get("spec")) {
            let spec_json = new.get("spec").cloned().unwrap_or(Value::Null);
            return vec![invalid_raw(
                &spec(),
                &go_spec(&spec_json),
                "field is immutable",
            )];
        }
        Vec::new()
    }

    fn validate_status_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let conds = arr(new, "/status/conditions");
        let path = status().child("conditions");
        let mut known = 0;
        for (i, c) in conds.iter().enumerate() {
            // Upstream names the index as a field of its own here.
            let cp = path.child(&format!("[{i}]"));
            let t = str_at(c, "/type");
            if TERMINAL_TYPES.contains(&t) {
                known += 1;
                if known > 1 {
                    errs.push(FieldError::invalid(
                        &cp.child("type"),
                        t,
                        r#"There may be at most one condition with type "Issued", "Denied", or "Failed""#,
                    ));
                }
                let s = str_at(c, "/status");
                if s != "True" {
                    errs.push(FieldError::not_supported(&cp.child("status"), s, &["True"]));
                }
            } else {
                errs.push(FieldError::not_supported(
                    &cp.child("type"),
                    t,
                    &TERMINAL_TYPES,
                ));
            }
        }
        validate_metav1_conditions(conds, &status().child("conditions"), &mut errs);
        if !errs.is_empty() {
            return errs;
        }
        let (new_status, old_status) =
            (normalized(new.get("status")), normalized(old.get("status")));
        if is_terminal(old) {
            if new_status != old_status {
                errs.push(FieldError::invalid(
                    &status(),
                    BadValue::Omitted,
                    "immutable after PodCertificateRequest is issued, denied, or failed",
                ));
            }
            return errs;
        }
        if has_true(new, "Denied") || has_true(new, "Failed") {
            let only_conditions = new_status
                .as_object()
                .is_none_or(|o| o.keys().all(|k| k == "conditions"));
            if !only_conditions {
                errs.push(FieldError::invalid(
                    &status(),
                    BadValue::Omitted,
                    "non-condition status fields must be empty when denying or failing the PodCertificateRequest",
                ));
            }
            return errs;
        }
        if has_true(new, "Issued") {
            return validate_issued(new, old);
        }
        if new_status != old_status {
            errs.push(FieldError::invalid(
                &status(),
                BadValue::Omitted,
                r#"status is immutable unless transitioning to "Issued", "Denied", or "Failed""#,
            ));
        }
        errs
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            Column::NAME,
            col(
                "PodName",
                "string",
                "podName is the name of the pod into which the certificate will be mounted.",
            ),
            col(
                "ServiceAccountName",
                "string",
                "serviceAccountName is the name of the service account the pod is running as.",
            ),
            col(
                "NodeName",
                "string",
                "nodeName is the name of the node the pod is assigned to.",
            ),
            col("SignerName", "string", "signerName indicates the requested signer.\n\nAll signer names beginning with `kubernetes.io` are reserved for use by the Kubernetes project.  There is currently one well-known signer documented by the Kubernetes project, `kubernetes.io/kube-apiserver-client-pod`, which will issue client certificates understood by kube-apiserver.  It is currently unimplemented."),
            col(
                "State",
                "string",
                "Is the request Pending, Issued, Denied, or Failed?",
            ),
            col("UnverifiedUserAnnotations", "string", "unverifiedUserAnnotations allow pod authors to pass additional information to the signer implementation.  Kubernetes does not restrict or validate this metadata in any way.\n\nEntries are subject to the same validation as object metadata annotations, with the addition that all keys must be domain-prefixed. No restrictions are placed on values, except an overall size limitation on the entire field.\n\nSigners should document the keys and values they support.  Signers should deny requests that contain keys they do not recognize."),
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        // The last terminal condition decides, whatever its status (as upstream prints).
        let mut state = "Pending";
        for c in arr(obj, "/status/conditions") {
            match str_at(c, "/type") {
                "Issued" => state = "Issued",
                "Denied" => state = "Denied",
                "Failed" => state = "Failed",
                _ => {}
            }
        }
        // labels.FormatLabels: sorted k=v pairs, `<none>` when empty.
        let annotations = obj
            .pointer("/spec/unverifiedUserAnnotations")
            .and_then(Value::as_object)
            .map(|a| {
                let mut pairs: Vec<String> = a
                    .iter()
                    .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                    .collect();
                pairs.sort();
                pairs.join(",")
            })
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "<none>".to_owned());
        vec![
            json!(name_of(obj)),
            json!(str_at(obj, "/spec/podName")),
            json!(str_at(obj, "/spec/serviceAccountName")),
            json!(str_at(obj, "/spec/nodeName")),
            json!(str_at(obj, "/spec/signerName")),
            json!(state),
            json!(annotations),
        ]
    }

    fn selectable_fields(&self, obj: &Value) -> Vec<(&'static str, String)> {
        vec![
            (
                "spec.signerName",
                str_at(obj, "/spec/signerName").to_owned(),
            ),
            ("spec.podName", str_at(obj, "/spec/podName").to_owned()),
            ("spec.nodeName", str_at(obj, "/spec/nodeName").to_owned()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons() {
        assert!(valid_reason("E2E"));
        assert!(valid_reason("A,B:c_"));
        assert!(!valid_reason("1abc"));
        assert!(!valid_reason("abc,"));
    }

    #[test]
    fn chain_blocks_in_order() {
        let key = rcgen::KeyPair::generate().expect("key");
        let leaf = rcgen::CertificateParams::new(vec!["a.example".to_owned()])
            .expect("params")
            .self_signed(&key)
            .expect("cert");
        let chain = format!(
            "{}{}-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
            leaf.pem(),
            leaf.pem()
        );
        let blocks = pem_blocks(&chain);
        let labels: Vec<&str> = blocks.iter().map(|(l, _)| l.as_str()).collect();
        assert_eq!(labels, ["CERTIFICATE", "CERTIFICATE", "PRIVATE KEY"]);
        assert_eq!(blocks[1].1, leaf.der().to_vec());
        assert!(pem_blocks("no pem here").is_empty());
    }

    /// Typed clients send protobuf: the wire facts know the v1 kind and its bytes field.
    #[test]
    fn protobuf_round_trip() {
        let obj = json!({
            "apiVersion": "certificates.k8s.io/v1",
            "kind": "PodCertificateRequest",
            "metadata": {"name": "p", "namespace": "default"},
            "spec": {
                "signerName": "example.com/s", "podName": "p", "podUID": "u",
                "serviceAccountName": "default", "serviceAccountUID": "u2",
                "nodeName": "n", "nodeUID": "u3", "maxExpirationSeconds": 3600,
                "stubPKCS10Request": "AAEC",
                "unverifiedUserAnnotations": {"example.com/a": "1"},
            },
            "status": {"certificateChain": "c", "notBefore": "2026-01-01T00:00:00Z"},
        });
        let wire = kumo_apimachinery::protobuf::encode(&obj).expect("encode");
        let back = kumo_apimachinery::protobuf::decode(&wire).expect("decode");
        assert_eq!(back["spec"], obj["spec"]);
        assert_eq!(back["status"], obj["status"]);
    }

    #[test]
    fn garbage_csr_is_invalid_not_a_panic() {
        let e = validate_stub_csr(b"not der").expect("an error");
        assert!(e.error_body().contains("must be a valid PKCS#10 CSR"));
    }
}
