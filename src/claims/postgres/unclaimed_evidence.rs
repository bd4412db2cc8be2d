//! The migration that makes the evidence of a thread the store keeps
//! nothing for cost one index probe. Every committed checkpoint write
//! through the proxy becomes evidence, and most threads never park: a
//! park's six items each ran their decision function (consume, move on,
//! each reading the clock, the claims and the leases) to change nothing,
//! about 2 ms of the database's CPU per park on an idle server, and more
//! beside the run it slows. A thread with no claim and no run lease has
//! nothing for evidence to consume, supersede or renew, so its items are
//! skipped after its lock is taken (a fence's transaction on it has
//! committed by then); the rest run as before, and the claims they consume
//! come back under their own item's index. A consequence: the retention
//! purge a thread's move-on runs now runs only on threads that were
//! claimed, which are the only ones that leave rows behind.

use super::evidence_batch::apply_evidence_head;
use super::thread_lock::lock_threads;

pub(super) fn unclaimed_evidence_migration(s: &str) -> String {
    let head = apply_evidence_head(s, "CREATE OR REPLACE");
    let lock = lock_threads("p_thread");
    let kept = |a: &str| {
        format!("ARRAY(SELECT {a}[j] FROM unnest(keep) WITH ORDINALITY AS u(j, n) ORDER BY n)")
    };
    let (kind, thread, ns) = (kept("p_kind"), kept("p_thread"), kept("p_ns"));
    let (checkpoint, evidence, ago) = (
        kept("p_checkpoint"),
        kept("p_evidence"),
        kept("p_sent_ago_ms"),
    );
    format!(
        r#"
-- A batch of evidence: the lock of every thread it names, in key order;
-- then the items of threads with a claim or a run lease, in order, each
-- consumed claim returned with its item's index in the whole batch.
{head}
DECLARE
    k integer;
    keep integer[];
BEGIN
{lock}    SELECT array_agg(i ORDER BY i) INTO keep FROM generate_subscripts(p_kind, 1) AS i
     WHERE EXISTS (SELECT 1 FROM {s}.claims c WHERE c.thread_id = p_thread[i])
        OR EXISTS (SELECT 1 FROM {s}.run_leases l WHERE l.thread_id = p_thread[i]);
    IF keep IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT keep[f.item], f.claim FROM {s}.apply_evidence_unlocked(
        {kind},
        {thread},
        {ns},
        {checkpoint},
        {evidence},
        {ago},
        p_hold_ms, p_lease_ms, p_superseded_grace_ms, p_retain_ms) f;
END
$f$;
"#
    )
}
