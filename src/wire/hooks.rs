//! What the protocol tracker asks of the layer above it: annotations for
//! statements and portals, watches for answers, and refusals. The tracker
//! keeps the protocol's state; its hooks decide what a statement means.

use bytes::Bytes;

use super::guard::{ClientError, ServerStep};
use super::injected::Injection;
use super::messages::bind::Bind;
use super::refusal::Refusal;
pub use super::sql_commands::SavepointChange;

/// ReadyForQuery's transaction status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TxnStatus {
    #[default]
    Idle,
    InBlock,
    Failed,
}

impl TxnStatus {
    pub fn from_byte(b: u8) -> TxnStatus {
        match b {
            b'T' => TxnStatus::InBlock,
            b'E' => TxnStatus::Failed,
            _ => TxnStatus::Idle,
        }
    }
}

/// What the client gets for a Bind.
#[derive(Debug)]
pub enum Bound<P, W> {
    /// Forward the Bind; the portal carries this annotation.
    Forward(Option<P>),
    /// The server gets these bytes instead of the Bind.
    Replace(Vec<u8>, Option<P>),
    /// The server first runs the proxy's own statement, then gets the
    /// Bind. Boxed: a watch is large and rare, and every Bind's answer
    /// moves by value.
    Guarded(Box<Guarded<P, W>>),
    /// The statement is refused.
    Refuse(Refusal),
}

/// A Bind the proxy's own statement (see [`super::injected`]) goes
/// before: an error of that statement is the client's answer.
#[derive(Debug)]
pub struct Guarded<P, W> {
    pub injection: Injection,
    /// Watches the proxy's statement's answer.
    pub watch: W,
    pub portal: Option<P>,
}

/// What the layer above decides where checkpoint traffic can be seen.
pub trait Hooks {
    /// What is known of a prepared statement (compared to decide whether
    /// an unconfirmed change matters).
    type Statement: Clone + PartialEq;
    /// What is known of a bound portal.
    type Portal: Clone;
    /// What watches one statement's answer.
    type Watch;

    /// A statement text (of a Parse or a Query) before anything else
    /// reads it: why the server may not get it at all, if it may not.
    fn admit(&mut self, sql: &str) -> Result<(), Refusal>;
    /// A Parse's statement text, one `admit` let through: its annotation,
    /// and SQL the server gets instead.
    fn parse(&mut self, sql: &str) -> (Self::Statement, Option<String>);
    /// The annotation of a statement nobody watches.
    fn plain(&self) -> Self::Statement;
    /// SQL `PREPARE … AS inner`: the annotation, or why it is refused.
    fn sql_prepare(&mut self, inner: &str) -> Result<Self::Statement, Refusal>;
    /// SQL `EXECUTE` of a statement with this annotation.
    fn sql_execute(&mut self, statement: &Self::Statement) -> Result<(), Refusal>;
    /// SQL `DECLARE … CURSOR FOR inner`.
    fn sql_declare(&mut self, inner: &str) -> Result<(), Refusal>;
    /// SQL `FETCH` from a portal a protocol Bind made, with this
    /// annotation: its rows would reach the client without the watch an
    /// Execute of it gets.
    fn sql_fetch(&mut self, portal: &Self::Portal) -> Result<(), Refusal>;
    /// A Bind of a statement with this annotation, read by the codec.
    fn bind(
        &mut self,
        statement: &Self::Statement,
        bind: &Bind<'_>,
    ) -> Result<Bound<Self::Portal, Self::Watch>, ClientError>;
    fn execute(&mut self, portal: Option<&Self::Portal>) -> Option<Self::Watch>;
    fn describe_statement(&mut self, statement: &Self::Statement) -> Option<Self::Watch>;
    fn describe_portal(&mut self, portal: Option<&Self::Portal>) -> Option<Self::Watch>;
    /// A simple Query's text: its watch, or why it is refused.
    fn query(&mut self, sql: &str) -> Result<Option<Self::Watch>, Refusal>;
    /// A simple Query the tracker refused itself (its text, or the SQL
    /// commands in it), answered by the refusal instead of run: the
    /// transaction it would have run in aborts with that error.
    fn query_refused(&mut self);
    /// A Sync: a refusal to raise before it.
    fn sync(&mut self) -> Option<Refusal>;
    /// A DataRow of a watched answer. A row held for a decision carries
    /// the relay's share of a ticket the hooks keep themselves, and read
    /// back once it is decided (see [`Hooks::release`]).
    fn row(&mut self, watch: &mut Self::Watch, frame: &[u8], step: &mut ServerStep);
    /// A RowDescription of a watched answer: its replacement.
    fn row_description(&mut self, watch: &Self::Watch, frame: &[u8]) -> Option<Bytes>;
    /// The CommandComplete of a watched statement (`tag`: `INSERT 0 1`
    /// and the like), before it completes it.
    fn command_complete(&mut self, _watch: &mut Self::Watch, _tag: &[u8]) {}
    /// A watched statement finished (`ok`: without an error).
    fn completed(&mut self, watch: Self::Watch, ok: bool);
    /// The ErrorResponse of a watched statement, before it completes it.
    fn answer_error(&mut self, watch: &mut Self::Watch, frame: &[u8]);
    /// The server reported an error.
    fn error(&mut self);
    fn ready(&mut self, status: TxnStatus);
    /// ROLLBACK (or a failed COMMIT) completed.
    fn rollback(&mut self);
    /// A savepoint command completed.
    fn savepoint(&mut self, change: SavepointChange<'_>);
    fn parameter_status(&mut self, name: &[u8], value: &[u8]);

    /// A client message is about to be tracked; `idle`: nothing is
    /// outstanding and no transaction is open before it.
    fn next_client_message(&mut self, _idle: bool) {}
    /// A FunctionCall (its body is never read) was forwarded.
    fn function_call(&mut self) {}
    /// A ReadyForQuery answered the last segment sent: nothing is
    /// outstanding (after [`Hooks::ready`]).
    fn drained(&mut self) {}
    /// Whether a Bind of a statement with this annotation is read past its
    /// names (for its parameters); one that is not may stream past.
    fn reads_bind(&self, _statement: &Self::Statement) -> bool {
        true
    }
    /// Whether the proxy may answer the statement this watch watches with
    /// a refusal in place of a row (see [`Hooks::row`]), at once or once a
    /// held row is decided: what the client pipelines behind it waits for
    /// that (past the statement's segment, for that segment's
    /// ReadyForQuery).
    fn may_refuse(&self, _watch: &Self::Watch) -> bool {
        false
    }
    /// The ticket of the message held last was decided: what the client
    /// gets instead of that message, if anything (see
    /// [`super::guard::Guard::release`]).
    fn release(&mut self) -> Option<Bytes> {
        None
    }
    /// Work granted outlasts the exchanges in flight (see
    /// [`super::guard::Guard::holds_work`]).
    fn holds_work(&self) -> bool {
        false
    }
    /// Whether a statement text (of a Parse or a Query, its bytes as the
    /// client sent them) may make a later hook block on a store (see
    /// [`super::guard::ClientStep::Blocks`]).
    fn may_block(&mut self, _sql: &[u8]) -> bool {
        false
    }
    /// Whether a statement text is ordinary: a [`TextScreen`] of the
    /// hooks' words, which always holds the SQL-level command keywords,
    /// finds none of them in it. The tracker reads no commands in such a
    /// text.
    ///
    /// [`TextScreen`]: super::text_screen::TextScreen
    fn ordinary(&mut self, _sql: &str) -> bool {
        false
    }
    /// Hands what was recorded to its stores; never blocks.
    fn flush(&mut self) {}
    /// The client connection is gone.
    fn closed(&mut self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_binds_answer_is_as_wide_whatever_a_watch_weighs() {
        // Every Bind's answer moves by value from the layer above to the
        // tracker: a watch, however large, stays behind the guarded
        // variant's pointer.
        type Light = Bound<u64, ()>;
        type Heavy = Bound<u64, [u8; 4096]>;
        assert_eq!(std::mem::size_of::<Heavy>(), std::mem::size_of::<Light>());
    }
}
