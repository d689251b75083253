//! Name → loss registry, with algorithm presets (`grpo`, `dr_grpo`, `dapo`, ...).

use super::settings::{Builder, Configurable};
use super::{
    Cispo, ClipCov, ClippedSurrogate, Dppo, DppoDivergence, Dro, GeoMean, Gpg, KlCov, LossSettings,
    PolicyLoss, PolicyLossConfig, PolicyLossInput, PolicyLossOutput, PrimeMask, PrimeRl, Reinforce,
    ReinforceIs, Sapo, SettingError, Topr, Vespo,
};
use crate::advantage::AdvantageEstimator;
use crate::aggregation::LossAggregation;
use crate::clip::ClipRange;
use crate::ratio::RatioLevel;
use crate::{AlgoError, Result};
use std::collections::BTreeMap;
use std::sync::Arc;

/// A named algorithm: which registered loss it runs, with which settings and advantage
/// estimator. Settings given explicitly (e.g. from a recipe) override the preset's.
#[derive(Debug, Clone)]
pub struct Preset {
    /// The name the preset is looked up by.
    pub name: String,
    /// The registered loss it runs.
    pub loss: String,
    /// Its settings.
    pub config: PolicyLossConfig,
    /// Its advantage estimator.
    pub advantage: AdvantageEstimator,
    /// The preset relies on `clip_ratio_high ≥ clip_ratio_low` (Clip-Higher).
    pub require_clip_higher: bool,
}

impl Preset {
    /// A preset that runs `loss` with default settings and GRPO advantages.
    pub fn new(name: impl Into<String>, loss: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            loss: loss.into(),
            config: PolicyLossConfig::new(),
            advantage: AdvantageEstimator::grpo(),
            require_clip_higher: false,
        }
    }

    fn with(mut self, f: impl FnOnce(PolicyLossConfig) -> PolicyLossConfig) -> Self {
        self.config = f(self.config);
        self
    }

    fn with_advantage(mut self, a: AdvantageEstimator) -> Self {
        self.advantage = a;
        self
    }

    /// Checks `config` (the preset's, after any overrides) against the preset's requirements.
    pub fn validate(&self, config: &PolicyLossConfig) -> Result<()> {
        config.validate()?;
        ClipRange::decoupled(config.clip_ratio_low, config.clip_ratio_high)
            .validate(self.require_clip_higher)
    }
}

/// A registered loss: fixed, or built from its settings.
#[derive(Clone)]
enum Registered {
    /// A loss without settings of its own.
    Fixed(Arc<dyn PolicyLoss>),
    /// A loss built from its `[algorithm.<section>]` settings.
    Configurable(Arc<dyn Configurable>),
}

/// A recipe table of loss settings, as a registry knows it.
#[derive(Debug, Clone)]
pub struct LossSection {
    /// The table's name: `[algorithm.<name>]`.
    pub name: String,
    /// The names (losses and presets) that read it, sorted.
    pub read_by: Vec<String>,
    /// The settings' JSON schema (types, doc comments).
    pub schema: schemars::Schema,
    /// The default settings.
    pub defaults: serde_json::Value,
}

/// Policy losses and presets by name. [`LossRegistry::default`] holds the built-ins; register
/// your own with [`LossRegistry::register`] (a loss without settings) or
/// [`LossRegistry::register_with_settings`] (a loss with its own recipe table) and use them by
/// name like any other.
#[derive(Clone)]
pub struct LossRegistry {
    losses: BTreeMap<String, Registered>,
    presets: BTreeMap<String, Preset>,
}

impl Default for LossRegistry {
    fn default() -> Self {
        Self::with_builtins()
    }
}

impl std::fmt::Debug for LossRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LossRegistry")
            .field("names", &self.names())
            .finish()
    }
}

impl LossRegistry {
    /// A registry with nothing in it.
    pub fn empty() -> Self {
        Self {
            losses: BTreeMap::new(),
            presets: BTreeMap::new(),
        }
    }

    /// The built-in losses (`ppo`, `gspo`, `cispo`, `ctpo`, `geo_mean`, `gpg`, `reinforce`,
    /// `reinforce_is`, `dro`, `sapo`, `clip_cov`, `kl_cov`, `dppo_tv`, `dppo_kl`, `vespo`, `topr`,
    /// `prime_rl`, `prime_rl_ipo`) and presets (`grpo`, `dr_grpo`, `dapo`, `luspo`).
    pub fn with_builtins() -> Self {
        use LossAggregation::*;
        let mut r = Self::empty();
        r.register("ppo", ClippedSurrogate::default());
        r.register(
            "gspo",
            ClippedSurrogate {
                position_adaptive: false,
                no_dual_clip: true,
            },
        );
        r.register(
            "ctpo",
            ClippedSurrogate {
                position_adaptive: true,
                no_dual_clip: false,
            },
        );
        r.register("cispo", Cispo);
        r.register("geo_mean", GeoMean);
        r.register("gpg", Gpg);
        r.register("reinforce", Reinforce);
        r.register("reinforce_is", ReinforceIs);
        r.register_with_settings("dro", |settings| Ok(Dro { settings }));
        r.register_with_settings("sapo", |settings| Ok(Sapo { settings }));
        r.register_with_settings("clip_cov", |settings| Ok(ClipCov { settings }));
        r.register_with_settings("kl_cov", |settings| Ok(KlCov { settings }));
        r.register(
            "dppo_tv",
            Dppo {
                divergence: DppoDivergence::TotalVariation,
            },
        );
        r.register(
            "dppo_kl",
            Dppo {
                divergence: DppoDivergence::BinaryKl,
            },
        );
        r.register_with_settings("vespo", |settings| Ok(Vespo { settings }));
        r.register_with_settings("topr", |settings| Ok(Topr { settings }));
        r.register_with_settings("prime_rl", |s| PrimeRl::new(PrimeMask::Dppo, s));
        r.register_with_settings("prime_rl_ipo", |s| PrimeRl::new(PrimeMask::Ipo, s));
        let presets = [
            // TRL's LUSPO: PPO-clip on the sequence-mean ratio (gradient through the mean),
            // each row's token sum averaged over the rows.
            Preset::new("luspo", "ppo").with(|c| {
                c.with_ratio_level(RatioLevel::SequenceMean)
                    .with_clip_ratio_high(0.28)
                    .with_aggregation(SeqMeanTokenSum)
            }),
            Preset::new("vespo", "vespo"),
            Preset::new("ppo", "ppo").with_advantage(AdvantageEstimator::Gae {
                gamma: 1.0,
                lam: 0.95,
            }),
            // GSPO paper: sequence ratio, ε = 3e-4 / 4e-4.
            Preset::new("gspo", "gspo").with(|c| {
                c.with_ratio_level(RatioLevel::Sequence)
                    .with_clip_ratio_low(3e-4)
                    .with_clip_ratio_high(4e-4)
                    .with_aggregation(SeqMeanTokenMean)
            }),
            Preset::new("ctpo", "ctpo").with(|c| c.with_ratio_level(RatioLevel::Cumulative)),
            Preset::new("cispo", "cispo").with(|c| c.with_clip_ratio_high(0.28)),
            Preset::new("geo_mean", "geo_mean")
                .with(|c| c.with_clip_ratio_low(0.4).with_clip_ratio_high(0.4)),
            Preset::new("sapo", "sapo").with(|c| c.with_aggregation(SeqMeanTokenMean)),
            // verl's effective default: ratio truncated at clip_ratio_c = 3.
            Preset::new("dppo_tv", "dppo_tv").with(|c| c.with_dual_clip(Some(3.0))),
            Preset::new("dppo_kl", "dppo_kl").with(|c| c.with_dual_clip(Some(3.0))),
            // DeepSeekMath GRPO: PPO clip, per-sequence token mean, k3 KL in the loss.
            Preset::new("grpo", "ppo").with(|c| {
                c.with_aggregation(SeqMeanTokenMean)
                    .with_kl_coef(0.04)
                    .with_kl_estimator(crate::KlEstimator::K3)
            }),
            // Dr.GRPO: no std in the advantage, constant normaliser, no KL.
            Preset::new("dr_grpo", "ppo")
                .with(|c| c.with_aggregation(SeqMeanTokenSumNorm))
                .with_advantage(AdvantageEstimator::Grpo {
                    norm_by_std: false,
                    epsilon: 1e-6,
                }),
            // DAPO: Clip-Higher, token-level loss, no KL.
            Preset {
                require_clip_higher: true,
                ..Preset::new("dapo", "ppo")
                    .with(|c| c.with_clip_ratio_high(0.28).with_aggregation(TokenMean))
            },
        ];
        for p in presets {
            r.presets.insert(p.name.clone(), p);
        }
        r
    }

    /// Registers (or replaces) a loss without settings of its own under `name`, with a default
    /// preset of the same name.
    pub fn register(
        &mut self,
        name: impl Into<String>,
        loss: impl PolicyLoss + 'static,
    ) -> &mut Self {
        self.insert(name.into(), Registered::Fixed(Arc::new(loss)))
    }

    /// Registers (or replaces) a loss with settings of its own under `name`: `build` makes the
    /// loss from its settings `S`, which a recipe sets in `[algorithm.<S::SECTION>]` (checked
    /// with [`LossSettings::check`], and by `build` for what concerns this loss only). Several
    /// losses may read one section; they must then share its settings type.
    pub fn register_with_settings<S, L>(
        &mut self,
        name: impl Into<String>,
        build: impl Fn(S) -> std::result::Result<L, SettingError> + Send + Sync + 'static,
    ) -> &mut Self
    where
        S: LossSettings,
        L: PolicyLoss + 'static,
    {
        let builder: Arc<dyn Configurable> = Arc::new(Builder::new(build));
        self.insert(name.into(), Registered::Configurable(builder))
    }

    fn insert(&mut self, name: String, loss: Registered) -> &mut Self {
        self.losses.insert(name.clone(), loss);
        self.presets
            .entry(name.clone())
            .or_insert_with(|| Preset::new(name.clone(), name));
        self
    }

    /// Registers (or replaces) a preset; its loss must already be registered.
    pub fn register_preset(&mut self, preset: Preset) -> Result<&mut Self> {
        if !self.losses.contains_key(&preset.loss) {
            return Err(self.unknown("policy loss", &preset.loss, false));
        }
        self.presets.insert(preset.name.clone(), preset);
        Ok(self)
    }

    /// Every name that [`resolve`](Self::resolve) accepts, sorted.
    pub fn names(&self) -> Vec<String> {
        self.presets.keys().cloned().collect()
    }

    /// The preset for `name` (every registered loss has one).
    pub fn resolve(&self, name: &str) -> Result<Preset> {
        self.presets
            .get(name)
            .cloned()
            .ok_or_else(|| self.unknown("policy loss", name, true))
    }

    /// The loss that `name` (a loss or a preset) runs, with its default settings.
    pub fn get(&self, name: &str) -> Result<Arc<dyn PolicyLoss>> {
        self.build(name, None)
    }

    /// The loss that `name` (a loss or a preset) runs, built from `settings` (its section's
    /// table as JSON; `None`: the defaults).
    ///
    /// # Errors
    /// An unknown name; settings for a loss that has none; settings that do not read or are
    /// out of range ([`AlgoError::LossSetting`], naming the key inside the section).
    pub fn build(
        &self,
        name: &str,
        settings: Option<&serde_json::Value>,
    ) -> Result<Arc<dyn PolicyLoss>> {
        let preset = self.resolve(name)?;
        match (self.registered(&preset.loss)?, settings) {
            (Registered::Fixed(loss), None) => Ok(loss.clone()),
            (Registered::Fixed(_), Some(_)) => Err(AlgoError::LossSetting {
                section: preset.loss.clone(),
                key: String::new(),
                message: format!("loss '{name}' has no settings of its own"),
            }),
            (Registered::Configurable(c), v) => c.build(v).map_err(|e| e.in_section(c.section())),
        }
    }

    /// The settings table (`[algorithm.<section>]`) that `name` (a loss or a preset) reads, if
    /// its loss has settings.
    ///
    /// # Errors
    /// An unknown name.
    pub fn section_of(&self, name: &str) -> Result<Option<&'static str>> {
        let preset = self.resolve(name)?;
        Ok(match self.registered(&preset.loss)? {
            Registered::Fixed(_) => None,
            Registered::Configurable(c) => Some(c.section()),
        })
    }

    /// Every settings table a registered loss reads, sorted by name.
    pub fn sections(&self) -> Vec<LossSection> {
        let mut out: BTreeMap<&str, LossSection> = BTreeMap::new();
        for (name, c) in self.configurable() {
            out.entry(c.section())
                .or_insert_with(|| LossSection {
                    name: c.section().to_string(),
                    read_by: Vec::new(),
                    schema: c.schema(),
                    defaults: c.defaults(),
                })
                .read_by
                .push(name.to_string());
        }
        out.into_values().collect()
    }

    /// The names (losses and presets) whose loss reads the table `[algorithm.<section>]`,
    /// sorted; empty when no registered loss reads it.
    pub fn readers(&self, section: &str) -> Vec<String> {
        self.configurable()
            .filter(|(_, c)| c.section() == section)
            .map(|(name, _)| name.to_string())
            .collect()
    }

    /// Every name (loss or preset, sorted) whose loss has settings, with them.
    fn configurable(&self) -> impl Iterator<Item = (&str, &Arc<dyn Configurable>)> {
        self.presets
            .iter()
            .filter_map(|(name, preset)| match self.losses.get(&preset.loss) {
                Some(Registered::Configurable(c)) => Some((name.as_str(), c)),
                _ => None,
            })
    }

    /// Reads and range-checks a `[algorithm.<section>]` table, whichever loss reads it.
    ///
    /// # Errors
    /// No registered loss reads `section`; a key that does not read or is out of range.
    pub fn check_section(&self, section: &str, settings: &serde_json::Value) -> Result<()> {
        let reader = self.losses.values().find_map(|r| match r {
            Registered::Configurable(c) if c.section() == section => Some(c),
            _ => None,
        });
        let Some(c) = reader else {
            return Err(AlgoError::UnknownName {
                kind: "loss settings section",
                name: section.to_string(),
                known: self.sections().into_iter().map(|s| s.name).collect(),
            });
        };
        c.check(settings).map_err(|e| e.in_section(section))
    }

    fn registered(&self, loss: &str) -> Result<&Registered> {
        self.losses
            .get(loss)
            .ok_or_else(|| self.unknown("policy loss", loss, false))
    }

    /// Whether the loss that `name` runs is batch-coupled (see [`PolicyLoss::batch_coupled`]).
    pub fn is_batch_coupled(&self, name: &str) -> Result<bool> {
        Ok(self.get(name)?.batch_coupled())
    }

    /// Whether the loss that `name` runs carries an importance ratio (see
    /// [`PolicyLoss::uses_importance_ratio`]).
    pub fn uses_importance_ratio(&self, name: &str) -> Result<bool> {
        Ok(self.get(name)?.uses_importance_ratio())
    }

    /// Runs the loss `name` with `config` (not the preset's: pass `resolve(name)?.config`,
    /// adjusted, to use the preset).
    pub fn compute(
        &self,
        name: &str,
        input: &PolicyLossInput,
        config: &PolicyLossConfig,
    ) -> Result<PolicyLossOutput> {
        self.resolve(name)?.validate(config)?;
        self.get(name)?.compute(input, config)
    }

    fn unknown(&self, kind: &'static str, name: &str, with_presets: bool) -> AlgoError {
        let known: Vec<String> = if with_presets {
            self.names()
        } else {
            self.losses.keys().cloned().collect()
        };
        AlgoError::UnknownName {
            kind,
            name: name.to_string(),
            known,
        }
    }
}
