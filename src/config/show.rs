//! The configuration in effect as TOML, each value with where it was set
//! (`resumeguard config show`, the admin API's `GET /config`); secrets
//! (the admin token, passwords inside connection strings) are never shown.

use std::fmt::Write;

use serde_json::Value;

use super::{ConfigError, Layered};

/// What stands for a secret.
pub const REDACTED: &str = "(redacted)";

/// Keys whose whole value is a secret.
const SECRET_KEYS: &[&str] = &["admin.token"];

/// `layered` as a TOML document: top-level keys first, then one table per
/// section; every line ends in `# <source>`. An unset key is a comment.
pub fn render(layered: &Layered) -> Result<String, ConfigError> {
    let mut out = String::from(
        "# resumeguard configuration in effect (flag > environment > file > default)\n",
    );
    if let Some(f) = &layered.file {
        let _ = writeln!(out, "# file: {}", f.display());
    }
    let values = layered.values()?;
    let (top, sections): (Vec<_>, Vec<_>) = values.iter().partition(|(k, _)| !k.contains('.'));
    for (key, value) in &top {
        line(&mut out, key, key, value, layered);
    }
    let mut section = "";
    for (key, value) in &sections {
        let (name, field) = key.split_once('.').unwrap_or(("", key));
        if name != section {
            let _ = write!(out, "\n[{name}]\n");
            section = name;
        }
        line(&mut out, field, key, value, layered);
    }
    Ok(out)
}

fn line(out: &mut String, shown: &str, key: &str, value: &Value, layered: &Layered) {
    let source = layered.source(key);
    match redact(key, value) {
        Value::Null => {
            let _ = writeln!(out, "# {shown} is not set  # {source}");
        }
        v => {
            let _ = writeln!(out, "{shown} = {}  # {source}", toml_inline(&v));
        }
    }
}

/// `value` as shown: a secret key's value replaced, passwords inside
/// connection strings masked.
pub fn redact(key: &str, value: &Value) -> Value {
    match value {
        Value::Null => Value::Null,
        _ if SECRET_KEYS.contains(&key) => Value::String(REDACTED.to_owned()),
        Value::String(s) => Value::String(mask_password(s)),
        Value::Array(items) => Value::Array(items.iter().map(|v| redact(key, v)).collect()),
        other => other.clone(),
    }
}

/// A connection string with its password masked: the password of a URL's
/// user info (`postgres://u:SECRET@h`) and a `password=` setting (libpq
/// `key=value`, or a URL query parameter).
pub fn mask_password(s: &str) -> String {
    let mut out = s.to_owned();
    if let Some(scheme_end) = out.find("://") {
        let rest = scheme_end + 3;
        let authority_end = out[rest..]
            .find(['/', '?', '#'])
            .map_or(out.len(), |i| rest + i);
        if let Some(at) = out[rest..authority_end].rfind('@') {
            if let Some(colon) = out[rest..rest + at].find(':') {
                out.replace_range(rest + colon + 1..rest + at, REDACTED);
            }
        }
    }
    let lower = out.to_ascii_lowercase();
    let mut masked = String::with_capacity(out.len());
    let mut pos = 0;
    while let Some(i) = lower[pos..].find("password=") {
        let start = pos + i + "password=".len();
        let end = out[start..]
            .find([' ', '&', '\t'])
            .map_or(out.len(), |j| start + j);
        masked.push_str(&out[pos..start]);
        masked.push_str(REDACTED);
        pos = end;
    }
    masked.push_str(&out[pos..]);
    masked
}

/// A JSON value (of a configuration leaf) written as an inline TOML value.
fn toml_inline(v: &Value) -> String {
    match v {
        Value::String(s) => toml::Value::String(s.clone()).to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(toml_inline).collect();
            format!("[{}]", items.join(", "))
        }
        Value::Object(m) => {
            let items: Vec<String> = m
                .iter()
                .map(|(k, v)| format!("{} = {}", toml::Value::String(k.clone()), toml_inline(v)))
                .collect();
            format!("{{ {} }}", items.join(", "))
        }
        Value::Null => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_masked() {
        assert_eq!(
            mask_password("postgres://rg:s3cret@db:5432/app?sslmode=require"),
            "postgres://rg:(redacted)@db:5432/app?sslmode=require"
        );
        assert_eq!(
            mask_password("postgres://rg@db/app"),
            "postgres://rg@db/app"
        );
        assert_eq!(
            mask_password("host=db user=rg password=s3cret dbname=app"),
            "host=db user=rg password=(redacted) dbname=app"
        );
        assert_eq!(
            mask_password("postgres://db/app?user=rg&password=s3cret&x=1"),
            "postgres://db/app?user=rg&password=(redacted)&x=1"
        );
        assert_eq!(mask_password("127.0.0.1:6432"), "127.0.0.1:6432");
    }

    #[test]
    fn the_admin_token_is_never_shown() {
        let v = Value::String("s3cret".into());
        assert_eq!(redact("admin.token", &v), Value::String(REDACTED.into()));
        assert_eq!(redact("claims.proxy_id", &v), v);
        assert_eq!(redact("admin.token", &Value::Null), Value::Null);
    }
}
