//! Evidence of several committed writes applied in one statement: the
//! evidence worker sends what arrived together (a run's writes follow each
//! other within milliseconds) as one call of `apply_evidence`, one round
//! trip and one server wake-up where each piece alone took its own. Each
//! item runs the same function it would run alone (`note_progress`,
//! `consume`, `move_on`), in arrival order; the claims an item consumed
//! come back with its index, for the audit trail.

use crate::claims::clock::WrittenAt;
use crate::saver::checkpoint_ref::CheckpointRef;

/// What a committed write tells the store about the checkpoint it
/// continues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteEvidence {
    /// A run-level answer: held claims taken by then record progress.
    Progress,
    /// A task's results: held claims taken by then are consumed.
    Consumed,
    /// A next checkpoint: the checkpoint's claims are consumed and
    /// superseded.
    MovedOn,
}

impl WriteEvidence {
    /// The kind as `apply_evidence` reads it.
    pub(super) fn sql_name(self) -> &'static str {
        match self {
            WriteEvidence::Progress => "progress",
            WriteEvidence::Consumed => "consumed",
            WriteEvidence::MovedOn => "moved_on",
        }
    }
}

/// One item of a batch.
#[derive(Debug, Clone, Copy)]
pub struct EvidenceItem<'a> {
    pub kind: WriteEvidence,
    pub at: &'a CheckpointRef,
    /// What the audit trail says consumed the claim.
    pub what: &'a str,
    /// When the write passed the proxy (a moved-on checkpoint consumes
    /// every claim, however late taken, so it has none).
    pub written_at: Option<WrittenAt>,
}

/// `CREATE FUNCTION` of `apply_evidence`, up to its body: `create` is
/// `CREATE` or `CREATE OR REPLACE`.
pub(super) fn apply_evidence_head(s: &str, create: &str) -> String {
    format!(
        r#"{create} FUNCTION {s}.apply_evidence(
    p_kind text[], p_thread text[], p_ns text[], p_checkpoint text[], p_evidence text[],
    p_sent_ago_ms bigint[], p_hold_ms bigint, p_lease_ms bigint,
    p_superseded_grace_ms bigint, p_retain_ms bigint
) RETURNS TABLE (item integer, claim {s}.claims) LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $f$"#
    )
}

/// The migration adding `apply_evidence`.
pub(super) fn evidence_batch_migration(s: &str) -> String {
    let head = apply_evidence_head(s, "CREATE");
    format!(
        r#"
-- Item i of the arrays is one write's evidence, applied as its own
-- function applies it alone, in order; the claims it consumed are
-- returned with i.
{head}
DECLARE
    i integer;
    r {s}.claims%ROWTYPE;
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_kind, 1), 0) LOOP
        IF p_kind[i] = 'progress' THEN
            PERFORM * FROM {s}.note_progress(p_thread[i], p_ns[i], p_checkpoint[i],
                p_evidence[i], p_hold_ms, p_sent_ago_ms[i]);
        ELSIF p_kind[i] = 'consumed' THEN
            FOR r IN SELECT * FROM {s}.consume(p_thread[i], p_ns[i], p_checkpoint[i],
                p_evidence[i], p_sent_ago_ms[i], p_lease_ms)
            LOOP
                item := i;
                claim := r;
                RETURN NEXT;
            END LOOP;
        ELSIF p_kind[i] = 'moved_on' THEN
            FOR r IN SELECT * FROM {s}.move_on(p_thread[i], p_ns[i], p_checkpoint[i],
                p_evidence[i], p_lease_ms, p_superseded_grace_ms, p_retain_ms)
            LOOP
                item := i;
                claim := r;
                RETURN NEXT;
            END LOOP;
        ELSE
            RAISE EXCEPTION 'resumeguard: unknown evidence kind %', p_kind[i];
        END IF;
    END LOOP;
END
$f$;
"#
    )
}
