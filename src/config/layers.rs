//! The configuration in effect and where each of its values came from:
//! the defaults, then the file, then `RESUMEGUARD_*` environment variables,
//! then command-line flags (flag > environment > file > default). Every key
//! has its variable, `RESUMEGUARD_<SECTION>_<KEY>` (`RESUMEGUARD_LISTEN`
//! for a top-level key), found from the configuration's own structure (its
//! serialized defaults), so a key added to [`Config`] has one too.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::{Config, ConfigError};

/// Prefix of every configuration variable.
pub const ENV_PREFIX: &str = "RESUMEGUARD_";

/// The variable naming the configuration file (as `--config` does).
pub const CONFIG_FILE_VAR: &str = "RESUMEGUARD_CONFIG";

/// Suffix of a variable whose value is the content of the file it names
/// (`RESUMEGUARD_CLAIMS_DSN_FILE`), for secrets mounted as files.
pub const FILE_SUFFIX: &str = "_FILE";

/// Where a value in effect was set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Default,
    File(PathBuf),
    /// The variable's name.
    Env(String),
    /// The flag's name (`--listen`).
    Flag(String),
}

impl Source {
    /// Which wins when two set the same thing: the higher.
    fn rank(&self) -> u8 {
        match self {
            Source::Default => 0,
            Source::File(_) => 1,
            Source::Env(_) => 2,
            Source::Flag(_) => 3,
        }
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Default => f.write_str("default"),
            Source::File(p) => write!(f, "file {}", p.display()),
            Source::Env(v) => write!(f, "env {v}"),
            Source::Flag(n) => write!(f, "flag {n}"),
        }
    }
}

/// Settings given on the command line: each a key, its value and the flag.
#[derive(Debug, Clone, Default)]
pub struct Flags(Vec<(String, Value, String)>);

impl Flags {
    /// `key` (dotted: `claims.proxy_id`) set to `value` by `flag`.
    pub fn set(&mut self, key: &str, value: impl Into<Value>, flag: &str) {
        self.0.push((key.to_owned(), value.into(), flag.to_owned()));
    }
}

/// Where the configuration is read from: a file (or none) and the flags;
/// the environment is the process's, read at each [`Loader::load`].
#[derive(Debug, Clone, Default)]
pub struct Loader {
    pub file: Option<PathBuf>,
    pub flags: Flags,
}

impl Loader {
    /// The configuration file: the one given, else `RESUMEGUARD_CONFIG`.
    pub fn new(file: Option<PathBuf>, flags: Flags) -> Loader {
        let file = file.or_else(|| std::env::var_os(CONFIG_FILE_VAR).map(PathBuf::from));
        Loader { file, flags }
    }

    /// Reads the file and the environment now and layers them.
    pub fn load(&self) -> Result<Layered, ConfigError> {
        Config::layered(self.file.as_deref(), std::env::vars_os(), &self.flags)
    }
}

/// A configuration with the source of each of its values.
#[derive(Debug, Clone)]
pub struct Layered {
    pub config: Config,
    /// The file read, if any.
    pub file: Option<PathBuf>,
    /// Keys set above the defaults, by where.
    sources: BTreeMap<String, Source>,
    /// `RESUMEGUARD_*` variables that name no key (ignored, to be warned of).
    pub unknown_env: Vec<String>,
}

impl Layered {
    /// Where `key`'s value in effect came from.
    pub fn source(&self, key: &str) -> &Source {
        self.sources.get(key).unwrap_or(&Source::Default)
    }

    /// Every key of the configuration in effect with its value, in order.
    pub fn values(&self) -> Result<Vec<(String, Value)>, ConfigError> {
        Ok(leaves(
            &serde_json::to_value(&self.config).map_err(ConfigError::Layers)?,
        ))
    }

    /// The keys whose value in effect differs between `self` and `other`.
    pub fn changed(&self, other: &Layered) -> Result<Vec<String>, ConfigError> {
        let before: BTreeMap<String, Value> = self.values()?.into_iter().collect();
        Ok(other
            .values()?
            .into_iter()
            .filter(|(k, v)| before.get(k) != Some(v))
            .map(|(k, _)| k)
            .collect())
    }

    /// `self` with `keys` as `old` has them (value and source): the
    /// configuration in effect after a reload that could not apply them.
    pub fn keeping(self, old: &Layered, keys: &[String]) -> Result<Layered, ConfigError> {
        let mut tree = serde_json::to_value(&self.config).map_err(ConfigError::Layers)?;
        let old_values: BTreeMap<String, Value> = old.values()?.into_iter().collect();
        let mut sources = self.sources;
        for key in keys {
            if let Some(v) = old_values.get(key) {
                set(&mut tree, key, v.clone());
            }
            match old.sources.get(key) {
                Some(s) => sources.insert(key.clone(), s.clone()),
                None => sources.remove(key),
            };
        }
        Ok(Layered {
            config: serde_json::from_value(tree).map_err(ConfigError::Layers)?,
            sources,
            ..self
        })
    }

    /// What `serve` derives from other keys: the audit database in the
    /// state directory when none is named.
    pub fn for_serve(mut self) -> Layered {
        if self.config.audit.sqlite.is_none() {
            self.config.audit.sqlite = Some(self.config.audit_db());
        }
        self
    }
}

/// The variable of a key (dotted: `claims.lapse_ms`).
pub fn env_var(key: &str) -> String {
    format!("{ENV_PREFIX}{}", key.replace('.', "_").to_ascii_uppercase())
}

/// Every key of the configuration with its default, in order.
pub fn keys() -> Result<Vec<(String, Value)>, ConfigError> {
    Ok(leaves(&defaults()?))
}

fn defaults() -> Result<Value, ConfigError> {
    serde_json::to_value(Config::default()).map_err(ConfigError::Layers)
}

/// The leaves of a JSON tree by dotted path (tables are walked into,
/// everything else, arrays too, is a value).
fn leaves(v: &Value) -> Vec<(String, Value)> {
    fn walk(prefix: &str, v: &Value, out: &mut Vec<(String, Value)>) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    let path = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    walk(&path, v, out);
                }
            }
            other => out.push((prefix.to_owned(), other.clone())),
        }
    }
    let mut out = Vec::new();
    walk("", v, &mut out);
    out
}

/// Puts `value` at the dotted `key` of `tree`, making tables on the way.
fn set(tree: &mut Value, key: &str, value: Value) {
    let mut at = tree;
    let mut parts = key.split('.').peekable();
    while let Some(part) = parts.next() {
        if !at.is_object() {
            *at = Value::Object(Map::new());
        }
        let Value::Object(map) = at else { return };
        if parts.peek().is_none() {
            map.insert(part.to_owned(), value);
            return;
        }
        at = map.entry(part.to_owned()).or_insert(Value::Null);
    }
}

impl Config {
    /// The configuration from its layers: defaults, the file (if any),
    /// the `RESUMEGUARD_*` variables among `env`, then `flags`. A value that
    /// does not fit its key fails naming where it was set (the file and
    /// line, the variable, the flag).
    pub fn layered(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (OsString, OsString)>,
        flags: &Flags,
    ) -> Result<Layered, ConfigError> {
        let defaults = defaults()?;
        let mut merged = defaults.clone();
        let mut sources = BTreeMap::new();
        if let Some(path) = file {
            for (key, value) in leaves(&file_tree(path)?) {
                set(&mut merged, &key, value);
                sources.insert(key, Source::File(path.to_path_buf()));
            }
        }
        let (from_env, unknown_env) = env_values(&defaults, env)?;
        for (key, value, var) in from_env {
            set(&mut merged, &key, value);
            sources.insert(key, Source::Env(var));
        }
        for (key, value, flag) in &flags.0 {
            set(&mut merged, key, value.clone());
            sources.insert(key.clone(), Source::Flag(flag.clone()));
        }
        let mut config: Config = serde_json::from_value(merged).map_err(ConfigError::Layers)?;
        resolve_token_file(&mut config, &sources)?;
        Ok(Layered {
            config,
            file: file.map(Path::to_path_buf),
            sources,
            unknown_env,
        })
    }
}

/// The file's keys, checked against the configuration first (so a wrong
/// key or value is reported with its line).
fn file_tree(path: &Path) -> Result<Value, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let parse_error = |source| ConfigError::Parse {
        path: path.to_path_buf(),
        source,
    };
    toml::from_str::<Config>(&text).map_err(parse_error)?;
    let table: toml::Table = toml::from_str(&text).map_err(parse_error)?;
    serde_json::to_value(table).map_err(ConfigError::Layers)
}

/// A value from the environment with its key and variable.
type EnvValue = (String, Value, String);

/// The configuration variables among `env` as typed values, and the names
/// of the `RESUMEGUARD_*` variables that are no key's.
fn env_values(
    defaults: &Value,
    env: impl IntoIterator<Item = (OsString, OsString)>,
) -> Result<(Vec<EnvValue>, Vec<String>), ConfigError> {
    let by_var: BTreeMap<String, String> = leaves(defaults)
        .into_iter()
        .map(|(key, _)| (env_var(&key), key))
        .collect();
    let ours: BTreeMap<String, OsString> = env
        .into_iter()
        .filter_map(|(name, value)| Some((name.into_string().ok()?, value)))
        .filter(|(name, _)| name.starts_with(ENV_PREFIX) && name != CONFIG_FILE_VAR)
        .collect();
    let mut values = Vec::new();
    let mut unknown = Vec::new();
    for (var, raw) in &ours {
        let text = |raw: &OsString| {
            raw.clone()
                .into_string()
                .map_err(|_| ConfigError::EnvNotUtf8(var.clone()))
        };
        let (key, raw, from_file) = if let Some(key) = by_var.get(var) {
            (key, text(raw)?, false)
        } else if let Some(key) = var.strip_suffix(FILE_SUFFIX).and_then(|v| by_var.get(v)) {
            let plain = &var[..var.len() - FILE_SUFFIX.len()];
            if ours.contains_key(plain) {
                return Err(ConfigError::EnvTwice {
                    var: plain.to_owned(),
                });
            }
            (key, secret_file(var, Path::new(&text(raw)?))?, true)
        } else {
            unknown.push(var.clone());
            continue;
        };
        // A file's content is not repeated (it may be a secret).
        let value = typed(defaults, key, &raw).map_err(|reason| ConfigError::Env {
            var: var.clone(),
            value: (!from_file).then(|| raw.clone()),
            reason,
        })?;
        values.push((key.clone(), value, var.clone()));
    }
    Ok((values, unknown))
}

/// A secret's file, its trailing line end dropped.
fn secret_file(var: &str, path: &Path) -> Result<String, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::EnvFile {
        var: var.to_owned(),
        path: path.to_path_buf(),
        source,
    })?;
    Ok(text.trim_end_matches(['\n', '\r']).to_owned())
}

/// `raw` as the value `key` takes: the text itself if the key takes text
/// (so `RESUMEGUARD_CLAIMS_PROXY_ID=7` is the name "7"), else the text
/// read as a TOML value (`500`, `true`, `["^a$", "^b$"]`). Each reading is
/// tried on the configuration itself; the error is the last reading's.
fn typed(defaults: &Value, key: &str, raw: &str) -> Result<Value, serde_json::Error> {
    let fits = |value: &Value| {
        let mut probe = defaults.clone();
        set(&mut probe, key, value.clone());
        serde_json::from_value::<Config>(probe).map(drop)
    };
    let as_text = Value::String(raw.to_owned());
    let text_error = match fits(&as_text) {
        Ok(()) => return Ok(as_text),
        Err(e) => e,
    };
    let Some(as_toml) = toml_value(raw) else {
        return Err(text_error);
    };
    fits(&as_toml).map(|()| as_toml)
}

/// `raw` read as one TOML value (on one line), as JSON.
fn toml_value(raw: &str) -> Option<Value> {
    if raw.contains(['\n', '\r']) {
        return None;
    }
    let mut table: toml::Table = toml::from_str(&format!("v = {raw}")).ok()?;
    serde_json::to_value(table.remove("v")?).ok()
}

/// `[admin] token_file` read into the token. Both set: the higher layer's
/// wins; both in one layer is an error.
fn resolve_token_file(
    config: &mut Config,
    sources: &BTreeMap<String, Source>,
) -> Result<(), ConfigError> {
    let Some(path) = config.admin.token_file.clone() else {
        return Ok(());
    };
    if config.admin.token.is_some() {
        let rank = |key: &str| sources.get(key).map_or(0, Source::rank);
        match rank("admin.token").cmp(&rank("admin.token_file")) {
            std::cmp::Ordering::Greater => return Ok(()),
            std::cmp::Ordering::Equal => return Err(ConfigError::TokenTwice),
            std::cmp::Ordering::Less => {}
        }
    }
    let token = std::fs::read_to_string(&path).map_err(|source| ConfigError::TokenFile {
        path: path.clone(),
        source,
    })?;
    let token = token.trim_end_matches(['\n', '\r']);
    if token.is_empty() {
        return Err(ConfigError::EmptyTokenFile(path));
    }
    config.admin.token = Some(token.to_owned());
    Ok(())
}

#[cfg(test)]
mod tests;
