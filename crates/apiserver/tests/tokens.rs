//! Bearer tokens through the real kubectl: service-account tokens from TokenRequest
//! (`kubectl create token`), bound and unbound, used and revoked; TokenReview and
//! SelfSubjectReview (`kubectl auth whoami`); bootstrap tokens; and malformed tokens,
//! which get 401 and never bring the server down.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use common::{k, k_in, out_json, start, Out};
use serde_json::Value;

fn server_url(admin: &Path) -> String {
    let text = std::fs::read_to_string(admin).unwrap();
    text.lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .unwrap()
        .to_owned()
}

/// A kubeconfig that authenticates with a bearer token only (no client certificate).
fn token_kubeconfig(data_dir: &Path, server: &str, name: &str, token: &str) -> PathBuf {
    let path = data_dir.join(format!("{name}.conf"));
    let ca = data_dir.join("pki/ca.crt");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1
kind: Config
clusters:
- name: kumo
  cluster:
    server: {server}
    certificate-authority: {}
users:
- name: {name}
  user:
    token: \"{token}\"
contexts:
- name: kumo
  context: {{cluster: kumo, user: {name}}}
current-context: kumo
",
            ca.display()
        ),
    )
    .unwrap();
    path
}

/// The rows of `kubectl auth whoami`'s table, as (attribute, value).
fn whoami_rows(out: &Out) -> Vec<(String, String)> {
    assert!(out.ok, "{}", out.stderr);
    let mut lines = out.stdout.lines();
    let header = lines.next().unwrap();
    assert!(header.starts_with("ATTRIBUTE"), "{}", out.stdout);
    let col = header.find("VALUE").unwrap();
    lines
        .map(|l| (l[..col].trim().to_owned(), l[col..].trim().to_owned()))
        .collect()
}

fn row<'a>(rows: &'a [(String, String)], attr: &str) -> Option<&'a str> {
    rows.iter()
        .find(|(a, _)| a == attr)
        .map(|(_, v)| v.as_str())
}

/// The claims of a JWT (unverified).
fn claims(token: &str) -> Value {
    let payload = token.split('.').nth(1).unwrap();
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap()
}

async fn create_token(kc: &Path, args: &[&str]) -> String {
    let mut a = vec!["create", "token"];
    a.extend_from_slice(args);
    let out = k(kc, &a).await;
    assert!(out.ok, "{}", out.stderr);
    out.stdout.trim().to_owned()
}

/// `curl` with a bearer token: (HTTP code, body).
fn curl_bearer(data_dir: &Path, server: &str, path: &str, token: &str) -> (String, String) {
    let out = std::process::Command::new("curl")
        .args(["-s", "--cacert"])
        .arg(data_dir.join("pki/ca.crt"))
        .arg("-H")
        .arg(format!("Authorization: Bearer {token}"))
        .args(["-w", "\n%{http_code}", &format!("{server}{path}")])
        .output()
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.to_owned(), body.to_owned())
}

/// A compact ES256 JWS of `claims` under `header` (its base64url text), signed with the
/// PEM key at `key` by `openssl dgst`, whose DER signature becomes JWS's r || s.
fn sign_es256(key: &Path, header: &str, claims: &Value) -> String {
    let input = format!("{header}.{}", URL_SAFE_NO_PAD.encode(claims.to_string()));
    let mut child = std::process::Command::new("openssl")
        .args(["dgst", "-sha256", "-sign"])
        .arg(key)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("openssl on PATH");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let der = child.wait_with_output().unwrap();
    assert!(der.status.success());
    // SEQUENCE { INTEGER r, INTEGER s }, each to 32 bytes.
    let d = der.stdout;
    let mut at = 2;
    let mut raw = Vec::new();
    for _ in 0..2 {
        assert_eq!(d[at], 0x02, "an INTEGER");
        let len = d[at + 1] as usize;
        let int = &d[at + 2..at + 2 + len];
        let int = &int[int.len().saturating_sub(32)..];
        raw.extend(std::iter::repeat_n(0u8, 32 - int.len()));
        raw.extend_from_slice(int);
        at += 2 + len;
    }
    format!("{input}.{}", URL_SAFE_NO_PAD.encode(raw))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn service_account_tokens() {
    let (server, dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    let url = server_url(&kc);

    // The signing key, laid out as kubeadm's.
    let key = dir.path().join("pki/sa.key");
    let text = std::fs::read_to_string(&key).unwrap();
    assert!(text.starts_with("-----BEGIN PRIVATE KEY-----"), "{text}");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let public = std::fs::read_to_string(dir.path().join("pki/sa.pub")).unwrap();
    assert!(public.starts_with("-----BEGIN PUBLIC KEY-----"), "{public}");

    let out = k(&kc, &["create", "serviceaccount", "bot"]).await;
    assert!(out.ok, "{}", out.stderr);
    let sa = out_json(&k(&kc, &["get", "sa", "bot", "-o", "json"]).await);
    let sa_uid = sa["metadata"]["uid"].as_str().unwrap().to_owned();

    let token = create_token(&kc, &["bot"]).await;
    let c = claims(&token);
    assert_eq!(c["iss"], "https://kubernetes.default.svc.cluster.local");
    assert_eq!(
        c["aud"],
        serde_json::json!(["https://kubernetes.default.svc.cluster.local"])
    );
    assert_eq!(c["sub"], "system:serviceaccount:default:bot");
    assert_eq!(
        c["exp"].as_i64().unwrap() - c["iat"].as_i64().unwrap(),
        3600
    );
    assert_eq!(c["nbf"], c["iat"]);
    assert_eq!(c["kubernetes.io"]["namespace"], "default");
    assert_eq!(c["kubernetes.io"]["serviceaccount"]["name"], "bot");
    assert_eq!(c["kubernetes.io"]["serviceaccount"]["uid"], sa_uid.as_str());
    assert!(c["kubernetes.io"].get("warnafter").is_none());
    let jti = c["jti"].as_str().unwrap().to_owned();
    let header: Value = serde_json::from_slice(
        &URL_SAFE_NO_PAD
            .decode(token.split('.').next().unwrap())
            .unwrap(),
    )
    .unwrap();
    assert_eq!(header["alg"], "ES256");

    // The token works: whoami prints upstream's table.
    let bot = token_kubeconfig(dir.path(), &url, "bot", &token);
    let out = k(&bot, &["auth", "whoami"]).await;
    let rows = whoami_rows(&out);
    assert_eq!(
        row(&rows, "Username"),
        Some("system:serviceaccount:default:bot")
    );
    assert_eq!(row(&rows, "UID"), Some(sa_uid.as_str()));
    assert_eq!(
        row(&rows, "Groups"),
        Some("[system:serviceaccounts system:serviceaccounts:default system:authenticated]")
    );
    assert_eq!(
        row(&rows, "Extra: authentication.kubernetes.io/credential-id"),
        Some(format!("[JTI={jti}]").as_str())
    );
    let ssr = out_json(&k(&bot, &["auth", "whoami", "-o", "json"]).await);
    assert_eq!(ssr["kind"], "SelfSubjectReview");
    assert_eq!(ssr["apiVersion"], "authentication.k8s.io/v1");
    assert!(ssr["metadata"]["creationTimestamp"].is_string());
    assert_eq!(ssr["status"]["userInfo"]["uid"], sa_uid.as_str());

    // --duration and --audience.
    let long = create_token(
        &kc,
        &[
            "bot",
            "--duration",
            "2h",
            "--audience",
            "vault",
            "--audience",
            "api",
        ],
    )
    .await;
    let c = claims(&long);
    assert_eq!(
        c["exp"].as_i64().unwrap() - c["iat"].as_i64().unwrap(),
        7200
    );
    assert_eq!(c["aud"], serde_json::json!(["vault", "api"]));
    // A token for other audiences does not reach the API server.
    let other = token_kubeconfig(dir.path(), &url, "other", &long);
    let out = k(&other, &["auth", "whoami"]).await;
    assert!(!out.ok);
    assert!(out.stderr.contains("Unauthorized"), "{}", out.stderr);

    // Validation as upstream.
    let out = k(&kc, &["create", "token", "bot", "--duration", "1m"]).await;
    assert!(!out.ok);
    assert!(
        out.stderr.contains("spec.expirationSeconds: Invalid value: 60: may not specify a duration less than 10 minutes"),
        "{}",
        out.stderr
    );
    let out = k(&kc, &["create", "token", "nobody"]).await;
    assert!(!out.ok);
    assert!(
        out.stderr.contains("serviceaccounts \"nobody\" not found"),
        "{}",
        out.stderr
    );

    // A tampered token (one character of the payload changed) is refused.
    let mut parts: Vec<String> = token.split('.').map(str::to_owned).collect();
    let mut c = claims(&token);
    c["sub"] = Value::from("system:serviceaccount:kube-system:admin");
    parts[1] = URL_SAFE_NO_PAD.encode(c.to_string());
    let tampered = parts.join(".");
    let bad = token_kubeconfig(dir.path(), &url, "tampered", &tampered);
    let out = k(&bad, &["auth", "whoami"]).await;
    assert!(!out.ok);
    assert!(out.stderr.contains("Unauthorized"), "{}", out.stderr);
    // One character in the middle of the signature changed (the last one's low bits are
    // padding, which Go's decoder, like kumo's, ignores).
    let at = token.len() - 10;
    let mut sig = token.clone();
    let old = sig.remove(at);
    sig.insert(at, if old == 'A' { 'B' } else { 'A' });
    let bad = token_kubeconfig(dir.path(), &url, "badsig", &sig);
    let out = k(&bad, &["get", "pods"]).await;
    assert!(!out.ok);
    assert!(out.stderr.contains("Unauthorized"), "{}", out.stderr);

    // An expired token: the claims of a real one with exp two minutes ago (past go-jose's
    // one-minute leeway), signed by the cluster's own key with openssl (the API's shortest
    // duration is 10 minutes, too long to wait out).
    let mut c = claims(&token);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    c["iat"] = Value::from(now - 3720);
    c["nbf"] = Value::from(now - 3720);
    c["exp"] = Value::from(now - 120);
    let expired = sign_es256(&key, token.split('.').next().unwrap(), &c);
    let bad = token_kubeconfig(dir.path(), &url, "expired", &expired);
    let out = k(&bad, &["get", "pods"]).await;
    assert!(!out.ok);
    assert!(out.stderr.contains("Unauthorized"), "{}", out.stderr);
    let review = format!(
        "apiVersion: authentication.k8s.io/v1\nkind: TokenReview\nspec:\n  token: {expired}\n"
    );
    let tr = out_json(
        &k_in(
            None,
            &kc,
            &["create", "-f", "-", "-o", "json"],
            Some(&review),
        )
        .await,
    );
    assert_eq!(
        tr["status"]["error"], "[invalid bearer token, service account token has expired]",
        "{tr}"
    );
    // The same claims with a current exp, signed the same way, pass: the refusal above is
    // the expiry, not the signing.
    c["exp"] = Value::from(now + 600);
    let fresh = sign_es256(&key, token.split('.').next().unwrap(), &c);
    let good = token_kubeconfig(dir.path(), &url, "resigned", &fresh);
    let out = k(
        &good,
        &[
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.username}",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(out.stdout, "system:serviceaccount:default:bot");

    // TokenReview, as `kubectl create -f` sends it.
    let review = format!(
        "apiVersion: authentication.k8s.io/v1\nkind: TokenReview\nspec:\n  token: {token}\n"
    );
    let out = k_in(
        None,
        &kc,
        &["create", "-f", "-", "-o", "json", "--show-managed-fields"],
        Some(&review),
    )
    .await;
    let tr = out_json(&out);
    assert_eq!(tr["kind"], "TokenReview");
    assert_eq!(tr["status"]["authenticated"], true);
    assert_eq!(
        tr["status"]["user"]["username"],
        "system:serviceaccount:default:bot"
    );
    assert_eq!(tr["status"]["user"]["uid"], sa_uid.as_str());
    assert_eq!(
        tr["status"]["audiences"],
        serde_json::json!(["https://kubernetes.default.svc.cluster.local"])
    );
    assert_eq!(
        tr["status"]["user"]["extra"]["authentication.kubernetes.io/credential-id"],
        serde_json::json!([format!("JTI={jti}")])
    );
    // kubectl create names itself the manager (`fieldManager=kubectl-create`).
    assert_eq!(
        tr["metadata"]["managedFields"][0]["manager"], "kubectl-create",
        "{tr}"
    );
    assert_eq!(
        tr["metadata"]["managedFields"][0]["fieldsV1"],
        serde_json::json!({"f:spec": {"f:token": {}}})
    );
    // ... for another audience, and for a tampered token.
    let review = format!(
        "apiVersion: authentication.k8s.io/v1\nkind: TokenReview\nspec:\n  token: {token}\n  audiences: [other]\n"
    );
    let out = k_in(
        None,
        &kc,
        &["create", "-f", "-", "-o", "yaml"],
        Some(&review),
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let tr: Value = serde_yaml::from_str(&out.stdout).unwrap();
    assert!(
        tr["status"].get("authenticated").is_none(),
        "{}",
        out.stdout
    );
    assert_eq!(
        tr["status"]["error"],
        "[invalid bearer token, token audiences [\"https://kubernetes.default.svc.cluster.local\"] is invalid for the target audiences [\"other\"]]"
    );
    assert_eq!(tr["status"]["user"], serde_json::json!({}));
    let review =
        format!("apiVersion: authentication.k8s.io/v1\nkind: TokenReview\nspec:\n  token: {sig}\n");
    let tr = out_json(
        &k_in(
            None,
            &kc,
            &["create", "-f", "-", "-o", "json"],
            Some(&review),
        )
        .await,
    );
    assert_eq!(
        tr["status"]["error"],
        "[invalid bearer token, go-jose/go-jose: error in cryptographic primitive]"
    );
    let review = "apiVersion: authentication.k8s.io/v1\nkind: TokenReview\nspec:\n  token: abc\n";
    let tr = out_json(
        &k_in(
            None,
            &kc,
            &["create", "-f", "-", "-o", "json"],
            Some(review),
        )
        .await,
    );
    assert_eq!(tr["status"]["error"], "invalid bearer token");
    let review = "apiVersion: authentication.k8s.io/v1\nkind: TokenReview\nspec:\n  token: \"\"\n";
    let out = k_in(None, &kc, &["create", "-f", "-"], Some(review)).await;
    assert!(!out.ok);
    assert!(
        out.stderr
            .contains("token is required for TokenReview in authentication"),
        "{}",
        out.stderr
    );

    // Discovery lists the group and the subresource as upstream.
    let list = out_json(&k(&kc, &["get", "--raw", "/apis/authentication.k8s.io/v1"]).await);
    let names: Vec<&str> = list["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["selfsubjectreviews", "tokenreviews"]);
    for r in list["resources"].as_array().unwrap() {
        assert_eq!(r["verbs"], serde_json::json!(["create"]));
        assert_eq!(r["namespaced"], false);
    }
    let core = out_json(&k(&kc, &["get", "--raw", "/api/v1"]).await);
    let token_sub = core["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "serviceaccounts/token")
        .expect("serviceaccounts/token listed");
    assert_eq!(token_sub["kind"], "TokenRequest");
    assert_eq!(token_sub["group"], "authentication.k8s.io");
    assert_eq!(token_sub["verbs"], serde_json::json!(["create"]));

    // Once the service account is gone, its tokens are too.
    let out = k(&kc, &["delete", "sa", "bot"]).await;
    assert!(out.ok, "{}", out.stderr);
    let out = k(&bot, &["auth", "whoami"]).await;
    assert!(!out.ok);
    assert!(out.stderr.contains("Unauthorized"), "{}", out.stderr);
    // ... and a new account of the same name does not revive them (another uid).
    let out = k(&kc, &["create", "serviceaccount", "bot"]).await;
    assert!(out.ok, "{}", out.stderr);
    let out = k(&bot, &["auth", "whoami"]).await;
    assert!(!out.ok);
    let review = format!(
        "apiVersion: authentication.k8s.io/v1\nkind: TokenReview\nspec:\n  token: {token}\n"
    );
    let tr = out_json(
        &k_in(
            None,
            &kc,
            &["create", "-f", "-", "-o", "json"],
            Some(&review),
        )
        .await,
    );
    let err = tr["status"]["error"].as_str().unwrap();
    assert!(
        err.starts_with("[invalid bearer token, service account UID (")
            && err.ends_with(&format!("does not match claim ({sa_uid})]")),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tokens_bound_to_objects() {
    let (server, dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    let url = server_url(&kc);
    for args in [
        vec!["create", "serviceaccount", "runner"],
        vec!["create", "serviceaccount", "other"],
        vec!["create", "secret", "generic", "s1", "--from-literal=a=b"],
    ] {
        let out = k(&kc, &args).await;
        assert!(out.ok, "{}", out.stderr);
    }
    let pod = "apiVersion: v1
kind: Pod
metadata: {name: p1}
spec:
  serviceAccountName: runner
  automountServiceAccountToken: false
  containers: [{name: c, image: busybox}]
";
    let out = k_in(None, &kc, &["create", "-f", "-"], Some(pod)).await;
    assert!(out.ok, "{}", out.stderr);
    let pod_uid = out_json(&k(&kc, &["get", "pod", "p1", "-o", "json"]).await)["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();

    let token = create_token(
        &kc,
        &[
            "runner",
            "--bound-object-kind",
            "Pod",
            "--bound-object-name",
            "p1",
        ],
    )
    .await;
    let c = claims(&token);
    assert_eq!(c["kubernetes.io"]["pod"]["name"], "p1");
    assert_eq!(c["kubernetes.io"]["pod"]["uid"], pod_uid.as_str());
    let runner = token_kubeconfig(dir.path(), &url, "runner", &token);
    let rows = whoami_rows(&k(&runner, &["auth", "whoami"]).await);
    assert_eq!(
        row(&rows, "Extra: authentication.kubernetes.io/pod-name"),
        Some("[p1]")
    );
    assert_eq!(
        row(&rows, "Extra: authentication.kubernetes.io/pod-uid"),
        Some(format!("[{pod_uid}]").as_str())
    );

    // Upstream's refusals.
    let out = k(
        &kc,
        &[
            "create",
            "token",
            "other",
            "--bound-object-kind",
            "Pod",
            "--bound-object-name",
            "p1",
        ],
    )
    .await;
    assert!(!out.ok);
    assert!(
        out.stderr.contains("cannot bind token for serviceaccount \"other\" to pod running with different serviceaccount name."),
        "{}",
        out.stderr
    );
    let out = k(
        &kc,
        &[
            "create",
            "token",
            "runner",
            "--bound-object-kind",
            "Pod",
            "--bound-object-name",
            "nope",
        ],
    )
    .await;
    assert!(!out.ok);
    assert!(
        out.stderr.contains("pods \"nope\" not found"),
        "{}",
        out.stderr
    );
    let out = k(
        &kc,
        &[
            "create",
            "token",
            "runner",
            "--bound-object-kind",
            "Pod",
            "--bound-object-name",
            "p1",
            "--bound-object-uid",
            "abc",
        ],
    )
    .await;
    assert!(!out.ok);
    assert!(
        out.stderr.contains("Operation cannot be fulfilled on Pod \"p1\": the UID in the bound object reference (abc) does not match the UID in record. The object might have been deleted and then recreated"),
        "{}",
        out.stderr
    );

    // A secret-bound token dies with its secret.
    let secret_token = create_token(
        &kc,
        &[
            "runner",
            "--bound-object-kind",
            "Secret",
            "--bound-object-name",
            "s1",
        ],
    )
    .await;
    assert!(claims(&secret_token)["kubernetes.io"]["secret"]["uid"].is_string());
    let by_secret = token_kubeconfig(dir.path(), &url, "by-secret", &secret_token);
    let out = k(&by_secret, &["auth", "whoami"]).await;
    assert!(out.ok, "{}", out.stderr);
    let out = k(&kc, &["delete", "secret", "s1"]).await;
    assert!(out.ok, "{}", out.stderr);
    let out = k(&by_secret, &["auth", "whoami"]).await;
    assert!(!out.ok);
    assert!(out.stderr.contains("Unauthorized"), "{}", out.stderr);

    // A pod-bound token stops working once the pod is gone.
    let out = k(&kc, &["delete", "pod", "p1", "--grace-period=0", "--force"]).await;
    assert!(out.ok, "{}", out.stderr);
    let out = k(&kc, &["get", "pod", "p1"]).await;
    assert!(!out.ok, "the pod is gone: {}", out.stdout);
    let out = k(&runner, &["auth", "whoami"]).await;
    assert!(!out.ok);
    assert!(out.stderr.contains("Unauthorized"), "{}", out.stderr);
    let review = format!(
        "apiVersion: authentication.k8s.io/v1\nkind: TokenReview\nspec:\n  token: {token}\n"
    );
    let tr = out_json(
        &k_in(
            None,
            &kc,
            &["create", "-f", "-", "-o", "json"],
            Some(&review),
        )
        .await,
    );
    assert_eq!(
        tr["status"]["error"],
        "[invalid bearer token, service account token has been invalidated]"
    );
}

/// A bootstrap token's Secret in kube-system.
fn bootstrap_secret(id: &str, secret: &str, expiration: Option<&str>) -> String {
    let mut s = format!(
        "apiVersion: v1
kind: Secret
metadata:
  name: bootstrap-token-{id}
  namespace: kube-system
type: bootstrap.kubernetes.io/token
stringData:
  token-id: {id}
  token-secret: {secret}
  usage-bootstrap-authentication: \"true\"
  auth-extra-groups: system:bootstrappers:kubeadm:default-node-token
"
    );
    if let Some(e) = expiration {
        s.push_str(&format!("  expiration: \"{e}\"\n"));
    }
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bootstrap_tokens() {
    let (server, dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    let url = server_url(&kc);
    let out = k_in(
        None,
        &kc,
        &["create", "-f", "-"],
        Some(&bootstrap_secret(
            "abcdef",
            "0123456789abcdef",
            Some("2099-01-01T00:00:00Z"),
        )),
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let out = k_in(
        None,
        &kc,
        &["create", "-f", "-"],
        Some(&bootstrap_secret(
            "expird",
            "0123456789abcdef",
            Some("2020-01-01T00:00:00Z"),
        )),
    )
    .await;
    assert!(out.ok, "{}", out.stderr);

    let good = token_kubeconfig(dir.path(), &url, "boot", "abcdef.0123456789abcdef");
    let rows = whoami_rows(&k(&good, &["auth", "whoami"]).await);
    assert_eq!(row(&rows, "Username"), Some("system:bootstrap:abcdef"));
    assert_eq!(
        row(&rows, "Groups"),
        Some("[system:bootstrappers system:bootstrappers:kubeadm:default-node-token system:authenticated]")
    );
    assert_eq!(row(&rows, "UID"), None);

    for (name, token) in [
        ("expired", "expird.0123456789abcdef"),
        ("wrong-secret", "abcdef.0123456789abcdee"),
        ("no-secret", "zzzzzz.0123456789abcdef"),
    ] {
        let kc = token_kubeconfig(dir.path(), &url, name, token);
        let out = k(&kc, &["auth", "whoami"]).await;
        assert!(!out.ok, "{name}");
        assert!(
            out.stderr.contains("Unauthorized"),
            "{name}: {}",
            out.stderr
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn malformed_tokens_get_401() {
    let (server, dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    let url = server_url(&kc);
    let iss = URL_SAFE_NO_PAD
        .encode(r#"{"iss":"https://kubernetes.default.svc.cluster.local","exp":"soon","aud":7}"#);
    let header = URL_SAFE_NO_PAD.encode(r#"{"alg":"ES256"}"#);
    let none = URL_SAFE_NO_PAD.encode(r#"{"alg":"none"}"#);
    let huge = "a".repeat(6_000);
    let tokens = [
        "gärbage-€-ÿ".to_owned(),
        "a.b.c".to_owned(),
        "a.b.c.d".to_owned(),
        "...".to_owned(),
        "!!!.@@@.###".to_owned(),
        format!("{header}.{iss}.AAAA"),
        format!("{none}.{iss}."),
        format!("{header}.{iss}.{}", URL_SAFE_NO_PAD.encode([0u8; 64])),
        format!("{header}.{iss}=.x"),
        "{\"iss\":\"x\"}".to_owned(),
        "abcdef.0123456789abcdef".to_owned(),
        // Large, but within the header limits of HTTP/2 clients and servers.
        format!("{header}.{huge}.{huge}"),
    ];
    for t in &tokens {
        let (code, body) =
            tokio::task::block_in_place(|| curl_bearer(dir.path(), &url, "/api/v1/namespaces", t));
        assert_eq!(code, "401", "{t:.40}: {body}");
        let status: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(status["reason"], "Unauthorized");
    }
    // Still serving.
    let out = k(&kc, &["get", "ns", "default"]).await;
    assert!(out.ok, "{}", out.stderr);
}
