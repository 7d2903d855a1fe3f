//! Nodes, Services (cluster IPs and node ports), Endpoints, EndpointSlices, ServiceCIDRs
//! and IPAddresses, driven by the real kubectl.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;

use std::path::Path;

/// The table kubectl printed, as rows of whitespace-separated cells, AGE cells dropped
/// (by the header's position) so rows can be compared exactly.
fn table(out: &Out) -> Vec<Vec<String>> {
    assert!(out.ok, "{}", out.stderr);
    let mut lines = out.stdout.lines();
    let header = lines.next().unwrap();
    let cols: Vec<&str> = header.split_whitespace().collect();
    // Cells are aligned on the header's column starts.
    let starts: Vec<usize> = cols
        .iter()
        .scan(0usize, |from, c| {
            let at = header[*from..].find(c).unwrap() + *from;
            *from = at + c.len();
            Some(at)
        })
        .collect();
    let cell = |line: &str, i: usize| -> String {
        let end = starts
            .get(i + 1)
            .copied()
            .unwrap_or(line.len())
            .min(line.len());
        line.get(starts[i]..end).unwrap_or("").trim().to_owned()
    };
    let mut rows = vec![cols.iter().map(|c| c.to_string()).collect::<Vec<_>>()];
    for line in lines {
        rows.push((0..cols.len()).map(|i| cell(line, i)).collect());
    }
    let age = cols.iter().position(|c| *c == "AGE");
    if let Some(a) = age {
        for r in &mut rows {
            r.remove(a);
        }
    }
    rows
}

fn row<'a>(rows: &'a [Vec<String>], name: &str) -> &'a [String] {
    rows.iter()
        .find(|r| r[0] == name)
        .unwrap_or_else(|| panic!("no row {name} in {rows:?}"))
}

async fn create(kc: &Path, yaml: &str) -> Out {
    k_in(None, kc, &["create", "-f", "-"], Some(yaml)).await
}

const TWO_PORTS: &str = "apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web, tier: front}
  ports:
  - {name: http, port: 80, targetPort: 8080}
  - {name: https, port: 443}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_get_cluster_ips_and_node_ports() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();

    // The Service every cluster has, its endpoints, and the default ServiceCIDR.
    let svc = out_json(&k(&kc, &["get", "svc", "kubernetes", "-o", "json"]).await);
    assert_eq!(svc["spec"]["clusterIP"], "10.96.0.1");
    assert_eq!(svc["spec"]["ports"][0]["name"], "https");
    assert_eq!(svc["spec"]["ports"][0]["port"], 443);
    assert_eq!(
        svc["spec"]["ports"][0]["targetPort"],
        server.local_addr.port()
    );
    assert_eq!(svc["metadata"]["labels"]["component"], "apiserver");
    assert_eq!(svc["metadata"]["labels"]["provider"], "kubernetes");
    let port = server.local_addr.port().to_string();
    let rows = table(&k(&kc, &["get", "endpoints", "kubernetes"]).await);
    assert_eq!(rows[0], ["NAME", "ENDPOINTS"]);
    assert_eq!(rows[1], ["kubernetes", &format!("127.0.0.1:{port}")]);
    let rows = table(
        &k(
            &kc,
            &[
                "get",
                "endpointslices",
                "-l",
                "kubernetes.io/service-name=kubernetes",
            ],
        )
        .await,
    );
    assert_eq!(rows[0], ["NAME", "ADDRESSTYPE", "PORTS", "ENDPOINTS"]);
    assert_eq!(rows[1], ["kubernetes", "IPv4", port.as_str(), "127.0.0.1"]);
    let rows = table(&k(&kc, &["get", "servicecidrs"]).await);
    assert_eq!(rows[1], ["kubernetes", "10.96.0.0/12"]);
    let cidr = out_json(&k(&kc, &["get", "servicecidr", "kubernetes", "-o", "json"]).await);
    assert_eq!(cidr["status"]["conditions"][0]["type"], "Ready");
    assert_eq!(cidr["status"]["conditions"][0]["status"], "True");

    // kubectl create service: defaults and a cluster IP from the range.
    let out = k(
        &kc,
        &[
            "create",
            "service",
            "clusterip",
            "a",
            "--tcp=80:8080",
            "-o",
            "json",
        ],
    )
    .await;
    let a = out_json(&out);
    let spec = &a["spec"];
    assert_eq!(spec["type"], "ClusterIP");
    assert_eq!(spec["sessionAffinity"], "None");
    assert_eq!(spec["ipFamilyPolicy"], "SingleStack");
    assert_eq!(spec["ipFamilies"], serde_json::json!(["IPv4"]));
    assert_eq!(spec["internalTrafficPolicy"], "Cluster");
    assert_eq!(spec["ports"][0]["protocol"], "TCP");
    assert_eq!(spec["ports"][0]["targetPort"], 8080);
    assert!(spec.get("externalTrafficPolicy").is_none());
    let ip: std::net::Ipv4Addr = spec["clusterIP"].as_str().unwrap().parse().unwrap();
    assert_eq!(spec["clusterIPs"], serde_json::json!([ip.to_string()]));
    let o = ip.octets();
    assert!(o[0] == 10 && (96..112).contains(&o[1]), "{ip}");
    assert_eq!(a["status"], serde_json::json!({"loadBalancer": {}}));

    // Each allocated IP is an IPAddress whose parent is the Service.
    let rows = table(&k(&kc, &["get", "ipaddresses"]).await);
    assert_eq!(rows[0], ["NAME", "PARENTREF"]);
    assert_eq!(row(&rows, &ip.to_string())[1], "services/default/a");
    assert_eq!(row(&rows, "10.96.0.1")[1], "services/default/kubernetes");
    let addr = out_json(&k(&kc, &["get", "ipaddress", &ip.to_string(), "-o", "json"]).await);
    assert_eq!(
        addr["metadata"]["labels"]["ipaddress.kubernetes.io/managed-by"],
        "ipallocator.k8s.io"
    );

    // NodePort with a port asked for, and the same port again.
    let out = k(
        &kc,
        &[
            "create",
            "service",
            "nodeport",
            "np",
            "--tcp=80:8080",
            "--node-port=30080",
            "-o",
            "json",
        ],
    )
    .await;
    let np = out_json(&out);
    assert_eq!(np["spec"]["ports"][0]["nodePort"], 30080);
    assert_eq!(np["spec"]["externalTrafficPolicy"], "Cluster");
    let out = k(
        &kc,
        &[
            "create",
            "service",
            "nodeport",
            "np2",
            "--tcp=81:8080",
            "--node-port=30080",
        ],
    )
    .await;
    assert!(!out.ok);
    assert!(
        out.stderr.contains(
            "Service \"np2\" is invalid: spec.ports[0].nodePort: Invalid value: 30080: provided port is already allocated"
        ),
        "{}",
        out.stderr
    );
    let out = k(
        &kc,
        &[
            "create",
            "service",
            "nodeport",
            "np3",
            "--tcp=80",
            "--node-port=40000",
        ],
    )
    .await;
    assert!(
        out.stderr.contains(
            "spec.ports[0].nodePort: Invalid value: 40000: provided port is not in the valid range. The range of valid ports is 30000-32767"
        ),
        "{}",
        out.stderr
    );
    // The failed create left no cluster IP behind.
    let ips = out_json(&k(&kc, &["get", "ipaddresses", "-o", "json"]).await);
    let parents: Vec<String> = ips["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["spec"]["parentRef"]["name"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        !parents.iter().any(|p| p == "np2" || p == "np3"),
        "{parents:?}"
    );

    // A specific cluster IP, twice; then released on delete and reusable.
    let out = k(
        &kc,
        &[
            "create",
            "service",
            "clusterip",
            "fixed",
            "--clusterip=10.96.100.100",
            "--tcp=80",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let out = k(
        &kc,
        &[
            "create",
            "service",
            "clusterip",
            "fixed2",
            "--clusterip=10.96.100.100",
            "--tcp=80",
        ],
    )
    .await;
    assert!(!out.ok);
    assert!(
        out.stderr.contains(
            "Service \"fixed2\" is invalid: spec.clusterIPs: Invalid value: [\"10.96.100.100\"]: failed to allocate IP 10.96.100.100: provided IP is already allocated"
        ),
        "{}",
        out.stderr
    );
    let out = k(
        &kc,
        &[
            "create",
            "service",
            "clusterip",
            "far",
            "--clusterip=10.200.0.1",
            "--tcp=80",
        ],
    )
    .await;
    assert!(
        out.stderr
            .contains("failed to allocate IP 10.200.0.1: the provided network does not match the current range"),
        "{}",
        out.stderr
    );
    let out = k(&kc, &["delete", "svc", "fixed"]).await;
    assert!(out.ok, "{}", out.stderr);
    let out = k(&kc, &["get", "ipaddress", "10.96.100.100"]).await;
    assert!(!out.ok, "released IP still there: {}", out.stdout);
    let out = k(
        &kc,
        &[
            "create",
            "service",
            "clusterip",
            "fixed2",
            "--clusterip=10.96.100.100",
            "--tcp=80",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);

    // A dry run reserves nothing.
    let out = k(
        &kc,
        &[
            "create",
            "service",
            "nodeport",
            "dry",
            "--tcp=80",
            "--node-port=30090",
            "--dry-run=server",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let out = k(
        &kc,
        &[
            "create",
            "service",
            "nodeport",
            "wet",
            "--tcp=80",
            "--node-port=30090",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);

    // Clusterip is immutable.
    let out = k(
        &kc,
        &[
            "patch",
            "svc",
            "a",
            "-p",
            r#"{"spec":{"clusterIP":"10.96.5.5"}}"#,
        ],
    )
    .await;
    assert!(
        out.stderr.contains(
            "spec.clusterIPs[0]: Invalid value: [\"10.96.5.5\"]: may not change once set"
        ),
        "{}",
        out.stderr
    );

    // NodePort -> ClusterIP gives the node port back.
    let out = k(
        &kc,
        &[
            "patch",
            "svc",
            "np",
            "-p",
            r#"{"spec":{"type":"ClusterIP"}}"#,
            "-o",
            "json",
        ],
    )
    .await;
    let np = out_json(&out);
    assert!(np["spec"]["ports"][0].get("nodePort").is_none(), "{np}");
    assert!(np["spec"].get("externalTrafficPolicy").is_none(), "{np}");
    let out = k(
        &kc,
        &[
            "create",
            "service",
            "nodeport",
            "np2",
            "--tcp=81:8080",
            "--node-port=30080",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);

    // Two ports from YAML, headless, LoadBalancer with Local traffic, ExternalName.
    let out = create(&kc, TWO_PORTS).await;
    assert!(out.ok, "{}", out.stderr);
    let out = k(
        &kc,
        &[
            "create",
            "service",
            "clusterip",
            "h",
            "--clusterip=None",
            "--tcp=80",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let out = create(
        &kc,
        "apiVersion: v1
kind: Service
metadata: {name: lb}
spec:
  type: LoadBalancer
  externalTrafficPolicy: Local
  selector: {app: lb}
  ports: [{port: 80, nodePort: 31000}]
",
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let lb = out_json(&k(&kc, &["get", "svc", "lb", "-o", "json"]).await);
    assert_eq!(lb["spec"]["allocateLoadBalancerNodePorts"], true);
    let hc = lb["spec"]["healthCheckNodePort"].as_i64().unwrap();
    assert!((30000..=32767).contains(&hc) && hc != 31000, "{hc}");
    let out = k(
        &kc,
        &[
            "create",
            "service",
            "externalname",
            "ext",
            "--external-name=example.com",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);

    let out = k(&kc, &["get", "svc", "-o", "wide"]).await;
    let rows = table(&out);
    assert_eq!(
        rows[0],
        [
            "NAME",
            "TYPE",
            "CLUSTER-IP",
            "EXTERNAL-IP",
            "PORT(S)",
            "SELECTOR"
        ]
    );
    let web = row(&rows, "web");
    assert_eq!(web[1], "ClusterIP");
    assert_eq!(web[3..], ["<none>", "80/TCP,443/TCP", "app=web,tier=front"]);
    assert_eq!(
        row(&rows, "kubernetes")[1..],
        ["ClusterIP", "10.96.0.1", "<none>", "443/TCP", "<none>"]
    );
    assert_eq!(row(&rows, "h")[1..4], ["ClusterIP", "None", "<none>"]);
    assert_eq!(row(&rows, "lb")[3..5], ["<pending>", "80:31000/TCP"]);
    assert_eq!(
        row(&rows, "ext")[1..5],
        ["ExternalName", "<none>", "example.com", "<none>"]
    );
    assert_eq!(row(&rows, "np2")[4], "81:30080/TCP");

    // This cluster is IPv4 single-stack.
    let out = k(
        &kc,
        &[
            "create",
            "service",
            "clusterip",
            "v6",
            "--clusterip=fd00::10",
            "--tcp=80",
        ],
    )
    .await;
    assert!(
        out.stderr.contains(
            "spec.clusterIPs[0]: Invalid value: [\"fd00::10\"]: IPv6 is not configured on this cluster"
        ),
        "{}",
        out.stderr
    );
    let out = create(
        &kc,
        "apiVersion: v1
kind: Service
metadata: {name: dual}
spec:
  ipFamilyPolicy: RequireDualStack
  ports: [{port: 80}]
",
    )
    .await;
    assert!(
        out.stderr.contains(
            "spec.ipFamilyPolicy: Invalid value: \"RequireDualStack\": this cluster is not configured for dual-stack services"
        ),
        "{}",
        out.stderr
    );

    // Validation with upstream's messages.
    let out = create(
        &kc,
        "apiVersion: v1
kind: Service
metadata: {name: bad}
spec:
  type: Weird
  ports: [{port: 80}, {port: 80}]
",
    )
    .await;
    assert!(!out.ok);
    for want in [
        "spec.ports[0].name: Required value",
        "spec.ports[1].name: Required value",
        "spec.ports[1]: Duplicate value: {\"Name\":\"\",\"Protocol\":\"TCP\",\"AppProtocol\":null,\"Port\":80,\"TargetPort\":0,\"NodePort\":0}",
        "spec.type: Unsupported value: \"Weird\": supported values: \"ClusterIP\", \"ExternalName\", \"LoadBalancer\", \"NodePort\"",
    ] {
        assert!(out.stderr.contains(want), "{want}\n{}", out.stderr);
    }
}

const NODE: &str = "apiVersion: v1
kind: Node
metadata:
  name: n1
  labels:
    node-role.kubernetes.io/control-plane: \"\"
    node-role.kubernetes.io/worker: \"\"
---
apiVersion: v1
kind: Node
metadata: {name: n2}
";

const NODE_STATUS: &str = r#"{"status":{
  "conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","message":"ok"}],
  "addresses":[{"type":"InternalIP","address":"192.168.1.5"},{"type":"ExternalIP","address":"1.2.3.4"}],
  "nodeInfo":{"kubeletVersion":"v1.37.2","osImage":"Debian 12","kernelVersion":"6.1.0",
    "containerRuntimeVersion":"containerd://1.7.0","architecture":"amd64"}}}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_print_status_roles_and_cordon() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();

    let out = create(&kc, NODE).await;
    assert!(out.ok, "{}", out.stderr);
    let n2 = out_json(&k(&kc, &["get", "node", "n2", "-o", "json"]).await);
    assert_eq!(
        n2["spec"]["taints"],
        serde_json::json!([{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}])
    );
    let out = k(
        &kc,
        &[
            "patch",
            "node",
            "n1",
            "--subresource=status",
            "--type=merge",
            "-p",
            NODE_STATUS,
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let rows = table(&k(&kc, &["get", "nodes"]).await);
    assert_eq!(rows[0], ["NAME", "STATUS", "ROLES", "VERSION"]);
    assert_eq!(rows[1], ["n1", "Ready", "control-plane,worker", "v1.37.2"]);
    assert_eq!(rows[2], ["n2", "Unknown", "<none>", ""]);

    let out = k(&kc, &["cordon", "n1"]).await;
    assert!(out.ok, "{}", out.stderr);
    let rows = table(&k(&kc, &["get", "nodes", "-o", "wide"]).await);
    assert_eq!(
        rows[0],
        [
            "NAME",
            "STATUS",
            "ROLES",
            "VERSION",
            "INTERNAL-IP",
            "EXTERNAL-IP",
            "OS-IMAGE",
            "KERNEL-VERSION",
            "CONTAINER-RUNTIME"
        ]
    );
    assert_eq!(
        rows[1],
        [
            "n1",
            "Ready,SchedulingDisabled",
            "control-plane,worker",
            "v1.37.2",
            "192.168.1.5",
            "1.2.3.4",
            "Debian 12",
            "6.1.0 (amd64)",
            "containerd://1.7.0"
        ]
    );
    assert_eq!(
        rows[2],
        [
            "n2",
            "Unknown",
            "<none>",
            "",
            "<none>",
            "<none>",
            "<unknown>",
            "<unknown>",
            "<unknown>"
        ]
    );
    let out = k(
        &kc,
        &[
            "get",
            "nodes",
            "--field-selector",
            "spec.unschedulable=true",
            "-o",
            "name",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(out.stdout.trim(), "node/n1");

    // Taints are validated with upstream's paths and messages.
    let out = create(
        &kc,
        "apiVersion: v1
kind: Node
metadata: {name: n3}
spec:
  taints: [{key: a, effect: Bad}]
",
    )
    .await;
    assert!(
        out.stderr.contains(
            "The Node \"n3\" is invalid: metadata.taints[0].effect: Unsupported value: \"Bad\": supported values: \"NoSchedule\", \"PreferNoSchedule\", \"NoExecute\""
        ),
        "{}",
        out.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_and_slices_print_like_upstream() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    let out = create(
        &kc,
        "apiVersion: v1
kind: Endpoints
metadata: {name: e1}
subsets:
- addresses: [{ip: 10.0.0.1}, {ip: 10.0.0.2}]
  notReadyAddresses: [{ip: 10.0.0.9}]
  ports: [{port: 80, name: a}, {port: 81, name: b}]
---
apiVersion: v1
kind: Endpoints
metadata: {name: e2}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s1, labels: {kubernetes.io/service-name: a}}
addressType: IPv4
endpoints:
- addresses: [10.0.0.1]
- addresses: [10.0.0.2]
- addresses: [10.0.0.3]
- addresses: [10.0.0.4]
ports: [{port: 80, name: a}, {port: 81, name: b, protocol: UDP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s2}
addressType: IPv4
",
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let out = k(&kc, &["get", "endpoints", "e1", "e2"]).await;
    // Every request to core/v1 Endpoints carries upstream's deprecation warning.
    assert!(
        out.stderr.contains(
            "Warning: v1 Endpoints is deprecated in v1.33+; use discovery.k8s.io/v1 EndpointSlice"
        ),
        "{}",
        out.stderr
    );
    let rows = table(&out);
    assert_eq!(
        rows[1],
        ["e1", "10.0.0.1:80,10.0.0.2:80,10.0.0.1:81 + 1 more..."]
    );
    assert_eq!(rows[2], ["e2", "<none>"]);
    let rows = table(
        &k(
            &kc,
            &[
                "get",
                "endpointslices",
                "-l",
                "kubernetes.io/service-name=a",
            ],
        )
        .await,
    );
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(
        rows[1],
        [
            "s1",
            "IPv4",
            "80,81",
            "10.0.0.1,10.0.0.2,10.0.0.3 + 1 more..."
        ]
    );
    let rows = table(&k(&kc, &["get", "endpointslices", "s2"]).await);
    assert_eq!(rows[1], ["s2", "IPv4", "<unset>", "<unset>"]);
    let s1 = out_json(&k(&kc, &["get", "endpointslice", "s1", "-o", "json"]).await);
    assert_eq!(s1["ports"][0]["protocol"], "TCP");
    assert_eq!(s1["endpoints"][0]["conditions"], serde_json::json!({}));
    let out = create(
        &kc,
        "apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s3}
addressType: Bogus
---
apiVersion: v1
kind: Endpoints
metadata: {name: lo}
subsets: [{addresses: [{ip: 127.0.0.1}]}]
",
    )
    .await;
    // A user's endpoints may not be loopback (the server's own, written at start, are).
    assert!(
        out.stderr.contains(
            "Endpoints \"lo\" is invalid: subsets[0].addresses[0].ip: Invalid value: \"127.0.0.1\": may not be in the loopback range (127.0.0.0/8, ::1/128)"
        ),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains(
            "EndpointSlice.discovery.k8s.io \"s3\" is invalid: addressType: Unsupported value: \"Bogus\": supported values: \"FQDN\", \"IPv4\", \"IPv6\""
        ),
        "{}",
        out.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_creates_never_share_an_ip_or_port() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();

    // Four Services ask for the same IP and node port at once: one wins each.
    let runs = (0..4).map(|i| {
        let kc = kc.clone();
        async move {
            let name = format!("race{i}");
            k(
                &kc,
                &[
                    "create",
                    "service",
                    "nodeport",
                    &name,
                    "--tcp=80",
                    "--node-port=31234",
                ],
            )
            .await
        }
    });
    let outs = futures::future::join_all(runs).await;
    let won = outs.iter().filter(|o| o.ok).count();
    assert_eq!(
        won,
        1,
        "{:?}",
        outs.iter().map(|o| &o.stderr).collect::<Vec<_>>()
    );
    for o in outs.iter().filter(|o| !o.ok) {
        assert!(
            o.stderr.contains("provided port is already allocated"),
            "{}",
            o.stderr
        );
    }
    let runs = (0..4).map(|i| {
        let kc = kc.clone();
        async move {
            let name = format!("ip{i}");
            k(
                &kc,
                &[
                    "create",
                    "service",
                    "clusterip",
                    &name,
                    "--tcp=80",
                    "--clusterip=10.96.7.7",
                ],
            )
            .await
        }
    });
    let outs = futures::future::join_all(runs).await;
    assert_eq!(outs.iter().filter(|o| o.ok).count(), 1);
    // Services without a request all get distinct IPs; the losers above left no IPAddress.
    let runs = (0..6).map(|i| {
        let kc = kc.clone();
        async move {
            let name = format!("many{i}");
            k(&kc, &["create", "service", "clusterip", &name, "--tcp=80"]).await
        }
    });
    for o in futures::future::join_all(runs).await {
        assert!(o.ok, "{}", o.stderr);
    }
    let svcs = out_json(&k(&kc, &["get", "svc", "-o", "json"]).await);
    let ips: Vec<String> = svcs["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["spec"]["clusterIP"].as_str().unwrap().to_owned())
        .collect();
    let distinct: std::collections::BTreeSet<&String> = ips.iter().collect();
    assert_eq!(distinct.len(), ips.len(), "{ips:?}");
    let addrs = out_json(&k(&kc, &["get", "ipaddresses", "-o", "json"]).await);
    let mut held: Vec<String> = addrs["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    let mut want = ips.clone();
    held.sort();
    want.sort();
    assert_eq!(held, want, "one IPAddress per Service IP, none leaked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_balancer_status_shows_in_the_table() {
    let (server, _dir) = start().await;
    let kc = server.admin_kubeconfig.clone();
    let out = k(
        &kc,
        &["create", "service", "loadbalancer", "lb", "--tcp=80:8080"],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    // A spec change through /status is ignored; the status (and metadata) is taken.
    let out = k(
        &kc,
        &[
            "patch",
            "svc",
            "lb",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"metadata":{"annotations":{"patched":"yes"}},"spec":{"type":"ClusterIP"},"status":{"loadBalancer":{"ingress":[{"ip":"203.0.113.7"}]}}}"#,
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let rows = table(&k(&kc, &["get", "svc", "lb"]).await);
    assert_eq!(rows[1][1], "LoadBalancer");
    assert_eq!(rows[1][3], "203.0.113.7");
    // Status is kept by a spec update.
    let out = k(&kc, &["label", "svc", "lb", "x=y"]).await;
    assert!(out.ok, "{}", out.stderr);
    let lb = out_json(&k(&kc, &["get", "svc", "lb", "-o", "json"]).await);
    assert_eq!(
        lb["status"]["loadBalancer"]["ingress"][0]["ip"],
        "203.0.113.7"
    );
    // As upstream's Service status strategy, /status takes metadata too.
    assert_eq!(lb["metadata"]["annotations"]["patched"], "yes");
    // Deleting the Service gives its node port back.
    let port = lb["spec"]["ports"][0]["nodePort"]
        .as_i64()
        .unwrap()
        .to_string();
    let out = k(&kc, &["delete", "svc", "lb"]).await;
    assert!(out.ok, "{}", out.stderr);
    let out = k(
        &kc,
        &[
            "create",
            "service",
            "nodeport",
            "again",
            "--tcp=80",
            &format!("--node-port={port}"),
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
}

/// A node's pod ranges are set once and its providerID is never changed or cleared, with
/// kube-apiserver v1.37.2's messages (observed side by side).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_pod_cidrs_and_provider_id_are_set_once() {
    let (server, _dir) = start().await;
    let kc = &server.admin_kubeconfig;
    let node = r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"cidr-n"},
        "spec":{"podCIDR":"10.244.3.0/24","podCIDRs":["10.244.3.0/24"],"providerID":"kumo://a/i-1"}}"#;
    let out = k_in(None, kc, &["create", "-f", "-"], Some(node)).await;
    assert!(out.ok, "{}", out.stderr);
    let refused = |args: &'static [&'static str], want: &'static str| async move {
        let out = k(kc, args).await;
        assert!(!out.ok, "{args:?} was accepted");
        assert!(out.stderr.contains(want), "{}", out.stderr);
    };
    refused(
        &["patch", "node", "cidr-n", "--type=merge", "-p",
          r#"{"spec":{"podCIDR":"10.244.4.0/24","podCIDRs":["10.244.4.0/24"]}}"#],
        r#"The Node "cidr-n" is invalid: spec.podCIDRs: Forbidden: node updates may not change podCIDR except from "" to valid"#,
    )
    .await;
    refused(
        &["patch", "node", "cidr-n", "--type=merge", "-p", r#"{"spec":{"providerID":"kumo://b/i-2"}}"#],
        r#"The Node "cidr-n" is invalid: spec.providerID: Invalid value: null: field cannot be modified once set"#,
    )
    .await;
    refused(
        &["patch", "node", "cidr-n", "--type=json", "-p", r#"[{"op":"remove","path":"/spec/providerID"}]"#],
        r#"The Node "cidr-n" is invalid: spec.providerID: Invalid value: null: field cannot be cleared once set"#,
    )
    .await;
    // A node without a range may be given one.
    let out = k_in(
        None,
        kc,
        &["create", "-f", "-"],
        Some(r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"fresh"}}"#),
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let out = k(
        kc,
        &["patch", "node", "fresh", "--type=merge", "-p",
          r#"{"spec":{"podCIDR":"10.244.5.0/24","podCIDRs":["10.244.5.0/24"],"providerID":"kumo://a/i-5"}}"#],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
}

/// `--service-cluster-ip-range`: the default ServiceCIDR, the `kubernetes` Service on its
/// first address, the serving certificate for that address, and every cluster IP from it
/// (a requested one outside it refused, as upstream words it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_range_is_the_configured_one() {
    use kumo_apiserver::ApiServerConfig;
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = ApiServerConfig::new(dir.path());
    cfg.bind = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
    cfg.service_cluster_ip_range = "10.128.0.0/12".into();
    let server = kumo_apiserver::ApiServer::start(cfg).await.unwrap();
    let kc = server.admin_kubeconfig.clone();
    let get = |args: &'static [&'static str]| {
        let kc = kc.clone();
        async move {
            let out = k(&kc, args).await;
            assert!(out.ok, "{args:?}: {}", out.stderr);
            out.stdout
        }
    };
    assert_eq!(
        get(&[
            "get",
            "servicecidr",
            "kubernetes",
            "-o",
            "jsonpath={.spec.cidrs}"
        ])
        .await,
        r#"["10.128.0.0/12"]"#
    );
    assert_eq!(
        get(&[
            "get",
            "svc",
            "kubernetes",
            "-o",
            "jsonpath={.spec.clusterIP}"
        ])
        .await,
        "10.128.0.1"
    );
    let pem = std::fs::read_to_string(dir.path().join("pki/apiserver.crt")).unwrap();
    let der = rustls_pemfile::certs(&mut pem.as_bytes())
        .next()
        .unwrap()
        .unwrap();
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    let sans = format!(
        "{:?}",
        cert.subject_alternative_name().unwrap().unwrap().value
    );
    assert!(sans.contains("IPAddress([10, 128, 0, 1])"), "{sans}");
    assert!(!sans.contains("IPAddress([10, 96, 0, 1])"), "{sans}");
    let out = k(&kc, &["create", "service", "clusterip", "web", "--tcp=80"]).await;
    assert!(out.ok, "{}", out.stderr);
    let ip: Ipv4Addr = get(&["get", "svc", "web", "-o", "jsonpath={.spec.clusterIP}"])
        .await
        .parse()
        .unwrap();
    assert_eq!(
        u32::from(ip) >> 20,
        u32::from(Ipv4Addr::new(10, 128, 0, 0)) >> 20,
        "{ip}"
    );
    let outside = "apiVersion: v1\nkind: Service\nmetadata: {name: old}\nspec: {clusterIP: 10.96.0.50, ports: [{port: 80}]}\n";
    let out = create(&kc, outside).await;
    assert!(!out.ok);
    assert!(
        out.stderr
            .contains("the provided network does not match the current range"),
        "{}",
        out.stderr
    );
    // The dry-run allocator answers the range's own address.
    let out = k(
        &kc,
        &[
            "create",
            "service",
            "clusterip",
            "dry",
            "--tcp=80",
            "--dry-run=server",
            "-o",
            "jsonpath={.spec.clusterIP}",
        ],
    )
    .await;
    assert_eq!(out.stdout, "10.128.0.0", "{}", out.stderr);
}

/// A `--service-cluster-ip-range` that cannot hold Services stops the server at start with
/// the flag and the value named, before anything is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_service_range_is_refused_at_start() {
    use kumo_apiserver::ApiServerConfig;
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};
    for bad in ["10.0.0.0/31", "fd00::/108", "ten/12", ""] {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = ApiServerConfig::new(dir.path());
        cfg.bind = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
        cfg.service_cluster_ip_range = bad.into();
        let err = match kumo_apiserver::ApiServer::start(cfg).await {
            Ok(_) => panic!("{bad:?} accepted"),
            Err(e) => e.to_string(),
        };
        assert!(
            err.contains("--service-cluster-ip-range") && err.contains(&format!("{bad:?}")),
            "{err}"
        );
        assert!(
            !dir.path().join("pki").exists(),
            "{bad:?}: certificates written"
        );
    }
}
