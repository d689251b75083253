//! The models of a run ([`Models`]): the policy (from an HF checkpoint or GGUF file, or new
//! from `[model.scratch]`; with LoRA adapters and the compute type of `model.dtype`), the
//! frozen reference on its device, and the critic.

use crate::recipe::Recipe;
use crate::{Result, TrainError};
use burn::tensor::{DType, Device};
use rlft_model::{
    LoraConfig, MoeConfig, Pretrained, Tokenizer, Transformer, TransformerConfig, ValueModel,
};
use std::path::Path;

/// The frozen reference policy and the device it lives on (`model.reference_device`, default
/// the learner's plain device).
pub(crate) struct Reference {
    pub(crate) model: Transformer,
    pub(crate) device: Device,
}

/// The models of a run.
pub(crate) struct Models {
    /// The policy (on the autodiff device); `None` only while an optimizer step holds it, so
    /// that its parameters are updated in place ([`Models::take_policy`]).
    pub(crate) policy: Option<Transformer>,
    /// The critic (PPO with GAE).
    pub(crate) critic: Option<ValueModel>,
    /// The frozen reference (with a KL term).
    pub(crate) reference: Option<Reference>,
    /// The policy's architecture.
    pub(crate) config: TransformerConfig,
}

impl Models {
    /// The policy `recipe` starts from, on `device`, with its tokenizer and architecture: the
    /// model file, or a new `[model.scratch]` model seeded by `seed`; in `model.dtype`'s
    /// compute type, with LoRA adapters when `[model.lora]` asks for them. A checkpoint's
    /// policy weights load into it.
    ///
    /// # Errors
    /// A model file that does not load; LoRA settings the model does not have.
    pub(crate) fn load_policy(
        recipe: &Recipe,
        device: &Device,
    ) -> Result<(Transformer, Tokenizer, TransformerConfig)> {
        let (policy, tokenizer, config) = if recipe.model.path.is_empty() {
            let tokenizer = Tokenizer::byte_level();
            let s = &recipe.model.scratch;
            let config = TransformerConfig::new(
                tokenizer.vocab_size(),
                s.hidden_size,
                s.intermediate_size,
                s.layers,
                s.heads,
                s.kv_heads,
                s.hidden_size / s.heads,
            )
            .with_tie_word_embeddings(true)
            .with_max_position_embeddings(1024);
            let config = if s.experts > 0 {
                config
                    .with_family(&rlft_model::families::Qwen3Moe)
                    .with_qk_norm(true)
                    .with_moe(Some(
                        MoeConfig::new(s.experts, s.experts_per_token, s.intermediate_size)
                            .with_norm_topk_prob(true),
                    ))
            } else {
                config
            };
            (config.init_seeded(device, recipe.seed), tokenizer, config)
        } else {
            let p = Pretrained::load(Path::new(&recipe.model.path), device, DType::F32)?;
            (p.model, p.tokenizer, p.config)
        };
        if recipe.algorithm.router_replay && !policy.is_moe() {
            return Err(TrainError::Recipe(format!(
                "algorithm.router_replay = true needs a mixture-of-experts model, and {} has no \
                 experts; set it to false, or give a Qwen3-MoE / Mixtral model (or \
                 model.scratch.experts > 0)",
                model_name(recipe)
            )));
        }
        if recipe.algorithm.moe_aux_coef > 0.0 && !policy.is_moe() {
            return Err(TrainError::Recipe(format!(
                "algorithm.moe_aux_coef = {} weighs the experts' load-balancing loss, and {} has \
                 no experts; set it to 0, or give a Qwen3-MoE / Mixtral model (or \
                 model.scratch.experts > 0)",
                recipe.algorithm.moe_aux_coef,
                model_name(recipe)
            )));
        }
        let policy = policy.with_compute_dtype(recipe.model.dtype.float_dtype());
        let policy = if recipe.model.lora.rank > 0 {
            let l = &recipe.model.lora;
            policy.with_lora(
                &LoraConfig::new(l.rank, l.alpha).with_target_modules(l.target_modules.clone()),
            )?
        } else {
            policy
        };
        Ok((policy, tokenizer, config))
    }

    /// The models `recipe` describes, on `device` (autodiff) and `plain` (its frozen twin),
    /// with the tokenizer; `ranks` are the learner's other devices, checked for the compute
    /// type like every device of the run.
    ///
    /// # Errors
    /// A model file that does not load, a device without `model.dtype`'s arithmetic, LoRA
    /// settings the model does not have.
    pub(crate) fn build(
        recipe: &Recipe,
        (device, plain): (&Device, &Device),
        ranks: &[Device],
    ) -> Result<(Self, Tokenizer)> {
        // Half-precision passes where every device of the run has them.
        let dtype = recipe.model.dtype;
        let devices = &recipe.distributed.devices;
        dtype.check(
            plain,
            "device",
            recipe.distributed.run_device(recipe.device),
        )?;
        for (d, &spec) in ranks.iter().zip(devices.iter().skip(1)) {
            dtype.check(d, "distributed.devices entry", spec)?;
        }
        if let Some(spec) = recipe.rollout.device {
            dtype.check(&spec.device()?, "rollout.device", spec)?;
        }
        let (mut models, tokenizer) = Self::trained(recipe, device)?;
        if recipe.algorithm.kl_coef > 0.0 {
            let device = match recipe.model.reference_device {
                Some(d) => d.device()?,
                None => plain.clone(),
            };
            if let Some(spec) = recipe.model.reference_device {
                dtype.check(&device, "model.reference_device", spec)?;
            }
            // Frozen: stored in the compute type.
            models.reference = Some(Reference {
                model: models
                    .policy()
                    .reference_copy(&device)
                    .cast_to_compute_dtype(),
                device,
            });
        }
        Ok((models, tokenizer))
    }

    /// The models a learner rank trains, on the autodiff `device`: the policy
    /// ([`Models::load_policy`]) and the critic, without the reference. What a process rank
    /// past the first holds ([`crate::follower::Follower`]).
    ///
    /// # Errors
    /// A model file that does not load.
    pub(crate) fn trained(recipe: &Recipe, device: &Device) -> Result<(Self, Tokenizer)> {
        let (policy, tokenizer, config) = Self::load_policy(recipe, device)?;
        let critic = recipe
            .model
            .critic
            .then(|| ValueModel::from_trunk(policy.clone(), device));
        let models = Models {
            policy: Some(policy),
            critic,
            reference: None,
            config,
        };
        Ok((models, tokenizer))
    }

    /// The policy (on the autodiff device).
    pub(crate) fn policy(&self) -> &Transformer {
        self.policy
            .as_ref()
            .expect("the policy is only moved out during an optimizer step")
    }

    /// Moves the policy out for an optimizer step, which puts the result back: while nothing
    /// else holds its parameters, [`crate::optim::FusedAdamW`] updates them where they lie.
    pub(crate) fn take_policy(&mut self) -> Transformer {
        self.policy
            .take()
            .expect("the policy is only moved out during an optimizer step")
    }
}

/// How errors name the recipe's model: its `model.path`, or the `[model.scratch]` model.
fn model_name(recipe: &Recipe) -> String {
    if recipe.model.path.is_empty() {
        "the [model.scratch] model".to_string()
    } else {
        format!("model.path {:?}", recipe.model.path)
    }
}
