//! The reward-scorer ports against the 600 golden cases scored by verl 0.9.1
//! (`tests/data/golden-rewards/cases.jsonl` at the workspace root).

use rlft_rollout::scorers::{Scorer, check_golden_file};

const CASES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tests/data/golden-rewards/cases.jsonl"
);

#[test]
fn every_golden_case_matches_verl() {
    let report = check_golden_file(CASES).unwrap();
    let failing: Vec<String> = report.failures.iter().map(|f| f.to_string()).collect();
    assert!(
        failing.is_empty(),
        "{}:\n{}",
        report.summary(),
        failing.join("\n")
    );
    assert_eq!(report.passed, 600, "{}", report.summary());
}

#[test]
fn the_golden_cases_cover_every_scorer() {
    let text = std::fs::read_to_string(CASES).unwrap();
    for scorer in Scorer::ALL {
        let tag = format!("\"scorer\": \"{scorer}\"");
        let n = text.lines().filter(|l| l.contains(&tag)).count();
        assert!(n >= 100, "{scorer}: {n} cases");
    }
}
