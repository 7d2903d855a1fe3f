//! `kumo`: one binary, one subcommand per component.

mod bench;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "kumo",
    version,
    about = "Kubernetes and the cloud it runs on, on one machine"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the whole system (API server on the embedded store, controllers, cloud).
    Up,
    /// Benchmarks that measure kumo side by side with the reference.
    Bench {
        #[command(subcommand)]
        what: bench::Bench,
    },
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Up => {
            eprintln!(
                "kumo up is coming: the storage layer has landed; the API server, controllers \
                 and cloud follow (see the open issues)."
            );
            std::process::exit(2);
        }
        Command::Bench { what } => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            rt.block_on(bench::run(what))
        }
    }
}
