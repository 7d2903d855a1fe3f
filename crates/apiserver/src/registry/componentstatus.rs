//! core/v1 ComponentStatuses (`kubectl get componentstatuses`, deprecated since v1.19):
//! computed on each request, never stored, by probing what kube-apiserver probes — the
//! controller-manager's and the scheduler's /healthz on their default secure ports on
//! loopback, and the etcd the objects are stored in (`etcd-0`; kumo's embedded store is
//! not etcd and is not listed).

use std::time::Duration;

use serde_json::{json, Value};

use super::printing::col;
use super::{name_of, str_at, Column, Computed, Resource, Strategy};

pub(super) fn resources() -> Vec<Resource> {
    vec![Resource {
        group: "",
        version: "v1",
        kind: "ComponentStatus",
        plural: "componentstatuses",
        singular: "componentstatus",
        namespaced: false,
        short_names: &["cs"],
        categories: &[],
        subresources: &[],
        strategy: Box::new(ComponentStatuses),
    }]
}

/// kube-apiserver's probe timeout.
const PROBE_TIMEOUT: Duration = Duration::from_secs(20);

struct ComponentStatuses;

/// One probe result as the Healthy condition: status, message (the body), error.
fn status(name: &str, healthy: Option<bool>, message: &str, error: &str) -> Value {
    let s = match healthy {
        Some(true) => "True",
        Some(false) => "False",
        None => "Unknown",
    };
    let mut cond = json!({"type": "Healthy", "status": s});
    if !message.is_empty() {
        cond["message"] = json!(message);
    }
    if !error.is_empty() {
        cond["error"] = json!(error);
    }
    json!({
        "kind": "ComponentStatus",
        "apiVersion": "v1",
        "metadata": {"name": name},
        "conditions": [cond],
    })
}

/// GET https://127.0.0.1:<port>/healthz without verifying the certificate, as upstream's
/// HTTP prober does for these two: 2xx/3xx is success, anything else a failure with the
/// body as message, no answer unknown with the error.
async fn probe_healthz(name: &str, port: u16) -> Value {
    let url = format!("https://127.0.0.1:{port}/healthz");
    let result = tokio::time::timeout(PROBE_TIMEOUT, get_insecure(port)).await;
    match result {
        Ok(Ok((code, body))) if (200..400).contains(&code) => status(name, Some(true), &body, ""),
        Ok(Ok((_, body))) => status(name, Some(false), &body, ""),
        Ok(Err(e)) => status(name, None, "", &format!("Get \"{url}\": {e}")),
        Err(_) => status(
            name,
            None,
            "",
            &format!("Get \"{url}\": context deadline exceeded"),
        ),
    }
}

/// One HTTP/1.1 GET of /healthz over TLS on loopback: the status code and body.
async fn get_insecure(port: u16) -> Result<(u16, String), String> {
    use http_body_util::BodyExt;
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(std::sync::Arc::new(crate::proxy::AnyServer(provider)))
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| format!("dial tcp 127.0.0.1:{port}: connect: {}", go_errno(&e)))?;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1")
        .map_err(|e| e.to_string())?
        .to_owned();
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = hyper::Request::get("/healthz")
        .header(hyper::header::HOST, format!("127.0.0.1:{port}"))
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .map_err(|e| e.to_string())?;
    let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let code = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((code, String::from_utf8_lossy(&body).into_owned()))
}

/// Go's wording of the common connect errors.
fn go_errno(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::ConnectionRefused => "connection refused".into(),
        std::io::ErrorKind::TimedOut => "i/o timeout".into(),
        _ => e.to_string(),
    }
}

impl Computed for ComponentStatuses {
    fn objects<'a>(
        &'a self,
        rest: &'a crate::rest::Rest,
    ) -> futures::future::BoxFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let (cm, sched) = tokio::join!(
                probe_healthz("controller-manager", 10257),
                probe_healthz("scheduler", 10259),
            );
            let mut out = vec![cm, sched];
            if rest.store_is_etcd {
                let probe =
                    tokio::time::timeout(PROBE_TIMEOUT, rest.store.current_revision()).await;
                out.push(match probe {
                    Ok(Ok(_)) => status("etcd-0", Some(true), "ok", ""),
                    Ok(Err(e)) => status("etcd-0", Some(false), "", &e.to_string()),
                    Err(_) => status("etcd-0", Some(false), "", "context deadline exceeded"),
                });
            }
            out
        })
    }
}

impl Strategy for ComponentStatuses {
    fn verbs(&self) -> Option<&'static [&'static str]> {
        Some(&["get", "list"])
    }

    fn deprecation(&self) -> Option<&'static str> {
        Some("v1 ComponentStatus is deprecated in v1.19+")
    }

    fn computed(&self) -> Option<&dyn Computed> {
        Some(self)
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            Column::NAME,
            col("Status", "string", "Status of the component conditions"),
            col("Message", "string", "Message of the component conditions"),
            col("Error", "string", "Error of the component conditions"),
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let healthy = obj
            .get("conditions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|c| str_at(c, "/type") == "Healthy");
        let (s, message, error) = match healthy {
            None => ("Unknown", "", ""),
            Some(c) => (
                if str_at(c, "/status") == "True" {
                    "Healthy"
                } else {
                    "Unhealthy"
                },
                str_at(c, "/message"),
                str_at(c, "/error"),
            ),
        };
        vec![json!(name_of(obj)), json!(s), json!(message), json!(error)]
    }
}
