//! The watch stream type shared by both backends.

use tokio::sync::mpsc;

use crate::{KeyValue, Result, Revision};

/// One change seen by a watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchEvent {
    /// The key was created or updated; `prev` is the value before (None on create, or when
    /// the previous value was compacted away).
    Put {
        kv: KeyValue,
        prev: Option<KeyValue>,
    },
    /// The key was deleted at `revision`; `prev` is the value it had.
    Delete {
        key: Vec<u8>,
        revision: Revision,
        prev: Option<KeyValue>,
    },
    /// Nothing under the watched prefix changed up to and including this revision
    /// (the API server turns it into a BOOKMARK).
    Progress(Revision),
}

impl WatchEvent {
    /// The revision this event is at.
    pub fn revision(&self) -> Revision {
        match self {
            WatchEvent::Put { kv, .. } => kv.mod_revision,
            WatchEvent::Delete { revision, .. } => *revision,
            WatchEvent::Progress(r) => *r,
        }
    }
}

/// A stream of [`WatchEvent`]s in revision order. Dropping it cancels the watch.
///
/// An `Err` item ends the stream (for example [`crate::StorageError::Compacted`] when the
/// watcher fell so far behind that the events it needs are gone).
pub struct WatchStream {
    rx: mpsc::Receiver<Result<WatchEvent>>,
    progress: mpsc::Sender<()>,
}

impl WatchStream {
    /// Builds a stream from its channels: events in, progress requests out.
    pub(crate) fn new(rx: mpsc::Receiver<Result<WatchEvent>>, progress: mpsc::Sender<()>) -> Self {
        WatchStream { rx, progress }
    }

    /// The next event; `None` once the watch has ended.
    pub async fn next(&mut self) -> Option<Result<WatchEvent>> {
        self.rx.recv().await
    }

    /// Asks for a [`WatchEvent::Progress`] carrying the current revision, delivered after
    /// every event up to that revision.
    pub async fn request_progress(&self) {
        // A full queue already holds a pending request, which answers this one too.
        let _ = self.progress.try_send(());
    }
}
