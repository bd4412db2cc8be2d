//! Fence lookups on a claim store that cannot answer: the write goes on as
//! the rule says, and the log says the lookups fail once per run.

use super::*;
use crate::enforce::claim_gate::tests::leg_on_unreachable_store;

#[test]
fn failing_fence_lookups_are_one_error_per_run_not_one_per_write() {
    let leg = leg_on_unreachable_store();
    let gate = FenceGate::default();
    let session = Holder {
        proxy_id: "proxy-a".into(),
        session_id: 7,
        client_addr: "127.0.0.1:1".into(),
        application_name: "app".into(),
    };
    let at = |checkpoint_id: &str| CheckpointRef {
        thread_id: "t1".into(),
        checkpoint_ns: String::new(),
        checkpoint_id: checkpoint_id.into(),
    };
    let (verdicts, log) = crate::test_log::captured(|| {
        ["c1", "c2", "c3"].map(|c| gate.lookup(&leg, &session, &at(c), false))
    });
    for verdict in verdicts {
        assert_eq!(
            verdict.metric_labels(),
            ("failed", None),
            "not known claimed: passes"
        );
    }
    let errors = log
        .lines()
        .filter(|l| l.contains("ERROR") && l.contains("fence lookups failing"))
        .count();
    assert_eq!(errors, 1, "{log}");
}
