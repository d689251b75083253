//! Recipe values written as names (`ratio_level = "sequence"`, `advantage = "rloo"`): read
//! through the name tables of the crates that own the types, so every spelling those tables
//! accept works and an unknown name lists the known ones; written back as the canonical name.
//! An optional name given as `""` reads as unset (what older run folders store for "the
//! preset's").

use rlft_algo::{AdvantageEstimator, KlEstimator, LossAggregation, RatioLevel};
use serde::{Deserialize, Deserializer, Serializer};

/// A type a recipe names by a string.
pub(crate) trait Named: Sized {
    /// From its name; the error lists the known names.
    fn from_name(name: &str) -> Result<Self, String>;
    /// The canonical name.
    fn name(&self) -> String;
}

/// Implements [`Named`] through `FromStr` and `Display`.
macro_rules! named_by_str {
    ($($ty:ty),*) => {$(
        impl Named for $ty {
            fn from_name(name: &str) -> Result<Self, String> {
                name.parse().map_err(|e: rlft_algo::AlgoError| e.to_string())
            }
            fn name(&self) -> String {
                self.to_string()
            }
        }
    )*};
}
named_by_str!(RatioLevel, LossAggregation, KlEstimator);

impl Named for AdvantageEstimator {
    fn from_name(name: &str) -> Result<Self, String> {
        AdvantageEstimator::from_name(name).map_err(|e| e.to_string())
    }
    fn name(&self) -> String {
        AdvantageEstimator::name(self).to_string()
    }
}

/// serde for a required name (`#[serde(with = "named::required")]`).
pub(crate) mod required {
    use super::*;

    pub(crate) fn serialize<T: Named, S: Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&v.name())
    }

    pub(crate) fn deserialize<'de, T: Named, D: Deserializer<'de>>(d: D) -> Result<T, D::Error> {
        let text = String::deserialize(d)?;
        T::from_name(&text).map_err(serde::de::Error::custom)
    }
}

/// serde for an optional name (`#[serde(with = "named::optional")]`): absent, null or `""` is
/// unset.
pub(crate) mod optional {
    use super::*;

    pub(crate) fn serialize<T: Named, S: Serializer>(
        v: &Option<T>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => s.serialize_some(&v.name()),
            None => s.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, T: Named, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<T>, D::Error> {
        match Option::<String>::deserialize(d)? {
            Some(text) if !text.trim().is_empty() => T::from_name(&text)
                .map(Some)
                .map_err(serde::de::Error::custom),
            _ => Ok(None),
        }
    }
}

/// The JSON Schema of an advantage estimator's name (for the recipe reference).
pub(crate) struct AdvantageName;

impl schemars::JsonSchema for AdvantageName {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "AdvantageEstimator".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "type": "string", "enum": rlft_algo::advantage::ESTIMATOR_NAMES })
    }
}

/// The JSON Schema of a device string (for the recipe reference).
pub(crate) struct DeviceName;

impl schemars::JsonSchema for DeviceName {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "DeviceSpec".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "type": "string" })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Probe {
        #[serde(with = "optional", default)]
        level: Option<RatioLevel>,
        #[serde(with = "required")]
        kl: KlEstimator,
        #[serde(with = "optional", default)]
        advantage: Option<AdvantageEstimator>,
    }

    #[test]
    fn names_read_in_every_spelling_and_write_back_canonical() {
        let p: Probe =
            toml::from_str("level = \"\"\nkl = \"k3\"\nadvantage = \"DR_GRPO\"").unwrap();
        assert_eq!(p.level, None);
        assert_eq!(p.kl, KlEstimator::K3);
        assert_eq!(p.advantage.unwrap().name(), "dr_grpo");
        let back: Probe = toml::from_str(&toml::to_string(&p).unwrap()).unwrap();
        assert_eq!(back, p);
        let e = toml::from_str::<Probe>("level = \"tokens\"\nkl = \"k3\"").unwrap_err();
        assert!(e.to_string().contains("sequence"), "{e}");
    }
}
