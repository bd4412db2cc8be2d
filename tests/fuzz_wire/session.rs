//! One proxied session in process: the real session guard (the protocol
//! tracker with the real enforcer as its hooks) between a client script
//! and the server model, checking on every step that the guard keeps in
//! step with the server, and at the end that a `select 1` round (simple
//! and extended) still routes every answer to the client.

use std::sync::Arc;

use resumeguard::audit::{AuditSink, SessionContext};
use resumeguard::enforce::{Enforcement, Legs, SessionGuard};
use resumeguard::policy::ChannelRules;
use resumeguard::saver::classify::Classifier;
use resumeguard::saver::profile::SaverProfile;
use resumeguard::saver::unknown::UnknownSaverPolicy;
use resumeguard::wire::guard::{ClientStep, Guard};
use resumeguard::wire::hooks::TxnStatus;
use resumeguard::wire::response_queue::Route;

use super::corpus::split_frames;
use super::server_model::{msg, Dice, ServerModel};

/// The validity leg with one rule: channel `items` is a list of strings.
fn items_rule() -> ChannelRules {
    let dir = std::env::temp_dir().join(format!("rg-fuzz-rules-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("channels")).expect("a temporary rules directory");
    std::fs::write(
        dir.join("channels/items.toml"),
        "[[channel]]\nname = \"items\"\nschema = { type = \"array\", items = { type = \"string\" } }\n",
    )
    .expect("a rule file");
    let rules = ChannelRules::load(&dir).expect("the rule loads");
    std::fs::remove_dir_all(&dir).ok();
    rules
}

/// The enforcement every session of a property shares: the built-in
/// LangGraph Python and JS profiles, the fork filter, the validity gate
/// with one rule when `validity`, no audit outputs.
pub fn enforcement(unknown: UnknownSaverPolicy, validity: bool) -> Arc<Enforcement> {
    let classifier = Classifier::new(vec![
        SaverProfile::langgraph_python(),
        SaverProfile::langgraph_js(),
    ])
    .with_unknown_policy(unknown);
    Arc::new(Enforcement::new(
        Arc::new(classifier),
        Legs {
            validity: Arc::new(if validity {
                items_rule()
            } else {
                ChannelRules::default()
            }),
            ..Legs::default()
        },
        AuditSink::disabled(),
    ))
}

/// `RG_FUZZ_TRACE=1`: print every message of a session (to reproduce a
/// failing case with its shrunk input, one case at a time).
fn tracing() -> bool {
    std::env::var_os("RG_FUZZ_TRACE").is_some()
}

fn show(frame: &[u8]) -> String {
    let tag = frame.first().copied().unwrap_or(0) as char;
    let body = String::from_utf8_lossy(frame.get(5..).unwrap_or_default());
    format!("{tag} {:.60}", body.replace('\0', "·"))
}

pub struct Session {
    pub guard: SessionGuard,
    pub server: ServerModel,
    dice: Dice,
    /// The proxy ended the session (a client message it refuses, or a
    /// FATAL from the server).
    pub ended: bool,
}

impl Session {
    /// A session whose startup exchange has been answered.
    pub fn start(
        enforcement: &Arc<Enforcement>,
        rows: Vec<Vec<u8>>,
        dice: Vec<u8>,
    ) -> Result<Self, String> {
        let mut s = Session {
            guard: enforcement.session(SessionContext::default(), false),
            server: ServerModel::after_startup(rows),
            dice: Dice::new(dice),
            ended: false,
        };
        s.deliver_all()?;
        if !s.guard.started() {
            return Err("startup exchange answered but the guard is not started".into());
        }
        Ok(s)
    }

    /// Whether both ends still talk.
    pub fn open(&self) -> bool {
        !self.ended && !self.server.closed
    }

    /// Hands the server's next answer to the guard.
    fn deliver_one(&mut self) -> Result<Route, String> {
        let Some(frame) = self.server.out.pop_front() else {
            return Err("nothing to deliver".into());
        };
        let tag = frame.first().copied().unwrap_or(0) as char;
        let step = self
            .guard
            .on_server(&frame)
            .map_err(|d| format!("desync on the server's {tag:?}: {d}"))?;
        if tracing() {
            eprintln!("  server {} -> {:?}", show(&frame), step.route);
        }
        if tag == 'Z' && step.route != Route::Forward {
            return Err("a ReadyForQuery was kept from the client".into());
        }
        if step.hold().is_some() {
            return Err(format!("{tag:?} held with the claims leg off"));
        }
        if step.fatal {
            self.ended = true;
        }
        Ok(step.route)
    }

    pub fn deliver_all(&mut self) -> Result<(), String> {
        while !self.server.out.is_empty() {
            self.deliver_one()?;
        }
        Ok(())
    }

    /// Sends one client message through the guard to the server model,
    /// then lets the server's answers arrive as the dice say.
    pub fn client(&mut self, frame: &[u8]) -> Result<(), String> {
        if !self.open() {
            return Ok(());
        }
        let mut waited = false;
        loop {
            let step = self.guard.on_client(frame, false);
            if tracing() {
                eprintln!("client {} -> {step:?}", show(frame));
            }
            match step {
                Ok(ClientStep::Forward) => {
                    self.server.receive(frame, &mut self.dice);
                    break;
                }
                Ok(ClientStep::Replace(bytes)) => {
                    for f in split_frames(&bytes) {
                        self.server.receive(&f, &mut self.dice);
                    }
                    break;
                }
                Ok(ClientStep::Inject(bytes)) => {
                    for f in split_frames(&bytes) {
                        self.server.receive(&f, &mut self.dice);
                    }
                }
                Ok(ClientStep::AwaitServer) => {
                    if waited {
                        return Err("still waiting for the server once it is settled".into());
                    }
                    while !self.guard.settled() && !self.server.out.is_empty() {
                        self.deliver_one()?;
                    }
                    if !self.guard.settled() && self.open() {
                        return Err("waits for answers the server does not owe".into());
                    }
                    waited = true;
                    if !self.open() {
                        return Ok(());
                    }
                }
                Ok(ClientStep::Blocks) => {
                    return Err("a message blocked although not on a loop".into())
                }
                // The proxy closes the session: fail closed.
                Err(_) => {
                    self.ended = true;
                    return Ok(());
                }
            }
        }
        for _ in 0..self.dice.next() % 4 {
            if self.server.out.is_empty() {
                break;
            }
            self.deliver_one()?;
        }
        Ok(())
    }

    /// After any sequence: ends what is open (Sync, ROLLBACK), then a
    /// simple and an extended `select 1` must each be forwarded and every
    /// message of their answers reach the client.
    pub fn check_select_one(&mut self) -> Result<(), String> {
        if !self.open() {
            return Ok(());
        }
        // From here on nothing fails by chance and no notice comes.
        self.dice = Dice::new(vec![255]);
        self.client(&msg(b'S', b""))?;
        self.deliver_all()?;
        if self.open() && self.guard.txn_status() != TxnStatus::Idle {
            self.client(&query("rollback"))?;
            self.deliver_all()?;
        }
        if !self.open() {
            return Ok(());
        }
        if !self.guard.is_idle() {
            return Err("not idle once every Sync is answered".into());
        }
        let extended = [
            msg(b'P', b"\0select 1\0\0\0"),
            msg(b'B', b"\0\0\0\0\0\0\0\0"),
            msg(b'D', b"P\0"),
            msg(b'E', b"\0\0\0\0\0"),
            msg(b'S', b""),
        ];
        for round in [vec![query("select 1")], extended.to_vec()] {
            for frame in &round {
                match self.guard.on_client(frame, false) {
                    Ok(ClientStep::Forward) => self.server.receive(frame, &mut self.dice),
                    other => return Err(format!("select 1 not forwarded: {other:?}")),
                }
            }
            let answers = self.server.out.len();
            for _ in 0..answers {
                if self.deliver_one()? != Route::Forward {
                    return Err("an answer to select 1 was kept from the client".into());
                }
            }
            if answers < 3 || !self.guard.is_idle() {
                return Err(format!(
                    "select 1 round: {answers} answers, idle: {}",
                    self.guard.is_idle()
                ));
            }
        }
        Ok(())
    }
}

pub fn query(sql: &str) -> Vec<u8> {
    let mut b = sql.as_bytes().to_vec();
    b.push(0);
    msg(b'Q', &b)
}
