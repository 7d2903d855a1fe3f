//! The resources this server serves, one strategy each.
//!
//! A [`Resource`] names a resource (group, version, kind, plural, scope, short names); its
//! [`Strategy`] holds the rules that differ between resources: defaulting, validation,
//! table columns, selectable fields. Everything else (the verbs, storage, watch, errors) is
//! shared in [`crate::rest`], so adding a resource is one small strategy.

mod admissionregistration;
pub mod apiregistration;
mod apps;
pub mod authentication;
pub mod authorization;
mod autoscaling;
mod batch;
pub mod binding;
mod bootstrap;
mod certificates;
mod componentstatus;
mod conversion;
mod coordination;
mod core;
mod core_extra;
pub mod crd;
mod custom;
mod events;
pub mod eviction;
mod flowcontrol;
mod ingress;
mod networking;
mod node;
mod nodes;
mod pod_subresources;
mod podcertificates;
mod pods;
mod policy;
mod printing;
mod rbac;
mod resource;
mod scheduling;
pub(crate) mod services;
mod storage;
mod storagemigration;
mod workloads_core;

use std::sync::{Arc, RwLock};

pub use bootstrap::bootstrap_policy;
pub use services::{first_service_ip, parse_service_cidr, service_cidr, DEFAULT_SERVICE_CIDR};

use kumo_apimachinery::status::GroupResource;
use kumo_apimachinery::validation::FieldError;
use serde_json::{json, Value};

/// A column of a `Table` answer.
#[derive(Clone, Copy, Debug)]
pub struct Column {
    pub name: &'static str,
    /// `string`, `integer`, `date`, ...
    pub type_: &'static str,
    pub format: &'static str,
    pub description: &'static str,
    /// 0: always shown; 1: only with `-o wide`.
    pub priority: u8,
}

impl Column {
    /// The first column of every table.
    pub const NAME: Column = Column {
        name: "Name",
        type_: "string",
        format: "name",
        description: "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names",
        priority: 0,
    };
    /// The `Age` column of the built-in printers.
    pub const AGE: Column = Column {
        name: "Age",
        type_: "string",
        format: "",
        description: "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata",
        priority: 0,
    };

    /// The column definition as a Table carries it.
    pub fn to_json(&self) -> Value {
        json!({
            "name": self.name,
            "type": self.type_,
            "format": self.format,
            "description": self.description,
            "priority": self.priority,
        })
    }
}

/// The rules of one resource.
pub trait Strategy: Send + Sync {
    /// Defaults set on a new object, before validation.
    fn prepare_create(&self, _obj: &mut Value) {}
    /// The type's defaulting (and, for a custom resource, pruning) alone, as decoding
    /// applies it: run again on an object a mutating admission webhook changed, as
    /// upstream decodes the webhook's result.
    fn default(&self, _obj: &mut Value) {}
    /// What upstream's strategy sets in PrepareForCreate: after the field manager has
    /// recorded the request, so the request's manager does not own these fields.
    fn prepare_for_create(&self, _obj: &mut Value) {}
    /// Defaults and carried-over fields on an update, before validation.
    fn prepare_update(&self, _new: &mut Value, _old: &Value) {}
    /// The same for an update through the `status` subresource (`rest` has already taken
    /// everything but the status from the stored object).
    fn prepare_status_update(&self, _new: &mut Value, _old: &Value) {}
    /// The same for an update through the `finalize` subresource (`rest` has taken
    /// everything but `spec.finalizers` from the stored object).
    fn prepare_finalize_update(&self, _new: &mut Value, _old: &Value) {}
    /// The same for an update through another subresource that changes part of the
    /// object (a CertificateSigningRequest's `approval`); a plain update by default.
    fn prepare_subresource_update(&self, _subresource: &str, new: &mut Value, old: &Value) {
        self.prepare_update(new, old)
    }
    /// Subresources served by POST only, each changing the object (pods/binding).
    fn post_subresources(&self) -> &'static [&'static str] {
        &[]
    }
    /// A POST of `body` to subresource `sub` of the object `current` named `name`: the
    /// object as it is to be written, or the error to answer. The strategy validates the
    /// body itself; the result is written as it is (no update hooks, no managed fields, as
    /// upstream's binding storage writes the pod directly).
    fn post_subresource(
        &self,
        sub: &str,
        _name: &str,
        _body: &Value,
        _current: &Value,
    ) -> Result<Value, kumo_apimachinery::status::ApiError> {
        Err(kumo_apimachinery::status::ApiError::bad_request(format!(
            "subresource {sub} takes no POST"
        )))
    }
    /// Whether something still holds up the deletion of an object marked for deletion:
    /// its `metadata.finalizers` by default (namespaces also wait for `spec.finalizers`).
    /// An update that leaves a deleted object with nothing pending deletes it.
    fn finalizers_pending(&self, obj: &Value) -> bool {
        obj.pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty())
    }
    /// Objects that admission looks up on create (storage keys), each with the error to
    /// answer when it is missing; e.g. the pod's service account.
    fn admission_lookups(&self, _obj: &Value) -> Vec<Lookup> {
        Vec::new()
    }
    /// Collections admission reads on create, by storage key prefix, each handed to
    /// `admit_create` as one array under its `what` (e.g. every StorageClass, to find the
    /// default one).
    fn admission_lists(&self, _obj: &Value) -> Vec<(&'static str, String)> {
        Vec::new()
    }
    /// Admission on create, after defaulting and before validation, with the objects
    /// `admission_lookups` found (by their `what`). An error refuses the object.
    fn admit_create(
        &self,
        _obj: &mut Value,
        _found: &[(&'static str, Value)],
    ) -> Result<(), kumo_apimachinery::status::ApiError> {
        Ok(())
    }
    /// Graceful deletion (upstream's CheckGracefulDelete): `Some(grace period seconds)`
    /// marks the object (deletionTimestamp, deletionGracePeriodSeconds) and leaves it to
    /// whoever finishes it after the period; `Some(0)` marks it and removes it at once
    /// (unless it has finalizers). `None`: the resource has no graceful deletion. `opts`
    /// are the DeleteOptions.
    fn graceful_delete(&self, _obj: &Value, _opts: &Value) -> Option<i64> {
        None
    }
    /// What a DELETE without a propagation policy does to the dependents (upstream's
    /// DefaultGarbageCollectionPolicy).
    fn default_gc_policy(&self) -> GcPolicy {
        GcPolicy::DeleteDependents
    }
    /// A warning for a DELETE that leaves the policy to [`Self::default_gc_policy`].
    fn default_gc_warning(&self) -> Option<&'static str> {
        None
    }
    /// Whether a DELETE only marks the object, which stays until a controller finishes
    /// it (namespaces, until their spec.finalizers are gone). The hook may change `obj`
    /// (e.g. its phase).
    fn delete_pending(&self, _obj: &mut Value) -> bool {
        false
    }
    /// Problems with an object name (a DNS-1123 subdomain by default).
    fn validate_name(&self, name: &str) -> Vec<String> {
        kumo_apimachinery::validation::is_dns1123_subdomain(name)
    }
    /// Whether DELETE of the collection is served (not for namespaces, as upstream).
    fn delete_collection(&self) -> bool {
        true
    }
    /// Validation of a new object (beyond the object metadata, which `rest` checks).
    fn validate(&self, _obj: &Value) -> Vec<FieldError> {
        Vec::new()
    }
    /// Validation of an update.
    fn validate_update(&self, new: &Value, _old: &Value) -> Vec<FieldError> {
        self.validate(new)
    }
    /// Validation of an update through the `status` subresource (by default the same as
    /// any update).
    fn validate_status_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        self.validate_update(new, old)
    }
    /// What the field manager compares with the live object on an update through
    /// `subresource`, when not the object as prepared: upstream's field manager sees the
    /// request (decoded, with its defaults) before the strategy drops what the subresource
    /// may not change, and pods' `ephemeralcontainers` and `resize` drop more than their
    /// reset fields.
    fn tracked_request(&self, _subresource: &str, _request: &Value, _old: &Value) -> Option<Value> {
        None
    }
    /// Validation of an update through another subresource that changes part of the
    /// object (pods' `ephemeralcontainers` and `resize`); a plain update's by default.
    fn validate_subresource_update(
        &self,
        _subresource: &str,
        new: &Value,
        old: &Value,
    ) -> Vec<FieldError> {
        self.validate_update(new, old)
    }
    /// The stored form of an object this endpoint serves (when it serves another
    /// version's objects, e.g. events.k8s.io/v1 Events are stored as core/v1 Events).
    /// Fails only where a conversion webhook is called.
    fn stored_form(&self, obj: Value) -> Result<Value, kumo_apimachinery::status::ApiError> {
        Ok(obj)
    }
    /// The endpoint's form of a stored object. A strategy that overrides it also says so
    /// in [`Strategy::converts`].
    fn served_form(&self, obj: Value) -> Result<Value, kumo_apimachinery::status::ApiError> {
        Ok(obj)
    }
    /// Whether `served_form` changes objects; when it does not, lists and watches hand out
    /// the stored bytes without decoding them.
    fn converts(&self) -> bool {
        false
    }
    /// Whether the kind has a field label conversion of its own even without selectable
    /// fields (custom resources): unsupported fields are then worded
    /// `field label not supported: <field>`.
    fn converts_field_labels(&self) -> bool {
        false
    }
    /// Whether `metadata.generation` counts changes of everything but metadata and status.
    fn tracks_generation(&self) -> bool {
        false
    }
    /// Columns of the table, `Name` first (the default is Name and Age).
    fn columns(&self) -> Vec<Column> {
        vec![Column::NAME, Column::AGE]
    }
    /// How the printer orders the rows of a list table (by default, as listed).
    fn row_order(&self, _a: &Value, _b: &Value) -> std::cmp::Ordering {
        std::cmp::Ordering::Equal
    }
    /// The cells of one row, in column order.
    fn cells(&self, obj: &Value) -> Vec<Value> {
        vec![json!(name_of(obj)), json!(age_of(obj))]
    }
    /// Fields besides `metadata.name` and `metadata.namespace` that field selectors may
    /// use, with their values for `obj`.
    fn selectable_fields(&self, _obj: &Value) -> Vec<(&'static str, String)> {
        Vec::new()
    }
    /// The selectable field the watch cache indexes (upstream's trigger function): lists
    /// and watches that pin it with `=` read only the objects with that value.
    fn watch_index(&self) -> Option<crate::cache::WatchIndex> {
        None
    }
    /// Where the object keeps what its `scale` subresource shows, for resources that
    /// serve one.
    fn scale(&self) -> Option<ScaleSpec> {
        None
    }
    /// What the resource's objects hold in the store besides themselves (Services: their
    /// cluster IPs and node ports), reserved and released around every write.
    fn allocator(&self) -> Option<&dyn Allocator> {
        None
    }
    /// Whether an update through `status` also takes the request's metadata (labels,
    /// annotations, finalizers, ...). Most built-in status strategies upstream reset only
    /// the spec; those that reset the metadata too say `false`.
    fn status_keeps_metadata(&self) -> bool {
        true
    }
    /// For resources computed on each request instead of stored (componentstatuses).
    fn computed(&self) -> Option<&dyn Computed> {
        None
    }
    /// The warning every request to a deprecated endpoint carries (core/v1 Endpoints).
    fn deprecation(&self) -> Option<&'static str> {
        None
    }
    /// Where the resource's keys live when not under `/registry/<plural>/`: custom
    /// resources use `/registry/<group>/<plural>/` as upstream, so their plurals cannot
    /// collide with built-in ones.
    fn key_root(&self) -> Option<&str> {
        None
    }
    /// The fields of `obj` its schema does not declare (`spec.foo`), for field validation
    /// of resources without a built-in OpenAPI schema (custom resources).
    fn unknown_fields(&self, _obj: &Value) -> Vec<String> {
        Vec::new()
    }
    /// The verbs discovery lists, when not the built-in list (custom resources list them
    /// in apiextensions-apiserver's order).
    fn verbs(&self) -> Option<&'static [&'static str]> {
        None
    }
    /// Whether the items of a list keep their `kind` and `apiVersion` (custom resources,
    /// which upstream serves as unstructured objects).
    fn list_items_keep_type(&self) -> bool {
        false
    }
    /// The OpenAPI definitions of a resource the built-in schemas do not know (custom
    /// resources): its object's and its list's, each as (name, schema).
    fn openapi_definitions(&self) -> Option<[(String, Value); 2]> {
        None
    }
    /// The schema server-side apply types the objects with when the built-in schemas do
    /// not know the kind (custom resources); its `$ref`s point into the built-in ones.
    fn apply_schema(&self) -> Option<&Value> {
        None
    }
}

/// A resource's default garbage collection policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GcPolicy {
    DeleteDependents,
    /// Kept for compatibility by core/v1 ReplicationControllers and batch/v1 Jobs.
    OrphanDependents,
    /// No garbage collection finalizers at all (events).
    Unsupported,
}

/// Reservations an object holds in the store besides itself, e.g. the IPAddress objects
/// and the node port bitmap of Services. `rest` calls `allocate` on a create or update
/// after defaulting and before validation (as upstream's BeginCreate/BeginUpdate); if
/// validation or the write then fails, it releases what the new object holds beyond the
/// old one; once the write is done, what the old object held beyond the new one (all of
/// it on delete). A dry run reserves and releases nothing. Releases are best effort: a
/// failed release leaks until a repair, never double-books.
pub trait Allocator: Send + Sync {
    /// Reserves what `new` needs and `old` (the stored object, on update) does not hold
    /// yet, and writes the values chosen into `new`. A dry run chooses without reserving.
    /// On error, nothing stays reserved. `new` is not validated yet: the allocator checks
    /// what it relies on.
    fn allocate<'a>(
        &'a self,
        store: &'a dyn kumo_storage::Store,
        new: &'a mut Value,
        old: Option<&'a Value>,
        dry_run: bool,
    ) -> futures::future::BoxFuture<'a, Result<(), kumo_apimachinery::status::ApiError>>;
    /// Releases what `held` holds and `kept` does not.
    fn release<'a>(
        &'a self,
        store: &'a dyn kumo_storage::Store,
        held: &'a Value,
        kept: Option<&'a Value>,
    ) -> futures::future::BoxFuture<'a, ()>;
}

/// Where an object keeps its replica counts and selector, for its `scale` subresource
/// (an autoscaling/v1 Scale). The same description as a CustomResourceDefinition's
/// `subresources.scale`, so custom resources can serve `scale` through the same code.
#[derive(Clone, Debug)]
pub struct ScaleSpec {
    /// Path of the desired replicas, e.g. `.spec.replicas`.
    pub spec_replicas: String,
    /// Path of the observed replicas, e.g. `.status.replicas`.
    pub status_replicas: String,
    /// Path and form of the label selector, if the resource has one.
    pub selector: Option<(String, SelectorForm)>,
}

/// How a selector is stored in an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SelectorForm {
    /// Already a selector string (a custom resource's `labelSelectorPath`).
    Serialized,
    /// A metav1.LabelSelector (`matchLabels`, `matchExpressions`).
    LabelSelector,
    /// A plain map of labels (a ReplicationController's `spec.selector`).
    Map,
}

impl ScaleSpec {
    /// The scale of a built-in workload: `.spec.replicas`, `.status.replicas` and a
    /// selector at `.spec.selector` in the given form.
    pub fn builtin(form: SelectorForm) -> ScaleSpec {
        ScaleSpec {
            spec_replicas: ".spec.replicas".into(),
            status_replicas: ".status.replicas".into(),
            selector: Some((".spec.selector".into(), form)),
        }
    }
}

/// The JSON pointer of a simple JSON path (`.spec.replicas` → `/spec/replicas`).
pub fn json_path_pointer(path: &str) -> String {
    path.split('.')
        .filter(|s| !s.is_empty())
        .map(|s| format!("/{}", s.replace('~', "~0").replace('/', "~1")))
        .collect()
}

/// An object admission needs, by storage key, with the error when it does not exist.
pub struct Lookup {
    /// What the object is to the strategy (e.g. `serviceaccount`).
    pub what: &'static str,
    pub key: String,
    pub missing: kumo_apimachinery::status::ApiError,
}

/// A resource whose objects are computed when asked for, never stored: only get and list.
pub trait Computed: Send + Sync {
    /// Every object, as the API shows it.
    fn objects<'a>(
        &'a self,
        rest: &'a crate::rest::Rest,
    ) -> futures::future::BoxFuture<'a, Vec<Value>>;
}

/// The resources whose registries set ReturnDeletedObject in kube-apiserver v1.37.
const RETURN_DELETED_OBJECT: &[(&str, &str)] = &[
    ("", "namespaces"),
    ("", "persistentvolumeclaims"),
    ("", "persistentvolumes"),
    ("", "pods"),
    ("", "podtemplates"),
    ("", "resourcequotas"),
    ("", "serviceaccounts"),
    ("", "services"),
    ("resource.k8s.io", "deviceclasses"),
    ("resource.k8s.io", "resourceclaims"),
    ("resource.k8s.io", "resourceclaimtemplates"),
    ("resource.k8s.io", "resourceslices"),
    ("storage.k8s.io", "csidrivers"),
    ("storage.k8s.io", "csinodes"),
    ("storage.k8s.io", "storageclasses"),
    ("storage.k8s.io", "volumeattachments"),
    ("storage.k8s.io", "volumeattributesclasses"),
];

/// A served resource.
pub struct Resource {
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
    pub categories: &'static [&'static str],
    /// Subresources served (`status`, ...).
    pub subresources: &'static [&'static str],
    pub strategy: Box<dyn Strategy>,
}

impl Resource {
    /// `v1` or `apps/v1`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_owned()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    pub fn group_resource(&self) -> GroupResource {
        GroupResource::new(self.group, self.plural)
    }

    /// Whether a DELETE that removes the object answers with the object rather than a
    /// success `Status` (upstream's ReturnDeletedObject).
    pub fn returns_deleted_object(&self) -> bool {
        RETURN_DELETED_OBJECT.contains(&(self.group, self.plural))
    }

    /// Storage key prefix of every object of this resource: `/registry/<plural>/` as
    /// kube-apiserver lays out its built-in resources.
    pub fn key_prefix(&self, namespace: Option<&str>) -> String {
        let root = match self.strategy.key_root() {
            Some(r) => r.to_owned(),
            None => format!("/registry/{}", self.plural),
        };
        match namespace {
            Some(ns) if self.namespaced => format!("{root}/{ns}/"),
            _ => format!("{root}/"),
        }
    }

    /// Storage key of one object.
    pub fn key(&self, namespace: Option<&str>, name: &str) -> String {
        format!("{}{}", self.key_prefix(namespace), name)
    }

    /// The verbs discovery lists for the resource itself.
    pub fn verbs(&self) -> &'static [&'static str] {
        if let Some(v) = self.strategy.verbs() {
            v
        } else if self.strategy.delete_collection() {
            &[
                "create",
                "delete",
                "deletecollection",
                "get",
                "list",
                "patch",
                "update",
                "watch",
            ]
        } else {
            &[
                "create", "delete", "get", "list", "patch", "update", "watch",
            ]
        }
    }
}

/// Every resource the server serves: the built-in ones, fixed at start, and the custom
/// resources of the stored CustomResourceDefinitions, replaced as those change
/// (`crd::watch`).
pub struct Registry {
    resources: Vec<Arc<Resource>>,
    dynamic: RwLock<Dynamic>,
}

/// The custom resources served, with what they were built from.
#[derive(Default)]
struct Dynamic {
    resources: Vec<Arc<Resource>>,
    /// What `resources` were built from (the definitions' specs); a change bumps
    /// `generation`.
    source: String,
    generation: u64,
}

impl Registry {
    /// The built-in resources.
    pub fn builtin() -> Registry {
        Registry {
            resources: core::resources()
                .into_iter()
                .chain(binding::resources())
                .chain(componentstatus::resources())
                .chain(pods::resources())
                .chain(apiregistration::resources())
                .chain(events::resources())
                .chain(coordination::resources())
                .chain(nodes::resources())
                .chain(services::resources())
                .chain(networking::resources())
                .chain(apps::resources())
                .chain(batch::resources())
                .chain(workloads_core::resources())
                .chain(autoscaling::resources())
                .chain(core_extra::resources())
                .chain(rbac::resources())
                .chain(authorization::resources())
                .chain(scheduling::resources())
                .chain(node::resources())
                .chain(storage::resources())
                .chain(storagemigration::resources())
                .chain(policy::resources())
                .chain(ingress::resources())
                .chain(certificates::resources())
                .chain(podcertificates::resources())
                .chain(authentication::resources())
                .chain(flowcontrol::resources())
                .chain(admissionregistration::resources())
                .chain(resource::resources())
                .chain(crd::resources())
                .map(Arc::new)
                .collect(),
            dynamic: RwLock::new(Dynamic::default()),
        }
    }

    /// Replaces the custom resources served with those built from `source` (the
    /// definitions), unless they were built from the same `source` already.
    pub fn set_dynamic(&self, source: String, resources: Vec<Arc<Resource>>) {
        let mut d = match self.dynamic.write() {
            Ok(d) => d,
            Err(poisoned) => poisoned.into_inner(),
        };
        if d.source != source {
            d.resources = resources;
            d.source = source;
            d.generation += 1;
        }
    }

    /// Changes with every change of the resources served (what documents built from the
    /// registry are cached by).
    pub fn generation(&self) -> u64 {
        match self.dynamic.read() {
            Ok(d) => d.generation,
            Err(poisoned) => poisoned.into_inner().generation,
        }
    }

    /// The custom resources served now.
    fn dynamic(&self) -> Vec<Arc<Resource>> {
        match self.dynamic.read() {
            Ok(d) => d.resources.clone(),
            Err(poisoned) => poisoned.into_inner().resources.clone(),
        }
    }

    /// Built-in and custom resources, in registration order.
    fn all(&self) -> impl Iterator<Item = Arc<Resource>> + '_ {
        self.resources.iter().cloned().chain(self.dynamic())
    }

    /// The resource at `/api[s]/<group>/<version>/<plural>`.
    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<Arc<Resource>> {
        self.all()
            .find(|r| r.group == group && r.version == version && r.plural == plural)
    }

    /// Whether `/api[s]/<group>/<version>` is served at all.
    pub fn serves(&self, group: &str, version: &str) -> bool {
        self.all().any(|r| r.group == group && r.version == version)
    }

    /// All resources of one group version, in registration order.
    pub fn in_group_version(
        &self,
        group: &str,
        version: &str,
    ) -> impl Iterator<Item = Arc<Resource>> {
        self.all()
            .filter(|r| r.group == group && r.version == version)
            .collect::<Vec<_>>()
            .into_iter()
    }

    /// The non-core groups with their versions, preferred first.
    pub fn groups(&self) -> Vec<(&'static str, Vec<&'static str>)> {
        let mut out: Vec<(&'static str, Vec<&'static str>)> = Vec::new();
        for r in self.all() {
            if r.group.is_empty() {
                continue;
            }
            match out.iter_mut().find(|(g, _)| *g == r.group) {
                Some((_, vs)) if !vs.contains(&r.version) => vs.push(r.version),
                Some(_) => {}
                None => out.push((r.group, vec![r.version])),
            }
        }
        // In kube-apiserver's order of its built-in groups.
        out.sort_by_key(|(g, _)| {
            GROUP_ORDER
                .iter()
                .position(|o| o == g)
                .unwrap_or(GROUP_ORDER.len())
        });
        out
    }
}

/// The order in which kube-apiserver lists its built-in groups in `/apis`.
const GROUP_ORDER: &[&str] = &[
    "apiregistration.k8s.io",
    "apps",
    "events.k8s.io",
    "authentication.k8s.io",
    "authorization.k8s.io",
    "autoscaling",
    "batch",
    "certificates.k8s.io",
    "networking.k8s.io",
    "policy",
    "rbac.authorization.k8s.io",
    "storage.k8s.io",
    "admissionregistration.k8s.io",
    "apiextensions.k8s.io",
    "scheduling.k8s.io",
    "coordination.k8s.io",
    "node.k8s.io",
    "discovery.k8s.io",
    "resource.k8s.io",
    "flowcontrol.apiserver.k8s.io",
    "storagemigration.k8s.io",
];

/// `metadata.name` of an object ("" when absent).
pub fn name_of(obj: &Value) -> &str {
    obj.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// `AGE` of an object from its creationTimestamp.
pub fn age_of(obj: &Value) -> String {
    crate::time::age(
        obj.pointer("/metadata/creationTimestamp")
            .and_then(Value::as_str),
    )
}

/// A string at a JSON pointer ("" when absent).
pub fn str_at<'a>(obj: &'a Value, pointer: &str) -> &'a str {
    obj.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// `s`, or `<none>` when empty (the printers' placeholder).
pub fn or_none(s: &str) -> String {
    if s.is_empty() {
        "<none>".to_owned()
    } else {
        s.to_owned()
    }
}

/// Inserts `k: v` into a JSON object if `k` is absent or null.
/// Puts back the old object's value (or absence) of each named `metadata` field: what a
/// status strategy does for the metadata it does not let /status change.
pub(super) fn keep_old_metadata(new: &mut Value, old: &Value, fields: &[&str]) {
    let Some(meta) = new.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    for f in fields {
        match old.pointer(&format!("/metadata/{f}")) {
            Some(v) => meta.insert((*f).to_owned(), v.clone()),
            None => meta.remove(*f),
        };
    }
}

pub fn default_field(obj: &mut Value, k: &str, v: Value) {
    if let Some(o) = obj.as_object_mut() {
        match o.get(k) {
            None | Some(Value::Null) => {
                o.insert(k.to_owned(), v);
            }
            Some(_) => {}
        }
    }
}

#[cfg(test)]
mod converts_tests {
    use super::*;

    /// Lists and watches splice stored bytes for resources whose strategy does not convert;
    /// a strategy that overrides `served_form` without saying so would serve the stored form.
    #[test]
    fn every_converting_strategy_says_so() {
        let r = Registry::builtin();
        let mut all: Vec<Arc<Resource>> = r.in_group_version("", "v1").collect();
        for (g, versions) in r.groups() {
            for v in versions {
                all.extend(r.in_group_version(g, v));
            }
        }
        for res in all {
            // The stored form of a typical object of the resource, as its endpoint writes it.
            let obj = res
                .strategy
                .stored_form(json!({
                "apiVersion": res.api_version(),
                "kind": res.kind,
                "metadata": {"name": "x", "namespace": "default", "labels": {"a": "b"}},
                "spec": {"k": "v"},
                "type": "Normal",
                "reason": "R",
                "note": "n",
                "regarding": {"kind": "Pod", "name": "p"},
                }))
                .expect("stored form");
            if !res.strategy.converts() {
                assert_eq!(
                    res.strategy.served_form(obj.clone()).expect("served form"),
                    obj,
                    "{}/{} changes objects in served_form but does not say so in converts()",
                    res.api_version(),
                    res.plural
                );
            }
        }
    }
}
