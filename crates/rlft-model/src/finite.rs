//! Whether a module's weights are all finite: [`first_non_finite`] walks its float tensors one
//! at a time, so a checkpoint holding a NaN or an infinity is refused before it is served or
//! trained, naming the tensor.

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::Tensor;

/// A float tensor of a module holding NaN or infinite values.
#[derive(Debug, Clone, PartialEq)]
pub struct NonFinite {
    /// The tensor's path in the module (`layers.3.self_attn.q_proj.weight`).
    pub path: String,
    /// Its shape.
    pub shape: Vec<usize>,
    /// How many of its elements are NaN.
    pub nan: usize,
    /// How many are +inf or −inf.
    pub inf: usize,
}

impl std::fmt::Display for NonFinite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "tensor {} {:?} holds {} NaN and {} infinite values",
            self.path, self.shape, self.nan, self.inf
        )
    }
}

/// The first float tensor of `module` (in its visiting order) that holds a NaN or an infinity,
/// or `None` when every value is finite.
///
/// Each tensor is reduced where it lives: its sum is finite exactly when every element is
/// (barring an overflow of the sum itself, which the exact count below rules out), so a finite
/// tensor costs one reduction and no copy; only a tensor whose sum is not finite is counted
/// element by element.
pub fn first_non_finite<M: Module>(module: &M) -> Option<NonFinite> {
    let mut v = Finder {
        path: Vec::new(),
        found: None,
    };
    module.visit(&mut v);
    v.found
}

struct Finder {
    /// The path's parts; `None` for an enum's variant, which the path leaves out (a field
    /// `mlp: Mlp::Dense(..)` reads `mlp.down_proj`, not `mlp.Dense.down_proj`).
    path: Vec<Option<String>>,
    found: Option<NonFinite>,
}

impl ModuleVisitor for Finder {
    fn enter_module(&mut self, name: &str, container_type: &str) {
        let variant = container_type.starts_with("Enum:");
        self.path.push((!variant).then(|| name.to_string()));
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if self.found.is_some() {
            return;
        }
        let t = param.val();
        let sum: f64 = t.clone().sum().into_scalar::<f64>();
        if sum.is_finite() {
            return;
        }
        let count = |mask: Tensor<D, burn::tensor::Bool>| -> usize {
            mask.int().sum().into_scalar::<i64>().max(0) as usize
        };
        let (nan, inf) = (count(t.clone().is_nan()), count(t.clone().is_inf()));
        if nan + inf > 0 {
            self.found = Some(NonFinite {
                path: self
                    .path
                    .iter()
                    .flatten()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("."),
                shape: t.dims().to_vec(),
                nan,
                inf,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::nn::{Linear, LinearConfig};
    use burn::tensor::{Device, TensorData};

    #[derive(Module, Debug)]
    struct Two {
        first: Linear,
        second: Linear,
    }

    #[test]
    fn names_the_tensor_and_counts_its_values() {
        let dev = Device::flex();
        let mut m = Two {
            first: LinearConfig::new(3, 2).init(&dev),
            second: LinearConfig::new(2, 2).init(&dev),
        };
        assert_eq!(first_non_finite(&m), None);
        let bad = TensorData::new(
            vec![1.0f32, f32::NAN, f32::INFINITY, -f32::INFINITY],
            [2, 2],
        );
        m.second.weight = Param::from_tensor(Tensor::from_data(bad, &dev));
        let found = first_non_finite(&m).expect("a NaN is found");
        assert_eq!(found.path, "second.weight");
        assert_eq!((found.nan, found.inf), (1, 2));
        assert!(found.to_string().contains("second.weight [2, 2]"));
        // Large finite values whose sum overflows f32 are not refused.
        let big = TensorData::new(vec![3.0e38f32; 4], [2, 2]);
        m.second.weight = Param::from_tensor(Tensor::from_data(big, &dev));
        assert_eq!(first_non_finite(&m), None);
    }
}
