//! The user's kubeconfig, kept as kind keeps it, and how kumo's commands find a cluster.
//!
//! `kumo up` merges its admin credentials into the user's kubeconfig (`$KUBECONFIG`'s first
//! file, else `~/.kube/config`) as cluster, user and context `kumo-<name>`, makes that
//! context current, and records where it wrote in the data directory
//! ([`RECORD`]); `kumo down` takes the entries out again. The cluster entry carries a
//! `kumo` extension with the data directory, so that commands which need more than the API
//! (the cloud, the process) find the cluster a context points at: `kumo doctor`, `kumo
//! status` and `kumo cloud` follow `--kubeconfig`, `$KUBECONFIG` and `--context` as kubectl
//! does.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde_yaml::{Mapping, Value};

/// The name of the extension in a cluster entry that holds the data directory.
pub const EXTENSION: &str = "kumo";
/// In the data directory: the kubeconfig file and context `kumo up` merged (JSON).
pub const RECORD: &str = "kubeconfig-context.json";

/// The user's kubeconfig: the first file of `$KUBECONFIG`, else `~/.kube/config`.
pub fn user_kubeconfig() -> Result<PathBuf> {
    match std::env::var_os("KUBECONFIG").filter(|v| !v.is_empty()) {
        Some(v) => std::env::split_paths(&v)
            .next()
            .context("$KUBECONFIG names no file"),
        None => Ok(home()?.join(".kube").join("config")),
    }
}

fn home() -> Result<PathBuf> {
    Ok(PathBuf::from(
        std::env::var_os("HOME").context("HOME is not set")?,
    ))
}

/// The context name of a cluster: `kumo-<name>`.
pub fn context_name(name: &str) -> String {
    format!("kumo-{name}")
}

fn read(p: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
    serde_yaml::from_str(&text).with_context(|| format!("parsing {}", p.display()))
}

fn write(target: &Path, doc: &Value) -> Result<()> {
    let text = serde_yaml::to_string(doc)?;
    if let Some(dir) = target.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    kumo_apiserver::pki::write_file(target, text.as_bytes(), 0o600)?;
    Ok(())
}

/// The admin kubeconfig of a data directory as a kubeconfig of its own, with cluster, user
/// and context named `kumo-<name>` and the cluster's `kumo` extension naming the data
/// directory (what `kumo get kubeconfig` prints).
pub fn named(admin: &Path, name: &str, data_dir: &Path) -> Result<Value> {
    let src = read(admin)?;
    let first = |list: &str, field: &str| -> Result<Value> {
        src.get(list)
            .and_then(|l| l.get(0))
            .and_then(|e| e.get(field))
            .cloned()
            .with_context(|| format!("{}: no {list}", admin.display()))
    };
    let ctx = context_name(name);
    let entry = |field: &str, value: Value| {
        let mut m = Mapping::new();
        m.insert("name".into(), Value::String(ctx.clone()));
        m.insert(field.into(), value);
        Value::Mapping(m)
    };
    let mut cluster = first("clusters", "cluster")?;
    if let Value::Mapping(c) = &mut cluster {
        let dir = std::path::absolute(data_dir).unwrap_or_else(|_| data_dir.to_owned());
        let mut ext = Mapping::new();
        ext.insert(
            "dataDir".into(),
            Value::String(dir.to_string_lossy().into_owned()),
        );
        let mut named_ext = Mapping::new();
        named_ext.insert("name".into(), EXTENSION.into());
        named_ext.insert("extension".into(), Value::Mapping(ext));
        c.insert(
            "extensions".into(),
            Value::Sequence(vec![Value::Mapping(named_ext)]),
        );
    }
    let mut context = Mapping::new();
    context.insert("cluster".into(), Value::String(ctx.clone()));
    context.insert("user".into(), Value::String(ctx.clone()));
    let mut doc = Mapping::new();
    doc.insert("apiVersion".into(), "v1".into());
    doc.insert("kind".into(), "Config".into());
    doc.insert("preferences".into(), Value::Mapping(Mapping::new()));
    doc.insert(
        "clusters".into(),
        Value::Sequence(vec![entry("cluster", cluster)]),
    );
    doc.insert(
        "users".into(),
        Value::Sequence(vec![entry("user", first("users", "user")?)]),
    );
    doc.insert(
        "contexts".into(),
        Value::Sequence(vec![entry("context", Value::Mapping(context))]),
    );
    doc.insert("current-context".into(), Value::String(ctx));
    Ok(Value::Mapping(doc))
}

/// Merges the admin kubeconfig of `data_dir` into `target` (created if missing) as
/// cluster, user and context `kumo-<name>`, and makes that context the current one, as
/// kind does. Entries of the same name are replaced; everything else is kept. Records the
/// merge in the data directory for [`remove`].
pub fn merge(admin: &Path, name: &str, data_dir: &Path, target: &Path) -> Result<()> {
    let new = named(admin, name, data_dir)?;
    let ctx = context_name(name);
    let mut doc = if target.exists() {
        read(target)?
    } else {
        Value::Null
    };
    if !doc.is_mapping() {
        let mut m = Mapping::new();
        m.insert("apiVersion".into(), "v1".into());
        m.insert("kind".into(), "Config".into());
        m.insert("preferences".into(), Value::Mapping(Mapping::new()));
        doc = Value::Mapping(m);
    }
    let Value::Mapping(m) = &mut doc else {
        bail!("{}: not a kubeconfig", target.display());
    };
    for list in ["clusters", "users", "contexts"] {
        let Some(value) = new.get(list).and_then(|l| l.get(0)).cloned() else {
            continue;
        };
        let entries = m
            .entry(list.into())
            .or_insert_with(|| Value::Sequence(Vec::new()));
        if !entries.is_sequence() {
            *entries = Value::Sequence(Vec::new());
        }
        if let Value::Sequence(seq) = entries {
            seq.retain(|e| e.get("name").and_then(Value::as_str) != Some(ctx.as_str()));
            seq.push(value);
        }
    }
    m.insert("current-context".into(), Value::String(ctx.clone()));
    write(target, &doc)?;
    let target = std::path::absolute(target).unwrap_or_else(|_| target.to_owned());
    let record = serde_json::json!({"kubeconfig": target, "context": ctx});
    std::fs::write(data_dir.join(RECORD), format!("{record}\n"))
        .with_context(|| format!("writing {}", data_dir.join(RECORD).display()))?;
    Ok(())
}

/// Takes the context `kumo up` merged for `data_dir` (and its cluster and user) out of
/// the kubeconfig it went into; the current context, if it was that one, is unset, as
/// `kind delete cluster` does. Returns the file and context, or None when nothing was
/// merged.
pub fn remove(data_dir: &Path) -> Result<Option<(PathBuf, String)>> {
    let path = data_dir.join(RECORD);
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(None);
    };
    let record: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let (Some(target), Some(ctx)) = (
        record.get("kubeconfig").and_then(|v| v.as_str()),
        record.get("context").and_then(|v| v.as_str()),
    ) else {
        bail!("{}: no kubeconfig or context", path.display());
    };
    let target = PathBuf::from(target);
    if target.exists() {
        let mut doc = read(&target)?;
        if let Value::Mapping(m) = &mut doc {
            for list in ["clusters", "users", "contexts"] {
                if let Some(Value::Sequence(seq)) = m.get_mut(list) {
                    seq.retain(|e| e.get("name").and_then(Value::as_str) != Some(ctx));
                }
            }
            if m.get("current-context").and_then(Value::as_str) == Some(ctx) {
                m.insert("current-context".into(), Value::String(String::new()));
            }
        }
        write(&target, &doc)?;
    }
    let _ = std::fs::remove_file(&path);
    Ok(Some((target, ctx.to_owned())))
}

/// How a command finds its cluster (the flags kubectl has, and kumo's data directory).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ClusterArgs {
    /// The data directory of `kumo up` (its admin kubeconfig and cloud); default: the
    /// cluster of the kubeconfig's current context, else $HOME/.kumo/default.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The name of the kubeconfig context to use.
    #[arg(long)]
    pub context: Option<String>,
}

/// A cluster a command talks to.
pub struct Target {
    pub client: kube::Client,
    /// The API server's URL.
    pub url: String,
    /// Its `kumo up` data directory, when known.
    pub data_dir: Option<PathBuf>,
    /// Where the credentials came from, for messages.
    pub source: String,
}

/// A client of the cluster with the data directory's admin kubeconfig, and the server URL.
pub async fn admin_client(data_dir: &Path) -> Result<(kube::Client, String)> {
    let path = data_dir.join("admin.conf");
    let kc = kube::config::Kubeconfig::read_from(&path)
        .with_context(|| format!("reading {}", path.display()))?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .with_context(|| format!("loading {}", path.display()))?;
    let url = cfg.cluster_url.to_string().trim_end_matches('/').to_owned();
    Ok((kumo_client::transport::client(cfg)?, url))
}

/// `$HOME/.kumo/default`, where `kumo up` keeps its state without `--data-dir` or `--name`.
pub fn default_data_dir() -> Result<PathBuf> {
    Ok(home()?.join(".kumo").join("default"))
}

/// The data directory a kubeconfig's context names (its cluster's `kumo` extension).
fn extension_dir(kc: &kube::config::Kubeconfig, context: &str) -> Option<PathBuf> {
    let ctx = kc.contexts.iter().find(|c| c.name == context)?;
    let cluster_name = &ctx.context.as_ref()?.cluster;
    let cluster = kc.clusters.iter().find(|c| &c.name == cluster_name)?;
    let ext = cluster.cluster.as_ref()?.extensions.as_ref()?;
    let e = ext.iter().find(|e| e.name == EXTENSION)?;
    e.extension
        .get("dataDir")
        .and_then(|d| d.as_str())
        .map(PathBuf::from)
}

/// The kubeconfig the flags and environment name, merged as kubectl merges
/// `$KUBECONFIG`'s files; None when there is none.
fn user_config(args: &ClusterArgs) -> Result<Option<(kube::config::Kubeconfig, String)>> {
    use kube::config::Kubeconfig;
    if let Some(p) = &args.kubeconfig {
        let kc = Kubeconfig::read_from(p).with_context(|| format!("reading {}", p.display()))?;
        return Ok(Some((kc, p.display().to_string())));
    }
    if let Some(kc) = Kubeconfig::from_env().context("reading $KUBECONFIG")? {
        return Ok(Some((kc, "$KUBECONFIG".into())));
    }
    let default = home()?.join(".kube").join("config");
    if default.exists() {
        let kc = Kubeconfig::read_from(&default)
            .with_context(|| format!("reading {}", default.display()))?;
        return Ok(Some((kc, default.display().to_string())));
    }
    Ok(None)
}

/// The cluster a command talks to: `--data-dir`'s admin credentials; else the
/// kubeconfig's (`--kubeconfig`, `$KUBECONFIG`, `~/.kube/config`) `--context` or current
/// context; else the default data directory's.
pub async fn target(args: &ClusterArgs) -> Result<Target> {
    let from_dir = |dir: PathBuf| async move {
        let (client, url) = admin_client(&dir).await?;
        Ok::<_, anyhow::Error>(Target {
            client,
            url,
            source: format!("{}", dir.join("admin.conf").display()),
            data_dir: Some(dir),
        })
    };
    if let Some(d) = &args.data_dir {
        return from_dir(d.clone()).await;
    }
    let user = user_config(args)?;
    let context = match (&args.context, &user) {
        (Some(c), _) => Some(c.clone()),
        (None, Some((kc, _))) => kc.current_context.clone().filter(|c| !c.is_empty()),
        (None, None) => None,
    };
    match (user, context) {
        (Some((kc, source)), Some(context)) => {
            if !kc.contexts.iter().any(|c| c.name == context) {
                bail!("context {context:?} is not in {source}");
            }
            let data_dir = extension_dir(&kc, &context);
            let opts = kube::config::KubeConfigOptions {
                context: Some(context.clone()),
                ..Default::default()
            };
            let cfg = kube::Config::from_custom_kubeconfig(kc, &opts)
                .await
                .with_context(|| format!("loading context {context} of {source}"))?;
            let url = cfg.cluster_url.to_string().trim_end_matches('/').to_owned();
            Ok(Target {
                client: kumo_client::transport::client(cfg)?,
                url,
                data_dir,
                source: format!("context {context} of {source}"),
            })
        }
        (Some((_, source)), None) if args.context.is_none() => {
            // No current context: the default cluster, as before any merge.
            let dir = default_data_dir()?;
            if dir.join("admin.conf").exists() {
                from_dir(dir).await
            } else {
                bail!("{source} has no current context; pass --context or --data-dir")
            }
        }
        _ => from_dir(default_data_dir()?).await,
    }
}

/// The data directory of the cluster the kubeconfig's current (or `--context`) context
/// points at, when `kumo up` merged it; for `kumo cloud`'s default.
pub fn current_data_dir(args: &ClusterArgs) -> Option<PathBuf> {
    if let Some(d) = &args.data_dir {
        return Some(d.clone());
    }
    let (kc, _) = user_config(args).ok()??;
    let context = args
        .context
        .clone()
        .or_else(|| kc.current_context.clone())?;
    extension_dir(&kc, &context)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ADMIN: &str = "apiVersion: v1\nkind: Config\nclusters:\n- name: kubernetes\n  cluster:\n    server: https://127.0.0.1:6443\n    certificate-authority-data: Q0E=\ncontexts:\n- name: kubernetes-admin@kubernetes\n  context:\n    cluster: kubernetes\n    user: kubernetes-admin\ncurrent-context: kubernetes-admin@kubernetes\nusers:\n- name: kubernetes-admin\n  user:\n    token: abc\n";
    const OTHER: &str = "apiVersion: v1\nkind: Config\nclusters:\n- name: other\n  cluster:\n    server: https://192.0.2.1:6443\ncontexts:\n- name: other\n  context:\n    cluster: other\n    user: other\nusers:\n- name: other\n  user:\n    token: x\ncurrent-context: other\n";

    fn names(doc: &Value, list: &str) -> Vec<String> {
        doc.get(list)
            .and_then(Value::as_sequence)
            .into_iter()
            .flatten()
            .filter_map(|e| e.get("name").and_then(Value::as_str).map(str::to_owned))
            .collect()
    }

    #[test]
    fn merge_then_remove_leaves_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir_all(&data).unwrap();
        let admin = data.join("admin.conf");
        std::fs::write(&admin, ADMIN).unwrap();
        let user = dir.path().join("kube").join("config");
        std::fs::create_dir_all(user.parent().unwrap()).unwrap();
        std::fs::write(&user, OTHER).unwrap();

        merge(&admin, "a", &data, &user).unwrap();
        // Twice: replaced, not duplicated.
        merge(&admin, "a", &data, &user).unwrap();
        let doc = read(&user).unwrap();
        assert_eq!(names(&doc, "contexts"), ["other", "kumo-a"]);
        assert_eq!(names(&doc, "clusters"), ["other", "kumo-a"]);
        assert_eq!(doc["current-context"], Value::from("kumo-a"));
        let kc = kube::config::Kubeconfig::read_from(&user).unwrap();
        assert_eq!(
            extension_dir(&kc, "kumo-a"),
            Some(std::path::absolute(&data).unwrap())
        );
        assert_eq!(extension_dir(&kc, "other"), None);

        let removed = remove(&data).unwrap().unwrap();
        assert_eq!(removed.1, "kumo-a");
        let doc = read(&user).unwrap();
        assert_eq!(names(&doc, "contexts"), ["other"]);
        assert_eq!(names(&doc, "users"), ["other"]);
        assert_eq!(doc["current-context"], Value::from(""));
        // Nothing recorded any more: a second removal does nothing.
        assert!(remove(&data).unwrap().is_none());
    }

    #[test]
    fn a_missing_kubeconfig_is_created() {
        let dir = tempfile::tempdir().unwrap();
        let admin = dir.path().join("admin.conf");
        std::fs::write(&admin, ADMIN).unwrap();
        let user = dir.path().join("new").join("config");
        merge(&admin, "kumo", dir.path(), &user).unwrap();
        let doc = read(&user).unwrap();
        assert_eq!(names(&doc, "contexts"), ["kumo-kumo"]);
        assert_eq!(doc["kind"], Value::from("Config"));
    }
}
