//! What client-go gives a Kubernetes component, for kumo's components (the
//! controller-manager, the scheduler, the kubelet, the proxy, the cloud-controller-manager):
//! shared informers with their caches and handlers ([`informer`], `tools/cache`), the
//! rate-limited deduplicating [`workqueue`] and the [`worker`] loop around it, leader
//! election on Leases ([`leader`], `tools/leaderelection`), the event recorders
//! ([`events`], core/v1 as `tools/record`; [`events_v1`], events.k8s.io with series as
//! `tools/events`), the secure port with health and metrics ([`healthz`], [`metrics`],
//! [`delegated`] authentication and authorization), and clients built from a kubeconfig or
//! from ServiceAccount tokens ([`clients`]) over HTTP/2 as client-go's ([`transport`]). No
//! controller lives here.

pub mod clients;
pub mod delegated;
pub mod error;
pub mod events;
pub mod events_v1;
pub mod healthz;
pub mod informer;
pub mod leader;
pub mod metrics;
pub mod transport;
pub mod worker;
pub mod workqueue;

pub use error::{Error, Result};
