//! `/portForward/{namespace}/{pod}[/{uid}]`: port forwarding into a pod, as upstream's
//! CRI streaming server answers it.
//!
//! Three ways in. A SPDY/3.1 upgrade (`X-Stream-Protocol-Version: portforward.k8s.io`); a
//! WebSocket whose subprotocol `SPDY/3.1+portforward.k8s.io` tunnels the same SPDY
//! connection in binary messages (what kubectl tries first; the kubelet does the
//! tunneling, as with `ExtendWebSocketsToKubelet`, which its Node declares); and the
//! WebSocket channel form (`v4.channel.k8s.io`, the ports in the query) of the language
//! clients. In the SPDY connection the client opens a pair of streams per forwarded
//! connection, `streamType: error` and `streamType: data`, with the same `requestID` and
//! `port` headers; the data stream carries the bytes, the error stream at most one
//! message.
//!
//! Where the bytes go: to the byte stream the pod network opens to the pod's port
//! ([`kumo_cri::PodNetwork::forward`]); for a host-network pod whose port the network has
//! no server of, to what really listens on the node's loopback. Nothing listening is
//! containerd's "connection refused" on the error stream.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use base64::Engine;
use bytes::Bytes;
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};
use http::{header, Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

type Body = BoxBody<Bytes, Infallible>;

/// Reads the pod as the API has it now (its containers' states decide what listens).
pub type PodFetch =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Option<Value>> + Send>> + Send + Sync>;

/// The port-forward stream protocol (`PortForwardProtocolV1Name`).
pub const PROTOCOL: &str = "portforward.k8s.io";
/// The WebSocket subprotocol prefix of a tunneled SPDY connection.
const TUNNEL_PREFIX: &str = "SPDY/3.1+";

/// SPDY/3 frame types and flags used here.
const SYN_STREAM: u16 = 1;
const SYN_REPLY: u16 = 2;
const RST_STREAM: u16 = 3;
const PING: u16 = 6;
const GOAWAY: u16 = 7;
const FLAG_FIN: u8 = 0x01;
/// RST_STREAM status CANCEL (what spdystream's Reset sends).
const RST_CANCEL: u32 = 5;
/// Stream pairs waiting for their other half, at most, per connection.
const MAX_PENDING: usize = 1024;
/// Payloads are at most this long per DATA frame we send.
const CHUNK: usize = 32 << 10;

/// A plain-text error, as Go's http.Error writes it.
fn error_text(code: StatusCode, msg: &str) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(format!("{msg}\n"))).boxed());
    *r.status_mut() = code;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert(
        "x-content-type-options",
        header::HeaderValue::from_static("nosniff"),
    );
    r
}

fn header_values(req: &Request<Incoming>, name: &str) -> Vec<String> {
    req.headers()
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|p| p.trim().to_owned())
        .filter(|p| !p.is_empty())
        .collect()
}

fn header_contains(req: &Request<Incoming>, name: &str, needle: &str) -> bool {
    req.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.to_ascii_lowercase().contains(needle))
}

/// Answers a port-forward request for `pod` (None: not on this node); `uid` is the
/// optional fourth path segment.
pub fn serve(
    mut req: Request<Incoming>,
    pod: Option<Value>,
    uid: Option<&str>,
    fetch: PodFetch,
    network: Arc<dyn kumo_cri::PodNetwork>,
) -> Response<Body> {
    let Some(pod) = pod else {
        return error_text(StatusCode::NOT_FOUND, "pod does not exist");
    };
    let pod_uid = pod
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    if uid.is_some_and(|u| !u.is_empty() && u != pod_uid) {
        return error_text(StatusCode::NOT_FOUND, "pod not found");
    }
    let target = Target {
        uid: pod_uid,
        network,
    };
    if header_contains(&req, "upgrade", "websocket") {
        let offered = header_values(&req, "sec-websocket-protocol");
        let spdy: Vec<&str> = offered
            .iter()
            .filter(|p| p.ends_with(".k8s.io"))
            .filter_map(|p| p.strip_prefix(TUNNEL_PREFIX))
            .collect();
        // Without a tunneling protocol: the channel form, its ports in the query.
        let channels = if spdy.is_empty() {
            let ports = match v4_ports(req.uri().query()) {
                Ok(p) => p,
                Err(e) => return error_text(StatusCode::BAD_REQUEST, &e),
            };
            let chosen = if offered.is_empty() {
                Some(("", false))
            } else {
                offered
                    .iter()
                    .find_map(|o| WS_CHANNEL_PROTOCOLS.iter().find(|(p, _)| p == o).copied())
            };
            let Some(chosen) = chosen else {
                return error_text(
                    StatusCode::BAD_REQUEST,
                    &format!(
                        "unable to upgrade websocket connection: requested protocol(s) are not supported: [{}]; supports [v4.channel.k8s.io v4.base64.channel.k8s.io]",
                        offered.join(" ")
                    ),
                );
            };
            Some((ports, chosen))
        } else {
            if !spdy.contains(&PROTOCOL) {
                return error_text(
                    StatusCode::FORBIDDEN,
                    &format!(
                        "unable to upgrade: unable to negotiate protocol: client supports [{}], server accepts [{PROTOCOL}]",
                        spdy.join(" ")
                    ),
                );
            }
            None
        };
        let Some(key) = req
            .headers()
            .get("sec-websocket-key")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
        else {
            return error_text(
                StatusCode::BAD_REQUEST,
                "websocket: not a websocket handshake: 'Sec-WebSocket-Key' header must be Base64 encoded value of 16-byte in length",
            );
        };
        let accept = kumo_apimachinery::websocket::accept_key(&key);
        let protocol = match &channels {
            Some((_, (p, _))) => (*p).to_owned(),
            None => format!("{TUNNEL_PREFIX}{PROTOCOL}"),
        };
        let on_upgrade = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            let io = match on_upgrade.await {
                Ok(io) => TokioIo::new(io),
                Err(e) => {
                    tracing::debug!(error = %e, "port-forward: upgrade failed");
                    return;
                }
            };
            match channels {
                Some((ports, (_, base64))) => ws_channels(io, ports, base64, target, fetch).await,
                None => {
                    // The SPDY connection tunneled in WebSocket binary messages.
                    let (inner, outer) = tokio::io::duplex(64 << 10);
                    tokio::spawn(tunnel(io, outer));
                    session(inner, target, fetch).await;
                }
            }
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
        if !protocol.is_empty() {
            if let Ok(v) = header::HeaderValue::from_str(&protocol) {
                h.insert("sec-websocket-protocol", v);
            }
        }
        return r;
    }
    // SPDY: httpstream.Handshake, then the SPDY upgrader.
    let versions = header_values(&req, "x-stream-protocol-version");
    if req.headers().get("x-stream-protocol-version").is_none() {
        return error_text(
            StatusCode::BAD_REQUEST,
            &format!(
                "unable to upgrade: header X-Stream-Protocol-Version does not exist in request with {} headers",
                req.headers().keys_len()
            ),
        );
    }
    if !versions.iter().any(|v| v == PROTOCOL) {
        let mut r = error_text(
            StatusCode::FORBIDDEN,
            &format!(
                "unable to upgrade: unable to negotiate protocol: client supports [{}], server accepts [{PROTOCOL}]",
                versions.join(" ")
            ),
        );
        r.headers_mut().insert(
            "x-accepted-stream-protocol-versions",
            header::HeaderValue::from_static(PROTOCOL),
        );
        return r;
    }
    if !header_contains(&req, "connection", "upgrade")
        || !header_contains(&req, "upgrade", "spdy/3.1")
    {
        return error_text(
            StatusCode::BAD_REQUEST,
            "unable to upgrade: missing upgrade headers in request",
        );
    }
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(io) => session(TokioIo::new(io), target, fetch).await,
            Err(e) => tracing::debug!(error = %e, "port-forward: upgrade failed"),
        }
    });
    let mut r = Response::new(Full::new(Bytes::new()).boxed());
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = r.headers_mut();
    h.insert(
        header::CONNECTION,
        header::HeaderValue::from_static("Upgrade"),
    );
    h.insert(
        header::UPGRADE,
        header::HeaderValue::from_static("SPDY/3.1"),
    );
    h.insert(
        "x-stream-protocol-version",
        header::HeaderValue::from_static(PROTOCOL),
    );
    r
}

/// What the error messages name, and the network the connections go through.
#[derive(Clone)]
struct Target {
    uid: String,
    network: Arc<dyn kumo_cri::PodNetwork>,
}

/// Carries WebSocket binary messages to and from `inner`, a byte stream (upstream's
/// TunnelingConnection on the server side).
async fn tunnel<S>(ws: S, inner: tokio::io::DuplexStream)
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (mut ws_r, mut ws_w) = tokio::io::split(ws);
    let (mut in_r, mut in_w) = tokio::io::split(inner);
    let (out_tx, mut out_rx) = mpsc::channel::<(u8, Vec<u8>)>(16);
    let writer = tokio::spawn(async move {
        while let Some((opcode, payload)) = out_rx.recv().await {
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
    let to_client = out_tx.clone();
    let outbound = tokio::spawn(async move {
        let mut buf = vec![0u8; CHUNK];
        loop {
            match in_r.read(&mut buf).await {
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
    // Client messages: binary data (masked), pings, close.
    while let Some((opcode, payload)) = read_ws_frame(&mut ws_r).await {
        match opcode {
            0x0 | 0x2 => {
                if in_w.write_all(&payload).await.is_err() {
                    break;
                }
            }
            0x9 => {
                let _ = out_tx.send((0xA, payload)).await;
            }
            0xA => {}
            // Close, or a text message (invalid in a tunnel).
            _ => break,
        }
    }
    // The SPDY session sees EOF and ends; its end closes the WebSocket.
    drop(in_w);
    let _ = outbound.await;
    drop(out_tx);
    let _ = writer.await;
}

/// SPDY/3 header compression: one zlib stream per direction, with the protocol's preset
/// dictionary (SPDY/3 section 2.6.10.1): these words, each after its 4-byte length, then
/// the tail.
const DICT_WORDS: &[&str] = &[
    "options",
    "head",
    "post",
    "put",
    "delete",
    "trace",
    "accept",
    "accept-charset",
    "accept-encoding",
    "accept-language",
    "accept-ranges",
    "age",
    "allow",
    "authorization",
    "cache-control",
    "connection",
    "content-base",
    "content-encoding",
    "content-language",
    "content-length",
    "content-location",
    "content-md5",
    "content-range",
    "content-type",
    "date",
    "etag",
    "expect",
    "expires",
    "from",
    "host",
    "if-match",
    "if-modified-since",
    "if-none-match",
    "if-range",
    "if-unmodified-since",
    "last-modified",
    "location",
    "max-forwards",
    "pragma",
    "proxy-authenticate",
    "proxy-authorization",
    "range",
    "referer",
    "retry-after",
    "server",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "user-agent",
    "vary",
    "via",
    "warning",
    "www-authenticate",
    "method",
    "get",
    "status",
    "200 OK",
    "version",
    "HTTP/1.1",
    "url",
    "public",
    "set-cookie",
    "keep-alive",
    "origin",
];
const DICT_TAIL: &str = concat!(
    "100101201202205206300302303304305306307402405406407408409410411412413414415416417",
    "502504505203 Non-Authoritative Information204 No Content301 Moved Permanently",
    "400 Bad Request401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error",
    "501 Not Implemented503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct ",
    "Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,",
    "image/jpg,image/gif,application/xml,application/xhtml+xml,text/plain,text/javascript,",
    "publicprivatemax-age=gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.",
);

fn dictionary() -> Vec<u8> {
    let mut d = Vec::with_capacity(1423);
    for w in DICT_WORDS {
        d.extend_from_slice(&(w.len() as u32).to_be_bytes());
        d.extend_from_slice(w.as_bytes());
    }
    d.extend_from_slice(DICT_TAIL.as_bytes());
    d
}

/// Inflates the client's header blocks (one zlib stream over the connection).
struct Inflater {
    z: Decompress,
    dict: Vec<u8>,
}

impl Inflater {
    fn new(dict: Vec<u8>) -> Inflater {
        Inflater {
            z: Decompress::new(true),
            dict,
        }
    }

    fn inflate(&mut self, input: &[u8]) -> Result<Vec<u8>, String> {
        let mut out: Vec<u8> = Vec::with_capacity(input.len() * 4 + 256);
        let mut pos = 0;
        let mut stalls = 0;
        loop {
            if out.capacity() - out.len() < 1024 {
                out.reserve(4096);
            }
            let (in0, out0) = (self.z.total_in(), out.len());
            let mut progressed = false;
            match self
                .z
                .decompress_vec(&input[pos..], &mut out, FlushDecompress::Sync)
            {
                Ok(_) => {}
                // The first block names the preset dictionary.
                Err(e) if e.needs_dictionary().is_some() => {
                    self.z
                        .set_dictionary(&self.dict)
                        .map_err(|e| e.to_string())?;
                    progressed = true;
                }
                Err(e) => return Err(e.to_string()),
            }
            pos += (self.z.total_in() - in0) as usize;
            progressed |= self.z.total_in() != in0 || out.len() != out0;
            // Done once the input is in and the output did not fill the buffer.
            if pos >= input.len() && out.len() < out.capacity() {
                return Ok(out);
            }
            if out.len() > 1 << 20 {
                return Err("header block too large".into());
            }
            stalls = if progressed { 0 } else { stalls + 1 };
            if stalls > 2 {
                return Err("corrupt header block".into());
            }
        }
    }
}

/// Deflates our header blocks (SYN_REPLY), each ending with a sync flush.
struct Deflater {
    z: Compress,
    dict: Option<Vec<u8>>,
}

impl Deflater {
    fn deflate(&mut self, input: &[u8]) -> Vec<u8> {
        if let Some(d) = self.dict.take() {
            if let Err(e) = self.z.set_dictionary(&d) {
                tracing::debug!(error = %e, "port-forward: zlib dictionary");
            }
        }
        let mut out: Vec<u8> = Vec::with_capacity(input.len() + 64);
        let mut pos = 0;
        loop {
            if out.capacity() - out.len() < 64 {
                out.reserve(256);
            }
            let in0 = self.z.total_in();
            if self
                .z
                .compress_vec(&input[pos..], &mut out, FlushCompress::Sync)
                .is_err()
            {
                return out;
            }
            pos += (self.z.total_in() - in0) as usize;
            // Done once the input is in and the flush did not fill the buffer.
            if pos >= input.len() && out.capacity() - out.len() >= 64 {
                return out;
            }
        }
    }
}

/// A header block: lowercase names, multiple values joined by NUL.
fn header_block(headers: &[(&str, &str)]) -> Vec<u8> {
    let mut b = (headers.len() as u32).to_be_bytes().to_vec();
    for (k, v) in headers {
        b.extend_from_slice(&(k.len() as u32).to_be_bytes());
        b.extend_from_slice(k.as_bytes());
        b.extend_from_slice(&(v.len() as u32).to_be_bytes());
        b.extend_from_slice(v.as_bytes());
    }
    b
}

fn parse_header_block(b: &[u8]) -> Option<HashMap<String, String>> {
    let u32_at = |i: usize| -> Option<usize> {
        b.get(i..i + 4)
            .map(|s| u32::from_be_bytes([s[0], s[1], s[2], s[3]]) as usize)
    };
    let n = u32_at(0)?;
    if n > 1000 {
        return None;
    }
    let mut i = 4;
    let mut h = HashMap::new();
    for _ in 0..n {
        let kl = u32_at(i)?;
        let k = b.get(i + 4..i + 4 + kl)?;
        i += 4 + kl;
        let vl = u32_at(i)?;
        let v = b.get(i + 4..i + 4 + vl)?;
        i += 4 + vl;
        let v = String::from_utf8_lossy(v);
        // Multiple values are NUL-separated; the first is what Header.Get reads.
        let first = v.split('\0').next().unwrap_or("").to_owned();
        h.insert(String::from_utf8_lossy(k).to_ascii_lowercase(), first);
    }
    Some(h)
}

fn control_frame(typ: u16, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(8 + payload.len());
    f.extend_from_slice(&(0x8003u16).to_be_bytes());
    f.extend_from_slice(&typ.to_be_bytes());
    f.push(flags);
    f.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    f.extend_from_slice(payload);
    f
}

fn data_frame(stream: u32, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(8 + payload.len());
    f.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    f.push(flags);
    f.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    f.extend_from_slice(payload);
    f
}

fn rst_frame(stream: u32, status: u32) -> Vec<u8> {
    let mut p = stream.to_be_bytes().to_vec();
    p.extend_from_slice(&status.to_be_bytes());
    control_frame(RST_STREAM, 0, &p)
}

/// What the connection's writer sends, in order.
enum Out {
    Frame(Vec<u8>),
    /// A SYN_REPLY with no headers (compressed in order with the others).
    Reply(u32),
}

/// One half of a forwarded connection, as the session hands it to its pair.
struct Half {
    id: u32,
    port: u16,
    rx: mpsc::Receiver<Bytes>,
}

#[derive(Default)]
struct Pair {
    data: Option<Half>,
    error: Option<Half>,
}

/// Serves one SPDY connection: streams in pairs, each pair one forwarded connection.
async fn session<S>(io: S, target: Target, fetch: PodFetch)
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let dict = dictionary();
    let (mut rd, mut wr) = tokio::io::split(io);
    let (tx, mut rx) = mpsc::channel::<Out>(64);
    let mut deflater = Deflater {
        z: Compress::new(Compression::best(), true),
        dict: Some(dict.clone()),
    };
    let writer = tokio::spawn(async move {
        while let Some(out) = rx.recv().await {
            let frame = match out {
                Out::Frame(f) => f,
                Out::Reply(id) => {
                    let mut p = (id & 0x7fff_ffff).to_be_bytes().to_vec();
                    p.extend(deflater.deflate(&header_block(&[])));
                    control_frame(SYN_REPLY, 0, &p)
                }
            };
            if wr.write_all(&frame).await.is_err() || wr.flush().await.is_err() {
                return;
            }
        }
        let _ = wr.shutdown().await;
    });
    let mut inflater = Inflater::new(dict);
    let mut streams: HashMap<u32, mpsc::Sender<Bytes>> = HashMap::new();
    let mut pairs: HashMap<String, Pair> = HashMap::new();
    loop {
        let mut h = [0u8; 8];
        if rd.read_exact(&mut h).await.is_err() {
            break;
        }
        let flags = h[4];
        let len = u32::from_be_bytes([0, h[5], h[6], h[7]]) as usize;
        let mut payload = vec![0u8; len];
        if rd.read_exact(&mut payload).await.is_err() {
            break;
        }
        if h[0] & 0x80 == 0 {
            // DATA
            let id = u32::from_be_bytes([h[0], h[1], h[2], h[3]]) & 0x7fff_ffff;
            if let Some(s) = streams.get(&id) {
                if !payload.is_empty() && s.send(Bytes::from(payload)).await.is_err() {
                    streams.remove(&id);
                }
            }
            if flags & FLAG_FIN != 0 {
                streams.remove(&id);
            }
            continue;
        }
        let version = u16::from_be_bytes([h[0] & 0x7f, h[1]]);
        let typ = u16::from_be_bytes([h[2], h[3]]);
        if version != 3 {
            break;
        }
        match typ {
            SYN_STREAM if payload.len() >= 10 => {
                let id = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]])
                    & 0x7fff_ffff;
                let headers = match inflater.inflate(&payload[10..]) {
                    Ok(b) => parse_header_block(&b),
                    Err(e) => {
                        tracing::debug!(error = %e, "port-forward: bad header block");
                        break;
                    }
                };
                let headers = headers.unwrap_or_default();
                let (port, kind) = match validate(&headers) {
                    Ok(v) => v,
                    Err(e) => {
                        tracing::debug!(stream = id, error = %e, "port-forward: stream refused");
                        let _ = tx.send(Out::Frame(rst_frame(id, RST_CANCEL))).await;
                        continue;
                    }
                };
                if tx.send(Out::Reply(id)).await.is_err() {
                    break;
                }
                let (stx, srx) = mpsc::channel(16);
                if flags & FLAG_FIN == 0 {
                    streams.insert(id, stx);
                }
                let request = headers
                    .get("requestid")
                    .filter(|r| !r.is_empty())
                    .cloned()
                    .unwrap_or_else(|| {
                        // Old clients: the error stream's id, the data stream's id - 2.
                        if kind == "error" {
                            id.to_string()
                        } else {
                            id.saturating_sub(2).to_string()
                        }
                    });
                let half = Half { id, port, rx: srx };
                // Half-open pairs are bounded (upstream times them out after 30 s).
                if pairs.len() >= MAX_PENDING && !pairs.contains_key(&request) {
                    tracing::debug!("port-forward: too many half-open stream pairs");
                    break;
                }
                let pair = pairs.entry(request.clone()).or_default();
                let slot = if kind == "error" {
                    &mut pair.error
                } else {
                    &mut pair.data
                };
                if slot.is_some() {
                    let msg = format!(
                        "error processing stream for request {request}: {kind} stream already assigned"
                    );
                    if let Some(e) = &pair.error {
                        let _ = tx
                            .send(Out::Frame(data_frame(e.id, 0, msg.as_bytes())))
                            .await;
                    }
                    continue;
                }
                *slot = Some(half);
                if pair.data.is_some() && pair.error.is_some() {
                    if let Some(Pair {
                        data: Some(d),
                        error: Some(e),
                    }) = pairs.remove(&request)
                    {
                        tokio::spawn(forward(d, e, tx.clone(), target.clone(), fetch.clone()));
                    }
                }
            }
            RST_STREAM if payload.len() >= 4 => {
                let id = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]])
                    & 0x7fff_ffff;
                streams.remove(&id);
            }
            PING if payload.len() >= 4 => {
                // Answer the client's pings (odd ids); ours would be even.
                let ping = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]);
                if ping & 1 == 1 {
                    let _ = tx.send(Out::Frame(control_frame(PING, 0, &payload))).await;
                }
            }
            GOAWAY => break,
            // SETTINGS, HEADERS, WINDOW_UPDATE: nothing to do.
            _ => {}
        }
    }
    drop(streams);
    drop(pairs);
    drop(tx);
    let _ = writer.await;
}

/// upstream's httpStreamReceived checks: (port, stream type).
fn validate(h: &HashMap<String, String>) -> Result<(u16, String), String> {
    let port = h.get("port").map(String::as_str).unwrap_or("");
    if port.is_empty() {
        return Err("\"port\" header is required".into());
    }
    let port: u16 = port
        .parse()
        .map_err(|e| format!("unable to parse {port:?} as a port: {e}"))?;
    if port < 1 {
        return Err(format!("port \"{port}\" must be > 0"));
    }
    let kind = h.get("streamtype").map(String::as_str).unwrap_or("");
    if kind.is_empty() {
        return Err("\"streamType\" header is required".into());
    }
    if kind != "error" && kind != "data" {
        return Err(format!("invalid stream type {kind:?}"));
    }
    Ok((port, kind.to_owned()))
}

/// Forwards one connection: the data stream to the pod's listener on the port, or the
/// runtime's error on the error stream.
async fn forward(data: Half, error: Half, tx: mpsc::Sender<Out>, target: Target, fetch: PodFetch) {
    let port = data.port;
    let pod = fetch().await;
    let found = pod.as_ref().and_then(|p| target.network.forward(p, port));
    let host = pod.as_ref().is_some_and(host_network);
    if found.is_none() && !host {
        let msg = refused(port, &target);
        let _ = tx
            .send(Out::Frame(data_frame(error.id, 0, msg.as_bytes())))
            .await;
        let _ = tx.send(Out::Frame(rst_frame(data.id, RST_CANCEL))).await;
        let _ = tx.send(Out::Frame(rst_frame(error.id, RST_CANCEL))).await;
        return;
    }
    let Half { id, mut rx, .. } = data;
    let send = |bytes: Vec<u8>| {
        let tx = tx.clone();
        async move {
            for chunk in bytes.chunks(CHUNK) {
                if tx.send(Out::Frame(data_frame(id, 0, chunk))).await.is_err() {
                    return false;
                }
            }
            true
        }
    };
    match found {
        Some(stream) => pipe(&mut rx, stream, send).await,
        // A host-network pod's port that the pod network has no server of.
        None => {
            if !pipe_to_loopback(&mut rx, port, send).await {
                let msg = refused(port, &target);
                let _ = tx
                    .send(Out::Frame(data_frame(error.id, 0, msg.as_bytes())))
                    .await;
            }
        }
    }
    // Both streams closed from our side (the deferred Closes of upstream's handler).
    let _ = tx.send(Out::Frame(data_frame(id, FLAG_FIN, &[]))).await;
    let _ = tx
        .send(Out::Frame(data_frame(error.id, FLAG_FIN, &[])))
        .await;
}

fn host_network(pod: &Value) -> bool {
    pod.pointer("/spec/hostNetwork").and_then(Value::as_bool) == Some(true)
}

/// Forwards a connection to a host-network pod's port that the pod network has no server
/// of to whatever really listens on that port of the node's loopback (the control plane's
/// components, which the kubeadm static pods stand for). `false` when nothing listens
/// there.
async fn pipe_to_loopback<F, Fut>(rx: &mut mpsc::Receiver<Bytes>, port: u16, send: F) -> bool
where
    F: Fn(Vec<u8>) -> Fut,
    Fut: Future<Output = bool>,
{
    let to = std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port));
    let Ok(sock) = tokio::net::TcpStream::connect(to).await else {
        return false;
    };
    pipe(rx, sock, send).await;
    true
}

/// Carries one forwarded connection: the client's bytes to `io`, and what comes back out
/// with `send`, until the server closes.
async fn pipe<IO, F, Fut>(rx: &mut mpsc::Receiver<Bytes>, io: IO, send: F)
where
    IO: AsyncRead + AsyncWrite,
    F: Fn(Vec<u8>) -> Fut,
    Fut: Future<Output = bool>,
{
    let (mut r, mut w) = tokio::io::split(io);
    let up = async {
        while let Some(b) = rx.recv().await {
            if w.write_all(&b).await.is_err() {
                break;
            }
        }
        let _ = w.shutdown().await;
        // The client is done sending; the answer may still be coming.
        std::future::pending::<()>().await;
    };
    let down = async {
        let mut buf = vec![0u8; 16 << 10];
        loop {
            match r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if !send(buf[..n].to_vec()).await {
                        break;
                    }
                }
            }
        }
    };
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
}

/// containerd's answer when nothing listens, as the kubelet's streaming server wraps it
/// (the sim's sandbox ids are `sandbox-<pod uid>`).
fn refused(port: u16, target: &Target) -> String {
    let sandbox = format!("sandbox-{}", target.uid);
    format!(
        "error forwarding port {port} to pod {sandbox}, uid : failed to execute portforward in network namespace \"/var/run/netns/cni-{uid}\": failed to connect to localhost:{port} inside namespace \"{sandbox}\", IPv4: dial tcp4 127.0.0.1:{port}: connect: connection refused IPv6 dial tcp6 [::1]:{port}: connect: connection refused ",
        uid = target.uid
    )
}

/// The WebSocket protocols of the channel form, and whether each is base64.
const WS_CHANNEL_PROTOCOLS: &[(&str, bool)] = &[
    ("v4.channel.k8s.io", false),
    ("v4.base64.channel.k8s.io", true),
];

/// upstream's NewV4Options: the `port` query parameters (repeated or comma-separated).
fn v4_ports(query: Option<&str>) -> Result<Vec<u16>, String> {
    let values: Vec<String> = kumo_apimachinery::query::pairs(query)
        .into_iter()
        .filter(|(k, _)| k == "port")
        .map(|(_, v)| v)
        .collect();
    if values.is_empty() {
        return Err("query parameter \"port\" is required".into());
    }
    let mut ports = Vec::new();
    for v in &values {
        if v.is_empty() {
            return Err("query parameter \"port\" cannot be empty".into());
        }
        for p in v.split(',') {
            let port: u16 = p.parse().map_err(|e| {
                format!("unable to parse {v:?} as a port: {}", go_parse_error(p, &e))
            })?;
            if port < 1 {
                return Err(format!("port {v:?} must be > 0"));
            }
            ports.push(port);
        }
    }
    Ok(ports)
}

/// strconv.ParseUint's error text.
fn go_parse_error(p: &str, e: &std::num::ParseIntError) -> String {
    match e.kind() {
        std::num::IntErrorKind::PosOverflow => {
            format!("strconv.ParseUint: parsing {p:?}: value out of range")
        }
        _ => format!("strconv.ParseUint: parsing {p:?}: invalid syntax"),
    }
}

/// The WebSocket channel form (no SPDY): per requested port a data channel (2i) and an
/// error channel (2i+1), each opened by the port in little-endian; one connection per
/// port, the WebSocket closed once every port is done.
async fn ws_channels<S>(io: S, ports: Vec<u16>, base64: bool, target: Target, fetch: PodFetch)
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (mut ws_r, mut ws_w) = tokio::io::split(io);
    let (out_tx, mut out_rx) = mpsc::channel::<(u8, Vec<u8>)>(16);
    let writer = tokio::spawn(async move {
        while let Some((opcode, payload)) = out_rx.recv().await {
            if ws_w
                .write_all(&kumo_apimachinery::websocket::frame(opcode, &payload))
                .await
                .is_err()
                || ws_w.flush().await.is_err()
            {
                return;
            }
            if opcode == 0x8 {
                let _ = ws_w.shutdown().await;
                return;
            }
        }
    });
    // A message on channel `c`.
    let message = move |c: u8, data: &[u8]| -> (u8, Vec<u8>) {
        if base64 {
            let mut m = vec![b'0' + c % 10];
            m.extend(
                base64::engine::general_purpose::STANDARD
                    .encode(data)
                    .into_bytes(),
            );
            (0x1, m)
        } else {
            let mut m = vec![c];
            m.extend_from_slice(data);
            (0x2, m)
        }
    };
    let mut inputs = Vec::new();
    let mut tasks = Vec::new();
    for (i, port) in ports.iter().copied().enumerate() {
        let (data_ch, err_ch) = ((2 * i) as u8, (2 * i + 1) as u8);
        for c in [data_ch, err_ch] {
            let _ = out_tx.send(message(c, &port.to_le_bytes())).await;
        }
        let (tx, mut rx) = mpsc::channel::<Bytes>(16);
        inputs.push(tx);
        let (out, target, fetch) = (out_tx.clone(), target.clone(), fetch.clone());
        tasks.push(tokio::spawn(async move {
            let pod = fetch().await;
            let send = |bytes: Vec<u8>| {
                let out = out.clone();
                async move {
                    for chunk in bytes.chunks(CHUNK) {
                        if out.send(message(data_ch, chunk)).await.is_err() {
                            return false;
                        }
                    }
                    true
                }
            };
            match pod.as_ref().and_then(|p| target.network.forward(p, port)) {
                None if pod.as_ref().is_some_and(host_network) => {
                    if !pipe_to_loopback(&mut rx, port, send).await {
                        let _ = out
                            .send(message(err_ch, refused(port, &target).as_bytes()))
                            .await;
                    }
                }
                Some(stream) => pipe(&mut rx, stream, send).await,
                None => {
                    let _ = out
                        .send(message(err_ch, refused(port, &target).as_bytes()))
                        .await;
                }
            }
        }));
    }
    let pongs = out_tx.clone();
    let reader = tokio::spawn(async move {
        while let Some((opcode, payload)) = read_ws_frame(&mut ws_r).await {
            let payload = match opcode {
                0x0..=0x2 => payload,
                0x9 => {
                    let _ = pongs.send((0xA, payload)).await;
                    continue;
                }
                0xA => continue,
                _ => break,
            };
            let decoded = if base64 {
                let Some((c, rest)) = payload.split_first() else {
                    continue;
                };
                let mut d = vec![c.wrapping_sub(b'0')];
                d.extend(
                    base64::engine::general_purpose::STANDARD
                        .decode(rest)
                        .unwrap_or_default(),
                );
                d
            } else {
                payload
            };
            let Some((c, data)) = decoded.split_first() else {
                continue;
            };
            // Only data channels take input.
            if c % 2 == 0 {
                if let Some(tx) = inputs.get(usize::from(*c / 2)) {
                    if !data.is_empty() {
                        let _ = tx.send(Bytes::copy_from_slice(data)).await;
                    }
                }
            }
        }
    });
    for t in tasks {
        let _ = t.await;
    }
    reader.abort();
    let _ = out_tx.send((0x8, 1000u16.to_be_bytes().to_vec())).await;
    drop(out_tx);
    let _ = writer.await;
}

/// The next frame from the client, unmasked: (opcode, payload); None at the end.
async fn read_ws_frame<R: AsyncRead + Unpin>(r: &mut R) -> Option<(u8, Vec<u8>)> {
    let mut head = [0u8; 2];
    r.read_exact(&mut head).await.ok()?;
    let opcode = head[0] & 0x0f;
    let masked = head[1] & 0x80 != 0;
    let mut len = u64::from(head[1] & 0x7f);
    if len == 126 {
        let mut b = [0u8; 2];
        r.read_exact(&mut b).await.ok()?;
        len = u64::from(u16::from_be_bytes(b));
    } else if len == 127 {
        let mut b = [0u8; 8];
        r.read_exact(&mut b).await.ok()?;
        len = u64::from_be_bytes(b);
    }
    if len > 16 << 20 {
        return None;
    }
    let mut mask = [0u8; 4];
    if masked {
        r.read_exact(&mut mask).await.ok()?;
    }
    let mut payload = vec![0u8; len as usize];
    r.read_exact(&mut payload).await.ok()?;
    if masked {
        for (i, b) in payload.iter_mut().enumerate() {
            *b ^= mask[i % 4];
        }
    }
    Some((opcode, payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host-network pod's port that no simulated server holds reaches what really
    /// listens on the node's loopback, both ways; nothing listening is a refusal.
    #[tokio::test]
    async fn host_network_ports_pipe_to_the_real_loopback_server() {
        let server = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = server.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut c, _) = server.accept().await.unwrap();
            let mut buf = [0u8; 4];
            c.read_exact(&mut buf).await.unwrap();
            c.write_all(&[b"echo:".as_slice(), &buf].concat())
                .await
                .unwrap();
        });
        let (tx, mut rx) = mpsc::channel(4);
        tx.send(Bytes::from_static(b"ping")).await.unwrap();
        let got = Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = got.clone();
        let ok = pipe_to_loopback(&mut rx, port, move |b| {
            sink.lock().unwrap().extend(b);
            async { true }
        })
        .await;
        assert!(ok);
        assert_eq!(got.lock().unwrap().as_slice(), b"echo:ping");
        // Nothing listens on the port any more.
        let (_tx, mut rx) = mpsc::channel(1);
        assert!(!pipe_to_loopback(&mut rx, port, |_| async { true }).await);
    }

    #[test]
    fn dictionary_is_spdy3s() {
        let d = dictionary();
        assert_eq!(d.len(), 1423);
        // Adler-32 of the SPDY/3 dictionary (the id a zlib stream names it by).
        let (mut a, mut b) = (1u32, 0u32);
        for x in &d {
            a = (a + u32::from(*x)) % 65521;
            b = (b + a) % 65521;
        }
        assert_eq!((b << 16) | a, 0xe3c6_a7c2);
    }

    #[test]
    fn header_blocks_round_trip_through_the_shared_zlib_streams() {
        let mut out = Deflater {
            z: Compress::new(Compression::best(), true),
            dict: Some(dictionary()),
        };
        let mut inp = Inflater::new(dictionary());
        for i in 0..3 {
            let port = format!("{}", 80 + i);
            let block = header_block(&[("streamtype", "data"), ("port", &port)]);
            let z = out.deflate(&block);
            let back = inp.inflate(&z).expect("inflate");
            let h = parse_header_block(&back).expect("parse");
            assert_eq!(h["port"], port);
            assert_eq!(validate(&h), Ok((80 + i, "data".to_owned())));
        }
    }

    /// A pod network where nothing listens.
    struct NoNetwork;

    impl kumo_cri::PodNetwork for NoNetwork {
        fn set_pod_cidr(&self, _: &str) {}
        fn set_up(&self, _: &str) -> Result<std::net::IpAddr, String> {
            Err("no network".into())
        }
        fn tear_down(&self, _: &str) {}
        fn serves(&self, _: &Value, _: u16) -> bool {
            false
        }
        fn get_pod(&self, _: &Value, _: u16, _: &str, _: bool) -> Result<u16, kumo_cri::DialError> {
            Err(kumo_cri::DialError::Refused)
        }
        fn connect(&self, _: std::net::SocketAddr) -> Result<(), kumo_cri::DialError> {
            Err(kumo_cri::DialError::Refused)
        }
        fn get(
            &self,
            _: std::net::SocketAddr,
            _: &str,
            _: bool,
        ) -> Result<u16, kumo_cri::DialError> {
            Err(kumo_cri::DialError::Refused)
        }
        fn forward(&self, _: &Value, _: u16) -> Option<tokio::io::DuplexStream> {
            None
        }
    }

    #[tokio::test]
    async fn bad_frames_end_the_session() {
        let fetch: PodFetch = Arc::new(|| Box::pin(async { None }));
        for garbage in [
            // A SYN_STREAM whose header block is no zlib stream.
            control_frame(SYN_STREAM, 0, &[0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4]),
            // SPDY/2.
            vec![0x80, 0x02, 0x00, 0x01, 0, 0, 0, 0],
            // A frame cut short.
            vec![0x80, 0x03, 0x00, 0x01, 0, 0xff, 0xff],
        ] {
            let (a, mut b) = tokio::io::duplex(4096);
            let target = Target {
                uid: "u".into(),
                network: Arc::new(NoNetwork),
            };
            let task = tokio::spawn(session(a, target, fetch.clone()));
            b.write_all(&garbage).await.expect("write");
            if garbage.len() == 7 {
                b.shutdown().await.expect("shutdown");
            }
            tokio::time::timeout(std::time::Duration::from_secs(5), task)
                .await
                .expect("session ends")
                .expect("no panic");
        }
    }
}
