//! rbac.authorization.k8s.io/v1: Roles, ClusterRoles and their bindings, and the bootstrap
//! policy kube-apiserver creates at start (`rbac_bootstrap.yaml`, facts of v1.37.2).

use kumo_apimachinery::validation::{self, FieldError, Path};
use serde_json::{json, Value};

use super::printing::{arr, col, created_at, path_segment_name, wide, CREATED_AT};
use super::{age_of, name_of, str_at, Column, Resource, Strategy};

const GROUP: &str = "rbac.authorization.k8s.io";

pub(super) fn resources() -> Vec<Resource> {
    let r = |kind, plural, singular, namespaced, strategy: Box<dyn Strategy>| Resource {
        group: GROUP,
        version: "v1",
        kind,
        plural,
        singular,
        namespaced,
        short_names: &[],
        categories: &[],
        subresources: &[],
        strategy,
    };
    vec![
        r(
            "ClusterRoleBinding",
            "clusterrolebindings",
            "clusterrolebinding",
            false,
            Box::new(Bindings { cluster: true }),
        ),
        r(
            "ClusterRole",
            "clusterroles",
            "clusterrole",
            false,
            Box::new(Roles { cluster: true }),
        ),
        r(
            "RoleBinding",
            "rolebindings",
            "rolebinding",
            true,
            Box::new(Bindings { cluster: false }),
        ),
        r(
            "Role",
            "roles",
            "role",
            true,
            Box::new(Roles { cluster: false }),
        ),
    ]
}

/// Roles and ClusterRoles: rules (and a ClusterRole's aggregationRule), stored as given.
struct Roles {
    cluster: bool,
}

/// Upstream's ValidatePolicyRule. Required values come last, as the declarative
/// validation upstream runs after the hand-written one reports them.
fn validate_rule(
    rule: &Value,
    path: &Path,
    namespaced: bool,
    errs: &mut Vec<FieldError>,
    required: &mut Vec<FieldError>,
) {
    if arr(rule, "/verbs").is_empty() {
        required.push(FieldError::required(&path.child("verbs"), ""));
    }
    let urls = arr(rule, "/nonResourceURLs");
    if !urls.is_empty() {
        if namespaced {
            errs.push(FieldError::invalid(
                &path.child("nonResourceURLs"),
                json!(urls),
                "namespaced rules cannot apply to non-resource URLs",
            ));
        }
        if !arr(rule, "/apiGroups").is_empty()
            || !arr(rule, "/resources").is_empty()
            || !arr(rule, "/resourceNames").is_empty()
        {
            errs.push(FieldError::invalid(
                &path.child("nonResourceURLs"),
                json!(urls),
                "rules cannot apply to both regular resources and non-resource URLs",
            ));
        }
        return;
    }
    if arr(rule, "/apiGroups").is_empty() {
        errs.push(FieldError::required(
            &path.child("apiGroups"),
            "resource rules must supply at least one api group",
        ));
    }
    if arr(rule, "/resources").is_empty() {
        errs.push(FieldError::required(
            &path.child("resources"),
            "resource rules must supply at least one resource",
        ));
    }
}

impl Strategy for Roles {
    fn validate_name(&self, name: &str) -> Vec<String> {
        validate_rbac_name(name)
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let (mut errs, mut required) = (Vec::new(), Vec::new());
        for (i, rule) in arr(obj, "/rules").iter().enumerate() {
            validate_rule(
                rule,
                &Path::new("rules").index(i),
                !self.cluster,
                &mut errs,
                &mut required,
            );
        }
        if self.cluster {
            if let Some(agg) = obj.get("aggregationRule").filter(|a| !a.is_null()) {
                if arr(agg, "/clusterRoleSelectors").is_empty() {
                    errs.push(FieldError::required(
                        &Path::new("aggregationRule").child("clusterRoleSelectors"),
                        "at least one clusterRoleSelector required if aggregationRule is non-nil",
                    ));
                }
            }
        }
        errs.extend(required);
        errs
    }

    fn columns(&self) -> Vec<Column> {
        vec![Column::NAME, CREATED_AT]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        vec![json!(name_of(obj)), created_at(obj)]
    }
}

/// RBAC object names are path segments.
fn validate_rbac_name(name: &str) -> Vec<String> {
    path_segment_name(name)
}

/// RoleBindings and ClusterRoleBindings.
struct Bindings {
    cluster: bool,
}

impl Bindings {
    fn kinds(&self) -> &'static [&'static str] {
        if self.cluster {
            &["ClusterRole"]
        } else {
            &["Role", "ClusterRole"]
        }
    }
}

/// SetDefaults_RoleBinding / SetDefaults_Subject: the rbac group on roleRef, users and
/// groups (a service account's group stays empty).
fn default_binding(obj: &mut Value) {
    if let Some(r) = obj.get_mut("roleRef").filter(|r| r.is_object()) {
        if str_at(r, "/apiGroup").is_empty() {
            r["apiGroup"] = json!(GROUP);
        }
    }
    if let Some(subjects) = obj.get_mut("subjects").and_then(Value::as_array_mut) {
        for s in subjects.iter_mut().filter(|s| s.is_object()) {
            let kind = str_at(s, "/kind").to_owned();
            if matches!(kind.as_str(), "User" | "Group") && str_at(s, "/apiGroup").is_empty() {
                s["apiGroup"] = json!(GROUP);
            }
        }
    }
}

impl Strategy for Bindings {
    fn validate_name(&self, name: &str) -> Vec<String> {
        validate_rbac_name(name)
    }

    fn prepare_create(&self, obj: &mut Value) {
        default_binding(obj);
    }

    fn prepare_update(&self, new: &mut Value, _old: &Value) {
        default_binding(new);
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let (mut errs, mut required) = (Vec::new(), Vec::new());
        let role_ref = Path::new("roleRef");
        let kind = str_at(obj, "/roleRef/kind");
        if !self.kinds().contains(&kind) {
            errs.push(FieldError::not_supported(
                &role_ref.child("kind"),
                kind,
                self.kinds(),
            ));
        }
        let group = str_at(obj, "/roleRef/apiGroup");
        if group != GROUP {
            errs.push(FieldError::not_supported(
                &role_ref.child("apiGroup"),
                group,
                &[GROUP],
            ));
        }
        let name = str_at(obj, "/roleRef/name");
        if name.is_empty() {
            required.push(FieldError::required(&role_ref.child("name"), ""));
        } else {
            for msg in validate_rbac_name(name) {
                errs.push(FieldError::invalid(&role_ref.child("name"), name, msg));
            }
        }
        for (i, s) in arr(obj, "/subjects").iter().enumerate() {
            let path = Path::new("subjects").index(i);
            let (kind, name, group) = (
                str_at(s, "/kind"),
                str_at(s, "/name"),
                str_at(s, "/apiGroup"),
            );
            if name.is_empty() {
                required.push(FieldError::required(&path.child("name"), ""));
            }
            match kind {
                "ServiceAccount" => {
                    if !name.is_empty() {
                        for msg in validation::is_dns1123_subdomain(name) {
                            errs.push(FieldError::invalid(&path.child("name"), name, msg));
                        }
                    }
                    if !group.is_empty() {
                        errs.push(FieldError::not_supported(
                            &path.child("apiGroup"),
                            group,
                            &[""],
                        ));
                    }
                    if self.cluster && str_at(s, "/namespace").is_empty() {
                        errs.push(FieldError::required(&path.child("namespace"), ""));
                    }
                }
                "User" | "Group" => {
                    if group != GROUP {
                        errs.push(FieldError::not_supported(
                            &path.child("apiGroup"),
                            group,
                            &[GROUP],
                        ));
                    }
                }
                other => errs.push(FieldError::not_supported(
                    &path.child("kind"),
                    other,
                    &["ServiceAccount", "User", "Group"],
                )),
            }
        }
        errs.extend(required);
        errs
    }

    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errs = self.validate(new);
        if new.get("roleRef") != old.get("roleRef") {
            // Upstream shows the internal struct, with Go's field names.
            let r = |k: &str| str_at(new, &format!("/roleRef/{k}")).to_owned();
            errs.push(FieldError::invalid(
                &Path::new("roleRef"),
                json!({"APIGroup": r("apiGroup"), "Kind": r("kind"), "Name": r("name")}),
                "field is immutable",
            ));
        }
        errs
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            Column::NAME,
            col("Role", "string", "The role the binding grants."),
            Column::AGE,
            wide(
                "Users",
                "string",
                if self.cluster {
                    "Users in the clusterRoleBinding"
                } else {
                    "Users in the roleBinding"
                },
            ),
            wide(
                "Groups",
                "string",
                if self.cluster {
                    "Groups in the clusterRoleBinding"
                } else {
                    "Groups in the roleBinding"
                },
            ),
            wide(
                "ServiceAccounts",
                "string",
                if self.cluster {
                    "ServiceAccounts in the clusterRoleBinding"
                } else {
                    "ServiceAccounts in the roleBinding"
                },
            ),
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let (mut users, mut groups, mut sas) = (Vec::new(), Vec::new(), Vec::new());
        for s in arr(obj, "/subjects") {
            let name = str_at(s, "/name");
            match str_at(s, "/kind") {
                "User" => users.push(name.to_owned()),
                "Group" => groups.push(name.to_owned()),
                "ServiceAccount" => sas.push(format!("{}/{name}", str_at(s, "/namespace"))),
                _ => {}
            }
        }
        vec![
            json!(name_of(obj)),
            json!(format!(
                "{}/{}",
                str_at(obj, "/roleRef/kind"),
                str_at(obj, "/roleRef/name")
            )),
            json!(age_of(obj)),
            json!(users.join(", ")),
            json!(groups.join(", ")),
            json!(sas.join(", ")),
        ]
    }
}

/// The annotation that lets the server reconcile a bootstrap object at start.
pub(super) const AUTOUPDATE: &str = "rbac.authorization.kubernetes.io/autoupdate";

/// The bootstrap policy: (plural, object) in creation order, roles before their bindings.
/// Beyond kube-apiserver's own, what `kubeadm init` adds: the binding of its admin group,
/// which kumo's admin certificate carries, and the bindings that let a node join with a
/// bootstrap token (post and get its CSR approved, read its Node) and renew its
/// certificate.
pub(super) fn bootstrap_objects() -> Result<Vec<(&'static str, Value)>, serde_yaml::Error> {
    let doc: Value = serde_yaml::from_str(include_str!("rbac_bootstrap.yaml"))?;
    let mut out = Vec::new();
    for (plural, kind) in [
        ("clusterroles", "ClusterRole"),
        ("clusterrolebindings", "ClusterRoleBinding"),
        ("roles", "Role"),
        ("rolebindings", "RoleBinding"),
    ] {
        for obj in arr(&doc, &format!("/{plural}")) {
            let mut obj = obj.clone();
            obj["apiVersion"] = json!(format!("{GROUP}/v1"));
            obj["kind"] = json!(kind);
            out.push((plural, obj));
        }
    }
    out.push((
        "clusterrolebindings",
        json!({
            "apiVersion": format!("{GROUP}/v1"),
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "kubeadm:cluster-admins"},
            "roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"apiGroup": GROUP, "kind": "Group", "name": "kubeadm:cluster-admins"}],
        }),
    ));
    out.push((
        "clusterroles",
        json!({
            "apiVersion": format!("{GROUP}/v1"),
            "kind": "ClusterRole",
            "metadata": {"name": "kubeadm:get-nodes"},
            "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}],
        }),
    ));
    const TOKENS: &str = "system:bootstrappers:kubeadm:default-node-token";
    for (name, role, group) in [
        ("kubeadm:get-nodes", "kubeadm:get-nodes", TOKENS),
        (
            "kubeadm:kubelet-bootstrap",
            "system:node-bootstrapper",
            TOKENS,
        ),
        (
            "kubeadm:node-autoapprove-bootstrap",
            "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
            TOKENS,
        ),
        (
            "kubeadm:node-autoapprove-certificate-rotation",
            "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
            "system:nodes",
        ),
    ] {
        out.push((
            "clusterrolebindings",
            json!({
                "apiVersion": format!("{GROUP}/v1"),
                "kind": "ClusterRoleBinding",
                "metadata": {"name": name},
                "roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": role},
                "subjects": [{"apiGroup": GROUP, "kind": "Group", "name": group}],
            }),
        ));
    }
    Ok(out)
}

/// Upstream's reconciliation of a bootstrap role or binding that already exists: unless its
/// autoupdate annotation is `false`, missing labels, annotations, rules and subjects are
/// added (nothing the user added is removed). `None` when nothing changes.
pub(super) fn reconcile(existing: &Value, wanted: &Value) -> Option<Value> {
    if str_at(
        existing,
        &format!("/metadata/annotations/{}", AUTOUPDATE.replace('/', "~1")),
    ) == "false"
    {
        return None;
    }
    let mut out = existing.clone();
    for m in ["labels", "annotations"] {
        if let Some(w) = wanted
            .pointer(&format!("/metadata/{m}"))
            .and_then(Value::as_object)
        {
            let meta = out.get_mut("metadata").and_then(Value::as_object_mut)?;
            let have = meta.entry(m).or_insert_with(|| json!({}));
            if let Some(h) = have.as_object_mut() {
                for (k, v) in w {
                    h.entry(k.clone()).or_insert_with(|| v.clone());
                }
            }
        }
    }
    for list in ["rules", "subjects"] {
        let wanted_items = arr(wanted, &format!("/{list}"));
        if wanted_items.is_empty() {
            continue;
        }
        let mut have = arr(&out, &format!("/{list}")).to_vec();
        for w in wanted_items {
            if !have.contains(w) {
                have.push(w.clone());
            }
        }
        out[list] = json!(have);
    }
    if let Some(agg) = wanted.get("aggregationRule") {
        if out.get("aggregationRule").is_none_or(Value::is_null) {
            out["aggregationRule"] = agg.clone();
        }
    }
    (out != *existing).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bootstrap_policy_has_the_well_known_objects() {
        let objs = bootstrap_objects().unwrap();
        for name in [
            "cluster-admin",
            "admin",
            "edit",
            "view",
            "system:node",
            "system:kube-scheduler",
        ] {
            assert!(
                objs.iter()
                    .any(|(p, o)| *p == "clusterroles" && name_of(o) == name),
                "{name}"
            );
        }
        let crb = objs
            .iter()
            .find(|(p, o)| *p == "clusterrolebindings" && name_of(o) == "cluster-admin")
            .unwrap();
        assert_eq!(crb.1["subjects"][0]["name"], "system:masters");
    }

    #[test]
    fn reconcile_adds_and_keeps() {
        let wanted = json!({"metadata": {"name": "r", "annotations": {AUTOUPDATE: "true"}}, "rules": [{"verbs": ["get"]}]});
        let user = json!({"metadata": {"name": "r", "annotations": {AUTOUPDATE: "true"}}, "rules": [{"verbs": ["list"]}]});
        let out = reconcile(&user, &wanted).unwrap();
        assert_eq!(
            out["rules"],
            json!([{"verbs": ["list"]}, {"verbs": ["get"]}])
        );
        assert_eq!(reconcile(&out, &wanted), None);
        let frozen =
            json!({"metadata": {"name": "r", "annotations": {AUTOUPDATE: "false"}}, "rules": []});
        assert_eq!(reconcile(&frozen, &wanted), None);
    }
}
