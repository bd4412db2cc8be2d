//! `GET /threads/{id}`: a thread's approvals as a run ledger, built from
//! its audit trail. Each interrupt parked on a checkpoint is one approval
//! that moves parked → claimed → running → completed (or superseded),
//! citing who parked it, who claimed and who answered it, when its run
//! moved on, and the attempts refused and forks served on the way. The
//! thread's rejected writes, audit gaps and whole timeline come with it.

use serde::Serialize;

use crate::audit::{AuditEvent, Operation};

/// Where an approval is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalState {
    /// The interrupt is recorded; nobody has claimed or answered it.
    Parked,
    /// A reader of the parked head holds the claim; no answer recorded yet.
    Claimed,
    /// The answer is recorded (or the claim consumed): the gated node runs.
    Running,
    /// The run moved on: a child checkpoint was saved, or the node parked
    /// again on a next interrupt.
    Completed,
    /// The thread moved on without an answer (a child checkpoint was saved
    /// while the interrupt was still parked).
    Superseded,
}

/// One audit event as the ledger cites it: when, who, and what it said.
#[derive(Debug, Clone, Serialize)]
pub struct Mark {
    pub time: String,
    /// The replica that recorded it.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub proxy_id: String,
    pub operation: Operation,
    pub session_id: u64,
    pub client_addr: String,
    pub user: String,
    pub application_name: String,
    pub checkpoint_id: Option<String>,
    pub task_id: Option<String>,
    pub detail: serde_json::Value,
}

impl Mark {
    pub(crate) fn of(ev: &AuditEvent) -> Mark {
        Mark {
            time: ev.time.clone(),
            proxy_id: ev.proxy_id.clone(),
            operation: ev.operation,
            session_id: ev.session_id,
            client_addr: ev.client_addr.clone(),
            user: ev.user.clone(),
            application_name: ev.application_name.clone(),
            checkpoint_id: ev.checkpoint_id.clone(),
            task_id: ev.task_id.clone(),
            detail: ev.detail.clone(),
        }
    }
}

/// One interrupt of one checkpoint and what became of it.
#[derive(Debug, Clone, Serialize)]
pub struct Approval {
    pub checkpoint_ns: String,
    pub checkpoint_id: String,
    pub state: ApprovalState,
    /// The `__interrupt__` write (the first, when several tasks parked).
    pub parked: Mark,
    /// Tasks that called `interrupt()` here.
    pub tasks: Vec<String>,
    /// The claim in effect: taken, or the latest takeover.
    pub claimed: Option<Mark>,
    /// The `__resume__` write: who answered.
    pub answered: Option<Mark>,
    /// The claim consumed by evidence of the run.
    pub consumed: Option<Mark>,
    /// What ended the run: its next checkpoint or its next interrupt.
    pub completed: Option<Mark>,
    pub waited: Vec<Mark>,
    pub takeovers: Vec<Mark>,
    pub refused: Vec<Mark>,
    pub forks_served: Vec<Mark>,
    /// Writes continuing this checkpoint from other than its claim's
    /// holder (a superseded holder, a replay), raised and not written.
    pub fenced: Vec<Mark>,
}

/// The ledger of one thread.
#[derive(Debug, Clone, Serialize)]
pub struct ThreadLedger {
    pub thread_id: String,
    /// Which trail answered: this replica's SQLite file, or the PostgreSQL
    /// table of every replica (`audit::TrailSource::describe`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub source: String,
    /// The replicas whose events make up the timeline, in order of first
    /// appearance.
    pub replicas: Vec<String>,
    /// The latest approval's state; `None` when the thread never parked.
    pub state: Option<ApprovalState>,
    pub approvals: Vec<Approval>,
    pub writes_rejected: Vec<Mark>,
    /// Fenced writes continuing no parked checkpoint of this thread.
    pub writes_fenced: Vec<Mark>,
    /// Refusals of reads that name no parked checkpoint of this thread
    /// (a running head under another run's lease).
    pub refused: Vec<Mark>,
    /// Forks served from checkpoints no interrupt parked on.
    pub forks_served: Vec<Mark>,
    /// `events_dropped` records since the thread's first event: events of
    /// this thread may be among those lost.
    pub gaps: Vec<Mark>,
    pub timeline: Vec<AuditEvent>,
}

/// Builds the ledger from the thread's events in the order written
/// (as `audit::thread_events` returns them).
pub fn thread_ledger(thread_id: &str, events: Vec<AuditEvent>) -> ThreadLedger {
    let mut l = ThreadLedger {
        thread_id: thread_id.to_owned(),
        source: String::new(),
        replicas: Vec::new(),
        state: None,
        approvals: Vec::new(),
        writes_rejected: Vec::new(),
        writes_fenced: Vec::new(),
        refused: Vec::new(),
        forks_served: Vec::new(),
        gaps: Vec::new(),
        timeline: Vec::new(),
    };
    for ev in &events {
        l.apply(ev);
        if !ev.proxy_id.is_empty() && !l.replicas.contains(&ev.proxy_id) {
            l.replicas.push(ev.proxy_id.clone());
        }
    }
    l.state = l.approvals.last().map(|a| a.state);
    l.timeline = events;
    l
}

impl ThreadLedger {
    fn apply(&mut self, ev: &AuditEvent) {
        let ns = ev.checkpoint_ns.as_deref().unwrap_or("");
        let id = ev.checkpoint_id.as_deref();
        match ev.operation {
            Operation::InterruptParked => self.parked(ev, ns, id.unwrap_or("")),
            Operation::ClaimTaken | Operation::ClaimTakeover => {
                if let Some(a) = self.approval(ns, id) {
                    if ev.operation == Operation::ClaimTakeover {
                        a.takeovers.push(Mark::of(ev));
                    }
                    a.claimed = Some(Mark::of(ev));
                    if a.state == ApprovalState::Parked {
                        a.state = ApprovalState::Claimed;
                    }
                }
            }
            Operation::ClaimWaited => {
                if let Some(a) = self.approval(ns, id) {
                    a.waited.push(Mark::of(ev));
                }
            }
            Operation::ClaimRefused => match self.approval(ns, id) {
                Some(a) => a.refused.push(Mark::of(ev)),
                None => self.refused.push(Mark::of(ev)),
            },
            Operation::ResumeRecorded => {
                if let Some(a) = self.approval(ns, id) {
                    a.answered.get_or_insert_with(|| Mark::of(ev));
                    a.start_running();
                }
            }
            Operation::ClaimConsumed => {
                if let Some(a) = self.approval(ns, id) {
                    a.consumed.get_or_insert_with(|| Mark::of(ev));
                    a.start_running();
                }
            }
            Operation::CheckpointPut => {
                let parent = ev.parent_checkpoint_id.as_deref();
                if let Some(a) = parent.and_then(|p| self.approval(ns, Some(p))) {
                    a.moved_on(ev);
                }
            }
            Operation::ForkServed => match self.approval(ns, id) {
                Some(a) => a.forks_served.push(Mark::of(ev)),
                None => self.forks_served.push(Mark::of(ev)),
            },
            Operation::WriteRejected => self.writes_rejected.push(Mark::of(ev)),
            Operation::WriteFenced => {
                let continues = ev.detail.get("continues").and_then(|c| c.as_str());
                match self.approval(ns, continues) {
                    Some(a) => a.fenced.push(Mark::of(ev)),
                    None => self.writes_fenced.push(Mark::of(ev)),
                }
            }
            Operation::EventsDropped => self.gaps.push(Mark::of(ev)),
            _ => {}
        }
    }

    /// An `__interrupt__` write: a new approval, unless it is another
    /// task parking on the same still-unanswered checkpoint.
    fn parked(&mut self, ev: &AuditEvent, ns: &str, id: &str) {
        let task = ev.task_id.clone();
        if let Some(a) = self.approval(ns, Some(id)) {
            if a.state == ApprovalState::Parked {
                a.tasks.extend(task);
                return;
            }
            // The node answered the earlier interrupt and parked again.
            a.moved_on(ev);
        }
        self.approvals.push(Approval {
            checkpoint_ns: ns.to_owned(),
            checkpoint_id: id.to_owned(),
            state: ApprovalState::Parked,
            parked: Mark::of(ev),
            tasks: task.into_iter().collect(),
            claimed: None,
            answered: None,
            consumed: None,
            completed: None,
            waited: Vec::new(),
            takeovers: Vec::new(),
            refused: Vec::new(),
            forks_served: Vec::new(),
            fenced: Vec::new(),
        });
    }

    /// The latest approval on a checkpoint.
    fn approval(&mut self, ns: &str, id: Option<&str>) -> Option<&mut Approval> {
        let id = id?;
        self.approvals
            .iter_mut()
            .rev()
            .find(|a| a.checkpoint_ns == ns && a.checkpoint_id == id)
    }
}

impl Approval {
    fn start_running(&mut self) {
        if matches!(self.state, ApprovalState::Parked | ApprovalState::Claimed) {
            self.state = ApprovalState::Running;
        }
    }

    /// The thread went past this approval's checkpoint.
    fn moved_on(&mut self, ev: &AuditEvent) {
        self.state = match self.state {
            ApprovalState::Parked => ApprovalState::Superseded,
            ApprovalState::Claimed | ApprovalState::Running => ApprovalState::Completed,
            ApprovalState::Completed | ApprovalState::Superseded => return,
        };
        self.completed = Some(Mark::of(ev));
    }
}

#[cfg(test)]
mod tests;
