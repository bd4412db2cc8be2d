//! The index of unanswered changes against the walk over every queued
//! change it replaces: for any script of client messages and server
//! answers (successes, errors, skips to Sync, SQL PREPARE / DEALLOCATE /
//! DEALLOCATE ALL confirmed one by one), every statement and portal lookup
//! and `settled` agree after every step; and a deep pipeline leaves
//! nothing behind once answered.

use proptest::prelude::*;

use super::super::names::{Change, Lookup, Portal, Statement};
use super::super::*;
use super::{bind_to, client, cs, execute, msg, parse, query, ready, sync, tracker, Marks};
use crate::wire::response_queue::Expect;
use crate::wire::sql_commands::SqlCommand;

/// The name's state from its confirmed state and every unanswered change,
/// oldest first (the lookup as it was before the index).
struct Settle<T> {
    confirmed: Option<T>,
    segment: u64,
    last: Option<(u64, Option<T>)>,
    differs: bool,
}

impl<T> Settle<T> {
    fn change(
        &mut self,
        segment: u64,
        effect: Option<T>,
        same: impl Fn(&Option<T>, &Option<T>) -> bool,
    ) {
        self.differs |= !same(&effect, &self.confirmed);
        self.last = Some((segment, effect));
    }

    fn finish(self) -> Lookup<T> {
        match self.last {
            None => Lookup::Known(self.confirmed),
            Some((s, effect)) if s == self.segment => Lookup::Known(effect),
            Some(_) if !self.differs => Lookup::Known(self.confirmed),
            Some(_) => Lookup::Ambiguous,
        }
    }
}

fn walked_statement(t: &Tracker<Marks>, name: &[u8]) -> Lookup<Statement<bool>> {
    let mut lookup = Settle {
        confirmed: t.statements.get(name).cloned(),
        segment: t.segment,
        last: None,
        differs: false,
    };
    for p in t.queue.payloads() {
        let effect = match &p.change {
            Change::Define { name: n, statement } if n == name => Some(statement.clone()),
            Change::Close {
                target: Target::Statement,
                name: n,
            } if n == name => None,
            Change::Answer {
                resets_unnamed: true,
                ..
            } if name.is_empty() => None,
            Change::Answer { commands, .. } => {
                let found = commands
                    .pending()
                    .iter()
                    .rev()
                    .find_map(|c| match &c.command {
                        SqlCommand::Prepare { name: n, .. } if n == name => {
                            Some(c.defines.map(Statement::new))
                        }
                        SqlCommand::Deallocate { name: n } if n == name => Some(None),
                        SqlCommand::DeallocateAll => Some(None),
                        _ => None,
                    });
                match found {
                    Some(effect) => effect,
                    None => continue,
                }
            }
            _ => continue,
        };
        lookup.change(p.segment, effect, |a, b| a == b);
    }
    lookup.finish()
}

/// What a test can compare of a portal: whether it is watched, and the
/// SQL commands it runs.
type PortalView = (bool, Option<Vec<(SqlCommand, Option<bool>)>>);

fn view(lookup: Lookup<Portal<(), bool>>) -> Lookup<PortalView> {
    match lookup {
        Lookup::Known(p) => Lookup::Known(p.map(|p| {
            let commands = p.commands.map(|c| c.as_ref().clone());
            (p.annotation.is_some(), commands)
        })),
        Lookup::Ambiguous => Lookup::Ambiguous,
    }
}

/// The portal `name` as the tracker's index says the server will see it.
fn indexed_portal(t: &Tracker<Marks>, name: &[u8]) -> Lookup<Portal<(), bool>> {
    match t.unanswered.portal(name, t.portals.get(name), t.segment) {
        Lookup::Known(p) => Lookup::Known(p.cloned()),
        Lookup::Ambiguous => Lookup::Ambiguous,
    }
}

fn walked_portal(t: &Tracker<Marks>, name: &[u8]) -> Lookup<PortalView> {
    let plain = |p: &Option<Portal<(), bool>>| p.as_ref().is_none_or(Portal::is_plain);
    let mut lookup = Settle {
        confirmed: t.portals.get(name).cloned(),
        segment: t.segment,
        last: None,
        differs: false,
    };
    for p in t.queue.payloads() {
        let effect = match &p.change {
            Change::Bind { portal, binding } if portal == name => Some(binding.clone()),
            Change::Close {
                target: Target::Portal,
                name: n,
            } if n == name => None,
            Change::Answer {
                resets_unnamed: true,
                ..
            } if name.is_empty() => None,
            _ => continue,
        };
        lookup.change(p.segment, effect, |a, b| plain(a) && plain(b));
    }
    view(lookup.finish())
}

const STATEMENTS: [&str; 3] = ["", "a", "b"];
const PORTALS: [&str; 2] = ["", "p"];

fn agree(t: &Tracker<Marks>, step: &str) -> Result<(), TestCaseError> {
    for name in STATEMENTS {
        let indexed = t.statement(name.as_bytes());
        let walked = walked_statement(t, name.as_bytes());
        prop_assert_eq!(indexed, walked, "statement {:?} after {}", name, step);
    }
    for name in PORTALS {
        let indexed = view(indexed_portal(t, name.as_bytes()));
        let walked = walked_portal(t, name.as_bytes());
        prop_assert_eq!(indexed, walked, "portal {:?} after {}", name, step);
    }
    let walked_settled = t.queue.payloads().all(|p| p.segment >= t.segment);
    prop_assert_eq!(t.settled(), walked_settled, "settled after {}", step);
    if t.queue.payloads().next().is_none() {
        prop_assert!(t.unanswered.is_empty(), "index left over after {}", step);
    }
    Ok(())
}

const PARSE_TEXTS: [&str; 7] = [
    "select 1",
    "insert guarded",
    "PREPARE b AS select 1",
    "DEALLOCATE a",
    "DEALLOCATE ALL",
    "execute a",
    // PostgreSQL refuses more than one command in a Parse; the tracker
    // follows what it is sent all the same.
    "DEALLOCATE ALL; PREPARE a AS select 1",
];

const QUERY_TEXTS: [&str; 7] = [
    "select 1",
    "PREPARE a AS select 1",
    "PREPARE b AS select 2; DEALLOCATE a",
    "DEALLOCATE ALL",
    "DISCARD ALL",
    "PREPARE a AS select 1; DEALLOCATE ALL; PREPARE b AS select 3; PREPARE a AS select 4",
    "DEALLOCATE b; PREPARE b AS select 5",
];

#[derive(Debug, Clone)]
enum Step {
    Parse(usize, usize),
    Bind(usize, usize),
    Execute(usize),
    DescribeStatement(usize),
    DescribePortal(usize),
    Close(bool, usize),
    Query(usize),
    Sync,
    Flush,
    /// The server answers what the queue's front entry waits for: with
    /// success, or with an error; ReadyForQuery with this status.
    Answer {
        ok: bool,
        in_block: bool,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0..STATEMENTS.len(), 0..PARSE_TEXTS.len()).prop_map(|(n, t)| Step::Parse(n, t)),
        (0..PORTALS.len(), 0..STATEMENTS.len()).prop_map(|(p, s)| Step::Bind(p, s)),
        (0..PORTALS.len()).prop_map(Step::Execute),
        (0..STATEMENTS.len()).prop_map(Step::DescribeStatement),
        (0..PORTALS.len()).prop_map(Step::DescribePortal),
        (any::<bool>(), 0..STATEMENTS.len()).prop_map(|(s, n)| Step::Close(s, n)),
        (0..QUERY_TEXTS.len()).prop_map(Step::Query),
        Just(Step::Sync),
        Just(Step::Flush),
        (prop::bool::weighted(0.8), any::<bool>())
            .prop_map(|(ok, in_block)| Step::Answer { ok, in_block }),
        (prop::bool::weighted(0.8), any::<bool>())
            .prop_map(|(ok, in_block)| Step::Answer { ok, in_block }),
    ]
}

fn target(kind: u8, name: &str) -> Vec<u8> {
    let mut b = vec![kind];
    b.extend(cs(&[name]));
    b
}

fn client_frame(s: &Step) -> Option<Vec<u8>> {
    Some(match *s {
        Step::Parse(n, t) => parse(STATEMENTS[n], PARSE_TEXTS[t]),
        Step::Bind(p, n) => bind_to(PORTALS[p], STATEMENTS[n]),
        Step::Execute(p) => execute(PORTALS[p]),
        Step::DescribeStatement(n) => msg(b'D', &target(b'S', STATEMENTS[n])),
        Step::DescribePortal(p) => msg(b'D', &target(b'P', PORTALS[p])),
        Step::Close(true, n) => msg(b'C', &target(b'S', STATEMENTS[n])),
        Step::Close(false, n) => msg(b'C', &target(b'P', PORTALS[n % PORTALS.len()])),
        Step::Query(q) => query(QUERY_TEXTS[q]),
        Step::Sync => sync(),
        Step::Flush => msg(b'H', b""),
        Step::Answer { .. } => return None,
    })
}

fn command_complete(tag: &str) -> Vec<u8> {
    msg(b'C', &cs(&[tag]))
}

fn error() -> Vec<u8> {
    msg(b'E', b"SERROR\0VERROR\0C42000\0Mx\0\0")
}

/// The tags that confirm the front answer's pending SQL commands, in order.
fn pending_tags(t: &mut Tracker<Marks>) -> Vec<&'static str> {
    match t.queue.front_payload_mut() {
        Some(super::super::names::Pending {
            change: Change::Answer { commands, .. },
            ..
        }) => commands
            .pending()
            .iter()
            .map(|c| match c.command {
                SqlCommand::Prepare { .. } => "PREPARE",
                SqlCommand::Deallocate { .. } => "DEALLOCATE",
                _ => "DISCARD ALL",
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// What PostgreSQL would send for the queue's front entry.
fn answer(t: &mut Tracker<Marks>, ok: bool, in_block: bool) -> Vec<Vec<u8>> {
    let Some(expect) = t.queue.front().map(|e| e.expect.clone()) else {
        return Vec::new();
    };
    let status = if in_block { b'T' } else { b'I' };
    let failed = if in_block { b'E' } else { b'I' };
    match (expect, ok) {
        (Expect::Sync, _) => vec![ready(status)],
        (Expect::Query, true) => {
            let mut out: Vec<_> = pending_tags(t).into_iter().map(command_complete).collect();
            out.push(command_complete("SELECT 1"));
            out.push(ready(status));
            out
        }
        (Expect::Query, false) => {
            // The first command succeeds, the next fails.
            let tags = pending_tags(t);
            let mut out: Vec<_> = tags.into_iter().take(1).map(command_complete).collect();
            out.push(error());
            out.push(ready(failed));
            out
        }
        (Expect::Startup | Expect::FunctionCall, _) => vec![ready(status)],
        // The queue never leaves the end of a COPY at its front.
        (Expect::CopyEnded, _) => Vec::new(),
        (_, false) => vec![error()],
        (Expect::ParseComplete, true) => vec![msg(b'1', b"")],
        (Expect::BindComplete, true) => vec![msg(b'2', b"")],
        (Expect::CloseComplete, true) => vec![msg(b'3', b"")],
        (Expect::DescribeStatement, true) => vec![msg(b't', &[0, 0]), msg(b'n', b"")],
        (Expect::DescribePortal, true) => vec![msg(b'n', b"")],
        (Expect::Execute, true) => {
            let tag = pending_tags(t).first().copied().unwrap_or("SELECT 1");
            vec![command_complete(tag)]
        }
    }
}

fn run(steps: &[Step]) -> Result<(), TestCaseError> {
    let mut t = tracker();
    for (i, s) in steps.iter().enumerate() {
        let what = format!("step {i} {s:?}");
        match client_frame(s) {
            // A message that waits for earlier answers is not sent yet:
            // the relay offers it again once they came.
            Some(frame) => match t.on_client(&frame, false) {
                Ok(_) => {}
                Err(e) => return Err(TestCaseError::fail(format!("{what}: {}", e.0))),
            },
            None => {
                let Step::Answer { ok, in_block } = *s else {
                    continue;
                };
                for frame in answer(&mut t, ok, in_block) {
                    t.on_server(&frame)
                        .map_err(|d| TestCaseError::fail(format!("{what}: {d}")))?;
                    agree(&t, &what)?;
                }
            }
        }
        agree(&t, &what)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn the_index_answers_every_lookup_as_the_walk_over_the_queue_does(
        steps in prop::collection::vec(step(), 1..80)
    ) {
        run(&steps)?;
    }
}

#[test]
fn the_sql_commands_of_one_answer_are_followed_as_each_is_confirmed() {
    // Pipelined after a Sync, so every lookup depends on the answers.
    let steps = [
        Step::Parse(1, 1),
        Step::Answer {
            ok: true,
            in_block: false,
        },
        Step::Sync,
        Step::Answer {
            ok: true,
            in_block: false,
        },
        Step::Query(5),
        Step::Query(6),
        Step::Parse(2, 0),
        Step::Sync,
        Step::Answer {
            ok: true,
            in_block: false,
        },
        Step::Answer {
            ok: false,
            in_block: true,
        },
        Step::Answer {
            ok: true,
            in_block: false,
        },
        Step::Answer {
            ok: true,
            in_block: false,
        },
    ];
    run(&steps).expect("the index and the walk agree");
}

#[test]
fn a_deep_pipeline_answered_leaves_nothing_indexed() {
    let mut t = tracker();
    let mut frames = vec![parse("a", "insert guarded")];
    for i in 0..10_000 {
        // Watched and plain portals, alternately (no run merges).
        frames.push(bind_to(if i % 2 == 0 { "" } else { "p" }, "a"));
        frames.push(execute(""));
    }
    frames.push(sync());
    for f in &frames {
        assert_eq!(t.on_client(f, false).unwrap(), ClientStep::Forward);
    }
    assert_eq!(t.hooks.binds.len(), 10_000, "every Bind saw its statement");
    assert!(t.hooks.binds.iter().all(|guarded| *guarded));
    t.on_server(&msg(b'1', b"")).unwrap();
    for _ in 0..10_000 {
        t.on_server(&msg(b'2', b"")).unwrap();
        t.on_server(&command_complete("INSERT 0 1")).unwrap();
    }
    assert_eq!(t.queue.len(), 1, "the Sync's answer is still owed");
    t.on_server(&ready(b'I')).unwrap();
    assert!(t.is_idle());
    assert!(t.unanswered.is_empty());
}

#[test]
fn an_error_deep_in_a_pipeline_forgets_everything_up_to_the_sync() {
    let mut t = tracker();
    client(&mut t, &[parse("a", "insert guarded"), sync()]);
    t.on_server(&msg(b'1', b"")).unwrap();
    t.on_server(&ready(b'I')).unwrap();
    let mut frames = Vec::new();
    for _ in 0..5_000 {
        frames.push(bind_to("", "a"));
        frames.push(execute(""));
    }
    frames.push(sync());
    frames.push(bind_to("p", "a"));
    for f in &frames {
        assert_eq!(t.on_client(f, false).unwrap(), ClientStep::Forward);
    }
    // The first Bind fails: the server skips the rest up to the Sync.
    t.on_server(&error()).unwrap();
    assert_eq!(t.queue.len(), 2, "the Sync's answer and the last Bind's");
    t.on_server(&ready(b'I')).unwrap();
    // The Bind after the Sync is what the index still holds.
    assert!(matches!(indexed_portal(&t, b"p"), Lookup::Known(Some(_))));
    assert!(!t.unanswered.is_empty());
    t.on_server(&msg(b'2', b"")).unwrap();
    assert!(t.unanswered.is_empty());
}
