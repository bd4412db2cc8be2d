//! The embedded default: a PostgreSQL server the proxy starts itself from
//! the installed server binaries, on loopback, in a data directory it owns.
//! PostgreSQL refuses to run as root, so when the proxy is root the server
//! runs as the `postgres` system user.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};

use serde::{Deserialize, Serialize};

use crate::error_chain::chain;
use crate::wire::upstream::UpstreamAddr;

/// `[managed]`: the local PostgreSQL `serve` starts when no upstream is
/// configured.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ManagedConfig {
    /// Whether `serve` with no upstream starts a local PostgreSQL (a
    /// development convenience); off: an upstream is required (the
    /// container image sets `RESUMEGUARD_MANAGED_ENABLED=false`).
    pub enabled: bool,
    /// Where the PostgreSQL server binaries live; absent: the newest
    /// `/usr/lib/postgresql/*/bin`.
    pub bin_dir: Option<PathBuf>,
    /// Data directory; absent: `<state_dir>/postgres`.
    pub data_dir: Option<PathBuf>,
    /// Loopback port for the managed server; 0 picks a free one.
    pub port: u16,
}

impl Default for ManagedConfig {
    fn default() -> Self {
        ManagedConfig {
            enabled: true,
            bin_dir: None,
            data_dir: None,
            port: 0,
        }
    }
}

/// Why the managed PostgreSQL could not be set up or started.
#[derive(Debug, thiserror::Error)]
pub enum ManagedPgError {
    #[error("creating {}", .path.display())]
    DataDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "no PostgreSQL server found under {} (install postgresql, or set upstream)",
        .root.display()
    )]
    NoServerDir {
        root: PathBuf,
        source: std::io::Error,
    },
    #[error("no PostgreSQL server binaries under /usr/lib/postgresql/*/bin")]
    NoServerBinaries,
    #[error("running {program:?}")]
    Spawn {
        program: OsString,
        source: std::io::Error,
    },
    #[error("{program:?} failed ({status}): {stderr}")]
    Failed {
        program: OsString,
        status: ExitStatus,
        stderr: String,
    },
    #[error("starting PostgreSQL (log: {})", .log.display())]
    Start {
        log: PathBuf,
        source: Box<ManagedPgError>,
    },
    /// A loopback port or the data directory's canonical path.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(
        "no managed PostgreSQL running ({} unreadable): start `resumeguard serve`, \
         or give --upstream or --store",
        .pid_file.display()
    )]
    NotRunning {
        pid_file: PathBuf,
        source: std::io::Error,
    },
    #[error("{} names no port and socket directory", .0.display())]
    PidFile(PathBuf),
}

pub struct ManagedPostgres {
    bin_dir: PathBuf,
    data_dir: PathBuf,
    as_postgres_user: bool,
    pub port: u16,
}

impl ManagedPostgres {
    /// Initializes the data directory if needed and starts the server.
    pub fn start(cfg: &ManagedConfig, state_dir: &Path) -> Result<Self, ManagedPgError> {
        let bin_dir = match &cfg.bin_dir {
            Some(d) => d.clone(),
            None => find_bin_dir()?,
        };
        let data_dir = cfg
            .data_dir
            .clone()
            .unwrap_or_else(|| state_dir.join("postgres"));
        std::fs::create_dir_all(&data_dir).map_err(|source| ManagedPgError::DataDir {
            path: data_dir.clone(),
            source,
        })?;
        let data_dir = data_dir.canonicalize()?;
        let as_postgres_user = running_as_root();
        let port = match cfg.port {
            0 => free_port()?,
            p => p,
        };
        let pg = ManagedPostgres {
            bin_dir,
            data_dir,
            as_postgres_user,
            port,
        };
        if as_postgres_user {
            run(Command::new("chown")
                .arg("-R")
                .arg("postgres:")
                .arg(&pg.data_dir))?;
            // The server must be able to reach its data directory.
            let mut dir = pg.data_dir.parent();
            while let Some(d) = dir {
                run(Command::new("chmod").arg("o+x").arg(d))?;
                dir = d.parent();
            }
        }
        if !pg.data_dir.join("PG_VERSION").exists() {
            tracing::info!(dir = %pg.data_dir.display(), "initializing managed PostgreSQL");
            pg.run_pg(
                "initdb",
                &[
                    "-D",
                    &pg.data_dir.to_string_lossy(),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "-E",
                    "UTF8",
                    "--no-instructions",
                ],
            )?;
        }
        let opts = format!(
            "-p {} -h 127.0.0.1 -k {}",
            pg.port,
            pg.data_dir.to_string_lossy()
        );
        let log = pg.data_dir.join("server.log");
        pg.run_pg(
            "pg_ctl",
            &[
                "-D",
                &pg.data_dir.to_string_lossy(),
                "-o",
                &opts,
                "-l",
                &log.to_string_lossy(),
                "-w",
                "start",
            ],
        )
        .map_err(|e| {
            // `pg_ctl -w` gave up (or was killed) but the postmaster may be
            // coming up anyway: stop it rather than leave it behind.
            if pg.data_dir.join("postmaster.pid").exists() {
                pg.stop();
            }
            ManagedPgError::Start {
                log: log.clone(),
                source: Box::new(e),
            }
        })?;
        tracing::info!(port = pg.port, "managed PostgreSQL started");
        Ok(pg)
    }

    /// The managed server is local: the relay reaches it over its Unix
    /// socket (cheaper than loopback TCP).
    pub fn socket(&self) -> UpstreamAddr {
        UpstreamAddr::Unix(format!(
            "{}/.s.PGSQL.{}",
            self.data_dir.to_string_lossy(),
            self.port
        ))
    }

    /// Stops the server (fast: open transactions roll back).
    pub fn stop(&self) {
        let dir = self.data_dir.to_string_lossy().into_owned();
        match self.run_pg("pg_ctl", &["-D", &dir, "-m", "fast", "-w", "stop"]) {
            Ok(()) => tracing::info!("managed PostgreSQL stopped"),
            Err(e) => tracing::warn!(error = %chain(&e), "stopping managed PostgreSQL failed"),
        }
    }

    fn run_pg(&self, tool: &str, args: &[&str]) -> Result<(), ManagedPgError> {
        let exe = self.bin_dir.join(tool);
        let mut cmd = if self.as_postgres_user {
            let mut c = Command::new("runuser");
            c.arg("-u").arg("postgres").arg("--").arg(&exe);
            c
        } else {
            Command::new(&exe)
        };
        cmd.args(args);
        run(&mut cmd)
    }
}

/// The socket of the managed server running in the state directory, read
/// from its `postmaster.pid` (port on line 4, socket directory on line 5):
/// operator commands reach the claims there.
pub fn running_socket(
    cfg: &ManagedConfig,
    state_dir: &Path,
) -> Result<UpstreamAddr, ManagedPgError> {
    let data_dir = cfg
        .data_dir
        .clone()
        .unwrap_or_else(|| state_dir.join("postgres"));
    let pid_file = data_dir.join("postmaster.pid");
    let text = match std::fs::read_to_string(&pid_file) {
        Ok(text) => text,
        Err(source) => return Err(ManagedPgError::NotRunning { pid_file, source }),
    };
    let lines: Vec<&str> = text.lines().collect();
    let port = lines.get(3).map(|l| l.trim()).unwrap_or_default();
    let dir = lines.get(4).map(|l| l.trim()).unwrap_or_default();
    if port.parse::<u16>().is_err() || dir.is_empty() {
        return Err(ManagedPgError::PidFile(pid_file));
    }
    Ok(UpstreamAddr::Unix(format!("{dir}/.s.PGSQL.{port}")))
}

/// Runs `cmd` to completion in a process group of its own, so a terminal's
/// Ctrl-C reaches the proxy (which stops the server in order) and not the
/// tools mid-way.
fn run(cmd: &mut Command) -> Result<(), ManagedPgError> {
    let out = cmd
        .process_group(0)
        .output()
        .map_err(|source| ManagedPgError::Spawn {
            program: cmd.get_program().to_owned(),
            source,
        })?;
    if !out.status.success() {
        return Err(ManagedPgError::Failed {
            program: cmd.get_program().to_owned(),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(())
}

/// The newest `/usr/lib/postgresql/<version>/bin` with a `postgres` in it.
fn find_bin_dir() -> Result<PathBuf, ManagedPgError> {
    let root = Path::new("/usr/lib/postgresql");
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir(root)
        .map_err(|source| ManagedPgError::NoServerDir {
            root: root.to_path_buf(),
            source,
        })?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("postgres").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, bin)| bin)
        .ok_or(ManagedPgError::NoServerBinaries)
}

fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|euid| euid == "0"))
        })
        .unwrap_or(false)
}

fn free_port() -> Result<u16, ManagedPgError> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_tool_is_reported_with_its_status_and_stderr() {
        let err =
            run(Command::new("sh").args(["-c", "echo 'no such role' >&2; exit 3"])).unwrap_err();
        match &err {
            ManagedPgError::Failed {
                program,
                status,
                stderr,
            } => {
                assert_eq!(program, "sh");
                assert_eq!(status.code(), Some(3));
                assert_eq!(stderr, "no such role");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            err.to_string(),
            "\"sh\" failed (exit status: 3): no such role"
        );
        let err = run(&mut Command::new("/no/such/initdb")).unwrap_err();
        assert!(
            matches!(&err, ManagedPgError::Spawn { source, .. }
                if source.kind() == std::io::ErrorKind::NotFound),
            "{err:?}"
        );
        assert!(chain(&err)
            .to_string()
            .starts_with("running \"/no/such/initdb\": "));
    }
}
