//! `rlft serve` as a client sees it: the real binary on the tiny fixtures, driven over loopback
//! HTTP. Completions carry the sampled ids and `log μ`, and equal what rlft's sampler draws
//! in-process for the same rows and seed; chat runs through the chat template (400 without
//! one); streamed answers are the unstreamed ones cut into chunks, and a client that leaves
//! mid-stream frees its slot; bad requests are 4xx errors naming the field while the server
//! keeps serving; the API key guards every route but `/health`; a refused weight update leaves
//! the old version serving.
//! Every server started here is killed when its test ends, also on failure.

#[path = "support/cli.rs"]
mod cli;

#[path = "support/serve.rs"]
mod serve;

use cli::{Scratch, check_all, root, tiny_llama};
use serde_json::{Value, json};
use serve::Serve;
use std::process::Command;

/// The ids of every choice.
fn ids(v: &Value) -> Vec<Vec<u64>> {
    v["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            c["rlft"]["token_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_u64().unwrap())
                .collect()
        })
        .collect()
}

#[test]
fn completions_return_what_the_sampler_draws_in_process() {
    let s = Serve::start(&tiny_llama(), &[]);
    let prompts = vec![vec![1u32, 17, 42, 99], vec![1, 5, 6]];
    let body = json!({
        "model": "policy", "prompt": prompts, "n": 2, "max_tokens": 8,
        "temperature": 0.9, "top_k": 40, "seed": 1234, "logprobs": 1,
        "return_tokens_as_token_ids": true, "return_token_ids": true,
    });
    let a = s.complete(body.clone());
    let b = s.complete(body.clone());
    assert_eq!(ids(&a), ids(&b), "the same request gave other tokens");
    let choices = a["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 4);
    let mut other = body.clone();
    other["seed"] = 99.into();
    assert_ne!(
        ids(&s.complete(other)),
        ids(&a),
        "another seed gave the same tokens"
    );

    // The same rows and settings through rlft's sampler in this process.
    use rlft::model::Pretrained;
    use rlft::rollout::{Sampler, SamplingConfig};
    let device = rlft::burn::tensor::Device::flex();
    let p = Pretrained::load(&tiny_llama(), &device, rlft::burn::tensor::DType::F32).unwrap();
    let rows: Vec<Vec<u32>> = prompts
        .iter()
        .flat_map(|r| [r.clone(), r.clone()])
        .collect();
    let cfg = SamplingConfig::new()
        .with_temperature(0.9)
        .with_top_k(40)
        .with_max_new_tokens(8)
        .with_seed(1234);
    let want = Sampler::new(&p.model, Some(&p.tokenizer))
        .generate(&rows, &cfg)
        .unwrap();
    for (k, (c, w)) in choices.iter().zip(&want).enumerate() {
        assert_eq!(c["index"], k);
        let got: Vec<u32> = serde_json::from_value(c["rlft"]["token_ids"].clone()).unwrap();
        assert_eq!(got, w.tokens, "choice {k}: tokens");
        let lp: Vec<f32> = serde_json::from_value(c["logprobs"]["token_logprobs"].clone()).unwrap();
        assert_eq!(lp, w.logprobs, "choice {k}: log μ, bit for bit");
        let rl: Vec<f32> = serde_json::from_value(c["rlft"]["logprobs"].clone()).unwrap();
        assert_eq!(rl, w.logprobs);
        let tokens: Vec<String> = serde_json::from_value(c["logprobs"]["tokens"].clone()).unwrap();
        let named: Vec<String> = w.tokens.iter().map(|t| format!("token_id:{t}")).collect();
        assert_eq!(tokens, named);
        assert_eq!(c["prompt_token_ids"], json!(prompts[k / 2]));
        assert!(lp.iter().all(|x| x.is_finite() && *x <= 0.0));
        // top-k draws: log S of each token, the kept mass.
        assert_eq!(
            c["rlft"]["log_kept_mass"].as_array().unwrap().len(),
            got.len()
        );
        assert_eq!(c["rlft"]["token_versions"], json!(vec![0; got.len()]));
        let finish = if w.truncated() { "length" } else { "stop" };
        assert_eq!(c["finish_reason"], finish);
    }
    let usage = &a["usage"];
    assert_eq!(usage["prompt_tokens"], 7);
    let generated: usize = want.iter().map(|w| w.tokens.len()).sum();
    assert_eq!(usage["completion_tokens"], generated);

    // Text prompts, one or several, and the kept sets under a filter.
    let v = s.complete(json!({"prompt": ["Hello", "The sky"], "max_tokens": 4,
        "top_p": 0.9, "return_kept_ids": true, "kept_ids_max": 400}));
    for c in v["choices"].as_array().unwrap() {
        let n = c["rlft"]["token_ids"].as_array().unwrap().len();
        assert_eq!(c["rlft"]["kept_ids"].as_array().unwrap().len(), n);
        assert!(c["text"].is_string());
    }
    // Greedy decoding is the same whatever the seed.
    let g =
        |seed: u64| ids(&s.complete(json!({"prompt": "Hello", "temperature": 0, "seed": seed})));
    assert_eq!(g(1), g(2));
    // An unknown field is ignored.
    s.complete(json!({"prompt": "Hello", "max_tokens": 2, "frobnicate": true}));

    let (status, models) = s.get("/v1/models");
    assert_eq!(status, 200);
    let models: Value = serde_json::from_str(&models).unwrap();
    assert_eq!(models["data"][0]["id"], "policy");
    assert_eq!(models["data"][0]["max_model_len"], 256);
    let (_, metrics) = s.get("/metrics");
    for name in [
        "rlft_requests_in_flight 0",
        "rlft_requests_total 7",
        "rlft_tokens_generated_total",
        "rlft_weight_version 0",
    ] {
        assert!(metrics.contains(name), "{name} not in {metrics}");
    }
    assert_eq!(s.get("/health").0, 200);
}

#[test]
fn chat_runs_through_the_template_and_is_refused_without_one() {
    let s = Serve::start(&tiny_llama(), &["--served-model-name", "tiny"]);
    let body = json!({"model": "tiny", "max_tokens": 6, "logprobs": true,
        "messages": [{"role": "user", "content": "What is 2+2?"}]});
    let (status, v) = s.post("/v1/chat/completions", &body);
    assert_eq!(status, 200, "{v}");
    let c = &v["choices"][0];
    assert_eq!(c["message"]["role"], "assistant");
    let n = c["rlft"]["token_ids"].as_array().unwrap().len();
    assert_eq!(c["logprobs"]["content"].as_array().unwrap().len(), n);
    let (status, v) = s.post(
        "/v1/completions",
        &json!({"model": "policy", "prompt": "x"}),
    );
    assert_eq!(status, 404, "{v}");
    assert_eq!(v["error"]["param"], "model");
    drop(s);

    let tmp = Scratch::new();
    let bare = tmp.copy_dir(&tiny_llama(), "bare");
    std::fs::remove_file(bare.join("chat_template.jinja")).unwrap();
    let s = Serve::start(&bare, &[]);
    let (status, v) = s.post(
        "/v1/chat/completions",
        &json!({
        "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(status, 400, "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("chat template"), "{msg}");
    s.complete(json!({"prompt": "hi", "max_tokens": 2}));
}

#[test]
fn bad_requests_are_4xx_naming_the_field_and_the_server_keeps_serving() {
    let s = Serve::start(
        &tiny_llama(),
        &["--max-n", "16", "--max-batch-tokens", "2000"],
    );
    let long: Vec<u32> = vec![5; 300];
    let cases: Vec<(Value, &str, u16)> = vec![
        (json!("{\"prompt\": "), "JSON", 400),
        (json!("[1, 2]"), "object", 400),
        (json!({}), "prompt", 400),
        (json!({"prompt": 5}), "prompt", 400),
        (json!({"prompt": ""}), "prompt", 400),
        (json!({"prompt": []}), "prompt", 400),
        (json!({"prompt": [1, 384]}), "prompt", 400),
        (json!({"prompt": [1, -3]}), "prompt", 400),
        (json!({"prompt": long}), "prompt", 400),
        (
            json!({"prompt": "hi", "max_tokens": "ten"}),
            "max_tokens",
            400,
        ),
        (json!({"prompt": "hi", "max_tokens": 0}), "max_tokens", 400),
        (
            json!({"prompt": "hi", "max_tokens": 1000000}),
            "max_tokens",
            400,
        ),
        (
            json!({"prompt": "hi", "temperature": -1}),
            "temperature",
            400,
        ),
        (
            json!({"prompt": "hi", "temperature": "hot"}),
            "temperature",
            400,
        ),
        (json!({"prompt": "hi", "top_p": 0}), "top_p", 400),
        (json!({"prompt": "hi", "top_p": 1.5}), "top_p", 400),
        (json!({"prompt": "hi", "top_k": -5}), "top_k", 400),
        (json!({"prompt": "hi", "min_p": 1.0}), "min_p", 400),
        (json!({"prompt": "hi", "n": 0}), "n", 400),
        (json!({"prompt": "hi", "n": 17}), "n", 400),
        (json!({"prompt": "hi", "seed": -3}), "seed", 400),
        (
            json!({"prompt": "hi", "stream_options": {"include_usage": true}}),
            "stream_options",
            400,
        ),
        (
            json!({"prompt": "hi", "stream": true, "rescore": true}),
            "rescore",
            400,
        ),
        (json!({"prompt": "hi", "echo": true}), "echo", 400),
        (json!({"prompt": "hi", "logprobs": "yes"}), "logprobs", 400),
        (json!({"prompt": "hi", "stop": 7}), "stop", 400),
        (
            json!({"prompt": "hi", "stop_token_ids": [100000]}),
            "stop_token_ids",
            400,
        ),
        (
            json!({"prompt": "hi", "return_kept_ids": true}),
            "return_kept_ids",
            400,
        ),
        (
            json!({"prompt": "hi", "n": 16, "max_tokens": 200}),
            "max-batch-tokens",
            400,
        ),
        (
            json!({"prompt": "hi", "presence_penalty": 0.5}),
            "presence_penalty",
            400,
        ),
        (
            json!({"prompt": "hi", "logit_bias": {"5": 10}}),
            "logit_bias",
            400,
        ),
        (json!({"prompt": "hi", "model": "gpt-4"}), "model", 404),
    ];
    let mut failed = Vec::new();
    for (body, field, want) in &cases {
        let (status, v) = s.post("/v1/completions", body);
        let msg = v["error"]["message"].as_str().unwrap_or_default();
        if status != *want || !msg.contains(field) {
            failed.push(format!("{body}: {status} {v}"));
        }
    }
    let chat = [
        (json!({"max_tokens": 2}), "messages"),
        (json!({"messages": "hi"}), "messages"),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
            "messages",
        ),
    ];
    for (body, field) in &chat {
        let (status, v) = s.post("/v1/chat/completions", body);
        let msg = v["error"]["message"].as_str().unwrap_or_default();
        if status != 400 || !msg.contains(field) {
            failed.push(format!("chat {body}: {status} {v}"));
        }
    }
    let (status, _) = s.post("/v1/nothing", &json!({}));
    if status != 404 {
        failed.push(format!("unknown route: {status}"));
    }
    check_all(cases.len() + chat.len() + 1, &failed);
    s.complete(json!({"prompt": "still serving", "max_tokens": 3}));
    let (_, metrics) = s.get("/metrics");
    assert!(
        metrics.contains("rlft_request_errors_total 35"),
        "{metrics}"
    );
}

#[test]
fn the_api_key_guards_every_route_but_health() {
    for (args, env) in [
        (vec!["--api-key", "sesame"], vec![]),
        (vec![], vec![("RLFT_API_KEY", "sesame")]),
    ] {
        let mut s = Serve::start_env(&tiny_llama(), &args, &env);
        assert_eq!(s.get("/health").0, 200);
        assert_eq!(s.get("/v1/models").0, 401);
        let (status, v) = s.post("/v1/completions", &json!({"prompt": "hi"}));
        assert_eq!(status, 401, "{v}");
        s.key = Some("wrong".into());
        assert_eq!(s.get("/metrics").0, 401);
        s.key = Some("sesame".into());
        assert_eq!(s.get("/v1/models").0, 200);
        s.complete(json!({"prompt": "hi", "max_tokens": 2}));
    }
}

#[test]
fn a_refused_update_leaves_the_old_version_serving() {
    let tmp = Scratch::new();
    let s = Serve::start(&tiny_llama(), &[]);
    let ask = json!({"prompt": [1, 17, 42], "max_tokens": 6, "seed": 7, "n": 2});
    let before = s.complete(ask.clone());
    let cut = tmp.copy_dir(&tiny_llama(), "cut");
    let f = cut.join("model.safetensors");
    let bytes = std::fs::read(&f).unwrap();
    std::fs::write(&f, &bytes[..bytes.len() / 2]).unwrap();
    let refused = [
        (
            json!({"model_path": tmp.0.join("missing"), "weight_version": 1}),
            "model_path",
        ),
        (
            json!({"model_path": cut, "weight_version": 1}),
            "model.safetensors",
        ),
        (
            json!({"model_path": root().join("tests/data/fixtures/tiny-qwen2"), "weight_version": 1}),
            "architecture",
        ),
        (json!({"model_path": "", "weight_version": 1}), "model_path"),
        (
            json!({"model_path": tiny_llama(), "weight_version": "one"}),
            "weight_version",
        ),
        (json!({"weight_version": 1}), "model_path"),
    ];
    for (body, expect) in &refused {
        let (status, v) = s.post("/update_weights_from_disk", body);
        assert_eq!(status, 400, "{body}: {v}");
        assert_eq!(v["success"], false, "{v}");
        let msg = v["message"].as_str().unwrap();
        assert!(msg.contains(expect), "{body}: {msg}");
    }
    let (_, models) = s.get("/v1/models");
    assert!(models.contains("\"weight_version\":0"), "{models}");
    assert_eq!(ids(&s.complete(ask.clone())), ids(&before));

    // A good update: the same weights as version 5 sample the same tokens, labelled 5.
    let same = tmp.copy_dir(&tiny_llama(), "v5");
    let (status, v) = s.post(
        "/update_weights_from_disk",
        &json!({"model_path": same, "weight_version": "5"}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["success"], true);
    let after = s.complete(ask);
    assert_eq!(ids(&after), ids(&before));
    let versions = &after["choices"][0]["rlft"]["token_versions"];
    assert!(
        versions.as_array().unwrap().iter().all(|x| x == 5),
        "{versions}"
    );
    assert!(s.get("/metrics").1.contains("rlft_weight_version 5"));
}

/// The `openai` Python client's `completions.create(…, logprobs=1)` reads the answer. Skipped
/// (and passing) where Python has no `openai` package; CI installs it.
#[test]
fn the_openai_python_client_reads_completions() {
    let Some(python) = serve::python_with("openai") else {
        return;
    };
    let mut s = Serve::start(&tiny_llama(), &["--api-key", "k"]);
    s.key = Some("k".into());
    let script = r#"
import json, sys, openai
client = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="k")
r = client.completions.create(model="policy", prompt="Hello", max_tokens=5, logprobs=1, seed=3)
c = r.choices[0]
print(json.dumps({"text": c.text, "tokens": c.logprobs.tokens,
                  "logprobs": c.logprobs.token_logprobs, "finish": c.finish_reason,
                  "completion_tokens": r.usage.completion_tokens}))
"#;
    let o = Command::new(&python)
        .args(["-c", script, &s.url])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let n = v["tokens"].as_array().unwrap().len();
    assert!((1..=5).contains(&n), "{v}");
    assert_eq!(v["logprobs"].as_array().unwrap().len(), n);
    assert_eq!(v["completion_tokens"], n);
    let direct = s.complete(json!({"prompt": "Hello", "max_tokens": 5, "seed": 3, "logprobs": 1}));
    assert_eq!(
        v["logprobs"],
        direct["choices"][0]["logprobs"]["token_logprobs"]
    );
}
