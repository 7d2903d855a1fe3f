//! Services (with cluster IP and node port allocation), Endpoints and EndpointSlices.

mod alloc;
pub mod repair;

use std::collections::{BTreeMap, BTreeSet};

use kumo_apimachinery::validation::{self, FieldError, Path};
use serde_json::{json, Value};

use super::{age_of, default_field, name_of, str_at, Allocator, Column, Resource, Strategy};

pub use alloc::{first_service_ip, parse_service_cidr, service_cidr, DEFAULT_SERVICE_CIDR};

pub(super) fn resources() -> Vec<Resource> {
    vec![
        Resource {
            group: "",
            version: "v1",
            kind: "Service",
            plural: "services",
            singular: "service",
            namespaced: true,
            short_names: &["svc"],
            categories: &["all"],
            subresources: &["status"],
            strategy: Box::new(Services),
        },
        Resource {
            group: "",
            version: "v1",
            kind: "Endpoints",
            plural: "endpoints",
            singular: "endpoints",
            namespaced: true,
            short_names: &["ep"],
            categories: &[],
            subresources: &[],
            strategy: Box::new(Endpoints),
        },
        Resource {
            group: "discovery.k8s.io",
            version: "v1",
            kind: "EndpointSlice",
            plural: "endpointslices",
            singular: "endpointslice",
            namespaced: true,
            short_names: &[],
            categories: &[],
            subresources: &[],
            strategy: Box::new(EndpointSlices),
        },
    ]
}

// Table columns, as kube-apiserver's printers define them.
const COL_TYPE: Column = Column {
    name: "Type",
    type_: "string",
    format: "",
    description: "type determines how the Service is exposed. Defaults to ClusterIP. Valid options are ExternalName, ClusterIP, NodePort, and LoadBalancer. \"ClusterIP\" allocates a cluster-internal IP address for load-balancing to endpoints. Endpoints are determined by the selector or if that is not specified, by manual construction of an Endpoints object or EndpointSlice objects. If clusterIP is \"None\", no virtual IP is allocated and the endpoints are published as a set of endpoints rather than a virtual IP. \"NodePort\" builds on ClusterIP and allocates a port on every node which routes to the same endpoints as the clusterIP. \"LoadBalancer\" builds on NodePort and creates an external load-balancer (if supported in the current cloud) which routes to the same endpoints as the clusterIP. \"ExternalName\" aliases this service to the specified externalName. Several other fields do not apply to ExternalName services. More info: https://kubernetes.io/docs/concepts/services-networking/service/#publishing-services-service-types",
    priority: 0,
};
const COL_CLUSTER_IP: Column = Column {
    name: "Cluster-IP",
    type_: "string",
    format: "",
    description: "clusterIP is the IP address of the service and is usually assigned randomly. If an address is specified manually, is in-range (as per system configuration), and is not in use, it will be allocated to the service; otherwise creation of the service will fail. This field may not be changed through updates unless the type field is also being changed to ExternalName (which requires this field to be blank) or the type field is being changed from ExternalName (in which case this field may optionally be specified, as describe above).  Valid values are \"None\", empty string (\"\"), or a valid IP address. Setting this to \"None\" makes a \"headless service\" (no virtual IP), which is useful when direct endpoint connections are preferred and proxying is not required.  Only applies to types ClusterIP, NodePort, and LoadBalancer. If this field is specified when creating a Service of type ExternalName, creation will fail. This field will be wiped when updating a Service to type ExternalName. More info: https://kubernetes.io/docs/concepts/services-networking/service/#virtual-ips-and-service-proxies",
    priority: 0,
};
const COL_EXTERNAL_IP: Column = Column {
    name: "External-IP",
    type_: "string",
    format: "",
    description: "externalIPs is a list of IP addresses for which nodes in the cluster will also accept traffic for this service.  These IPs are not managed by Kubernetes.  The user is responsible for ensuring that traffic arrives at a node with this IP.  A common example is external load-balancers that are not part of the Kubernetes system.",
    priority: 0,
};
const COL_PORTS: Column = Column {
    name: "Port(s)",
    type_: "string",
    format: "",
    description: "The list of ports that are exposed by this service. More info: https://kubernetes.io/docs/concepts/services-networking/service/#virtual-ips-and-service-proxies",
    priority: 0,
};
const COL_SELECTOR: Column = Column {
    name: "Selector",
    type_: "string",
    format: "",
    description: "Route service traffic to pods with label keys and values matching this selector. If empty or not present, the service is assumed to have an external process managing its endpoints, which Kubernetes will not modify. Only applies to types ClusterIP, NodePort, and LoadBalancer. Ignored if type is ExternalName. More info: https://kubernetes.io/docs/concepts/services-networking/service/",
    priority: 1,
};
const COL_EP_ENDPOINTS: Column = Column {
    name: "Endpoints",
    type_: "string",
    format: "",
    description: "The set of all endpoints is the union of all subsets. Addresses are placed into subsets according to the IPs they share. A single address with multiple ports, some of which are ready and some of which are not (because they come from different containers) will result in the address being displayed in different subsets for the different ports. No address will appear in both Addresses and NotReadyAddresses in the same subset. Sets of addresses and ports that comprise a service.",
    priority: 0,
};
const COL_ADDRESSTYPE: Column = Column {
    name: "AddressType",
    type_: "string",
    format: "",
    description: "addressType specifies the type of address carried by this EndpointSlice. All addresses in this slice must be the same type. This field is immutable after creation. The following address types are currently supported: * IPv4: Represents an IPv4 Address. * IPv6: Represents an IPv6 Address. * FQDN: Represents a Fully Qualified Domain Name. (Deprecated) The EndpointSlice controller only generates, and kube-proxy only processes, slices of addressType \"IPv4\" and \"IPv6\". No semantics are defined for the \"FQDN\" type.",
    priority: 0,
};
const COL_SLICE_PORTS: Column = Column {
    name: "Ports",
    type_: "string",
    format: "",
    description: "ports specifies the list of network ports exposed by each endpoint in this slice. Each port must have a unique name. Each slice may include a maximum of 100 ports. Services always have at least 1 port, so EndpointSlices generated by the EndpointSlice controller will likewise always have at least 1 port. EndpointSlices used for other purposes may have an empty ports list.",
    priority: 0,
};
const COL_SLICE_ENDPOINTS: Column = Column {
    name: "Endpoints",
    type_: "string",
    format: "",
    description: "endpoints is a list of unique endpoints in this slice. Each slice may include a maximum of 1000 endpoints.",
    priority: 0,
};

/// Services: upstream's defaults, validation, cluster IPs and node ports.
struct Services;

fn svc_type(svc: &Value) -> &str {
    match str_at(svc, "/spec/type") {
        "" => "ClusterIP",
        t => t,
    }
}

fn ports_mut(svc: &mut Value) -> Vec<&mut serde_json::Map<String, Value>> {
    svc.pointer_mut("/spec/ports")
        .and_then(Value::as_array_mut)
        .map(|a| a.iter_mut().filter_map(Value::as_object_mut).collect())
        .unwrap_or_default()
}

fn ports(svc: &Value) -> &[Value] {
    svc.pointer("/spec/ports")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

/// Whether a value is unset in Go's sense (absent, null, 0, "").
fn unset(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => true,
        Some(Value::Number(n)) => n.as_i64() == Some(0),
        Some(Value::String(s)) => s.is_empty(),
        _ => false,
    }
}

/// The defaults the decoder applies to a Service (SetDefaults_Service).
fn default_service(svc: &mut Value) {
    if let Some(o) = svc.as_object_mut() {
        o.entry("spec").or_insert_with(|| json!({}));
    }
    let Some(spec) = svc.get_mut("spec") else {
        return;
    };
    if unset(spec.get("type")) {
        spec["type"] = json!("ClusterIP");
    }
    if unset(spec.get("sessionAffinity")) {
        spec["sessionAffinity"] = json!("None");
    }
    let affinity = spec.get("sessionAffinity").and_then(Value::as_str);
    let timeout_unset = spec
        .pointer("/sessionAffinityConfig/clientIP/timeoutSeconds")
        .is_none_or(Value::is_null);
    match affinity {
        Some("ClientIP") if timeout_unset => {
            spec["sessionAffinityConfig"] = json!({"clientIP": {"timeoutSeconds": 10800}});
        }
        Some("None") => {
            if let Some(o) = spec.as_object_mut() {
                o.remove("sessionAffinityConfig");
            }
        }
        _ => {}
    }
    let ty = spec
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    if let Some(ps) = spec.get_mut("ports").and_then(Value::as_array_mut) {
        for p in ps.iter_mut().filter_map(Value::as_object_mut) {
            if unset(p.get("protocol")) {
                p.insert("protocol".into(), json!("TCP"));
            }
            if unset(p.get("targetPort")) {
                let port = p.get("port").cloned().unwrap_or(json!(0));
                p.insert("targetPort".into(), port);
            }
        }
    }
    let has_external_ips = spec
        .get("externalIPs")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty());
    let externally_accessible = matches!(ty.as_str(), "NodePort" | "LoadBalancer")
        || (ty == "ClusterIP" && has_external_ips);
    if externally_accessible && unset(spec.get("externalTrafficPolicy")) {
        spec["externalTrafficPolicy"] = json!("Cluster");
    }
    if ty != "ExternalName" && unset(spec.get("internalTrafficPolicy")) {
        spec["internalTrafficPolicy"] = json!("Cluster");
    }
    if ty == "LoadBalancer" && unset(spec.get("allocateLoadBalancerNodePorts")) {
        spec["allocateLoadBalancerNodePorts"] = json!(true);
    }
}

/// clusterIP and clusterIPs[0] name the same address (upstream's NormalizeClusterIPs, in
/// PrepareForCreate/PrepareForUpdate).
fn normalize_cluster_ips(svc: &mut Value) {
    let Some(spec) = svc.get_mut("spec") else {
        return;
    };
    let ip = spec
        .get("clusterIP")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let ips_empty = spec
        .get("clusterIPs")
        .and_then(Value::as_array)
        .is_none_or(Vec::is_empty);
    if !ip.is_empty() && ips_empty {
        spec["clusterIPs"] = json!([ip]);
    }
}

/// IP family fields (upstream sets them while allocating, after the field manager has
/// recorded the request, so the allocator calls this): SingleStack and the family of the
/// cluster IP, except a headless Service without selector, which asks for both.
fn default_ip_families(svc: &mut Value, old: Option<&Value>) {
    if svc_type(svc) == "ExternalName" {
        return;
    }
    let headless_selectorless = str_at(svc, "/spec/clusterIP") == "None"
        && svc
            .pointer("/spec/selector")
            .and_then(Value::as_object)
            .is_none_or(|m| m.is_empty());
    let Some(spec) = svc.get_mut("spec") else {
        return;
    };
    if unset(spec.get("ipFamilyPolicy")) {
        let policy = match old.and_then(|o| o.pointer("/spec/ipFamilyPolicy")) {
            Some(p) if !unset(Some(p)) => p.clone(),
            _ if headless_selectorless => json!("RequireDualStack"),
            _ => json!("SingleStack"),
        };
        spec["ipFamilyPolicy"] = policy;
    }
    let dual = spec.get("ipFamilyPolicy").and_then(Value::as_str) != Some("SingleStack");
    let families: Vec<String> = spec
        .get("ipFamilies")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    if headless_selectorless && dual && families.len() == 1 {
        let other = if families[0] == "IPv4" {
            "IPv6"
        } else {
            "IPv4"
        };
        spec["ipFamilies"] = json!([families[0], other]);
    }
    if families.is_empty() {
        let first = spec
            .pointer("/clusterIPs/0")
            .and_then(Value::as_str)
            .unwrap_or("");
        if first.contains(':') {
            // Not a family of this cluster: validation says so about the IP.
            return;
        }
        let family = "IPv4";
        spec["ipFamilies"] = if headless_selectorless && dual {
            json!([family, if family == "IPv4" { "IPv6" } else { "IPv4" }])
        } else {
            json!([family])
        };
    }
}

/// Whether traffic reaches the Service from outside the cluster (node ports, a load
/// balancer, or external IPs).
fn externally_accessible(svc: &Value) -> bool {
    match svc_type(svc) {
        "NodePort" | "LoadBalancer" => true,
        "ClusterIP" => svc
            .pointer("/spec/externalIPs")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty()),
        _ => false,
    }
}

/// Carries allocated values the new object left out over from the stored one, and drops
/// fields its (new) type does not use when they were left as they were
/// (upstream's patchAllocatedValues and dropTypeDependentFields).
fn carry_over(new: &mut Value, old: &Value) {
    let new_ty = svc_type(new).to_owned();
    let old_ty = svc_type(old).to_owned();
    let needs_ip = |t: &str| t != "ExternalName";
    let needs_ports = |t: &str| matches!(t, "NodePort" | "LoadBalancer");
    if needs_ip(&new_ty) && needs_ip(&old_ty) {
        let ip_empty = unset(new.pointer("/spec/clusterIP"));
        if ip_empty {
            if let (Some(spec), Some(ospec)) = (new.get_mut("spec"), old.get("spec")) {
                for k in ["clusterIP", "clusterIPs"] {
                    if let Some(v) = ospec.get(k) {
                        spec[k] = v.clone();
                    }
                }
            }
        }
    }
    if needs_ports(&new_ty) && needs_ports(&old_ty) {
        let old_ports: Vec<Value> = ports(old).to_vec();
        for p in ports_mut(new) {
            if unset(p.get("nodePort")) {
                if let Some(np) = old_ports.iter().find(|o| {
                    o.get("port") == p.get("port") && o.get("protocol") == p.get("protocol")
                }) {
                    if let Some(v) = np.get("nodePort") {
                        p.insert("nodePort".into(), v.clone());
                    }
                }
            }
        }
    }
    if alloc::needs_health_check(new)
        && alloc::needs_health_check(old)
        && unset(new.pointer("/spec/healthCheckNodePort"))
    {
        if let Some(v) = old.pointer("/spec/healthCheckNodePort").cloned() {
            new["spec"]["healthCheckNodePort"] = v;
        }
    }
    // clusterIP and clusterIPs: whichever of them changed leads.
    let ip = new.pointer("/spec/clusterIP").cloned();
    let ips = new.pointer("/spec/clusterIPs").cloned();
    if ip != old.pointer("/spec/clusterIP").cloned()
        && ips == old.pointer("/spec/clusterIPs").cloned()
    {
        if let Some(spec) = new.get_mut("spec") {
            match ip
                .as_ref()
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
            {
                Some(ip) => spec["clusterIPs"] = json!([ip]),
                None => {
                    if let Some(s) = spec.as_object_mut() {
                        s.remove("clusterIPs");
                    }
                }
            }
        }
    }
    let same = |new: &Value, p: &str| new.pointer(p) == old.pointer(p);
    let mut drop = Vec::new();
    if externally_accessible(old)
        && !externally_accessible(new)
        && same(new, "/spec/externalTrafficPolicy")
    {
        drop.push("externalTrafficPolicy");
    }
    if alloc::needs_health_check(old)
        && !alloc::needs_health_check(new)
        && same(new, "/spec/healthCheckNodePort")
    {
        drop.push("healthCheckNodePort");
    }
    if new_ty != old_ty {
        if !needs_ip(&new_ty) {
            for f in ["clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"] {
                if same(new, &format!("/spec/{f}")) {
                    drop.push(f);
                }
            }
            if same(new, "/spec/internalTrafficPolicy") {
                drop.push("internalTrafficPolicy");
            }
        }
        if !needs_ports(&new_ty) {
            let old_ports: Vec<Value> = ports(old).to_vec();
            for p in ports_mut(new) {
                let unchanged = old_ports.iter().any(|o| {
                    o.get("port") == p.get("port") && o.get("nodePort") == p.get("nodePort")
                });
                if unchanged {
                    p.remove("nodePort");
                }
            }
        }
        if new_ty != "LoadBalancer" {
            for f in ["allocateLoadBalancerNodePorts", "loadBalancerClass"] {
                if same(new, &format!("/spec/{f}")) {
                    drop.push(f);
                }
            }
        }
    }
    if let Some(spec) = new.get_mut("spec").and_then(Value::as_object_mut) {
        for f in drop {
            spec.remove(f);
        }
    }
}

const SERVICE_TYPES: &[&str] = &["ClusterIP", "ExternalName", "LoadBalancer", "NodePort"];
const PROTOCOLS: &[&str] = &["SCTP", "TCP", "UDP"];

/// A port number field: 1-65535.
fn check_port_num(errs: &mut Vec<FieldError>, path: &Path, v: &Value) {
    let n = v.as_i64().unwrap_or(0);
    for msg in validation::is_valid_port_num(n) {
        errs.push(FieldError::invalid(path, n, msg));
    }
}

/// The error for a ServicePort that repeats another's (protocol, port) pair, with the
/// value as Go prints the key it compares (its fields in declaration order).
fn duplicate_port(path: &Path, protocol: &str, port: i64) -> FieldError {
    let mut e = FieldError::duplicate(path, "");
    e.bad_value = validation::BadValue::Omitted;
    e.message = format!(
        "{{\"Name\":\"\",\"Protocol\":{},\"AppProtocol\":null,\"Port\":{port},\"TargetPort\":0,\"NodePort\":0}}",
        Value::String(protocol.to_owned())
    );
    e
}

/// The cluster IP and IP family fields of an IPv4 single-stack cluster, checked before
/// everything else as upstream's allocator does: when they are wrong, only they are
/// reported.
fn validate_ip_fields(svc: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let spec = Path::new("spec");
    if svc_type(svc) == "ExternalName" {
        for (field, pointer) in [
            ("ipFamilyPolicy", "/spec/ipFamilyPolicy"),
            ("clusterIPs", "/spec/clusterIPs"),
            ("ipFamilies", "/spec/ipFamilies"),
        ] {
            let set = match svc.pointer(pointer) {
                None | Some(Value::Null) => false,
                Some(Value::Array(a)) => !a.is_empty(),
                Some(_) => true,
            };
            if set {
                errs.push(FieldError::forbidden(
                    &spec.child(field),
                    "may not be set for ExternalName services",
                ));
            }
        }
        return errs;
    }
    let ip = str_at(svc, "/spec/clusterIP");
    let ips_value = svc
        .pointer("/spec/clusterIPs")
        .cloned()
        .unwrap_or(json!([]));
    let ips = strings_at(svc, "/spec/clusterIPs");
    let ips_path = spec.child("clusterIPs");
    if !ips.is_empty() && ip.is_empty() {
        errs.push(FieldError::invalid(
            &ips_path,
            ips_value.clone(),
            "must be empty when `clusterIP` is not specified",
        ));
    } else if ips.first().is_some_and(|first| first != ip) {
        errs.push(FieldError::invalid(
            &ips_path,
            ips_value.clone(),
            "first value must match `clusterIP`",
        ));
    }
    let family_of = |ip: &str| match ip.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => Some("IPv4"),
        Ok(std::net::IpAddr::V6(_)) => Some("IPv6"),
        Err(_) => None,
    };
    for (i, one) in ips.iter().enumerate() {
        if one == "None" && i == 0 {
            continue;
        }
        if family_of(one).is_none() {
            errs.push(FieldError::invalid(
                &ips_path.index(i),
                one.as_str(),
                "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
            ));
        }
    }
    if ips.len() == 2 && family_of(&ips[0]).is_some() && family_of(&ips[0]) == family_of(&ips[1]) {
        errs.push(FieldError::invalid(
            &ips_path,
            ips_value.clone(),
            "may specify no more than one IP for each IP family",
        ));
    }
    let policy = str_at(svc, "/spec/ipFamilyPolicy");
    const POLICIES: &[&str] = &["PreferDualStack", "RequireDualStack", "SingleStack"];
    if !policy.is_empty() && !POLICIES.contains(&policy) {
        errs.push(FieldError::not_supported(
            &spec.child("ipFamilyPolicy"),
            policy,
            POLICIES,
        ));
    }
    let families = strings_at(svc, "/spec/ipFamilies");
    let mut seen = BTreeSet::new();
    for (i, f) in families.iter().enumerate() {
        let path = spec.child("ipFamilies").index(i);
        if !["IPv4", "IPv6"].contains(&f.as_str()) {
            errs.push(FieldError::not_supported(
                &path,
                f.as_str(),
                &["IPv4", "IPv6"],
            ));
        } else if !seen.insert(f.clone()) {
            errs.push(FieldError::duplicate(&path, f.as_str()));
        }
    }
    if !errs.is_empty() {
        return errs;
    }
    let policy_path = spec.child("ipFamilyPolicy");
    if policy == "SingleStack" {
        if ips.len() == 2 {
            errs.push(FieldError::invalid(
                &policy_path,
                policy,
                "must be 'RequireDualStack' or 'PreferDualStack' when multiple cluster IPs are specified",
            ));
        }
        if families.len() == 2 {
            errs.push(FieldError::invalid(
                &policy_path,
                policy,
                "must be 'RequireDualStack' or 'PreferDualStack' when multiple IP families are specified",
            ));
        }
    }
    for (i, one) in ips.iter().enumerate() {
        if i >= families.len() && family_of(one) == Some("IPv6") {
            errs.push(FieldError::invalid(
                &ips_path.index(i),
                ips_value.clone(),
                "IPv6 is not configured on this cluster",
            ));
        }
    }
    if !errs.is_empty() {
        return errs;
    }
    // A headless Service without selector may name both families on any cluster.
    let selectorless = svc
        .pointer("/spec/selector")
        .and_then(Value::as_object)
        .is_none_or(|m| m.is_empty());
    if ip == "None" && selectorless {
        return errs;
    }
    if policy == "RequireDualStack" {
        errs.push(FieldError::invalid(
            &policy_path,
            policy,
            "this cluster is not configured for dual-stack services",
        ));
    }
    for (i, f) in families.iter().enumerate() {
        if f == "IPv6" {
            errs.push(FieldError::invalid(
                &spec.child("ipFamilies").index(i),
                f.as_str(),
                "not configured on this cluster",
            ));
        }
    }
    errs
}

fn validate_service(svc: &Value) -> Vec<FieldError> {
    let ip_errs = validate_ip_fields(svc);
    if !ip_errs.is_empty() {
        return ip_errs;
    }
    let mut errs = Vec::new();
    let spec = Path::new("spec");
    let ty = svc_type(svc);
    let headless = str_at(svc, "/spec/clusterIP") == "None";
    let ps = ports(svc);
    if ps.is_empty() && ty != "ExternalName" && !headless {
        errs.push(FieldError::required(&spec.child("ports"), ""));
    }
    let mut names = BTreeSet::new();
    for (i, p) in ps.iter().enumerate() {
        let path = spec.child("ports").index(i);
        let name = p.get("name").and_then(Value::as_str).unwrap_or("");
        if ps.len() > 1 && name.is_empty() {
            errs.push(FieldError::required(&path.child("name"), ""));
        } else if !name.is_empty() {
            for msg in validation::is_dns1123_label(name) {
                errs.push(FieldError::invalid(&path.child("name"), name, msg));
            }
            if !names.insert(name.to_owned()) {
                errs.push(FieldError::duplicate(&path.child("name"), name));
            }
        }
        check_port_num(
            &mut errs,
            &path.child("port"),
            p.get("port").unwrap_or(&json!(0)),
        );
        let proto = p.get("protocol").and_then(Value::as_str).unwrap_or("");
        if !PROTOCOLS.contains(&proto) {
            errs.push(FieldError::not_supported(
                &path.child("protocol"),
                proto,
                PROTOCOLS,
            ));
        }
        match p.get("targetPort") {
            Some(Value::String(s)) => {
                for msg in validation::is_valid_port_name(s) {
                    errs.push(FieldError::invalid(
                        &path.child("targetPort"),
                        s.as_str(),
                        msg,
                    ));
                }
            }
            Some(v) => check_port_num(&mut errs, &path.child("targetPort"), v),
            None => {}
        }
        if let Some(app) = p.get("appProtocol").and_then(Value::as_str) {
            for msg in validation::is_qualified_name(app) {
                errs.push(FieldError::invalid(&path.child("appProtocol"), app, msg));
            }
        }
        let node_port = p.get("nodePort").and_then(Value::as_i64).unwrap_or(0);
        if node_port != 0 && ty == "ClusterIP" {
            errs.push(FieldError::forbidden(
                &path.child("nodePort"),
                "may not be used when `type` is 'ClusterIP'",
            ));
        }
    }
    // (protocol, port) pairs are unique.
    let mut seen = BTreeSet::new();
    for (i, p) in ps.iter().enumerate() {
        let port = p.get("port").and_then(Value::as_i64).unwrap_or(0);
        let proto = p.get("protocol").and_then(Value::as_str).unwrap_or("");
        if !seen.insert((proto.to_owned(), port)) {
            errs.push(duplicate_port(&spec.child("ports").index(i), proto, port));
        }
    }
    if ty == "ExternalName" {
        let ext = str_at(svc, "/spec/externalName");
        if ext.is_empty() {
            errs.push(FieldError::required(&spec.child("externalName"), ""));
        }
    }
    if let Some(sel) = svc.pointer("/spec/selector").and_then(Value::as_object) {
        let labels: BTreeMap<String, String> = sel
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_owned()))
            .collect();
        errs.extend(validation::validate_labels(
            &labels,
            &spec.child("selector"),
        ));
    }
    for (i, ip) in strings_at(svc, "/spec/externalIPs").iter().enumerate() {
        let path = spec.child("externalIPs").index(i);
        match ip.parse::<std::net::IpAddr>() {
            Err(_) => errs.push(FieldError::invalid(
                &path,
                ip.as_str(),
                "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
            )),
            Ok(addr) => {
                if let Some(msg) = special_ip(addr) {
                    errs.push(FieldError::invalid(&path, ip.as_str(), msg));
                }
            }
        }
    }
    let hc = svc
        .pointer("/spec/healthCheckNodePort")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    if hc != 0 && !alloc::needs_health_check(svc) {
        errs.push(FieldError::invalid(
            &spec.child("healthCheckNodePort"),
            hc,
            "may only be set when `type` is 'LoadBalancer' and `externalTrafficPolicy` is 'Local'",
        ));
    }
    let affinity = str_at(svc, "/spec/sessionAffinity");
    if affinity == "ClientIP" {
        if let Some(t) = svc
            .pointer("/spec/sessionAffinityConfig/clientIP/timeoutSeconds")
            .and_then(Value::as_i64)
        {
            if t <= 0 || t > 86400 {
                errs.push(FieldError::invalid(
                    &spec
                        .child("sessionAffinityConfig")
                        .child("clientIP")
                        .child("timeoutSeconds"),
                    t,
                    "must be greater than 0 and less than 86400",
                ));
            }
        }
    }
    if !["ClientIP", "None"].contains(&affinity) {
        errs.push(FieldError::not_supported(
            &spec.child("sessionAffinity"),
            affinity,
            &["ClientIP", "None"],
        ));
    }
    let etp = str_at(svc, "/spec/externalTrafficPolicy");
    if externally_accessible(svc) {
        if !["Cluster", "Local"].contains(&etp) {
            errs.push(FieldError::not_supported(
                &spec.child("externalTrafficPolicy"),
                etp,
                &["Cluster", "Local"],
            ));
        }
    } else if !etp.is_empty() {
        errs.push(FieldError::invalid(
            &spec.child("externalTrafficPolicy"),
            etp,
            "may only be set for externally-accessible services",
        ));
    }
    let itp = str_at(svc, "/spec/internalTrafficPolicy");
    if ty != "ExternalName" && !["Cluster", "Local"].contains(&itp) {
        errs.push(FieldError::not_supported(
            &spec.child("internalTrafficPolicy"),
            itp,
            &["Cluster", "Local"],
        ));
    }
    if !SERVICE_TYPES.contains(&ty) {
        errs.push(FieldError::not_supported(
            &spec.child("type"),
            ty,
            SERVICE_TYPES,
        ));
    }
    errs
}

/// Upstream's warnings on a Service that is written.
fn warn_about(svc: &Value) {
    let has_external_ips = svc
        .pointer("/spec/externalIPs")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty());
    if has_external_ips {
        crate::rest::warn(
            "spec.externalIPs is deprecated and may no longer be implemented in some clusters"
                .into(),
        );
    }
    if svc_type(svc) != "ExternalName" && !str_at(svc, "/spec/externalName").is_empty() {
        crate::rest::warn(
            "spec.externalName is ignored when spec.type is not \"ExternalName\"".into(),
        );
    }
}

impl Strategy for Services {
    fn validate_name(&self, name: &str) -> Vec<String> {
        validation::is_dns1123_label(name)
    }

    fn prepare_create(&self, obj: &mut Value) {
        default_service(obj);
        if let Some(o) = obj.as_object_mut() {
            o.insert("status".into(), json!({"loadBalancer": {}}));
        }
    }

    fn prepare_for_create(&self, obj: &mut Value) {
        normalize_cluster_ips(obj);
    }

    fn prepare_update(&self, new: &mut Value, old: &Value) {
        default_service(new);
        normalize_cluster_ips(new);
        carry_over(new, old);
        if let Some(o) = new.as_object_mut() {
            o.insert(
                "status".into(),
                old.get("status").cloned().unwrap_or_else(|| json!({})),
            );
        }
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let errs = validate_service(obj);
        if errs.is_empty() {
            warn_about(obj);
        }
        errs
    }

    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errs = validate_service(new);
        let external = |s: &Value| svc_type(s) == "ExternalName";
        if !external(new) && !external(old) {
            let first = |s: &Value| s.pointer("/spec/clusterIPs/0").cloned();
            if let (Some(o), Some(n)) = (first(old), first(new)) {
                if o != n {
                    errs.push(FieldError::invalid(
                        &Path::new("spec").child("clusterIPs").index(0),
                        new.pointer("/spec/clusterIPs")
                            .cloned()
                            .unwrap_or(Value::Null),
                        "may not change once set",
                    ));
                }
            }
        }
        if errs.is_empty() {
            warn_about(new);
        }
        errs
    }

    fn allocator(&self) -> Option<&dyn Allocator> {
        Some(&alloc::ServiceAllocator)
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            Column::NAME,
            COL_TYPE,
            COL_CLUSTER_IP,
            COL_EXTERNAL_IP,
            COL_PORTS,
            Column::AGE,
            COL_SELECTOR,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let ip = match str_at(obj, "/spec/clusterIP") {
            "" => "<none>",
            ip => ip,
        };
        vec![
            json!(name_of(obj)),
            json!(str_at(obj, "/spec/type")),
            json!(ip),
            json!(external_ip(obj)),
            json!(port_string(obj)),
            json!(age_of(obj)),
            json!(selector_string(obj.pointer("/spec/selector"))),
        ]
    }

    fn selectable_fields(&self, obj: &Value) -> Vec<(&'static str, String)> {
        vec![
            ("spec.clusterIP", str_at(obj, "/spec/clusterIP").to_owned()),
            ("spec.type", str_at(obj, "/spec/type").to_owned()),
        ]
    }
}

fn strings_at(obj: &Value, pointer: &str) -> Vec<String> {
    obj.pointer(pointer)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// The load balancer's ingress points, cut short as the printer does.
fn load_balancer_ips(obj: &Value) -> String {
    let mut out = Vec::new();
    if let Some(ing) = obj
        .pointer("/status/loadBalancer/ingress")
        .and_then(Value::as_array)
    {
        for i in ing {
            for k in ["ip", "hostname"] {
                if let Some(v) = i.get(k).and_then(Value::as_str).filter(|v| !v.is_empty()) {
                    out.push(v.to_owned());
                }
            }
        }
    }
    let s = out.join(",");
    if s.len() > 16 {
        format!("{}...", &s[..13])
    } else {
        s
    }
}

/// The EXTERNAL-IP cell.
fn external_ip(obj: &Value) -> String {
    let external = strings_at(obj, "/spec/externalIPs");
    match str_at(obj, "/spec/type") {
        "ClusterIP" | "NodePort" => {
            if external.is_empty() {
                "<none>".into()
            } else {
                external.join(",")
            }
        }
        "LoadBalancer" => {
            let lb = load_balancer_ips(obj);
            if !external.is_empty() {
                let mut all = external;
                if !lb.is_empty() {
                    all.push(lb);
                }
                all.join(",")
            } else if !lb.is_empty() {
                lb
            } else {
                "<pending>".into()
            }
        }
        "ExternalName" => str_at(obj, "/spec/externalName").to_owned(),
        _ => "<unknown>".into(),
    }
}

/// The PORT(S) cell: `80/TCP`, `80:30080/TCP`, comma separated.
fn port_string(obj: &Value) -> String {
    let list: Vec<String> = ports(obj)
        .iter()
        .map(|p| {
            let port = p.get("port").and_then(Value::as_i64).unwrap_or(0);
            let proto = p.get("protocol").and_then(Value::as_str).unwrap_or("");
            match p.get("nodePort").and_then(Value::as_i64).filter(|n| *n > 0) {
                Some(np) => format!("{port}:{np}/{proto}"),
                None => format!("{port}/{proto}"),
            }
        })
        .collect();
    if list.is_empty() {
        "<none>".into()
    } else {
        list.join(",")
    }
}

/// A label map as `k=v,k2=v2` (sorted), or `<none>`.
fn selector_string(sel: Option<&Value>) -> String {
    let pairs: Vec<String> = sel
        .and_then(Value::as_object)
        .map(|m| {
            let sorted: BTreeMap<&String, &Value> = m.iter().collect();
            sorted
                .into_iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                .collect()
        })
        .unwrap_or_default();
    if pairs.is_empty() {
        "<none>".into()
    } else {
        pairs.join(",")
    }
}

/// `ip:port`, with brackets for IPv6.
fn host_port(ip: &str, port: i64) -> String {
    if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    }
}

/// At most three items, then `+ N more...`, as the printers list endpoints.
fn first_three(list: &[String], count: usize) -> String {
    let shown = list.join(",");
    if count > list.len() {
        format!("{shown} + {} more...", count - list.len())
    } else {
        shown
    }
}

/// Why an endpoint may not use `ip` (upstream's ValidateNonSpecialIP), if it may not.
fn special_ip(ip: std::net::IpAddr) -> Option<&'static str> {
    use std::net::IpAddr;
    match ip {
        IpAddr::V4(a) if a.is_unspecified() => Some("may not be unspecified (0.0.0.0)"),
        IpAddr::V6(a) if a.is_unspecified() => Some("may not be unspecified (::)"),
        _ if ip.is_loopback() => Some("may not be in the loopback range (127.0.0.0/8, ::1/128)"),
        IpAddr::V4(a) if a.is_link_local() => {
            Some("may not be in the link-local range (169.254.0.0/16, fe80::/10)")
        }
        IpAddr::V6(a) if (a.segments()[0] & 0xffc0) == 0xfe80 => {
            Some("may not be in the link-local range (169.254.0.0/16, fe80::/10)")
        }
        IpAddr::V4(a) if a.octets()[..3] == [224, 0, 0] => {
            Some("may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)")
        }
        IpAddr::V6(a) if (a.segments()[0] >> 8) == 0xff && (a.segments()[0] & 0x000f) == 2 => {
            Some("may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)")
        }
        _ => None,
    }
}

/// Endpoints (core/v1), the ENDPOINTS column as the printer builds it.
struct Endpoints;

fn format_endpoints(obj: &Value) -> String {
    let subsets = obj
        .get("subsets")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    if subsets.is_empty() {
        return "<none>".into();
    }
    let (max, mut list, mut count) = (3, Vec::new(), 0usize);
    for ss in subsets {
        let addrs: Vec<&str> = ss
            .get("addresses")
            .and_then(Value::as_array)
            .map(|a| a.iter().map(|x| str_at(x, "/ip")).collect())
            .unwrap_or_default();
        let sports = ss
            .get("ports")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        if sports.is_empty() {
            count += addrs.len();
            for a in &addrs {
                if list.len() == max {
                    break;
                }
                list.push((*a).to_owned());
            }
            continue;
        }
        for p in sports {
            let port = p.get("port").and_then(Value::as_i64).unwrap_or(0);
            count += addrs.len();
            for a in &addrs {
                if list.len() == max {
                    break;
                }
                list.push(host_port(a, port));
            }
        }
    }
    first_three(&list, count)
}

impl Strategy for Endpoints {
    fn deprecation(&self) -> Option<&'static str> {
        Some("v1 Endpoints is deprecated in v1.33+; use discovery.k8s.io/v1 EndpointSlice")
    }

    fn prepare_create(&self, obj: &mut Value) {
        default_endpoint_ports(obj);
    }

    fn prepare_update(&self, new: &mut Value, _old: &Value) {
        default_endpoint_ports(new);
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let subsets = obj.get("subsets").and_then(Value::as_array);
        for (i, ss) in subsets.into_iter().flatten().enumerate() {
            let path = Path::new("subsets").index(i);
            for list in ["addresses", "notReadyAddresses"] {
                for (j, a) in ss
                    .get(list)
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .enumerate()
                {
                    let ip = str_at(a, "/ip");
                    let p = path.child(list).index(j).child("ip");
                    match ip.parse::<std::net::IpAddr>() {
                        Err(_) => {
                            // Upstream checks the address twice, with two wordings.
                            errs.push(FieldError::invalid(
                                &p,
                                ip,
                                "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
                            ));
                            errs.push(FieldError::invalid(&p, ip, "must be a valid IP address"));
                        }
                        Ok(addr) => {
                            if let Some(msg) = special_ip(addr) {
                                errs.push(FieldError::invalid(&p, ip, msg));
                            }
                        }
                    }
                }
            }
            let sports = ss.get("ports").and_then(Value::as_array);
            let many = sports.is_some_and(|p| p.len() > 1);
            for (j, p) in sports.into_iter().flatten().enumerate() {
                let pp = path.child("ports").index(j);
                let name = p.get("name").and_then(Value::as_str).unwrap_or("");
                if many && name.is_empty() {
                    errs.push(FieldError::required(&pp.child("name"), ""));
                } else if !name.is_empty() {
                    for msg in validation::is_dns1123_label(name) {
                        errs.push(FieldError::invalid(&pp.child("name"), name, msg));
                    }
                }
                check_port_num(
                    &mut errs,
                    &pp.child("port"),
                    p.get("port").unwrap_or(&json!(0)),
                );
                let proto = p.get("protocol").and_then(Value::as_str).unwrap_or("");
                if !PROTOCOLS.contains(&proto) {
                    errs.push(FieldError::not_supported(
                        &pp.child("protocol"),
                        proto,
                        PROTOCOLS,
                    ));
                }
            }
        }
        errs
    }

    fn columns(&self) -> Vec<Column> {
        vec![Column::NAME, COL_EP_ENDPOINTS, Column::AGE]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        vec![
            json!(name_of(obj)),
            json!(format_endpoints(obj)),
            json!(age_of(obj)),
        ]
    }
}

fn default_endpoint_ports(obj: &mut Value) {
    if let Some(subsets) = obj.get_mut("subsets").and_then(Value::as_array_mut) {
        for ss in subsets {
            if let Some(ps) = ss.get_mut("ports").and_then(Value::as_array_mut) {
                for p in ps {
                    default_field(p, "protocol", json!("TCP"));
                }
            }
        }
    }
}

/// EndpointSlices (discovery.k8s.io/v1).
struct EndpointSlices;

const ADDRESS_TYPES: &[&str] = &["FQDN", "IPv4", "IPv6"];

fn default_slice(obj: &mut Value) {
    if let Some(ps) = obj.get_mut("ports").and_then(Value::as_array_mut) {
        for p in ps {
            default_field(p, "name", json!(""));
            default_field(p, "protocol", json!("TCP"));
        }
    }
    if let Some(eps) = obj.get_mut("endpoints").and_then(Value::as_array_mut) {
        for e in eps {
            default_field(e, "conditions", json!({}));
        }
    }
}

impl Strategy for EndpointSlices {
    fn prepare_create(&self, obj: &mut Value) {
        default_slice(obj);
    }

    fn prepare_update(&self, new: &mut Value, _old: &Value) {
        default_slice(new);
    }

    fn tracks_generation(&self) -> bool {
        true
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let at = str_at(obj, "/addressType");
        if at.is_empty() {
            errs.push(FieldError::required(&Path::new("addressType"), ""));
        } else if !ADDRESS_TYPES.contains(&at) {
            errs.push(FieldError::not_supported(
                &Path::new("addressType"),
                at,
                ADDRESS_TYPES,
            ));
        }
        for (i, p) in obj
            .get("ports")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            let path = Path::new("ports").index(i);
            let name = str_at(p, "/name");
            if !name.is_empty() {
                for msg in validation::is_dns1123_label(name) {
                    errs.push(FieldError::invalid(&path.child("name"), name, msg));
                }
            }
            let proto = p.get("protocol").and_then(Value::as_str).unwrap_or("");
            if !PROTOCOLS.contains(&proto) {
                errs.push(FieldError::not_supported(
                    &path.child("protocol"),
                    proto,
                    PROTOCOLS,
                ));
            }
            if let Some(port) = p.get("port").filter(|v| !v.is_null()) {
                let n = port.as_i64().unwrap_or(-1);
                for msg in validation::is_in_range(n, 0, 65535) {
                    errs.push(FieldError::invalid(&path.child("port"), n, msg));
                }
            }
        }
        for (i, e) in obj
            .get("endpoints")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            let path = Path::new("endpoints").index(i).child("addresses");
            let addrs = e.get("addresses").and_then(Value::as_array);
            if addrs.is_none_or(Vec::is_empty) {
                errs.push(FieldError::required(&path, ""));
            }
            if at != "IPv4" && at != "IPv6" {
                continue;
            }
            for (j, a) in addrs.into_iter().flatten().enumerate() {
                let a = a.as_str().unwrap_or("");
                match a.parse::<std::net::IpAddr>() {
                    Err(_) => errs.push(FieldError::invalid(
                        &path.index(j),
                        a,
                        "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
                    )),
                    Ok(addr) if addr.is_ipv6() != (at == "IPv6") => {
                        // Upstream names the list here, not the item.
                        let want = if at == "IPv6" { "an IPv6" } else { "an IPv4" };
                        errs.push(FieldError::invalid(
                            &path,
                            a,
                            format!("must be {want} address"),
                        ));
                    }
                    Ok(addr) => {
                        if let Some(msg) = special_ip(addr) {
                            errs.push(FieldError::invalid(&path.index(j), a, msg));
                        }
                    }
                }
            }
        }
        errs
    }

    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        if new.get("addressType") != old.get("addressType") {
            // Alone: the addresses are not checked against a type that cannot be. Upstream
            // shows the value as null.
            return vec![FieldError::invalid(
                &Path::new("addressType"),
                Value::Null,
                "field is immutable",
            )];
        }
        self.validate(new)
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            Column::NAME,
            COL_ADDRESSTYPE,
            COL_SLICE_PORTS,
            COL_SLICE_ENDPOINTS,
            Column::AGE,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        vec![
            json!(name_of(obj)),
            json!(str_at(obj, "/addressType")),
            json!(slice_ports(obj)),
            json!(slice_endpoints(obj)),
            json!(age_of(obj)),
        ]
    }
}

fn slice_ports(obj: &Value) -> String {
    let ps = obj
        .get("ports")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    if ps.is_empty() {
        return "<unset>".into();
    }
    let all: Vec<String> = ps
        .iter()
        .map(|p| match p.get("port").and_then(Value::as_i64) {
            Some(n) => n.to_string(),
            // A port without a number shows its name.
            None => str_at(p, "/name").to_owned(),
        })
        .collect();
    let shown: Vec<String> = all.iter().take(3).cloned().collect();
    first_three(&shown, all.len())
}

fn slice_endpoints(obj: &Value) -> String {
    let all: Vec<String> = obj
        .get("endpoints")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .flat_map(|e| {
            e.get("addresses")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(str::to_owned)
        })
        .collect();
    if all.is_empty() {
        return "<unset>".into();
    }
    let shown: Vec<String> = all.iter().take(3).cloned().collect();
    first_three(&shown, all.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_column_shows_three_then_counts() {
        let ep = json!({"subsets": [{
            "addresses": [{"ip": "10.0.0.1"}, {"ip": "10.0.0.2"}],
            "notReadyAddresses": [{"ip": "10.0.0.9"}],
            "ports": [{"port": 80, "name": "a"}, {"port": 81, "name": "b"}],
        }]});
        assert_eq!(
            format_endpoints(&ep),
            "10.0.0.1:80,10.0.0.2:80,10.0.0.1:81 + 1 more..."
        );
        assert_eq!(format_endpoints(&json!({})), "<none>");
    }

    #[test]
    fn duplicate_port_renders_like_go() {
        let e = duplicate_port(&Path::new("spec").child("ports").index(1), "TCP", 80);
        assert_eq!(
            e.to_string(),
            "spec.ports[1]: Duplicate value: {\"Name\":\"\",\"Protocol\":\"TCP\",\"AppProtocol\":null,\"Port\":80,\"TargetPort\":0,\"NodePort\":0}"
        );
    }
}
