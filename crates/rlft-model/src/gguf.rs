//! GGUF v2/v3 container: header, metadata and tensor directory, read with bounds checks.
//!
//! No maintained Rust crate fits: `ggus` 0.5 accepts only v3, reads enum tags with an unchecked
//! cast and slices past the end of truncated files, and `ggml-quants` 0.1 leaves the K-quant
//! dequantisers as `todo!()`. The format is small, so rlft reads it here: every length and
//! offset is checked against the file size before use, so a truncated or corrupt file is an
//! error, never a panic or an out-of-bounds read. Dequantisers are in [`crate::dequant`].

use crate::dequant::GgmlType;
use crate::{ModelError, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub(crate) mod names;
pub mod writer;
pub use writer::GgufWriter;

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;

/// A GGUF header as read: the version, the metadata and the tensor table.
type Parsed = (
    u32,
    BTreeMap<String, GgufValue>,
    BTreeMap<String, GgufTensorInfo>,
);

/// Upper bound on element counts in metadata arrays and directories, far above any real model
/// (the largest vocabularies have ~256k entries), so corrupt counts fail before allocating.
const MAX_COUNT: u64 = 1 << 24;

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    /// Any unsigned integer type.
    U64(u64),
    /// Any signed integer type.
    I64(i64),
    /// f32 or f64.
    F64(f64),
    /// Boolean.
    Bool(bool),
    /// UTF-8 string.
    Str(String),
    /// Array of values.
    Array(Vec<GgufValue>),
}

impl GgufValue {
    /// As a non-negative integer, if it is one.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Self::U64(v) => Some(v),
            Self::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }
    /// As a float, if numeric.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Self::F64(v) => Some(v),
            Self::U64(v) => Some(v as f64),
            Self::I64(v) => Some(v as f64),
            _ => None,
        }
    }
    /// As a string, if it is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::Str(s) => Some(s),
            _ => None,
        }
    }
    /// As a bool, if it is one.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Self::Bool(b) => Some(b),
            _ => None,
        }
    }
    /// As an array, if it is one.
    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            Self::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// Where one tensor lives in the file.
#[derive(Debug, Clone)]
pub struct GgufTensorInfo {
    /// Dimensions in GGUF order (`dims[0]` is the innermost, contiguous one).
    pub dims: Vec<u64>,
    /// Storage type.
    pub ty: GgmlType,
    /// Absolute byte range in the file.
    pub range: std::ops::Range<usize>,
}

impl GgufTensorInfo {
    /// Shape in row-major (PyTorch) order: the GGUF dims reversed.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
}

/// A memory-mapped GGUF file.
pub struct GgufFile {
    path: PathBuf,
    map: memmap2::Mmap,
    /// Format version (2 or 3).
    pub version: u32,
    /// Metadata key → value.
    pub metadata: BTreeMap<String, GgufValue>,
    /// Tensor name → location.
    pub tensors: BTreeMap<String, GgufTensorInfo>,
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> std::result::Result<&'a [u8], String> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| {
                format!(
                    "truncated: needs {n} bytes at offset {} but the file has {}",
                    self.pos,
                    self.buf.len()
                )
            })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn array<const N: usize>(&mut self) -> std::result::Result<[u8; N], String> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    fn u32(&mut self) -> std::result::Result<u32, String> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> std::result::Result<u64, String> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    fn count(&mut self, what: &str) -> std::result::Result<usize, String> {
        let n = self.u64()?;
        if n > MAX_COUNT {
            return Err(format!("{what} count {n} is implausible (corrupt file?)"));
        }
        Ok(n as usize)
    }
    fn string(&mut self) -> std::result::Result<String, String> {
        let n = self.u64()?;
        let n = usize::try_from(n).map_err(|_| format!("string length {n} is implausible"))?;
        let bytes = self.take(n)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| format!("string at offset {} is not UTF-8", self.pos - n))
    }
    fn value(&mut self, ty: u32, depth: usize) -> std::result::Result<GgufValue, String> {
        Ok(match ty {
            0 => GgufValue::U64(u64::from(self.array::<1>()?[0])),
            1 => GgufValue::I64(i64::from(i8::from_le_bytes(self.array()?))),
            2 => GgufValue::U64(u64::from(u16::from_le_bytes(self.array()?))),
            3 => GgufValue::I64(i64::from(i16::from_le_bytes(self.array()?))),
            4 => GgufValue::U64(u64::from(self.u32()?)),
            5 => GgufValue::I64(i64::from(i32::from_le_bytes(self.array()?))),
            6 => GgufValue::F64(f64::from(f32::from_le_bytes(self.array()?))),
            7 => match self.array::<1>()?[0] {
                0 => GgufValue::Bool(false),
                1 => GgufValue::Bool(true),
                b => return Err(format!("bool byte {b} at offset {}", self.pos - 1)),
            },
            8 => GgufValue::Str(self.string()?),
            9 => {
                if depth > 4 {
                    return Err("arrays nested too deeply".into());
                }
                let item_ty = self.u32()?;
                let n = self.count("array")?;
                let mut items = Vec::with_capacity(n.min(1 << 16));
                for _ in 0..n {
                    items.push(self.value(item_ty, depth + 1)?);
                }
                GgufValue::Array(items)
            }
            10 => GgufValue::U64(self.u64()?),
            11 => GgufValue::I64(i64::from_le_bytes(self.array()?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.array()?)),
            t => return Err(format!("unknown metadata value type {t}")),
        })
    }
}

impl GgufFile {
    /// Opens and indexes `path`. Tensor data stays on disk (memory-mapped) until read.
    pub fn open(path: &Path) -> Result<Self> {
        let file = std::fs::File::open(path).map_err(|source| ModelError::Io {
            path: path.into(),
            source,
        })?;
        // SAFETY: read-only map owned by the returned value; concurrent modification of the file
        // is the caller's race, as with any reader.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|source| ModelError::Io {
            path: path.into(),
            source,
        })?;
        let err = |msg: String| ModelError::Weights {
            path: path.into(),
            msg,
        };
        let (version, metadata, tensors) = Self::parse(&map).map_err(err)?;
        Ok(Self {
            path: path.into(),
            map,
            version,
            metadata,
            tensors,
        })
    }

    fn parse(buf: &[u8]) -> std::result::Result<Parsed, String> {
        let mut r = Reader { buf, pos: 0 };
        if r.take(4)
            .map_err(|_| "not a GGUF file (too short)".to_string())?
            != MAGIC
        {
            return Err("not a GGUF file (magic is not 'GGUF')".into());
        }
        let version = r.u32()?;
        if !(2..=3).contains(&version) {
            return Err(format!(
                "GGUF version {version} is not supported (2 and 3 are); re-convert with a recent llama.cpp"
            ));
        }
        let n_tensors = r.count("tensor")?;
        let n_kv = r.count("metadata")?;
        let mut metadata = BTreeMap::new();
        for _ in 0..n_kv {
            let key = r.string()?;
            let ty = r.u32()?;
            let v = r
                .value(ty, 0)
                .map_err(|e| format!("metadata '{key}': {e}"))?;
            metadata.insert(key, v);
        }
        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => v
                .as_u64()
                .filter(|a| a.is_power_of_two())
                .ok_or("general.alignment is not a power of two")?,
        };
        let mut raw = Vec::with_capacity(n_tensors.min(1 << 16));
        for _ in 0..n_tensors {
            let name = r.string()?;
            let n_dims = r.u32()?;
            if n_dims == 0 || n_dims > 4 {
                return Err(format!("tensor '{name}' has {n_dims} dimensions"));
            }
            let dims: Vec<u64> = (0..n_dims).map(|_| r.u64()).collect::<Result<_, _>>()?;
            let ty_id = r.u32()?;
            let ty = GgmlType::from_id(ty_id).ok_or_else(|| {
                format!(
                    "tensor '{name}' has ggml type {ty_id}, which rlft does not read (supported: {})",
                    GgmlType::SUPPORTED
                )
            })?;
            let offset = r.u64()?;
            raw.push((name, dims, ty, offset));
        }
        let data_start = (r.pos as u64).div_ceil(alignment) * alignment;
        let mut tensors = BTreeMap::new();
        for (name, dims, ty, offset) in raw {
            let numel = dims
                .iter()
                .try_fold(1u64, |a, &d| a.checked_mul(d))
                .ok_or_else(|| format!("tensor '{name}' dims {dims:?} overflow"))?;
            let nbytes = ty.byte_len(numel).ok_or_else(|| {
                if numel.is_multiple_of(ty.block().0 as u64) {
                    format!("tensor '{name}' ({ty:?}) has {numel} elements, more bytes than a file can hold")
                } else {
                    format!(
                        "tensor '{name}' ({ty:?}) has {numel} elements, not a whole number of blocks"
                    )
                }
            })?;
            let start = data_start
                .checked_add(offset)
                .ok_or_else(|| format!("tensor '{name}' offset overflows"))?;
            let end = start
                .checked_add(nbytes)
                .filter(|&e| e <= buf.len() as u64)
                .ok_or_else(|| {
                    format!(
                        "truncated: tensor '{name}' needs {nbytes} bytes at offset {start} but the file has {}",
                        buf.len()
                    )
                })?;
            tensors.insert(
                name,
                GgufTensorInfo {
                    dims,
                    ty,
                    range: start as usize..end as usize,
                },
            );
        }
        Ok((version, metadata, tensors))
    }

    /// The file this was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A metadata value.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }

    /// A required metadata value, or an error naming the key.
    pub fn require(&self, key: &str) -> Result<&GgufValue> {
        self.get(key).ok_or_else(|| ModelError::Weights {
            path: self.path.clone(),
            msg: format!("metadata key '{key}' is missing"),
        })
    }

    /// A tensor's values as f32 (row-major, shape [`GgufTensorInfo::shape`]).
    pub fn read_f32(&self, name: &str) -> Option<(Vec<usize>, Vec<f32>)> {
        let info = self.tensors.get(name)?;
        let numel = info.dims.iter().product::<u64>() as usize;
        let values = info.ty.dequantize(&self.map[info.range.clone()], numel);
        Some((info.shape(), values))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal v3 file with one string, one array and one F32 tensor.
    fn tiny_file(version: u32) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&version.to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes()); // tensors
        b.extend_from_slice(&2u64.to_le_bytes()); // kv
        let s = |b: &mut Vec<u8>, s: &str| {
            b.extend_from_slice(&(s.len() as u64).to_le_bytes());
            b.extend_from_slice(s.as_bytes());
        };
        s(&mut b, "general.architecture");
        b.extend_from_slice(&8u32.to_le_bytes());
        s(&mut b, "tiny");
        s(&mut b, "x.ids");
        b.extend_from_slice(&9u32.to_le_bytes());
        b.extend_from_slice(&5u32.to_le_bytes());
        b.extend_from_slice(&2u64.to_le_bytes());
        b.extend_from_slice(&7i32.to_le_bytes());
        b.extend_from_slice(&(-1i32).to_le_bytes());
        s(&mut b, "w");
        b.extend_from_slice(&2u32.to_le_bytes());
        b.extend_from_slice(&3u64.to_le_bytes());
        b.extend_from_slice(&2u64.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes()); // F32
        b.extend_from_slice(&0u64.to_le_bytes());
        while !b.len().is_multiple_of(32) {
            b.push(0);
        }
        for v in [1f32, 2., 3., 4., 5., 6.] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b
    }

    #[test]
    fn parses_v2_and_v3_and_rejects_every_truncation() {
        for version in [2, 3] {
            let bytes = tiny_file(version);
            let (v, meta, tensors) = GgufFile::parse(&bytes).unwrap();
            assert_eq!(v, version);
            assert_eq!(meta["general.architecture"].as_str(), Some("tiny"));
            assert_eq!(
                meta["x.ids"],
                GgufValue::Array(vec![GgufValue::I64(7), GgufValue::I64(-1)])
            );
            let w = &tensors["w"];
            assert_eq!(w.shape(), vec![2, 3]);
            assert_eq!(w.range.end, bytes.len());
            // Every strict prefix is an error, never a panic.
            for cut in 0..bytes.len() {
                assert!(
                    GgufFile::parse(&bytes[..cut]).is_err(),
                    "prefix {cut} parsed"
                );
            }
        }
        let mut bad = tiny_file(3);
        bad[4] = 9;
        assert!(GgufFile::parse(&bad).unwrap_err().contains("version 9"));
        let mut huge = tiny_file(3);
        huge[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(GgufFile::parse(&huge).unwrap_err().contains("implausible"));
    }

    /// A v3 file with no metadata and one tensor `w` of `dims`, type `ty`, at `offset`.
    fn one_tensor(dims: &[u64], ty: u32, offset: u64) -> Vec<u8> {
        let mut b = MAGIC.to_vec();
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes());
        b.push(b'w');
        b.extend_from_slice(&(dims.len() as u32).to_le_bytes());
        dims.iter()
            .for_each(|d| b.extend_from_slice(&d.to_le_bytes()));
        b.extend_from_slice(&ty.to_le_bytes());
        b.extend_from_slice(&offset.to_le_bytes());
        b
    }

    /// Regression (found by the property tests): 2^62 F32 elements overflowed the byte count.
    #[test]
    fn tensor_byte_count_overflow_is_an_error() {
        let e = GgufFile::parse(&one_tensor(&[1 << 62], 0, 0)).unwrap_err();
        assert!(
            e.contains("'w'") && e.contains("more bytes than a file can hold"),
            "{e}"
        );
    }

    /// Regression: an offset ending within `u64` but whose tensor end overflows panicked while
    /// formatting the truncation error.
    #[test]
    fn tensor_end_overflow_is_an_error() {
        let e = GgufFile::parse(&one_tensor(&[1], 0, u64::MAX - 64)).unwrap_err();
        assert!(e.contains("truncated: tensor 'w' needs 4 bytes"), "{e}");
    }
}
