//! The migrations that make evidence on a checkpoint nobody claimed cost
//! an index probe. Every committed checkpoint write through the proxy
//! becomes evidence, and most checkpoints are never claimed: a park's six
//! items each ran their decision function (consume, move on, each reading
//! the clock, the claims and the leases) to change nothing, about 3 ms of
//! the database's CPU per park, beside the run it slows. An item changes
//! the claims on its own checkpoint and renews its thread's live run
//! lease, nothing else. The first migration skips an item with neither
//! there, after its thread's lock is taken (a fence's transaction on the
//! thread has committed by then); the second makes an item on an
//! unclaimed checkpoint of a leased thread (a resumed run's next
//! checkpoints) renew that lease, once per thread and batch, instead of
//! running its decision. The items on claimed checkpoints run as before,
//! and the claims they consume come back under their own item's index. A
//! consequence: the retention purge a move-on runs now runs when a claimed
//! checkpoint moves on; only claims leave rows behind.

use super::evidence_batch::apply_evidence_head;
use super::leases::renew_live_leases;
use super::thread_lock::lock_threads;

/// Items on a checkpoint with no claim, of a thread with no live run
/// lease, skipped.
pub(super) fn unclaimed_evidence_migration(s: &str) -> String {
    apply_evidence_keeping(
        s,
        Keeping {
            what: "the items on a claimed checkpoint or of a thread with a live run
-- lease, in order, each consumed claim returned with its item's index in
-- the whole batch.",
            declare: "",
            or_kept: format!(
                "
            OR EXISTS (SELECT 1 FROM {s}.run_leases l WHERE l.thread_id = p_thread[i]
                AND l.until_ms > {s}.clock_ms())"
            ),
            otherwise: "",
            then: String::new(),
        },
    )
}

/// Items on a checkpoint with no claim only renew their thread's live
/// run lease (a task's results and a next checkpoint do; progress does
/// not). A resumed run's writes are nearly all of this kind, each a chain
/// of four function calls that took about 0.15 ms of the database's CPU.
/// The batch renews each such thread's lease once, after the items on
/// claimed checkpoints ran as before: the renewal only extends, on the
/// same clock, so the order within a batch does not change the lease.
pub(super) fn lease_only_evidence_migration(s: &str) -> String {
    apply_evidence_keeping(
        s,
        Keeping {
            what: "the items on a claimed checkpoint, in order, each consumed claim
-- returned with its item's index in the whole batch; then, once per
-- thread, the renewal of the live run lease that the other items (a
-- task's results, a next checkpoint) make.",
            declare: "    v_renewed text;
    v_now bigint;
    -- The threads whose live lease the items on unclaimed checkpoints renew.
    renew text[] := '{}';
",
            or_kept: String::new(),
            otherwise: "        ELSIF p_kind[i] IN ('consumed', 'moved_on') AND NOT p_thread[i] = ANY (renew) THEN
            renew := renew || p_thread[i];
        ELSIF p_kind[i] NOT IN ('progress', 'consumed', 'moved_on') THEN
            RAISE EXCEPTION 'resumeguard: unknown evidence kind %', p_kind[i];
",
            then: format!(
                "    IF p_lease_ms > 0 AND cardinality(renew) > 0 THEN
        v_now := {s}.clock_ms();
        FOREACH v_renewed IN ARRAY renew LOOP
{renew}        END LOOP;
    END IF;
",
                renew = renew_live_leases(s, "v_renewed", "v_now")
            ),
        },
    )
}

/// What a version of `apply_evidence` does beside running the items it
/// keeps.
struct Keeping {
    /// What it does, after the thread locks, for its comment.
    what: &'static str,
    /// Its own variables.
    declare: &'static str,
    /// A condition that keeps item `i` beside its checkpoint's claim row.
    or_kept: String,
    /// `ELSIF` branches for the items not kept.
    otherwise: &'static str,
    /// Statements after the kept items ran.
    then: String,
}

/// `apply_evidence` as the lock of every thread the batch names, in key
/// order; then a probe per item (one index lookup of its thread: one
/// statement over all items is planned as a scan of every claim) that
/// keeps the items on a checkpoint with a claim row; then the kept items
/// run by the function each ran before, each consumed claim returned with
/// its item's index in the whole batch.
fn apply_evidence_keeping(s: &str, k: Keeping) -> String {
    let head = apply_evidence_head(s, "CREATE OR REPLACE");
    let lock = lock_threads("p_thread");
    let Keeping {
        what,
        declare,
        or_kept,
        otherwise,
        then,
    } = k;
    format!(
        r#"
-- A batch of evidence: the lock of every thread it names, in key order;
-- then {what}
{head}
DECLARE
    k integer;
    i integer;
{declare}    -- The kept items' indexes in the batch, and their arrays.
    keep integer[] := '{{}}';
    v_kind text[] := '{{}}';
    v_thread text[] := '{{}}';
    v_ns text[] := '{{}}';
    v_checkpoint text[] := '{{}}';
    v_evidence text[] := '{{}}';
    v_ago bigint[] := '{{}}';
BEGIN
{lock}    FOR i IN 1 .. coalesce(array_length(p_kind, 1), 0) LOOP
        IF EXISTS (SELECT 1 FROM {s}.claims c WHERE c.thread_id = p_thread[i]
                AND c.checkpoint_ns = p_ns[i] AND c.checkpoint_id = p_checkpoint[i]){or_kept} THEN
            keep := keep || i;
            v_kind := v_kind || p_kind[i];
            v_thread := v_thread || p_thread[i];
            v_ns := v_ns || p_ns[i];
            v_checkpoint := v_checkpoint || p_checkpoint[i];
            v_evidence := v_evidence || p_evidence[i];
            v_ago := v_ago || p_sent_ago_ms[i];
{otherwise}        END IF;
    END LOOP;
    IF cardinality(keep) > 0 THEN
        RETURN QUERY SELECT keep[f.item], f.claim FROM {s}.apply_evidence_unlocked(v_kind,
            v_thread, v_ns, v_checkpoint, v_evidence, v_ago, p_hold_ms, p_lease_ms,
            p_superseded_grace_ms, p_retain_ms) f;
    END IF;
{then}END
$f$;
"#
    )
}
