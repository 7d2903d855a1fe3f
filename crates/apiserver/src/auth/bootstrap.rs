//! Bootstrap tokens (`<id>.<secret>`), as upstream's bootstrap token authenticator reads
//! them: the Secret `kube-system/bootstrap-token-<id>` of type
//! `bootstrap.kubernetes.io/token`, whose `token-secret` matches (compared in constant
//! time), not expired, marked `usage-bootstrap-authentication: "true"`. The user is
//! `system:bootstrap:<id>` in `system:bootstrappers` and the secret's `auth-extra-groups`.
//!
//! As upstream, a token that does not match its secret is simply not authenticated (no
//! error): the reason is only logged.

use std::sync::Arc;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use kumo_storage::Store;
use serde_json::Value;

use super::serviceaccount::read_object;
use super::{names, TokenAuthenticator, TokenResult, UserInfo};

/// The Secret type of bootstrap tokens.
pub const SECRET_TYPE: &str = "bootstrap.kubernetes.io/token";
/// The prefix of a bootstrap token's Secret name.
pub const SECRET_PREFIX: &str = "bootstrap-token-";
/// The prefix of a bootstrap token's user name.
pub const USER_PREFIX: &str = "system:bootstrap:";

/// `(id, secret)` of a well-formed token: `[a-z0-9]{6}.[a-z0-9]{16}`.
pub fn parse_token(token: &str) -> Option<(&str, &str)> {
    let (id, secret) = token.split_once('.')?;
    let ok = |s: &str, len: usize| {
        s.len() == len
            && s.bytes()
                .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase())
    };
    (ok(id, 6) && ok(secret, 16)).then_some((id, secret))
}

/// Whether `group` may be an extra group of a bootstrap token:
/// `system:bootstrappers:[a-z0-9:-]{0,255}[a-z0-9]` (upstream's BootstrapGroupPattern).
pub fn valid_group(group: &str) -> bool {
    let Some(rest) = group.strip_prefix("system:bootstrappers:") else {
        return false;
    };
    let b = rest.as_bytes();
    let Some((last, init)) = b.split_last() else {
        return false;
    };
    init.len() <= 255
        && (last.is_ascii_lowercase() || last.is_ascii_digit())
        && init
            .iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b':' || *c == b'-')
}

/// Constant-time equality of two byte strings (the length is not secret).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A value of the Secret's `data` (base64 in the stored object), "" when absent or not
/// decodable.
fn data(secret: &Value, key: &str) -> String {
    secret
        .get("data")
        .and_then(|d| d.get(key))
        .and_then(Value::as_str)
        .and_then(|v| STANDARD.decode(v).ok())
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

/// Why a token's Secret does not authenticate it, `None` when it does; `now` in unix
/// seconds.
fn refuse(secret: &Value, id: &str, token_secret: &str, now: i64) -> Option<String> {
    if secret.pointer("/metadata/deletionTimestamp").is_some() {
        return Some("is deleted and awaiting removal".into());
    }
    if secret.get("type").and_then(Value::as_str) != Some(SECRET_TYPE)
        || !secret.get("data").is_some_and(Value::is_object)
    {
        return Some(format!("has invalid type, expected {SECRET_TYPE}."));
    }
    if !constant_time_eq(
        data(secret, "token-secret").as_bytes(),
        token_secret.as_bytes(),
    ) {
        return Some("has invalid value for key token-secret.".into());
    }
    if data(secret, "token-id") != id {
        return Some("has invalid value for key token-id.".into());
    }
    let expiration = data(secret, "expiration");
    if !expiration.is_empty() {
        // An unparseable expiration counts as expired, as upstream.
        match crate::time::parse_rfc3339(&expiration) {
            Some(t) if t > now => {}
            _ => return Some(format!("has expired ({expiration}).")),
        }
    }
    if data(secret, "usage-bootstrap-authentication") != "true" {
        return Some("not marked usage-bootstrap-authentication=true.".into());
    }
    None
}

/// The groups of a token's user: `system:bootstrappers` and the valid
/// `auth-extra-groups`, sorted and without duplicates; an invalid extra group refuses the
/// token.
fn groups(secret: &Value) -> Result<Vec<String>, String> {
    let mut groups = std::collections::BTreeSet::new();
    groups.insert(names::BOOTSTRAPPERS.to_owned());
    let extra = data(secret, "auth-extra-groups");
    if !extra.is_empty() {
        for g in extra.split(',') {
            if !valid_group(g) {
                return Err(format!(
                    "has invalid value for key auth-extra-groups: bootstrap group {} is invalid (must match \\Asystem:bootstrappers:[a-z0-9:-]{{0,255}}[a-z0-9]\\z).",
                    kumo_apimachinery::validation::go_quote(g)
                ));
            }
            groups.insert(g.to_owned());
        }
    }
    Ok(groups.into_iter().collect())
}

/// The bootstrap token authenticator.
pub struct Authenticator {
    store: Arc<dyn Store>,
}

impl Authenticator {
    pub fn new(store: Arc<dyn Store>) -> Authenticator {
        Authenticator { store }
    }

    /// Checks a token for `audiences` (the API server's when empty) at `now` (unix
    /// seconds). Bootstrap tokens know no audiences: as upstream wraps such
    /// authenticators, they serve the API server's audiences only.
    pub async fn authenticate_at(
        &self,
        token: &str,
        audiences: &[String],
        now: i64,
    ) -> TokenResult {
        let Some((id, token_secret)) = parse_token(token) else {
            return TokenResult::NotMine;
        };
        let implicit = super::serviceaccount::api_audiences();
        let auds: Vec<String> = if audiences.is_empty() {
            implicit
        } else {
            implicit
                .into_iter()
                .filter(|a| audiences.contains(a))
                .collect()
        };
        if auds.is_empty() {
            return TokenResult::NotMine;
        }
        let name = format!("{SECRET_PREFIX}{id}");
        let secret = match read_object(
            &*self.store,
            &format!("/registry/secrets/kube-system/{name}"),
        )
        .await
        {
            Ok(Some(s)) => s,
            Ok(None) => {
                tracing::debug!(secret = %name, "no secret to match a bootstrap bearer token");
                return TokenResult::NotMine;
            }
            Err(e) => return TokenResult::Invalid(e),
        };
        let log = |why: &str| {
            tracing::debug!("Bootstrap secret kube-system/{name} matching bearer token {why}");
        };
        if let Some(why) = refuse(&secret, id, token_secret, now) {
            log(&why);
            return TokenResult::NotMine;
        }
        match groups(&secret) {
            Ok(groups) => {
                let user = UserInfo::authenticated(format!("{USER_PREFIX}{id}"), groups);
                TokenResult::User(user, auds)
            }
            Err(why) => {
                log(&why);
                TokenResult::NotMine
            }
        }
    }
}

#[async_trait::async_trait]
impl TokenAuthenticator for Authenticator {
    async fn authenticate(&self, token: &str, audiences: &[String]) -> TokenResult {
        self.authenticate_at(token, audiences, crate::time::now_secs())
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn b64(s: &str) -> String {
        STANDARD.encode(s)
    }

    fn secret(extra: &[(&str, &str)]) -> Value {
        let mut data = serde_json::Map::new();
        data.insert("token-id".into(), json!(b64("abcdef")));
        data.insert("token-secret".into(), json!(b64("0123456789abcdef")));
        data.insert("usage-bootstrap-authentication".into(), json!(b64("true")));
        for (k, v) in extra {
            data.insert((*k).into(), json!(b64(v)));
        }
        json!({"type": SECRET_TYPE, "metadata": {"name": "bootstrap-token-abcdef"}, "data": data})
    }

    #[test]
    fn token_shape() {
        assert_eq!(
            parse_token("abcdef.0123456789abcdef"),
            Some(("abcdef", "0123456789abcdef"))
        );
        for bad in [
            "abcdef",
            "ABCDEF.0123456789abcdef",
            "abcde.0123456789abcdef",
            "abcdef.0123456789abcde",
            "abcdef.0123456789abcdef.x",
            "abcdef.0123456789abcdeF",
            "",
        ] {
            assert_eq!(parse_token(bad), None, "{bad}");
        }
    }

    #[test]
    fn secret_checks() {
        let now = crate::time::parse_rfc3339("2030-01-01T00:00:00Z").expect("time");
        let s = secret(&[]);
        assert_eq!(refuse(&s, "abcdef", "0123456789abcdef", now), None);
        assert!(refuse(&s, "abcdef", "0123456789abcdee", now).is_some());
        assert!(refuse(&s, "zzzzzz", "0123456789abcdef", now).is_some());
        let expired = secret(&[("expiration", "2029-12-31T23:59:59Z")]);
        assert!(refuse(&expired, "abcdef", "0123456789abcdef", now).is_some());
        let later = secret(&[("expiration", "2030-01-01T00:00:01Z")]);
        assert_eq!(refuse(&later, "abcdef", "0123456789abcdef", now), None);
        let garbled = secret(&[("expiration", "soon")]);
        assert!(refuse(&garbled, "abcdef", "0123456789abcdef", now).is_some());
        let unmarked = secret(&[("usage-bootstrap-authentication", "false")]);
        assert!(refuse(&unmarked, "abcdef", "0123456789abcdef", now).is_some());
        let mut wrong_type = secret(&[]);
        wrong_type["type"] = json!("Opaque");
        assert!(refuse(&wrong_type, "abcdef", "0123456789abcdef", now).is_some());
    }

    #[test]
    fn extra_groups() {
        let s = secret(&[(
            "auth-extra-groups",
            "system:bootstrappers:kubeadm:default-node-token,system:bootstrappers:a",
        )]);
        assert_eq!(
            groups(&s).expect("valid"),
            vec![
                "system:bootstrappers",
                "system:bootstrappers:a",
                "system:bootstrappers:kubeadm:default-node-token"
            ]
        );
        for bad in [
            "system:masters",
            "system:bootstrappers:",
            "system:bootstrappers:a-",
            "system:bootstrappers:A",
        ] {
            let s = secret(&[("auth-extra-groups", bad)]);
            assert!(groups(&s).is_err(), "{bad}");
        }
    }

    #[test]
    fn constant_time_compare() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }
}
