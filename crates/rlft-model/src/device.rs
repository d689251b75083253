//! Backend selection at run time from a device string.
//!
//! | string | device | cargo feature |
//! |---|---|---|
//! | `auto` | `RLFT_DEVICE` if set, else burn's default (which honours `BURN_DEVICE`) | – |
//! | `flex` | `Device::flex()` (default CPU backend) | `flex` |
//! | `ndarray` | `Device::ndarray()` | `ndarray` |
//! | `cpu` | `Device::cpu()` (CubeCL CPU) | `cpu` |
//! | `wgpu` | `Device::wgpu(DeviceKind::DiscreteGpu(0))` | `wgpu` |
//! | `wgpu:cpu` | `Device::wgpu(DeviceKind::Cpu)` (e.g. Mesa lavapipe) | `wgpu` |
//! | `wgpu:N` | `Device::wgpu(DeviceKind::DiscreteGpu(N))` | `wgpu` |
//! | `vulkan[:N]`, `metal[:N]` | `Device::vulkan/metal(DeviceKind::DiscreteGpu(N))` | `vulkan`, `metal` |
//! | `cuda[:N]`, `rocm[:N]` | `Device::cuda(N)`, `Device::rocm(N)` | `cuda`, `rocm` |

use crate::{ModelError, Result};
use burn::tensor::Device;

/// Environment variable that `auto` (and [`resolve`] without a string) reads first.
pub const DEVICE_ENV: &str = "RLFT_DEVICE";

/// Every device string [`parse`] understands (indices `:N` are optional where shown).
pub const DEVICE_NAMES: &[&str] = &[
    "auto", "flex", "ndarray", "cpu", "wgpu", "wgpu:cpu", "vulkan", "metal", "cuda[:N]", "rocm[:N]",
];

/// Backends compiled into this build, in the order `auto` would prefer them.
pub fn compiled_backends() -> Vec<&'static str> {
    let all: [(&str, bool); 8] = [
        ("cuda", cfg!(feature = "cuda")),
        ("rocm", cfg!(feature = "rocm")),
        ("metal", cfg!(feature = "metal")),
        ("vulkan", cfg!(feature = "vulkan")),
        ("wgpu", cfg!(feature = "wgpu")),
        ("cpu", cfg!(feature = "cpu")),
        ("flex", cfg!(feature = "flex")),
        ("ndarray", cfg!(feature = "ndarray")),
    ];
    all.iter().filter(|(_, on)| *on).map(|(n, _)| *n).collect()
}

/// A device string, parsed: which backend and which of its devices. Parsing checks the
/// syntax only; [`DeviceSpec::device`] creates the device and fails for a backend that is not
/// compiled in. Written back ([`Display`](std::fmt::Display), serde) in the form it is read, with
/// index 0 left out (`cuda`, `cuda:1`, `wgpu:cpu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum DeviceSpec {
    /// `auto`: `RLFT_DEVICE` if set, else burn's default.
    #[default]
    Auto,
    /// `flex`.
    Flex,
    /// `ndarray`.
    Ndarray,
    /// `cpu` (CubeCL CPU).
    Cpu,
    /// `wgpu[:N|:cpu]`.
    Wgpu(GpuTarget),
    /// `vulkan[:N|:cpu]`.
    Vulkan(GpuTarget),
    /// `metal[:N|:cpu]`.
    Metal(GpuTarget),
    /// `cuda[:N]`.
    Cuda(usize),
    /// `rocm[:N]`.
    Rocm(usize),
}

/// Which adapter a wgpu-family backend uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GpuTarget {
    /// `:cpu`: a CPU adapter (e.g. Mesa lavapipe).
    Cpu,
    /// `:N` (default 0): the N-th discrete GPU.
    Discrete(usize),
}

impl std::str::FromStr for DeviceSpec {
    type Err = ModelError;

    fn from_str(spec: &str) -> Result<Self> {
        let spec = spec.trim().to_ascii_lowercase();
        let (name, arg) = match spec.split_once(':') {
            Some((n, a)) => (n, Some(a)),
            None => (spec.as_str(), None),
        };
        let gpu = || -> Result<GpuTarget> {
            match arg {
                Some("cpu") => Ok(GpuTarget::Cpu),
                other => index(name, other).map(GpuTarget::Discrete),
            }
        };
        Ok(match name {
            "auto" | "" if arg.is_none() => DeviceSpec::Auto,
            "flex" if arg.is_none() => DeviceSpec::Flex,
            "ndarray" if arg.is_none() => DeviceSpec::Ndarray,
            "cpu" if arg.is_none() => DeviceSpec::Cpu,
            "wgpu" => DeviceSpec::Wgpu(gpu()?),
            "vulkan" => DeviceSpec::Vulkan(gpu()?),
            "metal" => DeviceSpec::Metal(gpu()?),
            "cuda" => DeviceSpec::Cuda(index(name, arg)?),
            "rocm" => DeviceSpec::Rocm(index(name, arg)?),
            _ => {
                return Err(ModelError::Device(format!(
                    "unknown device '{spec}'; use one of: {}",
                    DEVICE_NAMES.join(", ")
                )));
            }
        })
    }
}

impl std::fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let with_index = |f: &mut std::fmt::Formatter<'_>, name: &str, i: usize| {
            if i == 0 {
                f.write_str(name)
            } else {
                write!(f, "{name}:{i}")
            }
        };
        let gpu = |f: &mut std::fmt::Formatter<'_>, name: &str, t: GpuTarget| match t {
            GpuTarget::Cpu => write!(f, "{name}:cpu"),
            GpuTarget::Discrete(i) => with_index(f, name, i),
        };
        match *self {
            DeviceSpec::Auto => f.write_str("auto"),
            DeviceSpec::Flex => f.write_str("flex"),
            DeviceSpec::Ndarray => f.write_str("ndarray"),
            DeviceSpec::Cpu => f.write_str("cpu"),
            DeviceSpec::Wgpu(t) => gpu(f, "wgpu", t),
            DeviceSpec::Vulkan(t) => gpu(f, "vulkan", t),
            DeviceSpec::Metal(t) => gpu(f, "metal", t),
            DeviceSpec::Cuda(i) => with_index(f, "cuda", i),
            DeviceSpec::Rocm(i) => with_index(f, "rocm", i),
        }
    }
}

impl serde::Serialize for DeviceSpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for DeviceSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl DeviceSpec {
    /// Whether this is `auto`.
    pub fn is_auto(self) -> bool {
        self == DeviceSpec::Auto
    }

    /// Creates the device.
    ///
    /// # Errors
    /// A backend that is not compiled in, naming the cargo feature to add (e.g. `backend 'cuda'
    /// is not compiled in; rebuild with --features cuda`); for `auto`, a bad `RLFT_DEVICE` or
    /// `BURN_DEVICE`.
    pub fn device(self) -> Result<Device> {
        match self {
            DeviceSpec::Auto => auto(),
            DeviceSpec::Flex => simple("flex"),
            DeviceSpec::Ndarray => simple("ndarray"),
            DeviceSpec::Cpu => simple("cpu"),
            DeviceSpec::Wgpu(t) => gpu("wgpu", t),
            DeviceSpec::Vulkan(t) => gpu("vulkan", t),
            DeviceSpec::Metal(t) => gpu("metal", t),
            DeviceSpec::Cuda(i) => indexed("cuda", i),
            DeviceSpec::Rocm(i) => indexed("rocm", i),
        }
    }
}

/// Parses a device string (`auto | flex | ndarray | cpu | wgpu | wgpu:cpu | vulkan | metal |
/// cuda[:N] | rocm[:N]`) into a [`Device`]: [`DeviceSpec`], then [`DeviceSpec::device`].
///
/// A backend that is not compiled in gives an error naming the cargo feature to add, e.g.
/// `backend 'cuda' is not compiled in; rebuild with --features cuda`.
pub fn parse(spec: &str) -> Result<Device> {
    spec.parse::<DeviceSpec>()?.device()
}

/// Resolves an optional device string: the string if given, else `RLFT_DEVICE`, else `auto`.
pub fn resolve(spec: Option<&str>) -> Result<Device> {
    match spec {
        Some(s) => parse(s),
        None => auto(),
    }
}

fn auto() -> Result<Device> {
    if let Ok(s) = std::env::var(DEVICE_ENV)
        && !s.trim().is_empty()
        && s.trim() != "auto"
    {
        return parse(&s);
    }
    if let Ok(s) = std::env::var("BURN_DEVICE")
        && !s.trim().is_empty()
    {
        // burn's default device panics on a name it does not know or did not compile: check
        // the value against burn's own list first, then resolve it here.
        let name = s.trim().to_ascii_lowercase();
        if !BURN_DEVICE_NAMES.contains(&name.as_str()) {
            return Err(ModelError::Device(format!(
                "BURN_DEVICE='{s}' is not a backend burn knows; burn accepts exactly one of {} \
                 (no device index: for one, set RLFT_DEVICE=cuda:1 or the recipe's device)",
                BURN_DEVICE_NAMES.join(", ")
            )));
        }
        if ["webgpu", "tch", "remote"].contains(&name.as_str()) {
            return Err(ModelError::Device(format!(
                "BURN_DEVICE='{s}': rlft has no '{name}' backend; use one of {} (compiled in: {})",
                DEVICE_NAMES.join(", "),
                compiled_backends().join(", ")
            )));
        }
        if !compiled_backends().contains(&name.as_str()) {
            return Err(not_compiled(&name));
        }
        return parse(&name);
    }
    if compiled_backends().is_empty() {
        return Err(ModelError::Device(
            "no backend is compiled in; rebuild with --features flex (or another backend)".into(),
        ));
    }
    Ok(Device::default())
}

/// The values burn's default device accepts in `BURN_DEVICE`.
const BURN_DEVICE_NAMES: [&str; 11] = [
    "cuda", "rocm", "metal", "vulkan", "webgpu", "wgpu", "cpu", "tch", "remote", "flex", "ndarray",
];

fn not_compiled(name: &str) -> ModelError {
    ModelError::Device(format!(
        "backend '{name}' is not compiled in; rebuild with --features {name}"
    ))
}

fn index(name: &str, arg: Option<&str>) -> Result<usize> {
    match arg {
        None => Ok(0),
        Some(a) => a.parse::<usize>().map_err(|_| {
            ModelError::Device(format!(
                "device '{name}:{a}': the part after ':' must be a device index such as {name}:0"
            ))
        }),
    }
}

#[allow(unreachable_code, unused_variables)]
fn simple(name: &str) -> Result<Device> {
    match name {
        "flex" => {
            #[cfg(feature = "flex")]
            return Ok(Device::flex());
        }
        "ndarray" => {
            // burn marks ndarray deprecated in favour of flex; it stays selectable on request.
            #[cfg(feature = "ndarray")]
            #[allow(deprecated)]
            return Ok(Device::ndarray());
        }
        _ => {
            #[cfg(feature = "cpu")]
            return Ok(Device::cpu());
        }
    }
    Err(not_compiled(name))
}

#[allow(unreachable_code, unused_variables)]
fn gpu(name: &str, target: GpuTarget) -> Result<Device> {
    #[cfg(any(feature = "wgpu", feature = "vulkan", feature = "metal"))]
    let kind = match target {
        GpuTarget::Cpu => burn::tensor::DeviceKind::Cpu,
        GpuTarget::Discrete(i) => burn::tensor::DeviceKind::DiscreteGpu(i),
    };
    match name {
        "wgpu" => {
            #[cfg(feature = "wgpu")]
            return Ok(Device::wgpu(kind));
        }
        "vulkan" => {
            #[cfg(feature = "vulkan")]
            return Ok(Device::vulkan(kind));
        }
        _ => {
            #[cfg(feature = "metal")]
            return Ok(Device::metal(kind));
        }
    }
    Err(not_compiled(name))
}

#[allow(unreachable_code, unused_variables)]
fn indexed(name: &str, i: usize) -> Result<Device> {
    if name == "cuda" {
        #[cfg(feature = "cuda")]
        return Ok(Device::cuda(i));
    } else {
        #[cfg(feature = "rocm")]
        return Ok(Device::rocm(i));
    }
    Err(not_compiled(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flex_parses() {
        assert!(parse("flex").is_ok());
        assert!(parse(" FLEX ").is_ok());
    }

    #[test]
    fn missing_backend_names_the_feature() {
        if cfg!(feature = "cuda") {
            return;
        }
        let err = parse("cuda:1").unwrap_err().to_string();
        assert_eq!(
            err,
            "backend 'cuda' is not compiled in; rebuild with --features cuda"
        );
    }

    #[test]
    fn unknown_and_bad_index_are_errors() {
        let err = parse("tpu").unwrap_err().to_string();
        assert!(
            err.contains("unknown device 'tpu'") && err.contains("flex"),
            "{err}"
        );
        let err = parse("cuda:x").unwrap_err().to_string();
        assert!(err.contains("device index"), "{err}");
        assert!(parse("flex:0").is_err());
    }

    #[test]
    fn specs_are_written_back_as_read() {
        for text in [
            "auto", "flex", "ndarray", "cpu", "wgpu", "wgpu:cpu", "wgpu:2", "cuda:1", "rocm",
        ] {
            let spec: DeviceSpec = text.parse().unwrap();
            assert_eq!(spec.to_string(), text);
            assert_eq!(spec.to_string().parse::<DeviceSpec>().unwrap(), spec);
        }
        assert_eq!("CUDA:0".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cuda(0));
        assert_eq!("".parse::<DeviceSpec>().unwrap(), DeviceSpec::Auto);
        let spec: DeviceSpec = serde_json::from_str("\"wgpu:cpu\"").unwrap();
        assert_eq!(spec, DeviceSpec::Wgpu(GpuTarget::Cpu));
        assert!(serde_json::from_str::<DeviceSpec>("\"tpu\"").is_err());
    }

    #[test]
    fn compiled_list_has_default_backend() {
        assert!(compiled_backends().contains(&"flex"));
        assert!(parse("auto").is_ok());
    }
}
