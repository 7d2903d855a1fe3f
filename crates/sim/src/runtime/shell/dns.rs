//! The DNS clients of the sim shell: `dig` (BIND 9.18), busybox's `nslookup`, `getent
//! hosts` (glibc), and the resolver `curl` and `wget` use. Queries go to the nameservers
//! of the pod's `/etc/resolv.conf` through the cluster's [`Dataplane`]: the cluster DNS
//! answers when a nameserver reaches a DNS pod ([`Dataplane::query`]); otherwise the
//! client waits for its timeouts as on a real pod.

use std::net::IpAddr;
use std::time::Duration;

use super::{Io, Sh};
use crate::dns::{hosts_lookup, reverse_name, Answer, QType, RData, Rcode, ResolvConf};

/// The libc resolver's timeout per try (`options timeout:5`) and its tries (`attempts:2`).
const RES_TIMEOUT: Duration = Duration::from_secs(5);
const RES_ATTEMPTS: u32 = 2;
/// dig's defaults: `+timeout=5`, `+tries=3`.
const DIG_TIMEOUT: u64 = 5;
const DIG_TRIES: u32 = 3;
/// The version `dig` announces.
const DIG_VERSION: &str = "9.18.33";

impl Sh<'_> {
    /// The pod's resolver configuration.
    fn resolv_conf(&self) -> ResolvConf {
        ResolvConf::parse(
            &self
                .view
                .read("/etc/resolv.conf", self.at())
                .unwrap_or_default(),
        )
    }

    /// Asks `servers` in turn, each `tries` times, for `name`/`qtype`; the first answer
    /// wins. Waiting for a server that never answers advances the clock by `timeout`.
    fn ask(
        &mut self,
        servers: &[IpAddr],
        tcp: bool,
        name: &str,
        qtype: QType,
        (timeout, tries): (Duration, u32),
        mut on_timeout: impl FnMut(&mut Self, IpAddr),
    ) -> Option<(IpAddr, Answer)> {
        let dp = self.ctx.net.clone();
        for _ in 0..tries.max(1) {
            for server in servers {
                if let Some(a) = dp
                    .as_ref()
                    .and_then(|dp| dp.query(*server, tcp, name, qtype))
                {
                    return Some((*server, a));
                }
                self.now += timeout;
                on_timeout(self, *server);
            }
        }
        None
    }

    /// The addresses `host` has for this pod, as libc finds them: an address as is,
    /// `/etc/hosts`, then the nameservers with the search list. `None`: not found (or no
    /// nameserver answered).
    pub(super) fn resolve_name(&mut self, host: &str) -> Option<Vec<IpAddr>> {
        self.lookup_host(host).map(|(_, ips)| ips)
    }

    /// [`Self::resolve_name`] with the canonical name: the one in `/etc/hosts`, or the
    /// name (after the search list and any CNAMEs) that DNS answered for.
    fn lookup_host(&mut self, host: &str) -> Option<(String, Vec<IpAddr>)> {
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Some((host.to_owned(), vec![ip]));
        }
        let hosts = self.view.read("/etc/hosts", self.at()).unwrap_or_default();
        let local = hosts_lookup(&hosts, host);
        let ips: Vec<IpAddr> = local
            .iter()
            .map(|(ip, _)| *ip)
            .filter(IpAddr::is_ipv4)
            .collect();
        if let Some((_, names)) = local.first().filter(|_| !ips.is_empty()) {
            return Some((names.first().cloned().unwrap_or_default(), ips));
        }
        let rc = self.resolv_conf();
        for candidate in rc.candidates(host) {
            let (_, answer) = self.ask(
                &rc.nameservers,
                false,
                &candidate,
                QType::A,
                (RES_TIMEOUT, RES_ATTEMPTS),
                |_, _| {},
            )?;
            let ips: Vec<IpAddr> = addresses(&answer);
            if !ips.is_empty() {
                let canonical = answer
                    .records
                    .iter()
                    .find(|r| matches!(r.data, RData::A(_)))
                    .map(|r| r.name.clone())
                    .unwrap_or(candidate);
                return Some((canonical, ips));
            }
        }
        None
    }

    /// `dig`, `nslookup` and `getent`.
    pub(super) fn dns_tool(&mut self, name: &str, args: &[String], io: &Io) -> i32 {
        match name {
            "dig" => self.dig(args, io),
            "nslookup" => self.nslookup(args, io),
            _ => self.getent(args, io),
        }
    }

    fn dig(&mut self, args: &[String], io: &Io) -> i32 {
        let mut server: Option<IpAddr> = None;
        let mut tcp = false;
        let mut short = false;
        let mut search = false;
        let mut show_answer = true;
        let mut show_rest = true;
        let mut timeout = DIG_TIMEOUT;
        let mut tries = DIG_TRIES;
        let mut name: Option<String> = None;
        let mut qtype: Option<QType> = None;
        let mut it = args.iter();
        while let Some(a) = it.next() {
            if let Some(s) = a.strip_prefix('@') {
                match s.parse() {
                    Ok(ip) => server = Some(ip),
                    Err(_) => {
                        self.err(
                            io,
                            &format!("dig: couldn't get address for '{s}': not found\n"),
                        );
                        return 10;
                    }
                }
            } else if let Some(opt) = a.strip_prefix('+') {
                let (neg, opt) = match opt.strip_prefix("no") {
                    Some(rest) => (true, rest),
                    None => (false, opt),
                };
                let (key, value) = opt.split_once('=').unwrap_or((opt, ""));
                match key {
                    "tcp" | "vc" => tcp = !neg,
                    "short" => short = !neg,
                    "search" => search = !neg,
                    "all" => {
                        show_answer = !neg;
                        show_rest = !neg;
                    }
                    "answer" => show_answer = !neg,
                    "time" | "timeout" => timeout = value.parse().unwrap_or(timeout).max(1),
                    "tries" => tries = value.parse().unwrap_or(tries).max(1),
                    "retry" => tries = value.parse::<u32>().map(|r| r + 1).unwrap_or(tries),
                    _ => {}
                }
            } else if a == "-t" {
                qtype = it.next().and_then(|t| QType::parse(t));
            } else if a == "-x" {
                if let Some(ip) = it.next().and_then(|ip| ip.parse::<IpAddr>().ok()) {
                    name = Some(reverse_name(ip));
                    qtype = Some(QType::Ptr);
                }
            } else if a == "-p" || a == "-c" || a == "-q" {
                if a == "-q" {
                    name = it.next().cloned();
                } else {
                    it.next();
                }
            } else if a.starts_with('-') {
            } else if name.is_some() && qtype.is_none() && QType::parse(a).is_some() {
                qtype = QType::parse(a);
            } else if a.eq_ignore_ascii_case("IN") {
            } else if name.is_none() {
                name = Some(a.clone());
            }
        }
        // Without a name, dig asks for the root's NS.
        let name = name.unwrap_or_else(|| ".".to_owned());
        let qtype = qtype.unwrap_or(if name == "." { QType::Ns } else { QType::A });
        let rc = self.resolv_conf();
        let servers = match server {
            Some(s) => vec![s],
            None => rc.nameservers.clone(),
        };
        let candidates = if search && name != "." {
            rc.candidates(&name)
        } else {
            vec![name.trim_end_matches('.').to_owned()]
        };
        let header = format!(
            "\n; <<>> DiG {DIG_VERSION} <<>> {}\n;; global options: +cmd\n",
            args.join(" ")
        );
        let mut last: Option<(IpAddr, String, Answer)> = None;
        for candidate in &candidates {
            let got = self.ask(
                &servers,
                tcp,
                candidate,
                qtype,
                (Duration::from_secs(timeout), if tcp { 1 } else { tries }),
                |sh, s| {
                    if !short {
                        let text = format!(";; communications error to {s}#53: timed out\n");
                        sh.out(io, &text);
                    }
                },
            );
            let Some((server, answer)) = got else {
                if !short {
                    self.out(io, &format!("{header};; no servers could be reached\n"));
                } else {
                    self.out(io, ";; connection timed out; no servers could be reached\n");
                }
                return 9;
            };
            let found = answer.rcode == Rcode::NoError && !answer.records.is_empty();
            last = Some((server, candidate.clone(), answer));
            if found {
                break;
            }
        }
        let Some((server, qname, answer)) = last else {
            return 0;
        };
        let lines: Vec<String> = answer
            .records
            .iter()
            .map(|r| {
                format!(
                    "{}.\t{}\tIN\t{}\t{}\n",
                    r.name,
                    r.ttl,
                    r.data.kind().name(),
                    r.data.text()
                )
            })
            .collect();
        if short {
            let data: String = answer
                .records
                .iter()
                .map(|r| format!("{}\n", r.data.text()))
                .collect();
            self.out(io, &data);
            return 0;
        }
        let mut out = String::new();
        if show_rest {
            let secs = (self.at())
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs() as i64)
                .unwrap_or_default();
            let when = k8s_openapi::jiff::Timestamp::from_second(secs)
                .unwrap_or_default()
                .strftime("%a %b %d %H:%M:%S UTC %Y")
                .to_string();
            let id = (self.rng % 65536) as u16;
            out.push_str(&header);
            out.push_str(&format!(
                ";; Got answer:\n;; ->>HEADER<<- opcode: QUERY, status: {}, id: {id}\n;; flags: qr aa rd; QUERY: 1, ANSWER: {}, AUTHORITY: 0, ADDITIONAL: 0\n;; WARNING: recursion requested but not available\n\n;; QUESTION SECTION:\n;{}.\t\t\tIN\t{}\n\n",
                answer.rcode.name(),
                lines.len(),
                qname.trim_end_matches('.'),
                qtype.name()
            ));
            if show_answer && !lines.is_empty() {
                out.push_str(";; ANSWER SECTION:\n");
                out.extend(lines);
                out.push('\n');
            }
            out.push_str(&format!(
                ";; Query time: 0 msec\n;; SERVER: {server}#53({server}) ({})\n;; WHEN: {when}\n;; MSG SIZE  rcvd: {}\n\n",
                if tcp { "TCP" } else { "UDP" },
                12 + qname.len() + 6 + answer.records.len() * 16
            ));
        } else if show_answer {
            out.extend(lines);
        }
        self.out(io, &out);
        0
    }

    /// busybox's `nslookup [-type=T] NAME [SERVER]`.
    fn nslookup(&mut self, args: &[String], io: &Io) -> i32 {
        let mut qtypes = vec![QType::A, QType::Aaaa];
        let mut words = Vec::new();
        for a in args {
            if let Some(t) = a
                .strip_prefix("-type=")
                .or_else(|| a.strip_prefix("-query="))
                .or_else(|| a.strip_prefix("-q="))
            {
                match QType::parse(t) {
                    Some(q) => qtypes = vec![q],
                    None => {
                        self.err(io, &format!("nslookup: invalid query type '{t}'\n"));
                        return 1;
                    }
                }
            } else if !a.starts_with('-') {
                words.push(a.clone());
            }
        }
        let Some(name) = words.first().cloned() else {
            self.err(io, "BusyBox v1.37.0 multi-call binary.\n\nUsage: nslookup [-type=QUERY_TYPE] [-debug] HOST [DNS_SERVER]\n");
            return 1;
        };
        let rc = self.resolv_conf();
        let servers = match words.get(1).map(|s| s.parse::<IpAddr>()) {
            Some(Ok(ip)) => vec![ip],
            Some(Err(_)) => {
                self.err(io, &format!("nslookup: can't resolve '{}'\n", words[1]));
                return 1;
            }
            None => rc.nameservers.clone(),
        };
        let (name, qtypes) = match name.parse::<IpAddr>() {
            Ok(ip) => (reverse_name(ip), vec![QType::Ptr]),
            Err(_) => (name, qtypes),
        };
        let mut out = String::new();
        let mut server_shown = false;
        let mut failed = false;
        // The name the first type was found at is the one the others are asked for.
        let mut found_at: Option<String> = None;
        for qtype in qtypes {
            let mut answered: Option<Answer> = None;
            let mut asked = name.clone();
            let candidates = match &found_at {
                Some(n) => vec![n.clone()],
                None => rc.candidates(&name),
            };
            for candidate in candidates {
                let got = self.ask(
                    &servers,
                    false,
                    &candidate,
                    qtype,
                    (RES_TIMEOUT, RES_ATTEMPTS),
                    |_, _| {},
                );
                let Some((server, answer)) = got else {
                    self.out(io, &out);
                    self.out(
                        io,
                        ";; connection timed out; no servers could be reached\n\n",
                    );
                    return 1;
                };
                if !server_shown {
                    out.push_str(&format!("Server:\t\t{server}\nAddress:\t{server}:53\n\n"));
                    server_shown = true;
                }
                asked = candidate;
                let done = !answer.records.is_empty();
                if done {
                    found_at = Some(asked.clone());
                }
                answered = Some(answer);
                if done {
                    break;
                }
            }
            let Some(answer) = answered else { continue };
            match answer.rcode {
                Rcode::NxDomain => {
                    out.push_str(&format!("** server can't find {asked}: NXDOMAIN\n\n"));
                    failed = true;
                }
                Rcode::NoError if answer.records.is_empty() => {
                    // busybox says nothing of an empty AAAA answer after an A one.
                    if qtype != QType::Aaaa {
                        out.push_str(&format!("*** Can't find {asked}: No answer\n\n"));
                    }
                }
                Rcode::NoError => {
                    for r in &answer.records {
                        match &r.data {
                            RData::A(ip) => {
                                out.push_str(&format!("Name:\t{}\nAddress: {ip}\n", r.name))
                            }
                            RData::Cname(t) => out.push_str(&format!(
                                "{}\tcanonical name = {}\n",
                                r.name,
                                t.trim_end_matches('.')
                            )),
                            RData::Ptr(t) => out.push_str(&format!(
                                "{}\tname = {}\n",
                                r.name,
                                t.trim_end_matches('.')
                            )),
                            RData::Srv { .. } => out.push_str(&format!(
                                "{}\tservice = {}\n",
                                r.name,
                                r.data.text().trim_end_matches('.')
                            )),
                        }
                    }
                    out.push('\n');
                }
            }
        }
        self.out(io, &out);
        i32::from(failed)
    }

    /// `getent hosts NAME...` (and `ahosts`): `/etc/hosts`, then DNS; exit 2 when a
    /// name is not found.
    fn getent(&mut self, args: &[String], io: &Io) -> i32 {
        let Some(db) = args.first() else {
            self.err(io, "Usage: getent [OPTION...] database [key ...]\n");
            return 1;
        };
        if db != "hosts" && db != "ahosts" && db != "ahostsv4" {
            self.err(io, &format!("Unknown database: {db}\n"));
            return 1;
        }
        let mut code = 0;
        let mut out = String::new();
        for key in &args[1..] {
            let hosts = self.view.read("/etc/hosts", self.at()).unwrap_or_default();
            let local = hosts_lookup(&hosts, key);
            let lines: Vec<(IpAddr, String)> = if let Some((ip, names)) = local.first() {
                vec![(*ip, names.join(" "))]
            } else {
                match self.lookup_host(key) {
                    Some((name, ips)) => ips.into_iter().map(|ip| (ip, name.clone())).collect(),
                    None => Vec::new(),
                }
            };
            if lines.is_empty() {
                code = 2;
            }
            for (ip, names) in lines {
                if db == "hosts" {
                    out.push_str(&format!("{:<15} {names}\n", ip.to_string()));
                } else {
                    out.push_str(&format!("{:<15} STREAM {names}\n", ip.to_string()));
                    out.push_str(&format!("{:<15} DGRAM  \n", ip.to_string()));
                    out.push_str(&format!("{:<15} RAW    \n", ip.to_string()));
                }
            }
        }
        self.out(io, &out);
        code
    }
}

/// The addresses an answer holds (after any CNAMEs).
fn addresses(a: &Answer) -> Vec<IpAddr> {
    a.records
        .iter()
        .filter_map(|r| match r.data {
            RData::A(ip) => Some(ip),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::{exec_program, Context, Step, Stream};
    use crate::net::{Dataplane, ServiceEntry};
    use std::sync::Arc;

    fn cluster() -> Arc<Dataplane> {
        let dp = Dataplane::new();
        crate::net::add_cluster_dns(&dp);
        dp.set_service(
            "default/kubernetes",
            ServiceEntry {
                rules: Vec::new(),
                records: crate::dns::kubernetes_records(),
                affinity: None,
            },
        );
        dp
    }

    fn run(net: Option<Arc<Dataplane>>, script: &str) -> (String, String, i32, u64) {
        let ctx = Context {
            hostname: "q".into(),
            pod_ip: "10.244.0.9".into(),
            net,
            ..Default::default()
        };
        let argv = vec!["sh".to_owned(), "-c".to_owned(), script.to_owned()];
        let (mut out, mut err, mut code, mut secs) = (String::new(), String::new(), -1, 0);
        for s in exec_program(&argv, &ctx).unwrap_or_default() {
            match s {
                Step::Out(Stream::Stdout, x) => out.push_str(&x),
                Step::Out(Stream::Stderr, x) => err.push_str(&x),
                Step::Sleep(d) => secs += d.as_secs(),
                Step::Exit(c) => code = c,
                _ => {}
            }
        }
        (out, err, code, secs)
    }

    #[test]
    fn dig_answers_from_the_cluster_dns_with_the_search_list() {
        let dp = Some(cluster());
        // The e2e DNS probe: non-empty answers by UDP and TCP with the search list.
        let (out, _, code, _) = run(
            dp.clone(),
            "dig +notcp +noall +answer +search kubernetes.default A; dig +tcp +noall +answer +search kubernetes.default.svc A",
        );
        assert_eq!(code, 0);
        assert_eq!(
            out,
            "kubernetes.default.svc.cluster.local.\t30\tIN\tA\t10.96.0.1\n".repeat(2)
        );
        // Without +search the short name is not found: no answer lines.
        let (out, _, _, _) = run(dp.clone(), "dig +noall +answer kubernetes.default");
        assert_eq!(out, "");
        let (out, _, _, _) = run(
            dp.clone(),
            "dig +short _https._tcp.kubernetes.default.svc.cluster.local SRV",
        );
        assert_eq!(out, "0 100 443 kubernetes.default.svc.cluster.local.\n");
        let (out, _, _, _) = run(dp.clone(), "dig kubernetes.default.svc.cluster.local");
        assert!(out.contains("status: NOERROR"), "{out}");
        assert!(
            out.contains(";; ANSWER SECTION:\nkubernetes.default"),
            "{out}"
        );
        assert!(
            out.contains(";; SERVER: 10.96.0.10#53(10.96.0.10) (UDP)"),
            "{out}"
        );
        let (out, _, _, _) = run(dp.clone(), "dig nope.default.svc.cluster.local");
        assert!(out.contains("status: NXDOMAIN"), "{out}");
        // A server nobody runs: three tries of five seconds, then exit 9.
        let (out, _, code, secs) = run(dp, "dig @10.0.0.2 +short example.com");
        assert_eq!((code, secs), (9, 15));
        assert!(out.contains("no servers could be reached"), "{out}");
    }

    #[test]
    fn nslookup_and_getent_resolve_as_the_pod_does() {
        let dp = Some(cluster());
        let (out, _, code, _) = run(dp.clone(), "nslookup kubernetes.default");
        assert_eq!(code, 0, "{out}");
        assert_eq!(
            out,
            "Server:\t\t10.96.0.10\nAddress:\t10.96.0.10:53\n\nName:\tkubernetes.default.svc.cluster.local\nAddress: 10.96.0.1\n\n"
        );
        let (out, _, code, _) = run(dp.clone(), "nslookup nope");
        assert_eq!(code, 1);
        assert!(out.contains("** server can't find nope: NXDOMAIN"), "{out}");
        // getent: /etc/hosts first (the pod's own name), then DNS.
        let (out, _, code, _) = run(dp.clone(), "getent hosts q; getent hosts kubernetes");
        assert_eq!(code, 0);
        assert_eq!(
            out,
            "10.244.0.9      q\n10.96.0.1       kubernetes.default.svc.cluster.local\n"
        );
        let (_, _, code, _) = run(dp, "getent hosts nope");
        assert_eq!(code, 2);
    }
}
