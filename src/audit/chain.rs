//! Tamper evidence for the trail: every record carries the hash of the
//! record before it in the same output and replica (its chain), so
//! `resumeguard audit verify` can name the first record that was removed
//! or changed after it was written.
//!
//! A record's hash covers the previous hash and every stored column but
//! the row id, in the text the output stores. Retention removes a prefix
//! of the trail and says where each chain now starts (the hash of its
//! last removed record, in the `audit_pruned` record's `chain_starts`).
//! What a chain cannot show: records removed from its newest end, or a
//! trail rewritten whole by someone who recomputes every hash; keep the
//! heads `audit verify` prints somewhere else to catch those.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::audit_event::{AuditEvent, Operation};

/// The previous hash of a chain's first record.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// The key of the `audit_pruned` record's detail that holds, per replica,
/// the hash of the last record the prune removed.
pub const CHAIN_STARTS: &str = "chain_starts";

/// The hash of `ev` following `prev` in its chain (lowercase hex SHA-256).
pub fn link(prev: &str, ev: &AuditEvent) -> Result<String, serde_json::Error> {
    let covered = (
        &ev.time,
        &ev.proxy_id,
        // As stored: the columns are i64.
        ev.session_id as i64,
        &ev.client_addr,
        &ev.user,
        &ev.database,
        &ev.application_name,
        ev.operation.as_str(),
        &ev.thread_id,
        &ev.checkpoint_ns,
        &ev.checkpoint_id,
        &ev.parent_checkpoint_id,
        &ev.task_id,
        serde_json::to_string(&ev.channels)?,
        serde_json::to_string(&ev.blob_sha256)?,
        serde_json::to_string(&ev.detail)?,
    );
    let mut hasher = Sha256::new();
    hasher.update(prev.as_bytes());
    hasher.update(b"\n");
    hasher.update(serde_json::to_vec(&covered)?);
    Ok(hex::encode(hasher.finalize()))
}

/// The newest hash of each chain a writer appends to, as the writer last
/// saw it.
#[derive(Debug, Default)]
pub struct Heads(HashMap<String, String>);

impl Heads {
    /// The head of `proxy_id`'s chain, read by `load` when not known yet.
    pub fn get<E>(
        &mut self,
        proxy_id: &str,
        load: impl FnOnce() -> Result<Option<String>, E>,
    ) -> Result<String, E> {
        if let Some(head) = self.0.get(proxy_id) {
            return Ok(head.clone());
        }
        let head = load()?.unwrap_or_else(|| GENESIS.to_owned());
        self.0.insert(proxy_id.to_owned(), head.clone());
        Ok(head)
    }

    /// The head of `proxy_id`'s chain, if known.
    pub fn head(&self, proxy_id: &str) -> Option<String> {
        self.0.get(proxy_id).cloned()
    }

    /// `hash` is now the head of `proxy_id`'s chain.
    pub fn advance(&mut self, proxy_id: &str, hash: String) {
        self.0.insert(proxy_id.to_owned(), hash);
    }
}

/// One stored record as the verifier reads it.
#[derive(Debug, Clone)]
pub struct ChainedRow {
    pub id: i64,
    pub event: AuditEvent,
    pub prev_hash: Option<String>,
    pub hash: Option<String>,
}

/// Where a chain stops proving its trail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Break {
    /// The record's columns are not the ones its hash was made of.
    Changed { id: i64, proxy_id: String },
    /// The record does not follow the chain's previous record (`after`):
    /// records between them were removed, or `after` was rewritten.
    Missing {
        id: i64,
        after: i64,
        proxy_id: String,
    },
    /// The chain's first record follows a record the trail no longer
    /// holds, and no prune says it removed it.
    Unanchored { id: i64, proxy_id: String },
    /// A record without a hash after its chain began.
    Unhashed { id: i64, proxy_id: String },
}

impl Break {
    /// The record where the break shows.
    pub fn id(&self) -> i64 {
        match self {
            Break::Changed { id, .. }
            | Break::Missing { id, .. }
            | Break::Unanchored { id, .. }
            | Break::Unhashed { id, .. } => *id,
        }
    }
}

impl std::fmt::Display for Break {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = |p: &str| crate::log_text::escaped(p).to_string();
        match self {
            Break::Changed { id, proxy_id } => write!(
                f,
                "record {id} (replica {}) was changed after it was written",
                shown(proxy_id)
            ),
            Break::Missing {
                id,
                after,
                proxy_id,
            } => write!(
                f,
                "record {id} (replica {}) does not follow record {after}: records between them \
                 were removed, or record {after} was rewritten",
                shown(proxy_id)
            ),
            Break::Unanchored { id, proxy_id } => write!(
                f,
                "record {id} (replica {}) follows a record the trail no longer holds, and no \
                 prune record says it was removed",
                shown(proxy_id)
            ),
            Break::Unhashed { id, proxy_id } => write!(
                f,
                "record {id} (replica {}) carries no hash although its chain began before it",
                shown(proxy_id)
            ),
        }
    }
}

/// What one chain proved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChainSummary {
    pub proxy_id: String,
    /// Hashed records walked.
    pub records: u64,
    /// Records written before the trail carried hashes (the chain's
    /// start), which it cannot prove.
    pub unhashed_before: u64,
    /// The first record's id, and whether it starts the chain or follows
    /// a prune.
    pub first_id: Option<i64>,
    pub after_prune: bool,
    /// The newest record's hash: keep it elsewhere to catch a removal from
    /// the newest end.
    pub head: String,
}

/// What a walk of the trail found: each chain, and each chain's first
/// break.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Verdict {
    pub chains: Vec<ChainSummary>,
    pub breaks: Vec<Break>,
}

impl Verdict {
    pub fn holds(&self) -> bool {
        self.breaks.is_empty()
    }

    /// Each chain's replica and how many records it proved.
    #[cfg(test)]
    pub fn records(&self) -> Vec<(&str, u64)> {
        self.chains
            .iter()
            .map(|c| (c.proxy_id.as_str(), c.records))
            .collect()
    }
}

#[derive(Debug, Default)]
struct Walk {
    summary: Option<ChainSummary>,
    unhashed_before: u64,
    last_id: i64,
    broken: bool,
}

/// Walks a trail's records in id order and checks every chain.
#[derive(Debug, Default)]
pub struct Verifier {
    /// Per replica, the hashes a prune said it removed last.
    anchors: HashMap<String, HashSet<String>>,
    chains: BTreeMap<String, Walk>,
    breaks: Vec<Break>,
}

impl Verifier {
    /// A verifier that knows the prunes recorded in `pruned` (the trail's
    /// `audit_pruned` records, read first: each is written after the
    /// records it anchors).
    pub fn new<'a>(pruned: impl IntoIterator<Item = &'a AuditEvent>) -> Verifier {
        let mut anchors: HashMap<String, HashSet<String>> = HashMap::new();
        for ev in pruned {
            if ev.operation != Operation::AuditPruned {
                continue;
            }
            let Some(starts) = ev.detail.get(CHAIN_STARTS).and_then(|s| s.as_object()) else {
                continue;
            };
            for (proxy, hash) in starts {
                if let Some(hash) = hash.as_str() {
                    anchors
                        .entry(proxy.clone())
                        .or_default()
                        .insert(hash.to_owned());
                }
            }
        }
        Verifier {
            anchors,
            ..Verifier::default()
        }
    }

    /// The next record of the trail (ids ascending).
    pub fn record(&mut self, row: ChainedRow) -> Result<(), serde_json::Error> {
        let proxy = row.event.proxy_id.clone();
        let walk = self.chains.entry(proxy.clone()).or_default();
        let (Some(prev), Some(hash)) = (row.prev_hash, row.hash) else {
            match walk.summary {
                None => walk.unhashed_before += 1,
                Some(_) if !walk.broken => {
                    walk.broken = true;
                    self.breaks.push(Break::Unhashed {
                        id: row.id,
                        proxy_id: proxy,
                    });
                }
                Some(_) => {}
            }
            return Ok(());
        };
        let found = link(&prev, &row.event)?;
        let mut broke = |walk: &mut Walk, b: Break| {
            if !walk.broken {
                walk.broken = true;
                self.breaks.push(b);
            }
        };
        match walk.summary.as_mut() {
            None => {
                let anchored = self.anchors.get(&proxy).is_some_and(|a| a.contains(&prev));
                if prev != GENESIS && !anchored {
                    broke(
                        walk,
                        Break::Unanchored {
                            id: row.id,
                            proxy_id: proxy.clone(),
                        },
                    );
                }
                walk.summary = Some(ChainSummary {
                    proxy_id: proxy.clone(),
                    records: 0,
                    unhashed_before: walk.unhashed_before,
                    first_id: Some(row.id),
                    after_prune: anchored,
                    head: GENESIS.to_owned(),
                });
            }
            Some(summary) => {
                if prev != summary.head {
                    let after = walk.last_id;
                    broke(
                        walk,
                        Break::Missing {
                            id: row.id,
                            after,
                            proxy_id: proxy.clone(),
                        },
                    );
                }
            }
        }
        if found != hash {
            broke(
                walk,
                Break::Changed {
                    id: row.id,
                    proxy_id: proxy,
                },
            );
        }
        walk.last_id = row.id;
        if let Some(summary) = walk.summary.as_mut() {
            summary.records += 1;
            // Later records are checked against what was stored, so one
            // break does not hide the rest of the chain's state.
            summary.head = hash;
        }
        Ok(())
    }

    /// Every chain's summary and first break.
    pub fn finish(self) -> Verdict {
        let chains = self
            .chains
            .into_iter()
            .map(|(proxy, walk)| {
                walk.summary.unwrap_or(ChainSummary {
                    proxy_id: proxy,
                    records: 0,
                    unhashed_before: walk.unhashed_before,
                    first_id: None,
                    after_prune: false,
                    head: GENESIS.to_owned(),
                })
            })
            .collect();
        let mut breaks = self.breaks;
        breaks.sort_by_key(Break::id);
        Verdict { chains, breaks }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit_event::SessionContext;

    fn event(proxy: &str, n: u64) -> AuditEvent {
        let mut ev = AuditEvent::new(&SessionContext::default(), Operation::ReadLatest)
            .with_thread("t")
            .with_detail(serde_json::json!({ "n": n, "ratio": 0.1 }));
        ev.proxy_id = proxy.into();
        ev
    }

    /// `events` chained as a writer chains them, ids from 1.
    fn chained(events: Vec<AuditEvent>) -> Vec<ChainedRow> {
        let mut heads = Heads::default();
        events
            .into_iter()
            .enumerate()
            .map(|(i, event)| {
                let prev = heads
                    .get::<()>(&event.proxy_id, || Ok(None))
                    .unwrap_or_default();
                let hash = link(&prev, &event).unwrap();
                heads.advance(&event.proxy_id, hash.clone());
                ChainedRow {
                    id: i as i64 + 1,
                    event,
                    prev_hash: Some(prev),
                    hash: Some(hash),
                }
            })
            .collect()
    }

    fn verify(rows: &[ChainedRow]) -> Verdict {
        let pruned: Vec<AuditEvent> = rows.iter().map(|r| r.event.clone()).collect();
        let mut v = Verifier::new(&pruned);
        for row in rows {
            v.record(row.clone()).unwrap();
        }
        v.finish()
    }

    #[test]
    fn a_chain_as_written_verifies_and_names_its_head() {
        let rows = chained(vec![event("a", 1), event("b", 2), event("a", 3)]);
        let verdict = verify(&rows);
        assert!(verdict.holds(), "{:?}", verdict.breaks);
        let heads: Vec<(&str, u64, &str)> = verdict
            .chains
            .iter()
            .map(|c| (c.proxy_id.as_str(), c.records, c.head.as_str()))
            .collect();
        assert_eq!(
            heads,
            vec![
                ("a", 2, rows[2].hash.as_deref().unwrap()),
                ("b", 1, rows[1].hash.as_deref().unwrap()),
            ]
        );
    }

    #[test]
    fn an_edited_record_is_named() {
        let mut rows = chained(vec![event("a", 1), event("a", 2), event("a", 3)]);
        rows[1].event.user = "mallory".into();
        assert_eq!(
            verify(&rows).breaks,
            vec![Break::Changed {
                id: 2,
                proxy_id: "a".into()
            }]
        );
    }

    #[test]
    fn a_removed_record_is_named_by_the_one_after_it() {
        let mut rows = chained(vec![
            event("a", 1),
            event("b", 9),
            event("a", 2),
            event("a", 3),
        ]);
        rows.remove(2);
        assert_eq!(
            verify(&rows).breaks,
            vec![Break::Missing {
                id: 4,
                after: 1,
                proxy_id: "a".into()
            }]
        );
    }

    #[test]
    fn a_removed_oldest_record_needs_a_prune_record_saying_so() {
        let mut rows = chained(vec![event("a", 1), event("a", 2), event("a", 3)]);
        let removed = rows.remove(0);
        assert_eq!(
            verify(&rows).breaks,
            vec![Break::Unanchored {
                id: 2,
                proxy_id: "a".into()
            }]
        );
        let mut prune = AuditEvent::new(&SessionContext::internal(), Operation::AuditPruned)
            .with_detail(serde_json::json!({ "rows": 1, CHAIN_STARTS: { "a": removed.hash } }));
        prune.proxy_id = "a".into();
        let mut events: Vec<AuditEvent> = rows.iter().map(|r| r.event.clone()).collect();
        events.push(prune);
        // Rechained from the removed record's hash, as the writer would.
        let mut heads = Heads::default();
        heads.advance("a", removed.hash.clone().unwrap());
        let rows: Vec<ChainedRow> = events
            .into_iter()
            .enumerate()
            .map(|(i, event)| {
                let prev = heads.get::<()>("a", || Ok(None)).unwrap_or_default();
                let hash = link(&prev, &event).unwrap();
                heads.advance("a", hash.clone());
                ChainedRow {
                    id: i as i64 + 2,
                    event,
                    prev_hash: Some(prev),
                    hash: Some(hash),
                }
            })
            .collect();
        let verdict = verify(&rows);
        assert!(verdict.holds(), "{:?}", verdict.breaks);
        assert!(verdict.chains[0].after_prune);
    }

    #[test]
    fn records_from_before_hashing_are_counted_not_broken() {
        let mut rows = chained(vec![event("a", 1), event("a", 2)]);
        let mut old = rows[0].clone();
        old.id = 0;
        old.prev_hash = None;
        old.hash = None;
        rows.insert(0, old);
        let verdict = verify(&rows);
        assert!(verdict.holds());
        assert_eq!(verdict.chains[0].unhashed_before, 1);
        let mut late = rows[1].clone();
        late.id = 9;
        late.prev_hash = None;
        late.hash = None;
        rows.push(late);
        assert_eq!(
            verify(&rows).breaks,
            vec![Break::Unhashed {
                id: 9,
                proxy_id: "a".into()
            }]
        );
    }

    #[test]
    fn the_hash_covers_every_stored_column() {
        let base = event("a", 1);
        let h = link(GENESIS, &base).unwrap();
        type Edit = Box<dyn Fn(&mut AuditEvent)>;
        let edits: Vec<Edit> = vec![
            Box::new(|e| e.time.push('x')),
            Box::new(|e| e.proxy_id.push('x')),
            Box::new(|e| e.session_id += 1),
            Box::new(|e| e.client_addr.push('x')),
            Box::new(|e| e.user.push('x')),
            Box::new(|e| e.database.push('x')),
            Box::new(|e| e.application_name.push('x')),
            Box::new(|e| e.operation = Operation::ReadById),
            Box::new(|e| e.thread_id = None),
            Box::new(|e| e.checkpoint_ns = Some(String::new())),
            Box::new(|e| e.checkpoint_id = Some("c".into())),
            Box::new(|e| e.parent_checkpoint_id = Some("p".into())),
            Box::new(|e| e.task_id = Some("k".into())),
            Box::new(|e| e.channels.push("c".into())),
            Box::new(|e| e.blob_sha256.push(super::super::BlobDigest::of("c", b""))),
            Box::new(|e| e.detail = serde_json::json!({ "n": 2 })),
        ];
        for (i, edit) in edits.iter().enumerate() {
            let mut e = base.clone();
            edit(&mut e);
            assert_ne!(link(GENESIS, &e).unwrap(), h, "edit {i}");
        }
        assert_ne!(
            link(&"1".repeat(64), &base).unwrap(),
            h,
            "the previous hash"
        );
    }
}
