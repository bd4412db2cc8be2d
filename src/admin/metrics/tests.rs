//! The decision counters and the statement histogram as `/metrics`
//! renders them, recorded into a recorder local to each test.

use std::time::{Duration, Instant};

use metrics::with_local_recorder;

use super::*;
use crate::claims::{Holder, RunLease};
use crate::metrics::{claim_refused, claim_served, forks_served, statement_completed};
use crate::policy::claims::{takeover_metric_label, Refusal, TAKEOVER_LAPSED};
use crate::saver::classify::StatementKind;

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
        statement_completed(StatementKind::Migration.label(), Some(executed));
        statement_completed(StatementKind::WritesRead.label(), Some(Instant::now()));
        statement_completed(StatementKind::Unrecognized.label(), Some(Instant::now()));
        // A Describe's watch was never executed: neither counted nor timed.
        statement_completed(StatementKind::Migration.label(), None);
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
        claim_served(None);
        claim_served(Some(takeover_metric_label(Some(TAKEOVER_LAPSED))));
        claim_served(Some(takeover_metric_label(Some("abandoned"))));
        for refusal in [
            Refusal::Answered {
                by: holder(),
                at_ms: 0,
            },
            Refusal::RunInProgress { lease },
            Refusal::StoreUnavailable("gone".into()),
        ] {
            claim_refused(refusal.metric_label());
        }
        forks_served(0);
        forks_served(2);
    });
    for line in [
        "resumeguard_claims_total{outcome=\"taken\"} 1",
        "resumeguard_claims_total{outcome=\"takeover\"} 2",
        "resumeguard_claims_total{outcome=\"refused\"} 3",
        "resumeguard_claim_takeovers_total{reason=\"lapsed\"} 1",
        "resumeguard_claim_takeovers_total{reason=\"abandoned\"} 1",
        "resumeguard_claims_refused_total{reason=\"answered\"} 1",
        "resumeguard_claims_refused_total{reason=\"in_flight\"} 0",
        "resumeguard_claims_refused_total{reason=\"run_in_progress\"} 1",
        "resumeguard_claims_refused_total{reason=\"store_unavailable\"} 1",
        "resumeguard_forks_served_total 2",
    ] {
        assert!(has(&body, line), "{line} missing:\n{body}");
    }
}

#[test]
fn known_label_sets_start_at_zero_and_no_family_is_two_types() {
    let body = rendered(|| {});
    for line in [
        "resumeguard_claims_total{outcome=\"taken\"} 0",
        "resumeguard_claim_waits_total 0",
        "resumeguard_writes_fenced_total{reason=\"store_unavailable\"} 0",
        "resumeguard_fence_checks_total{where=\"in_transaction\"} 0",
        "resumeguard_upstream_errors_total{kind=\"lost\"} 0",
        "resumeguard_checkpoint_statements_total{class=\"read_latest\"} 0",
        "resumeguard_claims_ahead_total{result=\"withdrawn\"} 0",
        "resumeguard_keepalive_errors_total{side=\"upstream\"} 0",
        "resumeguard_evidence_flush_timeouts_total 0",
        "resumeguard_blobs_kept_total 0",
    ] {
        assert!(has(&body, line), "{line} missing:\n{body}");
    }
    for name in [
        "resumeguard_claims_ahead_total",
        "resumeguard_keepalive_errors_total",
        "resumeguard_evidence_flush_timeouts_total",
    ] {
        let help = format!("# HELP {name} ");
        assert!(
            body.lines().any(|l| l.starts_with(&help)),
            "{help}missing:\n{body}"
        );
    }
    let types: Vec<(&str, &str)> = body
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .collect();
    for (name, kind) in &types {
        match *kind {
            "counter" => assert!(name.ends_with("_total"), "{name}"),
            _ => assert!(!name.ends_with("_total"), "{name} is a {kind}"),
        }
    }
}

/// Every metric name the source spells is documented in docs/metrics.md
/// (the one string of that shape that names no metric is skipped).
#[test]
fn every_metric_in_the_source_is_in_docs_metrics_md() {
    const NOT_METRICS: &[&str] = &["resumeguard_injected"];
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let docs = std::fs::read_to_string(root.join("docs/metrics.md")).unwrap();
    let pattern = regex::Regex::new(r#""((?:resumeguard|process)_[a-z_]+)""#).unwrap();
    let mut names = std::collections::BTreeSet::new();
    let mut dirs = vec![root.join("src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                for c in pattern.captures_iter(&text) {
                    names.insert(c[1].to_owned());
                }
            }
        }
    }
    assert!(names.contains("resumeguard_claims_total"), "{names:?}");
    assert!(names.contains("process_open_fds"), "{names:?}");
    let missing: Vec<&String> = names
        .iter()
        .filter(|n| !NOT_METRICS.contains(&n.as_str()))
        .filter(|n| !docs.contains(&format!("`{n}`")))
        .collect();
    assert!(missing.is_empty(), "not in docs/metrics.md: {missing:?}");
}
