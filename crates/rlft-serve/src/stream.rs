//! Streamed answers (`stream: true`): server-sent events as OpenAI and vLLM send them, one
//! chunk per token of each choice as the sampler chooses it, `data: [DONE]` last.
//!
//! A streamed request is computed exactly as the same request without `stream` (one sampler
//! call over all its rows, with its seed), so its tokens are the same, and the texts and ids of
//! a choice's chunks, concatenated, are the unstreamed choice's. Text that may be the start of a
//! stop string is held back until it is known not to be. Each chunk carries rlft's extensions
//! of its token under `rlft` (`token_ids`, `logprobs` = log μ, `token_versions`, and with
//! filters `log_kept_mass` and the kept ids), and the last chunk of a choice its `finish`. A
//! client that goes away ends the computation at the next decode step and frees its slot.

use crate::admission::InFlight;
use crate::error::ApiError;
use crate::generate::{self, Job};
use crate::state::{Policy, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use rlft_model::TokenStream;
use rlft_rollout::Sampled;
use serde_json::{Value, json};
use std::convert::Infallible;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::sync::mpsc::UnboundedSender;

/// Which protocol's chunks, with the request's output settings.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    /// `/v1/completions`: `text_completion` chunks.
    Completion {
        /// `logprobs` was given.
        logprobs: bool,
        /// `return_tokens_as_token_ids`.
        as_ids: bool,
    },
    /// `/v1/chat/completions`: `chat.completion.chunk` chunks.
    Chat {
        /// `logprobs: true`.
        logprobs: bool,
    },
}

/// What every chunk of one answer shares.
pub struct Plan {
    /// The protocol and its settings.
    pub kind: Kind,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// The answer's id (`cmpl-N`, `chatcmpl-N`).
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// The served name.
    pub model: String,
}

impl Plan {
    /// A chunk with these choices (`usage: null` when the answer ends with a usage chunk).
    fn chunk(&self, choices: Vec<Value>) -> Value {
        let object = match self.kind {
            Kind::Completion { .. } => "text_completion",
            Kind::Chat { .. } => "chat.completion.chunk",
        };
        let mut v = json!({
            "id": self.id, "object": object, "created": self.created, "model": self.model,
            "choices": choices,
        });
        if self.include_usage {
            v["usage"] = Value::Null;
        }
        v
    }
}

/// Waits for a generation slot, then answers with the stream of `job`'s chunks.
pub async fn respond(st: Arc<State>, job: Job, ticket: InFlight, plan: Plan) -> Response {
    let permit = match st.slots.clone().acquire_owned().await {
        Ok(p) => p,
        Err(_) => {
            return ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the server is stopping")
                .into_response();
        }
    };
    let policy = st.policy();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    tokio::task::spawn_blocking(move || {
        produce(&st, &job, &policy, &plan, &tx);
        drop((permit, ticket));
    });
    let events = futures_util::stream::unfold(rx, |mut rx| async move {
        let data = rx.recv().await?;
        Some((Ok::<_, Infallible>(Event::default().data(data)), rx))
    });
    Sse::new(events).into_response()
}

/// Computes `job`, sending each chunk's JSON, then the usage chunk (when asked), then `[DONE]`;
/// an error met on the way is sent as `{"error": …}` before `[DONE]`.
fn produce(st: &State, job: &Job, policy: &Policy, plan: &Plan, tx: &UnboundedSender<String>) {
    let send = |v: Value| tx.send(v.to_string()).is_ok();
    let rows = job.prompts.len() * job.n;
    if let Kind::Chat { .. } = plan.kind {
        let first: Vec<Value> = (0..rows)
            .map(|i| {
                json!({"index": i, "delta": {"role": "assistant", "content": ""},
                       "logprobs": null, "finish_reason": null})
            })
            .collect();
        send(plan.chunk(first));
    }
    let as_ids = matches!(plan.kind, Kind::Completion { as_ids: true, .. });
    let mut texts: Vec<RowText<'_>> = (0..rows).map(|_| RowText::new(policy, as_ids)).collect();
    let mut generated = 0usize;
    let mut failed: Option<ApiError> = None;
    let result = generate::run_with(job, policy, |s| {
        generated += 1;
        let chunk = texts[s.row]
            .advance(s, &job.cfg.stop_strings, policy)
            .map(|delta| plan.chunk(vec![choice(plan, job, s, &texts[s.row], delta)]));
        match chunk {
            Ok(c) => {
                if send(c) {
                    ControlFlow::Continue(())
                } else {
                    ControlFlow::Break(())
                }
            }
            Err(e) => {
                failed = Some(e);
                ControlFlow::Break(())
            }
        }
    });
    let c = &st.counters;
    let prompt_tokens: usize = job.prompts.iter().map(Vec::len).sum();
    c.prompt_tokens
        .fetch_add(prompt_tokens as u64, Ordering::Relaxed);
    c.tokens.fetch_add(generated as u64, Ordering::Relaxed);
    c.requests.fetch_add(1, Ordering::Relaxed);
    if tx.is_closed() {
        c.cancelled.fetch_add(1, Ordering::Relaxed);
        return;
    }
    match failed.map_or(result.map(|_| ()), Err) {
        Ok(()) => {
            if plan.include_usage {
                let completion_tokens = generated;
                let mut last = plan.chunk(Vec::new());
                last["usage"] = json!({
                    "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                });
                send(last);
            }
        }
        Err(e) => {
            c.errors.fetch_add(1, Ordering::Relaxed);
            send(e.body());
        }
    }
    let _ = tx.send("[DONE]".into());
}

/// One choice of a token's chunk.
fn choice(plan: &Plan, job: &Job, s: &Sampled<'_>, row: &RowText<'_>, delta: String) -> Value {
    let id = s.draw.token as u32;
    let lp = f32_number(s.draw.logprob);
    let finish = s.finish.map(generate::finish_name);
    let mut rlft = json!({"token_ids": [id], "logprobs": [lp], "token_versions": [s.version]});
    if job.cfg.draws_filtered() {
        rlft["log_kept_mass"] = json!([f32_number(s.draw.log_kept_mass as f32)]);
        if job.kept {
            rlft["kept_ids"] = json!([s.draw.kept_ids]);
        }
    }
    if let Some(f) = s.finish {
        rlft["finish"] = json!(generate::finish_kind(f));
    }
    match plan.kind {
        Kind::Completion { logprobs, .. } => {
            let logprobs = logprobs.then(|| {
                json!({"tokens": [row.shown],
                       "token_logprobs": [lp], "top_logprobs": null,
                       "text_offset": [row.offset_before]})
            });
            json!({"index": s.row, "text": delta, "logprobs": logprobs,
                   "finish_reason": finish, "rlft": rlft})
        }
        Kind::Chat { logprobs } => {
            let logprobs = logprobs.then(|| {
                let token = &row.shown;
                json!({"content": [{"token": token, "logprob": lp,
                       "bytes": token.as_bytes(), "top_logprobs": []}]})
            });
            json!({"index": s.row, "delta": {"content": delta}, "logprobs": logprobs,
                   "finish_reason": finish, "rlft": rlft})
        }
    }
}

/// An `f32` as the unstreamed answer writes it (serde writes an `f32` field in its shortest
/// form; `json!` would widen it to `f64` and write all of that's digits).
fn f32_number(x: f32) -> Value {
    x.to_string()
        .parse::<f64>()
        .map_or(Value::Null, Value::from)
}

/// One choice's text as it streams.
struct RowText<'p> {
    /// The incremental decoder (special tokens left out, as the unstreamed text).
    decoder: TokenStream<'p>,
    /// The ids so far.
    tokens: Vec<u32>,
    /// The text they decode to so far.
    decoded: String,
    /// Bytes of `decoded` sent.
    sent: usize,
    /// `text_offset` of the newest token (the characters of the tokens before it).
    offset_before: usize,
    /// The characters of every token so far (`text_offset`'s running sum).
    offset: usize,
    /// Tokens are shown as `token_id:<id>` (their offsets count those characters).
    as_ids: bool,
    /// The newest token as `logprobs` shows it.
    shown: String,
}

impl<'p> RowText<'p> {
    fn new(policy: &'p Policy, as_ids: bool) -> Self {
        Self {
            as_ids,
            shown: String::new(),
            decoder: policy.tokenizer.decode_stream(true),
            tokens: Vec::new(),
            decoded: String::new(),
            sent: 0,
            offset_before: 0,
            offset: 0,
        }
    }

    /// Takes the newest token; returns the text that can be sent now: all but what may start
    /// a stop string, and at the row's end the rest of the unstreamed text.
    fn advance(
        &mut self,
        s: &Sampled<'_>,
        stops: &[String],
        policy: &Policy,
    ) -> Result<String, ApiError> {
        let id = s.draw.token as u32;
        self.tokens.push(id);
        self.offset_before = self.offset;
        self.shown = generate::token_text(id, self.as_ids, policy);
        self.offset += self.shown.chars().count();
        if let Some(piece) = self
            .decoder
            .step(id)
            .map_err(|e| generate::internal(e.to_string()))?
        {
            self.decoded.push_str(&piece);
        }
        let Some(finish) = s.finish else {
            let end = self.decoded.len() - held_back(&self.decoded, stops);
            if end <= self.sent {
                return Ok(String::new());
            }
            let delta = self.decoded[self.sent..end].to_string();
            self.sent = end;
            return Ok(delta);
        };
        let text = generate::sample_text(&self.tokens, finish, stops, policy)?;
        let delta = match text.get(self.sent..) {
            Some(rest) if text.starts_with(&self.decoded[..self.sent]) => rest.to_string(),
            _ => String::new(),
        };
        self.sent = text.len();
        Ok(delta)
    }
}

/// How many bytes at the end of `text` may be the start of a stop string (held back until the
/// next tokens tell).
fn held_back(text: &str, stops: &[String]) -> usize {
    stops
        .iter()
        .flat_map(|s| {
            s.char_indices()
                .skip(1)
                .map(|(k, _)| k)
                .filter(|&k| text.ends_with(&s[..k]))
        })
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_may_start_a_stop_string_is_held_back() {
        let stops = vec!["\n\nQ:".to_string(), "éa".to_string()];
        assert_eq!(held_back("answer", &stops), 0);
        assert_eq!(held_back("answer\n", &stops), 1);
        assert_eq!(held_back("answer\n\n", &stops), 2);
        assert_eq!(held_back("answer\n\nQ", &stops), 3);
        assert_eq!(held_back("café", &stops), "é".len());
        assert_eq!(held_back("x", &[]), 0);
    }

    #[test]
    fn f32_numbers_are_written_as_serde_writes_them() {
        for x in [-0.104_387_1f32, -2.475_805, 1e-10, -7.5, 0.0] {
            let want = serde_json::to_string(&[x]).unwrap();
            assert_eq!(json!([f32_number(x)]).to_string(), want);
        }
    }
}
