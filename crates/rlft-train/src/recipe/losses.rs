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

/// The anchor-specific loss settings of a recipe, applied to `c` for the registered loss
/// `loss` (the loss the recipe's `algorithm.loss`, `named`, runs).
///
/// # Errors
/// A section's key set for another loss, or a value out of range; the message names the key.
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
    let positive = |key: &str, v: f64| {
        if v > 0.0 {
            Ok(v)
        } else {
            Err((format!("algorithm.{key}"), format!("must be > 0, got {v}")))
        }
    };
    let pair = |key: &str, [a, b]: [f64; 2]| -> Result<(f64, f64), (String, String)> {
        Ok((positive(key, a)?, positive(key, b)?))
    };
    if vespo.pos.is_some() || vespo.neg.is_some() {
        if loss != "vespo" {
            return wrong("vespo", "\"vespo\"");
        }
        if let Some(p) = vespo.pos {
            c.vespo_pos = pair("vespo.pos", p)?;
        }
        if let Some(n) = vespo.neg {
            c.vespo_neg = pair("vespo.neg", n)?;
        }
    }
    if let Some(w) = topr.weights {
        if loss != "topr" {
            return wrong("topr.weights", "\"topr\"");
        }
        let [p, n] = w;
        if !(p >= 0.0 && n >= 0.0) {
            return Err((
                "algorithm.topr.weights".into(),
                format!("must be ≥ 0, got {w:?}"),
            ));
        }
        c.topr_weights = (p, n);
    }
    let prime_rl = loss == "prime_rl" || loss == "prime_rl_ipo";
    for (key, value) in [("adv_tau", prime.adv_tau), ("kl_tau", prime.kl_tau)] {
        if let Some(v) = value {
            if !prime_rl {
                return wrong(
                    &format!("prime_rl.{key}"),
                    "\"prime_rl\" or \"prime_rl_ipo\"",
                );
            }
            let v = positive(&format!("prime_rl.{key}"), v)?;
            match key {
                "adv_tau" => c.adv_tau = v,
                _ => c.kl_tau = v,
            }
        }
    }
    if let Some(t) = prime.ipo_threshold {
        if loss != "prime_rl_ipo" {
            return wrong("prime_rl.ipo_threshold", "\"prime_rl_ipo\"");
        }
        c.ipo_threshold = positive("prime_rl.ipo_threshold", t)?;
    }
    Ok(())
}
