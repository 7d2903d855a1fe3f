//! The Pod Security Standards checks (k8s.io/pod-security-admission/policy), on pod
//! metadata and pod specs as JSON: one function per check and version, the same reasons and
//! details as upstream, evaluated in upstream's order (baseline checks by ID, then restricted
//! checks by ID; a restricted check may replace a baseline one).

use std::collections::BTreeSet;
use std::fmt;

use serde_json::Value;

/// A Pod Security Standards level, ordered from least to most strict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    Privileged,
    Baseline,
    Restricted,
}

impl Level {
    /// Parses a label value (`privileged`, `baseline` or `restricted`).
    pub fn parse(s: &str) -> Option<Level> {
        match s {
            "privileged" => Some(Level::Privileged),
            "baseline" => Some(Level::Baseline),
            "restricted" => Some(Level::Restricted),
            _ => None,
        }
    }

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Privileged => "privileged",
            Level::Baseline => "baseline",
            Level::Restricted => "restricted",
        }
    }
}

/// A policy version: `latest` or `v1.<minor>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Version {
    Latest,
    Minor(u64),
}

impl Version {
    /// Parses `latest` or `v1.x` (no leading zeros, as upstream's pattern).
    pub fn parse(s: &str) -> Option<Version> {
        if s == "latest" {
            return Some(Version::Latest);
        }
        let digits = s.strip_prefix("v1.")?;
        if digits.is_empty()
            || !digits.bytes().all(|b| b.is_ascii_digit())
            || (digits.len() > 1 && digits.starts_with('0'))
        {
            return None;
        }
        // Go's Atoi refuses values beyond int64.
        let n: i64 = digits.parse().ok()?;
        Some(Version::Minor(n as u64))
    }

    /// The minor version whose checks apply: newer versions than the newest check use the
    /// newest checks.
    fn effective_minor(self) -> u64 {
        match self {
            Version::Latest => MAX_MINOR,
            Version::Minor(m) => m.min(MAX_MINOR),
        }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Version::Latest => f.write_str("latest"),
            Version::Minor(m) => write!(f, "v1.{m}"),
        }
    }
}

/// A level at a version, shown as upstream does: `restricted:latest`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LevelVersion {
    pub level: Level,
    pub version: Version,
}

impl fmt::Display for LevelVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.level.as_str(), self.version)
    }
}

/// One failed check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub reason: String,
    pub detail: String,
}

/// The failed checks of one evaluation, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Aggregate(pub Vec<Violation>);

impl Aggregate {
    /// No check failed.
    pub fn allowed(&self) -> bool {
        self.0.is_empty()
    }

    /// The reasons, comma separated (the per-pod summary of a namespace label change).
    pub fn reasons(&self) -> String {
        self.0
            .iter()
            .map(|v| v.reason.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// `reason (detail), reason (detail), ...` as in upstream's messages.
    pub fn details(&self) -> String {
        self.0
            .iter()
            .map(|v| {
                if v.detail.is_empty() {
                    v.reason.clone()
                } else {
                    format!("{} ({})", v.reason, v.detail)
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Checks a pod's metadata and spec at `lv`.
pub fn evaluate(lv: LevelVersion, meta: &Value, spec: &Value) -> Aggregate {
    if lv.level == Level::Privileged {
        return Aggregate::default();
    }
    let v = lv.version.effective_minor();
    let active = |c: &Check| c.versions.iter().rev().find(|x| x.min <= v);
    let mut overridden: BTreeSet<&str> = BTreeSet::new();
    if lv.level == Level::Restricted {
        for c in CHECKS.iter().filter(|c| c.level == Level::Restricted) {
            if let Some(a) = active(c) {
                overridden.extend(a.overrides.iter().copied());
            }
        }
    }
    let mut out = Vec::new();
    for c in CHECKS {
        if c.level > lv.level || (c.level == Level::Baseline && overridden.contains(c.id)) {
            continue;
        }
        if let Some(a) = active(c) {
            if let Some(violation) = (a.check)(meta, spec) {
                out.push(violation);
            }
        }
    }
    Aggregate(out)
}

type CheckFn = fn(&Value, &Value) -> Option<Violation>;

struct Versioned {
    /// The first minor version (of 1.x) this implementation applies to.
    min: u64,
    check: CheckFn,
    /// Baseline checks this restricted check replaces.
    overrides: &'static [&'static str],
}

struct Check {
    id: &'static str,
    level: Level,
    versions: &'static [Versioned],
}

/// The newest version any check names; `latest` and newer versions evaluate as this one.
const MAX_MINOR: u64 = 37;

const fn v(min: u64, check: CheckFn) -> Versioned {
    Versioned {
        min,
        check,
        overrides: &[],
    }
}

const fn vo(min: u64, check: CheckFn, overrides: &'static [&'static str]) -> Versioned {
    Versioned {
        min,
        check,
        overrides,
    }
}

/// Every check, in evaluation order: baseline IDs sorted, then restricted IDs sorted.
static CHECKS: &[Check] = &[
    Check {
        id: "appArmorProfile",
        level: Level::Baseline,
        versions: &[v(0, app_armor_profile)],
    },
    Check {
        id: "capabilities_baseline",
        level: Level::Baseline,
        versions: &[v(0, capabilities_baseline)],
    },
    Check {
        id: "hostNamespaces",
        level: Level::Baseline,
        versions: &[v(0, host_namespaces)],
    },
    Check {
        id: "hostPathVolumes",
        level: Level::Baseline,
        versions: &[v(0, host_path_volumes)],
    },
    Check {
        id: "hostPorts",
        level: Level::Baseline,
        versions: &[v(0, host_ports)],
    },
    Check {
        id: "hostProbesAndHostLifecycle",
        level: Level::Baseline,
        versions: &[v(34, host_probes_and_lifecycle)],
    },
    Check {
        id: "privileged",
        level: Level::Baseline,
        versions: &[v(0, privileged)],
    },
    Check {
        id: "procMount",
        level: Level::Baseline,
        versions: &[v(0, proc_mount), v(35, proc_mount_1_35)],
    },
    Check {
        id: "seLinuxOptions",
        level: Level::Baseline,
        versions: &[v(0, se_linux_options_1_0), v(31, se_linux_options_1_31)],
    },
    Check {
        id: "seccompProfile_baseline",
        level: Level::Baseline,
        versions: &[v(0, seccomp_baseline_1_0), v(19, seccomp_baseline_1_19)],
    },
    Check {
        id: "sysctls",
        level: Level::Baseline,
        versions: &[
            v(0, sysctls_1_0),
            v(27, sysctls_1_27),
            v(29, sysctls_1_29),
            v(32, sysctls_1_32),
            v(37, sysctls_1_37),
        ],
    },
    Check {
        id: "windowsHostProcess",
        level: Level::Baseline,
        versions: &[v(0, windows_host_process)],
    },
    Check {
        id: "allowPrivilegeEscalation",
        level: Level::Restricted,
        versions: &[
            v(8, allow_privilege_escalation),
            v(25, allow_privilege_escalation_1_25),
        ],
    },
    Check {
        id: "capabilities_restricted",
        level: Level::Restricted,
        versions: &[
            vo(22, capabilities_restricted, &["capabilities_baseline"]),
            vo(25, capabilities_restricted_1_25, &["capabilities_baseline"]),
        ],
    },
    Check {
        id: "procMount_restricted",
        level: Level::Restricted,
        versions: &[vo(35, proc_mount, &["procMount"])],
    },
    Check {
        id: "restrictedVolumes",
        level: Level::Restricted,
        versions: &[vo(0, restricted_volumes, &["hostPathVolumes"])],
    },
    Check {
        id: "runAsNonRoot",
        level: Level::Restricted,
        versions: &[v(0, run_as_non_root), v(35, run_as_non_root_1_35)],
    },
    Check {
        id: "runAsUser",
        level: Level::Restricted,
        versions: &[v(23, run_as_user), v(35, run_as_user_1_35)],
    },
    Check {
        id: "seccompProfile_restricted",
        level: Level::Restricted,
        versions: &[
            vo(19, seccomp_restricted, &["seccompProfile_baseline"]),
            vo(25, seccomp_restricted_1_25, &["seccompProfile_baseline"]),
        ],
    },
];

// ---- JSON helpers -------------------------------------------------------------------------

/// A field that is set (present and not null).
fn get<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    v.get(key).filter(|x| !x.is_null())
}

fn get_str<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

fn get_bool(v: &Value, key: &str) -> Option<bool> {
    v.get(key).and_then(Value::as_bool)
}

fn items<'a>(v: &'a Value, key: &str) -> impl Iterator<Item = &'a Value> {
    v.get(key).and_then(Value::as_array).into_iter().flatten()
}

/// Init containers, containers, then ephemeral containers, as upstream's visitor.
fn containers(spec: &Value) -> impl Iterator<Item = &Value> {
    items(spec, "initContainers")
        .chain(items(spec, "containers"))
        .chain(items(spec, "ephemeralContainers"))
}

fn name(c: &Value) -> String {
    get_str(c, "name").to_owned()
}

fn security_context(v: &Value) -> Option<&Value> {
    get(v, "securityContext")
}

fn pod_security_context(spec: &Value) -> Option<&Value> {
    get(spec, "securityContext")
}

fn pluralize(singular: &'static str, plural: &'static str, n: usize) -> &'static str {
    if n == 1 {
        singular
    } else {
        plural
    }
}

fn join_quote<S: AsRef<str>>(items: &[S]) -> String {
    if items.is_empty() {
        return String::new();
    }
    let inner: Vec<&str> = items.iter().map(AsRef::as_ref).collect();
    format!("\"{}\"", inner.join("\", \""))
}

/// Go's `%q` of a string.
fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if c.is_control() => {
                let n = c as u32;
                if n <= 0xffff {
                    out.push_str(&format!("\\u{n:04x}"));
                } else {
                    out.push_str(&format!("\\U{n:08x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `container "a"` / `containers "a", "b"`.
fn containers_phrase(names: &[String]) -> String {
    format!(
        "{} {}",
        pluralize("container", "containers", names.len()),
        join_quote(names)
    )
}

fn is_windows(spec: &Value) -> bool {
    get(spec, "os").is_some_and(|os| get_str(os, "name") == "windows")
}

/// A pod in a user namespace (`hostUsers: false`) gets relaxed checks from 1.35.
fn in_user_namespace(spec: &Value) -> bool {
    get_bool(spec, "hostUsers") == Some(false)
}

fn violation(reason: impl Into<String>, detail: impl Into<String>) -> Option<Violation> {
    Some(Violation {
        reason: reason.into(),
        detail: detail.into(),
    })
}

fn annotations(meta: &Value) -> impl Iterator<Item = (&String, &str)> {
    meta.get("annotations")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k, v.as_str()?)))
}

// ---- baseline -----------------------------------------------------------------------------

const APPARMOR_ANNOTATION_PREFIX: &str = "container.apparmor.security.beta.kubernetes.io/";

fn app_armor_profile(meta: &Value, spec: &Value) -> Option<Violation> {
    let allowed_type = |p: &Value| matches!(get_str(p, "type"), "RuntimeDefault" | "Localhost");
    let mut setters = Vec::new();
    let mut bad_values = BTreeSet::new();
    if let Some(p) = pod_security_context(spec).and_then(|sc| get(sc, "appArmorProfile")) {
        if !allowed_type(p) {
            setters.push("pod".to_owned());
            bad_values.insert(get_str(p, "type").to_owned());
        }
    }
    let mut bad_containers = Vec::new();
    for c in containers(spec) {
        if let Some(p) = security_context(c).and_then(|sc| get(sc, "appArmorProfile")) {
            if !allowed_type(p) {
                bad_containers.push(name(c));
                bad_values.insert(get_str(p, "type").to_owned());
            }
        }
    }
    if !bad_containers.is_empty() {
        setters.push(containers_phrase(&bad_containers));
    }
    let mut bad_annotations: Vec<String> = annotations(meta)
        .filter(|(k, v)| {
            k.starts_with(APPARMOR_ANNOTATION_PREFIX)
                && !(v.is_empty() || *v == "runtime/default" || v.starts_with("localhost/"))
        })
        .map(|(k, v)| format!("{k}={}", go_quote(v)))
        .collect();
    let mut values: Vec<String> = bad_values.into_iter().collect();
    if !bad_annotations.is_empty() {
        bad_annotations.sort();
        setters.push(pluralize("annotation", "annotations", bad_annotations.len()).to_owned());
        values.extend(bad_annotations);
    }
    if setters.is_empty() {
        return None;
    }
    violation(
        pluralize(
            "forbidden AppArmor profile",
            "forbidden AppArmor profiles",
            values.len(),
        ),
        format!(
            "{} must not set AppArmor profile type to {}",
            setters.join(" and "),
            join_quote(&values)
        ),
    )
}

const DEFAULT_CAPABILITIES: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

fn capabilities_baseline(_: &Value, spec: &Value) -> Option<Violation> {
    let mut bad_containers = Vec::new();
    let mut caps = BTreeSet::new();
    for c in containers(spec) {
        let Some(capabilities) = security_context(c).and_then(|sc| get(sc, "capabilities")) else {
            continue;
        };
        let mut valid = true;
        for cap in items(capabilities, "add").filter_map(Value::as_str) {
            if !DEFAULT_CAPABILITIES.contains(&cap) {
                valid = false;
                caps.insert(cap.to_owned());
            }
        }
        if !valid {
            bad_containers.push(name(c));
        }
    }
    if bad_containers.is_empty() {
        return None;
    }
    let caps: Vec<String> = caps.into_iter().collect();
    violation(
        "non-default capabilities",
        format!(
            "{} must not include {} in securityContext.capabilities.add",
            containers_phrase(&bad_containers),
            join_quote(&caps)
        ),
    )
}

fn host_namespaces(_: &Value, spec: &Value) -> Option<Violation> {
    let set: Vec<&str> = [
        ("hostNetwork", "hostNetwork=true"),
        ("hostPID", "hostPID=true"),
        ("hostIPC", "hostIPC=true"),
    ]
    .iter()
    .filter(|(f, _)| get_bool(spec, f) == Some(true))
    .map(|(_, s)| *s)
    .collect();
    if set.is_empty() {
        return None;
    }
    violation("host namespaces", set.join(", "))
}

fn host_path_volumes(_: &Value, spec: &Value) -> Option<Violation> {
    let vols: Vec<String> = items(spec, "volumes")
        .filter(|v| get(v, "hostPath").is_some())
        .map(name)
        .collect();
    if vols.is_empty() {
        return None;
    }
    violation(
        "hostPath volumes",
        format!(
            "{} {}",
            pluralize("volume", "volumes", vols.len()),
            join_quote(&vols)
        ),
    )
}

fn host_ports(_: &Value, spec: &Value) -> Option<Violation> {
    let mut bad_containers = Vec::new();
    let mut ports = BTreeSet::new();
    for c in containers(spec) {
        let mut valid = true;
        for p in items(c, "ports") {
            let hp = p.get("hostPort").and_then(Value::as_i64).unwrap_or(0);
            if hp != 0 {
                valid = false;
                ports.insert(hp.to_string());
            }
        }
        if !valid {
            bad_containers.push(name(c));
        }
    }
    if bad_containers.is_empty() {
        return None;
    }
    let ports: Vec<String> = ports.into_iter().collect();
    violation(
        "hostPort",
        format!(
            "{} {} {} {}",
            containers_phrase(&bad_containers),
            pluralize("uses", "use", bad_containers.len()),
            pluralize("hostPort", "hostPorts", ports.len()),
            ports.join(", ")
        ),
    )
}

/// The hosts a probe or lifecycle handler names through httpGet or tcpSocket.
fn handler_hosts(h: Option<&Value>) -> Vec<String> {
    let Some(h) = h else {
        return Vec::new();
    };
    ["httpGet", "tcpSocket"]
        .iter()
        .filter_map(|k| get(h, k))
        .map(|x| get_str(x, "host"))
        .filter(|host| !host.is_empty())
        .map(str::to_owned)
        .collect()
}

fn host_probes_and_lifecycle(_: &Value, spec: &Value) -> Option<Violation> {
    let mut bad_containers = BTreeSet::new();
    let mut hosts = BTreeSet::new();
    for c in containers(spec) {
        let mut handlers = vec![
            get(c, "livenessProbe"),
            get(c, "readinessProbe"),
            get(c, "startupProbe"),
        ];
        if let Some(l) = get(c, "lifecycle") {
            handlers.push(get(l, "postStart"));
            handlers.push(get(l, "preStop"));
        }
        for h in handlers {
            let bad = handler_hosts(h);
            if !bad.is_empty() {
                bad_containers.insert(name(c));
                hosts.extend(bad);
            }
        }
    }
    if bad_containers.is_empty() {
        return None;
    }
    let bad_containers: Vec<String> = bad_containers.into_iter().collect();
    let hosts: Vec<String> = hosts.into_iter().collect();
    violation(
        "probe or lifecycle host",
        format!(
            "{} {} {} {}",
            containers_phrase(&bad_containers),
            pluralize("uses", "use", bad_containers.len()),
            pluralize(
                "probe or lifecycle host",
                "probe or lifecycle hosts",
                hosts.len()
            ),
            join_quote(&hosts)
        ),
    )
}

fn privileged(_: &Value, spec: &Value) -> Option<Violation> {
    let bad: Vec<String> = containers(spec)
        .filter(|c| security_context(c).and_then(|sc| get_bool(sc, "privileged")) == Some(true))
        .map(name)
        .collect();
    if bad.is_empty() {
        return None;
    }
    violation(
        "privileged",
        format!(
            "{} must not set securityContext.privileged=true",
            containers_phrase(&bad)
        ),
    )
}

fn proc_mount(_: &Value, spec: &Value) -> Option<Violation> {
    let mut bad = Vec::new();
    let mut types = BTreeSet::new();
    for c in containers(spec) {
        let Some(pm) = security_context(c).and_then(|sc| get(sc, "procMount")) else {
            continue;
        };
        let pm = pm.as_str().unwrap_or("");
        if pm != "Default" {
            bad.push(name(c));
            types.insert(pm.to_owned());
        }
    }
    if bad.is_empty() {
        return None;
    }
    let types: Vec<String> = types.into_iter().collect();
    violation(
        "procMount",
        format!(
            "{} must not set securityContext.procMount to {}",
            containers_phrase(&bad),
            join_quote(&types)
        ),
    )
}

fn proc_mount_1_35(meta: &Value, spec: &Value) -> Option<Violation> {
    if in_user_namespace(spec) {
        return None;
    }
    proc_mount(meta, spec)
}

fn se_linux_options_1_0(_: &Value, spec: &Value) -> Option<Violation> {
    se_linux_options(
        spec,
        &["", "container_t", "container_init_t", "container_kvm_t"],
    )
}

fn se_linux_options_1_31(_: &Value, spec: &Value) -> Option<Violation> {
    se_linux_options(
        spec,
        &[
            "",
            "container_t",
            "container_init_t",
            "container_kvm_t",
            "container_engine_t",
        ],
    )
}

fn se_linux_options(spec: &Value, allowed: &[&str]) -> Option<Violation> {
    let mut bad_types = BTreeSet::new();
    let mut set_user = false;
    let mut set_role = false;
    let mut valid = |o: &Value| {
        let mut ok = true;
        let t = get_str(o, "type");
        if !allowed.contains(&t) {
            ok = false;
            bad_types.insert(t.to_owned());
        }
        if !get_str(o, "user").is_empty() {
            ok = false;
            set_user = true;
        }
        if !get_str(o, "role").is_empty() {
            ok = false;
            set_role = true;
        }
        ok
    };
    let mut setters = Vec::new();
    if let Some(o) = pod_security_context(spec).and_then(|sc| get(sc, "seLinuxOptions")) {
        if !valid(o) {
            setters.push("pod".to_owned());
        }
    }
    let mut bad = Vec::new();
    for c in containers(spec) {
        if let Some(o) = security_context(c).and_then(|sc| get(sc, "seLinuxOptions")) {
            if !valid(o) {
                bad.push(name(c));
            }
        }
    }
    if !bad.is_empty() {
        setters.push(containers_phrase(&bad));
    }
    if setters.is_empty() {
        return None;
    }
    let mut data = Vec::new();
    if !bad_types.is_empty() {
        let types: Vec<String> = bad_types.into_iter().collect();
        data.push(format!(
            "{} {}",
            pluralize("type", "types", types.len()),
            join_quote(&types)
        ));
    }
    if set_user {
        data.push("user may not be set".to_owned());
    }
    if set_role {
        data.push("role may not be set".to_owned());
    }
    violation(
        "seLinuxOptions",
        format!(
            "{} set forbidden securityContext.seLinuxOptions: {}",
            setters.join(" and "),
            data.join("; ")
        ),
    )
}

const SECCOMP_POD_ANNOTATION: &str = "seccomp.security.alpha.kubernetes.io/pod";
const SECCOMP_CONTAINER_ANNOTATION_PREFIX: &str = "container.seccomp.security.alpha.kubernetes.io/";

fn seccomp_baseline_1_0(meta: &Value, spec: &Value) -> Option<Violation> {
    let valid =
        |v: &str| v == "runtime/default" || v == "docker/default" || v.starts_with("localhost/");
    let annotation = |key: &str| {
        meta.get("annotations")
            .and_then(|a| a.get(key))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    let mut forbidden = BTreeSet::new();
    if let Some(val) = annotation(SECCOMP_POD_ANNOTATION) {
        if !valid(&val) {
            forbidden.insert(format!("{SECCOMP_POD_ANNOTATION}={}", go_quote(&val)));
        }
    }
    for c in containers(spec) {
        let key = format!("{SECCOMP_CONTAINER_ANNOTATION_PREFIX}{}", name(c));
        if let Some(val) = annotation(&key) {
            if !valid(&val) {
                forbidden.insert(format!("{key}={}", go_quote(&val)));
            }
        }
    }
    if forbidden.is_empty() {
        return None;
    }
    let forbidden: Vec<String> = forbidden.into_iter().collect();
    violation(
        "seccompProfile",
        format!(
            "forbidden {} {}",
            pluralize("annotation", "annotations", forbidden.len()),
            forbidden.join(", ")
        ),
    )
}

fn valid_seccomp(p: &Value) -> bool {
    matches!(get_str(p, "type"), "RuntimeDefault" | "Localhost")
}

fn seccomp_baseline_1_19(_: &Value, spec: &Value) -> Option<Violation> {
    let mut setters = Vec::new();
    let mut values = BTreeSet::new();
    if let Some(p) = pod_security_context(spec).and_then(|sc| get(sc, "seccompProfile")) {
        if !valid_seccomp(p) {
            setters.push("pod".to_owned());
            values.insert(get_str(p, "type").to_owned());
        }
    }
    let mut bad = Vec::new();
    for c in containers(spec) {
        if let Some(p) = security_context(c).and_then(|sc| get(sc, "seccompProfile")) {
            if !valid_seccomp(p) {
                bad.push(name(c));
                values.insert(get_str(p, "type").to_owned());
            }
        }
    }
    if !bad.is_empty() {
        setters.push(containers_phrase(&bad));
    }
    if setters.is_empty() {
        return None;
    }
    let values: Vec<String> = values.into_iter().collect();
    violation(
        "seccompProfile",
        format!(
            "{} must not set securityContext.seccompProfile.type to {}",
            setters.join(" and "),
            join_quote(&values)
        ),
    )
}

const SYSCTLS_1_0: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start",
];
const SYSCTLS_1_27: &[&str] = &["net.ipv4.ip_local_reserved_ports"];
const SYSCTLS_1_29: &[&str] = &[
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
];
const SYSCTLS_1_32: &[&str] = &["net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"];
const SYSCTLS_1_37: &[&str] = &[
    "net.ipv4.tcp_slow_start_after_idle",
    "net.ipv4.tcp_notsent_lowat",
];

fn sysctls_1_0(_: &Value, spec: &Value) -> Option<Violation> {
    sysctls(spec, &[SYSCTLS_1_0])
}
fn sysctls_1_27(_: &Value, spec: &Value) -> Option<Violation> {
    sysctls(spec, &[SYSCTLS_1_0, SYSCTLS_1_27])
}
fn sysctls_1_29(_: &Value, spec: &Value) -> Option<Violation> {
    sysctls(spec, &[SYSCTLS_1_0, SYSCTLS_1_27, SYSCTLS_1_29])
}
fn sysctls_1_32(_: &Value, spec: &Value) -> Option<Violation> {
    sysctls(
        spec,
        &[SYSCTLS_1_0, SYSCTLS_1_27, SYSCTLS_1_29, SYSCTLS_1_32],
    )
}
fn sysctls_1_37(_: &Value, spec: &Value) -> Option<Violation> {
    sysctls(
        spec,
        &[
            SYSCTLS_1_0,
            SYSCTLS_1_27,
            SYSCTLS_1_29,
            SYSCTLS_1_32,
            SYSCTLS_1_37,
        ],
    )
}

fn sysctls(spec: &Value, allowed: &[&[&str]]) -> Option<Violation> {
    let forbidden: Vec<&str> = pod_security_context(spec)
        .map(|sc| items(sc, "sysctls"))
        .into_iter()
        .flatten()
        .map(|s| get_str(s, "name"))
        .filter(|n| !allowed.iter().any(|set| set.contains(n)))
        .collect();
    if forbidden.is_empty() {
        return None;
    }
    violation("forbidden sysctls", forbidden.join(", "))
}

fn windows_host_process(_: &Value, spec: &Value) -> Option<Violation> {
    let host_process = |sc: Option<&Value>| {
        sc.and_then(|sc| get(sc, "windowsOptions"))
            .and_then(|w| get_bool(w, "hostProcess"))
            == Some(true)
    };
    let bad: Vec<String> = containers(spec)
        .filter(|c| host_process(security_context(c)))
        .map(name)
        .collect();
    let mut setters = Vec::new();
    if host_process(pod_security_context(spec)) {
        setters.push("pod".to_owned());
    }
    if !bad.is_empty() {
        setters.push(containers_phrase(&bad));
    }
    if setters.is_empty() {
        return None;
    }
    violation(
        "hostProcess",
        format!(
            "{} must not set securityContext.windowsOptions.hostProcess=true",
            setters.join(" and ")
        ),
    )
}

// ---- restricted ---------------------------------------------------------------------------

fn allow_privilege_escalation(_: &Value, spec: &Value) -> Option<Violation> {
    let bad: Vec<String> = containers(spec)
        .filter(|c| {
            security_context(c).and_then(|sc| get_bool(sc, "allowPrivilegeEscalation"))
                != Some(false)
        })
        .map(name)
        .collect();
    if bad.is_empty() {
        return None;
    }
    violation(
        "allowPrivilegeEscalation != false",
        format!(
            "{} must set securityContext.allowPrivilegeEscalation=false",
            containers_phrase(&bad)
        ),
    )
}

fn allow_privilege_escalation_1_25(meta: &Value, spec: &Value) -> Option<Violation> {
    if is_windows(spec) {
        return None;
    }
    allow_privilege_escalation(meta, spec)
}

fn capabilities_restricted(_: &Value, spec: &Value) -> Option<Violation> {
    let mut missing_drop_all = Vec::new();
    let mut adding = Vec::new();
    let mut forbidden = BTreeSet::new();
    for c in containers(spec) {
        let Some(caps) = security_context(c).and_then(|sc| get(sc, "capabilities")) else {
            missing_drop_all.push(name(c));
            continue;
        };
        if !items(caps, "drop").any(|d| d.as_str() == Some("ALL")) {
            missing_drop_all.push(name(c));
        }
        let mut added_forbidden = false;
        for cap in items(caps, "add").filter_map(Value::as_str) {
            if cap != "NET_BIND_SERVICE" {
                added_forbidden = true;
                forbidden.insert(cap.to_owned());
            }
        }
        if added_forbidden {
            adding.push(name(c));
        }
    }
    let mut details = Vec::new();
    if !missing_drop_all.is_empty() {
        details.push(format!(
            "{} must set securityContext.capabilities.drop=[\"ALL\"]",
            containers_phrase(&missing_drop_all)
        ));
    }
    if !adding.is_empty() {
        let forbidden: Vec<String> = forbidden.into_iter().collect();
        details.push(format!(
            "{} must not include {} in securityContext.capabilities.add",
            containers_phrase(&adding),
            join_quote(&forbidden)
        ));
    }
    if details.is_empty() {
        return None;
    }
    violation("unrestricted capabilities", details.join("; "))
}

fn capabilities_restricted_1_25(meta: &Value, spec: &Value) -> Option<Violation> {
    if is_windows(spec) {
        return None;
    }
    capabilities_restricted(meta, spec)
}

/// The inline volume sources the restricted level allows.
const ALLOWED_VOLUME_SOURCES: &[&str] = &[
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "image",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

/// The other sources, in the order upstream names the first one a volume sets.
const RESTRICTED_VOLUME_SOURCES: &[&str] = &[
    "hostPath",
    "gcePersistentDisk",
    "awsElasticBlockStore",
    "gitRepo",
    "nfs",
    "iscsi",
    "glusterfs",
    "rbd",
    "flexVolume",
    "cinder",
    "cephfs",
    "flocker",
    "fc",
    "azureFile",
    "vsphereVolume",
    "quobyte",
    "azureDisk",
    "photonPersistentDisk",
    "portworxVolume",
    "scaleIO",
    "storageos",
];

fn restricted_volumes(_: &Value, spec: &Value) -> Option<Violation> {
    let mut bad = Vec::new();
    let mut types = BTreeSet::new();
    for vol in items(spec, "volumes") {
        if ALLOWED_VOLUME_SOURCES.iter().any(|s| get(vol, s).is_some()) {
            continue;
        }
        bad.push(name(vol));
        let t = RESTRICTED_VOLUME_SOURCES
            .iter()
            .find(|s| get(vol, s).is_some())
            .copied()
            .unwrap_or("unknown");
        types.insert(t);
    }
    if bad.is_empty() {
        return None;
    }
    let types: Vec<&str> = types.into_iter().collect();
    violation(
        "restricted volume types",
        format!(
            "{} {} {} {} {}",
            pluralize("volume", "volumes", bad.len()),
            join_quote(&bad),
            pluralize("uses", "use", bad.len()),
            pluralize(
                "restricted volume type",
                "restricted volume types",
                types.len()
            ),
            join_quote(&types)
        ),
    )
}

fn run_as_non_root(_: &Value, spec: &Value) -> Option<Violation> {
    let mut setters = Vec::new();
    let mut pod_non_root = false;
    match pod_security_context(spec).and_then(|sc| get_bool(sc, "runAsNonRoot")) {
        Some(false) => setters.push("pod".to_owned()),
        Some(true) => pod_non_root = true,
        None => {}
    }
    let mut explicit = Vec::new();
    let mut implicit = Vec::new();
    for c in containers(spec) {
        match security_context(c).and_then(|sc| get_bool(sc, "runAsNonRoot")) {
            Some(false) => explicit.push(name(c)),
            Some(true) => {}
            None if !pod_non_root => implicit.push(name(c)),
            None => {}
        }
    }
    if !explicit.is_empty() {
        setters.push(containers_phrase(&explicit));
    }
    if !setters.is_empty() {
        return violation(
            "runAsNonRoot != true",
            format!(
                "{} must not set securityContext.runAsNonRoot=false",
                setters.join(" and ")
            ),
        );
    }
    if !implicit.is_empty() {
        return violation(
            "runAsNonRoot != true",
            format!(
                "pod or {} must set securityContext.runAsNonRoot=true",
                containers_phrase(&implicit)
            ),
        );
    }
    None
}

fn run_as_non_root_1_35(meta: &Value, spec: &Value) -> Option<Violation> {
    if in_user_namespace(spec) {
        return None;
    }
    run_as_non_root(meta, spec)
}

fn run_as_user(_: &Value, spec: &Value) -> Option<Violation> {
    let root = |sc: Option<&Value>| {
        sc.and_then(|sc| sc.get("runAsUser"))
            .and_then(Value::as_i64)
            == Some(0)
    };
    let mut setters = Vec::new();
    if root(pod_security_context(spec)) {
        setters.push("pod".to_owned());
    }
    let bad: Vec<String> = containers(spec)
        .filter(|c| root(security_context(c)))
        .map(name)
        .collect();
    if !bad.is_empty() {
        setters.push(containers_phrase(&bad));
    }
    if setters.is_empty() {
        return None;
    }
    violation(
        "runAsUser=0",
        format!("{} must not set runAsUser=0", setters.join(" and ")),
    )
}

fn run_as_user_1_35(meta: &Value, spec: &Value) -> Option<Violation> {
    if in_user_namespace(spec) {
        return None;
    }
    run_as_user(meta, spec)
}

fn seccomp_restricted(_: &Value, spec: &Value) -> Option<Violation> {
    let mut setters = Vec::new();
    let mut values = BTreeSet::new();
    let mut pod_set = false;
    if let Some(p) = pod_security_context(spec).and_then(|sc| get(sc, "seccompProfile")) {
        if valid_seccomp(p) {
            pod_set = true;
        } else {
            setters.push("pod".to_owned());
            values.insert(get_str(p, "type").to_owned());
        }
    }
    let mut explicit = Vec::new();
    let mut implicit = Vec::new();
    for c in containers(spec) {
        match security_context(c).and_then(|sc| get(sc, "seccompProfile")) {
            Some(p) if !valid_seccomp(p) => {
                explicit.push(name(c));
                values.insert(get_str(p, "type").to_owned());
            }
            None if !pod_set => implicit.push(name(c)),
            Some(_) | None => {}
        }
    }
    if !explicit.is_empty() {
        setters.push(containers_phrase(&explicit));
    }
    if !setters.is_empty() {
        let values: Vec<String> = values.into_iter().collect();
        return violation(
            "seccompProfile",
            format!(
                "{} must not set securityContext.seccompProfile.type to {}",
                setters.join(" and "),
                join_quote(&values)
            ),
        );
    }
    if !implicit.is_empty() {
        return violation(
            "seccompProfile",
            format!(
                "pod or {} must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\"",
                containers_phrase(&implicit)
            ),
        );
    }
    None
}

fn seccomp_restricted_1_25(meta: &Value, spec: &Value) -> Option<Violation> {
    if is_windows(spec) {
        return None;
    }
    seccomp_restricted(meta, spec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lv(level: Level, version: Version) -> LevelVersion {
        LevelVersion { level, version }
    }

    #[test]
    fn checks_are_in_upstream_order() {
        let ids = |l: Level| -> Vec<&str> {
            CHECKS
                .iter()
                .filter(|c| c.level == l)
                .map(|c| c.id)
                .collect()
        };
        for l in [Level::Baseline, Level::Restricted] {
            let mut sorted = ids(l);
            sorted.sort();
            assert_eq!(ids(l), sorted);
        }
        let max = CHECKS
            .iter()
            .flat_map(|c| c.versions.iter().map(|v| v.min))
            .max();
        assert_eq!(max, Some(MAX_MINOR));
        // Baseline checks come first.
        let first_restricted = CHECKS
            .iter()
            .position(|c| c.level == Level::Restricted)
            .unwrap_or(0);
        assert!(CHECKS[first_restricted..]
            .iter()
            .all(|c| c.level == Level::Restricted));
    }

    #[test]
    fn versions_parse_as_upstream() {
        assert_eq!(Version::parse("latest"), Some(Version::Latest));
        assert_eq!(Version::parse("v1.0"), Some(Version::Minor(0)));
        assert_eq!(Version::parse("v1.25"), Some(Version::Minor(25)));
        assert_eq!(Version::parse("v1.025"), None);
        assert_eq!(Version::parse("v2.0"), None);
        assert_eq!(Version::parse("v1."), None);
        assert_eq!(Version::parse("1.25"), None);
        assert_eq!(Version::parse("v1.99999999999999999999"), None);
    }

    #[test]
    fn plain_pod_fails_restricted_in_order() {
        let spec = json!({"containers": [{"name": "c", "image": "nginx"}]});
        let r = evaluate(lv(Level::Restricted, Version::Latest), &json!({}), &spec);
        assert_eq!(
            r.details(),
            "allowPrivilegeEscalation != false (container \"c\" must set securityContext.allowPrivilegeEscalation=false), \
             unrestricted capabilities (container \"c\" must set securityContext.capabilities.drop=[\"ALL\"]), \
             runAsNonRoot != true (pod or container \"c\" must set securityContext.runAsNonRoot=true), \
             seccompProfile (pod or container \"c\" must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\")"
        );
        assert!(evaluate(lv(Level::Baseline, Version::Latest), &json!({}), &spec).allowed());
        // Before 1.8 only runAsNonRoot applies (and seccomp from 1.19).
        let old = evaluate(lv(Level::Restricted, Version::Minor(7)), &json!({}), &spec);
        assert_eq!(old.reasons(), "runAsNonRoot != true");
    }

    #[test]
    fn compliant_pod_passes_restricted() {
        let spec = json!({
            "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "c", "image": "nginx", "securityContext": {
                "allowPrivilegeEscalation": false,
                "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}}],
            "volumes": [{"name": "v", "emptyDir": {}}],
        });
        assert!(evaluate(lv(Level::Restricted, Version::Latest), &json!({}), &spec).allowed());
    }

    #[test]
    fn baseline_details() {
        let spec = json!({
            "hostNetwork": true, "hostPID": true,
            "securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"},
                                            {"name": "net.ipv4.tcp_rmem", "value": "1"}],
                                "seLinuxOptions": {"type": "spc_t", "user": "u"}},
            "containers": [
                {"name": "a", "image": "x", "ports": [{"containerPort": 80, "hostPort": 8080}, {"containerPort": 443, "hostPort": 443}],
                 "securityContext": {"privileged": true, "capabilities": {"add": ["SYS_ADMIN", "NET_RAW", "CHOWN"]}, "procMount": "Unmasked"},
                 "livenessProbe": {"httpGet": {"port": 80, "host": "10.0.0.1"}}},
                {"name": "b", "image": "x", "securityContext": {"privileged": true,
                  "seccompProfile": {"type": "Unconfined"}, "appArmorProfile": {"type": "Unconfined"},
                  "windowsOptions": {"hostProcess": true}}}
            ],
            "volumes": [{"name": "h", "hostPath": {"path": "/"}}],
        });
        let meta = json!({"annotations": {"container.apparmor.security.beta.kubernetes.io/a": "unconfined"}});
        let r = evaluate(lv(Level::Baseline, Version::Latest), &meta, &spec);
        let got: Vec<String> =
            r.0.iter()
                .map(|v| format!("{} ({})", v.reason, v.detail))
                .collect();
        assert_eq!(got, vec![
            "forbidden AppArmor profiles (container \"b\" and annotation must not set AppArmor profile type to \"Unconfined\", \"container.apparmor.security.beta.kubernetes.io/a=\"unconfined\"\")",
            "non-default capabilities (container \"a\" must not include \"NET_RAW\", \"SYS_ADMIN\" in securityContext.capabilities.add)",
            "host namespaces (hostNetwork=true, hostPID=true)",
            "hostPath volumes (volume \"h\")",
            "hostPort (container \"a\" uses hostPorts 443, 8080)",
            "probe or lifecycle host (container \"a\" uses probe or lifecycle host \"10.0.0.1\")",
            "privileged (containers \"a\", \"b\" must not set securityContext.privileged=true)",
            "procMount (container \"a\" must not set securityContext.procMount to \"Unmasked\")",
            "seLinuxOptions (pod set forbidden securityContext.seLinuxOptions: type \"spc_t\"; user may not be set)",
            "seccompProfile (container \"b\" must not set securityContext.seccompProfile.type to \"Unconfined\")",
            "forbidden sysctls (kernel.msgmax)",
            "hostProcess (container \"b\" must not set securityContext.windowsOptions.hostProcess=true)",
        ]);
        // tcp_rmem is only allowed from 1.32.
        let r31 = evaluate(lv(Level::Baseline, Version::Minor(31)), &meta, &spec);
        assert!(r31
            .details()
            .contains("forbidden sysctls (kernel.msgmax, net.ipv4.tcp_rmem)"));
        assert!(!r31.details().contains("probe or lifecycle host"));
    }

    #[test]
    fn restricted_overrides_and_user_namespaces() {
        let spec = json!({
            "hostUsers": false,
            "securityContext": {"runAsUser": 0, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "c", "image": "x", "securityContext": {
                "allowPrivilegeEscalation": false, "procMount": "Unmasked",
                "capabilities": {"drop": ["ALL"], "add": ["SYS_TIME"]}}}],
            "volumes": [{"name": "n", "nfs": {"server": "s", "path": "/"}}, {"name": "h", "hostPath": {"path": "/"}}],
        });
        let r = evaluate(lv(Level::Restricted, Version::Latest), &json!({}), &spec);
        assert_eq!(
            r.details(),
            "unrestricted capabilities (container \"c\" must not include \"SYS_TIME\" in securityContext.capabilities.add), \
             procMount (container \"c\" must not set securityContext.procMount to \"Unmasked\"), \
             restricted volume types (volumes \"n\", \"h\" use restricted volume types \"hostPath\", \"nfs\")"
        );
        let r34 = evaluate(lv(Level::Restricted, Version::Minor(34)), &json!({}), &spec);
        assert_eq!(
            r34.reasons(),
            "procMount, unrestricted capabilities, restricted volume types, runAsNonRoot != true, runAsUser=0"
        );
    }
}
