//! The resolv.conf the kubelet writes into each container (upstream's dns configurer):
//! the cluster DNS (`--cluster-dns`) with the namespace's search list in the cluster
//! domain (`--cluster-domain`), or the node's own resolver, per `dnsPolicy`, then
//! `dnsConfig`.

use serde_json::Value;

/// `--cluster-domain`.
pub const CLUSTER_DOMAIN: &str = "cluster.local";

/// `--cluster-dns` when none is configured: the cluster DNS Service's address in
/// kubeadm's default Service range (kube-dns's ClusterIP).
pub const CLUSTER_DNS: &str = "10.96.0.10";

/// The node's own resolver configuration (what `dnsPolicy: Default` pods get): the
/// cloud network's resolver, which the simulation does not run.
pub const NODE_RESOLV_CONF: &str = "nameserver 10.0.0.2\n";

/// The resolv.conf the kubelet writes for `pod`, as upstream's kubelet computes it from
/// its `dnsPolicy` and `dnsConfig`: ClusterFirst (and ClusterFirstWithHostNet) gives the
/// cluster DNS with the namespace's search list and `ndots:5`; Default, and ClusterFirst
/// with hostNetwork, the node's; None nothing; `dnsConfig` then adds its nameservers and
/// searches (without duplicates) and its options (replacing those of the same name).
pub fn pod_resolv_conf(pod: &Value, cluster_dns: &[String]) -> String {
    let s = |p: &str| pod.pointer(p).and_then(Value::as_str).unwrap_or("");
    let host_network = pod
        .pointer("/spec/hostNetwork")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let policy = match s("/spec/dnsPolicy") {
        "ClusterFirstWithHostNet" => "ClusterFirst",
        "Default" => "Default",
        "None" => "None",
        _ if host_network => "Default",
        _ => "ClusterFirst",
    };
    let mut servers: Vec<String> = Vec::new();
    let mut search: Vec<String> = Vec::new();
    let mut options: Vec<(String, Option<String>)> = Vec::new();
    match policy {
        "ClusterFirst" => {
            servers.extend(cluster_dns.iter().cloned());
            let ns = match s("/metadata/namespace") {
                "" => "default",
                ns => ns,
            };
            search = vec![
                format!("{ns}.svc.{CLUSTER_DOMAIN}"),
                format!("svc.{CLUSTER_DOMAIN}"),
                CLUSTER_DOMAIN.to_owned(),
            ];
            options.push(("ndots".into(), Some("5".into())));
        }
        "Default" => {
            for line in NODE_RESOLV_CONF.lines() {
                let mut words = line.split_whitespace();
                match words.next() {
                    Some("nameserver") => servers.extend(words.next().map(str::to_owned)),
                    Some("search") => search = words.map(str::to_owned).collect(),
                    _ => {}
                }
            }
        }
        _ => {}
    }
    let strings = |p: &str| -> Vec<String> {
        pod.pointer(p)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect()
    };
    for n in strings("/spec/dnsConfig/nameservers") {
        if !servers.contains(&n) {
            servers.push(n);
        }
    }
    for d in strings("/spec/dnsConfig/searches") {
        if !search.contains(&d) {
            search.push(d);
        }
    }
    for o in pod
        .pointer("/spec/dnsConfig/options")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let name = o
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let value = o.get("value").and_then(Value::as_str).map(str::to_owned);
        match options.iter_mut().find(|(n, _)| *n == name) {
            Some(existing) => existing.1 = value,
            None => options.push((name, value)),
        }
    }
    let mut out = String::new();
    if !search.is_empty() {
        out.push_str(&format!("search {}\n", search.join(" ")));
    }
    for n in &servers {
        out.push_str(&format!("nameserver {n}\n"));
    }
    if !options.is_empty() {
        let opts: Vec<String> = options
            .iter()
            .map(|(n, v)| match v {
                Some(v) => format!("{n}:{v}"),
                None => n.clone(),
            })
            .collect();
        out.push_str(&format!("options {}\n", opts.join(" ")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolv_conf_follows_dns_policy_and_config() {
        let pod = |spec: serde_json::Value| serde_json::json!({"metadata": {"name": "p", "namespace": "team"}, "spec": spec});
        let dns = [CLUSTER_DNS.to_owned()];
        assert_eq!(
            pod_resolv_conf(&pod(serde_json::json!({})), &dns),
            "search team.svc.cluster.local svc.cluster.local cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n"
        );
        // hostNetwork with ClusterFirst gets the node's; ClusterFirstWithHostNet the cluster's.
        assert_eq!(
            pod_resolv_conf(&pod(serde_json::json!({"hostNetwork": true})), &dns),
            NODE_RESOLV_CONF
        );
        assert!(pod_resolv_conf(
            &pod(serde_json::json!({"hostNetwork": true, "dnsPolicy": "ClusterFirstWithHostNet"})),
            &dns
        )
        .contains("nameserver 10.96.0.10"));
        // None: only dnsConfig; options replace those of the same name.
        assert_eq!(
            pod_resolv_conf(
                &pod(serde_json::json!({"dnsPolicy": "None", "dnsConfig": {
                "nameservers": ["1.1.1.1"], "searches": ["resolv.conf.local"],
                "options": [{"name": "ndots", "value": "2"}, {"name": "edns0"}]}})),
                &dns
            ),
            "search resolv.conf.local\nnameserver 1.1.1.1\noptions ndots:2 edns0\n"
        );
        assert_eq!(
            pod_resolv_conf(&pod(serde_json::json!({"dnsConfig": {
                "nameservers": ["10.96.0.10", "1.1.1.1"],
                "options": [{"name": "ndots", "value": "1"}]}})), &dns),
            "search team.svc.cluster.local svc.cluster.local cluster.local\nnameserver 10.96.0.10\nnameserver 1.1.1.1\noptions ndots:1\n"
        );
        // The configured cluster DNS (another Service range's).
        assert!(
            pod_resolv_conf(&pod(serde_json::json!({})), &["10.100.0.10".into()])
                .contains("nameserver 10.100.0.10\n")
        );
    }
}
