//! Keeps the workspace's conventions (STYLE.md, "Ten habits" 8 and 10): every
//! Rust file opens with a module doc, no stub macro is left in non-test code,
//! no test is ignored without a reason, and no file grows past the size where
//! one concept per file stops being believable.

use std::path::{Path, PathBuf};
use terse_tests::workspace_root;

const MAX_LINES: usize = 600;
/// The most lines a function in crates/ may span, from `fn` to its closing
/// brace: past it, a reader no longer follows one thing (issue 51).
const MAX_FN_LINES: usize = 120;
/// Files allowed past MAX_LINES, each with its reason.
const LONG_FILES: &[(&str, &str)] = &[];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy();
        if path.is_dir() {
            if !matches!(name.as_ref(), "target" | ".git" | "cache" | "results") {
                rust_files(&path, out);
            }
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

fn sources() -> Vec<(String, String)> {
    let root = workspace_root();
    let mut files = Vec::new();
    for dir in ["crates", "models", "xtask", "tests"] {
        rust_files(&root.join(dir), &mut files);
    }
    assert!(
        files.len() > 20,
        "found only {} Rust files under {}",
        files.len(),
        root.display()
    );
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (p.strip_prefix(&root).unwrap().display().to_string(), text)
        })
        .collect()
}

/// The paths of the workspace's Rust files whose path and text `offends`.
fn paths_where(offends: impl Fn(&str, &str) -> bool) -> Vec<String> {
    sources()
        .into_iter()
        .filter(|(path, text)| offends(path, text))
        .map(|(path, _)| path)
        .collect()
}

/// The part of a file before its `#[cfg(test)]` module, if any.
fn non_test_part(text: &str) -> &str {
    text.find("#[cfg(test)]").map_or(text, |i| &text[..i])
}

#[test]
fn every_file_opens_with_a_module_doc() {
    let missing = paths_where(|_, text| !text.trim_start().starts_with("//!"));
    assert!(
        missing.is_empty(),
        "files without a `//!` module doc: {missing:?}"
    );
}

#[test]
fn no_stubs_in_non_test_code() {
    let stub_macros = [concat!("todo", "!("), concat!("unimplemented", "!(")];
    let offenders = paths_where(|path, text| {
        !path.contains("/tests/")
            && !path.starts_with("tests/")
            && stub_macros.iter().any(|m| non_test_part(text).contains(m))
    });
    assert!(
        offenders.is_empty(),
        "stub macros in non-test code: {offenders:?}"
    );
}

#[test]
fn ignored_tests_give_a_reason() {
    let bare = concat!("#[", "ignore]");
    let offenders = paths_where(|_, text| text.contains(bare));
    assert!(
        offenders.is_empty(),
        "ignored tests without `= \"reason\"` in {offenders:?}"
    );
}

#[test]
fn files_stay_small() {
    let long: Vec<String> = sources()
        .into_iter()
        .filter(|(path, text)| {
            text.lines().count() > MAX_LINES && !LONG_FILES.iter().any(|(p, _)| p == path)
        })
        .map(|(path, text)| format!("{path} ({} lines)", text.lines().count()))
        .collect();
    assert!(long.is_empty(), "files over {MAX_LINES} lines: {long:?}");
}

/// Every function body in a parsed file longer than [`MAX_FN_LINES`], as
/// `name (N lines, line L)`.
struct LongFunctions(Vec<String>);

impl LongFunctions {
    fn check(&mut self, name: &syn::Ident, fn_token: &syn::token::Fn, body: &syn::Block) {
        let first = fn_token.span.start().line;
        let last = body.brace_token.span.close().end().line;
        let lines = last + 1 - first;
        if lines > MAX_FN_LINES {
            self.0.push(format!("{name} ({lines} lines, line {first})"));
        }
    }
}

impl<'ast> syn::visit::Visit<'ast> for LongFunctions {
    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        self.check(&f.sig.ident, &f.sig.fn_token, &f.block);
        syn::visit::visit_item_fn(self, f);
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        self.check(&f.sig.ident, &f.sig.fn_token, &f.block);
        syn::visit::visit_impl_item_fn(self, f);
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if let Some(body) = &f.default {
            self.check(&f.sig.ident, &f.sig.fn_token, body);
        }
        syn::visit::visit_trait_item_fn(self, f);
    }
}

#[test]
fn functions_in_crates_stay_short() {
    let mut long = Vec::new();
    for (path, text) in sources() {
        if !path.starts_with("crates/") {
            continue;
        }
        let file = syn::parse_file(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
        let mut found = LongFunctions(Vec::new());
        syn::visit::Visit::visit_file(&mut found, &file);
        long.extend(found.0.into_iter().map(|f| format!("{path}: {f}")));
    }
    assert!(
        long.is_empty(),
        "functions over {MAX_FN_LINES} lines: {long:#?}"
    );
}

/// The modules one file's non-test code names through `crate::` and
/// `super::` paths (in `use` items and in expressions), as module paths
/// from its crate's root; a name that is an item, not a module, is cut
/// back to the module that holds it by the caller.
struct ModuleRefs {
    /// This file's module path (`super::` is resolved against it).
    here: Vec<String>,
    /// Whether this file is a module's own directory file (`mod.rs`,
    /// `lib.rs`, `main.rs`): its `super` is its parent's parent.
    is_dir_module: bool,
    found: Vec<Vec<String>>,
}

impl ModuleRefs {
    fn record(&mut self, segments: Vec<String>) {
        let Some(first) = segments.first() else {
            return;
        };
        let base = match first.as_str() {
            "crate" => Vec::new(),
            "super" => {
                let mut base = self.here.clone();
                if !self.is_dir_module || !base.is_empty() {
                    base.pop();
                }
                base
            }
            _ => return,
        };
        let rest = segments[1..].iter().filter(|s| *s != "super").cloned();
        self.found.push(base.into_iter().chain(rest).collect());
    }

    fn use_tree(&mut self, prefix: Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                let mut next = prefix;
                next.push(p.ident.to_string());
                self.use_tree(next, &p.tree);
            }
            syn::UseTree::Name(n) => {
                let mut path = prefix;
                path.push(n.ident.to_string());
                self.record(path);
            }
            syn::UseTree::Rename(r) => {
                let mut path = prefix;
                path.push(r.ident.to_string());
                self.record(path);
            }
            syn::UseTree::Glob(_) => self.record(prefix),
            syn::UseTree::Group(g) => {
                for tree in &g.items {
                    self.use_tree(prefix.clone(), tree);
                }
            }
        }
    }
}

impl<'ast> syn::visit::Visit<'ast> for ModuleRefs {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        let test_only = m.attrs.iter().any(|a| {
            a.path().is_ident("cfg") && a.meta.to_token_stream().to_string().contains("test")
        });
        if !test_only {
            syn::visit::visit_item_mod(self, m);
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        self.use_tree(Vec::new(), &u.tree);
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        self.record(p.segments.iter().map(|s| s.ident.to_string()).collect());
        syn::visit::visit_path(self, p);
    }
}

use quote::ToTokens;

/// The module graph of the crate whose sources are under `src` (relative
/// paths and texts), and its cycles: each a list of modules that import
/// each other round (a module naming its own descendants is not counted).
fn module_cycles(files: &[(String, String)]) -> Vec<Vec<String>> {
    let module_of = |rel: &str| -> (Vec<String>, bool) {
        let mut parts: Vec<String> = rel
            .trim_end_matches(".rs")
            .split('/')
            .map(String::from)
            .collect();
        let dir_module = matches!(
            parts.last().map(String::as_str),
            Some("mod" | "lib" | "main")
        );
        if dir_module {
            parts.pop();
        }
        (parts, dir_module)
    };
    let modules: Vec<Vec<String>> = files.iter().map(|(rel, _)| module_of(rel).0).collect();
    let mut edges: Vec<Vec<usize>> = vec![Vec::new(); files.len()];
    for (i, (rel, text)) in files.iter().enumerate() {
        let (here, is_dir_module) = module_of(rel);
        let file = syn::parse_file(text).unwrap_or_else(|e| panic!("{rel}: {e}"));
        let mut refs = ModuleRefs {
            here: here.clone(),
            is_dir_module,
            found: Vec::new(),
        };
        syn::visit::Visit::visit_file(&mut refs, &file);
        for path in refs.found {
            // The longest prefix that is a module file.
            let target = (1..=path.len())
                .rev()
                .find_map(|k| modules.iter().position(|m| m[..] == path[..k]));
            if let Some(j) = target {
                // A module's own descendants and ancestors are not
                // imports round: `mod.rs` re-exports its children.
                let (a, b) = (&modules[i], &modules[j]);
                if !a.starts_with(b) && !b.starts_with(a) {
                    edges[i].push(j);
                }
            }
        }
    }
    // Modules that reach each other: a pair on a cycle.
    let reach = |from: usize| -> Vec<bool> {
        let mut seen = vec![false; files.len()];
        let mut stack = vec![from];
        while let Some(v) = stack.pop() {
            for &w in &edges[v] {
                if !seen[w] {
                    seen[w] = true;
                    stack.push(w);
                }
            }
        }
        seen
    };
    let reached: Vec<Vec<bool>> = (0..files.len()).map(reach).collect();
    let mut cycles: Vec<Vec<String>> = Vec::new();
    for (i, from_i) in reached.iter().enumerate() {
        if !from_i[i] {
            continue;
        }
        let mut members: Vec<String> = (0..files.len())
            .filter(|&j| from_i[j] && reached[j][i])
            .map(|j| files[j].0.clone())
            .collect();
        members.sort();
        if !cycles.contains(&members) {
            cycles.push(members);
        }
    }
    cycles
}

#[test]
fn no_import_circles_between_modules() {
    let root = workspace_root();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .unwrap()
        .map(|e| e.unwrap().path().join("src"))
        .collect();
    dirs.extend([root.join("models/src"), root.join("xtask/src")]);
    let mut circles = Vec::new();
    for src in dirs.into_iter().filter(|d| d.is_dir()) {
        let mut paths = Vec::new();
        rust_files(&src, &mut paths);
        let files: Vec<(String, String)> = paths
            .iter()
            .map(|p| {
                let rel = p.strip_prefix(&src).unwrap().display().to_string();
                (rel, std::fs::read_to_string(p).unwrap())
            })
            .collect();
        for cycle in module_cycles(&files) {
            circles.push(format!(
                "{}: {cycle:?}",
                src.strip_prefix(&root).unwrap().display()
            ));
        }
    }
    assert!(
        circles.is_empty(),
        "modules that import each other round: {circles:#?}"
    );
}
