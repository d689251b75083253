//! Property tests: the recipe loader ([`Recipe::from_toml_str`] with `--set` overrides, then
//! [`Recipe::validate`]) returns `Ok` or a `TrainError::Recipe` on any input, never panics.

use crate::{Recipe, TrainError};
use proptest::prelude::*;
use serde_json::Value;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Every dotted path of the recipe schema (sections and keys), from the default recipe.
fn paths() -> Vec<String> {
    fn walk(v: &Value, prefix: &str, out: &mut Vec<String>) {
        if let Value::Object(m) = v {
            for (k, v) in m {
                let p = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                out.push(p.clone());
                walk(v, &p, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(
        &serde_json::to_value(Recipe::default()).expect("the default recipe serialises"),
        "",
        &mut out,
    );
    out
}

/// A key: a known dotted path, a mangled one, or anything.
fn key() -> impl Strategy<Value = String> {
    let known = paths();
    prop_oneof![
        24 => proptest::sample::select(known.clone()),
        1 => (proptest::sample::select(known), "[A-Z_\\[\\]0-9.-]{0,4}").prop_map(|(k, s)| format!("{k}{s}")),
        1 => "[a-z_.\\[\\]0-9-]{0,12}",
    ]
}

/// A TOML scalar of a random type: integers at and past the limits, negative numbers, NaN
/// and infinities, empty and odd strings, booleans, dates.
fn toml_scalar() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => (0i64..10).prop_map(|i| i.to_string()),
        2 => any::<i64>().prop_map(|i| i.to_string()),
        2 => Just("-1".to_string()),
        1 => Just("9223372036854775807".to_string()),
        1 => Just("-9223372036854775808".to_string()),
        1 => Just("18446744073709551615".to_string()),
        1 => Just("99999999999999999999999".to_string()),
        4 => proptest::sample::select(&["nan", "+inf", "-inf", "-0.0", "1e308", "1e-320", "0.5", "-0.5", "1e400"][..]).prop_map(String::from),
        2 => any::<f64>().prop_map(|f| format!("{f:e}")),
        6 => proptest::sample::select(&["\"\"", "\"grpo\"", "\"gae\"", "\"cosine\"", "\"bypass\"", "\"arithmetic\"", "\"+\"", "'é'", "\"\\u0000\""][..]).prop_map(String::from),
        2 => "[a-z0-9 ]{0,8}".prop_map(|s| format!("{s:?}")),
        4 => any::<bool>().prop_map(|b| b.to_string()),
        1 => Just("1979-05-27T07:32:00Z".to_string()),
    ]
}

/// A TOML value: mostly a scalar, sometimes an array or inline table of scalars.
fn toml_value() -> impl Strategy<Value = String> {
    prop_oneof![
        12 => toml_scalar(),
        2 => proptest::collection::vec(toml_scalar(), 0..4).prop_map(|v| format!("[{}]", v.join(", "))),
        1 => proptest::collection::vec(("[a-z_]{1,8}", toml_scalar()), 0..3).prop_map(|v| {
            let kv: Vec<String> = v.into_iter().map(|(k, v)| format!("{k} = {v}")).collect();
            format!("{{ {} }}", kv.join(", "))
        }),
    ]
}

/// A TOML document: distinct keys with values of any type, written as dotted keys or grouped
/// under `[section]` headers, sometimes with a line of garbage inserted.
fn toml_doc() -> impl Strategy<Value = String> {
    (
        proptest::collection::btree_map(key(), toml_value(), 0..10),
        any::<bool>(),
        proptest::option::weighted(0.1, (any::<proptest::sample::Index>(), "[^\n]{0,16}")),
    )
        .prop_map(|(entries, sections, garbage)| {
            let mut top = Vec::new();
            let mut tables = std::collections::BTreeMap::<String, Vec<String>>::new();
            for (k, v) in entries {
                match k.split_once('.') {
                    Some((section, rest)) if sections => tables
                        .entry(section.into())
                        .or_default()
                        .push(format!("{rest} = {v}")),
                    _ => top.push(format!("{k} = {v}")),
                }
            }
            for (section, lines) in tables {
                top.push(format!("[{section}]"));
                top.extend(lines);
            }
            if let Some((at, line)) = garbage {
                top.insert(at.index(top.len() + 1), line);
            }
            top.join("\n")
        })
}

/// Names the recipe's string keys accept (and some they do not).
fn names() -> Vec<String> {
    let mut v = rlft_algo::loss::LossRegistry::with_builtins().names();
    v.extend(
        [
            "",
            "gae",
            "remax",
            "rloo",
            "cosine",
            "linear",
            "linear_warmup",
            "constant",
            "token-mean",
            "seq-mean-token-sum",
            "sequence",
            "token",
            "k1",
            "k2",
            "k3",
            "low_var_kl",
            "loss",
            "reward",
            "arithmetic",
            "countdown",
            "+",
            "*",
            "bypass",
            "decoupled",
            "recompute",
            "proximal",
            "behavior",
            "auto",
            "cpu",
            "x",
        ]
        .map(String::from),
    );
    v
}

/// A value of the type the default recipe has at that key (integer, float, string, bool,
/// list, or an absent option), drawn from the edges of its range.
fn typed_value(default: Value) -> BoxedStrategy<String> {
    let int = prop_oneof![
        6 => (0i64..5).prop_map(|i| i.to_string()),
        1 => Just("-1".to_string()),
        1 => Just(i64::MAX.to_string()),
        1 => (0u32..63).prop_map(|k| (1i64 << k).to_string()),
    ];
    let float = prop_oneof![
        6 => proptest::sample::select(&["0.0", "1.0", "0.5", "-0.5", "-0.0", "2.0", "1e-8", "0.999"][..]).prop_map(String::from),
        2 => proptest::sample::select(&["nan", "inf", "-inf", "1e308", "-1e308", "5e-324"][..]).prop_map(String::from),
        1 => any::<f64>().prop_map(|f| format!("{f:e}")),
    ];
    let string = proptest::sample::select(names()).prop_map(|s| format!("{s:?}"));
    match default {
        Value::Bool(_) => any::<bool>().prop_map(|b| b.to_string()).boxed(),
        Value::Number(n) if n.is_f64() => float.boxed(),
        Value::Number(_) => int.boxed(),
        Value::String(_) => string.boxed(),
        Value::Array(_) => proptest::collection::vec(string, 0..4)
            .prop_map(|v| format!("[{}]", v.join(", ")))
            .boxed(),
        _ => prop_oneof![float, string, int].boxed(),
    }
}

/// A TOML document setting known keys to values of their own type: it mostly parses, so
/// `validate` sees every range edge.
fn typed_doc() -> impl Strategy<Value = String> {
    let default = serde_json::to_value(Recipe::default()).unwrap();
    let leaves: Vec<BoxedStrategy<String>> = paths()
        .into_iter()
        .filter_map(|p| {
            let v = default
                .pointer(&format!("/{}", p.replace('.', "/")))?
                .clone();
            (!v.is_object()).then(|| {
                typed_value(v)
                    .prop_map(move |v| format!("{p} = {v}"))
                    .boxed()
            })
        })
        .collect();
    proptest::sample::subsequence((0..leaves.len()).collect::<Vec<_>>(), 0..8)
        .prop_flat_map(move |picks| {
            picks
                .into_iter()
                .map(|i| leaves[i].clone())
                .collect::<Vec<_>>()
        })
        .prop_map(|lines| lines.join("\n"))
}

/// A `--set` argument: `KEY=VALUE` of known or mangled keys and values of any type, or any text.
fn set_arg() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => (key(), toml_value()).prop_map(|(k, v)| format!("{k}={v}")),
        1 => (key(), "[^\n]{0,12}").prop_map(|(k, v)| format!("{k}={v}")),
        1 => ".{0,24}",
        1 => (key(), 0u64..4, prop_oneof![Just(0u64), Just(1u64 << 20), Just(u64::MAX)])
            .prop_map(|(k, i, n)| format!("{k}[{}]={i}", n)),
    ]
}

/// Any JSON value, a few levels deep.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        ".{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(2, 8, 4, |inner| {
        proptest::collection::vec(inner, 0..4).prop_map(Value::Array)
    })
}

/// Checks that an outcome is a recipe, or an error of the kind the loader promises.
fn accepted_or_recipe_error(r: crate::Result<Recipe>) -> std::result::Result<(), TestCaseError> {
    match r {
        Ok(recipe) => {
            // A loaded recipe is checked in everything but what depends on the loss registry
            // (the loss and its preset), which the trainer resolves against its own registry.
            if let Err(e) = recipe.validate() {
                let msg = e.to_string();
                prop_assert!(
                    msg.starts_with("recipe: algorithm.loss")
                        || msg.starts_with("recipe: algorithm:")
                        || msg.starts_with("recipe: algorithm.ratio_reference")
                        || msg.starts_with("recipe: algorithm.advantage = 'gae'")
                        // Settings of one anchor's loss, set for another loss.
                        || ["vespo", "topr", "prime_rl"].iter().any(|s| {
                            msg.starts_with(&format!("recipe: algorithm.{s}"))
                                && msg.contains("applies to loss")
                        }),
                    "loaded, then refused for a reason the loss does not explain: {msg}"
                );
            }
            Ok(())
        }
        Err(TrainError::Recipe(_) | TrainError::Json(_) | TrainError::Algo(_)) => Ok(()),
        Err(e) => Err(TestCaseError::fail(format!("unexpected error kind: {e}"))),
    }
}

proptest! {
    #![proptest_config(config())]

    /// Any text as a recipe.
    #[test]
    fn any_text(text in ".{0,256}") {
        accepted_or_recipe_error(Recipe::from_toml_str(&text, &[]))?;
    }

    /// TOML documents of known (and mangled) keys holding values of any type.
    #[test]
    fn structured_toml(doc in toml_doc()) {
        accepted_or_recipe_error(Recipe::from_toml_str(&doc, &[]))?;
    }

    /// Documents of known keys holding values of the right type from the edges of their range.
    #[test]
    fn typed_toml(doc in typed_doc(), sets in proptest::collection::vec(set_arg(), 0..2)) {
        accepted_or_recipe_error(Recipe::from_toml_str(&doc, &[]))?;
        accepted_or_recipe_error(Recipe::from_toml_str(&doc, &sets))?;
    }

    /// `--set` overrides of any shape on top of an empty recipe.
    #[test]
    fn any_overrides(sets in proptest::collection::vec(set_arg(), 0..4)) {
        accepted_or_recipe_error(Recipe::from_toml_str("", &sets))?;
    }

    /// `validate` on recipes that skipped the loader: every leaf of the default recipe replaced,
    /// with some probability, by a value of any type; what deserialises is validated.
    #[test]
    fn validate_any_values(
        picks in proptest::collection::vec((any::<proptest::sample::Index>(), json_value()), 0..6),
    ) {
        let mut v = serde_json::to_value(Recipe::default()).unwrap();
        let leaves: Vec<String> = paths()
            .into_iter()
            .filter(|p| !v.pointer(&format!("/{}", p.replace('.', "/"))).is_some_and(Value::is_object))
            .collect();
        for (i, value) in picks {
            let p = format!("/{}", leaves[i.index(leaves.len())].replace('.', "/"));
            if let Some(slot) = v.pointer_mut(&p) {
                *slot = value;
            }
        }
        if let Ok(recipe) = serde_json::from_value::<Recipe>(v) {
            let _ = recipe.validate();
        }
    }
}

/// Found by these tests: the `config` crate resizes an array to a `--set` key's `[index]`, so a
/// huge index panicked (capacity overflow) or, at 2^40, aborted on allocation; keys are now
/// checked to be dotted names first.
#[test]
fn huge_set_index_is_an_error() {
    let sets = ["task.ops[9223372036854775807]=1".to_string()];
    assert!(Recipe::from_toml_str("", &sets).is_err());
}

/// Found by these tests: `validate` accepted scratch models whose head width
/// `hidden_size / heads` is 0 or odd, and the first forward pass then panicked in RoPE (burn:
/// shape mismatch or index out of bounds).
#[test]
fn scratch_head_width_must_be_even_and_positive() {
    for doc in [
        "[model.scratch]\nhidden_size = 4\nheads = 4\nkv_heads = 2",
        "[model.scratch]\nhidden_size = 6\nheads = 2\nkv_heads = 1",
        "[model.scratch]\nhidden_size = 0",
    ] {
        assert!(Recipe::from_toml_str(doc, &[]).is_err(), "{doc}");
    }
}
