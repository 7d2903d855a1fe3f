//! Differential tests: a corpus of API requests (files under `corpus/`) replayed against two
//! API servers, with volatile fields normalised, and a report of every difference in status
//! code, Status reason, body and the headers that matter (`Content-Type`, `Warning`).
//!
//! ```no_run
//! # async fn f() -> anyhow::Result<()> {
//! use kumo_difftest::{run_corpus, Side, DEFAULT_CORPUS};
//! let left = Side::from_kubeconfig("reference", "/tmp/ref/admin.kubeconfig".as_ref()).await?;
//! let right = Side::from_kubeconfig("kumo", "/tmp/kumo/admin.kubeconfig".as_ref()).await?;
//! let report = run_corpus(&left, &right, DEFAULT_CORPUS.as_ref(), None).await?;
//! print!("{report}");
//! assert!(report.is_empty());
//! # Ok(()) }
//! ```
//!
//! The corpus format is in [`corpus`], the normalisation rules in [`normalize::RULES`];
//! docs/REFERENCE.md ("Differential tests") describes both.

pub mod corpus;
pub mod diff;
pub mod normalize;
pub mod report;
mod run;
mod side;

use std::path::Path;

pub use corpus::{load_corpus, CorpusError, RequestSpec, Scenario, WatchSpec};
pub use report::{Difference, Report, RequestReport, ScenarioError, SideId};
pub use run::{run_corpus, run_scenarios, RunError, COMPARED_HEADERS, DUMP_ENV, SCENARIO_LABEL};
pub use side::{Side, SideError, USER_AGENT};

/// The corpus in this repository.
pub const DEFAULT_CORPUS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/corpus");

/// `kumo difftest`: replays the corpus against the two kubeconfigs, prints the report and
/// returns whether it found no unexplained difference.
pub async fn run_cli(
    left: &Path,
    right: &Path,
    corpus: &Path,
    only: Option<&str>,
) -> anyhow::Result<bool> {
    let left = Side::from_kubeconfig("left", left).await?;
    let right = Side::from_kubeconfig("right", right).await?;
    let report = run_corpus(&left, &right, corpus, only).await?;
    print!("{report}");
    Ok(report.is_empty())
}
