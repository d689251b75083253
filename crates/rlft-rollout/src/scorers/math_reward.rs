//! Hendrycks MATH: verl's `verl/utils/reward_score/math_reward.py` (from EleutherAI's
//! lm-evaluation-harness): the last `\boxed{…}` of a solution against the ground truth after
//! `strip_string` normalisation on both sides.
//!
//! Where verl raises an exception the port returns `None`, and the callers fall back the way
//! verl's `try`/`except` blocks do.

/// verl's `last_boxed_only_string` (Hendrycks version): the last boxed expression of `text`.
///
/// * When `text` contains `\boxed ` (with a space) anywhere, the result is `\boxed ` followed
///   by what comes after its **last** occurrence, up to the first `$`.
/// * Otherwise from the last `\boxed` (or, when there is none, the last `\fbox`) up to the
///   `}` where the count of braces opened since comes back to zero (a `}` before any `{` makes
///   it negative; verl's counter does the same), or `None` when it never does.
pub fn last_boxed_only_string(text: &str) -> Option<String> {
    if text.contains("\\boxed ") {
        let after = text.rsplit("\\boxed ").next().unwrap_or_default();
        let value = after.split('$').next().unwrap_or_default();
        return Some(format!("\\boxed {value}"));
    }
    let start = text.rfind("\\boxed").or_else(|| text.rfind("\\fbox"))?;
    super::py::braced_from(text, start).map(str::to_string)
}

/// verl's `remove_boxed` (Hendrycks version): the content of `\boxed …` or `\boxed{…}`, or
/// `None` where verl's assertions fail (in particular for `\fbox{…}`, which
/// [`last_boxed_only_string`] finds but this never accepts, and for `\boxed` not directly
/// followed by `{`).
pub fn remove_boxed(boxed: &str) -> Option<&str> {
    if boxed.contains("\\boxed ") {
        return boxed.strip_prefix("\\boxed ");
    }
    boxed.strip_prefix("\\boxed{")?.strip_suffix('}')
}

/// `\frac1b` → `\frac{1}{b}`, `\frac12` → `\frac{1}{2}`, `\frac1{72}` → `\frac{1}{72}`; the
/// input unchanged when some `\frac` has fewer than two characters after it; `None` (verl:
/// `IndexError`) when some `\frac` has nothing after it, unless an earlier one returned.
fn fix_fracs(text: &str) -> Option<String> {
    let mut parts = text.split("\\frac");
    let mut out = parts.next().unwrap_or_default().to_string();
    for part in parts {
        out.push_str("\\frac");
        let mut chars = part.chars();
        let a = chars.next()?;
        if a == '{' {
            out.push_str(part);
            continue;
        }
        let Some(b) = chars.next() else {
            return Some(text.to_string());
        };
        let rest = chars.as_str();
        if b == '{' {
            out.extend(['{', a, '}', b]);
        } else {
            out.extend(['{', a, '}', '{', b, '}']);
        }
        out.push_str(rest);
    }
    Some(out)
}

/// Whether `s` is what Python's `str(int(s))` gives back: `0`, or digits without a leading zero
/// after an optional `-`.
fn is_canonical_int(s: &str) -> bool {
    let digits = s.strip_prefix('-').unwrap_or(s);
    match digits.as_bytes() {
        [] => false,
        [b'0'] => s == "0",
        [first, rest @ ..] => {
            (b'1'..=b'9').contains(first) && rest.iter().all(|b| b.is_ascii_digit())
        }
    }
}

/// `a/b` with `a` and `b` integers written the way Python prints them → `\frac{a}{b}`.
fn fix_a_slash_b(text: String) -> String {
    match text.split_once('/') {
        Some((a, b)) if !b.contains('/') && is_canonical_int(a) && is_canonical_int(b) => {
            format!("\\frac{{{a}}}{{{b}}}")
        }
        _ => text,
    }
}

/// Everything before `\text{ ` (units); `None` (verl: `AssertionError`) when it occurs twice.
fn remove_right_units(text: String) -> Option<String> {
    if !text.contains("\\text{ ") {
        return Some(text);
    }
    let mut parts = text.split("\\text{ ");
    let before = parts.next().unwrap_or_default();
    parts.next()?;
    parts.next().is_none().then(|| before.to_string())
}

/// `\sqrt3` → `\sqrt{3}` (one character); `None` (verl: `IndexError`) when a `\sqrt` ends the
/// text.
fn fix_sqrt(text: String) -> Option<String> {
    if !text.contains("\\sqrt") {
        return Some(text);
    }
    let mut parts = text.split("\\sqrt");
    let mut out = parts.next().unwrap_or_default().to_string();
    for part in parts {
        let mut chars = part.chars();
        match chars.next()? {
            '{' => {
                out.push_str("\\sqrt");
                out.push_str(part);
            }
            a => {
                out.extend(['\\', 's', 'q', 'r', 't', '{', a, '}']);
                out.push_str(chars.as_str());
            }
        }
    }
    Some(out)
}

/// verl's `strip_string`, the Hendrycks MATH normalisation, step by step: drop newlines and
/// `\!`; `\\` → `\`; `tfrac`/`dfrac` → `frac`; drop `\left`, `\right`, degree signs, `\$`, units
/// after `\text{ `, and `\%`; `.5` → `0.5`; drop a short `x =` prefix (one `=`, at most two
/// characters before it); `\sqrt3` → `\sqrt{3}`; drop spaces; `\frac12` → `\frac{1}{2}`;
/// `0.5` → `\frac{1}{2}`; `1/2` → `\frac{1}{2}`.
///
/// `None` where verl raises (a second `\text{ `, a `\sqrt` or `\frac` at the very end).
pub fn strip_string(text: &str) -> Option<String> {
    let mut s = text
        .replace('\n', "")
        .replace("\\!", "")
        .replace("\\\\", "\\")
        .replace("tfrac", "frac")
        .replace("dfrac", "frac")
        .replace("\\left", "")
        .replace("\\right", "")
        .replace("^{\\circ}", "")
        .replace("^\\circ", "")
        .replace("\\$", "");
    s = remove_right_units(s)?
        .replace("\\\\%", "")
        .replace("\\%", "")
        .replace(" .", " 0.")
        .replace("{.", "{0.");
    if s.is_empty() {
        return Some(s);
    }
    if s.starts_with('.') {
        s.insert(0, '0');
    }
    if let Some((var, value)) = s.split_once('=')
        && !value.contains('=')
        && var.chars().count() <= 2
    {
        s = value.to_string();
    }
    s = fix_sqrt(s)?.replace(' ', "");
    s = fix_fracs(&s)?;
    if s == "0.5" {
        s = "\\frac{1}{2}".to_string();
    }
    Some(fix_a_slash_b(s))
}

/// verl's `is_equiv` (Hendrycks version): equal after [`strip_string`] on both sides, or, when
/// that fails on either side, equal as written.
pub fn is_equiv(a: &str, b: &str) -> bool {
    match (strip_string(a), strip_string(b)) {
        (Some(a), Some(b)) => a == b,
        _ => a == b,
    }
}

/// verl's `math_reward.compute_score(solution, ground_truth)`: 1 when the content of the last
/// boxed answer ([`last_boxed_only_string`], [`remove_boxed`]) [`is_equiv`] to
/// `ground_truth`, else 0 (also when there is no boxed answer or it cannot be unboxed).
pub fn math_boxed(solution: &str, ground_truth: &str) -> f64 {
    let correct = last_boxed_only_string(solution)
        .as_deref()
        .and_then(remove_boxed)
        .is_some_and(|answer| is_equiv(answer, ground_truth));
    if correct { 1.0 } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boxed_extraction_follows_verl() {
        let last = |s: &str| last_boxed_only_string(s);
        assert_eq!(
            last(r"\boxed{1} then \boxed{\frac{1}{2}}").as_deref(),
            Some(r"\boxed{\frac{1}{2}}")
        );
        assert_eq!(last(r"\boxed{unclosed"), None);
        assert_eq!(last(r"so \boxed 5$ and more").as_deref(), Some(r"\boxed 5"));
        // `\boxed ` anywhere wins over a later `\boxed{}`.
        assert_eq!(
            last(r"\boxed 3 then \boxed{4}").as_deref(),
            Some(r"\boxed 3 then \boxed{4}")
        );
        assert_eq!(last(r"\fbox{7}").as_deref(), Some(r"\fbox{7}"));
        assert_eq!(remove_boxed(r"\fbox{7}"), None);
        assert_eq!(remove_boxed(r"\boxed{7}"), Some("7"));
        assert_eq!(remove_boxed(r"\boxed 7"), Some("7"));
    }

    #[test]
    fn strip_string_normalises_like_hendrycks() {
        let s = |t: &str| strip_string(t);
        assert_eq!(s(r"\dfrac{1}{2}").as_deref(), Some(r"\frac{1}{2}"));
        assert_eq!(s("0.5").as_deref(), Some(r"\frac{1}{2}"));
        assert_eq!(s(".5").as_deref(), Some(r"\frac{1}{2}"));
        assert_eq!(s("1/2").as_deref(), Some(r"\frac{1}{2}"));
        assert_eq!(s("01/2").as_deref(), Some("01/2"));
        assert_eq!(s(r"\frac12").as_deref(), Some(r"\frac{1}{2}"));
        assert_eq!(s(r"\frac1{72}").as_deref(), Some(r"\frac{1}{72}"));
        assert_eq!(s(r"\frac1").as_deref(), Some(r"\frac1"));
        assert_eq!(s(r"x = 5").as_deref(), Some("5"));
        assert_eq!(s(r"abc = 5").as_deref(), Some("abc=5"));
        assert_eq!(s(r"10\%").as_deref(), Some("10"));
        assert_eq!(s(r"5 \text{ cm}").as_deref(), Some("5"));
        assert_eq!(s(r"2\sqrt3").as_deref(), Some(r"2\sqrt{3}"));
        assert_eq!(s(r"90^\circ").as_deref(), Some("90"));
        // Where verl raises.
        assert_eq!(s(r"1 \text{ a} \text{ b}"), None);
        assert_eq!(s(r"2\sqrt"), None);
        assert_eq!(s(r"\frac"), None);
    }

    #[test]
    fn scores() {
        assert_eq!(math_boxed(r"so \boxed{\dfrac{1}{2}}.", "0.5"), 1.0);
        assert_eq!(math_boxed(r"so \boxed{x = 5}", "5"), 1.0);
        assert_eq!(math_boxed(r"so \boxed 5$ ok", "5"), 1.0);
        assert_eq!(
            math_boxed(r"so \fbox{5}", "5"),
            0.0,
            "verl's remove_boxed rejects \\fbox"
        );
        assert_eq!(math_boxed(r"so \boxed{5", "5"), 0.0);
        assert_eq!(math_boxed("no box: 5", "5"), 0.0);
        // Normalisation fails on both sides: compared as written.
        assert_eq!(math_boxed(r"\boxed{2\sqrt}", r"2\sqrt"), 1.0);
    }
}
