//! Reaching the API from another network namespace (a test's or a soak's nodes, each in a
//! namespace of its own): a loopback listener inside that namespace relays every connection
//! to the API's address outside it.

use std::net::SocketAddr;

use tokio::task::JoinHandle;

/// A listener on `127.0.0.1:<port>` inside the network namespace at `netns_path`
/// (`/var/run/netns/<name>`) whose connections are relayed to `target`; its address, and the
/// task serving it (abort it to stop). Needs the right to enter the namespace (root).
pub async fn relay_from_netns(
    netns_path: &str,
    target: SocketAddr,
) -> std::io::Result<(SocketAddr, JoinHandle<()>)> {
    let path = netns_path.to_string();
    // Sockets keep the namespace they were created in: bind on a thread that entered it.
    let listener = std::thread::spawn(move || -> std::io::Result<std::net::TcpListener> {
        let f = std::fs::File::open(&path)?;
        nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(|e| std::io::Error::other(format!("setns {path}: {e}")))?;
        std::net::TcpListener::bind("127.0.0.1:0")
    })
    .join()
    .map_err(|_| std::io::Error::other("the relay's binding thread panicked"))??;
    listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            tokio::spawn(async move {
                if let Ok(mut out) = tokio::net::TcpStream::connect(target).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                }
            });
        }
    });
    Ok((addr, task))
}
