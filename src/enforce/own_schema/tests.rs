use super::*;

fn own() -> OwnSchema {
    OwnSchema::new("resumeguard")
}

#[track_caller]
fn refused(sql: &str) -> Breach {
    match own().check(sql) {
        Err(b) => b,
        Ok(()) => panic!("admitted: {sql}"),
    }
}

#[track_caller]
fn admitted(sql: &str) {
    if let Err(b) = own().check(sql) {
        panic!("refused ({b}): {sql}");
    }
}

#[test]
fn changes_to_the_schema_are_refused_in_any_spelling() {
    for sql in [
        "DELETE FROM resumeguard.claims WHERE thread_id = $1",
        "delete from RESUMEGUARD.claims",
        "DELETE FROM \"resumeguard\".\"claims\"",
        "DELETE FROM ResumeGuard . claims",
        "DELETE FROM resumeguard/* c */./* d */claims",
        "DELETE FROM postgres.resumeguard.claims",
        "DELETE FROM U&\"resum\\0065guard\".claims",
        "DELETE FROM u&\"resum!0065guard\" UESCAPE '!' .claims",
        "DELETE FROM U&\"\\+000072esumeguard\".claims",
        "TRUNCATE resumeguard.audit_events",
        "UPDATE resumeguard.audit_events SET detail = '{}'",
        "INSERT INTO resumeguard.claims SELECT * FROM t",
        "ALTER TABLE resumeguard.audit_events DISABLE TRIGGER ALL",
        "DROP SCHEMA resumeguard CASCADE",
        "DROP TABLE public.t, resumeguard.claims",
        "CREATE TABLE resumeguard.x (a int)",
        "GRANT ALL ON ALL TABLES IN SCHEMA resumeguard TO PUBLIC",
        "COMMENT ON TABLE resumeguard.claims IS 'x'",
        "COPY resumeguard.claims FROM STDIN",
        "COPY (SELECT * FROM resumeguard.claims) TO STDOUT",
        "LOCK TABLE resumeguard.claims IN ACCESS EXCLUSIVE MODE",
        "VACUUM FULL resumeguard.claims",
        "ALTER TABLE t SET SCHEMA resumeguard",
        "WITH gone AS (DELETE FROM resumeguard.claims RETURNING *) SELECT * FROM gone",
        "SELECT * INTO TEMP copy FROM resumeguard.claims",
        "PREPARE p AS DELETE FROM resumeguard.claims",
        "EXPLAIN ANALYZE DELETE FROM resumeguard.claims",
        "SELECT 1; DELETE FROM resumeguard.claims",
    ] {
        assert!(
            matches!(refused(sql), Breach::Changes { .. }),
            "{sql}: {}",
            refused(sql)
        );
    }
    assert_eq!(
        refused("truncate resumeguard.audit_events"),
        Breach::Changes { verb: "TRUNCATE" }
    );
}

#[test]
fn reads_are_admitted_and_locking_reads_refused() {
    for sql in [
        "SELECT * FROM resumeguard.claims",
        "select state from RESUMEGUARD.claims where thread_id = $1",
        "SELECT count(*) FROM \"resumeguard\".audit_events",
        "WITH c AS (SELECT * FROM resumeguard.claims) SELECT * FROM c",
        "TABLE resumeguard.claims",
        "(SELECT 1 FROM resumeguard.claims)",
        "SELECT substring(thread_id FROM 1 FOR 3) FROM resumeguard.claims",
    ] {
        admitted(sql);
    }
    for sql in [
        "SELECT * FROM resumeguard.claims FOR UPDATE",
        "SELECT * FROM resumeguard.claims FOR NO KEY UPDATE SKIP LOCKED",
        "SELECT * FROM resumeguard.claims FOR SHARE",
        "select * from resumeguard.claims for key share nowait",
    ] {
        assert_eq!(refused(sql), Breach::Locks, "{sql}");
    }
    assert_eq!(
        refused("SELECT resumeguard.audit_events_append_only()"),
        Breach::CallsInto
    );
}

#[test]
fn mentions_in_strings_comments_and_other_schemas_are_not_mentions() {
    for sql in [
        "SELECT 'resumeguard.claims'",
        "INSERT INTO notes (body) VALUES ('DELETE FROM resumeguard.claims')",
        "INSERT INTO notes (body) VALUES (E'resumeguard.claims\\n')",
        "INSERT INTO notes (body) VALUES ($$DELETE FROM resumeguard.claims$$)",
        "INSERT INTO notes (body) VALUES ($q$resumeguard$q$)",
        "DELETE FROM notes -- resumeguard.claims\n WHERE id = 1",
        "DELETE FROM notes /* resumeguard.claims /* nested */ still */ WHERE id = 1",
        // Quoted names keep their case: other schemas than resumeguard.
        "DELETE FROM \"ResumeGuard\".claims",
        "DELETE FROM \"RESUMEGUARD\".claims",
        "DELETE FROM resumeguard_old.claims",
        "DELETE FROM my_resumeguard.claims",
        "UPDATE t SET schema = 'resumeguard'",
        "SELECT * FROM information_schema.tables WHERE table_schema = 'resumeguard'",
        "SHOW search_path",
        "RESET search_path",
        "SET search_path = public, \"$user\"",
        "SET search_path = 'RESUMEGUARD'",
        "SET search_path TO \"ResumeGuard\"",
        "SELECT set_config('search_path', '\"RESUMEGUARD\"', false)",
        "SELECT set_config('work_mem', '64MB', false)",
        "SELECT nextval('public.ids'), setval('ids', 5)",
        "SELECT currval('resumeguard.holder_instances')",
        "INSERT INTO checkpoints (thread_id) VALUES ($1) ON CONFLICT DO NOTHING",
    ] {
        admitted(sql);
    }
}

#[test]
fn putting_the_schema_on_search_path_is_refused() {
    for sql in [
        "SET search_path = resumeguard",
        "SET search_path TO public, RESUMEGUARD",
        "set local search_path = \"$user\", resumeguard",
        "SET SESSION SEARCH_PATH TO 'resumeguard'",
        "SET \"search_path\" = resumeguard",
        "SET SCHEMA 'resumeguard'",
        "ALTER ROLE app SET search_path = resumeguard",
        "ALTER DATABASE app SET search_path TO resumeguard, public",
        "SELECT set_config('search_path', 'resumeguard', false)",
        "SELECT set_config('search_path', 'public, ResumeGuard', true)",
        "SELECT pg_catalog.set_config('SEARCH_PATH', '\"resumeguard\"', false)",
        "SELECT set_config(E'search\\137path', E'resume\\147uard', false)",
        "SET search_path = U&\"resum\\0065guard\"",
    ] {
        assert_eq!(refused(sql), Breach::SearchPath, "{sql}");
    }
    for sql in [
        "SELECT set_config('search_path', $1, false)",
        "SELECT set_config($1, 'x', false)",
        "SELECT set_config('search_path', current_setting('search_path') || ',x', false)",
        "SELECT set_config('search_path', U&'resume!0067uard' UESCAPE '!', false)",
        "SET search_path = U&'resume!0067uard' UESCAPE '!'",
    ] {
        assert_eq!(refused(sql), Breach::ComputedSetting, "{sql}");
    }
    assert_eq!(
        refused("UPDATE pg_settings SET setting = 'resumeguard' WHERE name = 'search_path'"),
        Breach::Settings
    );
}

#[test]
fn bodies_of_do_blocks_and_functions_are_read() {
    for sql in [
        "DO $$ BEGIN DELETE FROM resumeguard.claims; END $$",
        "DO 'BEGIN DELETE FROM resumeguard.claims; END'",
        "DO E'BEGIN DELETE FROM resume\\147uard.claims; END'",
        "DO $$ BEGIN EXECUTE 'TRUNCATE resumeguard.audit_events'; END $$",
        "DO $$ BEGIN EXECUTE E'TRUNCATE resume\\147uard.audit_events'; END $$",
        "DO $$ BEGIN PERFORM set_config('search_path', 'resumeguard', false); END $$",
        "CREATE FUNCTION f() RETURNS void LANGUAGE sql AS $$ DELETE FROM resumeguard.claims $$",
        "create or replace procedure p() language plpgsql as 'begin delete from resumeguard.claims; end'",
        "SELECT query_to_xml('DELETE FROM resumeguard.claims RETURNING 1', true, false, '')",
        "SELECT dblink_exec('dbname=app', E'DELETE FROM resume\\147uard.claims')",
    ] {
        assert!(own().check(sql).is_err(), "admitted: {sql}");
    }
    admitted("DO $$ BEGIN RAISE NOTICE 'hello'; END $$");
    admitted("CREATE FUNCTION f() RETURNS int LANGUAGE sql AS 'SELECT 1'");
    admitted("SELECT query_to_xml('SELECT * FROM resumeguard.claims', true, false, '')");
}

#[test]
fn sequences_of_the_schema_are_not_moved() {
    for sql in [
        "SELECT setval('resumeguard.holder_instances', 1)",
        "SELECT nextval('RESUMEGUARD.holder_instances')",
        "SELECT setval('\"resumeguard\".holder_instances'::regclass, 1, false)",
        "SELECT setval($1, 1)",
        "SELECT setval(16384, 1)",
    ] {
        assert_eq!(refused(sql), Breach::Sequence, "{sql}");
    }
}

#[test]
fn drop_owned_and_reassign_owned_are_refused() {
    assert_eq!(refused("DROP OWNED BY CURRENT_USER"), Breach::Owned);
    assert_eq!(refused("reassign owned by app to other"), Breach::Owned);
}

#[test]
fn texts_that_read_two_ways_are_refused_when_they_mention_it() {
    // With standard_conforming_strings off the first string ends at the
    // second quote and the DELETE runs; on, it is all strings.
    let sql = "SELECT 'a\\''; DELETE FROM resumeguard.claims; --'";
    assert_eq!(refused(sql), Breach::Ambiguous);
    assert_eq!(
        refused("SELECT 'x\\'; DELETE FROM resumeguard.claims"),
        Breach::Ambiguous
    );
    // Backslashes that read alike either way are fine; their other
    // reading counts too.
    admitted("SELECT 'a\\\\b' FROM resumeguard.claims");
    admitted("SELECT 'no backslash', 'a''b' FROM resumeguard.claims");
    assert_eq!(
        refused("SET search_path = 'resume\\147uard'"),
        Breach::SearchPath
    );
    // Nothing watched in the text: not even tokenized.
    admitted("SELECT 'a\\'; SELECT 1");
}

#[test]
fn a_statement_a_multibyte_character_hides_in_a_string_is_refused() {
    let decoded = |sql: &[u8]| crate::wire::client_text::decode(sql).into_owned();
    // SJIS 表 is 0x95 0x5C: the server reads E'表', and the DELETE runs.
    let sql = decoded(b"SELECT E'\x95\\' ; DELETE FROM resumeguard.claims ; --'");
    assert_eq!(refused(&sql), Breach::Changes { verb: "DELETE" });
    // The character where the backslash escapes nothing; a reading the
    // server rejects (its string never ends); a character that holds no
    // backslash (é is 0xC3 0xA9).
    admitted(&decoded(b"SELECT $$\x95\\$$ FROM resumeguard.claims"));
    admitted(&decoded(b"SELECT E'\x95\\\\' FROM resumeguard.claims"));
    admitted("SELECT E'\u{e9}\\\\' FROM resumeguard.claims");
}

#[test]
fn unreadable_texts_are_refused_only_when_they_mention_it() {
    assert!(matches!(
        refused("DELETE FROM resumeguard.claims WHERE x = 'unterminated"),
        Breach::Unreadable(_)
    ));
    assert!(matches!(
        refused("DELETE FROM U&\"resum\\zzzzguard\".claims"),
        Breach::Unreadable(_)
    ));
    admitted("SELECT 'unterminated");
}

#[test]
fn statements_without_a_watched_word_cost_no_tokenizing() {
    let own = own();
    assert!(!own.may_touch("INSERT INTO checkpoints VALUES ($1, $2)", false));
    assert!(own.may_touch("delete from ResumeGuard.claims", false));
    assert!(!own.may_touch("SELECT E'\\n'", false));
    assert!(own.may_touch("DO E'\\n'", false));
    assert!(own.may_touch("SELECT E'\\n'", true));
}

#[test]
fn the_refusal_is_42501_and_names_the_schema() {
    let r = own().admit("DELETE FROM resumeguard.claims").unwrap_err();
    assert_eq!(r.sqlstate, "42501");
    assert!(
        r.message
            .contains("schema resumeguard belongs to resumeguard"),
        "{}",
        r.message
    );
    assert!(r.detail.starts_with("DELETE names it"), "{}", r.detail);
}

#[test]
fn another_schema_name_is_guarded_the_same() {
    let own = OwnSchema::new("rg_test_7");
    assert!(own.check("DELETE FROM RG_TEST_7.claims").is_err());
    assert!(own.check("DELETE FROM resumeguard.claims").is_ok());
}

#[test]
fn search_path_at_login_is_checked() {
    let own = own();
    let p = |k: &str, v: &str| {
        vec![
            ("user".to_owned(), "app".to_owned()),
            (k.to_owned(), v.to_owned()),
        ]
    };
    assert_eq!(
        own.check_startup(&p("options", "-c search_path=resumeguard")),
        Err(Breach::SearchPath)
    );
    assert_eq!(
        own.check_startup(&p("options", "--search_path=public,ResumeGuard")),
        Err(Breach::SearchPath)
    );
    assert_eq!(
        own.check_startup(&p("search_path", "public, RESUMEGUARD")),
        Err(Breach::SearchPath)
    );
    assert_eq!(
        own.check_startup(&p("options", "-csearch-path=resumeguard")),
        Err(Breach::SearchPath)
    );
    assert_eq!(
        own.check_startup(&p(
            "options",
            "-c work_mem=4MB -c search_path=a,\\ resumeguard"
        )),
        Err(Breach::SearchPath)
    );
    assert_eq!(own.check_startup(&p("search_path", "public")), Ok(()));
    assert_eq!(
        own.check_startup(&p(
            "options",
            "-c search_path=public -c application_name=resumeguard"
        )),
        Ok(())
    );
    assert_eq!(
        own.check_startup(&p("options", "-c search_path=\"RESUMEGUARD\"")),
        Ok(())
    );
    assert_eq!(own.check_startup(&p("options", "-c work_mem=64MB")), Ok(()));
    assert_eq!(
        own.check_startup(&p("application_name", "resumeguard")),
        Ok(())
    );
}

#[test]
fn identifier_lists_split_as_postgres_splits_them() {
    assert_eq!(
        split_identifiers(" a, \"B\"\"c\" ,D ", ','),
        Some(vec!["a".to_owned(), "B\"c".to_owned(), "d".to_owned()])
    );
    assert_eq!(split_identifiers("", ','), Some(vec![]));
    assert_eq!(split_identifiers("a,,b", ','), None);
    assert_eq!(split_identifiers("a b", ','), None);
    assert_eq!(split_identifiers("\"open", ','), None);
    assert_eq!(
        split_identifiers("\"resumeguard\".Claims", '.'),
        Some(vec!["resumeguard".to_owned(), "claims".to_owned()])
    );
}
