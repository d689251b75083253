//! Writing GGUF v3: metadata, the tensor directory and the data, each tensor aligned to 32
//! bytes, in the layout llama.cpp's `gguf` library reads. Tensors are stored as F32, F16 or
//! Q8_0, quantised as llama.cpp's `gguf-py` does (F16 round to nearest even; Q8_0 blocks of 32
//! with an f16 scale `max|x| / 127` and `round(x / scale)`, halves away from zero).

use crate::dequant::GgmlType;

/// Alignment of the data section and of every tensor in it (GGUF's default).
const ALIGNMENT: usize = 32;
/// Values per Q8_0 block.
pub const Q8_0_BLOCK: usize = 32;

/// GGUF metadata value type ids.
mod ty {
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
}

/// A GGUF file being assembled in memory: metadata first, then tensors.
#[derive(Debug, Default)]
pub struct GgufWriter {
    kv: Vec<u8>,
    n_kv: u64,
    /// (name, dims in GGUF order — innermost first —, type, encoded data).
    tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
}

fn put_str(b: &mut Vec<u8>, s: &str) {
    b.extend_from_slice(&(s.len() as u64).to_le_bytes());
    b.extend_from_slice(s.as_bytes());
}

impl GgufWriter {
    /// An empty file.
    pub fn new() -> Self {
        Self::default()
    }

    fn key(&mut self, key: &str, type_id: u32) -> &mut Vec<u8> {
        put_str(&mut self.kv, key);
        self.kv.extend_from_slice(&type_id.to_le_bytes());
        self.n_kv += 1;
        &mut self.kv
    }

    /// A `u32` value.
    pub fn u32(&mut self, key: &str, v: u32) {
        self.key(key, ty::U32).extend_from_slice(&v.to_le_bytes());
    }

    /// An `f32` value.
    pub fn f32(&mut self, key: &str, v: f32) {
        self.key(key, ty::F32).extend_from_slice(&v.to_le_bytes());
    }

    /// A boolean.
    pub fn bool(&mut self, key: &str, v: bool) {
        self.key(key, ty::BOOL).push(u8::from(v));
    }

    /// A UTF-8 string.
    pub fn string(&mut self, key: &str, v: &str) {
        put_str(self.key(key, ty::STRING), v);
    }

    /// An array of strings (possibly empty).
    pub fn strings(&mut self, key: &str, v: &[String]) {
        let b = self.key(key, ty::ARRAY);
        b.extend_from_slice(&ty::STRING.to_le_bytes());
        b.extend_from_slice(&(v.len() as u64).to_le_bytes());
        for s in v {
            put_str(b, s);
        }
    }

    /// An array of `i32`.
    pub fn i32s(&mut self, key: &str, v: &[i32]) {
        let b = self.key(key, ty::ARRAY);
        b.extend_from_slice(&ty::I32.to_le_bytes());
        b.extend_from_slice(&(v.len() as u64).to_le_bytes());
        for x in v {
            b.extend_from_slice(&x.to_le_bytes());
        }
    }

    /// A tensor of row-major `shape` stored as `ty` (F32, F16 or Q8_0; Q8_0 needs rows whose
    /// length is a multiple of [`Q8_0_BLOCK`]).
    ///
    /// # Panics
    /// If `values` does not hold `shape`'s element count, or `ty` is another type or a Q8_0
    /// row length is not a multiple of 32 — callers choose the type per tensor first
    /// ([`crate::GgufFileType::Q8_0`] falls back to F16 as llama.cpp's converter does).
    pub fn tensor(&mut self, name: &str, shape: &[usize], ty: GgmlType, values: &[f32]) {
        assert_eq!(
            shape.iter().product::<usize>(),
            values.len(),
            "tensor {name}: shape {shape:?} does not match its data"
        );
        let data = match ty {
            GgmlType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            GgmlType::F16 => values
                .iter()
                .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
                .collect(),
            GgmlType::Q8_0 => {
                let row = shape.last().copied().unwrap_or(1);
                assert!(
                    row.is_multiple_of(Q8_0_BLOCK),
                    "tensor {name}: Q8_0 rows must be a multiple of {Q8_0_BLOCK} long"
                );
                quantize_q8_0(values)
            }
            other => panic!("tensor {name}: rlft writes F32, F16 and Q8_0, not {other:?}"),
        };
        let dims = shape.iter().rev().map(|&d| d as u64).collect();
        self.tensors.push((name.into(), dims, ty, data));
    }

    /// The file's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let pad = |b: &mut Vec<u8>| b.resize(b.len().next_multiple_of(ALIGNMENT), 0);
        let mut b = b"GGUF".to_vec();
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        b.extend_from_slice(&self.n_kv.to_le_bytes());
        b.extend_from_slice(&self.kv);
        let mut offset = 0usize;
        for (name, dims, ty, data) in &self.tensors {
            put_str(&mut b, name);
            b.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                b.extend_from_slice(&d.to_le_bytes());
            }
            b.extend_from_slice(&ty.id().to_le_bytes());
            b.extend_from_slice(&(offset as u64).to_le_bytes());
            offset = (offset + data.len()).next_multiple_of(ALIGNMENT);
        }
        pad(&mut b);
        for (_, _, _, data) in &self.tensors {
            b.extend_from_slice(data);
            pad(&mut b);
        }
        b
    }
}

/// Q8_0 blocks (f16 scale, 32 × i8) of `values`, whose length is a multiple of 32.
fn quantize_q8_0(values: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() / Q8_0_BLOCK * (2 + Q8_0_BLOCK));
    for block in values.chunks(Q8_0_BLOCK) {
        let d = block.iter().fold(0.0f32, |m, v| m.max(v.abs())) / 127.0;
        let id = if d == 0.0 { 0.0 } else { 1.0 / d };
        out.extend_from_slice(&half::f16::from_f32(d).to_le_bytes());
        // `round` takes halves away from zero, as gguf-py's `np_roundf`.
        out.extend(
            block
                .iter()
                .map(|v| ((v * id).round() as i8).to_le_bytes()[0]),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::{GgufFile, GgufValue};

    #[test]
    fn written_files_read_back() {
        let dir = std::env::temp_dir().join(format!("rlft-gguf-writer-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.gguf");
        let mut w = GgufWriter::new();
        w.string("general.architecture", "tiny");
        w.u32("tiny.block_count", 3);
        w.f32("tiny.rope.freq_base", 5e5);
        w.bool("tokenizer.ggml.add_bos_token", true);
        w.strings("tokenizer.ggml.merges", &[]);
        w.strings("tokenizer.ggml.tokens", &["a".into(), "bc".into()]);
        w.i32s("tokenizer.ggml.token_type", &[1, 3]);
        let values: Vec<f32> = (0..96).map(|i| (i as f32 - 40.0) / 7.0).collect();
        w.tensor("a", &[3, 32], GgmlType::F32, &values);
        w.tensor("b", &[2, 48], GgmlType::F16, &values);
        w.tensor("c", &[3, 32], GgmlType::Q8_0, &values);
        w.tensor("d", &[5], GgmlType::F32, &values[..5]);
        std::fs::write(&path, w.to_bytes()).unwrap();
        let f = GgufFile::open(&path).unwrap();
        assert_eq!(f.get("tiny.block_count"), Some(&GgufValue::U64(3)));
        assert_eq!(f.get("tiny.rope.freq_base").unwrap().as_f64(), Some(5e5));
        assert_eq!(
            f.get("tokenizer.ggml.add_bos_token"),
            Some(&GgufValue::Bool(true))
        );
        assert_eq!(
            f.get("tokenizer.ggml.merges"),
            Some(&GgufValue::Array(vec![]))
        );
        assert_eq!(
            f.get("tokenizer.ggml.token_type"),
            Some(&GgufValue::Array(vec![
                GgufValue::I64(1),
                GgufValue::I64(3)
            ]))
        );
        let (shape, a) = f.read_f32("a").unwrap();
        assert_eq!((shape, a), (vec![3, 32], values.clone()));
        let (shape, b) = f.read_f32("b").unwrap();
        assert_eq!(shape, vec![2, 48]);
        for (x, y) in b.iter().zip(&values) {
            assert_eq!(*x, half::f16::from_f32(*y).to_f32());
        }
        // Q8_0: within half a step of each block's scale.
        let (_, c) = f.read_f32("c").unwrap();
        for (blk, (got, want)) in c.chunks(32).zip(values.chunks(32)).enumerate() {
            let d = want.iter().fold(0.0f32, |m, v| m.max(v.abs())) / 127.0;
            for (x, y) in got.iter().zip(want) {
                assert!((x - y).abs() <= 0.5 * d * 1.01, "block {blk}: {x} vs {y}");
            }
        }
        assert_eq!(f.read_f32("d").unwrap().1, values[..5].to_vec());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn q8_0_matches_gguf_py() {
        // gguf-py: d = max|x| / 127 (as f16), qs = round(x / d) with halves away from zero.
        let mut block = [0.0f32; 32];
        block[0] = 127.0;
        block[1] = -63.5;
        block[2] = 0.5;
        block[3] = -2.4;
        let q = quantize_q8_0(&block);
        assert_eq!(half::f16::from_le_bytes([q[0], q[1]]).to_f32(), 1.0);
        assert_eq!(&q[2..6], &[127u8, (-64i8) as u8, 1, (-2i8) as u8]);
        assert_eq!(quantize_q8_0(&[0.0; 32])[..4], [0, 0, 0, 0]);
    }
}
