//! The recipe reference: every key with its type, default, allowed values and meaning, generated
//! from the recipe's schema (its serde attributes and doc comments, read through `schemars`).
//! `rlft recipe keys` prints it; `docs/recipe-reference.md` is its output, kept in sync by a test.

use super::Recipe;
use rlft_algo::loss::LossRegistry;
use serde_json::{Map, Value};

/// The command that writes the reference page.
pub const REFERENCE_COMMAND: &str =
    "cargo run --release --bin rlft -- recipe keys > docs/recipe-reference.md";

/// One key of the reference.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyDoc {
    /// Dotted key (`algorithm.kl_coef`); entries of a list of tables are `reward[].kind`.
    pub key: String,
    /// `integer`, `number`, `boolean`, `string`, `list of string`, … (`, optional` when unset
    /// is allowed).
    pub kind: String,
    /// The default as TOML would write it (empty inside a list of tables without one).
    pub default: String,
    /// The allowed values of an enumeration (empty otherwise).
    pub allowed: Vec<String>,
    /// The key's doc comment.
    pub meaning: String,
}

/// Every key of a recipe with the built-in losses, in schema order (sections, then their keys,
/// alphabetically).
pub fn keys() -> Vec<KeyDoc> {
    keys_with(&LossRegistry::with_builtins())
}

/// Every key of a recipe with the losses of `registry`: their settings tables
/// (`[algorithm.<section>]`) follow the other `[algorithm]` keys.
pub fn keys_with(registry: &LossRegistry) -> Vec<KeyDoc> {
    let defaults = serde_json::to_value(Recipe::default()).unwrap_or(Value::Null);
    let mut out = walk_root(
        schemars::schema_for!(Recipe).as_value(),
        "",
        Some(&defaults),
    );
    let at = out
        .iter()
        .rposition(|k| k.key.starts_with("algorithm."))
        .map_or(out.len(), |i| i + 1);
    let mut tables = Vec::new();
    for s in registry.sections() {
        let prefix = format!("algorithm.{}", s.name);
        let mut keys = walk_root(s.schema.as_value(), &prefix, Some(&s.defaults));
        let readers = s.read_by.join("`, `");
        for k in &mut keys {
            k.meaning = format!("(loss `{readers}`) {}", k.meaning);
        }
        tables.extend(keys);
    }
    out.splice(at..at, tables);
    out
}

/// The keys of a root schema (its own `$defs`) under `prefix`.
fn walk_root(root: &Value, prefix: &str, defaults: Option<&Value>) -> Vec<KeyDoc> {
    let empty = Map::new();
    let defs = root
        .get("$defs")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let mut out = Vec::new();
    walk(root, prefix, defaults, defs, &mut out);
    out
}

/// The reference page (Markdown) with the built-in losses: one table per section.
pub fn reference_markdown() -> String {
    reference_markdown_with(&LossRegistry::with_builtins())
}

/// The reference page (Markdown) with the losses of `registry` (what a downstream trainer that
/// registers its own loss prints).
pub fn reference_markdown_with(registry: &LossRegistry) -> String {
    let mut page = format!(
        "# Recipe reference\n\nEvery key a recipe may set, with its type, default, allowed values \
         and meaning. A recipe is a TOML file; `RLFT__SECTION__KEY=value` environment variables \
         and `--set section.key=value` overrides (values parsed as TOML) change any key. Keys \
         under `reward[]` and `tool[]` belong to each `[[reward]]` and `[[tool]]` table.\n\nThis \
         page is generated from the recipe schema by `rlft recipe keys`; a test fails when it is \
         out of date. Regenerate it with\n\n```sh\n{REFERENCE_COMMAND}\n```\n"
    );
    let mut section = None;
    for k in keys_with(registry) {
        let head = match k.key.split_once('.') {
            Some((s, _)) => s.trim_end_matches("[]").to_string(),
            None => String::new(),
        };
        if section.as_ref() != Some(&head) {
            let title = match head.as_str() {
                "" => "Top level".to_string(),
                "reward" | "tool" => format!("`[[{head}]]`"),
                s => format!("`[{s}]`"),
            };
            page.push_str(&format!(
                "\n## {title}\n\n| key | type | default | allowed values | meaning |\n|---|---|---|---|---|\n"
            ));
            section = Some(head);
        }
        let allowed = k
            .allowed
            .iter()
            .map(|a| format!("`{a}`"))
            .collect::<Vec<_>>()
            .join(", ");
        let default = if k.default.is_empty() {
            String::new()
        } else {
            format!("`{}`", k.default)
        };
        page.push_str(&format!(
            "| `{}` | {} | {} | {} | {} |\n",
            k.key,
            cell(&k.kind),
            cell(&default),
            cell(&allowed),
            cell(&k.meaning)
        ));
    }
    page
}

/// Text that fits in one Markdown table cell.
fn cell(s: &str) -> String {
    s.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

/// `#/$defs/Name` → the definition, else the schema itself.
fn resolve<'a>(schema: &'a Value, defs: &'a Map<String, Value>) -> &'a Value {
    schema
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| r.strip_prefix("#/$defs/"))
        .and_then(|name| defs.get(name))
        .unwrap_or(schema)
}

/// The variants of `schema`: `anyOf` / `oneOf` alternatives, else the schema alone.
fn alternatives<'a>(schema: &'a Value, defs: &'a Map<String, Value>) -> Vec<&'a Value> {
    let s = resolve(schema, defs);
    match s
        .get("anyOf")
        .or_else(|| s.get("oneOf"))
        .and_then(Value::as_array)
    {
        Some(a) => a.iter().flat_map(|v| alternatives(v, defs)).collect(),
        None => vec![s],
    }
}

/// The table (an object with properties) a key holds, if it is a section.
fn section<'a>(schema: &'a Value, defs: &'a Map<String, Value>) -> Option<&'a Map<String, Value>> {
    resolve(schema, defs)
        .get("properties")
        .and_then(Value::as_object)
}

fn walk(
    schema: &Value,
    prefix: &str,
    defaults: Option<&Value>,
    defs: &Map<String, Value>,
    out: &mut Vec<KeyDoc>,
) {
    let Some(props) = section(schema, defs) else {
        return;
    };
    // Plain keys first, then sub-sections, so each section's table is contiguous.
    let mut entries: Vec<(&String, &Value)> = props.iter().collect();
    entries.sort_by_key(|(name, v)| (is_table(v, defs), name.as_str()));
    for (name, prop) in entries {
        let key = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}.{name}")
        };
        let default = defaults.and_then(|d| d.get(name));
        if section(prop, defs).is_some() {
            walk(prop, &key, default, defs, out);
            continue;
        }
        if let Some(items) = table_items(prop, defs) {
            walk(items, &format!("{key}[]"), None, defs, out);
            continue;
        }
        out.push(leaf(&key, prop, default, defs));
    }
}

/// Whether a key is a section or a list of tables (listed after the plain keys).
fn is_table(schema: &Value, defs: &Map<String, Value>) -> bool {
    section(schema, defs).is_some() || table_items(schema, defs).is_some()
}

/// The item schema of a list of tables (`[[reward]]`).
fn table_items<'a>(schema: &'a Value, defs: &'a Map<String, Value>) -> Option<&'a Value> {
    let s = resolve(schema, defs);
    (type_names(s).contains(&"array"))
        .then(|| s.get("items"))
        .flatten()
        .filter(|items| section(items, defs).is_some())
}

fn type_names(s: &Value) -> Vec<&str> {
    match s.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    }
}

fn leaf(key: &str, prop: &Value, default: Option<&Value>, defs: &Map<String, Value>) -> KeyDoc {
    let mut kinds: Vec<String> = Vec::new();
    let mut allowed: Vec<String> = Vec::new();
    let mut optional = false;
    for alt in alternatives(prop, defs) {
        let values = alt
            .get("enum")
            .and_then(Value::as_array)
            .cloned()
            .or_else(|| alt.get("const").map(|c| vec![c.clone()]));
        if let Some(values) = values {
            for v in values {
                match v.as_str() {
                    Some(s) => allowed.push(s.to_string()),
                    None if v.is_null() => optional = true,
                    None => allowed.push(v.to_string()),
                }
            }
            push_unique(&mut kinds, "string".into());
            continue;
        }
        for t in type_names(alt) {
            match t {
                "null" => optional = true,
                "array" => {
                    let item = alt.get("items").map(|i| {
                        alternatives(i, defs)
                            .iter()
                            .flat_map(|a| type_names(a))
                            .collect::<Vec<_>>()
                            .join(" or ")
                    });
                    let item_allowed: Vec<String> = alt
                        .get("items")
                        .map(|i| alternatives(i, defs))
                        .unwrap_or_default()
                        .iter()
                        .filter_map(|a| a.get("enum").and_then(Value::as_array))
                        .flatten()
                        .filter_map(|v| v.as_str().map(str::to_string))
                        .collect();
                    allowed.extend(item_allowed.iter().cloned());
                    let item = match item {
                        Some(i) if !i.is_empty() => i,
                        _ if !item_allowed.is_empty() => "string".into(),
                        _ => "value".into(),
                    };
                    push_unique(&mut kinds, format!("list of {item}"));
                }
                "object" => push_unique(&mut kinds, "table".into()),
                other => push_unique(&mut kinds, other.to_string()),
            }
        }
    }
    let mut kind = if kinds.is_empty() {
        "value".to_string()
    } else {
        kinds.join(" or ")
    };
    if optional {
        kind.push_str(", optional");
    }
    let meaning = prop
        .get("description")
        .or_else(|| resolve(prop, defs).get("description"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let default = default
        .or_else(|| prop.get("default"))
        .map(toml_text)
        .unwrap_or_default();
    KeyDoc {
        key: key.to_string(),
        kind,
        default,
        allowed,
        meaning,
    }
}

fn push_unique(v: &mut Vec<String>, s: String) {
    if !v.contains(&s) {
        v.push(s);
    }
}

/// A default as a TOML value (`null`: unset).
fn toml_text(v: &Value) -> String {
    match v {
        Value::Null => "unset".into(),
        Value::String(s) => format!("{s:?}"),
        Value::Array(a) => format!(
            "[{}]",
            a.iter().map(toml_text).collect::<Vec<_>>().join(", ")
        ),
        Value::Object(m) => format!(
            "{{{}}}",
            m.iter()
                .map(|(k, v)| format!("{k} = {}", toml_text(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recipe::keys::flatten;

    #[test]
    fn every_key_of_the_default_recipe_is_documented_with_type_and_meaning() {
        let docs = keys();
        let names: Vec<&str> = docs.iter().map(|k| k.key.as_str()).collect();
        let defaults = flatten(serde_json::to_value(Recipe::default()).unwrap());
        for key in defaults.keys() {
            // A list of tables (`reward`, `tool`) is documented by its entries' keys.
            let entries = format!("{key}[].");
            assert!(
                names.contains(&key.as_str()) || names.iter().any(|n| n.starts_with(&entries)),
                "{key} is not in the reference"
            );
        }
        for k in &docs {
            assert!(!k.meaning.is_empty(), "{}: no doc comment", k.key);
            assert!(
                !k.kind.is_empty() && k.kind != "value",
                "{}: {:?}",
                k.key,
                k.kind
            );
        }
        let find = |key: &str| docs.iter().find(|k| k.key == key).unwrap();
        assert!(
            find("algorithm.kl_placement")
                .allowed
                .contains(&"reward".into())
        );
        assert!(find("async.mode").allowed.contains(&"lagged".into()));
        assert!(find("reward[].kind").allowed.contains(&"exact".into()));
        assert_eq!(find("rollout.group_size").kind, "integer");
        assert!(find("algorithm.kl_target").kind.ends_with("optional"));
        assert_eq!(find("algorithm.correction.mode").default, "\"auto\"");
    }

    /// `docs/recipe-reference.md` is what `rlft recipe keys` prints.
    #[test]
    fn the_docs_reference_is_in_sync_with_the_schema() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/recipe-reference.md");
        let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
        let generated = reference_markdown();
        if on_disk != generated {
            let missing: Vec<String> = keys()
                .into_iter()
                .filter(|k| !on_disk.contains(&format!("| `{}` |", k.key)))
                .map(|k| k.key)
                .collect();
            panic!(
                "{} is out of date (keys missing there: {missing:?}); regenerate it: {REFERENCE_COMMAND}",
                path.display()
            );
        }
    }
}
