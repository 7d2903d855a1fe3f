//! Registry credentials for a pull, from the pod's imagePullSecrets (upstream's
//! credentialprovider keyring): the `.dockerconfigjson` (`{"auths": {...}}`) and legacy
//! `.dockercfg` secrets' entries whose registry matches the image, the most specific first.

use kumo_cri::PullAuth;
use serde_json::Value;

use crate::env::SOURCES;

/// `docker.io` images under any of Docker Hub's names.
const DOCKER_HUB: &str = "docker.io";

/// The registry host and repository path of `image` (`nginx` is
/// `docker.io/library/nginx`).
fn registry_and_path(image: &str) -> (String, String) {
    let name = image.split('@').next().unwrap_or(image);
    let (first, rest) = name.split_once('/').unwrap_or(("", name));
    let is_host = first.contains('.') || first.contains(':') || first == "localhost";
    let (host, path) = if is_host {
        (first.to_owned(), rest.to_owned())
    } else if first.is_empty() {
        (DOCKER_HUB.to_owned(), format!("library/{rest}"))
    } else {
        (DOCKER_HUB.to_owned(), name.to_owned())
    };
    // The tag is not part of the path.
    let path = match path.rsplit_once(':') {
        Some((p, tag)) if !tag.contains('/') => p.to_owned(),
        _ => path,
    };
    (host, path)
}

/// A keyring entry's registry key as a host and a path prefix (`https://` and a trailing
/// `/` dropped; Docker Hub's legacy `index.docker.io/v1/` is `docker.io`).
fn key_host_and_path(key: &str) -> (String, String) {
    let k = key
        .trim_start_matches("https://")
        .trim_start_matches("http://")
        .trim_end_matches('/');
    let (host, path) = k.split_once('/').unwrap_or((k, ""));
    match host {
        "index.docker.io" | "registry-1.docker.io" | "docker.io" => (
            DOCKER_HUB.into(),
            if path == "v1" {
                String::new()
            } else {
                path.into()
            },
        ),
        _ => (host.to_owned(), path.to_owned()),
    }
}

/// Whether registry pattern `pattern` (a host, `*.` globs allowed per label) matches
/// `host`.
fn host_matches(pattern: &str, host: &str) -> bool {
    let (p_port, h_port) = (pattern.split_once(':'), host.split_once(':'));
    let (p, pp) = p_port.map_or((pattern, ""), |(a, b)| (a, b));
    let (h, hp) = h_port.map_or((host, ""), |(a, b)| (a, b));
    if pp != hp {
        return false;
    }
    let (pl, hl): (Vec<&str>, Vec<&str>) = (p.split('.').collect(), h.split('.').collect());
    pl.len() == hl.len()
        && pl.iter().zip(&hl).all(|(a, b)| {
            *a == "*"
                || a.eq_ignore_ascii_case(b)
                || a.strip_prefix('*').is_some_and(|s| b.ends_with(s))
        })
}

/// The credentials of the pod's imagePullSecrets (as the kubelet fetched them) that
/// match `image`, the longest registry path first.
pub fn for_image(pod: &Value, image: &str) -> Vec<PullAuth> {
    let (host, path) = registry_and_path(image);
    let mut found: Vec<(usize, PullAuth)> = Vec::new();
    for s in pod
        .pointer("/spec/imagePullSecrets")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let Some(name) = s.get("name").and_then(Value::as_str) else {
            continue;
        };
        let Some(data) = pod.pointer(&format!("/{SOURCES}/secrets/{name}")) else {
            continue;
        };
        let entries: Option<Value> = data
            .get(".dockerconfigjson")
            .and_then(Value::as_str)
            .and_then(|t| serde_json::from_str::<Value>(t).ok())
            .and_then(|v| v.get("auths").cloned())
            .or_else(|| {
                data.get(".dockercfg")
                    .and_then(Value::as_str)
                    .and_then(|t| serde_json::from_str(t).ok())
            });
        for (key, entry) in entries
            .as_ref()
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            let (k_host, k_path) = key_host_and_path(key);
            let path_ok =
                k_path.is_empty() || path == k_path || path.starts_with(&format!("{k_path}/"));
            if !host_matches(&k_host, &host) || !path_ok {
                continue;
            }
            let field = |f: &str| {
                entry
                    .get(f)
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned()
            };
            let (mut username, mut password) = (field("username"), field("password"));
            let auth = field("auth");
            if username.is_empty() && !auth.is_empty() {
                use base64::Engine;
                if let Some((u, p)) = base64::engine::general_purpose::STANDARD
                    .decode(&auth)
                    .ok()
                    .and_then(|b| String::from_utf8(b).ok())
                    .and_then(|s| s.split_once(':').map(|(u, p)| (u.to_owned(), p.to_owned())))
                {
                    (username, password) = (u, p);
                }
            }
            found.push((
                k_host.len() + k_path.len(),
                PullAuth {
                    username,
                    password,
                    auth,
                    server_address: key.clone(),
                },
            ));
        }
    }
    // Most specific first; among equals, the secrets' order.
    found.sort_by_key(|(specificity, _)| std::cmp::Reverse(*specificity));
    found.into_iter().map(|(_, a)| a).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn images_name_their_registry_and_repository() {
        assert_eq!(
            registry_and_path("nginx"),
            ("docker.io".into(), "library/nginx".into())
        );
        assert_eq!(
            registry_and_path("me/app:1"),
            ("docker.io".into(), "me/app".into())
        );
        assert_eq!(
            registry_and_path("reg.example:5000/team/app:2@sha256:ab"),
            ("reg.example:5000".into(), "team/app".into())
        );
        assert_eq!(
            key_host_and_path("https://index.docker.io/v1/"),
            ("docker.io".into(), String::new())
        );
        assert!(host_matches("*.example.com", "reg.example.com"));
        assert!(!host_matches("*.example.com", "example.com"));
        assert!(!host_matches("reg.example.com:5000", "reg.example.com"));
    }

    #[test]
    fn the_most_specific_matching_credential_comes_first() {
        let cfg = json!({"auths": {
            "reg.example.com": {"username": "any", "password": "p1"},
            "reg.example.com/team": {"auth": "dGVhbTpwMg=="},
            "other.example.com": {"username": "no", "password": "p3"},
        }})
        .to_string();
        let legacy = json!({"https://index.docker.io/v1/": {"username": "hub", "password": "p4"}})
            .to_string();
        let pod = json!({
            "spec": {"imagePullSecrets": [{"name": "regcred"}, {"name": "hub"}, {"name": "missing"}]},
            "kumo.sources": {"secrets": {
                "regcred": {".dockerconfigjson": cfg},
                "hub": {".dockercfg": legacy},
            }},
        });
        let found = for_image(&pod, "reg.example.com/team/app:1");
        let users: Vec<&str> = found.iter().map(|a| a.username.as_str()).collect();
        assert_eq!(users, ["team", "any"]);
        assert_eq!(found[0].password, "p2");
        assert_eq!(found[0].server_address, "reg.example.com/team");
        let hub = for_image(&pod, "busybox");
        assert_eq!(hub.len(), 1);
        assert_eq!(hub[0].username, "hub");
        assert!(for_image(&pod, "elsewhere.example.org/x").is_empty());
    }
}
