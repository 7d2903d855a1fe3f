//! `kumo scheduler`: flags named as kube-scheduler's.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use crate::{Config, Result, Scheduler};

/// Flags of `kumo scheduler`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Path to a kubeconfig with the API server's address and this component's credentials.
    #[arg(long)]
    pub kubeconfig: PathBuf,
    /// Take part in leader election (Lease kube-system/kube-scheduler) first.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1,
          default_missing_value = "true")]
    pub leader_elect: bool,
    /// The address /healthz is served on.
    #[arg(long, default_value = "127.0.0.1")]
    pub bind_address: IpAddr,
    /// The HTTPS port for /healthz (0: not served).
    #[arg(long, default_value_t = 10259)]
    pub secure_port: u16,
}

/// Runs the scheduler until it stops (an error when it loses the lease).
pub async fn run(args: Args) -> Result<()> {
    let mut cfg = Config::new(&args.kubeconfig);
    cfg.leader_elect = args.leader_elect;
    cfg.serve =
        (args.secure_port != 0).then(|| SocketAddr::new(args.bind_address, args.secure_port));
    let s = Scheduler::start(cfg).await?;
    match s.healthz_addr {
        Some(a) => println!("kumo scheduler: serving /healthz on https://{a}"),
        None => println!("kumo scheduler: started"),
    }
    s.wait().await
}
