//! The gate's decisions on a claim store that cannot answer, counted in a
//! recorder local to each test.

use std::sync::Arc;

use super::*;
use crate::claims::timings::ClaimsTimings;
use crate::saver::checkpoint_ref::CheckpointRef;
use crate::test_metrics::has_line;

/// A leg whose claim store never answers.
pub(crate) fn leg_on_unreachable_store() -> ClaimsLeg {
    leg_on(Arc::new(crate::test_pg_server::unreachable()))
}

/// A leg on `store`, remembering no claim yet.
fn leg_on(store: Arc<ClaimStore>) -> ClaimsLeg {
    ClaimsLeg {
        store,
        proxy_id: "proxy-a".into(),
        lapse_ms: 1_000,
        timings: LiveClaimsTimings::new(ClaimsTimings::default()),
        policy: WaitPolicy::Refuse,
        inspection_patterns: Vec::new(),
        inspection_sql_hint: false,
        evidence: None,
        held: Arc::default(),
        parked: Arc::default(),
        draining: Draining::default(),
        fence_in_transaction: None,
        fence_lookups: Arc::default(),
    }
}

fn running_head_read() -> ClaimRequest {
    head_read(Head::Running, "")
}

/// session 7's read of t1's head c1, parked on the interrupts
/// `fingerprint` names, or running.
fn head_read(head: Head, fingerprint: &str) -> ClaimRequest {
    ClaimRequest {
        key: ClaimKey {
            at: CheckpointRef {
                thread_id: "t1".into(),
                checkpoint_ns: String::new(),
                checkpoint_id: "c1".into(),
            },
            fingerprint: fingerprint.into(),
        },
        holder: Holder {
            proxy_id: "proxy-a".into(),
            session_id: 7,
            client_addr: "127.0.0.1:1".into(),
            application_name: "app".into(),
        },
        head,
    }
}

#[test]
fn a_running_head_served_with_its_run_lease_unknown_is_counted_and_says_why() {
    let leg = leg_on_unreachable_store();
    let (resolution, body) = crate::test_metrics::recorded(|| {
        let ticket = ClaimTicket::new(Arc::new(leg), running_head_read(), None);
        ticket.decide(&|| None);
        ticket.resolution.into_inner()
    });
    let resolution = resolution.expect("decided");
    assert_eq!(
        resolution.decision,
        ClaimDecision::Serve { takeover: false },
        "served: only parked heads fail closed"
    );
    let why = resolution.lease_unknown.expect("the store's failure kept");
    assert!(why.contains("claim store unavailable"), "{why}");
    assert!(
        has_line(&body, "resumeguard_run_lease_unchecked_total 1"),
        "{body}"
    );
}

#[test]
fn a_holder_reading_its_parked_head_again_is_served_the_claim_it_held_already() {
    let db = crate::test_pg_server::PgSchema::new("gate-held-again");
    let store = Arc::new(db.open());
    let req = head_read(Head::Parked, "f1");
    let decided = |leg: &Arc<ClaimsLeg>| {
        let ticket = ClaimTicket::new(Arc::clone(leg), req.clone(), None);
        ticket.decide(&|| None);
        let res = ticket.resolution.into_inner().expect("decided");
        assert_eq!(res.decision, ClaimDecision::Serve { takeover: false });
        res.held_already
    };
    let leg = Arc::new(leg_on(Arc::clone(&store)));
    assert!(!decided(&leg), "the first read takes the claim");
    assert!(decided(&leg), "answered from the leg's memory");
    let forgetful = Arc::new(leg_on(store));
    assert!(decided(&forgetful), "answered by the store");
}

#[test]
fn a_read_waiting_for_another_holders_claim_ends_when_its_client_cancels() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let db = crate::test_pg_server::PgSchema::new("gate-canceled");
    let store = Arc::new(db.open());
    let holder = ClaimTicket::new(
        Arc::new(leg_on(Arc::clone(&store))),
        head_read(Head::Parked, "f1"),
        None,
    );
    holder.decide(&|| None);
    let taken = holder.resolution.into_inner().map(|r| r.decision);
    assert_eq!(taken, Some(ClaimDecision::Serve { takeover: false }));
    let mut waiting = leg_on(store);
    waiting.policy = WaitPolicy::Wait {
        max_wait_ms: 60_000,
        poll_ms: 5,
    };
    let mut reader = head_read(Head::Parked, "f1");
    reader.holder.session_id = 8;
    let looked = AtomicUsize::new(0);
    let (resolution, body) = crate::test_metrics::recorded(|| {
        let ticket = ClaimTicket::new(Arc::new(waiting), reader, None);
        // The client cancels once the reader has found the claim held.
        ticket
            .decide(&|| (looked.fetch_add(1, Ordering::SeqCst) >= 2).then_some(WaitEnd::Canceled));
        ticket.resolution.into_inner()
    });
    let res = resolution.expect("decided");
    assert_eq!(
        res.decision,
        ClaimDecision::Refuse {
            reason: Refusal::Canceled
        }
    );
    assert!(res.waited_ms < 60_000, "{res:?}");
    assert_eq!(Refusal::Canceled.sqlstate(), "57014");
    let counted = r#"resumeguard_claims_refused_total{reason="canceled"} 1"#;
    assert!(has_line(&body, counted), "{body}");
}
