//! The typed client of the cloud's API: one method per operation, over HTTPS (HTTP/2, one
//! multiplexed connection, re-established when it drops), trusting only the cloud's CA.
//!
//! ```no_run
//! # async fn f() -> Result<(), kumo_cloud::Error> {
//! let cloud = kumo_cloud::Client::from_data_dir("/var/lib/kumo/cloud".as_ref())?;
//! let i = cloud.run_instance(&kumo_cloud::RunInstanceRequest {
//!     name: Some("node-1".into()),
//!     ..Default::default()
//! }).await?;
//! match cloud.describe_instance(&i.id).await {
//!     Err(e) if e.is_not_found() => {}
//!     Err(e) => return Err(e),
//!     Ok(i) => println!("{} is {}", i.id, i.state),
//! }
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http2::SendRequest;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorBody};
use crate::model::*;
use crate::pki::{CredentialsFile, EndpointFile, CREDENTIALS_FILE, ENDPOINT_FILE};

/// Environment variables the CLI and [`ClientConfig::from_env_or_dir`] read.
pub mod env {
    /// The endpoint URL.
    pub const ENDPOINT: &str = "KUMO_CLOUD_ENDPOINT";
    /// The access key id.
    pub const ACCESS_KEY_ID: &str = "KUMO_CLOUD_ACCESS_KEY_ID";
    /// The secret.
    pub const SECRET_ACCESS_KEY: &str = "KUMO_CLOUD_SECRET_ACCESS_KEY";
    /// The CA file.
    pub const CA_FILE: &str = "KUMO_CLOUD_CA_FILE";
    /// The data directory.
    pub const DATA_DIR: &str = "KUMO_CLOUD_DATA_DIR";
}

/// Where the cloud is and who the client is.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// `https://host:port`.
    pub endpoint: String,
    /// PEM of the CA that signed the cloud's serving certificate.
    pub ca_pem: String,
    /// Access key id.
    pub access_key_id: String,
    /// Secret access key.
    pub secret_access_key: String,
    /// Per-request timeout (connecting included).
    pub timeout: Duration,
}

fn read_json<T: DeserializeOwned>(p: &Path) -> Result<T, Error> {
    let b = std::fs::read(p).map_err(|e| Error::Config(format!("{}: {e}", p.display())))?;
    serde_json::from_slice(&b).map_err(|e| Error::Config(format!("{}: {e}", p.display())))
}

impl ClientConfig {
    /// The endpoint, CA and admin credentials a cloud wrote into its data directory.
    pub fn from_data_dir(dir: &Path) -> Result<ClientConfig, Error> {
        let ep: EndpointFile = read_json(&dir.join(ENDPOINT_FILE))?;
        let creds: CredentialsFile = read_json(&dir.join(CREDENTIALS_FILE))?;
        let ca_pem = std::fs::read_to_string(&ep.ca_file)
            .map_err(|e| Error::Config(format!("{}: {e}", ep.ca_file.display())))?;
        Ok(ClientConfig {
            endpoint: ep.url,
            ca_pem,
            access_key_id: creds.access_key_id,
            secret_access_key: creds.secret_access_key,
            timeout: Duration::from_secs(30),
        })
    }

    /// The data directory's configuration (when `dir` is given or `KUMO_CLOUD_DATA_DIR` is
    /// set), with each `KUMO_CLOUD_*` variable that is set taking precedence.
    pub fn from_env_or_dir(dir: Option<&Path>) -> Result<ClientConfig, Error> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let dir = dir
            .map(Path::to_path_buf)
            .or_else(|| var(env::DATA_DIR).map(Into::into));
        let mut cfg = match dir {
            Some(d) => Some(ClientConfig::from_data_dir(&d)?),
            None => None,
        };
        let endpoint = var(env::ENDPOINT);
        let id = var(env::ACCESS_KEY_ID);
        let secret = var(env::SECRET_ACCESS_KEY);
        let ca = match var(env::CA_FILE) {
            Some(f) => {
                Some(std::fs::read_to_string(&f).map_err(|e| Error::Config(format!("{f}: {e}")))?)
            }
            None => None,
        };
        match &mut cfg {
            Some(c) => {
                if let Some(v) = endpoint {
                    c.endpoint = v;
                }
                if let Some(v) = id {
                    c.access_key_id = v;
                }
                if let Some(v) = secret {
                    c.secret_access_key = v;
                }
                if let Some(v) = ca {
                    c.ca_pem = v;
                }
            }
            None => {
                let (Some(endpoint), Some(id), Some(secret), Some(ca)) = (endpoint, id, secret, ca)
                else {
                    return Err(Error::Config(format!(
                        "no cloud to talk to: pass --data-dir, or set {} (or all of {}, {}, {} and {})",
                        env::DATA_DIR,
                        env::ENDPOINT,
                        env::ACCESS_KEY_ID,
                        env::SECRET_ACCESS_KEY,
                        env::CA_FILE
                    )));
                };
                cfg = Some(ClientConfig {
                    endpoint,
                    ca_pem: ca,
                    access_key_id: id,
                    secret_access_key: secret,
                    timeout: Duration::from_secs(30),
                });
            }
        }
        cfg.ok_or_else(|| Error::Config("no configuration".to_owned()))
    }
}

/// A client configuration file (what a `--cloud-config` flag points at): JSON with
/// `endpoint`, `accessKeyId`, `secretAccessKey`, and `caFile` or `caData` (PEM).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClientConfigFile {
    /// `https://host:port`.
    pub endpoint: String,
    /// Access key id.
    pub access_key_id: String,
    /// Secret access key.
    pub secret_access_key: String,
    /// Path of the CA certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<std::path::PathBuf>,
    /// The CA certificate itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_data: Option<String>,
}

impl ClientConfig {
    /// Reads a [`ClientConfigFile`].
    pub fn from_file(path: &Path) -> Result<ClientConfig, Error> {
        let f: ClientConfigFile = read_json(path)?;
        let ca_pem = match (f.ca_data, f.ca_file) {
            (Some(d), _) => d,
            (None, Some(p)) => std::fs::read_to_string(&p)
                .map_err(|e| Error::Config(format!("{}: {e}", p.display())))?,
            (None, None) => {
                return Err(Error::Config(format!(
                    "{}: neither caFile nor caData is set",
                    path.display()
                )))
            }
        };
        Ok(ClientConfig {
            endpoint: f.endpoint,
            ca_pem,
            access_key_id: f.access_key_id,
            secret_access_key: f.secret_access_key,
            timeout: Duration::from_secs(30),
        })
    }

    /// Writes this configuration as a [`ClientConfigFile`] with the CA embedded, mode 0600.
    pub fn write_file(&self, path: &Path) -> Result<(), Error> {
        let f = ClientConfigFile {
            endpoint: self.endpoint.clone(),
            access_key_id: self.access_key_id.clone(),
            secret_access_key: self.secret_access_key.clone(),
            ca_file: None,
            ca_data: Some(self.ca_pem.clone()),
        };
        let b = serde_json::to_vec_pretty(&f).map_err(|e| Error::Config(e.to_string()))?;
        crate::state::write_atomic(path, &b).map_err(Error::Config)
    }

    /// The same cloud with another access key.
    pub fn with_credentials(&self, access_key_id: &str, secret: &str) -> ClientConfig {
        ClientConfig {
            access_key_id: access_key_id.to_owned(),
            secret_access_key: secret.to_owned(),
            ..self.clone()
        }
    }
}

struct Inner {
    endpoint: String,
    host: String,
    port: u16,
    server_name: rustls::pki_types::ServerName<'static>,
    tls: Arc<rustls::ClientConfig>,
    auth: HeaderValue,
    timeout: Duration,
    conn: tokio::sync::Mutex<Option<SendRequest<Full<Bytes>>>>,
}

/// A client of the cloud's API. Cheap to clone; clones share the connection.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("endpoint", &self.inner.endpoint)
            .finish()
    }
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn enc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            o.push(char::from(b));
        } else {
            o.push_str(&format!("%{b:02X}"));
        }
    }
    o
}

fn query(pairs: &[(String, String)]) -> String {
    if pairs.is_empty() {
        return String::new();
    }
    let q: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{}={}", enc(k), enc(v)))
        .collect();
    format!("?{}", q.join("&"))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Instances {
    instances: Vec<Instance>,
}
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LoadBalancers {
    load_balancers: Vec<LoadBalancer>,
}
#[derive(Deserialize)]
struct Volumes {
    volumes: Vec<Volume>,
}
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RouteTables {
    route_tables: Vec<RouteTable>,
}
#[derive(Deserialize)]
struct Routes {
    routes: Vec<Route>,
}
#[derive(Deserialize)]
struct Regions {
    regions: Vec<Region>,
}
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct InstanceTypes {
    instance_types: Vec<InstanceType>,
}
#[derive(Deserialize)]
struct Vpcs {
    vpcs: Vec<Vpc>,
}
#[derive(Deserialize)]
struct Subnets {
    subnets: Vec<Subnet>,
}
#[derive(Deserialize)]
struct Faults {
    faults: BTreeMap<String, Fault>,
}
#[derive(Deserialize)]
struct Policies {
    policies: Vec<PolicyStatement>,
}
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AccessKeys {
    access_keys: Vec<AccessKey>,
}

/// No request body.
const NONE: Option<&()> = None;

impl Client {
    /// A client for `cfg`.
    pub fn new(cfg: ClientConfig) -> Result<Client, Error> {
        let rest = cfg
            .endpoint
            .strip_prefix("https://")
            .ok_or_else(|| Error::Config(format!("endpoint '{}' is not https://", cfg.endpoint)))?
            .trim_end_matches('/');
        let (host, port) = match rest.rsplit_once(':') {
            Some((h, p)) if !p.contains(']') => (
                h.to_owned(),
                p.parse::<u16>()
                    .map_err(|_| Error::Config(format!("endpoint '{}': bad port", cfg.endpoint)))?,
            ),
            _ => (rest.to_owned(), 443),
        };
        let bare = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let server_name = rustls::pki_types::ServerName::try_from(bare.clone())
            .map_err(|e| Error::Config(format!("endpoint host '{bare}': {e}")))?;
        let tls = crate::pki::client_config(&cfg.ca_pem).map_err(Error::Config)?;
        let auth = HeaderValue::from_str(&format!(
            "Bearer {}:{}",
            cfg.access_key_id, cfg.secret_access_key
        ))
        .map_err(|_| Error::Config("the credentials are not valid header text".to_owned()))?;
        Ok(Client {
            inner: Arc::new(Inner {
                endpoint: format!("https://{host}:{port}"),
                host: bare,
                port,
                server_name,
                tls,
                auth,
                timeout: cfg.timeout,
                conn: tokio::sync::Mutex::new(None),
            }),
        })
    }

    /// A client with the admin credentials of the cloud whose data directory is `dir`.
    pub fn from_data_dir(dir: &Path) -> Result<Client, Error> {
        Client::new(ClientConfig::from_data_dir(dir)?)
    }

    /// The endpoint URL.
    pub fn endpoint(&self) -> &str {
        &self.inner.endpoint
    }

    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, Error> {
        let i = &self.inner;
        let tcp = tokio::net::TcpStream::connect((i.host.as_str(), i.port))
            .await
            .map_err(|e| Error::Transport(format!("connecting to {}: {e}", i.endpoint)))?;
        let _ = tcp.set_nodelay(true);
        let tls = tokio_rustls::TlsConnector::from(i.tls.clone())
            .connect(i.server_name.clone(), tcp)
            .await
            .map_err(|e| Error::Transport(format!("TLS with {}: {e}", i.endpoint)))?;
        let (sender, conn) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(tls),
        )
        .await
        .map_err(|e| Error::Transport(format!("HTTP/2 with {}: {e}", i.endpoint)))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender)
    }

    async fn sender(&self, fresh: bool) -> Result<SendRequest<Full<Bytes>>, Error> {
        let mut g = self.inner.conn.lock().await;
        if !fresh {
            if let Some(s) = g.as_ref().filter(|s| !s.is_closed()) {
                return Ok(s.clone());
            }
        }
        let s = self.connect().await?;
        *g = Some(s.clone());
        Ok(s)
    }

    async fn send_once(
        &self,
        method: &Method,
        path: &str,
        body: &Bytes,
        fresh: bool,
    ) -> Result<http::Response<hyper::body::Incoming>, (bool, Error)> {
        let mut sender = self.sender(fresh).await.map_err(|e| (false, e))?;
        let mut req = Request::builder()
            .method(method.clone())
            .uri(format!("{}{path}", self.inner.endpoint))
            .header(http::header::AUTHORIZATION, self.inner.auth.clone());
        if !body.is_empty() {
            req = req.header(http::header::CONTENT_TYPE, "application/json");
        }
        let req = req
            .body(Full::new(body.clone()))
            .map_err(|e| (false, Error::Config(format!("building the request: {e}"))))?;
        sender
            .ready()
            .await
            .map_err(|e| (true, Error::Transport(e.to_string())))?;
        sender.send_request(req).await.map_err(|e| {
            // A request the connection never took can be sent again on a new one.
            (
                e.is_canceled() || e.is_closed(),
                Error::Transport(e.to_string()),
            )
        })
    }

    /// Sends a request and decodes a success body as `T`, or the error body.
    async fn call<T: DeserializeOwned, B: Serialize>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<T, Error> {
        let body = match body {
            Some(b) => Bytes::from(
                serde_json::to_vec(b).map_err(|e| Error::Config(format!("encoding: {e}")))?,
            ),
            None => Bytes::new(),
        };
        let fut = async {
            let resp = match self.send_once(&method, path, &body, false).await {
                Ok(r) => r,
                Err((true, _)) => self
                    .send_once(&method, path, &body, true)
                    .await
                    .map_err(|(_, e)| e)?,
                Err((false, e)) => return Err(e),
            };
            let status = resp.status().as_u16();
            let headers = resp.headers().clone();
            let bytes = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| Error::Transport(format!("reading the answer: {e}")))?
                .to_bytes();
            Ok::<_, Error>((status, headers, bytes))
        };
        let (status, headers, bytes) = tokio::time::timeout(self.inner.timeout, fut)
            .await
            .map_err(|_| {
                Error::Timeout(format!(
                    "{method} {path}: no answer within {:?}",
                    self.inner.timeout
                ))
            })??;
        if (200..300).contains(&status) {
            return serde_json::from_slice(&bytes)
                .map_err(|e| Error::Decode(format!("{method} {path}: {e}")));
        }
        let request_id = headers
            .get(crate::server::REQUEST_ID_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let retry_after = headers
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        match serde_json::from_slice::<ErrorBody>(&bytes) {
            Ok(b) => Err(Error::Api {
                status,
                code: b.error.code,
                message: b.error.message,
                request_id: b.request_id.or(request_id),
                retry_after,
            }),
            Err(_) => Err(Error::Decode(format!(
                "{method} {path}: HTTP {status} without an error body: {}",
                String::from_utf8_lossy(&bytes)
            ))),
        }
    }

    // ---- region ----

    /// `GET /v1/regions`.
    pub async fn regions(&self) -> Result<Vec<Region>, Error> {
        Ok(self
            .call::<Regions, ()>(Method::GET, "/v1/regions", NONE)
            .await?
            .regions)
    }

    /// `GET /v1/instance-types`.
    pub async fn instance_types(&self) -> Result<Vec<InstanceType>, Error> {
        Ok(self
            .call::<InstanceTypes, ()>(Method::GET, "/v1/instance-types", NONE)
            .await?
            .instance_types)
    }

    /// `GET /v1/vpcs`.
    pub async fn vpcs(&self) -> Result<Vec<Vpc>, Error> {
        Ok(self
            .call::<Vpcs, ()>(Method::GET, "/v1/vpcs", NONE)
            .await?
            .vpcs)
    }

    /// `GET /v1/subnets`.
    pub async fn subnets(&self) -> Result<Vec<Subnet>, Error> {
        Ok(self
            .call::<Subnets, ()>(Method::GET, "/v1/subnets", NONE)
            .await?
            .subnets)
    }

    // ---- instances ----

    /// `POST /v1/instances`: launches an instance (state `pending`).
    pub async fn run_instance(&self, req: &RunInstanceRequest) -> Result<Instance, Error> {
        self.call(Method::POST, "/v1/instances", Some(req)).await
    }

    /// `GET /v1/instances/{id}`; 404 `InvalidInstanceID.NotFound` when unknown.
    pub async fn describe_instance(&self, id: &str) -> Result<Instance, Error> {
        self.call::<_, ()>(Method::GET, &format!("/v1/instances/{}", enc(id)), NONE)
            .await
    }

    /// `GET /v1/instances` with filters.
    pub async fn list_instances(&self, filter: &InstanceFilter) -> Result<Vec<Instance>, Error> {
        let path = format!("/v1/instances{}", query(&filter.query_pairs()));
        Ok(self
            .call::<Instances, ()>(Method::GET, &path, NONE)
            .await?
            .instances)
    }

    /// `POST /v1/instances/{id}/stop`: running → stopping → stopped.
    pub async fn stop_instance(&self, id: &str) -> Result<Instance, Error> {
        self.call(
            Method::POST,
            &format!("/v1/instances/{}/stop", enc(id)),
            Some(&StopInstanceRequest::default()),
        )
        .await
    }

    /// `POST /v1/instances/{id}/start`: stopped → pending → running.
    pub async fn start_instance(&self, id: &str) -> Result<Instance, Error> {
        self.call::<_, ()>(
            Method::POST,
            &format!("/v1/instances/{}/start", enc(id)),
            NONE,
        )
        .await
    }

    /// `POST /v1/instances/{id}/terminate`: → shutting-down → terminated.
    pub async fn terminate_instance(&self, id: &str) -> Result<Instance, Error> {
        self.call::<_, ()>(
            Method::POST,
            &format!("/v1/instances/{}/terminate", enc(id)),
            NONE,
        )
        .await
    }

    /// Polls until the instance is in `state` (or `timeout` passes).
    pub async fn wait_for_instance_state(
        &self,
        id: &str,
        state: InstanceState,
        timeout: Duration,
    ) -> Result<Instance, Error> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let i = self.describe_instance(id).await?;
            if i.state == state {
                return Ok(i);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Error::Timeout(format!(
                    "instance {id} is {} after {timeout:?}, not {state}",
                    i.state
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    // ---- load balancers ----

    /// `POST /v1/load-balancers`.
    pub async fn create_load_balancer(
        &self,
        req: &CreateLoadBalancerRequest,
    ) -> Result<LoadBalancer, Error> {
        self.call(Method::POST, "/v1/load-balancers", Some(req))
            .await
    }

    /// `GET /v1/load-balancers/{id}`; 404 `LoadBalancerNotFound` when unknown.
    pub async fn describe_load_balancer(&self, id: &str) -> Result<LoadBalancer, Error> {
        self.call::<_, ()>(
            Method::GET,
            &format!("/v1/load-balancers/{}", enc(id)),
            NONE,
        )
        .await
    }

    /// The load balancer named `name`, if there is one (`GET /v1/load-balancers?name=`).
    pub async fn find_load_balancer(&self, name: &str) -> Result<Option<LoadBalancer>, Error> {
        let path = format!("/v1/load-balancers?name={}", enc(name));
        Ok(self
            .call::<LoadBalancers, ()>(Method::GET, &path, NONE)
            .await?
            .load_balancers
            .into_iter()
            .next())
    }

    /// `GET /v1/load-balancers`.
    pub async fn list_load_balancers(&self) -> Result<Vec<LoadBalancer>, Error> {
        Ok(self
            .call::<LoadBalancers, ()>(Method::GET, "/v1/load-balancers", NONE)
            .await?
            .load_balancers)
    }

    /// `PATCH /v1/load-balancers/{id}`: replaces the fields given.
    pub async fn update_load_balancer(
        &self,
        id: &str,
        req: &UpdateLoadBalancerRequest,
    ) -> Result<LoadBalancer, Error> {
        self.call(
            Method::PATCH,
            &format!("/v1/load-balancers/{}", enc(id)),
            Some(req),
        )
        .await
    }

    /// `DELETE /v1/load-balancers/{id}`: returns what was deleted.
    pub async fn delete_load_balancer(&self, id: &str) -> Result<LoadBalancer, Error> {
        self.call::<_, ()>(
            Method::DELETE,
            &format!("/v1/load-balancers/{}", enc(id)),
            NONE,
        )
        .await
    }

    // ---- volumes ----

    /// `POST /v1/volumes`: the new volume, or the one of the same name.
    pub async fn create_volume(&self, req: &CreateVolumeRequest) -> Result<Volume, Error> {
        self.call(Method::POST, "/v1/volumes", Some(req)).await
    }

    /// `GET /v1/volumes/{id}`; 404 `InvalidVolume.NotFound` when unknown.
    pub async fn describe_volume(&self, id: &str) -> Result<Volume, Error> {
        self.call::<_, ()>(Method::GET, &format!("/v1/volumes/{}", enc(id)), NONE)
            .await
    }

    /// `GET /v1/volumes` with `filter`.
    pub async fn list_volumes(&self, filter: &VolumeFilter) -> Result<Vec<Volume>, Error> {
        let path = format!("/v1/volumes{}", query(&filter.query_pairs()));
        Ok(self
            .call::<Volumes, ()>(Method::GET, &path, NONE)
            .await?
            .volumes)
    }

    /// `POST /v1/volumes/{id}/attach`.
    pub async fn attach_volume(&self, id: &str, instance_id: &str) -> Result<Volume, Error> {
        let req = AttachVolumeRequest {
            instance_id: instance_id.to_owned(),
        };
        self.call(
            Method::POST,
            &format!("/v1/volumes/{}/attach", enc(id)),
            Some(&req),
        )
        .await
    }

    /// `POST /v1/volumes/{id}/detach`; only from `instance_id` when given.
    pub async fn detach_volume(
        &self,
        id: &str,
        instance_id: Option<&str>,
    ) -> Result<Volume, Error> {
        let req = DetachVolumeRequest {
            instance_id: instance_id.map(str::to_owned),
        };
        self.call(
            Method::POST,
            &format!("/v1/volumes/{}/detach", enc(id)),
            Some(&req),
        )
        .await
    }

    /// `POST /v1/volumes/{id}/modify`: grows the volume to `size_gib`.
    pub async fn modify_volume(&self, id: &str, size_gib: u64) -> Result<Volume, Error> {
        self.call(
            Method::POST,
            &format!("/v1/volumes/{}/modify", enc(id)),
            Some(&ModifyVolumeRequest { size_gib }),
        )
        .await
    }

    /// `DELETE /v1/volumes/{id}`: returns what was deleted.
    pub async fn delete_volume(&self, id: &str) -> Result<Volume, Error> {
        self.call::<_, ()>(Method::DELETE, &format!("/v1/volumes/{}", enc(id)), NONE)
            .await
    }

    // ---- routes ----

    /// The main route table of the default VPC (the one the route controller writes).
    pub async fn main_route_table(&self) -> Result<RouteTable, Error> {
        self.list_route_tables()
            .await?
            .into_iter()
            .find(|t| t.main)
            .ok_or_else(|| Error::Decode("the cloud has no main route table".to_owned()))
    }

    /// `GET /v1/route-tables`.
    pub async fn list_route_tables(&self) -> Result<Vec<RouteTable>, Error> {
        Ok(self
            .call::<RouteTables, ()>(Method::GET, "/v1/route-tables", NONE)
            .await?
            .route_tables)
    }

    /// `GET /v1/route-tables/{id}`.
    pub async fn describe_route_table(&self, id: &str) -> Result<RouteTable, Error> {
        self.call::<_, ()>(Method::GET, &format!("/v1/route-tables/{}", enc(id)), NONE)
            .await
    }

    /// `GET /v1/route-tables/{id}/routes`.
    pub async fn list_routes(&self, table: &str) -> Result<Vec<Route>, Error> {
        Ok(self
            .call::<Routes, ()>(
                Method::GET,
                &format!("/v1/route-tables/{}/routes", enc(table)),
                NONE,
            )
            .await?
            .routes)
    }

    /// `POST /v1/route-tables/{id}/routes`.
    pub async fn create_route(
        &self,
        table: &str,
        req: &CreateRouteRequest,
    ) -> Result<Route, Error> {
        self.call(
            Method::POST,
            &format!("/v1/route-tables/{}/routes", enc(table)),
            Some(req),
        )
        .await
    }

    /// `DELETE /v1/route-tables/{id}/routes?destinationCidr=`: returns what was deleted.
    pub async fn delete_route(&self, table: &str, destination_cidr: &str) -> Result<Route, Error> {
        self.call::<_, ()>(
            Method::DELETE,
            &format!(
                "/v1/route-tables/{}/routes?destinationCidr={}",
                enc(table),
                enc(destination_cidr)
            ),
            NONE,
        )
        .await
    }

    // ---- faults, policies, quotas, keys ----

    /// `GET /v1/faults`.
    pub async fn faults(&self) -> Result<BTreeMap<String, Fault>, Error> {
        Ok(self
            .call::<Faults, ()>(Method::GET, "/v1/faults", NONE)
            .await?
            .faults)
    }

    /// `PUT /v1/faults/{operation}` (`*` for every operation).
    pub async fn set_fault(&self, operation: &str, fault: &Fault) -> Result<Fault, Error> {
        self.call(
            Method::PUT,
            &format!("/v1/faults/{}", enc(operation)),
            Some(fault),
        )
        .await
    }

    /// `DELETE /v1/faults/{operation}`, or every fault with `None`.
    pub async fn clear_faults(&self, operation: Option<&str>) -> Result<(), Error> {
        let path = match operation {
            Some(op) => format!("/v1/faults/{}", enc(op)),
            None => "/v1/faults".to_owned(),
        };
        self.call::<Faults, ()>(Method::DELETE, &path, NONE).await?;
        Ok(())
    }

    /// `GET /v1/policies`.
    pub async fn policies(&self) -> Result<Vec<PolicyStatement>, Error> {
        Ok(self
            .call::<Policies, ()>(Method::GET, "/v1/policies", NONE)
            .await?
            .policies)
    }

    /// Denies `action` to `credential` (every credential with `None`).
    pub async fn deny(
        &self,
        action: &str,
        credential: Option<&str>,
    ) -> Result<PolicyStatement, Error> {
        let req = CreatePolicyRequest {
            effect: Some("Deny".to_owned()),
            action: action.to_owned(),
            credential: credential.map(str::to_owned),
        };
        self.call(Method::POST, "/v1/policies", Some(&req)).await
    }

    /// Removes the deny statements of `action` (only `credential`'s when given); returns them.
    pub async fn allow(
        &self,
        action: &str,
        credential: Option<&str>,
    ) -> Result<Vec<PolicyStatement>, Error> {
        let mut path = format!("/v1/policies?action={}", enc(action));
        if let Some(c) = credential {
            path.push_str(&format!("&credential={}", enc(c)));
        }
        Ok(self
            .call::<Policies, ()>(Method::DELETE, &path, NONE)
            .await?
            .policies)
    }

    /// `DELETE /v1/policies/{id}`.
    pub async fn delete_policy(&self, id: &str) -> Result<PolicyStatement, Error> {
        self.call::<_, ()>(Method::DELETE, &format!("/v1/policies/{}", enc(id)), NONE)
            .await
    }

    /// `GET /v1/quotas`.
    pub async fn quotas(&self) -> Result<Quotas, Error> {
        self.call::<_, ()>(Method::GET, "/v1/quotas", NONE).await
    }

    /// `PUT /v1/quotas`.
    pub async fn set_quotas(&self, req: &UpdateQuotasRequest) -> Result<Quotas, Error> {
        self.call(Method::PUT, "/v1/quotas", Some(req)).await
    }

    /// `POST /v1/access-keys`: the answer holds the secret, once.
    pub async fn create_access_key(&self, name: &str) -> Result<AccessKey, Error> {
        let req = CreateAccessKeyRequest {
            name: name.to_owned(),
        };
        self.call(Method::POST, "/v1/access-keys", Some(&req)).await
    }

    /// `GET /v1/access-keys`.
    pub async fn list_access_keys(&self) -> Result<Vec<AccessKey>, Error> {
        Ok(self
            .call::<AccessKeys, ()>(Method::GET, "/v1/access-keys", NONE)
            .await?
            .access_keys)
    }

    /// `GET /v1/caller-identity`.
    pub async fn caller_identity(&self) -> Result<CallerIdentity, Error> {
        self.call::<_, ()>(Method::GET, "/v1/caller-identity", NONE)
            .await
    }

    /// The same cloud with another access key.
    pub fn with_credentials(&self, access_key_id: &str, secret: &str) -> Result<Client, Error> {
        let auth = HeaderValue::from_str(&format!("Bearer {access_key_id}:{secret}"))
            .map_err(|_| Error::Config("the credentials are not valid header text".to_owned()))?;
        let i = &self.inner;
        Ok(Client {
            inner: Arc::new(Inner {
                endpoint: i.endpoint.clone(),
                host: i.host.clone(),
                port: i.port,
                server_name: i.server_name.clone(),
                tls: i.tls.clone(),
                auth,
                timeout: i.timeout,
                conn: tokio::sync::Mutex::new(None),
            }),
        })
    }

    /// `GET /openapi.json`.
    pub async fn openapi(&self) -> Result<serde_json::Value, Error> {
        self.call::<_, ()>(Method::GET, "/openapi.json", NONE).await
    }
}
