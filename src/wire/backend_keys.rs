//! The backend keys a session's server sent: a CancelRequest naming one
//! is forwarded to the server, and ends what the session waits on before
//! the server's answer may go on (a claim), as it ends a statement.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::guard::WaitEnd;
use super::proxy::Proxy;
use super::upstream::Upstream;

/// One session's backend keys, and whether a cancel request for them
/// arrived while the session waited.
#[derive(Debug, Default)]
pub struct BackendKeys {
    sent: Mutex<Vec<(i32, Vec<u8>)>>,
    canceled: Arc<AtomicBool>,
}

impl BackendKeys {
    /// A key the server sent: cancel requests naming it reach the server
    /// and this session.
    pub fn record(&self, proxy: &Proxy, pid: i32, key: Vec<u8>) {
        proxy
            .cancel_keys
            .insert((pid, key.clone()), Arc::clone(&self.canceled));
        if let Ok(mut sent) = self.sent.lock() {
            sent.push((pid, key));
        }
    }

    /// The session ended: its keys reach nothing any more.
    pub fn forget(self, proxy: &Proxy) {
        for key in self.sent.into_inner().unwrap_or_default() {
            proxy.cancel_keys.remove(&key);
        }
    }

    /// What ends a wait the session starts now: `server` closing, or a
    /// cancel request arriving from now on (one that came earlier was for
    /// what the server ran, and the server had it).
    pub fn wait_ends(&self, server: Arc<Upstream>) -> WaitEnds {
        self.canceled.store(false, Ordering::SeqCst);
        WaitEnds {
            server,
            canceled: Arc::clone(&self.canceled),
        }
    }
}

/// What ends one wait of a session's (see [`BackendKeys::wait_ends`]).
#[derive(Clone)]
pub struct WaitEnds {
    server: Arc<Upstream>,
    canceled: Arc<AtomicBool>,
}

impl WaitEnds {
    /// Why the wait ends now, if it does.
    pub fn now(&self) -> Option<WaitEnd> {
        if self.server.peer_closed() {
            Some(WaitEnd::ServerClosed)
        } else if self.canceled.load(Ordering::SeqCst) {
            Some(WaitEnd::Canceled)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};

    use super::*;
    use crate::wire::session::tests::proxy;

    #[test]
    fn a_cancel_request_reaches_the_server_and_ends_a_wait_begun_before_it() {
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = server.local_addr().unwrap();
        let proxy = proxy(addr);
        let upstream = Arc::new(Upstream::Tcp(TcpStream::connect(addr).unwrap()));
        let _backend = server.accept().unwrap();
        let keys = BackendKeys::default();
        keys.record(&proxy, 7, b"key1".to_vec());
        // Before the session waits: the server has the request, and the
        // wait that starts next does not end for it.
        proxy.forward_cancel(7, b"key1".to_vec());
        let (mut forwarded, _) = server.accept().unwrap();
        let mut request = [0; 16];
        forwarded.read_exact(&mut request).unwrap();
        assert_eq!(request[8..12], 7_i32.to_be_bytes());
        assert_eq!(&request[12..], b"key1");
        let ends = keys.wait_ends(Arc::clone(&upstream));
        assert_eq!(ends.now(), None);
        // Another key ends nothing; the session's own ends the wait.
        proxy.forward_cancel(7, b"key2".to_vec());
        assert_eq!(ends.now(), None);
        proxy.forward_cancel(7, b"key1".to_vec());
        assert_eq!(ends.now(), Some(WaitEnd::Canceled));
        keys.forget(&proxy);
        assert!(proxy.cancel_keys.is_empty());
    }
}
