//! `kumo classroom`: the classroom (`kumo-classroom`) beside a cluster started with
//! `kumo up --cluster-api`, its users in `<data-dir>/classroom/users`.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Subcommand;

/// The Cluster every learner gets: docs/examples/cluster-api.yaml.
const TEMPLATE: &str = include_str!("../../../docs/examples/cluster-api.yaml");
/// The classroom's user in the management cluster.
const USER: &str = "system:kumo-classroom";
const ROLE: &str = "kumo:classroom";

#[derive(Subcommand)]
pub enum Classroom {
    /// Adds a user (or gives one a new password) and prints the password.
    AddUser {
        name: String,
        /// An instructor, who sees every learner's cluster.
        #[arg(long)]
        instructor: bool,
        #[command(flatten)]
        cluster: kumo::kubeconfig::ClusterArgs,
    },
    /// Serves the classroom over HTTPS until interrupted.
    Serve {
        /// The port on 127.0.0.1 (0 picks one).
        #[arg(long, default_value_t = 8443)]
        port: u16,
        #[command(flatten)]
        cluster: kumo::kubeconfig::ClusterArgs,
    },
}

fn data_dir(cluster: &kumo::kubeconfig::ClusterArgs) -> Result<PathBuf> {
    match kumo::kubeconfig::current_data_dir(cluster) {
        Some(d) => Ok(d),
        None => kumo::kubeconfig::default_data_dir(),
    }
}

pub async fn run(what: Classroom) -> Result<()> {
    match what {
        Classroom::AddUser {
            name,
            instructor,
            cluster,
        } => {
            let dir = data_dir(&cluster)?;
            let role = if instructor {
                kumo_classroom::Role::Instructor
            } else {
                kumo_classroom::Role::Learner
            };
            let password =
                kumo_classroom::users::add(&dir.join("classroom").join("users"), &name, role)?;
            println!("{password}");
            Ok(())
        }
        Classroom::Serve { port, cluster } => {
            let dir = data_dir(&cluster)?;
            let admin_kc = dir.join("admin.conf");
            let admin = crate_kube_client(&admin_kc).await?;
            // Its own identity: namespaces, the Cluster API objects of the learners'
            // namespaces and their kubeconfig Secrets, nothing else.
            kumo_capi::rbac::ensure_cluster_role(
                &admin,
                ROLE,
                USER,
                serde_json::json!([
                    {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "create", "patch"]},
                    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]},
                    {"apiGroups": ["cluster.x-k8s.io", "controlplane.cluster.x-k8s.io", "bootstrap.cluster.x-k8s.io", "infrastructure.cluster.x-k8s.io"],
                     "resources": ["*"], "verbs": ["get", "list", "watch", "create", "patch"]},
                ]),
            )
            .await?;
            let server = std::fs::read_to_string(&admin_kc)?
                .lines()
                .find_map(|l| l.trim().strip_prefix("server: ").map(str::to_owned))
                .context("the admin kubeconfig names no server")?;
            let kc = kumo_apiserver::pki::user_kubeconfig(&dir, "classroom.conf", USER, &server)?;
            let client = crate_kube_client(&kc).await?;
            let room = kumo_classroom::start(kumo_classroom::Config {
                bind: SocketAddr::from(([127, 0, 0, 1], port)),
                client,
                users_file: dir.join("classroom").join("users"),
                template: TEMPLATE.to_owned(),
                work_dir: dir.join("classroom").join("shells"),
                term_js: PathBuf::from("/usr/share/javascript/term.js/term.js"),
            })
            .await?;
            println!(
                "kumo classroom: https://{}/ (users: kumo classroom add-user NAME [--instructor])",
                room.addr
            );
            tokio::signal::ctrl_c().await?;
            Ok(())
        }
    }
}

async fn crate_kube_client(path: &std::path::Path) -> Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(path)?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    Ok(kumo_client::transport::client(
        kumo_client::clients::as_client_go(cfg),
    )?)
}
