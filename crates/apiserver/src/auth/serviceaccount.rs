//! Service-account tokens: the signing key (`pki/sa.key`, `pki/sa.pub` as kubeadm lays
//! them out), the JWTs TokenRequest issues (ES256, upstream's claims), and the
//! authenticator that accepts them, as kube-apiserver's service-account token
//! authenticator checks them: signature, issuer, audiences, time (with go-jose's one-minute
//! leeway), then that the service account and the object the token is bound to still
//! exist with the same uid.
//!
//! The JWS is written by hand (three base64url parts, ring's ECDSA P-256): it is small,
//! and a JWT library would bring a dependency for what upstream itself keeps in a few
//! functions.

use std::path::Path;
use std::sync::Arc;

use base64::engine::general_purpose::{
    GeneralPurpose, GeneralPurposeConfig, STANDARD, URL_SAFE_NO_PAD,
};
use base64::engine::DecodePaddingMode;
use base64::Engine;

/// Decodes JWS parts as Go's base64.RawURLEncoding does (go-jose): unpadded, and
/// non-zero trailing bits in the last character are ignored, not an error.
const JWS_DECODE: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::URL_SAFE,
    GeneralPurposeConfig::new()
        .with_encode_padding(false)
        .with_decode_allow_trailing_bits(true)
        .with_decode_padding_mode(DecodePaddingMode::RequireNone),
);
use kumo_storage::Store;
use ring::rand::SystemRandom;
use ring::signature::{
    EcdsaKeyPair, KeyPair, UnparsedPublicKey, ECDSA_P256_SHA256_FIXED,
    ECDSA_P256_SHA256_FIXED_SIGNING,
};
use serde_json::{json, Map, Value};

use super::{names, TokenAuthenticator, TokenResult, UserInfo};

/// The issuer of the tokens (kubeadm's default `--service-account-issuer`).
pub const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

/// How far exp, nbf and iat may be off (go-jose's DefaultLeeway).
pub const LEEWAY_SECS: i64 = 60;

/// The expiration of the tokens the ServiceAccount admission plugin projects into pods,
/// which upstream extends to a year while warning after it (WarnOnlyBoundTokenExpirationSeconds).
pub const WARN_ONLY_EXPIRATION_SECS: i64 = 60 * 60 + 7;

/// The extended expiration of those tokens (ExpirationExtensionSeconds).
pub const EXTENDED_EXPIRATION_SECS: i64 = 24 * 365 * 60 * 60;

/// Keys of a user's `extra` (k8s.io/apiserver/pkg/authentication/serviceaccount).
pub mod extra {
    pub const CREDENTIAL_ID: &str = "authentication.kubernetes.io/credential-id";
    pub const POD_NAME: &str = "authentication.kubernetes.io/pod-name";
    pub const POD_UID: &str = "authentication.kubernetes.io/pod-uid";
    pub const NODE_NAME: &str = "authentication.kubernetes.io/node-name";
    pub const NODE_UID: &str = "authentication.kubernetes.io/node-uid";
}

/// The API server's audiences (`--api-audiences`, which default to the issuer).
pub fn api_audiences() -> Vec<String> {
    vec![ISSUER.to_owned()]
}

/// The DER prefix of a P-256 SubjectPublicKeyInfo, before the 65-byte uncompressed point.
const P256_SPKI_PREFIX: [u8; 26] = [
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a,
    0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];

/// Why the signing key could not be loaded or made.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
}

/// The service-account signing key: an ECDSA P-256 key pair.
pub struct SigningKey {
    pair: EcdsaKeyPair,
    /// The key ID tokens carry: base64url(SHA-256(PKIX DER of the public key)), as upstream.
    kid: String,
    rng: SystemRandom,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey")
            .field("kid", &self.kid)
            .finish()
    }
}

fn pem(label: &str, der: &[u8]) -> String {
    let b64 = STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(chunk));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

impl SigningKey {
    /// Loads `<pki_dir>/sa.key` (PKCS#8 PEM), or makes a new key and writes `sa.key`
    /// (0600) and `sa.pub` (0644) when there is none. `sa.pub` is rewritten when missing.
    pub fn load_or_create(pki_dir: &Path) -> Result<Arc<SigningKey>, KeyError> {
        let key_path = pki_dir.join("sa.key");
        let pub_path = pki_dir.join("sa.pub");
        let io = |p: &Path| {
            let path = p.display().to_string();
            move |source| KeyError::Io { path, source }
        };
        let key = if key_path.exists() {
            let text = std::fs::read(&key_path).map_err(io(&key_path))?;
            let der = match rustls_pemfile::private_key(&mut text.as_slice()) {
                Ok(Some(rustls::pki_types::PrivateKeyDer::Pkcs8(k))) => {
                    k.secret_pkcs8_der().to_vec()
                }
                Ok(_) => {
                    return Err(KeyError::Invalid(format!(
                        "{}: not a PKCS#8 private key",
                        key_path.display()
                    )))
                }
                Err(e) => return Err(KeyError::Invalid(format!("{}: {e}", key_path.display()))),
            };
            SigningKey::from_pkcs8(&der)?
        } else {
            std::fs::create_dir_all(pki_dir).map_err(io(pki_dir))?;
            let rng = SystemRandom::new();
            let doc = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
                .map_err(|_| KeyError::Invalid("generating the service-account key".into()))?;
            crate::pki::write_file(
                &key_path,
                pem("PRIVATE KEY", doc.as_ref()).as_bytes(),
                0o600,
            )
            .map_err(|e| KeyError::Invalid(e.to_string()))?;
            SigningKey::from_pkcs8(doc.as_ref())?
        };
        if !pub_path.exists() {
            crate::pki::write_file(
                &pub_path,
                pem("PUBLIC KEY", &key.public_key_der()).as_bytes(),
                0o644,
            )
            .map_err(|e| KeyError::Invalid(e.to_string()))?;
        }
        Ok(Arc::new(key))
    }

    /// A key from its PKCS#8 DER (an ECDSA P-256 key).
    pub fn from_pkcs8(der: &[u8]) -> Result<SigningKey, KeyError> {
        let rng = SystemRandom::new();
        let pair =
            EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, der, &rng).map_err(|e| {
                KeyError::Invalid(format!(
                    "the service-account key is not an ECDSA P-256 key: {e}"
                ))
            })?;
        let mut key = SigningKey {
            pair,
            kid: String::new(),
            rng,
        };
        let digest = ring::digest::digest(&ring::digest::SHA256, &key.public_key_der());
        key.kid = URL_SAFE_NO_PAD.encode(digest.as_ref());
        Ok(key)
    }

    /// The public key as a PKIX SubjectPublicKeyInfo (DER).
    pub fn public_key_der(&self) -> Vec<u8> {
        let mut der = P256_SPKI_PREFIX.to_vec();
        der.extend_from_slice(self.pair.public_key().as_ref());
        der
    }

    /// The public key as a JSON Web Key, as `/openid/v1/jwks` lists it.
    pub fn jwk(&self) -> Value {
        let point = self.pair.public_key().as_ref();
        // An uncompressed P-256 point: 0x04, then X and Y (32 bytes each).
        let (x, y) = point
            .get(1..)
            .unwrap_or_default()
            .split_at(point.len().saturating_sub(1) / 2);
        serde_json::json!({
            "use": "sig", "kty": "EC", "kid": self.kid, "crv": "P-256", "alg": "ES256",
            "x": URL_SAFE_NO_PAD.encode(x), "y": URL_SAFE_NO_PAD.encode(y),
        })
    }

    /// The key ID (`kid`) of the tokens this key signs.
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// A compact JWS of `claims` (ES256, with this key's `kid`).
    pub fn sign(&self, claims: &Value) -> Result<String, KeyError> {
        let header = json!({"alg": "ES256", "kid": self.kid});
        let signing_input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let sig = self
            .pair
            .sign(&self.rng, signing_input.as_bytes())
            .map_err(|_| KeyError::Invalid("signing the token".into()))?;
        Ok(format!(
            "{signing_input}.{}",
            URL_SAFE_NO_PAD.encode(sig.as_ref())
        ))
    }

    /// Checks the signature of a compact JWS and returns its claims. `Err(None)` when the
    /// token is not a JWS at all (upstream's parse failure, which is not an error),
    /// `Err(Some(why))` when it is one this key did not sign.
    pub fn verify(&self, token: &str) -> Result<Value, Option<String>> {
        let mut parts = token.split('.');
        let (Some(h), Some(p), Some(s), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(None);
        };
        let header: Value = JWS_DECODE
            .decode(h)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or(None)?;
        let payload = JWS_DECODE.decode(p).map_err(|_| None)?;
        let sig = JWS_DECODE.decode(s).map_err(|_| None)?;
        if let Some(kid) = header.get("kid").and_then(Value::as_str) {
            if !kid.is_empty() && kid != self.kid {
                return Err(Some("invalid signature, no keys found".into()));
            }
        }
        let crypto = || Some("go-jose/go-jose: error in cryptographic primitive".to_owned());
        if header.get("alg").and_then(Value::as_str) != Some("ES256") {
            return Err(crypto());
        }
        let public = UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, self.pair.public_key());
        let signed = &token[..h.len() + 1 + p.len()];
        public
            .verify(signed.as_bytes(), &sig)
            .map_err(|_| crypto())?;
        serde_json::from_slice(&payload).map_err(|e| Some(format!("json: {e}")))
    }
}

/// The `iss` of a token without checking anything else (upstream's hasCorrectIssuer):
/// decides whether the token is a service-account token at all.
fn unverified_issuer(token: &str) -> Option<String> {
    if token.trim_start().starts_with('{') {
        return None;
    }
    let mut parts = token.split('.');
    let (Some(_), Some(p), Some(_), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    let payload = JWS_DECODE.decode(p).ok()?;
    let claims: Value = serde_json::from_slice(&payload).ok()?;
    claims.get("iss")?.as_str().map(str::to_owned)
}

/// A reference in the private claims: name and uid.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ObjectRef {
    pub name: String,
    pub uid: String,
}

impl ObjectRef {
    pub fn new(name: impl Into<String>, uid: impl Into<String>) -> ObjectRef {
        ObjectRef {
            name: name.into(),
            uid: uid.into(),
        }
    }

    fn to_json(&self) -> Value {
        let mut m = Map::new();
        if !self.name.is_empty() {
            m.insert("name".into(), json!(self.name));
        }
        if !self.uid.is_empty() {
            m.insert("uid".into(), json!(self.uid));
        }
        Value::Object(m)
    }

    fn from_json(v: Option<&Value>) -> Option<ObjectRef> {
        let v = v?.as_object()?;
        let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
        Some(ObjectRef {
            name: s("name"),
            uid: s("uid"),
        })
    }
}

/// What a token says, as upstream's public and private claims.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Claims {
    pub namespace: String,
    pub service_account: ObjectRef,
    pub pod: Option<ObjectRef>,
    pub secret: Option<ObjectRef>,
    pub node: Option<ObjectRef>,
    pub audiences: Vec<String>,
    /// Unix seconds.
    pub issued_at: i64,
    pub expires: i64,
    /// The `warnafter` of admission-projected tokens whose expiration was extended.
    pub warn_after: Option<i64>,
    pub jti: String,
}

impl Claims {
    /// The JWT payload: `aud`, `exp`, `iat`, `iss`, `jti`, `kubernetes.io`, `nbf`, `sub`
    /// (serde_json writes keys sorted, as Go's map encoding that go-jose uses).
    pub fn to_json(&self) -> Value {
        let mut k8s = Map::new();
        if !self.namespace.is_empty() {
            k8s.insert("namespace".into(), json!(self.namespace));
        }
        k8s.insert("serviceaccount".into(), self.service_account.to_json());
        if let Some(p) = &self.pod {
            k8s.insert("pod".into(), p.to_json());
        }
        if let Some(s) = &self.secret {
            k8s.insert("secret".into(), s.to_json());
        }
        if let Some(n) = &self.node {
            k8s.insert("node".into(), n.to_json());
        }
        if let Some(w) = self.warn_after {
            k8s.insert("warnafter".into(), json!(w));
        }
        let mut c = json!({
            "aud": self.audiences,
            "exp": self.expires,
            "iat": self.issued_at,
            "iss": ISSUER,
            "kubernetes.io": k8s,
            "nbf": self.issued_at,
            "sub": format!(
                "{}{}:{}",
                names::SERVICE_ACCOUNT_PREFIX,
                self.namespace,
                self.service_account.name
            ),
        });
        if !self.jti.is_empty() {
            c["jti"] = json!(self.jti);
        }
        c
    }
}

/// A NumericDate claim (a JSON number of seconds, possibly fractional), if present.
fn numeric_date(claims: &Value, key: &str) -> Result<Option<i64>, String> {
    match claims.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_i64()
            .or_else(|| n.as_f64().map(|f| f as i64))
            .map(Some)
            .ok_or_else(|| format!("json: cannot unmarshal {n} into NumericDate")),
        Some(other) => Err(format!(
            "json: cannot unmarshal {other} into Go struct field Claims.{key} of type jwt.NumericDate"
        )),
    }
}

/// The audiences of a token: a string or an array of strings.
fn audiences_of(claims: &Value) -> Result<Vec<String>, String> {
    match claims.get("aud") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                "square/go-jose/jwt: expected string or array value to unmarshal to Audience"
                    .to_owned()
            }),
        Some(_) => Err(
            "square/go-jose/jwt: expected string or array value to unmarshal to Audience".into(),
        ),
    }
}

/// Go's `%q` of a list of strings: `["a" "b"]`.
fn go_quote_list(l: &[String]) -> String {
    let items: Vec<String> = l
        .iter()
        .map(|s| kumo_apimachinery::validation::go_quote(s))
        .collect();
    format!("[{}]", items.join(" "))
}

/// An object read straight from the store (no resourceVersion stamped), `None` when it
/// does not exist.
pub(crate) async fn read_object(store: &dyn Store, key: &str) -> Result<Option<Value>, String> {
    let (kv, _) = store
        .get(key.as_bytes(), None)
        .await
        .map_err(|e| e.to_string())?;
    match kv {
        None => Ok(None),
        Some(kv) => serde_json::from_slice(&kv.value)
            .map(Some)
            .map_err(|e| e.to_string()),
    }
}

fn uid_of(obj: &Value) -> &str {
    obj.pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// Whether an object was marked deleted before `before` (unix seconds).
fn deleted_before(obj: &Value, before: i64) -> bool {
    obj.pointer("/metadata/deletionTimestamp")
        .and_then(Value::as_str)
        .and_then(crate::time::parse_rfc3339)
        .is_some_and(|t| t < before)
}

/// The service-account token authenticator.
pub struct Authenticator {
    key: Arc<SigningKey>,
    store: Arc<dyn Store>,
    /// The audiences a token is checked against when the caller names none.
    implicit_audiences: Vec<String>,
}

impl Authenticator {
    pub fn new(key: Arc<SigningKey>, store: Arc<dyn Store>) -> Authenticator {
        Authenticator {
            key,
            store,
            implicit_audiences: api_audiences(),
        }
    }

    /// Checks a token at time `now` (unix seconds).
    pub async fn authenticate_at(
        &self,
        token: &str,
        audiences: &[String],
        now: i64,
    ) -> TokenResult {
        if unverified_issuer(token).as_deref() != Some(ISSUER) {
            return TokenResult::NotMine;
        }
        let claims = match self.key.verify(token) {
            Ok(c) => c,
            Err(None) => return TokenResult::NotMine,
            Err(Some(why)) => return TokenResult::Invalid(why),
        };
        match self.validate(&claims, audiences, now).await {
            Ok((user, auds)) => TokenResult::User(user, auds),
            Err(why) => TokenResult::Invalid(why),
        }
    }

    async fn validate(
        &self,
        claims: &Value,
        audiences: &[String],
        now: i64,
    ) -> Result<(UserInfo, Vec<String>), String> {
        let issuer = claims.get("iss").and_then(Value::as_str).unwrap_or("");
        if issuer != ISSUER {
            return Err(format!(
                "token issuer {} is invalid",
                kumo_apimachinery::validation::go_quote(issuer)
            ));
        }
        let exp = numeric_date(claims, "exp")?;
        let nbf = numeric_date(claims, "nbf")?;
        let iat = numeric_date(claims, "iat")?;
        let mut token_auds = audiences_of(claims)?;
        if token_auds.is_empty() {
            // Legacy tokens without audiences are for the API server only.
            token_auds = self.implicit_audiences.clone();
        }
        let requested: &[String] = if audiences.is_empty() {
            &self.implicit_audiences
        } else {
            audiences
        };
        let auds: Vec<String> = token_auds
            .iter()
            .filter(|a| requested.contains(a))
            .cloned()
            .collect();
        if auds.is_empty() {
            return Err(format!(
                "token audiences {} is invalid for the target audiences {}",
                go_quote_list(&token_auds),
                go_quote_list(requested)
            ));
        }
        if nbf.is_some_and(|t| now + LEEWAY_SECS < t) {
            return Err("service account token is not valid yet".into());
        }
        if exp.is_some_and(|t| now - LEEWAY_SECS > t) {
            return Err("service account token has expired".into());
        }
        if iat.is_some_and(|t| now + LEEWAY_SECS < t) {
            return Err("service account token is issued in the future".into());
        }
        let k8s = claims.get("kubernetes.io");
        let namespace = k8s
            .and_then(|k| k.get("namespace"))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let sa =
            ObjectRef::from_json(k8s.and_then(|k| k.get("serviceaccount"))).unwrap_or_default();
        let pod = ObjectRef::from_json(k8s.and_then(|k| k.get("pod")));
        let secret = ObjectRef::from_json(k8s.and_then(|k| k.get("secret")));
        let node = ObjectRef::from_json(k8s.and_then(|k| k.get("node")));
        // Things deleted before now minus the leeway no longer back a token.
        let cutoff = now - LEEWAY_SECS;
        let store = &*self.store;
        let found = read_object(
            store,
            &format!("/registry/serviceaccounts/{namespace}/{}", sa.name),
        )
        .await?;
        let Some(account) = found else {
            return Err(format!(
                "serviceaccounts {} not found",
                kumo_apimachinery::validation::go_quote(&sa.name)
            ));
        };
        if uid_of(&account) != sa.uid {
            return Err(format!(
                "service account UID ({}) does not match claim ({})",
                uid_of(&account),
                sa.uid
            ));
        }
        if deleted_before(&account, cutoff) {
            return Err(format!(
                "service account {namespace}/{} has been deleted",
                sa.name
            ));
        }
        let invalidated = || "service account token has been invalidated".to_owned();
        if let Some(s) = &secret {
            let obj = read_object(store, &format!("/registry/secrets/{namespace}/{}", s.name))
                .await?
                .ok_or_else(invalidated)?;
            if uid_of(&obj) != s.uid {
                return Err(format!(
                    "secret UID ({}) does not match service account secret ref claim ({})",
                    uid_of(&obj),
                    s.uid
                ));
            }
            if deleted_before(&obj, cutoff) {
                return Err(invalidated());
            }
        }
        let mut user = UserInfo {
            name: format!("{}{namespace}:{}", names::SERVICE_ACCOUNT_PREFIX, sa.name),
            uid: sa.uid.clone(),
            groups: vec![
                names::SERVICE_ACCOUNTS.to_owned(),
                format!("{}:{namespace}", names::SERVICE_ACCOUNTS),
                names::ALL_AUTHENTICATED.to_owned(),
            ],
            extra: Default::default(),
        };
        if let Some(p) = &pod {
            let obj = read_object(store, &format!("/registry/pods/{namespace}/{}", p.name))
                .await?
                .ok_or_else(invalidated)?;
            if uid_of(&obj) != p.uid {
                return Err(format!(
                    "pod UID ({}) does not match service account pod ref claim ({})",
                    uid_of(&obj),
                    p.uid
                ));
            }
            if deleted_before(&obj, cutoff) {
                return Err(invalidated());
            }
            if !p.name.is_empty() && !p.uid.is_empty() {
                user.extra
                    .insert(extra::POD_NAME.into(), vec![p.name.clone()]);
                user.extra
                    .insert(extra::POD_UID.into(), vec![p.uid.clone()]);
            }
        }
        if let Some(n) = &node {
            if pod.is_none() {
                // A token bound to the node itself: the node must still be there.
                let obj = read_object(store, &format!("/registry/nodes/{}", n.name))
                    .await?
                    .ok_or_else(invalidated)?;
                if uid_of(&obj) != n.uid {
                    return Err(format!(
                        "node UID ({}) does not match service account node ref claim ({})",
                        uid_of(&obj),
                        n.uid
                    ));
                }
                if deleted_before(&obj, cutoff) {
                    return Err(invalidated());
                }
            }
            if !n.name.is_empty() {
                user.extra
                    .insert(extra::NODE_NAME.into(), vec![n.name.clone()]);
                if !n.uid.is_empty() {
                    user.extra
                        .insert(extra::NODE_UID.into(), vec![n.uid.clone()]);
                }
            }
        }
        if let Some(jti) = claims
            .get("jti")
            .and_then(Value::as_str)
            .filter(|j| !j.is_empty())
        {
            user.extra
                .insert(extra::CREDENTIAL_ID.into(), vec![format!("JTI={jti}")]);
        }
        Ok((user, auds))
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
    use kumo_storage::embedded::{EmbeddedConfig, EmbeddedStore};

    const NOW: i64 = 2_000_000_000;

    fn key() -> Arc<SigningKey> {
        let dir = tempfile::tempdir().expect("tempdir");
        SigningKey::load_or_create(dir.path()).expect("key")
    }

    fn claims_for(uid: &str) -> Claims {
        Claims {
            namespace: "default".into(),
            service_account: ObjectRef::new("bot", uid),
            audiences: api_audiences(),
            issued_at: NOW,
            expires: NOW + 3600,
            jti: "j-1".into(),
            ..Default::default()
        }
    }

    async fn store_with(objects: &[(&str, Value)]) -> (Arc<dyn Store>, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("tempdir");
        let store: Arc<dyn Store> = EmbeddedStore::open(EmbeddedConfig::new(dir.path()))
            .await
            .expect("store");
        for (key, obj) in objects {
            store
                .create(key.as_bytes(), obj.to_string().into_bytes())
                .await
                .expect("create");
        }
        (store, dir)
    }

    fn sa(uid: &str) -> (&'static str, Value) {
        (
            "/registry/serviceaccounts/default/bot",
            json!({"metadata": {"name": "bot", "namespace": "default", "uid": uid}}),
        )
    }

    #[test]
    fn key_files_as_kubeadm_lays_them_out() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let a = SigningKey::load_or_create(dir.path()).expect("new key");
        let key = dir.path().join("sa.key");
        let mode = std::fs::metadata(&key)
            .expect("sa.key")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let public = std::fs::read_to_string(dir.path().join("sa.pub")).expect("sa.pub");
        assert!(public.starts_with("-----BEGIN PUBLIC KEY-----\n"));
        // The same key at the next start.
        let b = SigningKey::load_or_create(dir.path()).expect("same key");
        assert_eq!(a.kid(), b.kid());
        assert_eq!(a.public_key_der(), b.public_key_der());
        // The public key parses as a P-256 SubjectPublicKeyInfo.
        let der = rustls_pemfile::read_one(&mut public.as_bytes())
            .expect("pem")
            .expect("one item");
        let rustls_pemfile::Item::SubjectPublicKeyInfo(spki) = der else {
            panic!("not a public key")
        };
        assert_eq!(spki.as_ref(), a.public_key_der().as_slice());
        // A key that is not ECDSA P-256 is refused, not used.
        std::fs::write(
            &key,
            "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
        )
        .expect("write");
        assert!(SigningKey::load_or_create(dir.path()).is_err());
    }

    #[test]
    fn jwt_round_trip() {
        let key = key();
        let c = claims_for("u-1").to_json();
        let token = key.sign(&c).expect("sign");
        assert_eq!(token.split('.').count(), 3);
        assert_eq!(key.verify(&token).expect("verifies"), c);
        let header: Value = serde_json::from_slice(
            &URL_SAFE_NO_PAD
                .decode(token.split('.').next().expect("header"))
                .expect("b64"),
        )
        .expect("json");
        assert_eq!(header, json!({"alg": "ES256", "kid": key.kid()}));
        // Upstream's claim names and order (Go's sorted map keys).
        let payload = String::from_utf8(
            URL_SAFE_NO_PAD
                .decode(token.split('.').nth(1).expect("payload"))
                .expect("b64"),
        )
        .expect("utf8");
        assert!(payload.starts_with("{\"aud\":[\"https://kubernetes.default.svc.cluster.local\"],\"exp\":2000003600,\"iat\":2000000000,\"iss\":\"https://kubernetes.default.svc.cluster.local\",\"jti\":\"j-1\",\"kubernetes.io\":{\"namespace\":\"default\",\"serviceaccount\":{\"name\":\"bot\",\"uid\":\"u-1\"}},\"nbf\":2000000000,\"sub\":\"system:serviceaccount:default:bot\"}"), "{payload}");

        // Another key's signature, a changed payload, a changed signature.
        let other = self::key();
        assert_eq!(
            other.verify(&token),
            Err(Some("invalid signature, no keys found".into()))
        );
        let parts: Vec<&str> = token.split('.').collect();
        let mut forged = claims_for("u-1").to_json();
        forged["sub"] = json!("system:serviceaccount:kube-system:x");
        let tampered = format!(
            "{}.{}.{}",
            parts[0],
            URL_SAFE_NO_PAD.encode(forged.to_string()),
            parts[2]
        );
        assert_eq!(
            key.verify(&tampered),
            Err(Some(
                "go-jose/go-jose: error in cryptographic primitive".into()
            ))
        );
        let bad_sig = format!(
            "{}.{}.{}",
            parts[0],
            parts[1],
            URL_SAFE_NO_PAD.encode([7u8; 64])
        );
        assert!(matches!(key.verify(&bad_sig), Err(Some(_))));
        // alg none is never accepted.
        let none = format!(
            "{}.{}.",
            URL_SAFE_NO_PAD.encode(r#"{"alg":"none"}"#),
            parts[1]
        );
        assert!(matches!(key.verify(&none), Err(Some(_))));
        for junk in ["", "a", "a.b", "a.b.c.d", "!.!.!", "e30.e30.!!"] {
            assert_eq!(key.verify(junk), Err(None), "{junk}");
        }
    }

    #[tokio::test]
    async fn authenticates_as_the_service_account() {
        let key = key();
        let (store, _dir) = store_with(&[sa("u-1")]).await;
        let auth = Authenticator::new(key.clone(), store);
        let token = key.sign(&claims_for("u-1").to_json()).expect("sign");
        let TokenResult::User(user, auds) = auth.authenticate_at(&token, &[], NOW + 10).await
        else {
            panic!("not authenticated")
        };
        assert_eq!(user.name, "system:serviceaccount:default:bot");
        assert_eq!(user.uid, "u-1");
        assert_eq!(
            user.groups,
            [
                "system:serviceaccounts",
                "system:serviceaccounts:default",
                "system:authenticated"
            ]
        );
        assert_eq!(user.extra[extra::CREDENTIAL_ID], ["JTI=j-1"]);
        assert_eq!(auds, api_audiences());
        // Not a service-account token: the next authenticator's turn.
        assert_eq!(
            auth.authenticate_at("abcdef.0123456789abcdef", &[], NOW)
                .await,
            TokenResult::NotMine
        );
        let mut foreign = claims_for("u-1").to_json();
        foreign["iss"] = json!("https://elsewhere");
        let foreign = key.sign(&foreign).expect("sign");
        assert_eq!(
            auth.authenticate_at(&foreign, &[], NOW).await,
            TokenResult::NotMine
        );
    }

    #[tokio::test]
    async fn time_and_audience_checks() {
        let key = key();
        let (store, _dir) = store_with(&[sa("u-1")]).await;
        let auth = Authenticator::new(key.clone(), store);
        let token = key.sign(&claims_for("u-1").to_json()).expect("sign");
        let invalid = |why: &str| TokenResult::Invalid(why.to_owned());
        // Expired, with go-jose's minute of leeway.
        assert!(matches!(
            auth.authenticate_at(&token, &[], NOW + 3600 + 60).await,
            TokenResult::User(..)
        ));
        assert_eq!(
            auth.authenticate_at(&token, &[], NOW + 3600 + 61).await,
            invalid("service account token has expired")
        );
        assert_eq!(
            auth.authenticate_at(&token, &[], NOW - 61).await,
            invalid("service account token is not valid yet")
        );
        assert!(matches!(
            auth.authenticate_at(&token, &[], NOW - 60).await,
            TokenResult::User(..)
        ));
        assert_eq!(
            auth.authenticate_at(&token, &["vault".to_owned(), "x".to_owned()], NOW).await,
            invalid("token audiences [\"https://kubernetes.default.svc.cluster.local\"] is invalid for the target audiences [\"vault\" \"x\"]")
        );
        let mut c = claims_for("u-1");
        c.audiences = vec!["vault".into(), ISSUER.into()];
        let both = key.sign(&c.to_json()).expect("sign");
        let TokenResult::User(_, auds) = auth
            .authenticate_at(&both, &["vault".to_owned()], NOW)
            .await
        else {
            panic!("vault token refused")
        };
        assert_eq!(auds, ["vault"]);
        // A claim of the wrong type is an error, not a panic.
        let mut odd = claims_for("u-1").to_json();
        odd["exp"] = json!("tomorrow");
        let odd = key.sign(&odd).expect("sign");
        assert!(matches!(
            auth.authenticate_at(&odd, &[], NOW).await,
            TokenResult::Invalid(_)
        ));
    }

    #[tokio::test]
    async fn expired_token_is_refused_at_the_current_time() {
        let key = key();
        let (store, _dir) = store_with(&[sa("u-1")]).await;
        let auth = Authenticator::new(key.clone(), store);
        let now = crate::time::now_secs();
        let mut c = claims_for("u-1");
        c.issued_at = now - 7200;
        c.expires = now - 3600;
        let token = key.sign(&c.to_json()).expect("sign");
        assert_eq!(
            auth.authenticate(&token, &[]).await,
            TokenResult::Invalid("service account token has expired".into())
        );
    }

    #[tokio::test]
    async fn revoked_with_their_objects() {
        let key = key();
        let pod = |uid: &str| {
            (
                "/registry/pods/default/p1",
                json!({"metadata": {"name": "p1", "uid": uid}}),
            )
        };
        let (store, _dir) = store_with(&[sa("u-2"), pod("pod-1")]).await;
        let auth = Authenticator::new(key.clone(), store.clone());
        // Another account of the same name.
        let token = key.sign(&claims_for("u-1").to_json()).expect("sign");
        assert_eq!(
            auth.authenticate_at(&token, &[], NOW).await,
            TokenResult::Invalid("service account UID (u-2) does not match claim (u-1)".into())
        );
        // Bound to a pod, which carries its name and uid (and its node's) into extra.
        let mut c = claims_for("u-2");
        c.pod = Some(ObjectRef::new("p1", "pod-1"));
        c.node = Some(ObjectRef::new("n1", "node-1"));
        let token = key.sign(&c.to_json()).expect("sign");
        let TokenResult::User(user, _) = auth.authenticate_at(&token, &[], NOW).await else {
            panic!("pod-bound token refused")
        };
        assert_eq!(user.extra[extra::POD_NAME], ["p1"]);
        assert_eq!(user.extra[extra::POD_UID], ["pod-1"]);
        assert_eq!(user.extra[extra::NODE_NAME], ["n1"]);
        assert_eq!(user.extra[extra::NODE_UID], ["node-1"]);
        c.pod = Some(ObjectRef::new("p1", "pod-0"));
        let stale = key.sign(&c.to_json()).expect("sign");
        assert_eq!(
            auth.authenticate_at(&stale, &[], NOW).await,
            TokenResult::Invalid(
                "pod UID (pod-1) does not match service account pod ref claim (pod-0)".into()
            )
        );
        c.pod = None;
        let node_bound = key.sign(&c.to_json()).expect("sign");
        assert_eq!(
            auth.authenticate_at(&node_bound, &[], NOW).await,
            TokenResult::Invalid("service account token has been invalidated".into())
        );
        store
            .delete(b"/registry/pods/default/p1", None)
            .await
            .expect("delete pod");
        assert_eq!(
            auth.authenticate_at(&token, &[], NOW).await,
            TokenResult::Invalid("service account token has been invalidated".into())
        );
        store
            .delete(b"/registry/serviceaccounts/default/bot", None)
            .await
            .expect("delete sa");
        let plain = key.sign(&claims_for("u-2").to_json()).expect("sign");
        assert_eq!(
            auth.authenticate_at(&plain, &[], NOW).await,
            TokenResult::Invalid("serviceaccounts \"bot\" not found".into())
        );
    }
}
