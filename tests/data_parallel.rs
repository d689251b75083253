//! The data-parallel learner (`[distributed] devices`): N ranks with B/N rows each take the same
//! optimiser step as one rank with all B rows, for every loss aggregation (N ranks on flex).

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::Tensor;
use rlft::train::metrics::{StepMetrics, read_metrics};
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

/// One run's policy parameters before and after, and its last metrics line.
struct Run {
    before: Vec<f32>,
    after: Vec<f32>,
    metrics: StepMetrics,
}

impl Run {
    fn metric(&self, key: &str) -> f64 {
        self.metrics
            .get(key)
            .and_then(|v| v.as_f64())
            .unwrap_or_else(|| panic!("{key} missing"))
    }
}

/// Largest |a − b|.
fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max)
}

/// The crash test's recipe (warm-up, GRPO with a reference KL and an entropy bonus), 3 prompts
/// × 4 completions = 12 rows of different lengths and rewards (a length penalty and a regex
/// term), one optimiser step, with `sets` and one learner rank per entry of `devices` (none:
/// no `[distributed]`).
fn one_step(sets: &[String], devices: &[&str]) -> Run {
    let (text, out) = crash_recipe();
    let mut all: Vec<String> = [
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
        // Adam's first step moves a weight by lr·g/(|g| + ε): with the default ε = 1e-8 a
        // parameter whose gradient is near zero turns a last-bit difference in the summed
        // gradient (ranks add their shards in another order) into a visible weight difference.
        // A larger ε keeps the comparison about the gradients.
        "optimizer.eps=1e-4",
    ]
    .map(String::from)
    .to_vec();
    all.extend_from_slice(sets);
    all.push(format!("output_dir=\"{}\"", out.display()));
    if !devices.is_empty() {
        let list: Vec<String> = devices.iter().map(|d| format!("\"{d}\"")).collect();
        all.push(format!("distributed.devices=[{}]", list.join(", ")));
    }
    let recipe = Recipe::from_toml_str(&text, &all).unwrap();
    let mut trainer = Trainer::new(recipe, None).unwrap();
    let before = parameters(trainer.policy());
    let summary = trainer
        .run(None)
        .unwrap_or_else(|e| panic!("{devices:?}: {e}"));
    assert_eq!(summary.steps, 1);
    let after = parameters(trainer.policy());
    let metrics = read_metrics(&out.join("metrics.jsonl"))
        .unwrap()
        .pop()
        .expect("a metrics line");
    std::fs::remove_dir_all(&out).ok();
    Run {
        before,
        after,
        metrics,
    }
}

static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The crash test's recipe text and a fresh output folder for a run of it.
fn crash_recipe() -> (String, std::path::PathBuf) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("tests/data/recipes/crash.toml")).unwrap();
    let out = std::env::temp_dir().join(format!(
        "rlft-dp-{}-{}",
        std::process::id(),
        RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&out);
    (text, out)
}

/// The runs compared here share the CPU's thread pool: one at a time, so that no other test's
/// work changes how their parallel reductions split.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Micro-batches of 2 rows line up with every rank's shard; micro-batches of 4 do not with 2
/// ranks (6 rows each: 4 + 2), so the rows are packed into other passes there.
#[test]
fn ranks_take_the_step_of_one_rank_with_every_row() {
    let _serial = serial();
    for micro in [2, 4] {
        for aggregation in [
            "token-mean",
            "token-sum",
            "seq-mean-token-sum",
            "seq-mean-token-mean",
            "seq-mean-token-sum-norm",
        ] {
            let sets = [
                format!("algorithm.aggregation=\"{aggregation}\""),
                format!("algorithm.micro_batch_size={micro}"),
            ];
            let one = one_step(&sets, &[]);
            assert!(
                one.metric("reward/std") > 0.0
                    && one.metric("response_len/mean") < one.metric("response_len/max"),
                "the rows must differ for the test to mean anything"
            );
            let moved = max_diff(&one.before, &one.after);
            assert!(moved > 1e-5, "{aggregation}: the step moved nothing");
            for ranks in [2, 3] {
                let many = one_step(&sets, &vec!["flex"; ranks]);
                assert_eq!(many.before, one.before, "same initial weights");
                let diff = max_diff(&one.after, &many.after);
                println!(
                    "{aggregation}, micro-batches of {micro}: {ranks} ranks, max |Δθ| vs 1 rank \
                     {diff:.2e} (the run moved weights by up to {moved:.2e})"
                );
                assert!(diff <= 1e-5, "{aggregation}, {ranks} ranks: {diff}");
            }
        }
    }
}

/// PPO with a critic (GAE, clipped value loss) on two ranks: the policy's step and the value
/// loss match one rank's; with ndarray compiled in, the second rank is on ndarray (the
/// gradients cross backends through the host) and at most 0.1 % of the weights may differ.
#[test]
fn ranks_with_a_critic_and_on_another_backend() {
    let _serial = serial();
    let sets = [
        "model.critic=true",
        "algorithm.loss=\"ppo\"",
        "algorithm.advantage=\"gae\"",
        "algorithm.micro_batch_size=3",
    ]
    .map(String::from);
    let second = if cfg!(feature = "ndarray") {
        "ndarray"
    } else {
        "flex"
    };
    let one = one_step(&sets, &[]);
    let two = one_step(&sets, &["flex", second]);
    // The two backends' kernels round differently, so a gradient that is zero up to rounding
    // may change sign, and Adam's first step (≈ lr · g / |g|) moves that weight by ±lr either
    // way: a few such weights may differ, every other one must agree.
    let off = one
        .after
        .iter()
        .zip(&two.after)
        .filter(|(a, b)| (*a - *b).abs() > 1e-5)
        .count();
    let (v1, v2) = (one.metric("value_loss"), two.metric("value_loss"));
    println!(
        "critic, ranks flex + {second}: {off} of {} weights differ by more than 1e-5, value loss \
         {v1} vs {v2}",
        one.after.len()
    );
    assert!(max_diff(&one.before, &one.after) > 1e-5);
    assert!(off * 1000 <= one.after.len(), "{off} weights differ");
    assert!((v1 - v2).abs() <= 1e-5 * (1.0 + v1.abs()), "{v1} vs {v2}");
}

/// Ranks on their own threads (`distributed.threads_per_rank`) give the same weights run after
/// run, bit for bit, and the step of one rank with every row.
#[test]
fn ranks_on_their_own_threads_are_reproducible() {
    let _serial = serial();
    let one = one_step(&[], &[]);
    for threads in [1, 2] {
        let sets = [format!("distributed.threads_per_rank={threads}")];
        let a = one_step(&sets, &["flex", "flex"]);
        let b = one_step(&sets, &["flex", "flex"]);
        assert_eq!(a.after, b.after, "{threads} threads per rank: run to run");
        let diff = max_diff(&one.after, &a.after);
        println!("2 ranks × {threads} threads: max |Δθ| vs 1 rank {diff:.2e}");
        assert!(diff <= 1e-5, "{threads} threads per rank: {diff}");
    }
}

/// `distributed.threads_per_rank` without ranks, or of 0, is refused naming the key.
#[test]
fn threads_per_rank_needs_ranks_and_threads() {
    for (text, want) in [
        (
            "[distributed]\nthreads_per_rank = 2\n",
            "two or more distributed.devices",
        ),
        (
            "[distributed]\ndevices = [\"flex\", \"flex\"]\nthreads_per_rank = 0\n",
            "between 1 and 1024",
        ),
    ] {
        let err = Recipe::from_toml_str(text, &[]).unwrap_err().to_string();
        assert!(
            err.contains("distributed.threads_per_rank") && err.contains(want),
            "{err}"
        );
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

/// The crash recipe's run of `steps` steps with `ranks` learner ranks: threads of this process
/// (`shard: None`), or process ranks ([`LocalGroup`]: a thread per rank standing in for a
/// process, as under MPI) with the optimizer state sharded or not. Returns the final weights
/// and the metrics lines without timings.
fn ranks_run(sets: &[&str], ranks: usize, shard: Option<bool>) -> (Vec<f32>, Vec<StepMetrics>) {
    use rlft::train::distributed::group::{LocalGroup, ProcessGroup};
    use rlft::train::{Extensions, follower::Follower};
    use std::sync::Arc;
    let (text, out) = crash_recipe();
    let mut all: Vec<String> = [
        "schedule.steps=2",
        "sft.steps=10",
        "rollout.prompts_per_step=3",
        "rollout.group_size=4",
        "algorithm.ppo_epochs=2",
        "checkpoint.every=1",
        "eval.every=0",
    ]
    .iter()
    .chain(sets)
    .map(|s| s.to_string())
    .collect();
    all.push(format!("output_dir=\"{}\"", out.display()));
    match shard {
        None => all.push(format!(
            "distributed.devices=[{}]",
            vec!["\"flex\""; ranks].join(",")
        )),
        Some(s) => {
            all.push("distributed.backend=\"mpi\"".into());
            all.push(format!("distributed.shard_optimizer={s}"));
        }
    }
    let recipe = Recipe::from_toml_str(&text, &all).unwrap();
    let weights = match shard {
        None => {
            let mut trainer = Trainer::new(recipe, None).unwrap();
            trainer.run(None).unwrap();
            parameters(trainer.policy())
        }
        Some(_) => {
            let mut groups = LocalGroup::new(ranks).into_iter();
            let lead: Arc<dyn ProcessGroup> = Arc::new(groups.next().unwrap());
            // The followers first: in one process the ranks share the device's random number
            // generator, which rank 0's trainer seeds when it is built, as a run of its own does.
            let registry = rlft::algo::loss::LossRegistry::with_builtins();
            let followers: Vec<Follower> = groups
                .map(|g| Follower::new(recipe.clone(), &registry, Arc::new(g)).unwrap())
                .collect();
            let ext = Extensions {
                group: Some(lead),
                ..Extensions::default()
            };
            let mut trainer = Trainer::with_extensions(recipe, None, ext).unwrap();
            std::thread::scope(|s| {
                let running: Vec<_> = followers.into_iter().map(|f| s.spawn(|| f.run())).collect();
                trainer.run(None).unwrap();
                let totals = trainer.stop_ranks().unwrap();
                assert_eq!(totals.optimizer_bytes.len(), ranks);
                for f in running {
                    assert_eq!(f.join().unwrap().unwrap(), 2, "an update per step");
                }
            });
            parameters(trainer.policy())
        }
    };
    let metrics = read_metrics(&out.join("metrics.jsonl"))
        .unwrap()
        .into_iter()
        .map(|mut m| {
            m.retain(|k, _| k != "tokens_per_s" && !k.starts_with("time/"));
            m
        })
        .collect();
    std::fs::remove_dir_all(&out).ok();
    (weights, metrics)
}

/// Process ranks (here threads through [`LocalGroup`], the same code as MPI's ranks) give
/// the weights and metrics of thread ranks bit for bit, with and without the optimizer state
/// sharded, over two steps of two epochs each with a checkpoint after each step (which gathers
/// the sharded state).
#[test]
fn process_ranks_take_the_steps_of_thread_ranks() {
    let _serial = serial();
    for ranks in [2, 3] {
        let threads = ranks_run(&[], ranks, None);
        for shard in [false, true] {
            let procs = ranks_run(&[], ranks, Some(shard));
            assert!(
                threads.0 == procs.0,
                "{ranks} ranks, shard {shard}: other weights"
            );
            assert_eq!(threads.1, procs.1, "{ranks} ranks, shard {shard}");
        }
    }
}

/// PPO with a critic (GAE, value loss) on process ranks: the weights and metrics of thread
/// ranks bit for bit, with and without the optimizer state sharded.
#[test]
fn process_ranks_train_a_critic() {
    let _serial = serial();
    let critic = [
        "model.critic=true",
        "algorithm.loss=\"ppo\"",
        "algorithm.advantage=\"gae\"",
    ];
    let threads = ranks_run(&critic, 2, None);
    assert!(threads.1.iter().any(|m| m.contains_key("value_loss")));
    for shard in [false, true] {
        let procs = ranks_run(&critic, 2, Some(shard));
        assert!(threads.0 == procs.0, "shard {shard}: other weights");
        assert_eq!(threads.1, procs.1, "shard {shard}");
    }
}
