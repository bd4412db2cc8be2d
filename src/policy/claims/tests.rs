//! The consume-once decisions, with made-up store answers and times.

use super::*;

const T0: i64 = 1_700_000_000_000;
const WAIT: WaitPolicy = WaitPolicy::Wait {
    max_wait_ms: 5_000,
    poll_ms: 50,
};

fn holder() -> Holder {
    Holder {
        proxy_id: "proxy-a".into(),
        session_id: 42,
        client_addr: "10.1.2.3:50123".into(),
        application_name: "approver".into(),
    }
}

fn key() -> ClaimKey {
    ClaimKey {
        at: CheckpointRef {
            thread_id: "t-1".into(),
            checkpoint_ns: String::new(),
            checkpoint_id: "1f0-c5".into(),
        },
        fingerprint: "abcdef0123456789".repeat(4),
    }
}

fn rec(state: ClaimState, lapse_at_ms: i64) -> ClaimRecord {
    ClaimRecord {
        key: key(),
        holder: holder(),
        state,
        claimed_at_ms: T0,
        lapse_at_ms,
        consumed_at_ms: (state == ClaimState::Consumed).then_some(T0 + 7),
        evidence: None,
        epoch: 1,
        refusals: 0,
        takeovers: 0,
        superseded_at_ms: None,
        abandon_at_ms: None,
    }
}

fn busy(lapse_at_ms: i64) -> Result<ClaimOutcome, StoreError> {
    Ok(ClaimOutcome::Busy(rec(ClaimState::Held, lapse_at_ms)))
}

fn in_flight() -> ClaimDecision {
    ClaimDecision::Refuse {
        reason: Refusal::InFlight {
            by: holder(),
            since_ms: T0,
        },
    }
}

#[test]
fn taken_and_already_held_are_served_under_both_policies() {
    for policy in [WAIT, WaitPolicy::Refuse] {
        for o in [
            ClaimOutcome::Taken(rec(ClaimState::Held, T0 + 1)),
            ClaimOutcome::AlreadyHeld(rec(ClaimState::Held, T0 + 1)),
        ] {
            assert_eq!(
                decide_at(&Ok(o), &policy, 0, T0),
                ClaimDecision::Serve { takeover: false }
            );
        }
    }
}

#[test]
fn a_takeover_is_served_and_flagged() {
    let o = Ok(ClaimOutcome::TakenOver {
        previous: rec(ClaimState::Held, T0),
        now: rec(ClaimState::Held, T0 + 30_000),
    });
    for policy in [WAIT, WaitPolicy::Refuse] {
        assert_eq!(
            decide_at(&o, &policy, 1_000, T0),
            ClaimDecision::Serve { takeover: true }
        );
    }
}

#[test]
fn a_takeover_says_whether_it_ended_a_lapse_or_an_abandoned_run() {
    assert_eq!(takeover_reason(&rec(ClaimState::Held, T0)), TAKEOVER_LAPSED);
    assert_eq!(
        takeover_reason(&rec(ClaimState::Consumed, T0)),
        TAKEOVER_ABANDONED
    );
    assert!(TAKEOVER_ABANDONED.contains("abandoned run"));
}

#[test]
fn consumed_is_refused_as_answered_under_both_policies() {
    let o = Ok(ClaimOutcome::Consumed(rec(ClaimState::Consumed, T0 + 1)));
    for policy in [WAIT, WaitPolicy::Refuse] {
        assert_eq!(
            decide_at(&o, &policy, 0, T0),
            ClaimDecision::Refuse {
                reason: Refusal::Answered {
                    by: holder(),
                    at_ms: T0 + 7
                }
            }
        );
    }
}

#[test]
fn busy_under_refuse_is_in_flight_at_once() {
    assert_eq!(
        decide_at(&busy(T0 + 30_000), &WaitPolicy::Refuse, 0, T0),
        in_flight()
    );
}

#[test]
fn busy_under_wait_polls() {
    assert_eq!(
        decide_at(&busy(T0 + 30_000), &WAIT, 0, T0 + 10),
        ClaimDecision::RetryAfter { ms: 50 }
    );
}

#[test]
fn a_retry_never_outlasts_the_lapse_or_the_maximum_wait() {
    // Lapse in 20 ms: ask again then, to take it over.
    assert_eq!(
        decide_at(&busy(T0 + 20), &WAIT, 0, T0),
        ClaimDecision::RetryAfter { ms: 20 }
    );
    // 30 ms of waiting left.
    assert_eq!(
        decide_at(&busy(T0 + 30_000), &WAIT, 4_970, T0),
        ClaimDecision::RetryAfter { ms: 30 }
    );
    // Lapsed by our clock but not the store's: ask right away.
    assert_eq!(
        decide_at(&busy(T0 - 5), &WAIT, 0, T0),
        ClaimDecision::RetryAfter { ms: 0 }
    );
    // Exhaustive: every retry fits both bounds.
    for waited in (0..5_000).step_by(37) {
        for lapse_in in (1..200).step_by(13) {
            match decide_at(&busy(T0 + lapse_in), &WAIT, waited, T0) {
                ClaimDecision::RetryAfter { ms } => {
                    assert!((0..=50).contains(&ms));
                    assert!(ms <= lapse_in);
                    assert!(waited + ms <= 5_000);
                }
                other => panic!("{other:?}"),
            }
        }
    }
}

#[test]
fn busy_after_the_maximum_wait_is_in_flight() {
    assert_eq!(decide_at(&busy(T0 + 30_000), &WAIT, 5_000, T0), in_flight());
    assert_eq!(decide_at(&busy(T0 + 30_000), &WAIT, 9_999, T0), in_flight());
}

#[test]
fn a_zero_poll_does_not_spin() {
    let policy = WaitPolicy::Wait {
        max_wait_ms: 100,
        poll_ms: 0,
    };
    assert_eq!(
        decide_at(&busy(T0 + 30_000), &policy, 0, T0),
        ClaimDecision::RetryAfter { ms: 1 }
    );
}

#[test]
fn a_store_error_fails_closed() {
    let err = StoreError::PgOpen {
        at: "postgres rg@db:5432/app".into(),
        reason: "connection refused".into(),
    };
    for policy in [WAIT, WaitPolicy::Refuse] {
        let d = decide_at(&Err(err.clone()), &policy, 0, T0);
        let ClaimDecision::Refuse { reason } = d else {
            panic!("{d:?}")
        };
        assert_eq!(reason.sqlstate(), "58000");
        let msg = reason.message(&key());
        assert!(msg.contains("claim store unavailable"), "{msg}");
        assert!(msg.contains("rg@db:5432/app"), "{msg}");
        assert!(msg.contains("fail closed"), "{msg}");
    }
}

#[test]
fn the_hint_of_an_unavailable_store_names_the_database_and_credential() {
    let postgres = StoreError::PgOpen {
        at: "postgres rg@db:5432/app".into(),
        reason: "invalid configuration: password missing".into(),
    };
    let hint = |e: StoreError| match decide_at(&Err(e), &WaitPolicy::Refuse, 0, T0) {
        ClaimDecision::Refuse { reason } => reason.hint(),
        d => panic!("{d:?}"),
    };
    let pg = hint(postgres);
    assert!(
        pg.contains("claims database") && pg.contains("[claims] dsn"),
        "{pg}"
    );
}

#[test]
fn a_wait_is_measured_against_the_stores_clock_not_this_hosts() {
    // A lapse 30 ms after the store decided: the next ask comes then,
    // whatever this host's wall clock reads (years before T0 here).
    assert_eq!(
        decide_at(&busy(T0 + 30), &WAIT, 0, T0),
        ClaimDecision::RetryAfter { ms: 30 }
    );
    assert_eq!(
        decide_at(&busy(T0 + 60_000), &WAIT, 0, T0),
        ClaimDecision::RetryAfter { ms: 50 }
    );
}

#[test]
fn refusal_messages_say_who_when_and_which_interrupt() {
    let answered = Refusal::Answered {
        by: holder(),
        at_ms: T0 + 7,
    };
    assert_eq!(answered.sqlstate(), "55000");
    assert_eq!(
        answered.message(&key()),
        "resumeguard: interrupt already answered: thread \"t-1\", checkpoint_ns \"\", \
         checkpoint \"1f0-c5\", interrupt abcdef012345 was answered by client \
         10.1.2.3:50123 (application_name \"approver\", proxy proxy-a, session 42) at \
         2023-11-14T22:13:20.007Z; this read of the parked checkpoint was refused before its node ran"
    );
    let flying = Refusal::InFlight {
        by: holder(),
        since_ms: T0,
    };
    assert_eq!(flying.sqlstate(), "55006");
    let msg = flying.message(&key());
    assert!(
        msg.starts_with("resumeguard: interrupt is being answered"),
        "{msg}"
    );
    assert!(msg.contains("application_name \"approver\""), "{msg}");
    assert!(msg.contains("2023-11-14T22:13:20.000Z"), "{msg}");
    assert!(!flying.hint().is_empty() && !answered.hint().is_empty());
}

fn lease() -> RunLease {
    RunLease {
        thread_id: "t-1".into(),
        checkpoint_ns: String::new(),
        answered_checkpoint_id: "1f0-c5".into(),
        fingerprint: "abcdef0123456789".repeat(4),
        holder: holder(),
        answered_at_ms: T0 + 7,
        last_write_ms: T0 + 900,
        until_ms: T0 + 10_900,
    }
}

#[test]
fn a_running_head_under_another_sessions_lease_is_refused() {
    let other = Holder {
        session_id: 43,
        ..holder()
    };
    let decision = decide_running_head(&Ok(Some(lease())), &other, false);
    let ClaimDecision::Refuse { reason } = &decision else {
        panic!("{decision:?}");
    };
    assert_eq!(reason.sqlstate(), SQLSTATE_ANSWERED);
    let head = ClaimKey {
        at: key().at.sibling("1f0-c6"),
        fingerprint: String::new(),
    };
    assert_eq!(
        reason.message(&head),
        "resumeguard: interrupt already answered and its run is in progress: thread \"t-1\", \
         checkpoint_ns \"\": interrupt abcdef012345 of checkpoint \"1f0-c5\" was answered by \
         client 10.1.2.3:50123 (application_name \"approver\", proxy proxy-a, session 42) at \
         2023-11-14T22:13:20.007Z, and that run last wrote at 2023-11-14T22:13:20.900Z; this \
         read of the thread's head (checkpoint \"1f0-c6\", tasks still to run) was refused \
         before any node ran"
    );
    assert!(reason.hint().contains("run_lease_ms"));
}

#[test]
fn a_running_head_is_served_to_its_run_without_a_lease_or_store() {
    let served = ClaimDecision::Serve { takeover: false };
    assert_eq!(
        decide_running_head(&Ok(Some(lease())), &holder(), false),
        served
    );
    assert_eq!(decide_running_head(&Ok(None), &holder(), false), served);
    // Only reads of parked heads fail closed.
    let down = Err(StoreError::PgOpen {
        at: "postgres rg@nowhere:5432/app".into(),
        reason: "connection refused".into(),
    });
    assert_eq!(decide_running_head(&down, &holder(), false), served);
}

#[test]
fn a_draining_proxy_serves_a_running_head_only_to_its_leaseholder() {
    let other = Holder {
        session_id: 43,
        ..holder()
    };
    let shutting = ClaimDecision::Refuse {
        reason: Refusal::ShuttingDown,
    };
    assert_eq!(decide_running_head(&Ok(None), &other, true), shutting);
    let down = Err(StoreError::PgOpen {
        at: "postgres rg@nowhere:5432/app".into(),
        reason: "connection refused".into(),
    });
    assert_eq!(decide_running_head(&down, &other, true), shutting);
    assert_eq!(
        decide_running_head(&Ok(Some(lease())), &holder(), true),
        ClaimDecision::Serve { takeover: false }
    );
    assert_eq!(
        Refusal::ShuttingDown.sqlstate(),
        crate::policy::claims::SQLSTATE_IN_FLIGHT
    );
    assert!(Refusal::ShuttingDown
        .message(&key())
        .starts_with("resumeguard is shutting down: thread \"t-1\""));
}

#[test]
fn inspection_marks() {
    let patterns = vec![
        Regex::new("^langgraph-studio").expect("regex"),
        Regex::new("(?i)inspect").expect("regex"),
    ];
    assert!(is_inspection(
        "langgraph-studio/1.2",
        &patterns,
        false,
        false
    ));
    assert!(is_inspection("ops-INSPECTOR", &patterns, false, false));
    assert!(!is_inspection("worker", &patterns, false, false));
    assert!(is_inspection("worker", &patterns, true, false));
    assert!(is_inspection("worker", &patterns, false, true));
    assert!(!is_inspection("anything", &[], false, false));
}

#[test]
fn the_sql_hint_must_be_in_a_comment() {
    assert!(has_inspection_hint(
        "/* resumeguard:inspect */ select * from checkpoints"
    ));
    assert!(has_inspection_hint(
        "select 1 - 2 -- resumeguard:inspect\nfrom checkpoints"
    ));
    assert!(has_inspection_hint("select 1 /* resumeguard:inspect"));
    assert!(!has_inspection_hint("select 'resumeguard:inspect'"));
    assert!(!has_inspection_hint("select a/b - c from t"));
    assert!(!has_inspection_hint("/* other */ select 1"));
}

fn writer_session(proxy: &str, session_id: u64, addr: &str, app: &str) -> Holder {
    Holder {
        proxy_id: proxy.into(),
        session_id,
        client_addr: addr.into(),
        application_name: app.into(),
    }
}

fn held_at(epoch: i64) -> Result<Option<ClaimRecord>, StoreError> {
    Ok(Some(ClaimRecord {
        epoch,
        ..rec(ClaimState::Held, T0 + 1_000)
    }))
}

fn verdict(
    session: &Holder,
    took: &[(String, i64)],
    current: &Result<Option<ClaimRecord>, StoreError>,
) -> WriteVerdict {
    decide_write(
        &Writer {
            session,
            took,
            known_claimed: false,
        },
        current,
    )
}

fn fence_reason(v: WriteVerdict) -> Option<FenceReason> {
    match v {
        WriteVerdict::Fenced { reason, .. } => Some(reason),
        _ => None,
    }
}

#[test]
fn the_holders_session_and_pool_may_continue_a_claimed_checkpoint() {
    let current = held_at(1);
    // The holder itself (proxy-a, session 42, 10.1.2.3, "approver").
    assert_eq!(
        verdict(&holder(), &[], &current),
        WriteVerdict::Accept(Accepted::Holder)
    );
    // Another connection of its pool: same proxy, host and application_name.
    let pooled = writer_session("proxy-a", 43, "10.1.2.3:50999", "approver");
    assert_eq!(
        verdict(&pooled, &[], &current),
        WriteVerdict::Accept(Accepted::Pool)
    );
    // Unclaimed checkpoints are anybody's.
    let stranger = writer_session("proxy-b", 7, "10.9.9.9:1", "other");
    assert_eq!(
        verdict(&stranger, &[], &Ok(None)),
        WriteVerdict::Accept(Accepted::Unclaimed)
    );
}

#[test]
fn a_superseded_holder_is_fenced_unless_it_is_the_holders_own_client() {
    let fp = key().fingerprint;
    let current = held_at(2);
    // Session 41 of proxy-b took epoch 1; proxy-a's session 42 took it over.
    let old = writer_session("proxy-b", 41, "10.1.2.3:50100", "approver");
    assert_eq!(
        fence_reason(verdict(&old, &[(fp.clone(), 1)], &current)),
        Some(FenceReason::Superseded { epoch: 1 })
    );
    assert_eq!(
        fence_reason(verdict(&old, &[], &current)),
        Some(FenceReason::OtherProxy)
    );
    // The same client on the holder's proxy is its pool, whichever of its
    // connections held the earlier generation (an unmarked get_state on
    // one, the resume on another).
    let pooled = writer_session("proxy-a", 41, "10.1.2.3:50100", "approver");
    assert_eq!(
        verdict(&pooled, &[(fp, 1)], &current),
        WriteVerdict::Accept(Accepted::Pool)
    );
    // A generation of another interrupt of the checkpoint is not this one's.
    assert_eq!(
        fence_reason(verdict(&old, &[("other".into(), 1)], &current)),
        Some(FenceReason::OtherProxy)
    );
}

#[test]
fn other_proxies_and_other_clients_are_fenced() {
    let current = held_at(3);
    let elsewhere = writer_session("proxy-b", 42, "10.1.2.3:50123", "approver");
    assert_eq!(
        fence_reason(verdict(&elsewhere, &[], &current)),
        Some(FenceReason::OtherProxy)
    );
    let other_host = writer_session("proxy-a", 5, "10.1.2.4:50123", "approver");
    let other_app = writer_session("proxy-a", 6, "10.1.2.3:50123", "replayer");
    for w in [other_host, other_app] {
        assert_eq!(
            fence_reason(verdict(&w, &[], &current)),
            Some(FenceReason::OtherClient),
            "{w:?}"
        );
    }
    // Consumed by its holder's run: still fenced for others.
    let consumed = Ok(Some(rec(ClaimState::Consumed, T0 + 1_000)));
    let other = writer_session("proxy-b", 1, "10.1.2.3:1", "approver");
    assert_eq!(
        fence_reason(verdict(&other, &[], &consumed)),
        Some(FenceReason::OtherProxy)
    );
}

#[test]
fn a_store_that_cannot_answer_fails_closed_where_a_claim_is_known() {
    let down: Result<Option<ClaimRecord>, StoreError> = Err(StoreError::PgOpen {
        at: "postgres rg@db:5432/app".into(),
        reason: "connection refused".into(),
    });
    let w = holder();
    let known = Writer {
        session: &w,
        took: &[],
        known_claimed: true,
    };
    match decide_write(&known, &down) {
        WriteVerdict::StoreUnavailable(text) => {
            assert!(text.contains("rg@db:5432/app"), "{text}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        verdict(&w, &[], &down),
        WriteVerdict::Accept(Accepted::Unknown)
    );
}

#[test]
fn a_fenced_message_names_the_holder_epoch_and_why() {
    let current = ClaimRecord {
        epoch: 2,
        ..rec(ClaimState::Held, T0)
    };
    let writer = writer_session("proxy-b", 9, "10.0.0.9:4000", "racer");
    let text = fenced_message(
        &CheckpointRef::new("t-1", "", "1f0-c5"),
        &current,
        &FenceReason::OtherProxy,
        &writer,
    );
    for part in [
        "write fenced",
        "thread \"t-1\"",
        "checkpoint \"1f0-c5\"",
        "client 10.1.2.3:50123",
        "proxy proxy-a, session 42",
        "at epoch 2",
        "interrupt abcdef012345",
        "on proxy proxy-b, not the holder's",
        "nothing of this write was committed",
    ] {
        assert!(text.contains(part), "{part}: {text}");
    }
    assert_eq!(client_host("[::1]:5432"), "[::1]");
    assert_eq!(client_host("unix"), "unix");
}

#[test]
fn a_holders_write_is_covered_until_it_can_commit_only_when_the_claim_would_go_first() {
    let holder_ok = WriteVerdict::Accept(Accepted::Holder);
    let pool_ok = WriteVerdict::Accept(Accepted::Pool);
    let until = T0 + COMMIT_COVER_MS;
    // Lapses within the cover: kept until it ends.
    let near = rec(ClaimState::Held, T0 + 500);
    assert_eq!(commit_cover(&holder_ok, &near, T0), Some(until));
    assert_eq!(commit_cover(&pool_ok, &near, T0), Some(until));
    // Holds longer anyway: nothing to do.
    let far = rec(ClaimState::Held, T0 + 30_000);
    assert_eq!(commit_cover(&holder_ok, &far, T0), None);
    // A consumed claim lapses no more; it is kept only once abandonment nears.
    let mut consumed = rec(ClaimState::Consumed, T0 - 1);
    assert_eq!(commit_cover(&holder_ok, &consumed, T0), None);
    consumed.abandon_at_ms = Some(T0 + 1_000);
    assert_eq!(commit_cover(&holder_ok, &consumed, T0), Some(until));
    // Writes not accepted as the holder's are never covered.
    for verdict in [
        WriteVerdict::Accept(Accepted::Unclaimed),
        WriteVerdict::Accept(Accepted::Unknown),
        WriteVerdict::StoreUnavailable("down".into()),
        WriteVerdict::Fenced {
            current: Box::new(near.clone()),
            reason: FenceReason::OtherProxy,
        },
    ] {
        assert_eq!(commit_cover(&verdict, &near, T0), None, "{verdict:?}");
    }
}

#[test]
fn a_key_the_server_converts_is_refused_as_not_supported_in_that_encoding() {
    let refusal = Refusal::ClientEncoding("SJIS".into());
    assert_eq!(refusal.sqlstate(), "0A000");
    assert_eq!(refusal.metric_label(), "client_encoding");
    let message = refusal.message(&key());
    assert!(message.contains("client_encoding SJIS"), "{message}");
    assert!(message.contains("thread \"t-1\""), "{message}");
    assert!(refusal.hint().contains("client_encoding"));
}

#[test]
fn a_head_row_that_does_not_decode_is_refused_as_not_supported() {
    let refusal = Refusal::Undecodable("thread_id: text: not valid UTF-8".into());
    assert_eq!(refusal.sqlstate(), "0A000");
    assert_eq!(refusal.metric_label(), "undecodable");
    let message = refusal.message(&key());
    assert!(message.contains("does not decode (thread_id"), "{message}");
    assert!(message.contains("thread \"t-1\""), "{message}");
    assert!(refusal.hint().contains("inspection"));
}
