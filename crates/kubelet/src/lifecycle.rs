//! Container lifecycle hooks (`lifecycle.postStart` / `preStop`), as the kubelet's
//! handler runner runs them: `exec` runs the command in the container, `httpGet` sends a
//! GET to the handler's host (the pod's IP by default) and port through the pod network.
//! The result is only whether it worked: the kubelet's events do not carry the message
//! (so that secrets do not leak), and neither does this.
//!
//! Running a hook takes no real time here: its result comes at once, with how long the
//! hook takes (an exec's simulated sleeps, a `sleep` handler's seconds), which the
//! kubelet waits out where upstream's would block (a preStop hook before the container is
//! told to stop).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use serde_json::Value;

use kumo_cri::{DialError, ExecStep, PodNetwork, Runtime};

/// Runs hook `handler` of container `spec` (runtime id `id`) of `pod`, whose IP is
/// `pod_ip`: how long it takes, or upstream's message of the failure.
pub(crate) fn run(
    runtime: &dyn Runtime,
    network: &dyn PodNetwork,
    pod: &Value,
    spec: &Value,
    id: &str,
    pod_ip: &str,
    handler: &Value,
) -> Result<Duration, String> {
    let container = spec["name"].as_str().unwrap_or_default();
    let pod_ref = format!(
        "{}_{}({})",
        pod.pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default(),
        pod.pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or_default(),
        pod.pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or_default(),
    );
    if let Some(cmd) = handler.pointer("/exec/command").and_then(Value::as_array) {
        let cmd: Vec<String> = cmd
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect();
        let steps = runtime.exec(id, &cmd, None).map_err(|e| e.to_string());
        let mut took = Duration::ZERO;
        let (code, output) = match &steps {
            Ok(steps) => steps
                .iter()
                .fold((0, String::new()), |(code, mut out), s| match s {
                    ExecStep::Out(_, text) => {
                        out.push_str(text);
                        (code, out)
                    }
                    ExecStep::Sleep(d) => {
                        took += *d;
                        (code, out)
                    }
                    ExecStep::Exit(c) => (*c, out),
                    // A hook that never ends runs until the grace period does.
                    ExecStep::Forever => {
                        took = Duration::MAX;
                        (code, out)
                    }
                }),
            Err(e) => (-1, e.clone()),
        };
        if code == 0 {
            return Ok(took);
        }
        return Err(format!(
            "Exec lifecycle hook ({cmd:?}) for Container {container:?} in Pod {pod_ref:?} failed - error: command '{}' exited with {code}: {output}, message: {output:?}",
            cmd.join(" ")
        ));
    }
    if let Some(get) = handler.get("httpGet") {
        let path = get["path"].as_str().unwrap_or("/");
        let path = if path.starts_with('/') {
            path.to_owned()
        } else {
            format!("/{path}")
        };
        return http_get(network, pod, spec, pod_ip, get, &path).map(|()| Duration::ZERO).map_err(|e| {
            format!("HTTP lifecycle hook ({path}) for Container {container:?} in Pod {pod_ref:?} failed - error: {e}")
        });
    }
    if let Some(sleep) = handler.get("sleep") {
        let seconds = sleep.get("seconds").and_then(Value::as_u64).unwrap_or(0);
        return Ok(Duration::from_secs(seconds));
    }
    Err(format!("Cannot run handler: invalid handler: {handler}"))
}

/// The handler's GET: an error only when nothing answers (any status is an answer).
fn http_get(
    network: &dyn PodNetwork,
    pod: &Value,
    spec: &Value,
    pod_ip: &str,
    get: &Value,
    path: &str,
) -> Result<(), String> {
    let host = get["host"]
        .as_str()
        .filter(|h| !h.is_empty())
        .unwrap_or(pod_ip);
    let port = match &get["port"] {
        Value::Number(n) => n.as_u64().and_then(|p| u16::try_from(p).ok()),
        Value::String(name) => spec["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["name"] == name.as_str())
            .and_then(|p| p["containerPort"].as_u64())
            .and_then(|p| u16::try_from(p).ok())
            .or_else(|| name.parse().ok()),
        _ => None,
    }
    .ok_or_else(|| format!("invalid port {}", get["port"]))?;
    let ip: IpAddr = host
        .parse()
        .map_err(|_| format!("dial tcp: lookup {host}: no such host"))?;
    let addr = SocketAddr::new(ip, port);
    let answered = if host == pod_ip {
        network.get_pod(pod, port, path, true)
    } else {
        network.get(addr, path, true)
    };
    match answered {
        Ok(_) => Ok(()),
        Err(DialError::Refused | DialError::Unreachable) => Err(format!(
            "Get \"http://{addr}{path}\": dial tcp {addr}: connect: connection refused"
        )),
    }
}
