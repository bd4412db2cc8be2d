//! A statement text's tokens as PostgreSQL reads them, for the checks that
//! must see names however they are spelled (the own-schema check, the
//! classifier's search for checkpoint tables): identifiers resolved
//! (unquoted ones folded to lower case, quoted and `U&"…"` ones exact),
//! string constants with their value under each setting of
//! `standard_conforming_strings`, whitespace and comments gone.
//! sqlparser's tokenizer splits the text (quotes, dollar quotes, nested
//! comments); nothing is parsed.

use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::tokenizer::{Token, Tokenizer, Word};

/// One token of a statement text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Lexeme {
    /// An identifier or key word as PostgreSQL resolves it; `quoted`:
    /// written in double quotes (then never a key word).
    Name {
        name: String,
        quoted: bool,
    },
    /// A string constant: its value under each reading of the text (one
    /// when the readings agree); empty when it cannot be known
    /// (`U&'…' UESCAPE`).
    Text(Vec<String>),
    Semicolon,
    Period,
    Comma,
    LParen,
    RParen,
    Equals,
    Other,
}

impl Lexeme {
    /// Whether this is the unquoted key word (or identifier) `word`.
    pub(crate) fn is_word(&self, word: &str) -> bool {
        matches!(self, Lexeme::Name { name, quoted: false } if name == word)
    }

    /// The name this lexeme resolves to, if it is a name.
    pub(crate) fn name(&self) -> Option<&str> {
        match self {
            Lexeme::Name { name, .. } => Some(name),
            _ => None,
        }
    }
}

/// Why a text's tokens cannot be known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LexError {
    /// The tokenizer (or a `U&` escape) failed.
    Unreadable(String),
    /// A `'…'` string ends elsewhere when `standard_conforming_strings` is
    /// off (a backslash before a quote): the server's reading depends on a
    /// setting the client can change at any time.
    Ambiguous,
}

/// The lexemes of `sql`.
pub(crate) fn lex(sql: &str) -> Result<Vec<Lexeme>, LexError> {
    // Raw: a '…' string's text as written, so both readings can be made.
    let tokens = Tokenizer::new(&PostgreSqlDialect {}, sql)
        .with_unescape(false)
        .tokenize()
        .map_err(|e| LexError::Unreadable(e.to_string()))?;
    let mut out = Vec::with_capacity(tokens.len());
    let mut at = 0;
    while let Some(token) = tokens.get(at) {
        at += 1;
        let lexeme = match token {
            Token::Whitespace(_) => continue,
            Token::Word(w) if is_unicode_prefix(w) => match unicode_identifier(&tokens, at) {
                Some((body, next)) => {
                    let (escape, next) = uescape(&tokens, next);
                    at = next;
                    let name = decode_unicode_escapes(&body, escape.unwrap_or('\\'))?;
                    Lexeme::Name { name, quoted: true }
                }
                None => word(w),
            },
            Token::Word(w) => word(w),
            Token::SingleQuotedString(raw) | Token::NationalStringLiteral(raw) => {
                Lexeme::Text(readings(raw)?)
            }
            Token::EscapedStringLiteral(value) => Lexeme::Text(vec![value.clone()]),
            Token::UnicodeStringLiteral(value) => {
                // The tokenizer decodes with `\`; another escape character
                // makes the value unknown.
                let (escape, next) = uescape(&tokens, at);
                at = next;
                match escape {
                    Some(_) => Lexeme::Text(Vec::new()),
                    None => Lexeme::Text(vec![value.clone()]),
                }
            }
            Token::DollarQuotedString(d) => Lexeme::Text(vec![d.value.clone()]),
            Token::SemiColon => Lexeme::Semicolon,
            Token::Period => Lexeme::Period,
            Token::Comma => Lexeme::Comma,
            Token::LParen => Lexeme::LParen,
            Token::RParen => Lexeme::RParen,
            Token::Eq => Lexeme::Equals,
            _ => Lexeme::Other,
        };
        out.push(lexeme);
    }
    Ok(out)
}

fn word(w: &Word) -> Lexeme {
    match w.quote_style {
        None => Lexeme::Name {
            name: w.value.to_ascii_lowercase(),
            quoted: false,
        },
        // Raw tokens keep a doubled quote doubled.
        Some(q) => Lexeme::Name {
            name: w.value.replace(&format!("{q}{q}"), &q.to_string()),
            quoted: true,
        },
    }
}

/// `U` or `u`, which opens a `U&"…"` identifier when `&"` follows at once.
fn is_unicode_prefix(w: &Word) -> bool {
    w.quote_style.is_none() && w.value.eq_ignore_ascii_case("u")
}

/// The raw body of the `&"…"` right after a `U` at `at`, and where the
/// tokens after it start; `None` when `&"` does not follow at once.
fn unicode_identifier(tokens: &[Token], at: usize) -> Option<(String, usize)> {
    match (tokens.get(at), tokens.get(at + 1)) {
        (Some(Token::Ampersand), Some(Token::Word(w))) if w.quote_style == Some('"') => {
            Some((w.value.replace("\"\"", "\""), at + 2))
        }
        _ => None,
    }
}

/// A `UESCAPE 'c'` clause starting at `at` (after whitespace): its escape
/// character and where the tokens after it start.
fn uescape(tokens: &[Token], at: usize) -> (Option<char>, usize) {
    let significant =
        |from: usize| (from..tokens.len()).find(|i| !matches!(tokens[*i], Token::Whitespace(_)));
    let Some(keyword) = significant(at) else {
        return (None, at);
    };
    match &tokens[keyword] {
        Token::Word(w) if w.quote_style.is_none() && w.value.eq_ignore_ascii_case("uescape") => {
            let quote = significant(keyword + 1);
            match quote.map(|q| (q, &tokens[q])) {
                Some((q, Token::SingleQuotedString(c))) => {
                    // Any other text than one character: an error for the
                    // server, unknown here.
                    let mut chars = c.chars();
                    let escape = match (chars.next(), chars.next()) {
                        (Some(c), None) => c,
                        _ => '\0',
                    };
                    (Some(escape), q + 1)
                }
                _ => (Some('\0'), keyword + 1),
            }
        }
        _ => (None, at),
    }
}

/// A `U&"…"` body with its escapes (`\XXXX`, `\+XXXXXX`, `\\`, with the
/// UESCAPE character in place of `\`) decoded.
fn decode_unicode_escapes(body: &str, escape: char) -> Result<String, LexError> {
    let bad = || LexError::Unreadable("an invalid Unicode escape in a U&\"…\" identifier".into());
    if escape == '\0' {
        return Err(bad());
    }
    let mut out = String::with_capacity(body.len());
    let mut chars = body.chars().peekable();
    while let Some(c) = chars.next() {
        if c != escape {
            out.push(c);
            continue;
        }
        if chars.peek() == Some(&escape) {
            chars.next();
            out.push(escape);
            continue;
        }
        let digits = if chars.peek() == Some(&'+') {
            chars.next();
            6
        } else {
            4
        };
        let hex: String = chars.by_ref().take(digits).collect();
        let code = (hex.len() == digits)
            .then(|| u32::from_str_radix(&hex, 16).ok())
            .flatten()
            .and_then(char::from_u32)
            .ok_or_else(bad)?;
        out.push(code);
    }
    Ok(out)
}

/// A `'…'` string's values, from its raw text: as written (quotes
/// doubled), and, when it holds a backslash, as the server reads it with
/// `standard_conforming_strings` off (backslash escapes, as in `E'…'`).
fn readings(raw: &str) -> Result<Vec<String>, LexError> {
    let standard = raw.replace("''", "'");
    if !raw.contains('\\') {
        return Ok(vec![standard]);
    }
    if !ends_alike(raw) {
        return Err(LexError::Ambiguous);
    }
    let escaped = Tokenizer::new(&PostgreSqlDialect {}, &format!("E'{raw}'"))
        .tokenize()
        .map_err(|e| LexError::Unreadable(e.to_string()))?;
    match escaped.as_slice() {
        [Token::EscapedStringLiteral(value)] if *value == standard => Ok(vec![standard]),
        [Token::EscapedStringLiteral(value)] => Ok(vec![standard, value.clone()]),
        _ => Err(LexError::Ambiguous),
    }
}

/// Whether a raw `'…'` body ends where it ends under both readings: no
/// backslash (outside a `\\` pair) stands before a quote or the end.
fn ends_alike(raw: &str) -> bool {
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c == '\\' && matches!(chars.next(), None | Some('\'')) {
            return false;
        }
    }
    true
}

/// A list of identifiers separated by `separator` as PostgreSQL splits a
/// setting's text (`SplitIdentifierString`: `search_path` in `set_config`,
/// a qualified name in a `regclass` string): unquoted ones folded to lower
/// case, quoted ones exact. `None`: the server refuses the text.
pub(crate) fn split_identifiers(text: &str, separator: char) -> Option<Vec<String>> {
    let mut names = Vec::new();
    let mut chars = text.chars().peekable();
    let skip_space = |chars: &mut std::iter::Peekable<std::str::Chars<'_>>| {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
    };
    skip_space(&mut chars);
    if chars.peek().is_none() {
        return Some(names);
    }
    loop {
        skip_space(&mut chars);
        let mut name = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            loop {
                match chars.next()? {
                    '"' if chars.peek() == Some(&'"') => {
                        chars.next();
                        name.push('"');
                    }
                    '"' => break,
                    c => name.push(c),
                }
            }
            if name.is_empty() {
                return None;
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c == separator || c.is_whitespace() {
                    break;
                }
                name.push(c.to_ascii_lowercase());
                chars.next();
            }
            if name.is_empty() {
                return None;
            }
        }
        names.push(name);
        skip_space(&mut chars);
        match chars.next() {
            None => return Some(names),
            Some(c) if c == separator => {}
            Some(_) => return None,
        }
    }
}
