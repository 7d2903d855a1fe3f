//! Lists and watches served by the watch cache, seen through the real kubectl: a list right
//! after a write sees it, watches replay the cache's window with selector transitions, and
//! `sendInitialEvents` ends its initial state with the `k8s.io/initial-events-end` bookmark.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;

use serde_json::Value;

/// Watch events printed by `kubectl get --raw` of a watch URL with a timeout.
fn events(out: &Out) -> Vec<Value> {
    assert!(out.ok, "{}", out.stderr);
    out.stdout
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The resourceVersion of a list of the default namespace's ConfigMaps.
async fn configmaps_revision(kc: &std::path::Path) -> i64 {
    let list = out_json(
        &k(
            kc,
            &["get", "--raw", "/api/v1/namespaces/default/configmaps"],
        )
        .await,
    );
    list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

fn summary(evs: &[Value]) -> Vec<String> {
    evs.iter()
        .map(|e| {
            format!(
                "{} {} {}",
                e["type"].as_str().unwrap(),
                e["object"]["metadata"]["name"].as_str().unwrap_or(""),
                e["object"]["metadata"]["resourceVersion"].as_str().unwrap()
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_read_their_writes() {
    let (_server, dir) = start().await;
    let kc = dir.path().join("admin.conf");
    // Warm the cache, then check every write is visible to the very next list.
    let out = k(&kc, &["get", "configmaps", "-o", "name"]).await;
    assert!(out.ok, "{}", out.stderr);
    for i in 0..12 {
        let name = format!("c{i}");
        let out = k(&kc, &["create", "configmap", &name, "--from-literal=k=v"]).await;
        assert!(out.ok, "{}", out.stderr);
        let out = k(&kc, &["label", "configmap", &name, &format!("round={i}")]).await;
        assert!(out.ok, "{}", out.stderr);
        let out = k(
            &kc,
            &[
                "get",
                "configmaps",
                "-l",
                &format!("round={i}"),
                "-o",
                "name",
            ],
        )
        .await;
        assert!(out.ok, "{}", out.stderr);
        assert_eq!(out.stdout.trim(), format!("configmap/{name}"));
    }
    let out = k(&kc, &["delete", "configmap", "c3"]).await;
    assert!(out.ok, "{}", out.stderr);
    let out = k(&kc, &["get", "configmaps", "-o", "name"]).await;
    assert!(!out.stdout.contains("configmap/c3\n"), "{}", out.stdout);
    assert_eq!(
        out.stdout.matches("configmap/c").count(),
        11,
        "{}",
        out.stdout
    );
    // resourceVersion=0 is answered from the cache too (after the list above it has the
    // delete).
    let all = out_json(
        &k(
            &kc,
            &[
                "get",
                "--raw",
                "/api/v1/namespaces/default/configmaps?resourceVersion=0",
            ],
        )
        .await,
    );
    assert_eq!(all["items"].as_array().unwrap().len(), 11);
    // So is a GET with resourceVersion=0: the object whole, or upstream's NotFound.
    let one = out_json(
        &k(
            &kc,
            &[
                "get",
                "--raw",
                "/api/v1/namespaces/default/configmaps/c4?resourceVersion=0",
            ],
        )
        .await,
    );
    assert_eq!(one["kind"], "ConfigMap");
    assert_eq!(one["apiVersion"], "v1");
    assert_eq!(one["metadata"]["labels"]["round"], "4");
    assert_eq!(one["data"]["k"], "v");
    let gone = k(
        &kc,
        &[
            "get",
            "--raw",
            "/api/v1/namespaces/default/configmaps/c3?resourceVersion=0",
        ],
    )
    .await;
    assert!(!gone.ok);
    assert!(
        gone.stderr.contains("configmaps \"c3\" not found"),
        "{}",
        gone.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_replay_the_window_with_selector_transitions() {
    let (_server, dir) = start().await;
    let kc = dir.path().join("admin.conf");
    let from = configmaps_revision(&kc).await.to_string();
    for args in [
        vec!["create", "configmap", "a", "--from-literal=k=v"],
        vec!["label", "configmap", "a", "team=x"],
        vec!["create", "configmap", "b", "--from-literal=k=v"],
        vec!["label", "configmap", "a", "team=y", "--overwrite"],
        vec!["delete", "configmap", "a"],
    ] {
        let out = k(&kc, &args).await;
        assert!(out.ok, "{}", out.stderr);
    }
    let rv = |name: &str, evs: &[Value], i: usize| {
        assert_eq!(evs[i]["object"]["metadata"]["name"], name);
        evs[i]["object"]["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse::<i64>()
            .unwrap()
    };
    let all = events(
        &k(
            &kc,
            &[
                "get",
                "--raw",
                &format!("/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={from}&timeoutSeconds=1"),
            ],
        )
        .await,
    );
    let types: Vec<&str> = all.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        types,
        ["ADDED", "MODIFIED", "ADDED", "MODIFIED", "DELETED"],
        "{:?}",
        summary(&all)
    );
    let revs: Vec<i64> = ["a", "a", "b", "a", "a"]
        .iter()
        .enumerate()
        .map(|(i, n)| rv(n, &all, i))
        .collect();
    assert!(revs.windows(2).all(|w| w[0] < w[1]), "{revs:?}");

    // With a selector: a enters when labelled team=x and leaves (DELETED, at the revision
    // of the relabel) when it becomes team=y.
    let sel = events(
        &k(
            &kc,
            &[
                "get",
                "--raw",
                &format!("/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={from}&labelSelector=team%3Dx&timeoutSeconds=1"),
            ],
        )
        .await,
    );
    assert_eq!(
        summary(&sel),
        [
            format!("ADDED a {}", revs[1]),
            format!("DELETED a {}", revs[3])
        ]
    );

    // From the middle of the window: only what came after.
    let tail = events(
        &k(
            &kc,
            &[
                "get",
                "--raw",
                &format!("/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={}&timeoutSeconds=1", revs[2]),
            ],
        )
        .await,
    );
    assert_eq!(
        summary(&tail),
        [
            format!("MODIFIED a {}", revs[3]),
            format!("DELETED a {}", revs[4])
        ]
    );
}

/// A watch from a revision the server has not reached gets one ERROR event, upstream's
/// "Too large resource version" Timeout, after the cache's wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_ahead_of_the_server_is_told_to_retry() {
    let (_server, dir) = start().await;
    let kc = dir.path().join("admin.conf");
    let ahead = configmaps_revision(&kc).await + 1000;
    let evs = events(
        &k(
            &kc,
            &[
                "get",
                "--raw",
                &format!("/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={ahead}&timeoutSeconds=10"),
            ],
        )
        .await,
    );
    assert_eq!(evs.len(), 1, "{evs:?}");
    assert_eq!(evs[0]["type"], "ERROR");
    let status = &evs[0]["object"];
    assert_eq!(status["code"], 504);
    assert_eq!(status["reason"], "Timeout");
    let msg = status["message"].as_str().unwrap();
    assert!(
        msg.starts_with(&format!(
            "Timeout: Too large resource version: {ahead}, current: "
        )),
        "{msg}"
    );
    assert_eq!(
        status["details"]["causes"][0]["reason"],
        "ResourceVersionTooLarge"
    );
    assert_eq!(status["details"]["retryAfterSeconds"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_initial_events_ends_with_the_bookmark() {
    let (_server, dir) = start().await;
    let kc = dir.path().join("admin.conf");
    for n in ["x1", "x2", "x3"] {
        let out = k(&kc, &["create", "configmap", n, "--from-literal=k=v"]).await;
        assert!(out.ok, "{}", out.stderr);
    }
    let evs = events(
        &k(
            &kc,
            &[
                "get",
                "--raw",
                "/api/v1/namespaces/default/configmaps?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=1",
            ],
        )
        .await,
    );
    let names: Vec<String> = evs
        .iter()
        .filter(|e| e["type"] == "ADDED")
        .map(|e| e["object"]["metadata"]["name"].as_str().unwrap().to_owned())
        .filter(|n| n.starts_with('x'))
        .collect();
    assert_eq!(names, ["x1", "x2", "x3"]);
    let last = evs.last().unwrap();
    assert_eq!(last["type"], "BOOKMARK");
    assert_eq!(
        last["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    // The bookmark's revision is at least the last object's.
    let bm: i64 = last["object"]["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let x3: i64 = evs
        .iter()
        .find(|e| e["object"]["metadata"]["name"] == "x3")
        .unwrap()["object"]["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(bm >= x3, "{bm} < {x3}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn continued_lists_read_one_revision() {
    let (_server, dir) = start().await;
    let kc = dir.path().join("admin.conf");
    for n in ["a", "b", "c", "d", "e"] {
        let out = k(&kc, &["create", "configmap", n, "--from-literal=k=v"]).await;
        assert!(out.ok, "{}", out.stderr);
    }
    let path = "/api/v1/namespaces/default/configmaps";
    // Nothing changes between the pages (served from memory).
    let p1 = out_json(&k(&kc, &["get", "--raw", &format!("{path}?limit=2")]).await);
    assert_eq!(names(&p1), ["a", "b"]);
    assert_eq!(p1["metadata"]["remainingItemCount"], 3);
    let token = p1["metadata"]["continue"].as_str().unwrap().to_owned();
    let p2 = out_json(
        &k(
            &kc,
            &["get", "--raw", &format!("{path}?limit=2&continue={token}")],
        )
        .await,
    );
    assert_eq!(names(&p2), ["c", "d"]);
    assert_eq!(
        p2["metadata"]["resourceVersion"],
        p1["metadata"]["resourceVersion"]
    );
    // Changes between the pages: the next page still shows the first page's revision.
    let token = p2["metadata"]["continue"].as_str().unwrap().to_owned();
    for args in [
        vec!["delete", "configmap", "e"],
        vec!["create", "configmap", "f", "--from-literal=k=v"],
    ] {
        let out = k(&kc, &args).await;
        assert!(out.ok, "{}", out.stderr);
    }
    let p3 = out_json(
        &k(
            &kc,
            &["get", "--raw", &format!("{path}?limit=2&continue={token}")],
        )
        .await,
    );
    assert_eq!(names(&p3), ["e"]);
    assert_eq!(
        p3["metadata"]["resourceVersion"],
        p1["metadata"]["resourceVersion"]
    );
    assert!(p3["metadata"].get("continue").is_none());
    let now = out_json(&k(&kc, &["get", "--raw", path]).await);
    assert_eq!(names(&now), ["a", "b", "c", "d", "f"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_continue_hands_out_an_inconsistent_one() {
    // History older than a second is compacted away.
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = kumo_apiserver::ApiServerConfig::new(dir.path());
    cfg.bind = "127.0.0.1:0".parse().unwrap();
    cfg.compaction_interval = std::time::Duration::from_secs(1);
    let server = kumo_apiserver::ApiServer::start(cfg).await.unwrap();
    let kc = server.admin_kubeconfig.clone();
    for n in ["a", "b", "c", "d", "e"] {
        let out = k(&kc, &["create", "configmap", n, "--from-literal=k=v"]).await;
        assert!(out.ok, "{}", out.stderr);
    }
    let path = "/api/v1/namespaces/default/configmaps";
    let p1 = out_json(&k(&kc, &["get", "--raw", &format!("{path}?limit=2")]).await);
    let token = p1["metadata"]["continue"].as_str().unwrap().to_owned();

    // A change after the first page, then the first page's revision is compacted: its
    // token gets upstream's 410 with a token that goes on from the same key.
    let out = k(&kc, &["create", "configmap", "f", "--from-literal=k=v"]).await;
    assert!(out.ok, "{}", out.stderr);
    let started = std::time::Instant::now();
    let expired = loop {
        let r = tokio::task::block_in_place(|| {
            curl(
                dir.path(),
                &kc,
                "GET",
                &format!("{path}?limit=2&continue={token}"),
                None,
            )
        });
        if r.code != 200 {
            break r;
        }
        assert!(started.elapsed().as_secs() < 30, "the token never expired");
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    };
    assert_eq!(expired.code, 410, "{}", expired.body);
    assert_eq!(expired.body["reason"], "Expired");
    assert!(
        expired.body["message"]
            .as_str()
            .unwrap()
            .starts_with("The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response"),
        "{}",
        expired.body
    );
    assert!(expired.body.get("details").is_none(), "{}", expired.body);
    let inconsistent = expired.body["metadata"]["continue"].as_str().unwrap();
    let decoded: Value = serde_json::from_slice(
        &base64::Engine::decode(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD,
            inconsistent,
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(decoded["rv"], -1, "{decoded}");

    // It lists the rest at the latest revision: the change shows up.
    let p2 = out_json(
        &k(
            &kc,
            &[
                "get",
                "--raw",
                &format!("{path}?limit=2&continue={inconsistent}"),
            ],
        )
        .await,
    );
    assert_eq!(names(&p2), ["c", "d"]);
    assert_eq!(p2["metadata"]["remainingItemCount"], 2);
    assert_ne!(
        p2["metadata"]["resourceVersion"],
        p1["metadata"]["resourceVersion"]
    );
    let token = p2["metadata"]["continue"].as_str().unwrap();
    let p3 = out_json(
        &k(
            &kc,
            &["get", "--raw", &format!("{path}?limit=2&continue={token}")],
        )
        .await,
    );
    assert_eq!(names(&p3), ["e", "f"]);
    // A token with revision 0 stays invalid.
    let zero = base64::Engine::encode(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD,
        r#"{"v":"meta.k8s.io/v1","rv":0,"start":"c"}"#,
    );
    let out = k(&kc, &["get", "--raw", &format!("{path}?continue={zero}")]).await;
    assert!(
        !out.ok && out.stderr.contains("(BadRequest)"),
        "{}",
        out.stderr
    );
}

/// The names of a list's items, in order.
fn names(l: &Value) -> Vec<String> {
    l["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap().to_owned())
        .collect()
}
