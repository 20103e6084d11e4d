//! Keeps the workspace's conventions (STYLE.md, "Ten habits" 8 and 10): every
//! Rust file opens with a module doc, no stub macro is left in non-test code,
//! no test is ignored without a reason, and no file grows past the size where
//! one concept per file stops being believable.

use std::path::{Path, PathBuf};

const MAX_LINES: usize = 600;
/// The most lines a function in crates/ may span, from `fn` to its closing
/// brace: past it, a reader no longer follows one thing (issue 51).
const MAX_FN_LINES: usize = 120;
/// Files allowed past MAX_LINES, each with its reason.
const LONG_FILES: &[(&str, &str)] = &[];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

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
