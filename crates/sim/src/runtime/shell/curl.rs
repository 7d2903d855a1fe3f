//! `curl` (as curl 8.11 behaves) and busybox's `wget` in the sim shell: names resolve as
//! the pod's resolver does (`/etc/hosts`, then the cluster DNS with the search list of
//! `/etc/resolv.conf`), connections go through the cluster's [`Dataplane`] (Service rules
//! to a ready endpoint, then whatever listens there), and the answer is the listening
//! container's (see [`crate::servers`]). Failures give curl's exit codes and
//! messages: 6 (could not resolve), 7 (could not connect), 28 (timeout).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use super::{Io, Sh, Step, R};
use crate::net::{ConnectError, Dataplane};
use crate::servers::{self, Listener};

/// curl's version, as its User-Agent says.
const CURL_VERSION: &str = "8.11.0";
/// curl's default connect timeout.
const CURL_CONNECT_TIMEOUT: Duration = Duration::from_secs(300);
/// busybox wget's default network timeout.
const WGET_TIMEOUT: Duration = Duration::from_secs(900);
/// How long a round trip inside the cluster takes in simulated time: nothing (so a
/// one-shot `curl` has exited by the kubelet's first status report, as a real one has
/// by the kubelet's next relist).
const RTT: Duration = Duration::ZERO;

/// A parsed URL.
struct Url {
    scheme: String,
    host: String,
    port: u16,
    /// Path and query (`/` at least).
    path: String,
    /// The URL as written back (`url_effective`).
    full: String,
}

/// Parses `s` as curl does (scheme optional, http by default).
fn parse_url(s: &str) -> Result<Url, (i32, String)> {
    let (scheme, rest) = match s.split_once("://") {
        Some((sch, rest)) => (sch.to_ascii_lowercase(), rest),
        None => ("http".to_owned(), s),
    };
    let default_port = match scheme.as_str() {
        "http" => 80,
        "https" => 443,
        other => return Err((1, format!("Protocol \"{other}\" not supported"))),
    };
    let (authority, path) = match rest.find(['/', '?', '#']) {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let authority = authority.rsplit('@').next().unwrap_or(authority);
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        match v6.split_once(']') {
            Some((h, p)) => (h.to_owned(), p.strip_prefix(':').unwrap_or("")),
            None => return Err((3, "URL rejected: Bad IPv6 address".into())),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_owned(), p),
            None => (authority.to_owned(), ""),
        }
    };
    if host.is_empty() {
        return Err((3, "URL rejected: No host part in the URL".into()));
    }
    let port = if port.is_empty() {
        default_port
    } else {
        port.parse::<u16>().map_err(|_| {
            (
                3,
                "URL rejected: Port number was not a decimal number between 0 and 65535".to_owned(),
            )
        })?
    };
    let path = path.split('#').next().unwrap_or("");
    let path = if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("/{path}")
    };
    let shown_host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.clone()
    };
    let shown_port = if port == default_port {
        String::new()
    } else {
        format!(":{port}")
    };
    Ok(Url {
        full: format!("{scheme}://{shown_host}{shown_port}{path}"),
        scheme,
        host,
        port,
        path,
    })
}

/// The method and path of `input` when it is an HTTP/1 request (request line and the
/// end of its head).
fn http_request(input: &str) -> Option<(String, String)> {
    let (head, _) = input
        .split_once("\r\n\r\n")
        .or_else(|| input.split_once("\n\n"))?;
    let line = head.lines().next()?;
    let mut parts = line.split(' ');
    let (method, path, version) = (parts.next()?, parts.next()?, parts.next()?);
    (version.trim_end().starts_with("HTTP/1.") && !method.is_empty())
        .then(|| (method.to_owned(), path.to_owned()))
}

/// A response as received.
struct Response {
    remote: SocketAddr,
    code: u16,
    /// Status line and headers, with their CRLFs and the empty line.
    head: String,
    body: String,
    content_type: String,
}

/// Why a transfer failed.
enum Failure {
    Resolve,
    Refused,
    Timeout,
    /// Connected, but the TLS handshake failed (what listens speaks plain HTTP).
    Tls,
}

/// curl's options that matter here.
#[derive(Default)]
struct CurlOpts {
    silent: bool,
    show_error: bool,
    output: Option<String>,
    write_out: Option<String>,
    head: bool,
    include: bool,
    verbose: bool,
    fail: bool,
    method: Option<String>,
    /// The request body (`-d`), pieces joined with `&` as curl does.
    data: Option<String>,
    connect_timeout: Option<Duration>,
    max_time: Option<Duration>,
    /// `--interface`: the source address (an interface name is taken as the pod's one).
    interface: Option<String>,
    urls: Vec<String>,
}

fn seconds(v: &str) -> Option<Duration> {
    v.parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64)
}

impl Sh<'_> {
    /// Runs `curl` or `wget`.
    pub(super) fn net_client(&mut self, name: &str, args: &[String], io: &Io) -> R {
        if name == "wget" {
            return Ok(self.wget(args, io));
        }
        Ok(self.curl(args, io))
    }

    /// busybox `nc [-v] [-t|-u] [-w SECS] [-z] HOST PORT` over TCP: stdin is sent, what
    /// the listener answers is printed. The sim's servers all speak HTTP, so input that
    /// is no HTTP request gets Go's `400 Bad Request`, as agnhost answers it. UDP finds
    /// nothing listening (it prints nothing, as after a lost datagram).
    pub(super) fn nc(&mut self, args: &[String], io: &Io) -> i32 {
        let (mut verbose, mut udp, mut scan, mut wait) = (false, false, false, None);
        let mut rest = Vec::new();
        let mut i = 0;
        while i < args.len() {
            match args[i].as_str() {
                "-w" => {
                    i += 1;
                    wait = args.get(i).and_then(|v| seconds(v));
                }
                a if a.starts_with('-') && a.len() > 1 => {
                    for c in a[1..].chars() {
                        match c {
                            'v' => verbose = true,
                            'u' => udp = true,
                            'z' => scan = true,
                            't' | 'n' | 'q' => {}
                            _ => {
                                self.err(io, &format!("nc: invalid option -- '{c}'\n"));
                                return 1;
                            }
                        }
                    }
                }
                a => rest.push(a.to_owned()),
            }
            i += 1;
        }
        let [host, port] = rest.as_slice() else {
            self.err(
                io,
                "BusyBox v1.37.0 multi-call binary.\n\nUsage: nc [OPTIONS] HOST PORT  - connect\n",
            );
            return 1;
        };
        let Ok(port) = port.parse::<u16>() else {
            self.err(io, &format!("nc: bad port '{port}'\n"));
            return 1;
        };
        let Some(ip) = self.resolve_host(host).and_then(|ips| ips.first().copied()) else {
            self.err(io, &format!("nc: bad address '{host}'\n"));
            return 1;
        };
        let input = io.read_all();
        if udp {
            // The input goes out as one datagram; replies print until -w seconds pass.
            let from = SocketAddr::new(
                self.ctx
                    .pod_ip
                    .parse()
                    .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
                40000,
            );
            let to = SocketAddr::new(ip, port);
            let reply = match self.dataplane() {
                Some(dp) if !input.is_empty() => dp.send_udp(to, from, &input).ok(),
                _ => None,
            };
            self.now += wait.unwrap_or(Duration::ZERO);
            if let Some(r) = reply {
                self.out(io, &r);
            }
            return 0;
        }
        let to = SocketAddr::new(ip, port);
        let dp = self.dataplane();
        let connected = match &dp {
            Some(dp) => dp
                .connect_from(self.ctx.pod_ip.parse().ok(), to)
                .map(|(_, l)| l),
            None => Err(ConnectError::Unreachable),
        };
        let listener = match connected {
            Ok(l) => l,
            Err(e) => {
                let why = match e {
                    ConnectError::Refused => "Connection refused",
                    ConnectError::Unreachable => {
                        self.now += wait.unwrap_or(Duration::from_secs(75));
                        "Connection timed out"
                    }
                };
                self.err(
                    io,
                    &format!("nc: can't connect to remote host ({to}): {why}\n"),
                );
                return 1;
            }
        };
        if verbose {
            self.err(io, &format!("{host} ({to}) open\n"));
        }
        if scan || input.is_empty() {
            return 0;
        }
        let answer = match http_request(&input) {
            Some((method, path)) => {
                String::from_utf8_lossy(&servers::answer(dp.as_deref(), &listener, &method, &path, false))
                    .into_owned()
            }
            None => "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request".to_owned(),
        };
        self.out(io, &answer);
        0
    }

    fn dataplane(&self) -> Option<Arc<Dataplane>> {
        self.ctx.net.clone()
    }

    /// The addresses `host` has for this pod (see [`Sh::resolve_name`]).
    fn resolve_host(&mut self, host: &str) -> Option<Vec<IpAddr>> {
        self.resolve_name(host)
    }

    /// One HTTP exchange with `url`, or why there was none; advances the clock.
    fn transfer(
        &mut self,
        url: &Url,
        method: &str,
        body: &str,
        connect_timeout: Duration,
    ) -> Result<Response, Failure> {
        let Some(ips) = self.resolve_host(&url.host) else {
            self.now += RTT;
            return Err(Failure::Resolve);
        };
        let ip = ips
            .first()
            .copied()
            .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
        let remote = SocketAddr::new(ip, url.port);
        // Loopback is the pod's own network namespace (the dataplane knows whose).
        let to = remote;
        let Some(dp) = self.dataplane() else {
            // No network: unreachable at once.
            return Err(Failure::Refused);
        };
        let listener = match dp.connect_from(self.ctx.pod_ip.parse().ok(), to) {
            Ok((_, l)) => l,
            Err(ConnectError::Refused) => {
                self.now += RTT;
                return Err(Failure::Refused);
            }
            Err(ConnectError::Unreachable) => {
                self.now += connect_timeout;
                return Err(Failure::Timeout);
            }
        };
        self.now += RTT;
        if url.scheme == "https" {
            // Whatever listens speaks plain HTTP; the TLS handshake fails.
            return Err(Failure::Tls);
        }
        Ok(http(&dp, &listener, remote, method, &url.path, body))
    }

    /// Writes `text` as the whole content of `path` (a `-o` / `-O` file).
    fn save(&mut self, path: &str, text: &str) -> bool {
        let path = self.path(path);
        let at = self.at();
        if self.view.write(&path, text, false, at).is_err() {
            return false;
        }
        self.events.push((
            self.now,
            Step::Write {
                path,
                text: text.to_owned(),
                append: false,
            },
        ));
        true
    }

    fn curl(&mut self, args: &[String], io: &Io) -> i32 {
        let mut o = CurlOpts::default();
        let mut i = 0;
        let usage = "curl: try 'curl --help' or 'curl --manual' for more information\n";
        while i < args.len() {
            let a = args[i].as_str();
            i += 1;
            let value = |i: &mut usize| -> Option<String> {
                let v = args.get(*i).cloned();
                *i += 1;
                v
            };
            let long = |name: &str| a == name;
            if let Some(rest) = a.strip_prefix("--") {
                let (name, inline) = match rest.split_once('=') {
                    Some((n, v)) => (n, Some(v.to_owned())),
                    None => (rest, None),
                };
                let take = |i: &mut usize| inline.clone().or_else(|| value(i));
                match name {
                    "silent" => o.silent = true,
                    "show-error" => o.show_error = true,
                    "head" => o.head = true,
                    "include" => o.include = true,
                    "verbose" => o.verbose = true,
                    "fail" | "fail-with-body" => o.fail = true,
                    "location" | "insecure" | "compressed" | "no-progress-meter" | "http1.1"
                    | "disable" | "globoff" => {}
                    "output" => o.output = take(&mut i),
                    "write-out" => o.write_out = take(&mut i),
                    "request" => o.method = take(&mut i),
                    "connect-timeout" | "max-time" => {
                        let Some(v) = take(&mut i).as_deref().and_then(seconds) else {
                            let err = format!("curl: option --{name}: expected a proper numerical parameter\n{usage}");
                            self.err(io, &err);
                            return 2;
                        };
                        if name == "connect-timeout" {
                            o.connect_timeout = Some(v);
                        } else {
                            o.max_time = Some(v);
                        }
                    }
                    "header" | "user-agent" | "retry" | "retry-delay" | "resolve" | "cacert" => {
                        take(&mut i);
                    }
                    "data" | "data-raw" | "data-binary" => {
                        let d = take(&mut i).unwrap_or_default();
                        o.data = Some(match o.data.take() {
                            Some(prev) => format!("{prev}&{d}"),
                            None => d,
                        });
                        o.method.get_or_insert_with(|| "POST".into());
                    }
                    "url" => o.urls.extend(take(&mut i)),
                    "interface" => o.interface = take(&mut i),
                    _ => {
                        let err = format!("curl: option {a}: is unknown\n{usage}");
                        self.err(io, &err);
                        return 2;
                    }
                }
                continue;
            }
            if a.len() > 1 && a.starts_with('-') && !long("-") {
                let chars: Vec<char> = a[1..].chars().collect();
                let mut k = 0;
                while k < chars.len() {
                    let c = chars[k];
                    k += 1;
                    let takes = matches!(c, 'o' | 'w' | 'X' | 'm' | 'H' | 'd' | 'A' | 'u');
                    let v = if takes {
                        let inline: String = chars[k..].iter().collect();
                        k = chars.len();
                        if inline.is_empty() {
                            value(&mut i)
                        } else {
                            Some(inline)
                        }
                    } else {
                        None
                    };
                    match c {
                        's' => o.silent = true,
                        'S' => o.show_error = true,
                        'I' => o.head = true,
                        'i' => o.include = true,
                        'v' => o.verbose = true,
                        'f' => o.fail = true,
                        // -q (--disable): no .curlrc is read here anyway.
                        // -g (--globoff): the sim does no URL globbing anyway.
                        'L' | 'k' | 'N' | '4' | 'q' | 'g' => {}
                        'o' => o.output = v,
                        'w' => o.write_out = v,
                        'X' => o.method = v,
                        'd' => {
                            let d = v.unwrap_or_default();
                            o.data = Some(match o.data.take() {
                                Some(prev) => format!("{prev}&{d}"),
                                None => d,
                            });
                            o.method.get_or_insert_with(|| "POST".into());
                        }
                        'H' | 'A' | 'u' => {}
                        'm' => {
                            let Some(d) = v.as_deref().and_then(seconds) else {
                                let err = format!("curl: option -m: expected a proper numerical parameter\n{usage}");
                                self.err(io, &err);
                                return 2;
                            };
                            o.max_time = Some(d);
                        }
                        _ => {
                            let err = format!("curl: option {a}: is unknown\n{usage}");
                            self.err(io, &err);
                            return 2;
                        }
                    }
                }
                continue;
            }
            o.urls.push(a.to_owned());
        }
        if o.urls.is_empty() {
            let err = format!("curl: no URL specified\n{usage}");
            self.err(io, &err);
            return 2;
        }
        // A source address the pod does not have cannot be bound.
        if let Some(ip) = o
            .interface
            .as_deref()
            .and_then(|i| i.parse::<IpAddr>().ok())
        {
            if self.ctx.pod_ip.parse::<IpAddr>().ok() != Some(ip) {
                if !o.silent || o.show_error {
                    self.err(
                        io,
                        "curl: (45) bind failed with errno 99: Cannot assign requested address\n",
                    );
                }
                return 45;
            }
        }
        let mut code = 0;
        let urls = std::mem::take(&mut o.urls);
        for raw in &urls {
            code = self.curl_one(&o, raw, io);
        }
        code
    }

    /// One URL of a curl command line; returns its exit code.
    fn curl_one(&mut self, o: &CurlOpts, raw: &str, io: &Io) -> i32 {
        let show_errors = !o.silent || o.show_error;
        let started = self.now;
        let url = match parse_url(raw) {
            Ok(u) => u,
            Err((code, msg)) => {
                if show_errors {
                    self.err(io, &format!("curl: ({code}) {msg}\n"));
                }
                return code;
            }
        };
        let method = o
            .method
            .clone()
            .unwrap_or_else(|| if o.head { "HEAD" } else { "GET" }.to_owned());
        let limit = match (o.connect_timeout, o.max_time) {
            (Some(c), Some(m)) => c.min(m),
            (Some(c), None) => c,
            (None, Some(m)) => m.min(CURL_CONNECT_TIMEOUT),
            (None, None) => CURL_CONNECT_TIMEOUT,
        };
        let result = self.transfer(&url, &method, o.data.as_deref().unwrap_or(""), limit);
        let elapsed = self.now.saturating_sub(started);
        let ms = elapsed.as_millis();
        let (code, err, resp) = match result {
            Ok(r) => (0, None, Some(r)),
            Err(Failure::Resolve) => (
                6,
                Some(format!("Could not resolve host: {}", url.host)),
                None,
            ),
            Err(Failure::Tls) => (
                35,
                Some("OpenSSL/3.3.2: error:0A00010B:SSL routines::wrong version number".into()),
                None,
            ),
            Err(Failure::Refused) => (
                7,
                Some(format!(
                    "Failed to connect to {} port {} after {ms} ms: Could not connect to server",
                    url.host, url.port
                )),
                None,
            ),
            Err(Failure::Timeout) => (
                28,
                Some(format!(
                    "Failed to connect to {} port {} after {ms} ms: Timeout was reached",
                    url.host, url.port
                )),
                None,
            ),
        };
        let mut code = code;
        let mut err = err;
        if o.verbose {
            let mut v = String::new();
            if let Some(r) = &resp {
                if url.host.parse::<IpAddr>().is_err() {
                    v.push_str(&format!(
                        "* Host {}:{} was resolved.\n* IPv6: (none)\n* IPv4: {}\n",
                        url.host,
                        url.port,
                        r.remote.ip()
                    ));
                }
                v.push_str(&format!(
                    "*   Trying {}...\n* Connected to {} ({}) port {}\n* using HTTP/1.x\n",
                    r.remote,
                    url.host,
                    r.remote.ip(),
                    url.port
                ));
                v.push_str(&format!(
                    "> {method} {} HTTP/1.1\r\n> Host: {}{}\r\n> User-Agent: curl/{CURL_VERSION}\r\n> Accept: */*\r\n> \r\n* Request completely sent off\n",
                    url.path,
                    url.host,
                    if url.port == 80 { String::new() } else { format!(":{}", url.port) }
                ));
                for line in r.head.split_inclusive("\r\n") {
                    v.push_str("< ");
                    v.push_str(line);
                }
            }
            self.err(io, &v);
        }
        let mut body_out = String::new();
        if let Some(r) = &resp {
            if o.fail && r.code >= 400 {
                code = 22;
                err = Some(format!("The requested URL returned error: {}", r.code));
            } else {
                if o.head || o.include {
                    body_out.push_str(&r.head);
                }
                if !o.head {
                    body_out.push_str(&r.body);
                }
            }
        }
        match o.output.as_deref() {
            None | Some("-") => self.out(io, &body_out),
            Some("/dev/null") => {}
            Some(path) if resp.is_some() => {
                if !self.save(path, &body_out) {
                    code = 23;
                    err = Some("client returned ERROR on write of 0 bytes".into());
                    let warn = format!(
                        "Warning: Failed to open the file {path}: No such file or directory\n"
                    );
                    if show_errors {
                        self.err(io, &warn);
                    }
                }
            }
            Some(_) => {}
        }
        if o.verbose && resp.is_some() {
            let v = format!("* Connection #0 to host {} left intact\n", url.host);
            self.err(io, &v);
        }
        if let (Some(e), true) = (&err, show_errors) {
            self.err(io, &format!("curl: ({code}) {e}\n"));
        }
        if let Some(w) = &o.write_out {
            let (text, errs) = write_out(w, &url, resp.as_ref(), code, &method, elapsed);
            self.out(io, &text);
            self.err(io, &errs);
        }
        code
    }

    fn wget(&mut self, args: &[String], io: &Io) -> i32 {
        let mut quiet = false;
        let mut server_response = false;
        let mut spider = false;
        let mut post_data: Option<String> = None;
        let mut output: Option<String> = None;
        let mut timeout = WGET_TIMEOUT;
        let mut urls: Vec<String> = Vec::new();
        let mut i = 0;
        while i < args.len() {
            let a = args[i].clone();
            i += 1;
            if let Some(rest) = a.strip_prefix("--") {
                let (name, inline) = match rest.split_once('=') {
                    Some((n, v)) => (n.to_owned(), Some(v.to_owned())),
                    None => (rest.to_owned(), None),
                };
                let take = |i: &mut usize| {
                    inline.clone().or_else(|| {
                        let v = args.get(*i).cloned();
                        *i += 1;
                        v
                    })
                };
                match name.as_str() {
                    "quiet" => quiet = true,
                    "server-response" => server_response = true,
                    "spider" => spider = true,
                    "post-data" => post_data = take(&mut i),
                    "output-document" => output = take(&mut i),
                    "timeout" => {
                        if let Some(d) = take(&mut i).as_deref().and_then(seconds) {
                            timeout = d;
                        }
                    }
                    _ => {
                        take(&mut i);
                    }
                }
                continue;
            }
            if a.len() > 1 && a.starts_with('-') {
                let chars: Vec<char> = a[1..].chars().collect();
                let mut k = 0;
                while k < chars.len() {
                    let c = chars[k];
                    k += 1;
                    let v = if matches!(c, 'O' | 'T' | 'U' | 'P' | 'Y' | 'e') {
                        let inline: String = chars[k..].iter().collect();
                        k = chars.len();
                        if inline.is_empty() {
                            let v = args.get(i).cloned();
                            i += 1;
                            v
                        } else {
                            Some(inline)
                        }
                    } else {
                        None
                    };
                    match c {
                        'q' => quiet = true,
                        'S' => server_response = true,
                        'O' => output = v,
                        'T' => {
                            if let Some(d) = v.as_deref().and_then(seconds) {
                                timeout = d;
                            }
                        }
                        _ => {}
                    }
                }
                continue;
            }
            urls.push(a);
        }
        let Some(raw) = urls.first() else {
            self.err(io, "BusyBox v1.37.0 (2024-09-26 21:31:42 UTC) multi-call binary.\n\nUsage: wget [-cqS] [--spider] [-O FILE] [-o LOGFILE] [--header STR]\n\t[--post-data STR | --post-file FILE] [-Y on/off]\n\t[-P DIR] [-U AGENT] [-T SEC] URL...\n");
            return 1;
        };
        let url = match parse_url(raw) {
            Ok(u) => u,
            Err(_) => {
                self.err(io, &format!("wget: not an http or ftp url: {raw}\n"));
                return 1;
            }
        };
        let method = match (&post_data, spider) {
            (Some(_), _) => "POST",
            (None, true) => "HEAD",
            (None, false) => "GET",
        };
        let resolved = self.resolve_host(&url.host);
        let Some(ip) = resolved.as_ref().and_then(|v| v.first().copied()) else {
            self.now += RTT;
            self.err(io, &format!("wget: bad address '{}'\n", url.host));
            return 1;
        };
        if !quiet {
            let line = format!("Connecting to {} ({ip}:{})\n", url.host, url.port);
            self.err(io, &line);
        }
        let r = match self.transfer(&url, method, post_data.as_deref().unwrap_or(""), timeout) {
            Ok(r) => r,
            Err(Failure::Timeout) => {
                self.err(io, "wget: download timed out\n");
                return 1;
            }
            Err(_) => {
                let e = format!("wget: can't connect to remote host ({ip}): Connection refused\n");
                self.err(io, &e);
                return 1;
            }
        };
        if server_response {
            let heads: String = r
                .head
                .split("\r\n")
                .filter(|l| !l.is_empty())
                .map(|l| format!("  {l}\n"))
                .collect();
            self.err(io, &heads);
        }
        if r.code >= 400 {
            let status = r.head.split("\r\n").next().unwrap_or("");
            self.err(io, &format!("wget: server returned error: {status}\n"));
            return 1;
        }
        if spider {
            if !quiet {
                self.err(io, "remote file exists\n");
            }
            return 0;
        }
        let file = output.unwrap_or_else(|| {
            let base = url
                .path
                .split('?')
                .next()
                .unwrap_or("")
                .rsplit('/')
                .next()
                .unwrap_or("");
            if base.is_empty() {
                "index.html".to_owned()
            } else {
                base.to_owned()
            }
        });
        let size = r.body.len();
        if file == "-" {
            if !quiet {
                self.err(io, "writing to stdout\n");
            }
            self.out(io, &r.body);
            if !quiet {
                let p = format!("-                    100% |********************************| {size:>5}  0:00:00 ETA\nwritten to stdout\n");
                self.err(io, &p);
            }
            return 0;
        }
        if !quiet {
            self.err(io, &format!("saving to '{file}'\n"));
        }
        if !self.save(&file, &r.body) {
            self.err(
                io,
                &format!("wget: can't open '{file}': No such file or directory\n"),
            );
            return 1;
        }
        if !quiet {
            let p = format!("{file:<20} 100% |********************************| {size:>5}  0:00:00 ETA\n'{file}' saved\n");
            self.err(io, &p);
        }
        0
    }
}

/// The listener's answer to `method path`.
fn http(
    dp: &Dataplane,
    l: &Listener,
    remote: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> Response {
    let raw = servers::answer_request(Some(dp), l, method, path, body, true);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = match text.find("\r\n\r\n") {
        Some(i) => (text[..i + 4].to_owned(), text[i + 4..].to_owned()),
        None => (text, String::new()),
    };
    let code = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let content_type = head
        .split("\r\n")
        .find_map(|l| {
            l.split_once(':')
                .filter(|(k, _)| k.eq_ignore_ascii_case("content-type"))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_default();
    Response {
        remote,
        code,
        head,
        body,
        content_type,
    }
}

/// `-w`'s text: variables (`%{http_code}`, ...) and `\n`-style escapes; returns the text
/// and curl's warnings for unknown variables.
fn write_out(
    fmt: &str,
    url: &Url,
    resp: Option<&Response>,
    exit: i32,
    method: &str,
    elapsed: Duration,
) -> (String, String) {
    let mut out = String::new();
    let mut warn = String::new();
    let mut rest = fmt;
    while let Some(c) = rest.chars().next() {
        if let Some(r) = rest.strip_prefix("%{") {
            if let Some(end) = r.find('}') {
                let name = &r[..end];
                rest = &r[end + 1..];
                let secs = format!("{:.6}", elapsed.as_secs_f64());
                let v = match name {
                    "http_code" | "response_code" => {
                        format!("{:03}", resp.map_or(0, |r| r.code))
                    }
                    "remote_ip" => resp.map(|r| r.remote.ip().to_string()).unwrap_or_default(),
                    "remote_port" => resp
                        .map(|r| r.remote.port().to_string())
                        .unwrap_or_default(),
                    "size_download" => resp.map_or(0, |r| r.body.len()).to_string(),
                    "size_header" => resp.map_or(0, |r| r.head.len()).to_string(),
                    "url_effective" | "url" => url.full.clone(),
                    "content_type" => resp.map(|r| r.content_type.clone()).unwrap_or_default(),
                    "exitcode" => exit.to_string(),
                    "method" => method.to_owned(),
                    "scheme" => url.scheme.to_ascii_uppercase(),
                    "http_version" => if resp.is_some() { "1.1" } else { "0" }.to_owned(),
                    "num_connects" => u8::from(resp.is_some()).to_string(),
                    "time_total" | "time_connect" | "time_namelookup" | "time_starttransfer"
                    | "time_pretransfer" | "time_appconnect" => secs,
                    other => {
                        warn.push_str(&format!("curl: unknown --write-out variable: '{other}'\n"));
                        String::new()
                    }
                };
                out.push_str(&v);
                continue;
            }
        }
        if let Some(r) = rest.strip_prefix("%%") {
            out.push('%');
            rest = r;
            continue;
        }
        if let Some(r) = rest.strip_prefix('\\') {
            match r.chars().next() {
                Some('n') => out.push('\n'),
                Some('r') => out.push('\r'),
                Some('t') => out.push('\t'),
                Some('\\') => out.push('\\'),
                Some(o) => {
                    out.push('\\');
                    out.push(o);
                }
                None => {
                    out.push('\\');
                    break;
                }
            }
            rest = &r[r.chars().next().map_or(0, char::len_utf8)..];
            continue;
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    (out, warn)
}

#[cfg(test)]
mod tests {
    use super::super::{exec_program, Context, Stream};
    use super::*;
    use crate::net::{Protocol, Rule, ServiceEntry};

    fn cluster() -> Arc<Dataplane> {
        let dp = Dataplane::new();
        crate::net::add_cluster_dns(&dp);
        let pod: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 244, 0, 5));
        dp.set_pod(
            "u1",
            pod,
            serde_json::json!({
                "metadata": {"name": "hello-1"},
                "spec": {"containers": [{"name": "nginx", "image": "nginx:1.29"}]},
                "status": {"containerStatuses": [{"name": "nginx", "state": {"running": {}}}]}
            }),
        );
        let vip = IpAddr::V4(Ipv4Addr::new(10, 96, 0, 20));
        dp.set_service(
            "default/hello",
            ServiceEntry {
                rules: vec![Rule {
                    frontend: SocketAddr::new(vip, 80),
                    protocol: Protocol::Tcp,
                    endpoints: vec![SocketAddr::new(pod, 80)],
                }],
                records: vec![crate::dns::Rr::new(
                    "hello.default.svc.cluster.local",
                    crate::dns::RData::A(vip),
                )],
                affinity: None,
            },
        );
        dp.set_service(
            "default/empty",
            ServiceEntry {
                rules: vec![Rule {
                    frontend: SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 96, 0, 21)), 80),
                    protocol: Protocol::Tcp,
                    endpoints: vec![],
                }],
                records: vec![crate::dns::Rr::new(
                    "empty.default.svc.cluster.local",
                    crate::dns::RData::A(IpAddr::V4(Ipv4Addr::new(10, 96, 0, 21))),
                )],
                affinity: None,
            },
        );
        dp
    }

    /// (stdout, stderr, exit code, simulated duration) of `cmd` in a pod with `net`.
    fn run(net: Option<Arc<Dataplane>>, cmd: &[&str]) -> (String, String, i32, Duration) {
        let ctx = Context {
            hostname: "probe".into(),
            pod_ip: "10.244.0.9".into(),
            net,
            ..Default::default()
        };
        let argv: Vec<String> = cmd.iter().map(|s| (*s).to_owned()).collect();
        let steps = exec_program(&argv, &ctx).unwrap_or_default();
        let (mut out, mut err, mut code, mut t) =
            (String::new(), String::new(), -1, Duration::ZERO);
        for s in steps {
            match s {
                Step::Out(Stream::Stdout, x) => out.push_str(&x),
                Step::Out(Stream::Stderr, x) => err.push_str(&x),
                Step::Sleep(d) => t += d,
                Step::Exit(c) => code = c,
                _ => {}
            }
        }
        (out, err, code, t)
    }

    #[test]
    fn posts_reach_nettest_which_counts_them() {
        let dp = cluster();
        dp.set_pod(
            "n1",
            IpAddr::V4(Ipv4Addr::new(10, 244, 0, 7)),
            serde_json::json!({
                "metadata": {"name": "server"},
                "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/e2e-test-images/agnhost:2.55",
                    "args": ["nettest"]}]},
                "status": {"containerStatuses": [{"name": "c", "containerID": "sim://n1", "state": {"running": {}}}]}
            }),
        );
        // The PreStop e2e test's hook, twice, then what the test reads.
        let post = r#"wget -O- --post-data='{"Source": "prestop"}' http://10.244.0.7:8080/write"#;
        let (out, _, code, _) = run(Some(dp.clone()), &["sh", "-c", &format!("{post}; {post}")]);
        assert_eq!(code, 0);
        assert_eq!(out, "{\"Hostname\":\"server\"}\n".repeat(2));
        let (out, _, _, _) = run(
            Some(dp.clone()),
            &[
                "curl",
                "-s",
                "-d",
                "{\"Source\":\"curl\"}",
                "http://10.244.0.7:8080/write",
            ],
        );
        assert_eq!(out, "{\"Hostname\":\"server\"}\n");
        let (out, _, _, _) = run(Some(dp), &["wget", "-qO-", "http://10.244.0.7:8080/read"]);
        let state: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
        assert_eq!(
            state["Received"],
            serde_json::json!({"prestop": 2, "curl": 1}),
            "{out}"
        );
        assert_eq!(state["Hostname"], "server");
    }

    #[test]
    fn nc_connects_as_the_e2e_reachability_checks_use_it() {
        let dp = Some(cluster());
        // What the service jig runs: a line that is no HTTP request gets a 400.
        let (out, err, code, _) = run(
            dp.clone(),
            &["sh", "-c", "echo hostName | nc -v -t -w 2 hello 80"],
        );
        assert_eq!(code, 0, "{err}");
        assert!(out.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{out}");
        assert_eq!(err, "hello (10.96.0.20:80) open\n");
        // A real request gets the listener's answer.
        let (out, _, code, _) = run(
            dp.clone(),
            &[
                "sh",
                "-c",
                "printf 'GET / HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n' | nc 10.244.0.5 80",
            ],
        );
        assert_eq!(code, 0);
        assert!(out.contains("Welcome to nginx!"), "{out}");
        let (out, err, code, _) = run(dp.clone(), &["nc", "-z", "10.244.0.5", "81"]);
        assert_eq!((out.as_str(), code), ("", 1));
        assert_eq!(
            err,
            "nc: can't connect to remote host (10.244.0.5:81): Connection refused\n"
        );
        let (_, err, code, _) = run(dp.clone(), &["nc", "nowhere", "80"]);
        assert_eq!((err.as_str(), code), ("nc: bad address 'nowhere'\n", 1));
        // UDP: the datagram reaches netexec's UDP server, whose reply prints; the wait
        // is -w's.
        if let Some(dp) = &dp {
            dp.set_pod(
                "u2",
                IpAddr::V4(Ipv4Addr::new(10, 244, 0, 6)),
                serde_json::json!({
                    "metadata": {"name": "udp-server"},
                    "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/e2e-test-images/agnhost:2.55",
                        "args": ["netexec", "--http-port", "80", "--udp-port", "80"]}]},
                    "status": {"containerStatuses": [{"name": "c", "state": {"running": {}}}]}
                }),
            );
        }
        let (out, _, code, took) = run(
            dp.clone(),
            &["sh", "-c", "echo hostName | nc -v -u -w 2 10.244.0.6 80"],
        );
        assert_eq!(
            (out.as_str(), code, took),
            ("udp-server", 0, Duration::from_secs(2))
        );
        let (out, _, _, _) = run(
            dp,
            &["sh", "-c", "echo hostName | nc -u -w 1 10.244.0.6 81"],
        );
        assert_eq!(out, "");
    }

    #[test]
    fn curl_reaches_services_by_name_and_reports_failures_as_curl_does() {
        let dp = Some(cluster());
        let w = "%{http_code}\\n";
        let (out, err, code, _) = run(
            dp.clone(),
            &["curl", "-s", "-o", "/dev/null", "-w", w, "http://hello"],
        );
        assert_eq!((out.as_str(), err.as_str(), code), ("200\n", "", 0));
        // -g -q as the e2e network utilities pass them.
        let (out, _, code, _) = run(
            dp.clone(),
            &[
                "curl",
                "-g",
                "-q",
                "-s",
                "http://hello.default.svc.cluster.local/",
            ],
        );
        assert!(out.contains("Welcome to nginx!"), "{out}");
        assert_eq!(code, 0);
        let (out, _, _, _) = run(dp.clone(), &["curl", "-sI", "10.96.0.20"]);
        assert!(
            out.starts_with("HTTP/1.1 200 OK\r\nServer: nginx/1.29\r\n"),
            "{out}"
        );
        let (out, _, code, _) = run(
            dp.clone(),
            &[
                "curl",
                "-s",
                "-w",
                "code=%{http_code}",
                "-o",
                "/dev/null",
                "hello/missing",
            ],
        );
        assert_eq!((out.as_str(), code), ("code=404", 0));
        let (out, err, code, _) = run(dp.clone(), &["curl", "http://nope"]);
        assert_eq!(
            (out.as_str(), err.as_str(), code),
            ("", "curl: (6) Could not resolve host: nope\n", 6)
        );
        let (out, err, code, _) = run(dp.clone(), &["curl", "-s", "-w", w, "http://nope"]);
        assert_eq!((out.as_str(), err.as_str(), code), ("000\n", "", 6));
        let (_, err, code, _) = run(dp.clone(), &["curl", "-sS", "http://empty"]);
        assert_eq!(code, 7);
        assert!(
            err.starts_with("curl: (7) Failed to connect to empty port 80 after "),
            "{err}"
        );
        assert!(err.ends_with(" ms: Could not connect to server\n"), "{err}");
        let (_, err, code, t) = run(
            dp.clone(),
            &["curl", "--connect-timeout", "2", "http://10.1.2.3"],
        );
        assert_eq!(code, 28);
        assert_eq!(
            err,
            "curl: (28) Failed to connect to 10.1.2.3 port 80 after 2000 ms: Timeout was reached\n"
        );
        assert_eq!(t, Duration::from_secs(2));
        let (_, _, code, _) = run(dp.clone(), &["curl", "-sf", "hello/x"]);
        assert_eq!(code, 22);
        let (_, _, code, _) = run(None, &["curl", "-s", "http://hello"]);
        assert_eq!(code, 6);
        let (out, err, code, _) = run(dp.clone(), &["wget", "-qO-", "http://hello"]);
        assert!(
            out.contains("Welcome to nginx!") && err.is_empty() && code == 0,
            "{out} {err}"
        );
        let (_, err, code, _) = run(dp, &["wget", "-q", "-O-", "http://nope"]);
        assert_eq!((err.as_str(), code), ("wget: bad address 'nope'\n", 1));
    }
}
