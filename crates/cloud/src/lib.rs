//! `kumo cloud`: a small local cloud with its own HTTPS API.
//!
//! Region `kumo-1` with zones `kumo-1a/b/c`; a default VPC (10.0.0.0/16) with one /24
//! subnet per zone and private-IP management; instances (`i-` and 17 hex digits) with a
//! lifecycle driven by a [`Hypervisor`] the process owner provides; load balancers with a
//! VIP from 203.0.113.0/24 (TEST-NET-3, then other ranges that never route), listeners, targets and
//! health; one route table per VPC (destination CIDR → instance); fault injection (latency,
//! error rates), deny policies and quotas. State is a JSON snapshot plus a journal of changes.
//!
//! - [`server`] serves the API ([`CloudServer::start`]); [`server::ROUTES`] lists it.
//! - [`Client`] is the typed client, one method per operation; [`Error`] carries the
//!   cloud's code, message and `Retry-After`.
//! - [`state`] holds the rules (IPAM, lifecycle, validation) and persistence.
//! - [`cli`] is `kumo cloud ...`.
//!
//! Target health is derived from instance state until the network data plane probes for
//! real (see [`model::Target`]).

#![recursion_limit = "256"]

pub mod cli;
pub mod client;
pub mod error;
pub mod hypervisor;
pub mod journal;
pub mod model;
pub mod network;
pub mod openapi;
pub mod pki;
pub mod server;
pub mod state;

pub use client::{Client, ClientConfig, ClientConfigFile};
pub use error::{codes, ApiError, Error};
pub use hypervisor::{Hypervisor, HypervisorError, NoopHypervisor};
pub use model::*;
pub use network::{LbRoute, Network, NextHop, NoopNetwork};
pub use server::{CloudConfig, CloudServer};
