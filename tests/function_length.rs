//! No library function under `crates/*/src` is over 100 lines: counted as physical lines from
//! its `fn` to its closing brace, comments included, outside `#[cfg(test)]` items and test or
//! fuzz files. A long function is split by what it does (the value checks per recipe section,
//! the HF reading per family), keeping numerically sensitive code bit-identical.
//!
//! The functions that are still longer are listed in [`LONGER`] with their length today: the
//! list may only shrink (a listed function may not grow, and one that is now short enough must
//! leave the list).

mod common;

use common::root;
use std::collections::BTreeMap;
use std::path::Path;

/// The most lines a function may have.
const MAX_LINES: usize = 100;

/// `(file, function, lines)`: the functions over [`MAX_LINES`] still to split, at most as long
/// as given.
const LONGER: &[(&str, &str, usize)] = &[];

/// A test or fuzz file, whose functions are not counted.
fn test_file(path: &str) -> bool {
    let name = Path::new(path)
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    path.contains("/tests/")
        || path.contains("/fuzz/")
        || name.contains("test")
        || name.contains("fuzz")
}

/// The name of the function a line declares (`pub(crate) const fn name<..>(`), if it does.
fn declared_fn(line: &str) -> Option<&str> {
    let mut rest = line.trim_start();
    loop {
        let before = rest;
        for prefix in ["pub ", "const ", "async ", "unsafe ", "extern \"C\" "] {
            rest = rest.strip_prefix(prefix).unwrap_or(rest);
        }
        if let Some(r) = rest.strip_prefix("pub(")
            && let Some(end) = r.find(')')
        {
            rest = r[end + 1..].trim_start();
        }
        if rest == before {
            break;
        }
    }
    let name = rest.strip_prefix("fn ")?;
    let end = name
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(name.len());
    Some(&name[..end])
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// The line after the item that starts at `start` (a `#[cfg(test)]` module or function): its
/// closing brace at the same indentation, or its `;`.
fn item_end(lines: &[&str], start: usize) -> usize {
    let ind = indent(lines[start]);
    let mut i = start + 1;
    while i < lines.len() {
        let l = lines[i];
        if !l.trim().is_empty() && indent(l) == ind && !l.trim_start().starts_with("#[") {
            if l.trim_end().ends_with(';') {
                return i + 1;
            }
            // The item's first line: find its closing brace at the same indentation.
            let mut j = i;
            while j < lines.len() {
                let t = lines[j];
                if j > i && indent(t) == ind && t.trim_start().starts_with('}') {
                    return j + 1;
                }
                if j == i && t.trim_end().ends_with('}') && t.contains('{') {
                    return j + 1;
                }
                j += 1;
            }
            return lines.len();
        }
        i += 1;
    }
    lines.len()
}

/// `(function, first line, lines)` of every function over `MAX_LINES` in `src`.
fn long_functions(src: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = src.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i];
        if l.trim() == "#[cfg(test)]" {
            i = item_end(&lines, i);
            continue;
        }
        if let Some(name) = declared_fn(l) {
            let ind = indent(l);
            let mut j = i;
            let mut end = None;
            while j < lines.len() {
                let t = lines[j];
                if j == i && t.trim_end().ends_with(';') {
                    break;
                }
                if j > i && indent(t) == ind && t.trim_start().starts_with('}') {
                    end = Some(j);
                    break;
                }
                if j > i && indent(t) == ind && t.trim_end().ends_with(';') && !t.contains('{') {
                    // A declaration without a body, its signature over several lines.
                    break;
                }
                j += 1;
            }
            if let Some(end) = end {
                let n = end - i + 1;
                if n > MAX_LINES {
                    out.push((name.to_string(), i + 1, n));
                }
            }
        }
        i += 1;
    }
    out
}

#[test]
fn no_library_function_is_over_100_lines_but_the_listed_ones() {
    let mut found: BTreeMap<(String, String), (usize, usize)> = BTreeMap::new();
    for entry in std::fs::read_dir(root().join("crates"))
        .expect("crates/")
        .flatten()
    {
        let src = entry.path().join("src");
        for f in common::files(&src, &["rs"]) {
            let rel = f.strip_prefix(root()).unwrap_or(&f).display().to_string();
            if test_file(&rel) {
                continue;
            }
            let text = std::fs::read_to_string(&f).expect("UTF-8 source");
            for (name, line, n) in long_functions(&text) {
                found.insert((rel.clone(), name), (line, n));
            }
        }
    }
    let mut problems = Vec::new();
    for ((file, name), (line, n)) in &found {
        match LONGER.iter().find(|(f, fn_, _)| f == file && fn_ == name) {
            None => problems.push(format!(
                "{file}:{line} {name} is {n} lines (at most {MAX_LINES}): split it by what it does"
            )),
            Some((_, _, max)) if n > max => problems.push(format!(
                "{file}:{line} {name} grew to {n} lines (listed at {max}): split it instead"
            )),
            _ => {}
        }
    }
    for (file, name, _) in LONGER {
        if !found.contains_key(&(file.to_string(), name.to_string())) {
            problems.push(format!(
                "{file} {name} is no longer over {MAX_LINES} lines (or is gone): remove it from \
                 LONGER"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_counter_finds_long_functions_and_skips_tests() {
    let body = "    let x = 1;\n".repeat(MAX_LINES);
    let inner = "        let x = 1;\n".repeat(MAX_LINES);
    let src = format!(
        "pub(crate) fn long() {{\n{body}}}\n\nfn short() {{\n    1\n}}\n\nfn decl();\n\
         #[cfg(test)]\nmod tests {{\n    fn long_test() {{\n{body}    }}\n}}\n\
         impl X {{\n    pub fn method(\n        a: u32,\n    ) -> u32 {{\n{inner}    }}\n}}\n"
    );
    let found: Vec<(String, usize)> = long_functions(&src)
        .into_iter()
        .map(|(n, _, len)| (n, len))
        .collect();
    assert_eq!(
        found,
        [
            ("long".to_string(), MAX_LINES + 2),
            ("method".to_string(), MAX_LINES + 4)
        ]
    );
    assert!(test_file("crates/a/src/loss/tests.rs"));
    assert!(test_file("crates/a/src/recipe_fuzz.rs"));
    assert!(!test_file("crates/a/src/loss.rs"));
}
