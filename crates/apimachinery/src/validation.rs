//! Validation of names, labels and annotations, and the field errors they produce, worded as
//! k8s.io/apimachinery words them (`pkg/util/validation`, `pkg/api/validate/content`,
//! `pkg/api/validation`, `pkg/apis/meta/v1/validation`, `pkg/util/validation/field`).
//!
//! The `is_*` validators return the list of problems with a value, each a sentence fragment
//! (empty when the value is valid). The `validate_*` functions turn them into [`FieldError`]s at
//! a [`Path`], whose `Display` is upstream's `field.Error.Error()`, e.g.
//! `metadata.name: Invalid value: "Foo": a lowercase RFC 1123 subdomain must consist of ...`.
//!
//! Upstream quirks kept on purpose, because clients see them:
//! - two spellings of the length limit: the DNS name validators say `must be no more than 253
//!   characters`, while label keys and values (and a label key's prefix) say `must be no more
//!   than 63 bytes`;
//! - the examples in a regex message are joined as `'a',  or 'b', ` (two spaces before `or`);
//! - a generateName prefix is checked with its last *two* bytes replaced by `a` when it ends
//!   in `-`;
//! - annotation keys are checked after lowercasing, so `Example.com/Key` is a valid
//!   annotation key but not a valid label key.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::Value;

use crate::selector::ApiLabelSelector;
use crate::status::Cause;

/// Maximum length of an RFC 1123 label (a namespace name, for instance).
pub const DNS1123_LABEL_MAX_LENGTH: usize = 63;
/// Maximum length of an RFC 1123 subdomain (most object names).
pub const DNS1123_SUBDOMAIN_MAX_LENGTH: usize = 253;
/// Maximum length of an RFC 1035 label (a service name, for instance).
pub const DNS1035_LABEL_MAX_LENGTH: usize = 63;
/// Maximum length of the name part of a qualified name (label key).
pub const QUALIFIED_NAME_MAX_LENGTH: usize = 63;
/// Maximum length of a label value.
pub const LABEL_VALUE_MAX_LENGTH: usize = 63;
/// Maximum total size of an object's annotations: the sum of the byte lengths of every key
/// and value.
pub const TOTAL_ANNOTATION_SIZE_LIMIT_B: usize = 256 * 1024;
/// The detail of an update that changes an immutable field.
pub const FIELD_IMMUTABLE_ERROR_MSG: &str = "field is immutable";
/// The detail of a negative value in a field that must not be negative.
pub const IS_NEGATIVE_ERROR_MSG: &str = "must be greater than or equal to 0";
/// The finalizer that orphans dependents.
pub const FINALIZER_ORPHAN_DEPENDENTS: &str = "orphan";
/// The finalizer that deletes dependents in the foreground.
pub const FINALIZER_DELETE_DEPENDENTS: &str = "foregroundDeletion";

const DNS1123_LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1123_LABEL_ERR_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_FMT: &str =
    "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const DNS1123_SUBDOMAIN_ERR_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";
const DNS1035_LABEL_FMT: &str = "[a-z]([-a-z0-9]*[a-z0-9])?";
const DNS1035_LABEL_ERR_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character";
const WILDCARD_DNS1123_SUBDOMAIN_FMT: &str =
    "\\*\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const WILDCARD_DNS1123_SUBDOMAIN_ERR_MSG: &str = "a wildcard DNS-1123 subdomain must start with '*.', followed by a valid DNS subdomain, which must consist of lower case alphanumeric characters, '-' or '.' and end with an alphanumeric character";
const LABEL_KEY_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const LABEL_KEY_ERR_MSG: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE_FMT: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";
const LABEL_VALUE_ERR_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const C_IDENTIFIER_FMT: &str = "[A-Za-z_][A-Za-z0-9_]*";
const C_IDENTIFIER_ERR_MSG: &str = "a valid C identifier must start with alphabetic character or '_', followed by a string of alphanumeric characters or '_'";
const CONFIG_MAP_KEY_FMT: &str = "[-._a-zA-Z0-9]+";
const CONFIG_MAP_KEY_ERR_MSG: &str =
    "a valid config key must consist of alphanumeric characters, '-', '_' or '.'";
const ENV_VAR_NAME_FMT: &str = "[-._a-zA-Z][-._a-zA-Z0-9]*";
const ENV_VAR_NAME_ERR_MSG: &str = "a valid environment variable name must consist of alphabetic characters, digits, '_', '-', or '.', and must not start with a digit";
const PERCENT_FMT: &str = "[0-9]+%";
const PERCENT_ERR_MSG: &str =
    "a valid percent string must be a numeric string followed by an ending '%'";
const HTTP_HEADER_NAME_FMT: &str = "[-A-Za-z0-9]+";
const HTTP_HEADER_NAME_ERR_MSG: &str =
    "a valid HTTP header must consist of alphanumeric characters or '-'";

// ---------------------------------------------------------------------------------------------
// Message helpers
// ---------------------------------------------------------------------------------------------

/// `must be no more than N characters` (pkg/util/validation's wording, used by the DNS name
/// validators).
pub fn max_len_error(length: usize) -> String {
    format!("must be no more than {length} characters")
}

/// `must be no more than N bytes` (pkg/api/validate/content's wording, used by label keys and
/// values).
pub fn max_len_bytes_error(length: usize) -> String {
    format!("must be no more than {length} bytes")
}

/// `must be non-empty`.
pub fn empty_error() -> String {
    "must be non-empty".to_owned()
}

/// `must be between LO and HI, inclusive`.
pub fn inclusive_range_error(lo: i64, hi: i64) -> String {
    format!("must be between {lo} and {hi}, inclusive")
}

/// A message for a value that does not match `re`, with examples, as upstream words it:
/// `MSG (e.g. 'a',  or 'b', regex used for validation is 'RE')`.
pub fn regex_error(msg: &str, re: &str, examples: &[&str]) -> String {
    if examples.is_empty() {
        return format!("{msg} (regex used for validation is '{re}')");
    }
    let mut out = String::with_capacity(msg.len() + re.len() + 64);
    out.push_str(msg);
    out.push_str(" (e.g. ");
    for (i, example) in examples.iter().enumerate() {
        if i > 0 {
            out.push_str(" or ");
        }
        out.push('\'');
        out.push_str(example);
        out.push_str("', ");
    }
    out.push_str("regex used for validation is '");
    out.push_str(re);
    out.push_str("')");
    out
}

/// [`regex_error`] for constant arguments, built once: the validators answer with these long
/// messages for every invalid value.
macro_rules! cached_regex_error {
    ($msg:expr, $re:expr, [$($example:expr),* $(,)?] $(,)?) => {{
        static MESSAGE: std::sync::LazyLock<String> =
            std::sync::LazyLock::new(|| regex_error($msg, $re, &[$($example),*]));
        MESSAGE.clone()
    }};
}

// ---------------------------------------------------------------------------------------------
// Matchers for upstream's regular expressions (anchored at both ends)
// ---------------------------------------------------------------------------------------------

fn is_lower_alnum(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`
fn matches_dns1123_label(s: &[u8]) -> bool {
    match (s.first(), s.last()) {
        (Some(&first), Some(&last)) => {
            is_lower_alnum(first)
                && is_lower_alnum(last)
                && s.iter().all(|&b| is_lower_alnum(b) || b == b'-')
        }
        _ => false,
    }
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*`
fn matches_dns1123_subdomain(s: &[u8]) -> bool {
    s.split(|&b| b == b'.').all(matches_dns1123_label)
}

/// `[a-z]([-a-z0-9]*[a-z0-9])?`
fn matches_dns1035_label(s: &[u8]) -> bool {
    match (s.first(), s.last()) {
        (Some(&first), Some(&last)) => {
            first.is_ascii_lowercase()
                && is_lower_alnum(last)
                && s.iter().all(|&b| is_lower_alnum(b) || b == b'-')
        }
        _ => false,
    }
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`
fn matches_label_key_name(s: &[u8]) -> bool {
    match (s.first(), s.last()) {
        (Some(&first), Some(&last)) => {
            first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && s.iter()
                    .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

// ---------------------------------------------------------------------------------------------
// Validators returning the list of problems
// ---------------------------------------------------------------------------------------------

/// An RFC 1123 label (at most 63 characters of `[a-z0-9-]`, alphanumeric at both ends), as
/// upstream's `IsDNS1123Label`.
pub fn is_dns1123_label(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_LABEL_MAX_LENGTH {
        errs.push(max_len_error(DNS1123_LABEL_MAX_LENGTH));
    }
    if !matches_dns1123_label(value.as_bytes()) {
        if matches_dns1123_subdomain(value.as_bytes()) {
            errs.push("must not contain dots".to_owned());
        } else {
            errs.push(cached_regex_error!(
                DNS1123_LABEL_ERR_MSG,
                DNS1123_LABEL_FMT,
                ["my-name", "123-abc"],
            ));
        }
    }
    errs
}

/// An RFC 1123 subdomain (at most 253 characters, dot-separated RFC 1123 labels), as
/// upstream's `IsDNS1123Subdomain`: the rule for most object names.
pub fn is_dns1123_subdomain(value: &str) -> Vec<String> {
    dns1123_subdomain_errors(value, max_len_error)
}

fn dns1123_subdomain_errors(value: &str, max_len: fn(usize) -> String) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_SUBDOMAIN_MAX_LENGTH {
        errs.push(max_len(DNS1123_SUBDOMAIN_MAX_LENGTH));
    }
    if !matches_dns1123_subdomain(value.as_bytes()) {
        errs.push(cached_regex_error!(
            DNS1123_SUBDOMAIN_ERR_MSG,
            DNS1123_SUBDOMAIN_FMT,
            ["example.com"],
        ));
    }
    errs
}

/// An RFC 1035 label (at most 63 characters of `[a-z0-9-]`, starting with a letter), as
/// upstream's `IsDNS1035Label`.
pub fn is_dns1035_label(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1035_LABEL_MAX_LENGTH {
        errs.push(max_len_error(DNS1035_LABEL_MAX_LENGTH));
    }
    if !matches_dns1035_label(value.as_bytes()) {
        errs.push(cached_regex_error!(
            DNS1035_LABEL_ERR_MSG,
            DNS1035_LABEL_FMT,
            ["my-name", "abc-123"],
        ));
    }
    errs
}

/// `*.` followed by an RFC 1123 subdomain, as upstream's `IsWildcardDNS1123Subdomain`.
pub fn is_wildcard_dns1123_subdomain(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_SUBDOMAIN_MAX_LENGTH {
        errs.push(max_len_error(DNS1123_SUBDOMAIN_MAX_LENGTH));
    }
    let ok = value
        .strip_prefix("*.")
        .is_some_and(|rest| matches_dns1123_subdomain(rest.as_bytes()));
    if !ok {
        errs.push(cached_regex_error!(
            WILDCARD_DNS1123_SUBDOMAIN_ERR_MSG,
            WILDCARD_DNS1123_SUBDOMAIN_FMT,
            ["*.example.com"],
        ));
    }
    errs
}

/// A qualified name: an optional RFC 1123 subdomain prefix and `/`, then a name of at most 63
/// characters of `[-A-Za-z0-9_.]`, alphanumeric at both ends. The rule for label keys,
/// annotation keys and finalizers (upstream's `IsQualifiedName`, alias of `IsLabelKey`).
pub fn is_qualified_name(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = value.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push(format!("prefix part {}", empty_error()));
            } else {
                for msg in dns1123_subdomain_errors(prefix, max_len_bytes_error) {
                    errs.push(format!("prefix part {msg}"));
                }
            }
            *name
        }
        _ => {
            errs.push(format!(
                "a valid label key {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                cached_regex_error!(LABEL_KEY_ERR_MSG, LABEL_KEY_FMT, ["MyName", "my.name", "123-abc"])
            ));
            return errs;
        }
    };
    if name.is_empty() {
        errs.push(format!("name part {}", empty_error()));
    } else if name.len() > QUALIFIED_NAME_MAX_LENGTH {
        errs.push(format!(
            "name part {}",
            max_len_bytes_error(QUALIFIED_NAME_MAX_LENGTH)
        ));
    }
    if !matches_label_key_name(name.as_bytes()) {
        errs.push(format!(
            "name part {}",
            cached_regex_error!(
                LABEL_KEY_ERR_MSG,
                LABEL_KEY_FMT,
                ["MyName", "my.name", "123-abc"]
            )
        ));
    }
    errs
}

/// A label value: empty, or at most 63 characters of `[-A-Za-z0-9_.]`, alphanumeric at both
/// ends (upstream's `IsValidLabelValue`).
pub fn is_valid_label_value(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > LABEL_VALUE_MAX_LENGTH {
        errs.push(max_len_bytes_error(LABEL_VALUE_MAX_LENGTH));
    }
    if !value.is_empty() && !matches_label_key_name(value.as_bytes()) {
        errs.push(cached_regex_error!(
            LABEL_VALUE_ERR_MSG,
            LABEL_VALUE_FMT,
            ["MyValue", "my_value", "12345"],
        ));
    }
    errs
}

/// A C identifier (`[A-Za-z_][A-Za-z0-9_]*`).
pub fn is_c_identifier(value: &str) -> Vec<String> {
    let b = value.as_bytes();
    let ok = b
        .first()
        .is_some_and(|&c| c.is_ascii_alphabetic() || c == b'_')
        && b.iter().all(|&c| c.is_ascii_alphanumeric() || c == b'_');
    if ok {
        Vec::new()
    } else {
        vec![cached_regex_error!(
            C_IDENTIFIER_ERR_MSG,
            C_IDENTIFIER_FMT,
            ["my_name", "MY_NAME", "MyName"],
        )]
    }
}

fn has_ch_dir_prefix(value: &str) -> Option<String> {
    if value == "." {
        Some("must not be '.'".to_owned())
    } else if value == ".." {
        Some("must not be '..'".to_owned())
    } else if value.starts_with("..") {
        Some("must not start with '..'".to_owned())
    } else {
        None
    }
}

/// A ConfigMap or Secret data key (upstream's `IsConfigMapKey`).
pub fn is_config_map_key(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_SUBDOMAIN_MAX_LENGTH {
        errs.push(max_len_error(DNS1123_SUBDOMAIN_MAX_LENGTH));
    }
    let b = value.as_bytes();
    if b.is_empty()
        || !b
            .iter()
            .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_'))
    {
        errs.push(cached_regex_error!(
            CONFIG_MAP_KEY_ERR_MSG,
            CONFIG_MAP_KEY_FMT,
            ["key.name", "KEY_NAME", "key-name"],
        ));
    }
    errs.extend(has_ch_dir_prefix(value));
    errs
}

/// An environment variable name (upstream's `IsEnvVarName`).
pub fn is_env_var_name(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let b = value.as_bytes();
    let ok = b
        .first()
        .is_some_and(|&c| c.is_ascii_alphabetic() || matches!(c, b'-' | b'.' | b'_'))
        && b.iter()
            .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_'));
    if !ok {
        errs.push(cached_regex_error!(
            ENV_VAR_NAME_ERR_MSG,
            ENV_VAR_NAME_FMT,
            ["my.env-name", "MY_ENV.NAME", "MyEnvName1"],
        ));
    }
    errs.extend(has_ch_dir_prefix(value));
    errs
}

/// A port number, 1 to 65535.
pub fn is_valid_port_num(port: i64) -> Vec<String> {
    is_in_range(port, 1, 65535)
}

/// A value between `min` and `max`, inclusive.
pub fn is_in_range(value: i64, min: i64, max: i64) -> Vec<String> {
    if (min..=max).contains(&value) {
        Vec::new()
    } else {
        vec![inclusive_range_error(min, max)]
    }
}

/// A port name (IANA_SVC_NAME): at most 15 characters of `[-a-z0-9]`, at least one letter, no
/// `--`, no hyphen at either end.
pub fn is_valid_port_name(port: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let b = port.as_bytes();
    if b.len() > 15 {
        errs.push(max_len_error(15));
    }
    if b.is_empty() || !b.iter().all(|&c| is_lower_alnum(c) || c == b'-') {
        errs.push(
            "must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)".to_owned(),
        );
    }
    if !b.iter().any(|c| c.is_ascii_lowercase()) {
        errs.push("must contain at least one letter (a-z)".to_owned());
    }
    if port.contains("--") {
        errs.push("must not contain consecutive hyphens".to_owned());
    }
    if b.first() == Some(&b'-') || b.last() == Some(&b'-') {
        errs.push("must not begin or end with a hyphen".to_owned());
    }
    errs
}

/// A percentage string such as `25%`.
pub fn is_valid_percent(percent: &str) -> Vec<String> {
    let ok = percent
        .strip_suffix('%')
        .is_some_and(|digits| !digits.is_empty() && digits.bytes().all(|c| c.is_ascii_digit()));
    if ok {
        Vec::new()
    } else {
        vec![cached_regex_error!(
            PERCENT_ERR_MSG,
            PERCENT_FMT,
            ["1%", "93%"]
        )]
    }
}

/// An HTTP header name (`[-A-Za-z0-9]+`).
pub fn is_http_header_name(value: &str) -> Vec<String> {
    let b = value.as_bytes();
    if !b.is_empty() && b.iter().all(|&c| c.is_ascii_alphanumeric() || c == b'-') {
        Vec::new()
    } else {
        vec![cached_regex_error!(
            HTTP_HEADER_NAME_ERR_MSG,
            HTTP_HEADER_NAME_FMT,
            ["X-Header-Name"],
        )]
    }
}

// ---------------------------------------------------------------------------------------------
// Object names (pkg/api/validation's ValidateNameFunc family)
// ---------------------------------------------------------------------------------------------

/// A name validator as upstream's `ValidateNameFunc`: `prefix` is true when the value is a
/// `generateName` prefix, which may end in `-`.
pub type NameValidator = fn(&str, bool) -> Vec<String>;

/// How upstream lets a generateName prefix end in `-`: when the value ends in `-` (and is
/// longer than one byte), its last two bytes are replaced by `a` before the name is checked.
fn mask_trailing_dash(name: &str) -> std::borrow::Cow<'_, [u8]> {
    let b = name.as_bytes();
    if b.len() > 1 && b.ends_with(b"-") {
        let mut masked = b[..b.len() - 2].to_vec();
        masked.push(b'a');
        std::borrow::Cow::Owned(masked)
    } else {
        std::borrow::Cow::Borrowed(b)
    }
}

/// Names that must be RFC 1123 subdomains (most resources): upstream's `NameIsDNSSubdomain`.
pub fn name_is_dns_subdomain(name: &str, prefix: bool) -> Vec<String> {
    is_dns1123_subdomain_masked(name, prefix)
}

fn is_dns1123_subdomain_masked(name: &str, prefix: bool) -> Vec<String> {
    if !prefix {
        return is_dns1123_subdomain(name);
    }
    let m = mask_trailing_dash(name);
    let mut errs = Vec::new();
    if m.len() > DNS1123_SUBDOMAIN_MAX_LENGTH {
        errs.push(max_len_error(DNS1123_SUBDOMAIN_MAX_LENGTH));
    }
    if !matches_dns1123_subdomain(&m) {
        errs.push(cached_regex_error!(
            DNS1123_SUBDOMAIN_ERR_MSG,
            DNS1123_SUBDOMAIN_FMT,
            ["example.com"],
        ));
    }
    errs
}

/// Names that must be RFC 1123 labels (namespaces, for instance): upstream's `NameIsDNSLabel`.
pub fn name_is_dns_label(name: &str, prefix: bool) -> Vec<String> {
    if !prefix {
        return is_dns1123_label(name);
    }
    let m = mask_trailing_dash(name);
    let mut errs = Vec::new();
    if m.len() > DNS1123_LABEL_MAX_LENGTH {
        errs.push(max_len_error(DNS1123_LABEL_MAX_LENGTH));
    }
    if !matches_dns1123_label(&m) {
        if matches_dns1123_subdomain(&m) {
            errs.push("must not contain dots".to_owned());
        } else {
            errs.push(cached_regex_error!(
                DNS1123_LABEL_ERR_MSG,
                DNS1123_LABEL_FMT,
                ["my-name", "123-abc"],
            ));
        }
    }
    errs
}

/// Names that must be RFC 1035 labels (services, for instance): upstream's
/// `NameIsDNS1035Label`.
pub fn name_is_dns1035_label(name: &str, prefix: bool) -> Vec<String> {
    if !prefix {
        return is_dns1035_label(name);
    }
    let m = mask_trailing_dash(name);
    let mut errs = Vec::new();
    if m.len() > DNS1035_LABEL_MAX_LENGTH {
        errs.push(max_len_error(DNS1035_LABEL_MAX_LENGTH));
    }
    if !matches_dns1035_label(&m) {
        errs.push(cached_regex_error!(
            DNS1035_LABEL_ERR_MSG,
            DNS1035_LABEL_FMT,
            ["my-name", "abc-123"],
        ));
    }
    errs
}

/// Namespace names: RFC 1123 labels (upstream's `ValidateNamespaceName`).
pub fn validate_namespace_name(name: &str, prefix: bool) -> Vec<String> {
    name_is_dns_label(name, prefix)
}

/// The name checks of upstream's `ValidateObjectMetaAccessor`: `generateName` (when set) is
/// checked as a prefix, and `name` must be set and valid. `meta` is the path of the metadata
/// (usually `metadata`).
pub fn validate_object_meta_name(
    name: &str,
    generate_name: &str,
    name_fn: NameValidator,
    meta: &Path,
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if !generate_name.is_empty() {
        for msg in name_fn(generate_name, true) {
            errs.push(FieldError::invalid(
                &meta.child("generateName"),
                generate_name,
                msg,
            ));
        }
    }
    if name.is_empty() {
        errs.push(FieldError::required(
            &meta.child("name"),
            "name or generateName is required",
        ));
    } else {
        for msg in name_fn(name, false) {
            errs.push(FieldError::invalid(&meta.child("name"), name, msg));
        }
    }
    errs
}

/// The namespace checks of upstream's ObjectMeta validation: required and a valid RFC 1123
/// label for namespaced resources, forbidden for cluster-scoped ones.
pub fn validate_object_meta_namespace(
    namespace: &str,
    namespaced: bool,
    meta: &Path,
) -> Vec<FieldError> {
    let path = meta.child("namespace");
    let mut errs = Vec::new();
    if namespaced {
        if namespace.is_empty() {
            errs.push(FieldError::required(&path, ""));
        } else {
            for msg in validate_namespace_name(namespace, false) {
                errs.push(FieldError::invalid(&path, namespace, msg));
            }
        }
    } else if !namespace.is_empty() {
        errs.push(FieldError::forbidden(&path, "not allowed on this type"));
    }
    errs
}

// ---------------------------------------------------------------------------------------------
// Labels, annotations, finalizers, selectors
// ---------------------------------------------------------------------------------------------

/// One label key (upstream's `ValidateLabelName`): one error per problem, at `path`.
pub fn validate_label_name(name: &str, path: &Path) -> Vec<FieldError> {
    is_qualified_name(name)
        .into_iter()
        .map(|msg| FieldError::invalid(path, name, msg))
        .collect()
}

/// An object's labels (upstream's `ValidateLabels`): every key and value, all errors at
/// `path` itself (e.g. `metadata.labels`). Keys are visited in sorted order (upstream visits
/// a Go map, in random order).
pub fn validate_labels(labels: &BTreeMap<String, String>, path: &Path) -> Vec<FieldError> {
    let mut errs = Vec::new();
    for (k, v) in labels {
        errs.extend(validate_label_name(k, path));
        for msg in is_valid_label_value(v) {
            errs.push(FieldError::invalid(path, v.as_str(), msg));
        }
    }
    errs
}

/// Go's `strings.ToLower`: the simple (one character to one character) lowercase mapping,
/// with no context rules.
fn go_to_lower(s: &str) -> String {
    s.chars()
        .map(|c| {
            let mut lower = c.to_lowercase();
            match (lower.next(), lower.next()) {
                (Some(l), None) => l,
                // U+0130 (İ) is the one character whose full lowercase is two characters;
                // its simple mapping, which Go uses, is `i`.
                _ if c == '\u{130}' => 'i',
                _ => c,
            }
        })
        .collect()
}

/// An object's annotations (upstream's `ValidateAnnotations`): every key must be a qualified
/// name once lowercased, and keys and values together may not exceed 256 KiB.
pub fn validate_annotations(
    annotations: &BTreeMap<String, String>,
    path: &Path,
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mut total: usize = 0;
    for (k, v) in annotations {
        for msg in is_qualified_name(&go_to_lower(k)) {
            errs.push(FieldError::invalid(path, k.as_str(), msg));
        }
        total = total.saturating_add(k.len()).saturating_add(v.len());
    }
    if total > TOTAL_ANNOTATION_SIZE_LIMIT_B {
        errs.push(FieldError::too_long(
            path,
            TOTAL_ANNOTATION_SIZE_LIMIT_B as i64,
        ));
    }
    errs
}

/// One finalizer name: a qualified name (upstream's `ValidateFinalizerName`).
pub fn validate_finalizer_name(name: &str, path: &Path) -> Vec<FieldError> {
    is_qualified_name(name)
        .into_iter()
        .map(|msg| FieldError::invalid(path, name, msg))
        .collect()
}

/// An object's finalizers (upstream's `ValidateFinalizers`): each a qualified name, and not
/// both `orphan` and `foregroundDeletion`.
pub fn validate_finalizers(finalizers: &[String], path: &Path) -> Vec<FieldError> {
    let mut errs = Vec::new();
    for f in finalizers {
        errs.extend(validate_finalizer_name(f, path));
    }
    let has = |name: &str| finalizers.iter().any(|f| f == name);
    if has(FINALIZER_DELETE_DEPENDENTS) && has(FINALIZER_ORPHAN_DEPENDENTS) {
        errs.push(FieldError::invalid(
            path,
            BadValue::Json(Value::from(finalizers.to_vec())),
            format!(
                "finalizer {FINALIZER_ORPHAN_DEPENDENTS} and {FINALIZER_DELETE_DEPENDENTS} cannot be both set"
            ),
        ));
    }
    errs
}

/// A field that must not be negative (upstream's `ValidateNonnegativeField`).
pub fn validate_nonnegative_field(value: i64, path: &Path) -> Vec<FieldError> {
    if value < 0 {
        vec![FieldError::invalid(path, value, IS_NEGATIVE_ERROR_MSG)]
    } else {
        Vec::new()
    }
}

/// Options of [`validate_label_selector`], as upstream's `LabelSelectorValidationOptions`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LabelSelectorValidationOptions {
    /// Accept values that are not valid label values in `matchExpressions`.
    pub allow_invalid_label_value_in_selector: bool,
    /// Accept operators other than In, NotIn, Exists and DoesNotExist.
    pub allow_unknown_operator_in_requirement: bool,
}

/// A metav1.LabelSelector in an object (a Deployment's `spec.selector`, for instance), as
/// upstream's `ValidateLabelSelector`.
pub fn validate_label_selector(
    selector: &ApiLabelSelector,
    opts: LabelSelectorValidationOptions,
    path: &Path,
) -> Vec<FieldError> {
    let mut errs = validate_labels(&selector.match_labels, &path.child("matchLabels"));
    for (i, expr) in selector.match_expressions.iter().enumerate() {
        let p = path.child("matchExpressions").index(i);
        let values = &expr.values;
        match expr.operator.as_str() {
            "In" | "NotIn" => {
                if values.is_empty() {
                    errs.push(FieldError::required(
                        &p.child("values"),
                        "must be specified when `operator` is 'In' or 'NotIn'",
                    ));
                }
            }
            "Exists" | "DoesNotExist" => {
                if !values.is_empty() {
                    errs.push(FieldError::forbidden(
                        &p.child("values"),
                        "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
                    ));
                }
            }
            other => {
                if !opts.allow_unknown_operator_in_requirement {
                    errs.push(FieldError::invalid(
                        &p.child("operator"),
                        BadValue::Json(Value::from(other)),
                        "not a valid selector operator",
                    ));
                }
            }
        }
        errs.extend(validate_label_name(&expr.key, &p.child("key")));
        if !opts.allow_invalid_label_value_in_selector {
            for (j, value) in values.iter().enumerate() {
                for msg in is_valid_label_value(value) {
                    errs.push(FieldError::invalid(
                        &p.child("values").index(j),
                        value.as_str(),
                        msg,
                    ));
                }
            }
        }
    }
    errs
}

// ---------------------------------------------------------------------------------------------
// Field paths and field errors (pkg/util/validation/field)
// ---------------------------------------------------------------------------------------------

/// A path to a field, rendered as upstream's `field.Path`: `spec.containers[0].image`,
/// `metadata.labels[app]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Path(String);

impl Path {
    /// A path starting at the field `name`.
    pub fn new(name: &str) -> Path {
        if name.is_empty() {
            Path("[]".to_owned())
        } else {
            Path(name.to_owned())
        }
    }

    /// The field `name` below this one.
    pub fn child(&self, name: &str) -> Path {
        if name.is_empty() {
            Path(format!("{}[]", self.0))
        } else {
            Path(format!("{}.{name}", self.0))
        }
    }

    /// The element `index` of this list.
    pub fn index(&self, index: usize) -> Path {
        Path(format!("{}[{index}]", self.0))
    }

    /// The entry `key` of this map.
    pub fn key(&self, key: &str) -> Path {
        Path(format!("{}[{key}]", self.0))
    }

    /// The rendered path.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The kind of a field error (upstream's `field.ErrorType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FieldErrorKind {
    NotFound,
    Required,
    Duplicate,
    Invalid,
    NotSupported,
    Forbidden,
    TooLong,
    TooMany,
    TooFew,
    TooShort,
    Internal,
    TypeInvalid,
}

impl FieldErrorKind {
    /// The CauseType of a Status cause, e.g. `FieldValueInvalid`.
    pub fn cause_type(self) -> &'static str {
        match self {
            FieldErrorKind::NotFound => "FieldValueNotFound",
            FieldErrorKind::Required => "FieldValueRequired",
            FieldErrorKind::Duplicate => "FieldValueDuplicate",
            FieldErrorKind::Invalid => "FieldValueInvalid",
            FieldErrorKind::NotSupported => "FieldValueNotSupported",
            FieldErrorKind::Forbidden => "FieldValueForbidden",
            FieldErrorKind::TooLong => "FieldValueTooLong",
            FieldErrorKind::TooMany => "FieldValueTooMany",
            FieldErrorKind::TooFew => "FieldValueTooFew",
            FieldErrorKind::TooShort => "FieldValueTooShort",
            FieldErrorKind::Internal => "InternalError",
            FieldErrorKind::TypeInvalid => "FieldValueTypeInvalid",
        }
    }

    /// The words that start the message, e.g. `Invalid value`.
    pub fn as_str(self) -> &'static str {
        match self {
            FieldErrorKind::NotFound => "Not found",
            FieldErrorKind::Required => "Required value",
            FieldErrorKind::Duplicate => "Duplicate value",
            FieldErrorKind::Invalid | FieldErrorKind::TypeInvalid => "Invalid value",
            FieldErrorKind::NotSupported => "Unsupported value",
            FieldErrorKind::Forbidden => "Forbidden",
            FieldErrorKind::TooLong => "Too long",
            FieldErrorKind::TooMany => "Too many",
            FieldErrorKind::TooFew => "Too few",
            FieldErrorKind::TooShort => "Too short",
            FieldErrorKind::Internal => "Internal error",
        }
    }
}

/// The offending value of a field error, rendered as upstream renders `BadValue`: strings
/// Go-quoted (`"Foo"`), numbers and booleans bare, anything else as JSON (Go's encoding, which
/// escapes `<`, `>` and `&`).
#[derive(Clone, Debug, PartialEq)]
pub enum BadValue {
    /// No value shown.
    Omitted,
    String(String),
    Int(i64),
    Bool(bool),
    Json(Value),
}

impl From<&str> for BadValue {
    fn from(s: &str) -> Self {
        BadValue::String(s.to_owned())
    }
}

impl From<String> for BadValue {
    fn from(s: String) -> Self {
        BadValue::String(s)
    }
}

impl From<&String> for BadValue {
    fn from(s: &String) -> Self {
        BadValue::String(s.clone())
    }
}

impl From<i64> for BadValue {
    fn from(v: i64) -> Self {
        BadValue::Int(v)
    }
}

impl From<i32> for BadValue {
    fn from(v: i32) -> Self {
        BadValue::Int(i64::from(v))
    }
}

impl From<bool> for BadValue {
    fn from(v: bool) -> Self {
        BadValue::Bool(v)
    }
}

impl From<Value> for BadValue {
    fn from(v: Value) -> Self {
        BadValue::Json(v)
    }
}

/// One validation error: where, what kind, the offending value and a detail message (upstream's
/// `field.Error`). `Display` renders `<field>: <body>` exactly as upstream's `Error()`.
#[derive(Clone, Debug, PartialEq)]
pub struct FieldError {
    /// The rendered field path, e.g. `spec.containers[0].image`.
    pub field: String,
    pub kind: FieldErrorKind,
    /// The value shown after the kind (only for the kinds that show one).
    pub bad_value: BadValue,
    /// The detail after the value; may be empty.
    pub message: String,
}

impl FieldError {
    fn new(path: &Path, kind: FieldErrorKind, bad_value: BadValue, message: String) -> Self {
        FieldError {
            field: path.0.clone(),
            kind,
            bad_value,
            message,
        }
    }

    /// `<field>: Required value[: <detail>]`.
    pub fn required(path: &Path, detail: impl Into<String>) -> Self {
        Self::new(
            path,
            FieldErrorKind::Required,
            BadValue::String(String::new()),
            detail.into(),
        )
    }

    /// `<field>: Invalid value: <value>[: <detail>]`.
    pub fn invalid(path: &Path, value: impl Into<BadValue>, detail: impl Into<String>) -> Self {
        Self::new(path, FieldErrorKind::Invalid, value.into(), detail.into())
    }

    /// `<field>: Duplicate value: <value>`.
    pub fn duplicate(path: &Path, value: impl Into<BadValue>) -> Self {
        Self::new(path, FieldErrorKind::Duplicate, value.into(), String::new())
    }

    /// `<field>: Not found: <value>`.
    pub fn not_found(path: &Path, value: impl Into<BadValue>) -> Self {
        Self::new(path, FieldErrorKind::NotFound, value.into(), String::new())
    }

    /// `<field>: Unsupported value: <value>: supported values: "a", "b"`.
    pub fn not_supported<S: AsRef<str>>(
        path: &Path,
        value: impl Into<BadValue>,
        valid: &[S],
    ) -> Self {
        let detail = if valid.is_empty() {
            String::new()
        } else {
            let quoted: Vec<String> = valid.iter().map(|v| go_quote(v.as_ref())).collect();
            format!("supported values: {}", quoted.join(", "))
        };
        Self::new(path, FieldErrorKind::NotSupported, value.into(), detail)
    }

    /// `<field>: Forbidden[: <detail>]`.
    pub fn forbidden(path: &Path, detail: impl Into<String>) -> Self {
        Self::new(
            path,
            FieldErrorKind::Forbidden,
            BadValue::String(String::new()),
            detail.into(),
        )
    }

    /// `<field>: Too long: may not be more than N bytes` (`value is too long` when `max` is
    /// negative).
    pub fn too_long(path: &Path, max: i64) -> Self {
        let detail = if max >= 0 {
            let unit = if max == 1 { "byte" } else { "bytes" };
            format!("may not be more than {max} {unit}")
        } else {
            "value is too long".to_owned()
        };
        Self::new(
            path,
            FieldErrorKind::TooLong,
            BadValue::String("<value omitted>".to_owned()),
            detail,
        )
    }

    /// `<field>: Too long: may not be more than N characters`.
    pub fn too_long_characters(path: &Path, max: i64) -> Self {
        let detail = if max >= 0 {
            let unit = if max == 1 { "character" } else { "characters" };
            format!("may not be more than {max} {unit}")
        } else {
            "value is too long".to_owned()
        };
        Self::new(
            path,
            FieldErrorKind::TooLong,
            BadValue::String("<value omitted>".to_owned()),
            detail,
        )
    }

    /// `<field>: Too many: <actual>: must have at most N items` (the count is left out when
    /// `actual` is negative).
    pub fn too_many(path: &Path, actual: i64, max: i64) -> Self {
        let detail = if max >= 0 {
            let unit = if max == 1 { "item" } else { "items" };
            format!("must have at most {max} {unit}")
        } else {
            "has too many items".to_owned()
        };
        let value = if actual >= 0 {
            BadValue::Int(actual)
        } else {
            BadValue::Omitted
        };
        Self::new(path, FieldErrorKind::TooMany, value, detail)
    }

    /// `<field>: Too short: must be at least N characters`.
    pub fn too_short(path: &Path, value: &str, min: i64) -> Self {
        let detail = if min >= 0 {
            let unit = if min == 1 { "character" } else { "characters" };
            format!("must be at least {min} {unit}")
        } else {
            "value is too short".to_owned()
        };
        Self::new(path, FieldErrorKind::TooShort, value.into(), detail)
    }

    /// `<field>: Invalid value: <value>: <detail>` of kind TypeInvalid.
    pub fn type_invalid(
        path: &Path,
        value: impl Into<BadValue>,
        detail: impl Into<String>,
    ) -> Self {
        Self::new(
            path,
            FieldErrorKind::TypeInvalid,
            value.into(),
            detail.into(),
        )
    }

    /// `<field>: Internal error: <err>`.
    pub fn internal(path: &Path, err: impl fmt::Display) -> Self {
        Self::new(
            path,
            FieldErrorKind::Internal,
            BadValue::Omitted,
            err.to_string(),
        )
    }

    /// The CauseType of this error, e.g. `FieldValueInvalid`.
    pub fn cause_type(&self) -> &'static str {
        self.kind.cause_type()
    }

    /// The message without the field (upstream's `ErrorBody()`), which is what a Status cause
    /// carries as its `message`.
    pub fn error_body(&self) -> String {
        let mut s = String::from(self.kind.as_str());
        let shows_value = !matches!(
            self.kind,
            FieldErrorKind::Required
                | FieldErrorKind::Forbidden
                | FieldErrorKind::TooLong
                | FieldErrorKind::TooShort
                | FieldErrorKind::Internal
        );
        if shows_value {
            match &self.bad_value {
                BadValue::Omitted => {}
                BadValue::String(v) => {
                    s.push_str(": ");
                    s.push_str(&go_quote(v));
                }
                BadValue::Int(v) => {
                    s.push_str(&format!(": {v}"));
                }
                BadValue::Bool(v) => {
                    s.push_str(&format!(": {v}"));
                }
                BadValue::Json(v) => {
                    s.push_str(": ");
                    s.push_str(&go_json(v));
                }
            }
        }
        if !self.message.is_empty() {
            s.push_str(": ");
            s.push_str(&self.message);
        }
        s
    }

    /// The Status cause for this error: `reason` is the CauseType, `message` the body.
    pub fn to_cause(&self) -> Cause {
        Cause {
            reason: self.cause_type().to_owned(),
            message: self.error_body(),
            field: self.field.clone(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.error_body())
    }
}

impl std::error::Error for FieldError {}

/// The message of a list of field errors as upstream's `ErrorList.ToAggregate().Error()`:
/// duplicates dropped, one message alone, several as `[a, b]`; `None` for no errors.
pub fn aggregate_message(errs: &[FieldError]) -> Option<String> {
    let mut seen = std::collections::HashSet::new();
    let mut msgs = Vec::new();
    for e in errs {
        let m = e.to_string();
        if seen.insert(m.clone()) {
            msgs.push(m);
        }
    }
    match msgs.len() {
        0 => None,
        1 => msgs.pop(),
        _ => Some(format!("[{}]", msgs.join(", "))),
    }
}

/// The message of the 422 Invalid error kube-apiserver answers for an object that fails
/// validation: `<Kind> "<name>" is invalid: <errors>`, where `kind` is the qualified kind
/// (`Pod`, `Deployment.apps`) and the errors are aggregated as [`aggregate_message`].
pub fn invalid_message(kind: &str, name: &str, errs: &[FieldError]) -> String {
    match aggregate_message(errs) {
        None => format!("{kind} {} is invalid", go_quote(name)),
        Some(agg) => format!("{kind} {} is invalid: {agg}", go_quote(name)),
    }
}

// ---------------------------------------------------------------------------------------------
// Go's quoting of values in messages
// ---------------------------------------------------------------------------------------------

/// A string quoted as Go's `%q` (`strconv.Quote`): printable characters kept, `"` and `\`
/// escaped, the rest as `\n`, `\x1f`, `\u00a0`, `\U000e0001`.
pub fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if go_is_print(c) => out.push(c),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if (c as u32) < 0x10000 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
    out.push('"');
    out
}

/// A JSON value encoded as Go's `encoding/json` encodes it: object keys sorted, no spaces,
/// `<`, `>`, `&`, U+2028 and U+2029 escaped as `\u003c` and so on.
pub fn go_json(v: &Value) -> String {
    let mut out = String::new();
    write_go_json(v, &mut out);
    out
}

fn write_go_json(v: &Value, out: &mut String) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&n.to_string()),
        Value::String(s) => write_go_json_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_go_json(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_go_json_string(k, out);
                out.push(':');
                if let Some(item) = map.get(k) {
                    write_go_json(item, out);
                }
            }
            out.push('}');
        }
    }
}

fn write_go_json_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                out.push_str(&format!("\\u{:04x}", c as u32));
            }
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Go's `unicode.IsPrint`: letters, marks, numbers, punctuation, symbols and the ASCII space.
pub fn go_is_print(c: char) -> bool {
    let cp = c as u32;
    if (0x20..0x7f).contains(&cp) {
        return true;
    }
    NON_PRINTABLE
        .binary_search_by(|&(lo, hi)| {
            if hi < cp {
                std::cmp::Ordering::Less
            } else if lo > cp {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        })
        .is_err()
}

/// The code points Go's `unicode.IsPrint` rejects (Unicode 15.0.0, the tables of the Go
/// release the reference kube-apiserver is built with), as inclusive ranges; surrogates,
/// which are not `char`s, are folded into their neighbours.
#[rustfmt::skip]
const NON_PRINTABLE: &[(u32, u32)] = &[
    (0x0, 0x1f), (0x7f, 0xa0), (0xad, 0xad), (0x378, 0x379), (0x380, 0x383), (0x38b, 0x38b),
    (0x38d, 0x38d), (0x3a2, 0x3a2), (0x530, 0x530), (0x557, 0x558), (0x58b, 0x58c),
    (0x590, 0x590), (0x5c8, 0x5cf), (0x5eb, 0x5ee), (0x5f5, 0x605), (0x61c, 0x61c),
    (0x6dd, 0x6dd), (0x70e, 0x70f), (0x74b, 0x74c), (0x7b2, 0x7bf), (0x7fb, 0x7fc),
    (0x82e, 0x82f), (0x83f, 0x83f), (0x85c, 0x85d), (0x85f, 0x85f), (0x86b, 0x86f),
    (0x88f, 0x897), (0x8e2, 0x8e2), (0x984, 0x984), (0x98d, 0x98e), (0x991, 0x992),
    (0x9a9, 0x9a9), (0x9b1, 0x9b1), (0x9b3, 0x9b5), (0x9ba, 0x9bb), (0x9c5, 0x9c6),
    (0x9c9, 0x9ca), (0x9cf, 0x9d6), (0x9d8, 0x9db), (0x9de, 0x9de), (0x9e4, 0x9e5),
    (0x9ff, 0xa00), (0xa04, 0xa04), (0xa0b, 0xa0e), (0xa11, 0xa12), (0xa29, 0xa29),
    (0xa31, 0xa31), (0xa34, 0xa34), (0xa37, 0xa37), (0xa3a, 0xa3b), (0xa3d, 0xa3d),
    (0xa43, 0xa46), (0xa49, 0xa4a), (0xa4e, 0xa50), (0xa52, 0xa58), (0xa5d, 0xa5d),
    (0xa5f, 0xa65), (0xa77, 0xa80), (0xa84, 0xa84), (0xa8e, 0xa8e), (0xa92, 0xa92),
    (0xaa9, 0xaa9), (0xab1, 0xab1), (0xab4, 0xab4), (0xaba, 0xabb), (0xac6, 0xac6),
    (0xaca, 0xaca), (0xace, 0xacf), (0xad1, 0xadf), (0xae4, 0xae5), (0xaf2, 0xaf8),
    (0xb00, 0xb00), (0xb04, 0xb04), (0xb0d, 0xb0e), (0xb11, 0xb12), (0xb29, 0xb29),
    (0xb31, 0xb31), (0xb34, 0xb34), (0xb3a, 0xb3b), (0xb45, 0xb46), (0xb49, 0xb4a),
    (0xb4e, 0xb54), (0xb58, 0xb5b), (0xb5e, 0xb5e), (0xb64, 0xb65), (0xb78, 0xb81),
    (0xb84, 0xb84), (0xb8b, 0xb8d), (0xb91, 0xb91), (0xb96, 0xb98), (0xb9b, 0xb9b),
    (0xb9d, 0xb9d), (0xba0, 0xba2), (0xba5, 0xba7), (0xbab, 0xbad), (0xbba, 0xbbd),
    (0xbc3, 0xbc5), (0xbc9, 0xbc9), (0xbce, 0xbcf), (0xbd1, 0xbd6), (0xbd8, 0xbe5),
    (0xbfb, 0xbff), (0xc0d, 0xc0d), (0xc11, 0xc11), (0xc29, 0xc29), (0xc3a, 0xc3b),
    (0xc45, 0xc45), (0xc49, 0xc49), (0xc4e, 0xc54), (0xc57, 0xc57), (0xc5b, 0xc5c),
    (0xc5e, 0xc5f), (0xc64, 0xc65), (0xc70, 0xc76), (0xc8d, 0xc8d), (0xc91, 0xc91),
    (0xca9, 0xca9), (0xcb4, 0xcb4), (0xcba, 0xcbb), (0xcc5, 0xcc5), (0xcc9, 0xcc9),
    (0xcce, 0xcd4), (0xcd7, 0xcdc), (0xcdf, 0xcdf), (0xce4, 0xce5), (0xcf0, 0xcf0),
    (0xcf4, 0xcff), (0xd0d, 0xd0d), (0xd11, 0xd11), (0xd45, 0xd45), (0xd49, 0xd49),
    (0xd50, 0xd53), (0xd64, 0xd65), (0xd80, 0xd80), (0xd84, 0xd84), (0xd97, 0xd99),
    (0xdb2, 0xdb2), (0xdbc, 0xdbc), (0xdbe, 0xdbf), (0xdc7, 0xdc9), (0xdcb, 0xdce),
    (0xdd5, 0xdd5), (0xdd7, 0xdd7), (0xde0, 0xde5), (0xdf0, 0xdf1), (0xdf5, 0xe00),
    (0xe3b, 0xe3e), (0xe5c, 0xe80), (0xe83, 0xe83), (0xe85, 0xe85), (0xe8b, 0xe8b),
    (0xea4, 0xea4), (0xea6, 0xea6), (0xebe, 0xebf), (0xec5, 0xec5), (0xec7, 0xec7),
    (0xecf, 0xecf), (0xeda, 0xedb), (0xee0, 0xeff), (0xf48, 0xf48), (0xf6d, 0xf70),
    (0xf98, 0xf98), (0xfbd, 0xfbd), (0xfcd, 0xfcd), (0xfdb, 0xfff), (0x10c6, 0x10c6),
    (0x10c8, 0x10cc), (0x10ce, 0x10cf), (0x1249, 0x1249), (0x124e, 0x124f), (0x1257, 0x1257),
    (0x1259, 0x1259), (0x125e, 0x125f), (0x1289, 0x1289), (0x128e, 0x128f), (0x12b1, 0x12b1),
    (0x12b6, 0x12b7), (0x12bf, 0x12bf), (0x12c1, 0x12c1), (0x12c6, 0x12c7), (0x12d7, 0x12d7),
    (0x1311, 0x1311), (0x1316, 0x1317), (0x135b, 0x135c), (0x137d, 0x137f), (0x139a, 0x139f),
    (0x13f6, 0x13f7), (0x13fe, 0x13ff), (0x1680, 0x1680), (0x169d, 0x169f), (0x16f9, 0x16ff),
    (0x1716, 0x171e), (0x1737, 0x173f), (0x1754, 0x175f), (0x176d, 0x176d), (0x1771, 0x1771),
    (0x1774, 0x177f), (0x17de, 0x17df), (0x17ea, 0x17ef), (0x17fa, 0x17ff), (0x180e, 0x180e),
    (0x181a, 0x181f), (0x1879, 0x187f), (0x18ab, 0x18af), (0x18f6, 0x18ff), (0x191f, 0x191f),
    (0x192c, 0x192f), (0x193c, 0x193f), (0x1941, 0x1943), (0x196e, 0x196f), (0x1975, 0x197f),
    (0x19ac, 0x19af), (0x19ca, 0x19cf), (0x19db, 0x19dd), (0x1a1c, 0x1a1d), (0x1a5f, 0x1a5f),
    (0x1a7d, 0x1a7e), (0x1a8a, 0x1a8f), (0x1a9a, 0x1a9f), (0x1aae, 0x1aaf), (0x1acf, 0x1aff),
    (0x1b4d, 0x1b4f), (0x1b7f, 0x1b7f), (0x1bf4, 0x1bfb), (0x1c38, 0x1c3a), (0x1c4a, 0x1c4c),
    (0x1c89, 0x1c8f), (0x1cbb, 0x1cbc), (0x1cc8, 0x1ccf), (0x1cfb, 0x1cff), (0x1f16, 0x1f17),
    (0x1f1e, 0x1f1f), (0x1f46, 0x1f47), (0x1f4e, 0x1f4f), (0x1f58, 0x1f58), (0x1f5a, 0x1f5a),
    (0x1f5c, 0x1f5c), (0x1f5e, 0x1f5e), (0x1f7e, 0x1f7f), (0x1fb5, 0x1fb5), (0x1fc5, 0x1fc5),
    (0x1fd4, 0x1fd5), (0x1fdc, 0x1fdc), (0x1ff0, 0x1ff1), (0x1ff5, 0x1ff5), (0x1fff, 0x200f),
    (0x2028, 0x202f), (0x205f, 0x206f), (0x2072, 0x2073), (0x208f, 0x208f), (0x209d, 0x209f),
    (0x20c1, 0x20cf), (0x20f1, 0x20ff), (0x218c, 0x218f), (0x2427, 0x243f), (0x244b, 0x245f),
    (0x2b74, 0x2b75), (0x2b96, 0x2b96), (0x2cf4, 0x2cf8), (0x2d26, 0x2d26), (0x2d28, 0x2d2c),
    (0x2d2e, 0x2d2f), (0x2d68, 0x2d6e), (0x2d71, 0x2d7e), (0x2d97, 0x2d9f), (0x2da7, 0x2da7),
    (0x2daf, 0x2daf), (0x2db7, 0x2db7), (0x2dbf, 0x2dbf), (0x2dc7, 0x2dc7), (0x2dcf, 0x2dcf),
    (0x2dd7, 0x2dd7), (0x2ddf, 0x2ddf), (0x2e5e, 0x2e7f), (0x2e9a, 0x2e9a), (0x2ef4, 0x2eff),
    (0x2fd6, 0x2fef), (0x2ffc, 0x3000), (0x3040, 0x3040), (0x3097, 0x3098), (0x3100, 0x3104),
    (0x3130, 0x3130), (0x318f, 0x318f), (0x31e4, 0x31ef), (0x321f, 0x321f), (0xa48d, 0xa48f),
    (0xa4c7, 0xa4cf), (0xa62c, 0xa63f), (0xa6f8, 0xa6ff), (0xa7cb, 0xa7cf), (0xa7d2, 0xa7d2),
    (0xa7d4, 0xa7d4), (0xa7da, 0xa7f1), (0xa82d, 0xa82f), (0xa83a, 0xa83f), (0xa878, 0xa87f),
    (0xa8c6, 0xa8cd), (0xa8da, 0xa8df), (0xa954, 0xa95e), (0xa97d, 0xa97f), (0xa9ce, 0xa9ce),
    (0xa9da, 0xa9dd), (0xa9ff, 0xa9ff), (0xaa37, 0xaa3f), (0xaa4e, 0xaa4f), (0xaa5a, 0xaa5b),
    (0xaac3, 0xaada), (0xaaf7, 0xab00), (0xab07, 0xab08), (0xab0f, 0xab10), (0xab17, 0xab1f),
    (0xab27, 0xab27), (0xab2f, 0xab2f), (0xab6c, 0xab6f), (0xabee, 0xabef), (0xabfa, 0xabff),
    (0xd7a4, 0xd7af), (0xd7c7, 0xd7ca), (0xd7fc, 0xf8ff), (0xfa6e, 0xfa6f), (0xfada, 0xfaff),
    (0xfb07, 0xfb12), (0xfb18, 0xfb1c), (0xfb37, 0xfb37), (0xfb3d, 0xfb3d), (0xfb3f, 0xfb3f),
    (0xfb42, 0xfb42), (0xfb45, 0xfb45), (0xfbc3, 0xfbd2), (0xfd90, 0xfd91), (0xfdc8, 0xfdce),
    (0xfdd0, 0xfdef), (0xfe1a, 0xfe1f), (0xfe53, 0xfe53), (0xfe67, 0xfe67), (0xfe6c, 0xfe6f),
    (0xfe75, 0xfe75), (0xfefd, 0xff00), (0xffbf, 0xffc1), (0xffc8, 0xffc9), (0xffd0, 0xffd1),
    (0xffd8, 0xffd9), (0xffdd, 0xffdf), (0xffe7, 0xffe7), (0xffef, 0xfffb), (0xfffe, 0xffff),
    (0x1000c, 0x1000c), (0x10027, 0x10027), (0x1003b, 0x1003b), (0x1003e, 0x1003e),
    (0x1004e, 0x1004f), (0x1005e, 0x1007f), (0x100fb, 0x100ff), (0x10103, 0x10106),
    (0x10134, 0x10136), (0x1018f, 0x1018f), (0x1019d, 0x1019f), (0x101a1, 0x101cf),
    (0x101fe, 0x1027f), (0x1029d, 0x1029f), (0x102d1, 0x102df), (0x102fc, 0x102ff),
    (0x10324, 0x1032c), (0x1034b, 0x1034f), (0x1037b, 0x1037f), (0x1039e, 0x1039e),
    (0x103c4, 0x103c7), (0x103d6, 0x103ff), (0x1049e, 0x1049f), (0x104aa, 0x104af),
    (0x104d4, 0x104d7), (0x104fc, 0x104ff), (0x10528, 0x1052f), (0x10564, 0x1056e),
    (0x1057b, 0x1057b), (0x1058b, 0x1058b), (0x10593, 0x10593), (0x10596, 0x10596),
    (0x105a2, 0x105a2), (0x105b2, 0x105b2), (0x105ba, 0x105ba), (0x105bd, 0x105ff),
    (0x10737, 0x1073f), (0x10756, 0x1075f), (0x10768, 0x1077f), (0x10786, 0x10786),
    (0x107b1, 0x107b1), (0x107bb, 0x107ff), (0x10806, 0x10807), (0x10809, 0x10809),
    (0x10836, 0x10836), (0x10839, 0x1083b), (0x1083d, 0x1083e), (0x10856, 0x10856),
    (0x1089f, 0x108a6), (0x108b0, 0x108df), (0x108f3, 0x108f3), (0x108f6, 0x108fa),
    (0x1091c, 0x1091e), (0x1093a, 0x1093e), (0x10940, 0x1097f), (0x109b8, 0x109bb),
    (0x109d0, 0x109d1), (0x10a04, 0x10a04), (0x10a07, 0x10a0b), (0x10a14, 0x10a14),
    (0x10a18, 0x10a18), (0x10a36, 0x10a37), (0x10a3b, 0x10a3e), (0x10a49, 0x10a4f),
    (0x10a59, 0x10a5f), (0x10aa0, 0x10abf), (0x10ae7, 0x10aea), (0x10af7, 0x10aff),
    (0x10b36, 0x10b38), (0x10b56, 0x10b57), (0x10b73, 0x10b77), (0x10b92, 0x10b98),
    (0x10b9d, 0x10ba8), (0x10bb0, 0x10bff), (0x10c49, 0x10c7f), (0x10cb3, 0x10cbf),
    (0x10cf3, 0x10cf9), (0x10d28, 0x10d2f), (0x10d3a, 0x10e5f), (0x10e7f, 0x10e7f),
    (0x10eaa, 0x10eaa), (0x10eae, 0x10eaf), (0x10eb2, 0x10efc), (0x10f28, 0x10f2f),
    (0x10f5a, 0x10f6f), (0x10f8a, 0x10faf), (0x10fcc, 0x10fdf), (0x10ff7, 0x10fff),
    (0x1104e, 0x11051), (0x11076, 0x1107e), (0x110bd, 0x110bd), (0x110c3, 0x110cf),
    (0x110e9, 0x110ef), (0x110fa, 0x110ff), (0x11135, 0x11135), (0x11148, 0x1114f),
    (0x11177, 0x1117f), (0x111e0, 0x111e0), (0x111f5, 0x111ff), (0x11212, 0x11212),
    (0x11242, 0x1127f), (0x11287, 0x11287), (0x11289, 0x11289), (0x1128e, 0x1128e),
    (0x1129e, 0x1129e), (0x112aa, 0x112af), (0x112eb, 0x112ef), (0x112fa, 0x112ff),
    (0x11304, 0x11304), (0x1130d, 0x1130e), (0x11311, 0x11312), (0x11329, 0x11329),
    (0x11331, 0x11331), (0x11334, 0x11334), (0x1133a, 0x1133a), (0x11345, 0x11346),
    (0x11349, 0x1134a), (0x1134e, 0x1134f), (0x11351, 0x11356), (0x11358, 0x1135c),
    (0x11364, 0x11365), (0x1136d, 0x1136f), (0x11375, 0x113ff), (0x1145c, 0x1145c),
    (0x11462, 0x1147f), (0x114c8, 0x114cf), (0x114da, 0x1157f), (0x115b6, 0x115b7),
    (0x115de, 0x115ff), (0x11645, 0x1164f), (0x1165a, 0x1165f), (0x1166d, 0x1167f),
    (0x116ba, 0x116bf), (0x116ca, 0x116ff), (0x1171b, 0x1171c), (0x1172c, 0x1172f),
    (0x11747, 0x117ff), (0x1183c, 0x1189f), (0x118f3, 0x118fe), (0x11907, 0x11908),
    (0x1190a, 0x1190b), (0x11914, 0x11914), (0x11917, 0x11917), (0x11936, 0x11936),
    (0x11939, 0x1193a), (0x11947, 0x1194f), (0x1195a, 0x1199f), (0x119a8, 0x119a9),
    (0x119d8, 0x119d9), (0x119e5, 0x119ff), (0x11a48, 0x11a4f), (0x11aa3, 0x11aaf),
    (0x11af9, 0x11aff), (0x11b0a, 0x11bff), (0x11c09, 0x11c09), (0x11c37, 0x11c37),
    (0x11c46, 0x11c4f), (0x11c6d, 0x11c6f), (0x11c90, 0x11c91), (0x11ca8, 0x11ca8),
    (0x11cb7, 0x11cff), (0x11d07, 0x11d07), (0x11d0a, 0x11d0a), (0x11d37, 0x11d39),
    (0x11d3b, 0x11d3b), (0x11d3e, 0x11d3e), (0x11d48, 0x11d4f), (0x11d5a, 0x11d5f),
    (0x11d66, 0x11d66), (0x11d69, 0x11d69), (0x11d8f, 0x11d8f), (0x11d92, 0x11d92),
    (0x11d99, 0x11d9f), (0x11daa, 0x11edf), (0x11ef9, 0x11eff), (0x11f11, 0x11f11),
    (0x11f3b, 0x11f3d), (0x11f5a, 0x11faf), (0x11fb1, 0x11fbf), (0x11ff2, 0x11ffe),
    (0x1239a, 0x123ff), (0x1246f, 0x1246f), (0x12475, 0x1247f), (0x12544, 0x12f8f),
    (0x12ff3, 0x12fff), (0x13430, 0x1343f), (0x13456, 0x143ff), (0x14647, 0x167ff),
    (0x16a39, 0x16a3f), (0x16a5f, 0x16a5f), (0x16a6a, 0x16a6d), (0x16abf, 0x16abf),
    (0x16aca, 0x16acf), (0x16aee, 0x16aef), (0x16af6, 0x16aff), (0x16b46, 0x16b4f),
    (0x16b5a, 0x16b5a), (0x16b62, 0x16b62), (0x16b78, 0x16b7c), (0x16b90, 0x16e3f),
    (0x16e9b, 0x16eff), (0x16f4b, 0x16f4e), (0x16f88, 0x16f8e), (0x16fa0, 0x16fdf),
    (0x16fe5, 0x16fef), (0x16ff2, 0x16fff), (0x187f8, 0x187ff), (0x18cd6, 0x18cff),
    (0x18d09, 0x1afef), (0x1aff4, 0x1aff4), (0x1affc, 0x1affc), (0x1afff, 0x1afff),
    (0x1b123, 0x1b131), (0x1b133, 0x1b14f), (0x1b153, 0x1b154), (0x1b156, 0x1b163),
    (0x1b168, 0x1b16f), (0x1b2fc, 0x1bbff), (0x1bc6b, 0x1bc6f), (0x1bc7d, 0x1bc7f),
    (0x1bc89, 0x1bc8f), (0x1bc9a, 0x1bc9b), (0x1bca0, 0x1ceff), (0x1cf2e, 0x1cf2f),
    (0x1cf47, 0x1cf4f), (0x1cfc4, 0x1cfff), (0x1d0f6, 0x1d0ff), (0x1d127, 0x1d128),
    (0x1d173, 0x1d17a), (0x1d1eb, 0x1d1ff), (0x1d246, 0x1d2bf), (0x1d2d4, 0x1d2df),
    (0x1d2f4, 0x1d2ff), (0x1d357, 0x1d35f), (0x1d379, 0x1d3ff), (0x1d455, 0x1d455),
    (0x1d49d, 0x1d49d), (0x1d4a0, 0x1d4a1), (0x1d4a3, 0x1d4a4), (0x1d4a7, 0x1d4a8),
    (0x1d4ad, 0x1d4ad), (0x1d4ba, 0x1d4ba), (0x1d4bc, 0x1d4bc), (0x1d4c4, 0x1d4c4),
    (0x1d506, 0x1d506), (0x1d50b, 0x1d50c), (0x1d515, 0x1d515), (0x1d51d, 0x1d51d),
    (0x1d53a, 0x1d53a), (0x1d53f, 0x1d53f), (0x1d545, 0x1d545), (0x1d547, 0x1d549),
    (0x1d551, 0x1d551), (0x1d6a6, 0x1d6a7), (0x1d7cc, 0x1d7cd), (0x1da8c, 0x1da9a),
    (0x1daa0, 0x1daa0), (0x1dab0, 0x1deff), (0x1df1f, 0x1df24), (0x1df2b, 0x1dfff),
    (0x1e007, 0x1e007), (0x1e019, 0x1e01a), (0x1e022, 0x1e022), (0x1e025, 0x1e025),
    (0x1e02b, 0x1e02f), (0x1e06e, 0x1e08e), (0x1e090, 0x1e0ff), (0x1e12d, 0x1e12f),
    (0x1e13e, 0x1e13f), (0x1e14a, 0x1e14d), (0x1e150, 0x1e28f), (0x1e2af, 0x1e2bf),
    (0x1e2fa, 0x1e2fe), (0x1e300, 0x1e4cf), (0x1e4fa, 0x1e7df), (0x1e7e7, 0x1e7e7),
    (0x1e7ec, 0x1e7ec), (0x1e7ef, 0x1e7ef), (0x1e7ff, 0x1e7ff), (0x1e8c5, 0x1e8c6),
    (0x1e8d7, 0x1e8ff), (0x1e94c, 0x1e94f), (0x1e95a, 0x1e95d), (0x1e960, 0x1ec70),
    (0x1ecb5, 0x1ed00), (0x1ed3e, 0x1edff), (0x1ee04, 0x1ee04), (0x1ee20, 0x1ee20),
    (0x1ee23, 0x1ee23), (0x1ee25, 0x1ee26), (0x1ee28, 0x1ee28), (0x1ee33, 0x1ee33),
    (0x1ee38, 0x1ee38), (0x1ee3a, 0x1ee3a), (0x1ee3c, 0x1ee41), (0x1ee43, 0x1ee46),
    (0x1ee48, 0x1ee48), (0x1ee4a, 0x1ee4a), (0x1ee4c, 0x1ee4c), (0x1ee50, 0x1ee50),
    (0x1ee53, 0x1ee53), (0x1ee55, 0x1ee56), (0x1ee58, 0x1ee58), (0x1ee5a, 0x1ee5a),
    (0x1ee5c, 0x1ee5c), (0x1ee5e, 0x1ee5e), (0x1ee60, 0x1ee60), (0x1ee63, 0x1ee63),
    (0x1ee65, 0x1ee66), (0x1ee6b, 0x1ee6b), (0x1ee73, 0x1ee73), (0x1ee78, 0x1ee78),
    (0x1ee7d, 0x1ee7d), (0x1ee7f, 0x1ee7f), (0x1ee8a, 0x1ee8a), (0x1ee9c, 0x1eea0),
    (0x1eea4, 0x1eea4), (0x1eeaa, 0x1eeaa), (0x1eebc, 0x1eeef), (0x1eef2, 0x1efff),
    (0x1f02c, 0x1f02f), (0x1f094, 0x1f09f), (0x1f0af, 0x1f0b0), (0x1f0c0, 0x1f0c0),
    (0x1f0d0, 0x1f0d0), (0x1f0f6, 0x1f0ff), (0x1f1ae, 0x1f1e5), (0x1f203, 0x1f20f),
    (0x1f23c, 0x1f23f), (0x1f249, 0x1f24f), (0x1f252, 0x1f25f), (0x1f266, 0x1f2ff),
    (0x1f6d8, 0x1f6db), (0x1f6ed, 0x1f6ef), (0x1f6fd, 0x1f6ff), (0x1f777, 0x1f77a),
    (0x1f7da, 0x1f7df), (0x1f7ec, 0x1f7ef), (0x1f7f1, 0x1f7ff), (0x1f80c, 0x1f80f),
    (0x1f848, 0x1f84f), (0x1f85a, 0x1f85f), (0x1f888, 0x1f88f), (0x1f8ae, 0x1f8af),
    (0x1f8b2, 0x1f8ff), (0x1fa54, 0x1fa5f), (0x1fa6e, 0x1fa6f), (0x1fa7d, 0x1fa7f),
    (0x1fa89, 0x1fa8f), (0x1fabe, 0x1fabe), (0x1fac6, 0x1facd), (0x1fadc, 0x1fadf),
    (0x1fae9, 0x1faef), (0x1faf9, 0x1faff), (0x1fb93, 0x1fb93), (0x1fbcb, 0x1fbef),
    (0x1fbfa, 0x1ffff), (0x2a6e0, 0x2a6ff), (0x2b73a, 0x2b73f), (0x2b81e, 0x2b81f),
    (0x2cea2, 0x2ceaf), (0x2ebe1, 0x2f7ff), (0x2fa1e, 0x2ffff), (0x3134b, 0x3134f),
    (0x323b0, 0xe00ff), (0xe01f0, 0x10ffff),
];

#[cfg(test)]
mod tests {
    //! Inputs and outcomes from upstream's test tables (pkg/util/validation/validation_test.go,
    //! pkg/api/validate/content) and answers of upstream v0.37.2 to further inputs.

    use super::*;
    use serde_json::json;

    const SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
    const LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
    const DNS1035_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";
    const NAME_PART_MSG: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
    const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";

    fn good(f: fn(&str) -> Vec<String>, values: &[&str]) {
        for v in values {
            assert_eq!(f(v), Vec::<String>::new(), "{v:?} should be valid");
        }
    }

    fn bad(f: fn(&str) -> Vec<String>, values: &[&str]) {
        for v in values {
            assert!(!f(v).is_empty(), "{v:?} should be invalid");
        }
    }

    #[test]
    fn dns1123_label() {
        let a63 = "a".repeat(63);
        let a64 = "a".repeat(64);
        good(
            is_dns1123_label,
            &[
                "a",
                "ab",
                "abc",
                "a1",
                "a-1",
                "a--1--2--b",
                "0",
                "01",
                "012",
                "1a",
                "1-a",
                "1--a--b--2",
                &a63,
            ],
        );
        bad(
            is_dns1123_label,
            &[
                "", "A", "ABC", "aBc", "A1", "A-1", "1-A", "-", "a-", "-a", "1-", "-1", "_", "a_",
                "_a", "a_b", "1_", "_1", "1_2", ".", "a.", ".a", "a.b", "1.", ".1", "1.2", " ",
                "a ", " a", "a b", "1 ", " 1", "1 2", &a64,
            ],
        );
        assert_eq!(is_dns1123_label("a.b"), ["must not contain dots"]);
        assert_eq!(is_dns1123_label("Foo"), [LABEL_MSG]);
        assert_eq!(
            is_dns1123_label(&a64),
            ["must be no more than 63 characters"]
        );
        assert_eq!(
            is_dns1123_label(&format!("{a64}-")),
            ["must be no more than 63 characters", LABEL_MSG]
        );
    }

    #[test]
    fn dns1123_subdomain() {
        let a253 = "a".repeat(253);
        let a254 = "a".repeat(254);
        good(
            is_dns1123_subdomain,
            &[
                "a",
                "ab",
                "abc",
                "a1",
                "a-1",
                "a--1--2--b",
                "0",
                "01",
                "012",
                "1a",
                "1-a",
                "1--a--b--2",
                "a.a",
                "ab.a",
                "abc.a",
                "a1.a",
                "a-1.a",
                "a--1--2--b.a",
                "a.1",
                "ab.1",
                "abc.1",
                "a1.1",
                "a-1.1",
                "a--1--2--b.1",
                "0.a",
                "01.a",
                "012.a",
                "1a.a",
                "1-a.a",
                "0.1",
                "01.1",
                "012.1",
                "1a.1",
                "1-a.1",
                "1--a--b--2.1",
                "a.b.c.d.e",
                "aa.bb.cc.dd.ee",
                "1.2.3.4.5",
                "11.22.33.44.55",
                &a253,
            ],
        );
        bad(
            is_dns1123_subdomain,
            &[
                "",
                "A",
                "ABC",
                "aBc",
                "A1",
                "A-1",
                "1-A",
                "-",
                "a-",
                "-a",
                "1-",
                "-1",
                "_",
                "a_",
                "_a",
                "a_b",
                "1_",
                "_1",
                "1_2",
                ".",
                "a.",
                ".a",
                "a..b",
                "1.",
                ".1",
                "1..2",
                " ",
                "a ",
                " a",
                "a b",
                "1 ",
                " 1",
                "1 2",
                "A.a",
                "aB.a",
                "ab.A",
                "A1.a",
                "a1.A",
                "A.1",
                "aB.1",
                "A1.1",
                "1A.1",
                "0.A",
                "01.A",
                "012.A",
                "1A.a",
                "1a.A",
                "A.B.C.D.E",
                "AA.BB.CC.DD.EE",
                "a.B.c.d.e",
                "aa.bB.cc.dd.ee",
                "a@b",
                "a,b",
                "a_b",
                "a;b",
                "a:b",
                "a%b",
                "a?b",
                "a$b",
                &a254,
            ],
        );
        assert_eq!(is_dns1123_subdomain("Foo"), [SUBDOMAIN_MSG]);
        assert_eq!(
            is_dns1123_subdomain(&a254),
            ["must be no more than 253 characters"]
        );
    }

    #[test]
    fn dns1035_label() {
        let a63 = "a".repeat(63);
        let a64 = "a".repeat(64);
        good(
            is_dns1035_label,
            &["a", "ab", "abc", "a1", "a-1", "a--1--2--b", &a63],
        );
        bad(
            is_dns1035_label,
            &[
                "0",
                "01",
                "012",
                "1a",
                "1-a",
                "1--a--b--2",
                "",
                "A",
                "ABC",
                "aBc",
                "A1",
                "A-1",
                "1-A",
                "-",
                "a-",
                "-a",
                "1-",
                "-1",
                "_",
                "a_",
                "_a",
                "a_b",
                "1_",
                "_1",
                "1_2",
                ".",
                "a.",
                ".a",
                "a.b",
                "1.",
                ".1",
                "1.2",
                " ",
                "a ",
                " a",
                "a b",
                "1 ",
                " 1",
                "1 2",
                &a64,
            ],
        );
        assert_eq!(is_dns1035_label("1a"), [DNS1035_MSG]);
    }

    #[test]
    fn qualified_names() {
        let a63 = "a".repeat(63);
        let long_ok = format!("{}/{}", "a".repeat(253), "b".repeat(63));
        let a64 = "a".repeat(64);
        let long_prefix = format!("{}/abc", "a".repeat(254));
        good(
            is_qualified_name,
            &[
                "simple",
                "now-with-dashes",
                "1-starts-with-num",
                "1234",
                "simple/simple",
                "now-with-dashes/simple",
                "now-with-dashes/now-with-dashes",
                "now.with.dots/simple",
                "now-with.dashes-and.dots/simple",
                "1-num.2-num/3-num",
                "1234/5678",
                "1.2.3.4/5678",
                "Uppercase_Is_OK_123",
                "example.com/Uppercase_Is_OK_123",
                "requests.storage-foo",
                &a63,
                &long_ok,
            ],
        );
        bad(
            is_qualified_name,
            &[
                "nospecialchars%^=@",
                "cantendwithadash-",
                "-cantstartwithadash-",
                "only/one/slash",
                "Example.com/abc",
                "example_com/abc",
                "example.com/",
                "/simple",
                &a64,
                &long_prefix,
            ],
        );
        assert_eq!(is_qualified_name("bad key"), [NAME_PART_MSG]);
        assert_eq!(
            is_qualified_name("/simple"),
            ["prefix part must be non-empty"]
        );
        assert_eq!(
            is_qualified_name("example.com/"),
            [
                "name part must be non-empty".to_owned(),
                NAME_PART_MSG.to_owned()
            ]
        );
        assert_eq!(
            is_qualified_name(&a64),
            ["name part must be no more than 63 bytes"]
        );
        assert_eq!(
            is_qualified_name(&long_prefix),
            ["prefix part must be no more than 253 bytes"]
        );
        assert_eq!(
            is_qualified_name("Example.com/abc"),
            [format!("prefix part {SUBDOMAIN_MSG}")]
        );
        assert_eq!(
            is_qualified_name("only/one/slash"),
            ["a valid label key must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"]
        );
    }

    #[test]
    fn label_values() {
        let a63 = "a".repeat(63);
        let a64 = "a".repeat(64);
        good(
            is_valid_label_value,
            &[
                "simple",
                "now-with-dashes",
                "1-starts-with-num",
                "end-with-num-1",
                "1234",
                &a63,
                "",
            ],
        );
        bad(
            is_valid_label_value,
            &[
                "nospecialchars%^=@",
                "Tama-nui-te-rā.is.Māori.sun",
                "\\backslashes\\are\\bad",
                "-starts-with-dash",
                "ends-with-dash-",
                ".starts.with.dot",
                "ends.with.dot.",
                &a64,
            ],
        );
        assert_eq!(
            is_valid_label_value(&a64),
            ["must be no more than 63 bytes"]
        );
        assert_eq!(is_valid_label_value("-x"), [LABEL_VALUE_MSG]);
    }

    #[test]
    fn other_validators() {
        good(
            is_valid_port_name,
            &[
                "telnet",
                "re-mail-ck",
                "pop3",
                "a",
                "a-1",
                "1-a",
                "a-1-b-2-c",
                "1-a-2-b-3",
            ],
        );
        let a16 = "a".repeat(16);
        bad(
            is_valid_port_name,
            &[
                "longerthan15characters",
                "",
                &a16,
                "12345",
                "1-2-3-4",
                "-begin",
                "end-",
                "two--hyphens",
                "whois++",
            ],
        );
        assert_eq!(
            is_valid_port_name("-"),
            [
                "must contain at least one letter (a-z)",
                "must not begin or end with a hyphen"
            ]
        );
        assert_eq!(
            is_valid_port_name("two--hyphens"),
            ["must not contain consecutive hyphens"]
        );
        for p in [1, 2, 1000, 16384, 32768, 65535] {
            assert!(is_valid_port_num(p).is_empty());
        }
        for p in [0, -1, 65536, 100000] {
            assert_eq!(
                is_valid_port_num(p),
                ["must be between 1 and 65535, inclusive"]
            );
        }
        good(
            is_valid_percent,
            &["0%", "00000%", "1%", "99%", "100%", "101%"],
        );
        bad(
            is_valid_percent,
            &["0", "", "%", "a%", "1.5%", " 1%", "1 %"],
        );
        good(
            is_http_header_name,
            &[
                "Accept-Encoding",
                "Host",
                "If-Modified-Since",
                "X-Forwarded-For",
                "a",
                "-a",
                "a-",
                "--abc-123",
                "A--1--2--B",
            ],
        );
        bad(
            is_http_header_name,
            &[
                "Host:",
                "X-Forwarded-For:",
                "X-@Home",
                "",
                "_",
                "a_",
                ".",
                "a.b",
                " ",
                "a b",
                "#a#",
                "^",
                ",",
                ";",
                "=",
                "<",
                "?",
                "@",
                "{",
            ],
        );
        good(
            is_c_identifier,
            &[
                "a",
                "ab",
                "abc",
                "a1",
                "_a",
                "a_",
                "a_b",
                "a_1",
                "a__1__2__b",
                "__abc_123",
                "A",
                "AB",
                "AbC",
                "A1",
                "_A",
                "A_",
                "A_B",
                "A_1",
                "A__1__2__B",
                "__123_ABC",
            ],
        );
        bad(
            is_c_identifier,
            &[
                "", "1", "123", "1a", "-", "a-", "-a", "a-b", "a b", "1-", "1_", "1_2", ".", "a.",
                ".a", "a.b", "1.", ".1", "1.2", "#a#", "^", ",", ";",
            ],
        );
        good(
            is_env_var_name,
            &[
                "A",
                "ABC",
                "AbC123",
                "_123",
                "A1_2_3",
                "a",
                "my.env-name",
                "MY_ENV.NAME",
                "MyEnvName1",
                "-a",
                ".a",
            ],
        );
        bad(
            is_env_var_name,
            &["", "1", "123", "1a", "A b", "A!", ".", "..", "..a"],
        );
        assert_eq!(is_env_var_name("..a"), ["must not start with '..'"]);
        good(
            is_config_map_key,
            &[
                "a",
                "ab",
                "abc",
                "a1",
                "a-1",
                "a--1--2--b",
                "0",
                "01",
                "012",
                "1a",
                "1-a",
                "1--a--b--2",
                "a.a",
                "ab.a",
                "abc.a",
                "a1.a",
                "a-1.a",
                "a--1--2--b.a",
                "a.1",
                "a.b.c.d.e",
                "_a",
                "a_",
                "a_b",
                "A",
                "AB",
                "AbC",
                ".a",
            ],
        );
        bad(
            is_config_map_key,
            &["", "a b", "a@b", "a,b", "a;b", ".", "..", "..a"],
        );
        assert_eq!(is_config_map_key("."), ["must not be '.'"]);
        assert_eq!(is_config_map_key(".."), ["must not be '..'"]);
        good(
            is_wildcard_dns1123_subdomain,
            &["*.example.com", "*.bar.com", "*.foo.bar.com"],
        );
        bad(
            is_wildcard_dns1123_subdomain,
            &[
                "*.*.bar.com",
                "*.foo.*.com",
                "*bar.com",
                "f*.bar.com",
                "*",
                "*.",
                "*.A",
            ],
        );
    }

    #[test]
    fn generate_name_prefixes() {
        // A trailing dash is allowed in a prefix: its last two bytes are masked as "a".
        assert!(name_is_dns_subdomain("foo-", true).is_empty());
        assert!(name_is_dns_label("a-", true).is_empty());
        assert!(name_is_dns1035_label("foo-", true).is_empty());
        assert_eq!(name_is_dns_subdomain("foo-", false), [SUBDOMAIN_MSG]);
        assert_eq!(name_is_dns_subdomain("-", true), [SUBDOMAIN_MSG]);
        assert_eq!(name_is_dns_subdomain("Foo-", true), [SUBDOMAIN_MSG]);
        // 255 bytes mask to 254; 65 to 64
        assert_eq!(
            name_is_dns_subdomain(&format!("{}-", "a".repeat(254)), true),
            ["must be no more than 253 characters"]
        );
        assert!(name_is_dns_subdomain(&format!("{}-", "a".repeat(64)), true).is_empty());
        assert_eq!(
            name_is_dns_label(&format!("{}-", "a".repeat(64)), true),
            ["must be no more than 63 characters"]
        );
        // the cut may fall inside a multi-byte character
        assert_eq!(name_is_dns_label("é-", true), [LABEL_MSG]);
        assert_eq!(
            validate_namespace_name("a.b", false),
            ["must not contain dots"]
        );
    }

    #[test]
    fn object_meta_names() {
        let meta = Path::new("metadata");
        let errs = validate_object_meta_name("", "", name_is_dns_subdomain, &meta);
        assert_eq!(
            rendered(&errs),
            ["metadata.name: Required value: name or generateName is required"]
        );
        assert_eq!(errs[0].cause_type(), "FieldValueRequired");
        let errs = validate_object_meta_name("Foo", "Bar-", name_is_dns_subdomain, &meta);
        assert_eq!(
            rendered(&errs),
            [
                format!("metadata.generateName: Invalid value: \"Bar-\": {SUBDOMAIN_MSG}"),
                format!("metadata.name: Invalid value: \"Foo\": {SUBDOMAIN_MSG}"),
            ]
        );
        assert!(
            validate_object_meta_name("foo-abcde", "foo-", name_is_dns_subdomain, &meta).is_empty()
        );
        assert_eq!(
            rendered(&validate_object_meta_namespace("", true, &meta)),
            ["metadata.namespace: Required value"]
        );
        assert_eq!(
            rendered(&validate_object_meta_namespace("default", false, &meta)),
            ["metadata.namespace: Forbidden: not allowed on this type"]
        );
        assert_eq!(
            rendered(&validate_object_meta_namespace("a.b", true, &meta)),
            ["metadata.namespace: Invalid value: \"a.b\": must not contain dots"]
        );
    }

    fn rendered(errs: &[FieldError]) -> Vec<String> {
        errs.iter().map(ToString::to_string).collect()
    }

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn labels_and_annotations() {
        let path = Path::new("metadata").child("labels");
        assert!(
            validate_labels(&map(&[("app", "web"), ("example.com/tier", "")]), &path).is_empty()
        );
        let errs = validate_labels(&map(&[("bad key", "-v")]), &path);
        assert_eq!(
            rendered(&errs),
            [
                format!("metadata.labels: Invalid value: \"bad key\": {NAME_PART_MSG}"),
                format!("metadata.labels: Invalid value: \"-v\": {LABEL_VALUE_MSG}"),
            ]
        );
        assert!(errs.iter().all(|e| e.cause_type() == "FieldValueInvalid"));

        let path = Path::new("metadata").child("annotations");
        // keys are checked lowercased: a capital prefix is fine, and so are U+0130 and the
        // Kelvin sign, which Go lowercases to ASCII
        assert!(validate_annotations(
            &map(&[("Example.COM/Key", "x"), ("İ", ""), ("\u{212a}", "")]),
            &path
        )
        .is_empty());
        assert_eq!(
            rendered(&validate_annotations(&map(&[("a/b/c", "x")]), &path))[0],
            "metadata.annotations: Invalid value: \"a/b/c\": a valid label key must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        );
        // 256 KiB of keys and values together is the limit
        let at_limit = map(&[("k", &"v".repeat(TOTAL_ANNOTATION_SIZE_LIMIT_B - 1))]);
        assert!(validate_annotations(&at_limit, &path).is_empty());
        let over = map(&[("k", &"v".repeat(TOTAL_ANNOTATION_SIZE_LIMIT_B))]);
        let errs = validate_annotations(&over, &path);
        assert_eq!(
            rendered(&errs),
            ["metadata.annotations: Too long: may not be more than 262144 bytes"]
        );
        assert_eq!(errs[0].cause_type(), "FieldValueTooLong");
    }

    #[test]
    fn finalizers_and_counts() {
        let path = Path::new("metadata").child("finalizers");
        assert!(
            validate_finalizers(&["kubernetes".into(), "example.com/x".into()], &path).is_empty()
        );
        assert_eq!(
            rendered(&validate_finalizers(
                &["orphan".into(), "foregroundDeletion".into()],
                &path
            )),
            ["metadata.finalizers: Invalid value: [\"orphan\",\"foregroundDeletion\"]: finalizer orphan and foregroundDeletion cannot be both set"]
        );
        assert_eq!(
            rendered(&validate_nonnegative_field(
                -1,
                &Path::new("metadata").child("generation")
            )),
            ["metadata.generation: Invalid value: -1: must be greater than or equal to 0"]
        );
    }

    #[test]
    fn label_selector_validation() {
        let sel: ApiLabelSelector = serde_json::from_value(json!({
            "matchLabels": {"app": "-x"},
            "matchExpressions": [
                {"key": "a", "operator": "In"},
                {"key": "b", "operator": "Exists", "values": ["v"]},
                {"key": "-c", "operator": "Foo<", "values": ["ok", "-bad"]},
            ]
        }))
        .unwrap_or_default();
        let errs = validate_label_selector(
            &sel,
            LabelSelectorValidationOptions::default(),
            &Path::new("spec").child("selector"),
        );
        assert_eq!(
            rendered(&errs),
            [
                format!("spec.selector.matchLabels: Invalid value: \"-x\": {LABEL_VALUE_MSG}"),
                "spec.selector.matchExpressions[0].values: Required value: must be specified when `operator` is 'In' or 'NotIn'".to_owned(),
                "spec.selector.matchExpressions[1].values: Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'".to_owned(),
                // the operator is shown JSON-encoded (Go's encoding escapes '<')
                "spec.selector.matchExpressions[2].operator: Invalid value: \"Foo\\u003c\": not a valid selector operator".to_owned(),
                format!("spec.selector.matchExpressions[2].key: Invalid value: \"-c\": {NAME_PART_MSG}"),
                format!("spec.selector.matchExpressions[2].values[1]: Invalid value: \"-bad\": {LABEL_VALUE_MSG}"),
            ]
        );
        let lenient = LabelSelectorValidationOptions {
            allow_invalid_label_value_in_selector: true,
            allow_unknown_operator_in_requirement: true,
        };
        assert_eq!(
            validate_label_selector(&sel, lenient, &Path::new("s")).len(),
            4,
            "only matchLabels, the two value-count errors and the key remain"
        );
    }

    #[test]
    fn field_error_rendering() {
        let p = |s: &str| {
            s.split('.').skip(1).fold(
                Path::new(s.split('.').next().unwrap_or_default()),
                |p, c| p.child(c),
            )
        };
        let image = Path::new("spec")
            .child("containers")
            .index(0)
            .child("image");
        assert_eq!(image.as_str(), "spec.containers[0].image");
        assert_eq!(
            FieldError::required(&image, "").to_string(),
            "spec.containers[0].image: Required value"
        );
        assert_eq!(
            FieldError::invalid(&p("metadata.name"), "Foo", SUBDOMAIN_MSG).to_string(),
            format!("metadata.name: Invalid value: \"Foo\": {SUBDOMAIN_MSG}")
        );
        assert_eq!(
            FieldError::duplicate(&p("spec.ports").index(1).child("name"), "http").to_string(),
            "spec.ports[1].name: Duplicate value: \"http\""
        );
        let e = FieldError::not_supported(
            &p("spec.restartPolicy"),
            "Sometimes",
            &["Always", "OnFailure", "Never"],
        );
        assert_eq!(
            e.to_string(),
            "spec.restartPolicy: Unsupported value: \"Sometimes\": supported values: \"Always\", \"OnFailure\", \"Never\""
        );
        assert_eq!(e.cause_type(), "FieldValueNotSupported");
        assert_eq!(
            FieldError::forbidden(&p("spec"), "pod updates may not change fields").to_string(),
            "spec: Forbidden: pod updates may not change fields"
        );
        assert_eq!(
            FieldError::too_long(&p("metadata.annotations"), 262144).to_string(),
            "metadata.annotations: Too long: may not be more than 262144 bytes"
        );
        assert_eq!(
            FieldError::too_long(&p("x"), 1).error_body(),
            "Too long: may not be more than 1 byte"
        );
        assert_eq!(
            FieldError::too_many(&p("spec.items"), 5, 3).to_string(),
            "spec.items: Too many: 5: must have at most 3 items"
        );
        assert_eq!(
            FieldError::too_many(&p("spec.items"), -1, 1).to_string(),
            "spec.items: Too many: must have at most 1 item"
        );
        assert_eq!(
            FieldError::invalid(&p("spec.replicas"), -1, IS_NEGATIVE_ERROR_MSG).to_string(),
            "spec.replicas: Invalid value: -1: must be greater than or equal to 0"
        );
        assert_eq!(
            FieldError::invalid(&p("spec.x"), BadValue::Json(json!({"b": 1, "a": "<"})), "")
                .to_string(),
            "spec.x: Invalid value: {\"a\":\"\\u003c\",\"b\":1}"
        );
        assert_eq!(
            FieldError::internal(&p("metadata.name"), "boom").to_string(),
            "metadata.name: Internal error: boom"
        );
        assert_eq!(
            p("metadata.labels").key("app").to_string(),
            "metadata.labels[app]"
        );
        let cause = FieldError::required(&image, "").to_cause();
        assert_eq!(
            (
                cause.reason.as_str(),
                cause.message.as_str(),
                cause.field.as_str()
            ),
            (
                "FieldValueRequired",
                "Required value",
                "spec.containers[0].image"
            )
        );
        for (kind, cause) in [
            (FieldErrorKind::Required, "FieldValueRequired"),
            (FieldErrorKind::Invalid, "FieldValueInvalid"),
            (FieldErrorKind::Duplicate, "FieldValueDuplicate"),
            (FieldErrorKind::Forbidden, "FieldValueForbidden"),
            (FieldErrorKind::TooLong, "FieldValueTooLong"),
            (FieldErrorKind::NotSupported, "FieldValueNotSupported"),
            (FieldErrorKind::TooMany, "FieldValueTooMany"),
        ] {
            assert_eq!(kind.cause_type(), cause);
        }
    }

    #[test]
    fn invalid_messages() {
        let name = Path::new("metadata").child("name");
        let image = Path::new("spec")
            .child("containers")
            .index(0)
            .child("image");
        let a = FieldError::invalid(&name, "Foo", SUBDOMAIN_MSG);
        let b = FieldError::required(&image, "");
        assert_eq!(
            invalid_message("Pod", "Foo", std::slice::from_ref(&a)),
            format!(
                "Pod \"Foo\" is invalid: metadata.name: Invalid value: \"Foo\": {SUBDOMAIN_MSG}"
            )
        );
        assert_eq!(
            invalid_message("Deployment.apps", "web", &[b.clone(), a.clone(), b.clone()]),
            format!("Deployment.apps \"web\" is invalid: [spec.containers[0].image: Required value, metadata.name: Invalid value: \"Foo\": {SUBDOMAIN_MSG}]")
        );
        assert_eq!(invalid_message("Pod", "x", &[]), "Pod \"x\" is invalid");
        // a repeated error counts once, so no brackets
        assert_eq!(
            invalid_message("Pod", "x", &[b.clone(), b]),
            "Pod \"x\" is invalid: spec.containers[0].image: Required value"
        );
    }

    #[test]
    fn go_quoting() {
        for (s, want) in [
            ("Foo", "\"Foo\""),
            ("a\"b\\c", "\"a\\\"b\\\\c\""),
            ("\n\t\r\u{7}\u{8}\u{c}\u{b}", "\"\\n\\t\\r\\a\\b\\f\\v\""),
            ("\0\u{1b}\u{7f}", "\"\\x00\\x1b\\x7f\""),
            (
                "\u{a0}\u{ad}\u{200b}\u{378}\u{feff}",
                "\"\\u00a0\\u00ad\\u200b\\u0378\\ufeff\"",
            ),
            ("\u{e0001}", "\"\\U000e0001\""),
            ("é😀İ<&>", "\"é😀İ<&>\""),
        ] {
            assert_eq!(go_quote(s), want, "{s:?}");
        }
        assert_eq!(
            go_json(&json!(["<&>", "\u{2028}", "\u{1}\n", "é"])),
            "[\"\\u003c\\u0026\\u003e\",\"\\u2028\",\"\\u0001\\n\",\"é\"]"
        );
        assert_eq!(go_json(&json!(null)), "null");
    }
}
