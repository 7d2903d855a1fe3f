//! `kumo certs`: kubeadm's `certs check-expiration` and `certs renew` over a data
//! directory's PKI and kubeconfigs (see `kumo_apiserver::pki`). A running `kumo apiserver`
//! serves a renewed serving certificate within a second; a component reads its renewed
//! kubeconfig when it (re)starts.

use std::path::{Path, PathBuf};

use anyhow::Result;
use clap::Subcommand;
use kumo_apiserver::pki;

/// The default data directory, as `kumo apiserver`'s.
const DEFAULT_DATA_DIR: &str = "/var/lib/kumo";

/// `kumo certs <command>`.
#[derive(Subcommand)]
pub enum Certs {
    /// Check certificates expiration for a kumo cluster.
    CheckExpiration {
        /// The data directory (certificates in <data-dir>/pki, kubeconfigs beside it).
        #[arg(long, default_value = DEFAULT_DATA_DIR)]
        data_dir: PathBuf,
    },
    /// Renew a certificate (or `all`) with the same subject and SANs, signed by the same
    /// CA.
    Renew {
        /// The certificate, by kubeadm's name, or all of them.
        #[arg(value_parser = renewable())]
        name: String,
        #[arg(long, default_value = DEFAULT_DATA_DIR)]
        data_dir: PathBuf,
    },
}

fn renewable() -> clap::builder::PossibleValuesParser {
    let mut names: Vec<&'static str> = pki::managed().iter().map(|m| m.name).collect();
    names.push("all");
    clap::builder::PossibleValuesParser::new(names)
}

/// Runs `kumo certs`, printing to stdout.
pub fn run(cmd: Certs) -> Result<()> {
    let out = match cmd {
        Certs::CheckExpiration { data_dir } => check_expiration(&data_dir)?,
        Certs::Renew { name, data_dir } => renew(&data_dir, &name)?,
    };
    print!("{out}");
    Ok(())
}

fn check_expiration(data_dir: &Path) -> Result<String> {
    Ok(pki::check_expiration(data_dir)?)
}

/// The lines kubeadm prints for `renew <name>` or `renew all`.
fn renew(data_dir: &Path, name: &str) -> Result<String> {
    let mut out = String::new();
    if name == "all" {
        for m in pki::managed() {
            out.push_str(&pki::renew(data_dir, m.name)?);
            out.push('\n');
        }
        out.push('\n');
        out.push_str(pki::RENEW_ALL_DONE);
        out.push('\n');
    } else {
        out.push_str(&pki::renew(data_dir, name)?);
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        certs: Certs,
    }

    #[test]
    fn names_are_kubeadms() {
        assert!(Cli::try_parse_from(["x", "renew", "apiserver"]).is_ok());
        assert!(Cli::try_parse_from(["x", "renew", "all", "--data-dir", "/d"]).is_ok());
        assert!(Cli::try_parse_from(["x", "renew", "etcd-server"]).is_err());
        assert!(Cli::try_parse_from(["x", "check-expiration"]).is_ok());
    }

    #[test]
    fn renew_all_prints_kubeadms_lines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (dns, ips) = pki::apiserver_sans(None, std::net::Ipv4Addr::LOCALHOST.into());
        pki::ensure(dir.path(), "https://127.0.0.1:6443", &dns, &ips).expect("pki");
        let out = renew(dir.path(), "all").expect("renew");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines[0],
            "certificate embedded in the kubeconfig file for the admin to use and for kubeadm itself renewed"
        );
        assert!(lines.contains(&"certificate for serving the Kubernetes API renewed"));
        assert_eq!(lines[lines.len() - 2], "");
        assert!(lines[lines.len() - 1].starts_with("Done renewing certificates."));
        let one = renew(dir.path(), "front-proxy-client").expect("renew");
        assert_eq!(one, "certificate for the front proxy client renewed\n");
    }
}
