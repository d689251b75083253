//! Bring your own data: 2-step runs from a JSONL file (TRL's layout) and from a Parquet file in
//! verl's layout (written here), scored by `math_dapo` plus a `command` reward; every term has
//! its metric, the eval file is really read, and bad data is an error naming file, row and
//! column.

use parquet::basic::Compression;
use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;
use rlft_train::metrics::{StepMetrics, read_metrics};
use rlft_train::{Recipe, Trainer};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("rlft-own-data-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// verl's layout as pyarrow writes it: optional columns, `prompt` a 3-level LIST of
/// `{content, role}`, `reward_model` and `extra_info` structs.
const VERL_SCHEMA: &str = "
message schema {
  OPTIONAL BYTE_ARRAY data_source (UTF8);
  OPTIONAL group prompt (LIST) {
    REPEATED group list {
      OPTIONAL group element {
        OPTIONAL BYTE_ARRAY content (UTF8);
        OPTIONAL BYTE_ARRAY role (UTF8);
      }
    }
  }
  OPTIONAL BYTE_ARRAY ability (UTF8);
  OPTIONAL group reward_model {
    OPTIONAL BYTE_ARRAY ground_truth (UTF8);
    OPTIONAL BYTE_ARRAY style (UTF8);
  }
  OPTIONAL group extra_info {
    OPTIONAL INT64 index;
    OPTIONAL BYTE_ARRAY split (UTF8);
  }
}";

/// One verl row: `(data_source, user message, ground truth, index)`.
type VerlRow<'a> = (&'a str, &'a str, &'a str, i64);

/// Writes `rows` in verl's layout (snappy pages, like pyarrow's default).
fn write_verl_parquet(path: &Path, rows: &[VerlRow]) {
    let schema = Arc::new(parse_message_type(VERL_SCHEMA).unwrap());
    let props = Arc::new(
        WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .build(),
    );
    let file = std::fs::File::create(path).unwrap();
    let mut w = SerializedFileWriter::new(file, schema, props).unwrap();
    let mut rg = w.next_row_group().unwrap();
    let n = rows.len();
    let bytes = |f: &dyn Fn(&VerlRow) -> String| -> Vec<ByteArray> {
        rows.iter()
            .map(|r| ByteArray::from(f(r).as_str()))
            .collect()
    };
    // Leaves in schema order, each with its definition levels (every value present: the
    // maximum level) and, for the list's leaves, repetition levels (one message per row: 0).
    let leaves: Vec<(Vec<ByteArray>, i16, bool)> = vec![
        (bytes(&|r| r.0.to_string()), 1, false),
        (bytes(&|r| r.1.to_string()), 4, true),
        (bytes(&|_| "user".to_string()), 4, true),
        (bytes(&|_| "math".to_string()), 1, false),
        (bytes(&|r| r.2.to_string()), 2, false),
        (bytes(&|_| "rule".to_string()), 2, false),
    ];
    let mut leaves = leaves.into_iter();
    let mut column = 0;
    while let Some(mut col) = rg.next_column().unwrap() {
        if column == 6 {
            let v: Vec<i64> = rows.iter().map(|r| r.3).collect();
            col.typed::<Int64Type>()
                .write_batch(&v, Some(&vec![2; n]), None)
                .unwrap();
        } else if column == 7 {
            col.typed::<ByteArrayType>()
                .write_batch(&bytes(&|_| "train".to_string()), Some(&vec![2; n]), None)
                .unwrap();
        } else {
            let (values, def, repeated) = leaves.next().unwrap();
            let reps = vec![0i16; n];
            col.typed::<ByteArrayType>()
                .write_batch(&values, Some(&vec![def; n]), repeated.then_some(&reps[..]))
                .unwrap();
        }
        col.close().unwrap();
        column += 1;
    }
    rg.close().unwrap();
    w.close().unwrap();
}

fn write_jsonl(path: &Path, rows: &[Value]) {
    let text: Vec<String> = rows.iter().map(Value::to_string).collect();
    std::fs::write(path, text.join("\n") + "\n").unwrap();
}

/// A command reward (POSIX sh) in `dir/file`: 1 for a JSON line matching the `case` pattern
/// `accept`, else 0.
fn case_scorer(dir: &Path, file: &str, accept: &str) -> PathBuf {
    let path = dir.join(file);
    let script = format!(
        "while read -r line; do\n  case \"$line\" in\n    {accept}) echo 1 ;;\n    *) echo 0 ;;\n  \
         esac\ndone\n"
    );
    std::fs::write(&path, script).unwrap();
    path
}

/// 1 when the ground truth it is sent is "7", else 0; it also shows that the JSON line carries
/// the metadata.
fn scorer(dir: &Path) -> PathBuf {
    case_scorer(dir, "score.sh", r#"*'"ground_truth":"7"'*'"metadata":{'*"#)
}

/// The recipe: tiny-llama (it has a chat template), 2 steps, the files given, `math_dapo`
/// plus the command term (which defines accuracy).
fn recipe(dir: &Path, train: &Path, eval: &Path) -> Recipe {
    let text = format!(
        r#"
seed = 1
output_dir = "{out}"
device = "flex"
[model]
path = "{model}"
[data]
train = "{train}"
eval = "{eval}"
[rollout]
prompts_per_step = 2
group_size = 2
max_new_tokens = 6
max_total_tokens = 6
[algorithm]
loss = "grpo"
kl_coef = 0.0
micro_batch_size = 4
[schedule]
steps = 2
warmup_steps = 0
[eval]
every = 0
k = 2
[checkpoint]
every = 0
export_final = false
[logging]
progress = false
[[reward]]
kind = "math_dapo"
[[reward]]
kind = "command"
name = "gt7"
command = ["sh", "{scorer}"]
timeout_s = 5
weight = 0.5
correctness = true
"#,
        out = dir.join("run").display(),
        model = root().join("tests/data/fixtures/tiny-llama").display(),
        train = train.display(),
        eval = eval.display(),
        scorer = scorer(dir).display(),
    );
    Recipe::from_toml_str(&text, &[]).unwrap()
}

fn run(recipe: Recipe) -> Vec<StepMetrics> {
    let out = recipe.output_dir.clone();
    let summary = Trainer::new(recipe, None)
        .and_then(|mut t| t.run(None))
        .unwrap();
    assert_eq!(summary.steps, 2);
    read_metrics(&out.join("metrics.jsonl")).unwrap()
}

fn check_terms(metrics: &[StepMetrics]) {
    for m in &metrics[1..] {
        for key in ["reward/math_dapo", "reward/gt7", "reward/mean", "accuracy"] {
            assert!(m.contains_key(key), "{key} missing from {m:?}");
        }
        // A tiny random model never writes "Answer: 7": math_dapo scores every sample -1.
        assert_eq!(m["reward/math_dapo"], json!(-1.0));
    }
    let last = metrics.last().unwrap();
    for key in ["eval/accuracy", "eval/pass@2", "eval/mean@2"] {
        assert!(last.contains_key(key), "{key} missing from {last:?}");
    }
}

#[test]
fn parquet_in_verl_layout_with_math_dapo_and_a_command_reward() {
    let dir = tmp("parquet");
    let train = dir.join("train.parquet");
    let rows: Vec<(String, String, String, i64)> = (0..6)
        .map(|i| {
            let source = if i % 2 == 0 { "src_a" } else { "src_b" };
            (
                source.into(),
                format!("What is {i} + 1?"),
                (i + 1).to_string(),
                i,
            )
        })
        .collect();
    let borrowed: Vec<VerlRow> = rows
        .iter()
        .map(|(s, p, g, i)| (s.as_str(), p.as_str(), g.as_str(), *i))
        .collect();
    write_verl_parquet(&train, &borrowed);
    // The eval file: its ground truths decide the command term, hence eval/accuracy.
    let eval_all_7 = dir.join("eval7.parquet");
    write_verl_parquet(
        &eval_all_7,
        &[
            ("src_a", "What is 6 + 1?", "7", 0),
            ("src_b", "What is 3 + 4?", "7", 1),
        ],
    );
    let eval_mixed = dir.join("eval_mixed.parquet");
    write_verl_parquet(
        &eval_mixed,
        &[
            ("src_a", "What is 6 + 1?", "7", 0),
            ("src_b", "What is 3 + 4?", "8", 1),
        ],
    );
    let m = run(recipe(&dir, &train, &eval_all_7));
    check_terms(&m);
    let last = m.last().unwrap();
    assert_eq!(last["eval/accuracy"], json!(1.0));
    assert_eq!(last["eval/src_a/accuracy"], json!(1.0));
    assert_eq!(last["eval/src_b/accuracy"], json!(1.0));
    std::fs::remove_dir_all(dir.join("run")).unwrap();
    let m = run(recipe(&dir, &train, &eval_mixed));
    let last = m.last().unwrap();
    assert_eq!(
        last["eval/accuracy"],
        json!(0.5),
        "the eval file's answers are read"
    );
    assert_eq!(last["eval/src_b/accuracy"], json!(0.0));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn jsonl_in_trl_layout() {
    let dir = tmp("jsonl");
    let train = dir.join("train.jsonl");
    let rows: Vec<Value> = (0..6)
        .map(|i| json!({"prompt": format!("{i} + 1 ="), "solution": i + 1, "id": i}))
        .collect();
    write_jsonl(&train, &rows);
    let eval = dir.join("eval.jsonl");
    write_jsonl(
        &eval,
        &[json!({"prompt": [{"role": "user", "content": "3 + 4?"}], "answer": "7"})],
    );
    let m = run(recipe(&dir, &train, &eval));
    check_terms(&m);
    assert_eq!(m.last().unwrap()["eval/accuracy"], json!(1.0));
    std::fs::remove_dir_all(dir.join("run")).unwrap();
    // A warm-up on demonstrations and a calculator and a command tool in a 2-turn episode.
    let sft = dir.join("sft.jsonl");
    write_jsonl(
        &sft,
        &[
            json!({"prompt": "1 + 1 =", "completion": " 2"}),
            json!({"prompt": "2 + 2 =", "completion": [{"role": "assistant", "content": " 4"}]}),
        ],
    );
    let tool = dir.join("tool.sh");
    std::fs::write(&tool, "read -r line; echo ok\n").unwrap();
    let text = recipe(&dir, &train, &eval).to_toml().unwrap();
    let r = Recipe::from_toml_str(
        &text,
        &[
            format!("data.sft=\"{}\"", sft.display()),
            "sft.steps=2".into(),
            "sft.batch_size=2".into(),
            "rollout.max_turns=2".into(),
            format!(
                "tool=[{{kind = \"calculator\"}}, {{kind = \"command\", name = \"lookup\", \
                 command = [\"sh\", \"{}\"], timeout_s = 2}}]",
                tool.display()
            ),
        ],
    )
    .unwrap();
    let out = r.output_dir.clone();
    let m = run(r);
    let warmup = read_metrics(&out.join("sft_metrics.jsonl")).unwrap();
    assert_eq!(warmup.len(), 2, "two warm-up steps on the demonstrations");
    for key in ["tool/calc/calls", "tool/calc/errors", "tool/lookup/calls"] {
        assert!(m[1].contains_key(key), "{key} missing from {:?}", m[1]);
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn verl_data_sources_and_target_lists() {
    let dir = tmp("sources");
    let train = dir.join("train.jsonl");
    // Search-R1 rows carry several acceptable answers; gsm8k rows one.
    let rows: Vec<Value> = (0..4)
        .map(|i| {
            let (source, truth) = if i % 2 == 0 {
                ("searchR1_nq", json!({"target": ["x", "7"]}))
            } else {
                ("openai/gsm8k", json!("7"))
            };
            json!({
                "data_source": source,
                "prompt": [{"role": "user", "content": format!("question {i}")}],
                "reward_model": {"ground_truth": truth, "style": "rule"},
            })
        })
        .collect();
    write_jsonl(&train, &rows);
    // No [[reward]] terms: verl's default reward, the scorer named by each row's data_source.
    let mut r = recipe(&dir, &train, &train);
    r.reward.clear();
    let m = run(r);
    for step in &m[1..] {
        for key in ["reward/by_source", "reward/mean", "accuracy"] {
            assert!(step.contains_key(key), "{key} missing from {step:?}");
        }
    }
    assert!(m.last().unwrap().contains_key("eval/searchR1_nq/accuracy"));
    std::fs::remove_dir_all(dir.join("run")).unwrap();
    // A command term sees every acceptable answer: 1 for ["x","7"] and for "7".
    let script = case_scorer(
        &dir,
        "lists.sh",
        r#"*'"ground_truth":["x","7"]'*|*'"ground_truth":"7"'*"#,
    );
    let mut r = recipe(&dir, &train, &train);
    r.reward[0] = rlft_train::recipe::RewardTerm::new(rlft_train::recipe::RewardKind::BySource);
    r.reward[1].command = Some(vec!["sh".into(), script.display().to_string()]);
    let m = run(r);
    for step in &m[1..] {
        assert_eq!(step["reward/gt7"], json!(1.0), "{step:?}");
        assert!(step.contains_key("reward/by_source"));
    }
    assert_eq!(m.last().unwrap()["eval/accuracy"], json!(1.0));
    std::fs::remove_dir_all(&dir).ok();
}

/// Loads a recipe with `train` and the default terms and returns the trainer's error.
fn load_error(dir: &Path, train: &Path, sets: &[&str]) -> String {
    let r = recipe(dir, train, train);
    let mut text = r.to_toml().unwrap();
    for s in sets {
        text.push_str(s);
        text.push('\n');
    }
    match Recipe::from_toml_str(&text, &[]).and_then(|r| Trainer::new(r, None)) {
        Ok(_) => panic!("{} loaded", train.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_data_names_file_row_and_column() {
    let dir = tmp("bad");
    let jsonl = |name: &str, rows: &[Value]| {
        let p = dir.join(name);
        write_jsonl(&p, rows);
        p
    };
    let cases: Vec<(PathBuf, Vec<&str>)> = vec![
        (
            jsonl(
                "missing.jsonl",
                &[
                    json!({"prompt": "a", "answer": "1"}),
                    json!({"prompt": "b"}),
                ],
            ),
            vec!["missing.jsonl:2", "no answer", "data.answer_column"],
        ),
        (
            jsonl("type.jsonl", &[json!({"prompt": 5, "answer": "1"})]),
            vec!["type.jsonl:1", "column \"prompt\"", "a number"],
        ),
        (
            {
                let p = dir.join("empty.jsonl");
                std::fs::write(&p, "\n\n").unwrap();
                p
            },
            vec!["empty.jsonl", "no examples"],
        ),
        (
            {
                let p = dir.join("other.parquet");
                let schema =
                    "message schema { OPTIONAL BYTE_ARRAY question (UTF8); OPTIONAL INT64 label; }";
                let mut w = SerializedFileWriter::new(
                    std::fs::File::create(&p).unwrap(),
                    Arc::new(parse_message_type(schema).unwrap()),
                    Arc::new(WriterProperties::builder().build()),
                )
                .unwrap();
                let mut rg = w.next_row_group().unwrap();
                let mut c = rg.next_column().unwrap().unwrap();
                c.typed::<ByteArrayType>()
                    .write_batch(&[ByteArray::from("q")], Some(&[1]), None)
                    .unwrap();
                c.close().unwrap();
                let mut c = rg.next_column().unwrap().unwrap();
                c.typed::<Int64Type>()
                    .write_batch(&[3], Some(&[1]), None)
                    .unwrap();
                c.close().unwrap();
                rg.close().unwrap();
                w.close().unwrap();
                p
            },
            vec!["other.parquet:1", "row 1", "no prompt", "label, question"],
        ),
        (
            {
                let p = dir.join("garbage.parquet");
                std::fs::write(&p, "not parquet").unwrap();
                p
            },
            vec!["garbage.parquet", "not a readable Parquet file"],
        ),
    ];
    for (path, wants) in cases {
        let e = load_error(&dir, &path, &[]);
        for w in wants {
            assert!(e.contains(w), "{}: {w:?} not in: {e}", path.display());
        }
    }
    // A ground truth the scorer cannot use: `exact` on the last number, a text answer.
    let text = jsonl(
        "text.jsonl",
        &[
            json!({"prompt": "a", "answer": "1"}),
            json!({"prompt": "b", "answer": "Paris"}),
        ],
    );
    let e = load_error(&dir, &text, &["[[reward]]\nkind = \"exact\""]);
    assert!(
        e.contains("text.jsonl:2") && e.contains("\"Paris\" is not a number"),
        "{e}"
    );
    // Message prompts for a model without a chat template (tiny-llama without its template).
    let msgs = jsonl(
        "msgs.jsonl",
        &[json!({"prompt": [{"role": "user", "content": "hi"}], "answer": "1"})],
    );
    let bare = dir.join("no-template");
    std::fs::create_dir_all(&bare).unwrap();
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        std::fs::copy(
            root().join("tests/data/fixtures/tiny-llama").join(f),
            bare.join(f),
        )
        .unwrap();
    }
    let mut r = recipe(&dir, &msgs, &msgs);
    r.model.path = bare.display().to_string();
    let e = Trainer::new(r, None).err().unwrap().to_string();
    assert!(
        e.contains("msgs.jsonl:1") && e.contains("no chat template"),
        "{e}"
    );
    // The old key points to the new one.
    let e = Recipe::from_toml_str("[task]\ndataset = \"x.jsonl\"", &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("task.dataset") && e.contains("[data]"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}
