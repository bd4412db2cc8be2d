//! The password of the proxy's own connections to PostgreSQL (claims,
//! audit trail), read again at every connect so a rotated secret or a
//! short-lived token (RDS and Cloud SQL IAM) needs no restart: a
//! `[claims] password_command`'s output, a `[claims] password_file`, the
//! URL's password, `PGPASSWORD`, or the libpq password file, first found.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Longest a `password_command` may run.
pub const PASSWORD_COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// How often a running `password_command` is checked for its exit.
const COMMAND_POLL: Duration = Duration::from_millis(10);

/// Where the password comes from; never holds a secret read from a file
/// or a command (those are read at each connect).
#[derive(Clone, PartialEq, Eq)]
pub enum PasswordSource {
    /// Run at each connect; its standard output, trimmed, is the password.
    Command(String),
    /// Read at each connect; its content, trailing line end dropped.
    File(PathBuf),
    /// Given in the URL or DSN.
    Given(String),
    /// `PGPASSWORD`, else the libpq password file (`PGPASSFILE`,
    /// `~/.pgpass`), else none (the server may not ask for one).
    Ambient,
}

impl std::fmt::Debug for PasswordSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PasswordSource::Command(c) => write!(f, "Command({c:?})"),
            PasswordSource::File(p) => write!(f, "File({})", p.display()),
            PasswordSource::Given(_) => f.write_str("Given(..)"),
            PasswordSource::Ambient => f.write_str("Ambient"),
        }
    }
}

/// A password that could not be read. Never contains the password.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    #[error("claims.password_file {}", .path.display())]
    File {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("claims.password_file {} is empty", .0.display())]
    EmptyFile(PathBuf),
    #[error("claims.password_command {command:?} could not be run")]
    Spawn {
        command: String,
        source: std::io::Error,
    },
    #[error("claims.password_command {command:?} did not finish within {}s", .after.as_secs())]
    Timeout { command: String, after: Duration },
    #[error("claims.password_command {command:?} failed ({status}): {stderr}")]
    Failed {
        command: String,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("claims.password_command {0:?} printed no password")]
    Empty(String),
    #[error("claims.password_command {0:?} printed a password that is not UTF-8")]
    NotUtf8(String),
}

/// Which connection a password is for (the libpq password file is
/// matched against it).
pub struct ConnectingTo<'a> {
    pub host: &'a str,
    pub port: u16,
    pub db: &'a str,
    pub user: &'a str,
}

impl PasswordSource {
    /// The source configured: the command, else the file, else the
    /// URL's password, else the environment.
    pub fn choose(
        command: Option<&str>,
        file: Option<&Path>,
        given: Option<&[u8]>,
    ) -> PasswordSource {
        match (command, file, given) {
            (Some(c), _, _) => PasswordSource::Command(c.to_owned()),
            (None, Some(f), _) => PasswordSource::File(f.to_path_buf()),
            (None, None, Some(p)) => PasswordSource::Given(String::from_utf8_lossy(p).into()),
            (None, None, None) => PasswordSource::Ambient,
        }
    }

    /// The password now (`None`: none is configured anywhere).
    pub fn read(&self, to: &ConnectingTo<'_>) -> Result<Option<String>, CredentialError> {
        match self {
            PasswordSource::Command(c) => run_command(c, PASSWORD_COMMAND_TIMEOUT).map(Some),
            PasswordSource::File(path) => {
                let text =
                    std::fs::read_to_string(path).map_err(|source| CredentialError::File {
                        path: path.clone(),
                        source,
                    })?;
                let password = text.trim_end_matches(['\n', '\r']);
                if password.is_empty() {
                    return Err(CredentialError::EmptyFile(path.clone()));
                }
                Ok(Some(password.to_owned()))
            }
            PasswordSource::Given(p) => Ok(Some(p.clone())),
            // An empty PGPASSWORD is none, as libpq reads it.
            PasswordSource::Ambient => Ok(std::env::var("PGPASSWORD")
                .ok()
                .filter(|p| !p.is_empty())
                .or_else(|| pgpass_lookup(to))),
        }
    }

    /// Where the password comes from, as said in errors and logs.
    pub fn shown(&self) -> String {
        match self {
            PasswordSource::Command(_) => "claims.password_command".into(),
            PasswordSource::File(p) => format!("claims.password_file {}", p.display()),
            PasswordSource::Given(_) => "the URL's password".into(),
            PasswordSource::Ambient => "PGPASSWORD or the password file".into(),
        }
    }
}

/// Runs `command` with `sh -c`, no input; its standard output, trimmed, is
/// the password. A command still running after `timeout` is killed.
fn run_command(command: &str, timeout: Duration) -> Result<String, CredentialError> {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(command)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| CredentialError::Spawn {
            command: command.to_owned(),
            source,
        })?;
    // Drained on threads of their own: a command that writes more than a
    // pipe holds would otherwise never exit.
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let began = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if began.elapsed() < timeout => std::thread::sleep(COMMAND_POLL),
            Ok(None) | Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(CredentialError::Timeout {
                    command: command.to_owned(),
                    after: timeout,
                });
            }
        }
    };
    let out = stdout.join().unwrap_or_default();
    let err = stderr.join().unwrap_or_default();
    if !status.success() {
        let text = String::from_utf8_lossy(&err);
        let last = text.lines().rev().find(|l| !l.trim().is_empty());
        return Err(CredentialError::Failed {
            command: command.to_owned(),
            status,
            stderr: crate::log_text::escaped(last.unwrap_or("no message")).to_string(),
        });
    }
    let text = String::from_utf8(out).map_err(|_| CredentialError::NotUtf8(command.to_owned()))?;
    let password = text.trim();
    if password.is_empty() {
        return Err(CredentialError::Empty(command.to_owned()));
    }
    Ok(password.to_owned())
}

/// All a child's pipe gives until it closes, read on a thread of its own.
fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut out = Vec::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_end(&mut out);
        }
        out
    })
}

/// The libpq password file: `PGPASSFILE`, else `~/.pgpass`.
fn pgpass_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PGPASSFILE") {
        return Some(PathBuf::from(p));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".pgpass"))
}

fn pgpass_lookup(to: &ConnectingTo<'_>) -> Option<String> {
    let text = std::fs::read_to_string(pgpass_path()?).ok()?;
    // libpq matches a socket directory as "localhost".
    let host = if to.host.starts_with('/') {
        "localhost"
    } else {
        to.host
    };
    pgpass_match(&text, host, &to.port.to_string(), to.db, to.user)
}

/// The password of the first `host:port:db:user:password` line matching
/// (`*` matches anything; `\:` and `\\` are escapes).
fn pgpass_match(text: &str, host: &str, port: &str, db: &str, user: &str) -> Option<String> {
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .find_map(|line| {
            let fields = split_pgpass(line);
            let [h, p, d, u, pw] = <[String; 5]>::try_from(fields).ok()?;
            let m = |pat: &str, v: &str| pat == "*" || pat == v;
            (m(&h, host) && m(&p, port) && m(&d, db) && m(&u, user)).then_some(pw)
        })
}

fn split_pgpass(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let (Some(n), Some(last)) = (chars.next(), fields.last_mut()) {
                    last.push(n);
                }
            }
            ':' if fields.len() < 5 => fields.push(String::new()),
            c => {
                if let Some(last) = fields.last_mut() {
                    last.push(c);
                }
            }
        }
    }
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    fn to() -> ConnectingTo<'static> {
        ConnectingTo {
            host: "db",
            port: 5432,
            db: "app",
            user: "rg",
        }
    }

    #[test]
    fn pgpass_lines_match_with_wildcards_and_escapes() {
        let text = "# comment\nother:5432:*:app:no\ndb:*:app\\:db:app:pa\\:ss\n*:*:*:*:any\n";
        assert_eq!(
            pgpass_match(text, "db", "5432", "app:db", "app").as_deref(),
            Some("pa:ss")
        );
        assert_eq!(
            pgpass_match(text, "x", "1", "y", "z").as_deref(),
            Some("any")
        );
        assert_eq!(pgpass_match("a:b:c\n", "a", "b", "c", "d"), None);
    }

    #[test]
    fn a_command_is_run_at_every_read_and_its_output_trimmed() {
        let dir = std::env::temp_dir().join(format!("rg-cred-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let count = dir.join("count");
        let cmd = format!(
            "n=$(cat {0} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {0}; echo \"  token-$n \"",
            count.display()
        );
        let source = PasswordSource::choose(Some(&cmd), Some(Path::new("/ignored")), None);
        assert_eq!(source.read(&to()).unwrap().as_deref(), Some("token-1"));
        assert_eq!(source.read(&to()).unwrap().as_deref(), Some("token-2"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_failing_or_silent_or_slow_command_is_an_error_without_its_output() {
        // What it printed ("hidden-token") is not in the command's text.
        let command = "printf 'hidden%s' -token; echo 'no token' >&2; exit 3";
        let failed = run_command(command, PASSWORD_COMMAND_TIMEOUT)
            .unwrap_err()
            .to_string();
        assert!(failed.contains("no token"), "{failed}");
        assert!(!failed.contains("hidden-token"), "{failed}");
        assert!(matches!(
            run_command("true", PASSWORD_COMMAND_TIMEOUT),
            Err(CredentialError::Empty(_))
        ));
        assert!(matches!(
            run_command("sleep 5", Duration::from_millis(100)),
            Err(CredentialError::Timeout { .. })
        ));
    }

    #[test]
    fn a_file_is_read_at_every_read() {
        let path = std::env::temp_dir().join(format!("rg-pwfile-{}", std::process::id()));
        std::fs::write(&path, "first\n").unwrap();
        let source = PasswordSource::choose(None, Some(&path), Some(b"url"));
        assert_eq!(source.read(&to()).unwrap().as_deref(), Some("first"));
        std::fs::write(&path, "second\r\n").unwrap();
        assert_eq!(source.read(&to()).unwrap().as_deref(), Some("second"));
        std::fs::write(&path, "\n").unwrap();
        assert!(matches!(
            source.read(&to()),
            Err(CredentialError::EmptyFile(_))
        ));
        std::fs::remove_file(&path).unwrap();
        assert!(source.read(&to()).is_err());
        let url = PasswordSource::choose(None, None, Some(b"pw"));
        assert_eq!(url.read(&to()).unwrap().as_deref(), Some("pw"));
    }
}
