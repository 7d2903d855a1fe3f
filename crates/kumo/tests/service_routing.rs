//! Service routing on `kumo up` (the cloud cluster, started in process), driven by the real
//! kubectl: the seed's "pending のままの LoadBalancer" hands-on. kube-proxy (kumo-proxy, as
//! system:kube-proxy) programs ClusterIPs, NodePorts and LoadBalancer VIPs to the ready
//! endpoints and the cluster DNS names; `curl` in a sim container resolves through the
//! pod's resolv.conf and gets nginx's answer from the endpoint's container.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use kumo::cluster::{CloudSettings, ClusterConfig};
use kumo_testkit::kubectl::{eventually, get, k, k_in};

const SERVICE: &str = "apiVersion: v1
kind: Service
metadata:
  name: hello
spec:
  type: LoadBalancer
  selector:
    app: hello
  ports:
    - port: 80
      targetPort: 80
";

/// Runs `curl ARGS` in a new pod `name` of `ns` (not interactive) and returns its logs and
/// the container's exit code; the pod is deleted.
async fn probe(kc: &Path, ns: &str, name: &str, args: &[&str]) -> (String, i64) {
    let mut a = vec![
        "run",
        name,
        "-n",
        ns,
        "--image=curlimages/curl:8.11.0",
        "--restart=Never",
        "--",
        "curl",
    ];
    a.extend_from_slice(args);
    let out = k(kc, &a).await;
    assert!(out.ok, "{}", out.stderr);
    let code = eventually(60, &format!("{name} finishes"), || async {
        let p = get(kc, &["pod", name, "-n", ns]).await?;
        p["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"].as_i64()
    })
    .await;
    let logs = k(kc, &["logs", name, "-n", ns]).await;
    assert!(logs.ok, "{}", logs.stderr);
    let del = k(
        kc,
        &[
            "delete",
            "pod",
            name,
            "-n",
            ns,
            "--wait=false",
            "--ignore-not-found",
        ],
    )
    .await;
    assert!(del.ok, "{}", del.stderr);
    (logs.stdout, code)
}

const W: &str = "%{http_code}\n";

/// `curl -s -o /dev/null -w '%{http_code}\n' URL` in a new pod (see `probe`).
async fn http_code(kc: &Path, ns: &str, name: &str, url: &str) -> (String, i64) {
    probe(kc, ns, name, &["-s", "-o", "/dev/null", "-w", W, url]).await
}

/// [`http_code`] for a URL by a Service's name, from namespace default, as a user does it:
/// once CoreDNS answers (kube-dns has a ready endpoint; before that every lookup fails, as
/// on any cluster just started), and with a lookup failure (curl's exit 6) asked again a
/// few times, since the cluster DNS has the Service's record a moment after its endpoint
/// is ready.
async fn http_code_by_name(kc: &Path, name: &str, url: &str) -> (String, i64) {
    eventually(120, "a ready endpoint of kube-dns", || async {
        let s = get(
            kc,
            &[
                "endpointslices",
                "-n",
                "kube-system",
                "-l",
                "kubernetes.io/service-name=kube-dns",
            ],
        )
        .await?;
        let ready = s["items"]
            .as_array()?
            .iter()
            .flat_map(|i| i["endpoints"].as_array().into_iter().flatten())
            .any(|e| e["conditions"]["ready"].as_bool() == Some(true));
        ready.then_some(())
    })
    .await;
    let mut r = (String::new(), -1);
    for attempt in 0..5 {
        r = http_code(kc, "default", &format!("{name}-{attempt}"), url).await;
        if r.1 != 6 {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    r
}

/// The seed's `kubectl create deployment hello` (nginx on port 80).
async fn create_hello(kc: &Path) {
    let out = k(
        kc,
        &[
            "create",
            "deployment",
            "hello",
            "--image=nginx:1.29",
            "--port=80",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
}

/// The EndpointSlices of Service hello, as a JSON list.
async fn hello_slices(kc: &Path) -> Option<serde_json::Value> {
    get(
        kc,
        &["endpointslices", "-l", "kubernetes.io/service-name=hello"],
    )
    .await
}

/// Waits until hello has a ready endpoint.
async fn wait_ready_endpoint(kc: &Path) {
    eventually(60, "a ready endpoint of hello", || async {
        let s = hello_slices(kc).await?;
        let ready = s["items"][0]["endpoints"][0]["conditions"]["ready"].as_bool();
        (ready == Some(true)).then_some(())
    })
    .await;
}

/// Runs `cmdline` (a kubectl command) through `script`, so kubectl gets a pty for `-it`:
/// (success, what the terminal showed).
async fn kubectl_in_pty(kc: &Path, cmdline: &str) -> (bool, String) {
    let kc = kc.to_owned();
    let cmdline = cmdline.to_owned();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("script")
            .args(["-qec", &cmdline, "/dev/null"])
            .env("KUBECONFIG", &kc)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn services_route_to_ready_pods_by_name_ip_nodeport_and_vip() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = ClusterConfig::with_cloud(dir.path().join("kumo"));
    cfg.port = 0;
    cfg.cloud = Some(CloudSettings {
        name: "sr".into(),
        workers: 1,
        controllers: vec!["*".into()],
        ..Default::default()
    });
    let cluster = kumo::cluster::start(cfg).await.unwrap();
    let kc = cluster.api.admin_kubeconfig.clone();
    let kc = kc.as_path();
    let nodes = cluster.node_names();
    cluster
        .wait_nodes_ready(&nodes, Duration::from_secs(30), |_| {})
        .await
        .unwrap();
    // kube-proxy's identity is its own, bound by the bootstrap policy.
    let kp = dir.path().join("kumo").join("kube-proxy.conf");
    let can = k(
        kc,
        &[
            "auth",
            "can-i",
            "watch",
            "endpointslices.discovery.k8s.io",
            "--as=system:kube-proxy",
        ],
    )
    .await;
    assert_eq!(can.stdout, "yes\n");
    assert!(kp.exists());

    // The seed's commands.
    create_hello(kc).await;
    let out = k_in(kc, &["apply", "-f", "-"], Some(SERVICE)).await;
    assert!(out.ok, "{}", out.stderr);
    wait_ready_endpoint(kc).await;
    // Until the default ServiceAccount exists for the probes.
    eventually(30, "the default ServiceAccount", || async {
        get(kc, &["serviceaccount", "default"]).await
    })
    .await;
    let svc = get(kc, &["svc", "hello"]).await.unwrap();
    let cluster_ip = svc["spec"]["clusterIP"].as_str().unwrap().to_owned();
    let node_port = svc["spec"]["ports"][0]["nodePort"].as_i64().unwrap();

    // By name, by ClusterIP, by the fully qualified name.
    let r = http_code_by_name(kc, "p1", "http://hello").await;
    assert_eq!(r, ("200\n".into(), 0));
    let url = format!("http://{cluster_ip}/");
    let r = http_code(kc, "default", "p2", &url).await;
    assert_eq!(r, ("200\n".into(), 0));
    let r = probe(
        kc,
        "default",
        "p3",
        &["-sI", "http://hello.default.svc.cluster.local"],
    )
    .await;
    assert!(
        r.0.replace('\r', "")
            .starts_with("HTTP/1.1 200 OK\nServer: nginx/1.29\n"),
        "{}",
        r.0
    );
    assert_eq!(r.1, 0);

    // From another namespace the short name is not found, `hello.default` is.
    let out = k(kc, &["create", "namespace", "other"]).await;
    assert!(out.ok, "{}", out.stderr);
    eventually(30, "other's default ServiceAccount", || async {
        get(kc, &["serviceaccount", "default", "-n", "other"]).await
    })
    .await;
    let r = probe(kc, "other", "p4", &["-sS", "http://hello"]).await;
    assert_eq!(r, ("curl: (6) Could not resolve host: hello\n".into(), 6));
    let r = http_code(kc, "other", "p5", "http://hello.default").await;
    assert_eq!(r, ("200\n".into(), 0));

    // A NodePort on a node's InternalIP.
    let node = get(kc, &["node", &nodes[1]]).await.unwrap();
    let ip = node["status"]["addresses"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["type"] == "InternalIP")
        .map(|a| a["address"].as_str().unwrap().to_owned())
        .unwrap();
    let url = format!("http://{ip}:{node_port}");
    let r = http_code(kc, "default", "p6", &url).await;
    assert_eq!(r, ("200\n".into(), 0));

    // The LoadBalancer's VIP, once the service controller has one.
    let vip = eventually(60, "hello's EXTERNAL-IP", || async {
        let s = get(kc, &["svc", "hello"]).await?;
        s["status"]["loadBalancer"]["ingress"][0]["ip"]
            .as_str()
            .map(str::to_owned)
    })
    .await;
    let url = format!("http://{vip}");
    let r = http_code(kc, "default", "p7", &url).await;
    assert_eq!(r, ("200\n".into(), 0));

    // The seed's probe line, interactive, through a pty: prints 200 and leaves no pod.
    let (seed_ok, text) = kubectl_in_pty(kc, "kubectl run -it --rm probe --image=curlimages/curl:8.11.0 --restart=Never -- curl -s -o /dev/null -w '%{http_code}\\n' http://hello").await;
    eprintln!("kubectl run -it --rm:\n{text}");
    assert!(seed_ok, "{text}");
    assert!(text.lines().any(|l| l.trim_end() == "200"), "{text:?}");
    assert!(text.contains("pod \"probe\" deleted"), "{text:?}");
    eventually(30, "probe gone", || async {
        get(kc, &["pod", "probe"]).await.is_none().then_some(())
    })
    .await;

    // A container that outlives the attach: its output arrives through the attach (TTY).
    let (attached_ok, text) = kubectl_in_pty(kc, "kubectl run -it --rm slow --image=curlimages/curl:8.11.0 --restart=Never -- sh -c 'sleep 3; curl -s -o /dev/null -w \"%{http_code}\\n\" http://hello'").await;
    eprintln!("kubectl run -it --rm (attached):\n{text}");
    assert!(attached_ok, "{text}");
    assert!(
        text.contains("If you don't see a command prompt, try pressing enter."),
        "{text:?}"
    );
    assert!(!text.contains("warning"), "{text:?}");
    assert!(text.lines().any(|l| l.trim_end() == "200"), "{text:?}");
    assert!(text.contains("pod \"slow\" deleted"), "{text:?}");

    // No ready endpoints: the connection is refused.
    let out = k(kc, &["scale", "deployment", "hello", "--replicas=0"]).await;
    assert!(out.ok, "{}", out.stderr);
    eventually(60, "hello without endpoints", || async {
        let s = hello_slices(kc).await?;
        let none = s["items"]
            .as_array()?
            .iter()
            .all(|i| i["endpoints"].as_array().is_none_or(Vec::is_empty));
        none.then_some(())
    })
    .await;
    let (logs, code) = probe(kc, "default", "p8", &["-sS", "http://hello"]).await;
    assert_eq!(code, 7);
    assert!(
        logs.starts_with("curl: (7) Failed to connect to hello port 80 after "),
        "{logs}"
    );
    assert!(
        logs.ends_with(" ms: Could not connect to server\n"),
        "{logs}"
    );
}

/// `kumo up --no-cloud`: the host kubelet's pods reach a ClusterIP Service the same way;
/// busybox's wget too; an address nobody has times out as curl's connect timeout says.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_cloud_cluster_routes_cluster_ips() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = ClusterConfig::new(dir.path().join("kumo"));
    cfg.port = 0;
    cfg.node_name = "routing-node".into();
    let cluster = kumo::cluster::start(cfg).await.unwrap();
    let kc = cluster.api.admin_kubeconfig.clone();
    let kc = kc.as_path();
    cluster
        .wait_nodes_ready(&cluster.node_names(), Duration::from_secs(30), |_| {})
        .await
        .unwrap();
    create_hello(kc).await;
    let out = k(
        kc,
        &[
            "expose",
            "deployment",
            "hello",
            "--port=80",
            "--target-port=80",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    wait_ready_endpoint(kc).await;
    eventually(30, "the default ServiceAccount", || async {
        get(kc, &["serviceaccount", "default"]).await
    })
    .await;
    let r = http_code_by_name(kc, "q1", "http://hello").await;
    assert_eq!(r, ("200\n".into(), 0));
    let out = k(
        kc,
        &[
            "run",
            "q2",
            "--image=busybox:1.37",
            "--restart=Never",
            "--",
            "wget",
            "-qO-",
            "http://hello",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let logs = eventually(60, "q2's page", || async {
        let p = get(kc, &["pod", "q2"]).await?;
        p["status"]["containerStatuses"][0]["state"]["terminated"].as_object()?;
        let l = k(kc, &["logs", "q2"]).await;
        Some(l.stdout)
    })
    .await;
    assert!(logs.contains("<title>Welcome to nginx!</title>"), "{logs}");
    let r = probe(
        kc,
        "default",
        "q3",
        &["-sS", "--connect-timeout", "1", "http://10.255.255.1/"],
    )
    .await;
    assert_eq!(
        r,
        (
            "curl: (28) Failed to connect to 10.255.255.1 port 80 after 1000 ms: Timeout was reached\n".into(),
            28
        )
    );

    // The API server's pod and service proxies reach the pods through the simulated pod
    // network, never through the host: agnhost's serve-hostname answers with its name.
    let out = k(
        kc,
        &[
            "run",
            "hostname-1",
            "--image=registry.k8s.io/e2e-test-images/agnhost:2.66.1",
            "--port=9376",
            "--",
            "serve-hostname",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let answer = eventually(60, "hostname-1 through pods/proxy", || async {
        let out = k(
            kc,
            &[
                "get",
                "--raw",
                "/api/v1/namespaces/default/pods/hostname-1/proxy/",
            ],
        )
        .await;
        out.ok.then_some(out.stdout)
    })
    .await;
    assert_eq!(answer, "hostname-1");
    let page = k(
        kc,
        &[
            "get",
            "--raw",
            "/api/v1/namespaces/default/services/hello:80/proxy/",
        ],
    )
    .await;
    assert!(
        page.stdout.contains("<title>Welcome to nginx!</title>"),
        "{}{}",
        page.stdout,
        page.stderr
    );
    // Nothing listens on the pod's port 81: the dial error as upstream words it.
    let out = k(
        kc,
        &[
            "get",
            "--raw",
            "/api/v1/namespaces/default/pods/hostname-1:81/proxy/",
        ],
    )
    .await;
    assert!(!out.ok);
    assert!(
        out.stderr
            .contains("error trying to reach service: dial tcp ")
            && out.stderr.contains(":81: connect: connection refused"),
        "{}",
        out.stderr
    );
}
