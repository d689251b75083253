//! The decode loop of [`Sampler`]: one generation's state ([`Decode`]) and its steps — new
//! weights taken between steps, the step's logits (a prefill or decode step on the device, or
//! a decode step on the host), the draw, the rows that finish, the rows that go on.

use super::routing::{Recorded, record_routing, sparse_shape};
use super::{
    Completion, Draw, FinishReason, KvOnUpdate, Row, SampleOn, Sampled, Sampler, SamplingConfig,
    StepLogits, Updated, Updates, WeightUpdate, draw_on_device, draw_on_host, model_err,
    padded_input,
};
use crate::{Result, RolloutError};
use burn::tensor::{Device, Int, Tensor, TensorData};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use rayon::prelude::*;
use rlft_model::{
    DECODE_ROWS, ForwardInput, HostKvCache, HostWeights, KvCache, TokenRouting, Transformer,
};
use std::collections::HashMap;
use std::ops::ControlFlow;

/// One generation under way.
pub(super) struct Decode<'s, 'a> {
    sampler: &'s Sampler<'a>,
    prompts: &'s [Vec<u32>],
    cfg: &'s SamplingConfig,
    device: Device,
    rng: StdRng,
    /// Each prompt's index among the distinct prompts (a repeated prompt is prefilled once).
    source: Vec<usize>,
    /// Some prompt is repeated.
    shared: bool,
    /// The next step's input when it is a prefill (the prompts, or every row's context after
    /// new weights that recompute the cache).
    prompt_input: Option<ForwardInput>,
    /// A mixture of experts: its sparse layers and experts per token, to record the routing.
    moe: Option<(usize, usize)>,
    rows: Vec<Row>,
    done: Vec<Option<Completion>>,
    done_versions: Vec<Vec<u64>>,
    version: u64,
    /// The weights switched to (with their host copies), once an update arrived.
    current: Option<(WeightUpdate, Option<HostWeights>)>,
    /// Weights kept in another type than the model computes in (f32 masters of a bf16 model),
    /// cast once per set of weights, not in every decode step.
    compute: Option<Transformer>,
    /// The first prefill (of the prompts) is still to run.
    initial: bool,
    cache: KvCache,
    /// Decode steps of few rows run on the host once the prompts are prefilled; from then on
    /// this holds the keys and values.
    host_cache: Option<HostKvCache>,
    temperature: f64,
    vocab: usize,
    on_device: bool,
    /// A stochastic draw through top-k / min-p / top-p: μ is renormalised, log S recorded.
    filtered: bool,
}

/// `m` cast to its compute type, when its weights are kept in another.
fn cast(m: &Transformer) -> Option<Transformer> {
    (!m.weights_in_compute_dtype()).then(|| m.clone().cast_to_compute_dtype())
}

impl<'s, 'a> Decode<'s, 'a> {
    /// A generation of one completion per prompt (checked non-empty), starting at `version`.
    pub(super) fn new(
        sampler: &'s Sampler<'a>,
        prompts: &'s [Vec<u32>],
        cfg: &'s SamplingConfig,
        version: u64,
    ) -> Self {
        let device = sampler.model.embed_tokens.weight.device();
        let mut unique: Vec<&Vec<u32>> = Vec::new();
        let mut first: HashMap<&[u32], usize> = HashMap::new();
        let source: Vec<usize> = prompts
            .iter()
            .map(|p| {
                *first.entry(&p[..]).or_insert_with(|| {
                    unique.push(p);
                    unique.len() - 1
                })
            })
            .collect();
        let moe = sparse_shape(sampler.model);
        let rows: Vec<Row> = prompts
            .iter()
            .enumerate()
            .map(|(index, p)| Row {
                index,
                tokens: Vec::new(),
                logprobs: Vec::new(),
                log_kept_mass: Vec::new(),
                kept_ids: Vec::new(),
                versions: Vec::new(),
                routing: moe.map(|(layers, k)| TokenRouting::new(layers, k)),
                position: p.len() as i64,
                text: String::new(),
            })
            .collect();
        Self {
            prompt_input: Some(padded_input(&unique, sampler.pad_id, &device)),
            shared: unique.len() < prompts.len(),
            rng: StdRng::seed_from_u64(cfg.seed),
            source,
            moe,
            rows,
            done: vec![None; prompts.len()],
            done_versions: vec![Vec::new(); prompts.len()],
            version,
            current: None,
            compute: cast(sampler.model),
            initial: true,
            cache: KvCache::new(),
            host_cache: None,
            temperature: if cfg.temperature > 0.0 {
                cfg.temperature
            } else {
                1.0
            },
            vocab: sampler.model.embed_tokens.weight.dims()[0],
            on_device: match cfg.sample_on {
                SampleOn::Host => false,
                SampleOn::Device => true,
                SampleOn::Auto => !rlft_model::decode::host_resident(&device),
            },
            filtered: cfg.draws_filtered(),
            sampler,
            prompts,
            cfg,
            device,
        }
    }

    /// Decodes until every row finished, calling `on_token` as each token is chosen (a `Break`
    /// cancels) and taking new weights from `updates` between steps.
    pub(super) fn run(
        mut self,
        mut on_token: impl FnMut(&Sampled<'_>) -> ControlFlow<()>,
        mut updates: Option<&mut Updates<'_>>,
    ) -> Result<Updated> {
        loop {
            if self.prompt_input.is_none()
                && let Some(u) = updates.as_mut()
                && let Some(w) = (u.poll)()
            {
                self.switch(w, u.kv)?;
            }
            let logits = self.logits()?;
            let picks = self.draw(logits)?;
            let keep = self.record(&picks, &mut on_token)?;
            if keep.is_empty() {
                break;
            }
            self.compact(&keep);
        }
        let mut done: Vec<Completion> = self
            .done
            .into_iter()
            .map(|c| c.expect("every row finishes"))
            .collect();
        if self.cfg.rescore {
            self.sampler
                .rescore(self.prompts, &mut done, self.temperature)?;
        }
        Ok(Updated {
            completions: done,
            versions: self.done_versions,
            latest: self.current.map(|(w, _)| w),
        })
    }

    /// Goes on with the weights `w`: the rows' caches kept, or recomputed for every row's
    /// context by the next step (a prefill whose logits sample the next token).
    fn switch(&mut self, w: WeightUpdate, kv: KvOnUpdate) -> Result<()> {
        let host = if HostWeights::suits_model(&w.model) {
            Some(HostWeights::new(&w.model).map_err(model_err)?)
        } else {
            None
        };
        self.version = w.version;
        if kv == KvOnUpdate::Recompute {
            let ctx: Vec<Vec<u32>> = self
                .rows
                .iter()
                .map(|r| [&self.prompts[r.index][..], &r.tokens[..]].concat())
                .collect();
            self.prompt_input = Some(padded_input(&ctx, self.sampler.pad_id, &self.device));
            self.cache = KvCache::new();
            self.host_cache = None;
        }
        self.compute = cast(&w.model);
        self.current = Some((w, host));
        Ok(())
    }

    /// This step's logits of each row's last position: a decode step of few rows on the host
    /// (CPU devices), else a prefill or decode step on the device.
    fn logits(&mut self) -> Result<StepLogits> {
        let n = self.rows.len();
        let prefill = self.prompt_input.is_some();
        let host = if prefill || n > DECODE_ROWS || self.on_device {
            None
        } else {
            match &self.current {
                Some((_, h)) => h.as_ref(),
                None => self.sampler.host_weights()?,
            }
        };
        let Some(w) = host else {
            return self.device_logits();
        };
        let hc = match self.host_cache.as_mut() {
            Some(hc) => hc,
            None => self
                .host_cache
                .insert(self.cache.to_host().map_err(model_err)?),
        };
        let tokens: Vec<u32> = self.rows.iter().map(Row::last_token).collect();
        let pos: Vec<usize> = self
            .rows
            .iter()
            .map(|r| r.next_position() as usize)
            .collect();
        Ok(StepLogits::Host(
            w.decode_step(hc, &tokens, &pos).map_err(model_err)?,
        ))
    }

    /// A prefill or decode step on the device, the routing recorded for a mixture of experts;
    /// a repeated prompt's cache and logits copied to every row that shares it.
    fn device_logits(&mut self) -> Result<StepLogits> {
        let model = self.compute.as_ref().unwrap_or_else(|| {
            self.current
                .as_ref()
                .map_or(self.sampler.model, |(w, _)| &w.model)
        });
        let (n, device) = (self.rows.len(), &self.device);
        let prefill = self.prompt_input.is_some();
        let int2 = |v: Vec<i64>, r: usize, c: usize| {
            Tensor::<2, Int>::from_data(TensorData::new(v, [r, c]), device)
        };
        let rows = &mut self.rows;
        let input = self.prompt_input.take().unwrap_or_else(|| ForwardInput {
            input_ids: int2(rows.iter().map(|r| r.last_token() as i64).collect(), n, 1),
            position_ids: int2(rows.iter().map(Row::next_position).collect(), n, 1),
            // The cache remembers the prompt's padding; new tokens are all real.
            attention_mask: None,
            segment_ids: None,
            prefix_ids: None,
        });
        let width = input.input_ids.dims()[1];
        let mut logits = if self.moe.is_some() {
            let (logits, routing) = model.forward_cached_last_routed(&input, &mut self.cache);
            let recorded = match (prefill, self.initial) {
                (false, _) => Recorded::Step,
                (true, true) => Recorded::Prompts(&self.source, self.prompts),
                (true, false) => Recorded::Contexts(self.prompts),
            };
            record_routing(rows, &routing, width, recorded);
            logits
        } else {
            model.forward_cached_last(&input, &mut self.cache)
        };
        if prefill && self.initial && self.shared {
            self.cache.select_rows(&self.source);
            let rows: Vec<i64> = self.source.iter().map(|&u| u as i64).collect();
            let rows =
                Tensor::<1, Int>::from_data(TensorData::new(rows, [self.source.len()]), device);
            logits = logits.select(0, rows);
        }
        self.initial = false;
        // Both passes give the logits of each row's last position only.
        let [n, _, v] = logits.dims();
        let last = logits.reshape([n, v]);
        if self.on_device {
            return Ok(StepLogits::Device(Box::new(last)));
        }
        Ok(StepLogits::Host(
            last.into_data()
                .convert::<f32>()
                .try_into_vec::<f32>()
                .map_err(|e| RolloutError::Input(format!("logits to host: {e:?}")))?,
        ))
    }

    /// Each row's token drawn from `logits` at the temperature, where the logits are.
    fn draw(&mut self, logits: StepLogits) -> Result<Vec<Draw>> {
        let (cfg, temperature) = (self.cfg, self.temperature);
        // Uniform variates in row order (reproducible, the same for either path).
        let draws: Vec<Option<f64>> = (0..self.rows.len())
            .map(|_| (cfg.temperature != 0.0).then(|| self.rng.random::<f64>()))
            .collect();
        let inv = (1.0 / temperature) as f32;
        Ok(match logits {
            StepLogits::Host(mut logits) => {
                if temperature != 1.0 {
                    logits.par_iter_mut().for_each(|x| *x *= inv);
                }
                draw_on_host(&logits, self.vocab, cfg, &draws)
            }
            StepLogits::Device(logits) => {
                let logits = *logits;
                let logits = if temperature != 1.0 {
                    logits.mul_scalar(inv)
                } else {
                    logits
                };
                draw_on_device(logits, cfg, &draws)?
            }
        })
    }

    /// Appends each row's pick and finishes the rows that ended (EOS, a stop token or string,
    /// the length limit); returns the indices of the rows that go on.
    ///
    /// # Errors
    /// A non-finite `log μ` (the logits held a NaN or an infinity), naming the row; a `Break`
    /// from `on_token`.
    fn record(
        &mut self,
        picks: &[Draw],
        on_token: &mut impl FnMut(&Sampled<'_>) -> ControlFlow<()>,
    ) -> Result<Vec<usize>> {
        let cfg = self.cfg;
        let mut keep = Vec::with_capacity(self.rows.len());
        for (r, row) in self.rows.iter_mut().enumerate() {
            let draw = &picks[r];
            let Draw {
                token,
                logprob,
                log_kept_mass,
                ref kept_ids,
            } = *draw;
            if !logprob.is_finite() {
                return Err(RolloutError::NonFiniteLogits {
                    row: row.index,
                    position: row.tokens.len(),
                    version: self.version,
                });
            }
            debug_assert!(token < self.vocab);
            row.tokens.push(token as u32);
            row.logprobs.push(logprob);
            if self.filtered {
                row.log_kept_mass.push(log_kept_mass as f32);
                if cfg.kept_ids_max > 0 {
                    row.kept_ids.push(kept_ids.clone());
                }
            }
            row.versions.push(self.version);
            let token = token as u32;
            let finish = if !cfg.ignore_eos && self.sampler.eos_ids.contains(&token) {
                Some(FinishReason::Eos)
            } else if cfg.stop_token_ids.contains(&token)
                || self.sampler.hits_stop_string(row, cfg)?
            {
                Some(FinishReason::Stop)
            } else if row.tokens.len() >= cfg.max_new_tokens {
                Some(FinishReason::Length)
            } else {
                None
            };
            let sampled = Sampled {
                row: row.index,
                draw,
                version: self.version,
                finish,
            };
            if on_token(&sampled).is_break() {
                return Err(RolloutError::Cancelled);
            }
            match finish {
                Some(finish_reason) => {
                    self.done_versions[row.index] = std::mem::take(&mut row.versions);
                    self.done[row.index] = Some(Completion {
                        tokens: std::mem::take(&mut row.tokens),
                        logprobs: std::mem::take(&mut row.logprobs),
                        log_kept_mass: std::mem::take(&mut row.log_kept_mass),
                        kept_ids: std::mem::take(&mut row.kept_ids),
                        finish_reason,
                        routing: row.routing.take(),
                    });
                }
                None => keep.push(r),
            }
        }
        Ok(keep)
    }

    /// Drops the finished rows from the batch and from the KV cache.
    fn compact(&mut self, keep: &[usize]) {
        if keep.len() == self.rows.len() {
            return;
        }
        match self.host_cache.as_mut() {
            Some(hc) => hc.select_rows(keep),
            None => self.cache.select_rows(keep),
        }
        self.rows = std::mem::take(&mut self.rows)
            .into_iter()
            .enumerate()
            .filter(|(r, _)| keep.binary_search(r).is_ok())
            .map(|(_, row)| row)
            .collect();
    }
}
