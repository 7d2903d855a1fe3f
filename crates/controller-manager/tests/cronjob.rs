//! The cronjob and ttl-after-finished controllers against an in-process `kumo apiserver`,
//! driven with kubectl. No job controller runs: tests finish Jobs by patching their status
//! (the Complete/Failed conditions a job controller would set). Schedule times are steered
//! through `status.lastScheduleTime` (missed times fire at once) or `@every`, so no test
//! waits for a wall-clock minute.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use jiff::Timestamp;
use serde_json::{json, Value};

const ANNOTATION: &str = "batch.kubernetes.io/cronjob-scheduled-timestamp";

/// A CronJob manifest (suspended unless `suspend` is false).
fn cronjob(name: &str, schedule: &str, extra_spec: Value, suspend: bool) -> String {
    let mut spec = json!({
        "schedule": schedule,
        "suspend": suspend,
        "jobTemplate": {
            "metadata": {"labels": {"app": name}, "annotations": {"note": "from-template"}},
            "spec": {"template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "c", "image": "busybox"}],
            }}},
        },
    });
    for (k, v) in extra_spec.as_object().unwrap() {
        spec[k] = v.clone();
    }
    json!({
        "apiVersion": "batch/v1", "kind": "CronJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    })
    .to_string()
}

async fn apply(kc: &Path, manifest: &str) {
    let out = k_in(kc, &["create", "-f", "-"], Some(manifest)).await;
    assert!(out.ok, "{}", out.stderr);
}

async fn patch(kc: &Path, kind: &str, name: &str, subresource: bool, body: Value) {
    let b = body.to_string();
    let mut args = vec!["patch", kind, name, "--type=merge", "-p", &b];
    if subresource {
        args.push("--subresource=status");
    }
    let out = k(kc, &args).await;
    assert!(out.ok, "{}", out.stderr);
}

/// RFC 3339 in UTC, whole seconds, `secs` from now.
fn time_from_now(secs: i64) -> String {
    let t = Timestamp::now().as_second() + secs;
    Timestamp::from_second(t).unwrap().to_string()
}

/// A whole minute two minutes ago (seconds since the epoch): the run a CronJob resumed
/// now has missed.
fn due_minute() -> i64 {
    (Timestamp::now().as_second() / 60 - 2) * 60
}

/// A daily schedule at the wall-clock minute of `at` in a zone `offset` seconds east of
/// UTC: it was due at `at` and does not fire again for a day.
fn daily(at: i64, offset: i64) -> String {
    let local = at + offset;
    format!("{} {} * * *", local / 60 % 60, local / 3600 % 24)
}

fn rfc3339(secs: i64) -> String {
    Timestamp::from_second(secs).unwrap().to_string()
}

/// Waits for events with `reason` on `name` and checks they all say `msg`.
async fn expect_event(kc: &Path, name: &str, reason: &str, msg: &str) {
    let got = wait_event(kc, name, reason).await;
    assert!(got.iter().all(|m| m == msg), "{reason}: {got:?}");
}

/// Marks a Job finished as the job controller would: Complete (succeeded) or Failed.
async fn finish(kc: &Path, job: &str, complete: bool, start: &str, end: &str) {
    let status = if complete {
        json!({"status": {"startTime": start, "completionTime": end, "succeeded": 1,
        "conditions": [
            {"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": end},
            {"type": "Complete", "status": "True", "lastTransitionTime": end},
        ]}})
    } else {
        json!({"status": {"startTime": start, "failed": 1,
        "conditions": [
            {"type": "FailureTarget", "status": "True", "lastTransitionTime": end},
            {"type": "Failed", "status": "True", "lastTransitionTime": end},
        ]}})
    };
    patch(kc, "job", job, true, status).await;
}

async fn wait_event(kc: &Path, name: &str, reason: &str) -> Vec<String> {
    eventually(30, &format!("{reason} event on {name}"), || async {
        let e = events(kc, "default", name, reason).await;
        (!e.is_empty()).then_some(e)
    })
    .await
}

/// The names of the Jobs whose controller is the CronJob with `uid`.
async fn jobs_of(kc: &Path, uid: &str) -> Vec<Value> {
    let v = get(kc, &["jobs", "-n", "default"]).await.unwrap();
    v["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|j| {
            j["metadata"]["ownerReferences"]
                .as_array()
                .is_some_and(|rs| {
                    rs.iter()
                        .any(|r| r["uid"] == uid && r["controller"] == true)
                })
        })
        .cloned()
        .collect()
}

fn name_of(v: &Value) -> String {
    v["metadata"]["name"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cronjob_starts_missed_run_with_name_annotation_owner_status_and_events() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    let _cm = start_cm(&kc, &["cronjob-controller"]).await;

    // Daily at the minute that was two minutes ago in Kolkata's zone (UTC+05:30), last run
    // an hour before that: the missed run starts as soon as the CronJob is resumed.
    let due = due_minute();
    apply(
        &kc,
        &cronjob(
            "tick",
            &daily(due, 19_800),
            json!({"timeZone": "Asia/Kolkata"}),
            true,
        ),
    )
    .await;
    let cj = get(&kc, &["cronjob", "tick"]).await.unwrap();
    let uid = cj["metadata"]["uid"].as_str().unwrap().to_owned();
    patch(
        &kc,
        "cronjob",
        "tick",
        true,
        json!({"status": {"lastScheduleTime": rfc3339(due - 3600)}}),
    )
    .await;
    // Suspended: nothing starts.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(jobs_of(&kc, &uid).await.is_empty());
    patch(
        &kc,
        "cronjob",
        "tick",
        false,
        json!({"spec": {"suspend": false}}),
    )
    .await;

    let jobs = eventually(20, "a job for the missed run", || async {
        let j = jobs_of(&kc, &uid).await;
        (!j.is_empty()).then_some(j)
    })
    .await;
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    let job = &jobs[0];
    let name = name_of(job);
    // Named after the scheduled minute, which is shown in the CronJob's zone.
    assert_eq!(name, format!("tick-{}", due / 60));
    let stamp = job["metadata"]["annotations"][ANNOTATION].as_str().unwrap();
    assert!(stamp.ends_with(":00+05:30"), "{stamp}");
    assert_eq!(stamp.parse::<Timestamp>().unwrap().as_second(), due);
    // The template's labels and annotations, the controller reference.
    assert_eq!(job["metadata"]["labels"]["app"], "tick");
    assert_eq!(job["metadata"]["annotations"]["note"], "from-template");
    let r = &job["metadata"]["ownerReferences"][0];
    assert_eq!(r["kind"], "CronJob");
    assert_eq!(r["apiVersion"], "batch/v1");
    assert_eq!(r["name"], "tick");
    assert_eq!(r["controller"], true);
    assert_eq!(r["blockOwnerDeletion"], true);
    assert_eq!(
        job["spec"]["template"]["spec"]["containers"][0]["image"],
        "busybox"
    );

    // Status: the active Job and the schedule time.
    let cj = eventually(20, "status.active", || async {
        get(&kc, &["cronjob", "tick"]).await.filter(|c| {
            c["status"]["active"]
                .as_array()
                .is_some_and(|a| a.len() == 1)
        })
    })
    .await;
    let active = &cj["status"]["active"][0];
    assert_eq!(active["kind"], "Job");
    assert_eq!(active["apiVersion"], "batch/v1");
    assert_eq!(active["name"], name.as_str());
    assert_eq!(active["namespace"], "default");
    assert_eq!(active["uid"], job["metadata"]["uid"]);
    assert_eq!(cj["status"]["lastScheduleTime"], rfc3339(due).as_str());
    expect_event(
        &kc,
        "tick",
        "SuccessfulCreate",
        &format!("Created job {name}"),
    )
    .await;
    assert!(events(&kc, "default", "tick", "TooManyMissedTimes")
        .await
        .is_empty());

    // The Job completes: it leaves the active list and sets lastSuccessfulTime.
    let end = time_from_now(0);
    finish(&kc, &name, true, &time_from_now(-5), &end).await;
    let cj = eventually(20, "lastSuccessfulTime", || async {
        get(&kc, &["cronjob", "tick"])
            .await
            .filter(|c| c["status"]["lastSuccessfulTime"].is_string())
    })
    .await;
    assert_eq!(cj["status"]["lastSuccessfulTime"], end.as_str());
    // No Job active: the list is left out (omitempty), as upstream.
    assert!(cj["status"]["active"].is_null(), "{cj}");
    expect_event(
        &kc,
        "tick",
        "SawCompletedJob",
        &format!("Saw completed job: {name}, condition: Complete"),
    )
    .await;
    // Nothing else started: the next run is tomorrow.
    assert_eq!(jobs_of(&kc, &uid).await.len(), 1);
    assert_eq!(
        events(&kc, "default", "tick", "SuccessfulCreate")
            .await
            .len(),
        1
    );

    // An active Job deleted behind the controller's back: it notices it went missing.
    let due = due_minute();
    apply(
        &kc,
        &cronjob("gone", &daily(due, 0), json!({"timeZone": "Etc/UTC"}), true),
    )
    .await;
    let gone_uid = get(&kc, &["cronjob", "gone"]).await.unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    patch(
        &kc,
        "cronjob",
        "gone",
        true,
        json!({"status": {"lastScheduleTime": rfc3339(due - 3600)}}),
    )
    .await;
    patch(
        &kc,
        "cronjob",
        "gone",
        false,
        json!({"spec": {"suspend": false}}),
    )
    .await;
    let j = eventually(20, "gone's job", || async {
        jobs_of(&kc, &gone_uid).await.into_iter().next()
    })
    .await;
    let jname = name_of(&j);
    eventually(20, "gone's active list", || async {
        get(&kc, &["cronjob", "gone"]).await.filter(|c| {
            c["status"]["active"]
                .as_array()
                .is_some_and(|a| a.len() == 1)
        })
    })
    .await;
    assert!(k(&kc, &["delete", "job", &jname]).await.ok);
    expect_event(
        &kc,
        "gone",
        "MissingJob",
        &format!("Active job went missing: {jname}"),
    )
    .await;
    eventually(20, "gone's active list emptied", || async {
        get(&kc, &["cronjob", "gone"])
            .await
            .filter(|c| c["status"]["active"].is_null())
    })
    .await;
    // Already run for that time: not started again.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(jobs_of(&kc, &gone_uid).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cronjob_too_many_missed_and_invalid_schedule_events() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    let _cm = start_cm(&kc, &["cronjob-controller"]).await;

    // 200 minutes missed: the event, and still a Job for the latest one.
    apply(&kc, &cronjob("late", "* * * * *", json!({}), true)).await;
    let uid = get(&kc, &["cronjob", "late"]).await.unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    patch(
        &kc,
        "cronjob",
        "late",
        true,
        json!({"status": {"lastScheduleTime": time_from_now(-200 * 60)}}),
    )
    .await;
    patch(
        &kc,
        "cronjob",
        "late",
        false,
        json!({"spec": {"suspend": false}}),
    )
    .await;
    expect_event(
        &kc,
        "late",
        "TooManyMissedTimes",
        "too many missed start times. Set or decrease .spec.startingDeadlineSeconds or check clock skew",
    )
    .await;
    let jobs = eventually(20, "late's job", || async {
        let j = jobs_of(&kc, &uid).await;
        (!j.is_empty()).then_some(j)
    })
    .await;
    let stamp = jobs[0]["metadata"]["annotations"][ANNOTATION]
        .as_str()
        .unwrap();
    // UTC without spec.timeZone.
    assert!(stamp.ends_with(":00Z"), "{stamp}");
    let scheduled: Timestamp = stamp.parse().unwrap();
    assert!(Timestamp::now().as_second() - scheduled.as_second() < 120);

    // February 30th never comes: upstream's InvalidSchedule event.
    apply(&kc, &cronjob("never", "0 0 30 2 *", json!({}), false)).await;
    expect_event(
        &kc,
        "never",
        "InvalidSchedule",
        "invalid schedule: 0 0 30 2 * : time difference between two schedules is less than 1 second",
    )
    .await;

    // The API server refuses what the controller could not parse.
    let out = k_in(
        &kc,
        &["create", "-f", "-"],
        Some(&cronjob("bad", "61 * * * *", json!({}), false)),
    )
    .await;
    assert!(!out.ok);
    assert!(
        out.stderr
            .contains("end of range (61) above maximum (59): 61"),
        "{}",
        out.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cronjob_every_descriptor_fires_after_its_interval() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    let _cm = start_cm(&kc, &["cronjob-controller"]).await;
    apply(&kc, &cronjob("often", "@every 4s", json!({}), false)).await;
    let cj = get(&kc, &["cronjob", "often"]).await.unwrap();
    let uid = cj["metadata"]["uid"].as_str().unwrap().to_owned();
    let created: Timestamp = cj["metadata"]["creationTimestamp"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    // Not before its time (the controller requeues for it; nothing polls).
    while Timestamp::now().as_second() < created.as_second() + 3 {
        assert!(jobs_of(&kc, &uid).await.is_empty());
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let job = eventually(10, "the first run", || async {
        jobs_of(&kc, &uid).await.into_iter().next()
    })
    .await;
    let at = Timestamp::now();
    let stamp: Timestamp = job["metadata"]["annotations"][ANNOTATION]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(stamp.as_second(), created.as_second() + 4);
    assert!(
        at.as_second() - stamp.as_second() <= 3,
        "late: {at} vs {stamp}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cronjob_history_limits_unexpected_jobs_and_create_from() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    let _cm = start_cm(&kc, &["cronjob-controller"]).await;
    apply(
        &kc,
        &cronjob(
            "hist",
            "0 0 1 1 *",
            json!({"successfulJobsHistoryLimit": 2, "failedJobsHistoryLimit": 1}),
            true,
        ),
    )
    .await;
    let uid = get(&kc, &["cronjob", "hist"]).await.unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();

    // `kubectl create job --from=cronjob/…` makes Jobs the CronJob controls.
    for n in ["s1", "s2", "s3", "s4", "f1", "f2"] {
        let out = k(
            &kc,
            &["create", "job", &format!("hist-{n}"), "--from=cronjob/hist"],
        )
        .await;
        assert!(out.ok, "{}", out.stderr);
    }
    let j = get(&kc, &["job", "hist-s1"]).await.unwrap();
    assert_eq!(
        j["metadata"]["annotations"]["cronjob.kubernetes.io/instantiate"],
        "manual"
    );
    assert_eq!(j["metadata"]["ownerReferences"][0]["uid"], uid.as_str());
    assert_eq!(j["metadata"]["labels"]["app"], "hist");
    // Running Jobs it did not start: UnexpectedJob.
    let unexpected = eventually(20, "six UnexpectedJob events", || async {
        let e = events(&kc, "default", "hist", "UnexpectedJob").await;
        (e.len() >= 6).then_some(e)
    })
    .await;
    assert!(unexpected
        .contains(&"Saw a job that the controller did not create or forgot: hist-s3".to_string()));

    // Finish them with increasing start times; the oldest beyond the limits go.
    for (i, n) in ["s1", "s2", "s3", "s4"].iter().enumerate() {
        let start = time_from_now(-100 + i as i64 * 10);
        finish(&kc, &format!("hist-{n}"), true, &start, &time_from_now(-50)).await;
    }
    finish(
        &kc,
        "hist-f1",
        false,
        &time_from_now(-90),
        &time_from_now(-50),
    )
    .await;
    finish(
        &kc,
        "hist-f2",
        false,
        &time_from_now(-80),
        &time_from_now(-50),
    )
    .await;
    let left = eventually(30, "history trimmed to 2 + 1", || async {
        let mut names: Vec<String> = jobs_of(&kc, &uid).await.iter().map(name_of).collect();
        names.sort();
        (names.len() == 3).then_some(names)
    })
    .await;
    assert_eq!(left, vec!["hist-f2", "hist-s3", "hist-s4"]);
    let mut deleted = events(&kc, "default", "hist", "SuccessfulDelete").await;
    deleted.sort();
    assert_eq!(
        deleted,
        vec![
            "Deleted job hist-f1",
            "Deleted job hist-s1",
            "Deleted job hist-s2"
        ]
    );
    // Suspended: cleaned up, but nothing started.
    assert!(events(&kc, "default", "hist", "SuccessfulCreate")
        .await
        .is_empty());

    // The status subresource takes metadata too (cronJobStatusStrategy resets only spec).
    patch(
        &kc,
        "cronjob",
        "hist",
        true,
        json!({"metadata": {"annotations": {"patchedstatus": "true"}},
               "spec": {"suspend": false},
               "status": {"lastScheduleTime": time_from_now(0)}}),
    )
    .await;
    let cj = get(&kc, &["cronjob", "hist"]).await.unwrap();
    assert_eq!(cj["metadata"]["annotations"]["patchedstatus"], "true");
    assert_eq!(cj["spec"]["suspend"], true);
}

/// Sets up a resumed CronJob whose daily run was due two minutes ago while a Job
/// `<name>-manual` is in its active list; returns the CronJob's uid and the due minute.
async fn due_with_active_job(kc: &Path, name: &str, policy: &str) -> (String, i64) {
    let due = due_minute();
    apply(
        kc,
        &cronjob(
            name,
            &daily(due, 0),
            json!({"concurrencyPolicy": policy, "timeZone": "Etc/UTC"}),
            true,
        ),
    )
    .await;
    let uid = get(kc, &["cronjob", name]).await.unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    let manual = format!("{name}-manual");
    let out = k(
        kc,
        &["create", "job", &manual, &format!("--from=cronjob/{name}")],
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let j = get(kc, &["job", &manual]).await.unwrap();
    patch(
        kc,
        "cronjob",
        name,
        true,
        json!({"status": {
            "lastScheduleTime": rfc3339(due - 3600),
            "active": [{"kind": "Job", "apiVersion": "batch/v1", "namespace": "default",
                        "name": manual, "uid": j["metadata"]["uid"]}],
        }}),
    )
    .await;
    patch(
        kc,
        "cronjob",
        name,
        false,
        json!({"spec": {"suspend": false}}),
    )
    .await;
    (uid, due)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cronjob_concurrency_policies_forbid_and_replace() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    let _cm = start_cm(&kc, &["cronjob-controller"]).await;

    // Forbid: the due run is skipped while the previous one runs.
    let (forbid, _) = due_with_active_job(&kc, "forbid", "Forbid").await;
    expect_event(
        &kc,
        "forbid",
        "JobAlreadyActive",
        "Not starting job because prior execution is running and concurrency policy is Forbid",
    )
    .await;
    let names: Vec<String> = jobs_of(&kc, &forbid).await.iter().map(name_of).collect();
    assert_eq!(names, vec!["forbid-manual"]);

    // Replace: the running one is deleted and the due one started.
    let (replace, due) = due_with_active_job(&kc, "replace", "Replace").await;
    let new = eventually(20, "the replacement job", || async {
        let j: Vec<String> = jobs_of(&kc, &replace).await.iter().map(name_of).collect();
        (j.len() == 1 && j[0] != "replace-manual").then(|| j[0].clone())
    })
    .await;
    assert_eq!(new, format!("replace-{}", due / 60));
    expect_event(
        &kc,
        "replace",
        "SuccessfulDelete",
        "Deleted job replace-manual",
    )
    .await;
    let cj = eventually(20, "active list with the new job", || async {
        get(&kc, &["cronjob", "replace"]).await.filter(|c| {
            c["status"]["active"]
                .as_array()
                .is_some_and(|a| a.len() == 1 && a[0]["name"] == new.as_str())
        })
    })
    .await;
    assert!(cj["status"]["lastScheduleTime"].is_string());

    // Allow (the default): both run.
    let (allow, due) = due_with_active_job(&kc, "allow", "Allow").await;
    let names = eventually(20, "a second job", || async {
        let mut j: Vec<String> = jobs_of(&kc, &allow).await.iter().map(name_of).collect();
        j.sort();
        (j.len() == 2).then_some(j)
    })
    .await;
    assert_eq!(
        names,
        vec![format!("allow-{}", due / 60), "allow-manual".into()]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ttl_after_finished_deletes_finished_jobs_when_due() {
    let (server, _dir) = start_apiserver().await;
    let kc = server.admin_kubeconfig.clone();
    let _cm = start_cm(&kc, &["ttl-after-finished-controller"]).await;
    let job = |name: &str, ttl: i64| {
        json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"ttlSecondsAfterFinished": ttl, "template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "c", "image": "busybox"}],
            }}},
        })
        .to_string()
    };
    apply(&kc, &job("short", 2)).await;
    apply(&kc, &job("long", 3600)).await;
    apply(&kc, &job("running", 0)).await;

    // Finished now (whole seconds), with a TTL of 2 s.
    let now = Timestamp::now();
    let end = Timestamp::from_second(now.as_second()).unwrap();
    let end_s = end.to_string();
    finish(&kc, "short", true, &time_from_now(-10), &end_s).await;
    finish(&kc, "long", false, &time_from_now(-10), &end_s).await;
    // Not yet: still there, not being deleted, a second after finishing.
    tokio::time::sleep(Duration::from_millis(
        u64::try_from(1000 - (now.as_millisecond() - end.as_millisecond())).unwrap_or(0),
    ))
    .await;
    let j = get(&kc, &["job", "short"]).await.unwrap();
    assert!(j["metadata"]["deletionTimestamp"].is_null(), "{j}");
    // Deleted in the foreground (no garbage collector runs here, so the Job waits with the
    // foregroundDeletion finalizer), at or after the expiry.
    let j = eventually(10, "short deleted", || async {
        get(&kc, &["job", "short"])
            .await
            .filter(|j| j["metadata"]["deletionTimestamp"].is_string())
    })
    .await;
    let deleted: Timestamp = j["metadata"]["deletionTimestamp"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        deleted.as_second() >= end.as_second() + 2,
        "deleted at {deleted}, finished at {end}"
    );
    assert!(
        deleted.as_second() <= end.as_second() + 4,
        "deleted at {deleted}"
    );
    assert_eq!(j["metadata"]["finalizers"], json!(["foregroundDeletion"]));
    // The other finished Job's TTL is an hour; the unfinished one has none to count.
    for n in ["long", "running"] {
        let j = get(&kc, &["job", n]).await.unwrap();
        assert!(j["metadata"]["deletionTimestamp"].is_null(), "{j}");
    }
    // Lowering the TTL of the finished one makes it due at once.
    patch(
        &kc,
        "job",
        "long",
        false,
        json!({"spec": {"ttlSecondsAfterFinished": 1}}),
    )
    .await;
    eventually(10, "long deleted", || async {
        get(&kc, &["job", "long"])
            .await
            .filter(|j| j["metadata"]["deletionTimestamp"].is_string())
    })
    .await;
    let j = get(&kc, &["job", "running"]).await.unwrap();
    assert!(j["metadata"]["deletionTimestamp"].is_null(), "{j}");
}
