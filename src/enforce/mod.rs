//! The enforcer: between the saver layer (what a statement is, what its
//! parameters and rows say) and the policy (what may happen), it turns
//! decoded checkpoint traffic into actions for the wire layer — forward,
//! replace these bytes, refuse with this error, hold this row for a
//! claim — and into audit events and claim evidence.
//!
//! - `session`: one session's hooks into the protocol tracker.
//! - `watch`, `events`, `evidence`: one statement's answer, what it
//!   audits, what it tells the claims store.
//! - `validity`, `claim_gate`, `fencing`: the validity gate, the
//!   consume-once gate, and the fencing of writes continuing a claimed
//!   checkpoint from sessions other than its holder (`fence_check`: a
//!   write the server fences in its own transaction); `holder_detail`: a
//!   claim's holder as audited; `held_claims`: the
//!   claims this proxy's sessions hold, for a holder's own re-read;
//!   `parked_heads`, `claim_ahead`: a parked head's claim asked beside
//!   the read that returns it.
//! - `history`: the delta-channel history read never returns the writes
//!   the legs guard.
//! - `reload`: the rule set a running proxy replaces (SIGHUP).
//! - `own_schema`: client statements may only read the proxy's schema.
//! - `shared_session`: a session carrying several clients (a transaction
//!   pooler in front), said loudly.
//! - `transaction_end`: statements that end the open transaction, before
//!   which the validity gate raises a refusal still waiting.

pub mod claim_ahead;
pub mod claim_gate;
mod converted_write;
mod events;
mod evidence;
mod fence_check;
mod fencing;
pub mod held_claims;
mod history;
mod holder_detail;
mod late_duplicate;
pub mod own_schema;
pub mod parked_heads;
pub mod reload;
pub mod session;
pub mod shared_session;
mod transaction_end;
pub mod validity;
pub mod watch;

use std::sync::Arc;

use crate::audit::{AuditSink, SessionContext};
use crate::policy::ChannelRules;
use crate::saver::classify::Classifier;
use crate::wire::guard::{Guard, GuardFactory, SessionInfo};
use crate::wire::refusal::Refusal;
use crate::wire::text_screen::TextScreen;
use crate::wire::tracker::Tracker;
use claim_gate::ClaimsLeg;
use own_schema::OwnSchema;
use reload::FollowedRules;
use session::SessionEnforcer;

/// Which enforcement legs run. Off, the proxy is a transparent relay that
/// still recognizes and audits checkpoint traffic.
#[derive(Clone)]
pub struct Legs {
    /// Hide recorded answers from reads that fork a superseded checkpoint.
    pub fork_filter: bool,
    /// Channel schemas every checkpoint write is validated against (empty:
    /// the validity gate has nothing to check).
    pub validity: Arc<ChannelRules>,
    /// Consume-once claims on reads of parked heads (`None`: off).
    pub claims: Option<Arc<ClaimsLeg>>,
    /// The proxy's own schema, which client statements may only read
    /// (whatever the other legs say).
    pub own_schema: Arc<OwnSchema>,
}

impl Default for Legs {
    fn default() -> Self {
        Legs {
            fork_filter: true,
            validity: Arc::new(ChannelRules::default()),
            claims: None,
            own_schema: Arc::new(OwnSchema::new(crate::pg::DEFAULT_SCHEMA)),
        }
    }
}

impl Legs {
    /// Whether anything is enforced at all.
    pub fn any(&self) -> bool {
        self.fork_filter || !self.validity.is_empty() || self.claims.is_some()
    }
}

/// What every session's enforcer shares.
pub struct Enforcement {
    pub classifier: Arc<Classifier>,
    pub legs: Legs,
    pub audit: AuditSink,
    /// The saver profiles' table names and the words the own-schema check
    /// looks for (see [`Enforcement::ordinary`]).
    screen: TextScreen,
}

/// One session's guard: the protocol tracker with the session's enforcer
/// as its hooks.
pub type SessionGuard = Tracker<SessionEnforcer>;

impl Enforcement {
    /// What the sessions share, with the screen of ordinary texts built
    /// for these saver profiles and this own schema.
    pub fn new(classifier: Arc<Classifier>, legs: Legs, audit: AuditSink) -> Self {
        // A backslash is among the words: an escape may spell any name.
        let words: Vec<&str> = classifier
            .table_names()
            .chain(legs.own_schema.words())
            .chain(["\\"])
            .collect();
        let screen = TextScreen::new(words);
        Enforcement {
            classifier,
            legs,
            audit,
            screen,
        }
    }

    /// Whether a statement text is ordinary traffic: it names no saver
    /// table (so it classifies as no checkpoint statement), cannot touch
    /// the proxy's schema, and carries no SQL-level command. A text with
    /// a backslash is never ordinary: an escape may spell any name.
    pub fn ordinary(&self, sql: &[u8]) -> bool {
        self.screen.ordinary(sql)
    }

    /// A session's guard, before its startup exchange.
    pub fn session(
        self: &Arc<Self>,
        ctx: SessionContext,
        inspection_listener: bool,
    ) -> SessionGuard {
        let mut enforcer = SessionEnforcer::new(Arc::clone(self), ctx);
        enforcer.inspection_listener = inspection_listener;
        let mut tracker = Tracker::new(enforcer);
        tracker.expect_startup();
        tracker
    }

    /// The guard of the session the relay describes; with `rules`, it
    /// moves to a replaced rule set at its idle points.
    fn session_for(
        self: &Arc<Self>,
        info: SessionInfo,
        rules: Option<FollowedRules>,
    ) -> SessionGuard {
        let ctx = SessionContext {
            session_id: info.session_id,
            client_addr: info.client_addr,
            user: info.user,
            database: info.database,
            application_name: info.application_name,
        };
        let mut tracker = self.session(ctx, info.inspection_listener);
        tracker.hooks.rules = rules;
        tracker
    }
}

impl GuardFactory for Arc<Enforcement> {
    fn guard(&self, info: SessionInfo) -> Box<dyn Guard> {
        Box::new(self.session_for(info, None))
    }

    fn refuse_startup(&self, params: &[(String, String)]) -> Option<Refusal> {
        let own = &self.legs.own_schema;
        let breach = own.check_startup(params).err()?;
        Some(own.refusal(&breach))
    }
}

#[cfg(test)]
mod tests;
