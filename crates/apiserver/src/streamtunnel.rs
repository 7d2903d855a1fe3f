//! Port-forward's WebSocket tunnel translated at the API server (upstream's
//! TunnelingHandler), for nodes that do not declare `ExtendWebSocketsToKubelet`: the
//! client's WebSocket (`SPDY/3.1+portforward.k8s.io`) carries a SPDY connection in binary
//! messages; the kubelet gets a plain SPDY/3.1 upgrade, and the bytes of the two are
//! copied across once both sides have switched protocols.

use std::convert::Infallible;

use bytes::Bytes;
use http::{header, HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use kumo_apimachinery::status::ApiError;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

type Body = BoxBody<Bytes, Infallible>;

/// The WebSocket subprotocol prefix of a tunneled SPDY connection.
const TUNNEL_PREFIX: &str = "SPDY/3.1+";
/// The feature a Node declares when its kubelet does the tunneling itself.
pub const KUBELET_FEATURE: &str = "ExtendWebSocketsToKubelet";

/// The SPDY protocols a WebSocket request asks to tunnel (`SPDY/3.1+<p>.k8s.io`), in order;
/// empty when it is no tunneling request.
pub fn spdy_protocols(headers: &HeaderMap) -> Vec<String> {
    let websocket = headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    if !websocket {
        return Vec::new();
    }
    headers
        .get_all("sec-websocket-protocol")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|p| p.ends_with(".k8s.io"))
        .filter_map(|p| p.strip_prefix(TUNNEL_PREFIX))
        .map(str::to_owned)
        .collect()
}

/// Sends the SPDY upgrade for `path` over `io` (a connection to the kubelet) and, once it
/// switched protocols, upgrades the client's WebSocket and joins the two.
pub async fn translate<S>(
    io: S,
    host: &str,
    path: &str,
    mut req: Request<Incoming>,
    protocols: &[String],
) -> Result<Response<Body>, ApiError>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let Some(key) = req
        .headers()
        .get("sec-websocket-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
    else {
        return Err(ApiError::bad_request(
            "websocket: not a websocket handshake: 'Sec-WebSocket-Key' header must be Base64 encoded value of 16-byte in length",
        ));
    };
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| ApiError::internal(format!("error dialing backend: {e}")))?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "kubelet connection ended");
        }
    });
    let mut out = Request::builder()
        .method(Method::POST)
        .uri(path)
        .header(header::HOST, host)
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "SPDY/3.1");
    for p in protocols {
        out = out.header("x-stream-protocol-version", p.as_str());
    }
    let out = out
        .body(http_body_util::Empty::<Bytes>::new())
        .map_err(ApiError::internal)?;
    let mut resp = sender
        .send_request(out)
        .await
        .map_err(|e| ApiError::internal(format!("error trying to reach the kubelet: {e}")))?;
    let contains = |name: header::HeaderName, needle: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.to_ascii_lowercase().contains(needle))
    };
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        // The kubelet's refusal goes back as it is.
        let status = resp.status();
        let headers = resp.headers().clone();
        let body = resp
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let mut r = Response::new(Full::new(body).boxed());
        *r.status_mut() = status;
        if let Some(ct) = headers.get(header::CONTENT_TYPE) {
            r.headers_mut().insert(header::CONTENT_TYPE, ct.clone());
        }
        return Ok(r);
    }
    if !contains(header::CONNECTION, "upgrade") || !contains(header::UPGRADE, "spdy/3.1") {
        return Err(ApiError::internal(
            "unable to upgrade: missing upgrade headers in response",
        ));
    }
    let protocol = resp
        .headers()
        .get("x-stream-protocol-version")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| format!("{TUNNEL_PREFIX}{p}"));
    let backend = hyper::upgrade::on(&mut resp);
    let front = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        match (front.await, backend.await) {
            (Ok(f), Ok(b)) => join(TokioIo::new(f), TokioIo::new(b)).await,
            (f, b) => tracing::debug!(client = f.is_ok(), kubelet = b.is_ok(), "upgrade failed"),
        }
    });
    let accept = kumo_apimachinery::websocket::accept_key(&key);
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
    if let Some(v) = protocol.and_then(|p| header::HeaderValue::from_str(&p).ok()) {
        h.insert("sec-websocket-protocol", v);
    }
    Ok(r)
}

/// Copies the client's binary messages to the kubelet's byte stream and back.
async fn join<W, K>(ws: W, kubelet: K)
where
    W: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    K: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (mut ws_r, mut ws_w) = tokio::io::split(ws);
    let (mut k_r, mut k_w) = tokio::io::split(kubelet);
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(u8, Vec<u8>)>(16);
    let writer = tokio::spawn(async move {
        while let Some((opcode, payload)) = rx.recv().await {
            let f = kumo_apimachinery::websocket::frame(opcode, &payload);
            if ws_w.write_all(&f).await.is_err() || ws_w.flush().await.is_err() {
                return;
            }
            if opcode == 0x8 {
                let _ = ws_w.shutdown().await;
                return;
            }
        }
    });
    let to_client = tx.clone();
    let from_kubelet = tokio::spawn(async move {
        let mut buf = vec![0u8; 32 << 10];
        loop {
            match k_r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to_client.send((0x2, buf[..n].to_vec())).await.is_err() {
                        return;
                    }
                }
            }
        }
        let _ = to_client.send((0x8, 1000u16.to_be_bytes().to_vec())).await;
    });
    loop {
        let mut head = [0u8; 2];
        if ws_r.read_exact(&mut head).await.is_err() {
            break;
        }
        let opcode = head[0] & 0x0f;
        let masked = head[1] & 0x80 != 0;
        let mut len = u64::from(head[1] & 0x7f);
        if len == 126 {
            let mut b = [0u8; 2];
            if ws_r.read_exact(&mut b).await.is_err() {
                break;
            }
            len = u64::from(u16::from_be_bytes(b));
        } else if len == 127 {
            let mut b = [0u8; 8];
            if ws_r.read_exact(&mut b).await.is_err() {
                break;
            }
            len = u64::from_be_bytes(b);
        }
        if len > 16 << 20 {
            break;
        }
        let mut mask = [0u8; 4];
        if masked && ws_r.read_exact(&mut mask).await.is_err() {
            break;
        }
        let mut payload = vec![0u8; len as usize];
        if ws_r.read_exact(&mut payload).await.is_err() {
            break;
        }
        if masked {
            for (i, b) in payload.iter_mut().enumerate() {
                *b ^= mask[i % 4];
            }
        }
        match opcode {
            0x0 | 0x2 => {
                if k_w.write_all(&payload).await.is_err() {
                    break;
                }
            }
            0x9 => {
                let _ = tx.send((0xA, payload)).await;
            }
            0xA => {}
            _ => break,
        }
    }
    let _ = k_w.shutdown().await;
    drop(k_w);
    let _ = from_kubelet.await;
    drop(tx);
    let _ = writer.await;
}
