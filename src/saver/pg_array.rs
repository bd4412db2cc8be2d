//! Array values: `bytea[]`, the shape the checkpoint SELECT returns its
//! blobs in, and `text[]`, the thread ids a housekeeping delete names.
//!
//! `channel_values` and `pending_writes` are `array_agg(array[...])` over
//! bytea, i.e. 2-D arrays whose rows are one blob or one write; prune's
//! `thread_id = ANY($1)` binds a 1-D `text[]`. Both the binary and the
//! text form are decoded here.
//! The input comes from the network, so every length and dimension is checked
//! against the bytes actually present before anything is allocated.

use bytes::Bytes;

use super::bytea::decode_bytea_text;
use super::decode_error::{utf8, DecodeError};
use crate::wire::messages::read::{read_i32, read_nullable, ReadError};

/// PostgreSQL's limit on array dimensions (`MAXDIM`).
const MAX_DIMS: usize = 6;
/// Type OID of `bytea`.
const BYTEA_OID: u32 = 17;
/// Type OIDs a binary text array's elements may carry: `text`, `varchar`,
/// `name`, `bpchar` (all sent as their UTF-8 bytes).
const TEXT_OIDS: [u32; 4] = [25, 1043, 19, 1042];

/// What an array's elements are, which says how each one decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Element {
    /// `bytea`: hex or escape format in text, raw bytes in binary.
    Bytea,
    /// A string type: the element's UTF-8 bytes in both formats.
    Text,
}

impl Element {
    fn accepts_oid(self, oid: u32) -> bool {
        match self {
            Element::Bytea => oid == BYTEA_OID,
            Element::Text => TEXT_OIDS.contains(&oid),
        }
    }
}

/// Decodes a `text[]` (any dimensions, flattened in row-major order) from
/// its wire format; `None` elements are SQL NULLs.
pub fn decode_text_array(raw: &[u8], binary: bool) -> Result<Vec<Option<String>>, DecodeError> {
    let array = if binary {
        decode_binary_of(raw, Element::Text)?
    } else {
        let text = std::str::from_utf8(raw).map_err(|_| DecodeError::Utf8 { what: "text[]" })?;
        decode_text_of(text, Element::Text)?
    };
    array
        .elements
        .into_iter()
        .map(|e| e.map(|b| utf8(&b, "text[] element")).transpose())
        .collect()
}

/// A decoded `bytea[]`: dimension sizes and the elements in row-major order.
/// An empty array has no dimensions and no elements.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ByteaArray {
    pub dims: Vec<usize>,
    pub elements: Vec<Option<Bytes>>,
}

impl ByteaArray {
    /// The rows of the innermost dimension: for the 2-D arrays the checkpoint
    /// SELECT returns, one slice of `dims[1]` elements per row. An empty
    /// array has no rows; a 1-D array is a single row.
    pub fn rows(&self) -> impl Iterator<Item = &[Option<Bytes>]> {
        // `max(1)` keeps `chunks` from panicking on a hand-built value; a
        // zero-width array has no elements, so it yields nothing either way.
        let width = self.dims.last().copied().unwrap_or(0).max(1);
        self.elements.chunks(width)
    }

    /// Decodes the binary array format with element OID 17 (bytea).
    pub fn decode_binary(raw: &[u8]) -> Result<ByteaArray, DecodeError> {
        decode_binary_of(raw, Element::Bytea)
    }

    /// Decodes the text array form, e.g.
    /// `{{"\\x6974656d73","\\x6d73677061636b",NULL},{...}}`: elements quoted
    /// or not, backslash escapes, unquoted `NULL`, each element a bytea in
    /// text form (hex `\x..` or escape format). 1-D arrays are accepted too.
    /// A leading dimension decoration (`[0:1][1:3]=`) is skipped.
    pub fn decode_text(text: &str) -> Result<ByteaArray, DecodeError> {
        decode_text_of(text, Element::Bytea)
    }

    /// Encodes in the binary array format `decode_binary` reads.
    pub fn encode_binary(&self) -> Vec<u8> {
        let payload: usize = self.elements.iter().flatten().map(|e| e.len()).sum();
        let mut out =
            Vec::with_capacity(12 + 8 * self.dims.len() + 4 * self.elements.len() + payload);
        out.extend_from_slice(&(self.dims.len() as i32).to_be_bytes());
        let has_null = self.elements.iter().any(Option::is_none);
        out.extend_from_slice(&i32::from(has_null).to_be_bytes());
        out.extend_from_slice(&BYTEA_OID.to_be_bytes());
        for d in &self.dims {
            out.extend_from_slice(&(*d as i32).to_be_bytes());
            out.extend_from_slice(&1i32.to_be_bytes());
        }
        for e in &self.elements {
            match e {
                Some(b) => {
                    out.extend_from_slice(&(b.len() as i32).to_be_bytes());
                    out.extend_from_slice(b);
                }
                None => out.extend_from_slice(&(-1i32).to_be_bytes()),
            }
        }
        out
    }

    /// Encodes in PostgreSQL's text array format with hex bytea elements.
    pub fn encode_text(&self) -> String {
        fn level(
            out: &mut String,
            dims: &[usize],
            elems: &mut std::slice::Iter<'_, Option<Bytes>>,
        ) {
            out.push('{');
            for i in 0..dims[0] {
                if i > 0 {
                    out.push(',');
                }
                if dims.len() > 1 {
                    level(out, &dims[1..], elems);
                } else {
                    match elems.next() {
                        Some(Some(b)) => {
                            out.push_str("\"\\\\x");
                            out.push_str(&hex::encode(b));
                            out.push('"');
                        }
                        _ => out.push_str("NULL"),
                    }
                }
            }
            out.push('}');
        }
        let mut out = String::new();
        if self.dims.is_empty() {
            return "{}".into();
        }
        level(&mut out, &self.dims, &mut self.elements.iter());
        out
    }
}

/// The binary array format: int32 ndim, int32 has-null flag, uint32
/// element OID (one `element` accepts), per dimension int32 size and int32
/// lower bound, then each element as int32 length (-1 = NULL) + bytes.
/// Not postgres-protocol's `array_from_sql`, which takes any negative
/// length as NULL and reserves the declared element count up front.
fn decode_binary_of(raw: &[u8], element: Element) -> Result<ByteaArray, DecodeError> {
    let mut buf = raw;
    let ndim = read_i32(&mut buf, "array ndim")?;
    let ndim = usize::try_from(ndim)
        .ok()
        .filter(|n| *n <= MAX_DIMS)
        .ok_or_else(|| {
            DecodeError::ArrayHeader(format!("{ndim} dimensions (expected 0..={MAX_DIMS})"))
        })?;
    let flags = read_i32(&mut buf, "array flags")?;
    if flags != 0 && flags != 1 {
        return Err(DecodeError::ArrayHeader(format!(
            "has-null flag {flags} (expected 0 or 1)"
        )));
    }
    let oid = read_i32(&mut buf, "array element oid")? as u32;
    if !element.accepts_oid(oid) {
        return Err(DecodeError::ElementOid(oid));
    }

    let mut dims = Vec::with_capacity(ndim);
    let mut total: u64 = if ndim == 0 { 0 } else { 1 };
    for _ in 0..ndim {
        let size = read_i32(&mut buf, "array dimension size")?;
        let _lower_bound = read_i32(&mut buf, "array lower bound")?;
        let size = usize::try_from(size)
            .map_err(|_| DecodeError::ArrayHeader(format!("negative dimension size {size}")))?;
        total = total.checked_mul(size as u64).ok_or_else(|| {
            DecodeError::ArrayHeader("dimension sizes overflow the element count".into())
        })?;
        dims.push(size);
    }
    if total == 0 {
        // PostgreSQL turns any zero-sized dimension into the empty array.
        dims.clear();
    }
    // Each element needs at least its 4-byte length.
    if total > (buf.len() / 4) as u64 {
        return Err(DecodeError::ArrayCount {
            declared: total,
            remaining: buf.len(),
        });
    }
    // Bounded by the check above, so this fits in usize.
    let mut elements = Vec::with_capacity(total as usize);
    for _ in 0..total {
        let element = read_nullable(&mut buf, "array element")?;
        elements.push(element.map(Bytes::copy_from_slice));
    }
    if !buf.is_empty() {
        return Err(DecodeError::Read(ReadError::TrailingBytes {
            what: "array (more bytes than the dimensions declare)",
            extra: buf.len(),
        }));
    }
    Ok(ByteaArray { dims, elements })
}

/// The text array form, each element decoded as `element` says.
fn decode_text_of(text: &str, element: Element) -> Result<ByteaArray, DecodeError> {
    let mut p = TextParser {
        s: text.as_bytes(),
        pos: 0,
        dims: [None; MAX_DIMS],
        leaf_depth: None,
        elements: Vec::new(),
        element,
    };
    p.skip_ws();
    if p.peek() == Some(b'[') {
        while p.bump() != Some(b'=') {
            if p.peek().is_none() {
                return Err(p.err("unterminated dimension decoration"));
            }
        }
        p.skip_ws();
    }
    p.array(0)?;
    p.skip_ws();
    if p.peek().is_some() {
        return Err(p.err("unexpected characters after the array"));
    }
    let TextParser { dims, elements, .. } = p;
    let dims: Vec<usize> = dims.iter().map_while(|d| *d).collect();
    if elements.is_empty() {
        return Ok(ByteaArray::default());
    }
    let product = dims.iter().try_fold(1usize, |acc, d| acc.checked_mul(*d));
    if product != Some(elements.len()) {
        return Err(DecodeError::ArrayHeader(format!(
            "dimensions {dims:?} disagree with {} elements",
            elements.len()
        )));
    }
    Ok(ByteaArray { dims, elements })
}

/// Recursive-descent parser state for the text array form.
struct TextParser<'a> {
    s: &'a [u8],
    pos: usize,
    /// Size of each nesting level, fixed by the first (sub-)array closed there.
    dims: [Option<usize>; MAX_DIMS],
    /// Depth at which elements sit; all must sit at the same one.
    leaf_depth: Option<usize>,
    /// How each element decodes.
    element: Element,
    elements: Vec<Option<Bytes>>,
}

impl TextParser<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.pos).copied()
    }

    fn bump(&mut self) -> Option<u8> {
        let c = self.peek()?;
        self.pos += 1;
        Some(c)
    }

    fn skip_ws(&mut self) {
        while self.peek().is_some_and(|c| c.is_ascii_whitespace()) {
            self.pos += 1;
        }
    }

    fn err(&self, reason: &'static str) -> DecodeError {
        DecodeError::ArraySyntax {
            pos: self.pos,
            reason,
        }
    }

    /// Parses `{ item, ... }` at nesting `depth`.
    fn array(&mut self, depth: usize) -> Result<(), DecodeError> {
        if depth >= MAX_DIMS {
            return Err(self.err("more than 6 dimensions"));
        }
        if self.bump() != Some(b'{') {
            return Err(self.err("expected '{'"));
        }
        self.skip_ws();
        let mut count = 0;
        if self.peek() == Some(b'}') {
            self.pos += 1;
            if depth > 0 {
                return Err(self.err("empty sub-array"));
            }
        } else {
            loop {
                self.skip_ws();
                if self.peek() == Some(b'{') {
                    self.array(depth + 1)?;
                } else {
                    if *self.leaf_depth.get_or_insert(depth) != depth {
                        return Err(self.err("elements at different nesting depths"));
                    }
                    let element = self.element()?;
                    self.elements.push(element);
                }
                count += 1;
                self.skip_ws();
                match self.bump() {
                    Some(b',') => continue,
                    Some(b'}') => break,
                    _ => return Err(self.err("expected ',' or '}'")),
                }
            }
        }
        // `depth < MAX_DIMS` was checked on entry.
        match self.dims.get_mut(depth) {
            Some(slot @ None) => *slot = Some(count),
            Some(Some(d)) if *d == count => {}
            _ => return Err(self.err("sub-arrays have different lengths")),
        }
        Ok(())
    }

    /// Parses one element, quoted or not, and decodes it as its type's text.
    fn element(&mut self) -> Result<Option<Bytes>, DecodeError> {
        let mut raw = Vec::new();
        if self.peek() == Some(b'"') {
            self.pos += 1;
            loop {
                match self.bump() {
                    None => return Err(self.err("unterminated quoted element")),
                    Some(b'"') => break,
                    Some(b'\\') => match self.bump() {
                        Some(c) => raw.push(c),
                        None => return Err(self.err("backslash at end of input")),
                    },
                    Some(c) => raw.push(c),
                }
            }
        } else {
            let mut escaped = false;
            // Length of `raw` up to its last escaped or non-space byte:
            // PostgreSQL trims trailing unescaped whitespace.
            let mut keep = 0;
            loop {
                match self.peek() {
                    None => return Err(self.err("unterminated array")),
                    Some(b',' | b'}') => break,
                    Some(b'{' | b'"') => return Err(self.err("unexpected character in element")),
                    Some(b'\\') => {
                        self.pos += 1;
                        match self.bump() {
                            Some(c) => raw.push(c),
                            None => return Err(self.err("backslash at end of input")),
                        }
                        escaped = true;
                        keep = raw.len();
                    }
                    Some(c) => {
                        self.pos += 1;
                        raw.push(c);
                        if !c.is_ascii_whitespace() {
                            keep = raw.len();
                        }
                    }
                }
            }
            raw.truncate(keep);
            if raw.is_empty() {
                return Err(self.err("empty unquoted element"));
            }
            if !escaped && raw.eq_ignore_ascii_case(b"NULL") {
                return Ok(None);
            }
        }
        match self.element {
            Element::Bytea => decode_bytea_text(&raw).map(Some),
            Element::Text => Ok(Some(Bytes::from(raw))),
        }
    }
}

#[cfg(test)]
mod tests;
