//! Plain UDP peers: a socket with a read timeout, and a sink in a namespace that counts what
//! arrives and from where.

use std::collections::HashSet;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::in_netns;

/// A socket bound to `addr` whose reads wait at most `timeout`.
pub fn bound(addr: &str, timeout: Duration) -> UdpSocket {
    let s = UdpSocket::bind(addr).unwrap_or_else(|e| panic!("bind {addr}: {e}"));
    s.set_read_timeout(Some(timeout)).unwrap();
    s
}

/// Counts the datagrams (and their sources) arriving at `addr` inside namespace `ns` until
/// `stop` is set; bound before this returns.
pub fn count_sink(
    ns: &str,
    addr: &str,
    stop: Arc<AtomicBool>,
) -> JoinHandle<(u64, HashSet<SocketAddr>)> {
    let (ns, addr) = (ns.to_owned(), addr.to_owned());
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        in_netns(&ns, move || {
            let s = UdpSocket::bind(&addr).unwrap_or_else(|e| panic!("bind {addr}: {e}"));
            s.set_read_timeout(Some(Duration::from_millis(200)))
                .unwrap();
            let _ = ready_tx.send(());
            let mut buf = [0u8; 2048];
            let (mut n, mut sources) = (0u64, HashSet::new());
            while !stop.load(Relaxed) {
                if let Ok((_, from)) = s.recv_from(&mut buf) {
                    n += 1;
                    sources.insert(from);
                }
            }
            (n, sources)
        })
    });
    let _ = ready_rx.recv_timeout(Duration::from_secs(10));
    h
}
