//! The PKI and kubeconfigs kumo writes at first start (kubeadm's layout, modes and
//! identities), `kumo certs` (check-expiration's table, renewal that keeps the CA), the
//! audit log driven by the real kubectl, and the TLS listener (no plain HTTP, no TLS 1.1).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use common::{k, out_json, start};
use kumo_apiserver::pki;
use kumo_apiserver::{ApiServer, ApiServerConfig};

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

fn serial(pem_path: &Path) -> Vec<u8> {
    pki::cert_info(&std::fs::read_to_string(pem_path).unwrap())
        .unwrap()
        .serial
}

fn kubeconfig_serial(path: &Path) -> Vec<u8> {
    pki::cert_info(&pki::kubeconfig_cert(path).unwrap())
        .unwrap()
        .serial
}

/// Every certificate's serial, by kumo certs name.
fn serials(dir: &Path) -> BTreeMap<&'static str, Vec<u8>> {
    pki::managed()
        .iter()
        .map(|m| {
            let s = if m.name.ends_with(".conf") {
                kubeconfig_serial(&dir.join(m.name))
            } else {
                serial(&dir.join("pki").join(format!("{}.crt", m.name)))
            };
            (m.name, s)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layout_modes_sans_and_identities() {
    let (server, dir) = start().await;
    let d = dir.path();
    let pki_dir = d.join("pki");
    for name in [
        "ca",
        "apiserver",
        "apiserver-kubelet-client",
        "front-proxy-ca",
        "front-proxy-client",
    ] {
        assert_eq!(
            mode(&pki_dir.join(format!("{name}.crt"))),
            0o644,
            "{name}.crt"
        );
        assert_eq!(
            mode(&pki_dir.join(format!("{name}.key"))),
            0o600,
            "{name}.key"
        );
    }
    // Every key in pki/, whoever wrote it (sa.key too), is private.
    for e in std::fs::read_dir(&pki_dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "key") {
            assert_eq!(mode(&p), 0o600, "{}", p.display());
        }
    }

    let apiserver = std::fs::read_to_string(pki_dir.join("apiserver.crt")).unwrap();
    let info = pki::cert_info(&apiserver).unwrap().params;
    assert_eq!(info.common_name, "kube-apiserver");
    assert!(info.server_auth && !info.client_auth);
    for dns in [
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    ] {
        assert!(
            info.dns_names.iter().any(|d| d == dns),
            "SAN {dns}: {info:?}"
        );
    }
    for ip in ["127.0.0.1", "10.96.0.1"] {
        assert!(info.ips.contains(&ip.parse().unwrap()), "SAN {ip}");
    }

    let kubelet_client =
        std::fs::read_to_string(pki_dir.join("apiserver-kubelet-client.crt")).unwrap();
    let p = pki::cert_info(&kubelet_client).unwrap().params;
    assert_eq!(p.common_name, "kube-apiserver-kubelet-client");
    assert_eq!(p.organizations, vec!["kubeadm:cluster-admins"]);
    let ca = pki::Ca::load(&pki_dir, "ca").unwrap().unwrap();
    let fp_ca = pki::Ca::load(&pki_dir, "front-proxy-ca").unwrap().unwrap();
    let fp_client = std::fs::read_to_string(pki_dir.join("front-proxy-client.crt")).unwrap();
    assert!(fp_ca.verifies(&fp_client) && !ca.verifies(&fp_client));
    assert!(ca.verifies(&apiserver) && ca.verifies(&kubelet_client));

    // Each kubeconfig is its identity, as the server sees it (SelfSubjectReview).
    let cases = [
        (
            "admin.conf",
            "kubernetes-admin",
            vec!["kubeadm:cluster-admins"],
        ),
        (
            "super-admin.conf",
            "kubernetes-super-admin",
            vec!["system:masters"],
        ),
        (
            "controller-manager.conf",
            "system:kube-controller-manager",
            vec![],
        ),
        ("scheduler.conf", "system:kube-scheduler", vec![]),
        (
            "cloud-controller-manager.conf",
            "system:cloud-controller-manager",
            vec![],
        ),
    ];
    for (file, user, groups) in cases {
        let kc = d.join(file);
        assert_eq!(mode(&kc), 0o600, "{file}");
        let who = out_json(&k(&kc, &["auth", "whoami", "-o", "json"]).await);
        let info = &who["status"]["userInfo"];
        assert_eq!(info["username"], user, "{file}");
        let mut want: Vec<&str> = groups;
        want.push("system:authenticated");
        assert_eq!(info["groups"], serde_json::json!(want), "{file}");
    }

    // A kubelet's kubeconfig, issued on demand.
    let server_url = format!("https://{}", server.local_addr);
    let kc = pki::kubelet_kubeconfig(d, "node-a", &server_url).unwrap();
    assert_eq!(kc, d.join("kubelets/node-a.conf"));
    assert_eq!(mode(&kc), 0o600);
    let who = out_json(&k(&kc, &["auth", "whoami", "-o", "json"]).await);
    assert_eq!(who["status"]["userInfo"]["username"], "system:node:node-a");
    assert_eq!(
        who["status"]["userInfo"]["groups"],
        serde_json::json!(["system:nodes", "system:authenticated"])
    );
}

#[test]
fn restart_reuses_files_and_the_serving_certificate_follows_the_flags() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (dns, ips) = pki::apiserver_sans(None, Ipv4Addr::LOCALHOST.into());
    pki::ensure(d, "https://127.0.0.1:6443", &dns, &ips).unwrap();
    let before = serials(d);
    let ca = std::fs::read(d.join("pki/ca.crt")).unwrap();

    // Same flags, another port: nothing is reissued, the kubeconfigs point at the port.
    pki::ensure(d, "https://127.0.0.1:7443", &dns, &ips).unwrap();
    assert_eq!(serials(d), before);
    let admin = std::fs::read_to_string(d.join("admin.conf")).unwrap();
    assert!(
        admin.contains("server: https://127.0.0.1:7443\n"),
        "{admin}"
    );

    // A new --advertise-address: only the serving certificate changes.
    let advertised: IpAddr = "192.0.2.10".parse().unwrap();
    let (dns2, ips2) = pki::apiserver_sans(Some(advertised), Ipv4Addr::LOCALHOST.into());
    pki::ensure(d, "https://192.0.2.10:6443", &dns2, &ips2).unwrap();
    let after = serials(d);
    for (name, s) in &after {
        assert_eq!(s != &before[name], *name == "apiserver", "{name}");
    }
    let crt = std::fs::read_to_string(d.join("pki/apiserver.crt")).unwrap();
    assert!(pki::cert_info(&crt)
        .unwrap()
        .params
        .ips
        .contains(&advertised));
    assert_eq!(std::fs::read(d.join("pki/ca.crt")).unwrap(), ca);

    // A certificate the CA did not sign is replaced.
    let other = tempfile::tempdir().unwrap();
    let foreign = pki::Ca::load_or_create(other.path())
        .unwrap()
        .issue_client("x", &[])
        .unwrap();
    std::fs::write(d.join("pki/front-proxy-client.crt"), &foreign.cert_pem).unwrap();
    pki::ensure(d, "https://192.0.2.10:6443", &dns2, &ips2).unwrap();
    let fp = std::fs::read_to_string(d.join("pki/front-proxy-client.crt")).unwrap();
    let fp_ca = pki::Ca::load(&d.join("pki"), "front-proxy-ca")
        .unwrap()
        .unwrap();
    assert!(fp_ca.verifies(&fp));
    assert_eq!(
        pki::cert_info(&fp).unwrap().params.common_name,
        "front-proxy-client"
    );
}

#[test]
fn check_expiration_prints_kubeadms_tables() {
    let dir = tempfile::tempdir().unwrap();
    let (dns, ips) = pki::apiserver_sans(None, Ipv4Addr::LOCALHOST.into());
    pki::ensure(dir.path(), "https://127.0.0.1:6443", &dns, &ips).unwrap();
    let out = pki::check_expiration(dir.path()).unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 1 + 8 + 1 + 1 + 2, "{out}");
    let header = lines[0];
    assert!(
        header.starts_with("CERTIFICATE                     EXPIRES                  RESIDUAL TIME   CERTIFICATE AUTHORITY   EXTERNALLY MANAGED"),
        "{out}"
    );
    let names: Vec<&str> = lines[1..9]
        .iter()
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "admin.conf",
            "apiserver",
            "apiserver-kubelet-client",
            "cloud-controller-manager.conf",
            "controller-manager.conf",
            "front-proxy-client",
            "scheduler.conf",
            "super-admin.conf"
        ]
    );
    // Columns line up under the header; expiry like "Dec 03, 2027 03:27 UTC".
    let col = |h: &str| header.find(h).unwrap();
    for l in &lines[1..9] {
        let expires = &l[col("EXPIRES")..col("RESIDUAL TIME")];
        assert!(expires.trim_end().ends_with(" UTC"), "{l}");
        assert_eq!(
            expires.trim_end().len(),
            "Jan 02, 2006 15:04 UTC".len(),
            "{l}"
        );
        assert_eq!(
            l[col("RESIDUAL TIME")..].split_whitespace().next(),
            Some("364d")
        );
        let ca = l[col("CERTIFICATE AUTHORITY")..].split_whitespace().next();
        let want = if l.starts_with("front-proxy-client") {
            "front-proxy-ca"
        } else {
            "ca"
        };
        assert_eq!(ca, Some(want), "{l}");
        assert!(l.ends_with("no      "), "{l:?}");
    }
    assert_eq!(lines[9], "");
    assert_eq!(
        lines[10],
        "CERTIFICATE AUTHORITY   EXPIRES                  RESIDUAL TIME   EXTERNALLY MANAGED"
    );
    assert!(lines[11].starts_with("ca      "), "{out}");
    assert!(lines[11].contains("   9y   "), "{out}");
    assert!(lines[12].starts_with("front-proxy-ca   "), "{out}");

    // Without the CA key the CA is externally managed, and renewal says so.
    std::fs::remove_file(dir.path().join("pki/ca.key")).unwrap();
    let out = pki::check_expiration(dir.path()).unwrap();
    assert!(out.lines().nth(1).unwrap().ends_with("yes     "), "{out}");
    assert_eq!(
        pki::renew(dir.path(), "apiserver").unwrap(),
        "Detected external ca, certificate for serving the Kubernetes API can't be renewed"
    );
    std::fs::remove_file(dir.path().join("scheduler.conf")).unwrap();
    let out = pki::check_expiration(dir.path()).unwrap();
    assert!(out.contains("\n!MISSING! scheduler.conf"), "{out}");
    assert!(pki::renew(dir.path(), "etcd-server").is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_all_keeps_the_ca_and_kubectl_keeps_working() {
    let (server, dir) = start().await;
    let d = dir.path();
    let before = serials(d);
    assert_eq!(
        served_serial(&server.local_addr, &d.join("pki/ca.crt")),
        before["apiserver"]
    );
    let ca = std::fs::read(d.join("pki/ca.crt")).unwrap();
    let subject = |name: &str| {
        let pem = if name.ends_with(".conf") {
            pki::kubeconfig_cert(&d.join(name)).unwrap()
        } else {
            std::fs::read_to_string(d.join("pki").join(format!("{name}.crt"))).unwrap()
        };
        pki::cert_info(&pem).unwrap().params
    };
    let params_before: Vec<_> = pki::managed().iter().map(|m| subject(m.name)).collect();
    let admin_before = std::fs::read_to_string(d.join("admin.conf")).unwrap();

    let mut lines = Vec::new();
    for m in pki::managed() {
        lines.push(pki::renew(d, m.name).unwrap());
    }
    assert_eq!(
        lines[0],
        "certificate embedded in the kubeconfig file for the admin to use and for kubeadm itself renewed"
    );
    assert!(lines.contains(&"certificate for the API server to connect to kubelet renewed".into()));

    let after = serials(d);
    for (name, s) in &after {
        assert_ne!(s, &before[name], "{name} was not renewed");
    }
    assert_eq!(std::fs::read(d.join("pki/ca.crt")).unwrap(), ca);
    let params_after: Vec<_> = pki::managed().iter().map(|m| subject(m.name)).collect();
    assert_eq!(params_after, params_before);
    for e in std::fs::read_dir(d.join("pki")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "key") {
            assert_eq!(mode(&p), 0o600, "{}", p.display());
        }
    }
    // Only the embedded certificate and key changed in the kubeconfig.
    let admin_after = std::fs::read_to_string(d.join("admin.conf")).unwrap();
    let changed: Vec<(&str, &str)> = admin_before
        .lines()
        .zip(admin_after.lines())
        .filter(|(a, b)| a != b)
        .collect();
    assert_eq!(changed.len(), 2, "{changed:?}");
    assert!(changed[0]
        .0
        .trim_start()
        .starts_with("client-certificate-data:"));
    assert!(changed[1].0.trim_start().starts_with("client-key-data:"));

    // The running server serves the renewed certificate (it follows the files).
    let mut served = Vec::new();
    for _ in 0..40 {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        served = served_serial(&server.local_addr, &d.join("pki/ca.crt"));
        if served == after["apiserver"] {
            break;
        }
    }
    assert_eq!(
        served, after["apiserver"],
        "renewed serving certificate not served"
    );

    // The renewed admin.conf still works against the running server (same CA).
    let out = k(
        &d.join("admin.conf"),
        &["get", "namespace", "default", "-o", "name"],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(out.stdout.trim(), "namespace/default");
    let who = out_json(
        &k(
            &d.join("super-admin.conf"),
            &["auth", "whoami", "-o", "json"],
        )
        .await,
    );
    assert_eq!(
        who["status"]["userInfo"]["username"],
        "kubernetes-super-admin"
    );
}

/// The serial of the certificate the server at `addr` presents.
fn served_serial(addr: &SocketAddr, ca: &Path) -> Vec<u8> {
    let out = Command::new("openssl")
        .args(["s_client", "-connect", &addr.to_string(), "-CAfile"])
        .arg(ca)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("openssl runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let begin = text
        .find("-----BEGIN CERTIFICATE-----")
        .expect("a certificate");
    let end = text
        .find("-----END CERTIFICATE-----")
        .expect("a certificate")
        + 25;
    pki::cert_info(&text[begin..end]).expect("parses").serial
}

/// Audit events of `path`, one JSON object per line.
fn audit_events(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON event per line"))
        .collect()
}

fn curl(args: &[&str]) -> String {
    let out = Command::new("curl").args(args).output().expect("curl runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_log_of_kubectl_requests() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("audit-policy.yaml");
    std::fs::write(
        &policy,
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n\
         - level: None\n  users: [system:kube-scheduler]\n\
         - level: None\n  nonResourceURLs: [/version, /api, /apis, /openapi/*]\n\
         - level: Metadata\n",
    )
    .unwrap();
    let log = dir.path().join("logs/audit.log");
    let mut cfg = ApiServerConfig::new(dir.path().join("data"));
    cfg.bind = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
    cfg.audit_policy_file = Some(policy);
    cfg.audit_log_path = Some(log.clone());
    let server = ApiServer::start(cfg).await.unwrap();
    let admin = server.admin_kubeconfig.clone();
    let data = dir.path().join("data");

    let out = k(
        &admin,
        &["create", "configmap", "audited", "--from-literal=a=b"],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let out = k(&admin, &["get", "configmap", "audited", "-o", "json"]).await;
    assert!(out.ok, "{}", out.stderr);
    let out = k(&data.join("scheduler.conf"), &["get", "namespaces"]).await;
    assert!(out.ok, "{}", out.stderr);
    // Refused by authentication: audited with an empty user, like upstream.
    let url = format!(
        "https://{}/api/v1/namespaces/default/pods",
        server.local_addr
    );
    let ca = data.join("pki/ca.crt");
    let headers = curl(&[
        "-s",
        "-o",
        "/dev/null",
        "-D",
        "-",
        "--cacert",
        ca.to_str().unwrap(),
        "-H",
        "Authorization: Bearer not-a-token",
        &url,
    ]);
    let refused_id = headers
        .lines()
        .find_map(|l| l.strip_prefix("audit-id: "))
        .expect("Audit-Id header")
        .trim()
        .to_owned();
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;

    let events = audit_events(&log);
    assert!(!events.is_empty());
    for e in &events {
        assert_eq!(e["apiVersion"], "audit.k8s.io/v1");
        assert_eq!(e["kind"], "Event");
        assert_ne!(e["stage"], "RequestReceived", "omitted stage: {e}");
        assert_ne!(
            e["user"]["username"], "system:kube-scheduler",
            "None rule: {e}"
        );
        assert_ne!(e["requestURI"], "/version?timeout=32s", "None rule: {e}");
        assert!(e.get("requestObject").is_none() && e.get("responseObject").is_none());
        assert_eq!(
            uuid::Uuid::parse_str(e["auditID"].as_str().unwrap())
                .unwrap()
                .to_string(),
            e["auditID"]
        );
    }
    let create = events
        .iter()
        .find(|e| e["verb"] == "create" && e["objectRef"]["resource"] == "configmaps")
        .expect("create event");
    assert_eq!(create["level"], "Metadata");
    assert_eq!(create["stage"], "ResponseComplete");
    assert_eq!(create["user"]["username"], "kubernetes-admin");
    assert_eq!(
        create["user"]["groups"],
        serde_json::json!(["kubeadm:cluster-admins", "system:authenticated"])
    );
    assert_eq!(create["sourceIPs"], serde_json::json!(["127.0.0.1"]));
    assert!(create["userAgent"]
        .as_str()
        .unwrap()
        .starts_with("kubectl/"));
    assert_eq!(
        create["objectRef"],
        serde_json::json!({"resource": "configmaps", "namespace": "default",
            "name": "audited", "apiVersion": "v1"})
    );
    assert_eq!(
        create["responseStatus"],
        serde_json::json!({"metadata": {}, "code": 201})
    );
    assert!(create["requestURI"]
        .as_str()
        .unwrap()
        .starts_with("/api/v1/namespaces/default/configmaps?"));
    assert_eq!(
        create["annotations"]["authorization.k8s.io/decision"],
        "allow"
    );
    assert!(create["annotations"]
        .get("authorization.k8s.io/reason")
        .is_some());
    assert!(create["requestReceivedTimestamp"]
        .as_str()
        .unwrap()
        .ends_with('Z'));
    assert!(
        create["stageTimestamp"].as_str().unwrap()
            >= create["requestReceivedTimestamp"].as_str().unwrap()
    );
    let get = events
        .iter()
        .find(|e| e["verb"] == "get" && e["objectRef"]["name"] == "audited")
        .expect("get event");
    assert_eq!(get["responseStatus"]["code"], 200);
    assert_eq!(
        get["requestURI"],
        "/api/v1/namespaces/default/configmaps/audited"
    );

    let refused = events
        .iter()
        .find(|e| e["auditID"] == refused_id.as_str())
        .expect("the 401 is audited under the Audit-Id it answered with");
    assert_eq!(refused["stage"], "ResponseStarted");
    assert_eq!(refused["user"], serde_json::json!({}));
    assert_eq!(refused["verb"], "list");
    assert_eq!(refused["responseStatus"]["code"], 401);
    assert_eq!(refused["responseStatus"]["reason"], "Unauthorized");
    assert!(refused.get("annotations").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_only_1_2_and_1_3_and_no_plain_http() {
    let (server, dir) = start().await;
    let port = server.local_addr.port().to_string();
    let addr = format!("127.0.0.1:{port}");
    let ca = dir.path().join("pki/ca.crt");
    let s_client = |version: &str| {
        let mut child = Command::new("openssl")
            .args(["s_client", "-brief", "-connect", &addr, version, "-CAfile"])
            .arg(&ca)
            // Let the client offer old versions: the refusal must come from the server.
            .args(["-cipher", "DEFAULT@SECLEVEL=0"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("openssl runs");
        let _ = child.stdin.take();
        let out = child.wait_with_output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (ok, text) = s_client("-tls1_1");
    assert!(!ok, "{text}");
    assert!(text.contains("alert"), "the server refuses TLS 1.1: {text}");
    let (ok, text) = s_client("-tls1_2");
    assert!(ok && text.contains("Protocol version: TLSv1.2"), "{text}");
    let (ok, text) = s_client("-tls1_3");
    assert!(ok && text.contains("Protocol version: TLSv1.3"), "{text}");

    // Plain HTTP gets Go's answer, never an API response.
    let plain = curl(&["-s", "-i", &format!("http://{addr}/version")]);
    assert!(plain.starts_with("HTTP/1.0 400 Bad Request"), "{plain}");
    assert!(plain.ends_with("Client sent an HTTP request to an HTTPS server.\n"));

    // Every response has an Audit-Id, even without an audit policy; a client's is kept.
    let url = format!("https://{addr}/healthz");
    let h = curl(&[
        "-s",
        "-o",
        "/dev/null",
        "-D",
        "-",
        "--cacert",
        ca.to_str().unwrap(),
        &url,
    ]);
    let id = h
        .lines()
        .find_map(|l| l.strip_prefix("audit-id: "))
        .expect("Audit-Id");
    assert!(uuid::Uuid::parse_str(id.trim()).is_ok(), "{id}");
    let h = curl(&[
        "-s",
        "-o",
        "/dev/null",
        "-D",
        "-",
        "--cacert",
        ca.to_str().unwrap(),
        "-H",
        "Audit-ID: mine-1",
        &url,
    ]);
    assert!(h.lines().any(|l| l.trim() == "audit-id: mine-1"), "{h}");
}
