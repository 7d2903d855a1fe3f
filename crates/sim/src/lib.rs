//! kumo's simulated node. Nothing in it starts a process, pulls an image or sends a
//! packet; everything is modelled in the kumo process, and where the model ends the
//! simulator says so.
//!
//! - [`runtime`] `Sim`, a container runtime (kumo-cri's `Runtime`) whose containers run
//!   their command line in a simulated POSIX shell with busybox's utilities
//!   (`runtime/shell`), on simulated files (`runtime/fs`), with the image catalogue
//!   (`runtime/images`) saying which programs and images it has a model of, and the
//!   simulated registry (`runtime/registry`).
//! - [`servers`] what listens on a pod's ports: the catalogue's servers (agnhost's, nginx,
//!   httpd, the sample API server with [`sample_apiserver`], [`netexec`], [`guestbook`],
//!   [`agnhost_webhook`], [`mtls`]) and the HTTP they speak on in-memory connections.
//! - [`net`] the cluster's in-process data plane (pods, Service rules, node ports, load
//!   balancer VIPs) and [`dns`] the cluster DNS zone and resolver; [`network`] the pod
//!   network as a kubelet sees it (kumo-cri's `PodNetwork`) and the factory that gives a
//!   node its runtime and network.

pub mod agnhost_webhook;
pub mod dns;
pub mod guestbook;
pub mod mtls;
pub mod net;
pub mod netexec;
pub mod network;
pub mod runtime;
pub mod sample_apiserver;
pub mod sample_openapi;
pub mod servers;

pub use network::factory;
