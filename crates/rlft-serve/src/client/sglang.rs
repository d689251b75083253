//! SGLang as a rollout server, as its source defines it (SGLang 0.5.23:
//! `python/sglang/srt/managers/io_struct.py` `GenerateReqInput` and
//! `UpdateWeightFromDiskReqInput`, `python/sglang/srt/sampling/sampling_params.py`,
//! `TokenizerManager` for the answer's `meta_info`).
//!
//! - Samples: `POST /generate` with the rows as `input_ids` (a list of lists, answered by a
//!   list), `return_logprob` with `logprob_start_len: -1` (output tokens only). Each answer's
//!   `output_ids`, `meta_info.output_token_logprobs` (`[logprob, id, text]`),
//!   `meta_info.finish_reason` and `meta_info.weight_versions` (≥ 0.5.19; else
//!   `weight_version`). No `sampling_seed`: one seed for a request's rows would draw a group's
//!   copies of one prompt alike, and the flashinfer backend refuses it with top-k / top-p.
//! - μ: SGLang's log-probability is taken after temperature and before top-k / top-p / min-p,
//!   not renormalised: μ without filters.
//! - Weights: `POST /update_weights_from_disk` with `model_path`, `weight_version` and
//!   `flush_cache` (it waits for the requests in flight); the version reads back from
//!   `GET /model_info`.

use super::{Client, ClientError, Remote, versions_from_spans};
use rlft_rollout::{Completion, FinishReason, SamplingConfig};
use serde_json::{Value, json};
use std::path::Path;

/// The `/generate` request for one sampler call.
pub fn request(rows: &[Vec<u32>], cfg: &SamplingConfig) -> Value {
    json!({
        "input_ids": rows,
        "sampling_params": {
            "max_new_tokens": cfg.max_new_tokens,
            "temperature": cfg.temperature,
            "top_p": cfg.top_p,
            "top_k": if cfg.top_k == 0 { -1 } else { cfg.top_k as i64 },
            "min_p": cfg.min_p,
            "stop": cfg.stop_strings,
            "stop_token_ids": cfg.stop_token_ids,
            "ignore_eos": cfg.ignore_eos,
            "skip_special_tokens": false,
            "no_stop_trim": true,
            "n": 1,
        },
        "return_logprob": true,
        "logprob_start_len": -1,
        "top_logprobs_num": 0,
    })
}

/// Reads a `/generate` answer: a list with one object per row, in order.
///
/// # Errors
/// What is missing or inconsistent, as text.
pub fn parse(
    text: &str,
    rows: usize,
    cfg: &SamplingConfig,
    version: u64,
) -> Result<Remote, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let answers = v
        .as_array()
        .ok_or("the answer to a list of input_ids must be a list")?;
    if answers.len() != rows {
        return Err(format!("{} answers for {rows} rows", answers.len()));
    }
    let mut remote = Remote {
        completions: Vec::with_capacity(rows),
        versions: Vec::with_capacity(rows),
    };
    for (i, a) in answers.iter().enumerate() {
        let meta = &a["meta_info"];
        let tokens: Vec<u32> = serde_json::from_value(a["output_ids"].clone())
            .map_err(|_| format!("answer {i} has no `output_ids`"))?;
        let triples = meta["output_token_logprobs"]
            .as_array()
            .ok_or_else(|| format!("answer {i} has no `meta_info.output_token_logprobs`"))?;
        if triples.len() != tokens.len() {
            return Err(format!(
                "answer {i} has {} tokens and {} log-probs",
                tokens.len(),
                triples.len()
            ));
        }
        let mut logprobs = Vec::with_capacity(tokens.len());
        for (j, (t, &id)) in triples.iter().zip(&tokens).enumerate() {
            let (Some(lp), Some(tid)) = (t[0].as_f64(), t[1].as_u64()) else {
                return Err(format!("answer {i}, token {j}: not [logprob, id, text]"));
            };
            if tid != u64::from(id) {
                return Err(format!(
                    "answer {i}, token {j}: the log-prob is of id {tid}, the token is {id}"
                ));
            }
            logprobs.push(lp as f32);
        }
        let finish = &meta["finish_reason"];
        let finish_reason = match finish["type"].as_str() {
            Some("length") => FinishReason::Length,
            Some("stop") => match &finish["matched"] {
                Value::Number(n)
                    if n.as_u64().is_some_and(|id| {
                        !cfg.stop_token_ids.iter().any(|&s| u64::from(s) == id)
                    }) =>
                {
                    FinishReason::Eos
                }
                _ => FinishReason::Stop,
            },
            other => {
                return Err(format!(
                    "answer {i} ended with finish_reason {other:?}, not a finished sample"
                ));
            }
        };
        let fallback = meta["weight_version"]
            .as_str()
            .and_then(|s| s.trim().parse().ok())
            .or_else(|| meta["weight_version"].as_u64())
            .unwrap_or(version);
        remote.versions.push(versions_from_spans(
            meta.get("weight_versions"),
            tokens.len(),
            fallback,
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

/// The weight update's body.
pub fn update_request(dir: &Path, version: u64) -> Value {
    json!({
        "model_path": dir,
        "weight_version": version.to_string(),
        "flush_cache": true,
    })
}

/// Has the server load `dir` as `version`; an answer with `success: false` is refused.
pub(super) fn update_weights(client: &Client, dir: &Path, version: u64) -> Result<(), ClientError> {
    let text = client.post_path("/update_weights_from_disk", &update_request(dir, version))?;
    let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    if v["success"] == false {
        return Err(ClientError::Status {
            url: format!("{}/update_weights_from_disk", client.url()),
            status: 200,
            msg: v["message"]
                .as_str()
                .unwrap_or("success: false")
                .to_string(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::mock::{Mock, fixture};
    use super::super::{Client, ClientError, Protocol};
    use rlft_rollout::{FinishReason, SamplingConfig};
    use std::collections::HashMap;
    use std::time::Duration;

    fn client(mock: &Mock) -> Client {
        Client::new(&mock.url, "policy", Duration::from_secs(10)).with_protocol(Protocol::Sglang)
    }

    #[test]
    fn a_call_is_one_generate_request_read_back_in_order() {
        let mock = Mock::start(HashMap::from([(
            "/generate",
            (200, fixture("sglang-0.5.23-generate-response.json")),
        )]));
        let rows = vec![
            vec![49, 43, 55, 61],
            vec![49, 43, 54, 61],
            vec![49, 43, 56, 61],
        ];
        let cfg = SamplingConfig::new()
            .with_max_new_tokens(3)
            .with_top_k(20)
            .with_seed(9)
            .with_stop_strings(vec!["\n".into()]);
        let got = client(&mock).generate(&rows, &cfg, 5).unwrap();
        let (route, body) = mock.log.lock().unwrap()[0].clone();
        assert_eq!(route, "/generate");
        assert_eq!(body["input_ids"], serde_json::json!(rows));
        let sp = &body["sampling_params"];
        assert_eq!(sp["max_new_tokens"], 3);
        assert_eq!(sp["top_k"], 20);
        assert_eq!(sp["n"], 1);
        assert!(sp.get("sampling_seed").is_none() && sp.get("seed").is_none());
        assert_eq!(body["return_logprob"], true);
        assert_eq!(body["logprob_start_len"], -1);
        let c = &got.completions;
        assert_eq!(c[0].tokens, [56, 2]);
        assert_eq!(c[0].finish_reason, FinishReason::Eos);
        assert_eq!(c[1].finish_reason, FinishReason::Stop);
        assert_eq!(c[2].finish_reason, FinishReason::Length);
        assert_eq!(c[2].logprobs, [-3.0, -2.0, -0.75]);
        // Spans where given, else the answer's `weight_version`.
        assert_eq!(got.versions, [vec![7, 7], vec![6, 7], vec![7, 7, 7]]);
        // A stop id the call asked for is a stop, not an EOS.
        let text = fixture("sglang-0.5.23-generate-response.json");
        let stop = cfg.clone().with_stop_token_ids(vec![2]);
        let r = super::parse(&text, 3, &stop, 0).unwrap();
        assert_eq!(r.completions[0].finish_reason, FinishReason::Stop);
    }

    #[test]
    fn answers_that_do_not_fit_are_protocol_errors() {
        let good: serde_json::Value =
            serde_json::from_str(&fixture("sglang-0.5.23-generate-response.json")).unwrap();
        let cfg = SamplingConfig::new();
        let mut cases = Vec::new();
        let mut v = good.clone();
        v[0]["meta_info"]["output_token_logprobs"][1][1] = 3.into();
        cases.push((v, "the log-prob is of id 3"));
        let mut v = good.clone();
        v[1]["meta_info"]["finish_reason"] = serde_json::json!({"type": "abort"});
        cases.push((v, "abort"));
        let mut v = good.clone();
        v[2]["output_ids"] = serde_json::Value::Null;
        cases.push((v, "output_ids"));
        cases.push((good[0].clone(), "must be a list"));
        for (answer, says) in cases {
            let e = super::parse(&answer.to_string(), 3, &cfg, 0).unwrap_err();
            assert!(e.contains(says), "{says}: {e}");
        }
    }

    #[test]
    fn new_weights_go_through_update_weights_from_disk() {
        let mock = Mock::start(HashMap::from([
            (
                "/update_weights_from_disk",
                (
                    200,
                    r#"{"success":true,"message":"Succeeded to update model weights.","num_paused_requests":0}"#
                        .to_string(),
                ),
            ),
            (
                "/model_info",
                (200, r#"{"model_path":"/w/v4","weight_version":"4"}"#.to_string()),
            ),
        ]));
        let c = client(&mock);
        c.update_weights(std::path::Path::new("/w/v4"), 4).unwrap();
        assert_eq!(c.version().unwrap(), 4);
        let log = mock.log.lock().unwrap();
        assert_eq!(log[0].0, "/update_weights_from_disk");
        assert_eq!(log[0].1["model_path"], "/w/v4");
        assert_eq!(log[0].1["weight_version"], "4");
        assert_eq!(log[0].1["flush_cache"], true);
        drop(log);
        // Refused: a 400 with success false, or (older servers) a 200 with success false.
        for status in [400, 200] {
            let mock = Mock::start(HashMap::from([(
                "/update_weights_from_disk",
                (
                    status,
                    r#"{"success":false,"message":"Failed to get weights iterator","num_paused_requests":0}"#
                        .to_string(),
                ),
            )]));
            let e = client(&mock)
                .update_weights(std::path::Path::new("/w/v5"), 5)
                .unwrap_err();
            assert!(
                matches!(&e, ClientError::Status { msg, .. } if msg.contains("weights iterator")),
                "{e}"
            );
            assert!(!e.is_server_fault());
        }
    }
}
