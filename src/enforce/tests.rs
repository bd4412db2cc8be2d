//! The ordinary-text screen against the checks it stands in for: a text
//! it calls ordinary is one every check would pass by itself.

use super::*;
use crate::saver::profile::profiles_for;
use crate::wire::sql_commands::scan;

fn enforcement() -> Enforcement {
    let classifier = Arc::new(Classifier::new(
        profiles_for(None).expect("built-in profiles"),
    ));
    Enforcement::new(classifier, Legs::default(), AuditSink::disabled())
}

/// Texts ordinary traffic sends, and texts each check has something to
/// say about, in several spellings.
const TEXTS: &[&str] = &[
    "SELECT abalance FROM pgbench_accounts WHERE aid = 42;",
    "UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = 7",
    "BEGIN",
    "COMMIT",
    "select * from CHECKPOINTS where thread_id = $1",
    "INSERT INTO checkpoint_writes VALUES ($1)",
    "SELECT v FROM checkpoint_blobs",
    "select * from checkpoint_migrations",
    "SET search_path = resumeguard",
    "select set_config('search_path', 'resumeguard', false)",
    "DELETE FROM ResumeGuard.claims",
    "select nextval('resumeguard.seq')",
    "SELECT U&\"d\\0061ta\" FROM t",
    "SELECT u&'x'",
    "DROP OWNED BY app",
    "PREPARE q AS SELECT 1",
    "execute q",
    "DEALLOCATE ALL",
    "DISCARD ALL",
    "DECLARE c CURSOR FOR SELECT 1",
    "DO $$BEGIN EXECUTE 'delete from resum' || 'eguard.claims'; END$$",
    "select E'\\x72esumeguard'",
    "CREATE FUNCTION f() RETURNS int AS 'select 1' LANGUAGE sql",
];

#[test]
fn an_ordinary_text_passes_every_check_it_stands_in_for() {
    let enforcement = enforcement();
    let mut ordinary = 0;
    for sql in TEXTS {
        if !enforcement.ordinary(sql.as_bytes()) {
            continue;
        }
        ordinary += 1;
        assert!(enforcement.legs.own_schema.check(sql).is_ok(), "{sql}");
        assert!(!enforcement.classifier.names_saver_tables(sql), "{sql}");
        assert!(
            enforcement
                .classifier
                .is_other(&enforcement.classifier.classify(sql)),
            "{sql}"
        );
        assert_eq!(scan(sql), Ok(Vec::new()), "{sql}");
    }
    // pgbench's texts, BEGIN and COMMIT, and the function definition with
    // none of the words.
    assert_eq!(ordinary, 5);
}

#[test]
fn every_text_a_check_acts_on_is_not_ordinary() {
    let enforcement = enforcement();
    for sql in TEXTS
        .iter()
        .skip(4)
        .filter(|s| !s.starts_with("CREATE FUNCTION"))
    {
        assert!(!enforcement.ordinary(sql.as_bytes()), "{sql}");
    }
}

#[test]
fn a_backslash_makes_a_text_not_ordinary() {
    let enforcement = enforcement();
    assert!(enforcement.ordinary("SELECT 'a' FROM t".as_bytes()));
    assert!(!enforcement.ordinary("SELECT 'a\\' FROM t".as_bytes()));
}
