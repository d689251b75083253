//! Streamed answers of `rlft serve` (`stream: true`): server-sent events whose chunks, joined
//! per choice, are the unstreamed answer (text, token ids, log μ, offsets, finish), with the
//! usage last when asked; the `openai` client's `stream=True` reads both routes; a client that
//! leaves mid-stream frees its slot at once. Every server started here is killed when its test
//! ends, also on failure.

#[path = "support/cli.rs"]
mod cli;

#[path = "support/serve.rs"]
mod serve;

use cli::tiny_llama;
use serde_json::{Value, json};
use serve::{Serve, request};
use std::io::{BufRead, BufReader, Write};
use std::process::Command;
use std::time::{Duration, Instant};

/// The `data:` payloads of a streamed answer, `[DONE]` checked last and left out.
fn chunks(answer: &Value) -> Vec<Value> {
    let text = answer.as_str().expect("an event stream, not JSON");
    let data: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{text}");
    data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("{d}: {e}")))
        .collect()
}

/// Appends the array `from[key]` (a path of keys) to `into`.
fn extend(into: &mut Vec<Value>, from: &Value, path: &[&str]) {
    let v = path.iter().fold(from, |v, k| &v[*k]);
    if let Some(a) = v.as_array() {
        into.extend(a.iter().cloned());
    }
}

/// One choice put back together from its chunks.
#[derive(Default, Debug)]
struct Joined {
    text: String,
    finish_reason: Value,
    arrays: std::collections::BTreeMap<String, Vec<Value>>,
    finish: Value,
}

/// Joins the chunks' choices by index; `text_of` reads a choice's text piece.
fn join(chunks: &[Value], text_of: fn(&Value) -> &str, arrays: &[&[&str]]) -> Vec<Joined> {
    let mut out: Vec<Joined> = Vec::new();
    for c in chunks {
        for ch in c["choices"].as_array().unwrap() {
            let i = ch["index"].as_u64().unwrap() as usize;
            if out.len() <= i {
                out.resize_with(i + 1, Joined::default);
            }
            let j = &mut out[i];
            assert!(j.finish_reason.is_null(), "a chunk after the finish: {ch}");
            j.text.push_str(text_of(ch));
            for path in arrays {
                extend(j.arrays.entry(path.join(".")).or_default(), ch, path);
            }
            j.finish_reason = ch["finish_reason"].clone();
            if !ch["rlft"]["finish"].is_null() {
                j.finish = ch["rlft"]["finish"].clone();
            }
        }
    }
    out
}

const COMPLETION_ARRAYS: &[&[&str]] = &[
    &["rlft", "token_ids"],
    &["rlft", "logprobs"],
    &["rlft", "token_versions"],
    &["rlft", "log_kept_mass"],
    &["logprobs", "tokens"],
    &["logprobs", "token_logprobs"],
    &["logprobs", "text_offset"],
];

#[test]
fn streamed_completions_join_into_the_unstreamed_answer() {
    let s = Serve::start(&tiny_llama(), &[]);
    let asks = [
        json!({"prompt": [[1, 17, 42, 99], [1, 5, 6]], "n": 2, "max_tokens": 12, "seed": 5,
               "temperature": 0.9, "top_k": 40, "logprobs": 1}),
        // Stop strings: text that may start one is held back, and the stop is cut.
        json!({"prompt": ["Hello", "The sky is"], "n": 3, "max_tokens": 24, "seed": 11,
               "stop": ["e", "a b", "\n"], "logprobs": 0}),
        json!({"prompt": "Once", "max_tokens": 30, "temperature": 0, "logprobs": 1,
               "return_tokens_as_token_ids": true}),
    ];
    for ask in asks {
        let plain = s.complete(ask.clone());
        let mut streamed = ask.clone();
        streamed["stream"] = true.into();
        streamed["stream_options"] = json!({"include_usage": true});
        let (status, answer) = s.post("/v1/completions", &streamed);
        assert_eq!(status, 200, "{answer}");
        let chunks = chunks(&answer);
        let (usage, tokens) = chunks.split_last().unwrap();
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(usage["usage"], plain["usage"], "{ask}");
        for c in tokens {
            assert_eq!(c["object"], "text_completion");
            assert!(c["usage"].is_null());
            assert_eq!(c["choices"].as_array().unwrap().len(), 1);
        }
        let joined = join(tokens, |c| c["text"].as_str().unwrap(), COMPLETION_ARRAYS);
        let want = plain["choices"].as_array().unwrap();
        assert_eq!(joined.len(), want.len(), "{ask}");
        for (k, (j, w)) in joined.iter().zip(want).enumerate() {
            assert_eq!(
                j.text,
                w["text"].as_str().unwrap(),
                "{ask}: choice {k} text"
            );
            assert_eq!(j.finish_reason, w["finish_reason"], "{ask}: choice {k}");
            assert_eq!(j.finish, w["rlft"]["finish"], "{ask}: choice {k}");
            for path in COMPLETION_ARRAYS {
                let mut expect = Vec::new();
                extend(&mut expect, w, path);
                let got = j.arrays.get(&path.join(".")).cloned().unwrap_or_default();
                assert_eq!(got, expect, "{ask}: choice {k} {}", path.join("."));
            }
        }
    }
}

#[test]
fn streamed_chat_joins_into_the_unstreamed_answer() {
    let s = Serve::start(&tiny_llama(), &[]);
    let ask = json!({"messages": [{"role": "user", "content": "What is 2+2?"}], "n": 2,
                     "max_tokens": 10, "seed": 3, "logprobs": true});
    let plain = {
        let (status, v) = s.post("/v1/chat/completions", &ask);
        assert_eq!(status, 200, "{v}");
        v
    };
    let mut streamed = ask.clone();
    streamed["stream"] = true.into();
    let (status, answer) = s.post("/v1/chat/completions", &streamed);
    assert_eq!(status, 200, "{answer}");
    let chunks = chunks(&answer);
    // The first chunk opens each choice with the assistant's role.
    let first = &chunks[0]["choices"];
    assert_eq!(first.as_array().unwrap().len(), 2);
    assert_eq!(first[1]["delta"]["role"], "assistant");
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk");
        assert!(c.get("usage").is_none(), "usage without include_usage: {c}");
    }
    let joined = join(
        &chunks,
        |c| c["delta"]["content"].as_str().unwrap_or_default(),
        &[
            &["logprobs", "content"],
            &["rlft", "token_ids"],
            &["rlft", "logprobs"],
        ],
    );
    for (k, (j, w)) in joined
        .iter()
        .zip(plain["choices"].as_array().unwrap())
        .enumerate()
    {
        assert_eq!(
            j.text,
            w["message"]["content"].as_str().unwrap(),
            "choice {k}"
        );
        assert_eq!(j.finish_reason, w["finish_reason"], "choice {k}");
        assert_eq!(
            j.arrays["logprobs.content"],
            *w["logprobs"]["content"].as_array().unwrap(),
            "choice {k}"
        );
        assert_eq!(
            j.arrays["rlft.token_ids"],
            *w["rlft"]["token_ids"].as_array().unwrap()
        );
    }
}

#[test]
fn a_client_that_leaves_mid_stream_frees_its_slot_at_once() {
    let s = Serve::start(&tiny_llama(), &[]);
    // 256 samples of 250 tokens each: far more than is sampled before the client leaves.
    let (rows, max_tokens) = (256u64, 250u64);
    let body = json!({"prompt": [1, 17], "n": rows, "max_tokens": max_tokens,
                      "ignore_eos": true, "stream": true})
    .to_string();
    let auth = s.bearer();
    let mut c = s.connect();
    let req = request(
        "POST",
        "/v1/completions",
        &[
            ("Host", "127.0.0.1"),
            ("Authorization", &auth),
            ("Content-Type", "application/json"),
        ],
        &body,
    );
    c.write_all(req.as_bytes()).unwrap();
    let mut reader = BufReader::new(c);
    let mut line = String::new();
    while !line.starts_with("data: ") {
        line.clear();
        assert!(reader.read_line(&mut line).unwrap() > 0, "no chunk came");
    }
    drop(reader);
    let t = Instant::now();
    while s.metric("rlft_requests_cancelled_total") == 0 {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the stream was not cancelled"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let generated = s.metric("rlft_tokens_generated_total");
    assert!(
        generated < rows * max_tokens,
        "all {generated} tokens were generated for a client that left"
    );
    assert_eq!(s.metric("rlft_requests_in_flight"), 0);
    // The slot (one, the default) is free: the next request is served.
    s.complete(json!({"prompt": "Hello", "max_tokens": 3}));
    println!(
        "cancelled after {generated} of {} tokens",
        rows * max_tokens
    );
}

/// The `openai` Python client's `stream=True` on both routes reads the same texts as the
/// unstreamed answers. Skipped (and passing) where Python has no `openai` package; CI installs
/// it.
#[test]
fn the_openai_python_client_streams_both_routes() {
    let Some(python) = serve::python_with("openai") else {
        return;
    };
    let s = Serve::start(&tiny_llama(), &[]);
    let script = r#"
import json, sys, openai
client = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key=sys.argv[2])
out = {"completion": "", "chat": "", "usage": None, "finish": None, "ids": []}
stream = client.completions.create(model="policy", prompt="Hello", max_tokens=12, seed=3,
                                   stream=True, stream_options={"include_usage": True})
for chunk in stream:
    if chunk.choices:
        out["completion"] += chunk.choices[0].text
        out["ids"] += chunk.choices[0].model_extra["rlft"]["token_ids"]
    if chunk.usage:
        out["usage"] = chunk.usage.completion_tokens
stream = client.chat.completions.create(
    model="policy", messages=[{"role": "user", "content": "What is 2+2?"}], max_tokens=12,
    seed=3, stream=True)
for chunk in stream:
    if chunk.choices:
        out["chat"] += chunk.choices[0].delta.content or ""
        out["finish"] = chunk.choices[0].finish_reason or out["finish"]
print(json.dumps(out))
"#;
    let key = s.key.clone().unwrap_or_default();
    let o = Command::new(&python)
        .args(["-c", script, &s.url, &key])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let plain = s.complete(json!({"prompt": "Hello", "max_tokens": 12, "seed": 3}));
    assert_eq!(v["completion"], plain["choices"][0]["text"]);
    assert_eq!(v["ids"], plain["choices"][0]["rlft"]["token_ids"]);
    assert_eq!(v["usage"], plain["usage"]["completion_tokens"]);
    let (_, chat) = s.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "What is 2+2?"}], "max_tokens": 12,
                "seed": 3}),
    );
    assert_eq!(v["chat"], chat["choices"][0]["message"]["content"]);
    assert_eq!(v["finish"], chat["choices"][0]["finish_reason"]);
}
