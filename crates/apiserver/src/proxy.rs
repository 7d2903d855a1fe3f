//! The connect subresources that go through a node's kubelet: `pods/log` (streamed from
//! the kubelet's `/containerLogs`), `pods/exec`, `pods/attach` and `pods/portforward`
//! (upgrade requests proxied byte for byte once the kubelet has switched protocols, as
//! apimachinery's UpgradeAwareHandler does), and `nodes/proxy`.
//!
//! The kubelet is reached at the Node's first address of kubeadm's
//! `--kubelet-preferred-address-types` (InternalIP, ExternalIP, Hostname) and its
//! daemonEndpoints port, with the `apiserver-kubelet-client` certificate; the kubelet's
//! serving certificate is not verified (kube-apiserver without
//! `--kubelet-certificate-authority`).

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use kumo_apimachinery::status::{ApiError, GroupResource};
use kumo_apimachinery::validation::{FieldError, Path as FieldPath};
use serde_json::Value;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::auth::{Attributes, Decision};
use crate::handler::{Body, State};

/// Where the API server dials a node's kubelet instead of the address the Node reports:
/// node name → address. Filled by whoever runs the kubelets in this process (`kumo up`
/// for its cloud instances, whose InternalIPs do not route from the host and must not be
/// routed: their kubelets listen on 127.0.0.1 ports of their own); empty otherwise.
pub type KubeletDialOverrides =
    Arc<std::sync::RwLock<std::collections::HashMap<String, std::net::SocketAddr>>>;

/// The API server's client towards kubelets.
pub struct KubeletClient {
    tls: Arc<rustls::ClientConfig>,
}

/// Accepts any server certificate (kube-apiserver's default towards kubelets without
/// `--kubelet-certificate-authority`, and its InsecureSkipVerify probes of the
/// componentstatuses); handshake signatures are still checked.
#[derive(Debug)]
pub(crate) struct AnyServer(pub(crate) Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

impl KubeletClient {
    /// The client of `<pki>/apiserver-kubelet-client.{crt,key}`.
    pub fn load(pki: &Path) -> anyhow::Result<KubeletClient> {
        let cert = std::fs::read(pki.join("apiserver-kubelet-client.crt"))?;
        let key = std::fs::read(pki.join("apiserver-kubelet-client.key"))?;
        let certs = rustls_pemfile::certs(&mut cert.as_slice()).collect::<Result<Vec<_>, _>>()?;
        let key = rustls_pemfile::private_key(&mut key.as_slice())?
            .ok_or_else(|| anyhow::anyhow!("no key in apiserver-kubelet-client.key"))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut tls = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyServer(provider)))
            .with_client_auth_cert(certs, key)?;
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(KubeletClient { tls: Arc::new(tls) })
    }

    async fn connect(&self, host: &str, port: u16) -> Result<TlsStream<TcpStream>, ApiError> {
        let unreachable = |e: &dyn std::fmt::Display| {
            ApiError::internal(format!(
                "error dialing backend: dial tcp {}: {e}",
                join_host_port(host, port)
            ))
        };
        let tcp = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            TcpStream::connect((host, port)),
        )
        .await
        .map_err(|_| unreachable(&"i/o timeout"))?
        .map_err(|e| unreachable(&e))?;
        let _ = tcp.set_nodelay(true);
        let name = rustls::pki_types::ServerName::try_from(host.to_owned())
            .map_err(|e| unreachable(&e))?;
        tokio_rustls::TlsConnector::from(self.tls.clone())
            .connect(name, tcp)
            .await
            .map_err(|e| ApiError::internal(format!("error dialing backend: {e}")))
    }
}

fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Whether the request is one this module answers.
pub fn handles(attrs: &Attributes) -> bool {
    attrs.resource_request
        && attrs.api_group.is_empty()
        && attrs.api_version == "v1"
        && !attrs.name.is_empty()
        && matches!(
            (attrs.resource.as_str(), attrs.subresource.as_str()),
            ("pods", "log" | "exec" | "attach" | "portforward") | ("nodes", "proxy")
        )
}

fn error_response(e: &ApiError) -> Response<Body> {
    let body = e.to_status().to_string();
    let mut r = Response::new(Full::new(Bytes::from(body)).boxed());
    *r.status_mut() = StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    r
}

fn percent_encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The query's parameters in order, repeated ones kept.
fn query_pairs(q: Option<&str>) -> Vec<(String, String)> {
    kumo_apimachinery::query::pairs(q)
}

fn encode_query(pairs: &[(&str, String)]) -> String {
    let mut sorted: Vec<&(&str, String)> = pairs.iter().collect();
    // url.Values.Encode sorts by key.
    sorted.sort_by_key(|(k, _)| *k);
    sorted
        .iter()
        .map(|(k, v)| format!("{}={}", percent_encode(k), percent_encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// Answers a connect subresource; `attrs` were authorized already.
pub async fn serve(state: Arc<State>, attrs: Attributes, req: Request<Incoming>) -> Response<Body> {
    match serve_inner(&state, &attrs, req).await {
        Ok(r) => r,
        Err(e) => error_response(&e),
    }
}

async fn read_object(
    state: &State,
    plural: &str,
    ns: Option<&str>,
    name: &str,
) -> Result<Value, ApiError> {
    let res = state
        .registry
        .find("", "v1", plural)
        .ok_or_else(ApiError::path_not_found)?;
    let key = res.key(ns, name);
    let (kv, _) = state
        .rest
        .store
        .get(key.as_bytes(), None)
        .await
        .map_err(ApiError::internal)?;
    let kv = kv.ok_or_else(|| ApiError::not_found(&res.group_resource(), name))?;
    serde_json::from_slice(&kv.value).map_err(ApiError::internal)
}

/// Where the kubelet of node `name` listens: (host, port); a dial override comes first.
async fn kubelet_of(state: &State, node: &str) -> Result<(String, u16), ApiError> {
    kubelet_port_of(state, node, None).await
}

/// Where port `port` (the kubelet's, by default) of node `name` is reached: (host, port).
/// A dial override stands for the node's kubelet port (the advertised one, or 10250);
/// other ports are the node's own.
async fn kubelet_port_of(
    state: &State,
    node: &str,
    port: Option<u16>,
) -> Result<(String, u16), ApiError> {
    let n = read_object(state, "nodes", None, node).await?;
    let advertised = n
        .pointer("/status/daemonEndpoints/kubeletEndpoint/Port")
        .and_then(Value::as_u64)
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p > 0)
        .unwrap_or(10250);
    let dial = state
        .kubelet_dial
        .read()
        .ok()
        .and_then(|m| m.get(node).copied());
    // 10250, the kubelet's well-known port, names the kubelet wherever it listens.
    if let Some(a) = dial.filter(|_| port.is_none_or(|p| p == advertised || p == 10250)) {
        return Ok((a.ip().to_string(), a.port()));
    }
    let addresses = n
        .pointer("/status/addresses")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let host = ["InternalIP", "ExternalIP", "Hostname"]
        .iter()
        .find_map(|t| {
            addresses
                .iter()
                .find(|a| a["type"] == *t)
                .and_then(|a| a["address"].as_str())
                .filter(|a| !a.is_empty())
        })
        .ok_or_else(|| {
            ApiError::internal(format!(
                "no preferred addresses found; known addresses: {}",
                Value::Array(addresses.clone())
            ))
        })?
        .to_owned();
    let port = port.unwrap_or(advertised);
    // On a simulated network (`kumo up`) node addresses exist only inside it: never
    // dialed from the host, they answer as the simulated network does.
    if let (Some(net), Ok(ip)) = (&state.pod_network, host.parse::<std::net::IpAddr>()) {
        if !ip.is_loopback() {
            let why = match net.connect(std::net::SocketAddr::new(ip, port)) {
                Err(e) => e.to_string(),
                // Something simulated listens there, but it is no kubelet.
                Ok(_) => "connect: connection refused".to_owned(),
            };
            return Err(ApiError::internal(format!(
                "error dialing backend: dial tcp {}: {why}",
                join_host_port(&host, port)
            )));
        }
    }
    Ok((host, port))
}

/// Whether node `name` declares `ExtendWebSocketsToKubelet` (NodeDeclaredFeatures).
async fn declares_websockets(state: &State, name: &str) -> bool {
    read_object(state, "nodes", None, name)
        .await
        .ok()
        .and_then(|n| n.pointer("/status/declaredFeatures").cloned())
        .and_then(|f| f.as_array().cloned())
        .is_some_and(|f| f.iter().any(|x| x == crate::streamtunnel::KUBELET_FEATURE))
}

/// Upstream's validateContainer: the named container must exist; without a name, the
/// only container.
fn validate_container(
    container: Option<&str>,
    pod: &Value,
    name: &str,
) -> Result<String, ApiError> {
    let names = |keys: &[&str]| -> Vec<String> {
        keys.iter()
            .filter_map(|k| pod.pointer(&format!("/spec/{k}")).and_then(Value::as_array))
            .flatten()
            .filter_map(|c| c["name"].as_str().map(str::to_owned))
            .collect()
    };
    match container.filter(|c| !c.is_empty()) {
        Some(c) => {
            if names(&["containers", "initContainers", "ephemeralContainers"])
                .iter()
                .any(|n| n == c)
            {
                Ok(c.to_owned())
            } else {
                Err(ApiError::bad_request(format!(
                    "container {c} is not valid for pod {name}"
                )))
            }
        }
        None => {
            let mains = names(&["containers"]);
            match mains.len() {
                1 => Ok(mains[0].clone()),
                0 => Err(ApiError::bad_request(format!(
                    "a container name must be specified for pod {name}"
                ))),
                _ => Err(ApiError::bad_request(format!(
                    "a container name must be specified for pod {name}, choose one of: [{}]",
                    names(&["initContainers", "containers", "ephemeralContainers"]).join(" ")
                ))),
            }
        }
    }
}

/// The admission chain for a CONNECT of `pods/<sub>` (exec, attach, portforward): the
/// options object the query decodes to (PodExecOptions, PodAttachOptions,
/// PodPortForwardOptions, as Go marshals them) goes through both phases, as upstream's
/// connect handler does before it dials the kubelet.
async fn connect_admission(
    state: &State,
    sub: &str,
    ns: &str,
    name: &str,
    pairs: &[(String, String)],
    flag: &(dyn Fn(&str) -> bool + Sync),
) -> Result<(), ApiError> {
    let mut opts = serde_json::Map::new();
    let kind = match sub {
        "exec" => "PodExecOptions",
        "attach" => "PodAttachOptions",
        _ => "PodPortForwardOptions",
    };
    opts.insert("kind".into(), kind.into());
    opts.insert("apiVersion".into(), "v1".into());
    if sub == "portforward" {
        let ports: Vec<Value> = pairs
            .iter()
            .filter(|(k, _)| k == "ports")
            .flat_map(|(_, v)| v.split(','))
            .filter_map(|p| p.trim().parse::<u16>().ok())
            .map(Value::from)
            .collect();
        if !ports.is_empty() {
            opts.insert("ports".into(), Value::Array(ports));
        }
    } else {
        for f in ["stdin", "stdout", "stderr", "tty"] {
            if flag(f) {
                opts.insert(f.into(), true.into());
            }
        }
        if let Some((_, c)) = pairs
            .iter()
            .find(|(k, v)| k == "container" && !v.is_empty())
        {
            opts.insert("container".into(), c.clone().into());
        }
        if sub == "exec" {
            let command: Vec<Value> = pairs
                .iter()
                .filter(|(k, _)| k == "command")
                .map(|(_, v)| Value::from(v.clone()))
                .collect();
            opts.insert("command".into(), Value::Array(command));
        }
    }
    let mut obj = Value::Object(opts);
    let res = state
        .registry
        .find("", "v1", "pods")
        .ok_or_else(ApiError::path_not_found)?;
    let user = crate::auth::current_user();
    let attrs = crate::admission::Attributes {
        operation: crate::admission::Operation::Connect,
        resource: &res,
        subresource: Some(sub),
        namespace: Some(ns),
        name,
        old: None,
        user: &user,
        dry_run: false,
        options: Value::Null,
        rest: &state.rest,
    };
    let chain = state.rest.chain();
    chain.admit(&attrs, Some(&mut obj)).await?;
    chain.validate(&attrs, Some(&obj)).await
}

async fn serve_inner(
    state: &State,
    attrs: &Attributes,
    req: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let client = state
        .kubelet
        .clone()
        .ok_or_else(|| ApiError::internal("no kubelet client credentials"))?;
    let pairs = query_pairs(req.uri().query());
    let get = |k: &str| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    let name = attrs.name.clone();
    if attrs.resource == "nodes" {
        // nodes/proxy/<path>: the rest of the path goes to the kubelet as is.
        let prefix = format!("/api/v1/nodes/{name}/proxy");
        let rest = req
            .uri()
            .path()
            .strip_prefix(&prefix)
            .unwrap_or("")
            .to_owned();
        let rest = if rest.is_empty() {
            "/".to_owned()
        } else {
            rest
        };
        // `[scheme:]name[:port]`, as upstream's SplitSchemeNamePort.
        let parts: Vec<&str> = name.split(':').collect();
        let (node, port) = match parts.as_slice() {
            [n] => (*n, None),
            [n, p] => (*n, Some(*p)),
            [_, n, p] => (*n, Some(*p)),
            _ => {
                return Err(ApiError::bad_request(format!(
                    "invalid node request {name:?}"
                )))
            }
        };
        let port = match port.filter(|p| !p.is_empty()) {
            Some(p) => Some(
                p.parse()
                    .map_err(|_| ApiError::bad_request(format!("invalid node request {name:?}")))?,
            ),
            None => None,
        };
        let (host, port) = kubelet_port_of(state, node, port).await?;
        let path = match req.uri().query() {
            Some(q) => format!("{rest}?{q}"),
            None => rest,
        };
        let mut req = req;
        return forward(
            &client,
            &host,
            port,
            &path,
            &mut req,
            true,
            ("nodes/proxy", &name),
        )
        .await;
    }
    let ns = attrs.namespace.clone();
    let pod = read_object(state, "pods", Some(&ns), &name).await?;
    let node = pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    match attrs.subresource.as_str() {
        "log" => {
            let opts = log_params(&pairs, &name)?;
            let container = validate_container(get("container"), &pod, &name)?;
            if node.is_empty() {
                // No node yet: no location, so no content (upstream's 204).
                let mut r = Response::new(Full::new(Bytes::new()).boxed());
                *r.status_mut() = StatusCode::NO_CONTENT;
                return Ok(r);
            }
            let (host, port) = kubelet_of(state, &node).await?;
            let path = format!(
                "/containerLogs/{ns}/{name}/{}?{}",
                percent_encode(&container),
                encode_query(&opts)
            );
            let path = path.trim_end_matches('?').to_owned();
            let mut req = req;
            let resp = forward(
                &client,
                &host,
                port,
                &path,
                &mut req,
                false,
                ("pods/log", &name),
            )
            .await?;
            if is_websocket(&req) {
                // A WebSocket client gets the log as messages (wsstream's reader protocols).
                return Ok(websocket_log(req, resp));
            }
            Ok(resp)
        }
        sub => {
            // Upgrades must also be allowed as `create` (AuthorizePodWebsocketUpgradeCreatePermission).
            if attrs.verb != "create" {
                let mut create = attrs.clone();
                create.verb = "create".into();
                match state.auth.authorize(&create) {
                    Decision::Allow(_) => {}
                    Decision::Deny(reason) | Decision::NoOpinion(reason) => {
                        return Err(ApiError::forbidden(
                            &GroupResource::new("", "pods"),
                            &name,
                            &reason,
                        ));
                    }
                }
            }
            let flag = |k: &str| {
                get(k).is_some_and(|v| matches!(v, "1" | "t" | "T" | "true" | "TRUE" | "True"))
            };
            connect_admission(state, sub, &ns, &name, &pairs, &flag).await?;
            let mut params: Vec<(&str, String)> = Vec::new();
            let path = if sub == "portforward" {
                for (k, v) in &pairs {
                    if k == "ports" {
                        params.push(("port", v.clone()));
                    }
                }
                format!("/portForward/{ns}/{name}")
            } else {
                let container = validate_container(get("container"), &pod, &name)?;
                if flag("stdin") {
                    params.push(("input", "1".into()));
                }
                if flag("stdout") {
                    params.push(("output", "1".into()));
                }
                if flag("stderr") {
                    params.push(("error", "1".into()));
                }
                if flag("tty") {
                    params.push(("tty", "1".into()));
                }
                if sub == "exec" {
                    for (k, v) in &pairs {
                        if k == "command" {
                            params.push(("command", v.clone()));
                        }
                    }
                }
                format!("/{sub}/{ns}/{name}/{}", percent_encode(&container))
            };
            if node.is_empty() {
                return Err(ApiError::bad_request(format!(
                    "pod {name} does not have a host assigned"
                )));
            }
            let (host, port) = kubelet_of(state, &node).await?;
            // Commands keep their order: encode without sorting them apart.
            let mut q: Vec<String> = Vec::new();
            let mut keys: Vec<&str> = params.iter().map(|(k, _)| *k).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                for (_, v) in params.iter().filter(|(n, _)| *n == k) {
                    q.push(format!("{}={}", percent_encode(k), percent_encode(v)));
                }
            }
            let path = if q.is_empty() {
                path
            } else {
                format!("{path}?{}", q.join("&"))
            };
            if sub == "portforward" {
                // A node whose kubelet does not tunnel WebSockets itself gets SPDY, the
                // tunnel translated here (upstream's PortForwardWebsockets).
                let protocols = crate::streamtunnel::spdy_protocols(req.headers());
                if !protocols.is_empty() && !declares_websockets(state, &node).await {
                    let io = client.connect(&host, port).await?;
                    let host = join_host_port(&host, port);
                    return crate::streamtunnel::translate(io, &host, &path, req, &protocols).await;
                }
            }
            let mut req = req;
            forward(&client, &host, port, &path, &mut req, true, ("pods", &name)).await
        }
    }
}

/// PodLogOptions from the query, validated as upstream; the kubelet's parameters.
fn log_params(
    pairs: &[(String, String)],
    name: &str,
) -> Result<Vec<(&'static str, String)>, ApiError> {
    let get = |k: &str| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    let boolean = |k: &str| -> Result<bool, ApiError> {
        match get(k) {
            None | Some("") => Ok(false),
            Some("1" | "t" | "T" | "true" | "TRUE" | "True") => Ok(true),
            Some("0" | "f" | "F" | "false" | "FALSE" | "False") => Ok(false),
            Some(v) => Err(ApiError::bad_request(format!(
                "strconv.ParseBool: parsing {v:?}: invalid syntax"
            ))),
        }
    };
    let int = |k: &str| -> Result<Option<i64>, ApiError> {
        match get(k) {
            None | Some("") => Ok(None),
            Some(v) => v.parse().map(Some).map_err(|_| {
                ApiError::bad_request(format!("strconv.ParseInt: parsing {v:?}: invalid syntax"))
            }),
        }
    };
    let follow = boolean("follow")?;
    let previous = boolean("previous")?;
    let timestamps = boolean("timestamps")?;
    let tail = int("tailLines")?;
    let limit = int("limitBytes")?;
    let since_seconds = int("sinceSeconds")?;
    let since_time = get("sinceTime").filter(|s| !s.is_empty());
    let stream = get("stream").filter(|s| !s.is_empty()).unwrap_or("All");
    let mut errs = Vec::new();
    if let Some(t) = tail.filter(|t| *t < 0) {
        errs.push(FieldError::invalid(
            &FieldPath::new("tailLines"),
            t,
            "must be greater than or equal to 0",
        ));
    }
    if let Some(b) = limit.filter(|b| *b < 1) {
        errs.push(FieldError::invalid(
            &FieldPath::new("limitBytes"),
            b,
            "must be greater than 0",
        ));
    }
    match (since_seconds, since_time) {
        (Some(_), Some(_)) => errs.push(FieldError::forbidden(
            &FieldPath::new(""),
            "at most one of `sinceTime` or `sinceSeconds` may be specified",
        )),
        (Some(s), None) if s < 1 => errs.push(FieldError::invalid(
            &FieldPath::new("sinceSeconds"),
            s,
            "must be greater than 0",
        )),
        _ => {}
    }
    if !matches!(stream, "All" | "Stdout" | "Stderr") {
        errs.push(FieldError::not_supported(
            &FieldPath::new("stream"),
            stream,
            &["All", "Stdout", "Stderr"],
        ));
    } else if stream != "All" && tail.is_some() {
        errs.push(FieldError::forbidden(
            &FieldPath::new(""),
            "`tailLines` and specific `stream` are mutually exclusive for now",
        ));
    }
    if !errs.is_empty() {
        let causes = errs.iter().map(FieldError::to_cause).collect();
        return Err(ApiError::invalid(
            "",
            "PodLogOptions",
            name,
            kumo_apimachinery::validation::invalid_message("PodLogOptions", name, &errs),
            causes,
        ));
    }
    let since_time = match since_time {
        Some(t) => Some(crate::time::format_rfc3339(
            crate::time::parse_rfc3339(t).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "parsing time {t:?} as \"2006-01-02T15:04:05Z07:00\": cannot parse {t:?} as \"2006\""
                ))
            })?,
        )),
        None => None,
    };
    let mut out: Vec<(&'static str, String)> = Vec::new();
    if follow {
        out.push(("follow", "true".into()));
    }
    if previous {
        out.push(("previous", "true".into()));
    }
    if timestamps {
        out.push(("timestamps", "true".into()));
    }
    if let Some(s) = since_seconds {
        out.push(("sinceSeconds", s.to_string()));
    }
    if let Some(t) = since_time {
        out.push(("sinceTime", t));
    }
    if let Some(t) = tail {
        out.push(("tailLines", t.to_string()));
    }
    if let Some(b) = limit {
        out.push(("limitBytes", b.to_string()));
    }
    if stream != "All" {
        out.push(("stream", stream.to_owned()));
    }
    Ok(out)
}

/// Sends the request to the kubelet at `path`: an upgrade is proxied byte for byte once
/// the kubelet switches protocols; anything else is streamed back, errors mapped to
/// Status as upstream's response checker does.
async fn forward(
    client: &KubeletClient,
    host: &str,
    port: u16,
    path: &str,
    req: &mut Request<Incoming>,
    pass_upgrade: bool,
    (resource, name): (&str, &str),
) -> Result<Response<Body>, ApiError> {
    let io = client.connect(host, port).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| ApiError::internal(format!("error dialing backend: {e}")))?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "kubelet connection ended");
        }
    });
    let upgrade = pass_upgrade && req.headers().contains_key(header::UPGRADE);
    let method = if upgrade {
        req.method().clone()
    } else {
        Method::GET
    };
    let mut out = Request::builder()
        .method(method)
        .uri(path)
        .header(header::HOST, join_host_port(host, port));
    if upgrade {
        for (k, v) in req.headers() {
            let keep = matches!(k.as_str(), "upgrade" | "connection")
                || k.as_str().starts_with("sec-websocket-")
                || k.as_str().starts_with("x-stream-protocol-");
            if keep {
                out = out.header(k, v);
            }
        }
    }
    let out = out
        .body(http_body_util::Empty::<Bytes>::new())
        .map_err(ApiError::internal)?;
    let mut resp = sender
        .send_request(out)
        .await
        .map_err(|e| ApiError::internal(format!("error trying to reach the kubelet: {e}")))?;
    let status = resp.status();
    if upgrade && status == StatusCode::SWITCHING_PROTOCOLS {
        let backend = hyper::upgrade::on(&mut resp);
        let front = hyper::upgrade::on(&mut *req);
        tokio::spawn(async move {
            match (front.await, backend.await) {
                (Ok(f), Ok(b)) => {
                    let (mut f, mut b) = (TokioIo::new(f), TokioIo::new(b));
                    let _ = tokio::io::copy_bidirectional(&mut f, &mut b).await;
                }
                (f, b) => {
                    tracing::debug!(client = f.is_ok(), kubelet = b.is_ok(), "upgrade failed")
                }
            }
        });
        let mut r = Response::new(Full::new(Bytes::new()).boxed());
        *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        *r.headers_mut() = resp.headers().clone();
        return Ok(r);
    }
    let content_type = resp.headers().get(header::CONTENT_TYPE).cloned();
    let mut body = resp.into_body();
    // A proxy passes the kubelet's answer through; a log's errors become Statuses.
    if resource != "nodes/proxy" && !(200..=206).contains(&status.as_u16()) {
        // Upstream's GenericHttpResponseChecker.
        let mut text = Vec::new();
        while let Some(Ok(f)) = body.frame().await {
            if let Ok(d) = f.into_data() {
                text.extend_from_slice(&d);
            }
            if text.len() > 64 << 10 {
                break;
            }
        }
        let text = String::from_utf8_lossy(&text).trim_end().to_owned();
        return Err(checker_error(status.as_u16(), &text, resource, name));
    }
    // Stream the body as it comes (follow), flushing every frame.
    let streamed = crate::handler::relay(body, ());
    let mut r = Response::new(streamed);
    *r.status_mut() = status;
    if resource == "pods/log" {
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("text/plain"),
        );
    } else if let Some(ct) = content_type {
        r.headers_mut().insert(header::CONTENT_TYPE, ct);
    }
    Ok(r)
}

fn is_websocket(req: &Request<Incoming>) -> bool {
    req.headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

/// Streams a log response over WebSocket: one binary message per chunk
/// (`binary.k8s.io`, or no protocol) or base64 text messages (`base64.binary.k8s.io`),
/// then a close.
fn websocket_log(mut req: Request<Incoming>, resp: Response<Body>) -> Response<Body> {
    let offered: Vec<String> = req
        .headers()
        .get_all("sec-websocket-protocol")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|p| p.trim().to_owned())
        .collect();
    let protocol = offered
        .into_iter()
        .find(|p| p == "binary.k8s.io" || p == "base64.binary.k8s.io");
    let base64 = protocol.as_deref() == Some("base64.binary.k8s.io");
    let key = req
        .headers()
        .get("sec-websocket-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let accept = kumo_apimachinery::websocket::accept_key(&key);
    let on_upgrade = hyper::upgrade::on(&mut req);
    let mut body = resp.into_body();
    tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        let Ok(upgraded) = on_upgrade.await else {
            return;
        };
        let mut io = TokioIo::new(upgraded);
        let frame = kumo_apimachinery::websocket::frame;
        while let Some(Ok(f)) = body.frame().await {
            let Ok(data) = f.into_data() else { continue };
            let msg = if base64 {
                use base64::Engine;
                frame(
                    0x1,
                    base64::engine::general_purpose::STANDARD
                        .encode(&data)
                        .as_bytes(),
                )
            } else {
                frame(0x2, &data)
            };
            if io.write_all(&msg).await.is_err() {
                return;
            }
        }
        let _ = io.write_all(&frame(0x8, &1000u16.to_be_bytes())).await;
        let _ = io.shutdown().await;
    });
    let mut r = Response::new(Full::new(Bytes::new()).boxed());
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = r.headers_mut();
    h.insert(
        header::UPGRADE,
        header::HeaderValue::from_static("websocket"),
    );
    h.insert(
        header::CONNECTION,
        header::HeaderValue::from_static("Upgrade"),
    );
    if let Ok(v) = header::HeaderValue::from_str(&accept) {
        h.insert("sec-websocket-accept", v);
    }
    if let Some(p) = protocol.and_then(|p| header::HeaderValue::from_str(&p).ok()) {
        h.insert("sec-websocket-protocol", p);
    }
    r
}

/// The Status of a kubelet's error answer.
fn checker_error(status: u16, text: &str, resource: &str, name: &str) -> ApiError {
    match status {
        500 => ApiError::internal(text),
        400 => ApiError::bad_request(text),
        _ => {
            let (reason, message): (&'static str, String) = match status {
                404 => (
                    "NotFound",
                    "the server could not find the requested resource".into(),
                ),
                401 => (
                    "Unauthorized",
                    "the server has asked for the client to provide credentials".into(),
                ),
                403 => ("Forbidden", text.to_owned()),
                422 => (
                    "Invalid",
                    "the server rejected our request due to an error in our request".into(),
                ),
                s if s >= 500 => (
                    "InternalError",
                    format!("an error on the server ({text:?}) has prevented the request from succeeding"),
                ),
                s => (
                    "Unknown",
                    format!("the server responded with the status code {s} but did not return more information"),
                ),
            };
            ApiError {
                code: status,
                reason,
                message: format!("{message} ( {resource} {name})"),
                details: Some(Box::new(kumo_apimachinery::status::Details {
                    name: name.to_owned(),
                    kind: resource.to_owned(),
                    ..Default::default()
                })),
            }
        }
    }
}
