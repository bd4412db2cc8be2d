//! TLS towards the upstream server, with libpq's `sslmode` meanings: the
//! proxy sends SSLRequest itself and, on 'S', runs the handshake; on 'N'
//! it goes on in plaintext only under `prefer`.

use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::pki_types::{InvalidDnsNameError, ServerName};
use rustls::{ClientConfig, ClientConnection, Connection};

use super::server_cert_verifier::certificate_problem;
use super::tls_config::{self, TlsConfigError, Verify};
use super::tls_stream::TlsStream;
use super::upstream::{Upstream, UpstreamAddr};

/// An upstream TLS setting the proxy cannot honour.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamTlsError {
    #[error(
        "sslmode=allow is not supported for the upstream: use disable, prefer, \
         require, verify-ca or verify-full"
    )]
    AllowMode,
    #[error("unknown sslmode {0:?}: use disable, prefer, require, verify-ca or verify-full")]
    UnknownMode(String),
    #[error("upstream sslcert and sslkey go together: give both or neither")]
    HalfIdentity,
    #[error(
        "upstream TLS settings (sslmode={mode}) for the Unix socket {path}: \
         PostgreSQL offers no TLS on a local socket"
    )]
    UnixSocket { mode: &'static str, path: String },
    #[error(
        "sslmode={0} may not be used with sslrootcert=system: the system's roots vouch \
         for any host, so only verify-full (the default with it) checks the server"
    )]
    WeakModeWithSystemRoots(&'static str),
    #[error("upstream sslrootcert/sslcert given with sslmode=disable")]
    FilesWithDisable,
    #[error(transparent)]
    Files(#[from] TlsConfigError),
    #[error("upstream host {host:?} as a TLS server name")]
    ServerName {
        host: String,
        source: InvalidDnsNameError,
    },
}

/// libpq's sslmode values the proxy honours (`allow` is not one: it
/// would reconnect with TLS after a plaintext refusal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    pub fn parse(s: &str) -> Result<SslMode, UpstreamTlsError> {
        Ok(match s {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            "allow" => return Err(UpstreamTlsError::AllowMode),
            other => return Err(UpstreamTlsError::UnknownMode(other.to_owned())),
        })
    }

    /// As libpq spells it.
    pub fn name(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

/// The upstream TLS parameters as given: the `[upstream_tls]` table of
/// the configuration, overridden by the upstream URL's query.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct UpstreamTlsParams {
    /// disable, prefer (default), require, verify-ca, verify-full.
    pub sslmode: Option<String>,
    /// PEM roots to trust, or `system` for the operating system's store;
    /// absent: the system's store.
    pub sslrootcert: Option<PathBuf>,
    /// PEM client certificate (with `sslkey`) presented to the server.
    pub sslcert: Option<PathBuf>,
    pub sslkey: Option<PathBuf>,
    /// Send the host name in the handshake (libpq's `sslsni`, default on).
    pub sni: Option<bool>,
}

/// TLS towards the upstream, ready to use.
#[derive(Debug, Clone)]
pub struct UpstreamTls {
    pub mode: SslMode,
    config: Option<Handshake>,
}

/// What a TLS handshake with the upstream needs. The configuration is
/// rebuilt from the same files by [`UpstreamTls::reload`]; each
/// connection uses the latest that loaded.
#[derive(Debug, Clone)]
struct Handshake {
    config: Arc<ArcSwap<ClientConfig>>,
    name: ServerName<'static>,
    files: Files,
}

/// The settings the client configuration is built from.
#[derive(Debug, Clone)]
struct Files {
    verify: Verify,
    roots: Option<PathBuf>,
    identity: Option<(PathBuf, PathBuf)>,
    sni: bool,
}

impl Files {
    fn build(&self) -> Result<Arc<ClientConfig>, TlsConfigError> {
        let identity = self
            .identity
            .as_ref()
            .map(|(c, k)| (c.as_path(), k.as_path()));
        tls_config::client_config(self.verify, self.roots.as_deref(), identity, self.sni)
    }
}

/// The SSLRequest packet: length 8, code 80877103.
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];

impl UpstreamTls {
    /// No TLS: plaintext always.
    pub fn disabled() -> Self {
        UpstreamTls {
            mode: SslMode::Disable,
            config: None,
        }
    }

    /// Builds the TLS settings for `addr`, loading every file now. The
    /// default mode is libpq's, `prefer` (`verify-full` with
    /// `sslrootcert=system`, the only mode allowed with it); a Unix socket never uses TLS
    /// (PostgreSQL offers none there), so a mode that requires it is
    /// refused. `sslmode=require` with a root file checks the chain, as
    /// libpq does.
    pub fn build(addr: &UpstreamAddr, p: &UpstreamTlsParams) -> Result<Self, UpstreamTlsError> {
        let system_roots = p.sslrootcert.as_deref() == Some(Path::new(tls_config::SYSTEM_ROOTS));
        let mode = match &p.sslmode {
            Some(m) => SslMode::parse(m)?,
            None if system_roots => SslMode::VerifyFull,
            None => SslMode::Prefer,
        };
        if system_roots && mode != SslMode::VerifyFull {
            return Err(UpstreamTlsError::WeakModeWithSystemRoots(mode.name()));
        }
        if p.sslcert.is_some() != p.sslkey.is_some() {
            return Err(UpstreamTlsError::HalfIdentity);
        }
        let host = match addr {
            UpstreamAddr::Unix(path) => {
                let files = p.sslrootcert.is_some() || p.sslcert.is_some();
                if matches!(mode, SslMode::Disable | SslMode::Prefer) && !files {
                    return Ok(UpstreamTls::disabled());
                }
                return Err(UpstreamTlsError::UnixSocket {
                    mode: mode.name(),
                    path: path.clone(),
                });
            }
            UpstreamAddr::Tcp(hostport) => host_of(hostport),
        };
        if mode == SslMode::Disable {
            if p.sslrootcert.is_some() || p.sslcert.is_some() {
                return Err(UpstreamTlsError::FilesWithDisable);
            }
            return Ok(UpstreamTls::disabled());
        }
        let verify = match mode {
            SslMode::VerifyFull => Verify::Full,
            SslMode::VerifyCa => Verify::Chain,
            SslMode::Require if p.sslrootcert.is_some() => Verify::Chain,
            _ => Verify::Nothing,
        };
        let files = Files {
            verify,
            roots: p.sslrootcert.clone(),
            identity: p.sslcert.clone().zip(p.sslkey.clone()),
            sni: p.sni.unwrap_or(true),
        };
        let config = files.build()?;
        let name = ServerName::try_from(host.to_owned()).map_err(|source| {
            UpstreamTlsError::ServerName {
                host: host.to_owned(),
                source,
            }
        })?;
        Ok(UpstreamTls {
            mode,
            config: Some(Handshake {
                config: Arc::new(ArcSwap::new(config)),
                name,
                files,
            }),
        })
    }

    /// The client configuration a handshake starting now uses; `None`
    /// without TLS. The proxy's own connections to the upstream (the
    /// claims store) use it too.
    pub fn client_config(&self) -> Option<Arc<ClientConfig>> {
        self.config.as_ref().map(|h| h.config.load_full())
    }

    /// Whether a reload reads any file: a root file or a client
    /// certificate is configured.
    pub fn has_files(&self) -> bool {
        self.config
            .as_ref()
            .is_some_and(|h| h.files.roots.is_some() || h.files.identity.is_some())
    }

    /// Reads the root file and the client certificate and key again and,
    /// when all of them load, makes them what new upstream connections
    /// use. On an error nothing changes. Without TLS there is nothing to
    /// read.
    pub fn reload(&self) -> Result<(), TlsConfigError> {
        if let Some(h) = &self.config {
            h.config.store(h.files.build()?);
        }
        Ok(())
    }

    /// Negotiates TLS on a freshly connected upstream socket: SSLRequest,
    /// then the handshake on 'S'. Bounded by `timeout` per read.
    pub fn negotiate(&self, upstream: Upstream, timeout: Duration) -> io::Result<Upstream> {
        let (Some(handshake), Upstream::Tcp(sock)) = (&self.config, &upstream) else {
            return Ok(upstream);
        };
        sock.set_read_timeout(Some(timeout))?;
        sock.set_write_timeout(Some(timeout))?;
        let mut sock = sock.try_clone()?;
        sock.write_all(&SSL_REQUEST)?;
        let mut answer = [0u8; 1];
        sock.read_exact(&mut answer)?;
        let upstream = match answer[0] {
            b'S' => {
                let conn =
                    ClientConnection::new(handshake.config.load_full(), handshake.name.clone())
                        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                let tls = TlsStream::handshake(sock.try_clone()?, Connection::Client(conn), &[])
                    .map_err(|e| {
                        let why = certificate_problem(&e).unwrap_or_else(|| e.to_string());
                        io::Error::new(e.kind(), format!("TLS handshake with the server: {why}"))
                    })?;
                Upstream::Tls(Box::new(tls))
            }
            b'N' if self.mode == SslMode::Prefer => upstream,
            b'N' => {
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionRefused,
                    format!(
                        "the server does not accept TLS (sslmode={} requires it)",
                        self.mode.name()
                    ),
                ))
            }
            other => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("the server answered SSLRequest with byte {other:#04x}"),
                ))
            }
        };
        sock.set_read_timeout(None)?;
        sock.set_write_timeout(None)?;
        Ok(upstream)
    }
}

/// The host of `host:port` (`[v6]:port` too).
fn host_of(hostport: &str) -> &str {
    let host = match hostport.rsplit_once(':') {
        Some((h, port)) if !port.contains(']') => h,
        _ => hostport,
    };
    host.trim_start_matches('[').trim_end_matches(']')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_unknown_ones_are_refused() {
        assert_eq!(SslMode::parse("verify-full").unwrap(), SslMode::VerifyFull);
        assert!(SslMode::parse("allow").is_err());
        let err = SslMode::parse("verify_full").unwrap_err().to_string();
        assert!(err.contains("verify_full"), "{err}");
    }

    #[test]
    fn hosts_of_addresses() {
        assert_eq!(host_of("db.example.com:5432"), "db.example.com");
        assert_eq!(host_of("[::1]:5432"), "::1");
        assert_eq!(host_of("10.0.0.1:6000"), "10.0.0.1");
    }

    #[test]
    fn a_unix_socket_refuses_required_tls() {
        let unix = UpstreamAddr::Unix("/tmp/.s.PGSQL.5432".into());
        let none = UpstreamTlsParams::default();
        assert_eq!(
            UpstreamTls::build(&unix, &none).unwrap().mode,
            SslMode::Disable
        );
        let require = UpstreamTlsParams {
            sslmode: Some("require".into()),
            ..Default::default()
        };
        assert!(UpstreamTls::build(&unix, &require).is_err());
    }

    #[test]
    fn a_reload_trusts_the_new_roots_and_a_bad_file_keeps_the_old() {
        use crate::wire::client_stream::tests::{handshake, scratch, self_signed};
        let dir = scratch("upstream-tls");
        let root = dir.join("root.crt");
        let server_with = |tag: &str, (cert, key): (String, String)| {
            let (c, k) = (
                dir.join(format!("{tag}.crt")),
                dir.join(format!("{tag}.key")),
            );
            std::fs::write(&c, &cert).unwrap();
            std::fs::write(&k, key).unwrap();
            (tls_config::server_config(&c, &k).unwrap(), cert)
        };
        let (old_server, old_cert) = server_with("old", self_signed());
        let (new_server, new_cert) = server_with("new", self_signed());
        std::fs::write(&root, &old_cert).unwrap();
        let tls = UpstreamTls::build(
            &UpstreamAddr::Tcp("localhost:5432".into()),
            &UpstreamTlsParams {
                sslmode: Some("verify-full".into()),
                sslrootcert: Some(root.clone()),
                ..Default::default()
            },
        )
        .unwrap();
        assert!(tls.has_files());
        let shared = tls.clone(); // what the relay holds
        let trusts = |server: &Arc<rustls::ServerConfig>| {
            let config = shared.config.as_ref().unwrap().config.load_full();
            handshake(config, Arc::clone(server)).is_ok()
        };
        assert!(trusts(&old_server) && !trusts(&new_server));
        std::fs::write(&root, &new_cert).unwrap();
        tls.reload().unwrap();
        assert!(!trusts(&old_server) && trusts(&new_server));
        std::fs::write(&root, "no certificate here").unwrap();
        let err = format!("{:#}", tls.reload().unwrap_err());
        assert!(err.contains("root.crt"), "{err}");
        assert!(trusts(&new_server), "the last roots that loaded stay");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn unreadable_files_stop_the_build() {
        let tcp = UpstreamAddr::Tcp("db:5432".into());
        let p = UpstreamTlsParams {
            sslmode: Some("verify-full".into()),
            sslrootcert: Some("/nonexistent/root.crt".into()),
            ..Default::default()
        };
        let err = format!("{:#}", UpstreamTls::build(&tcp, &p).unwrap_err());
        assert!(err.contains("/nonexistent/root.crt"), "{err}");
        let half = UpstreamTlsParams {
            sslcert: Some("/x.crt".into()),
            ..Default::default()
        };
        assert!(UpstreamTls::build(&tcp, &half).is_err());
    }
}
