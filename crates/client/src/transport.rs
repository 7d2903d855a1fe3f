//! The connection under kumo's API clients: HTTP/2 when the server offers it (ALPN), as
//! client-go's transport. kube's own client speaks HTTP/1.1 only, where every watch holds
//! a TLS connection of its own: a controller-manager with a few dozen informers kept a
//! few dozen connections open to its API server, each with its buffers on both ends and
//! its handshake to pay. Over HTTP/2 a client's requests and watches share one connection.
//!
//! The service stack is kube's (base URI, authentication, extra headers) without its 503
//! retries, which client-go does not make (see [`crate::clients::as_client_go`]), and
//! without its request tracing, which logs every failed connect at error level.
//! Liveness is client-go's HTTP/2 health check: a PING when the connection has been quiet
//! for a while, the connection dropped when none comes back.

use std::time::Duration;

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::ConfigExt;
use tower::ServiceBuilder;

/// client-go's `ReadIdleTimeout`: a connection quiet this long is pinged...
const READ_IDLE: Duration = Duration::from_secs(30);
/// ...and dropped when the PING is not answered within this (its `PingTimeout`).
const PING_TIMEOUT: Duration = Duration::from_secs(15);
/// Flow-control windows of Go's HTTP/2 transport: a watch whose reader is slow can hold
/// its stream's window, never the connection's, so the other watches go on.
const STREAM_WINDOW: u32 = 4 << 20;
const CONNECTION_WINDOW: u32 = 1 << 30;

/// A client for `cfg` (its server, credentials, timeouts and headers) over HTTP/2.
pub fn client(cfg: kube::Config) -> Result<kube::Client, kube::Error> {
    let tls = cfg.rustls_client_config()?;
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(cfg.connect_timeout);
    http.set_nodelay(true);
    let builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    let https = match &cfg.tls_server_name {
        Some(name) => {
            let name = rustls::pki_types::ServerName::try_from(name.clone()).map_err(|e| {
                kube::Error::Service(format!("tls-server-name {name:?}: {e}").into())
            })?;
            builder
                .with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name))
                .enable_all_versions()
                .wrap_connector(http)
        }
        None => builder.enable_all_versions().wrap_connector(http),
    };
    // A read timeout, where one is set, counts from the last byte read; the PINGs keep a
    // healthy connection with quiet watches from reaching it.
    let ping_every = cfg
        .read_timeout
        .map_or(READ_IDLE, |t| READ_IDLE.min(t / 3))
        .max(Duration::from_secs(1));
    let mut connector = hyper_timeout::TimeoutConnector::new(https);
    connector.set_read_timeout(cfg.read_timeout);
    connector.set_write_timeout(cfg.write_timeout);
    let http_client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .http2_keep_alive_interval(ping_every)
        .http2_keep_alive_timeout(PING_TIMEOUT)
        .http2_keep_alive_while_idle(true)
        .http2_initial_stream_window_size(STREAM_WINDOW)
        .http2_initial_connection_window_size(CONNECTION_WINDOW)
        .build(connector);
    let service = ServiceBuilder::new()
        .layer(cfg.base_uri_layer())
        .option_layer(cfg.auth_layer()?)
        .layer(cfg.extra_headers_layer()?)
        .map_err(tower::BoxError::from)
        .service(http_client);
    Ok(kube::Client::new(service, cfg.default_namespace))
}
