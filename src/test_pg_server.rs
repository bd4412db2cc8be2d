//! A real PostgreSQL for the unit tests of the claims store, the audit
//! trail and the layers above them (test builds only): `RESUMEGUARD_TEST_PG_DSN`, else
//! one server per test process started with `managed_pg` in a scratch
//! directory (stopped and removed by a watchdog once the process exits).
//! Each scratch store is a schema of its own, dropped afterwards.

use std::os::unix::process::CommandExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use crate::claims::ClaimStore;
use crate::config::shared_schema::SHARED_SCHEMA;
use crate::managed_pg::ManagedConfig;
use crate::managed_pg::ManagedPostgres;
use crate::pg::PgTarget;

fn server() -> &'static PgTarget {
    static SERVER: OnceLock<Result<PgTarget, String>> = OnceLock::new();
    let got = SERVER.get_or_init(|| match std::env::var("RESUMEGUARD_TEST_PG_DSN") {
        Ok(dsn) => PgTarget::from_dsn(&dsn).map_err(|e| format!("{e:#}")),
        Err(_) => start().map_err(|e| format!("{e:#}")),
    });
    match got {
        Ok(t) => t,
        Err(e) => panic!("no PostgreSQL for the claims tests: {e}"),
    }
}

fn start() -> Result<PgTarget, Box<dyn std::error::Error>> {
    let me = std::process::id();
    let dir = std::env::temp_dir().join(format!("resumeguard-claims-pg-{me}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let pg = ManagedPostgres::start(&ManagedConfig::default(), &dir)?;
    let shown = dir.display();
    // Stops the server (fast shutdown) and removes it once this process
    // is gone, however it ends.
    std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "while kill -0 {me} 2>/dev/null; do sleep 1; done; \
             kill -INT $(head -1 {shown}/postgres/postmaster.pid); sleep 3; rm -rf {shown}"
        ))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .spawn()?;
    Ok(PgTarget::from_upstream(
        Some("postgres://postgres@/postgres"),
        &pg.socket(),
    )?)
}

/// A store whose database nothing answers (a port nothing listens on):
/// every operation fails, as with the database down.
pub fn unreachable() -> ClaimStore {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let dsn = format!("host=127.0.0.1 port={port} user=rg dbname=claims connect_timeout=2");
    ClaimStore::connect(PgTarget::from_dsn(&dsn).expect("dsn"), SHARED_SCHEMA)
}

/// A scratch store: a schema of its own, dropped on drop.
pub struct PgSchema {
    target: PgTarget,
}

impl PgSchema {
    pub fn new(name: &str) -> PgSchema {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let tag: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '_'
                }
            })
            .collect();
        let schema = format!("rgtest_{tag}_{}_{n}", std::process::id());
        PgSchema {
            target: server()
                .clone()
                .with_schema(&schema)
                .expect("test schema name"),
        }
    }

    pub fn target(&self) -> &PgTarget {
        &self.target
    }

    /// A plain connection to the test server, as its administrator: what
    /// another tool (or an idle-session reaper) does beside the store.
    pub fn admin(&self) -> postgres::Client {
        self.target
            .config()
            .connect(postgres::NoTls)
            .expect("connect to the test server")
    }

    pub fn open(&self) -> ClaimStore {
        ClaimStore::open(self.target.clone(), SHARED_SCHEMA).expect("open PostgreSQL claim store")
    }
}

impl Drop for PgSchema {
    fn drop(&mut self) {
        if let Ok(mut c) = self.target.config().connect(postgres::NoTls) {
            let _ = c.batch_execute(&format!(
                "DROP SCHEMA IF EXISTS {} CASCADE",
                self.target.schema()
            ));
        }
    }
}
