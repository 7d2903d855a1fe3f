//! The HTTPS listener and start-up: store, certificates, admin kubeconfig, the namespaces
//! every cluster has, then serving.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use kumo_storage::embedded::{EmbeddedConfig, EmbeddedStore};
use kumo_storage::etcd::EtcdStore;
use kumo_storage::{CompactionConfig, Limits, Store};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::handler::State;
use crate::negotiate::Accept;
use crate::pki;
use crate::registry::Registry;
use crate::rest::{self, Rest};

/// Where the API server keeps its state.
#[derive(Clone, Debug)]
pub enum StoreConfig {
    /// The embedded store in `<data-dir>/store`.
    Embedded,
    /// A real etcd cluster.
    Etcd(Vec<String>),
}

/// Settings of `kumo apiserver`.
#[derive(Clone, Debug)]
pub struct ApiServerConfig {
    /// Address to listen on (port 0 picks a free one).
    pub bind: SocketAddr,
    /// Certificates, kubeconfigs and (for the embedded store) data.
    pub data_dir: PathBuf,
    pub store: StoreConfig,
    /// Extra IP address for the serving certificate and the kubeconfig.
    pub advertise_address: Option<IpAddr>,
    /// `--audit-policy-file`: an audit.k8s.io/v1 Policy; no auditing without one.
    pub audit_policy_file: Option<PathBuf>,
    /// `--audit-log-path`: where audit events go, one JSON line each (`-` is stdout).
    pub audit_log_path: Option<PathBuf>,
    /// Kubelets reached at another address than their Node reports (shared: the owner
    /// may change it while the server runs).
    pub kubelet_dial_overrides: crate::proxy::KubeletDialOverrides,
    /// `--etcd-compaction-interval`: history older than this is compacted away (5m, as
    /// upstream; zero keeps it all).
    pub compaction_interval: std::time::Duration,
    /// The pods' network, when the host does not route it (`kumo up`'s simulated one).
    pub pod_network: Option<Arc<dyn crate::resource_proxy::PodNetwork>>,
    /// Where in-cluster clients reach this server, when not where it serves: the
    /// `kubernetes` Service's endpoint (kube-apiserver's advertise address and port).
    /// `kumo up` on the real network relays the control-plane node's address to the
    /// server on loopback.
    pub service_endpoint: Option<SocketAddr>,
    /// The client certificate for etcd members that serve TLS (`--etcd-cafile`,
    /// `--etcd-certfile`, `--etcd-keyfile`).
    pub etcd_tls: Option<kumo_storage::etcd::EtcdTls>,
    /// The host name this server's identity lease is named after (the machine's own;
    /// the OS's when `None`).
    pub hostname: Option<String>,
    /// `--service-cluster-ip-range`: the default ServiceCIDR, made at the first start
    /// (a stored one stays, as upstream), whose first address is the `kubernetes`
    /// Service's. IPv4, from /1 to /30.
    pub service_cluster_ip_range: String,
}

impl ApiServerConfig {
    /// Defaults: 127.0.0.1:6443, the embedded store.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        ApiServerConfig {
            bind: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 6443),
            data_dir: data_dir.into(),
            store: StoreConfig::Embedded,
            advertise_address: None,
            audit_policy_file: None,
            audit_log_path: None,
            kubelet_dial_overrides: Default::default(),
            compaction_interval: CompactionConfig::default().window,
            pod_network: None,
            service_endpoint: None,
            etcd_tls: None,
            hostname: None,
            service_cluster_ip_range: crate::registry::service_cidr(),
        }
    }
}

/// A running API server.
pub struct ApiServer {
    /// The address it listens on.
    pub local_addr: SocketAddr,
    /// The admin kubeconfig it wrote.
    pub admin_kubeconfig: PathBuf,
    /// Time from start to serving.
    pub startup: std::time::Duration,
    task: tokio::task::JoinHandle<()>,
}

impl ApiServer {
    /// Starts serving; returns once the listener is up and the cluster is bootstrapped.
    pub async fn start(cfg: ApiServerConfig) -> Result<ApiServer> {
        let started = Instant::now();
        std::fs::create_dir_all(&cfg.data_dir)
            .with_context(|| format!("creating {}", cfg.data_dir.display()))?;
        let compaction = CompactionConfig {
            window: cfg.compaction_interval,
            ..CompactionConfig::default()
        };
        let store: Arc<dyn Store> = match &cfg.store {
            StoreConfig::Embedded => {
                let mut store_cfg = EmbeddedConfig::new(cfg.data_dir.join("store"));
                store_cfg.compaction = compaction;
                EmbeddedStore::open(store_cfg).await?
            }
            StoreConfig::Etcd(endpoints) => {
                EtcdStore::connect_with(
                    endpoints,
                    cfg.etcd_tls.as_ref(),
                    Limits::default(),
                    compaction,
                )
                .await?
            }
        };
        let listener = TcpListener::bind(cfg.bind)
            .await
            .with_context(|| format!("listening on {}", cfg.bind))?;
        let local_addr = listener.local_addr()?;

        // Certificates and kubeconfigs, laid out like kubeadm's (see `pki`): created at
        // first start, reused afterwards; the serving certificate follows the flags.
        let host = match (cfg.advertise_address, local_addr.ip()) {
            (Some(a), _) => a,
            (None, ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            (None, ip) => ip,
        };
        let server_url = format!("https://{}", SocketAddr::new(host, local_addr.port()));
        let service_range = crate::registry::parse_service_cidr(&cfg.service_cluster_ip_range)
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "--service-cluster-ip-range {:?}: not an IPv4 range from /1 to /30",
                    cfg.service_cluster_ip_range
                )
            })?;
        let (dns, mut ips) = pki::apiserver_sans(cfg.advertise_address, cfg.bind.ip());
        // The `kubernetes` Service's address, where in-cluster clients dial it.
        let service_ip = IpAddr::V4(crate::registry::first_service_ip(service_range));
        if !ips.contains(&service_ip) {
            ips.push(service_ip);
        }
        // In-cluster clients (and nodes, on the real network) reach it at the Service's
        // endpoint: the certificate is for that address too, as for kubeadm's advertise
        // address.
        if let Some(e) = cfg.service_endpoint.filter(|e| !ips.contains(&e.ip())) {
            ips.push(e.ip());
        }
        let certs = pki::ensure(&cfg.data_dir, &server_url, &dns, &ips)?;
        let admin_kubeconfig = certs.admin_kubeconfig.clone();
        let audit = crate::audit::Auditor::from_config(
            cfg.audit_policy_file.as_deref(),
            cfg.audit_log_path.as_deref(),
        )?;

        let (tls, verifier) = tls_config(&cfg.data_dir, &certs.ca_pem, &certs.serving)?;
        let mut rest = Rest::new(store.clone());
        rest.store_is_etcd = matches!(cfg.store, StoreConfig::Etcd(_));
        rest.pod_network = cfg.pod_network.clone();
        // The admission plugins beyond the strategies' own, in upstream's order.
        // RBAC follows its objects from here on (the bootstrap policy arrives by watch).
        let rbac = crate::auth::rbac::Rbac::start(store.clone()).await?;
        // After system:masters: Node, then RBAC.
        let authorizers: Vec<Arc<dyn crate::auth::Authorizer>> = vec![
            crate::auth::node::NodeAuthorizer::start(store.clone()).await?,
            rbac.clone(),
        ];
        let plugins: Vec<Arc<dyn crate::admission::Plugin>> = vec![
            // Not an admission plugin upstream but part of RBAC's storage; it refuses
            // before any other plugin validates.
            Arc::new(crate::auth::escalation::Escalation { rbac: rbac.clone() }),
            // kube-apiserver's order (its AllOrderedPlugins): ResourceQuota comes last, so
            // that nothing refused later has been charged.
            Arc::new(crate::admission::limitranger::LimitRanger),
            Arc::new(crate::admission::noderestriction::NodeRestriction),
            Arc::new(crate::admission::taintnodes::TaintNodesByCondition),
            Arc::new(crate::admission::podsecurity::PodSecurity::default()),
            Arc::new(crate::admission::pvcresize::PersistentVolumeClaimResize),
            Arc::new(crate::admission::runtimeclass::RuntimeClass),
            Arc::new(crate::admission::certificates::CertificateApproval::new(
                authorizers.clone(),
            )),
            Arc::new(crate::admission::certificates::CertificateSigning::new(
                authorizers.clone(),
            )),
            Arc::new(crate::admission::certificates::CertificateSubjectRestriction),
            Arc::new(crate::admission::map::MutatingAdmissionPolicy),
            Arc::new(crate::admission::webhook::Webhooks::mutating()),
            Arc::new(crate::admission::vap::ValidatingAdmissionPolicy),
            Arc::new(crate::admission::webhook::Webhooks::validating()),
            Arc::new(crate::admission::quota::ResourceQuota::new()),
        ];
        let _ = rest.admission.set(crate::admission::Chain::new(plugins));
        let rest = Arc::new(rest);
        let registry = Registry::builtin();
        bootstrap_namespaces(&rest, &registry).await?;
        crate::registry::bootstrap_policy(&rest, &registry).await?;
        let (ep_ip, ep_port) = cfg
            .service_endpoint
            .map_or((host, local_addr.port()), |e| (e.ip(), e.port()));
        bootstrap_kubernetes_service(&rest, &registry, service_range, ep_ip, ep_port).await?;
        let front_proxy_ca =
            std::fs::read_to_string(cfg.data_dir.join("pki").join("front-proxy-ca.crt")).ok();
        bootstrap_kube_system_config_maps(&rest, &registry, &certs.ca_pem, front_proxy_ca).await?;
        let crd_revision = crate::registry::crd::load(&rest, &registry).await?;
        let sa_key =
            crate::auth::serviceaccount::SigningKey::load_or_create(&cfg.data_dir.join("pki"))?;
        // kube-apiserver's --kubelet-client-certificate/--kubelet-client-key.
        let kubelet = match crate::proxy::KubeletClient::load(&cfg.data_dir.join("pki")) {
            Ok(k) => Some(Arc::new(k)),
            Err(e) => {
                tracing::warn!(error = %e, "no kubelet client certificate: pods/log and exec are unavailable");
                None
            }
        };
        let aggregator =
            crate::aggregator::Aggregator::start(store.clone(), &cfg.data_dir.join("pki")).await?;
        let state = Arc::new(State {
            aggregator,
            kubelet,
            kubelet_dial: cfg.kubelet_dial_overrides.clone(),
            pod_network: cfg.pod_network.clone(),
            service_account_key: Some(sa_key.clone()),
            metrics: Default::default(),
            registry,
            rest,
            // Where clients reach it, as kube-apiserver's advertise address: what `/api`
            // and the OIDC discovery document's `jwks_uri` name.
            address: cfg
                .service_endpoint
                .unwrap_or(SocketAddr::new(host, local_addr.port()))
                .to_string(),
            // The checks under upstream's names. Apart from etcd, each names work kumo has
            // finished before it serves (its post-start hooks run to completion first),
            // so they pass from the first request on.
            checks: [
                "etcd",
                "poststarthook/start-apiserver-admission-initializer",
                "poststarthook/generic-apiserver-start-informers",
                "poststarthook/storage-readiness",
                "poststarthook/start-apiextensions-informers",
                "poststarthook/start-apiextensions-controllers",
                "poststarthook/crd-informer-synced",
                "poststarthook/start-system-namespaces-controller",
                "poststarthook/start-cluster-authentication-info-controller",
                crate::identity::HOOKS[0],
                crate::identity::HOOKS[1],
                crate::registry::services::repair::HOOK,
                "poststarthook/rbac/bootstrap-roles",
                "poststarthook/scheduling/bootstrap-system-priority-classes",
                "poststarthook/priority-and-fairness-config-producer",
                "poststarthook/bootstrap-controller",
                "poststarthook/start-kube-aggregator-informers",
                "poststarthook/apiservice-status-local-available-controller",
                "poststarthook/apiservice-status-remote-available-controller",
                "poststarthook/apiservice-registration-controller",
                "poststarthook/kube-apiserver-autoregistration",
                "autoregister-completion",
                "poststarthook/apiservice-openapi-controller",
                "poststarthook/apiservice-openapiv3-controller",
            ]
            .into_iter()
            .map(|name| -> crate::handler::Check { (name, Arc::new(|| true)) })
            .collect(),
            openapi: Default::default(),
            auth: crate::auth::Auth {
                // Bearer tokens: service-account JWTs, then bootstrap tokens.
                tokens: vec![
                    Arc::new(crate::auth::serviceaccount::Authenticator::new(
                        sa_key.clone(),
                        store.clone(),
                    )),
                    Arc::new(crate::auth::bootstrap::Authenticator::new(store.clone())),
                ],
                authorizers,
                // TokenRequest, TokenReview, SelfSubjectReview, the access reviews.
                reviews: vec![
                    Arc::new(crate::registry::eviction::Eviction),
                    Arc::new(crate::registry::binding::Bindings),
                    Arc::new(crate::registry::authentication::TokenRequest::new(
                        sa_key.clone(),
                    )),
                    Arc::new(crate::registry::authentication::TokenReview),
                    Arc::new(crate::registry::authentication::SelfSubjectReview),
                    Arc::new(crate::registry::authorization::AccessReview::SUBJECT),
                    Arc::new(crate::registry::authorization::AccessReview::LOCAL),
                    Arc::new(crate::registry::authorization::AccessReview::SELF),
                    Arc::new(crate::registry::authorization::AccessReview::SELF_RULES),
                ],
            },
        });
        // Custom resources follow their definitions from here on.
        tokio::spawn(crate::registry::crd::watch(
            state.rest.clone(),
            ArcRegistry(state.clone()),
            crd_revision,
        ));
        // The kube-aggregator's availability checks of APIServices served by Services.
        tokio::spawn(crate::aggregator::run_available_controller(state.clone()));
        // Cluster IPs and node ports brought back in line with the Services.
        if let Some(services) = state.registry.find("", "v1", "services") {
            crate::registry::services::repair::start(
                state.rest.clone(),
                &services,
                state.registry.find("events.k8s.io", "v1", "events"),
            );
        }
        // The identity lease of this server and the collector of departed servers' ones.
        if let Some(leases) = state.registry.find("coordination.k8s.io", "v1", "leases") {
            crate::identity::start(
                state.rest.clone(),
                leases,
                state.address.clone(),
                cfg.hostname
                    .clone()
                    .unwrap_or_else(crate::identity::hostname),
            );
        }
        // API servers sharing an etcd cluster share the `kubernetes` endpoints.
        if matches!(cfg.store, StoreConfig::Etcd(_)) {
            tokio::spawn(crate::masterleases::run(
                state.rest.clone(),
                ArcRegistry(state.clone()),
                ep_ip,
                ep_port,
            ));
        }
        let acceptor = TlsAcceptor::from(Arc::new(tls));
        let task = tokio::spawn(serve(listener, acceptor, verifier, state, audit));
        let startup = started.elapsed();
        tracing::info!(address = %local_addr, ?startup, "kumo apiserver serving");
        Ok(ApiServer {
            local_addr,
            admin_kubeconfig,
            startup,
            task,
        })
    }

    /// Waits until the server stops (it runs until the process ends).
    pub async fn wait(self) -> Result<()> {
        self.task.await.context("server task failed")
    }
}

/// The registry of the shared state, for tasks that outlive a request.
struct ArcRegistry(Arc<State>);

impl std::ops::Deref for ArcRegistry {
    type Target = Registry;
    fn deref(&self) -> &Registry {
        &self.0.registry
    }
}

fn tls_config(
    data_dir: &std::path::Path,
    ca_pem: &str,
    serving: &pki::CertAndKey,
) -> Result<(rustls::ServerConfig, crate::auth::x509::Verifier)> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    // The serving certificate follows pki/apiserver.crt (kumo certs renew), as upstream's.
    let serving = pki::ServingCertResolver::new(data_dir, serving, provider.clone())?;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut ca_pem.as_bytes()) {
        roots.add(c?)?;
    }
    // Client certificates are requested, and verified against the cluster CA when a
    // request is authenticated (a bad one is a 401, as upstream); requests without one
    // reach authentication as anonymous (health and version stay reachable).
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .allow_unauthenticated()
    .build()?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_client_cert_verifier(Arc::new(crate::auth::x509::DeferredVerifier(
            verifier.clone(),
        )))
        .with_cert_resolver(Arc::new(serving));
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok((cfg, crate::auth::x509::Verifier(verifier)))
}

async fn serve(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    verifier: crate::auth::x509::Verifier,
    state: Arc<State>,
    audit: Option<Arc<crate::audit::Auditor>>,
) {
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let verifier = verifier.clone();
        let state = state.clone();
        let audit = audit.clone();
        tokio::spawn(async move {
            if plain_http(&tcp).await {
                // What Go's TLS server answers plain HTTP with.
                let mut tcp = tcp;
                let _ = tokio::io::AsyncWriteExt::write_all(
                    &mut tcp,
                    b"HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n",
                )
                .await;
                return;
            }
            let tls = match acceptor.accept(tcp).await {
                Ok(t) => t,
                Err(e) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
            };
            // The client certificate, verified once per connection.
            let cert_user = verifier.check(tls.get_ref().1.peer_certificates());
            let service = service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
                let state = state.clone();
                let cert_user = cert_user.clone();
                let audit = audit.clone();
                // The client's address, for the X-Forwarded-For of proxied requests.
                req.extensions_mut()
                    .insert(crate::resource_proxy::ClientAddr(peer));
                async move {
                    // Every request has an audit ID; events are written when a policy is set.
                    let resp = crate::audit::handle(audit.as_ref(), state, cert_user, peer, req);
                    Ok::<_, std::convert::Infallible>(resp.await)
                }
            });
            let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            // Headers as large as Go's default limit (1 MiB): bearer tokens can be long.
            builder.http1().max_buf_size(1 << 20);
            builder.http2().max_header_list_size(1 << 20);
            // kube-apiserver's --http2-max-streams-per-connection default (hyper's is 200):
            // a client's watches each hold a stream for as long as they run.
            builder.http2().max_concurrent_streams(1000);
            if let Err(e) = builder
                .serve_connection_with_upgrades(TokioIo::new(tls), service)
                .await
            {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
}

/// Whether a connection starts with an HTTP request instead of a TLS handshake (the
/// method prefixes Go's crypto/tls recognises).
async fn plain_http(tcp: &tokio::net::TcpStream) -> bool {
    let mut head = [0u8; 5];
    match tcp.peek(&mut head).await {
        Ok(5) => matches!(&head, b"GET /" | b"HEAD " | b"POST " | b"PUT /" | b"OPTIO"),
        _ => false,
    }
}

/// The namespaces every cluster has.
async fn bootstrap_namespaces(rest: &Rest, registry: &Registry) -> Result<()> {
    let Some(ns) = registry.find("", "v1", "namespaces") else {
        return Ok(());
    };
    let query = Default::default();
    for name in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        let body = serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
        let body = body.to_string();
        let req = rest::Request::json(&query, body.as_bytes());
        match rest.create(&ns, None, &req).await {
            Ok(_) => {}
            Err(e) if e.code == 409 => {}
            Err(e) => anyhow::bail!("creating namespace {name}: {}", e.message),
        }
    }
    Ok(())
}

/// Creates `body` (in `ns`) or, when it exists, merge-patches it with `reconcile`; then,
/// if it was created, merge-patches its status with `status`.
pub(crate) async fn ensure(
    rest: &Rest,
    registry: &Registry,
    (group, version, plural): (&str, &str, &str),
    ns: Option<&str>,
    body: &serde_json::Value,
    reconcile: Option<&serde_json::Value>,
    status: Option<&serde_json::Value>,
) -> Result<()> {
    let Some(res) = registry.find(group, version, plural) else {
        return Ok(());
    };
    let name = body
        .pointer("/metadata/name")
        .and_then(serde_json::Value::as_str)
        .unwrap_or("");
    let query = Default::default();
    let accept = || Accept::OBJECT;
    let bytes = body.to_string();
    let req = rest::Request {
        query: &query,
        accept: accept(),
        content_type: Some("application/json"),
        body: bytes.as_bytes(),
    };
    // Look first: creating an existing Service would fail on its cluster IP, not its name.
    let exists = match rest.get(&res, ns, name, &req).await {
        Ok(_) => true,
        Err(e) if e.code == 404 => false,
        Err(e) => anyhow::bail!("reading {plural} {name}: {}", e.message),
    };
    let created = !exists
        && match rest.create(&res, ns, &req).await {
            Ok(_) => true,
            Err(e) if e.code == 409 => false,
            Err(e) => anyhow::bail!("creating {plural} {name}: {}", e.message),
        };
    let patch = match (created, reconcile, status) {
        (false, Some(p), _) => Some((p, None)),
        (true, _, Some(p)) => Some((p, Some("status"))),
        _ => None,
    };
    if let Some((patch, sub)) = patch {
        let bytes = patch.to_string();
        let req = rest::Request {
            query: &query,
            accept: accept(),
            content_type: Some("application/merge-patch+json"),
            body: bytes.as_bytes(),
        };
        if let Err(e) = rest.patch(&res, ns, name, sub, &req).await {
            anyhow::bail!("updating {plural} {name}: {}", e.message);
        }
    }
    Ok(())
}

/// The ConfigMaps kube-apiserver keeps in kube-system: `extension-apiserver-authentication`
/// (the client CA that components such as kube-controller-manager read for delegated
/// authentication; kept current), and `kube-apiserver-legacy-service-account-token-tracking`
/// (since when legacy tokens are tracked: the day first started, never changed).
async fn bootstrap_kube_system_config_maps(
    rest: &Rest,
    registry: &Registry,
    ca_pem: &str,
    front_proxy_ca: Option<String>,
) -> Result<()> {
    use serde_json::json;
    let mut data = json!({"client-ca-file": ca_pem});
    // What extension API servers need to trust the aggregator's proxied requests: kubeadm's
    // --requestheader-* flags, as kube-apiserver publishes them.
    if let Some(ca) = front_proxy_ca {
        data["requestheader-client-ca-file"] = json!(ca);
        data["requestheader-allowed-names"] = json!(r#"["front-proxy-client"]"#);
        data["requestheader-extra-headers-prefix"] = json!(r#"["X-Remote-Extra-"]"#);
        data["requestheader-group-headers"] = json!(r#"["X-Remote-Group"]"#);
        data["requestheader-username-headers"] = json!(r#"["X-Remote-User"]"#);
    }
    let auth = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "extension-apiserver-authentication", "namespace": "kube-system"},
        "data": data,
    });
    let current = json!({"data": data});
    ensure(
        rest,
        registry,
        ("", "v1", "configmaps"),
        Some("kube-system"),
        &auth,
        Some(&current),
        None,
    )
    .await?;
    let today = crate::time::format_rfc3339(crate::time::now_secs());
    let since = today.split('T').next().unwrap_or(&today);
    let tracking = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "kube-apiserver-legacy-service-account-token-tracking", "namespace": "kube-system"},
        "data": {"since": since},
    });
    ensure(
        rest,
        registry,
        ("", "v1", "configmaps"),
        Some("kube-system"),
        &tracking,
        None,
        None,
    )
    .await
}

/// What kube-apiserver keeps in place at start: the default ServiceCIDR, the
/// `default/kubernetes` Service on the first cluster IP, and its Endpoints and
/// EndpointSlice naming this server (the endpoint reconciler's work).
async fn bootstrap_kubernetes_service(
    rest: &Rest,
    registry: &Registry,
    range: (Ipv4Addr, u8),
    address: IpAddr,
    port: u16,
) -> Result<()> {
    use serde_json::json;
    // The aggregator's Local APIServices, one per served built-in group version.
    for (obj, status) in crate::registry::apiregistration::local_api_services(registry) {
        ensure(
            rest,
            registry,
            ("apiregistration.k8s.io", "v1", "apiservices"),
            None,
            &obj,
            None,
            Some(&status),
        )
        .await?;
    }
    let cidr = format!("{}/{}", range.0, range.1);
    let name = crate::registry::DEFAULT_SERVICE_CIDR;
    let ready = json!({"status": {"conditions": [{
        "type": "Ready",
        "status": "True",
        "reason": "",
        "message": "Kubernetes default Service CIDR is ready",
        "lastTransitionTime": crate::time::now_rfc3339(),
    }]}});
    ensure(
        rest,
        registry,
        ("networking.k8s.io", "v1", "servicecidrs"),
        None,
        &json!({"apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR",
            "metadata": {"name": name}, "spec": {"cidrs": [cidr]}}),
        None,
        Some(&ready),
    )
    .await?;
    let ports = json!([{"name": "https", "port": 443, "protocol": "TCP", "targetPort": port}]);
    ensure(
        rest,
        registry,
        ("", "v1", "services"),
        Some("default"),
        &json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "kubernetes", "namespace": "default",
                "labels": {"component": "apiserver", "provider": "kubernetes"}},
            "spec": {"type": "ClusterIP", "clusterIP": crate::registry::first_service_ip(range).to_string(), "ports": ports,
                "sessionAffinity": "None"}}),
        Some(&json!({"spec": {"ports": ports}})),
        None,
    )
    .await?;
    write_kubernetes_endpoints(rest, registry, &[address], port).await
}

/// The `default/kubernetes` Endpoints and EndpointSlice: `port` on each of `addresses`
/// (this server's, or every live one's: [`crate::masterleases`]).
pub(crate) async fn write_kubernetes_endpoints(
    rest: &Rest,
    registry: &Registry,
    addresses: &[IpAddr],
    port: u16,
) -> Result<()> {
    use serde_json::json;
    let Some(first) = addresses.first() else {
        return Ok(());
    };
    let endpoint_ports = json!([{"name": "https", "port": port, "protocol": "TCP"}]);
    let ips: Vec<String> = addresses.iter().map(ToString::to_string).collect();
    let subset_addresses: Vec<serde_json::Value> = ips.iter().map(|ip| json!({"ip": ip})).collect();
    let subsets = json!([{"addresses": subset_addresses, "ports": endpoint_ports}]);
    put_endpoints(
        rest,
        registry,
        ("", "v1", "endpoints"),
        json!({"apiVersion": "v1", "kind": "Endpoints",
            "metadata": {"name": "kubernetes", "namespace": "default",
                "labels": {"endpointslice.kubernetes.io/skip-mirror": "true"}},
            "subsets": subsets}),
    )
    .await?;
    let family = if first.is_ipv6() { "IPv6" } else { "IPv4" };
    let endpoints: Vec<serde_json::Value> = ips
        .iter()
        .map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}}))
        .collect();
    put_endpoints(
        rest,
        registry,
        ("discovery.k8s.io", "v1", "endpointslices"),
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "kubernetes", "namespace": "default",
                "labels": {"kubernetes.io/service-name": "kubernetes"}, "generation": 1},
            "addressType": family, "endpoints": endpoints, "ports": endpoint_ports}),
    )
    .await?;
    Ok(())
}

/// Writes the `default/kubernetes` Endpoints or EndpointSlice straight to the store, as
/// the endpoint reconciler owns them. Not through validation: that refuses a loopback
/// address (upstream's reconciler refuses to run on one), and a server on loopback still
/// has to name itself for in-cluster clients and the conformance tests.
async fn put_endpoints(
    rest: &Rest,
    registry: &Registry,
    (group, version, plural): (&str, &str, &str),
    mut obj: serde_json::Value,
) -> Result<()> {
    let Some(res) = registry.find(group, version, plural) else {
        return Ok(());
    };
    let key = res.key(Some("default"), "kubernetes");
    for _ in 0..8 {
        let (current, _) = rest.store.get(key.as_bytes(), None).await?;
        let old = match &current {
            Some(kv) => Some(serde_json::from_slice::<serde_json::Value>(&kv.value)?),
            None => None,
        };
        let meta = |o: &serde_json::Value, k: &str| o.pointer(&format!("/metadata/{k}")).cloned();
        let uid = old.as_ref().and_then(|o| meta(o, "uid"));
        let created = old.as_ref().and_then(|o| meta(o, "creationTimestamp"));
        if let Some(m) = obj
            .get_mut("metadata")
            .and_then(serde_json::Value::as_object_mut)
        {
            m.insert(
                "uid".into(),
                uid.unwrap_or_else(|| uuid::Uuid::new_v4().to_string().into()),
            );
            m.insert(
                "creationTimestamp".into(),
                created.unwrap_or_else(|| crate::time::now_rfc3339().into()),
            );
        }
        let unchanged = old.as_ref().is_some_and(|o| {
            let strip = |v: &serde_json::Value| {
                let mut v = v.clone();
                if let Some(m) = v
                    .get_mut("metadata")
                    .and_then(serde_json::Value::as_object_mut)
                {
                    m.remove("generation");
                }
                v
            };
            strip(o) == strip(&obj)
        });
        if unchanged {
            return Ok(());
        }
        if let (Some(o), Some(g)) = (&old, obj.pointer_mut("/metadata/generation")) {
            let before = o
                .pointer("/metadata/generation")
                .and_then(serde_json::Value::as_i64)
                .unwrap_or(0);
            *g = (before + 1).into();
        }
        let bytes = serde_json::to_vec(&obj)?;
        let written = match &current {
            Some(kv) => rest
                .store
                .update(key.as_bytes(), bytes, Some(kv.mod_revision))
                .await
                .map(|_| ()),
            None => rest.store.create(key.as_bytes(), bytes).await.map(|_| ()),
        };
        match written {
            Ok(()) => return Ok(()),
            Err(
                kumo_storage::StorageError::Conflict { .. }
                | kumo_storage::StorageError::AlreadyExists { .. },
            ) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    anyhow::bail!("writing {plural} default/kubernetes kept conflicting")
}
