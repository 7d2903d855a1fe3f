//! agnhost's `mtlsclient` in the sim shell: every 10 s it reads its trust and credential
//! bundles, connects to `--fetch-url` through the cluster's dataplane and, when agnhost's
//! `mtlsserver` listens there, makes the exchange of [`crate::mtls::fetch`] with that
//! container's files. It logs as the real client: Go's `log` line for an answer, a klog
//! error line for a failure.

use std::net::SocketAddr;
use std::time::Duration;

use super::{Flow, Io, Sh, HORIZON, R};
use crate::mtls::{self, Party};
use crate::net::ConnectError;
use crate::servers::Listener;

/// How often the client polls (its `time.Tick`).
const POLL: Duration = Duration::from_secs(10);
/// Go's default dialer timeout, for an address nobody has.
const DIAL_TIMEOUT: Duration = Duration::from_secs(30);

impl Sh<'_> {
    pub(super) fn mtlsclient(&mut self, flag: impl Fn(&str) -> Option<String>, io: &Io) -> R {
        let (Some(url), Some(trust), Some(cred)) = (
            flag("--fetch-url").filter(|v| !v.is_empty()),
            flag("--server-trust-bundle").filter(|v| !v.is_empty()),
            flag("--client-cred-bundle").filter(|v| !v.is_empty()),
        ) else {
            self.err(io, "Error: missing required flags\n");
            return Ok(1);
        };
        let Some(target) = url.strip_prefix("https://").or(url.strip_prefix("http://")) else {
            let msg =
                format!("Error: invalid --fetch-url: parse {url:?}: invalid URI for request\n");
            self.err(io, &msg);
            return Ok(1);
        };
        let (authority, path) = match target.find('/') {
            Some(i) => (&target[..i], &target[i..]),
            None => (target, "/"),
        };
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_owned(), p.parse().unwrap_or(443)),
            None => (authority.to_owned(), 443u16),
        };
        let path = path.to_owned();
        loop {
            self.tick()?;
            self.now += POLL;
            if self.now > HORIZON {
                return Err(Flow::Forever);
            }
            self.observe(io, |sh, io| {
                match sh.mtls_poll(&host, port, &path, &trust, &cred) {
                    Ok(body) => sh.err(io, &go_log(sh.at(), &format!("Got response body: {body}"))),
                    Err(e) => sh.err(
                        io,
                        &klog_error(
                            sh.at(),
                            "client.go:71",
                            &format!("while sending requests to the server: {e}"),
                        ),
                    ),
                }
                Ok(0)
            })?;
        }
    }

    /// One poll: the body of a 2xx answer, or the client's error text.
    fn mtls_poll(
        &mut self,
        host: &str,
        port: u16,
        path: &str,
        trust: &str,
        cred: &str,
    ) -> Result<String, String> {
        let read = |sh: &Self, p: &str, what: &str| {
            sh.read_file(p)
                .map_err(|_| format!("while reading {what}: open {p}: no such file or directory"))
        };
        let client = Party {
            trust_bundle: read(self, trust, "service trust bundle")?,
            cred_bundle: read(self, cred, "client credential bundle")?,
        };
        let url = format!(
            "https://{host}{}{path}",
            if port == 443 {
                String::new()
            } else {
                format!(":{port}")
            }
        );
        let get = |e: String| format!("while getting URL: Get \"{url}\": {e}");
        let Some(ip) = self.resolve_name(host).and_then(|ips| ips.first().copied()) else {
            return Err(get(format!("dial tcp: lookup {host}: no such host")));
        };
        let to = SocketAddr::new(ip, port);
        let Some(dp) = self.ctx.net.clone() else {
            return Err(get(format!(
                "dial tcp {to}: connect: network is unreachable"
            )));
        };
        let listener = match dp.connect_from(self.ctx.pod_ip.parse().ok(), to) {
            Ok((_, l)) => l,
            Err(ConnectError::Refused) => {
                return Err(get(format!("dial tcp {to}: connect: connection refused")))
            }
            Err(ConnectError::Unreachable) => {
                self.now += DIAL_TIMEOUT;
                return Err(get(format!("dial tcp {to}: i/o timeout")));
            }
        };
        let Listener::MtlsServer {
            container,
            creds_file,
            trust_file,
        } = listener
        else {
            // Whatever else listens speaks plain HTTP.
            return Err(get(
                "tls: first record does not look like a TLS handshake".into()
            ));
        };
        let server = Party {
            cred_bundle: dp.read_file(&container, &creds_file).unwrap_or_default(),
            trust_bundle: dp.read_file(&container, &trust_file).unwrap_or_default(),
        };
        let (status, body) = mtls::fetch(&client, &server, host, path).map_err(get)?;
        if !(200..300).contains(&status) {
            return Err(format!(
                "non-2xx status {status} \"{status} {}\"",
                mtls::reason(status)
            ));
        }
        Ok(body)
    }
}

/// A line of Go's standard logger at `at`.
fn go_log(at: std::time::SystemTime, text: &str) -> String {
    let ts = timestamp(at);
    format!("{} {text}\n", ts.strftime("%Y/%m/%d %H:%M:%S"))
}

/// A klog error line at `at` from `file:line` (PID 1, as a container's first process).
fn klog_error(at: std::time::SystemTime, source: &str, text: &str) -> String {
    let ts = timestamp(at);
    format!(
        "E{}       1 {source}] {text}\n",
        ts.strftime("%m%d %H:%M:%S%.6f")
    )
}

fn timestamp(at: std::time::SystemTime) -> k8s_openapi::jiff::Timestamp {
    let d = at
        .duration_since(std::time::SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    k8s_openapi::jiff::Timestamp::new(d.as_secs() as i64, d.subsec_nanos() as i32)
        .unwrap_or_default()
}
