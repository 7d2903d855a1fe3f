//! The secure port: HTTPS with a self-signed certificate made in memory at start (as
//! kube-controller-manager does when it is given no --tls-cert-file). `/healthz`,
//! `/livez` and `/readyz` are always allowed (upstream's default
//! --authorization-always-allow-paths); anything else, `/metrics` first, goes through
//! delegated authentication and authorization ([`crate::delegated`]): 401 for refused
//! credentials, 403 with upstream's message when the API server says no. The checks can
//! be added to while serving (controllers register theirs once they start).

use std::net::SocketAddr;
use std::sync::Arc;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use crate::delegated::{Attributes, Delegated};
use crate::error::{Error, Result};
use crate::metrics::Registry;

/// A named health check: `Err(reason)` fails `/healthz`.
pub type Check = Arc<dyn Fn() -> std::result::Result<(), String> + Send + Sync>;

/// The checks `/healthz` runs, in order; shared so that more can be added later.
pub type Checks = Arc<parking_lot::RwLock<Vec<(String, Check)>>>;

/// A self-signed CA and a serving certificate for `localhost` and `addr`, in DER.
pub fn self_signed(
    addr: SocketAddr,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
    let tls = |e: rcgen::Error| Error::Tls(e.to_string());
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let ca_key = KeyPair::generate().map_err(tls)?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(tls)?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, format!("localhost-ca@{stamp}"));
    ca.distinguished_name = dn;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
        KeyUsagePurpose::KeyCertSign,
    ];
    let ca_cert = ca.self_signed(&ca_key).map_err(tls)?;
    let issuer = Issuer::from_ca_cert_der(ca_cert.der(), &ca_key).map_err(tls)?;

    let key = KeyPair::generate().map_err(tls)?;
    let mut leaf = CertificateParams::new(Vec::<String>::new()).map_err(tls)?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, format!("localhost@{stamp}"));
    leaf.distinguished_name = dn;
    leaf.subject_alt_names
        .push(SanType::DnsName("localhost".try_into().map_err(tls)?));
    leaf.subject_alt_names.push(SanType::IpAddress(addr.ip()));
    leaf.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let leaf_cert = leaf.signed_by(&key, &issuer).map_err(tls)?;
    Ok((
        vec![leaf_cert.der().clone(), ca_cert.der().clone()],
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
    ))
}

/// What the secure port serves beyond health: the component's metrics, to whom the API
/// server allows.
#[derive(Clone)]
pub struct Secure {
    delegated: Arc<Delegated>,
    verifier: Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>,
    metrics: Arc<Registry>,
}

impl Secure {
    /// Reads the cluster's authentication trust with `client` (the component's own) and
    /// serves `metrics` under it.
    pub async fn load(client: kube::Client, metrics: Arc<Registry>) -> Result<Secure> {
        let (delegated, verifier) = Delegated::load(Arc::new(move || client.clone())).await?;
        Ok(Secure {
            delegated: Arc::new(delegated),
            verifier,
            metrics,
        })
    }
}

/// [`Secure::load`], or `None` (health only, said in the log) when the cluster's trust
/// cannot be read.
pub async fn secure(client: &kube::Client, metrics: &Arc<Registry>) -> Option<Secure> {
    match Secure::load(client.clone(), metrics.clone()).await {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "the secure port serves health only: cannot read the cluster's authentication trust");
            None
        }
    }
}

/// Binds `addr` and serves the health endpoints (and, with `secure`, the metrics) until
/// `stop`; returns the bound address.
pub async fn serve(
    addr: SocketAddr,
    checks: Checks,
    mut stop: watch::Receiver<bool>,
    secure: Option<Secure>,
) -> Result<SocketAddr> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Listen { addr, source })?;
    let local = listener
        .local_addr()
        .map_err(|source| Error::Listen { addr, source })?;
    let (certs, key) = self_signed(local)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| Error::Tls(e.to_string()))?;
    let builder = match secure.as_ref().and_then(|s| s.verifier.clone()) {
        Some(v) => builder.with_client_cert_verifier(v),
        None => builder.with_no_client_auth(),
    };
    let mut cfg = builder
        .with_single_cert(certs, key)
        .map_err(|e| Error::Tls(e.to_string()))?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = TlsAcceptor::from(Arc::new(cfg));
    tokio::spawn(async move {
        loop {
            let (tcp, _) = tokio::select! {
                r = listener.accept() => match r {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        continue;
                    }
                },
                _ = stop.wait_for(|s| *s) => return,
            };
            let acceptor = acceptor.clone();
            let checks = checks.clone();
            let secure = secure.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let peer: Option<Arc<Vec<CertificateDer<'static>>>> = tls
                    .get_ref()
                    .1
                    .peer_certificates()
                    .map(|c| Arc::new(c.iter().map(|c| c.clone().into_owned()).collect()));
                let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                    let (checks, secure, peer) = (checks.clone(), secure.clone(), peer.clone());
                    async move {
                        if is_health(req.uri().path()) {
                            let checks = checks.read().clone();
                            return Ok::<_, std::convert::Infallible>(answer(&req, &checks));
                        }
                        let Some(secure) = secure else {
                            return Ok(text(StatusCode::NOT_FOUND, "404 page not found\n".into()));
                        };
                        Ok(guarded(&req, &secure, peer.as_deref().map(Vec::as_slice)).await)
                    }
                });
                let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                let _ = builder.serve_connection(TokioIo::new(tls), service).await;
            });
        }
    });
    Ok(local)
}

/// Whether `path` is a health endpoint (always allowed).
fn is_health(path: &str) -> bool {
    ["/healthz", "/livez", "/readyz"]
        .iter()
        .any(|h| path == *h || path.strip_prefix(h).is_some_and(|r| r.starts_with('/')))
}

/// A request beyond health: authenticated and authorized by the API server, then
/// answered (`/metrics`) or not found.
async fn guarded<B>(
    req: &Request<B>,
    secure: &Secure,
    peer: Option<&[CertificateDer<'static>]>,
) -> Response<Full<Bytes>> {
    let Some(user) = secure.delegated.authenticate(req.headers(), peer).await else {
        return status(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized");
    };
    let path = req.uri().path().to_owned();
    let verb = match *req.method() {
        http::Method::GET | http::Method::HEAD => "get",
        http::Method::POST => "post",
        http::Method::PUT => "put",
        http::Method::DELETE => "delete",
        _ => "patch",
    };
    let attrs = Attributes::NonResource {
        path: path.clone(),
        verb: verb.into(),
    };
    if !secure.delegated.authorize(&user, &attrs).await {
        return status(StatusCode::FORBIDDEN, "Forbidden", &attrs.forbidden(&user));
    }
    if path == "/metrics" && verb == "get" {
        let mut r = text(StatusCode::OK, secure.metrics.render());
        r.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        );
        return r;
    }
    text(StatusCode::NOT_FOUND, "404 page not found\n".into())
}

/// A `Status` answer, as the generic API server writes a refusal.
fn status(code: StatusCode, reason: &str, message: &str) -> Response<Full<Bytes>> {
    // In the generic API server's field order (kind first, code last).
    let quoted = |v: &str| serde_json::Value::from(v).to_string();
    let details = if code == StatusCode::FORBIDDEN {
        r#""details":{},"#
    } else {
        ""
    };
    let body = format!(
        r#"{{"kind":"Status","apiVersion":"v1","metadata":{{}},"status":"Failure","message":{},"reason":{},{details}"code":{}}}"#,
        quoted(message),
        quoted(reason),
        code.as_u16()
    );
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = code;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

/// The healthz handler's answers (also as `/livez` and `/readyz`): `ok`, or the failing
/// checks (`?verbose` lists all); `/healthz/<check>` runs one. With no checks, the `ping` check stands in (as upstream).
fn answer<B>(req: &Request<B>, checks: &[(String, Check)]) -> Response<Full<Bytes>> {
    let path = req.uri().path();
    let verbose = req.uri().query().is_some_and(|q| {
        q.split('&')
            .any(|p| p == "verbose" || p.starts_with("verbose="))
    });
    // /livez and /readyz run the same checks (what kubeadm's probes of the scheduler
    // ask for); each answers in its own name.
    let Some((what, only)) = ["healthz", "livez", "readyz"].iter().find_map(|w| {
        let rest = path.strip_prefix('/')?.strip_prefix(w)?;
        match rest {
            "" => Some((*w, None)),
            r => Some((*w, Some(r.strip_prefix('/')?))),
        }
    }) else {
        return text(StatusCode::NOT_FOUND, "404 page not found\n".into());
    };
    let mut out = String::new();
    let mut failed = false;
    let mut results: Vec<(String, std::result::Result<(), String>)> = Vec::new();
    if checks.is_empty() {
        results.push(("ping".into(), Ok(())));
    }
    for (name, check) in checks {
        results.push((name.clone(), check()));
    }
    if let Some(name) = only {
        return match results.iter().find(|(n, _)| n == name) {
            Some((_, Ok(()))) => text(StatusCode::OK, "ok".into()),
            Some((_, Err(e))) => text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("internal server error: {e}\n"),
            ),
            None => text(StatusCode::NOT_FOUND, "404 page not found\n".into()),
        };
    }
    for (name, r) in &results {
        match r {
            Ok(()) => out.push_str(&format!("[+]{name} ok\n")),
            Err(_) => {
                failed = true;
                out.push_str(&format!("[-]{name} failed: reason withheld\n"));
            }
        }
    }
    if failed {
        out.push_str(&format!("{what} check failed\n"));
        return text(StatusCode::INTERNAL_SERVER_ERROR, out);
    }
    if verbose {
        out.push_str(&format!("{what} check passed\n"));
        return text(StatusCode::OK, out);
    }
    text(StatusCode::OK, "ok".into())
}

fn text(code: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = code;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r.headers_mut().insert(
        http::header::HeaderName::from_static("x-content-type-options"),
        http::HeaderValue::from_static("nosniff"),
    );
    r
}
