//! vLLM's OpenAI server as a rollout server, as its source defines it (vLLM 0.34.0:
//! `vllm/entrypoints/openai/completion/protocol.py`, `vllm/entrypoints/serve/dev/rpc`,
//! `vllm/entrypoints/rl/online/api_router.py`).
//!
//! - Samples: `POST /v1/completions` with the rows as token-id prompts, `return_token_ids`
//!   (vLLM ≥ 0.10.2) for the sampled ids, `logprobs: 0` for the sampled token's log-probability,
//!   and `return_weight_versions` (≥ 0.33; older servers ignore it and every token gets the
//!   version last pushed). Every sampling setting is sent, so the model's
//!   `generation_config.json` defaults never apply. No `seed`: vLLM seeds each prompt of a
//!   request alike, so a group's copies of one prompt would draw the same tokens.
//! - μ: vLLM's default `--logprobs-mode raw_logprobs` is the softmax before temperature and the
//!   filters; `processed_logprobs` (what TRL starts vLLM with) is μ.
//! - Weights (routes that exist with `VLLM_SERVER_DEV_MODE=1`, vLLM ≥ 0.27): `POST
//!   /pause?mode=keep` (requests in flight wait), `POST /collective_rpc` with `reload_weights`
//!   from the folder (≥ 0.16), `POST /reset_prefix_cache?reset_running_requests=true` (no KV of
//!   the old weights is reused), `POST /update_weight_version`, `POST /resume`. The version
//!   reads back from `GET /weight_info`.

use super::{Client, ClientError, Remote, versions_from_spans};
use rlft_rollout::{Completion, FinishReason, SamplingConfig};
use serde_json::{Value, json};
use std::path::Path;

/// The completions request for one sampler call.
pub fn request(model: &str, rows: &[Vec<u32>], cfg: &SamplingConfig) -> Value {
    json!({
        "model": model,
        "prompt": rows,
        "n": 1,
        "max_tokens": cfg.max_new_tokens,
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "top_k": if cfg.top_k == 0 { -1 } else { cfg.top_k as i64 },
        "min_p": cfg.min_p,
        "repetition_penalty": 1.0,
        "stop": cfg.stop_strings,
        "stop_token_ids": cfg.stop_token_ids,
        "ignore_eos": cfg.ignore_eos,
        "skip_special_tokens": false,
        "include_stop_str_in_output": true,
        "logprobs": 0,
        "return_token_ids": true,
        "return_tokens_as_token_ids": true,
        "return_weight_versions": true,
    })
}

/// Reads a completions answer: one choice per row, by `index`.
///
/// # Errors
/// What is missing or inconsistent, as text.
pub fn parse(text: &str, rows: usize, version: u64) -> Result<Remote, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let choices = v["choices"]
        .as_array()
        .ok_or("no `choices` list in the answer")?;
    if choices.len() != rows {
        return Err(format!("{} choices for {rows} rows", choices.len()));
    }
    let mut by_index: Vec<Option<&Value>> = vec![None; rows];
    for c in choices {
        let i = c["index"].as_u64().ok_or("a choice without `index`")? as usize;
        match by_index.get_mut(i) {
            Some(slot @ None) => *slot = Some(c),
            _ => return Err(format!("choice index {i} is repeated or past {rows} rows")),
        }
    }
    let mut remote = Remote {
        completions: Vec::with_capacity(rows),
        versions: Vec::with_capacity(rows),
    };
    for (i, c) in by_index.into_iter().enumerate() {
        let c = c.ok_or_else(|| format!("no choice for row {i}"))?;
        let tokens: Vec<u32> = serde_json::from_value(c["token_ids"].clone()).map_err(|_| {
            format!(
                "choice {i} has no `token_ids`: vLLM returns them from 0.10.2 on, with \
                 `return_token_ids`"
            )
        })?;
        let logprobs: Vec<Option<f64>> =
            serde_json::from_value(c["logprobs"]["token_logprobs"].clone())
                .map_err(|_| format!("choice {i} has no `logprobs.token_logprobs`"))?;
        if logprobs.len() != tokens.len() {
            return Err(format!(
                "choice {i} has {} tokens and {} log-probs",
                tokens.len(),
                logprobs.len()
            ));
        }
        let logprobs = logprobs
            .into_iter()
            .map(|l| l.map(|l| l as f32))
            .collect::<Option<Vec<f32>>>()
            .ok_or_else(|| format!("choice {i} has a null log-prob"))?;
        let finish_reason = match (c["finish_reason"].as_str(), &c["stop_reason"]) {
            (Some("length"), _) => FinishReason::Length,
            // "None if the completion finished for some other reason including encountering
            // the EOS token".
            (Some("stop"), Value::Null) => FinishReason::Eos,
            (Some("stop"), _) => FinishReason::Stop,
            (other, _) => {
                return Err(format!(
                    "choice {i} ended with finish_reason {other:?}, not a finished sample"
                ));
            }
        };
        remote.versions.push(versions_from_spans(
            c.get("weight_versions"),
            tokens.len(),
            version,
        ));
        remote.completions.push(Completion {
            tokens,
            logprobs,
            log_kept_mass: Vec::new(),
            kept_ids: Vec::new(),
            finish_reason,
            routing: None,
        });
    }
    Ok(remote)
}

/// The requests that bring a vLLM server to the weights in `dir` as `version`, in order:
/// (route, body).
pub fn update_requests(dir: &Path, version: u64) -> Vec<(&'static str, Value)> {
    vec![
        ("/pause?mode=keep", json!({})),
        (
            "/collective_rpc",
            json!({"method": "reload_weights", "kwargs": {"weights_path": dir}}),
        ),
        ("/reset_prefix_cache?reset_running_requests=true", json!({})),
        (
            "/update_weight_version",
            json!({"new_version": version.to_string()}),
        ),
        ("/resume", json!({})),
    ]
}

/// Brings the server to the weights in `dir` as `version` ([`update_requests`]); a server left
/// paused by a failed step is resumed before the error returns.
pub(super) fn update_weights(client: &Client, dir: &Path, version: u64) -> Result<(), ClientError> {
    let steps = update_requests(dir, version);
    let last = steps.len() - 1;
    for (k, (path, body)) in steps.iter().enumerate() {
        if let Err(e) = client.post_path(path, body) {
            if k > 0 && k < last {
                let _ = client.post_path(steps[last].0, &steps[last].1);
            }
            return Err(e);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::mock::{Mock, fixture};
    use super::super::{Client, Protocol};
    use rlft_rollout::{FinishReason, SamplingConfig};
    use std::collections::HashMap;
    use std::time::Duration;

    fn client(mock: &Mock) -> Client {
        Client::new(&mock.url, "policy", Duration::from_secs(10)).with_protocol(Protocol::Vllm)
    }

    #[test]
    fn a_call_is_one_completions_request_read_back_by_index() {
        let mock = Mock::start(HashMap::from([(
            "/v1/completions",
            (200, fixture("vllm-0.34.0-completions-response.json")),
        )]));
        let rows = vec![
            vec![49, 43, 55, 61],
            vec![49, 43, 54, 61],
            vec![49, 43, 56, 61],
        ];
        let cfg = SamplingConfig::new()
            .with_max_new_tokens(3)
            .with_temperature(0.7)
            .with_seed(9)
            .with_stop_strings(vec!["\n".into()]);
        let got = client(&mock).generate(&rows, &cfg, 5).unwrap();
        let (route, body) = mock.log.lock().unwrap()[0].clone();
        assert_eq!(route, "/v1/completions");
        assert_eq!(body["prompt"], serde_json::json!(rows));
        assert_eq!(body["max_tokens"], 3);
        assert_eq!(body["temperature"], 0.7);
        assert_eq!(body["top_k"], -1, "vLLM's off is -1");
        assert_eq!(body["repetition_penalty"], 1.0);
        assert_eq!(body["return_token_ids"], true);
        assert_eq!(body["logprobs"], 0);
        assert_eq!(body["stop"], serde_json::json!(["\n"]));
        assert!(
            body.get("seed").is_none(),
            "one seed would draw every row alike"
        );
        // Choices come back by index: row 0 is the EOS one.
        let c = &got.completions;
        assert_eq!(c[0].tokens, [56, 2]);
        assert_eq!(c[0].finish_reason, FinishReason::Eos);
        assert_eq!(c[0].logprobs, [-0.5, -0.125]);
        assert_eq!(c[1].tokens, [55, 10]);
        assert_eq!(c[1].finish_reason, FinishReason::Stop);
        assert_eq!(c[2].finish_reason, FinishReason::Length);
        assert_eq!(c[2].logprobs[0], -9999.0);
        assert!(
            c.iter()
                .all(|c| c.kept_ids.is_empty() && c.routing.is_none())
        );
        // Versions from the spans; a choice without spans gets the version last pushed.
        assert_eq!(got.versions, [vec![7, 7], vec![6, 7], vec![5, 5, 5]]);
    }

    #[test]
    fn answers_that_do_not_fit_are_protocol_errors() {
        let good: serde_json::Value =
            serde_json::from_str(&fixture("vllm-0.34.0-completions-response.json")).unwrap();
        let rows = vec![vec![1u32]; 3];
        let mut cases = Vec::new();
        let mut v = good.clone();
        v["choices"][0]["token_ids"] = serde_json::Value::Null;
        cases.push((v, "0.10.2"));
        let mut v = good.clone();
        v["choices"][1]["finish_reason"] = "abort".into();
        cases.push((v, "abort"));
        let mut v = good.clone();
        v["choices"][2]["logprobs"]["token_logprobs"] = serde_json::json!([-1.0]);
        cases.push((v, "log-probs"));
        let mut v = good.clone();
        v["choices"][2]["index"] = 0.into();
        cases.push((v, "repeated"));
        for (answer, says) in cases {
            let e = super::parse(&answer.to_string(), rows.len(), 0).unwrap_err();
            assert!(e.contains(says), "{says}: {e}");
        }
        let e = super::parse(&good.to_string(), 2, 0).unwrap_err();
        assert!(e.contains("3 choices for 2 rows"), "{e}");
    }

    #[test]
    fn new_weights_pause_reload_reset_label_and_resume() {
        let ok = |b: &str| (200u16, b.to_string());
        let mock = Mock::start(HashMap::from([
            ("/pause", ok(r#"{"status":"paused"}"#)),
            ("/collective_rpc", ok(r#"{"results":[null]}"#)),
            ("/reset_prefix_cache", ok(r#"{"success":true}"#)),
            (
                "/update_weight_version",
                ok(r#"{"success":true,"new_version":"12"}"#),
            ),
            ("/resume", ok(r#"{"status":"resumed"}"#)),
            ("/weight_info", ok(r#"{"weight_version":"12"}"#)),
        ]));
        let c = client(&mock);
        let dir = std::path::Path::new("/shared/run/weights/v12");
        c.update_weights(dir, 12).unwrap();
        assert_eq!(c.version().unwrap(), 12);
        assert_eq!(
            mock.routes(),
            [
                "/pause?mode=keep",
                "/collective_rpc",
                "/reset_prefix_cache?reset_running_requests=true",
                "/update_weight_version",
                "/resume",
                "/weight_info"
            ]
        );
        let log = mock.log.lock().unwrap();
        assert_eq!(log[1].1["method"], "reload_weights");
        assert_eq!(
            log[1].1["kwargs"]["weights_path"],
            "/shared/run/weights/v12"
        );
        assert_eq!(log[3].1["new_version"], "12");
    }

    #[test]
    fn a_failed_reload_resumes_the_server_and_is_an_error() {
        let mock = Mock::start(HashMap::from([
            ("/pause", (200, "{}".to_string())),
            (
                "/collective_rpc",
                (500, r#"{"error":"no such file"}"#.to_string()),
            ),
            ("/resume", (200, "{}".to_string())),
        ]));
        let e = client(&mock)
            .update_weights(std::path::Path::new("/missing"), 3)
            .unwrap_err();
        assert!(e.is_server_fault(), "{e}");
        assert_eq!(
            mock.routes(),
            ["/pause?mode=keep", "/collective_rpc", "/resume"]
        );
    }
}
