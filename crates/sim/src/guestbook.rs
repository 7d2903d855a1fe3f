//! agnhost `guestbook` in the sim: the e2e suite's Guestbook application (a primary, its
//! replicas and a frontend, each `agnhost guestbook` on its own flags) as upstream's
//! handlers answer:
//!
//! * `/register?host=IP`: a replica subscribes; the answer is the whole store
//!   (`{"data":{...}}`), and later sets are pushed to it on `--backend-port`.
//! * `/get?key=K`: `{"data":"value"}` (`""` when unset, the whole store without a key).
//! * `/set?key=K&value=V`: stores it, pushes it to every replica, `{"message":"Updated"}`.
//! * `/guestbook?cmd=get|set&key=&value=`: the frontend's; a set goes to
//!   `agnhost-primary:<backend-port>`, a get to `agnhost-replica:<backend-port>`, resolved
//!   from the pod's namespace, and the backend's answer is passed on.
//!
//! A replica (`--replicaof NAME`) registers when it starts. Here the registration happens
//! when it is first needed: when the replica answers its first request, or when the
//! primary pushes a set, the primary counts every running replica whose `--replicaof`
//! reaches it as registered (each of those would have registered at its start). The
//! stores live in the [`Dataplane`]'s per-container server state.

use std::net::{IpAddr, SocketAddr};

use serde_json::{json, Value};

use crate::net::Dataplane;
use crate::netexec::{ok, Answer};
use crate::sample_apiserver::query_param;

/// What one guestbook container runs with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Guestbook {
    /// The container's id: whose store this is.
    pub container: String,
    pub namespace: String,
    pub pod_ip: Option<IpAddr>,
    /// `--replicaof`: the primary's name ("" for a primary or a frontend).
    pub replica_of: String,
    /// `--backend-port` (6379).
    pub backend_port: u16,
}

/// Go's `http.Error`: the message and a newline, as plain text.
fn error(code: u16, reason: &'static str, message: &str) -> Answer {
    Answer {
        code,
        reason,
        content_type: "text/plain; charset=utf-8",
        body: format!("{message}\n"),
    }
}

impl Guestbook {
    /// The answer to `GET path` (with its query).
    pub(crate) fn answer(&self, dp: Option<&Dataplane>, path: &str) -> Answer {
        let (route, query) = path.split_once('?').unwrap_or((path, ""));
        let q = |k: &str| query_param(query, k).unwrap_or_default();
        let Some(dp) = dp else {
            return error(417, "Expectation Failed", "no network");
        };
        match route {
            "/register" => {
                self.ensure_registered(dp);
                let host = q("host");
                self.state(dp, |s| {
                    if let Some(r) = s["replicas"].as_array_mut() {
                        r.push(json!(host));
                    }
                    ok(json!({"data": s["store"]}).to_string())
                })
            }
            "/get" => {
                self.ensure_registered(dp);
                let key = q("key");
                self.state(dp, |s| {
                    let data = if key.is_empty() {
                        s["store"].clone()
                    } else {
                        s["store"].get(&key).cloned().unwrap_or(json!(""))
                    };
                    ok(json!({ "data": data }).to_string())
                })
            }
            "/set" => self.set(dp, &q("key"), &q("value")),
            "/guestbook" => self.frontend(dp, &q("cmd"), &q("key"), &q("value")),
            _ => error(404, "Not Found", "404 page not found"),
        }
    }

    fn state<T>(&self, dp: &Dataplane, f: impl FnOnce(&mut Value) -> T) -> T {
        dp.with_server_state(
            &self.container,
            || json!({"store": {}, "replicas": [], "registered": false}),
            f,
        )
    }

    /// This container's pod IP: its status's, or where the network has the pod that runs
    /// this container (a status not yet written).
    fn my_ip(&self, dp: &Dataplane) -> Option<IpAddr> {
        self.pod_ip.or_else(|| {
            dp.pods().into_iter().find_map(|(ip, pod)| {
                let runs_me = pod
                    .pointer("/status/containerStatuses")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|c| c.get("containerID").and_then(Value::as_str))
                    .any(|id| id.rsplit("://").next() == Some(self.container.as_str()));
                runs_me.then_some(ip)
            })
        })
    }

    /// A replica's registration with its primary: the primary's store becomes its own.
    fn ensure_registered(&self, dp: &Dataplane) {
        if self.replica_of.is_empty() || self.state(dp, |s| s["registered"] == true) {
            return;
        }
        let Some(primary) = dp.resolve_in(&self.namespace, &self.replica_of) else {
            return;
        };
        let host = self.my_ip(dp).map(|i| i.to_string()).unwrap_or_default();
        let to = SocketAddr::new(primary, self.backend_port);
        let Ok(body) = crate::netexec::get(Some(dp), to, &format!("/register?host={host}")) else {
            return;
        };
        let store = serde_json::from_str::<Value>(&body)
            .ok()
            .and_then(|v| v.get("data").filter(|d| d.is_object()).cloned());
        if let Some(store) = store {
            self.state(dp, |s| {
                s["store"] = store;
                s["registered"] = json!(true);
            });
        }
    }

    fn set(&self, dp: &Dataplane, key: &str, value: &str) -> Answer {
        if key.is_empty() {
            return error(400, "Bad Request", "cannot set with empty key.");
        }
        self.ensure_registered(dp);
        let registered: Vec<String> = self.state(dp, |s| {
            if let Some(m) = s["store"].as_object_mut() {
                m.insert(key.to_owned(), json!(value));
            }
            strings(&s["replicas"])
        });
        let mut replicas = registered;
        for ip in self.running_replicas(dp) {
            let ip = ip.to_string();
            if !replicas.contains(&ip) {
                replicas.push(ip);
            }
        }
        let request = format!("/set?key={key}&value={value}");
        for replica in replicas {
            let Ok(ip) = replica.parse::<IpAddr>() else {
                continue;
            };
            let to = SocketAddr::new(ip, self.backend_port);
            if let Err(e) = crate::netexec::get(Some(dp), to, &request) {
                return error(
                    417,
                    "Expectation Failed",
                    &format!(
                        "encountered error while propagating to replica '{replica}': Get \"http://{to}{request}\": dial tcp {to}: {e}"
                    ),
                );
            }
        }
        ok(json!({"message": "Updated"}).to_string())
    }

    /// The running replicas whose `--replicaof` reaches this primary (through their
    /// Service, from their namespace).
    fn running_replicas(&self, dp: &Dataplane) -> Vec<IpAddr> {
        let Some(me) = self.my_ip(dp) else {
            return Vec::new();
        };
        dp.pods()
            .into_iter()
            .filter(|(ip, _)| *ip != me)
            .filter_map(|(ip, pod)| {
                let ns = pod.pointer("/metadata/namespace").and_then(Value::as_str)?;
                let of = replica_of(&pod)?;
                let primary = dp.resolve_in(ns, &of.0)?;
                dp.routes_to(SocketAddr::new(primary, of.1), me)
                    .then_some(ip)
            })
            .collect()
    }

    fn frontend(&self, dp: &Dataplane, cmd: &str, key: &str, value: &str) -> Answer {
        let cmd = cmd.to_ascii_lowercase();
        if cmd != "get" && cmd != "set" {
            return error(400, "Bad Request", &format!("unsupported cmd: '{cmd}'"));
        }
        if cmd == "set" && key.is_empty() {
            return error(400, "Bad Request", "cannot set with empty key.");
        }
        let host = if cmd == "get" {
            "agnhost-replica"
        } else {
            "agnhost-primary"
        };
        let Some(ip) = dp.resolve_in(&self.namespace, host) else {
            return error(
                400,
                "Bad Request",
                &format!(
                    "host and/or port param are invalid. lookup {host} on {}:53: no such host",
                    crate::net::CLUSTER_DNS
                ),
            );
        };
        let to = SocketAddr::new(ip, self.backend_port);
        let request = format!("/{cmd}?key={key}&value={value}");
        match crate::netexec::get(Some(dp), to, &request) {
            Ok(body) => ok(body),
            Err(e) => error(
                417,
                "Expectation Failed",
                &format!(
                    "encountered error: Get \"http://{host}:{}{request}\": dial tcp {to}: {e}",
                    self.backend_port
                ),
            ),
        }
    }
}

/// A running pod's `agnhost guestbook --replicaof NAME` (the name and its
/// `--backend-port`), if it runs one.
fn replica_of(pod: &Value) -> Option<(String, u16)> {
    pod.pointer("/spec/containers")
        .and_then(Value::as_array)?
        .iter()
        .find_map(|c| {
            let argv = [strings(&c["command"]), strings(&c["args"])].concat();
            let args: Vec<&str> = argv.iter().map(String::as_str).collect();
            let at = args.iter().position(|a| *a == "guestbook")?;
            let args = &args[at + 1..];
            let of = crate::servers::flag(args, "--replicaof")?;
            let port = crate::servers::flag(args, "--backend-port")
                .and_then(|p| p.parse().ok())
                .unwrap_or(6379);
            (!of.is_empty()).then(|| (of.to_owned(), port))
        })
}

/// The strings of a JSON array.
fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect()
}

/// The JSON object a store holds, for tests.
#[cfg(test)]
fn store_of(v: &str) -> serde_json::Map<String, Value> {
    serde_json::from_str::<Value>(v)
        .ok()
        .and_then(|v| v.get("data").and_then(Value::as_object).cloned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::{Protocol, Rule, ServiceEntry};

    fn pod(name: &str, args: &[&str]) -> Value {
        json!({
            "metadata": {"name": name, "namespace": "gb"},
            "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/e2e-test-images/agnhost:2.56",
                "args": args, "ports": [{"containerPort": 6379}]}]},
            "status": {"containerStatuses": [{"name": "c", "state": {"running": {}}, "containerID": format!("sim://{name}")}]}
        })
    }

    #[test]
    fn the_frontend_sets_through_the_primary_and_gets_from_the_replicas() {
        let dp = Dataplane::default();
        let ip = |n: u8| IpAddr::from([10, 244, 0, n]);
        let primary = pod("primary", &["guestbook", "--http-port", "6379"]);
        let replica = |n: &str| {
            pod(
                n,
                &[
                    "guestbook",
                    "--replicaof",
                    "agnhost-primary",
                    "--http-port",
                    "6379",
                ],
            )
        };
        dp.set_pod("p", ip(2), primary);
        dp.set_pod("r1", ip(3), replica("r1"));
        dp.set_pod("r2", ip(4), replica("r2"));
        let service = |name: &str, vip: u8, eps: Vec<IpAddr>| {
            let frontend = SocketAddr::new(IpAddr::from([10, 96, 0, vip]), 6379);
            dp.set_service(
                &format!("gb/{name}"),
                ServiceEntry {
                    rules: vec![Rule {
                        frontend,
                        protocol: Protocol::Tcp,
                        endpoints: eps.into_iter().map(|i| SocketAddr::new(i, 6379)).collect(),
                    }],
                    records: vec![crate::dns::Rr::new(
                        &format!("{name}.gb.svc.cluster.local"),
                        crate::dns::RData::A(frontend.ip()),
                    )],
                    affinity: None,
                },
            );
        };
        service("agnhost-primary", 50, vec![ip(2)]);
        service("agnhost-replica", 51, vec![ip(3), ip(4)]);
        let frontend = Guestbook {
            container: "frontend".into(),
            namespace: "gb".into(),
            pod_ip: Some(ip(9)),
            replica_of: String::new(),
            backend_port: 6379,
        };
        let ask = |path: &str| frontend.answer(Some(&dp), path);
        assert_eq!(
            ask("/guestbook?cmd=get&key=messages&value=").body,
            r#"{"data":""}"#
        );
        let set = ask("/guestbook?cmd=set&key=messages&value=TestEntry");
        assert_eq!(
            (set.code, set.body.as_str()),
            (200, r#"{"message":"Updated"}"#)
        );
        // Both replicas have it, whichever the Service picks.
        for _ in 0..4 {
            assert_eq!(
                ask("/guestbook?cmd=get&key=messages&value=").body,
                r#"{"data":"TestEntry"}"#
            );
        }
        assert_eq!(
            store_of(&ask("/guestbook?cmd=get&key=&value=").body).get("messages"),
            Some(&json!("TestEntry"))
        );
        let bad = ask("/guestbook?cmd=drop");
        assert_eq!(
            (bad.code, bad.body.as_str()),
            (400, "unsupported cmd: 'drop'\n")
        );
        let empty = ask("/guestbook?cmd=set&key=&value=x");
        assert_eq!(empty.body, "cannot set with empty key.\n");
    }
}
