//! DAPO: verl 0.9.1's `verl/utils/reward_score/math_dapo.py`, Minerva-style answer
//! normalisation (from the Minerva paper's appendix) with a `\boxed{…}` fallback.

use super::py;
use regex::Captures;

/// The `pred` of a solution with no answer at all.
pub const INVALID: &str = "[INVALID]";

/// How many characters from the end of a solution are looked at.
pub const SOLUTION_CLIP_CHARS: usize = 300;

/// How many characters from the end the `\boxed{…}` fallback looks at.
pub const BOXED_CLIP_CHARS: usize = 100;

/// The result of [`math_dapo`], verl's `{"score", "acc", "pred"}`.
#[derive(Debug, Clone, PartialEq)]
pub struct DapoScore {
    /// 1 when correct, −1 otherwise.
    pub score: f64,
    /// Whether the prediction matched.
    pub acc: bool,
    /// The prediction: the normalised `Answer:` text, the raw boxed content, or
    /// [`INVALID`].
    pub pred: String,
}

/// verl's `math_dapo.last_boxed_only_string`: from the last `\boxed{` to the `}` that closes
/// it (counting braces), or `None`.
pub fn last_boxed_only_string(text: &str) -> Option<&str> {
    let start = text.rfind("\\boxed{")?;
    super::py::braced_from(text, start)
}

/// verl's `math_dapo.remove_boxed`: the content of `\boxed{…}`, or `None` where verl's
/// assertions fail.
pub fn remove_boxed(boxed: &str) -> Option<&str> {
    boxed.strip_prefix("\\boxed{")?.strip_suffix('}')
}

/// verl's `SUBSTITUTIONS`, applied in order.
const SUBSTITUTIONS: [(&str, &str); 10] = [
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
];

/// verl's `REMOVED_EXPRESSIONS`, removed in order.
const REMOVED_EXPRESSIONS: [&str; 41] = [
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
    "hours",
    "km",
    "units",
    "\\ldots",
    "sue",
    "points",
    "feet",
    "minutes",
    "digits",
    "cents",
    "degrees",
    "cm",
    "gm",
    "pounds",
    "meters",
    "meals",
    "edges",
    "students",
    "childrentickets",
    "multiples",
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    "\\mathrm{th}",
    "^\\circ",
    "^{\\circ}",
    "\\;",
    ",\\!",
    "{,}",
    "\"",
    "\\dots",
];

/// verl's `normalize_final_answer` (Minerva): the part after the last `=`; the substitutions
/// (articles, spaces, `\$`, `mbox`, `\text{and}`, ...) and removals (unit words, `\text{}`,
/// degree signs, `{,}`, ...) in verl's order; the math between the first two `$` of a line;
/// the content of `\text{}`, `\textbf{}`, `\overline{}`, `\boxed{}`; `\fracab` →
/// `\frac{a}{b}`, `\sqrta` → `\sqrt{a}`; no `$`; no thousands separators in a pure digit
/// string; surrounding whitespace trimmed.
///
/// The substitutions act on substrings, as verl's do: `"an "` and `"a "` are removed inside
/// words too, and removing `"km"` or `"sue"` can cut other words.
pub fn normalize_final_answer(answer: &str) -> String {
    let mut s = answer.rsplit('=').next().unwrap_or_default().to_string();
    for (before, after) in SUBSTITUTIONS {
        s = s.replace(before, after);
    }
    for expr in REMOVED_EXPRESSIONS {
        s = s.replace(expr, "");
    }
    let group = |n: usize| move |c: &Captures<'_>| c[n].to_string();
    s = cached_regex!(r"(.*?)(\$)(.*?)(\$)(.*)")
        .replace_all(&s, |c: &Captures<'_>| format!("${}$", &c[3]))
        .into_owned();
    s = cached_regex!(r"(\\text\{)(.*?)(\})")
        .replace_all(&s, group(2))
        .into_owned();
    s = cached_regex!(r"(\\textbf\{)(.*?)(\})")
        .replace_all(&s, group(2))
        .into_owned();
    s = cached_regex!(r"(\\overline\{)(.*?)(\})")
        .replace_all(&s, group(2))
        .into_owned();
    s = cached_regex!(r"(\\boxed\{)(.*)(\})")
        .replace_all(&s, group(2))
        .into_owned();
    s = cached_regex!(r"(frac)([^{])(.)")
        .replace_all(&s, |c: &Captures<'_>| {
            format!("frac{{{}}}{{{}}}", &c[2], &c[3])
        })
        .into_owned();
    s = cached_regex!(r"(sqrt)([^{])")
        .replace_all(&s, |c: &Captures<'_>| format!("sqrt{{{}}}", &c[2]))
        .into_owned();
    s = s.replace('$', "");
    let without_commas = s.replace(',', "");
    if py::isdigit(&without_commas) {
        s = without_commas;
    }
    py::strip(&s).to_string()
}

/// verl's `math_dapo.compute_score(solution, ground_truth)` as of verl 0.9.1, on the last
/// [`SOLUTION_CLIP_CHARS`] characters of `solution`:
///
/// * When some `Answer:` line is there (the regex `(?i)Answer\s*:\s*([^\n]+)`, Python's `\s`),
///   the last one's text through [`normalize_final_answer`] is the prediction, correct when
///   equal to the normalised `ground_truth`.
/// * Otherwise the content of the last `\boxed{…}` in the last [`BOXED_CLIP_CHARS`]
///   characters, not normalised, is the prediction, correct when equal to `ground_truth` as
///   written; [`INVALID`] when there is none.
///
/// Score 1 when correct, −1 otherwise.
///
/// The fallback is what verl 0.9.1's scores show (the golden cases in
/// `tests/data/golden-rewards/`); verl's main branch of early 2026 (0.8.0.dev) has none, and
/// there a solution without an `Answer:` line scores −1 with the prediction [`INVALID`].
pub fn math_dapo(solution: &str, ground_truth: &str) -> DapoScore {
    let text = py::tail(solution, SOLUTION_CLIP_CHARS);
    let answer = cached_regex!(r"(?i)Answer[\s\x1C-\x1F]*:[\s\x1C-\x1F]*([^\n]+)")
        .captures_iter(text)
        .last();
    let (acc, pred) = match answer {
        Some(c) => {
            let pred = normalize_final_answer(&c[1]);
            (pred == normalize_final_answer(ground_truth), pred)
        }
        None => {
            let pred = last_boxed_only_string(py::tail(text, BOXED_CLIP_CHARS))
                .and_then(remove_boxed)
                .unwrap_or(INVALID)
                .to_string();
            (pred == ground_truth, pred)
        }
    };
    DapoScore {
        score: if acc { 1.0 } else { -1.0 },
        acc,
        pred,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(solution: &str, gt: &str, acc: bool, pred: &str) {
        let got = math_dapo(solution, gt);
        assert_eq!(
            (got.acc, got.pred.as_str()),
            (acc, pred),
            "{solution:?} vs {gt:?}"
        );
        assert_eq!(got.score, if acc { 1.0 } else { -1.0 });
    }

    #[test]
    fn minerva_answer_lines() {
        check("Answer: $-415$", "-415", true, "-415");
        check("ANSWER : 7 ", "7", true, "7");
        check("Answer: 8\nAnswer: \\sqrt2", "\\sqrt{2}", true, "\\sqrt{2}");
        check("Answer: x = 1{,}000", "1000", true, "1000");
        check("Answer: 1,000 units", "1000", true, "1000");
        check("Answer: 5 \\text{ cm}", "5", true, "5");
        check("Answer: \\textbf{(B)}", "\\text{(B)}", true, "(B)");
        check("Answer: 90^{\\circ}", "90^\\circ", true, "90");
        check("Answer: x = 217.", "217", false, "217.");
        check(
            "Answer: \\text{\\frac{-7}{3}}",
            "-\\frac{7}{3}",
            false,
            "\\frac{-7{3}}",
        );
        check("Answer:\\frac34\n", "\\frac{3}{4}", true, "\\frac{3}{4}");
        check("Answer: .5", "0.5", false, ".5");
    }

    #[test]
    fn boxed_fallback_is_verbatim() {
        check("so \\boxed{841}", "841", true, "841");
        check("so \\boxed{\\text{5}}", "5", false, "\\text{5}");
        check("so \\boxed{\\sqrt2}", "\\sqrt{2}", false, "\\sqrt2");
        check("The final result is 64192.", "64192", false, INVALID);
        let far = format!("\\boxed{{7}}{}", " ".repeat(100));
        check(&far, "7", false, INVALID);
    }

    #[test]
    fn only_the_last_300_characters_count() {
        let pad = "x".repeat(300);
        check(&format!("Answer: 5\n{pad}"), "5", false, INVALID);
        check(&format!("Answer: 5\n{}", "é".repeat(290)), "5", true, "5");
    }
}
