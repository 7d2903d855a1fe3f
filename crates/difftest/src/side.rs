//! One side of the comparison: an API server reached through a kubeconfig.

use std::path::{Path, PathBuf};
use std::time::Duration;

use http_body_util::BodyExt;
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::Value;

/// How long one request (or the start of a watch) may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The `User-Agent` of every request (it names the field manager of updates).
pub const USER_AGENT: &str = "kumo-difftest";

/// An API server to replay the corpus against.
#[derive(Clone)]
pub struct Side {
    label: String,
    kubeconfig: PathBuf,
    client: kube::Client,
}

impl std::fmt::Debug for Side {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Side")
            .field("label", &self.label)
            .field("kubeconfig", &self.kubeconfig)
            .finish()
    }
}

/// A side could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SideError {
    /// The kubeconfig could not be read or used.
    #[error("kubeconfig {}: {source}", path.display())]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// Why.
        source: kube::config::KubeconfigError,
    },
    /// No client could be built from it.
    #[error("kubeconfig {}: cannot build a client: {source}", path.display())]
    Client {
        /// The file.
        path: PathBuf,
        /// Why.
        source: kube::Error,
    },
}

impl Side {
    /// A side that talks to the current context of the kubeconfig at `path`. `label` names it
    /// in reports ("left", "reference", "kumo", ...).
    pub async fn from_kubeconfig(label: impl Into<String>, path: &Path) -> Result<Self, SideError> {
        let kubeconfig = Kubeconfig::read_from(path).map_err(|source| SideError::Kubeconfig {
            path: path.to_path_buf(),
            source,
        })?;
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|source| SideError::Kubeconfig {
                    path: path.to_path_buf(),
                    source,
                })?;
        let mut config = config;
        // Raw answers only: kube's default policy would retry 429, 503 and 504 (and send a
        // POST twice), which hides exactly what is compared.
        config.default_retry = false;
        let client = kube::Client::try_from(config).map_err(|source| SideError::Client {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Side {
            label: label.into(),
            kubeconfig: path.to_path_buf(),
            client,
        })
    }

    /// The side's name in reports.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The kubeconfig it was made from.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// Sends one request. A watch reads events until `watch.events` have arrived, the stream
    /// ends, or `watch.timeout_seconds` have passed. `Err` is a transport failure.
    pub(crate) async fn send(
        &self,
        mut req: Prepared,
        watch: Option<(usize, Duration)>,
    ) -> Result<Exchange, String> {
        let mut builder = http::Request::builder()
            .method(req.method.as_str())
            .uri(req.path.as_str());
        let mut has_agent = false;
        for (k, v) in &req.headers {
            has_agent |= k.eq_ignore_ascii_case("user-agent");
            builder = builder.header(k.as_str(), v.as_str());
        }
        if !has_agent {
            builder = builder.header("User-Agent", USER_AGENT);
        }
        let request = builder
            .body(kube::client::Body::from(std::mem::take(&mut req.body)))
            .map_err(|e| format!("cannot build the request: {e}"))?;
        let response = tokio::time::timeout(REQUEST_TIMEOUT, self.client.send(request))
            .await
            .map_err(|_| format!("no response within {}s", REQUEST_TIMEOUT.as_secs()))?
            .map_err(|e| format!("request failed: {e}"))?;
        let status = response.status().as_u16();
        tracing::debug!(side = %self.label, method = %req.method, path = %req.path, status);
        let headers: Vec<(String, String)> = response
            .headers()
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_ascii_lowercase(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        let mut body = response.into_body();
        let body = match watch {
            Some((events, timeout)) if status == 200 => {
                RawBody::Events(read_events(&mut body, events, timeout).await)
            }
            _ => {
                let bytes = tokio::time::timeout(REQUEST_TIMEOUT, body.collect_bytes())
                    .await
                    .map_err(|_| {
                        format!("body not complete within {}s", REQUEST_TIMEOUT.as_secs())
                    })?
                    .map_err(|e| format!("reading the body failed: {e}"))?;
                RawBody::Bytes(bytes.to_vec())
            }
        };
        Ok(Exchange {
            status,
            headers,
            body,
        })
    }
}

/// Reads newline-separated JSON watch events. A line that is not JSON is kept as a string;
/// a stream error ends the list with a string saying so.
async fn read_events(body: &mut kube::client::Body, want: usize, timeout: Duration) -> Vec<Value> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut events = Vec::new();
    let mut buf: Vec<u8> = Vec::new();
    while events.len() < want {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) | Ok(None) => break,
            Ok(Some(Err(e))) => {
                events.push(Value::String(format!("<stream error: {e}>")));
                break;
            }
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        buf.extend_from_slice(&data);
        while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=nl).collect();
            push_event(&line, &mut events);
            if events.len() >= want {
                break;
            }
        }
    }
    if events.len() < want && !buf.is_empty() {
        push_event(&buf, &mut events);
    }
    events
}

fn push_event(line: &[u8], events: &mut Vec<Value>) {
    let text = String::from_utf8_lossy(line);
    let text = text.trim();
    if text.is_empty() {
        return;
    }
    events.push(serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_string())));
}

/// A request with its placeholders substituted for one side.
#[derive(Debug, Clone)]
pub(crate) struct Prepared {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// A response as received.
#[derive(Debug, Clone)]
pub(crate) struct Exchange {
    pub status: u16,
    /// Lowercase names, in the order received.
    pub headers: Vec<(String, String)>,
    pub body: RawBody,
}

#[derive(Debug, Clone)]
pub(crate) enum RawBody {
    Bytes(Vec<u8>),
    Events(Vec<Value>),
}

impl Exchange {
    /// All values of a header, joined by ", " (in the order received), or `None`.
    pub fn header(&self, name: &str) -> Option<String> {
        let values: Vec<&str> = self
            .headers
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .collect();
        (!values.is_empty()).then(|| values.join(", "))
    }
}
