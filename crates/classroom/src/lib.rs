//! The classroom: a web application (HTTPS) served by kumo beside a management cluster
//! running Cluster API. People sign in with their name and password (no anonymous access:
//! every page but the sign-in form needs a session); a learner gets the namespace
//! `handson-<user>` with a Cluster made from the template, a web terminal (term.js over a
//! WebSocket to a confined shell with kubectl and that cluster's kubeconfig, see
//! [`terminal`]) and beside it a map of the cluster (control-plane components and their
//! leases, nodes with their pods, Services → EndpointSlices → the cloud load balancer,
//! recent events) pushed over a WebSocket at every change watches of it see; an instructor
//! sees every user's cluster.

pub mod pages;
pub mod terminal;
pub mod users;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE, COOKIE, LOCATION, SET_COOKIE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::Message;

pub use users::Role;

/// The session cookie.
const COOKIE_NAME: &str = "kumo-classroom";
/// The Cluster every learner gets (the template's name).
pub const CLUSTER: &str = "demo";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Api(#[from] kube::Error),
}

/// What to serve.
pub struct Config {
    /// Where to listen (port 0 picks one).
    pub bind: SocketAddr,
    /// The classroom's client of the management cluster.
    pub client: kube::Client,
    /// The users file (see [`users`]).
    pub users_file: PathBuf,
    /// The Cluster API objects each learner's namespace gets (YAML stream), a Cluster
    /// named [`CLUSTER`] among them.
    pub template: String,
    /// Where the shells' roots and kubeconfigs are made.
    pub work_dir: PathBuf,
    /// term.js, served to the browser.
    pub term_js: PathBuf,
}

struct State {
    cfg: Config,
    /// Session token → user name.
    sessions: Mutex<HashMap<String, String>>,
    remote: kumo_capi::remote::Remote,
    /// Held while a learner's Cluster gets its pod range, so two sign-ins at once do not
    /// take the same one.
    allocating: tokio::sync::Mutex<()>,
}

/// A running classroom.
pub struct Classroom {
    pub addr: SocketAddr,
    _stop: watch::Sender<bool>,
}

/// Binds and serves until the returned [`Classroom`] is dropped.
pub async fn start(cfg: Config) -> Result<Classroom, Error> {
    let listener = tokio::net::TcpListener::bind(cfg.bind)
        .await
        .map_err(|e| Error::Io(cfg.bind.to_string(), e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::Io(cfg.bind.to_string(), e))?;
    std::fs::create_dir_all(&cfg.work_dir)
        .map_err(|e| Error::Io(cfg.work_dir.display().to_string(), e))?;
    let (certs, key) =
        kumo_client::healthz::self_signed(addr).map_err(|e| Error::Invalid(e.to_string()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| Error::Invalid(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| Error::Invalid(e.to_string()))?;
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let state = Arc::new(State {
        remote: kumo_capi::remote::Remote::new(cfg.client.clone()),
        cfg,
        sessions: Mutex::new(HashMap::new()),
        allocating: tokio::sync::Mutex::new(()),
    });
    let (stop, mut stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        loop {
            let (tcp, _) = tokio::select! {
                r = listener.accept() => match r { Ok(c) => c, Err(_) => continue },
                _ = stop_rx.wait_for(|s| *s) => return,
                else => return,
            };
            let (acceptor, state) = (acceptor.clone(), state.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper::service::service_fn(move |req| {
                    let state = state.clone();
                    async move { Ok::<_, std::convert::Infallible>(route(state, req).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .with_upgrades()
                    .await;
            });
        }
    });
    Ok(Classroom { addr, _stop: stop })
}

type Resp = Response<Full<Bytes>>;

fn respond(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Resp {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_str(content_type).unwrap_or(HeaderValue::from_static("text/plain")),
    );
    // Nothing of the classroom is to be framed or guessed at.
    r.headers_mut()
        .insert("x-frame-options", HeaderValue::from_static("DENY"));
    r.headers_mut().insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    r.headers_mut()
        .insert("cache-control", HeaderValue::from_static("no-store"));
    r
}

fn redirect(to: &str) -> Resp {
    let mut r = respond(StatusCode::SEE_OTHER, "text/plain", "");
    r.headers_mut().insert(
        LOCATION,
        HeaderValue::from_str(to).unwrap_or(HeaderValue::from_static("/")),
    );
    r
}

/// The signed-in user of `req`, if any.
fn session_user(state: &State, req: &Request<Incoming>) -> Option<String> {
    let cookies = req.headers().get_all(COOKIE);
    for c in cookies {
        for kv in c.to_str().ok()?.split(';') {
            if let Some(token) = kv.trim().strip_prefix(&format!("{COOKIE_NAME}=")) {
                if let Some(u) = state.sessions.lock().get(token) {
                    return Some(u.clone());
                }
            }
        }
    }
    None
}

fn user_of(state: &State, name: &str) -> Option<users::User> {
    users::load(&state.cfg.users_file)
        .ok()?
        .into_iter()
        .find(|u| u.name == name)
}

/// `application/x-www-form-urlencoded` fields.
fn form(body: &[u8]) -> HashMap<String, String> {
    let decode = |s: &str| -> String {
        let bytes = s.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'+' => out.push(b' '),
                b'%' if i + 2 < bytes.len() => {
                    match u8::from_str_radix(
                        std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("zz"),
                        16,
                    ) {
                        Ok(b) => {
                            out.push(b);
                            i += 2;
                        }
                        Err(_) => out.push(b'%'),
                    }
                }
                b => out.push(b),
            }
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    };
    String::from_utf8_lossy(body)
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (decode(k), decode(v)))
        .collect()
}

async fn route(state: Arc<State>, req: Request<Incoming>) -> Resp {
    let path = req.uri().path().to_owned();
    match (req.method().clone(), path.as_str()) {
        (Method::GET, "/signin") => respond(
            StatusCode::OK,
            "text/html; charset=utf-8",
            pages::signin(None),
        ),
        (Method::POST, "/signin") => signin(state, req).await,
        (Method::GET, "/term.js") => match std::fs::read(&state.cfg.term_js) {
            Ok(b) => respond(StatusCode::OK, "application/javascript", b),
            Err(_) => respond(
                StatusCode::NOT_FOUND,
                "text/plain",
                "term.js is not installed (apt-get install libjs-term.js)\n",
            ),
        },
        _ => {
            let Some(user) = session_user(&state, &req) else {
                return if path.starts_with("/api/") || path == "/terminal" {
                    respond(StatusCode::UNAUTHORIZED, "text/plain", "sign in first\n")
                } else {
                    redirect("/signin")
                };
            };
            let role = user_of(&state, &user).map(|u| u.role);
            match (req.method().clone(), path.as_str(), role) {
                (_, _, None) => respond(
                    StatusCode::FORBIDDEN,
                    "text/plain",
                    "no such user any more\n",
                ),
                (Method::GET, "/", Some(Role::Instructor)) => respond(
                    StatusCode::OK,
                    "text/html; charset=utf-8",
                    pages::instructor(&user),
                ),
                (Method::GET, "/", Some(Role::Learner)) => respond(
                    StatusCode::OK,
                    "text/html; charset=utf-8",
                    pages::learner(&user),
                ),
                (Method::GET, "/api/map", Some(Role::Learner)) => {
                    json_resp(map(&state, &user).await)
                }
                (Method::GET, "/map", Some(Role::Learner)) => map_socket(state, req, user),
                (Method::GET, "/api/users", Some(Role::Instructor)) => {
                    json_resp(overview(&state).await)
                }
                (Method::GET, "/terminal", Some(Role::Learner)) => terminal(state, req, user).await,
                (Method::POST, "/signout", _) => {
                    state.sessions.lock().retain(|_, u| *u != user);
                    redirect("/signin")
                }
                (_, "/api/map" | "/api/users" | "/terminal" | "/map", _) => {
                    respond(StatusCode::FORBIDDEN, "text/plain", "not yours\n")
                }
                _ => respond(StatusCode::NOT_FOUND, "text/plain", "not found\n"),
            }
        }
    }
}

fn json_resp(v: Value) -> Resp {
    respond(
        StatusCode::OK,
        "application/json",
        serde_json::to_vec(&v).unwrap_or_default(),
    )
}

async fn signin(state: Arc<State>, req: Request<Incoming>) -> Resp {
    let body = match http_body_util::Limited::new(req.into_body(), 4096)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(_) => return respond(StatusCode::PAYLOAD_TOO_LARGE, "text/plain", "too large\n"),
    };
    let f = form(&body);
    let (name, password) = (
        f.get("user").cloned().unwrap_or_default(),
        f.get("password").cloned().unwrap_or_default(),
    );
    let user = user_of(&state, &name).filter(|u| u.verify(&password));
    let Some(user) = user else {
        // The same answer whichever part was wrong, a little late.
        tokio::time::sleep(Duration::from_millis(300)).await;
        return respond(
            StatusCode::UNAUTHORIZED,
            "text/html; charset=utf-8",
            pages::signin(Some("Wrong user name or password.")),
        );
    };
    let token: [u8; 32] = rand::random();
    let token: String = token.iter().map(|b| format!("{b:02x}")).collect();
    state
        .sessions
        .lock()
        .insert(token.clone(), user.name.clone());
    if user.role == Role::Learner {
        let (state, name) = (state.clone(), user.name.clone());
        tokio::spawn(async move {
            if let Err(e) = provision(&state, &name).await {
                tracing::warn!(user = %name, error = %e, "provisioning the user's cluster");
            }
        });
    }
    let mut r = redirect("/");
    let cookie = format!("{COOKIE_NAME}={token}; Path=/; HttpOnly; Secure; SameSite=Strict");
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        r.headers_mut().insert(SET_COOKIE, v);
    }
    r
}

/// The user's namespace.
pub fn namespace_of(user: &str) -> String {
    format!("handson-{user}")
}

/// The namespace `handson-<user>` and the template's objects in it (server-side apply:
/// made once, kept as they are).
async fn provision(state: &State, user: &str) -> Result<(), Error> {
    let client = &state.cfg.client;
    let ns = namespace_of(user);
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let pp = PatchParams::apply("kumo-classroom");
    namespaces
        .patch(
            &ns,
            &pp,
            &Patch::Apply(json!({
                "apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": ns, "labels": {"kumo.io/classroom-user": user}},
            })),
        )
        .await?;
    let docs: Vec<Value> = serde_yaml::Deserializer::from_str(&state.cfg.template)
        .map(|d| {
            serde::Deserialize::deserialize(d)
                .map_err(|e| Error::Invalid(format!("the template: {e}")))
        })
        .collect::<Result<_, _>>()?;
    let _allocating = state.allocating.lock().await;
    for mut v in docs {
        let (Some(api_version), Some(kind), Some(name)) = (
            v["apiVersion"].as_str().map(str::to_owned),
            v["kind"].as_str().map(str::to_owned),
            v.pointer("/metadata/name")
                .and_then(Value::as_str)
                .map(str::to_owned),
        ) else {
            continue;
        };
        let (group, version) = api_version
            .split_once('/')
            .unwrap_or(("", api_version.as_str()));
        let gvk = kube::core::GroupVersionKind::gvk(group, version, &kind);
        let (ar, _) = kube::discovery::pinned_kind(client, &gvk).await?;
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &ar);
        if api.get_opt(&name).await?.is_none() {
            if kind == "Cluster" {
                // The learners' clusters share the cloud's network (on the real runtime,
                // the VPC's route table holds every cluster's pod routes): each gets a
                // pod range of its own.
                let all: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
                let taken: Vec<String> = all
                    .list(&Default::default())
                    .await?
                    .items
                    .iter()
                    .flat_map(|c| pod_ranges(&c.data))
                    .collect();
                let range = free_pod_range(&taken).ok_or_else(|| {
                    Error::Invalid("no pod range left for another learner's cluster".into())
                })?;
                v["spec"]["clusterNetwork"]["pods"]["cidrBlocks"] = json!([range]);
            }
            api.patch(&name, &pp, &Patch::Apply(&v)).await?;
        }
    }
    Ok(())
}

/// The pod ranges a Cluster's `spec.clusterNetwork.pods.cidrBlocks` names.
fn pod_ranges(cluster: &Value) -> Vec<String> {
    cluster
        .pointer("/spec/clusterNetwork/pods/cidrBlocks")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|b| b.as_str().map(str::to_owned))
        .collect()
}

/// The first of the learners' pod ranges (the /20s of 172.16.0.0/12: 256 clusters of up
/// to 16 nodes, a /24 each) that overlaps none of `taken`.
fn free_pod_range(taken: &[String]) -> Option<String> {
    let parse = |c: &str| -> Option<(u32, u32)> {
        let (ip, bits) = c.split_once('/')?;
        let ip: std::net::Ipv4Addr = ip.trim().parse().ok()?;
        let bits: u32 = bits.trim().parse().ok().filter(|b| *b <= 32)?;
        let mask = if bits == 0 {
            0
        } else {
            u32::MAX << (32 - bits)
        };
        Some((u32::from(ip) & mask, mask))
    };
    let taken: Vec<(u32, u32)> = taken.iter().filter_map(|c| parse(c)).collect();
    let base = u32::from(std::net::Ipv4Addr::new(172, 16, 0, 0));
    (0..256u32).map(|i| base + (i << 12)).find_map(|net| {
        let mask = u32::MAX << 12;
        // Two ranges overlap when either holds the other's network address.
        let overlaps = taken.iter().any(|(n, m)| net & m == *n || n & mask == net);
        (!overlaps).then(|| format!("{}/20", std::net::Ipv4Addr::from(net)))
    })
}

/// The map of the user's cluster.
async fn map(state: &State, user: &str) -> Value {
    let ns = namespace_of(user);
    let clusters: Api<DynamicObject> = Api::namespaced_with(
        state.cfg.client.clone(),
        &ns,
        &kube::api::ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Cluster"),
            "clusters",
        ),
    );
    let cluster = clusters.get_opt(CLUSTER).await.ok().flatten();
    let phase = cluster
        .as_ref()
        .and_then(|c| c.data.pointer("/status/phase"))
        .cloned()
        .unwrap_or(json!("Pending"));
    let available = cluster
        .as_ref()
        .and_then(|c| c.data.pointer("/status/conditions"))
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Available"))
        .map(|c| c["status"].clone())
        .unwrap_or(json!("Unknown"));
    let mut out = json!({"user": user, "namespace": ns, "cluster": CLUSTER, "phase": phase, "available": available});
    let Ok(Some(tenant)) = state.remote.client(&ns, CLUSTER).await else {
        return out;
    };
    let list = |path: &'static str| {
        let tenant = tenant.clone();
        async move {
            let req = http_get(path);
            tenant
                .request::<Value>(req)
                .await
                .ok()
                .and_then(|v| v.get("items").cloned())
                .unwrap_or(json!([]))
        }
    };
    let (leases, nodes, pods, services, slices, events) = tokio::join!(
        list("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases"),
        list("/api/v1/nodes"),
        list("/api/v1/pods"),
        list("/api/v1/services"),
        list("/apis/discovery.k8s.io/v1/endpointslices"),
        list("/api/v1/events"),
    );
    let items = |v: &Value| v.as_array().cloned().unwrap_or_default();
    out["components"] = items(&leases)
        .iter()
        .filter(|l| !l["metadata"]["name"].as_str().unwrap_or_default().starts_with("apiserver-"))
        .map(|l| json!({"name": l["metadata"]["name"], "holder": l["spec"]["holderIdentity"], "renewed": l["spec"]["renewTime"]}))
        .collect();
    out["nodes"] = items(&nodes)
        .iter()
        .map(|n| {
            let name = n["metadata"]["name"].clone();
            let ready = n["status"]["conditions"].as_array().into_iter().flatten().any(|c| c["type"] == "Ready" && c["status"] == "True");
            let node_pods: Vec<Value> = items(&pods)
                .iter()
                .filter(|p| p["spec"]["nodeName"] == name)
                .map(|p| json!({"namespace": p["metadata"]["namespace"], "name": p["metadata"]["name"], "phase": p["status"]["phase"]}))
                .collect();
            json!({
                "name": name, "ready": ready, "providerID": n["spec"]["providerID"],
                "controlPlane": n["metadata"]["labels"].get("node-role.kubernetes.io/control-plane").is_some(),
                "zone": n["metadata"]["labels"]["topology.kubernetes.io/zone"],
                "pods": node_pods,
            })
        })
        .collect();
    out["services"] = items(&services)
        .iter()
        .map(|s| {
            let (sns, sname) = (s["metadata"]["namespace"].clone(), s["metadata"]["name"].clone());
            let endpoints: usize = items(&slices)
                .iter()
                .filter(|e| e["metadata"]["namespace"] == sns && e["metadata"]["labels"]["kubernetes.io/service-name"] == sname)
                .map(|e| e["endpoints"].as_array().map_or(0, |a| a.iter().filter(|x| x["conditions"]["ready"] != false).count()))
                .sum();
            json!({
                "namespace": sns, "name": sname, "type": s["spec"]["type"], "clusterIP": s["spec"]["clusterIP"],
                "endpoints": endpoints, "loadBalancer": s["status"]["loadBalancer"]["ingress"][0]["ip"],
            })
        })
        .collect();
    let mut evs = items(&events);
    evs.sort_by(|a, b| {
        let t = |e: &Value| {
            e["lastTimestamp"]
                .as_str()
                .or(e["eventTime"].as_str())
                .unwrap_or_default()
                .to_owned()
        };
        t(b).cmp(&t(a))
    });
    out["events"] = evs
        .iter()
        .take(8)
        .map(|e| json!({"type": e["type"], "reason": e["reason"], "object": format!("{}/{}", e["involvedObject"]["kind"].as_str().unwrap_or_default(), e["involvedObject"]["name"].as_str().unwrap_or_default()), "message": e["message"]}))
        .collect();
    out
}

fn http_get(path: &str) -> http::Request<Vec<u8>> {
    let mut r = http::Request::new(Vec::new());
    *r.uri_mut() = path.parse().unwrap_or_default();
    r
}

/// Every user's cluster, for the instructor.
async fn overview(state: &State) -> Value {
    let users = users::load(&state.cfg.users_file).unwrap_or_default();
    let clusters: Api<DynamicObject> = Api::all_with(
        state.cfg.client.clone(),
        &kube::api::ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Cluster"),
            "clusters",
        ),
    );
    let all = clusters
        .list(&Default::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    let rows: Vec<Value> = users
        .iter()
        .filter(|u| u.role == Role::Learner)
        .map(|u| {
            let ns = namespace_of(&u.name);
            let c = all.iter().find(|c| {
                c.metadata.namespace.as_deref() == Some(ns.as_str())
                    && c.metadata.name.as_deref() == Some(CLUSTER)
            });
            let get = |p: &str| {
                c.and_then(|c| c.data.pointer(p))
                    .cloned()
                    .unwrap_or(Value::Null)
            };
            let available = c
                .and_then(|c| c.data.pointer("/status/conditions"))
                .and_then(Value::as_array)
                .and_then(|cs| cs.iter().find(|x| x["type"] == "Available"))
                .map(|x| x["status"].clone())
                .unwrap_or(Value::Null);
            json!({
                "user": u.name, "namespace": ns, "cluster": c.map(|_| CLUSTER),
                "phase": get("/status/phase"), "available": available,
                "controlPlaneReady": get("/status/controlPlane/readyReplicas"),
                "workersReady": get("/status/workers/readyReplicas"),
            })
        })
        .collect();
    json!({"users": rows})
}

/// The web terminal: a WebSocket to the user's confined shell.
/// The accept key of a same-origin WebSocket upgrade, else the answer refusing it (a page
/// of another origin cannot open the user's sockets with the user's cookie).
fn websocket_accept(req: &Request<Incoming>) -> Result<String, Box<Resp>> {
    let host = req
        .headers()
        .get("host")
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let origin_ok = req
        .headers()
        .get("origin")
        .and_then(|o| o.to_str().ok())
        .is_some_and(|o| o.strip_prefix("https://") == Some(host.as_str()));
    if !origin_ok {
        return Err(Box::new(respond(
            StatusCode::FORBIDDEN,
            "text/plain",
            "cross-origin WebSocket refused\n",
        )));
    }
    let Some(key) = req.headers().get("sec-websocket-key") else {
        return Err(Box::new(respond(
            StatusCode::BAD_REQUEST,
            "text/plain",
            "a WebSocket upgrade is expected\n",
        )));
    };
    Ok(tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes()))
}

/// The 101 answer of an accepted WebSocket upgrade.
fn switching_protocols(accept: &str) -> Resp {
    let mut r = respond(StatusCode::SWITCHING_PROTOCOLS, "text/plain", "");
    r.headers_mut().remove(CONTENT_TYPE);
    r.headers_mut()
        .insert("upgrade", HeaderValue::from_static("websocket"));
    r.headers_mut()
        .insert("connection", HeaderValue::from_static("Upgrade"));
    if let Ok(v) = HeaderValue::from_str(accept) {
        r.headers_mut().insert("sec-websocket-accept", v);
    }
    r
}

/// The server side of an upgraded request.
async fn server_socket(
    req: Request<Incoming>,
) -> Option<tokio_tungstenite::WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>> {
    let upgraded = hyper::upgrade::on(req).await.ok()?;
    Some(
        tokio_tungstenite::WebSocketStream::from_raw_socket(
            TokioIo::new(upgraded),
            tokio_tungstenite::tungstenite::protocol::Role::Server,
            None,
        )
        .await,
    )
}

/// Signals `changed` at every event of a watch of `api`.
fn watch_changes<K>(api: Api<K>, changed: Arc<tokio::sync::Notify>) -> tokio::task::JoinHandle<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    K::DynamicType: Default,
{
    tokio::spawn(signal_changes(
        kube::runtime::watcher(api, Default::default()),
        changed,
    ))
}

/// The map as a WebSocket: a new snapshot whenever a watch of the user's Cluster or of
/// its workload cluster (leases, nodes, pods, Services, EndpointSlices, events) sees a
/// change.
fn map_socket(state: Arc<State>, req: Request<Incoming>, user: String) -> Resp {
    let accept = match websocket_accept(&req) {
        Ok(a) => a,
        Err(r) => return *r,
    };
    tokio::spawn(async move {
        let Some(ws) = server_socket(req).await else {
            return;
        };
        let (mut tx, mut rx) = ws.split();
        let ns = namespace_of(&user);
        let changed = Arc::new(tokio::sync::Notify::new());
        let clusters: Api<DynamicObject> = Api::namespaced_with(
            state.cfg.client.clone(),
            &ns,
            &kube::api::ApiResource::from_gvk_with_plural(
                &kube::core::GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Cluster"),
                "clusters",
            ),
        );
        let mut watches = vec![watch_changes_dynamic(clusters, changed.clone())];
        let mut watching = false;
        let mut last = Value::Null;
        loop {
            if !watching {
                if let Ok(Some(t)) = state.remote.client(&ns, CLUSTER).await {
                    use k8s_openapi::api::{
                        coordination::v1::Lease, core::v1 as core, discovery::v1::EndpointSlice,
                    };
                    watches.push(watch_changes(
                        Api::<Lease>::namespaced(t.clone(), "kube-system"),
                        changed.clone(),
                    ));
                    watches.push(watch_changes(
                        Api::<core::Node>::all(t.clone()),
                        changed.clone(),
                    ));
                    watches.push(watch_changes(
                        Api::<core::Pod>::all(t.clone()),
                        changed.clone(),
                    ));
                    watches.push(watch_changes(
                        Api::<core::Service>::all(t.clone()),
                        changed.clone(),
                    ));
                    watches.push(watch_changes(
                        Api::<EndpointSlice>::all(t.clone()),
                        changed.clone(),
                    ));
                    watches.push(watch_changes(Api::<core::Event>::all(t), changed.clone()));
                    watching = true;
                }
            }
            let m = map(&state, &user).await;
            if m != last {
                if tx.send(Message::Text(m.to_string().into())).await.is_err() {
                    break;
                }
                last = m;
            }
            tokio::select! {
                _ = changed.notified() => {
                    // A burst of changes is one snapshot.
                    tokio::time::sleep(Duration::from_millis(150)).await;
                }
                // Until the workload cluster answers, its coming is looked for.
                _ = tokio::time::sleep(Duration::from_secs(if watching { 30 } else { 1 })) => {}
                msg = rx.next() => match msg {
                    None | Some(Err(_)) | Some(Ok(Message::Close(_))) => break,
                    Some(Ok(_)) => {}
                },
            }
        }
        for w in watches {
            w.abort();
        }
    });
    switching_protocols(&accept)
}

/// [`watch_changes`] of dynamic objects.
fn watch_changes_dynamic(
    api: Api<DynamicObject>,
    changed: Arc<tokio::sync::Notify>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(signal_changes(
        kube::runtime::watcher(api, Default::default()),
        changed,
    ))
}

/// Signals `changed` at every event of `stream` (a watcher), backing off on errors.
async fn signal_changes<S, K>(stream: S, changed: Arc<tokio::sync::Notify>)
where
    S: futures::Stream<Item = kube::runtime::watcher::Result<kube::runtime::watcher::Event<K>>>
        + Send,
{
    use kube::runtime::WatchStreamExt;
    let stream = stream.default_backoff();
    futures::pin_mut!(stream);
    while let Some(ev) = stream.next().await {
        if ev.is_ok() {
            changed.notify_one();
        }
    }
}

async fn terminal(state: Arc<State>, req: Request<Incoming>, user: String) -> Resp {
    let accept = match websocket_accept(&req) {
        Ok(a) => a,
        Err(r) => return *r,
    };
    let ns = namespace_of(&user);
    let secrets: Api<Secret> = Api::namespaced(state.cfg.client.clone(), &ns);
    let kubeconfig = match secrets
        .get_opt(&kumo_capi::remote::kubeconfig_secret(CLUSTER))
        .await
    {
        Ok(Some(s)) => s.data.and_then(|d| d.get("value").map(|v| v.0.clone())),
        _ => None,
    };
    let Some(kubeconfig) = kubeconfig else {
        return respond(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "your cluster is not ready yet\n",
        );
    };
    let work = state.cfg.work_dir.clone();
    tokio::spawn(async move {
        let Some(ws) = server_socket(req).await else {
            return;
        };
        if let Err(e) = run_shell(ws, &work, &user, &kubeconfig).await {
            tracing::warn!(user = %user, error = %e, "the web terminal ended");
        }
    });
    switching_protocols(&accept)
}

async fn run_shell<S>(
    ws: tokio_tungstenite::WebSocketStream<S>,
    work: &std::path::Path,
    user: &str,
    kubeconfig: &[u8],
) -> Result<(), Error>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    // The kubeconfig is copied into the shell's root, then removed from here.
    let kc_path = work.join(format!("{user}-{:016x}.kubeconfig", rand::random::<u64>()));
    {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&kc_path)
            .map_err(|e| Error::Io(kc_path.display().to_string(), e))?;
        f.write_all(kubeconfig)
            .map_err(|e| Error::Io(kc_path.display().to_string(), e))?;
    }
    let shell = terminal::Shell::start(work, user, &kc_path);
    let mut shell = match shell {
        Ok(s) => s,
        Err(e) => {
            let _ = std::fs::remove_file(&kc_path);
            return Err(e);
        }
    };
    let (mut tx, mut rx) = ws.split();
    let mut stdin = shell
        .child
        .stdin
        .take()
        .ok_or_else(|| Error::Invalid("no stdin".into()))?;
    let mut stdout = shell
        .child
        .stdout
        .take()
        .ok_or_else(|| Error::Invalid("no stdout".into()))?;
    let mut stderr = shell
        .child
        .stderr
        .take()
        .ok_or_else(|| Error::Invalid("no stderr".into()))?;
    let kc_gone = {
        let kc = kc_path.clone();
        tokio::spawn(async move {
            // The shell's setup copies it within a moment.
            tokio::time::sleep(Duration::from_secs(3)).await;
            let _ = std::fs::remove_file(kc);
        })
    };
    let mut out = vec![0u8; 8192];
    let mut err = vec![0u8; 4096];
    loop {
        tokio::select! {
            n = stdout.read(&mut out) => match n {
                Ok(0) | Err(_) => break,
                Ok(n) => if tx.send(Message::Binary(Bytes::copy_from_slice(&out[..n]))).await.is_err() { break },
            },
            n = stderr.read(&mut err) => match n {
                Ok(0) | Err(_) => {}
                Ok(n) => { let _ = tx.send(Message::Binary(Bytes::copy_from_slice(&err[..n]))).await; }
            },
            m = rx.next() => match m {
                Some(Ok(Message::Text(t))) => { if stdin.write_all(t.as_bytes()).await.is_err() { break } }
                Some(Ok(Message::Binary(b))) => { if stdin.write_all(&b).await.is_err() { break } }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            },
        }
    }
    let _ = tx.send(Message::Close(None)).await;
    drop(shell);
    kc_gone.abort();
    let _ = std::fs::remove_file(&kc_path);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_learner_gets_a_pod_range_no_other_cluster_has() {
        assert_eq!(free_pod_range(&[]).as_deref(), Some("172.16.0.0/20"));
        // The template's own range and the management cluster's do not collide.
        let taken = vec!["192.168.0.0/16".to_owned(), "10.244.0.0/16".to_owned()];
        assert_eq!(free_pod_range(&taken).as_deref(), Some("172.16.0.0/20"));
        let taken = vec!["172.16.0.0/20".to_owned(), "172.16.16.0/20".to_owned()];
        assert_eq!(free_pod_range(&taken).as_deref(), Some("172.16.32.0/20"));
        // A wider range someone chose covers several; one inside a /20 takes it whole.
        let taken = vec!["172.16.0.0/18".to_owned(), "172.16.64.5/24".to_owned()];
        assert_eq!(free_pod_range(&taken).as_deref(), Some("172.16.80.0/20"));
        // Garbage is skipped, a full pool is none.
        let taken = vec!["nonsense".to_owned(), "172.16.0.0/12".to_owned()];
        assert_eq!(free_pod_range(&taken), None);
        let cluster =
            serde_json::json!({"spec": {"clusterNetwork": {"pods": {"cidrBlocks": ["a", "b"]}}}});
        assert_eq!(pod_ranges(&cluster), vec!["a", "b"]);
        assert!(pod_ranges(&serde_json::json!({})).is_empty());
    }
}
