//! The learner's process ranks past the first ([`Follower`]) and what rank 0 sends them.
//!
//! Rank 0 runs the trainer as a single process would (the run folder, the rollout side, the
//! warm-up, evaluation, checkpoints). Before its first update it sends the weights and optimiser
//! state (`start_ranks`); each update it sends the prepared rows with the step's learning rate
//! and seeds (`lead_update`); at the end, [`crate::Trainer::stop_ranks`]. A follower holds its own policy and
//! optimiser, runs the same update over the same rows (computing its shard, summing every
//! rank's gradients in rank order: `crate::step::learn`), and writes nothing.

use crate::algorithm::resolve_algorithm;
use crate::distributed::group::{Blobs, Command, ProcessGroup, Update, decode, encode};
use crate::distributed::shard::{keep_owned, merge_states};
use crate::learner::{Learner, Placement};
use crate::models::Models;
use crate::offpolicy::StepDiagnostics;
use crate::optim::adamw;
use crate::recipe::Recipe;
use crate::step::learn::Learn;
use crate::{Result, TrainError};
use burn::module::Module;
use burn::optim::ModuleOptimizer;
use burn::store::ModuleRecord;
use burn::tensor::Bytes;
use rlft_algo::loss::LossRegistry;
use std::sync::Arc;

/// A module's weights as burnpack bytes (parameter ids included).
fn module_bytes<M: Module>(m: &M) -> Result<Vec<u8>> {
    let bytes =
        m.clone().into_record().into_bytes().map_err(|e| {
            TrainError::Ranks(format!("cannot pack the weights for the ranks: {e:?}"))
        })?;
    Ok(bytes.to_vec())
}

fn optim_bytes(o: &ModuleOptimizer) -> Result<Vec<u8>> {
    let bytes = o.into_bytes().map_err(|e| {
        TrainError::Ranks(format!(
            "cannot pack the optimizer state for the ranks: {e:?}"
        ))
    })?;
    Ok(bytes.to_vec())
}

/// `m` with the weights of `bytes` ([`module_bytes`]).
fn load_module<M: Module>(m: M, bytes: Vec<u8>, what: &str) -> Result<M> {
    ModuleRecord::from_bytes(Bytes::from_bytes_vec(bytes))
        .and_then(|r| m.try_load_record(r))
        .map_err(|e| {
            TrainError::Ranks(format!(
                "rank 0's {what} do not fit this rank's model ({e:?}); every rank must run the \
                 same recipe"
            ))
        })
}

fn load_optim(o: ModuleOptimizer, bytes: Vec<u8>, what: &str) -> Result<ModuleOptimizer> {
    o.from_bytes(Bytes::from_bytes_vec(bytes))
        .map_err(|e| TrainError::Ranks(format!("rank 0's {what} cannot be read ({e:?})")))
}

/// Rank 0: the weights and optimiser states every rank starts its updates from, once, before
/// the first update (after the warm-up, or as a checkpoint loaded them).
pub(crate) fn start_ranks(recipe: &Recipe, models: &Models, learner: &mut Learner) -> Result<()> {
    let Some(group) = learner.group.clone().filter(|_| !learner.ranks_started) else {
        return Ok(());
    };
    let critic = match (&models.critic, &learner.critic_optim) {
        (Some(c), Some(o)) => Some(Blobs {
            weights: module_bytes(c)?,
            optim: optim_bytes(o)?,
        }),
        _ => None,
    };
    let start = Command::Start {
        policy: module_bytes(models.policy())?,
        optim: optim_bytes(&learner.optim)?,
        critic,
    };
    group.broadcast(encode(&start)?)?;
    learner.ranks_started = true;
    keep_shares(recipe, models, learner)
}

/// With `distributed.shard_optimizer`, once the ranks hold rank 0's state: each keeps only the
/// state of the parameters it owns.
fn keep_shares(recipe: &Recipe, models: &Models, learner: &mut Learner) -> Result<()> {
    let Some(group) = learner.optimizer_shards() else {
        return Ok(());
    };
    let (rank, size) = (group.rank(), group.size());
    let optim = std::mem::replace(&mut learner.optim, adamw(&recipe.optimizer));
    learner.optim = keep_owned(optim, models.policy(), rank, size)?;
    if let (Some(c), Some(o)) = (&models.critic, learner.critic_optim.take()) {
        learner.critic_optim = Some(keep_owned(o, c, rank, size)?);
    }
    Ok(())
}

/// A rank's optimiser states as burnpack bytes.
#[derive(serde::Serialize, serde::Deserialize)]
struct States {
    #[serde(with = "serde_bytes")]
    policy: Vec<u8>,
    critic: Option<serde_bytes::ByteBuf>,
}

impl States {
    fn len(&self) -> usize {
        self.policy.len() + self.critic.as_ref().map_or(0, |c| c.len())
    }
}

/// This rank's optimiser states.
fn own_states(learner: &Learner) -> Result<States> {
    let critic = learner.critic_optim.as_ref().map(optim_bytes).transpose()?;
    Ok(States {
        policy: optim_bytes(&learner.optim)?,
        critic: critic.map(serde_bytes::ByteBuf::from),
    })
}

/// Every rank's share of the optimiser states, gathered.
fn gather_states(group: &dyn ProcessGroup, learner: &Learner) -> Result<Vec<States>> {
    let all = group.all_gather(encode(&own_states(learner)?)?)?;
    all.iter()
        .enumerate()
        .map(|(from, b)| decode::<States>(b, from))
        .collect()
}

/// Rank 0, writing a checkpoint: the whole optimiser states (policy, critic), gathered from the
/// ranks' shares when `distributed.shard_optimizer` spreads them (`None`: rank 0 holds them).
///
/// # Errors
/// The group cannot gather them, or a share cannot be read.
pub(crate) fn whole_states(
    recipe: &Recipe,
    learner: &Learner,
) -> Result<Option<(ModuleOptimizer, Option<ModuleOptimizer>)>> {
    let Some(group) = learner.optimizer_shards() else {
        return Ok(None);
    };
    group.broadcast(encode(&Command::Gather)?)?;
    let (policy, critic): (Vec<_>, Vec<_>) = gather_states(group.as_ref(), learner)?
        .into_iter()
        .map(|s| (s.policy, s.critic.map(serde_bytes::ByteBuf::into_vec)))
        .unzip();
    let whole = |shares: Vec<Vec<u8>>, what: &str| {
        load_optim(
            adamw(&recipe.optimizer),
            merge_states(shares)?.to_vec(),
            what,
        )
    };
    let policy = whole(policy, "optimizer shards")?;
    let critic: Vec<Vec<u8>> = critic.into_iter().flatten().collect();
    let critic = match critic.is_empty() {
        true => None,
        false => Some(whole(critic, "critic optimizer shards")?),
    };
    Ok(Some((policy, critic)))
}

/// Rank 0: the update every rank runs next.
pub(crate) fn lead_update(group: &dyn ProcessGroup, update: Update) -> Result<()> {
    group.broadcast(encode(&Command::Update(update))?)?;
    Ok(())
}

/// Each rank's optimiser state and traffic, as rank 0 reports them at the end of a run.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct RankTotals {
    /// Each rank's optimiser state (policy and critic) in bytes; with
    /// `distributed.shard_optimizer`, its share.
    pub optimizer_bytes: Vec<u64>,
    /// The bytes each rank sent ([`ProcessGroup::bytes_sent`]).
    pub sent_bytes: Vec<u64>,
}

/// Rank 0: the run is over; the followers return. Returns each rank's totals (empty without
/// process ranks).
///
/// # Errors
/// The group cannot deliver it.
pub(crate) fn stop_ranks(learner: &Learner) -> Result<RankTotals> {
    let Some(group) = &learner.group else {
        return Ok(RankTotals::default());
    };
    group.broadcast(encode(&Command::Stop)?)?;
    totals(group.as_ref(), learner)
}

/// Every rank's totals, gathered.
fn totals(group: &dyn ProcessGroup, learner: &Learner) -> Result<RankTotals> {
    let state = own_states(learner)?.len() as u64;
    // Counted before this last exchange.
    let mine = (state, group.bytes_sent());
    let all = group.all_gather(encode(&mine)?)?;
    let mut t = RankTotals::default();
    for (from, b) in all.iter().enumerate() {
        let (state, sent) = decode::<(u64, u64)>(b, from)?;
        t.optimizer_bytes.push(state);
        t.sent_bytes.push(sent);
    }
    Ok(t)
}

/// A learner rank past the first: its copy of the policy (and critic), its optimiser, and the
/// group it takes rank 0's commands from.
pub struct Follower {
    recipe: Recipe,
    models: Models,
    learner: Learner,
    group: Arc<dyn ProcessGroup>,
}

impl Follower {
    /// The rank `recipe` describes, in `group` (not its rank 0), with the losses of `registry`:
    /// the policy's architecture (and critic) and an optimiser; the weights come from rank 0.
    ///
    /// # Errors
    /// A bad recipe or a model that does not load.
    pub fn new(
        recipe: Recipe,
        registry: &LossRegistry,
        group: Arc<dyn ProcessGroup>,
    ) -> Result<Self> {
        recipe.check_values()?;
        let algo = resolve_algorithm(&recipe, registry)?;
        let place = Placement::new(&recipe, Some(group.clone()))?;
        let device = place.plain.clone().autodiff();
        device.seed(recipe.seed);
        // This rank's device must have the passes' compute type, as rank 0's must.
        let spec = recipe.distributed.run_device(recipe.device);
        recipe.model.dtype.check(&place.plain, "device", spec)?;
        let (models, tokenizer) = Models::trained(&recipe, &device)?;
        let pad_id = i64::from(tokenizer.pad_id.unwrap_or(0));
        let vocab = models.config.vocab_size;
        let learner = Learner::new(&recipe, algo, place, pad_id, vocab);
        Ok(Self {
            recipe,
            models,
            learner,
            group,
        })
    }

    /// Runs rank 0's commands until it stops the run; returns the updates run.
    ///
    /// # Errors
    /// A message that cannot be read, weights that do not fit, a failed update, or weights that
    /// diverged from rank 0's.
    pub fn run(mut self) -> Result<usize> {
        let mut updates = 0;
        loop {
            let bytes = self.group.broadcast(Vec::new())?;
            match decode::<Command>(&bytes, 0)? {
                Command::Start {
                    policy,
                    optim,
                    critic,
                } => self.start(policy, optim, critic)?,
                Command::Update(u) => {
                    self.update(u)?;
                    updates += 1;
                }
                Command::Gather => {
                    gather_states(self.group.as_ref(), &self.learner)?;
                }
                Command::Stop => {
                    totals(self.group.as_ref(), &self.learner)?;
                    return Ok(updates);
                }
            }
        }
    }

    fn start(&mut self, policy: Vec<u8>, optim: Vec<u8>, critic: Option<Blobs>) -> Result<()> {
        let p = self.models.take_policy();
        self.models.policy = Some(load_module(p, policy, "policy weights")?);
        let fresh = adamw(&self.recipe.optimizer);
        self.learner.optim = load_optim(fresh, optim, "optimizer state")?;
        if let (Some(c), Some(b)) = (self.models.critic.take(), critic) {
            self.models.critic = Some(load_module(c, b.weights, "critic weights")?);
            let fresh = adamw(&self.recipe.optimizer);
            self.learner.critic_optim = Some(load_optim(fresh, b.optim, "critic optimizer")?);
        }
        self.learner.ranks_started = true;
        keep_shares(&self.recipe, &self.models, &mut self.learner)
    }

    fn update(&mut self, u: Update) -> Result<()> {
        if !self.learner.ranks_started {
            return Err(TrainError::Ranks(
                "rank 0 sent an update before the weights".into(),
            ));
        }
        crate::fault::point(|| format!("rank{}:update:{}", self.group.rank(), u.step + 1));
        self.learner.loss_seed = u.loss_seed;
        self.learner.algo.config.kl_coef = u.kl_coef;
        let mut diag = StepDiagnostics::default();
        let pool = self.learner.pool.clone();
        let mut learn = Learn {
            recipe: &self.recipe,
            models: &mut self.models,
            learner: &mut self.learner,
            step: u.step,
        };
        match pool {
            Some(pool) => pool.install(|| learn.update(&u.rows, u.lr, &mut diag))?,
            None => learn.update(&u.rows, u.lr, &mut diag)?,
        };
        Ok(())
    }
}
