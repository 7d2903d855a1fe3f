//! The scheduler's errors.

/// What can go wrong starting or running the scheduler.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The client machinery failed (kubeconfig, serving, lease).
    #[error(transparent)]
    Client(#[from] kumo_client::Error),
    /// A call to the API server failed.
    #[error(transparent)]
    Kube(#[from] kube::Error),
    /// The secure port could not be served.
    #[error("serving: {0}")]
    Serve(String),
    /// This instance stopped being the leader (upstream exits then).
    #[error("leaderelection lost")]
    LeaderElectionLost,
}

/// Shorthand.
pub type Result<T, E = Error> = std::result::Result<T, E>;
