//! The ordered queue of server responses a session is waiting for.
//!
//! Every client request that the server answers pushes one entry; every
//! server message is matched against the front entry. The queue is what
//! lets the proxy inject its own requests (their responses are swallowed)
//! and know which response belongs to which statement. It follows the protocol's rules:
//! after an ErrorResponse in the extended protocol the server skips every
//! message up to the next Sync, so those entries are dropped; a simple
//! Query and a FunctionCall end at ReadyForQuery; Flush, CopyData and
//! CopyDone expect nothing. In copy-in mode (from the server's
//! CopyInResponse until it reads the client's CopyDone or CopyFail) the
//! server ignores Sync, so a Sync the client sends before it ends the copy
//! expects nothing either. Every operation touches only the entries it
//! adds or removes (a CopyInResponse also reads those the client queued
//! between its statement and its end of the copy), so a deep pipeline
//! costs the same per message as a shallow one.

use std::collections::VecDeque;

/// Whether a response reaches the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Route {
    #[default]
    Forward,
    /// A response to a request the proxy injected: the client never asked.
    /// An ErrorResponse is still the client's (the server then skips the
    /// client's own messages up to Sync).
    Swallow,
    /// The rest of an answer the proxy gave the client itself: nothing
    /// more of it reaches the client but the ReadyForQuery that ends a
    /// simple Query (the client waits for it before its next message, as
    /// after any error).
    Answered,
}

impl Route {
    /// Where the ReadyForQuery that ends a request on this route goes.
    fn at_ready(self) -> Route {
        match self {
            Route::Answered => Route::Forward,
            other => other,
        }
    }
}

/// What a queued request expects from the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// Authentication and session start, up to the first ReadyForQuery.
    Startup,
    ParseComplete,
    BindComplete,
    CloseComplete,
    /// ParameterDescription, then RowDescription or NoData.
    DescribeStatement,
    /// RowDescription or NoData.
    DescribePortal,
    /// DataRows (or COPY), then CommandComplete, EmptyQueryResponse or
    /// PortalSuspended.
    Execute,
    /// ReadyForQuery.
    Sync,
    /// Anything, up to ReadyForQuery.
    Query,
    /// FunctionCallResponse, then ReadyForQuery.
    FunctionCall,
    /// Nothing: where the client ended a COPY (CopyDone or CopyFail)
    /// before the server's CopyInResponse arrived. That CopyInResponse
    /// drops the Syncs queued before this mark, which the server reads in
    /// copy-in mode and ignores.
    CopyEnded,
}

impl Expect {
    /// Entries that ReadyForQuery closes.
    fn ends_at_ready(&self) -> bool {
        matches!(
            self,
            Expect::Startup | Expect::Sync | Expect::Query | Expect::FunctionCall
        )
    }
}

/// One expected response, with what to do with it and, for responses the
/// proxy inspects, what it needs to know about the request.
#[derive(Debug)]
pub struct Entry<T> {
    pub expect: Expect,
    pub route: Route,
    pub payload: Option<T>,
}

/// Where a server message landed.
#[derive(Debug)]
pub enum Progress<T> {
    /// Part of the front entry's response, which goes on.
    Within { route: Route },
    /// The message finished this entry.
    Completed { route: Route, done: Entry<T> },
    /// Not an answer to any request: notices, notifications, parameter status.
    Async,
}

/// The server sent something the queue did not expect: the session's view
/// of the protocol is no longer trustworthy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "protocol out of sync: server sent '{}' while expecting {expected:?}",
    .got.escape_ascii()
)]
pub struct Desync {
    pub got: u8,
    pub expected: Option<Expect>,
}

/// Entries kept allocated once the queue drains; a deep pipeline's larger
/// buffer is let go.
const KEEP_ENTRIES: usize = 1024;

#[derive(Debug)]
pub struct ResponseQueue<T> {
    entries: VecDeque<Entry<T>>,
    /// The server failed an extended-protocol message and is discarding
    /// input up to the next Sync; requests pushed meanwhile get no answer.
    skipping_to_sync: bool,
    /// The server is in copy-in mode and the client has not ended the
    /// copy yet: the server ignores the client's Syncs meanwhile.
    copy_in: bool,
}

impl<T> Default for ResponseQueue<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> ResponseQueue<T> {
    pub fn new() -> Self {
        ResponseQueue {
            entries: VecDeque::with_capacity(8),
            skipping_to_sync: false,
            copy_in: false,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Queues the response to a request forwarded to the server. False
    /// when the server will not answer it (it is skipping to a Sync).
    pub fn push(&mut self, expect: Expect, route: Route, payload: Option<T>) -> bool {
        if self.copy_in && expect == Expect::Sync {
            return false;
        }
        if self.skipping_to_sync {
            if expect != Expect::Sync {
                return false;
            }
            self.skipping_to_sync = false;
        }
        self.entries.push_back(Entry {
            expect,
            route,
            payload,
        });
        true
    }

    /// The client ended a COPY (CopyDone or CopyFail). In copy-in mode
    /// that ends the mode; before the server's CopyInResponse arrives it
    /// leaves a mark for it. With nothing outstanding no CopyInResponse
    /// can come, and the server ignores the message.
    pub fn copy_ended(&mut self) {
        if self.copy_in {
            self.copy_in = false;
        } else if !self.entries.is_empty() && !self.skipping_to_sync {
            self.entries.push_back(Entry {
                expect: Expect::CopyEnded,
                route: Route::Forward,
                payload: None,
            });
        }
    }

    /// The server's CopyInResponse to the front entry: the Syncs queued
    /// after it up to the client's end of the copy get no answer. Without
    /// that end queued, the client's Syncs get none until it ends the copy.
    fn copy_in_began(&mut self) {
        let end = self
            .entries
            .iter()
            .skip(1)
            .position(|e| e.expect == Expect::CopyEnded)
            .map(|at| at + 1);
        let mut until = end.unwrap_or(self.entries.len());
        let mut at = 1;
        while at < until {
            if self.entries[at].expect == Expect::Sync {
                self.entries.remove(at);
                until -= 1;
            } else {
                at += 1;
            }
        }
        match end {
            Some(_) => {
                self.entries.remove(until);
            }
            None => self.copy_in = true,
        }
    }

    /// Queues the response for the client message with type `tag`, if it
    /// gets one. Returns whether an entry was queued.
    #[cfg(test)]
    pub fn push_for_client(&mut self, tag: u8, describe_target: u8, payload: Option<T>) -> bool {
        let expect = match tag {
            b'P' => Expect::ParseComplete,
            b'B' => Expect::BindComplete,
            b'C' => Expect::CloseComplete,
            b'D' if describe_target == b'S' => Expect::DescribeStatement,
            b'D' => Expect::DescribePortal,
            b'E' => Expect::Execute,
            b'S' => Expect::Sync,
            b'Q' => Expect::Query,
            b'F' => Expect::FunctionCall,
            b'c' | b'f' => {
                self.copy_ended();
                return false;
            }
            _ => return false,
        };
        self.push(expect, Route::Forward, payload);
        true
    }

    /// The payloads of every outstanding entry, oldest first.
    pub fn payloads(&self) -> impl Iterator<Item = &T> {
        self.entries.iter().filter_map(|e| e.payload.as_ref())
    }

    /// The entry whose answer arrives now.
    pub fn front(&self) -> Option<&Entry<T>> {
        self.entries.front()
    }

    /// The payload of the entry queued last.
    pub fn back_payload(&self) -> Option<&T> {
        self.entries.back().and_then(|e| e.payload.as_ref())
    }

    /// The payload of the entry the next server message belongs to.
    pub fn front_payload_mut(&mut self) -> Option<&mut T> {
        self.entries.front_mut().and_then(|e| e.payload.as_mut())
    }

    /// The proxy answered the front request, an Execute, itself. When no
    /// Sync (nor anything else the server ends with ReadyForQuery) follows
    /// it yet, the server has not ended its pipeline segment: every entry
    /// is then answered by the proxy too (PostgreSQL skips what follows a
    /// failed message up to Sync), and true says the server must be made
    /// to fail before it reads the client's next message. Otherwise only
    /// the front entry is, and false is returned.
    pub fn answer_front(&mut self) -> bool {
        let open = self
            .entries
            .front()
            .is_some_and(|front| front.expect == Expect::Execute)
            && !self.entries.iter().any(|e| e.expect.ends_at_ready());
        for entry in self
            .entries
            .iter_mut()
            .take(if open { usize::MAX } else { 1 })
        {
            entry.route = Route::Answered;
        }
        open
    }

    /// True while nothing is outstanding: no request waits for an answer.
    pub fn idle(&self) -> bool {
        self.entries.is_empty() && !self.skipping_to_sync
    }

    /// Matches one server message (by type byte) against the queue.
    pub fn on_server(&mut self, tag: u8) -> Result<Progress<T>, Desync> {
        self.on_server_with(tag, |_| {})
    }

    /// Matches one server message against the queue, showing `leaving`
    /// every entry that leaves it, oldest first: the one the message
    /// completes (also returned), and those the server will never answer.
    pub fn on_server_with(
        &mut self,
        tag: u8,
        mut leaving: impl FnMut(&Entry<T>),
    ) -> Result<Progress<T>, Desync> {
        if matches!(tag, b'N' | b'A' | b'S') {
            return Ok(Progress::Async);
        }
        if tag == b'E' {
            // An error ends copy-in mode: the server reads the client's
            // Syncs again.
            self.copy_in = false;
        }
        let Some(front) = self.entries.front() else {
            // A FATAL error can arrive unasked (administrator shutdown).
            return if tag == b'E' {
                Ok(Progress::Async)
            } else {
                Err(self.desync(tag))
            };
        };
        let route = front.route;
        let expect = front.expect.clone();
        if tag == b'G' && matches!(expect, Expect::Execute | Expect::Query) {
            self.copy_in_began();
            return Ok(Progress::Within { route });
        }
        match (tag, &expect) {
            (b'Z', e) if e.ends_at_ready() => self.complete(route.at_ready(), leaving),
            (b'Z', _) => {
                // Entries that never got their answer: drop them up to the
                // first one ReadyForQuery closes.
                while let Some(e) = self.entries.front() {
                    if e.expect.ends_at_ready() {
                        return self.complete(route, leaving);
                    }
                    leaving(e);
                    self.entries.pop_front();
                }
                Err(self.desync(tag))
            }
            (_, Expect::Startup) => Ok(Progress::Within { route }),
            (b'E', Expect::Query | Expect::FunctionCall | Expect::Sync) => {
                Ok(Progress::Within { route })
            }
            (b'E', _) => {
                // The error of a request the proxy answered itself is not
                // the client's: it had its answer.
                let route = match route {
                    Route::Answered => Route::Answered,
                    _ => Route::Forward,
                };
                let done = self.complete_entry(&mut leaving);
                // The server skips every message up to the next Sync.
                while let Some(e) = self.entries.front() {
                    if e.expect == Expect::Sync {
                        break;
                    }
                    leaving(e);
                    self.entries.pop_front();
                }
                self.skipping_to_sync = self.entries.is_empty();
                self.release_if_drained();
                Ok(Progress::Completed { route, done })
            }
            (b'1', Expect::ParseComplete)
            | (b'2', Expect::BindComplete)
            | (b'3', Expect::CloseComplete)
            | (b'T' | b'n', Expect::DescribeStatement | Expect::DescribePortal)
            | (b'C' | b'I' | b's', Expect::Execute) => self.complete(route, leaving),
            (b't', Expect::DescribeStatement)
            | (b'D' | b'H' | b'W' | b'd' | b'c', Expect::Execute)
            | (b'V', Expect::FunctionCall)
            | (_, Expect::Query) => Ok(Progress::Within { route }),
            _ => Err(self.desync(tag)),
        }
    }

    fn complete(
        &mut self,
        route: Route,
        mut leaving: impl FnMut(&Entry<T>),
    ) -> Result<Progress<T>, Desync> {
        let done = self.complete_entry(&mut leaving);
        self.release_if_drained();
        Ok(Progress::Completed { route, done })
    }

    fn complete_entry(&mut self, leaving: &mut impl FnMut(&Entry<T>)) -> Entry<T> {
        if let Some(e) = self.entries.front() {
            leaving(e);
        }
        let done = match self.entries.pop_front() {
            Some(e) => e,
            // Callers check for a front entry before completing it.
            None => Entry {
                expect: Expect::Sync,
                route: Route::Forward,
                payload: None,
            },
        };
        // The end of a COPY that never began: the server ignored it.
        while self
            .entries
            .front()
            .is_some_and(|e| e.expect == Expect::CopyEnded)
        {
            self.entries.pop_front();
        }
        done
    }

    /// Lets a deep pipeline's buffer go once it is answered.
    fn release_if_drained(&mut self) {
        if self.entries.is_empty() && self.entries.capacity() > KEEP_ENTRIES {
            self.entries.shrink_to(KEEP_ENTRIES);
        }
    }

    fn desync(&self, got: u8) -> Desync {
        Desync {
            got,
            expected: self.entries.front().map(|e| e.expect.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Q = ResponseQueue<u32>;

    fn push_all(q: &mut Q, client: &[u8]) {
        for &t in client {
            q.push_for_client(t, b'P', None);
        }
    }

    /// Feeds server messages; returns the routes of those that completed
    /// an entry, as (tag, route) pairs.
    fn feed(q: &mut Q, server: &[u8]) -> Vec<(u8, Route)> {
        let mut out = Vec::new();
        for &t in server {
            match q.on_server(t).unwrap() {
                Progress::Completed { route, .. } => out.push((t, route)),
                Progress::Within { .. } | Progress::Async => {}
            }
        }
        out
    }

    #[test]
    fn extended_round_trip_completes_in_order() {
        let mut q = Q::new();
        push_all(&mut q, b"PBDES");
        let done = feed(&mut q, b"12TDDCZ");
        let tags: Vec<u8> = done.iter().map(|d| d.0).collect();
        assert_eq!(tags, b"12TCZ");
        assert!(q.idle());
    }

    #[test]
    fn flush_expects_nothing() {
        let mut q = Q::new();
        assert!(!q.push_for_client(b'H', 0, None));
        assert!(!q.push_for_client(b'd', 0, None));
        assert!(!q.push_for_client(b'c', 0, None));
        assert!(q.idle());
    }

    #[test]
    fn flush_without_sync_answers_as_it_goes() {
        // psycopg pipeline mode: Parse Bind Describe Execute Flush, no Sync.
        let mut q = Q::new();
        push_all(&mut q, b"PBDE");
        assert_eq!(feed(&mut q, b"12nC").len(), 4);
        assert!(q.idle());
    }

    #[test]
    fn error_mid_pipeline_skips_to_sync() {
        // Two statements in one segment; the second Bind fails.
        let mut q = Q::new();
        push_all(&mut q, b"BDEBDES");
        let done = feed(&mut q, b"2nC");
        assert_eq!(done.len(), 3);
        // Error at the second Bind: D, E are skipped by the server.
        match q.on_server(b'E').unwrap() {
            Progress::Completed { done, route } => {
                assert_eq!(done.expect, Expect::BindComplete);
                assert_eq!(route, Route::Forward);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(q.len(), 1);
        assert_eq!(feed(&mut q, b"Z"), vec![(b'Z', Route::Forward)]);
        assert!(q.idle());
    }

    #[test]
    fn error_without_sync_skips_later_pushes_until_sync() {
        let mut q = Q::new();
        push_all(&mut q, b"BDE");
        q.on_server(b'E').unwrap();
        assert!(!q.idle(), "server is discarding until Sync");
        // The client goes on sending before it notices; the server drops these.
        push_all(&mut q, b"BDE");
        assert!(q.is_empty());
        push_all(&mut q, b"S");
        assert_eq!(feed(&mut q, b"Z").len(), 1);
        assert!(q.idle());
        // After the Sync everything is answered again.
        push_all(&mut q, b"BDES");
        assert_eq!(feed(&mut q, b"2nCZ").len(), 4);
    }

    #[test]
    fn error_in_simple_query_ends_at_ready() {
        let mut q = Q::new();
        push_all(&mut q, b"Q");
        assert!(matches!(
            q.on_server(b'T').unwrap(),
            Progress::Within { .. }
        ));
        assert!(matches!(
            q.on_server(b'E').unwrap(),
            Progress::Within { .. }
        ));
        assert_eq!(feed(&mut q, b"Z").len(), 1);
        assert!(q.idle());
    }

    #[test]
    fn an_answered_query_still_gets_its_ready_for_query() {
        let mut q = Q::new();
        push_all(&mut q, b"Q");
        assert!(feed(&mut q, b"T").is_empty());
        assert!(
            !q.answer_front(),
            "a simple Query ends at its ReadyForQuery"
        );
        assert!(matches!(
            q.on_server(b'C').unwrap(),
            Progress::Within {
                route: Route::Answered
            }
        ));
        assert_eq!(feed(&mut q, b"Z"), vec![(b'Z', Route::Forward)]);
        assert!(q.idle());
    }

    #[test]
    fn an_execute_answered_in_an_open_segment_answers_what_follows_it() {
        use Route::{Answered, Forward, Swallow};
        let mut q = Q::new();
        // A read, and a statement pipelined behind it, with no Sync yet.
        push_all(&mut q, b"PBEPBE");
        assert_eq!(feed(&mut q, b"12"), [(b'1', Forward), (b'2', Forward)]);
        assert!(q.answer_front());
        assert_eq!(
            feed(&mut q, b"C12C"),
            [
                (b'C', Answered),
                (b'1', Answered),
                (b'2', Answered),
                (b'C', Answered)
            ]
        );
        // The proxy's raising statement, then the client's Sync: the
        // error is not the client's, and its ReadyForQuery is.
        q.push(Expect::ParseComplete, Swallow, None);
        q.push(Expect::BindComplete, Swallow, None);
        q.push(Expect::Execute, Answered, None);
        push_all(&mut q, b"PBES");
        assert_eq!(
            feed(&mut q, b"12EZ"),
            [
                (b'1', Swallow),
                (b'2', Swallow),
                (b'E', Answered),
                (b'Z', Forward)
            ]
        );
        assert!(q.idle());
    }

    #[test]
    fn an_execute_answered_after_its_sync_answers_only_itself() {
        let mut q = Q::new();
        push_all(&mut q, b"PBESPBES");
        assert_eq!(feed(&mut q, b"12").len(), 2);
        assert!(!q.answer_front(), "the server ended the segment");
        assert_eq!(
            feed(&mut q, b"CZ12CZ"),
            [
                (b'C', Route::Answered),
                (b'Z', Route::Forward),
                (b'1', Route::Forward),
                (b'2', Route::Forward),
                (b'C', Route::Forward),
                (b'Z', Route::Forward)
            ]
        );
    }

    #[test]
    fn multi_statement_query_and_copy() {
        let mut q = Q::new();
        push_all(&mut q, b"Q");
        // COPY out, then another statement's rows, then ready.
        assert!(feed(&mut q, b"HddcCTDCZ").len() == 1);
        push_all(&mut q, b"Q");
        // COPY in: client sends CopyData/CopyDone (no entries), server completes.
        q.push_for_client(b'd', 0, None);
        q.push_for_client(b'c', 0, None);
        assert_eq!(feed(&mut q, b"GCZ").len(), 1);
        assert!(q.idle());
    }

    /// The client's CopyDone (or CopyFail), as the tracker reports it.
    fn end_copy(q: &mut Q) {
        q.copy_ended();
    }

    /// A round the server answers after a COPY: the queue is in step.
    fn select_round(q: &mut Q) {
        assert!(q.idle(), "nothing is owed after the COPY");
        push_all(q, b"PBES");
        assert_eq!(feed(q, b"12DCZ").len(), 4);
        assert!(q.idle());
    }

    #[test]
    fn extended_copy_in_ignores_the_sync_sent_before_copy_in_response() {
        // libpq's PQexecParams: Parse Bind Describe Execute Sync, then
        // CopyInResponse, the data, CopyDone and a second Sync.
        let mut q = Q::new();
        push_all(&mut q, b"PBDES");
        assert_eq!(feed(&mut q, b"12nG").len(), 3);
        push_all(&mut q, b"dd");
        end_copy(&mut q);
        push_all(&mut q, b"S");
        assert_eq!(feed(&mut q, b"CZ").len(), 2);
        select_round(&mut q);
    }

    #[test]
    fn a_sync_sent_in_copy_in_mode_gets_no_answer() {
        let mut q = Q::new();
        push_all(&mut q, b"PBES");
        feed(&mut q, b"12G");
        push_all(&mut q, b"dSHd");
        end_copy(&mut q);
        push_all(&mut q, b"S");
        assert_eq!(feed(&mut q, b"CZ").len(), 2);
        select_round(&mut q);
    }

    #[test]
    fn extended_copy_in_sent_whole_before_copy_in_response() {
        // The Sync before CopyDone is read in copy-in mode; the one after
        // it is answered.
        let mut q = Q::new();
        push_all(&mut q, b"PBDES");
        push_all(&mut q, b"d");
        end_copy(&mut q);
        push_all(&mut q, b"S");
        assert_eq!(feed(&mut q, b"12nGCZ").len(), 5);
        select_round(&mut q);
    }

    #[test]
    fn copy_fail_ends_copy_in_with_an_error() {
        let mut q = Q::new();
        push_all(&mut q, b"PBDES");
        feed(&mut q, b"12nG");
        push_all(&mut q, b"d");
        end_copy(&mut q);
        push_all(&mut q, b"S");
        assert_eq!(feed(&mut q, b"EZ").len(), 2);
        select_round(&mut q);
    }

    #[test]
    fn an_error_in_copy_in_mode_skips_to_the_clients_next_sync() {
        // The data is refused before the client ends the copy; the server
        // skips the rest of it and answers the Sync after CopyDone.
        let mut q = Q::new();
        push_all(&mut q, b"PBDES");
        feed(&mut q, b"12nG");
        push_all(&mut q, b"d");
        assert_eq!(feed(&mut q, b"E").len(), 1);
        push_all(&mut q, b"d");
        end_copy(&mut q);
        push_all(&mut q, b"S");
        assert_eq!(feed(&mut q, b"Z").len(), 1);
        select_round(&mut q);
    }

    #[test]
    fn the_end_of_a_copy_that_never_began_is_ignored() {
        // The COPY fails before CopyInResponse: its Sync is answered, the
        // data and CopyDone are skipped, and so is the mark they left.
        let mut q = Q::new();
        push_all(&mut q, b"PBES");
        push_all(&mut q, b"d");
        end_copy(&mut q);
        push_all(&mut q, b"S");
        assert_eq!(feed(&mut q, b"12EZZ").len(), 5);
        select_round(&mut q);
    }

    #[test]
    fn simple_query_copy_in() {
        let mut q = Q::new();
        push_all(&mut q, b"Q");
        assert!(feed(&mut q, b"G").is_empty());
        push_all(&mut q, b"d");
        end_copy(&mut q);
        assert_eq!(feed(&mut q, b"CZ").len(), 1);
        select_round(&mut q);
        // The same with the whole COPY sent before CopyInResponse.
        push_all(&mut q, b"Q");
        end_copy(&mut q);
        assert_eq!(feed(&mut q, b"GCZ").len(), 1);
        select_round(&mut q);
    }

    #[test]
    fn describe_statement_takes_parameter_description() {
        let mut q = Q::new();
        q.push_for_client(b'D', b'S', None);
        q.push_for_client(b'S', 0, None);
        assert_eq!(feed(&mut q, b"tTZ").len(), 2);
    }

    #[test]
    fn notices_and_notifications_are_async() {
        let mut q = Q::new();
        push_all(&mut q, b"ES");
        assert!(matches!(q.on_server(b'N').unwrap(), Progress::Async));
        assert!(matches!(q.on_server(b'A').unwrap(), Progress::Async));
        assert!(matches!(q.on_server(b'S').unwrap(), Progress::Async));
        assert_eq!(feed(&mut q, b"CZ").len(), 2);
        // Also with nothing outstanding.
        assert!(matches!(q.on_server(b'A').unwrap(), Progress::Async));
        assert!(matches!(q.on_server(b'E').unwrap(), Progress::Async));
    }

    #[test]
    fn swallowed_injection_keeps_order() {
        // The proxy injects Parse+Bind ahead of the client's Execute.
        let mut q = Q::new();
        q.push(Expect::ParseComplete, Route::Swallow, None);
        q.push(Expect::BindComplete, Route::Swallow, None);
        q.push(Expect::Execute, Route::Forward, Some(7));
        q.push(Expect::Sync, Route::Forward, None);
        assert_eq!(
            feed(&mut q, b"12"),
            vec![(b'1', Route::Swallow), (b'2', Route::Swallow)]
        );
        assert_eq!(q.front_payload_mut().copied(), Some(7));
        assert_eq!(q.payloads().copied().collect::<Vec<_>>(), vec![7]);
        match q.on_server(b'C').unwrap() {
            Progress::Completed { done, route } => {
                assert_eq!((done.payload, route), (Some(7), Route::Forward))
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(feed(&mut q, b"Z").len(), 1);
    }

    #[test]
    fn startup_runs_until_first_ready() {
        let mut q = Q::new();
        q.push(Expect::Startup, Route::Forward, None);
        for t in b"RRRSSK" {
            assert!(!matches!(
                q.on_server(*t).unwrap(),
                Progress::Completed { .. }
            ));
        }
        assert_eq!(feed(&mut q, b"Z").len(), 1);
        assert!(q.idle());
    }

    #[test]
    fn commit_error_at_sync_keeps_waiting_for_ready() {
        let mut q = Q::new();
        push_all(&mut q, b"S");
        assert!(matches!(
            q.on_server(b'E').unwrap(),
            Progress::Within { .. }
        ));
        assert_eq!(feed(&mut q, b"Z").len(), 1);
    }

    #[test]
    fn unexpected_message_is_a_desync() {
        let mut q = Q::new();
        push_all(&mut q, b"P");
        let err = q.on_server(b'2').unwrap_err();
        assert_eq!(err.expected, Some(Expect::ParseComplete));
        let mut q = Q::new();
        assert!(q.on_server(b'D').is_err());
    }

    #[test]
    fn function_call_ends_at_ready() {
        let mut q = Q::new();
        push_all(&mut q, b"F");
        assert_eq!(feed(&mut q, b"VZ").len(), 1);
    }
}
