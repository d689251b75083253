//! The documentation a newcomer reads: every relative link in `README.md` and `docs/` resolves
//! inside the repository, the README stays a front door (at most 200 lines), and no document or
//! recipe speaks of how the project was made (sessions, issue numbers) or points outside the
//! repository.

mod common;

use common::{files, root};
use std::path::PathBuf;

/// The Markdown pages: README.md and everything under docs/.
fn pages() -> Vec<PathBuf> {
    let mut v = vec![root().join("README.md"), root().join("recipes/README.md")];
    v.extend(files(&root().join("docs"), &["md"]));
    v
}

/// The lines of a Markdown text outside fenced code blocks, numbered from 1, each with its
/// inline code spans removed.
fn outside_code(text: &str) -> Vec<(usize, &str, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let plain: String = line
            .split('`')
            .enumerate()
            .filter(|(i, _)| i % 2 == 0)
            .map(|(_, s)| s)
            .collect::<Vec<_>>()
            .join(" ");
        out.push((n + 1, line, plain));
    }
    out
}

/// The targets of inline links `[text](target)` outside code spans and fenced blocks.
fn link_targets(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    // Code spans dropped: a `[x](y)` inside backticks is not a link.
    for (_, _, plain) in outside_code(text) {
        let mut rest = plain.as_str();
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            let end = rest.find(')').unwrap_or(rest.len());
            let target = rest[..end].split_whitespace().next().unwrap_or("");
            out.push(target.to_string());
            rest = &rest[end..];
        }
    }
    out
}

#[test]
fn every_relative_link_resolves() {
    // Inside the repository: a plain clone has nothing beside it.
    let repo = root().canonicalize().unwrap();
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for target in link_targets(&text) {
            if target.is_empty()
                || target.starts_with('#')
                || target.contains("://")
                || target.starts_with("mailto:")
            {
                continue;
            }
            let path = target.split('#').next().unwrap_or_default();
            let resolved = page.parent().unwrap().join(path);
            checked += 1;
            if !resolved.canonicalize().is_ok_and(|p| p.starts_with(&repo)) {
                broken.push(format!("{}: {target}", page.display()));
            }
        }
    }
    assert!(checked > 0, "no relative links found");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_readme_is_a_front_door() {
    let text = std::fs::read_to_string(root().join("README.md")).unwrap();
    let lines = text.lines().count();
    assert!(lines <= 200, "README.md has {lines} lines (at most 200)");
    assert!(text.contains("cargo test --workspace --features ndarray"));
    assert!(text.contains("recipes/quickstart.toml"));
}

/// `grep -riwE "sessions?|issues? [0-9]+" README.md docs recipes` finds nothing, and no text
/// names the `../shared` folder that lies outside the repository.
#[test]
fn documents_describe_the_product_not_its_making() {
    let mut texts = pages();
    texts.extend(files(&root().join("recipes"), &["toml"]));
    texts.extend(files(&root().join("docs"), &["toml", "txt", "csv", "svg"]));
    let mut found = Vec::new();
    for p in texts {
        let Ok(text) = std::fs::read_to_string(&p) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            let lower = line.to_lowercase();
            let words: Vec<&str> = lower
                .split(|c: char| !c.is_alphanumeric())
                .filter(|w| !w.is_empty())
                .collect();
            let session = words.iter().any(|w| *w == "session" || *w == "sessions");
            let issue_number = words.windows(2).any(|w| {
                (w[0] == "issue" || w[0] == "issues") && w[1].chars().all(|c| c.is_ascii_digit())
            });
            if session || issue_number || line.contains("../shared") {
                found.push(format!("{}:{}: {line}", p.display(), n + 1));
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// Lab-notebook wording: phrases that only make sense to whoever made a change, and commit
/// hashes (7–40 hex digits with a letter and a digit) in prose. Fenced code blocks, inline code
/// and table rows (measurements) are not prose.
fn notebook_wording(text: &str) -> Vec<(usize, String)> {
    const PHRASES: [&str; 4] = ["this change", "that change", "previous stop", "earlier run"];
    let mut out = Vec::new();
    for (n, line, prose) in outside_code(text) {
        if line.trim_start().starts_with('|') {
            continue;
        }
        let lower = prose.to_lowercase();
        let phrase = PHRASES.iter().find(|p| lower.contains(*p));
        let hash = lower.split(|c: char| !c.is_ascii_alphanumeric()).find(|w| {
            (7..=40).contains(&w.len())
                && w.chars().all(|c| c.is_ascii_hexdigit())
                && w.chars().any(|c| c.is_ascii_digit())
                && w.chars().any(|c| c.is_ascii_alphabetic())
        });
        if let Some(what) = phrase.map(|p| p.to_string()).or(hash.map(String::from)) {
            out.push((n, what));
        }
    }
    out
}

/// No page or recipe reads like a lab notebook ([`notebook_wording`]).
#[test]
fn documents_carry_no_notebook_wording() {
    let mut texts = pages();
    texts.extend(files(&root().join("recipes"), &["toml"]));
    let mut found = Vec::new();
    for p in texts {
        let Ok(text) = std::fs::read_to_string(&p) else {
            continue;
        };
        for (n, what) in notebook_wording(&text) {
            found.push(format!("{}:{n}: {what:?}", p.display()));
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn notebook_wording_is_found_in_prose_only() {
    let text = "With commit 17f2656 the step\nafter this change it\n| 17f2656 | 1.0 |\n\
                `abc1234` in code\n```\nthat change\n```\nseed 1234567, the deadbeef value\n";
    let found: Vec<usize> = notebook_wording(text).into_iter().map(|(n, _)| n).collect();
    assert_eq!(found, [1, 2]);
}

#[test]
fn the_link_parser_finds_links_and_skips_code() {
    let t = "see [a](docs/a.md) and `[b](nope)`\n```\n[c](nope)\n```\n[d](x.md#part \"t\")";
    assert_eq!(link_targets(t), ["docs/a.md", "x.md#part"]);
}

/// On `docs/stale-samples.md` the staleness experiment's tables are the only ones whose rows
/// start with a number: `| lag | arm | a / b / c | steps to 0.9 | mean offpolicy/kl | step s |`,
/// and every seed of every row has its metrics file in `docs/runs/staleness` (each table is
/// `scripts/staleness_table.py --recipe NAME` over them, the command shown above it).
#[test]
fn the_staleness_table_rows_have_their_runs() {
    let page = std::fs::read_to_string(root().join("docs/stale-samples.md")).unwrap();
    let mut rows = 0;
    // Each table follows the command that prints it, which names its recipe.
    let mut recipe = "quickstart";
    for line in page.lines() {
        if let Some((_, rest)) = line.split_once("staleness_table.py --recipe ") {
            recipe = rest.split_whitespace().next().unwrap_or(recipe);
        }
        let cells: Vec<&str> = line
            .trim()
            .trim_matches('|')
            .split('|')
            .map(str::trim)
            .collect();
        let Ok(lag) = cells[0].parse::<u32>() else {
            continue;
        };
        assert_eq!(cells.len(), 6, "{line}");
        let arm = cells[1].trim_matches('`');
        let finals: Vec<f64> = cells[2].split(" / ").map(|a| a.parse().unwrap()).collect();
        assert!(finals.iter().all(|a| (0.0..=1.0).contains(a)), "{line}");
        assert_eq!(cells[3].split(" / ").count(), finals.len(), "{line}");
        for seed in 0..finals.len() {
            let f = format!("docs/runs/staleness/{recipe}-{arm}-lag{lag}-seed{seed}.jsonl.gz");
            assert!(root().join(&f).is_file(), "{line}: no {f}");
        }
        rows += 1;
    }
    assert!(rows > 0, "no staleness table on docs/stale-samples.md");
}
