//! Throwaway certificates for tests, made with the `openssl` command at run time (nothing
//! secret is ever committed).

use std::path::Path;
use std::process::Command;

fn openssl(dir: &Path, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// A CA (`CN=<ca_name>`) and a serving certificate for DNS name `dns` signed by it, written
/// to `dir` as `ca.crt`/`ca.key` and `tls.crt`/`tls.key`. Returns the CA's PEM.
pub fn serving(dir: &Path, ca_name: &str, dns: &str) -> anyhow::Result<String> {
    let days = ["-days", "1"];
    let subj = format!("/CN={ca_name}");
    let mut ca = vec!["req", "-x509", "-newkey", "rsa:2048", "-nodes"];
    ca.extend(["-keyout", "ca.key", "-out", "ca.crt", "-subj", &subj]);
    ca.extend(days);
    openssl(dir, &ca)?;
    let cn = format!("/CN={dns}");
    openssl(
        dir,
        &[
            "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "tls.key", "-out", "tls.csr",
            "-subj", &cn,
        ],
    )?;
    std::fs::write(
        dir.join("ext.cnf"),
        format!("subjectAltName=DNS:{dns}\nextendedKeyUsage=serverAuth\n"),
    )?;
    let mut sign = vec![
        "x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
    ];
    sign.extend(["-CAcreateserial", "-out", "tls.crt", "-extfile", "ext.cnf"]);
    sign.extend(days);
    openssl(dir, &sign)?;
    Ok(std::fs::read_to_string(dir.join("ca.crt"))?)
}
