//! Test helpers: TCP fronts for the test server's Unix socket, so a test
//! can make the PostgreSQL output's database stall, go away and come back
//! (a restart or a failover, as the output sees it).

use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::pg::PgTarget;

/// The Unix socket the test server listens on.
pub fn unix_socket_of(server: &PgTarget) -> PathBuf {
    let shown = server.shown();
    let at = shown.split_once('@').map_or("", |(_, at)| at);
    let (dir, rest) = at.rsplit_once(':').unwrap_or_default();
    assert!(dir.starts_with('/'), "a Unix socket test server: {shown}");
    let port = rest.split('/').next().unwrap_or_default();
    Path::new(dir).join(format!(".s.PGSQL.{port}"))
}

/// Relay `client` to a new connection to `socket` until either side ends;
/// the server's end, or `None` when the server cannot be reached.
pub fn relay(client: TcpStream, socket: &Path) -> Option<UnixStream> {
    let server = UnixStream::connect(socket).ok()?;
    let (mut c_in, mut s_out) = (client.try_clone().ok()?, server.try_clone().ok()?);
    let (mut c_out, mut s_in) = (client, server.try_clone().ok()?);
    std::thread::spawn(move || std::io::copy(&mut c_in, &mut s_out));
    std::thread::spawn(move || std::io::copy(&mut s_in, &mut c_out));
    Some(server)
}

/// A front that relays every connection while it is up; taken down, it
/// ends the connections it relays and closes new ones at once.
pub struct PgFront {
    port: u16,
    up: Arc<AtomicBool>,
    relayed: Arc<Mutex<Vec<UnixStream>>>,
}

impl PgFront {
    pub fn new(server: &PgTarget) -> PgFront {
        let socket = unix_socket_of(server);
        let listener = TcpListener::bind("127.0.0.1:0").expect("a local port");
        let port = listener.local_addr().expect("its address").port();
        let up = Arc::new(AtomicBool::new(true));
        let relayed = Arc::new(Mutex::new(Vec::new()));
        let (accepting, relaying) = (Arc::clone(&up), Arc::clone(&relayed));
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                if !accepting.load(Ordering::SeqCst) {
                    continue;
                }
                if let Some(server) = relay(client, &socket) {
                    relaying
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(server);
                }
            }
        });
        PgFront { port, up, relayed }
    }

    /// `server`'s database and schema, reached through this front.
    pub fn target(&self, server: &PgTarget) -> PgTarget {
        let dsn = format!(
            "postgres://postgres@127.0.0.1:{}/postgres?sslmode=disable&connect_timeout=2",
            self.port
        );
        PgTarget::from_dsn(&dsn)
            .expect("the front's DSN")
            .with_schema(server.schema())
            .expect("the test schema")
    }

    /// The database goes away: its connections end, new ones are closed.
    pub fn down(&self) {
        self.up.store(false, Ordering::SeqCst);
        let mut relayed = self.relayed.lock().unwrap_or_else(PoisonError::into_inner);
        for server in relayed.drain(..) {
            let _ = server.shutdown(Shutdown::Both);
        }
    }

    /// The database is back.
    pub fn up(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}
