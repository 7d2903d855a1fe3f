//! The controller-manager's errors.

/// What can go wrong starting or running the controller-manager.
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
    /// A file named by a flag could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A bad flag value (the message is upstream's where it has one).
    #[error("{0}")]
    Flag(String),
    /// A call to the API server failed.
    #[error(transparent)]
    Kube(#[from] kube::Error),
    /// The serving certificate could not be made or used.
    #[error("serving certificate: {0}")]
    Tls(String),
    /// Listening on the secure port failed.
    #[error("listening on {addr}: {source}")]
    Listen {
        /// The address.
        addr: std::net::SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
    /// A controller's client could not be made (ServiceAccount token).
    #[error("{0}")]
    Client(String),
    /// This instance stopped being the leader (upstream exits then).
    #[error("leaderelection lost")]
    LeaderElectionLost,
}

/// Shorthand.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The API server's Status of a failed call, if it answered with one.
pub fn api_status(e: &kube::Error) -> Option<&kube::core::Status> {
    match e {
        kube::Error::Api(s) => Some(s),
        _ => None,
    }
}

/// `apierrors.IsNotFound`.
pub fn is_not_found(e: &kube::Error) -> bool {
    api_status(e).is_some_and(|s| s.reason == "NotFound" || (s.reason.is_empty() && s.code == 404))
}

/// `apierrors.IsAlreadyExists`.
pub fn is_already_exists(e: &kube::Error) -> bool {
    api_status(e).is_some_and(|s| s.reason == "AlreadyExists")
}

/// `apierrors.IsConflict`.
pub fn is_conflict(e: &kube::Error) -> bool {
    api_status(e).is_some_and(|s| s.reason == "Conflict" || (s.reason.is_empty() && s.code == 409))
}

/// `apierrors.IsMethodNotSupported`.
pub fn is_method_not_supported(e: &kube::Error) -> bool {
    api_status(e)
        .is_some_and(|s| s.reason == "MethodNotAllowed" || (s.reason.is_empty() && s.code == 405))
}

/// `apierrors.HasStatusCause(err, v1.NamespaceTerminatingCause)`.
pub fn namespace_terminating(e: &kube::Error) -> bool {
    api_status(e)
        .and_then(|s| s.details.as_ref())
        .is_some_and(|d| d.causes.iter().any(|c| c.reason == "NamespaceTerminating"))
}

/// The text client-go's errors print: the Status message for API errors.
pub fn message(e: &kube::Error) -> String {
    match api_status(e) {
        Some(s) if !s.message.is_empty() => s.message.clone(),
        _ => e.to_string(),
    }
}
