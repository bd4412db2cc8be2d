//! LangGraph Python 3.2.0's `prune()`, delta-channel history and shallow
//! saver statements as they reach the wire (psycopg turns `%s` into `$n`),
//! read from `langgraph/checkpoint/postgres/{base,shallow}.py`; the 2.0.25
//! shallow read for its 4-element layout. Shared by the classification and
//! evidence tests.

pub const PRUNE_DELETE_THREADS: [&str; 3] = [
    "DELETE FROM checkpoints WHERE thread_id = ANY($1)",
    "DELETE FROM checkpoint_blobs WHERE thread_id = ANY($1)",
    "DELETE FROM checkpoint_writes WHERE thread_id = ANY($1)",
];

pub const PRUNE_DELTA_THREADS: &str = "
SELECT thread_id FROM checkpoints
WHERE thread_id = ANY($1) AND (
    metadata ? 'counters_since_delta_snapshot'
    OR metadata ? 'delta_writes_versioned'
)
UNION
SELECT c.thread_id
FROM checkpoints c
CROSS JOIN LATERAL jsonb_each(c.checkpoint -> 'channel_values') AS v
CROSS JOIN LATERAL (
    SELECT 1 FROM checkpoint_blobs b
    WHERE b.thread_id = c.thread_id
    AND b.checkpoint_ns = c.checkpoint_ns
    AND b.channel = v.key
    AND b.version = c.checkpoint -> 'channel_versions' ->> v.key
    LIMIT 1
) AS snapshot
WHERE c.thread_id = ANY($2) AND v.value = 'true'::jsonb
";

pub const PRUNE_HEADS: &str = "
SELECT
    h.checkpoint_ns,
    h.checkpoint_id AS head,
    CASE WHEN (c.checkpoint ->> 'v')::int < 4 AND EXISTS (
        SELECT 1 FROM checkpoint_writes w
        WHERE w.thread_id = $1
        AND w.checkpoint_ns = h.checkpoint_ns
        AND w.checkpoint_id = c.parent_checkpoint_id
        AND w.channel = '__pregel_tasks'
    ) THEN c.parent_checkpoint_id END AS sends_parent,
    c.metadata -> 'parents' ->> '' AS root,
    EXISTS (
        SELECT 1 FROM checkpoints r
        WHERE r.thread_id = $2 AND r.checkpoint_ns = ''
        AND r.checkpoint_id = c.metadata -> 'parents' ->> ''
    ) AS root_saved
FROM (
    SELECT DISTINCT ON (checkpoint_ns) checkpoint_ns, checkpoint_id
    FROM checkpoints
    WHERE thread_id = $3
    ORDER BY checkpoint_ns DESC, checkpoint_id DESC
) AS h
CROSS JOIN LATERAL (
    SELECT checkpoint, parent_checkpoint_id, metadata FROM checkpoints
    WHERE thread_id = $4
    AND checkpoint_ns = h.checkpoint_ns
    AND checkpoint_id = h.checkpoint_id
) AS c
";

pub const PRUNE_UNKEPT: &str = "
SELECT checkpoint_id FROM checkpoints
WHERE thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id <> ALL($3)
";

pub const PRUNE_WRITES: &str = "
DELETE FROM checkpoint_writes
WHERE thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id = ANY($3)
";

pub const PRUNE_CHECKPOINTS: &str = "
WITH deleted AS (
    DELETE FROM checkpoints
    WHERE thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id <> ALL($3)
    RETURNING checkpoint -> 'channel_versions' AS versions
)
SELECT DISTINCT v.key AS channel, v.value AS version
FROM deleted
CROSS JOIN LATERAL jsonb_each_text(deleted.versions) AS v
";

pub const PRUNE_PARENTS: &str = "
UPDATE checkpoints SET parent_checkpoint_id = NULL
WHERE thread_id = $1 AND checkpoint_ns = $2
AND checkpoint_id = ANY($3) AND parent_checkpoint_id <> ALL($4)
";

pub const PRUNE_REFERENCED_BLOBS: &str = "
SELECT DISTINCT v.key AS channel, v.value AS version
FROM checkpoints c
CROSS JOIN LATERAL jsonb_each_text(c.checkpoint -> 'channel_versions') AS v
WHERE c.thread_id = $1 AND c.checkpoint_ns = $2
";

pub const PRUNE_BLOBS: &str = "
DELETE FROM checkpoint_blobs
WHERE thread_id = $1 AND checkpoint_ns = $2 AND channel = $3 AND version = ANY($4)
";

pub const PRUNE_SUBGRAPH_CALLS: [&str; 3] = [
    "DELETE FROM checkpoints WHERE thread_id = $1 AND checkpoint_ns = ANY($2)",
    "DELETE FROM checkpoint_writes WHERE thread_id = $1 AND checkpoint_ns = ANY($2)",
    "DELETE FROM checkpoint_blobs WHERE thread_id = $1 AND checkpoint_ns = ANY($2)",
];

/// `_build_delta_stage1_sql(["messages"], paged=True, include_cursor=True)`.
pub const DELTA_STAGE1: &str = "SELECT checkpoint_id, parent_checkpoint_id, \
checkpoint -> 'channel_versions' ->> $1 AS ver_0, \
EXISTS (SELECT 1 FROM checkpoint_blobs b0 WHERE b0.thread_id = checkpoints.thread_id \
AND b0.checkpoint_ns = checkpoints.checkpoint_ns AND b0.channel = $2 \
AND b0.version = checkpoint -> 'channel_versions' ->> $3 AND b0.type <> 'empty') AS hb_0, \
checkpoint -> 'channel_values' -> $4 AS inline_0 \
FROM checkpoints WHERE thread_id = $5 AND checkpoint_ns = $6 \
AND checkpoint_id <= $7 ORDER BY checkpoint_id DESC LIMIT $8";

/// `_build_delta_stage2_sql` with two chained channels and one seeded.
pub const DELTA_STAGE2: &str = "SELECT 'w'::text AS _kind, checkpoint_id, channel, type, blob, \
task_id, task_path, idx, NULL::text AS version FROM checkpoint_writes \
WHERE thread_id = $1 AND checkpoint_ns = $2 AND channel = $3 AND checkpoint_id = ANY($4) \
UNION ALL SELECT 'w'::text AS _kind, checkpoint_id, channel, type, blob, \
task_id, task_path, idx, NULL::text AS version FROM checkpoint_writes \
WHERE thread_id = $5 AND checkpoint_ns = $6 AND channel = $7 AND checkpoint_id = ANY($8) \
UNION ALL SELECT 'b'::text AS _kind, NULL::text AS checkpoint_id, channel, \
type, blob, NULL::text AS task_id, NULL::text AS task_path, NULL::int AS idx, version \
FROM checkpoint_blobs WHERE thread_id = $9 AND checkpoint_ns = $10 AND channel = $11 \
AND version = $12";

pub const SHALLOW_SELECT_SQL: &str = "
select
    thread_id,
    checkpoint,
    checkpoint_ns,
    metadata,
    (
        select array_agg(array[bl.channel::bytea, bl.type::bytea, bl.blob])
        from jsonb_each_text(checkpoint -> 'channel_versions')
        inner join checkpoint_blobs bl
            on bl.thread_id = checkpoints.thread_id
            and bl.checkpoint_ns = checkpoints.checkpoint_ns
            and bl.channel = jsonb_each_text.key
    ) as channel_values,
    (
        select
        array_agg(array[cw.task_id::text::bytea, cw.channel::bytea, cw.type::bytea, cw.blob, convert_to(cw.task_path, 'UTF8'), cw.idx::text::bytea])
        from checkpoint_writes cw
        where cw.thread_id = checkpoints.thread_id
            and cw.checkpoint_ns = checkpoints.checkpoint_ns
            and cw.checkpoint_id = (checkpoint->>'id')
    ) as pending_writes,
    (
        select array_agg(array[cw.type::bytea, cw.blob] order by cw.task_path, cw.task_id, cw.idx)
        from checkpoint_writes cw
        where cw.thread_id = checkpoints.thread_id
            and cw.checkpoint_ns = checkpoints.checkpoint_ns
            and cw.channel = '__pregel_tasks'
    ) as pending_sends
from checkpoints ";

/// 2.0.25's shallow read differs in its `pending_writes` element.
pub const SHALLOW_2_0_PENDING_WRITES: &str = "array_agg(array[cw.task_id::text::bytea, cw.channel::bytea, cw.type::bytea, cw.blob] order by cw.task_id, cw.idx)";

pub const SHALLOW_DELETE_WRITES: &str = "DELETE FROM checkpoint_writes
                WHERE thread_id = $1 AND checkpoint_ns = $2 AND checkpoint_id NOT IN ($3, $4)";

pub const SHALLOW_UPSERT_BLOBS: &str = "
    INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, type, blob)
    VALUES ($1, $2, $3, $4, $5)
    ON CONFLICT (thread_id, checkpoint_ns, channel) DO UPDATE SET
        type = EXCLUDED.type,
        blob = EXCLUDED.blob;
";

pub const SHALLOW_UPSERT_CHECKPOINT: &str = "
    INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint, metadata)
    VALUES ($1, $2, $3, $4)
    ON CONFLICT (thread_id, checkpoint_ns)
    DO UPDATE SET
        checkpoint = EXCLUDED.checkpoint,
        metadata = EXCLUDED.metadata;
";

/// The Python test suite's own look-ups of a thread's rows (test_prune.py).
pub const SUITE_ROW_LISTINGS: [&str; 3] = [
    "SELECT checkpoint_ns, checkpoint_id FROM checkpoints WHERE thread_id = $1 ORDER BY 1, 2",
    "SELECT checkpoint_ns, checkpoint_id, task_id, idx FROM checkpoint_writes WHERE thread_id = $1 ORDER BY 1, 2, 3, 4",
    "SELECT checkpoint_ns, channel, version FROM checkpoint_blobs WHERE thread_id = $1 ORDER BY 1, 2, 3",
];
