//! `kumo cloud ...`: serve the cloud, or drive one as a client.
//!
//! Client commands find the cloud through `--data-dir` (its `endpoint.json`,
//! `credentials.json` and `ca.crt`), `KUMO_CLOUD_DATA_DIR`, or the `KUMO_CLOUD_ENDPOINT`,
//! `KUMO_CLOUD_ACCESS_KEY_ID`, `KUMO_CLOUD_SECRET_ACCESS_KEY` and `KUMO_CLOUD_CA_FILE`
//! variables (which override the directory's values); by default `$HOME/.kumo/cloud`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args as ClapArgs, Subcommand, ValueEnum};

use crate::client::{Client, ClientConfig};
use crate::error::Error;
use crate::model::*;
use crate::server::{CloudConfig, CloudServer};

/// `kumo cloud`.
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Where the cloud is.
    #[command(flatten)]
    pub conn: Conn,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// How client commands find the cloud (and where `serve` keeps it).
#[derive(ClapArgs, Debug, Clone, Default)]
pub struct Conn {
    /// The cloud's data directory (state, certificates, endpoint and credentials files).
    /// Defaults to $KUMO_CLOUD_DATA_DIR, then $HOME/.kumo/cloud.
    #[arg(long, global = true)]
    pub data_dir: Option<PathBuf>,
    /// Client configuration file (JSON: endpoint, accessKeyId, secretAccessKey, caFile or
    /// caData), instead of the data directory.
    #[arg(long, global = true)]
    pub cloud_config: Option<PathBuf>,
    /// The cloud's URL (overrides the data directory's and $KUMO_CLOUD_ENDPOINT).
    #[arg(long, global = true)]
    pub endpoint: Option<String>,
    /// Access key id (overrides $KUMO_CLOUD_ACCESS_KEY_ID).
    #[arg(long, global = true)]
    pub access_key_id: Option<String>,
    /// Secret access key (overrides $KUMO_CLOUD_SECRET_ACCESS_KEY).
    #[arg(long, global = true)]
    pub secret_access_key: Option<String>,
    /// CA certificate of the cloud (overrides $KUMO_CLOUD_CA_FILE).
    #[arg(long, global = true)]
    pub ca_file: Option<PathBuf>,
}

/// Output format of list commands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Aligned columns.
    #[default]
    Table,
    /// The API's JSON.
    Json,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the cloud: HTTPS API on --bind-address:--port, state in --data-dir.
    Serve {
        /// Port (0 picks a free one).
        #[arg(long, default_value_t = 0)]
        port: u16,
        /// Address to listen on (loopback by default: nothing leaves the machine).
        #[arg(long, default_value = "127.0.0.1")]
        bind_address: std::net::IpAddr,
        /// Added to every boot and halt, so pending and stopping can be watched.
        #[arg(long, default_value_t = 0)]
        transition_delay_ms: u64,
    },
    /// Instances: `kumo cloud instances list`.
    Instances {
        /// The action.
        #[command(subcommand)]
        what: ListOnly<InstanceListArgs>,
    },
    /// One instance: run, get, stop, start, terminate.
    Instance {
        /// The action.
        #[command(subcommand)]
        what: InstanceCmd,
    },
    /// Load balancers: `kumo cloud lbs list`.
    Lbs {
        /// The action.
        #[command(subcommand)]
        what: ListOnly<OutputArgs>,
    },
    /// Volumes (disks): list, create, get, attach, detach, resize, delete.
    Volumes {
        /// The action.
        #[command(subcommand)]
        what: VolumeCmd,
    },
    /// Run a command on the cloud's public side, "from the internet":
    /// `kumo cloud exec -- curl http://<EXTERNAL-IP>/`. Only where the cloud's network is
    /// real (`kumo up --runtime containerd`); the command runs in that network only.
    Exec {
        /// The command and its arguments.
        #[arg(required = true, last = true)]
        command: Vec<String>,
    },
    /// Route tables: `kumo cloud routes list`, `kumo cloud routes delete CIDR`.
    Routes {
        /// The action.
        #[command(subcommand)]
        what: RouteCmd,
    },
    /// Deny policies: deny, allow, list.
    Policy {
        /// The action.
        #[command(subcommand)]
        what: PolicyCmd,
    },
    /// Injected faults: set, clear, list.
    Faults {
        /// The action.
        #[command(subcommand)]
        what: FaultsCmd,
    },
    /// Quotas: get, set.
    Quotas {
        /// The action.
        #[command(subcommand)]
        what: QuotasCmd,
    },
    /// Access keys: create, list.
    AccessKeys {
        /// The action.
        #[command(subcommand)]
        what: KeysCmd,
    },
}

/// The route tables' commands.
#[derive(Subcommand, Debug)]
pub enum RouteCmd {
    /// List the route tables' routes.
    List(OutputArgs),
    /// Delete the route to a destination (from the main route table unless
    /// --route-table says another).
    Delete {
        /// The destination, e.g. 10.244.1.0/24.
        destination: String,
        /// The route table (default: the main one).
        #[arg(long)]
        route_table: Option<String>,
    },
}

/// A resource with only `list`.
#[derive(Subcommand, Debug)]
pub enum ListOnly<A: clap::Args> {
    /// List them.
    List(A),
}

/// `-o`.
#[derive(ClapArgs, Debug)]
pub struct OutputArgs {
    /// table or json.
    #[arg(short, long, value_enum, default_value_t)]
    pub output: Output,
}

/// `instances list` flags.
#[derive(ClapArgs, Debug)]
pub struct InstanceListArgs {
    /// Only these states (repeatable or comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub state: Vec<String>,
    /// Only instances with tag KEY=VALUE (repeatable).
    #[arg(long)]
    pub tag: Vec<String>,
    /// table or json.
    #[arg(short, long, value_enum, default_value_t)]
    pub output: Output,
}

/// `instance ...`.
#[derive(Subcommand, Debug)]
pub enum InstanceCmd {
    /// Launch an instance.
    Run {
        /// The Name tag.
        #[arg(long)]
        name: Option<String>,
        /// Instance type (k1.small, k1.medium, k1.large, k1.xlarge).
        #[arg(long = "type")]
        instance_type: Option<String>,
        /// Zone (kumo-1a, kumo-1b, kumo-1c).
        #[arg(long)]
        zone: Option<String>,
        /// A file whose contents are the user data.
        #[arg(long)]
        user_data_file: Option<PathBuf>,
        /// A free address of the zone's subnet to take (default: the next free one).
        #[arg(long)]
        private_ip: Option<String>,
        /// Tags KEY=VALUE (repeatable).
        #[arg(long)]
        tag: Vec<String>,
    },
    /// Show one instance as JSON.
    Get {
        /// Instance id.
        id: String,
    },
    /// Stop a running instance.
    Stop {
        /// Instance id.
        id: String,
    },
    /// Start a stopped instance.
    Start {
        /// Instance id.
        id: String,
    },
    /// Terminate an instance.
    Terminate {
        /// Instance id.
        id: String,
    },
}

/// `volumes ...`.
#[derive(Subcommand, Debug)]
pub enum VolumeCmd {
    /// List the volumes.
    List {
        /// Only this zone's.
        #[arg(long)]
        zone: Option<String>,
        /// Only those attached to this instance.
        #[arg(long)]
        instance: Option<String>,
        /// table or json.
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// Create a volume.
    Create {
        /// Zone (kumo-1a, kumo-1b, kumo-1c).
        #[arg(long)]
        zone: String,
        /// Size in GiB.
        #[arg(long)]
        size_gib: u64,
        /// A name (a create of the same name again answers the same volume).
        #[arg(long)]
        name: Option<String>,
        /// Tags KEY=VALUE (repeatable).
        #[arg(long)]
        tag: Vec<String>,
    },
    /// Show one volume as JSON.
    Get {
        /// Volume id.
        id: String,
    },
    /// Attach a volume to an instance of its zone.
    Attach {
        /// Volume id.
        id: String,
        /// Instance id.
        instance: String,
    },
    /// Detach a volume.
    Detach {
        /// Volume id.
        id: String,
    },
    /// Grow a volume.
    Resize {
        /// Volume id.
        id: String,
        /// The new size in GiB.
        #[arg(long)]
        size_gib: u64,
    },
    /// Delete a volume that is not attached.
    Delete {
        /// Volume id.
        id: String,
    },
}

/// `policy ...`.
#[derive(Subcommand, Debug)]
pub enum PolicyCmd {
    /// Deny ACTION (e.g. CreateLoadBalancer, or '*', or 'Describe*').
    Deny {
        /// The action.
        action: String,
        /// Only for this access key id (default: every credential).
        #[arg(long)]
        credential: Option<String>,
    },
    /// Remove the deny statements of ACTION.
    Allow {
        /// The action.
        action: String,
        /// Only this access key id's statements.
        #[arg(long)]
        credential: Option<String>,
    },
    /// List the deny statements.
    List(OutputArgs),
}

/// `faults ...`.
#[derive(Subcommand, Debug)]
pub enum FaultsCmd {
    /// Inject latency and errors into an operation.
    Set {
        /// The operation (action name, or '*').
        #[arg(long)]
        operation: String,
        /// Added latency in milliseconds.
        #[arg(long, default_value_t = 0)]
        latency_ms: u64,
        /// Error rate in [0, 1].
        #[arg(long, default_value_t = 0.0)]
        error_rate: f64,
        /// ServiceUnavailable, RequestLimitExceeded or InternalError.
        #[arg(long, default_value = "ServiceUnavailable")]
        error_code: String,
    },
    /// Clear one operation's fault, or all.
    Clear {
        /// The operation (all when absent).
        #[arg(long)]
        operation: Option<String>,
    },
    /// List the faults.
    List(OutputArgs),
}

/// `quotas ...`.
#[derive(Subcommand, Debug)]
pub enum QuotasCmd {
    /// Show the quotas.
    Get,
    /// Change quotas.
    Set {
        /// Max instances not terminated.
        #[arg(long)]
        max_instances: Option<u32>,
        /// Max load balancers.
        #[arg(long)]
        max_load_balancers: Option<u32>,
        /// Max routes per route table.
        #[arg(long)]
        max_routes_per_table: Option<u32>,
        /// Max volumes.
        #[arg(long)]
        max_volumes: Option<u32>,
        /// Max GiB of all volumes together.
        #[arg(long)]
        max_volume_gib: Option<u64>,
    },
}

/// `access-keys ...`.
#[derive(Subcommand, Debug)]
pub enum KeysCmd {
    /// Create an access key (prints the secret once).
    Create {
        /// A name for it.
        name: String,
    },
    /// List the access keys.
    List,
}

fn tags(kv: &[String]) -> Result<std::collections::BTreeMap<String, String>, Error> {
    kv.iter()
        .map(|t| {
            t.split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .ok_or_else(|| Error::Config(format!("--tag '{t}': expected KEY=VALUE")))
        })
        .collect()
}

/// Prints rows as aligned columns, kubectl style.
fn table(header: &[&str], rows: Vec<Vec<String>>) {
    let mut w: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.len());
        }
    }
    let line = |cells: Vec<&str>| {
        let n = cells.len();
        let mut s = String::new();
        for (i, c) in cells.into_iter().enumerate() {
            if i + 1 == n {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<width$}   ", width = w[i]));
            }
        }
        println!("{}", s.trim_end());
    };
    line(header.to_vec());
    for r in &rows {
        line(r.iter().map(String::as_str).collect());
    }
}

fn json<T: serde::Serialize>(v: &T) -> Result<(), Error> {
    let s = serde_json::to_string_pretty(v).map_err(|e| Error::Decode(e.to_string()))?;
    println!("{s}");
    Ok(())
}

/// Where the client's configuration comes from, strongest first: the flags, then
/// `--cloud-config`, the `KUMO_CLOUD_*` variables, `--data-dir` (or
/// `$KUMO_CLOUD_DATA_DIR`), and `$HOME/.kumo/cloud`.
fn client(a: &Conn) -> Result<Client, Error> {
    let flags_complete = a.endpoint.is_some()
        && a.access_key_id.is_some()
        && a.secret_access_key.is_some()
        && a.ca_file.is_some();
    let dir = a.data_dir.as_deref();
    let mut cfg = if let Some(f) = &a.cloud_config {
        ClientConfig::from_file(f)?
    } else {
        let default =
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".kumo").join("cloud"));
        match ClientConfig::from_env_or_dir(dir) {
            Ok(c) => c,
            Err(_) if flags_complete => ClientConfig {
                endpoint: String::new(),
                ca_pem: String::new(),
                access_key_id: String::new(),
                secret_access_key: String::new(),
                timeout: Duration::from_secs(30),
            },
            Err(e) => match (&default, dir) {
                (Some(d), None) if d.join(crate::pki::ENDPOINT_FILE).exists() => {
                    ClientConfig::from_env_or_dir(Some(d))?
                }
                _ => return Err(e),
            },
        }
    };
    if let Some(v) = &a.endpoint {
        cfg.endpoint = v.clone();
    }
    if let Some(v) = &a.access_key_id {
        cfg.access_key_id = v.clone();
    }
    if let Some(v) = &a.secret_access_key {
        cfg.secret_access_key = v.clone();
    }
    if let Some(f) = &a.ca_file {
        cfg.ca_pem = std::fs::read_to_string(f)
            .map_err(|e| Error::Config(format!("{}: {e}", f.display())))?;
    }
    Client::new(cfg)
}

fn print_instance_line(verb: &str, i: &Instance) {
    println!("instance {} {verb} (state {})", i.id, i.state);
}

/// The cloud's data directory as the client commands find it (`--data-dir`, else
/// `$KUMO_CLOUD_DATA_DIR`, else `$HOME/.kumo/cloud`).
pub fn data_dir(conn: &Conn) -> Option<PathBuf> {
    conn.data_dir
        .clone()
        .or_else(|| std::env::var_os("KUMO_CLOUD_DATA_DIR").map(PathBuf::from))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".kumo").join("cloud")))
}

/// Runs `kumo cloud ...`.
pub async fn run(args: Args) -> Result<(), Error> {
    let conn = args.conn;
    let client = |_: ()| client(&conn);
    match args.command {
        Command::Exec { .. } => Err(Error::Config(
            "kumo cloud exec runs where the cloud's network is made: use the kumo binary".into(),
        )),
        Command::Serve {
            port,
            bind_address,
            transition_delay_ms,
        } => {
            let dir = match conn
                .data_dir
                .clone()
                .or_else(|| std::env::var_os(crate::client::env::DATA_DIR).map(PathBuf::from))
            {
                Some(d) => d,
                None => std::env::var_os("HOME")
                    .map(|h| PathBuf::from(h).join(".kumo").join("cloud"))
                    .ok_or_else(|| Error::Config("HOME is not set; pass --data-dir".to_owned()))?,
            };
            let mut cfg = CloudConfig::new(&dir);
            cfg.bind = std::net::SocketAddr::new(bind_address, port);
            cfg.transition_delay = Duration::from_millis(transition_delay_ms);
            let server = CloudServer::start(cfg).await.map_err(Error::Config)?;
            println!(
                "kumo cloud: region {REGION} serving on {} (state in {})",
                server.url,
                dir.display()
            );
            println!(
                "kumo cloud: endpoint {}, credentials {} (CA {})",
                server.endpoint_file.display(),
                server.credentials_file.display(),
                server.ca_file.display()
            );
            println!(
                "To use it:\n  kumo cloud --data-dir {} instances list",
                dir.display()
            );
            // Stop on Ctrl-C or SIGTERM; the state on disk is complete either way.
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .map_err(|e| Error::Config(e.to_string()))?;
            tokio::select! {
                r = tokio::signal::ctrl_c() => r.map_err(|e| Error::Config(e.to_string()))?,
                _ = term.recv() => {}
            }
            println!("kumo cloud: stopping");
            server.shutdown().await;
            Ok(())
        }
        Command::Instances {
            what: ListOnly::List(a),
        } => {
            let c = client(())?;
            let mut f = InstanceFilter::default();
            for s in &a.state {
                f.states.push(InstanceState::parse(s).ok_or_else(|| {
                    Error::Config(format!(
                        "--state '{s}': pending, running, stopping, stopped, shutting-down or terminated"
                    ))
                })?);
            }
            f.tags = tags(&a.tag)?;
            let list = c.list_instances(&f).await?;
            if a.output == Output::Json {
                return json(&list);
            }
            table(
                &[
                    "ID",
                    "NAME",
                    "STATE",
                    "TYPE",
                    "ZONE",
                    "PRIVATE-IP",
                    "PRIVATE-DNS",
                    "LAUNCHED",
                ],
                list.iter()
                    .map(|i| {
                        vec![
                            i.id.clone(),
                            none(&i.name),
                            i.state.to_string(),
                            i.instance_type.clone(),
                            i.zone.clone(),
                            none(&i.private_ip),
                            none(&i.private_dns_name),
                            i.launch_time.clone(),
                        ]
                    })
                    .collect(),
            );
            Ok(())
        }
        Command::Instance { what } => {
            let c = client(())?;
            match what {
                InstanceCmd::Run {
                    name,
                    instance_type,
                    zone,
                    user_data_file,
                    private_ip,
                    tag,
                } => {
                    let user_data = match user_data_file {
                        Some(f) => Some(
                            std::fs::read_to_string(&f)
                                .map_err(|e| Error::Config(format!("{}: {e}", f.display())))?,
                        ),
                        None => None,
                    };
                    let i = c
                        .run_instance(&RunInstanceRequest {
                            name,
                            instance_type,
                            zone,
                            subnet_id: None,
                            user_data,
                            private_ip_address: private_ip,
                            tags: tags(&tag)?,
                        })
                        .await?;
                    println!(
                        "instance {} launched in {} with private IP {} (state {})",
                        i.id, i.zone, i.private_ip, i.state
                    );
                }
                InstanceCmd::Get { id } => json(&c.describe_instance(&id).await?)?,
                InstanceCmd::Stop { id } => {
                    print_instance_line("stopping", &c.stop_instance(&id).await?)
                }
                InstanceCmd::Start { id } => {
                    print_instance_line("starting", &c.start_instance(&id).await?)
                }
                InstanceCmd::Terminate { id } => {
                    print_instance_line("terminating", &c.terminate_instance(&id).await?)
                }
            }
            Ok(())
        }
        Command::Lbs {
            what: ListOnly::List(a),
        } => {
            let list = client(())?.list_load_balancers().await?;
            if a.output == Output::Json {
                return json(&list);
            }
            table(
                &["ID", "NAME", "VIP", "DNS-NAME", "LISTENERS", "TARGETS"],
                list.iter()
                    .map(|l| {
                        let listeners: Vec<String> = l
                            .listeners
                            .iter()
                            .map(|x| {
                                format!("{}:{}/{}", x.port, x.target_port, x.protocol.as_str())
                            })
                            .collect();
                        let healthy = l
                            .targets
                            .iter()
                            .filter(|t| t.health == TargetHealthState::Healthy)
                            .count();
                        vec![
                            l.id.clone(),
                            l.name.clone(),
                            l.vip.clone(),
                            l.dns_name.clone(),
                            none(&listeners.join(",")),
                            format!("{healthy}/{} healthy", l.targets.len()),
                        ]
                    })
                    .collect(),
            );
            Ok(())
        }
        Command::Volumes { what } => {
            let c = client(())?;
            match what {
                VolumeCmd::List {
                    zone,
                    instance,
                    output,
                } => {
                    let f = VolumeFilter {
                        zone,
                        instance_id: instance,
                        ..VolumeFilter::default()
                    };
                    let list = c.list_volumes(&f).await?;
                    if output == Output::Json {
                        return json(&list);
                    }
                    table(
                        &[
                            "ID", "NAME", "ZONE", "SIZE", "STATE", "INSTANCE", "DEVICE", "CREATED",
                        ],
                        list.iter()
                            .map(|v| {
                                let (inst, dev) = v
                                    .attachment
                                    .as_ref()
                                    .map(|a| (a.instance_id.clone(), a.device.clone()))
                                    .unwrap_or_default();
                                vec![
                                    v.id.clone(),
                                    none(&v.name),
                                    v.zone.clone(),
                                    format!("{}Gi", v.size_gib),
                                    v.state.to_string(),
                                    none(&inst),
                                    none(&dev),
                                    v.created_time.clone(),
                                ]
                            })
                            .collect(),
                    );
                    Ok(())
                }
                VolumeCmd::Create {
                    zone,
                    size_gib,
                    name,
                    tag,
                } => json(
                    &c.create_volume(&CreateVolumeRequest {
                        name: name.unwrap_or_default(),
                        zone,
                        size_gib,
                        tags: tags(&tag)?,
                    })
                    .await?,
                ),
                VolumeCmd::Get { id } => json(&c.describe_volume(&id).await?),
                VolumeCmd::Attach { id, instance } => json(&c.attach_volume(&id, &instance).await?),
                VolumeCmd::Detach { id } => json(&c.detach_volume(&id, None).await?),
                VolumeCmd::Resize { id, size_gib } => json(&c.modify_volume(&id, size_gib).await?),
                VolumeCmd::Delete { id } => json(&c.delete_volume(&id).await?),
            }
        }
        Command::Routes {
            what:
                RouteCmd::Delete {
                    destination,
                    route_table,
                },
        } => {
            let c = client(())?;
            let table = match route_table {
                Some(t) => t,
                None => c.main_route_table().await?.id,
            };
            let r = c.delete_route(&table, &destination).await?;
            println!(
                "route {} -> {} deleted from {table}",
                r.destination_cidr, r.instance_id
            );
            Ok(())
        }
        Command::Routes {
            what: RouteCmd::List(a),
        } => {
            let tables = client(())?.list_route_tables().await?;
            if a.output == Output::Json {
                return json(&tables);
            }
            let mut rows = Vec::new();
            for t in &tables {
                for r in &t.routes {
                    rows.push(vec![
                        t.id.clone(),
                        r.destination_cidr.clone(),
                        if r.instance_id.is_empty() {
                            "local".to_owned()
                        } else {
                            r.instance_id.clone()
                        },
                        match r.state {
                            RouteState::Active => "active".to_owned(),
                            RouteState::Blackhole => "blackhole".to_owned(),
                        },
                        none(&r.name),
                    ]);
                }
            }
            table(
                &["ROUTE-TABLE", "DESTINATION", "TARGET", "STATE", "NAME"],
                rows,
            );
            Ok(())
        }
        Command::Policy { what } => {
            let c = client(())?;
            match what {
                PolicyCmd::Deny { action, credential } => {
                    let p = c.deny(&action, credential.as_deref()).await?;
                    println!(
                        "policy {}: deny {} to {}",
                        p.id,
                        p.action,
                        p.credential.as_deref().unwrap_or("every credential")
                    );
                }
                PolicyCmd::Allow { action, credential } => {
                    let gone = c.allow(&action, credential.as_deref()).await?;
                    if gone.is_empty() {
                        println!("no deny statement for {action}");
                    }
                    for p in gone {
                        println!("policy {} removed: {} allowed again", p.id, p.action);
                    }
                }
                PolicyCmd::List(a) => {
                    let ps = c.policies().await?;
                    if a.output == Output::Json {
                        return json(&ps);
                    }
                    table(
                        &["ID", "EFFECT", "ACTION", "CREDENTIAL"],
                        ps.into_iter()
                            .map(|p| {
                                vec![
                                    p.id,
                                    p.effect,
                                    p.action,
                                    p.credential.unwrap_or_else(|| "*".to_owned()),
                                ]
                            })
                            .collect(),
                    );
                }
            }
            Ok(())
        }
        Command::Faults { what } => {
            let c = client(())?;
            match what {
                FaultsCmd::Set {
                    operation,
                    latency_ms,
                    error_rate,
                    error_code,
                } => {
                    let f = c
                        .set_fault(
                            &operation,
                            &Fault {
                                latency_ms,
                                error_rate,
                                error_code,
                            },
                        )
                        .await?;
                    println!(
                        "fault on {operation}: +{} ms latency, error rate {} ({})",
                        f.latency_ms, f.error_rate, f.error_code
                    );
                }
                FaultsCmd::Clear { operation } => {
                    c.clear_faults(operation.as_deref()).await?;
                    match operation {
                        Some(op) => println!("fault on {op} cleared"),
                        None => println!("all faults cleared"),
                    }
                }
                FaultsCmd::List(a) => {
                    let fs = c.faults().await?;
                    if a.output == Output::Json {
                        return json(&fs);
                    }
                    table(
                        &["OPERATION", "LATENCY-MS", "ERROR-RATE", "ERROR-CODE"],
                        fs.into_iter()
                            .map(|(op, f)| {
                                vec![
                                    op,
                                    f.latency_ms.to_string(),
                                    f.error_rate.to_string(),
                                    f.error_code,
                                ]
                            })
                            .collect(),
                    );
                }
            }
            Ok(())
        }
        Command::Quotas { what } => {
            let c = client(())?;
            let q = match what {
                QuotasCmd::Get => c.quotas().await?,
                QuotasCmd::Set {
                    max_instances,
                    max_load_balancers,
                    max_routes_per_table,
                    max_volumes,
                    max_volume_gib,
                } => {
                    c.set_quotas(&UpdateQuotasRequest {
                        max_instances,
                        max_load_balancers,
                        max_routes_per_table,
                        max_volumes,
                        max_volume_gib,
                    })
                    .await?
                }
            };
            json(&q)
        }
        Command::AccessKeys { what } => {
            let c = client(())?;
            match what {
                KeysCmd::Create { name } => json(&c.create_access_key(&name).await?),
                KeysCmd::List => json(&c.list_access_keys().await?),
            }
        }
    }
}

fn none(s: &str) -> String {
    if s.is_empty() {
        "<none>".to_owned()
    } else {
        s.to_owned()
    }
}
