//! The kubelet against an in-process API server, with its own node identity
//! (`system:node:w1`, so the Node authorizer and NodeRestriction apply), driven and
//! observed with the real kubectl: registration, lease, pods bound to the node run and
//! stop, restart policies, and static pods with their mirror pods.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{k, node_kubeconfig, until};
use kumo_kubelet::KubeletConfig;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubelet_runs_pods_and_static_pods() {
    let (server, dir) = common::start_apiserver().await;
    let admin = server.admin_kubeconfig.clone();
    let manifests = dir.path().join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    std::fs::write(
        manifests.join("static-web.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: static-web\n  labels:\n    app: static\nspec:\n  containers:\n  - name: web\n    image: nginx:1.28\n",
    )
    .unwrap();
    let mut kcfg = KubeletConfig::new(node_kubeconfig(dir.path(), &admin, "w1"), "w1");
    kcfg.runtime = Some(kumo_sim::factory(None));
    kcfg.pod_manifest_path = Some(manifests.clone());
    // Not rescanned during the test: the manifest changes below take effect through the
    // directory's file events.
    kcfg.static_pod_rescan = Duration::from_secs(3600);
    kcfg.status_update_frequency = Duration::from_secs(1);
    common::spawn_kubelet(kcfg);

    // Registered and Ready, with upstream's labels and a lease.
    common::node_ready(&admin, "w1").await;
    let (_, labels, _) = k(
        &admin,
        &["get", "node", "w1", "-o", "jsonpath={.metadata.labels}"],
    )
    .await;
    for l in [
        "\"kubernetes.io/hostname\":\"w1\"",
        "\"kubernetes.io/os\":\"linux\"",
        "\"kubernetes.io/arch\"",
    ] {
        assert!(labels.contains(l), "{labels}");
    }
    let (_, info, _) = k(
        &admin,
        &[
            "get",
            "node",
            "w1",
            "-o",
            "jsonpath={.status.nodeInfo.kubeletVersion} {.status.nodeInfo.containerRuntimeVersion}",
        ],
    )
    .await;
    assert_eq!(info, "v1.37.2-kumo sim://0.1.0");
    until(&admin, &["-n", "kube-node-lease", "get", "lease", "w1", "-o", "jsonpath={.spec.holderIdentity} {.spec.leaseDurationSeconds} {.metadata.ownerReferences[0].kind}"], "lease", |o| o == "w1 40 Node").await;

    // A pod bound to the node runs, with an IP from the pod range.
    let (ok, _, err) = k(&admin, &["create", "sa", "default"]).await;
    assert!(ok, "{err}");
    let pod = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  nodeName: w1\n  containers:\n  - name: nginx\n    image: nginx:1.29\n";
    std::fs::write(dir.path().join("web.yaml"), pod).unwrap();
    let (ok, _, err) = k(
        &admin,
        &[
            "create",
            "-f",
            dir.path().join("web.yaml").to_str().unwrap(),
        ],
    )
    .await;
    assert!(ok, "{err}");
    // Its token volume projects kube-root-ca.crt, which does not exist yet (no
    // controller-manager publishes it here): the volume cannot be set up, so the container
    // waits in ContainerCreating and the kubelet reports FailedMount, as upstream's does.
    until(
        &admin,
        &[
            "get",
            "pod",
            "web",
            "-o",
            "jsonpath={.status.phase} {.status.containerStatuses[0].state.waiting.reason} {.status.conditions[?(@.type==\"Ready\")].reason}",
        ],
        "pod waiting for its volume",
        |o| o == "Pending ContainerCreating ContainersNotReady",
    )
    .await;
    let mount = until(
        &admin,
        &[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=web,reason=FailedMount",
            "-o",
            "jsonpath={.items[0].type} {.items[0].message}",
        ],
        "FailedMount event",
        |o| !o.is_empty(),
    )
    .await;
    assert!(
        mount.starts_with("Warning MountVolume.SetUp failed for volume \"kube-api-access-")
            && mount.ends_with("\" : configmap \"kube-root-ca.crt\" not found"),
        "{mount}"
    );
    // Once it exists, the volume is set up on a retry and the pod starts.
    common::publish_root_ca(&admin, dir.path()).await;
    until(
        &admin,
        &[
            "get",
            "pod",
            "web",
            "-o",
            "jsonpath={.status.phase} {.status.conditions[?(@.type==\"Ready\")].status}",
        ],
        "pod Running",
        |o| o == "Running True",
    )
    .await;
    let (_, ip, _) = k(
        &admin,
        &[
            "get",
            "pod",
            "web",
            "-o",
            "jsonpath={.status.podIP} {.status.containerStatuses[0].state.running.startedAt}",
        ],
    )
    .await;
    assert!(ip.starts_with("10.244.0."), "{ip}");
    // A spec update is observed: status.observedGeneration follows metadata.generation.
    let (ok, _, err) = k(
        &admin,
        &[
            "patch",
            "pod",
            "web",
            "--type=merge",
            "-p",
            r#"{"spec":{"activeDeadlineSeconds":5000}}"#,
        ],
    )
    .await;
    assert!(ok, "{err}");
    until(
        &admin,
        &[
            "get",
            "pod",
            "web",
            "-o",
            "jsonpath={.metadata.generation} {.status.observedGeneration}",
        ],
        "observed generation",
        |o| o == "2 2",
    )
    .await;
    // The kubelet's events, in upstream's words.
    let events = until(
        &admin,
        &[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=web",
            "-o",
            "jsonpath={range .items[*]}{.reason}: {.message}{\"\\n\"}{end}",
        ],
        "pod events",
        |o| o.contains("Started:"),
    )
    .await;
    for line in [
        "Pulling: Pulling image \"nginx:1.29\"",
        "Created: Created container: nginx",
        "Started: Started container nginx",
    ] {
        assert!(events.contains(line), "{events}");
    }
    assert!(
        events.contains("Pulled: Successfully pulled image \"nginx:1.29\" in "),
        "{events}"
    );
    // Deleted: stopped, then gone.
    let (ok, _, err) = k(&admin, &["delete", "pod", "web", "--wait=false"]).await;
    assert!(ok, "{err}");
    until(&admin, &["get", "pods", "-o", "name"], "web gone", |o| {
        !o.contains("pod/web\n")
    })
    .await;

    // Deleted while a finalizer holds it (a Job's pods carry one): the kubelet reports
    // the final status, terminal and not ready, and the pod goes once the finalizer does.
    let held = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: held\n  finalizers: [example.com/hold]\nspec:\n  nodeName: w1\n  restartPolicy: Never\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: busybox\n    command: [sleep, \"3600\"]\n";
    let f = dir.path().join("held.yaml");
    std::fs::write(&f, held).unwrap();
    let (ok, _, err) = k(&admin, &["create", "-f", f.to_str().unwrap()]).await;
    assert!(ok, "{err}");
    until(
        &admin,
        &["get", "pod", "held", "-o", "jsonpath={.status.phase}"],
        "held running",
        |o| o == "Running",
    )
    .await;
    let (ok, _, err) = k(&admin, &["delete", "pod", "held", "--wait=false"]).await;
    assert!(ok, "{err}");
    until(
        &admin,
        &[
            "get",
            "pod",
            "held",
            "-o",
            "jsonpath={.status.phase} {.status.containerStatuses[0].state.terminated.reason} {.status.containerStatuses[0].ready} {.status.conditions[?(@.type==\"Ready\")].status}",
        ],
        "held terminal",
        |o| o == "Failed Error false False",
    )
    .await;
    let (ok, _, err) = k(
        &admin,
        &[
            "patch",
            "pod",
            "held",
            "--type=json",
            "-p",
            r#"[{"op":"remove","path":"/metadata/finalizers"}]"#,
        ],
    )
    .await;
    assert!(ok, "{err}");
    until(&admin, &["get", "pods", "-o", "name"], "held gone", |o| {
        !o.contains("pod/held\n")
    })
    .await;

    // Admission: a second pod bound here that wants a host port already taken is never
    // started; it fails with upstream's reason and message.
    for n in ["port-a", "port-b"] {
        let body = format!("apiVersion: v1\nkind: Pod\nmetadata:\n  name: {n}\nspec:\n  nodeName: w1\n  containers:\n  - name: c\n    image: nginx\n    ports:\n    - containerPort: 80\n      hostPort: 8080\n");
        let f = dir.path().join(format!("{n}.yaml"));
        std::fs::write(&f, body).unwrap();
        let (ok, _, err) = k(&admin, &["create", "-f", f.to_str().unwrap()]).await;
        assert!(ok, "{err}");
        if n == "port-a" {
            until(
                &admin,
                &["get", "pod", n, "-o", "jsonpath={.status.phase}"],
                "port-a running",
                |o| o == "Running",
            )
            .await;
        }
    }
    until(
        &admin,
        &["get", "pod", "port-b", "-o", "jsonpath={.status.phase}|{.status.reason}|{.status.message}|{.status.containerStatuses}"],
        "port-b rejected",
        |o| o == "Failed|NodePorts|Pod was rejected: Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports|",
    )
    .await;
    until(
        &admin,
        &[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=port-b",
            "-o",
            "jsonpath={.items[*].type} {.items[*].reason}",
        ],
        "the NodePorts event",
        |o| o == "Warning NodePorts",
    )
    .await;

    // Restart policies: a crashing container backs off; a finished one succeeds.
    let crash = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: crash\n  annotations:\n    sim.kumo.io/exit-after-seconds: \"0\"\n    sim.kumo.io/exit-code: \"1\"\nspec:\n  nodeName: w1\n  containers:\n  - name: c\n    image: busybox\n";
    let done = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: done\n  annotations:\n    sim.kumo.io/exit-after-seconds: \"0\"\nspec:\n  nodeName: w1\n  restartPolicy: Never\n  containers:\n  - name: c\n    image: busybox\n";
    for (n, body) in [("crash", crash), ("done", done)] {
        let f = dir.path().join(format!("{n}.yaml"));
        std::fs::write(&f, body).unwrap();
        let (ok, _, err) = k(&admin, &["create", "-f", f.to_str().unwrap()]).await;
        assert!(ok, "{err}");
    }
    until(&admin, &["get", "pod", "crash", "-o", "jsonpath={.status.containerStatuses[0].state.waiting.reason} {.status.containerStatuses[0].restartCount} {.status.containerStatuses[0].lastState.terminated.exitCode}"], "crash loop", |o| o == "CrashLoopBackOff 1 1").await;
    until(
        &admin,
        &[
            "get",
            "pod",
            "done",
            "-o",
            "jsonpath={.status.phase} {.status.containerStatuses[0].state.terminated.reason}",
        ],
        "succeeded",
        |o| o == "Succeeded Completed",
    )
    .await;

    // A pod that ran steady for a while (passes skip it) is synced when its container
    // exits on its own.
    let f = dir.path().join("later.yaml");
    std::fs::write(&f, "apiVersion: v1\nkind: Pod\nmetadata:\n  name: later\n  annotations:\n    sim.kumo.io/exit-after-seconds: \"4\"\nspec:\n  nodeName: w1\n  restartPolicy: Never\n  containers:\n  - name: c\n    image: busybox\n").unwrap();
    let (ok, _, err) = k(&admin, &["create", "-f", f.to_str().unwrap()]).await;
    assert!(ok, "{err}");
    let phase = [
        "get",
        "pod",
        "later",
        "-o",
        "jsonpath={.status.phase} {.status.containerStatuses[0].state.terminated.reason}",
    ];
    until(&admin, &phase, "running", |o| o.starts_with("Running")).await;
    until(&admin, &phase, "exited", |o| o == "Succeeded Completed").await;

    // activeDeadlineSeconds: the pod fails once it ran that long.
    let f = dir.path().join("deadline.yaml");
    std::fs::write(&f, "apiVersion: v1\nkind: Pod\nmetadata:\n  name: deadline\nspec:\n  nodeName: w1\n  activeDeadlineSeconds: 1\n  containers:\n  - name: c\n    image: nginx:1.29\n").unwrap();
    let (ok, _, err) = k(&admin, &["create", "-f", f.to_str().unwrap()]).await;
    assert!(ok, "{err}");
    until(
        &admin,
        &[
            "get",
            "pod",
            "deadline",
            "-o",
            "jsonpath={.status.phase} {.status.reason}",
        ],
        "deadline exceeded",
        |o| o == "Failed DeadlineExceeded",
    )
    .await;
    // Probes: a failing readiness probe keeps the pod Running but not Ready; a failing
    // liveness probe restarts the container.
    let unready = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: unready\n  annotations:\n    sim.kumo.io/probe-fail: readiness\nspec:\n  nodeName: w1\n  containers:\n  - name: c\n    image: nginx:1.29\n    readinessProbe:\n      httpGet: {path: /, port: 80}\n";
    let sick = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: sick\n  annotations:\n    sim.kumo.io/probe-fail: liveness\nspec:\n  nodeName: w1\n  containers:\n  - name: c\n    image: nginx:1.29\n    livenessProbe:\n      httpGet: {path: /, port: 80}\n      periodSeconds: 1\n      failureThreshold: 1\n";
    for (n, body) in [("unready", unready), ("sick", sick)] {
        let f = dir.path().join(format!("{n}.yaml"));
        std::fs::write(&f, body).unwrap();
        let (ok, _, err) = k(&admin, &["create", "-f", f.to_str().unwrap()]).await;
        assert!(ok, "{err}");
    }
    until(&admin, &["get", "pod", "unready", "-o", "jsonpath={.status.phase} {.status.containerStatuses[0].ready} {.status.conditions[?(@.type==\"Ready\")].reason}"], "running, not ready", |o| o == "Running false ContainersNotReady").await;
    until(
        &admin,
        &[
            "get",
            "pod",
            "sick",
            "-o",
            "jsonpath={.status.containerStatuses[0].restartCount}",
        ],
        "liveness restarts",
        |o| o.parse::<u32>().is_ok_and(|n| n >= 1),
    )
    .await;
    let events = until(
        &admin,
        &[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=sick",
            "-o",
            "jsonpath={range .items[*]}{.reason}: {.message}{\"\\n\"}{end}",
        ],
        "liveness events",
        |o| o.contains("Unhealthy:"),
    )
    .await;
    assert!(
        events.contains("Killing: Container c failed liveness probe, will be restarted"),
        "{events}"
    );

    // The static pod's mirror: named after the node, owned by it, Running.
    let mirror = "static-web-w1";
    until(
        &admin,
        &["get", "pod", mirror, "-o", "jsonpath={.status.phase}"],
        "mirror Running",
        |o| o == "Running",
    )
    .await;
    let (_, owner, _) = k(
        &admin,
        &[
            "get",
            "pod",
            mirror,
            "-o",
            "jsonpath={.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}",
        ],
    )
    .await;
    assert_eq!(owner, "Node/w1");
    let (_, hash, _) = k(
        &admin,
        &[
            "get",
            "pod",
            mirror,
            "-o",
            "jsonpath={.metadata.annotations.kubernetes\\.io/config\\.mirror}",
        ],
    )
    .await;
    assert_eq!(hash.len(), 32, "{hash}");
    let (_, uid, _) = k(
        &admin,
        &["get", "pod", mirror, "-o", "jsonpath={.metadata.uid}"],
    )
    .await;
    // Deleting the mirror pod brings it back (a new object; the static pod kept running).
    let (ok, _, err) = k(&admin, &["delete", "pod", mirror, "--wait=false"]).await;
    assert!(ok, "{err}");
    until(
        &admin,
        &[
            "get",
            "pod",
            mirror,
            "-o",
            "jsonpath={.metadata.uid} {.status.phase}",
        ],
        "mirror back",
        |o| o.ends_with(" Running") && !o.starts_with(&uid),
    )
    .await;
    // The node may not create a pod that is not a mirror pod (NodeRestriction).
    let node_kc = dir.path().join("kubelet-w1.conf");
    let (ok, _, err) = k(
        &node_kc,
        &[
            "run",
            "sneaky",
            "--image=nginx",
            "--overrides={\"spec\":{\"nodeName\":\"w1\"}}",
        ],
    )
    .await;
    assert!(!ok && err.contains("can only create mirror pods"), "{err}");
    // A manifest that cannot be used is reported on the Node and skipped; the static pod
    // keeps running.
    std::fs::write(
        manifests.join("broken.yaml"),
        "apiVersion: v1\nkind: Pod\nspec: [\n",
    )
    .unwrap();
    let events = until(
        &admin,
        &[
            "get",
            "events",
            "--field-selector",
            "involvedObject.kind=Node,involvedObject.name=w1,reason=FailedValidation",
            "-o",
            "jsonpath={.items[*].type}: {.items[*].message}",
        ],
        "the broken manifest reported",
        |o| o.contains("broken.yaml"),
    )
    .await;
    assert!(
        events.starts_with("Warning: Could not process manifest file"),
        "{events}"
    );
    let (_, phase, _) = k(
        &admin,
        &[
            "get",
            "pod",
            mirror,
            "-o",
            "jsonpath={.metadata.uid} {.status.phase}",
        ],
    )
    .await;
    assert!(phase.ends_with(" Running"), "{phase}");
    // Changing the manifest replaces the mirror pod with the new hash; removing it
    // deletes the mirror pod.
    std::fs::write(
        manifests.join("static-web.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: static-web\n  labels:\n    app: static\n    version: two\nspec:\n  containers:\n  - name: web\n    image: nginx:1.28\n",
    )
    .unwrap();
    until(
        &admin,
        &[
            "get",
            "pod",
            mirror,
            "-o",
            "jsonpath={.metadata.labels.version} {.status.phase}",
        ],
        "mirror replaced",
        |o| o == "two Running",
    )
    .await;
    std::fs::remove_file(manifests.join("static-web.yaml")).unwrap();
    until(
        &admin,
        &["get", "pods", "-o", "name"],
        "mirror deleted",
        |o| !o.contains(mirror),
    )
    .await;
}

/// Static pods run before there is an API server to register with (kubeadm's control
/// plane is static pods the kubelet starts first): the kubelet's API server is unreachable
/// for its first seconds, and its static pod's container starts in them; once the API
/// server answers, the Node is registered and the mirror pod shows the container running
/// since before the Node existed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn static_pods_run_before_the_api_server_answers() {
    let (server, dir) = common::start_apiserver().await;
    let admin = server.admin_kubeconfig.clone();
    let manifests = dir.path().join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    std::fs::write(
        manifests.join("early.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: early\n  namespace: kube-system\nspec:\n  hostNetwork: true\n  containers:\n  - name: web\n    image: nginx:1.28\n",
    )
    .unwrap();
    // The kubelet's kubeconfig names a port nothing listens on yet.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let kc = node_kubeconfig(dir.path(), &admin, "early-node");
    let text = std::fs::read_to_string(&kc).unwrap();
    let text = text.replace(
        &format!("https://{}", server.local_addr),
        &format!("https://127.0.0.1:{port}"),
    );
    assert!(text.contains(&format!(":{port}")), "{text}");
    std::fs::write(&kc, text).unwrap();
    let mut kcfg = KubeletConfig::new(kc, "early-node");
    kcfg.runtime = Some(kumo_sim::factory(None));
    kcfg.pod_manifest_path = Some(manifests);
    kcfg.status_update_frequency = Duration::from_secs(1);
    common::spawn_kubelet(kcfg);
    tokio::time::sleep(Duration::from_secs(3)).await;
    // The API server becomes reachable on that port.
    let relay = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    let upstream = server.local_addr;
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = relay.accept().await {
            tokio::spawn(async move {
                if let Ok(mut out) = tokio::net::TcpStream::connect(upstream).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                }
            });
        }
    });
    common::node_ready(&admin, "early-node").await;
    let started = until(
        &admin,
        &[
            "-n",
            "kube-system",
            "get",
            "pod",
            "early-early-node",
            "-o",
            "jsonpath={.status.containerStatuses[0].state.running.startedAt}",
        ],
        "the mirror pod's running container",
        |o| !o.is_empty(),
    )
    .await;
    let (_, registered, _) = k(
        &admin,
        &[
            "get",
            "node",
            "early-node",
            "-o",
            "jsonpath={.metadata.creationTimestamp}",
        ],
    )
    .await;
    // RFC 3339 times of one zone compare as strings.
    assert!(
        started < registered,
        "started {started}, registered {registered}"
    );
}
