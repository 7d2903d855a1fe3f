//! The OpenAPI 3 document served at `/openapi.json`, built from [`ROUTES`] so it lists
//! exactly what is served.

use serde_json::{json, Map, Value};

use crate::server::ROUTES;

fn s(t: &str) -> Value {
    json!({ "type": t })
}

fn r(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

fn arr(items: Value) -> Value {
    json!({ "type": "array", "items": items })
}

fn obj(required: &[&str], props: &[(&str, Value)], closed: bool) -> Value {
    let mut p = Map::new();
    for (k, v) in props {
        p.insert((*k).to_owned(), v.clone());
    }
    let mut o = json!({ "type": "object", "properties": p });
    if !required.is_empty() {
        o["required"] = json!(required);
    }
    if closed {
        o["additionalProperties"] = json!(false);
    }
    o
}

fn list(key: &str, item: &str) -> Value {
    obj(&[key], &[(key, arr(r(item)))], false)
}

fn tags() -> Value {
    json!({ "type": "object", "additionalProperties": { "type": "string" } })
}

fn enumer(vals: &[&str]) -> Value {
    json!({ "type": "string", "enum": vals })
}

fn schemas() -> Value {
    let port = json!({ "type": "integer", "minimum": 1, "maximum": 65535 });
    let state = enumer(&[
        "pending",
        "running",
        "stopping",
        "stopped",
        "shutting-down",
        "terminated",
    ]);
    json!({
        "Error": obj(&["error"], &[
            ("error", obj(&["code", "message"], &[("code", s("string")), ("message", s("string"))], false)),
            ("requestId", s("string")),
        ], false),
        "Zone": obj(&["name", "state"], &[("name", s("string")), ("state", s("string"))], false),
        "Region": obj(&["name", "zones"], &[("name", s("string")), ("zones", arr(r("Zone")))], false),
        "RegionList": list("regions", "Region"),
        "InstanceType": obj(&["name", "cpu", "memoryMib"], &[("name", s("string")), ("cpu", s("integer")), ("memoryMib", s("integer"))], false),
        "InstanceTypeList": list("instanceTypes", "InstanceType"),
        "Vpc": obj(&["id", "cidr", "isDefault"], &[("id", s("string")), ("cidr", s("string")), ("isDefault", s("boolean"))], false),
        "VpcList": list("vpcs", "Vpc"),
        "Subnet": obj(&["id", "vpcId", "zone", "cidr", "availableIpCount"], &[
            ("id", s("string")), ("vpcId", s("string")), ("zone", s("string")), ("cidr", s("string")), ("availableIpCount", s("integer"))], false),
        "SubnetList": list("subnets", "Subnet"),
        "StateReason": obj(&["code", "message"], &[("code", s("string")), ("message", s("string"))], false),
        "Instance": obj(&["id", "name", "instanceType", "cpu", "memoryMib", "state", "region", "zone", "vpcId", "subnetId", "privateIp", "privateDnsName", "launchTime", "tags", "userData"], &[
            ("id", json!({"type": "string", "pattern": "^i-[0-9a-f]{17}$"})),
            ("name", s("string")), ("instanceType", s("string")), ("cpu", s("integer")), ("memoryMib", s("integer")),
            ("state", state), ("stateReason", r("StateReason")), ("region", s("string")), ("zone", s("string")),
            ("vpcId", s("string")), ("subnetId", s("string")), ("privateIp", s("string")), ("privateDnsName", s("string")),
            ("launchTime", json!({"type": "string", "format": "date-time"})),
            ("terminatedTime", json!({"type": "string", "format": "date-time"})),
            ("tags", tags()), ("userData", s("string")),
        ], false),
        "InstanceList": list("instances", "Instance"),
        "RunInstanceRequest": obj(&[], &[
            ("name", s("string")), ("instanceType", s("string")), ("zone", s("string")), ("subnetId", s("string")),
            ("userData", json!({"type": "string", "maxLength": 16384})), ("privateIpAddress", s("string")), ("tags", tags())], true),
        "StopInstanceRequest": obj(&[], &[("force", s("boolean"))], true),
        "Listener": obj(&["port", "protocol", "targetPort"], &[("port", port.clone()), ("protocol", enumer(&["TCP", "UDP"])), ("targetPort", port.clone())], true),
        "HealthCheck": obj(&[], &[
            ("protocol", enumer(&["TCP", "HTTP"])), ("port", s("integer")), ("path", s("string")),
            ("intervalSeconds", s("integer")), ("timeoutSeconds", s("integer")),
            ("healthyThreshold", s("integer")), ("unhealthyThreshold", s("integer"))], true),
        "Target": obj(&["instanceId", "health"], &[("instanceId", s("string")), ("health", enumer(&["healthy", "unhealthy", "unused"])), ("reason", s("string"))], false),
        "LoadBalancer": obj(&["id", "name", "dnsName", "vip", "scheme", "state", "vpcId", "listeners", "targets", "healthCheck", "tags", "createdTime"], &[
            ("id", json!({"type": "string", "pattern": "^lb-[0-9a-f]{17}$"})), ("name", s("string")), ("dnsName", s("string")),
            ("vip", s("string")), ("scheme", s("string")), ("state", s("string")), ("vpcId", s("string")),
            ("listeners", arr(r("Listener"))), ("targets", arr(r("Target"))), ("healthCheck", r("HealthCheck")),
            ("tags", tags()), ("createdTime", json!({"type": "string", "format": "date-time"}))], false),
        "LoadBalancerList": list("loadBalancers", "LoadBalancer"),
        "CreateLoadBalancerRequest": obj(&["name", "listeners"], &[
            ("name", json!({"type": "string", "pattern": "^[A-Za-z0-9]([A-Za-z0-9-]{0,30}[A-Za-z0-9])?$"})),
            ("listeners", arr(r("Listener"))), ("targets", arr(s("string"))), ("healthCheck", r("HealthCheck")), ("tags", tags())], true),
        "UpdateLoadBalancerRequest": obj(&[], &[
            ("listeners", arr(r("Listener"))), ("targets", arr(s("string"))), ("healthCheck", r("HealthCheck")), ("tags", tags())], true),
        "VolumeAttachment": obj(&["instanceId", "device", "attachTime"], &[
            ("instanceId", s("string")), ("device", s("string")), ("attachTime", json!({"type": "string", "format": "date-time"}))], false),
        "Volume": obj(&["id", "zone", "sizeGib", "state", "tags", "createdTime"], &[
            ("id", json!({"type": "string", "pattern": "^vol-[0-9a-f]{17}$"})), ("name", s("string")), ("zone", s("string")),
            ("sizeGib", s("integer")), ("state", enumer(&["available", "in-use"])), ("attachment", r("VolumeAttachment")),
            ("tags", tags()), ("createdTime", json!({"type": "string", "format": "date-time"}))], false),
        "VolumeList": list("volumes", "Volume"),
        "CreateVolumeRequest": obj(&["zone", "sizeGib"], &[
            ("name", json!({"type": "string", "pattern": "^[A-Za-z0-9._-]{1,128}$"})), ("zone", s("string")),
            ("sizeGib", json!({"type": "integer", "minimum": 1, "maximum": 16384})), ("tags", tags())], true),
        "AttachVolumeRequest": obj(&["instanceId"], &[("instanceId", s("string"))], true),
        "DetachVolumeRequest": obj(&[], &[("instanceId", s("string"))], true),
        "ModifyVolumeRequest": obj(&["sizeGib"], &[("sizeGib", json!({"type": "integer", "minimum": 1, "maximum": 16384}))], true),
        "Route": obj(&["destinationCidr", "instanceId", "name", "description", "state", "origin"], &[
            ("destinationCidr", s("string")), ("instanceId", s("string")), ("name", s("string")), ("description", s("string")),
            ("state", enumer(&["active", "blackhole"])), ("origin", s("string"))], false),
        "RouteList": list("routes", "Route"),
        "RouteTable": obj(&["id", "vpcId", "main", "routes"], &[("id", s("string")), ("vpcId", s("string")), ("main", s("boolean")), ("routes", arr(r("Route")))], false),
        "RouteTableList": list("routeTables", "RouteTable"),
        "CreateRouteRequest": obj(&["destinationCidr", "instanceId"], &[
            ("destinationCidr", s("string")), ("instanceId", s("string")), ("name", s("string")), ("description", s("string"))], true),
        "Fault": obj(&[], &[
            ("latencyMs", s("integer")), ("errorRate", json!({"type": "number", "minimum": 0, "maximum": 1})),
            ("errorCode", enumer(&["ServiceUnavailable", "RequestLimitExceeded", "InternalError"]))], true),
        "FaultMap": obj(&["faults"], &[("faults", json!({"type": "object", "additionalProperties": r("Fault")}))], false),
        "PolicyStatement": obj(&["id", "effect", "action"], &[("id", s("string")), ("effect", enumer(&["Deny"])), ("action", s("string")), ("credential", s("string"))], false),
        "PolicyList": list("policies", "PolicyStatement"),
        "CreatePolicyRequest": obj(&["action"], &[("effect", enumer(&["Deny"])), ("action", s("string")), ("credential", s("string"))], true),
        "Quotas": obj(&["maxInstances", "maxLoadBalancers", "maxRoutesPerTable", "maxVolumes", "maxVolumeGib"], &[
            ("maxInstances", s("integer")), ("maxLoadBalancers", s("integer")), ("maxRoutesPerTable", s("integer")),
            ("maxVolumes", s("integer")), ("maxVolumeGib", s("integer"))], true),
        "UpdateQuotasRequest": obj(&[], &[
            ("maxInstances", s("integer")), ("maxLoadBalancers", s("integer")), ("maxRoutesPerTable", s("integer")),
            ("maxVolumes", s("integer")), ("maxVolumeGib", s("integer"))], true),
        "AccessKey": obj(&["accessKeyId", "name"], &[("accessKeyId", s("string")), ("name", s("string")), ("secretAccessKey", s("string"))], false),
        "AccessKeyList": list("accessKeys", "AccessKey"),
        "CreateAccessKeyRequest": obj(&["name"], &[("name", s("string"))], true),
        "CallerIdentity": obj(&["accessKeyId", "name", "region"], &[("accessKeyId", s("string")), ("name", s("string")), ("region", s("string"))], false),
    })
}

fn error_response(desc: &str) -> Value {
    json!({ "description": desc, "content": { "application/json": { "schema": r("Error") } } })
}

/// The document.
pub fn document() -> Value {
    let mut paths = Map::new();
    for rt in ROUTES {
        let mut op = Map::new();
        op.insert("operationId".into(), json!(rt.operation_id));
        op.insert("summary".into(), json!(rt.summary));
        op.insert(
            "description".into(),
            json!(format!(
                "Policy action: `{}`.{}",
                rt.action,
                if rt.control {
                    " A control operation: deny policies and injected faults do not apply."
                } else {
                    ""
                }
            )),
        );
        let mut params = Vec::new();
        for seg in rt.path.split('/') {
            if let Some(name) = seg.strip_prefix('{').and_then(|x| x.strip_suffix('}')) {
                params.push(
                    json!({"name": name, "in": "path", "required": true, "schema": s("string")}),
                );
            }
        }
        for (q, d) in rt.query {
            params.push(json!({"name": q, "in": "query", "required": false, "description": d, "schema": s("string")}));
        }
        if !params.is_empty() {
            op.insert("parameters".into(), Value::Array(params));
        }
        if let Some(req) = rt.request {
            op.insert(
                "requestBody".into(),
                json!({"required": false, "content": {"application/json": {"schema": r(req)}}}),
            );
        }
        let mut responses = Map::new();
        responses.insert(
            rt.status.to_string(),
            json!({"description": "Success", "content": {"application/json": {"schema": r(rt.response)}}}),
        );
        responses.insert("400".into(), error_response("Bad input: MalformedInput, UnknownParameter, MissingParameter, InvalidParameterValue, *LimitExceeded"));
        responses.insert(
            "401".into(),
            error_response("MissingAuthenticationToken or AuthFailure"),
        );
        if !rt.control {
            responses.insert(
                "403".into(),
                error_response("AccessDenied by a deny policy"),
            );
            responses.insert(
                "503".into(),
                error_response("ServiceUnavailable or RequestLimitExceeded (with Retry-After)"),
            );
        }
        if rt.path.contains('{') {
            responses.insert("404".into(), error_response("The resource does not exist"));
        }
        responses.insert("default".into(), error_response("Any other error"));
        op.insert("responses".into(), Value::Object(responses));
        let entry = paths
            .entry(rt.path.to_owned())
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(m) = entry {
            m.insert(rt.method.to_ascii_lowercase(), Value::Object(op));
        }
    }
    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "kumo cloud",
            "version": "v1",
            "description": "The local cloud of kumo: region kumo-1, instances, load balancers, route tables, fault injection. Authenticate with 'Authorization: Bearer <accessKeyId>:<secretAccessKey>'. Errors are {\"error\":{\"code\",\"message\"},\"requestId\"}."
        },
        "servers": [{ "url": "/" }],
        "security": [{ "accessKey": [] }],
        "paths": paths,
        "components": {
            "securitySchemes": { "accessKey": { "type": "http", "scheme": "bearer", "bearerFormat": "ACCESS_KEY_ID:SECRET_ACCESS_KEY" } },
            "schemas": schemas(),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refs(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                if let Some(Value::String(s)) = m.get("$ref") {
                    out.push(s.trim_start_matches("#/components/schemas/").to_owned());
                }
                m.values().for_each(|x| refs(x, out));
            }
            Value::Array(a) => a.iter().for_each(|x| refs(x, out)),
            _ => {}
        }
    }

    #[test]
    fn every_reference_resolves_and_every_route_is_there() {
        let doc = document();
        let mut out = Vec::new();
        refs(&doc, &mut out);
        assert!(!out.is_empty());
        for name in out {
            assert!(
                doc["components"]["schemas"].get(&name).is_some(),
                "missing schema {name}"
            );
        }
        for rt in ROUTES {
            assert!(
                doc["paths"][rt.path][rt.method.to_ascii_lowercase()]["operationId"]
                    == rt.operation_id,
                "{} {}",
                rt.method,
                rt.path
            );
        }
    }
}
