//! networking.k8s.io/v1 ServiceCIDRs and IPAddresses: the ranges Service cluster IPs come
//! from and one object per allocated IP (see `services::alloc`).

use kumo_apimachinery::validation::{FieldError, Path};
use serde_json::{json, Value};

use super::{age_of, name_of, str_at, Column, Resource, Strategy};

pub(super) fn resources() -> Vec<Resource> {
    vec![
        Resource {
            group: "networking.k8s.io",
            version: "v1",
            kind: "ServiceCIDR",
            plural: "servicecidrs",
            singular: "servicecidr",
            namespaced: false,
            short_names: &[],
            categories: &[],
            subresources: &["status"],
            strategy: Box::new(ServiceCidrs),
        },
        Resource {
            group: "networking.k8s.io",
            version: "v1",
            kind: "IPAddress",
            plural: "ipaddresses",
            singular: "ipaddress",
            namespaced: false,
            short_names: &["ip"],
            categories: &[],
            subresources: &[],
            strategy: Box::new(IpAddresses),
        },
    ]
}

const COL_CIDRS: Column = Column {
    name: "CIDRs",
    type_: "string",
    format: "",
    description: "cidrs defines the IP blocks in CIDR notation (e.g. \"192.168.0.0/24\" or \"2001:db8::/64\") from which to assign service cluster IPs. Max of two CIDRs is allowed, one of each IP family. This field is immutable.",
    priority: 0,
};
const COL_PARENTREF: Column = Column {
    name: "ParentRef",
    type_: "string",
    format: "",
    description: "parentRef references the resource that an IPAddress is attached to. An IPAddress must reference a parent object.",
    priority: 0,
};

/// What is wrong with a CIDR (`10.96.0.0/12` is right), in upstream's words.
fn cidr_problem(s: &str) -> Option<&'static str> {
    const NOT_CIDR: &str = "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)";
    let Some((ip, bits)) = s.split_once('/') else {
        return Some(NOT_CIDR);
    };
    let Ok(bits) = bits.parse::<u8>() else {
        return Some(NOT_CIDR);
    };
    let host_bits = match ip.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(a)) if bits <= 32 => {
            let mask = if bits == 0 {
                0
            } else {
                u32::MAX << (32 - bits)
            };
            u32::from(a) & !mask != 0
        }
        Ok(std::net::IpAddr::V6(a)) if bits <= 128 => {
            let mask = if bits == 0 {
                0
            } else {
                u128::MAX << (128 - bits)
            };
            u128::from(a) & !mask != 0
        }
        _ => return Some(NOT_CIDR),
    };
    host_bits.then_some("must not have bits set beyond the prefix length")
}

struct ServiceCidrs;

impl Strategy for ServiceCidrs {
    // Upstream's status strategy resets the metadata (ResetObjectMetaForStatus or its
    // equivalent): only the status changes through /status.
    fn status_keeps_metadata(&self) -> bool {
        false
    }

    fn prepare_create(&self, obj: &mut Value) {
        if let Some(o) = obj.as_object_mut() {
            o.insert("status".into(), json!({}));
        }
    }

    fn prepare_update(&self, new: &mut Value, old: &Value) {
        if let Some(o) = new.as_object_mut() {
            match old.get("status") {
                Some(s) => o.insert("status".into(), s.clone()),
                None => o.remove("status"),
            };
        }
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let path = Path::new("spec").child("cidrs");
        let cidrs = obj
            .pointer("/spec/cidrs")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if cidrs.is_empty() {
            errs.push(FieldError::required(&path, ""));
        } else if cidrs.len() > 2 {
            errs.push(FieldError::too_many(&path, cidrs.len() as i64, 2));
        }
        for (i, c) in cidrs.iter().enumerate() {
            let c = c.as_str().unwrap_or("");
            match cidr_problem(c) {
                None => {}
                Some(msg) => errs.push(FieldError::invalid(&path.index(i), c, msg)),
            }
        }
        errs
    }

    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errs = self.validate(new);
        // CIDRs stay; a second one may be added.
        let list = |o: &Value| -> Vec<String> {
            o.pointer("/spec/cidrs")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .map(|v| v.as_str().unwrap_or("").to_owned())
                        .collect()
                })
                .unwrap_or_default()
        };
        let (new_cidrs, old_cidrs) = (list(new), list(old));
        for (i, o) in old_cidrs.iter().enumerate() {
            let n = new_cidrs.get(i).map(String::as_str).unwrap_or("");
            if n != o {
                errs.push(FieldError::invalid(
                    &Path::new("spec").child("cidrs").index(i),
                    n,
                    "field is immutable",
                ));
            }
        }
        errs
    }

    fn columns(&self) -> Vec<Column> {
        vec![Column::NAME, COL_CIDRS, Column::AGE]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let cidrs: Vec<&str> = obj
            .pointer("/spec/cidrs")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        vec![
            json!(name_of(obj)),
            json!(cidrs.join(",")),
            json!(age_of(obj)),
        ]
    }
}

struct IpAddresses;

impl Strategy for IpAddresses {
    fn validate_name(&self, name: &str) -> Vec<String> {
        let leading_zero = !name.contains(':')
            && name
                .split('.')
                .any(|part| part.len() > 1 && part.starts_with('0'));
        match name.parse::<std::net::IpAddr>() {
            Ok(ip) if ip.to_string() == name => Vec::new(),
            Ok(ip) => vec![format!("must be in canonical form (\"{ip}\")")],
            Err(_) if leading_zero => vec!["must not have leading 0s".into()],
            Err(_) => vec!["must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)".into()],
        }
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let path = Path::new("spec").child("parentRef");
        if obj.pointer("/spec/parentRef").is_none_or(Value::is_null) {
            errs.push(FieldError::required(&path, ""));
            return errs;
        }
        for f in ["resource", "name"] {
            if str_at(obj, &format!("/spec/parentRef/{f}")).is_empty() {
                errs.push(FieldError::required(&path.child(f), ""));
            }
        }
        errs
    }

    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errs = self.validate(new);
        if new.pointer("/spec/parentRef") != old.pointer("/spec/parentRef") {
            // Upstream shows the value as null.
            errs.push(FieldError::invalid(
                &Path::new("spec").child("parentRef"),
                Value::Null,
                "field is immutable",
            ));
        }
        errs
    }

    fn columns(&self) -> Vec<Column> {
        // Upstream's printer has no Age column but still fills an age cell.
        vec![Column::NAME, COL_PARENTREF]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        vec![
            json!(name_of(obj)),
            json!(parent_ref(obj)),
            json!(age_of(obj)),
        ]
    }
}

/// `services/default/kubernetes` (`resource.group/...` for a grouped resource).
fn parent_ref(obj: &Value) -> String {
    let Some(r) = obj.pointer("/spec/parentRef").filter(|v| v.is_object()) else {
        return "<none>".into();
    };
    let group = str_at(r, "/group");
    let resource = str_at(r, "/resource");
    let mut s = if group.is_empty() {
        resource.to_lowercase()
    } else {
        format!("{resource}.{group}").to_lowercase()
    };
    let ns = str_at(r, "/namespace");
    if !ns.is_empty() {
        s.push('/');
        s.push_str(ns);
    }
    s.push('/');
    s.push_str(str_at(r, "/name"));
    s
}
