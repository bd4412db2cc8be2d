//! The gate's decisions on a claim store that cannot answer, counted in a
//! recorder local to each test.

use std::sync::Arc;

use super::*;
use crate::claims::timings::ClaimsTimings;
use crate::saver::checkpoint_ref::CheckpointRef;
use crate::test_metrics::has_line;

/// A leg whose claim store never answers.
pub(crate) fn leg_on_unreachable_store() -> ClaimsLeg {
    ClaimsLeg {
        store: Arc::new(crate::test_pg_server::unreachable()),
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
    ClaimRequest {
        key: ClaimKey {
            at: CheckpointRef {
                thread_id: "t1".into(),
                checkpoint_ns: String::new(),
                checkpoint_id: "c1".into(),
            },
            fingerprint: String::new(),
        },
        holder: Holder {
            proxy_id: "proxy-a".into(),
            session_id: 7,
            client_addr: "127.0.0.1:1".into(),
            application_name: "app".into(),
        },
        head: Head::Running,
    }
}

#[test]
fn a_running_head_served_with_its_run_lease_unknown_is_counted() {
    let leg = leg_on_unreachable_store();
    let (resolution, body) = crate::test_metrics::recorded(|| {
        let ticket = ClaimTicket::new(Arc::new(leg), running_head_read(), None);
        ticket.decide(&|| false);
        ticket.resolution.into_inner()
    });
    assert!(
        matches!(
            resolution.map(|r| r.decision),
            Some(ClaimDecision::Serve { takeover: false })
        ),
        "served: only parked heads fail closed"
    );
    assert!(
        has_line(&body, "resumeguard_run_lease_unchecked_total 1"),
        "{body}"
    );
}
