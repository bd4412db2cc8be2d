//! Runs a proptest property for a share of a wall-clock budget instead of
//! a fixed case count, so the fuzz harness costs the same on any machine:
//! `RG_FUZZ_SECONDS` (default 60) is split evenly between the properties.

use std::fmt::Debug;
use std::time::{Duration, Instant};

use proptest::strategy::Strategy;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

/// How many properties share the budget (the `#[test]`s of fuzz_wire.rs).
pub const PROPERTIES: u32 = 6;

/// Cases per proptest run; a run is the unit between two deadline checks.
const CASES_PER_RUN: u32 = 64;

fn share() -> Duration {
    let total: f64 = std::env::var("RG_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60.0);
    Duration::from_secs_f64(total.max(0.0) / f64::from(PROPERTIES))
}

/// Runs `test` on values of `strategy` until this property's share of the
/// budget is spent (at least one run). A failing case is shrunk by proptest
/// and reported with `name`.
pub fn run_for<S>(name: &str, strategy: S, test: impl Fn(S::Value) -> Result<(), TestCaseError>)
where
    S: Strategy,
    S::Value: Debug,
{
    let started = Instant::now();
    let deadline = started + share();
    let mut cases = 0u64;
    loop {
        let mut runner = TestRunner::new(Config {
            cases: CASES_PER_RUN,
            failure_persistence: None,
            ..Config::default()
        });
        if let Err(e) = runner.run(&strategy, &test) {
            panic!("{name}: {e}");
        }
        cases += u64::from(CASES_PER_RUN);
        if Instant::now() >= deadline {
            break;
        }
    }
    eprintln!(
        "{name}: {cases} cases in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
