//! Where a rollout's sampler calls run ([`Generator`]): in this process ([`InProcess`]: the
//! sampler on a model, optionally taking newer weights between decode steps) or anywhere else
//! that answers a call with the same completions — an inference server reached over HTTP.
//!
//! The rollout engine ([`crate::rollout_with`]) makes the same calls whichever generator it is
//! given — the same rows in the same order, the same settings and seed — so a generator that
//! computes a call as the sampler does yields the same batch.

use crate::Result;
use crate::sampler::{Completion, Sampler, SamplingConfig, Updates, WeightUpdate};
use rlft_model::{Tokenizer, Transformer};

/// What one sampler call returned.
#[derive(Debug, Clone, PartialEq)]
pub struct Generated {
    /// One completion per row, in the call's order.
    pub completions: Vec<Completion>,
    /// Per completion, the weight version that sampled each of its tokens.
    pub versions: Vec<Vec<u64>>,
}

/// Computes a rollout's sampler calls.
pub trait Generator {
    /// Samples `prompts` with `cfg` as one call of [`Sampler::generate`]; `groups[i]` is the
    /// index in the batch of the group row `i` belongs to (for the generator's records).
    ///
    /// # Errors
    /// A bad prompt or setting, a model error, or a generator that could not answer.
    fn generate(
        &mut self,
        prompts: &[Vec<u32>],
        groups: &[usize],
        cfg: &SamplingConfig,
    ) -> Result<Generated>;

    /// The newest weight version it has sampled with: the version given to tokens appended
    /// between model turns (tool observations).
    fn version(&self) -> u64;
}

/// The sampler on a model in this process; with [`Updates`], newer weights reach the
/// generation between decode steps and later calls go on with the newest.
pub struct InProcess<'a, 'u> {
    model: &'a Transformer,
    tokenizer: &'a Tokenizer,
    version: u64,
    updates: Option<&'a mut Updates<'u>>,
    /// The newest weights an update brought.
    latest: Option<WeightUpdate>,
}

impl<'a, 'u> InProcess<'a, 'u> {
    /// Samples with `model` (weight `version`), taking updates from `updates` if given.
    pub fn new(
        model: &'a Transformer,
        tokenizer: &'a Tokenizer,
        version: u64,
        updates: Option<&'a mut Updates<'u>>,
    ) -> Self {
        Self {
            model,
            tokenizer,
            version,
            updates,
            latest: None,
        }
    }
}

impl Generator for InProcess<'_, '_> {
    fn generate(
        &mut self,
        prompts: &[Vec<u32>],
        _groups: &[usize],
        cfg: &SamplingConfig,
    ) -> Result<Generated> {
        let model = self.latest.as_ref().map_or(self.model, |w| &w.model);
        let sampler = Sampler::new(model, Some(self.tokenizer));
        match self.updates.as_deref_mut() {
            Some(u) => {
                u.version = self.version;
                let r = sampler.generate_updating(prompts, cfg, u)?;
                if let Some(w) = r.latest {
                    self.version = w.version;
                    self.latest = Some(w);
                }
                Ok(Generated {
                    completions: r.completions,
                    versions: r.versions,
                })
            }
            None => {
                let completions = sampler.generate(prompts, cfg)?;
                let versions = completions
                    .iter()
                    .map(|c| vec![self.version; c.tokens.len()])
                    .collect();
                Ok(Generated {
                    completions,
                    versions,
                })
            }
        }
    }

    fn version(&self) -> u64 {
        self.version
    }
}
