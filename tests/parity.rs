//! Reference parity on the golden cases kept in `tests/golden/` (verl 0.9.1; the CTPO authors'
//! loss code; TRL, slime, AReaL, ROLL and prime-rl for the frontier off-policy variants), in f64 (required tolerances) and in f32. Every case must pass: none may be
//! skipped, and every metric the reference reports is compared (a case with a metric rlft does
//! not report counts as skipped).

use rlft_parity::{Options, golden_dir, run_dir};

fn check(set: &str, cases: usize, opts: Options) {
    let report = run_dir(&golden_dir(set), &opts).unwrap_or_else(|e| panic!("{e}"));
    println!("{}", report.render());
    let (passed, failed, skipped) = report.counts();
    assert_eq!(report.cases.len(), cases, "{set}: case count");
    assert_eq!(
        (passed, failed, skipped),
        (cases, 0, 0),
        "{set}: {}",
        report.summary()
    );
}

#[test]
fn verl_cases_match_in_f64() {
    check("verl", 368, Options::f64());
}

#[test]
fn verl_cases_match_in_f32() {
    check("verl", 368, Options::f32());
}

#[test]
fn offpolicy_cases_match_verl_in_f64() {
    check("offpolicy", 64, Options::f64());
}

#[test]
fn offpolicy_cases_match_verl_in_f32() {
    check("offpolicy", 64, Options::f32());
}

#[test]
fn ctpo_cases_match_the_authors_code_in_f64() {
    check("ctpo", 34, Options::f64());
}

#[test]
fn ctpo_cases_match_the_authors_code_in_f32() {
    check("ctpo", 34, Options::f32());
}

#[test]
fn frontier_cases_match_their_anchors_in_f64() {
    check("frontier", 83, Options::f64());
}

#[test]
fn frontier_cases_match_their_anchors_in_f32() {
    check("frontier", 83, Options::f32());
}
