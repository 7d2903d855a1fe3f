//! MachineSets (a number of Machines from one template: each Machine's bootstrap config
//! and infrastructure machine cloned from the template's templates) and MachineDeployments
//! (a MachineSet per template revision; a changed template gets a new MachineSet, scaled
//! up before the old one is scaled down and removed).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kumo_client::worker::SyncError;
use serde_json::{json, Value};

use crate::object::*;
use crate::{
    Error, Manager, CLUSTER_NAME_LABEL, DEPLOYMENT_NAME_LABEL, MACHINE_DEPLOYMENT_FINALIZER,
    MACHINE_SET_FINALIZER, SET_NAME_LABEL,
};

/// The MachineSet label of a MachineDeployment's template revision.
pub const TEMPLATE_HASH_LABEL: &str = "machine-template-hash";

fn replicas(spec: &Value) -> i64 {
    spec.get("replicas").and_then(Value::as_i64).unwrap_or(1)
}

/// Creates a Machine of `template` (a Machine template: metadata and spec) named `name`,
/// its bootstrap config and infrastructure machine cloned from the template's templates.
pub async fn create_machine(
    m: &Manager,
    ns: &str,
    cluster: &str,
    name: &str,
    template: &Value,
    labels: BTreeMap<String, String>,
    owner: OwnerReference,
) -> Result<(), Error> {
    let mut spec = template.get("spec").cloned().unwrap_or_else(|| json!({}));
    spec["clusterName"] = cluster.into();
    let mut all_labels: BTreeMap<String, String> = template
        .pointer("/metadata/labels")
        .and_then(|l| serde_json::from_value(l.clone()).ok())
        .unwrap_or_default();
    all_labels.extend(labels);
    all_labels.insert(CLUSTER_NAME_LABEL.into(), cluster.into());
    if let Some(r) = spec
        .pointer("/bootstrap/configRef")
        .cloned()
        .filter(|r| r.get("name").is_some())
    {
        let made = m
            .refs
            .clone_template(ns, &r, name, &all_labels, owner.clone())
            .await?;
        spec["bootstrap"]["configRef"] = made;
    }
    if let Some(r) = spec.get("infrastructureRef").cloned() {
        let made = m
            .refs
            .clone_template(ns, &r, name, &all_labels, owner.clone())
            .await?;
        spec["infrastructureRef"] = made;
    }
    let mut x = Machine::new(ns, name, spec);
    x.metadata.labels = Some(all_labels);
    x.metadata.annotations = template
        .pointer("/metadata/annotations")
        .and_then(|a| serde_json::from_value(a.clone()).ok());
    x.metadata.owner_references = Some(vec![owner]);
    match m
        .api::<MachineKind>(ns)
        .create(&PostParams::default(), &x)
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if kumo_client::error::is_already_exists(&e) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

pub async fn sync_set(m: &Manager, key: &str) -> Result<(), SyncError> {
    let Some(s) = m.machine_sets.get(key) else {
        return Ok(());
    };
    let ns = s.namespace();
    let cluster = s.cluster_name().unwrap_or_default().to_owned();
    let owned = Manager::controlled_by(m.machines.list(), &*s);
    if s.deleting() {
        return m.delete_children(&*s, &owned, MACHINE_SET_FINALIZER).await;
    }
    if m.add_finalizer(&*s, MACHINE_SET_FINALIZER).await? {
        return Ok(());
    }
    if s.label(CLUSTER_NAME_LABEL) != Some(cluster.as_str()) {
        m.patch_meta(&*s, json!({"labels": {CLUSTER_NAME_LABEL: cluster}}))
            .await?;
        return Ok(());
    }
    // Remediation: a Machine its health check marked for its owner is replaced.
    for x in owned.iter().filter(|x| !x.deleting()) {
        if is_waiting_remediation(x) {
            let cs = merge_conditions(
                &x.status,
                &[Condition::new("OwnerRemediated", false, "MachineDeleting")
                    .message("Machine is deleting")],
                x.metadata.generation,
            );
            m.api::<MachineKind>(ns)
                .patch_status(
                    x.name(),
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"conditions": cs}})),
                )
                .await
                .map_err(Error::from)?;
            delete_machine(
                m,
                &s,
                x,
                "MachineRemediated",
                format!("Machine {} deleted by remediation", x.name()),
            )
            .await;
        }
    }
    let want = replicas(&s.spec);
    let live: Vec<_> = owned
        .iter()
        .filter(|x| !x.deleting() && !is_waiting_remediation(x))
        .collect();
    let have = live.len() as i64;
    let template = s.spec.get("template").cloned().unwrap_or_default();
    // What this sync deletes is no longer counted below (the cache has not seen it go).
    let mut deleted: Vec<String> = Vec::new();
    if have < want {
        // Machines are made only once the Cluster's control plane can take them
        // (upstream's preflight checks), else the bootstrap data waits anyway.
        let mut labels = BTreeMap::from([(SET_NAME_LABEL.to_owned(), s.name().to_owned())]);
        if let Some(d) = s.label(DEPLOYMENT_NAME_LABEL) {
            labels.insert(DEPLOYMENT_NAME_LABEL.into(), d.into());
        }
        for _ in have..want {
            let name = format!("{}-{}", s.name(), crate::random_suffix());
            create_machine(
                m,
                ns,
                &cluster,
                &name,
                &template,
                labels.clone(),
                s.owner_ref(),
            )
            .await?;
            m.event(
                &*s,
                "Normal",
                "SuccessfulCreate",
                format!("Created Machine {name:?}"),
            )
            .await;
        }
    } else if have > want {
        // Unhealthy ones first, then the newest (upstream's deletion order, "Newest").
        let mut victims = live.clone();
        victims.sort_by_key(|x| {
            (
                is_true(&x.status, "Ready"),
                std::cmp::Reverse(x.metadata.creation_timestamp.clone().map(|t| t.0)),
            )
        });
        for x in victims.into_iter().take((have - want) as usize) {
            deleted.push(x.name().to_owned());
            delete_machine(
                m,
                &s,
                x,
                "SuccessfulDelete",
                format!("Deleted Machine {:?}", x.name()),
            )
            .await;
        }
    }
    let count = |f: &dyn Fn(&Machine) -> bool| {
        live.iter()
            .filter(|x| !deleted.iter().any(|d| d == x.name()) && f(x))
            .count() as i64
    };
    let ready = count(&|x| is_true(&x.status, "Ready"));
    let available = count(&|x| is_true(&x.status, "Available"));
    let mut conditions = vec![
        Condition::new("Deleting", false, "NotDeleting"),
        Condition::new("Paused", false, "NotPaused"),
        Condition::new(
            "MachinesUpToDate",
            true,
            if have == 0 { "NoReplicas" } else { "UpToDate" },
        ),
    ];
    conditions.extend(crate::scaling_conditions(have, want, ready));
    let selector = selector_text(&s.spec);
    let status = json!({
        "replicas": have - deleted.len() as i64, "readyReplicas": ready, "availableReplicas": available,
        "upToDateReplicas": have - deleted.len() as i64,
        "selector": selector, "observedGeneration": s.metadata.generation,
        "conditions": merge_conditions(&s.status, &conditions, s.metadata.generation),
    });
    m.patch_status(&*s, status).await?;
    Ok(())
}

/// Deletes machine `x` of set `s`, said in an event of `reason`.
async fn delete_machine(m: &Manager, s: &MachineSet, x: &Machine, reason: &str, msg: String) {
    let _ = m
        .api::<MachineKind>(x.namespace())
        .delete(x.name(), &DeleteParams::background())
        .await;
    m.event(s, "Normal", reason, msg).await;
}

/// Whether a health check marked machine `x` for its owner to remediate.
pub(crate) fn is_waiting_remediation(x: &Machine) -> bool {
    x.status
        .get("conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.get("type").and_then(Value::as_str) == Some("OwnerRemediated")
                    && c.get("status").and_then(Value::as_str) == Some("False")
            })
        })
}

/// `spec.rollout.strategy.rollingUpdate`'s (maxSurge, maxUnavailable) for `want`
/// replicas: integers or percentages (the surge rounded up, the unavailable down), 1 and 0
/// by default; never both 0.
fn rollout_limits(spec: &Value, want: i64) -> (i64, i64) {
    let read = |k: &str, default: i64, up: bool| -> i64 {
        match spec.pointer(&format!("/rollout/strategy/rollingUpdate/{k}")) {
            Some(Value::Number(n)) => n.as_i64().unwrap_or(default),
            Some(Value::String(p)) => match p.strip_suffix('%').and_then(|p| p.parse::<i64>().ok())
            {
                Some(pct) if up => (pct * want + 99) / 100,
                Some(pct) => pct * want / 100,
                None => default,
            },
            _ => default,
        }
    };
    let (surge, unavailable) = (read("maxSurge", 1, true), read("maxUnavailable", 0, false));
    if surge == 0 && unavailable == 0 {
        (1, 0)
    } else {
        (surge, unavailable)
    }
}

/// Sets MachineSet `s`'s replicas, said in an event of its deployment `d`.
async fn scale_set(
    m: &Manager,
    d: &MachineDeployment,
    s: &MachineSet,
    to: i64,
) -> Result<(), Error> {
    let from = replicas(&s.spec);
    m.api::<MachineSetKind>(s.namespace())
        .patch(
            s.name(),
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": to}})),
        )
        .await?;
    let (reason, how) = if to > from {
        ("SuccessfulScaleUp", "up")
    } else {
        ("SuccessfulScaleDown", "down")
    };
    m.event(
        d,
        "Normal",
        reason,
        format!(
            "Scaled {how} MachineSet {} from {from} to {to} replicas",
            s.name()
        ),
    )
    .await;
    Ok(())
}

/// `spec.selector.matchLabels` as a label selector string.
fn selector_text(spec: &Value) -> String {
    spec.pointer("/selector/matchLabels")
        .and_then(Value::as_object)
        .map(|o| {
            o.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default()
}

/// A MachineDeployment's machine's UpToDate condition: whether the template of the
/// MachineSet it belongs to is the deployment's (None for a machine of no deployment).
pub(crate) fn deployment_up_to_date(m: &Manager, x: &Machine) -> Option<Condition> {
    let ns = x.namespace();
    let set = x.controller_of_kind::<MachineSetKind>()?;
    let set = m.machine_sets.get(&format!("{ns}/{}", set.name))?;
    let d = set.controller_of_kind::<MachineDeploymentKind>()?;
    let d = m.deployments.get(&format!("{ns}/{}", d.name))?;
    let why = template_differences(
        set.spec.get("template").unwrap_or(&Value::Null),
        d.spec.get("template").unwrap_or(&Value::Null),
    );
    Some(if why.is_empty() {
        Condition::new("UpToDate", true, "UpToDate")
    } else {
        let lines: Vec<String> = why.iter().map(|w| format!("* {w}")).collect();
        Condition::new("UpToDate", false, "NotUpToDate").message(lines.join("\n"))
    })
}

/// How machine template `current` differs from `desired` in what makes a machine
/// (upstream's MachineTemplateUpToDate condition messages).
fn template_differences(current: &Value, desired: &Value) -> Vec<String> {
    let at = |v: &Value, p: &str| v.pointer(p).cloned().unwrap_or(Value::Null);
    let text = |v: &Value, p: &str| str_at(v, p).unwrap_or_default().to_owned();
    let mut why = Vec::new();
    if at(current, "/spec/version") != at(desired, "/spec/version") {
        why.push(format!(
            "Version {}, {} required",
            text(current, "/spec/version"),
            text(desired, "/spec/version")
        ));
    }
    if at(current, "/spec/bootstrap") != at(desired, "/spec/bootstrap") {
        match str_at(current, "/spec/bootstrap/configRef/kind") {
            Some(kind) => why.push(format!(
                "{} is not up-to-date",
                kind.strip_suffix("Template").unwrap_or(kind)
            )),
            None => why.push(format!(
                "spec.bootstrap.dataSecretName {}, {} required",
                str_at(current, "/spec/bootstrap/dataSecretName").unwrap_or("nil"),
                str_at(desired, "/spec/bootstrap/dataSecretName").unwrap_or("nil")
            )),
        }
    }
    if at(current, "/spec/infrastructureRef") != at(desired, "/spec/infrastructureRef") {
        let kind = text(current, "/spec/infrastructureRef/kind");
        why.push(format!(
            "{} is not up-to-date",
            kind.strip_suffix("Template").unwrap_or(&kind)
        ));
    }
    if at(current, "/spec/failureDomain") != at(desired, "/spec/failureDomain") {
        why.push(format!(
            "Failure domain {}, {} required",
            text(current, "/spec/failureDomain"),
            text(desired, "/spec/failureDomain")
        ));
    }
    why
}

/// A short stable hash of a template (the MachineSet name's suffix).
fn template_hash(t: &Value) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, t.to_string().as_bytes());
    // Upstream's hashes are decimal-free strings of safe characters.
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    d.as_ref()[..10]
        .iter()
        .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
        .collect()
}

pub async fn sync_deployment(m: &Manager, key: &str) -> Result<(), SyncError> {
    let Some(d) = m.deployments.get(key) else {
        return Ok(());
    };
    let ns = d.namespace();
    let cluster = d.cluster_name().unwrap_or_default().to_owned();
    let sets = Manager::controlled_by(m.machine_sets.list(), &*d);
    if d.deleting() {
        return m
            .delete_children(&*d, &sets, MACHINE_DEPLOYMENT_FINALIZER)
            .await;
    }
    if m.add_finalizer(&*d, MACHINE_DEPLOYMENT_FINALIZER).await? {
        return Ok(());
    }
    if d.label(CLUSTER_NAME_LABEL) != Some(cluster.as_str()) {
        m.patch_meta(&*d, json!({"labels": {CLUSTER_NAME_LABEL: cluster}}))
            .await?;
        return Ok(());
    }
    let want = replicas(&d.spec);
    let template = d.spec.get("template").cloned().unwrap_or_default();
    let hash = template_hash(&template);
    let current = sets
        .iter()
        .find(|s| s.label(TEMPLATE_HASH_LABEL) == Some(hash.as_str()));
    // Decisions rest on the sets' status: wait until each has seen its last change (as
    // upstream waits for observedGeneration), or a scale-down would count machines twice.
    let stale = sets.iter().any(|s| {
        s.status.get("observedGeneration").and_then(Value::as_i64) < s.metadata.generation
    });
    if stale {
        return Err(SyncError::After(Duration::from_millis(200)));
    }
    let (surge, unavailable) = rollout_limits(&d.spec, want);
    let spec_total: i64 = sets
        .iter()
        .filter(|s| !s.deleting())
        .map(|s| replicas(&s.spec))
        .sum();
    let status_of = |s: &MachineSet, k: &str| s.status.get(k).and_then(Value::as_i64).unwrap_or(0);
    match current {
        None => {
            // The new revision starts with what the surge allows beside the old ones.
            let first = (want + surge - spec_total).clamp(0, want);
            let name = format!("{}-{hash}", d.name());
            let mut tmpl = template.clone();
            tmpl["metadata"]["labels"][DEPLOYMENT_NAME_LABEL] = d.name().into();
            tmpl["metadata"]["labels"][TEMPLATE_HASH_LABEL] = hash.clone().into();
            let mut selector = d
                .spec
                .get("selector")
                .cloned()
                .unwrap_or_else(|| json!({"matchLabels": {}}));
            selector["matchLabels"][TEMPLATE_HASH_LABEL] = hash.clone().into();
            let mut s = MachineSet::new(
                ns,
                &name,
                json!({
                    "clusterName": cluster,
                    "replicas": first,
                    "selector": selector,
                    "template": tmpl,
                }),
            );
            s.metadata.labels = Some(BTreeMap::from([
                (CLUSTER_NAME_LABEL.to_owned(), cluster.clone()),
                (DEPLOYMENT_NAME_LABEL.to_owned(), d.name().to_owned()),
                (TEMPLATE_HASH_LABEL.to_owned(), hash.clone()),
            ]));
            s.metadata.owner_references = Some(vec![d.owner_ref()]);
            match m
                .api::<MachineSetKind>(ns)
                .create(&PostParams::default(), &s)
                .await
            {
                Ok(_) => {
                    m.event(
                        &*d,
                        "Normal",
                        "SuccessfulCreate",
                        format!("Created MachineSet {name:?} with {first} replicas"),
                    )
                    .await;
                }
                Err(e) if kumo_client::error::is_already_exists(&e) => {}
                Err(e) => return Err(Error::from(e).into()),
            }
        }
        Some(cur) => {
            let olds: Vec<_> = sets
                .iter()
                .filter(|s| s.name() != cur.name() && !s.deleting())
                .collect();
            let cur_replicas = replicas(&cur.spec);
            // Scale the new revision up within the surge (or straight to the replicas
            // when it is the only one).
            let target = if olds.is_empty() {
                want
            } else {
                (cur_replicas + (want + surge - spec_total).max(0)).min(want)
            };
            if target != cur_replicas && (olds.is_empty() || target > cur_replicas) {
                scale_set(m, &d, cur, target).await?;
            }
            // Scale the old ones down as far as the available machines allow
            // (oldest first), and remove them once empty.
            let available: i64 = sets.iter().map(|s| status_of(s, "availableReplicas")).sum();
            let mut room = available - (want - unavailable);
            let mut olds = olds;
            olds.sort_by_key(|s| s.metadata.creation_timestamp.clone().map(|t| t.0));
            for old in olds {
                let r = replicas(&old.spec);
                if r == 0 {
                    if status_of(old, "replicas") == 0 {
                        let _ = m
                            .api::<MachineSetKind>(ns)
                            .delete(old.name(), &DeleteParams::background())
                            .await;
                    }
                    continue;
                }
                // Machines of the old revision that are not available cost nothing.
                let unhealthy = (r - status_of(old, "availableReplicas")).max(0);
                let down = (unhealthy + room.max(0)).min(r);
                if down > 0 {
                    room -= down - unhealthy.min(down);
                    scale_set(m, &d, old, r - down).await?;
                }
            }
        }
    }
    let sum = |k: &str| {
        sets.iter()
            .map(|s| s.status.get(k).and_then(Value::as_i64).unwrap_or(0))
            .sum::<i64>()
    };
    let (have, ready, available) = (
        sum("replicas"),
        sum("readyReplicas"),
        sum("availableReplicas"),
    );
    let up_to_date = current
        .map(|c| {
            c.status
                .get("replicas")
                .and_then(Value::as_i64)
                .unwrap_or(0)
        })
        .unwrap_or(0);
    let all = m.machines.list();
    let machines: Vec<_> = sets
        .iter()
        .flat_map(|s| Manager::controlled_by(all.clone(), &**s))
        .collect();
    let mut conditions = vec![
        Condition::new("Deleting", false, "NotDeleting"),
        Condition::new("Paused", false, "NotPaused"),
        if available >= want {
            Condition::new("Available", true, "Available")
        } else {
            Condition::new("Available", false, "NotAvailable").message(format!("{available} available replicas, at least {want} required (spec.strategy.rollout.maxUnavailable is 0, spec.replicas is {want})"))
        },
        crate::rolling_out(machines.iter().map(|x| &**x)),
    ];
    conditions.extend(crate::scaling_conditions(have, want, ready));
    let phase = if have < want {
        "ScalingUp"
    } else if have > want {
        "ScalingDown"
    } else if available >= want {
        "Running"
    } else {
        "ScalingUp"
    };
    let status = json!({
        "replicas": have, "readyReplicas": ready, "availableReplicas": available, "upToDateReplicas": up_to_date,
        "selector": selector_text(&d.spec), "phase": phase, "observedGeneration": d.metadata.generation,
        "conditions": merge_conditions(&d.status, &conditions, d.metadata.generation),
    });
    m.patch_status(&*d, status).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rollout_limits_read_integers_and_percentages() {
        assert_eq!(rollout_limits(&json!({}), 3), (1, 0));
        let spec = |s: Value, u: Value| json!({"rollout": {"strategy": {"rollingUpdate": {"maxSurge": s, "maxUnavailable": u}}}});
        assert_eq!(rollout_limits(&spec(json!(2), json!(1)), 3), (2, 1));
        assert_eq!(rollout_limits(&spec(json!("25%"), json!("25%")), 3), (1, 0));
        assert_eq!(rollout_limits(&spec(json!("50%"), json!("50%")), 5), (3, 2));
        assert_eq!(rollout_limits(&spec(json!(0), json!(0)), 3), (1, 0));
    }

    #[test]
    fn template_differences_name_what_makes_a_machine() {
        let t = |version: &str, infra: &str, fd: Option<&str>| {
            let mut t = json!({"metadata": {"labels": {"a": version}}, "spec": {
                "version": version,
                "bootstrap": {"configRef": {"kind": "KubeadmConfigTemplate", "name": "b"}},
                "infrastructureRef": {"kind": "KumoMachineTemplate", "name": infra},
            }});
            if let Some(fd) = fd {
                t["spec"]["failureDomain"] = fd.into();
            }
            t
        };
        let a = t("v1.36.0", "x", None);
        assert!(template_differences(&a, &a).is_empty());
        assert_eq!(
            template_differences(&a, &t("v1.37.2", "y", Some("kumo-1a"))),
            [
                "Version v1.36.0, v1.37.2 required",
                "KumoMachine is not up-to-date",
                "Failure domain , kumo-1a required"
            ]
        );
        let secret = json!({"spec": {"bootstrap": {"dataSecretName": "s"}}});
        assert_eq!(
            template_differences(
                &secret,
                &json!({"spec": {"bootstrap": {"dataSecretName": "t"}}})
            ),
            ["spec.bootstrap.dataSecretName s, t required"]
        );
    }
}
