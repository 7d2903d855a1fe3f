//! Joining a node with a bootstrap token, as `kubeadm join` does, and the certificates API
//! around it: `kumo kubelet --bootstrap-kubeconfig` posts a CSR as `system:bootstrap:<id>`,
//! the controller-manager's csrapproving approves it after a SubjectAccessReview and
//! csrsigning issues it from the cluster CA, and the kubelet then runs as
//! `system:node:<name>`. Also: a person's certificate through `kubectl certificate approve`,
//! the signer refusing a malformed kubelet request, the admission plugins that guard
//! approval and the system:masters group, and the token cleaner. All with the real kubectl.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use kumo::cluster::{self, ClusterConfig};
use kumo_testkit::kubectl::{eventually, k, k_in, Out};

fn ok(out: Out, what: &str) -> String {
    assert!(out.ok, "{what}: {}", out.stderr);
    out.stdout
}

/// A kubeconfig for `server` trusting `ca_data` (base64) that authenticates with `token`.
fn token_kubeconfig(path: &Path, server: &str, ca_data: &str, token: &str) {
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: kubernetes\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca_data}\nusers:\n- name: tls-bootstrap-token-user\n  user:\n    token: {token}\ncontexts:\n- name: tls-bootstrap-token-user@kubernetes\n  context:\n    cluster: kubernetes\n    user: tls-bootstrap-token-user\ncurrent-context: tls-bootstrap-token-user@kubernetes\n"
    );
    std::fs::write(path, text).unwrap();
}

/// `openssl req`: a new P-256 key in `dir/<name>.key` and the PEM CSR for `subject`.
fn openssl_csr(dir: &Path, name: &str, subject: &str) -> String {
    let key = dir.join(format!("{name}.key"));
    let csr = dir.join(format!("{name}.csr"));
    let out = std::process::Command::new("openssl")
        .args([
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ])
        .args(["-nodes", "-subj", subject, "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&csr)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read_to_string(csr).unwrap()
}

fn b64(data: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(data)
}

fn csr_manifest(name: &str, pem: &str, signer: &str, usages: &[&str]) -> String {
    format!(
        "apiVersion: certificates.k8s.io/v1\nkind: CertificateSigningRequest\nmetadata:\n  name: {name}\nspec:\n  request: {}\n  signerName: {signer}\n  expirationSeconds: 86400\n  usages: [{}]\n",
        b64(pem.as_bytes()),
        usages.iter().map(|u| format!("\"{u}\"")).collect::<Vec<_>>().join(", ")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_joins_with_a_bootstrap_token() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut cfg = ClusterConfig::new(dir.join("cluster"));
    cfg.port = 0;
    cfg.scheduler = false;
    cfg.kubelet = false;
    let c = cluster::start(cfg).await.expect("cluster starts");
    let admin = c.api.admin_kubeconfig.clone();

    // kubeadm token create: a bootstrap token in kube-system.
    let expires = (k8s_openapi::jiff::Timestamp::now()
        + k8s_openapi::jiff::SignedDuration::from_hours(1))
    .strftime("%Y-%m-%dT%H:%M:%SZ")
    .to_string();
    ok(
        k(
            &admin,
            &[
                "create",
                "secret",
                "generic",
                "bootstrap-token-abcdef",
                "-n",
                "kube-system",
                "--type",
                "bootstrap.kubernetes.io/token",
                "--from-literal",
                "token-id=abcdef",
                "--from-literal",
                "token-secret=0123456789abcdef",
                "--from-literal",
                "usage-bootstrap-authentication=true",
                "--from-literal",
                "usage-bootstrap-signing=true",
                "--from-literal",
                "auth-extra-groups=system:bootstrappers:kubeadm:default-node-token",
                "--from-literal",
                &format!("expiration={expires}"),
            ],
        )
        .await,
        "token",
    );
    let server = ok(
        k(
            &admin,
            &[
                "config",
                "view",
                "--raw",
                "-o",
                "jsonpath={.clusters[0].cluster.server}",
            ],
        )
        .await,
        "server",
    );
    let ca = ok(
        k(
            &admin,
            &[
                "config",
                "view",
                "--raw",
                "-o",
                "jsonpath={.clusters[0].cluster.certificate-authority-data}",
            ],
        )
        .await,
        "ca",
    );
    let boot = dir.join("bootstrap-kubelet.conf");
    token_kubeconfig(&boot, &server, &ca, "abcdef.0123456789abcdef");
    let who = ok(
        k(
            &boot,
            &[
                "auth",
                "whoami",
                "-o",
                "jsonpath={.status.userInfo.username}",
            ],
        )
        .await,
        "whoami",
    );
    assert_eq!(who, "system:bootstrap:abcdef");

    // kubeadm join: the kubelet bootstraps its client certificate.
    let kubelet_conf = dir.join("kubelet.conf");
    let cert_dir = dir.join("pki");
    let mut kubelet = tokio::process::Command::new(env!("CARGO_BIN_EXE_kumo"))
        .arg("kubelet")
        .arg("--bootstrap-kubeconfig")
        .arg(&boot)
        .arg("--kubeconfig")
        .arg(&kubelet_conf)
        .arg("--cert-dir")
        .arg(&cert_dir)
        .args([
            "--hostname-override",
            "joiner",
            "--port",
            "0",
            "--address",
            "127.0.0.1",
        ])
        .kill_on_drop(true)
        .env("RUST_LOG", "info")
        .stdout(std::fs::File::create(dir.join("kubelet.log")).unwrap())
        .stderr(std::fs::File::create(dir.join("kubelet.err")).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let node = loop {
        let out = k(&admin, &["get", "node", "joiner", "-o", "json"]).await;
        if out.ok {
            break serde_json::from_str::<serde_json::Value>(&out.stdout).unwrap();
        }
        if Instant::now() > deadline || kubelet.try_wait().unwrap().is_some() {
            let csrs = k(&admin, &["get", "csr", "-o", "yaml"]).await.stdout;
            panic!(
                "no node joiner; kubelet: {}\n{}\nCSRs: {csrs}",
                std::fs::read_to_string(dir.join("kubelet.log")).unwrap_or_default(),
                std::fs::read_to_string(dir.join("kubelet.err")).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert_eq!(node["metadata"]["name"], "joiner");
    if let Ok(Some(status)) = kubelet.try_wait() {
        panic!("the kubelet exited: {status}");
    }

    // The request, as `kubectl get csr` shows it.
    let csrs = ok(k(&admin, &["get", "csr"]).await, "get csr");
    let lines: Vec<Vec<&str>> = csrs
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        lines[0],
        [
            "NAME",
            "AGE",
            "SIGNERNAME",
            "REQUESTOR",
            "REQUESTEDDURATION",
            "CONDITION"
        ]
    );
    let row = lines
        .iter()
        .find(|r| r[0].starts_with("node-csr-"))
        .unwrap_or_else(|| panic!("{csrs}"));
    assert_eq!(
        row[2..],
        [
            "kubernetes.io/kube-apiserver-client-kubelet",
            "system:bootstrap:abcdef",
            "<none>",
            "Approved,Issued"
        ]
    );
    let approved = ok(
        k(
            &admin,
            &[
                "get",
                "csr",
                row[0],
                "-o",
                "jsonpath={.status.conditions[0].reason}: {.status.conditions[0].message}",
            ],
        )
        .await,
        "conditions",
    );
    assert_eq!(
        approved,
        "AutoApproved: Auto approving kubelet client certificate after SubjectAccessReview."
    );

    // The kubelet's kubeconfig, written by it, names it system:node:joiner.
    let whoami = ok(
        k(&kubelet_conf, &["auth", "whoami", "-o", "json"]).await,
        "whoami",
    );
    let v: serde_json::Value = serde_json::from_str(&whoami).unwrap();
    assert_eq!(v["status"]["userInfo"]["username"], "system:node:joiner");
    assert_eq!(
        v["status"]["userInfo"]["groups"],
        serde_json::json!(["system:nodes", "system:authenticated"])
    );
    let current = cert_dir.join("kubelet-client-current.pem");
    assert!(std::fs::symlink_metadata(&current)
        .unwrap()
        .file_type()
        .is_symlink());
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&current).unwrap().permissions().mode() & 0o777,
        0o600
    );
    drop(kubelet);

    // A person's certificate: posted, approved with kubectl, issued, and usable.
    let pem = openssl_csr(dir, "alice", "/CN=alice/O=dev");
    ok(
        k_in(
            &admin,
            &["create", "-f", "-"],
            Some(&csr_manifest(
                "alice",
                &pem,
                "kubernetes.io/kube-apiserver-client",
                &["client auth"],
            )),
        )
        .await,
        "alice csr",
    );
    let pending = ok(
        k(&admin, &["get", "csr", "alice", "--no-headers"]).await,
        "get",
    );
    assert!(
        pending.split_whitespace().any(|w| w == "Pending"),
        "{pending}"
    );
    assert!(pending.contains("24h"), "{pending}");
    assert_eq!(
        ok(
            k(&admin, &["certificate", "approve", "alice"]).await,
            "approve"
        )
        .trim(),
        "certificatesigningrequest.certificates.k8s.io/alice approved"
    );
    let cert = eventually(30, "alice's certificate", || async {
        let out = k(
            &admin,
            &[
                "get",
                "csr",
                "alice",
                "-o",
                "jsonpath={.status.certificate}",
            ],
        )
        .await;
        (out.ok && !out.stdout.is_empty()).then_some(out.stdout)
    })
    .await;
    std::fs::write(dir.join("alice.crt.b64"), &cert).unwrap();
    let alice_conf = dir.join("alice.conf");
    std::fs::write(
        &alice_conf,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: k\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: alice\n  user:\n    client-certificate-data: {cert}\n    client-key-data: {}\ncontexts:\n- name: alice\n  context: {{cluster: k, user: alice}}\ncurrent-context: alice\n",
            b64(&std::fs::read(dir.join("alice.key")).unwrap())
        ),
    )
    .unwrap();
    let whoami = ok(
        k(&alice_conf, &["auth", "whoami", "-o", "json"]).await,
        "alice whoami",
    );
    let v: serde_json::Value = serde_json::from_str(&whoami).unwrap();
    assert_eq!(v["status"]["userInfo"]["username"], "alice");
    assert_eq!(
        v["status"]["userInfo"]["groups"],
        serde_json::json!(["dev", "system:authenticated"])
    );

    // The kubelet signer refuses a request that is no node's, once someone approves it.
    let pem = openssl_csr(dir, "fake", "/CN=system:node:fake/O=other");
    ok(
        k_in(
            &admin,
            &["create", "-f", "-"],
            Some(&csr_manifest(
                "fake",
                &pem,
                "kubernetes.io/kube-apiserver-client-kubelet",
                &["digital signature", "client auth"],
            )),
        )
        .await,
        "fake csr",
    );
    ok(
        k(&admin, &["certificate", "approve", "fake"]).await,
        "approve fake",
    );
    let failed = eventually(30, "the Failed condition", || async {
        let out = k(
            &admin,
            &[
                "get",
                "csr",
                "fake",
                "-o",
                "jsonpath={range .status.conditions[*]}{.type}/{.reason}/{.message};{end}",
            ],
        )
        .await;
        (out.ok && out.stdout.contains("Failed")).then_some(out.stdout)
    })
    .await;
    assert!(
        failed.contains("Failed/SignerValidationFailure/subject organization is not system:nodes;"),
        "{failed}"
    );
    let row = ok(
        k(&admin, &["get", "csr", "fake", "--no-headers"]).await,
        "get fake",
    );
    assert!(row.trim_end().ends_with("Approved,Failed"), "{row}");

    // Admission: nobody gets a system:masters certificate from the client signer...
    let pem = openssl_csr(dir, "root", "/CN=mallory/O=system:masters");
    let out = k_in(
        &admin,
        &["create", "-f", "-"],
        Some(&csr_manifest(
            "root",
            &pem,
            "kubernetes.io/kube-apiserver-client",
            &["client auth"],
        )),
    )
    .await;
    assert!(!out.ok);
    assert!(
        out.stderr.contains(
            "certificatesigningrequests.certificates.k8s.io \"root\" is forbidden: use of kubernetes.io/kube-apiserver-client signer with system:masters group is not allowed"
        ),
        "{}",
        out.stderr
    );
    // ...and updating /approval is not enough to approve: the signer must be approvable.
    ok(
        k_in(
            &admin,
            &["apply", "-f", "-"],
            Some(
                "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: csr-updater\nrules:\n- apiGroups: [certificates.k8s.io]\n  resources: [certificatesigningrequests, certificatesigningrequests/approval]\n  verbs: [get, list, update]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: jane-csr-updater\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: csr-updater}\nsubjects:\n- {apiGroup: rbac.authorization.k8s.io, kind: User, name: jane}\n",
            ),
        )
        .await,
        "rbac",
    );
    let pem = openssl_csr(dir, "bob", "/CN=bob");
    ok(
        k_in(
            &admin,
            &["create", "-f", "-"],
            Some(&csr_manifest(
                "bob",
                &pem,
                "example.com/signer",
                &["client auth"],
            )),
        )
        .await,
        "bob csr",
    );
    // (RBAC follows its objects by watch: wait until jane's update gets that far.)
    let refused = eventually(10, "jane refused by CertificateApproval", || async {
        let out = k(&admin, &["certificate", "approve", "bob", "--as", "jane"]).await;
        assert!(!out.ok, "jane approved bob");
        (!out.stderr.contains("cannot update resource")).then_some(out.stderr)
    })
    .await;
    assert!(
        refused.contains(
            "certificatesigningrequests.certificates.k8s.io \"bob\" is forbidden: user not permitted to approve requests with signerName \"example.com/signer\""
        ),
        "{refused}"
    );
    // With `approve` on the signer's domain, jane may.
    ok(
        k_in(
            &admin,
            &["apply", "-f", "-"],
            Some(
                "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: example-approver\nrules:\n- apiGroups: [certificates.k8s.io]\n  resources: [signers]\n  resourceNames: [\"example.com/*\"]\n  verbs: [approve]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: jane-example-approver\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: example-approver}\nsubjects:\n- {apiGroup: rbac.authorization.k8s.io, kind: User, name: jane}\n",
            ),
        )
        .await,
        "rbac",
    );
    eventually(10, "jane approves bob", || async {
        k(&admin, &["certificate", "approve", "bob", "--as", "jane"])
            .await
            .ok
            .then_some(())
    })
    .await;
    let requestor = ok(
        k(
            &admin,
            &["get", "csr", "bob", "-o", "jsonpath={.spec.username}"],
        )
        .await,
        "bob",
    );
    assert_eq!(requestor, "kubernetes-admin");

    // The token cleaner deletes an expired bootstrap token.
    ok(
        k(
            &admin,
            &[
                "create",
                "secret",
                "generic",
                "bootstrap-token-oldold",
                "-n",
                "kube-system",
                "--type",
                "bootstrap.kubernetes.io/token",
                "--from-literal",
                "token-id=oldold",
                "--from-literal",
                "token-secret=0123456789abcdef",
                "--from-literal",
                "expiration=2020-01-01T00:00:00Z",
            ],
        )
        .await,
        "old token",
    );
    eventually(30, "the expired token deleted", || async {
        let out = k(
            &admin,
            &[
                "get",
                "secret",
                "-n",
                "kube-system",
                "bootstrap-token-oldold",
            ],
        )
        .await;
        (!out.ok && out.stderr.contains("NotFound")).then_some(())
    })
    .await;
    assert!(
        k(
            &admin,
            &[
                "get",
                "secret",
                "-n",
                "kube-system",
                "bootstrap-token-abcdef"
            ]
        )
        .await
        .ok
    );
}
