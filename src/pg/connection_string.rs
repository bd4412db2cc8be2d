//! The one reader of every PostgreSQL address the proxy accepts (the
//! upstream, `[claims] dsn`): the proxy's short forms (`host`,
//! `host:port`, a socket path) or what libpq accepts and the postgres
//! crate's `Config` reads (`postgres://` URLs, `key=value` parameters).
//! Text it cannot read is refused, named (its password masked), never
//! guessed at; `%`-escapes are decoded here, for every reader of them.

use std::sync::LazyLock;

use regex::Regex;

/// URL parameters the proxy reads itself (`upstream_url::url_tls_params`),
/// which the postgres crate's `Config` does not know or reads otherwise.
const PROXY_TLS_KEYS: &[&str] = &[
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "sslsni",
    "sslnegotiation",
];

/// `host`, `host:port`, `[v6]` or `[v6]:port`, an optional `?query`.
static SHORT_FORM: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^(?:[A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.%A-Za-z]+\])(?::[0-9]+)?(?:\?.*)?$")
        .unwrap_or_else(|e| unreachable!("constant pattern: {e}"))
});

/// A password in a URL's user info or a `password=` parameter.
static PASSWORD: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(://[^/?@:]*:)[^@/?]*@|(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)")
        .unwrap_or_else(|e| unreachable!("constant pattern: {e}"))
});

/// Why an address cannot be used: the text at fault (its password
/// masked) and what is wrong with it.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionStringError {
    #[error("upstream URL scheme {0:?} is not postgres://")]
    UpstreamScheme(String),
    #[error("upstream {0:?} names no host")]
    UpstreamHost(String),
    #[error("upstream {0:?} names more than one host: the proxy fronts one server")]
    UpstreamHosts(String),
    #[error(
        "upstream {0:?}: TLS settings of a key=value upstream go in [upstream_tls] \
         (or write the upstream as a postgres:// URL)"
    )]
    UpstreamKeyValueTls(String),
    #[error(
        "cannot read {text:?}: not host[:port], a socket path, a postgres:// URL \
         nor libpq key=value parameters"
    )]
    Unreadable {
        text: String,
        source: postgres::Error,
    },
    #[error("upstream sslsni must be 0 or 1, not {0:?}")]
    UpstreamSni(String),
    #[error(
        "upstream URL parameter {key}={value} is not supported by the proxy \
         (supported: sslmode, sslrootcert, sslcert, sslkey, sslsni)"
    )]
    UpstreamParameter { key: String, value: String },
    #[error("bad %-escape in upstream URL value {0:?}")]
    UpstreamEscape(String),
    #[error("upstream URL value {0:?} is not UTF-8")]
    UpstreamUtf8(String),
}

/// How the text was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// `postgres://…` (or a short form, read as one).
    Url,
    /// `host=… port=…`.
    KeyValue,
}

/// What a connection string says.
#[derive(Debug, Clone)]
pub struct ConnectionString {
    /// Everything but the URL parameters the proxy reads itself
    /// (`PROXY_TLS_KEYS`, a URL's only).
    pub config: postgres::Config,
    pub form: Form,
    /// Those parameters, `%`-decoded, in order.
    pub tls_params: Vec<(String, String)>,
}

/// Reads `spec`: `host`, `host:port` (with an optional `?query`), a
/// `postgres://`/`postgresql://` URL, or libpq `key=value` parameters.
/// A URL's TLS parameters are left to `upstream_url::url_tls_params`;
/// `key=value` text is read whole.
pub fn connection_string(spec: &str) -> Result<ConnectionString, ConnectionStringError> {
    let unreadable = |source| ConnectionStringError::Unreadable {
        text: masked(spec),
        source,
    };
    let url = match spec.split_once("://") {
        Some((scheme, _)) if scheme == "postgres" || scheme == "postgresql" => spec.to_owned(),
        Some((scheme, _)) if is_scheme(scheme) => {
            return Err(ConnectionStringError::UpstreamScheme(scheme.to_owned()))
        }
        _ if SHORT_FORM.is_match(spec) => format!("postgres://{spec}"),
        _ => {
            let config = spec.parse::<postgres::Config>().map_err(unreadable)?;
            return Ok(ConnectionString {
                config,
                form: Form::KeyValue,
                tls_params: Vec::new(),
            });
        }
    };
    let (rest, tls_params) = split_proxy_params(&url)?;
    let config = rest.parse::<postgres::Config>().map_err(unreadable)?;
    Ok(ConnectionString {
        config,
        form: Form::Url,
        tls_params,
    })
}

/// Letters, digits, `+`, `-`, `.`, starting with a letter (RFC 3986).
fn is_scheme(s: &str) -> bool {
    s.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// A URL without the query parameters in [`PROXY_TLS_KEYS`], and those
/// parameters (`%`-decoded; the rest is the postgres crate's to decode).
fn split_proxy_params(url: &str) -> Result<(String, Vec<(String, String)>), ConnectionStringError> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), Vec::new()));
    };
    let mut kept = Vec::new();
    let mut taken = Vec::new();
    for kv in query.split('&').filter(|kv| !kv.is_empty()) {
        let (key, value) = kv.split_once('=').unwrap_or((kv, ""));
        if PROXY_TLS_KEYS.contains(&key) {
            taken.push((key.to_owned(), percent_decode(value)?));
        } else {
            kept.push(kv);
        }
    }
    let rest = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((rest, taken))
}

/// `%XX` escapes of a URL query value, decoded; a bad escape or text that
/// is not UTF-8 is refused.
pub(super) fn percent_decode(s: &str) -> Result<String, ConnectionStringError> {
    let escapes_ok = s.split('%').skip(1).all(|after| {
        after
            .get(..2)
            .is_some_and(|hex| hex.bytes().all(|b| b.is_ascii_hexdigit()))
    });
    if !escapes_ok {
        return Err(ConnectionStringError::UpstreamEscape(s.to_owned()));
    }
    String::from_utf8(percent_encoding::percent_decode_str(s).collect())
        .map_err(|_| ConnectionStringError::UpstreamUtf8(s.to_owned()))
}

/// `spec` with any password in it replaced by `****`, for messages.
pub fn masked(spec: &str) -> String {
    PASSWORD
        .replace_all(spec, |c: &regex::Captures<'_>| match (c.get(1), c.get(2)) {
            (Some(userinfo), _) => format!("{}****@", userinfo.as_str()),
            (None, Some(key)) => format!("{}****", key.as_str()),
            (None, None) => String::new(),
        })
        .into_owned()
}

/// `postgres://[user@]address[/db]`, user and database percent-encoded:
/// the URL a client connects to through the proxy listening at `address`.
pub fn client_url(user: Option<&str>, address: &str, db: Option<&str>) -> String {
    use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
    let user = user
        .map(|u| format!("{}@", utf8_percent_encode(u, NON_ALPHANUMERIC)))
        .unwrap_or_default();
    let db = db
        .map(|d| format!("/{}", utf8_percent_encode(d, NON_ALPHANUMERIC)))
        .unwrap_or_default();
    format!("postgres://{user}{address}{db}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error_chain::chain;
    use postgres::config::Host;

    fn host_port(spec: &str) -> (Host, u16) {
        let c = connection_string(spec).unwrap().config;
        (c.get_hosts()[0].clone(), c.get_ports()[0])
    }

    #[test]
    fn short_forms_urls_and_key_values_read_alike() {
        let tcp = |h: &str| Host::Tcp(h.into());
        assert_eq!(host_port("db"), (tcp("db"), 5432));
        assert_eq!(host_port("127.0.0.1:5433"), (tcp("127.0.0.1"), 5433));
        assert_eq!(host_port("[::1]:6000"), (tcp("::1"), 6000));
        assert_eq!(host_port("db?sslmode=require"), (tcp("db"), 5432));
        assert_eq!(host_port("host=db port=7000"), (tcp("db"), 7000));
        let url = connection_string(
            "postgres://app%40x:s%3Acret@db.internal:6000/check%20points?sslmode=verify-full\
             &sslrootcert=/ca.pem&application_name=x",
        )
        .unwrap();
        assert_eq!(url.form, Form::Url);
        assert_eq!(
            url.tls_params,
            [
                ("sslmode".to_owned(), "verify-full".to_owned()),
                ("sslrootcert".to_owned(), "/ca.pem".to_owned())
            ]
        );
        let c = &url.config;
        assert_eq!(c.get_user(), Some("app@x"));
        assert_eq!(c.get_password(), Some(&b"s:cret"[..]));
        assert_eq!(c.get_dbname(), Some("check points"));
        assert_eq!(c.get_application_name(), Some("x"));
        let kv = connection_string("host=/run/pg port=5433 user=rg dbname=ck").unwrap();
        assert_eq!(kv.form, Form::KeyValue);
        assert_eq!(kv.config.get_hosts(), &[Host::Unix("/run/pg".into())]);
    }

    #[test]
    fn what_cannot_be_read_is_refused_by_name() {
        for typo in [
            "postgres//127.0.0.1:57301",
            "postgres:/127.0.0.1:57301/app",
            "127.0.0.1:port",
            "host=db prot=5432",
            "postgres://db/app?frobnicate=1",
        ] {
            let err = connection_string(typo).unwrap_err();
            let text = chain(&err).to_string();
            assert!(text.contains(typo), "{typo}: {text}");
        }
        assert!(matches!(
            connection_string("mysql://db/x"),
            Err(ConnectionStringError::UpstreamScheme(_))
        ));
    }

    #[test]
    fn passwords_are_masked_in_messages() {
        assert_eq!(
            masked("postgres://rg:s3cr3t@db:5432/app?x=1"),
            "postgres://rg:****@db:5432/app?x=1"
        );
        assert_eq!(
            masked("host=db password='a b\\'c' user=rg"),
            "host=db password=**** user=rg"
        );
        assert_eq!(masked("postgres://rg@db/app"), "postgres://rg@db/app");
        let err = connection_string("postgres://rg:s3cr3t@db/app?bogus=1").unwrap_err();
        assert!(!chain(&err).to_string().contains("s3cr3t"));
    }

    #[test]
    fn client_urls_are_encoded() {
        assert_eq!(
            client_url(Some("app@x"), "127.0.0.1:6432", Some("ck")),
            "postgres://app%40x@127.0.0.1:6432/ck"
        );
        assert_eq!(
            client_url(None, "127.0.0.1:6432", None),
            "postgres://127.0.0.1:6432"
        );
    }
}
