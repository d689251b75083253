//! The settings of losses that follow one anchor's code: `[algorithm.vespo]` (TRL),
//! `[algorithm.topr]` (ROLL) and `[algorithm.prime_rl]`. Unset keys keep the preset's values
//! (the anchor's defaults); a key set for a loss that does not use it is a recipe error.

use rlft_algo::loss::PolicyLossConfig;
use serde::{Deserialize, Serialize};

/// `[algorithm.vespo]`: the gamma weights of TRL 1.16's VESPO (`loss = "vespo"`).
#[derive(schemars::JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct VespoSection {
    /// `[k, λ]` for rows with a non-negative advantage (TRL's default `[2, 3]`).
    pub pos: Option<[f64; 2]>,
    /// `[k, λ]` for rows with a negative advantage (TRL's default `[3, 2]`).
    pub neg: Option<[f64; 2]>,
}

/// `[algorithm.topr]`: ROLL's TOPR (`loss = "topr"`).
#[derive(schemars::JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ToprSection {
    /// `[positive, negative]`: the weights of rows with a positive and a non-positive score
    /// (ROLL's default `[1, 1]`).
    pub weights: Option<[f64; 2]>,
}

/// `[algorithm.prime_rl]`: prime-rl's losses (`loss = "prime_rl"` or `"prime_rl_ipo"`).
#[derive(schemars::JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PrimeRlSection {
    /// Scale of the advantage term (`adv_tau`, default 1).
    pub adv_tau: Option<f64>,
    /// Coefficient of the squared log-ratio penalty (`kl_tau`, default 1e-3).
    pub kl_tau: Option<f64>,
    /// `prime_rl_ipo`: tokens whose probability moved by more than this are masked (default
    /// 0.1).
    pub ipo_threshold: Option<f64>,
}

/// The ranges of the anchor-specific loss settings (checked when a recipe loads, whatever its
/// loss).
///
/// # Errors
/// A value out of range, naming its key.
pub(crate) fn check_ranges(
    (vespo, topr, prime): (&VespoSection, &ToprSection, &PrimeRlSection),
) -> Result<(), (String, String)> {
    let positive = [
        ("vespo.pos", vespo.pos.map(|[a, b]| a.min(b))),
        ("vespo.neg", vespo.neg.map(|[a, b]| a.min(b))),
        ("prime_rl.adv_tau", prime.adv_tau),
        ("prime_rl.kl_tau", prime.kl_tau),
        ("prime_rl.ipo_threshold", prime.ipo_threshold),
    ];
    for (key, v) in positive {
        if let Some(v) = v
            && v <= 0.0
        {
            return Err((format!("algorithm.{key}"), format!("must be > 0, got {v}")));
        }
    }
    if let Some(w @ [p, n]) = topr.weights
        && (p < 0.0 || n < 0.0)
    {
        return Err((
            "algorithm.topr.weights".into(),
            format!("must be ≥ 0, got {w:?}"),
        ));
    }
    Ok(())
}

/// The anchor-specific loss settings of a recipe, applied to `c` for the registered loss
/// `loss` (the loss the recipe's `algorithm.loss`, `named`, runs).
///
/// # Errors
/// A section's key set for another loss (the ranges are [`check_ranges`]'s); the message names the
/// key.
pub(crate) fn apply(
    (vespo, topr, prime): (&VespoSection, &ToprSection, &PrimeRlSection),
    (loss, named): (&str, &str),
    c: &mut PolicyLossConfig,
) -> Result<(), (String, String)> {
    let wrong = |key: &str, owner: &str| {
        Err((
            format!("algorithm.{key}"),
            format!("applies to loss = {owner}, not '{named}'; remove it or choose that loss"),
        ))
    };
    if vespo.pos.is_some() || vespo.neg.is_some() {
        if loss != "vespo" {
            return wrong("vespo", "\"vespo\"");
        }
        if let Some([k, l]) = vespo.pos {
            c.vespo_pos = (k, l);
        }
        if let Some([k, l]) = vespo.neg {
            c.vespo_neg = (k, l);
        }
    }
    if let Some([p, n]) = topr.weights {
        if loss != "topr" {
            return wrong("topr.weights", "\"topr\"");
        }
        c.topr_weights = (p, n);
    }
    let prime_rl = loss == "prime_rl" || loss == "prime_rl_ipo";
    if let Some(v) = prime.adv_tau {
        if !prime_rl {
            return wrong("prime_rl.adv_tau", "\"prime_rl\" or \"prime_rl_ipo\"");
        }
        c.adv_tau = v;
    }
    if let Some(v) = prime.kl_tau {
        if !prime_rl {
            return wrong("prime_rl.kl_tau", "\"prime_rl\" or \"prime_rl_ipo\"");
        }
        c.kl_tau = v;
    }
    if let Some(t) = prime.ipo_threshold {
        if loss != "prime_rl_ipo" {
            return wrong("prime_rl.ipo_threshold", "\"prime_rl_ipo\"");
        }
        c.ipo_threshold = t;
    }
    Ok(())
}
