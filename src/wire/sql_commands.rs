//! SQL-level commands that act on the protocol's own namespaces: `PREPARE`,
//! `EXECUTE`, `DEALLOCATE`, `DISCARD ALL`, `DECLARE … CURSOR` and `FETCH`.
//! A statement prepared in SQL is the same object a protocol Bind can name,
//! SQL `EXECUTE` runs a statement prepared by a protocol Parse, and SQL
//! `FETCH` reads the rows of a portal a protocol Bind made, so the tracker
//! must see these in query texts as it sees Parse, Close and Execute. The
//! savepoint commands (`SAVEPOINT`, `RELEASE`, `ROLLBACK TO`) are read too:
//! which of a transaction's statements survive it depends on them.
//!
//! Texts are split with sqlparser's tokenizer (quotes, dollar quotes and
//! comments are understood, nothing is parsed), and only when a cheap scan
//! finds one of the keywords. A text is read as [`client_text`] decodes
//! it; names are the client's bytes.

use std::borrow::Cow;
use std::sync::LazyLock;

use aho_corasick::AhoCorasick;
use sqlparser::dialect::{Dialect, PostgreSqlDialect};
use sqlparser::keywords::Keyword;
use sqlparser::tokenizer::{Token, Tokenizer, Whitespace, Word};

use super::client_text::{self, HELD_BACKSLASH};
use super::multibyte_readings;
use backslash_escapes::BackslashEscapes;

mod backslash_escapes;

/// One namespace-changing or namespace-reading command of a query text.
/// A name is the client's bytes, as a protocol message would carry it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SqlCommand {
    /// `PREPARE name [(types)] AS inner`: defines `name` when the server
    /// answers `PREPARE`.
    Prepare { name: Vec<u8>, inner: String },
    /// `EXECUTE name`, also under `EXPLAIN` and `CREATE TABLE … AS`.
    Execute { name: Vec<u8> },
    /// `DEALLOCATE [PREPARE] name`: forgets `name` when the server answers.
    Deallocate { name: Vec<u8> },
    /// `DEALLOCATE ALL` or `DISCARD ALL`: forgets every statement.
    DeallocateAll,
    /// `DECLARE name … CURSOR … FOR inner`: a portal whose rows `FETCH`
    /// and a protocol Execute read.
    Declare { name: Vec<u8>, inner: String },
    /// `FETCH [direction] [FROM | IN] name`: reads rows of the portal
    /// `name`, one a protocol Bind made among them. (`MOVE` reads none.)
    Fetch { name: Vec<u8> },
    /// `SAVEPOINT name`.
    Savepoint { name: Vec<u8> },
    /// `RELEASE [SAVEPOINT] name`.
    Release { name: Vec<u8> },
    /// `ROLLBACK [WORK | TRANSACTION] TO [SAVEPOINT] name`.
    RollbackTo { name: Vec<u8> },
}

/// A savepoint command the server confirmed: what it did to the open
/// transaction. A name is the client's bytes, folded as the server folds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SavepointChange<'a> {
    /// A savepoint of this name was set.
    Set(&'a [u8]),
    /// The newest savepoint of this name, and every later one, were
    /// released: what was done since stays, as part of the enclosing one.
    Released(&'a [u8]),
    /// Everything done since the newest savepoint of this name was undone;
    /// the savepoint stays, later ones are gone.
    RolledBackTo(&'a [u8]),
}

impl SqlCommand {
    /// The CommandComplete tag the server answers a successful command
    /// with, for the commands applied when confirmed (`DEALLOCATE ALL` has
    /// two: see [`SqlCommand::confirmed_by`]).
    pub fn completion_tag(&self) -> Option<&'static [u8]> {
        match self {
            SqlCommand::Prepare { .. } => Some(b"PREPARE"),
            SqlCommand::Deallocate { .. } => Some(b"DEALLOCATE"),
            SqlCommand::DeallocateAll => None,
            SqlCommand::Execute { .. } | SqlCommand::Declare { .. } | SqlCommand::Fetch { .. } => {
                None
            }
            SqlCommand::Savepoint { .. } => Some(b"SAVEPOINT"),
            SqlCommand::Release { .. } => Some(b"RELEASE"),
            SqlCommand::RollbackTo { .. } => Some(b"ROLLBACK"),
        }
    }

    /// What the command does to the open transaction, for a savepoint
    /// command.
    pub fn savepoint(&self) -> Option<SavepointChange<'_>> {
        match self {
            SqlCommand::Savepoint { name } => Some(SavepointChange::Set(name)),
            SqlCommand::Release { name } => Some(SavepointChange::Released(name)),
            SqlCommand::RollbackTo { name } => Some(SavepointChange::RolledBackTo(name)),
            _ => None,
        }
    }

    /// Whether the tracker applies the command when the server confirms
    /// it: it changes which statements exist, or what of the open
    /// transaction survives.
    pub fn applies_when_confirmed(&self) -> bool {
        !matches!(
            self,
            SqlCommand::Execute { .. } | SqlCommand::Declare { .. } | SqlCommand::Fetch { .. }
        )
    }

    /// Whether `tag` (a CommandComplete tag without its NUL) confirms this
    /// command.
    pub fn confirmed_by(&self, tag: &[u8]) -> bool {
        match self {
            SqlCommand::DeallocateAll => tag == b"DEALLOCATE ALL" || tag == b"DISCARD ALL",
            other => other.completion_tag() == Some(tag),
        }
    }
}

/// A query text whose commands the tokenizer could not read although it
/// names one of the keywords: the tracker cannot know what it prepares or
/// executes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable(pub String);

/// The commands of `sql`, in order. Texts without any of the keywords
/// (almost all traffic) cost one case-insensitive scan.
pub fn scan(sql: &str) -> Result<Vec<SqlCommand>, Unreadable> {
    if !mentions_keyword(sql) {
        return Ok(Vec::new());
    }
    let commands = commands_read_by(&PostgreSqlDialect {}, sql, Literals::Kept)?;
    // With `standard_conforming_strings` off a backslash may end a string
    // elsewhere, and text the standard reading holds in a string run as
    // commands. Read so, a text that does not tokenize fails on the
    // server as well (a simple Query or a Parse is lexed whole before
    // anything of it runs), so only the standard reading's commands can.
    if sql.contains('\\') {
        if let Ok(escaped) = commands_read_by(&BackslashEscapes, sql, Literals::Kept) {
            if escaped != commands {
                return Err(Unreadable(
                    "its commands differ when standard_conforming_strings is off".into(),
                ));
            }
        }
        if differs_in_a_multibyte_encoding(sql)? {
            return Err(Unreadable(
                "its commands differ in a client encoding whose characters may end in a \
                 backslash (SJIS, BIG5, GBK)"
                    .into(),
            ));
        }
    }
    Ok(commands)
}

/// Whether `sql`'s commands differ in shape as SJIS, BIG5 and the like
/// read it, where a backslash may be part of the character before it
/// (with `standard_conforming_strings` on or off). Shapes, because what
/// a string holds reads differently in those encodings anyway.
fn differs_in_a_multibyte_encoding(sql: &str) -> Result<bool, Unreadable> {
    let readings = multibyte_readings::readings(sql);
    if readings.is_empty() {
        return Ok(false);
    }
    let shape = commands_read_by(&PostgreSqlDialect {}, sql, Literals::Blank)?;
    Ok(readings.iter().any(|reading| {
        [&PostgreSqlDialect {} as &dyn Dialect, &BackslashEscapes]
            .into_iter()
            .any(|dialect| {
                commands_read_by(dialect, reading, Literals::Blank)
                    .is_ok_and(|theirs| theirs != shape)
            })
    }))
}

/// How the statement a command holds is rejoined.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Literals {
    /// As written.
    Kept,
    /// Each literal as `''`, and a backslash held in a character as a
    /// backslash: what is left is the statement's shape.
    Blank,
}

/// The commands of `sql` as `dialect` tokenizes it.
fn commands_read_by(
    dialect: &dyn Dialect,
    sql: &str,
    literals: Literals,
) -> Result<Vec<SqlCommand>, Unreadable> {
    let tokens = Tokenizer::new(dialect, sql)
        .tokenize()
        .map_err(|e| Unreadable(e.to_string()))?;
    let mut commands = Vec::new();
    for statement in tokens.split(|t| *t == Token::SemiColon) {
        let significant: Vec<&Token> = statement
            .iter()
            .filter(|t| !matches!(t, Token::Whitespace(_)))
            .collect();
        if let Some(command) = command_of(&significant, literals) {
            commands.push(command);
        }
    }
    Ok(commands)
}

/// The words a text names a command by (in any ASCII case): a text
/// without any of them has no command.
pub const KEYWORDS: [&str; 9] = [
    "prepare",
    "execute",
    "deallocate",
    "declare",
    "discard",
    "fetch",
    "savepoint",
    "release",
    "rollback",
];

/// The keywords, searched for at once, ASCII case-insensitively (a SIMD
/// literal search with no scratch state shared between sessions).
static SEARCH: LazyLock<Option<AhoCorasick>> = LazyLock::new(|| {
    AhoCorasick::builder()
        .ascii_case_insensitive(true)
        .build(KEYWORDS)
        .ok()
});

fn mentions_keyword(sql: &str) -> bool {
    // The patterns are constants that build; were they ever not to, every
    // text is tokenized (slower, never blind).
    SEARCH.as_ref().is_none_or(|k| k.is_match(sql))
}

fn command_of(tokens: &[&Token], literals: Literals) -> Option<SqlCommand> {
    let first = word(tokens.first()?)?;
    match first.keyword {
        Keyword::PREPARE => named_statement(&tokens[1..], Keyword::AS, literals)
            .map(|(name, inner)| SqlCommand::Prepare { name, inner }),
        Keyword::EXECUTE => Some(SqlCommand::Execute {
            name: identifier(tokens.get(1)?)?,
        }),
        Keyword::DEALLOCATE => {
            let mut rest = &tokens[1..];
            if rest.first().and_then(|t| word(t)).map(|w| w.keyword) == Some(Keyword::PREPARE) {
                rest = &rest[1..];
            }
            let target = rest.first()?;
            if word(target).is_some_and(|w| w.keyword == Keyword::ALL && w.quote_style.is_none()) {
                return Some(SqlCommand::DeallocateAll);
            }
            Some(SqlCommand::Deallocate {
                name: identifier(target)?,
            })
        }
        Keyword::DISCARD => {
            let all = tokens
                .get(1)
                .and_then(|t| word(t))
                .is_some_and(|w| w.keyword == Keyword::ALL);
            all.then_some(SqlCommand::DeallocateAll)
        }
        Keyword::DECLARE => named_statement(&tokens[1..], Keyword::FOR, literals)
            .map(|(name, inner)| SqlCommand::Declare { name, inner }),
        // The portal's name ends the command, after any direction and
        // FROM or IN.
        Keyword::FETCH => Some(SqlCommand::Fetch {
            name: identifier(tokens.get(1..)?.last()?)?,
        }),
        // EXPLAIN [ANALYZE] EXECUTE name and CREATE TABLE … AS EXECUTE name
        // run the prepared statement too.
        Keyword::EXPLAIN | Keyword::CREATE => embedded_execute(first.keyword, tokens),
        Keyword::SAVEPOINT => Some(SqlCommand::Savepoint {
            name: identifier(tokens.get(1)?)?,
        }),
        Keyword::RELEASE => Some(SqlCommand::Release {
            name: savepoint_name(&tokens[1..])?,
        }),
        Keyword::ROLLBACK => {
            let mut rest = &tokens[1..];
            if matches!(
                keyword_of(rest.first()),
                Some(Keyword::WORK | Keyword::TRANSACTION)
            ) {
                rest = &rest[1..];
            }
            if keyword_of(rest.first()) != Some(Keyword::TO) {
                return None;
            }
            Some(SqlCommand::RollbackTo {
                name: savepoint_name(&rest[1..])?,
            })
        }
        _ => None,
    }
}

/// `[SAVEPOINT] name`: the name. `SAVEPOINT` alone names a savepoint
/// called `savepoint`.
fn savepoint_name(tokens: &[&Token]) -> Option<Vec<u8>> {
    let named = match (keyword_of(tokens.first()), tokens.get(1)) {
        (Some(Keyword::SAVEPOINT), Some(name)) => name,
        _ => tokens.first()?,
    };
    identifier(named)
}

/// The keyword of an unquoted word.
fn keyword_of(t: Option<&&Token>) -> Option<Keyword> {
    word(t?)
        .filter(|w| w.quote_style.is_none())
        .map(|w| w.keyword)
}

/// `name … <keyword> statement` (PREPARE's AS, DECLARE's FOR): the name
/// and the text of the statement it holds.
fn named_statement(
    tokens: &[&Token],
    keyword: Keyword,
    literals: Literals,
) -> Option<(Vec<u8>, String)> {
    let name = identifier(tokens.first()?)?;
    let at = top_level_position(tokens, keyword)?;
    Some((name, text_of(&tokens[at + 1..], literals)))
}

fn embedded_execute(first: Keyword, tokens: &[&Token]) -> Option<SqlCommand> {
    let at = top_level_position(tokens, Keyword::EXECUTE)?;
    if first == Keyword::CREATE {
        // Only `AS EXECUTE`: `GRANT`-like uses of the word do not run anything.
        let before = tokens.get(at.checked_sub(1)?).and_then(|t| word(t))?;
        if before.keyword != Keyword::AS {
            return None;
        }
    }
    Some(SqlCommand::Execute {
        name: identifier(tokens.get(at + 1)?)?,
    })
}

/// Index of the first unparenthesized, unquoted `keyword`.
fn top_level_position(tokens: &[&Token], keyword: Keyword) -> Option<usize> {
    let mut depth = 0i32;
    for (i, t) in tokens.iter().enumerate() {
        match t {
            Token::LParen => depth += 1,
            Token::RParen => depth -= 1,
            Token::Word(w) if depth == 0 && w.quote_style.is_none() && w.keyword == keyword => {
                return Some(i)
            }
            _ => {}
        }
    }
    None
}

fn word(t: &Token) -> Option<&Word> {
    match t {
        Token::Word(w) => Some(w),
        _ => None,
    }
}

/// A name as the server stores it, in the client's bytes: unquoted
/// identifiers fold to lower case, ASCII letters only, as PostgreSQL folds
/// them in a multibyte (UTF-8) database.
fn identifier(t: &Token) -> Option<Vec<u8>> {
    let w = word(t)?;
    let folded = match w.quote_style {
        Some(_) => Cow::Borrowed(w.value.as_str()),
        None => Cow::Owned(w.value.to_ascii_lowercase()),
    };
    Some(client_text::encode(&folded).into_owned())
}

/// The text of `tokens`, re-joined (enough to classify the statement).
fn text_of(tokens: &[&Token], literals: Literals) -> String {
    let mut out = String::new();
    for t in tokens {
        if !out.is_empty() {
            out.push(' ');
        }
        match t {
            Token::Whitespace(Whitespace::SingleLineComment { .. }) => {}
            Token::SingleQuotedString(_)
            | Token::EscapedStringLiteral(_)
            | Token::DollarQuotedString(_)
            | Token::NationalStringLiteral(_)
            | Token::UnicodeStringLiteral(_)
            | Token::HexStringLiteral(_)
            | Token::SingleQuotedByteStringLiteral(_)
                if literals == Literals::Blank =>
            {
                out.push_str("''")
            }
            other => out.push_str(&other.to_string()),
        }
    }
    if literals == Literals::Blank && out.contains(HELD_BACKSLASH) {
        out = out.replace(HELD_BACKSLASH, "\\");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(sql: &str) -> Vec<SqlCommand> {
        scan(sql).unwrap()
    }

    #[test]
    fn ordinary_traffic_has_no_commands() {
        assert!(names("select 1").is_empty());
        assert!(names("SELECT abalance FROM pgbench_accounts WHERE aid = 5").is_empty());
        assert!(names("select 'prepare s as insert'").is_empty());
        assert!(names("GRANT EXECUTE ON FUNCTION f() TO bob").is_empty());
        assert!(names(
            "CREATE FUNCTION f() RETURNS void LANGUAGE plpgsql AS $$ BEGIN EXECUTE 'x'; END $$"
        )
        .is_empty());
    }

    #[test]
    fn prepare_names_fold_and_keep_the_inner_statement() {
        let got =
            names("PREPARE S4 (text) AS INSERT INTO checkpoint_writes (thread_id) VALUES ($1)");
        let [SqlCommand::Prepare { name, inner }] = got.as_slice() else {
            panic!("{got:?}")
        };
        assert_eq!(name, b"s4");
        assert!(
            inner.starts_with("INSERT INTO checkpoint_writes"),
            "{inner}"
        );
        let got = names(r#"prepare "S5" as select 1"#);
        assert!(matches!(&got[..], [SqlCommand::Prepare { name, .. }] if name == b"S5"));
        // Only ASCII letters fold: `Ä` stays the name a protocol Parse gives.
        let got = names("PREPARE ÄB AS SELECT 1");
        assert!(
            matches!(&got[..], [SqlCommand::Prepare { name, .. }] if name == "Äb".as_bytes()),
            "{got:?}"
        );
    }

    #[test]
    fn execute_forms() {
        assert_eq!(
            names(
                "EXECUTE s5('t', 1); explain analyze execute s6; CREATE TEMP TABLE x AS EXECUTE s7"
            ),
            vec![
                SqlCommand::Execute { name: "s5".into() },
                SqlCommand::Execute { name: "s6".into() },
                SqlCommand::Execute { name: "s7".into() },
            ]
        );
    }

    #[test]
    fn deallocate_and_discard() {
        assert_eq!(
            names("begin; select 1/0; DEALLOCATE s1; deallocate prepare all; DISCARD ALL; discard plans"),
            vec![
                SqlCommand::Deallocate { name: "s1".into() },
                SqlCommand::DeallocateAll,
                SqlCommand::DeallocateAll,
            ]
        );
        assert!(SqlCommand::DeallocateAll.confirmed_by(b"DISCARD ALL"));
        assert!(SqlCommand::Deallocate { name: "a".into() }.confirmed_by(b"DEALLOCATE"));
        assert!(!SqlCommand::Deallocate { name: "a".into() }.confirmed_by(b"DEALLOCATE ALL"));
    }

    #[test]
    fn declare_keeps_the_cursor_query() {
        let got = names("DECLARE c NO SCROLL CURSOR WITH HOLD FOR select * from checkpoints");
        let [SqlCommand::Declare { name, inner }] = got.as_slice() else {
            panic!("{got:?}")
        };
        assert_eq!(name, b"c");
        assert!(inner.contains("checkpoints"), "{inner}");
    }

    #[test]
    fn fetch_names_the_portal_it_reads() {
        assert_eq!(
            names(
                r#"FETCH ALL FROM "P1"; fetch next in c2; FETCH 10 c3; fetch forward all from c4; MOVE 1 IN c5"#
            ),
            vec![
                SqlCommand::Fetch { name: "P1".into() },
                SqlCommand::Fetch { name: "c2".into() },
                SqlCommand::Fetch { name: "c3".into() },
                SqlCommand::Fetch { name: "c4".into() },
            ]
        );
        assert!(names("fetch").is_empty(), "no portal named");
        assert!(names("select 'fetch all from p'").is_empty());
    }

    #[test]
    fn commands_a_string_hides_only_when_backslashes_escape_are_unreadable() {
        // Standard: one string, then nothing. Backslashes escaping: the
        // string ends at `\'`, and EXECUTE runs.
        let hidden = r"SELECT 'a\'' ; EXECUTE s1 ; --'";
        assert!(scan(hidden).is_err(), "{hidden}");
        let fetch = r"SELECT 'a\'' ; FETCH ALL FROM p ; --'";
        assert!(scan(fetch).is_err(), "{fetch}");
        // Read alike both ways.
        assert_eq!(
            names(r"EXECUTE s1('C:\dir'); SELECT E'\'' "),
            vec![SqlCommand::Execute { name: "s1".into() }]
        );
        // A string the other reading never ends: the server would refuse
        // the whole text, so the standard reading's commands stand.
        assert_eq!(
            names(r"SELECT 'C:\' ; EXECUTE s1"),
            vec![SqlCommand::Execute { name: "s1".into() }]
        );
        assert!(names(r"UPDATE t SET path = 'C:\' WHERE release_date > now()").is_empty());
    }

    #[test]
    fn commands_a_multibyte_character_hides_are_unreadable() {
        // SJIS 表 is 0x95 0x5C: the server reads E'表', then EXECUTE and
        // FETCH; read as UTF-8 the backslash escapes the quote.
        for hidden in [
            &b"SELECT E'\x95\\' ; EXECUTE r7 ; --'"[..],
            b"SELECT E'\x95\\' ; FETCH ALL FROM p6 ; --'",
            b"SELECT E'x' , E'\x95\\' ; EXECUTE r7 ; --'",
        ] {
            let text = client_text::decode(hidden);
            assert!(scan(&text).is_err(), "{text}");
        }
        // The same character where the backslash escapes nothing, or a
        // name holding it, reads alike.
        let plain = client_text::decode(b"SAVEPOINT s ; SELECT '\x95\\'");
        assert_eq!(
            scan(&plain),
            Ok(vec![SqlCommand::Savepoint { name: "s".into() }])
        );
        let named = client_text::decode(b"EXECUTE \"\x95\\\"");
        assert_eq!(
            scan(&named),
            Ok(vec![SqlCommand::Execute {
                name: b"\x95\\".to_vec()
            }])
        );
        // UTF-8 ぁ (0xE3 0x81 0x81) pairs its last byte with the backslash
        // in SJIS: an escape in a PREPARE's string is a different
        // character there, and the same shape.
        assert_eq!(
            names("PREPARE p AS SELECT E'ぁ\\n', 1"),
            vec![SqlCommand::Prepare {
                name: "p".into(),
                inner: "SELECT E'ぁ\n' , 1".into()
            }]
        );
    }

    #[test]
    fn unreadable_text_with_a_keyword_is_reported() {
        assert!(scan("prepare x as select 'unterminated").is_err());
        assert!(
            scan("select 'unterminated").is_ok(),
            "no keyword: never tokenized"
        );
    }

    #[test]
    fn savepoint_commands_in_every_spelling() {
        let named = |name: &str| name.as_bytes().to_vec();
        assert_eq!(
            names(concat!(
                "SAVEPOINT _pg3_1; savepoint \"Mixed\"; RELEASE _pg3_1; release savepoint B; ",
                "ROLLBACK TO _pg3_1; rollback work to savepoint \"Mixed\"; ",
                "ROLLBACK TRANSACTION TO c; release savepoint"
            )),
            vec![
                SqlCommand::Savepoint {
                    name: named("_pg3_1")
                },
                SqlCommand::Savepoint {
                    name: named("Mixed")
                },
                SqlCommand::Release {
                    name: named("_pg3_1")
                },
                SqlCommand::Release { name: named("b") },
                SqlCommand::RollbackTo {
                    name: named("_pg3_1")
                },
                SqlCommand::RollbackTo {
                    name: named("Mixed")
                },
                SqlCommand::RollbackTo { name: named("c") },
                SqlCommand::Release {
                    name: named("savepoint")
                },
            ]
        );
        assert!(SqlCommand::RollbackTo { name: named("a") }.confirmed_by(b"ROLLBACK"));
        assert!(SqlCommand::Release { name: named("a") }.confirmed_by(b"RELEASE"));
        assert!(SqlCommand::Savepoint { name: named("a") }.confirmed_by(b"SAVEPOINT"));
    }

    #[test]
    fn whole_rollbacks_and_other_words_are_no_savepoint_commands() {
        assert!(names("ROLLBACK; rollback work; ABORT; ROLLBACK AND CHAIN").is_empty());
        assert!(names("ROLLBACK PREPARED 'x'; COMMIT").is_empty());
        assert!(names("SELECT release_date FROM releases WHERE note = 'savepoint a'").is_empty());
    }
}
