//! What the relay counts, so a benchmark can tell how many round trips an
//! operation waited for and on whose connection: per connection, the
//! *turns* (a client's bytes arriving after the server last spoke: for a
//! request-response client, one round trip each) and the bytes each way,
//! summed per `application_name` (read from the client's StartupMessage).
//! `--stats-listen ADDR` answers every connection with the totals, one
//! line per name:
//!
//! ```text
//! name="resumeguard-claims" connections=4 turns=1234 bytes_up=98765 bytes_down=54321
//! ```

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};

/// The client's first bytes kept at most while looking for its startup
/// packet.
const SNIFF_LIMIT: usize = 16 * 1024;

/// Names kept apart at most; more are counted as one.
const MAX_NAMES: usize = 256;

/// Protocol codes in the first 8 bytes of a client's first messages.
const PROTOCOL_3_0: u32 = 196_608;
const SSL_REQUEST: u32 = 80_877_103;
const GSSENC_REQUEST: u32 = 80_877_104;
const CANCEL_REQUEST: u32 = 80_877_102;

/// Counters of one connection, or of every closed connection of a name.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub connections: u64,
    pub turns: u64,
    pub bytes_up: u64,
    pub bytes_down: u64,
}

impl Counts {
    fn add(&mut self, other: Counts) {
        self.connections += other.connections;
        self.turns += other.turns;
        self.bytes_up += other.bytes_up;
        self.bytes_down += other.bytes_down;
    }
}

/// Every connection's counters: those open, and the totals of those closed.
#[derive(Default)]
pub struct Registry {
    open: Mutex<Vec<Weak<Connection>>>,
    closed: Mutex<BTreeMap<String, Counts>>,
}

impl Registry {
    /// A new connection's counters, registered until the returned guard drops.
    pub fn open(self: &Arc<Self>) -> Tracked {
        let conn = Arc::new(Connection::default());
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.retain(|w| w.strong_count() > 0);
        open.push(Arc::downgrade(&conn));
        Tracked {
            conn,
            registry: Arc::clone(self),
        }
    }

    /// Totals per name over every connection so far, open or closed.
    pub fn totals(&self) -> BTreeMap<String, Counts> {
        // Both locks at once (closed first, as a closing connection takes
        // them), so a connection closing meanwhile is counted exactly once.
        let closed = self.closed.lock().unwrap_or_else(PoisonError::into_inner);
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out = closed.clone();
        for conn in open.iter().filter_map(Weak::upgrade) {
            add_named(&mut out, conn.name(), conn.counts());
        }
        out
    }

    /// `totals()` as the stats endpoint's text (names escaped).
    pub fn render(&self) -> String {
        let mut text = String::new();
        for (name, c) in self.totals() {
            let _ = writeln!(
                text,
                "name={name:?} connections={} turns={} bytes_up={} bytes_down={}",
                c.connections, c.turns, c.bytes_up, c.bytes_down
            );
        }
        text
    }
}

fn add_named(into: &mut BTreeMap<String, Counts>, name: &str, counts: Counts) {
    let key = if into.len() >= MAX_NAMES && !into.contains_key(name) {
        "(other names)"
    } else {
        name
    };
    into.entry(key.to_owned()).or_default().add(counts);
}

/// One connection's counters while it is open; folded into the closed
/// totals when dropped.
pub struct Tracked {
    pub conn: Arc<Connection>,
    registry: Arc<Registry>,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        let mut closed = self
            .registry
            .closed
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut open = self
            .registry
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        add_named(&mut closed, self.conn.name(), self.conn.counts());
        let me = Arc::as_ptr(&self.conn);
        open.retain(|w| w.as_ptr() != me);
    }
}

/// The counters of one relayed connection.
#[derive(Default)]
pub struct Connection {
    name: OnceLock<String>,
    sniffed: Mutex<Vec<u8>>,
    server_spoke_last: AtomicBool,
    started: AtomicBool,
    turns: AtomicU64,
    bytes_up: AtomicU64,
    bytes_down: AtomicU64,
}

impl Connection {
    /// Client bytes arrived: a turn if the server spoke last (or these are
    /// the first); the first bytes are searched for the application name.
    pub fn client_sent(&self, bytes: &[u8]) {
        self.bytes_up
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        let first = !self.started.swap(true, Ordering::Relaxed);
        if self.server_spoke_last.swap(false, Ordering::Relaxed) || first {
            self.turns.fetch_add(1, Ordering::Relaxed);
        }
        if self.name.get().is_none() {
            let mut seen = self.sniffed.lock().unwrap_or_else(PoisonError::into_inner);
            seen.extend_from_slice(bytes);
            let found = match startup_name(&seen) {
                Some(name) => Some(name),
                None if seen.len() > SNIFF_LIMIT => Some("(no startup packet)".to_owned()),
                None => None,
            };
            if let Some(name) = found {
                let _ = self.name.set(name);
                *seen = Vec::new();
            }
        }
    }

    /// Server bytes arrived.
    pub fn server_sent(&self, bytes: &[u8]) {
        self.bytes_down
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        self.server_spoke_last.store(true, Ordering::Relaxed);
    }

    fn name(&self) -> &str {
        self.name.get().map_or("(before startup)", String::as_str)
    }

    fn counts(&self) -> Counts {
        Counts {
            connections: 1,
            turns: self.turns.load(Ordering::Relaxed),
            bytes_up: self.bytes_up.load(Ordering::Relaxed),
            bytes_down: self.bytes_down.load(Ordering::Relaxed),
        }
    }
}

/// The `application_name` of the StartupMessage at the start of `buf`
/// (after any SSL or GSS encryption requests), `""` when it names none;
/// `None` while more bytes are needed.
pub fn startup_name(mut buf: &[u8]) -> Option<String> {
    loop {
        let (Some(len), Some(code)) = (be_u32(buf, 0), be_u32(buf, 4)) else {
            return None;
        };
        match code {
            SSL_REQUEST | GSSENC_REQUEST => buf = buf.get(8..)?,
            CANCEL_REQUEST => return Some("(cancel request)".to_owned()),
            PROTOCOL_3_0 => {
                let body = buf.get(8..usize::try_from(len).ok()?)?;
                return Some(application_name(body));
            }
            // The server accepted TLS (a record starts 0x16), or not PostgreSQL.
            _ => return Some("(encrypted or unknown)".to_owned()),
        }
    }
}

fn be_u32(buf: &[u8], at: usize) -> Option<u32> {
    let bytes: [u8; 4] = buf.get(at..at + 4)?.try_into().ok()?;
    Some(u32::from_be_bytes(bytes))
}

/// The value of `application_name` among a StartupMessage's NUL-ended
/// key/value pairs.
fn application_name(body: &[u8]) -> String {
    let mut fields = body.split(|b| *b == 0);
    while let (Some(key), Some(value)) = (fields.next(), fields.next()) {
        if key.is_empty() {
            break;
        }
        if key == b"application_name" {
            return String::from_utf8_lossy(value).into_owned();
        }
    }
    String::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn startup(pairs: &[(&str, &str)]) -> Vec<u8> {
        let mut body = PROTOCOL_3_0.to_be_bytes().to_vec();
        for (k, v) in pairs {
            body.extend_from_slice(k.as_bytes());
            body.push(0);
            body.extend_from_slice(v.as_bytes());
            body.push(0);
        }
        body.push(0);
        let mut msg = u32::try_from(body.len() + 4)
            .unwrap()
            .to_be_bytes()
            .to_vec();
        msg.extend(body);
        msg
    }

    #[test]
    fn the_name_is_read_after_an_ssl_request_and_only_when_whole() {
        let mut bytes = 8u32.to_be_bytes().to_vec();
        bytes.extend_from_slice(&SSL_REQUEST.to_be_bytes());
        bytes.extend(startup(&[("user", "u"), ("application_name", "inspector")]));
        assert_eq!(startup_name(&bytes[..bytes.len() - 3]), None);
        assert_eq!(startup_name(&bytes).as_deref(), Some("inspector"));
        assert_eq!(
            startup_name(&startup(&[("user", "u")])).as_deref(),
            Some("")
        );
    }

    #[test]
    fn a_turn_is_client_bytes_after_the_server_spoke() {
        let registry = Arc::new(Registry::default());
        let tracked = registry.open();
        let c = &tracked.conn;
        c.client_sent(&startup(&[("application_name", "app")]));
        c.server_sent(b"R");
        c.client_sent(b"Q1");
        c.client_sent(b"Q1 rest");
        c.server_sent(b"Z");
        c.client_sent(b"Q2");
        let open = registry.totals()["app"];
        assert_eq!((open.connections, open.turns, open.bytes_down), (1, 3, 2));
        drop(tracked);
        assert_eq!(registry.totals()["app"], open, "counted once after closing");
    }
}
