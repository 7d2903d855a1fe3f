//! kube-rs, a client other than kubectl, against `kumo apiserver` run as its own process:
//! a paged list-then-watch reflector and a streaming-list watcher (sendInitialEvents, ended
//! by the initial-events-end bookmark) both follow the server across a SIGKILL and restart,
//! and `Api<PartialObjectMeta<Pod>>` (kube-rs's PartialObjectMetadata) gets, lists and watches
//! metadata only.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, ServiceAccount};
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::PartialObjectMeta;
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::{Client, Config};
use serde_json::json;

/// `kumo apiserver` on `port` over `dir`, ready when this returns.
fn start(dir: &Path, port: u16) -> Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kumo"))
        .args([
            "apiserver",
            "--secure-port",
            &port.to_string(),
            "--data-dir",
        ])
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let kubeconfig = dir.join("admin.conf");
    while Instant::now() < deadline {
        if kubeconfig.exists()
            && Command::new("kubectl")
                .args(["get", "--raw", "/readyz"])
                .env("KUBECONFIG", &kubeconfig)
                .output()
                .is_ok_and(|o| o.status.success())
        {
            return child;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("kumo apiserver did not become ready on port {port}");
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn client(dir: &Path) -> Client {
    let kc = Kubeconfig::read_from(dir.join("admin.conf")).unwrap();
    let cfg = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap();
    Client::try_from(cfg).unwrap()
}

fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"set": "r"}},
        "data": {"k": name},
    }))
    .unwrap()
}

/// Waits until `f` holds, failing after 30 s with `what`.
async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflectors_follow_the_server_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut server = start(dir.path(), port);
    let client = client(dir.path()).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for i in 0..25 {
        cms.create(&PostParams::default(), &cm(&format!("c{i:02}")))
            .await
            .unwrap();
    }

    // A reflector over a paged list-then-watch (pages of 10: three list requests).
    let (paged, writer) = reflector::store::<ConfigMap>();
    let cfg = watcher::Config::default().labels("set=r").page_size(10);
    let stream = reflector(writer, watcher(cms.clone(), cfg))
        .default_backoff()
        .touched_objects();
    let paged_task = tokio::spawn(stream.for_each(|_| async {}));

    // A reflector over a streaming list: sendInitialEvents, then the bookmark that ends
    // the initial state.
    let (streamed, writer) = reflector::store::<ConfigMap>();
    let cfg = watcher::Config::default().labels("set=r").streaming_lists();
    let stream = reflector(writer, watcher(cms.clone(), cfg))
        .default_backoff()
        .touched_objects();
    let streamed_task = tokio::spawn(stream.for_each(|_| async {}));

    let names = |s: &reflector::Store<ConfigMap>| -> BTreeSet<String> {
        s.state()
            .iter()
            .map(|c| c.metadata.name.clone().unwrap())
            .collect()
    };
    eventually("25 objects in the paged reflector", || {
        names(&paged).len() == 25
    })
    .await;
    eventually("25 objects in the streaming reflector", || {
        names(&streamed).len() == 25
    })
    .await;

    // Kill the server (no graceful shutdown), start it again on the same port and data.
    server.kill().unwrap();
    server.wait().unwrap();
    let mut server = start(dir.path(), port);
    for i in 25..30 {
        cms.create(&PostParams::default(), &cm(&format!("c{i:02}")))
            .await
            .unwrap();
    }
    for i in 0..3 {
        cms.delete(&format!("c{i:02}"), &Default::default())
            .await
            .unwrap();
    }
    let want: BTreeSet<String> = (3..30).map(|i| format!("c{i:02}")).collect();
    eventually("the paged reflector to converge", || names(&paged) == want).await;
    eventually("the streaming reflector to converge", || {
        names(&streamed) == want
    })
    .await;
    // The data the reflectors hold is the server's.
    let listed: BTreeSet<String> = cms
        .list(&ListParams::default().labels("set=r"))
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|c| c.metadata.name.unwrap())
        .collect();
    assert_eq!(listed, want);
    paged_task.abort();
    streamed_task.abort();
    let _ = server.kill();
    let _ = server.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partial_object_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path(), free_port());
    let client = client(dir.path()).await;
    // No controller makes the default service account yet; pods need it.
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
    let _ = sas
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "default"}})).unwrap(),
        )
        .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "web", "labels": {"app": "web"}, "annotations": {"note": "x"}},
        "spec": {"containers": [{"name": "web", "image": "nginx:1.29"}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();

    let one = pods.get_metadata("web").await.unwrap();
    assert_eq!(one.metadata.name.as_deref(), Some("web"));
    assert_eq!(one.metadata.annotations.unwrap()["note"], "x");
    assert_eq!(one.types.as_ref().unwrap().kind, "PartialObjectMetadata");
    let list = pods.list_metadata(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    assert_eq!(
        list.items[0].metadata.labels.as_ref().unwrap()["app"],
        "web"
    );

    // A metadata watch sees an update as MODIFIED, without the spec.
    let rv = list.metadata.resource_version.clone().unwrap();
    let mut events = pods
        .watch_metadata(&WatchParams::default().timeout(10), &rv)
        .await
        .unwrap()
        .boxed();
    let patch = json!({"metadata": {"labels": {"tier": "front"}}});
    pods.patch("web", &Default::default(), &kube::api::Patch::Merge(&patch))
        .await
        .unwrap();
    let ev = tokio::time::timeout(Duration::from_secs(10), events.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    match ev {
        WatchEvent::Modified(m) => {
            assert_eq!(m.types.as_ref().unwrap().kind, "PartialObjectMetadata");
            assert_eq!(m.metadata.labels.unwrap()["tier"], "front");
        }
        other => panic!("expected MODIFIED, got {other:?}"),
    }

    // `Api<PartialObjectMeta<Pod>>` makes metadata-only requests: a list-watch through it
    // yields PartialObjectMeta<Pod> objects.
    let meta: Api<PartialObjectMeta<Pod>> = Api::namespaced(client.clone(), "default");
    let got = meta.get("web").await.unwrap();
    assert_eq!(got.types.as_ref().unwrap().kind, "PartialObjectMetadata");
    let seen: Vec<PartialObjectMeta<Pod>> = watcher(meta, watcher::Config::default())
        .applied_objects()
        .take(1)
        .try_collect()
        .await
        .unwrap();
    assert_eq!(seen[0].metadata.name.as_deref(), Some("web"));
    assert_eq!(seen[0].metadata.labels.as_ref().unwrap()["tier"], "front");
    let _ = server.kill();
    let _ = server.wait();
}
