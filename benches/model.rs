//! SmolLM2-135M on the default device: one no-autodiff forward at 8 × 128 (full-vocabulary
//! logits), single decode steps at batch 1 and 8 with a 32-token KV cache (on the backend, and on
//! the host as the sampler runs them on a CPU device), and the backend's f32 matrix product at
//! the learner's shapes and layouts (reported as FLOP/s; `scripts/matmul_torch.py` times
//! PyTorch's). It allocates through rlft's allocator (`rlft::alloc`), as the `rlft` binary and
//! the examples do: with the system allocator every product's output is fresh pages from the
//! OS, and at these shapes the page faults cost as much as the product.
//!
//! ```text
//! ./scripts/fetch-smollm2.sh && cargo bench --bench model
//! ```
//! Skips the model benchmarks (printing why) when the GGUF is missing. `RLFT_SMOLLM2_GGUF`
//! overrides the path.

use burn::tensor::{DType, Int, Tensor, TensorData};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use rlft::model::{ForwardInput, HostWeights, KvCache, Pretrained};
use std::path::PathBuf;

#[global_allocator]
static GLOBAL: rlft::alloc::Allocator = rlft::alloc::Allocator;

fn model_path() -> Option<PathBuf> {
    let p = std::env::var_os("RLFT_SMOLLM2_GGUF")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("models/SmolLM2-135M-Instruct.Q4_1.gguf"));
    if p.exists() {
        return Some(p);
    }
    eprintln!(
        "skipped: {} missing; run scripts/fetch-smollm2.sh",
        p.display()
    );
    None
}

fn ids(b: usize, t: usize, device: &burn::tensor::Device) -> Tensor<2, Int> {
    let v: Vec<i64> = (0..b * t).map(|i| 17 + (i as i64 * 7919) % 40000).collect();
    Tensor::from_data(TensorData::new(v, [b, t]), device)
}

/// The `[m, k] × [k, n]` products of a SmolLM2 learner step on ~560 packed tokens, each
/// operand laid out as the step holds it (`t`: a transposed view of a row-major matrix):
/// `(name, m, k, n, lhs transposed, rhs transposed)`. A linear layer `y = x·W` (`W`:
/// `[in, out]`) runs `x·W`, `dy·Wᵀ` (the input's gradient) and `xᵀ·dy` (the weight's); the
/// tied output head `z = h·Eᵀ` (`E`: `[vocab, hidden]`, ~240 response positions) runs `h·Eᵀ`,
/// `dz·E` and `dzᵀ·h`.
const LEARNER_PRODUCTS: [(&str, usize, usize, usize, bool, bool); 12] = [
    ("q_o_fwd", 560, 576, 576, false, false),
    ("q_o_dx", 560, 576, 576, false, true),
    ("q_o_dw", 576, 560, 576, true, false),
    ("gate_up_fwd", 560, 576, 1536, false, false),
    ("gate_up_dx", 560, 1536, 576, false, true),
    ("gate_up_dw", 576, 560, 1536, true, false),
    ("down_fwd", 560, 1536, 576, false, false),
    ("down_dx", 560, 576, 1536, false, true),
    ("down_dw", 1536, 560, 576, true, false),
    ("head_fwd", 240, 576, 49152, false, true),
    ("head_dh", 240, 49152, 576, false, false),
    ("head_de", 49152, 240, 576, true, false),
];

/// A `[rows, cols]` operand of ones, stored transposed (`[cols, rows]`, viewed back) when `t`.
fn operand(rows: usize, cols: usize, t: bool, device: &burn::tensor::Device) -> Tensor<2> {
    if t {
        Tensor::<2>::ones([cols, rows], device).transpose()
    } else {
        Tensor::<2>::ones([rows, cols], device)
    }
}

fn matmul(c: &mut Criterion) {
    let device = rlft::device::resolve(None).expect("default device");
    let mut g = c.benchmark_group("matmul_f32");
    g.sample_size(20);
    for (name, m, k, n, lhs_t, rhs_t) in LEARNER_PRODUCTS {
        let a = operand(m, k, lhs_t, &device);
        let b = operand(k, n, rhs_t, &device);
        g.throughput(Throughput::Elements(2 * (m * k * n) as u64));
        g.bench_function(format!("{name}/{m}x{k}x{n}"), |bench| {
            bench.iter(|| {
                a.clone()
                    .matmul(b.clone())
                    .slice([0..1, 0..1])
                    .into_scalar::<f32>()
            })
        });
    }
    g.finish();
}

fn bench(c: &mut Criterion) {
    let Some(path) = model_path() else { return };
    let device = rlft::device::resolve(None).expect("default device");
    let p = Pretrained::load(&path, &device, DType::F32).expect("load SmolLM2");
    let mut g = c.benchmark_group("smollm2_135m");
    g.sample_size(10);
    let input = ForwardInput::new(ids(8, 128, &device));
    g.bench_function("forward_8x128", |b| {
        b.iter(|| p.model.forward(&input).sum().into_scalar::<f32>())
    });
    for batch in [1usize, 8] {
        let prompt = ForwardInput::new(ids(batch, 32, &device));
        let mut cache = KvCache::new();
        p.model.forward_cached(&prompt, &mut cache);
        let step = ForwardInput {
            input_ids: ids(batch, 1, &device),
            position_ids: Tensor::from_data(
                TensorData::new(vec![32i64; batch], [batch, 1]),
                &device,
            ),
            attention_mask: None,
            segment_ids: None,
            prefix_ids: None,
        };
        g.bench_function(format!("decode_step_b{batch}_ctx32"), |b| {
            b.iter(|| {
                let mut c = cache.clone();
                p.model
                    .forward_cached(&step, &mut c)
                    .sum()
                    .into_scalar::<f32>()
            })
        });
        if !HostWeights::suits(&device) {
            continue;
        }
        let host = HostWeights::new(&p.model).expect("host copies");
        let host_cache = cache.to_host().expect("unpadded cache");
        let tokens: Vec<u32> = (0..batch as u32).map(|r| 17 + r).collect();
        g.bench_function(format!("host_decode_step_b{batch}_ctx32"), |b| {
            b.iter(|| {
                let mut c = host_cache.clone();
                host.decode_step(&mut c, &tokens, &vec![32; batch])
                    .expect("decode step")[0]
            })
        });
    }
    g.finish();
}

criterion_group!(benches, matmul, bench);
criterion_main!(benches);
