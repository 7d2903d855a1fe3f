//! The parts of the `kumo` binary that tests use too: [`cluster`], the whole cluster
//! `kumo up` runs in one process, and [`hypervisor`], what makes its cloud's instances
//! nodes.

pub mod addons;
pub mod cluster;
pub mod clusterapi;
pub mod controlplane;
pub mod etcd;
pub mod hypervisor;
pub mod kubeadm;
pub mod kubeconfig;
pub mod machine;
pub mod storage;
