//! CSI endpoints: gRPC over a Unix socket (`unix:///.../csi.sock`), as a container
//! orchestrator and a driver's sidecars reach the driver.

use std::path::{Path, PathBuf};

use tokio::net::{UnixListener, UnixStream};
use tokio_stream::wrappers::UnixListenerStream;
use tonic_csi::transport::{Channel, Endpoint, Server};

use crate::spec::{
    controller_client::ControllerClient, controller_server::ControllerServer,
    identity_client::IdentityClient, identity_server::IdentityServer, node_client::NodeClient,
    node_server::NodeServer,
};

/// An endpoint that cannot be reached or served.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Connecting to the socket failed.
    #[error("connecting to the CSI endpoint {path}: {source}")]
    Connect {
        /// The socket.
        path: PathBuf,
        /// Why.
        source: tonic_csi::transport::Error,
    },
    /// Binding the socket failed.
    #[error("serving the CSI endpoint {path}: {source}")]
    Bind {
        /// The socket.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The server stopped with an error.
    #[error("the CSI endpoint {path} failed: {source}")]
    Serve {
        /// The socket.
        path: PathBuf,
        /// Why.
        source: tonic_csi::transport::Error,
    },
}

/// A connection to a driver's socket with a client of each service (cheap to clone; calls
/// share the connection).
#[derive(Clone, Debug)]
pub struct Client {
    /// The socket.
    pub path: PathBuf,
    /// The identity service.
    pub identity: IdentityClient<Channel>,
    /// The controller service (a driver that has none answers `Unimplemented`).
    pub controller: ControllerClient<Channel>,
    /// The node service.
    pub node: NodeClient<Channel>,
}

impl Client {
    /// Connects to the socket at `path`.
    pub async fn connect(path: &Path) -> Result<Client, Error> {
        let p = path.to_path_buf();
        // The URI is not dialed: every connection goes to the socket.
        let channel = Endpoint::from_static("http://csi.sock")
            .connect_with_connector(tower::service_fn(move |_| {
                let p = p.clone();
                async move { UnixStream::connect(p).await }
            }))
            .await
            .map_err(|source| Error::Connect {
                path: path.to_path_buf(),
                source,
            })?;
        Ok(Client {
            path: path.to_path_buf(),
            identity: IdentityClient::new(channel.clone()),
            controller: ControllerClient::new(channel.clone()),
            node: NodeClient::new(channel),
        })
    }

    /// The driver's name (`GetPluginInfo`).
    pub async fn driver_name(&self) -> Result<String, tonic_csi::Status> {
        let info = self
            .identity
            .clone()
            .get_plugin_info(crate::spec::GetPluginInfoRequest {})
            .await?
            .into_inner();
        Ok(info.name)
    }
}

/// The services a driver serves; a driver without a controller (or node) service leaves
/// it out.
pub struct Services<I, C, N> {
    /// Identity (required).
    pub identity: I,
    /// Controller.
    pub controller: Option<C>,
    /// Node.
    pub node: Option<N>,
}

/// Serves `services` on a Unix socket at `path` (a stale socket file is replaced) until
/// `shutdown` completes; the socket is removed at the end.
pub async fn serve<I, C, N>(
    path: &Path,
    services: Services<I, C, N>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), Error>
where
    I: crate::spec::identity_server::Identity,
    C: crate::spec::controller_server::Controller,
    N: crate::spec::node_server::Node,
{
    let bind = |source| Error::Bind {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(bind)?;
    }
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(bind(e)),
        _ => {}
    }
    let listener = UnixListener::bind(path).map_err(bind)?;
    let router = Server::builder()
        .add_service(IdentityServer::new(services.identity))
        .add_optional_service(services.controller.map(ControllerServer::new))
        .add_optional_service(services.node.map(NodeServer::new));
    let out = router
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
        .await
        .map_err(|source| Error::Serve {
            path: path.to_path_buf(),
            source,
        });
    let _ = std::fs::remove_file(path);
    out
}
