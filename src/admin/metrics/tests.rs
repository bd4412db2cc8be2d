//! The decision counters and the statement histogram as `/metrics`
//! renders them, recorded into a recorder local to each test.

use std::time::{Duration, Instant};

use metrics::with_local_recorder;

use super::*;
use crate::claims::{Holder, RunLease};

fn rendered(record: impl FnOnce()) -> String {
    let recorder = recorder().unwrap();
    with_local_recorder(&recorder, || {
        describe();
        record();
    });
    recorder.handle().render()
}

fn has(body: &str, line: &str) -> bool {
    body.lines().any(|l| l == line)
}

#[test]
fn statements_are_counted_and_timed_by_class() {
    let body = rendered(|| {
        let executed = Instant::now() - Duration::from_millis(3);
        statement_completed(&StatementKind::Migration, Some(executed));
        statement_completed(&StatementKind::WritesRead, Some(Instant::now()));
        statement_completed(&StatementKind::Unrecognized, Some(Instant::now()));
        // A Describe's watch was never executed: neither counted nor timed.
        statement_completed(&StatementKind::Migration, None);
    });
    for kind in [
        StatementKind::Migration,
        StatementKind::WritesRead,
        StatementKind::Unrecognized,
    ] {
        let class = kind.label();
        assert!(
            has(&body, &format!("{STATEMENTS}{{class=\"{class}\"}} 1")),
            "{class}:\n{body}"
        );
        assert!(
            has(
                &body,
                &format!("{STATEMENT_SECONDS}_count{{class=\"{class}\"}} 1")
            ),
            "{class}:\n{body}"
        );
    }
    // 3 ms lands above the 2.5 ms bucket and within the 5 ms one.
    let bucket =
        |le: &str| format!("{STATEMENT_SECONDS}_bucket{{class=\"migration\",le=\"{le}\"}}");
    assert!(has(&body, &format!("{} 0", bucket("0.0025"))), "{body}");
    assert!(has(&body, &format!("{} 1", bucket("0.005"))), "{body}");
    assert!(
        body.contains("# HELP resumeguard_checkpoint_statement_seconds"),
        "{body}"
    );
}

fn holder() -> Holder {
    Holder {
        proxy_id: "px".into(),
        session_id: 1,
        client_addr: "127.0.0.1:1".into(),
        application_name: "app".into(),
    }
}

#[test]
fn claim_outcomes_and_refusal_reasons() {
    let lease = RunLease {
        thread_id: "t".into(),
        checkpoint_ns: String::new(),
        answered_checkpoint_id: "c".into(),
        fingerprint: "f".into(),
        holder: holder(),
        answered_at_ms: 0,
        last_write_ms: 0,
        until_ms: 0,
    };
    let body = rendered(|| {
        claim_served(false, None);
        claim_served(true, Some(TAKEOVER_LAPSED));
        claim_served(true, Some("abandoned"));
        claim_refused(&Refusal::Answered {
            by: holder(),
            at_ms: 0,
        });
        claim_refused(&Refusal::RunInProgress { lease });
        claim_refused(&Refusal::StoreUnavailable("gone".into()));
        forks_served(0);
        forks_served(2);
    });
    for line in [
        "resumeguard_claims_total{outcome=\"taken\"} 1",
        "resumeguard_claims_total{outcome=\"takeover\"} 2",
        "resumeguard_claims_total{outcome=\"lapsed\"} 1",
        "resumeguard_claims_total{outcome=\"refused\"} 3",
        "resumeguard_claims_refused_total{reason=\"answered\"} 1",
        "resumeguard_claims_refused_total{reason=\"run_in_progress\"} 1",
        "resumeguard_claims_refused_total{reason=\"store_unavailable\"} 1",
        "resumeguard_forks_served_total 2",
    ] {
        assert!(has(&body, line), "{line} missing:\n{body}");
    }
}
