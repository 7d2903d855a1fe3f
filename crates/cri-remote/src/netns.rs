//! Work inside a network namespace: a connection opened there stays there, whichever
//! thread uses it afterwards. What runs outside a node's namespace (the API server's
//! relay to a kubelet, a kubelet on the host) dials the node's pods and servers from a
//! short-lived thread that entered it first; a kubelet in its machine enters it for good.

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use nix::sched::CloneFlags;

/// Runs `f` on a thread of its own in network namespace `netns` (a bind-mounted
/// namespace such as `/run/netns/NAME`), or here when `None`.
pub fn run_in<T: Send + 'static>(
    netns: Option<&Path>,
    f: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    let Some(ns) = netns.map(Path::to_path_buf) else {
        return f();
    };
    std::thread::Builder::new()
        .name("netns".into())
        .spawn(move || {
            enter(&ns)?;
            f()
        })?
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("the thread in the namespace panicked")))
}

/// Moves the calling thread into network namespace `ns`; threads it starts afterwards are
/// born there too.
pub fn enter(ns: &Path) -> io::Result<()> {
    let file = std::fs::File::open(ns)
        .map_err(|e| io::Error::new(e.kind(), format!("opening {}: {e}", ns.display())))?;
    nix::sched::setns(&file, CloneFlags::CLONE_NEWNET).map_err(io::Error::from)
}

/// A TCP connection to `addr` opened in `netns`.
pub fn connect(netns: Option<&Path>, addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    run_in(netns, move || TcpStream::connect_timeout(&addr, timeout))
}
