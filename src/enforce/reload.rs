//! The rule set of a running proxy, replaceable (SIGHUP): saver profiles
//! and channel rules are swapped in whole, and every session, open ones
//! included, takes the new set at its next idle point — nothing
//! outstanding, no transaction open — so a transaction is judged by one
//! set from its first statement to its last.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::{Enforcement, Legs};
use crate::policy::ChannelRules;
use crate::saver::classify::Classifier;
use crate::wire::guard::{Guard, GuardFactory, SessionInfo};
use crate::wire::refusal::Refusal;
use arc_swap::ArcSwap;

/// The enforcement every session shares, with rules that can be replaced.
pub struct Reloadable {
    current: ArcSwap<Enforcement>,
    /// Moves after each replacement. Sessions compare it on every client
    /// message (one atomic load) and read the new set only when it moved.
    generation: AtomicU64,
}

impl Reloadable {
    pub fn new(enforcement: Enforcement) -> Arc<Reloadable> {
        Arc::new(Reloadable {
            current: ArcSwap::from_pointee(enforcement),
            generation: AtomicU64::new(0),
        })
    }

    /// The set new sessions and statements use now.
    pub fn current(&self) -> Arc<Enforcement> {
        self.current.load_full()
    }

    /// Puts a new classifier (saver profiles) and new channel rules in
    /// place of the current ones; the legs' switches, the claims leg and
    /// the audit sink stay as they are.
    pub fn replace(&self, classifier: Arc<Classifier>, validity: Arc<ChannelRules>) {
        self.current.rcu(|now| {
            Enforcement::new(
                Arc::clone(&classifier),
                Legs {
                    validity: Arc::clone(&validity),
                    ..now.legs.clone()
                },
                now.audit.clone(),
            )
        });
        self.generation.fetch_add(1, Ordering::Release);
    }
}

impl Reloadable {
    /// Puts new legs in place of the current ones (a reloaded
    /// configuration's switches and claims settings), made from them; the
    /// classifier and the audit sink stay.
    pub fn replace_legs(&self, legs: impl Fn(&Legs) -> Legs) {
        self.current.rcu(|now| {
            Enforcement::new(
                Arc::clone(&now.classifier),
                legs(&now.legs),
                now.audit.clone(),
            )
        });
        self.generation.fetch_add(1, Ordering::Release);
    }
}

impl GuardFactory for Arc<Reloadable> {
    fn guard(&self, info: SessionInfo) -> Box<dyn Guard> {
        let rules = FollowedRules {
            generation: self.generation.load(Ordering::Acquire),
            source: Arc::clone(self),
        };
        Box::new(self.current().session_for(info, Some(rules)))
    }

    fn refuse_startup(&self, params: &[(String, String)]) -> Option<Refusal> {
        self.current().refuse_startup(params)
    }
}

/// A session's place in the replaceable rule set: where replacements
/// come from, and the generation of the set the session uses.
pub struct FollowedRules {
    source: Arc<Reloadable>,
    generation: u64,
}

impl FollowedRules {
    /// The current set, when it was replaced since the session took its
    /// own and the session is `idle`; the session uses it from now on.
    /// One atomic load when nothing was replaced.
    pub fn replaced(&mut self, idle: bool) -> Option<Arc<Enforcement>> {
        let generation = self.source.generation.load(Ordering::Acquire);
        if generation == self.generation || !idle {
            return None;
        }
        self.generation = generation;
        Some(self.source.current())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::AuditSink;
    use crate::enforce::own_schema::OwnSchema;
    use crate::saver::profile::SaverProfile;
    use crate::wire::connection::message as msg;
    use crate::wire::guard::ClientStep;

    const WRITE_SQL: &str = "INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET channel = EXCLUDED.channel, type = EXCLUDED.type, blob = EXCLUDED.blob";

    fn classifier() -> Arc<Classifier> {
        Arc::new(Classifier::new(vec![SaverProfile::langgraph_python()]))
    }

    /// One rule: `items` is a list of strings. Each call writes a
    /// directory of its own: tests running at once must not load a
    /// directory another one has just removed (an empty rule set).
    fn items_rules() -> Arc<ChannelRules> {
        static CALLS: AtomicU64 = AtomicU64::new(0);
        let call = CALLS.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("rg-reload-rules-{}-{call}", std::process::id()));
        std::fs::create_dir_all(dir.join("channels")).unwrap();
        std::fs::write(
            dir.join("channels/items.toml"),
            "[[channel]]\nname = \"items\"\nschema = { type = \"array\", items = { type = \"string\" } }\n",
        )
        .unwrap();
        let rules = ChannelRules::load(&dir).unwrap();
        std::fs::remove_dir_all(&dir).ok();
        Arc::new(rules)
    }

    fn reloadable() -> Arc<Reloadable> {
        Reloadable::new(Enforcement::new(
            classifier(),
            Legs::default(),
            AuditSink::disabled(),
        ))
    }

    /// A session of `source` past its startup exchange.
    fn session(source: &Arc<Reloadable>) -> Box<dyn Guard> {
        let mut guard = source.guard(SessionInfo::default());
        for frame in [msg(b'R', &0i32.to_be_bytes()), msg(b'Z', b"I")] {
            guard.on_server(&frame).unwrap();
        }
        assert!(guard.started() && guard.is_idle());
        guard
    }

    fn client(guard: &mut Box<dyn Guard>, frames: &[Vec<u8>]) -> Vec<ClientStep> {
        frames
            .iter()
            .map(|f| guard.on_client(f, false).unwrap())
            .collect()
    }

    fn server(guard: &mut Box<dyn Guard>, frames: &[Vec<u8>]) {
        for f in frames {
            guard.on_server(f).unwrap();
        }
    }

    fn query(sql: &str) -> Vec<u8> {
        msg(b'Q', format!("{sql}\0").as_bytes())
    }

    fn parse() -> Vec<u8> {
        msg(b'P', format!("\0{WRITE_SQL}\0\0\0").as_bytes())
    }

    /// A pending write of msgpack `[None]` to `items`.
    fn bind() -> Vec<u8> {
        let params: [Option<&[u8]>; 9] = [
            Some(b"t1"),
            Some(b""),
            Some(b"ck1"),
            Some(b"task-1"),
            Some(b""),
            Some(&[0, 0, 0, 0]),
            Some(b"items"),
            Some(b"msgpack"),
            Some(b"\x91\xc0"),
        ];
        crate::saver::bind::tests::bind_frame("", &[0, 0, 0, 0, 0, 1, 0, 0, 1], &params, &[])
    }

    /// Whether the write is let through (its Bind forwarded as it is) or
    /// refused; a write let through completes, ending with `status`.
    fn write(guard: &mut Box<dyn Guard>, status: u8) -> bool {
        let steps = client(guard, &[parse(), bind()]);
        if steps[1] != ClientStep::Forward {
            return false;
        }
        client(guard, &[msg(b'E', b"\0\0\0\0\0"), msg(b'S', b"")]);
        let done = msg(b'C', b"INSERT 0 1\0");
        server(
            guard,
            &[msg(b'1', b""), msg(b'2', b""), done, msg(b'Z', &[status])],
        );
        true
    }

    #[test]
    fn an_open_session_takes_replaced_rules_at_its_next_statement() {
        let source = reloadable();
        let mut open = session(&source);
        assert!(write(&mut open, b'I'), "no rules yet: the write passes");
        source.replace(classifier(), items_rules());
        assert!(
            !write(&mut open, b'I'),
            "the open session checks the new rule"
        );
        let mut new = session(&source);
        assert!(!write(&mut new, b'I'), "so does a new one");
        assert_eq!(source.current().legs.validity.len(), 1);
    }

    #[test]
    fn a_transaction_keeps_the_rules_it_began_with() {
        let source = reloadable();
        let mut open = session(&source);
        client(&mut open, &[query("BEGIN")]);
        server(&mut open, &[msg(b'C', b"BEGIN\0"), msg(b'Z', b"T")]);
        source.replace(classifier(), items_rules());
        assert!(
            write(&mut open, b'T'),
            "inside the transaction: the old set"
        );
        client(&mut open, &[query("COMMIT")]);
        server(&mut open, &[msg(b'C', b"COMMIT\0"), msg(b'Z', b"I")]);
        assert!(!write(&mut open, b'I'), "after it: the new one");
    }

    #[test]
    fn replaced_legs_reach_an_open_session_and_keep_the_rules() {
        let source = reloadable();
        source.replace(classifier(), items_rules());
        let mut open = session(&source);
        let before = source.current();
        source.replace_legs(|legs| Legs {
            fork_filter: false,
            ..legs.clone()
        });
        let after = source.current();
        assert!(before.legs.fork_filter && !after.legs.fork_filter);
        assert!(Arc::ptr_eq(&before.classifier, &after.classifier));
        assert_eq!(after.legs.validity.len(), 1);
        assert!(
            !write(&mut open, b'I'),
            "the rules still hold after the swap"
        );
    }

    #[test]
    fn a_parse_text_remembered_as_plain_is_read_again_under_replaced_legs() {
        let source = reloadable();
        let mut open = session(&source);
        let text = msg(b'P', b"\0DELETE FROM elsewhere.t\0\0\0");
        let steps = client(&mut open, &[text.clone(), msg(b'S', b"")]);
        assert_eq!(steps, [ClientStep::Forward, ClientStep::Forward]);
        server(&mut open, &[msg(b'1', b""), msg(b'Z', b"I")]);
        source.replace_legs(|legs| Legs {
            own_schema: Arc::new(OwnSchema::new("elsewhere")),
            ..legs.clone()
        });
        let steps = client(&mut open, &[text]);
        assert!(matches!(steps[0], ClientStep::Replace(_)), "{steps:?}");
    }

    #[test]
    fn a_replacement_keeps_the_other_legs() {
        let claims_off = Legs {
            fork_filter: false,
            ..Legs::default()
        };
        let source = Reloadable::new(Enforcement::new(
            classifier(),
            claims_off,
            AuditSink::disabled(),
        ));
        let before = source.current();
        source.replace(classifier(), items_rules());
        let after = source.current();
        assert!(!after.legs.fork_filter);
        assert!(after.legs.claims.is_none());
        assert!(!Arc::ptr_eq(&before.classifier, &after.classifier));
        assert!(
            before.legs.validity.is_empty(),
            "the old set is left as it was"
        );
    }
}
