//! The proxy's own schema (claims, run leases, the audit trail) is the
//! proxy's: a client statement sent through the proxy may read it with a
//! plain SELECT, and nothing else. Statements that change it, lock its
//! rows, call into it or put it on `search_path` are refused with 42501
//! before the server sees them, in simple and extended protocol alike.
//!
//! The check reads the statement text (`sql_tokens`: PostgreSQL's own
//! rules for identifiers, quotes and `standard_conforming_strings`), and
//! the bodies of `DO` blocks and function definitions as statements of
//! their own.
//! What the server builds from text at run time (PL/pgSQL `EXECUTE` of a
//! concatenation, a setting read from a table) is beyond a text check:
//! there a role the application cannot log in as is the boundary
//! (docs/architecture.md, "The schema is the proxy's"). Texts that cannot
//! mention the schema cost one literal search.

use aho_corasick::AhoCorasick;

use crate::sql_tokens::{lex, split_identifiers, LexError, Lexeme};
use crate::wire::multibyte_readings;
use crate::wire::refusal::Refusal;

/// insufficient_privilege: what a client gets for a statement on the
/// proxy's schema.
pub const INSUFFICIENT_PRIVILEGE: &str = "42501";

/// How deep bodies inside bodies are read (a `DO` block running `EXECUTE`
/// of a string is two).
const MAX_DEPTH: usize = 4;

/// Words without which a text cannot touch the schema (besides its name):
/// the ways to set `search_path`, sequences by name, settings, statements
/// that reach objects without naming them, `U&` escapes.
const WATCHED: [&str; 8] = [
    "search_path",
    "set_config",
    "schema",
    "owned",
    "setval",
    "nextval",
    "pg_settings",
    "u&",
];

/// Functions that run a string as SQL: their string arguments are code.
const RUN_TEXT: [&str; 7] = [
    "query_to_xml",
    "query_to_xmlschema",
    "query_to_xml_and_xmlschema",
    "dblink",
    "dblink_exec",
    "dblink_open",
    "dblink_send_query",
];

/// Where strings are code (bodies, and what [`RUN_TEXT`] runs): written
/// with backslash escapes, they can spell the schema's name without
/// writing it.
const CODE: [&str; 5] = ["do", "function", "procedure", "query_to_xml", "dblink"];

/// Why a client statement may not run: it would reach the proxy's schema
/// otherwise than by reading it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Breach {
    /// A statement other than a plain read names the schema.
    Changes { verb: &'static str },
    /// A read that locks the schema's rows (FOR UPDATE / SHARE).
    Locks,
    /// A read that calls a function of the schema.
    CallsInto,
    /// Puts the schema on `search_path` (SET, set_config, ALTER … SET).
    SearchPath,
    /// Sets `search_path` (or a setting named by an expression) to a value
    /// the text does not spell out.
    ComputedSetting,
    /// Moves one of the schema's sequences (setval, nextval), or sets a
    /// sequence the text does not name.
    Sequence,
    /// Writes to `pg_settings` (sets parameters, `search_path` among them).
    Settings,
    /// `DROP OWNED` / `REASSIGN OWNED`: reaches every object of a role
    /// without naming it, the schema's too when the role owns them.
    Owned,
    /// The text reads differently with `standard_conforming_strings` off.
    Ambiguous,
    /// The text (or a body in it) does not tokenize.
    Unreadable(String),
    /// Bodies nested deeper than the check reads.
    TooDeep,
}

impl std::fmt::Display for Breach {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Breach::Changes { verb } => {
                write!(f, "{verb} names it; clients may only SELECT from it")
            }
            Breach::Locks => f.write_str("SELECT … FOR UPDATE/SHARE would lock its rows"),
            Breach::CallsInto => f.write_str("the statement calls a function of it"),
            Breach::SearchPath => f.write_str("the statement puts it on search_path"),
            Breach::ComputedSetting => f.write_str(
                "the statement sets search_path (or a setting it names by an expression) \
                 to a value the proxy cannot read",
            ),
            Breach::Sequence => f.write_str(
                "the statement moves one of its sequences, or a sequence it does not name",
            ),
            Breach::Settings => f.write_str("the statement writes to pg_settings"),
            Breach::Owned => {
                f.write_str("DROP OWNED and REASSIGN OWNED reach its objects without naming them")
            }
            Breach::Ambiguous => f.write_str(
                "the text mentions it and reads differently with standard_conforming_strings \
                 off (a backslash before a quote in a '…' string): write E'…' or $$…$$",
            ),
            Breach::Unreadable(e) => write!(f, "the text mentions it and does not tokenize: {e}"),
            Breach::TooDeep => f.write_str("bodies are nested deeper than the proxy reads"),
        }
    }
}

/// The proxy's schema, and the check of client statements against it.
pub struct OwnSchema {
    /// Lower-case letters, digits and `_` (the claims store allows no
    /// other), so an unquoted mention in any case resolves to it.
    name: String,
    /// The name and [`WATCHED`], ASCII case-insensitively.
    watched: Option<AhoCorasick>,
    /// [`CODE`], ASCII case-insensitively.
    code: Option<AhoCorasick>,
}

impl std::fmt::Debug for OwnSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("OwnSchema").field(&self.name).finish()
    }
}

impl OwnSchema {
    pub fn new(name: &str) -> Self {
        let search = |words: &[&str]| {
            AhoCorasick::builder()
                .ascii_case_insensitive(true)
                .build(words)
                .ok()
        };
        let mut watched = vec![name];
        watched.extend(WATCHED);
        OwnSchema {
            name: name.to_owned(),
            watched: search(&watched),
            code: search(&CODE),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The words without which a text with no backslash cannot touch the
    /// schema: its name and [`WATCHED`].
    pub fn words(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.name.as_str()).chain(WATCHED)
    }

    /// Whether a client statement text may run; the refusal it gets if not.
    pub fn admit(&self, sql: &str) -> Result<(), Refusal> {
        self.check(sql).map_err(|breach| self.refusal(&breach))
    }

    /// The error a client gets for `breach`.
    pub fn refusal(&self, breach: &Breach) -> Refusal {
        Refusal {
            sqlstate: INSUFFICIENT_PRIVILEGE,
            message: format!(
                "resumeguard: schema {} belongs to resumeguard (claims and audit trail)",
                self.name
            ),
            detail: breach.to_string(),
        }
    }

    /// Checks one client statement text (one or more statements), also as
    /// the server reads it in a client encoding whose characters may end
    /// in a backslash (SJIS, BIG5, GBK: see [`multibyte_readings`]), where
    /// a string may end elsewhere. A reading that does not tokenize is
    /// one the server rejects in that encoding.
    pub fn check(&self, sql: &str) -> Result<(), Breach> {
        self.check_text(sql, 0, false)?;
        if !self.may_touch(sql, false) {
            return Ok(());
        }
        for reading in multibyte_readings::readings(sql) {
            if !matches!(lex(&reading), Err(LexError::Unreadable(_))) {
                self.check_text(&reading, 0, false)?;
            }
        }
        Ok(())
    }

    /// Checks a StartupMessage's parameters: `search_path` set at login
    /// (a parameter of its own or `-c` in `options`) must not name the
    /// schema.
    pub fn check_startup(&self, params: &[(String, String)]) -> Result<(), Breach> {
        let names_it =
            |value: &str| split_identifiers(value, ',').is_none_or(|l| l.contains(&self.name));
        for (key, value) in params {
            let settings = match key.as_str() {
                "options" => option_settings(value),
                _ => vec![(key.clone(), value.clone())],
            };
            for (name, value) in settings {
                if name.eq_ignore_ascii_case("search_path") && names_it(&value) {
                    return Err(Breach::SearchPath);
                }
            }
        }
        Ok(())
    }

    /// Whether `sql` can touch the schema at all: one literal search (in
    /// `code`, any backslash escape may spell a name).
    fn may_touch(&self, sql: &str, code: bool) -> bool {
        let found = |s: &Option<AhoCorasick>| s.as_ref().is_none_or(|a| a.is_match(sql));
        found(&self.watched) || (sql.contains('\\') && (code || found(&self.code)))
    }

    /// `code`: `sql` is a body (then every string in it is code too).
    fn check_text(&self, sql: &str, depth: usize, code: bool) -> Result<(), Breach> {
        if !self.may_touch(sql, code) {
            return Ok(());
        }
        if depth > MAX_DEPTH {
            return Err(Breach::TooDeep);
        }
        let lexemes = match lex(sql) {
            Ok(l) => l,
            Err(LexError::Ambiguous) => return Err(Breach::Ambiguous),
            Err(LexError::Unreadable(e)) => return Err(Breach::Unreadable(e)),
        };
        for statement in lexemes.split(|l| *l == Lexeme::Semicolon) {
            self.check_statement(statement, depth, code)?;
        }
        Ok(())
    }

    fn check_statement(&self, s: &[Lexeme], depth: usize, code: bool) -> Result<(), Breach> {
        let Some(first) = s.first() else {
            return Ok(());
        };
        self.check_set(s)?;
        self.check_calls(s, depth)?;
        if (first.is_word("drop") || first.is_word("reassign"))
            && s.get(1).is_some_and(|l| l.is_word("owned"))
        {
            return Err(Breach::Owned);
        }
        if code || first.is_word("do") || defines_routine(s) {
            self.check_code(s, depth)?;
        }
        let read = read_kind(s);
        if read == Read::Not && s.iter().any(|l| l.name() == Some("pg_settings")) {
            return Err(Breach::Settings);
        }
        if !s.iter().any(|l| self.is_schema(l)) {
            return Ok(());
        }
        match read {
            Read::Not => Err(Breach::Changes { verb: verb(first) }),
            Read::Locking => Err(Breach::Locks),
            Read::Plain if self.calls_into(s) => Err(Breach::CallsInto),
            Read::Plain => Ok(()),
        }
    }

    /// Checks every string among `lexemes` as statements of their own.
    fn check_code(&self, lexemes: &[Lexeme], depth: usize) -> Result<(), Breach> {
        for lexeme in lexemes {
            if let Lexeme::Text(values) = lexeme {
                for body in values {
                    self.check_text(body, depth + 1, true)?;
                }
            }
        }
        Ok(())
    }

    fn is_schema(&self, lexeme: &Lexeme) -> bool {
        lexeme.name() == Some(self.name.as_str())
    }

    /// `schema.f(`: a call of one of the schema's functions.
    fn calls_into(&self, s: &[Lexeme]) -> bool {
        s.windows(4).any(|w| {
            self.is_schema(&w[0])
                && w[1] == Lexeme::Period
                && w[2].name().is_some()
                && w[3] == Lexeme::LParen
        })
    }

    /// `SET [SESSION|LOCAL] search_path {TO|=} …` (also under ALTER ROLE,
    /// DATABASE, FUNCTION, SYSTEM and in CREATE FUNCTION) and `SET SCHEMA`.
    fn check_set(&self, s: &[Lexeme]) -> Result<(), Breach> {
        for (i, lexeme) in s.iter().enumerate() {
            if !lexeme.is_word("set") {
                continue;
            }
            let mut at = i + 1;
            while s
                .get(at)
                .is_some_and(|l| l.is_word("session") || l.is_word("local"))
            {
                at += 1;
            }
            let Some(target) = s.get(at) else { continue };
            if target.is_word("schema") {
                // The statement SET SCHEMA 'name' (search_path); not ALTER …
                // SET SCHEMA (a mention) nor UPDATE … SET schema = (a column).
                if i != 0 {
                    continue;
                }
                if self.value_names_schema(s.get(at + 1))? {
                    return Err(Breach::SearchPath);
                }
            } else if target
                .name()
                .is_some_and(|n| n.eq_ignore_ascii_case("search_path"))
            {
                self.check_path_values(&s[at + 1..])?;
            }
        }
        Ok(())
    }

    /// The value list of a `SET search_path`: identifiers (folded as
    /// always) and strings (each one schema name, exact), up to the first
    /// lexeme that is not part of the list.
    fn check_path_values(&self, rest: &[Lexeme]) -> Result<(), Breach> {
        match rest.first() {
            Some(l) if l.is_word("to") || *l == Lexeme::Equals => {}
            // FROM CURRENT, or nothing to set.
            _ => return Ok(()),
        }
        let mut at = 1;
        loop {
            let value = rest.get(at);
            if value.is_some_and(|l| l.is_word("default")) {
                return Ok(());
            }
            if self.value_names_schema(value)? {
                return Err(Breach::SearchPath);
            }
            if rest.get(at + 1) != Some(&Lexeme::Comma) {
                return Ok(());
            }
            at += 2;
        }
    }

    /// Whether one SET value is the schema: an identifier resolving to
    /// it, or a string whose text (under any reading) is its name.
    fn value_names_schema(&self, value: Option<&Lexeme>) -> Result<bool, Breach> {
        match value {
            Some(Lexeme::Name { name, .. }) => Ok(*name == self.name),
            Some(Lexeme::Text(values)) if values.is_empty() => Err(Breach::ComputedSetting),
            Some(Lexeme::Text(values)) => Ok(values.contains(&self.name)),
            _ => Err(Breach::ComputedSetting),
        }
    }

    /// Calls that set `search_path`, move a sequence by name or run a
    /// string as SQL.
    fn check_calls(&self, s: &[Lexeme], depth: usize) -> Result<(), Breach> {
        for (i, lexeme) in s.iter().enumerate() {
            let Some(function) = lexeme.name() else {
                continue;
            };
            if s.get(i + 1) != Some(&Lexeme::LParen) {
                continue;
            }
            match function {
                "set_config" => self.check_set_config(&arguments(&s[i + 2..]))?,
                "setval" | "nextval" => {
                    let args = arguments(&s[i + 2..]);
                    let sequence = args.first().copied().unwrap_or_default();
                    let named: Vec<&String> = sequence
                        .iter()
                        .filter_map(|l| match l {
                            Lexeme::Text(values) => Some(values),
                            _ => None,
                        })
                        .flatten()
                        .collect();
                    if named.is_empty() && function == "setval" {
                        return Err(Breach::Sequence);
                    }
                    if named.iter().any(|text| self.qualifies(text)) {
                        return Err(Breach::Sequence);
                    }
                }
                f if RUN_TEXT.contains(&f) => {
                    for arg in arguments(&s[i + 2..]) {
                        self.check_code(arg, depth)?;
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// `set_config(name, value, is_local)`: the name must be a string; for
    /// `search_path`, so must the value, and it must not list the schema.
    fn check_set_config(&self, args: &[&[Lexeme]]) -> Result<(), Breach> {
        let text = |arg: Option<&&[Lexeme]>| match arg {
            Some([Lexeme::Text(values)]) if !values.is_empty() => Some(values.clone()),
            _ => None,
        };
        let name = text(args.first()).ok_or(Breach::ComputedSetting)?;
        if !name.iter().any(|n| n.eq_ignore_ascii_case("search_path")) {
            return Ok(());
        }
        let values = text(args.get(1)).ok_or(Breach::ComputedSetting)?;
        for value in values {
            let listed = split_identifiers(&value, ',').ok_or(Breach::ComputedSetting)?;
            if listed.contains(&self.name) {
                return Err(Breach::SearchPath);
            }
        }
        Ok(())
    }

    /// Whether a `regclass` text names an object of the schema.
    fn qualifies(&self, text: &str) -> bool {
        match split_identifiers(text, '.') {
            Some(parts) => parts.len() >= 2 && parts[parts.len() - 2] == self.name,
            // Unreadable for the server too; refused if it mentions it.
            None => text.to_ascii_lowercase().contains(&self.name),
        }
    }
}

/// The settings of a StartupMessage's `options`, as the server reads them:
/// words split at unescaped spaces (`\\` escapes the next character), then
/// `-c name=value`, `-cname=value` or `--name=value` (dashes of the name
/// read as `_`).
fn option_settings(options: &str) -> Vec<(String, String)> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut chars = options.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => word.extend(chars.next()),
            c if c.is_ascii_whitespace() => words.push(std::mem::take(&mut word)),
            c => word.push(c),
        }
    }
    words.push(word);
    words.retain(|w| !w.is_empty());
    let mut settings = Vec::new();
    let mut words = words.into_iter();
    while let Some(word) = words.next() {
        let setting = if word == "-c" {
            words.next()
        } else {
            word.strip_prefix("--")
                .or_else(|| word.strip_prefix("-c"))
                .map(str::to_owned)
        };
        if let Some((name, value)) = setting.as_deref().and_then(|s| s.split_once('=')) {
            settings.push((name.replace('-', "_"), value.to_owned()));
        }
    }
    settings
}

/// Whether a statement only reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Read {
    /// SELECT, WITH … SELECT, TABLE, VALUES without a data-changing or
    /// row-locking word anywhere in it.
    Plain,
    /// A read with FOR UPDATE / FOR SHARE (any strength).
    Locking,
    Not,
}

fn read_kind(s: &[Lexeme]) -> Read {
    let starts_as_read = s.first().is_some_and(|l| {
        *l == Lexeme::LParen
            || ["select", "with", "table", "values"]
                .iter()
                .any(|w| l.is_word(w))
    });
    const CHANGES: [&str; 7] = [
        "insert", "update", "delete", "merge", "truncate", "into", "copy",
    ];
    let changes = |l: &Lexeme| CHANGES.iter().any(|w| l.is_word(w));
    if !starts_as_read {
        return Read::Not;
    }
    // `update` alone is FOR [NO KEY] UPDATE when no other change word is
    // there; either way the statement does not pass as a plain read.
    let locks = s.windows(2).any(|w| {
        w[0].is_word("for")
            && ["update", "share", "no", "key"]
                .iter()
                .any(|k| w[1].is_word(k))
    });
    if locks {
        return Read::Locking;
    }
    if s.iter().any(changes) {
        return Read::Not;
    }
    Read::Plain
}

/// `CREATE [OR REPLACE] FUNCTION|PROCEDURE`: its strings are its body.
fn defines_routine(s: &[Lexeme]) -> bool {
    if !s.first().is_some_and(|l| l.is_word("create")) {
        return false;
    }
    let kind = match s.get(1) {
        Some(l) if l.is_word("or") => s.get(3),
        other => other,
    };
    kind.is_some_and(|l| l.is_word("function") || l.is_word("procedure"))
}

/// The arguments of a call whose `(` was just passed, split at top-level
/// commas, up to the matching `)`.
fn arguments(rest: &[Lexeme]) -> Vec<&[Lexeme]> {
    let mut args = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, lexeme) in rest.iter().enumerate() {
        match lexeme {
            Lexeme::LParen => depth += 1,
            Lexeme::RParen if depth == 0 => {
                args.push(&rest[start..i]);
                return args;
            }
            Lexeme::RParen => depth -= 1,
            Lexeme::Comma if depth == 0 => {
                args.push(&rest[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    args.push(&rest[start..]);
    args
}

/// The statement's verb for the refusal: one of a fixed set of key words
/// (no client text).
fn verb(first: &Lexeme) -> &'static str {
    const VERBS: [&str; 30] = [
        "INSERT", "UPDATE", "DELETE", "MERGE", "TRUNCATE", "DROP", "ALTER", "CREATE", "GRANT",
        "REVOKE", "COMMENT", "COPY", "LOCK", "SELECT", "WITH", "VACUUM", "ANALYZE", "REINDEX",
        "CLUSTER", "SECURITY", "EXPLAIN", "PREPARE", "DECLARE", "DO", "CALL", "SET", "IMPORT",
        "REFRESH", "EXECUTE", "TABLE",
    ];
    VERBS
        .iter()
        .find(|v| first.is_word(&v.to_ascii_lowercase()))
        .copied()
        .unwrap_or("the statement")
}

#[cfg(test)]
mod tests;
