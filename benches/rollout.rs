//! Generation throughput on SmolLM2-135M with bench_hf.py's settings: one 32-token prompt × G = 8,
//! exactly 64 new tokens (EOS not stopping), temperature 1, no top-k/top-p, default device.
//!
//! ```text
//! ./scripts/fetch-smollm2.sh && cargo bench --bench rollout
//! ```
//! Tokens/s = 8 × 64 / time per iteration. Skips when the GGUF is missing.

use burn::tensor::DType;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use rlft::model::Pretrained;
use rlft::rollout::{Sampler, SamplingConfig};
use std::path::PathBuf;

fn bench(c: &mut Criterion) {
    let path = std::env::var_os("RLFT_SMOLLM2_GGUF")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("models/SmolLM2-135M-Instruct.Q4_1.gguf"));
    if !path.exists() {
        eprintln!(
            "skipped: {} missing; run scripts/fetch-smollm2.sh",
            path.display()
        );
        return;
    }
    let device = rlft::device::resolve(None).expect("default device");
    let p = Pretrained::load(&path, &device, DType::F32).expect("load SmolLM2");
    let text = "Group relative policy optimisation removes the value network entirely: the \
                advantage of each completion is its reward minus the mean reward of its group.";
    let prompt: Vec<u32> = p.tokenizer.encode(text).expect("encode")[..32].to_vec();
    let prompts = vec![prompt; 8];
    let sampler = Sampler::new(&p.model, None);
    let mut g = c.benchmark_group("generate_smollm2_135m");
    g.sample_size(10);
    g.throughput(Throughput::Elements(8 * 64));
    let mut seed = 0;
    g.bench_function("b8_prompt32_new64", |b| {
        b.iter(|| {
            seed += 1;
            let cfg = SamplingConfig::new()
                .with_max_new_tokens(64)
                .with_ignore_eos(true)
                .with_seed(seed);
            sampler.generate(&prompts, &cfg).expect("generate")
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
