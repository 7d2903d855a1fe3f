//! Live exec and attach through the runtime's streaming server: the CRI's Exec and Attach
//! answer with a URL, which speaks the remotecommand protocol over WebSocket
//! (`v4.channel.k8s.io`: one byte of channel, then data; 0 stdin, 1 stdout, 2 stderr, 3 the
//! final Status, 4 terminal sizes). The server listens in the node's network namespace, so
//! the connection is opened from there.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use kumo_cri::{LiveStream, RuntimeError, Stream};
use serde_json::Value;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

/// The subprotocol spoken to the streaming server.
const PROTOCOL: &str = "v4.channel.k8s.io";

/// The exit code a final Status gives: 0 for Success, the `ExitCode` cause of a
/// NonZeroExitCode failure; an error for anything else.
pub fn exit_code(status: &Value) -> Result<i32, String> {
    if status["status"] == "Success" {
        return Ok(0);
    }
    if status["reason"] == "NonZeroExitCode" {
        let code = status["details"]["causes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["reason"] == "ExitCode")
            .and_then(|c| c["message"].as_str())
            .and_then(|m| m.parse().ok());
        if let Some(code) = code {
            return Ok(code);
        }
    }
    Err(status["message"]
        .as_str()
        .unwrap_or("the stream ended with an error")
        .to_owned())
}

/// Connects to `url` (from `netns`) and carries its streams.
pub async fn connect(
    url: String,
    netns: Option<std::path::PathBuf>,
) -> Result<LiveStream, RuntimeError> {
    let fail = |what: &str, e: &dyn std::fmt::Display| {
        RuntimeError::Exec(format!(
            "{what} the runtime's streaming server at {url}: {e}"
        ))
    };
    let uri: http::Uri = url.parse().map_err(|e| fail("parsing", &e))?;
    let host = uri.host().unwrap_or("127.0.0.1").to_owned();
    let port = uri.port_u16().unwrap_or(80);
    let addr: std::net::SocketAddr = format!("{host}:{port}")
        .parse()
        .map_err(|e| fail("reaching", &e))?;
    let stream = tokio::task::spawn_blocking(move || {
        crate::netns::connect(netns.as_deref(), addr, Duration::from_secs(5))
    })
    .await
    .map_err(|e| fail("reaching", &e))?
    .map_err(|e| fail("reaching", &e))?;
    stream
        .set_nonblocking(true)
        .map_err(|e| fail("reaching", &e))?;
    let stream = tokio::net::TcpStream::from_std(stream).map_err(|e| fail("reaching", &e))?;
    let ws_url = url.replacen("http://", "ws://", 1);
    let mut request = ws_url
        .as_str()
        .into_client_request()
        .map_err(|e| fail("addressing", &e))?;
    request.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        http::HeaderValue::from_static(PROTOCOL),
    );
    let (ws, _) = tokio_tungstenite::client_async(request, stream)
        .await
        .map_err(|e| fail("upgrading to", &e))?;
    let (mut sink, mut source) = ws.split();
    let (stdin_tx, mut stdin_rx) = tokio::sync::mpsc::channel::<Vec<u8>>(16);
    let (resize_tx, mut resize_rx) = tokio::sync::mpsc::channel::<(u16, u16)>(4);
    let (out_tx, out_rx) = tokio::sync::mpsc::channel(64);
    let (exit_tx, exit_rx) = tokio::sync::oneshot::channel();
    // Client to server: stdin and sizes, until both senders are gone or the stream ends.
    let writer = tokio::spawn(async move {
        let (mut stdin_open, mut resize_open) = (true, true);
        while stdin_open || resize_open {
            let msg = tokio::select! {
                data = stdin_rx.recv(), if stdin_open => match data {
                    Some(d) => {
                        let mut m = Vec::with_capacity(d.len() + 1);
                        m.push(0u8);
                        m.extend_from_slice(&d);
                        m
                    }
                    None => {
                        stdin_open = false;
                        continue;
                    }
                },
                size = resize_rx.recv(), if resize_open => match size {
                    Some((w, h)) => {
                        let mut m = vec![4u8];
                        m.extend_from_slice(
                            serde_json::json!({"Width": w, "Height": h}).to_string().as_bytes(),
                        );
                        m
                    }
                    None => {
                        resize_open = false;
                        continue;
                    }
                },
            };
            if sink.send(Message::binary(msg)).await.is_err() {
                return;
            }
        }
        // Kept open: closing would end the output too (v4 has no half-close of stdin).
        std::future::pending::<()>().await;
    });
    // Server to client: output, then the Status.
    tokio::spawn(async move {
        let mut status: Option<Value> = None;
        while let Some(msg) = source.next().await {
            let data = match msg {
                Ok(Message::Binary(b)) => b.to_vec(),
                Ok(Message::Text(t)) => t.as_bytes().to_vec(),
                Ok(Message::Close(_)) | Err(_) => break,
                Ok(_) => continue,
            };
            let Some((&channel, rest)) = data.split_first() else {
                continue;
            };
            match channel {
                1 | 2 if !rest.is_empty() => {
                    let s = if channel == 1 {
                        Stream::Stdout
                    } else {
                        Stream::Stderr
                    };
                    if out_tx.send((s, rest.to_vec())).await.is_err() {
                        break;
                    }
                }
                3 if !rest.is_empty() => {
                    status = serde_json::from_slice(rest).ok().or_else(|| {
                        Some(serde_json::json!({
                            "status": "Failure",
                            "message": String::from_utf8_lossy(rest),
                        }))
                    });
                }
                _ => {}
            }
        }
        writer.abort();
        drop(out_tx);
        let result = match status {
            Some(s) => exit_code(&s),
            // v4 sends a Status at the end even on success; a stream that ends without
            // one was cut.
            None => Err("the runtime's stream ended without a status".into()),
        };
        let _ = exit_tx.send(result);
    });
    Ok(LiveStream {
        stdin: Some(stdin_tx),
        resize: Some(resize_tx),
        output: out_rx,
        exit: exit_rx,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_final_status_gives_the_exit_code() {
        assert_eq!(exit_code(&json!({"status": "Success"})), Ok(0));
        let failed = json!({"status": "Failure", "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": "3"}]}});
        assert_eq!(exit_code(&failed), Ok(3));
        let broken = json!({"status": "Failure", "message": "container not running"});
        assert_eq!(exit_code(&broken), Err("container not running".into()));
    }
}
