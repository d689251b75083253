//! ggml tensor storage types and their dequantisers (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K,
//! Q5_K, Q6_K), following the block layouts of llama.cpp's `ggml-quants.c`.
//!
//! Each dequantiser is tested against a block dequantised by gguf-py (llama.cpp's own Python
//! package): see `tests/data/quant_blocks.json` and `scripts/make_quant_blocks.py`.

use half::f16;

/// Elements per K-quant super-block.
const QK_K: usize = 256;

/// A ggml storage type rlft can read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types, missing_docs)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q8_0,
    Q4_K,
    Q5_K,
    Q6_K,
}

impl GgmlType {
    /// The supported types, for error messages.
    pub const SUPPORTED: &'static str = "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K";

    /// From the ggml type id in a GGUF tensor directory.
    pub fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            8 => Self::Q8_0,
            12 => Self::Q4_K,
            13 => Self::Q5_K,
            14 => Self::Q6_K,
            30 => Self::BF16,
            _ => return None,
        })
    }

    /// The ggml type id written in a GGUF tensor directory (the inverse of [`Self::from_id`]).
    pub fn id(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q4_0 => 2,
            Self::Q4_1 => 3,
            Self::Q8_0 => 8,
            Self::Q4_K => 12,
            Self::Q5_K => 13,
            Self::Q6_K => 14,
            Self::BF16 => 30,
        }
    }

    /// (elements per block, bytes per block).
    pub fn block(self) -> (usize, usize) {
        match self {
            Self::F32 => (1, 4),
            Self::F16 | Self::BF16 => (1, 2),
            Self::Q4_0 => (32, 18),
            Self::Q4_1 => (32, 20),
            Self::Q8_0 => (32, 34),
            Self::Q4_K => (QK_K, 144),
            Self::Q5_K => (QK_K, 176),
            Self::Q6_K => (QK_K, 210),
        }
    }

    /// Bytes holding `numel` elements, or `None` if `numel` is not a whole number of blocks or
    /// the byte count does not fit in a `u64`.
    pub fn byte_len(self, numel: u64) -> Option<u64> {
        let (n, b) = self.block();
        numel
            .is_multiple_of(n as u64)
            .then(|| (numel / n as u64).checked_mul(b as u64))
            .flatten()
    }

    /// Dequantises `bytes` (exactly [`Self::byte_len`] of `numel`) to f32.
    pub fn dequantize(self, bytes: &[u8], numel: usize) -> Vec<f32> {
        let (n, b) = self.block();
        debug_assert_eq!(bytes.len(), numel / n * b);
        let mut out = Vec::with_capacity(numel);
        let blocks = bytes.chunks_exact(b);
        match self {
            Self::F32 => out.extend(blocks.map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))),
            Self::F16 => out.extend(blocks.map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())),
            Self::BF16 => {
                out.extend(blocks.map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()))
            }
            Self::Q4_0 => blocks.for_each(|c| q4_0(c, &mut out)),
            Self::Q4_1 => blocks.for_each(|c| q4_1(c, &mut out)),
            Self::Q8_0 => blocks.for_each(|c| q8_0(c, &mut out)),
            Self::Q4_K => blocks.for_each(|c| q4_k(c, &mut out)),
            Self::Q5_K => blocks.for_each(|c| q5_k(c, &mut out)),
            Self::Q6_K => blocks.for_each(|c| q6_k(c, &mut out)),
        }
        out
    }
}

fn half_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// `{d: f16, qs: [u8; 16]}`: low nibbles are elements 0..16, high nibbles 16..32, offset −8.
fn q4_0(b: &[u8], out: &mut Vec<f32>) {
    let d = half_at(b, 0);
    let qs = &b[2..18];
    out.extend(qs.iter().map(|&q| ((q & 0xF) as f32 - 8.0) * d));
    out.extend(qs.iter().map(|&q| ((q >> 4) as f32 - 8.0) * d));
}

/// `{d: f16, m: f16, qs: [u8; 16]}`: `x = q·d + m`.
fn q4_1(b: &[u8], out: &mut Vec<f32>) {
    let (d, m) = (half_at(b, 0), half_at(b, 2));
    let qs = &b[4..20];
    out.extend(qs.iter().map(|&q| (q & 0xF) as f32 * d + m));
    out.extend(qs.iter().map(|&q| (q >> 4) as f32 * d + m));
}

/// `{d: f16, qs: [i8; 32]}`.
fn q8_0(b: &[u8], out: &mut Vec<f32>) {
    let d = half_at(b, 0);
    out.extend(b[2..34].iter().map(|&q| q as i8 as f32 * d));
}

/// The 6-bit (scale, min) pair `j` of a K-quant block's 12 packed scale bytes.
fn scale_min_k4(j: usize, q: &[u8]) -> (f32, f32) {
    let (sc, m) = if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    };
    (sc as f32, m as f32)
}

/// `{d: f16, dmin: f16, scales: [u8; 12], qs: [u8; 128]}`: 8 sub-blocks of 32 with 6-bit scales
/// and mins; each 32 bytes of `qs` hold two sub-blocks (low nibbles, then high nibbles).
fn q4_k(b: &[u8], out: &mut Vec<f32>) {
    let (d, dmin) = (half_at(b, 0), half_at(b, 2));
    let scales = &b[4..16];
    for (chunk, q) in b[16..144].chunks_exact(32).enumerate() {
        let (s1, m1) = scale_min_k4(2 * chunk, scales);
        let (s2, m2) = scale_min_k4(2 * chunk + 1, scales);
        out.extend(q.iter().map(|&x| d * s1 * (x & 0xF) as f32 - dmin * m1));
        out.extend(q.iter().map(|&x| d * s2 * (x >> 4) as f32 - dmin * m2));
    }
}

/// `{d, dmin, scales: [u8; 12], qh: [u8; 32], qs: [u8; 128]}`: as Q4_K plus a fifth bit per
/// element from `qh` (bit `2·chunk` for the low nibbles, `2·chunk + 1` for the high ones).
fn q5_k(b: &[u8], out: &mut Vec<f32>) {
    let (d, dmin) = (half_at(b, 0), half_at(b, 2));
    let scales = &b[4..16];
    let qh = &b[16..48];
    for (chunk, ql) in b[48..176].chunks_exact(32).enumerate() {
        let (s1, m1) = scale_min_k4(2 * chunk, scales);
        let (s2, m2) = scale_min_k4(2 * chunk + 1, scales);
        let (u1, u2) = (1u8 << (2 * chunk), 2u8 << (2 * chunk));
        let hi = |h: u8, u: u8| if h & u != 0 { 16.0 } else { 0.0 };
        out.extend(
            ql.iter()
                .zip(qh)
                .map(|(&x, &h)| d * s1 * ((x & 0xF) as f32 + hi(h, u1)) - dmin * m1),
        );
        out.extend(
            ql.iter()
                .zip(qh)
                .map(|(&x, &h)| d * s2 * ((x >> 4) as f32 + hi(h, u2)) - dmin * m2),
        );
    }
}

/// `{ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16}`: 6-bit values (4 low bits from
/// `ql`, 2 high bits from `qh`) offset by −32, 16 sub-blocks of 16 with signed 8-bit scales.
fn q6_k(b: &[u8], out: &mut Vec<f32>) {
    let d = half_at(b, 208);
    let start = out.len();
    out.resize(start + QK_K, 0.0);
    let y = &mut out[start..];
    for half in 0..2 {
        let ql = &b[64 * half..64 * half + 64];
        let qh = &b[128 + 32 * half..128 + 32 * half + 32];
        let sc = &b[192 + 8 * half..192 + 8 * half + 8];
        let y = &mut y[128 * half..128 * half + 128];
        for l in 0..32 {
            let is = l / 16;
            let q = [
                (ql[l] & 0xF) | ((qh[l] & 3) << 4),
                (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4),
                (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
                (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4),
            ];
            for (k, &qk) in q.iter().enumerate() {
                let s = sc[is + 2 * k] as i8 as f32;
                y[l + 32 * k] = d * s * (qk as i32 - 32) as f32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_sizes_match_ggml() {
        // (type id, elements, bytes) from ggml.c's type_traits.
        for (id, n, b) in [
            (2, 32, 18),
            (3, 32, 20),
            (8, 32, 34),
            (12, 256, 144),
            (13, 256, 176),
            (14, 256, 210),
        ] {
            assert_eq!(GgmlType::from_id(id).unwrap().block(), (n, b));
        }
        for id in 0..64 {
            if let Some(t) = GgmlType::from_id(id) {
                assert_eq!(t.id(), id);
            }
        }
        assert_eq!(GgmlType::Q4_0.byte_len(64), Some(36));
        assert_eq!(GgmlType::Q4_K.byte_len(100), None);
        // 2^62 f32 elements are 2^64 bytes: an overflow, not a length.
        assert_eq!(GgmlType::F32.byte_len(1 << 62), None);
        assert_eq!(GgmlType::F16.byte_len(1 << 62), Some(1 << 63));
        assert_eq!(GgmlType::from_id(6), None);
    }

    /// Blocks dequantised by gguf-py (`scripts/make_quant_blocks.py`): exact f32 equality.
    #[test]
    fn matches_gguf_py_on_known_blocks() {
        let data: serde_json::Value =
            serde_json::from_str(include_str!("../tests/data/quant_blocks.json")).unwrap();
        let mut seen = Vec::new();
        for case in data["cases"].as_array().unwrap() {
            let name = case["type"].as_str().unwrap();
            let ty = match name {
                "Q4_0" => GgmlType::Q4_0,
                "Q4_1" => GgmlType::Q4_1,
                "Q8_0" => GgmlType::Q8_0,
                "Q4_K" => GgmlType::Q4_K,
                "Q5_K" => GgmlType::Q5_K,
                "Q6_K" => GgmlType::Q6_K,
                other => panic!("unknown type {other}"),
            };
            let bytes: Vec<u8> = serde_json::from_value(case["bytes"].clone()).unwrap();
            let want: Vec<f32> = serde_json::from_value(case["values"].clone()).unwrap();
            let got = ty.dequantize(&bytes, want.len());
            assert_eq!(got, want, "{name}");
            seen.push(name.to_string());
        }
        assert_eq!(seen.len(), 6);
    }

    #[test]
    fn q4_0_by_hand() {
        // d = 0.5, every byte 0x9A: low nibble 10 → (10−8)·0.5 = 1, high 9 → 0.5.
        let mut b = vec![0u8; 18];
        b[..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        b[2..].fill(0x9A);
        let v = GgmlType::Q4_0.dequantize(&b, 32);
        assert!(v[..16].iter().all(|&x| x == 1.0));
        assert!(v[16..].iter().all(|&x| x == 0.5));
    }
}
