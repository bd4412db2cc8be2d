//! A small model of what PostgreSQL answers, message by message, to what
//! it is sent (after the proxy's replacements): ParseComplete,
//! BindComplete, CloseComplete, ParameterDescription / RowDescription /
//! NoData, DataRows and CommandComplete, ErrorResponse then nothing up to
//! Sync, ReadyForQuery with the transaction status, simple queries,
//! named statements and portals as the server keeps them, FATAL on an
//! unknown message type. Where a real server could answer either way (a
//! statement that fails, how many rows), the fuzzer's dice decide.

use std::collections::{HashMap, VecDeque};

use resumeguard::wire::messages::bind::Bind;
use resumeguard::wire::messages::frontend::{Frontend, Target};

/// The fuzzer's choices, read one byte at a time.
pub struct Dice {
    bytes: Vec<u8>,
    at: usize,
}

impl Dice {
    pub fn new(bytes: Vec<u8>) -> Self {
        Dice { bytes, at: 0 }
    }

    /// The next choice; the choices repeat once all are read.
    pub fn next(&mut self) -> u8 {
        if self.bytes.is_empty() {
            return 0;
        }
        let b = self.bytes[self.at % self.bytes.len()];
        self.at += 1;
        b
    }

    /// True with probability `in256` / 256.
    pub fn chance(&mut self, in256: u8) -> bool {
        self.next() < in256
    }
}

pub fn msg(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(body.len() + 5);
    v.push(tag);
    v.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
    v.extend_from_slice(body);
    v
}

fn error(sqlstate: &str, fatal: bool) -> Vec<u8> {
    let mut b = Vec::new();
    let severity: &[u8] = if fatal { b"FATAL" } else { b"ERROR" };
    for (code, value) in [
        (b'S', severity),
        (b'V', severity),
        (b'C', sqlstate.as_bytes()),
        (b'M', b"modelled failure".as_slice()),
    ] {
        b.push(code);
        b.extend_from_slice(value);
        b.push(0);
    }
    b.push(0);
    msg(b'E', &b)
}

fn complete(tag: &str) -> Vec<u8> {
    let mut b = tag.as_bytes().to_vec();
    b.push(0);
    msg(b'C', &b)
}

fn row_description(columns: usize) -> Vec<u8> {
    let mut b = (columns as i16).to_be_bytes().to_vec();
    for i in 0..columns {
        b.extend_from_slice(format!("c{i}").as_bytes());
        b.push(0);
        b.extend_from_slice(&0u32.to_be_bytes());
        b.extend_from_slice(&0i16.to_be_bytes());
        b.extend_from_slice(&25u32.to_be_bytes());
        b.extend_from_slice(&(-1i16).to_be_bytes());
        b.extend_from_slice(&(-1i32).to_be_bytes());
        b.extend_from_slice(&0i16.to_be_bytes());
    }
    msg(b'T', &b)
}

/// What a statement's text makes the server do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Rows,
    Write,
    Begin,
    End,
    /// The proxy's injected `DO` block that raises its refusal.
    Raise,
    Other,
}

fn kind(sql: &[u8]) -> Kind {
    let text = String::from_utf8_lossy(sql)
        .trim_start()
        .to_ascii_lowercase();
    if text.starts_with("do $resumeguard$") {
        Kind::Raise
    } else if text.starts_with("select") || text.starts_with("with") || text.starts_with("execute")
    {
        Kind::Rows
    } else if text.starts_with("insert") || text.starts_with("update") || text.starts_with("delete")
    {
        Kind::Write
    } else if text.starts_with("begin") || text.starts_with("start") {
        Kind::Begin
    } else if text.starts_with("commit") || text.starts_with("rollback") || text.starts_with("end")
    {
        Kind::End
    } else {
        Kind::Other
    }
}

/// The server's side of one session.
pub struct ServerModel {
    statements: HashMap<Vec<u8>, Vec<u8>>,
    portals: HashMap<Vec<u8>, Vec<u8>>,
    /// An error in the extended protocol: everything up to Sync is skipped.
    skipping: bool,
    /// Inside an explicit transaction block (`T`), failed (`E`) or not (`I`).
    txn: u8,
    /// The connection is closed (FATAL, Terminate).
    pub closed: bool,
    /// Answers produced and not yet delivered to the proxy.
    pub out: VecDeque<Vec<u8>>,
    /// Sample rows for row-returning statements (e.g. a checkpoint row).
    rows: Vec<Vec<u8>>,
}

impl ServerModel {
    /// A server that has just accepted a startup packet: it answers
    /// AuthenticationOk, a ParameterStatus, BackendKeyData, ReadyForQuery.
    pub fn after_startup(rows: Vec<Vec<u8>>) -> Self {
        let mut m = ServerModel {
            statements: HashMap::new(),
            portals: HashMap::new(),
            skipping: false,
            txn: b'I',
            closed: false,
            out: VecDeque::new(),
            rows,
        };
        m.out.push_back(msg(b'R', &0i32.to_be_bytes()));
        m.out.push_back(msg(b'S', b"server_version\x0015.18\x00"));
        m.out
            .push_back(msg(b'K', &[0, 0, 0, 42, 0xde, 0xad, 0xbe, 0xef]));
        m.out.push_back(msg(b'Z', b"I"));
        m
    }

    /// In a failed transaction block only its end may run (25P02).
    fn aborted(&self, sql: &[u8]) -> bool {
        self.txn == b'E' && kind(sql) != Kind::End
    }

    fn fail(&mut self, sqlstate: &str) {
        self.out.push_back(error(sqlstate, false));
        if self.txn == b'T' {
            self.txn = b'E';
        }
    }

    fn data_rows(&mut self, dice: &mut Dice) -> usize {
        let n = usize::from(dice.next() % 3);
        for i in 0..n {
            let row = if self.rows.is_empty() || dice.chance(64) {
                msg(b'D', &[0, 1, 0, 0, 0, 1, b'1'])
            } else {
                self.rows[i % self.rows.len()].clone()
            };
            self.out.push_back(row);
        }
        n
    }

    fn execute(&mut self, sql: &[u8], dice: &mut Dice) -> bool {
        if self.txn == b'E' && kind(sql) != Kind::End {
            self.fail("25P02");
            return false;
        }
        match kind(sql) {
            Kind::Raise => {
                self.fail("23514");
                return false;
            }
            k if k != Kind::End && dice.chance(24) => {
                self.fail("XX000");
                return false;
            }
            Kind::Rows => {
                let n = self.data_rows(dice);
                self.out.push_back(complete(&format!("SELECT {n}")));
            }
            Kind::Write => self.out.push_back(complete("INSERT 0 1")),
            Kind::Begin => {
                self.txn = b'T';
                self.out.push_back(complete("BEGIN"));
            }
            Kind::End => {
                let tag = if self.txn == b'E' {
                    "ROLLBACK"
                } else {
                    "COMMIT"
                };
                self.txn = b'I';
                self.out.push_back(complete(tag));
            }
            Kind::Other => {
                let tag = self.sql_command(sql);
                self.out.push_back(complete(&tag));
            }
        }
        true
    }

    /// Applies a SQL-level PREPARE / DEALLOCATE / DISCARD ALL (they share
    /// the protocol's statement namespace) and returns its command tag.
    fn sql_command(&mut self, sql: &[u8]) -> String {
        let text = String::from_utf8_lossy(sql).to_ascii_lowercase();
        let words: Vec<&str> = text.split_whitespace().collect();
        match words.as_slice() {
            ["prepare", name, "as", ..] => {
                let body = text.split_once(" as ").map(|(_, b)| b).unwrap_or("");
                self.statements
                    .insert(name.as_bytes().to_vec(), body.as_bytes().to_vec());
                "PREPARE".into()
            }
            ["deallocate", "all"] | ["deallocate", "prepare", "all"] => {
                self.statements.retain(|k, _| k.is_empty());
                "DEALLOCATE ALL".into()
            }
            ["deallocate", "prepare", name] | ["deallocate", name] => {
                self.statements.remove(name.as_bytes());
                "DEALLOCATE".into()
            }
            ["discard", "all"] => {
                self.statements.retain(|k, _| k.is_empty());
                self.portals.clear();
                "DISCARD ALL".into()
            }
            [first, ..] => first.to_ascii_uppercase(),
            [] => "SET".into(),
        }
    }

    fn ready(&mut self) {
        if self.txn == b'I' {
            self.portals.clear();
        }
        self.out.push_back(msg(b'Z', &[self.txn]));
    }

    /// Answers one message the server receives.
    pub fn receive(&mut self, frame: &[u8], dice: &mut Dice) {
        if self.closed {
            return;
        }
        let tag = frame.first().copied().unwrap_or(0);
        if dice.chance(8) {
            self.out
                .push_back(msg(b'N', b"SNOTICE\0C00000\0Mmodelled notice\0\0"));
        }
        let message = Frontend::read(frame);
        if self.skipping && !matches!(message, Frontend::Sync | Frontend::Terminate) {
            return;
        }
        match message {
            Frontend::Parse { name, sql, .. } => {
                // exec_parse_message drops the unnamed statement first,
                // whether or not the new text parses.
                if name.is_empty() {
                    self.statements.remove(name);
                }
                if self.aborted(sql) {
                    self.fail("25P02");
                } else if !name.is_empty() && self.statements.contains_key(name) {
                    self.fail("42P05");
                } else if dice.chance(16) {
                    self.fail("42601");
                } else {
                    self.statements.insert(name.to_vec(), sql.to_vec());
                    self.out.push_back(msg(b'1', b""));
                    return;
                }
                self.skipping = true;
            }
            Frontend::Bind(Bind {
                portal, statement, ..
            }) => {
                let Some(sql) = self.statements.get(statement).cloned() else {
                    self.fail("26000");
                    self.skipping = true;
                    return;
                };
                if self.aborted(&sql) {
                    self.fail("25P02");
                    self.skipping = true;
                    return;
                }
                if (!portal.is_empty() && self.portals.contains_key(portal)) || dice.chance(16) {
                    self.fail("42P03");
                    self.skipping = true;
                    return;
                }
                self.portals.insert(portal.to_vec(), sql);
                self.out.push_back(msg(b'2', b""));
            }
            Frontend::Describe { target, name } => {
                let sql = match target {
                    Target::Statement => self.statements.get(name).cloned(),
                    Target::Portal => self.portals.get(name).cloned(),
                };
                let Some(sql) = sql.filter(|sql| !self.aborted(sql)) else {
                    self.fail("26000");
                    self.skipping = true;
                    return;
                };
                if target == Target::Statement {
                    self.out.push_back(msg(b't', &[0, 0]));
                }
                if kind(&sql) == Kind::Rows {
                    self.out
                        .push_back(row_description(1 + usize::from(dice.next() % 9)));
                } else {
                    self.out.push_back(msg(b'n', b""));
                }
            }
            Frontend::Execute { portal } => {
                let Some(sql) = self.portals.get(portal).cloned() else {
                    self.fail("34000");
                    self.skipping = true;
                    return;
                };
                if !self.execute(&sql, dice) {
                    self.skipping = true;
                }
            }
            Frontend::Close { target, name } => {
                match target {
                    Target::Statement => self.statements.remove(name),
                    Target::Portal => self.portals.remove(name),
                };
                self.out.push_back(msg(b'3', b""));
            }
            Frontend::Sync => {
                self.skipping = false;
                self.ready();
            }
            Frontend::Query { sql } => {
                // A simple query drops the unnamed statement.
                self.statements.remove(&b""[..]);
                if sql.iter().all(u8::is_ascii_whitespace) {
                    self.out.push_back(msg(b'I', b""));
                } else {
                    if kind(sql) == Kind::Rows && self.txn != b'E' {
                        self.out.push_back(row_description(1));
                    }
                    self.execute(sql, dice);
                }
                self.ready();
            }
            Frontend::FunctionCall => {
                self.fail("42883");
                self.ready();
            }
            Frontend::Flush | Frontend::CopyData | Frontend::CopyEnd => {}
            Frontend::Terminate => self.closed = true,
            Frontend::Other(t) if b"PBEDCQSF".contains(&t) && t == tag => {
                // A known message whose body does not read: ERROR 08P01.
                self.fail("08P01");
                if t == b'S' || t == b'Q' || t == b'F' {
                    self.ready();
                } else {
                    self.skipping = true;
                }
            }
            Frontend::Other(_) => {
                self.out.push_back(error("08P01", true));
                self.closed = true;
            }
        }
    }
}
