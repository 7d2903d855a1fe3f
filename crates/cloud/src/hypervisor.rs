//! What runs an instance. The cloud keeps the records; the owner of the process provides
//! the [`Hypervisor`] that makes a running instance real (`kumo up` boots a kubelet for
//! each one). The cloud crate itself knows nothing about kubelets.

use async_trait::async_trait;

use crate::model::Instance;

/// Why a hypervisor could not boot or halt an instance.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct HypervisorError(pub String);

/// Boots and halts instances.
///
/// `boot` runs while the instance is `pending` and it becomes `running` when `boot`
/// returns `Ok` (`stopped` with reason `Server.InternalError` on `Err`). `halt` runs while
/// it is `stopping` or `shutting-down`; it becomes `stopped` or `terminated` afterwards
/// even if `halt` fails (the failure is logged). Calls for one instance never overlap.
/// At start the cloud boots every instance recorded as `running` or `pending` again, since
/// nothing of the previous process survives, and finishes interrupted halts.
#[async_trait]
pub trait Hypervisor: Send + Sync + 'static {
    /// Makes the instance run.
    async fn boot(&self, instance: &Instance) -> Result<(), HypervisorError>;
    /// Makes the instance stop running.
    async fn halt(&self, instance: &Instance) -> Result<(), HypervisorError>;
}

/// A hypervisor that does nothing: instances are records only.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoopHypervisor;

#[async_trait]
impl Hypervisor for NoopHypervisor {
    async fn boot(&self, _: &Instance) -> Result<(), HypervisorError> {
        Ok(())
    }
    async fn halt(&self, _: &Instance) -> Result<(), HypervisorError> {
        Ok(())
    }
}
