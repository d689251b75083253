//! The shape of the workspace's sources: no file under `crates/*/src` is over 700 lines, and
//! within each crate no two top-level modules import each other (a circle means the two are one
//! concern split in the wrong place, or share something that belongs in a third module).
//!
//! Imports are read from the source text: `use crate::a::..`, `use crate::{a, b::c}` groups,
//! `use super::..` / `self::..` (resolved from the module the path is written in, inline `mod`
//! blocks included) and paths such as `crate::a::f(..)` in code; an item the crate root
//! re-exports (`use crate::Transformer`) counts as an import of the module it comes from.
//! Comments (doc comments too) and string and character literals are skipped. A file
//! `crates/c/src/foo/bar.rs` belongs to the top-level module `foo`.
//!
//! And a model family's names (`model_type`s, GGUF architectures) appear as string literals
//! only in the families folder: everything else asks the family.

mod common;

use common::root;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The most lines a source file may have.
const MAX_LINES: usize = 700;

/// `crates/*/src` folders, sorted.
fn crate_sources() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(root().join("crates"))
        .expect("crates/")
        .flatten()
        .map(|e| e.path().join("src"))
        .filter(|p| p.is_dir())
        .collect();
    out.sort();
    assert!(!out.is_empty(), "no crates/*/src folders");
    out
}

fn relative(p: &Path) -> String {
    p.strip_prefix(root()).unwrap_or(p).display().to_string()
}

#[test]
fn no_source_file_is_over_700_lines() {
    let mut long = Vec::new();
    for src in crate_sources() {
        for f in common::files(&src, &["rs"]) {
            let n = std::fs::read_to_string(&f)
                .expect("UTF-8 source")
                .lines()
                .count();
            if n > MAX_LINES {
                long.push(format!("{} ({n} lines)", relative(&f)));
            }
        }
    }
    assert!(
        long.is_empty(),
        "source files over {MAX_LINES} lines (split them by concern):\n  {}",
        long.join("\n  ")
    );
}

/// The source as tokens: identifiers and keywords, `::`, and single punctuation characters.
/// Comments, whitespace and the contents of string, byte-string, raw-string and character
/// literals are dropped (a literal leaves a `"` token behind); lifetimes are dropped too.
fn tokens(src: &str) -> Vec<String> {
    lex(src, false)
}

/// The source text of every string literal (plain, byte or raw) outside comments.
fn string_literals(src: &str) -> Vec<String> {
    lex(src, true)
        .into_iter()
        .filter_map(|t| t.strip_prefix('"').map(str::to_string))
        .filter(|t| !t.is_empty())
        .collect()
}

/// [`tokens`], a string literal's token followed by its source text when `keep_strings`.
fn lex(src: &str, keep_strings: bool) -> Vec<String> {
    let c: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let ident_char = |ch: char| ch.is_alphanumeric() || ch == '_';
    while i < c.len() {
        let ch = c[i];
        let next = c.get(i + 1).copied();
        if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && next == Some('*') {
            // Block comments nest.
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if let Some(end) = raw_string_end(&c, i) {
            let text: String = c[i..end.min(c.len())].iter().collect();
            out.push(format!(
                "\"{}",
                if keep_strings { text.as_str() } else { "" }
            ));
            i = end;
        } else if ch == '"' || (ch == 'b' && next == Some('"')) {
            i += if ch == 'b' { 2 } else { 1 };
            let start = i;
            while i < c.len() && c[i] != '"' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            let text: String = c[start..i.min(c.len())].iter().collect();
            out.push(format!(
                "\"{}",
                if keep_strings { text.as_str() } else { "" }
            ));
            i += 1;
        } else if ch == '\'' || (ch == 'b' && next == Some('\'')) {
            let start = if ch == 'b' { i + 1 } else { i };
            // A character literal closes within a few characters ('a', '\n', '\u{1F600}'); a
            // lifetime or label ('a, 'static) does not.
            let close = if c.get(start + 1) == Some(&'\\') {
                (start + 3..c.len().min(start + 12)).find(|&j| c[j] == '\'')
            } else {
                (c.get(start + 2) == Some(&'\'')).then_some(start + 2)
            };
            match close {
                Some(j) => {
                    out.push("'".to_string());
                    i = j + 1;
                }
                None => {
                    i = start + 1;
                    while i < c.len() && ident_char(c[i]) {
                        i += 1;
                    }
                }
            }
        } else if ident_char(ch) {
            let start = i;
            while i < c.len() && ident_char(c[i]) {
                i += 1;
            }
            out.push(c[start..i].iter().collect());
        } else if ch == ':' && next == Some(':') {
            out.push("::".to_string());
            i += 2;
        } else {
            out.push(ch.to_string());
            i += 1;
        }
    }
    out
}

/// Where the raw (byte) string literal starting at `i` ends, if one starts there:
/// `r"…"`, `r#"…"#`, `br##"…"##`.
fn raw_string_end(c: &[char], i: usize) -> Option<usize> {
    if i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_') {
        return None;
    }
    let mut j = i;
    if c.get(j) == Some(&'b') {
        j += 1;
    }
    if c.get(j) != Some(&'r') {
        return None;
    }
    j += 1;
    let hashes = c[j..].iter().take_while(|&&h| h == '#').count();
    j += hashes;
    if c.get(j) != Some(&'"') {
        return None;
    }
    j += 1;
    while j < c.len() {
        if c[j] == '"'
            && c[j + 1..]
                .iter()
                .take(hashes)
                .filter(|&&h| h == '#')
                .count()
                == hashes
        {
            return Some(j + 1 + hashes);
        }
        j += 1;
    }
    Some(c.len())
}

fn is_ident(t: &str) -> bool {
    t.chars()
        .next()
        .is_some_and(|ch| ch.is_alphabetic() || ch == '_')
}

/// The paths of the use tree starting at `toks[*i]`, each as its segments with `prefix` in
/// front; `*i` ends after the tree. `self` in a group names the group's prefix.
fn use_tree(toks: &[String], i: &mut usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
    let mut path = prefix.to_vec();
    loop {
        match toks.get(*i).map(String::as_str) {
            Some("{") => {
                *i += 1;
                while *i < toks.len() && toks[*i] != "}" {
                    use_tree(toks, i, &path, out);
                    if toks.get(*i).is_some_and(|t| t == ",") {
                        *i += 1;
                    }
                }
                *i += 1;
                return;
            }
            // `{self, ..}` in a group names the group's prefix (a leading `self::` is a
            // segment like any other, resolved by `target`).
            Some("self")
                if path.len() == prefix.len()
                    && !prefix.is_empty()
                    && toks.get(*i + 1).is_none_or(|t| t != "::") =>
            {
                *i += 1;
                out.push(path);
                return;
            }
            Some("*") => {
                *i += 1;
                out.push(path);
                return;
            }
            Some(t) if is_ident(t) => {
                path.push(t.to_string());
                *i += 1;
            }
            _ => {
                out.push(path);
                return;
            }
        }
        match toks.get(*i).map(String::as_str) {
            Some("::") => *i += 1,
            Some("as") => {
                *i += 2;
                out.push(path);
                return;
            }
            _ => {
                out.push(path);
                return;
            }
        }
    }
}

/// The top-level module a path written in module `at` (segments below the crate root) names,
/// if it starts at `crate`, `super` or `self`.
fn target(at: &[String], path: &[String]) -> Option<String> {
    let mut base: Vec<String> = match path.first()?.as_str() {
        "crate" => Vec::new(),
        "self" | "super" => at.to_vec(),
        _ => return None,
    };
    let mut rest = &path[usize::from(path[0] == "crate")..];
    while let Some(first) = rest.first() {
        match first.as_str() {
            "self" => {}
            "super" => {
                base.pop()?;
            }
            _ => break,
        }
        rest = &rest[1..];
    }
    base.extend(rest.iter().cloned());
    base.into_iter().next().filter(|m| is_ident(m))
}

/// The top-level modules `src` (the file of module `at`) refers to through `crate`, `super`
/// or `self` paths, in `use` items and in code.
fn references(src: &str, at: &[String]) -> BTreeSet<String> {
    let toks = tokens(src);
    let mut out = BTreeSet::new();
    // Inline `mod name { .. }` blocks: (name, brace depth inside them).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let module = |inline: &[(String, usize)]| -> Vec<String> {
        at.iter()
            .cloned()
            .chain(inline.iter().map(|(n, _)| n.clone()))
            .collect()
    };
    let mut i = 0;
    while i < toks.len() {
        let t = toks[i].as_str();
        let prev = if i > 0 { toks[i - 1].as_str() } else { "" };
        match t {
            "{" => depth += 1,
            "}" => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
            }
            "mod" if toks.get(i + 2).is_some_and(|t| t == "{") && is_ident(&toks[i + 1]) => {
                inline.push((toks[i + 1].clone(), depth + 1));
            }
            "use" => {
                let here = module(&inline);
                let mut j = i + 1;
                if toks.get(j).is_some_and(|t| t == "::") {
                    j += 1;
                }
                let mut paths = Vec::new();
                use_tree(&toks, &mut j, &[], &mut paths);
                out.extend(paths.iter().filter_map(|p| target(&here, p)));
                i = j;
                continue;
            }
            // `$crate::` is a macro's own crate, `pub(in crate::x)` a visibility, `a::crate`
            // nothing: none of them is an import.
            "crate" | "super" | "self"
                if toks.get(i + 1).is_some_and(|t| t == "::")
                    && !matches!(prev, "$" | "in" | "::") =>
            {
                let mut path = vec![t.to_string()];
                let mut j = i + 1;
                while toks.get(j).is_some_and(|t| t == "::")
                    && toks.get(j + 1).is_some_and(|t| is_ident(t))
                {
                    path.push(toks[j + 1].clone());
                    j += 2;
                }
                out.extend(target(&module(&inline), &path));
                i = j;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// The module path (below the crate root) of the file `f` in the source folder `src`; empty for
/// the crate root.
fn module_path(src: &Path, f: &Path) -> Vec<String> {
    let rel = f.strip_prefix(src).expect("file under src");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|s| s.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().expect("file name");
    match last.as_str() {
        "lib.rs" | "main.rs" if parts.is_empty() => {}
        "mod.rs" => {}
        file => parts.push(file.trim_end_matches(".rs").to_string()),
    }
    parts
}

/// `name → module` for the items the crate root re-exports from its modules (`pub use
/// model::{Transformer, ForwardInput};`), so that `use crate::Transformer` counts as an import
/// of `model`.
fn root_reexports(lib: &str, modules: &BTreeSet<String>) -> BTreeMap<String, String> {
    let toks = tokens(lib);
    let mut out = BTreeMap::new();
    let mut i = 0;
    while i < toks.len() {
        if toks[i] != "use" {
            i += 1;
            continue;
        }
        i += 1;
        let mut paths = Vec::new();
        use_tree(&toks, &mut i, &[], &mut paths);
        for p in paths {
            let start = usize::from(p.first().is_some_and(|s| s == "self" || s == "crate"));
            if let (Some(module), Some(item)) = (p.get(start), p.last())
                && p.len() > start + 1
                && modules.contains(module)
            {
                out.insert(item.clone(), module.clone());
            }
        }
    }
    out
}

/// `module → the other top-level modules it refers to`, for one crate's source folder.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let files: Vec<PathBuf> = common::files(src, &["rs"])
        .into_iter()
        .filter(|f| !f.strip_prefix(src).is_ok_and(|r| r.starts_with("bin")))
        .collect();
    let modules: BTreeSet<String> = files
        .iter()
        .filter_map(|f| module_path(src, f).first().cloned())
        .collect();
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap_or_default();
    let reexports = root_reexports(&lib, &modules);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let at = module_path(src, f);
        let Some(own) = at.first().cloned() else {
            continue; // the crate root re-exports; it is not a module of the graph
        };
        let text = std::fs::read_to_string(f).expect("UTF-8 source");
        let refs = references(&text, &at)
            .into_iter()
            .map(|r| reexports.get(&r).cloned().unwrap_or(r))
            .filter(|m| *m != own && modules.contains(m));
        graph.entry(own.clone()).or_default().extend(refs);
    }
    graph
}

/// Pairs `(a, b)`, `a < b`, where `a` refers to `b` and `b` to `a`.
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (a, uses) in graph {
        for b in uses {
            if a < b && graph.get(b).is_some_and(|u| u.contains(a)) {
                out.push((a.clone(), b.clone()));
            }
        }
    }
    out
}

#[test]
fn no_two_modules_import_each_other() {
    let mut found = Vec::new();
    for src in crate_sources() {
        let name = relative(src.parent().expect("crate folder"));
        for (a, b) in circles(&module_graph(&src)) {
            found.push(format!("{name}: {a} <-> {b}"));
        }
    }
    assert!(
        found.is_empty(),
        "top-level modules that import each other (move what both need into one of them or a \
         third module):\n  {}",
        found.join("\n  ")
    );
}

/// Whether the source text of a string literal names `name` as a whole: the literal is the
/// name, or quotes it (JSON in a raw string, `\"name\"` in a plain one).
fn names(literal: &str, name: &str) -> bool {
    literal == name
        || literal.contains(&format!("\"{name}\""))
        || literal.contains(&format!("\\\"{name}\\\""))
}

/// A model family's names are spelled only in its own module: outside `families` folders no
/// string literal is a family's `model_type` (any spelling) or GGUF architecture.
#[test]
fn family_names_are_spelled_only_in_the_families_folder() {
    use rlft_model::families::{FAMILIES, gguf_architectures, model_types};
    let mut spellings: BTreeSet<&str> = model_types().into_iter().collect();
    spellings.extend(gguf_architectures());
    assert!(spellings.len() >= FAMILIES.len());
    let mut found = Vec::new();
    for src in crate_sources() {
        for f in common::files(&src, &["rs"]) {
            if f.components().any(|c| c.as_os_str() == "families") {
                continue;
            }
            let text = std::fs::read_to_string(&f).expect("UTF-8 source");
            for lit in string_literals(&text) {
                for name in spellings.iter().filter(|n| names(&lit, n)) {
                    found.push(format!("{}: \"{name}\" in {lit:?}", relative(&f)));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "family names outside the families folder (ask the family instead: \
         rlft_model::families):\n  {}",
        found.join("\n  ")
    );
}

/// The library's showcase loop stays short: `examples/custom_loop.rs` is at most 80 lines of
/// code (neither blank nor comment lines), as docs/library.md says.
#[test]
fn the_custom_loop_example_is_at_most_80_lines_of_code() {
    let path = root().join("examples/custom_loop.rs");
    let text = std::fs::read_to_string(&path).expect("examples/custom_loop.rs");
    let code = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("//"))
        .count();
    assert!(
        code <= 80,
        "{}: {code} lines of code (at most 80)",
        relative(&path)
    );
}

#[test]
fn the_literal_reader_finds_names_in_strings_and_not_in_comments() {
    let src = r##"
        // "llama" in a comment
        /// "qwen2" in a doc comment
        let a = "mistral";
        let b = r#"{"model_type":"olmo2"}"#;
        let c = "{\"model_type\":\"phi3\"}";
        let d = "llama3 is a RoPE type";
    "##;
    let lits = string_literals(src);
    let hits: Vec<&str> = ["llama", "qwen2", "mistral", "olmo2", "phi3"]
        .into_iter()
        .filter(|n| lits.iter().any(|l| names(l, n)))
        .collect();
    assert_eq!(hits, ["mistral", "olmo2", "phi3"]);
}

#[test]
fn the_import_reader_sees_groups_nesting_and_skips_comments_and_strings() {
    let at = |m: &[&str]| -> Vec<String> { m.iter().map(|s| s.to_string()).collect() };
    let src = r##"
        //! Uses [`crate::doc_only`].
        use crate::{alpha, beta::{Gamma, delta::f}, Result};
        use crate::eps as e;
        use super::{self, zeta};
        /* crate::block_comment /* nested crate::x */ */
        fn g<'a>(s: &'a str) -> char {
            let _ = "crate::in_string";
            let _ = r#"crate::in_raw "string""#;
            let _ = crate::eta::run();
            let _ = $crate::theta;
            pub(in crate::iota) struct S;
            '{'
        }
        mod tests {
            use super::*;
            use super::super::mu::M;
            use super::super::super::kappa::{K, self};
            let _ = ('\'', '\\', '"', b'"', '\u{7B}');
        }
        fn after() { crate::lambda::go(); }
    "##;
    let refs = references(src, &at(&["own", "sub"]));
    let want: BTreeSet<String> = [
        "alpha", "beta", "Result", "eps", "own", "eta", "kappa", "lambda",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // `use super::{self, zeta}` in own::sub names own and own::zeta, and `super::super::mu`
    // in own::sub::tests is own::mu: all in `own`.
    assert_eq!(refs, want);
    let modules: BTreeSet<String> = ["model", "error"].iter().map(|s| s.to_string()).collect();
    let lib = "pub mod model;\nmod error;\npub use error::{ModelError, Result};\n\
               pub use model::{self, Transformer as T};\npub use burn;\npub use other::X;";
    let reexports: Vec<(String, String)> = root_reexports(lib, &modules).into_iter().collect();
    let pair = |a: &str, b: &str| (a.to_string(), b.to_string());
    assert_eq!(
        reexports,
        [
            pair("ModelError", "error"),
            pair("Result", "error"),
            pair("Transformer", "model")
        ]
    );
    assert_eq!(
        module_path(Path::new("s"), Path::new("s/a/b.rs")),
        at(&["a", "b"])
    );
    assert_eq!(
        module_path(Path::new("s"), Path::new("s/a/mod.rs")),
        at(&["a"])
    );
    assert_eq!(module_path(Path::new("s"), Path::new("s/a.rs")), at(&["a"]));
    assert!(module_path(Path::new("s"), Path::new("s/lib.rs")).is_empty());
}
