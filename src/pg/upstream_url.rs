//! The upstream as configured: `host:port`, a socket path or directory,
//! or a `postgres://` URL, whose TLS parameters are read and whose other
//! parameters are the clients' own.

use postgres::config::Host;

use super::connection_string::{
    connection_string, masked, percent_decode, ConnectionStringError, Form,
};
use crate::wire::upstream::UpstreamAddr;
use crate::wire::upstream_tls::UpstreamTlsParams;

/// The upstream from `host:port`, `host`, a `postgres://` URL, libpq
/// `key=value` parameters (all read by [`connection_string`]), or a Unix
/// socket: `unix:/path/.s.PGSQL.5432`, a socket directory
/// (`/var/run/postgresql`, port 5432), or a URL with `?host=/dir` (libpq's
/// spelling, port from the URL).
pub fn upstream_addr(spec: &str) -> Result<UpstreamAddr, ConnectionStringError> {
    if let Some(path) = spec.strip_prefix("unix:") {
        return Ok(UpstreamAddr::Unix(path.to_owned()));
    }
    if spec.starts_with('/') {
        return Ok(UpstreamAddr::Unix(socket_in(spec, "5432")));
    }
    let parsed = connection_string(spec)?;
    if parsed.form == Form::KeyValue && spec.contains("ssl") {
        return Err(ConnectionStringError::UpstreamKeyValueTls(masked(spec)));
    }
    address_of(&parsed.config, spec)
}

/// The one server `config` (read from `spec`) names: a TCP host and port,
/// or a socket directory's socket.
pub fn address_of(
    config: &postgres::Config,
    spec: &str,
) -> Result<UpstreamAddr, ConnectionStringError> {
    let c = config;
    let port = c.get_ports().first().copied().unwrap_or(5432);
    // A URL's empty host (`postgres://:6001/app?host=/tmp`) is no host.
    let hosts: Vec<&Host> = c
        .get_hosts()
        .iter()
        .filter(|h| !matches!(h, Host::Tcp(t) if t.is_empty()))
        .collect();
    match hosts.as_slice() {
        [Host::Unix(dir)] => Ok(UpstreamAddr::Unix(socket_in(
            &dir.display().to_string(),
            &port.to_string(),
        ))),
        [Host::Tcp(host)] if host.contains(':') => {
            Ok(UpstreamAddr::Tcp(format!("[{host}]:{port}")))
        }
        [Host::Tcp(host)] => Ok(UpstreamAddr::Tcp(format!("{host}:{port}"))),
        [] => Err(ConnectionStringError::UpstreamHost(masked(spec))),
        _ => Err(ConnectionStringError::UpstreamHosts(masked(spec))),
    }
}

/// Reads the TLS parameters of a `postgres://` URL's query into `p`. An
/// `ssl*` parameter the proxy does not implement is refused rather than
/// ignored; other parameters (application_name, ...) belong to clients.
pub fn url_tls_params(spec: &str, p: &mut UpstreamTlsParams) -> Result<(), ConnectionStringError> {
    let Some((_, query)) = spec.split_once("://").and_then(|(_, r)| r.split_once('?')) else {
        return Ok(());
    };
    for pair in query.split('&').filter(|kv| !kv.is_empty()) {
        let (key, raw) = pair.split_once('=').unwrap_or((pair, ""));
        let value = percent_decode(raw)?;
        match key {
            "sslmode" => p.sslmode = Some(value),
            "sslrootcert" => p.sslrootcert = Some(value.into()),
            "sslcert" => p.sslcert = Some(value.into()),
            "sslkey" => p.sslkey = Some(value.into()),
            "sslsni" => {
                p.sni = Some(match value.as_str() {
                    "1" => true,
                    "0" => false,
                    v => return Err(ConnectionStringError::UpstreamSni(v.to_owned())),
                })
            }
            "sslnegotiation" if value == "postgres" => {}
            k if k.starts_with("ssl") || k == "requiressl" => {
                return Err(ConnectionStringError::UpstreamParameter {
                    key: k.to_owned(),
                    value,
                })
            }
            _ => {}
        }
    }
    Ok(())
}

fn socket_in(dir: &str, port: &str) -> String {
    format!("{}/.s.PGSQL.{port}", dir.trim_end_matches('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_forms() {
        let tcp = |s: &str| UpstreamAddr::Tcp(s.into());
        let unix = |s: &str| UpstreamAddr::Unix(s.into());
        let forms = [
            ("127.0.0.1:5433", tcp("127.0.0.1:5433")),
            ("db", tcp("db:5432")),
            (
                "postgres://u:p@10.0.0.1:6000/app?sslmode=disable",
                tcp("10.0.0.1:6000"),
            ),
            ("postgresql://localhost/app", tcp("localhost:5432")),
            (
                "/var/run/postgresql/",
                unix("/var/run/postgresql/.s.PGSQL.5432"),
            ),
            ("unix:/tmp/.s.PGSQL.6000", unix("/tmp/.s.PGSQL.6000")),
            ("postgres://:6001/app?host=/tmp", unix("/tmp/.s.PGSQL.6001")),
        ];
        for (spec, want) in forms {
            assert_eq!(upstream_addr(spec).unwrap(), want, "{spec}");
        }
        assert!(upstream_addr("mysql://x").is_err());
        assert!(upstream_addr("postgres:///app").is_err());
    }
}
