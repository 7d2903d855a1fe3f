//! certificates.k8s.io/v1 PodCertificateRequests through the real kubectl: create from a
//! stub CSR, the verbs, `status` with an issued chain, and upstream's validation messages.

mod common;

use common::{k, k_in, out_json, start};
use serde_json::{json, Value};
use std::path::Path;
use time::format_description::well_known::Rfc3339;
use time::{Duration, OffsetDateTime};

/// A fresh P-256 key and its empty stub CSR (DER), as kubelet makes them.
fn key_and_csr() -> (rcgen::KeyPair, Vec<u8>) {
    let key = rcgen::KeyPair::generate().expect("key");
    let csr = rcgen::CertificateParams::default()
        .serialize_request(&key)
        .expect("csr");
    (key, csr.der().to_vec())
}

fn b64(der: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(der)
}

/// A self-signed certificate for `key`, valid from a minute ago for `lifetime`.
fn cert_for(key: &rcgen::KeyPair, lifetime: Duration) -> (String, OffsetDateTime, OffsetDateTime) {
    let now = OffsetDateTime::now_utc();
    let not_before = now - Duration::minutes(1);
    let not_before = not_before.replace_nanosecond(0).expect("whole seconds");
    let not_after = not_before + lifetime;
    let mut params =
        rcgen::CertificateParams::new(vec!["e2e.example.com".to_owned()]).expect("params");
    params.not_before = not_before;
    params.not_after = not_after;
    let cert = params.self_signed(key).expect("cert");
    (cert.pem(), not_before, not_after)
}

fn ts(t: OffsetDateTime) -> String {
    t.format(&Rfc3339).expect("rfc3339")
}

fn request(name: &str, signer: &str, csr: &[u8]) -> Value {
    json!({
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "PodCertificateRequest",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "signerName": signer,
            "podName": "test-pod",
            "podUID": "12345678-1234-1234-1234-123456789012",
            "serviceAccountName": "default",
            "serviceAccountUID": "12345678-1234-1234-1234-123456789013",
            "nodeName": "test-node",
            "nodeUID": "12345678-1234-1234-1234-123456789014",
            "stubPKCS10Request": b64(csr),
        }
    })
}

async fn create(kc: &Path, obj: &Value) -> common::Out {
    k_in(
        None,
        kc,
        &["create", "-o", "json", "-f", "-"],
        Some(&obj.to_string()),
    )
    .await
}

/// The Issued status for a certificate valid from `nb` to `na`.
fn issued(chain: &str, nb: OffsetDateTime, na: OffsetDateTime) -> Value {
    json!({"status": {
        "certificateChain": chain,
        "notBefore": ts(nb),
        "notAfter": ts(na),
        "beginRefreshAt": ts(nb + Duration::minutes(15)),
        "conditions": [{
            "type": "Issued", "status": "True", "reason": "Test",
            "message": "issued by the test", "lastTransitionTime": ts(OffsetDateTime::now_utc()),
        }],
    }})
}

async fn patch_status(kc: &Path, name: &str, patch: &Value) -> common::Out {
    k(
        kc,
        &[
            "patch",
            "podcertificaterequests",
            name,
            "--subresource=status",
            "--type=merge",
            "-o",
            "json",
            "-p",
            &patch.to_string(),
        ],
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn pod_certificate_request_verbs_and_status() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    let (key, csr) = key_and_csr();

    // Create with generateName: the status starts empty, maxExpirationSeconds defaults.
    let mut obj = request("", "example.com/e2e-signer", &csr);
    obj["metadata"] = json!({"generateName": "e2e-example-pcr-", "namespace": "default"});
    let created = out_json(&create(&kc, &obj).await);
    let name = created["metadata"]["name"]
        .as_str()
        .expect("name")
        .to_owned();
    assert!(name.starts_with("e2e-example-pcr-"), "{name}");
    assert_eq!(created["spec"]["maxExpirationSeconds"], 86400);
    assert_eq!(created["spec"]["stubPKCS10Request"], json!(b64(&csr)));

    // The table as kube-apiserver prints it (every column shown without -o wide).
    let out = k(&kc, &["get", "podcertificaterequests"]).await;
    assert!(out.ok, "{}", out.stderr);
    let mut lines = out.stdout.lines();
    let header: Vec<&str> = lines.next().expect("header").split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME",
            "PODNAME",
            "SERVICEACCOUNTNAME",
            "NODENAME",
            "SIGNERNAME",
            "STATE",
            "UNVERIFIEDUSERANNOTATIONS"
        ]
    );
    let row: Vec<&str> = lines.next().expect("row").split_whitespace().collect();
    assert_eq!(
        row,
        [
            name.as_str(),
            "test-pod",
            "default",
            "test-node",
            "example.com/e2e-signer",
            "Pending",
            "<none>"
        ]
    );

    // List by the selectable fields.
    let listed = out_json(
        &k(
            &kc,
            &[
                "get",
                "podcertificaterequests",
                "--field-selector=spec.nodeName=test-node,spec.podName=test-pod",
                "-o",
                "json",
            ],
        )
        .await,
    );
    assert_eq!(listed["items"].as_array().map(Vec::len), Some(1));
    let none = out_json(
        &k(
            &kc,
            &[
                "get",
                "podcertificaterequests",
                "--field-selector=spec.signerName=example.com/other",
                "-o",
                "json",
            ],
        )
        .await,
    );
    assert_eq!(none["items"].as_array().map(Vec::len), Some(0));

    // Metadata changes; the spec does not; a status in a plain update is dropped.
    let patched = out_json(
        &k(
            &kc,
            &[
                "patch",
                "podcertificaterequests",
                &name,
                "--type=merge",
                "-o",
                "json",
                "-p",
                r#"{"metadata":{"labels":{"test":"yes"}},"status":{"certificateChain":"x"}}"#,
            ],
        )
        .await,
    );
    assert_eq!(patched["metadata"]["labels"]["test"], "yes");
    assert_eq!(patched["status"], json!({}));
    let out = k(
        &kc,
        &[
            "patch",
            "podcertificaterequests",
            &name,
            "--type=merge",
            "-p",
            r#"{"spec":{"podName":"other"}}"#,
        ],
    )
    .await;
    assert!(!out.ok);
    assert!(
        out.stderr.contains(&format!(
            "The PodCertificateRequest \"{name}\" is invalid: spec: Invalid value: {{\"SignerName\":\"example.com/e2e-signer\",\"PodName\":\"other\","
        )) && out.stderr.contains("\"UnverifiedUserAnnotations\":null}: field is immutable"),
        "{}",
        out.stderr
    );

    // Update (replace) with a new label.
    let mut current = patched.clone();
    current["metadata"]["labels"]["second"] = json!("label");
    let replaced = out_json(
        &k_in(
            None,
            &kc,
            &["replace", "-o", "json", "-f", "-"],
            Some(&current.to_string()),
        )
        .await,
    );
    assert_eq!(replaced["metadata"]["labels"]["second"], "label");

    // Status: nothing but a terminal transition changes it.
    let out = patch_status(
        &kc,
        &name,
        &json!({"status": {"certificateChain": "not yet"}}),
    )
    .await;
    assert!(
        out.stderr.contains(
            r#"status: Invalid value: status is immutable unless transitioning to "Issued", "Denied", or "Failed""#
        ),
        "{}",
        out.stderr
    );

    // A certificate for another key is refused.
    let (other_key, _) = key_and_csr();
    let (chain, nb, na) = cert_for(&other_key, Duration::hours(1));
    let out = patch_status(&kc, &name, &issued(&chain, nb, na)).await;
    assert!(
        out.stderr
            .contains("status.certificateChain: Invalid value: \"-----BEGIN CERTIFICATE-----")
            && out
                .stderr
                .contains("leaf certificate was not issued to the requested public key"),
        "{}",
        out.stderr
    );

    // Too short a lifetime, and a beginRefreshAt too late.
    let (chain, nb, na) = cert_for(&key, Duration::minutes(30));
    let out = patch_status(&kc, &name, &issued(&chain, nb, na)).await;
    assert!(
        out.stderr.contains(
            "status.certificateChain: Invalid value: 1800000000000: leaf certificate lifetime must be >= 1 hour"
        ),
        "{}",
        out.stderr
    );
    let (chain, nb, na) = cert_for(&key, Duration::hours(1));
    let mut late = issued(&chain, nb, na);
    late["status"]["beginRefreshAt"] = json!(ts(na - Duration::minutes(5)));
    let out = patch_status(&kc, &name, &late).await;
    let want = format!(
        "status.beginRefreshAt: Invalid value: \"{}\": must be at least 10 minutes before status.notAfter",
        ts(na - Duration::minutes(5))
    );
    assert!(out.stderr.contains(&want), "{want}\n{}", out.stderr);
    let mut missing = issued(&chain, nb, na);
    missing["status"]["notAfter"] = Value::Null;
    let out = patch_status(&kc, &name, &missing).await;
    assert!(
        out.stderr.contains(
            "status.notAfter: Required value: must be present and consistent with the issued certificate"
        ),
        "{}",
        out.stderr
    );

    // The issued chain is taken; labels sent through status are not.
    let mut good = issued(&chain, nb, na);
    good["metadata"] = json!({"labels": {"through": "status"}});
    let done = out_json(&patch_status(&kc, &name, &good).await);
    assert_eq!(done["status"]["certificateChain"], json!(chain));
    assert_eq!(done["status"]["notBefore"], json!(ts(nb)));
    assert_eq!(done["status"]["conditions"][0]["type"], "Issued");
    assert!(done["metadata"]["labels"].get("through").is_none());
    assert_eq!(done["spec"], replaced["spec"]);
    let out = k(
        &kc,
        &["get", "podcertificaterequests", &name, "--no-headers"],
    )
    .await;
    assert!(out.stdout.contains(" Issued "), "{}", out.stdout);

    // Issued is final.
    let out = patch_status(
        &kc,
        &name,
        &json!({"status": {"conditions": [{"type": "Issued", "status": "True", "reason": "Again", "message": "", "lastTransitionTime": ts(nb)}]}}),
    )
    .await;
    assert!(
        out.stderr.contains(
            "status: Invalid value: immutable after PodCertificateRequest is issued, denied, or failed"
        ),
        "{}",
        out.stderr
    );

    // A second request: denying carries nothing but conditions, and one terminal type.
    let (_, csr2) = key_and_csr();
    out_json(&create(&kc, &request("denied", "example.com/e2e-signer", &csr2)).await);
    let denied = |extra: Value| {
        let mut s = json!({"conditions": [{
            "type": "Denied", "status": "True", "reason": "NoWay",
            "message": "denied", "lastTransitionTime": ts(nb),
        }]});
        if let (Some(s), Value::Object(extra)) = (s.as_object_mut(), extra) {
            s.extend(extra);
        }
        json!({ "status": s })
    };
    let out = patch_status(&kc, "denied", &denied(json!({"certificateChain": chain}))).await;
    assert!(
        out.stderr.contains("status: Invalid value: non-condition status fields must be empty when denying or failing the PodCertificateRequest"),
        "{}",
        out.stderr
    );
    let out = patch_status(
        &kc,
        "denied",
        &json!({"status": {"conditions": [
            {"type": "Denied", "status": "True", "reason": "A", "message": "", "lastTransitionTime": ts(nb)},
            {"type": "Failed", "status": "False", "reason": "B", "message": "", "lastTransitionTime": ts(nb)},
            {"type": "Other", "status": "True", "reason": "C", "message": "", "lastTransitionTime": ts(nb)},
        ]}}),
    )
    .await;
    for want in [
        r#"status.conditions.[1].type: Invalid value: "Failed": There may be at most one condition with type "Issued", "Denied", or "Failed""#,
        r#"status.conditions.[1].status: Unsupported value: "False": supported values: "True""#,
        r#"status.conditions.[2].type: Unsupported value: "Other": supported values: "Issued", "Denied", "Failed""#,
    ] {
        assert!(out.stderr.contains(want), "{want}\n{}", out.stderr);
    }
    let done = out_json(&patch_status(&kc, "denied", &denied(json!({}))).await);
    assert_eq!(done["status"]["conditions"][0]["reason"], "NoWay");

    // Update of the status subresource (kubectl replace --subresource=status).
    let (_, csr3) = key_and_csr();
    let mut third =
        out_json(&create(&kc, &request("third", "example.com/e2e-signer", &csr3)).await);
    third["status"] = json!({"conditions": [{
        "type": "Failed", "status": "True", "reason": "Broken",
        "message": "failed", "lastTransitionTime": ts(nb),
    }]});
    let out = k_in(
        None,
        &kc,
        &["replace", "--subresource=status", "-o", "json", "-f", "-"],
        Some(&third.to_string()),
    )
    .await;
    assert_eq!(out_json(&out)["status"]["conditions"][0]["type"], "Failed");

    // Delete.
    for n in [name.as_str(), "denied", "third"] {
        let out = k(&kc, &["delete", "podcertificaterequests", n]).await;
        assert!(out.ok, "{}", out.stderr);
    }
    let left = out_json(&k(&kc, &["get", "podcertificaterequests", "-o", "json"]).await);
    assert_eq!(left["items"], json!([]));
}

#[tokio::test(flavor = "multi_thread")]
async fn pod_certificate_request_validation() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    let (_, csr) = key_and_csr();

    let mut bad = request("p2", "kubernetes.io/foo", b"hello");
    bad["spec"]["podName"] = json!("Test_Pod");
    bad["spec"]["podUID"] = json!("");
    bad["spec"]["serviceAccountName"] = json!("");
    bad["spec"]["nodeName"] = json!("a..b");
    bad["spec"]["maxExpirationSeconds"] = json!(90000);
    bad["spec"]["unverifiedUserAnnotations"] = json!({"nodomain": "x"});
    let out = create(&kc, &bad).await;
    assert!(!out.ok);
    let subdomain = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
    for want in [
        "The PodCertificateRequest \"p2\" is invalid: \n".to_owned(),
        r#"* spec.unverifiedUserAnnotations: Invalid value: "nodomain": must be a domain-prefixed key (such as "acme.io/foo")"#.to_owned(),
        format!("* spec.podName: Invalid value: \"Test_Pod\": {subdomain}"),
        "* spec.podUID: Invalid value: \"\": must not be empty".to_owned(),
        format!("* spec.serviceAccountName: Invalid value: \"\": {subdomain}"),
        format!("* spec.nodeName: Invalid value: \"a..b\": {subdomain}"),
        "* spec.maxExpirationSeconds: Invalid value: 90000: must be in the range [3600, 86400]".to_owned(),
        "* spec.stubPKCS10Request: Invalid value: must be a valid PKCS#10 CSR".to_owned(),
    ] {
        assert!(out.stderr.contains(&want), "{want}\n{}", out.stderr);
    }

    // No stub CSR at all, and a signer name without a path.
    let mut none = request("p3", "foo", &csr);
    none["spec"]["stubPKCS10Request"] = json!("");
    let out = create(&kc, &none).await;
    for want in [
        "* spec.signerName: Invalid value: \"foo\": must be a fully qualified domain and path of the form 'example.com/signer-name'",
        "* spec: Invalid value: exactly one of (stubPKCS10Request) or (pkixPublicKey, proofOfPossession) must be set",
    ] {
        assert!(out.stderr.contains(want), "{want}\n{}", out.stderr);
    }

    // Other signers may ask for up to 91 days, not more.
    let mut long = request("p4", "example.com/foo", &csr);
    long["spec"]["maxExpirationSeconds"] = json!(91 * 86400 + 1);
    let out = create(&kc, &long).await;
    assert!(
        out.stderr.contains(
            "The PodCertificateRequest \"p4\" is invalid: spec.maxExpirationSeconds: Invalid value: 7862401: must be in the range [3600, 7862400]"
        ),
        "{}",
        out.stderr
    );

    // A CSR whose signature does not verify.
    let mut tampered = csr.clone();
    let last = tampered.len() - 2;
    tampered[last] ^= 0x55;
    let out = create(&kc, &request("p5", "example.com/foo", &tampered)).await;
    assert!(
        out.stderr.contains(
            "The PodCertificateRequest \"p5\" is invalid: spec.stubPKCS10Request: Invalid value: invalid signature"
        ),
        "{}",
        out.stderr
    );

    // Nothing was stored.
    let left = out_json(&k(&kc, &["get", "podcertificaterequests", "-A", "-o", "json"]).await);
    assert_eq!(left["items"], json!([]));
}
