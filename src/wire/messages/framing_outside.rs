//! Every message the proxy writes is written by this codec: no file of
//! `src/` outside it computes a length word by hand. Test code (a file's
//! part after its first `#[cfg(test)]`, `tests.rs` files and `tests/`
//! folders) builds its frames as it likes.

use std::path::{Path, PathBuf};

/// What writing a big-endian length or header word looks like.
const FRAMING: [&str; 6] = [
    "put_i32(",
    "put_u32(",
    "put_i16(",
    "put_u16(",
    ".to_be_bytes()",
    "as i32)",
];

/// Files that write big-endian words that are not message framing, and
/// why.
const ALLOWED: [(&str, &str); 1] = [(
    "src/saver/pg_array.rs",
    "the binary bytea[] value encoding: an array header and element lengths \
     inside one parameter or field value",
)];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src/ is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            if !path.ends_with("tests") {
                rust_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") && !path.ends_with("tests.rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_message_is_framed_outside_the_codec() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let codec = root.join("src/wire/messages");
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    let mut found = Vec::new();
    for path in files.iter().filter(|p| !p.starts_with(&codec)) {
        let relative = path.strip_prefix(root).expect("under the root");
        if ALLOWED
            .iter()
            .any(|(allowed, _)| relative == Path::new(allowed))
        {
            continue;
        }
        let text = std::fs::read_to_string(path).expect("a source file");
        let production = text.split("#[cfg(test)]").next().unwrap_or_default();
        for (n, line) in production.lines().enumerate() {
            if FRAMING.iter().any(|p| line.contains(p)) {
                found.push(format!("{}:{}: {}", relative.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "messages framed outside wire::messages:\n{}",
        found.join("\n")
    );
    assert!(files.iter().any(|p| p.ends_with("saver/pg_array.rs")));
}
