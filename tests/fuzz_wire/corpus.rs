//! The seed corpus (byte streams captured from real psycopg, node-postgres
//! and LangGraph sessions by integration/capture.py, in fuzz/corpus/) and
//! the mutations the harness applies to it: bit flips, byte stores,
//! truncations, splices from another stream, length-field edits, and
//! dropped, duplicated or swapped messages.

use std::path::PathBuf;
use std::sync::OnceLock;

use proptest::prelude::*;

/// One captured connection: what the client sent and what the server
/// answered.
pub struct Captured {
    pub name: String,
    pub client: Vec<u8>,
    pub server: Vec<u8>,
}

/// Every captured connection in fuzz/corpus/ (loaded once).
pub fn corpus() -> &'static [Captured] {
    static CORPUS: OnceLock<Vec<Captured>> = OnceLock::new();
    CORPUS.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                name.strip_suffix(".client").map(str::to_owned)
            })
            .collect();
        names.sort();
        let read =
            |file: String| std::fs::read(dir.join(&file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        let all: Vec<Captured> = names
            .into_iter()
            .map(|name| Captured {
                client: read(format!("{name}.client")),
                server: read(format!("{name}.server")),
                name,
            })
            .collect();
        assert!(!all.is_empty(), "no captured sessions in {}", dir.display());
        all
    })
}

/// Bytes of the untyped first packets (SSLRequest / GSSENCRequest, then
/// the StartupMessage) at the front of a captured client stream.
pub fn first_packets_len(stream: &[u8]) -> usize {
    let mut at = 0;
    while let Some(head) = stream.get(at..at + 8) {
        let len = i32::from_be_bytes([head[0], head[1], head[2], head[3]]);
        let code = u32::from_be_bytes([head[4], head[5], head[6], head[7]]);
        at += usize::try_from(len).unwrap_or(stream.len());
        if code != 80_877_103 && code != 80_877_104 {
            break;
        }
    }
    at.min(stream.len())
}

/// The 'N' answers to SSL/GSSENC requests in front of a server stream.
pub fn server_typed_start(stream: &[u8]) -> usize {
    stream.iter().take_while(|b| **b == b'N').count()
}

/// Splits typed messages off a stream as long as their headers hold;
/// whatever is left (a cut message, a broken header) is the last piece.
pub fn split_frames(stream: &[u8]) -> Vec<Vec<u8>> {
    let mut frames = Vec::new();
    let mut rest = stream;
    while rest.len() >= 5 {
        let len = i32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]);
        let Some(total) = usize::try_from(len).ok().filter(|l| *l >= 4).map(|l| l + 1) else {
            break;
        };
        if total > rest.len() {
            break;
        }
        frames.push(rest[..total].to_vec());
        rest = &rest[total..];
    }
    if !rest.is_empty() {
        frames.push(rest.to_vec());
    }
    frames
}

/// One edit of a message stream. Positions are taken modulo the stream
/// (or message count) when applied.
#[derive(Debug, Clone)]
pub enum Mutation {
    FlipBit {
        at: usize,
        bit: u8,
    },
    SetByte {
        at: usize,
        value: u8,
    },
    Truncate {
        at: usize,
    },
    /// Inserts `len` bytes of another captured stream at `at`.
    Splice {
        from: usize,
        start: usize,
        len: usize,
        at: usize,
    },
    /// Overwrites a message's length field.
    SetLength {
        frame: usize,
        len: i32,
    },
    DropFrame {
        frame: usize,
    },
    DuplicateFrame {
        frame: usize,
    },
    SwapFrames {
        a: usize,
        b: usize,
    },
}

fn interesting_length() -> impl Strategy<Value = i32> {
    prop_oneof![
        Just(0),
        Just(3),
        Just(4),
        Just(5),
        Just(-1),
        Just(i32::MAX),
        Just(i32::MIN),
        Just(0x4000_0000),
        0i32..300,
    ]
}

pub fn mutation() -> impl Strategy<Value = Mutation> {
    let n = any::<usize>();
    prop_oneof![
        3 => (n, 0u8..8).prop_map(|(at, bit)| Mutation::FlipBit { at, bit }),
        2 => (n, any::<u8>()).prop_map(|(at, value)| Mutation::SetByte { at, value }),
        1 => n.prop_map(|at| Mutation::Truncate { at }),
        1 => (n, n, 1usize..200, n)
            .prop_map(|(from, start, len, at)| Mutation::Splice { from, start, len, at }),
        2 => (n, interesting_length()).prop_map(|(frame, len)| Mutation::SetLength { frame, len }),
        1 => n.prop_map(|frame| Mutation::DropFrame { frame }),
        1 => n.prop_map(|frame| Mutation::DuplicateFrame { frame }),
        1 => (n, n).prop_map(|(a, b)| Mutation::SwapFrames { a, b }),
    ]
}

/// A captured session and the edits to make to one of its streams.
pub fn mutated_session() -> impl Strategy<Value = (usize, Vec<Mutation>)> {
    (any::<usize>(), proptest::collection::vec(mutation(), 0..6))
}

/// Applies `edits` to the typed part of `stream`.
pub fn apply(stream: &[u8], edits: &[Mutation]) -> Vec<u8> {
    let mut bytes = stream.to_vec();
    for edit in edits {
        bytes = apply_one(bytes, edit);
    }
    bytes
}

fn apply_one(mut bytes: Vec<u8>, edit: &Mutation) -> Vec<u8> {
    let len = bytes.len();
    match *edit {
        Mutation::FlipBit { at, bit } if len > 0 => bytes[at % len] ^= 1 << bit,
        Mutation::SetByte { at, value } if len > 0 => bytes[at % len] = value,
        Mutation::Truncate { at } => bytes.truncate(at % (len + 1)),
        Mutation::Splice {
            from,
            start,
            len: n,
            at,
        } => {
            let all = corpus();
            let source = &all[from % all.len()];
            let source = if start % 2 == 0 {
                &source.client
            } else {
                &source.server
            };
            if !source.is_empty() {
                let s = start % source.len();
                let piece = &source[s..(s + n).min(source.len())];
                let at = at % (len + 1);
                bytes.splice(at..at, piece.iter().copied());
            }
        }
        Mutation::SetLength { frame, len: new } => {
            let mut frames = split_frames(&bytes);
            if !frames.is_empty() {
                let i = frame % frames.len();
                if frames[i].len() >= 5 {
                    frames[i][1..5].copy_from_slice(&new.to_be_bytes());
                }
            }
            bytes = frames.concat();
        }
        Mutation::DropFrame { frame } => {
            let mut frames = split_frames(&bytes);
            if !frames.is_empty() {
                let i = frame % frames.len();
                frames.remove(i);
            }
            bytes = frames.concat();
        }
        Mutation::DuplicateFrame { frame } => {
            let mut frames = split_frames(&bytes);
            if !frames.is_empty() {
                let i = frame % frames.len();
                let copy = frames[i].clone();
                frames.insert(i, copy);
            }
            bytes = frames.concat();
        }
        Mutation::SwapFrames { a, b } => {
            let mut frames = split_frames(&bytes);
            if !frames.is_empty() {
                let n = frames.len();
                frames.swap(a % n, b % n);
            }
            bytes = frames.concat();
        }
        _ => {}
    }
    bytes
}
