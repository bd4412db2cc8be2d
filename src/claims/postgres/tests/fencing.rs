//! The write fence: the holder's write passes and another proxy's is
//! refused, an answer consumes its claim in its own transaction, and
//! evidence on a thread waits for a write fencing on it.

use super::*;

/// `sql`, a call of the fence, for `holder`'s write continuing `k`'s
/// checkpoint: the writer's seven parameters, then `answer` as `$8` if
/// given.
fn fence_call(
    tx: &mut postgres::Transaction<'_>,
    sql: &str,
    k: &ClaimKey,
    holder: &Holder,
    answer: Option<&str>,
) -> Result<u64, postgres::Error> {
    let session = holder.session_id as i64;
    let mut params: Vec<&(dyn postgres::types::ToSql + Sync)> = vec![
        &k.at.thread_id,
        &k.at.checkpoint_ns,
        &k.at.checkpoint_id,
        &holder.proxy_id,
        &session,
        &holder.client_addr,
        &holder.application_name,
    ];
    if let Some(answer) = &answer {
        params.push(answer);
    }
    tx.execute(sql, &params)
}

/// The fence run in a write's transaction with the answer (see
/// `answer_in_write`): `holder`'s write of `answer` continuing `k`'s
/// checkpoint, committed or rolled back.
fn answer_in_write(db: &PgSchema, k: &ClaimKey, holder: &Holder, answer: &str, commit: bool) {
    let s = db.target().schema().to_owned();
    let mut c = db.admin();
    let mut tx = c.transaction().expect("begin");
    let sql =
        format!("SELECT {s}.fence_write($1, $2, $3, $4, $5, $6, $7, '', 2000, $8, false, 60000)");
    fence_call(&mut tx, &sql, k, holder, Some(answer))
        .expect("the holder's write passes its fence");
    if commit {
        tx.commit().expect("commit");
    } else {
        tx.rollback().expect("rollback");
    }
}

#[test]
fn an_answer_consumes_its_claim_in_its_own_transaction_and_is_reported_once() {
    let db = PgSchema::new("answer-in-write");
    let store = db.open();
    let k = key("c1");
    claim_as_p1(&store, &k);
    // Rolled back: nothing was answered, the claim is still held.
    answer_in_write(&db, &k, &holder("p1", 1), "task a wrote approved", false);
    match store.try_claim(&k, &holder("p2", 2), T0 + 1, LAPSE) {
        Ok(ClaimOutcome::Busy(r)) => assert_eq!(r.state, ClaimState::Held),
        other => panic!("{other:?}"),
    }
    // Committed: the claim is consumed with the write, before any evidence
    // of it is applied, and even after its lapse nobody takes it over.
    answer_in_write(&db, &k, &holder("p1", 1), "task a wrote approved", true);
    match store.try_claim(&k, &holder("p2", 2), T0 + 2 * LAPSE, LAPSE) {
        Ok(ClaimOutcome::Consumed(r)) => {
            assert_eq!(r.holder, holder("p1", 1));
            assert_eq!(r.evidence.as_deref(), Some("task a wrote approved"));
        }
        other => panic!("{other:?}"),
    }
    // The write's evidence, applied late, reports that consumption once
    // (for the audit trail); the same evidence again reports nothing.
    let reported = store
        .consume("t-1", "", "c1", "task a wrote approved", T0, T0 + 3)
        .expect("consume");
    assert_eq!(reported.len(), 1, "{reported:?}");
    assert_eq!(reported[0].holder, holder("p1", 1));
    assert!(reported[0].consumed_at_ms.is_some());
    let again = store
        .consume("t-1", "", "c1", "task a wrote approved", T0, T0 + 4)
        .expect("consume");
    assert!(again.is_empty(), "{again:?}");
}

/// The fence by either signature (the older one is what replicas of an
/// older build call): the holder's write passes and keeps its claim past
/// the commit cover, measured on the server's clock; another proxy's write
/// is refused with RGF01, naming why.
#[test]
fn the_fence_passes_the_holder_and_refuses_another_proxy_by_either_signature() {
    let db = PgSchema::new("fence-one-call");
    let store = db.open();
    let k = key("c1");
    claim_as_p1(&store, &k);
    let s = db.target().schema().to_owned();
    let older = format!("SELECT {s}.fence_write($1, $2, $3, $4, $5, $6, $7, '', 2000)");
    let newer =
        format!("SELECT {s}.fence_write($1, $2, $3, $4, $5, $6, $7, '', 2000, NULL, false, 0)");
    for sql in [older, newer] {
        let mut c = db.admin();
        let mut fence = |h: &Holder| {
            let mut tx = c.transaction().expect("begin");
            let server_ms: i64 = tx
                .query_one(
                    "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint",
                    &[],
                )
                .expect("clock")
                .get(0);
            let out = fence_call(&mut tx, &sql, &k, h, None);
            if out.is_ok() {
                tx.commit().expect("commit");
            }
            out.map(|_| server_ms)
        };
        let checked_at = fence(&holder("p1", 1)).expect("the holder's write passes");
        let kept = store.get(&k).expect("read").expect("the claim");
        assert_eq!(kept.state, ClaimState::Held, "{sql}");
        assert!(kept.lapse_at_ms >= checked_at + 2000, "{sql}: {kept:?}");
        let refused = fence(&holder("p2", 2)).expect_err("another proxy's write is fenced");
        let db_error = refused.as_db_error().expect("a server error");
        assert_eq!(db_error.code().code(), "RGF01", "{sql}");
        assert_eq!(db_error.hint(), Some("other_proxy"), "{sql}");
    }
}

/// A write's transaction fences twice on a thread (its progress, then its
/// answer) while the evidence worker applies a batch that renews the
/// thread's run lease and then records progress on the claim the write
/// holds: the batch waits for the write's commit, and neither is aborted
/// as a deadlock.
#[test]
fn evidence_on_a_thread_waits_for_a_write_fencing_on_it_instead_of_deadlocking() {
    let db = PgSchema::new("thread-lock");
    let store = Arc::new(db.open());
    let (earlier, parked) = (key("c0"), key("c1"));
    // An earlier answer on the thread: its run lease is live.
    answer(&store, &earlier);
    store
        .try_claim(&parked, &holder("p1", 1), T0 + 3, LAPSE)
        .expect("claim");

    let s = db.target().schema().to_owned();
    let mut c = db.admin();
    let mut tx = c.transaction().expect("begin");
    tx.execute(
        "SELECT set_config($1, $2, true)",
        &[&super::db_clock::TEST_CLOCK_SETTING, &(T0 + 10).to_string()],
    )
    .expect("the write's clock");
    let progress =
        format!("SELECT {s}.fence_write($1, $2, $3, $4, $5, $6, $7, '', 2000, NULL, false, 0)");
    fence_call(&mut tx, &progress, &parked, &holder("p1", 1), None)
        .expect("the holder's progress passes its fence");

    let worker = {
        let store = Arc::clone(&store);
        let (earlier, parked) = (earlier.clone(), parked.clone());
        std::thread::spawn(move || {
            let items = [
                evidence_item(
                    WriteEvidence::Consumed,
                    &earlier,
                    "task a wrote x",
                    Some(T0 + 4),
                ),
                evidence_item(
                    WriteEvidence::Progress,
                    &parked,
                    "run-level __resume__ recorded",
                    Some(T0 + 4),
                ),
            ];
            store.apply_evidence(&items, T0 + 5, 1_000).map(|_| ())
        })
    };
    // The batch is waiting for the write's transaction.
    let mut watch = db.admin();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let waiting: i64 = watch
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
                &[],
            )
            .expect("activity")
            .get(0);
        if waiting > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the batch never waited");
        std::thread::sleep(Duration::from_millis(10));
    }

    let answer =
        format!("SELECT {s}.fence_write($1, $2, $3, $4, $5, $6, $7, '', 2000, $8, false, 60000)");
    fence_call(
        &mut tx,
        &answer,
        &parked,
        &holder("p1", 1),
        Some("task a wrote approved"),
    )
    .expect("the holder's answer passes its fence");
    tx.commit().expect("the write commits");
    worker
        .join()
        .expect("the worker thread")
        .expect("the batch applies after the write's commit");
    let answered = store.get(&parked).expect("get").expect("row");
    assert_eq!(
        (answered.state, answered.evidence.as_deref()),
        (ClaimState::Consumed, Some("task a wrote approved"))
    );
}
