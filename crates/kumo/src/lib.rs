//! The parts of the `kumo` binary that tests use too: [`cluster`], the whole cluster
//! `kumo up` runs in one process.

pub mod cluster;
