//! The migration that makes evidence the store has nothing to apply to
//! cost two index probes. Every committed checkpoint write through the
//! proxy becomes evidence, and most checkpoints are never claimed: a
//! park's six items each ran their decision function (consume, move on,
//! each reading the clock, the claims and the leases) to change nothing,
//! about 3 ms of the database's CPU per park, beside the run it slows. An item changes the claims on its own
//! checkpoint and renews its thread's live run lease, nothing else; with
//! neither there, it is skipped, after its thread's lock is taken (a
//! fence's transaction on the thread has committed by then). The rest run
//! as before, and the claims they consume come back under their own item's
//! index. A consequence: the retention purge a move-on runs now runs when a
//! claimed checkpoint (or a thread with a live run lease) moves on; only
//! claims leave rows behind.

use super::evidence_batch::apply_evidence_head;
use super::thread_lock::lock_threads;

pub(super) fn unclaimed_evidence_migration(s: &str) -> String {
    let head = apply_evidence_head(s, "CREATE OR REPLACE");
    let lock = lock_threads("p_thread");
    format!(
        r#"
-- A batch of evidence: the lock of every thread it names, in key order;
-- then the items on a claimed checkpoint or of a thread with a live run
-- lease, in order, each consumed claim returned with its item's index in
-- the whole batch.
{head}
DECLARE
    k integer;
    i integer;
    -- The kept items' indexes in the batch, and their arrays.
    keep integer[] := '{{}}';
    v_kind text[] := '{{}}';
    v_thread text[] := '{{}}';
    v_ns text[] := '{{}}';
    v_checkpoint text[] := '{{}}';
    v_evidence text[] := '{{}}';
    v_ago bigint[] := '{{}}';
BEGIN
{lock}    -- Item by item, so each probe is an index lookup of its thread (one
    -- statement over all items is planned as a scan of every claim).
    FOR i IN 1 .. coalesce(array_length(p_kind, 1), 0) LOOP
        IF EXISTS (SELECT 1 FROM {s}.claims c WHERE c.thread_id = p_thread[i]
                AND c.checkpoint_ns = p_ns[i] AND c.checkpoint_id = p_checkpoint[i])
            OR EXISTS (SELECT 1 FROM {s}.run_leases l WHERE l.thread_id = p_thread[i]
                AND l.until_ms > {s}.clock_ms()) THEN
            keep := keep || i;
            v_kind := v_kind || p_kind[i];
            v_thread := v_thread || p_thread[i];
            v_ns := v_ns || p_ns[i];
            v_checkpoint := v_checkpoint || p_checkpoint[i];
            v_evidence := v_evidence || p_evidence[i];
            v_ago := v_ago || p_sent_ago_ms[i];
        END IF;
    END LOOP;
    IF cardinality(keep) = 0 THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT keep[f.item], f.claim FROM {s}.apply_evidence_unlocked(v_kind,
        v_thread, v_ns, v_checkpoint, v_evidence, v_ago, p_hold_ms, p_lease_ms,
        p_superseded_grace_ms, p_retain_ms) f;
END
$f$;
"#
    )
}
