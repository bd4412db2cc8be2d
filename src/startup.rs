//! `serve`'s signals and the managed server's start: a stop request or a
//! SIGHUP at any moment, startup included, never leaves the managed
//! PostgreSQL running without the proxy that started it.

use anyhow::Context;
use tokio::signal::unix::{signal, Signal, SignalKind};

use resumeguard::config::Config;
use resumeguard::managed_pg::ManagedPostgres;

/// How the managed server's start ended.
pub enum Startup {
    Running(ManagedPostgres),
    /// A stop was asked for while it started: it is up, to be stopped.
    Interrupted(ManagedPostgres),
}

/// Starts the managed server off the event loop, watching signals
/// meanwhile: a stop request lets the start finish (its tools run in a
/// process group of their own, so a terminal's Ctrl-C reaches only us)
/// and then has the server stopped, never left running.
pub async fn start_managed(cfg: &Config, signals: &mut Signals) -> anyhow::Result<Startup> {
    let managed = cfg.managed.clone();
    let state_dir = cfg.state_dir.clone();
    let start = tokio::task::spawn_blocking(move || ManagedPostgres::start(&managed, &state_dir));
    tokio::pin!(start);
    loop {
        tokio::select! {
            done = &mut start => return Ok(Startup::Running(done??)),
            signal = signals.next() => match signal {
                Received::Stop => break,
                Received::Hangup => tracing::warn!(
                    "SIGHUP received while the managed PostgreSQL starts: ignored; send it \
                     again once the proxy serves to reload"
                ),
            },
        }
    }
    tracing::info!("shutdown requested while the managed PostgreSQL starts: stopping it once up");
    Ok(Startup::Interrupted(start.await??))
}

/// The signals `serve` handles: SIGINT and SIGTERM stop it, SIGHUP
/// reloads the files its configuration names (`crate::reload`).
pub struct Signals {
    term: Signal,
    hup: Signal,
    int: Signal,
}

impl Signals {
    /// Takes the signals over from their default (which ends the process).
    /// Needs a runtime context.
    pub fn install() -> anyhow::Result<Signals> {
        Ok(Signals {
            term: signal(SignalKind::terminate()).context("handling SIGTERM")?,
            hup: signal(SignalKind::hangup()).context("handling SIGHUP")?,
            int: signal(SignalKind::interrupt()).context("handling SIGINT")?,
        })
    }

    /// The next signal (cancel-safe: one that arrives meanwhile waits).
    pub async fn next(&mut self) -> Received {
        tokio::select! {
            _ = self.int.recv() => Received::Stop,
            _ = self.term.recv() => Received::Stop,
            _ = self.hup.recv() => Received::Hangup,
        }
    }
}

/// A signal, by what it asks of `serve`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    /// SIGINT, SIGTERM: stop (gracefully).
    Stop,
    /// SIGHUP: read the rules and certificates again.
    Hangup,
}
