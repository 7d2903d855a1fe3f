//! core/v1 `bindings` (`POST /api/v1/namespaces/<ns>/bindings`): the older way to bind a
//! pod, the Binding naming the pod in its metadata. Served as upstream serves it, by the
//! same code as `pods/<name>/binding`; it is authorized as `create` on `bindings`.

use std::collections::BTreeMap;

use async_trait::async_trait;
use kumo_apimachinery::status::ApiError;
use serde_json::Value;

use super::{Resource, Strategy};
use crate::auth::{Review, ReviewContext};
use crate::rest::{Reply, Request};

pub(super) fn resources() -> Vec<Resource> {
    vec![Resource {
        group: "",
        version: "v1",
        kind: "Binding",
        plural: "bindings",
        singular: "binding",
        namespaced: true,
        short_names: &[],
        categories: &[],
        subresources: &[],
        strategy: Box::new(BindingStrategy),
    }]
}

struct BindingStrategy;

impl Strategy for BindingStrategy {
    fn verbs(&self) -> Option<&'static [&'static str]> {
        Some(&["create"])
    }
}

/// The POST handler of `bindings`.
pub struct Bindings;

#[async_trait]
impl Review for Bindings {
    fn serves(&self) -> (&'static str, &'static str, &'static str) {
        ("", "bindings", "")
    }

    async fn create(&self, ctx: ReviewContext<'_>) -> Result<(u16, Value), ApiError> {
        let ns = ctx.namespace;
        let name = ctx
            .body
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        if name.is_empty() {
            return Err(ApiError::bad_request("Name parameter required."));
        }
        let pods = ctx
            .registry
            .find("", "v1", "pods")
            .ok_or_else(|| ApiError::internal("pods are not served"))?;
        let body = ctx.body.to_string();
        let query: BTreeMap<String, String> = ctx.query.clone();
        let req = Request::json(&query, body.as_bytes());
        match ctx
            .rest
            .post_subresource(&pods, ns, &name, "binding", &req)
            .await?
        {
            Reply::Json(code, v) => Ok((code, v)),
            Reply::Raw(code, b) => Ok((
                code,
                serde_json::from_slice(&b).map_err(ApiError::internal)?,
            )),
            Reply::Stream(_) => Err(ApiError::internal("unexpected stream")),
        }
    }
}
