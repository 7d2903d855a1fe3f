//! The scheduler's errors.

/// What can go wrong starting or running the scheduler.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kubeconfig could not be read or used.
    #[error("invalid kubeconfig {path}: {message}")]
    Kubeconfig {
        /// The file.
        path: String,
        /// Why.
        message: String,
    },
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

/// The text client-go's errors print: the Status message for API errors.
pub(crate) fn message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if !s.message.is_empty() => s.message.clone(),
        _ => e.to_string(),
    }
}

/// `apierrors.IsNotFound`.
pub(crate) fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.reason == "NotFound" || s.code == 404)
}
