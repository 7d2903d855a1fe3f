//! The service (load balancer) controller.

use std::sync::Arc;

use kumo_controller_manager::informer::InformerFactory;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::Context;

/// Registers the controller's handlers on `factory` and starts its workers.
pub fn start(
    ctx: Arc<Context>,
    factory: &InformerFactory,
    stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let _ = (ctx, factory);
    let mut stop = stop;
    tokio::spawn(async move {
        let _ = stop.wait_for(|s| *s).await;
    })
}
