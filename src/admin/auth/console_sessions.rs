//! The console's login sessions: a random id in an HttpOnly, SameSite=Strict
//! cookie, a CSRF token of its own that every form POST must carry, bound
//! to the admin token in effect when it was opened (a reload that changes
//! the token ends every session). Bounded in number and in age.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The cookie that carries a console session's id.
pub const SESSION_COOKIE: &str = "rg_session";

/// How long a console session lasts after its login.
pub const SESSION_LIFETIME: Duration = Duration::from_secs(12 * 3600);

/// Console sessions held at once; a login past it ends the oldest.
const MAX_SESSIONS: usize = 256;

/// One open console session, as a request sees it.
#[derive(Debug, Clone)]
pub struct ConsoleSession {
    /// The token every form POST of this session must carry.
    pub csrf: String,
}

impl ConsoleSession {
    /// Whether `given` is this session's CSRF token (constant time).
    pub fn csrf_matches(&self, given: &str) -> bool {
        bool::from(Sha256::digest(given.as_bytes()).ct_eq(&Sha256::digest(self.csrf.as_bytes())))
    }
}

struct Entry {
    csrf: String,
    /// The admin token's digest when the session was opened.
    token: [u8; 32],
    opened: Instant,
}

/// The open sessions, keyed by the digest of their id (the id itself is
/// never kept).
#[derive(Default)]
pub struct ConsoleSessions {
    open: Mutex<HashMap<[u8; 32], Entry>>,
}

/// Why no session could be opened.
#[derive(Debug, thiserror::Error)]
#[error("the system's random source failed: {0}")]
pub struct RandomError(String);

impl ConsoleSessions {
    /// Opens a session for the holder of `token`: its id (for the cookie)
    /// and its CSRF token.
    pub fn open(&self, token: &str) -> Result<(String, ConsoleSession), RandomError> {
        let id = random_hex()?;
        let csrf = random_hex()?;
        let mut open = self.lock();
        open.retain(|_, e| e.opened.elapsed() < SESSION_LIFETIME);
        if open.len() >= MAX_SESSIONS {
            if let Some(oldest) = open.iter().min_by_key(|(_, e)| e.opened).map(|(k, _)| *k) {
                open.remove(&oldest);
            }
        }
        open.insert(
            digest(&id),
            Entry {
                csrf: csrf.clone(),
                token: digest(token),
                opened: Instant::now(),
            },
        );
        Ok((id, ConsoleSession { csrf }))
    }

    /// The session `id` names, if it is open, unexpired and was opened
    /// with the token now in effect.
    pub fn find(&self, id: &str, token: &str) -> Option<ConsoleSession> {
        let open = self.lock();
        let e = open.get(&digest(id))?;
        let same_token = bool::from(e.token.ct_eq(&digest(token)));
        (same_token && e.opened.elapsed() < SESSION_LIFETIME).then(|| ConsoleSession {
            csrf: e.csrf.clone(),
        })
    }

    /// Ends the session `id` (logout).
    pub fn close(&self, id: &str) {
        self.lock().remove(&digest(id));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Entry>> {
        // A panic while holding the lock leaves a map that is still whole.
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn digest(s: &str) -> [u8; 32] {
    Sha256::digest(s.as_bytes()).into()
}

/// 32 random bytes as hex.
fn random_hex() -> Result<String, RandomError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| RandomError(e.to_string()))?;
    Ok(hex::encode(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_is_found_by_its_id_only_while_its_token_holds() {
        let sessions = ConsoleSessions::default();
        let (id, s) = sessions.open("secret").unwrap();
        assert_eq!(id.len(), 64);
        let found = sessions.find(&id, "secret").unwrap();
        assert_eq!(found.csrf, s.csrf);
        assert!(found.csrf_matches(&s.csrf));
        assert!(!found.csrf_matches("forged"));
        assert!(sessions.find(&id, "rotated").is_none());
        assert!(sessions.find("unknown", "secret").is_none());
        sessions.close(&id);
        assert!(sessions.find(&id, "secret").is_none());
    }

    #[test]
    fn logins_past_the_bound_end_the_oldest_session() {
        let sessions = ConsoleSessions::default();
        let (first, _) = sessions.open("t").unwrap();
        for _ in 0..MAX_SESSIONS {
            sessions.open("t").unwrap();
        }
        assert!(sessions.find(&first, "t").is_none());
        assert_eq!(sessions.lock().len(), MAX_SESSIONS);
    }
}
