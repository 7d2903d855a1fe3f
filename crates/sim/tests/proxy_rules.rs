//! kumo-proxy programming the simulated data plane, against an in-process API server,
//! with kube-proxy's own identity
//! (`system:kube-proxy`, bound to `system:node-proxier` by the bootstrap policy): what it
//! programs for ClusterIP, NodePort (cluster and Local traffic policy), LoadBalancer,
//! headless and ExternalName Services as objects are made with the real kubectl, and
//! what it takes away.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kumo_apiserver::{pki, ApiServer, ApiServerConfig};
use kumo_sim::dns::QType;
use kumo_sim::net::{ConnectError, Dataplane, Protocol, ServiceEntry};

fn kubectl(kc: &Path, args: &[&str], stdin: &str) {
    use std::io::Write;
    let mut child = Command::new("kubectl")
        .args(args)
        .env("KUBECONFIG", kc)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

async fn apply(kc: &Path, yaml: &str) {
    let kc = kc.to_owned();
    let yaml = yaml.to_owned();
    tokio::task::spawn_blocking(move || {
        kubectl(&kc, &["apply", "--server-side", "-f", "-"], &yaml)
    })
    .await
    .unwrap();
}

async fn delete(kc: &Path, what: &[&str]) {
    let kc = kc.to_owned();
    let mut args = vec!["delete".to_owned()];
    args.extend(what.iter().map(|s| s.to_string()));
    tokio::task::spawn_blocking(move || {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        kubectl(&kc, &a, "")
    })
    .await
    .unwrap();
}

/// Waits until `ok` holds for Service `key`'s entry (None: not programmed).
async fn until(
    dp: &Dataplane,
    key: &str,
    what: &str,
    ok: impl Fn(Option<&ServiceEntry>) -> bool,
) -> Option<ServiceEntry> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let e = dp.service(key);
        if ok(e.as_ref()) {
            return e;
        }
        assert!(Instant::now() < deadline, "{what}: {e:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

const NODES: &str = r#"
apiVersion: v1
kind: Node
metadata: {name: n1}
status:
  addresses: [{type: InternalIP, address: 10.0.1.11}, {type: Hostname, address: n1}]
---
apiVersion: v1
kind: Node
metadata: {name: n2}
status:
  addresses: [{type: InternalIP, address: 10.0.1.12}, {type: Hostname, address: n2}]
"#;

fn slice(
    name: &str,
    svc: &str,
    ns: &str,
    port_name: &str,
    port: u16,
    eps: &[(&str, &str, bool)],
) -> String {
    let endpoints: Vec<String> = eps
        .iter()
        .map(|(ip, node, ready)| {
            format!(
                "  - addresses: [{ip}]\n    nodeName: {node}\n    conditions: {{ready: {ready}}}\n"
            )
        })
        .collect();
    format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}\n  namespace: {ns}\n  labels: {{kubernetes.io/service-name: {svc}}}\naddressType: IPv4\nports:\n- name: \"{port_name}\"\n  port: {port}\n  protocol: TCP\nendpoints:\n{}",
        endpoints.concat()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn programs_services_from_watches_as_kube_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = ApiServerConfig::new(dir.path());
    cfg.bind = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
    let server = ApiServer::start(cfg).await.unwrap();
    let admin = server.admin_kubeconfig.clone();
    let url = std::fs::read_to_string(&admin)
        .unwrap()
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: ").map(str::to_owned))
        .unwrap();
    // kube-proxy's own kubeconfig, and nothing else: a missing permission would stall it.
    let kp = pki::kube_proxy_kubeconfig(dir.path(), &url).unwrap();
    let dp = Dataplane::new();
    let config = kumo_client::clients::config_from_kubeconfig(&kp)
        .await
        .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    let proxy = kumo_proxy::Proxy::start(client, dp.clone());
    tokio::time::timeout(Duration::from_secs(20), proxy.wait_synced())
        .await
        .expect("kube-proxy lists Services, EndpointSlices and Nodes");

    apply(&admin, NODES).await;
    apply(
        &admin,
        "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: default}\nspec:\n  type: NodePort\n  clusterIP: 10.96.0.50\n  selector: {app: web}\n  ports:\n  - {name: http, port: 80, targetPort: 8080, nodePort: 30080}\n",
    )
    .await;
    // Programmed at once, rejecting until there are endpoints.
    let e = until(&dp, "default/web", "web programmed", |e| {
        e.is_some_and(|e| e.rules.len() == 3)
    })
    .await
    .unwrap();
    // Its DNS records: A and PTR for the ClusterIP, SRV for the named port.
    let texts = |name: &str, q: QType| -> Vec<String> {
        dp.answer(name, q)
            .records
            .iter()
            .map(|r| r.data.text())
            .collect()
    };
    assert_eq!(
        texts("web.default.svc.cluster.local", QType::A),
        ["10.96.0.50"]
    );
    assert_eq!(
        texts("50.0.96.10.in-addr.arpa", QType::Ptr),
        ["web.default.svc.cluster.local."]
    );
    assert_eq!(
        texts("_http._tcp.web.default.svc.cluster.local", QType::Srv),
        ["0 100 80 web.default.svc.cluster.local."]
    );
    assert!(e
        .rules
        .iter()
        .all(|r| r.endpoints.is_empty() && r.protocol == Protocol::Tcp));
    assert_eq!(dp.connect(sa("10.96.0.50:80")), Err(ConnectError::Refused));
    assert_eq!(
        dp.connect(sa("10.0.1.12:30080")),
        Err(ConnectError::Refused)
    );

    // Ready endpoints only, at the slice port of the Service port's name.
    apply(
        &admin,
        &slice(
            "web-a",
            "web",
            "default",
            "http",
            8080,
            &[
                ("10.244.1.5", "n1", true),
                ("10.244.2.7", "n2", true),
                ("10.244.2.8", "n2", false),
            ],
        ),
    )
    .await;
    let e = until(&dp, "default/web", "web's endpoints", |e| {
        e.is_some_and(|e| e.rules.iter().all(|r| r.endpoints.len() == 2))
    })
    .await
    .unwrap();
    let frontends: Vec<SocketAddr> = e.rules.iter().map(|r| r.frontend).collect();
    assert_eq!(
        frontends,
        [
            sa("10.96.0.50:80"),
            sa("10.0.1.11:30080"),
            sa("10.0.1.12:30080")
        ]
    );
    assert_eq!(
        e.rules[0].endpoints,
        [sa("10.244.1.5:8080"), sa("10.244.2.7:8080")]
    );

    // externalTrafficPolicy: Local keeps each node's NodePort to its own endpoints.
    apply(
        &admin,
        "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: default}\nspec:\n  type: NodePort\n  externalTrafficPolicy: Local\n  clusterIP: 10.96.0.50\n  selector: {app: web}\n  ports:\n  - {name: http, port: 80, targetPort: 8080, nodePort: 30080}\n",
    )
    .await;
    let e = until(&dp, "default/web", "Local policy", |e| {
        e.is_some_and(|e| e.rules.iter().any(|r| r.endpoints.len() == 1))
    })
    .await
    .unwrap();
    let n1 = e
        .rules
        .iter()
        .find(|r| r.frontend == sa("10.0.1.11:30080"))
        .unwrap();
    assert_eq!(n1.endpoints, [sa("10.244.1.5:8080")]);
    let n2 = e
        .rules
        .iter()
        .find(|r| r.frontend == sa("10.0.1.12:30080"))
        .unwrap();
    assert_eq!(n2.endpoints, [sa("10.244.2.7:8080")]);
    let cip = e
        .rules
        .iter()
        .find(|r| r.frontend == sa("10.96.0.50:80"))
        .unwrap();
    assert_eq!(cip.endpoints.len(), 2);

    // A headless Service resolves to its ready pods; ExternalName is a CNAME, no rules.
    apply(
        &admin,
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: data}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: db, namespace: data}\nspec:\n  clusterIP: None\n  selector: {app: db}\n  ports:\n  - {port: 5432}\n",
    )
    .await;
    apply(
        &admin,
        &slice(
            "db-a",
            "db",
            "data",
            "",
            5432,
            &[("10.244.1.9", "n1", true)],
        ),
    )
    .await;
    let e = until(&dp, "data/db", "headless db", |e| {
        e.is_some_and(|e| !e.records.is_empty())
    })
    .await
    .unwrap();
    assert!(e.rules.is_empty());
    assert_eq!(
        dp.resolve("db", &kumo_sim::net::search_path("data")),
        Some(vec![IpAddr::V4(Ipv4Addr::new(10, 244, 1, 9))])
    );
    // Each ready endpoint has a name of its own (its address with dashes, without a
    // hostname) and the reverse record to it.
    assert_eq!(
        texts("10-244-1-9.db.data.svc.cluster.local", QType::A),
        ["10.244.1.9"]
    );
    assert_eq!(
        texts("9.1.244.10.in-addr.arpa", QType::Ptr),
        ["10-244-1-9.db.data.svc.cluster.local."]
    );
    apply(
        &admin,
        "apiVersion: v1\nkind: Service\nmetadata: {name: ext, namespace: default}\nspec:\n  type: ExternalName\n  externalName: example.com\n",
    )
    .await;
    let ext = until(&dp, "default/ext", "ext programmed", |e| e.is_some())
        .await
        .unwrap();
    assert!(ext.rules.is_empty());
    assert_eq!(
        texts("ext.default.svc.cluster.local", QType::Cname),
        ["example.com."]
    );

    // Gone with the Service.
    delete(&admin, &["service", "web"]).await;
    until(&dp, "default/web", "web removed", |e| e.is_none()).await;
    assert_eq!(
        dp.resolve("web", &kumo_sim::net::search_path("default")),
        None
    );
    assert_eq!(
        dp.connect(sa("10.96.0.50:80")),
        Err(ConnectError::Unreachable)
    );
    drop(proxy);
}
