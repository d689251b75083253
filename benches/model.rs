//! SmolLM2-135M on the default device: one no-autodiff forward at 8 × 128 (full-vocabulary
//! logits), single decode steps at batch 1 and 8 with a 32-token KV cache (on the backend, and on
//! the host as the sampler runs them on a CPU device), and the backend's f32 matrix product at
//! the learner's shapes (reported as FLOP/s; `scripts/matmul_torch.py` times PyTorch's).
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

/// `[m, k] × [k, n]` products of a SmolLM2 learner step on ~560 packed tokens: q/o, gate/up,
/// down, a weight gradient, and the output head at ~240 response positions.
const LEARNER_SHAPES: [(usize, usize, usize); 5] = [
    (560, 576, 576),
    (560, 576, 1536),
    (560, 1536, 576),
    (576, 560, 1536),
    (240, 576, 49152),
];

fn matmul(c: &mut Criterion) {
    let device = rlft::device::resolve(None).expect("default device");
    let mut g = c.benchmark_group("matmul_f32");
    g.sample_size(20);
    for (m, k, n) in LEARNER_SHAPES {
        let a = Tensor::<2>::ones([m, k], &device);
        let b = Tensor::<2>::ones([k, n], &device);
        g.throughput(Throughput::Elements(2 * (m * k * n) as u64));
        g.bench_function(format!("{m}x{k}x{n}"), |bench| {
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
