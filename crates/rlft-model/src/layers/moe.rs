//! The sparse mixture-of-experts block of Qwen3-MoE and Mixtral: a linear router scores every
//! expert, each token goes to its top-k experts, and their outputs are summed with the routing
//! weights. Experts compute only the tokens routed to them.

use super::{Mlp, MlpConfig};
use burn::config::Config;
use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::activation::softmax;
use burn::tensor::{Device, FloatDType, IndexingUpdateOp, Int, Tensor, TensorData};
use std::convert::Infallible;

/// Settings of a sparse MoE block.
#[derive(Config, Debug)]
pub struct SparseMoeConfig {
    /// Model width `d`.
    pub d_model: usize,
    /// Inner width of each expert.
    pub d_expert: usize,
    /// Number of experts `E`.
    pub num_experts: usize,
    /// Experts per token `k`.
    pub top_k: usize,
    /// Renormalise the k routing weights to sum to 1.
    #[config(default = true)]
    pub norm_topk_prob: bool,
}

impl SparseMoeConfig {
    /// A block with burn's default initialisers.
    pub fn init(&self, device: &Device) -> SparseMoe {
        let Ok(m) = self.try_init_with(&mut |_, i, o, b| {
            Ok::<_, Infallible>(LinearConfig::new(i, o).with_bias(b).init(device))
        });
        m
    }

    /// A block from `linear(name, d_in, d_out, bias)`: the router `gate` first, then
    /// `experts.E.gate_proj`, `experts.E.up_proj`, `experts.E.down_proj` for each expert in
    /// order (the Qwen3-MoE names; loaders map them to their family's).
    pub fn try_init_with<E>(
        &self,
        linear: &mut impl FnMut(&str, usize, usize, bool) -> Result<Linear, E>,
    ) -> Result<SparseMoe, E> {
        let gate = linear("gate", self.d_model, self.num_experts, false)?;
        let mut experts = Vec::new();
        for e in 0..self.num_experts {
            experts.push(
                MlpConfig::new(self.d_model, self.d_expert).try_init_with(&mut |n, i, o, b| {
                    linear(&format!("experts.{e}.{n}"), i, o, b)
                })?,
            );
        }
        Ok(SparseMoe {
            gate,
            experts,
            top_k: self.top_k,
            norm_topk_prob: self.norm_topk_prob,
        })
    }
}

/// Which experts each token of a forward pass went to: `ids[t·k + j]` is token `t`'s `j`-th
/// expert, in descending router probability. In a replayed routing a token whose first id is
/// [`Routing::OWN`] has no record and goes where the router sends it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routing {
    /// Experts per token.
    pub k: usize,
    /// `n·k` expert ids.
    pub ids: Vec<u32>,
}

impl Routing {
    /// Marks a token without a record in a replayed routing.
    pub const OWN: u32 = u32::MAX;

    /// Tokens covered.
    pub fn tokens(&self) -> usize {
        self.ids.len().checked_div(self.k).unwrap_or(0)
    }

    /// Token `t`'s experts.
    pub fn token(&self, t: usize) -> &[u32] {
        &self.ids[t * self.k..(t + 1) * self.k]
    }

    /// Whether token `t` goes to the same set of experts in both routings.
    pub fn same_set(&self, other: &Routing, t: usize) -> bool {
        let (mut a, mut b) = (self.token(t).to_vec(), other.token(t).to_vec());
        a.sort_unstable();
        b.sort_unstable();
        a == b
    }
}

/// The experts a sequence's tokens were routed to as the sampler forwarded them: per token, per
/// sparse layer, `k` ids (small integers: bounded memory).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TokenRouting {
    /// Sparse layers.
    pub layers: usize,
    /// Experts per token.
    pub k: usize,
    /// `tokens · layers · k` ids, token-major.
    pub ids: Vec<u16>,
}

impl TokenRouting {
    /// An empty record for `layers` sparse layers of `k` experts per token.
    pub fn new(layers: usize, k: usize) -> Self {
        Self {
            layers,
            k,
            ids: Vec::new(),
        }
    }

    /// Tokens recorded.
    pub fn tokens(&self) -> usize {
        self.ids
            .len()
            .checked_div(self.layers * self.k)
            .unwrap_or(0)
    }

    /// Token `t`'s ids in sparse layer `layer`.
    pub fn get(&self, t: usize, layer: usize) -> &[u16] {
        let at = (t * self.layers + layer) * self.k;
        &self.ids[at..at + self.k]
    }

    /// Appends token `t` of a pass's `routing` (one [`Routing`] per sparse layer).
    pub fn push_from(&mut self, routing: &[Routing], t: usize) {
        for r in routing {
            self.ids.extend(r.token(t).iter().map(|&e| e as u16));
        }
    }

    /// Keeps the first `tokens` tokens.
    pub fn truncate(&mut self, tokens: usize) {
        self.ids.truncate(tokens * self.layers * self.k);
    }
}

/// What a pass through a [`SparseMoe`] computed ([`SparseMoe::forward_traced`]).
#[derive(Debug, Clone)]
pub struct MoeTrace {
    /// The block's output `[batch, L, d]`.
    pub output: Tensor<3>,
    /// The router's own top-k.
    pub own: Routing,
    /// The experts the tokens went to (the replayed ones under replay).
    pub used: Routing,
    /// Router probabilities `[batch·L, E]`.
    pub probs: Tensor<2>,
}

/// A sparse MoE feed-forward block.
#[derive(Module, Debug)]
pub struct SparseMoe {
    /// Router `d → E` (no bias).
    pub gate: Linear,
    /// The experts (SwiGLU MLPs).
    pub experts: Vec<Mlp>,
    /// Experts per token.
    #[module(skip)]
    pub top_k: usize,
    /// Renormalise the chosen routing weights.
    #[module(skip)]
    pub norm_topk_prob: bool,
}

impl SparseMoe {
    /// Router probabilities in f32, softmax over all experts.
    ///
    /// # Shapes
    /// - `x`: `[n, d]` → `[n, E]`
    pub fn router_probs(&self, x: Tensor<2>) -> Tensor<2> {
        softmax(self.gate.forward(x).cast(FloatDType::F32), 1)
    }

    /// Each token's top-k experts by router probability (ties: the lower id first, as
    /// `torch.topk` returns them for distinct values).
    pub fn top_k_of(&self, probs: &Tensor<2>) -> Routing {
        let [n, e] = probs.dims();
        let p: Vec<f32> = probs
            .clone()
            .into_data()
            .convert::<f32>()
            .try_into_vec::<f32>()
            .unwrap_or_else(|_| vec![0.0; n * e]);
        let k = self.top_k.min(e);
        let mut ids = Vec::with_capacity(n * k);
        let mut order: Vec<u32> = Vec::with_capacity(e);
        for row in p.chunks_exact(e) {
            order.clear();
            order.extend(0..e as u32);
            order.sort_by(|a, b| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b)));
            ids.extend_from_slice(&order[..k]);
        }
        Routing { k, ids }
    }

    /// The block's output, routing each token to its own top-k experts; also returns the
    /// routing.
    ///
    /// # Shapes
    /// - `x`: `[batch, L, d]` → `[batch, L, d]`
    pub fn forward_routed(&self, x: Tensor<3>) -> (Tensor<3>, Routing) {
        let t = self.forward_traced(x, None);
        (t.output, t.own)
    }

    /// The block's output with the experts given by `routing` (router replay): the routing
    /// weights are the current router's probabilities of those experts (renormalised when
    /// configured), so the router still gets a gradient. Also returns the router's own top-k.
    ///
    /// # Shapes
    /// - `x`: `[batch, L, d]` → `[batch, L, d]`; `routing` covers `batch·L` tokens.
    ///
    /// # Panics
    /// When `routing` does not cover `batch·L` tokens or names an expert that does not exist.
    pub fn forward_with(&self, x: Tensor<3>, routing: &Routing) -> (Tensor<3>, Routing) {
        let t = self.forward_traced(x, Some(routing));
        (t.output, t.own)
    }

    /// The block's output, routed by the router or (`replay`) by a recorded routing as
    /// [`SparseMoe::forward_with`] routes, with everything a caller measures: the router's own
    /// top-k, the experts used, and the router probabilities `[batch·L, E]` (in the autodiff
    /// graph, for a load-balancing loss).
    ///
    /// # Panics
    /// As [`SparseMoe::forward_with`].
    pub fn forward_traced(&self, x: Tensor<3>, replay: Option<&Routing>) -> MoeTrace {
        let [b, l, d] = x.dims();
        let rows = x.reshape([b * l, d]);
        let probs = self.router_probs(rows.clone());
        let own = self.top_k_of(&probs);
        let used = match replay {
            None => own.clone(),
            Some(routing) => {
                self.check_replay(routing, b * l);
                let mut forced = routing.clone();
                for t in 0..b * l {
                    if forced.ids[t * forced.k] == Routing::OWN {
                        forced.ids[t * forced.k..(t + 1) * forced.k].copy_from_slice(own.token(t));
                    }
                }
                forced
            }
        };
        let output = self.combine(rows, probs.clone(), &used).reshape([b, l, d]);
        MoeTrace {
            output,
            own,
            used,
            probs,
        }
    }

    fn check_replay(&self, routing: &Routing, tokens: usize) {
        assert!(
            routing.k == self.top_k.min(self.experts.len())
                && routing.ids.len() == tokens * routing.k
                && routing
                    .ids
                    .iter()
                    .all(|&e| e == Routing::OWN || (e as usize) < self.experts.len()),
            "a replayed routing must give {} of {} experts to each of {tokens} tokens; it has {} \
             ids of k = {}",
            self.top_k,
            self.experts.len(),
            routing.ids.len(),
            routing.k,
        );
    }

    /// `Σ_j w_tj · expert_{id_tj}(x_t)` with `w` gathered from `probs` at the routed ids.
    fn combine(&self, rows: Tensor<2>, probs: Tensor<2>, routing: &Routing) -> Tensor<2> {
        let n = rows.dims()[0];
        let k = routing.k;
        let device = rows.device();
        let idx = Tensor::<2, Int>::from_data(
            TensorData::new(
                routing.ids.iter().map(|&i| i as i64).collect::<Vec<_>>(),
                [n, k],
            ),
            &device,
        );
        let mut w = probs.gather(1, idx);
        if self.norm_topk_prob {
            let sum = w.clone().sum_dim(1);
            w = w / sum;
        }
        let w = w.cast(rows.dtype()).reshape([n * k]);
        let mut out = rows.zeros_like();
        for (e, expert) in self.experts.iter().enumerate() {
            let slots: Vec<i64> = routing
                .ids
                .iter()
                .enumerate()
                .filter(|(_, id)| **id as usize == e)
                .map(|(s, _)| s as i64)
                .collect();
            if slots.is_empty() {
                continue;
            }
            let m = slots.len();
            let tokens: Vec<i64> = slots.iter().map(|s| s / k as i64).collect();
            let tok = Tensor::<1, Int>::from_data(TensorData::new(tokens, [m]), &device);
            let slot = Tensor::<1, Int>::from_data(TensorData::new(slots, [m]), &device);
            let y = expert.forward(rows.clone().select(0, tok.clone()));
            let y = y * w.clone().select(0, slot).reshape([m, 1]);
            out = out.select_assign(0, tok, y, IndexingUpdateOp::Add);
        }
        out
    }
}

/// A layer's feed-forward block: one dense MLP or a mixture of experts.
// One per layer: the variants' sizes do not matter, and burn's derive takes the module itself.
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum FeedForward {
    /// A gated MLP.
    Dense(Mlp),
    /// A sparse mixture of experts.
    Experts(SparseMoe),
}

impl FeedForward {
    /// The dense MLP, if this block is one.
    pub fn dense(&self) -> Option<&Mlp> {
        match self {
            Self::Dense(m) => Some(m),
            Self::Experts(_) => None,
        }
    }

    /// The mixture of experts, if this block is one.
    pub fn experts(&self) -> Option<&SparseMoe> {
        match self {
            Self::Experts(m) => Some(m),
            Self::Dense(_) => None,
        }
    }

    /// # Shapes
    /// - `x`: `[batch, L, d]` → `[batch, L, d]`
    pub fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        match self {
            Self::Dense(m) => m.forward(x),
            Self::Experts(m) => m.forward_routed(x).0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Routing every token to all experts with unnormalised weights is the dense
    /// probability-weighted sum; the router gets a gradient through the weights.
    #[test]
    fn top_e_routing_is_the_probability_weighted_sum() {
        let device = Device::flex();
        let moe = SparseMoeConfig::new(8, 6, 3, 3)
            .with_norm_topk_prob(false)
            .init(&device);
        let x = Tensor::<1, Int>::arange(0..40, &device)
            .float()
            .reshape([1, 5, 8])
            .mul_scalar(0.07)
            .sin();
        let (y, routing) = moe.forward_routed(x.clone());
        assert_eq!(routing.ids.len(), 15);
        let rows = x.clone().reshape([5, 8]);
        let probs = moe.router_probs(rows.clone());
        let mut want = rows.zeros_like();
        for (e, expert) in moe.experts.iter().enumerate() {
            let p = probs.clone().narrow(1, e, 1);
            want = want + expert.forward(rows.clone()) * p;
        }
        let diff = (y.reshape([5, 8]) - want).abs().max().into_scalar::<f32>();
        assert!(diff < 1e-6, "{diff}");
    }

    #[test]
    fn the_router_gets_a_gradient_under_forced_routing() {
        let device = Device::flex().autodiff();
        let moe = SparseMoeConfig::new(8, 6, 4, 2).init(&device);
        let x = Tensor::<1, Int>::arange(0..24, &device)
            .float()
            .reshape([1, 3, 8])
            .mul_scalar(0.1)
            .cos();
        let routing = Routing {
            k: 2,
            ids: vec![0, 1, 2, 3, 3, 0],
        };
        let (y, _) = moe.forward_with(x, &routing);
        let grads = y.square().sum().backward();
        let g = moe.gate.weight.grad(&grads).expect("router gradient");
        assert!(g.abs().sum().into_scalar::<f32>() > 0.0);
        let g = moe.experts[1]
            .up_proj
            .weight
            .grad(&grads)
            .expect("expert 1 gradient");
        assert!(g.abs().sum().into_scalar::<f32>() > 0.0);
    }
}
