//! Holds `src/` to its layer picture: a module may use only the modules in
//! the layers below its own, never one above and never a sibling of its
//! own layer. Test code (`tests.rs`, `tests/` folders, `#[cfg(test)]`
//! items) is exempt, and so is the binary's own code, the top layer, whose
//! `crate::` is the binary. The picture is the README's Architecture
//! section.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// The layers, top first. Modules of one layer do not use each other.
const LAYERS: &[&[&str]] = &[
    &["config"],
    &["admin"],
    &["enforce"],
    &["policy"],
    &["claims", "audit"],
    &["audit_event"],
    &["managed_pg", "pg"],
    &["saver"],
    &["wire"],
    &["metrics", "timestamp", "error_chain", "log_text", "fd_limit"],
];

/// The library's test-only modules (`#[cfg(test)] mod x;` in `lib.rs`).
fn test_modules(src: &Path) -> BTreeSet<String> {
    let lib = fs::read_to_string(src.join("lib.rs")).expect("src/lib.rs");
    let mut names = BTreeSet::new();
    let mut after_cfg_test = false;
    for line in lib.lines().map(str::trim) {
        if after_cfg_test {
            if let Some(name) = line.strip_prefix("mod ").and_then(|r| r.strip_suffix(';')) {
                names.insert(name.to_string());
            }
        }
        after_cfg_test = line == "#[cfg(test)]";
    }
    names
}

/// The binary's own modules (declared in `main.rs`).
fn binary_modules(src: &Path) -> BTreeSet<String> {
    let main = fs::read_to_string(src.join("main.rs")).expect("src/main.rs");
    let mut names: BTreeSet<String> = main
        .lines()
        .filter_map(|l| l.trim().strip_prefix("mod "))
        .filter_map(|rest| rest.strip_suffix(';'))
        .map(str::to_string)
        .collect();
    names.insert("main".to_string());
    names
}

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

/// Every `.rs` file under `dir` that is not test code.
fn product_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .expect("readable src folder")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            if name != "tests" {
                product_files(&path, out);
            }
        } else if name.ends_with(".rs") && name != "tests.rs" {
            out.push(path);
        }
    }
}

/// The file's code with comments and `#[cfg(test)]` items removed.
fn product_code(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("//") {
            continue;
        }
        if trimmed.starts_with("#[cfg(test)]") {
            skip_item(&mut lines);
            continue;
        }
        let code = match line.find("//") {
            Some(i) if !line[..i].contains('"') => &line[..i],
            _ => line,
        };
        out.push_str(code);
        out.push('\n');
    }
    out
}

/// Skips the item that follows an attribute: a one-line item, or one whose
/// braces close on a later line.
fn skip_item<'a>(lines: &mut impl Iterator<Item = &'a str>) {
    let mut depth = 0i64;
    let mut opened = false;
    for line in lines.by_ref() {
        let trimmed = line.trim_start();
        if !opened && (trimmed.starts_with("#[") || trimmed.starts_with("//")) {
            continue;
        }
        for c in line.chars() {
            match c {
                '{' => {
                    depth += 1;
                    opened = true;
                }
                '}' => depth -= 1,
                _ => {}
            }
        }
        if (opened && depth <= 0) || (!opened && trimmed.ends_with(';')) {
            return;
        }
    }
}

/// The top-level modules a piece of code names through `crate::`.
fn used_modules(code: &str) -> BTreeSet<String> {
    let mut used = BTreeSet::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().next_back();
        rest = &rest[i + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for part in group[..end].split(',') {
                used.insert(leading_ident(part.trim()));
            }
        } else {
            used.insert(leading_ident(rest));
        }
    }
    used.remove("");
    used
}

fn leading_ident(s: &str) -> String {
    s.chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

#[test]
fn no_module_uses_one_above_it_or_beside_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let binary = binary_modules(&src);
    let test_only = test_modules(&src);
    let mut files = Vec::new();
    product_files(&src, &mut files);

    let mut breaches = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(&src).expect("under src");
        let first = rel
            .components()
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .map(|s| s.trim_end_matches(".rs").to_string())
            .expect("a file name");
        if first == "lib" || binary.contains(&first) || test_only.contains(&first) {
            continue;
        }
        let module = first;
        let Some(own) = layer_of(&module) else {
            breaches.push(format!(
                "{}: module `{module}` is in no layer",
                rel.display()
            ));
            continue;
        };
        let text = fs::read_to_string(file).expect("readable source");
        for used_module in used_modules(&product_code(&text)) {
            if used_module == module {
                continue;
            }
            match layer_of(&used_module) {
                Some(layer) if layer > own => {}
                Some(_) => breaches.push(format!(
                    "{}: `{module}` uses `{used_module}`, which is not below it",
                    rel.display()
                )),
                None => breaches.push(format!(
                    "{}: uses `{used_module}`, which is in no layer",
                    rel.display()
                )),
            }
        }
    }
    assert!(
        breaches.is_empty(),
        "imports against the layer picture:\n{}",
        breaches.join("\n")
    );
}

#[test]
fn the_scan_sees_grouped_uses_and_skips_test_items() {
    let code = product_code(
        "use crate::{wire::frame, saver::bind};\n\
         // use crate::admin::x;\n\
         #[cfg(test)]\n\
         mod tests {\n    use crate::enforce::y;\n}\n\
         fn f() { crate::claims::g(); }\n",
    );
    let used: Vec<String> = used_modules(&code).into_iter().collect();
    assert_eq!(used, ["claims", "saver", "wire"]);
}
