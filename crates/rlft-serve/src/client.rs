//! The trainer's side of the protocol: one sampler call sent to a server as one request, and
//! the answer read back as the [`Completion`]s the sampler would have returned in-process,
//! with the weight version of every token; and the weight-update routes.
//!
//! Three dialects ([`Protocol`]): rlft's own (`rlft serve`: the sampler's draws bit for bit,
//! μ, versions, kept sets and routing), vLLM's OpenAI completions ([`vllm`]) and SGLang's
//! `/generate` ([`sglang`]).

#[cfg(test)]
mod mock;
pub mod sglang;
pub mod vllm;

use crate::protocol::{CompletionResponse, Finish};
use rlft_rollout::{Completion, FinishReason, SamplingConfig};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;

/// Which server a client speaks to: how it asks for samples, reads them, and pushes weights.
#[derive(
    schemars::JsonSchema, Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// `rlft serve`: `/v1/completions` with rlft's extensions, `/update_weights_from_disk`.
    #[default]
    Rlft,
    /// vLLM's OpenAI server (≥ 0.27 with `VLLM_SERVER_DEV_MODE=1`): `/v1/completions` with
    /// `return_token_ids`, weights through `/collective_rpc` `reload_weights`.
    Vllm,
    /// SGLang (≥ 0.5.6): `/generate` with `return_logprob`, `/update_weights_from_disk`.
    Sglang,
}

impl Protocol {
    /// Every value with its name, as written in recipes.
    pub const ALL: [(Protocol, &'static str); 3] = [
        (Protocol::Rlft, "rlft"),
        (Protocol::Vllm, "vllm"),
        (Protocol::Sglang, "sglang"),
    ];

    /// The name recipes use.
    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(p, _)| *p == self)
            .map_or("rlft", |(_, n)| n)
    }

    /// Whether the log-probabilities the server returns are `log μ`, the distribution tokens
    /// are drawn from, when sampling at `temperature` with (`filtered`) or without top-k /
    /// top-p / min-p. rlft's always are. vLLM's default (`raw_logprobs`) is the softmax before
    /// temperature and filters: μ only at temperature 1 (or 0, where rlft's μ is the softmax at
    /// temperature 1) without filters. SGLang's is after temperature, before the filters: μ
    /// without filters.
    pub fn returns_mu(self, temperature: f64, filtered: bool) -> bool {
        match self {
            Protocol::Rlft => true,
            Protocol::Vllm => !filtered && (temperature == 1.0 || temperature == 0.0),
            Protocol::Sglang => !filtered,
        }
    }
}

/// Why a server did not answer as it must.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No connection, a connection cut mid-answer, or no answer within the timeout.
    #[error("{url}: {msg}")]
    Transport {
        /// The request's URL.
        url: String,
        /// What failed.
        msg: String,
    },
    /// An error status, with the server's message.
    #[error("{url}: HTTP {status}: {msg}")]
    Status {
        /// The request's URL.
        url: String,
        /// The status.
        status: u16,
        /// The server's message.
        msg: String,
    },
    /// An answer that is not the protocol's.
    #[error("{url}: the answer does not parse: {msg}")]
    Protocol {
        /// The request's URL.
        url: String,
        /// What was wrong.
        msg: String,
    },
}

impl ClientError {
    /// Whether the fault is the server's, so the same request may be sent to another server:
    /// no answer, a cut or garbled one, an overloaded or failing server (429, 5xx). Other
    /// statuses say the request itself is wrong, which another server would answer alike.
    pub fn is_server_fault(&self) -> bool {
        match self {
            ClientError::Transport { .. } | ClientError::Protocol { .. } => true,
            ClientError::Status { status, .. } => *status == 429 || *status >= 500,
        }
    }
}

/// What a server sampled for one call.
#[derive(Debug, Clone, PartialEq)]
pub struct Remote {
    /// One completion per row, in the call's order.
    pub completions: Vec<Completion>,
    /// The weight version that sampled each token of each completion.
    pub versions: Vec<Vec<u64>>,
}

/// One inference server (`rlft serve`, or anything speaking its protocol), reached over HTTP.
#[derive(Clone)]
pub struct Client {
    base: String,
    agent: ureq::Agent,
    api_key: Option<String>,
    model: String,
    protocol: Protocol,
}

impl Client {
    /// The server at `base_url` (`http://host:port`), serving `model`, with requests that give
    /// up after `timeout`.
    pub fn new(base_url: &str, model: &str, timeout: Duration) -> Self {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(timeout))
            .build()
            .into();
        Self {
            base: base_url.trim_end_matches('/').to_string(),
            agent,
            api_key: None,
            model: model.to_string(),
            protocol: Protocol::Rlft,
        }
    }

    /// Speaks `protocol` to the server.
    pub fn with_protocol(mut self, protocol: Protocol) -> Self {
        self.protocol = protocol;
        self
    }

    /// Sends `Authorization: Bearer key` with every request.
    pub fn with_api_key(mut self, key: Option<String>) -> Self {
        self.api_key = key;
        self
    }

    /// The server's base URL.
    pub fn url(&self) -> &str {
        &self.base
    }

    /// The route and body of the request that computes `rows` with `cfg` as one sampler call,
    /// in the client's protocol.
    pub fn request(&self, rows: &[Vec<u32>], cfg: &SamplingConfig) -> (&'static str, Value) {
        match self.protocol {
            Protocol::Rlft => ("/v1/completions", self.rlft_request(rows, cfg)),
            Protocol::Vllm => ("/v1/completions", vllm::request(&self.model, rows, cfg)),
            Protocol::Sglang => ("/generate", sglang::request(rows, cfg)),
        }
    }

    /// rlft's completions request: the rows as token-id prompts in order, one sample each,
    /// the call's seed and settings.
    fn rlft_request(&self, rows: &[Vec<u32>], cfg: &SamplingConfig) -> Value {
        let kept = cfg.kept_ids_max > 0 && cfg.draws_filtered();
        let mut body = json!({
            "model": self.model,
            "prompt": rows,
            "n": 1,
            "max_tokens": cfg.max_new_tokens,
            "temperature": cfg.temperature,
            "top_p": cfg.top_p,
            "top_k": cfg.top_k,
            "min_p": cfg.min_p,
            "seed": cfg.seed,
            "stop": cfg.stop_strings,
            "stop_token_ids": cfg.stop_token_ids,
            "ignore_eos": cfg.ignore_eos,
            "return_kept_ids": kept,
            "return_routing": true,
            "rescore": cfg.rescore,
            "sample_on": cfg.sample_on,
        });
        if kept {
            body["kept_ids_max"] = cfg.kept_ids_max.into();
        }
        body
    }

    /// Samples `rows` with `cfg` on the server: on `rlft serve`, what
    /// [`rlft_rollout::Sampler::generate`] returns for the same call on the server's weights,
    /// with each token's version. A server that reports no versions (older vLLM and SGLang)
    /// gets `version`, the one it was last given.
    ///
    /// # Errors
    /// The server cannot be reached, answers an error, or answers something else than one
    /// choice per row.
    pub fn generate(
        &self,
        rows: &[Vec<u32>],
        cfg: &SamplingConfig,
        version: u64,
    ) -> Result<Remote, ClientError> {
        let (path, body) = self.request(rows, cfg);
        let url = format!("{}{path}", self.base);
        let text = self.post(&url, &body)?;
        let parsed = match self.protocol {
            Protocol::Rlft => parse_rlft(&text, rows.len()),
            Protocol::Vllm => vllm::parse(&text, rows.len(), version),
            Protocol::Sglang => sglang::parse(&text, rows.len(), cfg, version),
        };
        parsed.map_err(|msg| ClientError::Protocol { url, msg })
    }

    /// Asks the server to load the Hugging Face folder `dir` as weight `version`.
    ///
    /// # Errors
    /// The server cannot be reached or refused the update (its message says why).
    pub fn update_weights(&self, dir: &Path, version: u64) -> Result<(), ClientError> {
        match self.protocol {
            Protocol::Rlft => {
                let body = json!({"model_path": dir, "weight_version": version});
                self.post_path("/update_weights_from_disk", &body)
                    .map(|_| ())
            }
            Protocol::Sglang => sglang::update_weights(self, dir, version),
            Protocol::Vllm => vllm::update_weights(self, dir, version),
        }
    }

    /// Whether the server answers `GET /health` within `timeout`.
    pub fn healthy(&self, timeout: Duration) -> bool {
        let url = format!("{}/health", self.base);
        self.agent
            .get(&url)
            .config()
            .timeout_global(Some(timeout))
            .build()
            .call()
            .is_ok_and(|r| r.status().is_success())
    }

    /// The weight version the server serves now.
    ///
    /// # Errors
    /// The server cannot be reached or answers without a version.
    pub fn version(&self) -> Result<u64, ClientError> {
        let (path, field): (&str, fn(&Value) -> &Value) = match self.protocol {
            Protocol::Rlft => ("/v1/models", |v| &v["data"][0]["weight_version"]),
            Protocol::Vllm => ("/weight_info", |v| &v["weight_version"]),
            Protocol::Sglang => ("/model_info", |v| &v["weight_version"]),
        };
        let url = format!("{}{path}", self.base);
        let mut req = self.agent.get(&url);
        if let Some(k) = &self.api_key {
            req = req.header("Authorization", &format!("Bearer {k}"));
        }
        let text = read(&url, req.call())?;
        let v: Value = serde_json::from_str(&text).map_err(|e| ClientError::Protocol {
            url: url.clone(),
            msg: e.to_string(),
        })?;
        let got = field(&v);
        got.as_u64()
            .or_else(|| got.as_str().and_then(|s| s.trim().parse().ok()))
            .ok_or_else(|| ClientError::Protocol {
                url,
                msg: format!("no weight version a number reads from ({got})"),
            })
    }

    /// POSTs `body` to `path` on the server; the answer's text.
    pub(crate) fn post_path(&self, path: &str, body: &Value) -> Result<String, ClientError> {
        self.post(&format!("{}{path}", self.base), body)
    }

    fn post(&self, url: &str, body: &Value) -> Result<String, ClientError> {
        let mut req = self.agent.post(url);
        if let Some(k) = &self.api_key {
            req = req.header("Authorization", &format!("Bearer {k}"));
        }
        read(url, req.send_json(body))
    }
}

/// Reads `rlft serve`'s answer: one choice per row with rlft's extensions.
fn parse_rlft(text: &str, rows: usize) -> Result<Remote, String> {
    let answer: CompletionResponse = serde_json::from_str(text).map_err(|e| e.to_string())?;
    if answer.choices.len() != rows {
        return Err(format!("{} choices for {rows} rows", answer.choices.len()));
    }
    let mut remote = Remote {
        completions: Vec::with_capacity(rows),
        versions: Vec::with_capacity(rows),
    };
    for (k, c) in answer.choices.into_iter().enumerate() {
        let r = c.rlft;
        let n = r.token_ids.len();
        if c.index != k || r.logprobs.len() != n || r.token_versions.len() != n {
            return Err(format!(
                "choice {k} (index {}) has {n} tokens, {} log-probs and {} versions",
                c.index,
                r.logprobs.len(),
                r.token_versions.len()
            ));
        }
        remote.completions.push(Completion {
            tokens: r.token_ids,
            logprobs: r.logprobs,
            log_kept_mass: r.log_kept_mass,
            kept_ids: r.kept_ids.unwrap_or_default(),
            finish_reason: match r.finish {
                Finish::Eos => FinishReason::Eos,
                Finish::Stop => FinishReason::Stop,
                Finish::Length => FinishReason::Length,
            },
            routing: r.routing,
        });
        remote.versions.push(r.token_versions);
    }
    Ok(remote)
}

/// Each token's version from spans `[{version, start, end}]` (vLLM's and SGLang's
/// `weight_versions`): a version that does not read as a number, or a token no span covers,
/// gets `fallback`.
pub(crate) fn versions_from_spans(spans: Option<&Value>, n: usize, fallback: u64) -> Vec<u64> {
    let mut out = vec![fallback; n];
    for s in spans.and_then(Value::as_array).into_iter().flatten() {
        let version = s["version"]
            .as_u64()
            .or_else(|| s["version"].as_str().and_then(|v| v.trim().parse().ok()));
        let (Some(v), Some(a), Some(b)) = (version, s["start"].as_u64(), s["end"].as_u64()) else {
            continue;
        };
        for x in out.iter_mut().take(b as usize).skip(a as usize) {
            *x = v;
        }
    }
    out
}

/// The body of a 2xx answer; an error status with the server's message otherwise.
fn read(
    url: &str,
    r: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
) -> Result<String, ClientError> {
    let transport = |e: ureq::Error| ClientError::Transport {
        url: url.to_string(),
        msg: e.to_string(),
    };
    let mut r = r.map_err(transport)?;
    let status = r.status().as_u16();
    let text = r
        .body_mut()
        .with_config()
        .limit(1 << 30)
        .read_to_string()
        .map_err(transport)?;
    if !(200..300).contains(&status) {
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        let msg = v["error"]["message"]
            .as_str()
            .or_else(|| v["message"].as_str())
            .map_or(text.clone(), String::from);
        return Err(ClientError::Status {
            url: url.to_string(),
            status,
            msg,
        });
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Policy, ServerConfig};
    use burn::tensor::Device;
    use rlft_model::{Tokenizer, TransformerConfig};
    use rlft_rollout::Sampler;

    fn policy(seed: u64) -> Policy {
        let tokenizer = Tokenizer::byte_level();
        let config = TransformerConfig::new(tokenizer.vocab_size(), 32, 64, 2, 4, 2, 8)
            .with_tie_word_embeddings(true)
            .with_max_position_embeddings(128);
        Policy {
            model: config.init_seeded(&Device::flex(), seed),
            tokenizer,
            config,
            version: 0,
        }
    }

    #[test]
    fn a_call_on_the_server_is_the_call_in_process_bit_for_bit() {
        let served = policy(1);
        let key = crate::guard::random_key().unwrap();
        let server = ServerConfig::new()
            .with_port(0)
            .with_api_key(Some(key.clone()))
            .start(served.clone())
            .unwrap();
        let client =
            Client::new(&server.url(), "policy", Duration::from_secs(60)).with_api_key(Some(key));
        let here = Sampler::new(&served.model, Some(&served.tokenizer));
        let t = &served.tokenizer;
        let a = t.encode("12+7=").unwrap();
        let b = t.encode("3*3=").unwrap();
        // A GRPO call: each prompt's group side by side, as the rollout stage sends it.
        let rows = vec![a.clone(), a.clone(), a, b.clone(), b];
        let base = SamplingConfig::new().with_max_new_tokens(12).with_seed(77);
        for cfg in [
            base.clone(),
            base.clone().with_temperature(0.7).with_top_k(20),
            base.clone()
                .with_top_p(0.8)
                .with_min_p(0.05)
                .with_kept_ids_max(64),
            base.clone().with_temperature(0.0),
            base.clone().with_stop_strings(vec!["1".into()]),
            base.clone().with_ignore_eos(true).with_seed(3),
        ] {
            let want = here.generate(&rows, &cfg).unwrap();
            let got = client.generate(&rows, &cfg, 0).unwrap();
            assert_eq!(got.completions, want, "{cfg:?}");
            assert!(got.versions.iter().flatten().all(|&v| v == 0));
        }

        // New weights by version: what they sample, labelled with their version.
        let next = policy(2);
        let dir = std::env::temp_dir().join(format!("rlft-client-{}", std::process::id()));
        next.model
            .save_hf(&next.config, Some(&next.tokenizer), &dir)
            .unwrap();
        client.update_weights(&dir, 7).unwrap();
        assert_eq!(client.version().unwrap(), 7);
        let want = Sampler::new(&next.model, Some(&next.tokenizer))
            .generate(&rows, &base)
            .unwrap();
        let got = client.generate(&rows, &base, 0).unwrap();
        assert_eq!(got.completions, want);
        assert!(got.versions.iter().flatten().all(|&v| v == 7));
        // A refused update names the folder's fault and keeps version 7.
        let e = client.update_weights(&dir.join("missing"), 8).unwrap_err();
        assert!(matches!(e, ClientError::Status { status: 400, .. }), "{e}");
        assert_eq!(client.version().unwrap(), 7);
        std::fs::remove_dir_all(&dir).unwrap();
        server.stop().unwrap();
        // A stopped server is a transport error, not a hang.
        let e = client.generate(&rows, &base, 0).unwrap_err();
        assert!(matches!(e, ClientError::Transport { .. }), "{e}");
    }
}
