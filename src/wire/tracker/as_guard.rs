//! The tracker is the session's guard: the relay drives it directly, and
//! what the layer above decides reaches the relay through its hooks.

use bytes::Bytes;

use super::super::guard::{ClientError, ClientStep, Guard, ServerStep};
use super::super::messages::read::cstr;
use super::super::messages::read::HEADER_LEN;
use super::super::response_queue::Desync;
use super::names::{Change, Lookup, Pending};
use super::{Hooks, Tracker};

/// How much of a Bind's body may hold its portal and statement names.
const BIND_NAMES_WITHIN: usize = 64 * 1024;

impl<H: Hooks> Guard for Tracker<H>
where
    Tracker<H>: Send,
{
    fn on_client(&mut self, frame: &[u8]) -> Result<ClientStep, ClientError> {
        Tracker::on_client(self, frame)
    }

    fn on_server(&mut self, frame: &[u8]) -> Result<ServerStep, Desync> {
        Tracker::on_server(self, frame)
    }

    /// CopyData and FunctionCall bodies are never read; a Bind's only when
    /// the hooks read the parameters of the statement it names (a Bind
    /// that waits for earlier answers is asked again after them); anything
    /// else (Parse, Query: their text) is read whole.
    fn client_streams(&mut self, prefix: &[u8]) -> bool {
        match prefix.first() {
            Some(b'd' | b'F') => true,
            Some(b'B') => {
                // The names open the body; longer ones than this are
                // offered whole.
                let front = prefix.get(HEADER_LEN..).unwrap_or_default();
                let front = &front[..front.len().min(BIND_NAMES_WITHIN)];
                let Some((_, rest)) = cstr(front) else {
                    return false;
                };
                let Some((name, _)) = cstr(rest) else {
                    return false;
                };
                match self.statement(name) {
                    Lookup::Ambiguous => true,
                    Lookup::Known(Some(s)) => !self.hooks.reads_bind(&s.annotation),
                    Lookup::Known(None) if name.is_empty() => {
                        !self.hooks.reads_bind(&self.hooks.plain())
                    }
                    // Never prepared: refused without reading it.
                    Lookup::Known(None) => true,
                }
            }
            _ => false,
        }
    }

    /// A DataRow or CopyData of an answer nobody watches streams.
    fn server_streams(&mut self, tag: u8) -> bool {
        let watched = matches!(
            self.queue.front_payload_mut(),
            Some(Pending {
                change: Change::Answer { watch: Some(_), .. },
                ..
            })
        );
        matches!(tag, b'D' | b'd') && !watched
    }

    fn release(&mut self) -> Option<Bytes> {
        let refusal = self.hooks.release();
        if refusal.is_some() {
            // The refused message's statement must not reach the client:
            // the rest of its answer is swallowed.
            self.swallow_front();
        }
        refusal
    }

    fn is_idle(&self) -> bool {
        Tracker::is_idle(self)
    }

    fn holds_work(&self) -> bool {
        self.hooks.holds_work()
    }

    fn settled(&self) -> bool {
        Tracker::settled(self)
    }

    fn started(&self) -> bool {
        Tracker::started(self)
    }

    fn flush(&mut self) {
        self.hooks.flush()
    }

    fn closed(&mut self) {
        self.hooks.closed()
    }
}
