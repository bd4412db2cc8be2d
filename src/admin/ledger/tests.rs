//! The ledger of a thread built from audit events as the enforcer writes
//! them: each approval's state after each step, and who did what.

use serde_json::json;

use super::*;
use crate::audit::SessionContext;

const THREAD: &str = "t-1";
const C1: &str = "1f0-c1";
const C2: &str = "1f0-c2";

fn who(session_id: u64, app: &str) -> SessionContext {
    SessionContext {
        session_id,
        client_addr: format!("127.0.0.1:{}", 40_000 + session_id),
        user: "postgres".into(),
        database: "app".into(),
        application_name: app.into(),
    }
}

fn at(ctx: &SessionContext, op: Operation, checkpoint: &str) -> AuditEvent {
    AuditEvent::new(ctx, op)
        .with_thread(THREAD)
        .with_checkpoint("", checkpoint)
}

fn parked(ctx: &SessionContext, checkpoint: &str, task: &str) -> AuditEvent {
    let mut ev = at(ctx, Operation::InterruptParked, checkpoint);
    ev.task_id = Some(task.into());
    ev
}

fn saved(ctx: &SessionContext, checkpoint: &str, parent: &str) -> AuditEvent {
    let mut ev = at(ctx, Operation::CheckpointPut, checkpoint);
    ev.parent_checkpoint_id = Some(parent.into());
    ev
}

fn state_after(events: &[AuditEvent]) -> Option<ApprovalState> {
    thread_ledger(THREAD, events.to_vec()).state
}

#[test]
fn an_approval_moves_parked_claimed_running_completed() {
    let runner = who(1, "runner");
    let resumer = who(2, "resumer");
    let racer = who(3, "racer");
    let mut events = vec![
        saved(&runner, C1, "1f0-c0"),
        parked(&runner, C1, "task-gate"),
    ];
    assert_eq!(state_after(&events), Some(ApprovalState::Parked));
    events.push(at(&resumer, Operation::ClaimTaken, C1));
    assert_eq!(state_after(&events), Some(ApprovalState::Claimed));
    events.push(
        at(&racer, Operation::ClaimRefused, C1)
            .with_detail(json!({"sqlstate": "55000", "head": "parked"})),
    );
    events.push(at(&resumer, Operation::ResumeRecorded, C1));
    assert_eq!(state_after(&events), Some(ApprovalState::Running));
    events.push(at(&resumer, Operation::ClaimConsumed, C1));
    assert_eq!(state_after(&events), Some(ApprovalState::Running));
    events.push(saved(&resumer, C2, C1));
    events.push(at(&racer, Operation::ForkServed, C1));
    events.push(at(&racer, Operation::WriteRejected, "1f0-c9"));

    let l = thread_ledger(THREAD, events.clone());
    assert_eq!(l.state, Some(ApprovalState::Completed));
    assert_eq!(l.approvals.len(), 1);
    let a = &l.approvals[0];
    assert_eq!(a.checkpoint_id, C1);
    assert_eq!(a.tasks, vec!["task-gate".to_string()]);
    assert_eq!(a.parked.application_name, "runner");
    let claimed = a.claimed.as_ref().expect("claimed");
    assert_eq!(
        (claimed.session_id, claimed.application_name.as_str()),
        (2, "resumer")
    );
    let answered = a.answered.as_ref().expect("answered");
    assert_eq!(answered.session_id, 2);
    assert!(a.consumed.is_some());
    let completed = a.completed.as_ref().expect("completed");
    assert_eq!(completed.checkpoint_id.as_deref(), Some(C2));
    assert_eq!(a.refused.len(), 1);
    assert_eq!(a.refused[0].session_id, 3);
    assert_eq!(a.refused[0].detail["sqlstate"], "55000");
    assert_eq!(a.forks_served.len(), 1);
    assert_eq!(l.writes_rejected.len(), 1);
    assert!(l.refused.is_empty() && l.forks_served.is_empty());
    assert_eq!(l.timeline, events, "the whole trail comes along, in order");
}

#[test]
fn a_takeover_replaces_the_claim_and_is_listed() {
    let inspector = who(1, "ui");
    let resumer = who(2, "resumer");
    let events = vec![
        parked(&inspector, C1, "task-gate"),
        at(&inspector, Operation::ClaimTaken, C1),
        at(&resumer, Operation::ClaimWaited, C1),
        at(&resumer, Operation::ClaimTakeover, C1),
    ];
    let l = thread_ledger(THREAD, events);
    let a = &l.approvals[0];
    assert_eq!(a.state, ApprovalState::Claimed);
    assert_eq!(a.claimed.as_ref().map(|m| m.session_id), Some(2));
    assert_eq!(a.takeovers.len(), 1);
    assert_eq!(a.waited.len(), 1);
}

#[test]
fn a_second_interrupt_on_the_same_checkpoint_is_a_new_approval() {
    let runner = who(1, "runner");
    let events = vec![
        parked(&runner, C1, "task-ask"),
        at(&runner, Operation::ClaimTaken, C1),
        at(&runner, Operation::ResumeRecorded, C1),
        parked(&runner, C1, "task-ask"),
    ];
    let l = thread_ledger(THREAD, events);
    assert_eq!(l.approvals.len(), 2);
    assert_eq!(l.approvals[0].state, ApprovalState::Completed);
    assert_eq!(
        l.approvals[0].completed.as_ref().map(|m| m.operation),
        Some(Operation::InterruptParked)
    );
    assert_eq!(l.approvals[1].state, ApprovalState::Parked);
    assert_eq!(l.state, Some(ApprovalState::Parked));
}

#[test]
fn parallel_interrupts_share_one_approval_and_moving_on_unanswered_supersedes_it() {
    let runner = who(1, "runner");
    let events = vec![
        parked(&runner, C1, "task-a"),
        parked(&runner, C1, "task-b"),
        saved(&runner, C2, C1),
    ];
    let l = thread_ledger(THREAD, events);
    assert_eq!(l.approvals.len(), 1);
    assert_eq!(l.approvals[0].tasks, vec!["task-a", "task-b"]);
    assert_eq!(l.state, Some(ApprovalState::Superseded));
}

#[test]
fn refusals_and_forks_off_any_parked_checkpoint_stay_on_the_thread() {
    let racer = who(3, "racer");
    let events = vec![
        at(&racer, Operation::ClaimRefused, C2).with_detail(json!({"head": "running"})),
        at(&racer, Operation::ForkServed, C2),
    ];
    let l = thread_ledger(THREAD, events);
    assert_eq!(l.state, None);
    assert!(l.approvals.is_empty());
    assert_eq!(l.refused.len(), 1);
    assert_eq!(l.forks_served.len(), 1);
}

#[test]
fn a_fenced_write_is_listed_on_the_approval_it_continues() {
    let holder = who(1, "resumer");
    let stale = who(2, "resumer");
    let fenced = |continues: &str| {
        at(&stale, Operation::WriteFenced, "1f0-c7")
            .with_detail(json!({"sqlstate": "RGF01", "continues": continues}))
    };
    let events = vec![
        parked(&holder, C1, "task-gate"),
        at(&holder, Operation::ClaimTaken, C1),
        fenced(C1),
        fenced("1f0-elsewhere"),
    ];
    let l = thread_ledger(THREAD, events);
    let a = &l.approvals[0];
    assert_eq!(a.fenced.len(), 1);
    assert_eq!(a.fenced[0].session_id, 2);
    assert_eq!(a.fenced[0].detail["sqlstate"], "RGF01");
    assert_eq!(
        l.writes_fenced.len(),
        1,
        "a fence on no parked checkpoint is the thread's"
    );
}
