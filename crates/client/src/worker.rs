//! The loop every controller runs: wait for the informers' caches, get its client, and
//! have workers take keys from its queue (client-go's WaitForNamedCacheSync and the
//! processNextWorkItem pattern of its sample controller).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::clients::{ClientBuilder, ClientSource};
use crate::workqueue::WorkQueue;

/// Waits for `synced` (the informers' initial lists); false if `stop` turned true first
/// (client-go's WaitForNamedCacheSync).
pub async fn wait_for_sync(
    stop: &mut watch::Receiver<bool>,
    synced: impl Future<Output = ()>,
) -> bool {
    tokio::select! {
        _ = synced => true,
        _ = stop.wait_for(|s| *s) => false,
    }
}

/// The client of the controller acting as ServiceAccount `name`, retried every 5 s until
/// it can be made; None if `stop` turned true first.
pub async fn client_for(
    clients: &ClientBuilder,
    name: &str,
    stop: &mut watch::Receiver<bool>,
) -> Option<ClientSource> {
    loop {
        match clients.client(name).await {
            Ok(c) => return Some(c),
            Err(e) => {
                tracing::error!(service_account = name, error = %e, "cannot create the controller's client")
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
            _ = stop.wait_for(|s| *s) => return None,
        }
    }
}

/// Why a sync did not finish.
#[derive(Debug)]
pub enum SyncError {
    /// A failure: retried after the queue's rate-limited delay.
    Failed(String),
    /// A write lost an optimistic-concurrency race (409 Conflict): routine, retried like a
    /// failure but logged at debug level, as upstream logs it only verbosely.
    Conflict(String),
    /// Not done yet: look again after this long (no failure counted).
    After(Duration),
}

impl From<kube::Error> for SyncError {
    fn from(e: kube::Error) -> Self {
        if crate::error::is_conflict(&e) {
            SyncError::Conflict(crate::error::message(&e))
        } else {
            SyncError::Failed(crate::error::message(&e))
        }
    }
}

/// [`run_workers`] for a controller `ctl` whose sync is a method of it: each call gets
/// the controller and the key (`|c, key| async move { c.sync(&key).await }`).
pub fn run_workers_of<C, F, Fut>(
    name: &'static str,
    queue: Arc<WorkQueue<String>>,
    workers: usize,
    stop: watch::Receiver<bool>,
    ctl: &Arc<C>,
    sync: F,
) -> Vec<JoinHandle<()>>
where
    C: Send + Sync + 'static,
    F: Fn(Arc<C>, String) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<(), SyncError>> + Send + 'static,
{
    let ctl = ctl.clone();
    run_workers(name, queue, workers, stop, move |key| {
        sync(ctl.clone(), key)
    })
}

/// Starts `workers` workers that take keys from `queue` and run `sync` on them (client-go's
/// processNextWorkItem: forget on success, rate-limited requeue on failure), and shuts the
/// queue down when `stop` turns true.
pub fn run_workers<F, Fut>(
    name: &'static str,
    queue: Arc<WorkQueue<String>>,
    workers: usize,
    mut stop: watch::Receiver<bool>,
    sync: F,
) -> Vec<JoinHandle<()>>
where
    F: Fn(String) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<(), SyncError>> + Send + 'static,
{
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let queue = queue.clone();
        let sync = sync.clone();
        tasks.push(tokio::spawn(async move {
            while let Some(key) = queue.get().await {
                match sync(key.clone()).await {
                    Ok(()) => queue.forget(&key),
                    Err(SyncError::After(d)) => queue.add_after(key.clone(), d),
                    Err(SyncError::Failed(e)) => {
                        tracing::warn!(controller = name, item = %key, error = %e, "sync failed; requeued");
                        queue.add_rate_limited(key.clone());
                    }
                    Err(SyncError::Conflict(e)) => {
                        tracing::debug!(controller = name, item = %key, error = %e, "conflict; requeued");
                        queue.add_rate_limited(key.clone());
                    }
                }
                queue.done(&key);
            }
        }));
    }
    tasks.push(tokio::spawn(async move {
        let _ = stop.wait_for(|s| *s).await;
        queue.shut_down();
    }));
    tasks
}
