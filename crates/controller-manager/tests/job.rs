//! The job controller against an in-process `kumo apiserver`, driven with kubectl. No
//! kubelet runs: the tests play it by writing pods' phase and container states through
//! the status subresource.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;

use common::*;
use serde_json::{json, Value};

const TRACKING: &str = "batch.kubernetes.io/job-tracking";

/// An API server and the job (plus serviceaccount, for the default SA pods need)
/// controllers; returns once the default ServiceAccount exists.
async fn cluster() -> (
    kumo_apiserver::ApiServer,
    tempfile::TempDir,
    kumo_controller_manager::ControllerManager,
) {
    let (server, dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    let cm = start_cm(&kc, &["job-controller", "serviceaccount-controller"]).await;
    eventually(20, "default SA", || get(&kc, &["sa", "default"])).await;
    (server, dir, cm)
}

async fn apply(kc: &Path, y: &str) {
    let out = k_in(kc, &["apply", "-f", "-"], Some(y)).await;
    assert!(out.ok, "{}", out.stderr);
}

/// The job's pods (by its name label), terminating ones included.
async fn job_pods(kc: &Path, job: &str) -> Vec<Value> {
    let sel = format!("batch.kubernetes.io/job-name={job}");
    let v = get(kc, &["pods", "-l", &sel]).await.unwrap();
    v["items"].as_array().unwrap().clone()
}

fn live(pods: &[Value]) -> Vec<Value> {
    pods.iter()
        .filter(|p| {
            p["metadata"]["deletionTimestamp"].is_null()
                && p["status"]["phase"] != "Succeeded"
                && p["status"]["phase"] != "Failed"
        })
        .cloned()
        .collect()
}

async fn wait_live(kc: &Path, job: &str, n: usize) -> Vec<Value> {
    eventually(30, &format!("{n} live pods of {job}"), || async {
        let p = live(&job_pods(kc, job).await);
        (p.len() == n).then_some(p)
    })
    .await
}

fn has_tracking(p: &Value) -> bool {
    p["metadata"]["finalizers"]
        .as_array()
        .is_some_and(|f| f.iter().any(|f| f == TRACKING))
}

fn name(p: &Value) -> String {
    p["metadata"]["name"].as_str().unwrap().to_owned()
}

/// What a kubelet reports when the pod's only container `c` exits with `code`.
async fn finish(kc: &Path, pod: &str, code: i32) {
    let now = "2026-01-01T00:00:00Z";
    let (phase, reason) = if code == 0 {
        ("Succeeded", "Completed")
    } else {
        ("Failed", "Error")
    };
    let finished_at = k8s_now();
    let patch = json!({"status": {"phase": phase, "containerStatuses": [{
        "name": "c", "image": "busybox", "imageID": "", "ready": false, "restartCount": 0,
        "state": {"terminated": {"exitCode": code, "reason": reason, "startedAt": now,
                                 "finishedAt": finished_at}},
    }]}});
    let out = k(
        kc,
        &[
            "patch",
            "pod",
            pod,
            "--subresource=status",
            "--type=merge",
            "-p",
            &patch.to_string(),
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
}

fn k8s_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    // RFC 3339 in UTC without a date library: days since the epoch to a civil date.
    let (days, rem) = (secs / 86400, secs % 86400);
    let z = days as i64 + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

async fn job(kc: &Path, name: &str) -> Value {
    get(kc, &["job", name]).await.unwrap()
}

async fn wait_job(kc: &Path, name: &str, what: &str, f: impl Fn(&Value) -> bool) -> Value {
    eventually(40, what, || async {
        let j = job(kc, name).await;
        f(&j).then_some(j)
    })
    .await
}

fn cond<'a>(j: &'a Value, t: &str) -> Option<&'a Value> {
    j["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == t)
}

fn cond_types(j: &Value) -> Vec<String> {
    j["status"]["conditions"]
        .as_array()
        .map(|cs| {
            cs.iter()
                .map(|c| {
                    format!(
                        "{}={}",
                        c["type"].as_str().unwrap(),
                        c["status"].as_str().unwrap()
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The event messages with `reason` about `name`.
async fn events(kc: &Path, name: &str, reason: &str) -> Vec<String> {
    let v = get(kc, &["events"]).await.unwrap();
    v["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["involvedObject"]["name"] == name && e["reason"] == reason)
        .map(|e| {
            assert_eq!(e["source"]["component"], "job-controller");
            e["message"].as_str().unwrap_or_default().to_owned()
        })
        .collect()
}

/// `kubectl get jobs` columns NAME STATUS COMPLETIONS of `name`.
async fn get_jobs_row(kc: &Path, name: &str) -> Vec<String> {
    let out = k(kc, &["get", "jobs", name, "--no-headers"]).await;
    assert!(out.ok, "{}", out.stderr);
    out.stdout
        .split_whitespace()
        .take(3)
        .map(str::to_owned)
        .collect()
}

fn job_yaml(name: &str, extra_spec: &str) -> String {
    format!(
        r#"
apiVersion: batch/v1
kind: Job
metadata:
  name: {name}
  namespace: default
spec:
{extra_spec}
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: c
        image: busybox
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn job_with_completions_and_parallelism_completes() {
    let (server, _dir, cm) = cluster().await;
    let kc = server.admin_kubeconfig.clone();
    apply(&kc, &job_yaml("calc", "  completions: 3\n  parallelism: 2")).await;
    let j = job(&kc, "calc").await;
    let uid = j["metadata"]["uid"].as_str().unwrap().to_owned();

    let ps = wait_live(&kc, "calc", 2).await;
    for p in &ps {
        let m = &p["metadata"];
        assert_eq!(m["generateName"], "calc-");
        assert!(name(p).starts_with("calc-"));
        for (l, v) in [
            ("batch.kubernetes.io/job-name", "calc"),
            ("job-name", "calc"),
            ("batch.kubernetes.io/controller-uid", uid.as_str()),
            ("controller-uid", uid.as_str()),
        ] {
            assert_eq!(m["labels"][l], v, "{l} on {p}");
        }
        assert_eq!(m["finalizers"], json!([TRACKING]));
        let r = &m["ownerReferences"][0];
        assert_eq!(r["kind"], "Job");
        assert_eq!(r["apiVersion"], "batch/v1");
        assert_eq!(r["uid"], uid.as_str());
        assert_eq!(r["controller"], true);
        assert_eq!(r["blockOwnerDeletion"], true);
    }
    let j = wait_job(&kc, "calc", "active 2", |j| j["status"]["active"] == 2).await;
    let st = &j["status"];
    assert_eq!(st["ready"], 0, "{st}");
    assert_eq!(st["terminating"], 0, "{st}");
    assert_eq!(st["uncountedTerminatedPods"], json!({}), "{st}");
    assert!(st["startTime"].is_string(), "{st}");
    assert!(st["succeeded"].is_null(), "{st}");
    assert_eq!(get_jobs_row(&kc, "calc").await, ["calc", "Running", "0/3"]);

    // One succeeds: it is counted, loses its finalizer, and a third pod starts.
    let first = name(&ps[0]);
    finish(&kc, &first, 0).await;
    let j = wait_job(&kc, "calc", "succeeded 1", |j| {
        j["status"]["succeeded"] == 1
    })
    .await;
    assert_eq!(j["status"]["uncountedTerminatedPods"], json!({}));
    let p = get(&kc, &["pod", &first]).await.unwrap();
    assert!(!has_tracking(&p), "{p}");
    let ps = wait_live(&kc, "calc", 2).await;
    assert!(ps.iter().all(|p| name(p) != first));
    wait_job(&kc, "calc", "active 2 after replacement", |j| {
        j["status"]["active"] == 2
    })
    .await;

    for p in &ps {
        finish(&kc, &name(p), 0).await;
    }
    let out = k(
        &kc,
        &[
            "wait",
            "--for=condition=complete",
            "job/calc",
            "--timeout=30s",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    assert!(
        out.stdout.contains("job.batch/calc condition met"),
        "{}",
        out.stdout
    );
    let j = job(&kc, "calc").await;
    let st = &j["status"];
    assert_eq!(st["succeeded"], 3, "{st}");
    assert!(st["failed"].is_null(), "{st}");
    assert!(st["active"].is_null(), "{st}");
    assert!(st["completionTime"].is_string(), "{st}");
    assert_eq!(cond_types(&j), ["SuccessCriteriaMet=True", "Complete=True"]);
    for t in ["SuccessCriteriaMet", "Complete"] {
        let c = cond(&j, t).unwrap();
        assert_eq!(c["reason"], "CompletionsReached");
        assert_eq!(c["message"], "Reached expected number of succeeded pods");
        assert!(c["lastProbeTime"].is_string());
    }
    assert_eq!(get_jobs_row(&kc, "calc").await, ["calc", "Complete", "3/3"]);
    // Every pod was counted and released.
    for p in job_pods(&kc, "calc").await {
        assert!(!has_tracking(&p), "{p}");
    }
    let created = events(&kc, "calc", "SuccessfulCreate").await;
    assert_eq!(created.len(), 3, "{created:?}");
    assert!(created.iter().all(|m| m.starts_with("Created pod: calc-")));
    assert_eq!(events(&kc, "calc", "Completed").await, ["Job completed"]);
    cm.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failing_job_backs_off_then_exceeds_backoff_limit() {
    let (server, _dir, cm) = cluster().await;
    let kc = server.admin_kubeconfig.clone();
    apply(&kc, &job_yaml("flaky", "  backoffLimit: 1")).await;
    let first = name(&wait_live(&kc, "flaky", 1).await[0]);
    finish(&kc, &first, 1).await;
    let failed_at = std::time::Instant::now();
    let j = wait_job(&kc, "flaky", "failed 1", |j| j["status"]["failed"] == 1).await;
    assert!(cond(&j, "Failed").is_none(), "{j}");
    // The replacement waits for the pod failure backoff (10 s after the first failure).
    let second = eventually(30, "replacement pod", || async {
        live(&job_pods(&kc, "flaky").await).first().map(name)
    })
    .await;
    let waited = failed_at.elapsed();
    assert!(waited.as_secs() >= 7, "replaced after {waited:?}");
    assert_ne!(second, first);
    finish(&kc, &second, 1).await;
    let j = wait_job(&kc, "flaky", "Failed", |j| {
        cond(j, "Failed").is_some_and(|c| c["status"] == "True")
    })
    .await;
    assert_eq!(cond_types(&j), ["FailureTarget=True", "Failed=True"]);
    for t in ["FailureTarget", "Failed"] {
        let c = cond(&j, t).unwrap();
        assert_eq!(c["reason"], "BackoffLimitExceeded");
        assert_eq!(c["message"], "Job has reached the specified backoff limit");
    }
    assert_eq!(j["status"]["failed"], 2);
    assert!(j["status"]["completionTime"].is_null());
    assert_eq!(get_jobs_row(&kc, "flaky").await, ["flaky", "Failed", "0/1"]);
    assert_eq!(
        events(&kc, "flaky", "BackoffLimitExceeded").await,
        ["Job has reached the specified backoff limit"]
    );
    let out = k(
        &kc,
        &[
            "wait",
            "--for=condition=failed",
            "job/flaky",
            "--timeout=10s",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    cm.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn indexed_job_tracks_completed_indexes() {
    let (server, _dir, cm) = cluster().await;
    let kc = server.admin_kubeconfig.clone();
    apply(
        &kc,
        &job_yaml(
            "idx",
            "  completions: 3\n  parallelism: 3\n  completionMode: Indexed",
        ),
    )
    .await;
    let ps = wait_live(&kc, "idx", 3).await;
    let mut by_index = std::collections::BTreeMap::new();
    for p in &ps {
        let m = &p["metadata"];
        let ix = m["annotations"]["batch.kubernetes.io/job-completion-index"]
            .as_str()
            .unwrap()
            .to_owned();
        assert_eq!(
            m["labels"]["batch.kubernetes.io/job-completion-index"],
            ix.as_str()
        );
        assert_eq!(m["generateName"], format!("idx-{ix}-"));
        assert_eq!(p["spec"]["hostname"], format!("idx-{ix}"));
        let env = &p["spec"]["containers"][0]["env"][0];
        assert_eq!(env["name"], "JOB_COMPLETION_INDEX");
        assert_eq!(
            env["valueFrom"]["fieldRef"]["fieldPath"],
            "metadata.labels['batch.kubernetes.io/job-completion-index']"
        );
        by_index.insert(ix, name(p));
    }
    assert_eq!(
        by_index.keys().cloned().collect::<Vec<_>>(),
        ["0", "1", "2"]
    );

    finish(&kc, &by_index["0"], 0).await;
    finish(&kc, &by_index["2"], 0).await;
    let j = wait_job(&kc, "idx", "indexes 0,2", |j| {
        j["status"]["completedIndexes"] == "0,2"
    })
    .await;
    assert_eq!(j["status"]["succeeded"], 2);
    // Index 1 fails once: it is recreated with the same index.
    finish(&kc, &by_index["1"], 3).await;
    let again = eventually(40, "index 1 recreated", || async {
        live(&job_pods(&kc, "idx").await).into_iter().next()
    })
    .await;
    assert_eq!(
        again["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"],
        "1"
    );
    finish(&kc, &name(&again), 0).await;
    let j = wait_job(&kc, "idx", "Complete", |j| {
        cond(j, "Complete").is_some_and(|c| c["status"] == "True")
    })
    .await;
    assert_eq!(j["status"]["completedIndexes"], "0-2");
    assert_eq!(j["status"]["succeeded"], 3);
    assert_eq!(j["status"]["failed"], 1);
    assert_eq!(get_jobs_row(&kc, "idx").await, ["idx", "Complete", "3/3"]);
    cm.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pod_failure_policy_fails_job_on_exit_code() {
    let (server, _dir, cm) = cluster().await;
    let kc = server.admin_kubeconfig.clone();
    let spec = r#"  completions: 2
  parallelism: 2
  podFailurePolicy:
    rules:
    - action: Ignore
      onExitCodes: {operator: In, values: [7]}
    - action: FailJob
      onExitCodes: {containerName: c, operator: In, values: [42]}"#;
    apply(&kc, &job_yaml("pfp", spec)).await;
    let j = job(&kc, "pfp").await;
    assert_eq!(j["spec"]["podReplacementPolicy"], "Failed");
    let ps = wait_live(&kc, "pfp", 2).await;
    // An ignored failure is not counted; the pod is replaced.
    finish(&kc, &name(&ps[0]), 7).await;
    let ps = eventually(30, "replacement of the ignored failure", || async {
        let l = live(&job_pods(&kc, "pfp").await);
        (l.len() == 2 && l.iter().all(|p| name(p) != name(&ps[0]))).then_some(l)
    })
    .await;
    let j = job(&kc, "pfp").await;
    assert!(j["status"]["failed"].is_null(), "{j}");
    let victim = name(&ps[0]);
    let other = name(&ps[1]);
    finish(&kc, &victim, 42).await;
    let j = wait_job(&kc, "pfp", "Failed", |j| {
        cond(j, "Failed").is_some_and(|c| c["status"] == "True")
    })
    .await;
    let msg = format!(
        "Container c for pod default/{victim} failed with exit code 42 matching FailJob rule at index 1"
    );
    assert_eq!(cond_types(&j), ["FailureTarget=True", "Failed=True"]);
    for t in ["FailureTarget", "Failed"] {
        let c = cond(&j, t).unwrap();
        assert_eq!(c["reason"], "PodFailurePolicy");
        assert_eq!(c["message"], msg.as_str());
    }
    // The other, still running, pod was deleted and counted as failed.
    assert_eq!(j["status"]["failed"], 2, "{j}");
    assert_eq!(j["status"]["terminating"], 0, "{j}");
    assert!(get(&kc, &["pod", &other]).await.is_none());
    assert_eq!(
        events(&kc, "pfp", "SuccessfulDelete").await,
        [format!("Deleted pod: {other}")]
    );
    assert_eq!(events(&kc, "pfp", "PodFailurePolicy").await, [msg]);
    cm.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn suspend_and_resume() {
    let (server, _dir, cm) = cluster().await;
    let kc = server.admin_kubeconfig.clone();
    apply(
        &kc,
        &job_yaml(
            "sleepy",
            "  suspend: true\n  parallelism: 2\n  completions: 4",
        ),
    )
    .await;
    let j = wait_job(&kc, "sleepy", "Suspended", |j| {
        cond(j, "Suspended").is_some()
    })
    .await;
    let c = cond(&j, "Suspended").unwrap();
    assert_eq!(c["status"], "True");
    assert_eq!(c["reason"], "JobSuspended");
    assert_eq!(c["message"], "Job suspended");
    assert!(j["status"]["startTime"].is_null(), "{j}");
    assert!(job_pods(&kc, "sleepy").await.is_empty());
    assert_eq!(
        get_jobs_row(&kc, "sleepy").await,
        ["sleepy", "Suspended", "0/4"]
    );
    assert_eq!(events(&kc, "sleepy", "Suspended").await, ["Job suspended"]);

    let out = k(
        &kc,
        &[
            "patch",
            "job",
            "sleepy",
            "--type=merge",
            "-p",
            r#"{"spec":{"suspend":false}}"#,
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    wait_live(&kc, "sleepy", 2).await;
    let j = wait_job(&kc, "sleepy", "resumed", |j| {
        cond(j, "Suspended").is_some_and(|c| c["status"] == "False") && j["status"]["active"] == 2
    })
    .await;
    let c = cond(&j, "Suspended").unwrap();
    assert_eq!(c["reason"], "JobResumed");
    assert_eq!(c["message"], "Job resumed");
    assert!(j["status"]["startTime"].is_string(), "{j}");
    assert_eq!(events(&kc, "sleepy", "Resumed").await, ["Job resumed"]);
    assert_eq!(
        get_jobs_row(&kc, "sleepy").await,
        ["sleepy", "Running", "0/4"]
    );

    // Suspended again: the running pods are deleted (not counted as failures).
    let out = k(
        &kc,
        &[
            "patch",
            "job",
            "sleepy",
            "--type=merge",
            "-p",
            r#"{"spec":{"suspend":true}}"#,
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let j = wait_job(&kc, "sleepy", "suspended again", |j| {
        cond(j, "Suspended").is_some_and(|c| c["status"] == "True")
            && j["status"]["active"].is_null()
    })
    .await;
    assert!(j["status"]["failed"].is_null(), "{j}");
    eventually(20, "pods gone", || async {
        job_pods(&kc, "sleepy").await.is_empty().then_some(())
    })
    .await;
    assert_eq!(events(&kc, "sleepy", "SuccessfulDelete").await.len(), 2);
    cm.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn active_deadline_fails_the_job() {
    let (server, _dir, cm) = cluster().await;
    let kc = server.admin_kubeconfig.clone();
    apply(&kc, &job_yaml("slow", "  activeDeadlineSeconds: 3")).await;
    let pod = name(&wait_live(&kc, "slow", 1).await[0]);
    let j = wait_job(&kc, "slow", "Failed", |j| {
        cond(j, "Failed").is_some_and(|c| c["status"] == "True")
    })
    .await;
    assert_eq!(cond_types(&j), ["FailureTarget=True", "Failed=True"]);
    let c = cond(&j, "Failed").unwrap();
    assert_eq!(c["reason"], "DeadlineExceeded");
    assert_eq!(
        c["message"],
        "Job was active longer than specified deadline"
    );
    assert_eq!(j["status"]["failed"], 1);
    assert!(get(&kc, &["pod", &pod]).await.is_none());
    assert_eq!(
        events(&kc, "slow", "DeadlineExceeded").await,
        ["Job was active longer than specified deadline"]
    );
    assert_eq!(get_jobs_row(&kc, "slow").await, ["slow", "Failed", "0/1"]);
    cm.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn releases_adopts_and_cleans_up_orphans() {
    let (server, _dir, cm) = cluster().await;
    let kc = server.admin_kubeconfig.clone();
    apply(
        &kc,
        &job_yaml("keeper", "  parallelism: 2\n  completions: 4"),
    )
    .await;
    let uid = job(&kc, "keeper").await["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    let ps = wait_live(&kc, "keeper", 2).await;
    let (a, b) = (name(&ps[0]), name(&ps[1]));

    // A pod whose labels stop matching the selector is released: no ownerReference,
    // no tracking finalizer; the job starts another.
    let out = k(
        &kc,
        &[
            "label",
            "pod",
            &a,
            "batch.kubernetes.io/controller-uid=other",
            "--overwrite",
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let p = eventually(30, "released", || async {
        get(&kc, &["pod", &a]).await.filter(|p| {
            p["metadata"]["ownerReferences"]
                .as_array()
                .is_none_or(|r| r.is_empty())
        })
    })
    .await;
    assert!(!has_tracking(&p), "{p}");
    eventually(30, "replacement", || async {
        let l = live(&job_pods(&kc, "keeper").await);
        let mine: Vec<_> = l
            .iter()
            .filter(|p| p["metadata"]["ownerReferences"][0]["uid"] == uid.as_str())
            .collect();
        (mine.len() == 2).then_some(())
    })
    .await;

    // An orphan that matches is adopted back, with the tracking finalizer.
    let out = k(
        &kc,
        &[
            "patch",
            "pod",
            &b,
            "--type=json",
            "-p",
            r#"[{"op":"remove","path":"/metadata/ownerReferences"},{"op":"remove","path":"/metadata/finalizers"}]"#,
        ],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let p = eventually(30, "adopted", || async {
        get(&kc, &["pod", &b])
            .await
            .filter(|p| p["metadata"]["ownerReferences"][0]["uid"] == uid.as_str())
    })
    .await;
    assert_eq!(p["metadata"]["ownerReferences"][0]["controller"], true);
    assert!(has_tracking(&p), "{p}");

    // The job goes (no garbage collector runs here): its pods lose the tracking finalizer.
    let out = k(&kc, &["delete", "job", "keeper", "--wait=false"]).await;
    assert!(out.ok, "{}", out.stderr);
    eventually(30, "finalizers removed from the orphans", || async {
        let ps = job_pods(&kc, "keeper").await;
        (!ps.is_empty() && ps.iter().all(|p| !has_tracking(p))).then_some(())
    })
    .await;
    cm.shutdown().await.unwrap();
}
