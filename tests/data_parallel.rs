//! The data-parallel learner (`[distributed] devices`): N ranks with B/N rows each take the same
//! optimiser step as one rank with all B rows, for every loss aggregation (N ranks on flex).

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::Tensor;
use rlft::train::metrics::read_metrics;
use rlft::train::{Recipe, Trainer};
use std::path::Path;

/// Every parameter's values, in visiting order.
fn parameters(model: &impl Module) -> Vec<f32> {
    struct Collect(Vec<f32>);
    impl ModuleVisitor for Collect {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<D>>) {
            let v = p
                .val()
                .into_data()
                .try_into_vec::<f32>()
                .expect("f32 parameters");
            self.0.extend(v);
        }
    }
    let mut c = Collect(Vec::new());
    model.visit(&mut c);
    c.0
}

/// The crash test's recipe (warm-up, GRPO with a reference KL and an entropy bonus), 3 prompts
/// × 4 completions = 12 rows of different lengths and rewards (a length penalty and a regex
/// term), micro-batches of `micro` rows, one optimiser step, with `ranks` flex ranks (1: no
/// `[distributed]`). Returns the policy's parameters before and after the step, the step's
/// reward std and whether the response lengths differ.
fn one_step(aggregation: &str, micro: usize, ranks: usize) -> (Vec<f32>, Vec<f32>, f64, bool) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("tests/data/recipes/crash.toml")).unwrap();
    let out = std::env::temp_dir().join(format!(
        "rlft-dp-{aggregation}-{micro}-{ranks}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&out);
    let mut sets: Vec<String> = [
        "schedule.steps=1",
        "sft.steps=30",
        "rollout.max_new_tokens=6",
        "rollout.max_total_tokens=6",
        "reward=[{kind=\"length\", target=3}, {kind=\"regex\", pattern=\"[13579]\", correctness=true}]",
        "rollout.prompts_per_step=3",
        "rollout.group_size=4",
        "algorithm.ppo_epochs=1",
        "algorithm.mini_batches=1",
        "algorithm.entropy_coef=0.01",
        "checkpoint.every=0",
        "eval.every=0",
    ]
    .map(String::from)
    .to_vec();
    sets.push(format!("algorithm.aggregation=\"{aggregation}\""));
    sets.push(format!("algorithm.micro_batch_size={micro}"));
    sets.push(format!("output_dir=\"{}\"", out.display()));
    if ranks > 1 {
        let devices = vec!["\"flex\""; ranks].join(", ");
        sets.push(format!("distributed.devices=[{devices}]"));
    }
    let recipe = Recipe::from_toml_str(&text, &sets).unwrap();
    let mut trainer = Trainer::new(recipe, None).unwrap();
    let before = parameters(trainer.policy());
    let summary = trainer
        .run(None)
        .unwrap_or_else(|e| panic!("{ranks} ranks: {e}"));
    assert_eq!(summary.steps, 1);
    let after = parameters(trainer.policy());
    let metrics = read_metrics(&out.join("metrics.jsonl")).unwrap();
    let last = |key: &str| {
        metrics
            .iter()
            .rev()
            .find_map(|m| m.get(key).and_then(|v| v.as_f64()))
            .unwrap_or(f64::NAN)
    };
    let lengths_differ = last("response_len/mean") < last("response_len/max");
    std::fs::remove_dir_all(&out).ok();
    (before, after, last("reward/std"), lengths_differ)
}

/// Micro-batches of 2 rows line up with every rank's shard; micro-batches of 4 do not with 2
/// ranks (6 rows each: 4 + 2), so the rows are packed into other passes there.
#[test]
fn ranks_take_the_step_of_one_rank_with_every_row() {
    for micro in [2, 4] {
        for aggregation in [
            "token-mean",
            "token-sum",
            "seq-mean-token-sum",
            "seq-mean-token-mean",
            "seq-mean-token-sum-norm",
        ] {
            let (before, one, reward_std, lengths_differ) = one_step(aggregation, micro, 1);
            assert!(
                reward_std > 0.0 && lengths_differ,
                "the rows must differ for the test to mean anything"
            );
            let moved = before
                .iter()
                .zip(&one)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(moved > 1e-5, "{aggregation}: the step moved nothing");
            for ranks in [2, 3] {
                let (start, many, _, _) = one_step(aggregation, micro, ranks);
                assert_eq!(start, before, "same initial weights");
                let diff = one
                    .iter()
                    .zip(&many)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0f32, f32::max);
                println!(
                    "{aggregation}, micro-batches of {micro}: {ranks} ranks, max |Δθ| vs 1 rank \
                     {diff:.2e} (the run moved weights by up to {moved:.2e})"
                );
                assert!(diff <= 1e-5, "{aggregation}, {ranks} ranks: {diff}");
            }
        }
    }
}

/// A `device` other than the first rank's is refused, naming both keys.
#[test]
fn device_must_be_the_first_rank() {
    let err = Recipe::from_toml_str(
        "device = \"ndarray\"\n[distributed]\ndevices = [\"flex\", \"flex\"]\n",
        &[],
    )
    .and_then(|r| r.validate().map(|_| r))
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("distributed.devices") && err.contains("device"),
        "{err}"
    );
    let err = Recipe::from_toml_str("[distributed]\ndevices = [\"flex\", \"tpu\"]\n", &[])
        .and_then(|r| r.validate().map(|_| r))
        .unwrap_err()
        .to_string();
    assert!(err.contains("tpu"), "{err}");
}
