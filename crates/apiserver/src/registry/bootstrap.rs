//! The API objects kube-apiserver creates at start besides its namespaces (its post-start
//! hooks): the RBAC bootstrap policy, the system PriorityClasses and the API Priority and
//! Fairness configuration. Missing objects are created; existing ones are reconciled as
//! upstream does (RBAC: missing rules and subjects added unless autoupdate is `false`;
//! flowcontrol: the spec restored while autoupdate-spec is `true`), and never otherwise
//! overwritten.

use std::collections::BTreeMap;

use anyhow::{anyhow, Result};
use kumo_apimachinery::status::ApiError;
use serde_json::Value;

use super::{flowcontrol, name_of, rbac, scheduling, str_at, Registry};
use crate::rest::{Reply, Request, Rest};

/// Creates or reconciles every bootstrap object.
pub async fn bootstrap_policy(rest: &Rest, registry: &Registry) -> Result<()> {
    let mut objects =
        rbac::bootstrap_objects().map_err(|e| anyhow!("rbac bootstrap policy: {e}"))?;
    objects.extend(scheduling::bootstrap_objects());
    objects.extend(
        flowcontrol::bootstrap_objects().map_err(|e| anyhow!("flowcontrol bootstrap: {e}"))?,
    );
    let query = BTreeMap::new();
    for (plural, wanted) in objects {
        let api_version = str_at(&wanted, "/apiVersion");
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let Some(res) = registry.find(group, version, plural) else {
            continue;
        };
        let ns = wanted
            .pointer("/metadata/namespace")
            .and_then(Value::as_str);
        let name = name_of(&wanted);
        let req = |body| Request::json(&query, body);
        let existing = match rest.get(&res, ns, name, &req(&[])).await {
            Ok(Reply::Json(_, obj)) => Some(obj),
            Ok(Reply::Stream(_) | Reply::Raw(..)) => None,
            Err(e) if e.code == 404 => None,
            Err(e) => return Err(failed(plural, name, &e)),
        };
        let update = match &existing {
            None => {
                let body = wanted.to_string();
                match rest.create(&res, ns, &req(body.as_bytes())).await {
                    Ok(_) => {}
                    Err(e) if e.code == 409 => {}
                    Err(e) => return Err(failed(plural, name, &e)),
                }
                if plural == "flowschemas" {
                    // What kube-apiserver's APF configuration controller records once it
                    // sees the schema; the bootstrap levels exist.
                    let status = flowcontrol::found_status(&wanted);
                    let body = status.to_string();
                    if let Err(e) = rest
                        .update(&res, ns, name, Some("status"), &req(body.as_bytes()))
                        .await
                    {
                        return Err(failed(plural, name, &e));
                    }
                }
                continue;
            }
            Some(have) if group == "flowcontrol.apiserver.k8s.io" => {
                let key = format!(
                    "/metadata/annotations/{}",
                    flowcontrol::AUTOUPDATE_SPEC.replace('/', "~1")
                );
                (str_at(have, &key) == "true" && have.get("spec") != wanted.get("spec")).then(
                    || {
                        let mut out = have.clone();
                        out["spec"] = wanted.get("spec").cloned().unwrap_or(Value::Null);
                        out
                    },
                )
            }
            Some(have) if group == "rbac.authorization.k8s.io" => rbac::reconcile(have, &wanted),
            Some(_) => None,
        };
        if let Some(obj) = update {
            let body = obj.to_string();
            match rest
                .update(&res, ns, name, None, &req(body.as_bytes()))
                .await
            {
                Ok(_) => tracing::info!(resource = plural, name, "reconciled bootstrap object"),
                Err(e) if e.code == 409 => {}
                Err(e) => return Err(failed(plural, name, &e)),
            }
        }
    }
    Ok(())
}

/// A JSON request with a JSON answer.
fn failed(plural: &str, name: &str, e: &ApiError) -> anyhow::Error {
    anyhow!("bootstrapping {plural} {name}: {}", e.message)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use kumo_storage::embedded::{EmbeddedConfig, EmbeddedStore};
    use serde_json::json;

    use super::*;

    async fn send(
        rest: &Rest,
        registry: &Registry,
        plural: &str,
        name: Option<&str>,
        body: Value,
    ) -> Value {
        let res = registry
            .find("rbac.authorization.k8s.io", "v1", plural)
            .unwrap();
        let query = BTreeMap::new();
        let body = body.to_string();
        let req = Request::json(&query, body.as_bytes());
        let reply = match name {
            None => rest.create(&res, None, &req).await,
            Some(n) if body == "null" => rest.get(&res, None, n, &req).await,
            Some(n) => rest.update(&res, None, n, None, &req).await,
        };
        match reply {
            Ok(Reply::Json(_, v)) => v,
            Ok(Reply::Stream(_) | Reply::Raw(..)) => panic!("stream"),
            Err(e) => panic!("{}", e.message),
        }
    }

    #[tokio::test]
    async fn a_second_start_restores_missing_policy_and_keeps_frozen_objects() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(EmbeddedConfig::new(dir.path().join("store")))
            .await
            .unwrap();
        let rest = Rest::new(store as Arc<dyn kumo_storage::Store>);
        let registry = Registry::builtin();
        let ns = registry.find("", "v1", "namespaces").unwrap();
        let query = BTreeMap::new();
        for name in ["kube-system", "kube-public"] {
            let body = json!({"metadata": {"name": name}}).to_string();
            rest.create(&ns, None, &Request::json(&query, body.as_bytes()))
                .await
                .unwrap();
        }
        bootstrap_policy(&rest, &registry).await.unwrap();

        // The user freezes one role and trims another.
        let get =
            |name: &'static str| send(&rest, &registry, "clusterroles", Some(name), Value::Null);
        let mut frozen = get("system:basic-user").await;
        frozen["metadata"]["annotations"][rbac::AUTOUPDATE] = json!("false");
        frozen["rules"] = json!([]);
        send(
            &rest,
            &registry,
            "clusterroles",
            Some("system:basic-user"),
            frozen,
        )
        .await;
        let mut trimmed = get("system:discovery").await;
        let wanted_rules = trimmed["rules"].clone();
        trimmed["rules"] = json!([{"verbs": ["get"], "nonResourceURLs": ["/x"]}]);
        send(
            &rest,
            &registry,
            "clusterroles",
            Some("system:discovery"),
            trimmed,
        )
        .await;

        bootstrap_policy(&rest, &registry).await.unwrap();
        assert_eq!(get("system:basic-user").await["rules"], json!([]));
        let mut expected = vec![json!({"verbs": ["get"], "nonResourceURLs": ["/x"]})];
        expected.extend(wanted_rules.as_array().unwrap().iter().cloned());
        assert_eq!(get("system:discovery").await["rules"], json!(expected));
    }
}
