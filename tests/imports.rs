//! Holds the imports of `src/` to the shape the README's Architecture
//! section draws: a module uses only the layers below its own, never one
//! above or beside it; and no two files of one folder import each other,
//! directly or around a cycle, so each file of a folder sits above or below
//! its siblings and can be read, and changed, knowing only those below it.
//! A file counts with everything under it (`a.rs` with `a/`); test code
//! (`tests.rs`, `tests/` folders, `#[cfg(test)]` items) is left out, and so
//! is the binary's own code (the top layer, whose `crate::` is the binary).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::{self, Visit};
use syn::{Attribute, ImplItemFn, Item, ItemMod, Macro, UseTree};

/// A module's path from the crate root: `src/admin/auth.rs` is
/// `["admin", "auth"]`.
type ModPath = Vec<String>;

/// The layers of the library, top first; the modules of one layer do not
/// use each other.
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
    &[
        "metrics",
        "timestamp",
        "error_chain",
        "log_text",
        "log_scope",
        "fd_limit",
        "sql_tokens",
    ],
];

/// One source file of `src/`, parsed.
struct Source {
    path: PathBuf,
    module: ModPath,
    syntax: syn::File,
}

/// Every `.rs` file under `dir` but `tests.rs` files and `tests/` folders.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            if name != "tests" {
                rust_files(&path, out);
            }
        } else if name.ends_with(".rs") && name != "tests.rs" {
            out.push(path);
        }
    }
}

/// The module a file holds; the crate roots (`lib.rs`, `main.rs`) hold the
/// empty path.
fn module_of(src: &Path, file: &Path) -> Option<ModPath> {
    let rel = file.strip_prefix(src).ok()?.with_extension("");
    let mut module: ModPath = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if module.last().map(String::as_str) == Some("mod") {
        module.pop();
    }
    match module.as_slice() {
        [root] if root == "lib" || root == "main" => Some(Vec::new()),
        _ => Some(module),
    }
}

fn is_cfg_test(attrs: &[Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.meta
                .require_list()
                .is_ok_and(|l| l.tokens.to_string() == "test")
    })
}

fn item_attrs(item: &Item) -> &[Attribute] {
    match item {
        Item::Const(i) => &i.attrs,
        Item::Enum(i) => &i.attrs,
        Item::ExternCrate(i) => &i.attrs,
        Item::Fn(i) => &i.attrs,
        Item::ForeignMod(i) => &i.attrs,
        Item::Impl(i) => &i.attrs,
        Item::Macro(i) => &i.attrs,
        Item::Mod(i) => &i.attrs,
        Item::Static(i) => &i.attrs,
        Item::Struct(i) => &i.attrs,
        Item::Trait(i) => &i.attrs,
        Item::TraitAlias(i) => &i.attrs,
        Item::Type(i) => &i.attrs,
        Item::Union(i) => &i.attrs,
        Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

/// The `crate::`, `super::` and `self::` paths of one file outside its
/// test code, each resolved against the module it is written in; and the
/// files declared as test modules (`#[cfg(test)] mod name;`).
struct Paths {
    /// The module being read: the file's, then any inline module in it.
    module: ModPath,
    found: Vec<ModPath>,
    test_modules: Vec<ModPath>,
}

impl Paths {
    /// Keeps `segments`, when they start with `crate`, `super` or `self`,
    /// as a path from the crate root.
    fn record(&mut self, segments: &[String]) {
        let mut base = match segments.first().map(String::as_str) {
            Some("crate") => Vec::new(),
            Some("super" | "self") => self.module.clone(),
            _ => return,
        };
        let mut rest = match segments.first().map(String::as_str) {
            Some("crate" | "self") => &segments[1..],
            _ => segments,
        };
        while let Some((first, tail)) = rest.split_first() {
            if first != "super" {
                break;
            }
            base.pop();
            rest = tail;
        }
        base.extend(rest.iter().cloned());
        self.found.push(base);
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &UseTree) {
        match tree {
            UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            UseTree::Name(n) if n.ident == "self" => self.record(prefix),
            UseTree::Name(n) => {
                prefix.push(n.ident.to_string());
                self.record(prefix);
                prefix.pop();
            }
            UseTree::Rename(r) => {
                prefix.push(r.ident.to_string());
                self.record(prefix);
                prefix.pop();
            }
            UseTree::Glob(_) => self.record(prefix),
            UseTree::Group(g) => {
                for tree in &g.items {
                    self.use_tree(prefix, tree);
                }
            }
        }
    }

    /// Paths written inside a macro's arguments, which are tokens to syn:
    /// `crate`/`super`/`self` followed by `::name` pairs.
    fn tokens(&mut self, tokens: TokenStream) {
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < trees.len() {
            match &trees[i] {
                TokenTree::Group(g) => self.tokens(g.stream()),
                TokenTree::Ident(id) if ["crate", "super", "self"].contains(&&*id.to_string()) => {
                    let mut segments = vec![id.to_string()];
                    while let [TokenTree::Punct(a), TokenTree::Punct(b), TokenTree::Ident(next), ..] =
                        &trees[i + 1..]
                    {
                        if a.as_char() != ':' || b.as_char() != ':' {
                            break;
                        }
                        segments.push(next.to_string());
                        i += 3;
                    }
                    if segments.len() > 1 {
                        self.record(&segments);
                    }
                }
                _ => {}
            }
            i += 1;
        }
    }
}

impl<'ast> Visit<'ast> for Paths {
    fn visit_item(&mut self, item: &'ast Item) {
        if !is_cfg_test(item_attrs(item)) {
            visit::visit_item(self, item);
        } else if let Item::Mod(m) = item {
            let mut module = self.module.clone();
            module.push(m.ident.to_string());
            self.test_modules.push(module);
        }
    }

    fn visit_impl_item_fn(&mut self, f: &'ast ImplItemFn) {
        if !is_cfg_test(&f.attrs) {
            visit::visit_impl_item_fn(self, f);
        }
    }

    fn visit_item_mod(&mut self, m: &'ast ItemMod) {
        if m.content.is_some() {
            self.module.push(m.ident.to_string());
            visit::visit_item_mod(self, m);
            self.module.pop();
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        if u.leading_colon.is_none() {
            self.use_tree(&mut Vec::new(), &u.tree);
        }
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        if p.leading_colon.is_none() {
            let segments: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
            self.record(&segments);
        }
        visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast Macro) {
        self.tokens(m.tokens.clone());
        visit::visit_macro(self, m);
    }
}

/// The sibling files of one folder that import each other around a
/// cycle, each as `folder/file`, with the imports that close it.
#[derive(Debug)]
struct Cycle {
    files: BTreeSet<String>,
    imports: Vec<String>,
}

/// One import outside test code: the module that makes it, the file it is
/// written in, and the module (a file's) it reaches.
struct Import {
    from: ModPath,
    file: PathBuf,
    target: ModPath,
}

/// Every import of the files under `src` outside their test code.
fn imports(src: &Path) -> Vec<Import> {
    let mut paths = Vec::new();
    rust_files(src, &mut paths);
    let mut sources = Vec::new();
    for path in paths {
        let Some(module) = module_of(src, &path) else {
            continue;
        };
        let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let syntax = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        sources.push(Source {
            path,
            module,
            syntax,
        });
    }
    let modules: BTreeSet<ModPath> = sources.iter().map(|s| s.module.clone()).collect();

    let mut test_modules = Vec::new();
    let mut found = Vec::new();
    for source in &sources {
        let mut paths = Paths {
            module: source.module.clone(),
            found: Vec::new(),
            test_modules: Vec::new(),
        };
        paths.visit_file(&source.syntax);
        test_modules.extend(paths.test_modules);
        for path in paths.found {
            // The longest prefix of the path that is a file's module.
            let target = (0..=path.len())
                .rev()
                .map(|n| &path[..n])
                .find(|p| modules.contains(*p))
                .unwrap_or(&[]);
            let file = source.path.strip_prefix(src).unwrap_or(&source.path);
            found.push(Import {
                from: source.module.clone(),
                file: file.to_path_buf(),
                target: target.to_vec(),
            });
        }
    }
    found.retain(|i| !test_modules.iter().any(|t| i.from.starts_with(t)));
    found
}

/// The modules the binary declares (`mod name;` in `main.rs`).
fn binary_modules(src: &Path) -> BTreeSet<String> {
    let main = src.join("main.rs");
    let text = fs::read_to_string(&main).unwrap_or_else(|e| panic!("{}: {e}", main.display()));
    let syntax = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", main.display()));
    syntax
        .items
        .iter()
        .filter_map(|item| match item {
            Item::Mod(m) if !is_cfg_test(&m.attrs) => Some(m.ident.to_string()),
            _ => None,
        })
        .collect()
}

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

/// The imports of library modules that reach a module not below their
/// own layer, each as a line saying so.
fn layer_breaches(src: &Path) -> Vec<String> {
    let binary = binary_modules(src);
    let mut breaches = BTreeSet::new();
    for import in imports(src) {
        let (Some(from), Some(to)) = (import.from.first(), import.target.first()) else {
            continue;
        };
        if from == to || binary.contains(from) {
            continue;
        }
        let file = import.file.display();
        match (layer_of(from), layer_of(to)) {
            (None, _) => breaches.insert(format!("src/{file}: `{from}` is in no layer")),
            (_, None) => breaches.insert(format!("src/{file}: uses `{to}`, in no layer")),
            (Some(own), Some(used)) if used <= own => breaches.insert(format!(
                "src/{file}: `{from}` uses `{to}`, which is not below it"
            )),
            _ => false,
        };
    }
    breaches.into_iter().collect()
}

/// The cycles between sibling files of every folder under `src`.
fn file_cycles(src: &Path) -> Vec<Cycle> {
    // Per folder: which of its files (with what is under each) import
    // which, and one import that says so.
    type Folder = BTreeMap<String, BTreeMap<String, String>>;
    let mut folders: BTreeMap<ModPath, Folder> = BTreeMap::new();
    for Import { from, file, target } in imports(src) {
        let common = from.iter().zip(&target).take_while(|(a, b)| a == b).count();
        if common >= from.len() || common >= target.len() {
            continue;
        }
        let folder = from[..common].to_vec();
        let name = |m: &[String]| m[..=common].join("/");
        folders
            .entry(folder)
            .or_default()
            .entry(name(&from))
            .or_default()
            .entry(name(&target))
            .or_insert_with(|| format!("src/{} uses {}", file.display(), target.join("::")));
    }

    let mut cycles = Vec::new();
    for graph in folders.values() {
        let reach = |start: &String| {
            let mut seen = BTreeSet::new();
            let mut todo = vec![start.clone()];
            while let Some(file) = todo.pop() {
                for next in graph.get(&file).into_iter().flat_map(BTreeMap::keys) {
                    if seen.insert(next.clone()) {
                        todo.push(next.clone());
                    }
                }
            }
            seen
        };
        let reached: BTreeMap<&String, BTreeSet<String>> =
            graph.keys().map(|f| (f, reach(f))).collect();
        let mut placed = BTreeSet::new();
        for (file, from_file) in &reached {
            if placed.contains(*file) || !from_file.contains(*file) {
                continue;
            }
            let files: BTreeSet<String> = from_file
                .iter()
                .filter(|other| reached.get(other).is_some_and(|r| r.contains(*file)))
                .cloned()
                .collect();
            let imports = files
                .iter()
                .flat_map(|f| graph.get(f).into_iter().flatten())
                .filter(|(to, _)| files.contains(*to))
                .map(|(_, import)| import.clone())
                .collect();
            placed.extend(files.iter().cloned());
            cycles.push(Cycle { files, imports });
        }
    }
    cycles
}

#[test]
fn no_sibling_files_import_each_other_in_a_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let cycles = file_cycles(&src);
    let described: Vec<String> = cycles
        .iter()
        .map(|c| format!("{:?}:\n    {}", c.files, c.imports.join("\n    ")))
        .collect();
    assert!(
        cycles.is_empty(),
        "sibling files importing each other in a cycle:\n{}",
        described.join("\n")
    );
}

#[test]
fn no_module_uses_one_above_it_or_beside_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let breaches = layer_breaches(&src);
    assert!(
        breaches.is_empty(),
        "imports against the layer picture:\n{}",
        breaches.join("\n")
    );
}
