//! The controllers, one module each.

pub mod certificates;
pub mod clusterrole_aggregation;
pub mod cronjob;
pub mod daemonset;
pub mod deployment;
pub mod disruption;
pub mod endpoints;
pub mod endpointslice;
pub mod endpointslicemirroring;
pub mod garbagecollector;
pub mod job;
pub mod namespace;
pub mod nodeipam;
pub mod nodelifecycle;
pub mod podautoscaler;
pub mod podgc;
pub mod pvcprotection;
pub mod pvprotection;
pub mod replicaset;
pub mod resourcequota;
pub mod rootca;
pub mod serviceaccount;
pub mod statefulset;
pub mod tainteviction;
pub mod tokencleaner;
pub mod ttlafterfinished;
