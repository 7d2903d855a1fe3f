//! The simulated servers: what listens on a pod's ports (the image catalogue's servers —
//! agnhost's netexec, serve-hostname, test-webserver, porter, liveness, webhook, nettest,
//! guestbook, mtlsserver; nginx's and httpd's page; the sample API server) and the
//! HTTP/1.x they speak on an in-memory connection. Nothing listens on a port of an image
//! the catalogue does not know.

use std::future::Future;
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

/// What listens on a port of the pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listener {
    /// nginx's default server; the version its `Server` header names, if the tag has one.
    Nginx(Option<String>),
    /// A catalogued image's one page on its port (httpd's "It works!", the HPA
    /// walkthrough's php-apache "OK!"): its `Server` header and body.
    Page {
        server: &'static str,
        body: &'static str,
    },
    /// agnhost's `serve-hostname` (9376, or `--port`): the pod's hostname, no newline.
    Hostname(String),
    /// agnhost's `netexec` (`--http-port`, 8080): see [`crate::netexec`]; it logs to
    /// `container`.
    Netexec { pod: String, container: String },
    /// agnhost's `test-webserver` (80, or `--port`): a file server over the container's
    /// root. `found` is whether the requested file exists, when the caller asked the
    /// runtime (the prober does); unknown answers as found.
    FileServer {
        pod: String,
        container: String,
        found: Option<bool>,
    },
    /// agnhost's `liveness` server on 8080: `/healthz` answers 200 for the first 10 s
    /// after the container started (`started`, when known), then 500.
    AgnhostLiveness { started: Option<SystemTime> },
    /// agnhost's `webhook` (443, or `--port`): admission webhooks over TLS with the
    /// certificate and key at these paths of `container` (see [`crate::agnhost_webhook`]);
    /// `/readyz` answers `ok`.
    AgnhostWebhook {
        container: String,
        cert_file: String,
        key_file: String,
        sidecar_image: String,
        /// `crd-conversion-webhook` (serves `/crdconvert`) rather than `webhook`.
        crd_conversion: bool,
    },
    /// agnhost's `nettest` (`--port`, 8080): `/write` counts the `Source` of the JSON
    /// posted to it, `/read` answers the counts (kept in the [`crate::net::Dataplane`]
    /// under `container`), `/status` whether enough peers were seen.
    Nettest { hostname: String, container: String },
    /// agnhost's `guestbook` (`--http-port`, 80): see [`crate::guestbook`].
    Guestbook(crate::guestbook::Guestbook),
    /// agnhost's `porter`: on a port named by its `SERVE_PORT_<port>` environment
    /// variable that value as the body of every answer (with `--json-response` a JSON
    /// object of the method and the body); on one named by `SERVE_TLS_PORT_<port>` the
    /// same over TLS with the image's `/localhost.crt` (`tls`: the container's id).
    Porter {
        body: String,
        json: bool,
        tls: Option<String>,
    },
    /// sample-apiserver (`--secure-port`, 443 by default): the `wardle.example.com`
    /// extension API server over TLS with the certificate and key at these paths of
    /// `container` (see [`crate::sample_apiserver`]); `/readyz` answers `ok`.
    SampleApiserver {
        container: String,
        cert_file: String,
        key_file: String,
    },
    /// agnhost's `mtlsserver` (`--listen`): `GET /spiffe-echo` over TLS with the
    /// credential bundle at `creds_file` of `container`, verifying client certificates
    /// against the bundle at `trust_file` (see [`crate::mtls`]).
    MtlsServer {
        container: String,
        creds_file: String,
        trust_file: String,
    },
}

/// How long agnhost's `liveness` server stays healthy.
const AGNHOST_LIVENESS_HEALTHY: std::time::Duration = std::time::Duration::from_secs(10);

/// The server a container's image and arguments run on `port`, when the sim knows it:
/// agnhost's `liveness` (8080) and `test-webserver` (80, or `--port`), `netexec`
/// (`--http-port`, 8080 by default).
fn image_listener(
    pod: &Value,
    c: &Value,
    pod_name: &str,
    port: u16,
    started: Option<SystemTime>,
    container_id: Option<String>,
) -> Option<Listener> {
    let image = c["image"].as_str().unwrap_or("");
    let (repo, _) = split_image(image);
    let strings = |key: &str| -> Vec<String> {
        c[key]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect()
    };
    // The command line with the image's entrypoint and cmd where the spec has none.
    let argv = crate::runtime::images::image_argv(image, &strings("command"), &strings("args"));
    let mut args: Vec<&str> = argv.iter().map(String::as_str).collect();
    // `command: [/agnhost, serve-hostname]` names the binary the image's entrypoint is.
    if args
        .first()
        .is_some_and(|a| a.rsplit('/').next() == Some("agnhost"))
    {
        args.remove(0);
    }
    let text_flag = |name: &str| flag(&args, name).unwrap_or("").to_owned();
    match repo.rsplit('/').next() {
        Some("agnhost" | "nautilus" | "kitten") => {}
        Some("sample-apiserver") => {
            let secure_port = text_flag("--secure-port").parse::<u16>().unwrap_or(443);
            return (port == secure_port).then(|| Listener::SampleApiserver {
                container: container_id.unwrap_or_default(),
                cert_file: text_flag("--tls-cert-file"),
                key_file: text_flag("--tls-private-key-file"),
            });
        }
        _ => return None,
    }
    let port_flag = |name: &str| flag(&args, name).and_then(|v| v.parse::<u16>().ok());
    let env = |name: &str| {
        c["env"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["name"] == name)
            .map(|e| e["value"].as_str().unwrap_or("").to_owned())
    };
    match args.first().copied() {
        Some("guestbook")
            if port
                == flag(&args, "--http-port")
                    .and_then(|p| p.parse().ok())
                    .unwrap_or(80) =>
        {
            Some(Listener::Guestbook(crate::guestbook::Guestbook {
                container: container_id.unwrap_or_default(),
                namespace: pod
                    .pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    .unwrap_or("default")
                    .to_owned(),
                pod_ip: pod
                    .pointer("/status/podIP")
                    .and_then(Value::as_str)
                    .and_then(|i| i.parse().ok()),
                replica_of: flag(&args, "--replicaof").unwrap_or("").to_owned(),
                backend_port: flag(&args, "--backend-port")
                    .and_then(|p| p.parse().ok())
                    .unwrap_or(6379),
            }))
        }
        Some("nettest") if port == port_flag("--port").unwrap_or(8080) => Some(Listener::Nettest {
            hostname: pod_name.to_owned(),
            container: container_id.unwrap_or_default(),
        }),
        Some("porter") => {
            let json = args.contains(&"--json-response");
            if let Some(body) = env(&format!("SERVE_PORT_{port}")) {
                return Some(Listener::Porter {
                    body,
                    json,
                    tls: None,
                });
            }
            env(&format!("SERVE_TLS_PORT_{port}")).map(|body| Listener::Porter {
                body,
                json,
                tls: Some(container_id.unwrap_or_default()),
            })
        }
        Some("liveness") if port == 8080 => Some(Listener::AgnhostLiveness { started }),
        Some("mtlsserver")
            if text_flag("--listen")
                .rsplit_once(':')
                .and_then(|(_, p)| p.parse::<u16>().ok())
                == Some(port) =>
        {
            Some(Listener::MtlsServer {
                container: container_id.unwrap_or_default(),
                creds_file: text_flag("--server-creds"),
                trust_file: text_flag("--spiffe-trust-bundle"),
            })
        }
        Some(server @ ("webhook" | "crd-conversion-webhook"))
            if port == port_flag("--port").unwrap_or(443) =>
        {
            Some(Listener::AgnhostWebhook {
                container: container_id.unwrap_or_default(),
                cert_file: text_flag("--tls-cert-file"),
                key_file: text_flag("--tls-private-key-file"),
                sidecar_image: text_flag("--sidecar-image"),
                crd_conversion: server == "crd-conversion-webhook",
            })
        }
        Some("test-webserver") if port == port_flag("--port").unwrap_or(80) => {
            Some(Listener::FileServer {
                pod: pod_name.to_owned(),
                container: container_id.unwrap_or_default(),
                found: None,
            })
        }
        Some("netexec") if port == port_flag("--http-port").unwrap_or(8080) => {
            Some(Listener::Netexec {
                pod: pod_name.to_owned(),
                container: container_id.unwrap_or_default(),
            })
        }
        Some("serve-hostname") if port == port_flag("--port").unwrap_or(9376) => {
            Some(Listener::Hostname(pod_name.to_owned()))
        }
        _ => None,
    }
}

/// What a running container of `pod` answers to a UDP datagram `request` from `client`
/// on `port`: agnhost netexec's UDP server (`--udp-port`, 8081 unless -1: `hostname`,
/// `echo <text>`, `clientip`, `envvar <name>`) and `serve-hostname --udp` (`--port`,
/// 9376: the host name). `None`: nothing listens there.
pub(crate) fn udp_answer(
    pod: &Value,
    port: u16,
    request: &str,
    client: std::net::SocketAddr,
) -> Option<String> {
    let statuses = statuses(pod);
    let hostname = pod
        .pointer("/spec/hostname")
        .and_then(Value::as_str)
        .filter(|h| !h.is_empty())
        .or_else(|| pod.pointer("/metadata/name").and_then(Value::as_str))
        .unwrap_or("");
    for c in serving_containers(pod) {
        let running = statuses
            .iter()
            .any(|s| s["name"] == c["name"] && s.pointer("/state/running").is_some());
        let (repo, _) = split_image(c["image"].as_str().unwrap_or(""));
        if !running || repo.rsplit('/').next() != Some("agnhost") {
            continue;
        }
        let mut args: Vec<&str> = c["command"]
            .as_array()
            .into_iter()
            .chain(c["args"].as_array())
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        if args
            .first()
            .is_some_and(|a| a.rsplit('/').next() == Some("agnhost"))
        {
            args.remove(0);
        }
        let text_flag = |name: &str| flag(&args, name);
        let text = request.trim();
        let lower = text.to_ascii_lowercase();
        match args.first().copied() {
            Some("netexec") => {
                let udp_port = text_flag("--udp-port")
                    .and_then(|p| p.parse::<i64>().ok())
                    .unwrap_or(8081);
                if udp_port != i64::from(port) {
                    continue;
                }
                return Some(if lower == "hostname" {
                    hostname.to_owned()
                } else if let Some(rest) = lower.strip_prefix("echo ") {
                    rest.to_owned()
                } else if lower == "clientip" {
                    client.to_string()
                } else if let Some(name) = text
                    .strip_prefix("envvar ")
                    .or_else(|| text.strip_prefix("ENVVAR "))
                {
                    c["env"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .find(|e| e["name"] == name.trim())
                        .and_then(|e| e["value"].as_str())
                        .unwrap_or("")
                        .to_owned()
                } else {
                    udp_port.to_string()
                });
            }
            Some("serve-hostname") => {
                let udp = args.iter().any(|a| *a == "--udp" || *a == "--udp=true");
                let p = text_flag("--port")
                    .and_then(|p| p.parse::<u16>().ok())
                    .unwrap_or(9376);
                if udp && p == port {
                    return Some(hostname.to_owned());
                }
            }
            _ => {}
        }
    }
    None
}

/// The statuses of the pod's long-running containers: its containers' and its sidecars'
/// (init containers that restart Always).
fn statuses(pod: &Value) -> Vec<&Value> {
    ["/status/containerStatuses", "/status/initContainerStatuses"]
        .iter()
        .filter_map(|p| pod.pointer(p).and_then(Value::as_array))
        .flatten()
        .collect()
}

/// The pod's containers that serve: its containers, then its sidecars.
fn serving_containers(pod: &Value) -> Vec<&Value> {
    let containers = pod.pointer("/spec/containers").and_then(Value::as_array);
    let sidecars = pod
        .pointer("/spec/initContainers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|c| c["restartPolicy"] == "Always");
    containers.into_iter().flatten().chain(sidecars).collect()
}

/// The runtime's id of container `name` of `pod` (its status's `sim://<id>`).
fn container_id_of(pod: &Value, name: &Value) -> Option<String> {
    statuses(pod)
        .into_iter()
        .find(|s| &s["name"] == name)?
        .get("containerID")?
        .as_str()
        .map(|id| id.rsplit("://").next().unwrap_or(id).to_owned())
}

/// When container `name` of `pod` started running, as its status says.
fn started_at(pod: &Value, name: &Value) -> Option<SystemTime> {
    let at = statuses(pod)
        .into_iter()
        .find(|s| &s["name"] == name)?
        .pointer("/state/running/startedAt")?
        .as_str()?;
    let ts: k8s_openapi::jiff::Timestamp = at.parse().ok()?;
    SystemTime::UNIX_EPOCH.checked_add(std::time::Duration::from_secs(
        u64::try_from(ts.as_second()).ok()?,
    ))
}

/// The listener on `port` of `pod`: a running container that declares it (TCP), or an
/// nginx image on 80.
pub(crate) fn listener(pod: &Value, port: u16) -> Option<Listener> {
    listener_of(pod, port, true)
}

/// The listener on `port` of `pod` as its spec declares it, whatever the containers'
/// status says (the kubelet's prober asks about a container it knows runs).
pub(crate) fn declared_listener(pod: &Value, port: u16) -> Option<Listener> {
    listener_of(pod, port, false)
}

fn listener_of(pod: &Value, port: u16, running_only: bool) -> Option<Listener> {
    let statuses = statuses(pod);
    for c in serving_containers(pod) {
        let running = statuses
            .iter()
            .any(|s| s["name"] == c["name"] && s.pointer("/state/running").is_some());
        if running_only && !running {
            continue;
        }
        let declared = c["ports"].as_array().is_some_and(|ps| {
            ps.iter().any(|p| {
                p["containerPort"].as_u64() == Some(u64::from(port))
                    && p["protocol"].as_str().unwrap_or("TCP") == "TCP"
            })
        });
        let pod_name = pod
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("");
        if let Some(l) = image_listener(
            pod,
            c,
            pod_name,
            port,
            started_at(pod, &c["name"]),
            container_id_of(pod, &c["name"]),
        ) {
            return Some(l);
        }
        let image = c["image"].as_str().unwrap_or("");
        let (repo, tag) = split_image(image);
        let name = repo.rsplit('/').next().unwrap_or(repo);
        if name == "nginx" && (port == 80 || declared) {
            let version = tag
                .split('-')
                .next()
                .filter(|v| v.starts_with(|ch: char| ch.is_ascii_digit()))
                .map(str::to_owned);
            return Some(Listener::Nginx(version));
        }
        // Another image's declared port is answered only when the catalogue knows what
        // serves there: the simulator does not make up a server.
        if let Some((server, body)) = crate::runtime::images::page_of(name, c, port) {
            return Some(Listener::Page { server, body });
        }
    }
    None
}

/// A flag's value in agnhost's arguments, as `--name=value` or `--name value` (cobra
/// accepts both).
pub(crate) fn flag<'a>(args: &[&'a str], name: &str) -> Option<&'a str> {
    args.iter().enumerate().find_map(|(i, a)| {
        let rest = a.strip_prefix(name)?;
        match rest.strip_prefix('=') {
            Some(v) => Some(v),
            None if rest.is_empty() => args.get(i + 1).copied(),
            None => None,
        }
    })
}

/// (repository, tag) of an image reference; the tag is empty without one.
fn split_image(image: &str) -> (&str, &str) {
    let image = image.split('@').next().unwrap_or(image);
    match image.rsplit_once(':') {
        Some((r, t)) if !t.contains('/') => (r, t),
        _ => (image, ""),
    }
}

/// Serves one in-memory connection with the listener's HTTP server (a connection the
/// simulated pod network hands a client outside the sim, e.g. the API server's proxy).
pub(crate) async fn serve_stream(
    io: tokio::io::DuplexStream,
    l: Listener,
    dp: Option<Arc<crate::net::Dataplane>>,
) {
    let (mut r, w) = tokio::io::split(io);
    let (tx, mut rx) = mpsc::channel::<Bytes>(16);
    tokio::spawn(async move {
        let mut buf = vec![0u8; 16 << 10];
        loop {
            match r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx.send(Bytes::copy_from_slice(&buf[..n])).await.is_err() {
                        break;
                    }
                }
            }
        }
    });
    let w = Arc::new(tokio::sync::Mutex::new(w));
    http_server(&mut rx, &l, dp.as_deref(), |out| {
        let w = w.clone();
        async move { w.lock().await.write_all(&out).await.is_ok() }
    })
    .await;
    let _ = w.lock().await.shutdown().await;
}

/// A minimal HTTP/1.x server on one connection: requests in, answers out, keep-alive as
/// HTTP/1.1 has it.
async fn http_server<F, Fut>(
    rx: &mut mpsc::Receiver<Bytes>,
    l: &Listener,
    dp: Option<&crate::net::Dataplane>,
    send: F,
) where
    F: Fn(Vec<u8>) -> Fut,
    Fut: Future<Output = bool>,
{
    let mut buf: Vec<u8> = Vec::new();
    loop {
        let end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            if buf.len() > 64 << 10 {
                let _ = send(response(l, 400, "Bad Request", false, false)).await;
                return;
            }
            match rx.recv().await {
                Some(b) => buf.extend_from_slice(&b),
                None => return,
            }
        };
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        buf.drain(..end);
        let mut lines = head.split("\r\n");
        let request_line = lines.next().unwrap_or("");
        let mut parts = request_line.split(' ');
        let (method, path, version) = (
            parts.next().unwrap_or(""),
            parts.next().unwrap_or(""),
            parts.next().unwrap_or(""),
        );
        let mut content_length = 0usize;
        let mut connection = String::new();
        for line in lines {
            if let Some((k, v)) = line.split_once(':') {
                match k.trim().to_ascii_lowercase().as_str() {
                    "content-length" => content_length = v.trim().parse().unwrap_or(0),
                    "connection" => connection = v.trim().to_ascii_lowercase(),
                    _ => {}
                }
            }
        }
        while buf.len() < content_length {
            match rx.recv().await {
                Some(b) => buf.extend_from_slice(&b),
                None => return,
            }
        }
        let body: Vec<u8> = buf.drain(..content_length).collect();
        let body = String::from_utf8_lossy(&body).into_owned();
        let keep_alive = if version == "HTTP/1.0" {
            connection.contains("keep-alive")
        } else {
            !connection.contains("close")
        };
        if !version.starts_with("HTTP/1.") || method.is_empty() {
            let _ = send(response(l, 400, "Bad Request", false, false)).await;
            return;
        }
        if !send(answer_request(dp, l, method, path, &body, keep_alive)).await || !keep_alive {
            return;
        }
    }
}

/// The whole HTTP answer of the listener to `method path` (netexec's handlers run here,
/// with the pod network `dp` for its `/dial`).
pub(crate) fn answer(
    dp: Option<&crate::net::Dataplane>,
    l: &Listener,
    method: &str,
    path: &str,
    keep_alive: bool,
) -> Vec<u8> {
    answer_request(dp, l, method, path, "", keep_alive)
}

/// [`answer`] to a request with a body.
pub(crate) fn answer_request(
    dp: Option<&crate::net::Dataplane>,
    l: &Listener,
    method: &str,
    path: &str,
    body: &str,
    keep_alive: bool,
) -> Vec<u8> {
    let head_only = method == "HEAD";
    // test-webserver serves the container's files (what it can read of them).
    if let (Listener::FileServer { container, .. }, Some(dp)) = (l, dp) {
        let file = path.split('?').next().unwrap_or("/");
        let (code, reason, content_type, body) = match dp.read_file(container, file) {
            Some(content) => (200, "OK", sniff_content_type(&content), content),
            None => (
                404,
                "Not Found",
                "text/plain; charset=utf-8",
                "404 page not found\n".to_owned(),
            ),
        };
        return http_message(
            code,
            reason,
            None,
            content_type,
            &body,
            keep_alive,
            head_only,
            false,
        );
    }
    if let Listener::Nettest {
        hostname,
        container,
    } = l
    {
        let (code, reason, text) = nettest(dp, hostname, container, path, body);
        return http_message(
            code,
            reason,
            None,
            "text/plain; charset=utf-8",
            &text,
            keep_alive,
            head_only,
            false,
        );
    }
    if let Listener::Porter { .. } = l {
        let (content_type, body) = porter_body(l, method);
        return http_message(
            200,
            "OK",
            None,
            &content_type,
            &body,
            keep_alive,
            head_only,
            false,
        );
    }
    let handled = match l {
        Listener::Guestbook(g) => Some(g.answer(dp, path)),
        Listener::Netexec { pod, container } => {
            Some(crate::netexec::answer(dp, pod, container, path))
        }
        _ => None,
    };
    if let Some(a) = handled {
        return http_message(
            a.code,
            a.reason,
            None,
            a.content_type,
            &a.body,
            keep_alive,
            head_only,
            false,
        );
    }
    let (code, reason) = status(l, method, path, "HTTP/1.1");
    response(l, code, reason, keep_alive && code != 400, head_only)
}

/// agnhost nettest's handlers over its state (upstream's `State`, as JSON).
fn nettest(
    dp: Option<&crate::net::Dataplane>,
    hostname: &str,
    container: &str,
    path: &str,
    body: &str,
) -> (u16, &'static str, String) {
    let fresh = || {
        serde_json::json!({"Hostname": hostname, "Sent": {}, "Received": {}, "Errors": null,
            "Log": null, "StillContactingPeers": true})
    };
    let Some(dp) = dp else {
        return (200, "OK", fresh().to_string());
    };
    match path.split('?').next().unwrap_or("") {
        "/write" => {
            let source = serde_json::from_str::<Value>(body)
                .ok()
                .and_then(|v| v.get("Source").and_then(Value::as_str).map(str::to_owned));
            dp.with_server_state(container, fresh, |state| match &source {
                Some(src) if !src.is_empty() => {
                    let n = state["Received"][src.as_str()].as_u64().unwrap_or(0);
                    state["Received"][src.as_str()] = (n + 1).into();
                }
                _ => {
                    let e = match &source {
                        Some(_) => format!("{hostname}: Got request with no source"),
                        None => "EOF".to_owned(),
                    };
                    match state["Errors"].as_array_mut() {
                        Some(errors) => errors.push(e.into()),
                        None => state["Errors"] = serde_json::json!([e]),
                    }
                }
            });
            (
                200,
                "OK",
                format!("{}\n", serde_json::json!({"Hostname": hostname})),
            )
        }
        "/read" => {
            let state = dp.with_server_state(container, fresh, |s| s.clone());
            let text = serde_json::to_string_pretty(&state).unwrap_or_default();
            (200, "OK", text.replace("  ", "\t"))
        }
        "/status" => (200, "OK", "running".to_owned()),
        _ => (404, "Not Found", "404 page not found\n".to_owned()),
    }
}

/// agnhost porter's answer to `method`: its content type and body. Without
/// `--json-response` the type is what Go's content sniffing makes of the body.
pub(crate) fn porter_body(l: &Listener, method: &str) -> (String, String) {
    let Listener::Porter { body, json, .. } = l else {
        return ("text/plain; charset=utf-8".into(), String::new());
    };
    if *json {
        let j = serde_json::json!({"Method": method, "Body": body});
        return ("application/json".into(), j.to_string());
    }
    (sniff_content_type(body).into(), body.clone())
}

/// The HTML part of Go's http.DetectContentType: a body that starts (after white space)
/// with one of the tags it knows is HTML, anything else printable is plain text.
fn sniff_content_type(body: &str) -> &'static str {
    const TAGS: &[&str] = &[
        "<!DOCTYPE HTML",
        "<HTML",
        "<HEAD",
        "<SCRIPT",
        "<IFRAME",
        "<H1",
        "<DIV",
        "<FONT",
        "<TABLE",
        "<A",
        "<STYLE",
        "<TITLE",
        "<B",
        "<BODY",
        "<BR",
        "<P",
        "<!--",
    ];
    let t = body.trim_start_matches(['\t', '\n', '\x0c', '\r', ' ']);
    let html = TAGS.iter().any(|tag| {
        t.len() > tag.len()
            && t.is_char_boundary(tag.len())
            && t[..tag.len()].eq_ignore_ascii_case(tag)
            && matches!(t.as_bytes()[tag.len()], b' ' | b'>')
    });
    if html {
        "text/html; charset=utf-8"
    } else {
        "text/plain; charset=utf-8"
    }
}

/// The status the listener answers a request with.
pub(crate) fn status(l: &Listener, method: &str, path: &str, version: &str) -> (u16, &'static str) {
    match (l, method, path.split('?').next().unwrap_or("")) {
        (_, m, _) if !version.starts_with("HTTP/1.") || m.is_empty() => (400, "Bad Request"),
        (Listener::Nginx(_), "GET" | "HEAD", "/" | "/index.html") => (200, "OK"),
        (Listener::Nginx(_), "GET" | "HEAD", _) => (404, "Not Found"),
        (Listener::Nginx(_), _, _) => (405, "Not Allowed"),
        (
            Listener::Page { .. }
            | Listener::Hostname(_)
            | Listener::Netexec { .. }
            | Listener::Nettest { .. }
            | Listener::Porter { .. },
            _,
            _,
        ) => (200, "OK"),
        (
            Listener::FileServer {
                found: Some(false), ..
            },
            _,
            _,
        ) => (404, "Not Found"),
        (Listener::FileServer { .. }, _, _) => (200, "OK"),
        (Listener::Guestbook(_), _, "/register" | "/get" | "/set" | "/guestbook") => (200, "OK"),
        (Listener::Guestbook(_), _, _) => (404, "Not Found"),
        (Listener::AgnhostLiveness { started }, _, "/healthz") => {
            let up = started.and_then(|s| s.elapsed().ok()).unwrap_or_default();
            if up < AGNHOST_LIVENESS_HEALTHY {
                (200, "OK")
            } else {
                (500, "Internal Server Error")
            }
        }
        (Listener::AgnhostLiveness { .. }, _, _) => (404, "Not Found"),
        (Listener::AgnhostWebhook { .. }, _, "/readyz") => (200, "OK"),
        (Listener::AgnhostWebhook { .. }, _, _) => (404, "Not Found"),
        (Listener::SampleApiserver { .. }, _, "/readyz" | "/healthz" | "/livez") => (200, "OK"),
        (Listener::SampleApiserver { .. }, _, _) => (403, "Forbidden"),
        // Go's TLS server to a plain HTTP request.
        (Listener::MtlsServer { .. }, _, _) => (400, "Bad Request"),
    }
}

/// An HTTP response of the listener.
pub(crate) fn response(
    l: &Listener,
    code: u16,
    reason: &str,
    keep_alive: bool,
    head_only: bool,
) -> Vec<u8> {
    let (server, content_type, body) = match l {
        Listener::Nginx(v) => {
            let server = match v {
                Some(v) => format!("nginx/{v}"),
                None => "nginx".to_owned(),
            };
            let body = if code == 200 {
                concat!(
                    "<!DOCTYPE html>\n<html>\n<head>\n<title>Welcome to nginx!</title>\n</head>\n",
                    "<body>\n<h1>Welcome to nginx!</h1>\n",
                    "<p>If you see this page, the nginx web server is successfully installed and\n",
                    "working. Further configuration is required.</p>\n</body>\n</html>\n"
                )
                .to_owned()
            } else {
                format!(
                    "<html>\r\n<head><title>{code} {reason}</title></head>\r\n<body>\r\n<center><h1>{code} {reason}</h1></center>\r\n<hr><center>{server}</center>\r\n</body>\r\n</html>\r\n"
                )
            };
            (Some(server), "text/html", body)
        }
        Listener::Page { server, body } => (
            Some((*server).to_owned()).filter(|s| !s.is_empty()),
            if body.starts_with('<') {
                "text/html"
            } else {
                "text/plain; charset=utf-8"
            },
            (*body).to_owned(),
        ),
        Listener::Netexec { pod, .. } => (None, "text/plain; charset=utf-8", format!("{pod}\n")),
        Listener::Nettest { hostname, .. } => (
            None,
            "text/plain; charset=utf-8",
            format!("{}\n", serde_json::json!({"Hostname": hostname})),
        ),
        Listener::Hostname(host) => (None, "text/plain; charset=utf-8", host.clone()),
        Listener::Guestbook(_) => (
            None,
            "text/plain; charset=utf-8",
            "404 page not found\n".to_owned(),
        ),
        Listener::FileServer { pod, .. } if code == 200 => {
            (None, "text/plain; charset=utf-8", format!("{pod}\n"))
        }
        Listener::FileServer { .. } => (
            None,
            "text/plain; charset=utf-8",
            "404 page not found\n".to_owned(),
        ),
        Listener::AgnhostLiveness { started } => {
            let up = started.and_then(|s| s.elapsed().ok()).unwrap_or_default();
            let body = match code {
                200 => "ok".to_owned(),
                500 => format!("error: {:.6}", up.as_secs_f64()),
                _ => "404 page not found\n".to_owned(),
            };
            (None, "text/plain; charset=utf-8", body)
        }
        Listener::AgnhostWebhook { .. } => {
            let body = if code == 200 {
                "ok"
            } else {
                "404 page not found\n"
            };
            (None, "text/plain; charset=utf-8", body.to_owned())
        }
        Listener::SampleApiserver { .. } => {
            let body = if code == 200 { "ok" } else { "forbidden\n" };
            (None, "text/plain; charset=utf-8", body.to_owned())
        }
        Listener::MtlsServer { .. } => (
            None,
            "text/plain; charset=utf-8",
            "Client sent an HTTP request to an HTTPS server.\n".to_owned(),
        ),
        Listener::Porter { .. } => {
            let (content_type, body) = porter_body(l, "GET");
            let content_type: &'static str = if content_type.starts_with("application/json") {
                "application/json"
            } else if content_type.starts_with("text/html") {
                "text/html; charset=utf-8"
            } else {
                "text/plain; charset=utf-8"
            };
            (None, content_type, body)
        }
    };
    let nginx_ok = matches!(l, Listener::Nginx(_)) && code == 200;
    http_message(
        code,
        reason,
        server.as_deref(),
        content_type,
        &body,
        keep_alive,
        head_only,
        nginx_ok,
    )
}

/// An HTTP/1.1 response message (`ranges`: nginx's Accept-Ranges header).
#[allow(clippy::too_many_arguments)]
fn http_message(
    code: u16,
    reason: &str,
    server: Option<&str>,
    content_type: &str,
    body: &str,
    keep_alive: bool,
    head_only: bool,
    ranges: bool,
) -> Vec<u8> {
    let mut r = format!("HTTP/1.1 {code} {reason}\r\n");
    if let Some(s) = server {
        r.push_str(&format!("Server: {s}\r\n"));
    }
    r.push_str(&format!("Date: {}\r\n", http_date(SystemTime::now())));
    r.push_str(&format!("Content-Type: {content_type}\r\n"));
    r.push_str(&format!("Content-Length: {}\r\n", body.len()));
    r.push_str(if keep_alive {
        "Connection: keep-alive\r\n"
    } else {
        "Connection: close\r\n"
    });
    if ranges {
        r.push_str("Accept-Ranges: bytes\r\n");
    }
    r.push_str("\r\n");
    let mut out = r.into_bytes();
    if !head_only {
        out.extend_from_slice(body.as_bytes());
    }
    out
}

/// RFC 7231's IMF-fixdate, e.g. `Thu, 03 Dec 2026 09:49:13 GMT`.
fn http_date(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let days = (secs / 86400) as i64;
    let rem = secs % 86400;
    let weekday = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"][(days % 7) as usize];
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let months = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    format!(
        "{weekday}, {day:02} {} {year} {:02}:{:02}:{:02} GMT",
        months[(month - 1) as usize],
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn listeners() {
        let pod = serde_json::json!({
            "metadata": {"name": "web"},
            "spec": {"containers": [
                {"name": "nginx", "image": "nginx:1.27-alpine"},
                {"name": "app", "image": "busybox", "ports": [{"containerPort": 8080}]},
                {"name": "idle", "image": "busybox", "ports": [{"containerPort": 9090}]},
            ]},
            "status": {"containerStatuses": [
                {"name": "nginx", "state": {"running": {}}},
                {"name": "app", "state": {"running": {}}},
                {"name": "idle", "state": {"waiting": {"reason": "CrashLoopBackOff"}}},
            ]},
        });
        assert_eq!(
            listener(&pod, 80),
            Some(Listener::Nginx(Some("1.27".into())))
        );
        // busybox declares 8080 but nothing of its image serves there.
        assert_eq!(listener(&pod, 8080), None);
        assert_eq!(listener(&pod, 9090), None);
        let httpd = serde_json::json!({
            "metadata": {"name": "web"},
            "spec": {"containers": [{"name": "h", "image": "registry.k8s.io/e2e-test-images/httpd:2.4.38-4"}]},
            "status": {"containerStatuses": [{"name": "h", "state": {"running": {}}}]},
        });
        assert!(
            matches!(listener(&httpd, 80), Some(Listener::Page { body, .. }) if body.contains("It works!"))
        );
        assert_eq!(listener(&httpd, 8080), None);
        assert_eq!(listener(&pod, 81), None);
        // agnhost named as the command, as the e2e service jig runs serve-hostname.
        let hostnames = serde_json::json!({
            "metadata": {"name": "hn-1"},
            "spec": {"containers": [{"name": "c",
                "image": "registry.k8s.io/e2e-test-images/agnhost:2.55",
                "command": ["/agnhost", "serve-hostname"]}]},
            "status": {"containerStatuses": [{"name": "c", "state": {"running": {}}}]},
        });
        assert_eq!(
            listener(&hostnames, 9376),
            Some(Listener::Hostname("hn-1".into()))
        );
    }

    #[test]
    fn agnhost_servers_answer_as_agnhost() {
        let agnhost = "registry.k8s.io/e2e-test-images/agnhost:2.56";
        let pod = serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [
                {"name": "live", "image": agnhost, "args": ["liveness"]},
                {"name": "web", "image": agnhost, "args": ["test-webserver", "--port=8081"]},
            ]},
        });
        let l = declared_listener(&pod, 8080).expect("liveness on 8080");
        assert_eq!(l, Listener::AgnhostLiveness { started: None });
        let files = declared_listener(&pod, 8081).expect("test-webserver on 8081");
        assert_eq!(
            files,
            Listener::FileServer {
                pod: "p".into(),
                container: String::new(),
                found: None
            }
        );
        let gone = Listener::FileServer {
            pod: "p".into(),
            container: "c1".into(),
            found: Some(false),
        };
        assert_eq!(status(&gone, "GET", "/localhost.crt", "HTTP/1.1").0, 404);
        assert_eq!(status(&files, "GET", "/localhost.crt", "HTTP/1.1").0, 200);
        assert_eq!(declared_listener(&pod, 80), None);
        // Healthy for its first 10 s, then 500; other paths are not found.
        let young = Listener::AgnhostLiveness {
            started: Some(SystemTime::now()),
        };
        assert_eq!(status(&young, "GET", "/healthz", "HTTP/1.1").0, 200);
        assert_eq!(status(&young, "GET", "/", "HTTP/1.1").0, 404);
        let old = Listener::AgnhostLiveness {
            started: SystemTime::now().checked_sub(std::time::Duration::from_secs(11)),
        };
        assert_eq!(status(&old, "GET", "/healthz", "HTTP/1.1").0, 500);
        // The start time comes from the container's status when it is there.
        let mut running = pod.clone();
        running["status"] = serde_json::json!({"containerStatuses": [
            {"name": "live", "state": {"running": {"startedAt": "2020-01-01T00:00:00Z"}}},
        ]});
        let l = listener(&running, 8080).expect("running");
        assert_eq!(status(&l, "GET", "/healthz", "HTTP/1.1").0, 500);
    }

    #[test]
    fn porter_serves_its_environment() {
        let agnhost = "registry.k8s.io/e2e-test-images/agnhost:2.55";
        let pod = serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "image": agnhost, "command": ["/agnhost", "porter"],
                "env": [{"name": "SERVE_PORT_80", "value": "<a href=\"/rewriteme\">test</a>"},
                        {"name": "SERVE_PORT_160", "value": "foo"},
                        {"name": "SERVE_TLS_PORT_460", "value": "tls baz"}]}]},
            "status": {"containerStatuses": [{"name": "c", "containerID": "sim://abc", "state": {"running": {}}}]}
        });
        let text = |port: u16, method: &str| {
            let l = listener(&pod, port).expect("porter listens");
            String::from_utf8_lossy(&answer(None, &l, method, "/", false)).into_owned()
        };
        let html = text(80, "GET");
        assert!(
            html.contains("Content-Type: text/html; charset=utf-8\r\n"),
            "{html}"
        );
        assert!(
            html.ends_with("\r\n\r\n<a href=\"/rewriteme\">test</a>"),
            "{html}"
        );
        let foo = text(160, "GET");
        assert!(
            foo.contains("text/plain") && foo.ends_with("\r\n\r\nfoo"),
            "{foo}"
        );
        assert_eq!(
            listener(&pod, 460),
            Some(Listener::Porter {
                body: "tls baz".into(),
                json: false,
                tls: Some("abc".into())
            })
        );
        assert_eq!(listener(&pod, 161), None);
        // The update-demo images serve their files with test-webserver by default.
        let nautilus = serde_json::json!({
            "metadata": {"name": "n"},
            "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/e2e-test-images/nautilus:1.8"}]},
            "status": {"containerStatuses": [{"name": "c", "containerID": "sim://n1", "state": {"running": {}}}]}
        });
        assert!(matches!(
            listener(&nautilus, 80),
            Some(Listener::FileServer { .. })
        ));
        let mut json_pod = pod.clone();
        json_pod["spec"]["containers"][0]["command"] =
            serde_json::json!(["/agnhost", "porter", "--json-response"]);
        let l = listener(&json_pod, 160).expect("porter");
        assert_eq!(
            porter_body(&l, "PATCH"),
            (
                "application/json".into(),
                r#"{"Body":"foo","Method":"PATCH"}"#.into()
            )
        );
    }

    #[test]
    fn dates() {
        let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_796_291_353);
        assert_eq!(http_date(t), "Thu, 03 Dec 2026 09:49:13 GMT");
    }

    #[test]
    fn agnhost_flags_take_either_form() {
        // What the e2e service tests run: `netexec --http-port 100` (cobra takes both
        // `--flag value` and `--flag=value`).
        for args in [
            json!(["netexec", "--http-port", "100"]),
            json!(["netexec", "--http-port=100"]),
        ] {
            let pod = json!({
                "metadata": {"name": "pod1"},
                "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/e2e-test-images/agnhost:2.55",
                    "args": args, "ports": [{"containerPort": 100}]}]},
                "status": {"containerStatuses": [{"name": "c", "state": {"running": {}}}]},
            });
            assert!(
                matches!(listener(&pod, 100), Some(Listener::Netexec { .. })),
                "{args}"
            );
            assert_eq!(listener(&pod, 8080), None, "{args}");
        }
    }
}
