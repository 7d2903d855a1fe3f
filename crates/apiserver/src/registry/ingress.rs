//! networking.k8s.io/v1 Ingresses, IngressClasses and NetworkPolicies (the group's
//! ServiceCIDRs and IPAddresses are in `networking`).

use kumo_apimachinery::validation::{
    is_dns1123_subdomain, is_qualified_name, is_wildcard_dns1123_subdomain, FieldError, Path,
};
use serde_json::{json, Value};

use super::printing::{arr, col, format_label_selector, keep_status, set};
use super::{age_of, name_of, str_at, Column, Resource, Strategy};

const GROUP: &str = "networking.k8s.io";

pub(super) fn resources() -> Vec<Resource> {
    vec![
        Resource {
            group: GROUP,
            version: "v1",
            kind: "IngressClass",
            plural: "ingressclasses",
            singular: "ingressclass",
            namespaced: false,
            short_names: &[],
            categories: &[],
            subresources: &[],
            strategy: Box::new(IngressClasses),
        },
        Resource {
            group: GROUP,
            version: "v1",
            kind: "Ingress",
            plural: "ingresses",
            singular: "ingress",
            namespaced: true,
            short_names: &["ing"],
            categories: &[],
            subresources: &["status"],
            strategy: Box::new(Ingresses),
        },
        Resource {
            group: GROUP,
            version: "v1",
            kind: "NetworkPolicy",
            plural: "networkpolicies",
            singular: "networkpolicy",
            namespaced: true,
            short_names: &["netpol"],
            categories: &[],
            subresources: &[],
            strategy: Box::new(NetworkPolicies),
        },
    ]
}

struct Ingresses;

const PATH_TYPES: [&str; 3] = ["Exact", "ImplementationSpecific", "Prefix"];

/// An IngressBackend: a service (name and port) or a resource, not both.
fn validate_backend(b: &Value, path: &Path, errs: &mut Vec<FieldError>) {
    let service = b.get("service").filter(|s| !s.is_null());
    let resource = b.get("resource").filter(|s| !s.is_null());
    let Some(s) = service else {
        if resource.is_none() {
            errs.push(FieldError::invalid(
                path,
                "",
                "resource or service backend is required",
            ));
        }
        return;
    };
    if resource.is_some() {
        errs.push(FieldError::invalid(
            path,
            "",
            "cannot set both resource and service backends",
        ));
        return;
    }
    let sp = path.child("service");
    if str_at(s, "/name").is_empty() {
        errs.push(FieldError::required(&sp.child("name"), ""));
    }
    let has_name = !str_at(s, "/port/name").is_empty();
    let number = s
        .pointer("/port/number")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    match (has_name, number != 0) {
        (true, true) => errs.push(FieldError::invalid(
            path,
            "",
            "cannot set both port name & port number",
        )),
        (false, false) => errs.push(FieldError::required(
            path,
            "port name or number is required",
        )),
        (false, true) if !(1..=65535).contains(&number) => errs.push(FieldError::invalid(
            &sp.child("port").child("number"),
            number,
            "must be between 1 and 65535, inclusive",
        )),
        _ => {}
    }
}

impl Strategy for Ingresses {
    fn prepare_create(&self, obj: &mut Value) {
        set(obj, "status", json!({"loadBalancer": {}}));
    }

    fn prepare_update(&self, new: &mut Value, old: &Value) {
        keep_status(new, old);
    }

    fn tracks_generation(&self) -> bool {
        true
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let spec = Path::new("spec");
        let backend = obj.pointer("/spec/defaultBackend").filter(|b| !b.is_null());
        let rules = arr(obj, "/spec/rules");
        if backend.is_none() && rules.is_empty() {
            errs.push(FieldError::invalid(
                &spec,
                Value::Null,
                "either `defaultBackend` or `rules` must be specified",
            ));
        }
        if let Some(b) = backend {
            validate_backend(b, &spec.child("defaultBackend"), &mut errs);
        }
        for (i, rule) in rules.iter().enumerate() {
            let rp = spec.child("rules").index(i);
            let host = str_at(rule, "/host");
            if !host.is_empty() {
                let msgs = if host.starts_with("*.") {
                    is_wildcard_dns1123_subdomain(host)
                } else {
                    is_dns1123_subdomain(host)
                };
                for msg in msgs {
                    errs.push(FieldError::invalid(&rp.child("host"), host, msg));
                }
            }
            let Some(http) = rule.get("http").filter(|h| !h.is_null()) else {
                continue;
            };
            let hp = rp.child("http");
            let paths = arr(http, "/paths");
            if paths.is_empty() {
                errs.push(FieldError::required(&hp.child("paths"), ""));
            }
            for (j, p) in paths.iter().enumerate() {
                let pp = hp.child("paths").index(j);
                let path = str_at(p, "/path");
                match str_at(p, "/pathType") {
                    "" => {
                        // Nothing else of a path without a type is checked.
                        errs.push(FieldError::required(
                            &pp.child("pathType"),
                            "pathType must be specified",
                        ));
                        continue;
                    }
                    t if !PATH_TYPES.contains(&t) => errs.push(FieldError::not_supported(
                        &pp.child("pathType"),
                        t,
                        &PATH_TYPES,
                    )),
                    "Exact" | "Prefix" if !path.starts_with('/') => errs.push(FieldError::invalid(
                        &pp.child("path"),
                        path,
                        "must be an absolute path",
                    )),
                    _ => {}
                }
                validate_backend(
                    p.get("backend").unwrap_or(&Value::Null),
                    &pp.child("backend"),
                    &mut errs,
                );
            }
        }
        errs
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            Column::NAME,
            col(
                "Class",
                "string",
                "The name of the IngressClass resource that should be used for additional configurations",
            ),
            col(
                "Hosts",
                "string",
                "Hosts that incoming requests are matched against before the ingress rule",
            ),
            col(
                "Address",
                "string",
                "Address is a list containing ingress points for the load-balancer",
            ),
            col("Ports", "string", "Ports of TLS configurations that open"),
            Column::AGE,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let class = match str_at(obj, "/spec/ingressClassName") {
            "" => "<none>",
            c => c,
        };
        // At most three hosts, then how many rules are left.
        let rules = arr(obj, "/spec/rules");
        let mut hosts: Vec<&str> = Vec::new();
        let mut more = false;
        for r in rules {
            if hosts.len() == 3 {
                more = true;
            }
            let h = str_at(r, "/host");
            if !more && !h.is_empty() {
                hosts.push(h);
            }
        }
        let hosts = match (hosts.is_empty(), more) {
            (true, _) => "*".to_owned(),
            (false, false) => hosts.join(","),
            (false, true) => format!("{} + {} more...", hosts.join(","), rules.len() - 3),
        };
        let mut addresses: Vec<&str> = arr(obj, "/status/loadBalancer/ingress")
            .iter()
            .map(|i| match str_at(i, "/ip") {
                "" => str_at(i, "/hostname"),
                ip => ip,
            })
            .filter(|a| !a.is_empty())
            .collect();
        addresses.sort_unstable();
        addresses.dedup();
        let ports = if arr(obj, "/spec/tls").is_empty() {
            "80"
        } else {
            "80, 443"
        };
        vec![
            json!(name_of(obj)),
            json!(class),
            json!(hosts),
            json!(addresses.join(",")),
            json!(ports),
            json!(age_of(obj)),
        ]
    }
}

struct IngressClasses;

impl Strategy for IngressClasses {
    fn tracks_generation(&self) -> bool {
        true
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let path = Path::new("spec").child("controller");
        let controller = str_at(obj, "/spec/controller");
        if controller.is_empty() {
            errs.push(FieldError::required(&path, ""));
        } else {
            for msg in is_qualified_name(controller) {
                errs.push(FieldError::invalid(&path, controller, msg));
            }
        }
        errs
    }

    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errs = self.validate(new);
        if new.pointer("/spec/controller") != old.pointer("/spec/controller") {
            errs.push(FieldError::invalid(
                &Path::new("spec").child("controller"),
                str_at(new, "/spec/controller"),
                "field is immutable",
            ));
        }
        errs
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            Column::NAME,
            col(
                "Controller",
                "string",
                "Controller that is responsible for handling this class",
            ),
            col(
                "Parameters",
                "string",
                "A reference to a resource with additional parameters",
            ),
            Column::AGE,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let parameters = match obj.pointer("/spec/parameters").filter(|p| p.is_object()) {
            None => "<none>".to_owned(),
            Some(p) => {
                let mut s = str_at(p, "/kind").to_owned();
                if let Some(g) = p.get("apiGroup").and_then(Value::as_str) {
                    s = format!("{s}.{g}");
                }
                format!("{s}/{}", str_at(p, "/name"))
            }
        };
        vec![
            json!(name_of(obj)),
            json!(str_at(obj, "/spec/controller")),
            json!(parameters),
            json!(age_of(obj)),
        ]
    }
}

struct NetworkPolicies;

/// SetDefaults_NetworkPolicy: TCP ports; policy types from the rules present.
fn default_network_policy(obj: &mut Value) {
    let Some(spec) = obj.get_mut("spec").filter(|s| s.is_object()) else {
        return;
    };
    for dir in ["ingress", "egress"] {
        if let Some(rules) = spec.get_mut(dir).and_then(Value::as_array_mut) {
            for r in rules {
                if let Some(ports) = r.get_mut("ports").and_then(Value::as_array_mut) {
                    for p in ports.iter_mut().filter(|p| p.is_object()) {
                        if str_at(p, "/protocol").is_empty() {
                            p["protocol"] = json!("TCP");
                        }
                    }
                }
            }
        }
    }
    if arr(spec, "/policyTypes").is_empty() {
        let mut types = vec![json!("Ingress")];
        if !arr(spec, "/egress").is_empty() {
            types.push(json!("Egress"));
        }
        spec["policyTypes"] = json!(types);
    }
}

impl Strategy for NetworkPolicies {
    fn prepare_create(&self, obj: &mut Value) {
        default_network_policy(obj);
    }

    fn prepare_update(&self, new: &mut Value, _old: &Value) {
        default_network_policy(new);
    }

    fn tracks_generation(&self) -> bool {
        true
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        for (i, t) in arr(obj, "/spec/policyTypes").iter().enumerate() {
            let t = t.as_str().unwrap_or("");
            if !matches!(t, "Ingress" | "Egress") {
                errs.push(FieldError::not_supported(
                    &Path::new("spec").child("policyTypes").index(i),
                    t,
                    &["Ingress", "Egress"],
                ));
            }
        }
        errs
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            Column::NAME,
            col("Pod-Selector", "string", "The pods the policy applies to."),
            Column::AGE,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        vec![
            json!(name_of(obj)),
            json!(format_label_selector(obj.pointer("/spec/podSelector"))),
            json!(age_of(obj)),
        ]
    }
}
