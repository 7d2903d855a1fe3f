//! What client-go gives a Kubernetes component, for kumo's components (the
//! controller-manager, the scheduler, the kubelet, the proxy, the cloud-controller-manager):
//! shared informers with their caches and handlers ([`informer`], `tools/cache`), the
//! rate-limited deduplicating [`workqueue`] and the [`worker`] loop around it, leader
//! election on Leases ([`leader`], `tools/leaderelection`), the event recorder ([`events`],
//! `tools/record`), the secure health endpoint ([`healthz`]), and clients built from a
//! kubeconfig or from ServiceAccount tokens ([`clients`]). No controller lives here.

pub mod clients;
pub mod delegated;
pub mod error;
pub mod events;
pub mod healthz;
pub mod informer;
pub mod leader;
pub mod metrics;
pub mod worker;
pub mod workqueue;

pub use error::{Error, Result};
