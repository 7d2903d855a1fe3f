//! agnhost `netexec`'s HTTP server as the sim runs it: the handlers the e2e tests use
//! (`/`, `/echo`, `/hostname`, `/hostName`, `/healthz`, `/readyz`, `/dial` over HTTP),
//! each logging its request to the container's stdout as netexec does
//! (`2006/01/02 15:04:05 GET /echo?msg=...&code=`), which is how the lifecycle-hook tests
//! see that a hook reached it. `/dial` makes its requests through the simulated pod
//! network and answers `{"responses":[...],"errors":[...]}`.

use std::net::{IpAddr, SocketAddr};
use std::time::SystemTime;

use crate::net::{ConnectError, Dataplane};
use crate::sample_apiserver::query_param;
use crate::servers::{self, Listener};

/// One answer: status code and reason, content type and body.
pub(crate) struct Answer {
    pub code: u16,
    pub reason: &'static str,
    pub content_type: &'static str,
    pub body: String,
}

pub(crate) fn ok(body: String) -> Answer {
    Answer {
        code: 200,
        reason: "OK",
        content_type: "text/plain; charset=utf-8",
        body,
    }
}

fn reason(code: u16) -> &'static str {
    match code {
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        400 => "Bad Request",
        404 => "Not Found",
        417 => "Expectation Failed",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "",
    }
}

/// Go's `log` prefix: local (here UTC) date and time.
fn log_line(text: &str) -> String {
    let secs = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default();
    let ts = k8s_openapi::jiff::Timestamp::from_second(secs).unwrap_or_default();
    format!("{} {text}\n", ts.strftime("%Y/%m/%d %H:%M:%S"))
}

/// netexec in container `container` of pod `pod` answering `path` (with its query).
pub(crate) fn answer(dp: Option<&Dataplane>, pod: &str, container: &str, path: &str) -> Answer {
    let (route, query) = path.split_once('?').unwrap_or((path, ""));
    let q = |k: &str| query_param(query, k).unwrap_or_default();
    let log = |text: String| {
        if let Some(dp) = dp {
            dp.write_log(container, &log_line(&text));
        }
    };
    match route {
        "/" => {
            log("GET /".into());
            ok(format!("NOW: {}", k8s_openapi::jiff::Timestamp::now()))
        }
        "/echo" => {
            let (msg, code) = (q("msg"), q("code"));
            log(format!("GET /echo?msg={msg}&code={code}"));
            if code.is_empty() {
                return ok(msg);
            }
            match code.parse::<u16>() {
                Ok(c) => Answer {
                    code: c,
                    reason: reason(c),
                    ..ok(msg)
                },
                Err(_) => ok(format!(
                    "argument 'code' must be an integer or empty, got {code:?}\n"
                )),
            }
        }
        "/hostname" | "/hostName" => {
            log(format!("GET {route}"));
            ok(pod.to_owned())
        }
        "/healthz" | "/readyz" => {
            log(format!("GET {route}"));
            ok(String::new())
        }
        "/dial" => dial(dp, &q, &log),
        _ => Answer {
            code: 404,
            reason: "Not Found",
            ..ok("404 page not found\n".to_owned())
        },
    }
}

/// `/dial?host=&port=&request=&protocol=&tries=`: HTTP GETs of `request` at host:port.
fn dial(dp: Option<&Dataplane>, q: &dyn Fn(&str) -> String, log: &dyn Fn(String)) -> Answer {
    let (host, port, request, protocol, tries) = (
        q("host"),
        q("port"),
        q("request"),
        q("protocol"),
        q("tries"),
    );
    log(format!(
        "GET /dial?host={host}&protocol={protocol}&port={port}&request={request}&tries={tries}"
    ));
    let bad = |body: String| Answer {
        code: 400,
        reason: "Bad Request",
        ..ok(format!("{body}\n"))
    };
    let tries = if tries.is_empty() {
        1
    } else {
        match tries.parse::<usize>() {
            Ok(n) => n,
            Err(e) => return bad(format!("tries parameter is invalid. {e}")),
        }
    };
    if request.is_empty() {
        return bad("request parameter not specified. <nil>".into());
    }
    let udp = match protocol.to_ascii_lowercase().as_str() {
        "" | "http" => false,
        "udp" => true,
        _ => return bad(format!("unsupported protocol. {protocol}")),
    };
    let addr = match (host.parse::<IpAddr>(), port.parse::<u16>()) {
        (Ok(ip), Ok(p)) => SocketAddr::new(ip, p),
        _ => {
            return bad(format!(
                "host and/or port param are invalid. address {host}:{port}"
            ))
        }
    };
    let url = format!("http://{addr}/{request}");
    let (mut responses, mut errors) = (Vec::new(), Vec::new());
    let mut last = String::new();
    for _ in 0..tries {
        let answer = if udp {
            udp_exchange(dp, addr, &request)
        } else {
            get(dp, addr, &format!("/{request}"))
                .map_err(|e| format!("Get \"{url}\": dial tcp {addr}: {e}"))
        };
        match answer {
            Ok(body) => {
                last.clone_from(&body);
                responses.push(body);
            }
            Err(e) => {
                last.clear();
                errors.push(e);
            }
        }
    }
    let mut out = serde_json::Map::new();
    if !last.is_empty() {
        out.insert("responses".into(), responses.into());
    }
    if !errors.is_empty() {
        out.insert("errors".into(), errors.into());
    }
    ok(serde_json::Value::Object(out).to_string())
}

/// agnhost's UDP exchange: `request` as one datagram, the reply within 5 seconds.
fn udp_exchange(dp: Option<&Dataplane>, addr: SocketAddr, request: &str) -> Result<String, String> {
    let local = "0.0.0.0:40000";
    let dp =
        dp.ok_or_else(|| "udp dial failed. err:dial udp: network is unreachable".to_owned())?;
    let from: SocketAddr = local.parse().unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)));
    dp.send_udp(addr, from, request).map_err(|e| {
        let why = match e {
            ConnectError::Refused => "connect: connection refused",
            ConnectError::Unreachable => "i/o timeout",
        };
        format!("reading from udp connection failed. err:'read udp {local}->{addr}: {why}'")
    })
}

/// The body of an HTTP GET of `path` at `addr` through the pod network.
pub(crate) fn get(
    dp: Option<&Dataplane>,
    addr: SocketAddr,
    path: &str,
) -> Result<String, &'static str> {
    let dp = dp.ok_or("connect: network is unreachable")?;
    let (_, listener) = dp.connect(addr).map_err(|e| match e {
        ConnectError::Refused => "connect: connection refused",
        ConnectError::Unreachable => "i/o timeout",
    })?;
    Ok(http_body(Some(dp), &listener, "GET", path))
}

/// The body `listener` answers `method path` with.
pub(crate) fn http_body(dp: Option<&Dataplane>, l: &Listener, method: &str, path: &str) -> String {
    let raw = servers::answer(dp, l, method, path, true);
    let text = String::from_utf8_lossy(&raw).into_owned();
    match text.find("\r\n\r\n") {
        Some(i) => text[i + 4..].to_owned(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{ContainerConfig, Runtime, Sim};
    use std::sync::Arc;

    #[test]
    fn dial_reaches_another_netexec_which_logs_the_request() {
        let dp = Arc::new(Dataplane::default());
        let sim: Arc<dyn Runtime> = Arc::new(Sim::with_dataplane(Some(dp.clone())));
        dp.add_runtime(Arc::downgrade(&sim));
        let sb = sim
            .run_pod_sandbox(&kumo_cri::SandboxConfig {
                uid: "u1".into(),
                ..Default::default()
            })
            .unwrap();
        let image = "registry.k8s.io/e2e-test-images/agnhost:2.55";
        let id = sim
            .create_container(
                &sb,
                &ContainerConfig {
                    name: "c".into(),
                    image: image.into(),
                    args: vec!["netexec".into()],
                    ..Default::default()
                },
                image,
            )
            .unwrap();
        sim.start_container(&id).expect("start");
        let ip: IpAddr = [10, 244, 0, 9].into();
        dp.set_pod(
            "u1",
            ip,
            serde_json::json!({
                "metadata": {"name": "target"},
                "spec": {"containers": [{"name": "c", "image": image, "args": ["netexec"]}]},
                "status": {"containerStatuses": [{"name": "c", "containerID": format!("sim://{id}"),
                    "state": {"running": {}}}]},
            }),
        );
        let a = answer(
            Some(&dp),
            "client",
            "",
            "/dial?host=10.244.0.9&port=8080&request=echo%3Fmsg%3Dpoststart&tries=2",
        );
        assert_eq!(
            (a.code, a.body.as_str()),
            (200, r#"{"responses":["poststart","poststart"]}"#)
        );
        let logs = sim.read_logs(&id).expect("logs");
        assert_eq!(
            logs.matches("GET /echo?msg=poststart&code=").count(),
            2,
            "{logs}"
        );
        let a = answer(
            Some(&dp),
            "client",
            "",
            "/dial?host=10.244.0.8&port=8080&request=hostname",
        );
        assert!(
            a.body.starts_with(
                r#"{"errors":["Get \"http://10.244.0.8:8080/hostname\": dial tcp 10.244.0.8:8080: "#
            ),
            "{}",
            a.body
        );
        // UDP: netexec's UDP server on 8081 answers `hostname`; another port refuses.
        let a = answer(
            Some(&dp),
            "client",
            "",
            "/dial?host=10.244.0.9&port=8081&request=hostname&protocol=udp&tries=1",
        );
        assert_eq!(a.body, r#"{"responses":["target"]}"#);
        let a = answer(
            Some(&dp),
            "client",
            "",
            "/dial?host=10.244.0.9&port=8082&request=hostname&protocol=udp&tries=1",
        );
        assert!(
            a.body.contains("reading from udp connection failed")
                && a.body.contains("connection refused"),
            "{}",
            a.body
        );
        let a = answer(Some(&dp), "client", "", "/echo?msg=x&code=503");
        assert_eq!((a.code, a.body.as_str()), (503, "x"));
        assert_eq!(answer(None, "client", "", "/hostname").body, "client");
        assert_eq!(answer(None, "client", "", "/nope").code, 404);
    }
}
