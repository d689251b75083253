//! A discrete-event simulation of sync and async training, with every parameter taken from
//! measured runs ([`Costs::from_runs`]): seconds per generated and per trained token (from
//! `events.jsonl`), scoring and publishing time, the batch size and a response-length
//! distribution (log-normal, its spread fitted to the measured mean and longest response of
//! each step, cut at the longest seen).
//!
//! The model ([`simulate`]): `devices` rollout devices take the sequences of batch `n` in order,
//! each the earliest free device (requests streamed, as AReaL's rollout servers do), a device
//! spending `gen_s_per_token × length` on a sequence; batch `n` may start only once the learner
//! has published version `n − 1 − η` (η = 0 is the sync schedule: generate, then learn); the
//! learner trains the batches in order, `train_s_per_token` per token. When the two sides share
//! one machine's cores each runs at its own share's measured speed (`shared_*`), while the sync
//! baseline gives each phase all the cores. Costs stay this machine's: projecting to more
//! devices keeps the measured ratio of generation to training cost.

use crate::events::{EventKind, read_events};
use crate::metrics::read_metrics;
use crate::recipe::Recipe;
use crate::{Result, TrainError};
use std::path::Path;

/// A log-normal response length with a given mean, cut at `max`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Lengths {
    /// Mean length (tokens).
    pub mean: f64,
    /// σ of the log-length.
    pub sigma: f64,
    /// Longest length (the cap).
    pub max: f64,
}

/// Acklam's rational approximation of the standard normal quantile (relative error < 1.2e-9).
fn normal_quantile(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
    ];
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] = [
        7.784_695_709_041_462e-3,
        3.224_671_290_700_398e-1,
        2.445_134_137_142_996,
        3.754_408_661_907_416,
    ];
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    if p < 0.02425 {
        tail((-2.0 * p.ln()).sqrt())
    } else if p > 1.0 - 0.02425 {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    }
}

impl Lengths {
    /// Fits σ to the measured `(mean, max)` of each step's `batch` lengths: the log of
    /// max/mean is `σ·M − σ²/2`, `M` the expected largest of `batch` standard normals (Blom's
    /// approximation), averaged over the steps and solved for σ.
    pub fn fit(steps: &[(f64, f64)], batch: usize) -> Option<Self> {
        let n = batch.max(1) as f64;
        let z = normal_quantile((n - 0.375) / (n + 0.25));
        let logs: Vec<f64> = steps
            .iter()
            .filter(|(m, x)| *m > 0.0 && x >= m)
            .map(|(m, x)| (x / m).ln())
            .collect();
        if logs.is_empty() {
            return None;
        }
        let l = logs.iter().sum::<f64>() / logs.len() as f64;
        // The smaller root, or z where none is real.
        let d = z * z - 2.0 * l;
        Some(Self {
            mean: steps.iter().map(|s| s.0).sum::<f64>() / steps.len() as f64,
            sigma: if d >= 0.0 { z - d.sqrt() } else { z },
            max: steps.iter().map(|s| s.1).fold(0.0, f64::max),
        })
    }

    /// Length number `i` of the stream seeded `seed` (Box–Muller on a counter hash).
    fn sample(&self, seed: u64, i: u64) -> f64 {
        let u1 = rlft_algo::seed::unit_hash(seed, 2 * i).max(1e-12);
        let u2 = rlft_algo::seed::unit_hash(seed, 2 * i + 1);
        let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        let mu = self.mean.ln() - self.sigma * self.sigma / 2.0;
        (mu + self.sigma * z).exp().clamp(1.0, self.max.max(1.0))
    }
}

/// Measured costs.
#[derive(Debug, Clone, PartialEq)]
pub struct Costs {
    /// Rollout seconds per generated token with all the machine's cores.
    pub gen_s_per_token: f64,
    /// Learner seconds per trained token with all the machine's cores.
    pub train_s_per_token: f64,
    /// Rollout seconds per token on the rollout side's share of a shared machine.
    pub shared_gen_s_per_token: f64,
    /// Learner seconds per token on the learner's share of a shared machine.
    pub shared_train_s_per_token: f64,
    /// Scoring seconds per batch.
    pub score_s: f64,
    /// Publishing seconds per update.
    pub publish_s: f64,
    /// Sequences per batch.
    pub batch_seqs: usize,
    /// Response lengths.
    pub lengths: Lengths,
}

/// `(seconds per token of generate, of learn, mean score seconds, mean publish seconds)` of a
/// run's events.
fn event_costs(run: &Path) -> Result<(f64, f64, f64, f64)> {
    let events = read_events(run)?;
    let sum = |kind: EventKind| {
        events
            .iter()
            .filter(|e| e.kind == kind)
            .fold((0.0, 0usize, 0usize), |(s, t, n), e| {
                (s + e.end_s - e.start_s, t + e.tokens, n + 1)
            })
    };
    let (gen_s, gen_tok, _) = sum(EventKind::Generate);
    let (learn_s, learn_tok, _) = sum(EventKind::Learn);
    let (score_s, _, scores) = sum(EventKind::Score);
    let (pub_s, _, pubs) = sum(EventKind::Publish);
    if gen_tok == 0 || learn_tok == 0 {
        return Err(TrainError::Usage(format!(
            "{}: events.jsonl has no generate or learn intervals with tokens; give a run folder \
             of rlft 0.1 or later that took at least one step",
            run.display()
        )));
    }
    Ok((
        gen_s / gen_tok as f64,
        learn_s / learn_tok as f64,
        score_s / scores.max(1) as f64,
        pub_s / pubs.max(1) as f64,
    ))
}

impl Costs {
    /// From a sync run (each phase on all cores) and, when the sides of an async run share the
    /// machine, a run that gave each side its share (an async η = 0 run with `rollout_threads`
    /// and `learner_threads`: it alternates like sync, on the shares' speed). Without `shared`
    /// a side on a shared machine is taken to run at half speed (perfect scaling on 2 shares).
    pub fn from_runs(sync: &Path, shared: Option<&Path>) -> Result<Self> {
        let (gen_s, train, score_s, publish_s) = event_costs(sync)?;
        let (shared_gen, shared_train) = match shared {
            Some(p) => {
                let (g, t, _, _) = event_costs(p)?;
                (g, t)
            }
            None => (2.0 * gen_s, 2.0 * train),
        };
        let recipe = Recipe::from_stored(
            &std::fs::read_to_string(sync.join("recipe.toml")).map_err(crate::io_err(sync))?,
        )?;
        let batch = recipe.rollout.prompts_per_step * recipe.rollout.group_size;
        let steps: Vec<(f64, f64)> = read_metrics(&sync.join("metrics.jsonl"))?
            .iter()
            .filter_map(|m| {
                Some((
                    m.get("response_len/mean")?.as_f64()?,
                    m.get("response_len/max")?.as_f64()?,
                ))
            })
            .collect();
        let lengths = Lengths::fit(&steps, batch).ok_or_else(|| {
            TrainError::Usage(format!(
                "{}: metrics.jsonl has no response_len/mean and /max",
                sync.display()
            ))
        })?;
        Ok(Self {
            gen_s_per_token: gen_s,
            train_s_per_token: train,
            shared_gen_s_per_token: shared_gen,
            shared_train_s_per_token: shared_train,
            score_s,
            publish_s,
            batch_seqs: batch,
            lengths,
        })
    }
}

/// What a simulated run gives.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimOutcome {
    /// Seconds per step in the steady state (the first quarter of the steps left out).
    pub step_s: f64,
    /// Fraction of the time the learner waits for batches.
    pub learner_idle: f64,
    /// Fraction of the rollout devices' time spent waiting.
    pub rollout_idle: f64,
}

/// Simulates `steps` steps with `devices` rollout devices and staleness bound `eta` (0: sync);
/// `shared`: the rollout side and the learner share one machine's cores.
pub fn simulate(
    costs: &Costs,
    devices: usize,
    eta: usize,
    shared: bool,
    steps: usize,
    seed: u64,
) -> SimOutcome {
    let (g, t) = if shared {
        (costs.shared_gen_s_per_token, costs.shared_train_s_per_token)
    } else {
        (costs.gen_s_per_token, costs.train_s_per_token)
    };
    let devices = devices.max(1);
    let steps = steps.max(4);
    let mut free = vec![0.0f64; devices];
    let mut published = vec![0.0f64; steps + 1];
    let (mut learner_free, mut learner_wait, mut busy) = (0.0f64, 0.0f64, 0.0f64);
    let mut k = 0u64;
    for n in 1..=steps {
        // Batch n needs version n − 1 − η.
        let admit = n.checked_sub(1 + eta).map_or(0.0, |v| published[v]);
        let mut done = admit;
        let mut tokens = 0.0;
        for _ in 0..costs.batch_seqs {
            let len = costs.lengths.sample(seed, k);
            k += 1;
            tokens += len;
            let (d, at) = free
                .iter()
                .copied()
                .enumerate()
                .fold(
                    (0, f64::INFINITY),
                    |a, (i, f)| if f < a.1 { (i, f) } else { a },
                );
            let end = at.max(admit) + g * len;
            free[d] = end;
            busy += g * len;
            done = done.max(end);
        }
        let ready = done + costs.score_s;
        let start = learner_free.max(ready);
        learner_wait += start - learner_free;
        learner_free = start + t * tokens + costs.publish_s;
        published[n] = learner_free;
    }
    let skip = steps / 4;
    let total = learner_free;
    SimOutcome {
        step_s: (published[steps] - published[skip]) / (steps - skip) as f64,
        learner_idle: learner_wait / total,
        rollout_idle: 1.0 - busy / (devices as f64 * total),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn costs(gen_s: f64, train: f64) -> Costs {
        Costs {
            gen_s_per_token: gen_s,
            train_s_per_token: train,
            shared_gen_s_per_token: 2.0 * gen_s,
            shared_train_s_per_token: 2.0 * train,
            score_s: 0.0,
            publish_s: 0.0,
            batch_seqs: 8,
            lengths: Lengths {
                mean: 10.0,
                sigma: 0.0,
                max: 10.0,
            },
        }
    }

    #[test]
    fn quantile_and_fit() {
        assert!(normal_quantile(0.5).abs() < 1e-9);
        assert!((normal_quantile(0.975) - 1.959_964).abs() < 1e-5);
        assert!((normal_quantile(0.01) + 2.326_348).abs() < 1e-5);
        // Steps drawn with σ = 0.8 fit back near 0.8.
        let l = Lengths {
            mean: 100.0,
            sigma: 0.8,
            max: 1e9,
        };
        let steps: Vec<(f64, f64)> = (0..200)
            .map(|s| {
                let v: Vec<f64> = (0..32).map(|i| l.sample(s, i)).collect();
                (
                    v.iter().sum::<f64>() / 32.0,
                    v.iter().copied().fold(0.0, f64::max),
                )
            })
            .collect();
        let fit = Lengths::fit(&steps, 32).unwrap();
        assert!((fit.sigma - 0.8).abs() < 0.15, "{fit:?}");
    }

    #[test]
    fn sync_adds_and_async_overlaps() {
        let c = costs(1.0, 1.0);
        // Sync on one device: 80 s of generation, then 80 s of training.
        let s = simulate(&c, 1, 0, false, 40, 0);
        assert!((s.step_s - 160.0).abs() < 1e-9, "{s:?}");
        assert!((s.learner_idle - 0.5).abs() < 0.02);
        // η = 1 on separate devices: the two overlap.
        let a = simulate(&c, 1, 1, false, 40, 0);
        assert!((a.step_s - 80.0).abs() < 1e-9, "{a:?}");
        // Sharing the machine at half speed each gives nothing back.
        let shared = simulate(&c, 1, 1, true, 40, 0);
        assert!((shared.step_s - 160.0).abs() < 1e-9, "{shared:?}");
        // More devices shorten generation; then training bounds the step.
        let s8 = simulate(&c, 8, 0, false, 40, 0);
        assert!((s8.step_s - 90.0).abs() < 1e-9, "{s8:?}");
        let a8 = simulate(&c, 8, 2, false, 40, 0);
        assert!((a8.step_s - 80.0).abs() < 1e-9, "{a8:?}");
    }
}
