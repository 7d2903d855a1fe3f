//! kumo's API server: the Kubernetes v1.37 REST API over [`kumo_storage`].
//!
//! Layout, from the outside in:
//! * [`server`] — TLS listener (HTTP/1.1 and HTTP/2), one hyper service per connection;
//! * [`handler`] — routing of a request path to discovery, health, or a resource;
//! * [`rest`] — the generic verbs (create, get, list, watch, update, patch, delete) that
//!   every resource shares;
//! * [`registry`] — one strategy per resource: its names, scope, defaulting, validation,
//!   table columns and field selectors;
//! * [`pki`] — the cluster CA and certificates created at first start.
//!
//! Only this crate talks to storage (see ARCHITECTURE.md).

pub mod admission;
pub mod aggregator;
pub mod audit;
pub mod auth;
pub mod cache;
pub mod cel;
pub mod discovery;
pub mod fieldmanager;
pub mod handler;
pub mod identity;
pub mod masterleases;
pub mod metrics;
pub mod mirror;
pub mod negotiate;
pub mod omitempty;
pub mod openapi;
pub mod pki;
pub mod proxy;
pub mod registry;
pub mod resource_proxy;
pub mod rest;
pub mod server;
pub mod strategic;
pub mod streamtunnel;
pub mod time;
mod webhook_client;

pub use server::{ApiServer, ApiServerConfig};

/// The Kubernetes version this server implements.
pub const KUBERNETES_VERSION: &str = "v1.37.2";
