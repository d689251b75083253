//! A generation request checked and computed: its prompt rows as token ids, its sampler
//! settings, and one call of rlft's sampler over all its rows.
//!
//! A request is one batch of its own: its rows in order, each prompt's `n` samples side by side,
//! drawn with the request's `seed` exactly as rlft's sampler draws for one call, so its answer
//! depends only on the request and the weights.

use crate::config::ServerConfig;
use crate::error::ApiError;
use crate::protocol::{Finish, PromptInput, RlftChoice, Sampling};
use crate::state::Policy;
use rlft_model::ChatMessage;
use rlft_rollout::{Completion, FinishReason, Sampled, Sampler, SamplingConfig};
use std::ops::ControlFlow;

/// `max_tokens` of a completion request that gives none (OpenAI's and vLLM's default).
pub const DEFAULT_MAX_TOKENS: usize = 16;

/// The largest `max_tokens` the server takes for `policy`.
pub fn most_tokens(policy: &Policy, limits: &ServerConfig) -> usize {
    let context = policy.context();
    limits.max_tokens.unwrap_or(context).min(context)
}

/// Default `kept_ids_max` with `return_kept_ids` (as `rollout.sampling_mask_max_ids`).
pub const DEFAULT_KEPT_IDS_MAX: usize = 1024;

/// A checked request: what the sampler computes.
#[derive(Debug)]
pub struct Job {
    /// The prompt rows' token ids.
    pub prompts: Vec<Vec<u32>>,
    /// Samples per prompt.
    pub n: usize,
    /// The sampler's settings (the request's seed included).
    pub cfg: SamplingConfig,
    /// Return the kept sets.
    pub kept: bool,
    /// Return the routing.
    pub routing: bool,
}

/// One computed sample.
pub struct Sample {
    /// What the sampler returned.
    pub completion: Completion,
    /// Its text (special tokens and the stop string left out).
    pub text: String,
}

/// The prompt rows of `/v1/completions` as token ids. A text longer in bytes than the context
/// times the longest vocabulary entry is refused without being tokenised.
///
/// # Errors
/// An empty row, a token id outside the vocabulary, a row too long for the context.
pub fn prompt_rows(input: &PromptInput, policy: &Policy) -> Result<Vec<Vec<u32>>, ApiError> {
    let rows = match input {
        PromptInput::Text(t) => vec![encode(t, policy)?],
        PromptInput::Texts(v) => v
            .iter()
            .map(|t| encode(t, policy))
            .collect::<Result<_, _>>()?,
        PromptInput::Ids(ids) => vec![ids.clone()],
        PromptInput::IdLists(v) => v.clone(),
    };
    if rows.is_empty() {
        return Err(ApiError::bad("prompt", "no prompt rows given"));
    }
    let vocab = policy.config.vocab_size;
    for (i, row) in rows.iter().enumerate() {
        if row.is_empty() {
            return Err(ApiError::bad("prompt", format!("row {i} is empty")));
        }
        if let Some(&id) = row.iter().find(|&&id| id as usize >= vocab) {
            return Err(ApiError::bad(
                "prompt",
                format!("row {i}: token id {id} is outside the vocabulary (0..{vocab})"),
            ));
        }
    }
    Ok(rows)
}

/// The token ids of a text prompt.
fn encode(text: &str, policy: &Policy) -> Result<Vec<u32>, ApiError> {
    if policy
        .tokenizer
        .surely_longer_than(text.len(), policy.context())
    {
        return Err(too_long("prompt", text.len(), policy.context()));
    }
    policy
        .tokenizer
        .encode(text)
        .map_err(|e| ApiError::bad("prompt", e.to_string()))
}

fn too_long(param: &str, bytes: usize, context: usize) -> ApiError {
    ApiError::bad(
        param,
        format!(
            "{bytes} bytes is more than the model's context of {context} tokens can hold; \
             shorten it"
        ),
    )
}

/// The prompt of a chat request: the messages through the model's chat template.
///
/// # Errors
/// A model without a chat template, a part that is not text, a template that fails.
pub fn chat_prompt(
    messages: &[crate::protocol::ChatMessageIn],
    policy: &Policy,
) -> Result<Vec<u32>, ApiError> {
    if policy.tokenizer.chat_template.is_none() {
        return Err(ApiError::bad(
            "messages",
            "the model has no chat template (tokenizer_config.json's chat_template, \
             chat_template.jinja or a GGUF's tokenizer.chat_template), so chat messages cannot \
             be rendered; send the text to /v1/completions instead",
        ));
    }
    if messages.is_empty() {
        return Err(ApiError::bad("messages", "no messages given"));
    }
    let mut list = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let content = match &m.content {
            crate::protocol::Content::Text(t) => t.clone(),
            crate::protocol::Content::Parts(parts) => {
                let mut text = String::new();
                for p in parts {
                    match (&*p.kind, &p.text) {
                        ("text", Some(t)) => text.push_str(t),
                        (kind, _) => {
                            return Err(ApiError::bad(
                                "messages",
                                format!(
                                    "message {i}: a part of type {kind:?} is not served; send \
                                     text parts ({{\"type\": \"text\", \"text\": ...}})"
                                ),
                            ));
                        }
                    }
                }
                text
            }
        };
        list.push(ChatMessage::new(&m.role, &content));
    }
    let text = policy
        .tokenizer
        .apply_chat_template(&list, true)
        .map_err(|e| ApiError::bad("messages", e.to_string()))?;
    let rows = prompt_rows(&PromptInput::Text(text), policy)?;
    Ok(rows.into_iter().next().unwrap_or_default())
}

/// The sampler's settings of a request with `max_tokens` new tokens per sample, checked against
/// the server's limits and the model.
///
/// # Errors
/// A field out of range, naming it.
pub fn job(
    s: &Sampling,
    prompts: Vec<Vec<u32>>,
    max_tokens: usize,
    policy: &Policy,
    limits: &ServerConfig,
) -> Result<Job, ApiError> {
    refuse_unserved(s)?;
    let n = checked_size(s, &prompts, max_tokens, policy, limits)?;
    let cfg = sampling_config(s, max_tokens, policy)?;
    let kept = s.return_kept_ids.unwrap_or(false);
    let kept_max = s.kept_ids_max.unwrap_or(DEFAULT_KEPT_IDS_MAX);
    if kept && !cfg.draws_filtered() {
        return Err(ApiError::bad(
            "return_kept_ids",
            "kept sets exist only when tokens are drawn through a filter: set top_k, top_p or \
             min_p, at a temperature above 0",
        ));
    }
    if kept_max == 0 {
        return Err(ApiError::bad("kept_ids_max", "must be at least 1"));
    }
    Ok(Job {
        prompts,
        n,
        cfg: cfg.with_kept_ids_max(if kept { kept_max } else { 0 }),
        kept,
        routing: s.return_routing.unwrap_or(false),
    })
}

/// Refuses the fields whose settings are not served (penalties, logit bias, a minimum length)
/// unless given their neutral value, and what streaming cannot carry.
fn refuse_unserved(s: &Sampling) -> Result<(), ApiError> {
    let stream = s.stream == Some(true);
    if s.stream_options.is_some() && !stream {
        return Err(ApiError::bad(
            "stream_options",
            "is only allowed with stream = true",
        ));
    }
    for (key, asked) in [
        ("rescore", s.rescore == Some(true)),
        ("return_routing", s.return_routing == Some(true)),
    ] {
        if stream && asked {
            return Err(ApiError::bad(
                key,
                "is known only once the whole batch is sampled, so it is not served with                  stream = true; ask without streaming",
            ));
        }
    }
    for (key, given, neutral) in [
        ("presence_penalty", s.presence_penalty, 0.0),
        ("frequency_penalty", s.frequency_penalty, 0.0),
        ("repetition_penalty", s.repetition_penalty, 1.0),
    ] {
        if given.is_some_and(|v| v != neutral) {
            return Err(ApiError::bad(
                key,
                format!(
                    "is not served (the returned log μ would not be of the distribution asked \
                     for); leave it out or set it to {neutral}"
                ),
            ));
        }
    }
    if s.logit_bias.as_ref().is_some_and(|m| !m.is_empty()) {
        return Err(ApiError::bad(
            "logit_bias",
            "is not served; leave it out or send an empty map",
        ));
    }
    if s.min_tokens.is_some_and(|m| m > 0) {
        return Err(ApiError::bad(
            "min_tokens",
            "is not served; leave it out or set it to 0",
        ));
    }
    Ok(())
}

/// `n`, checked with the request's size against the server's limits and the model's context.
fn checked_size(
    s: &Sampling,
    prompts: &[Vec<u32>],
    max_tokens: usize,
    policy: &Policy,
    limits: &ServerConfig,
) -> Result<usize, ApiError> {
    let n = s.n.unwrap_or(1);
    if n == 0 || n > limits.max_n {
        return Err(ApiError::bad(
            "n",
            format!(
                "must be in 1..={} (the server's --max-n), got {n}",
                limits.max_n
            ),
        ));
    }
    let rows = prompts.len().saturating_mul(n);
    if rows > limits.max_rows {
        return Err(ApiError::bad(
            "n",
            format!(
                "{} prompt rows × n = {n} makes {rows} samples, more than the server's \
                 --max-rows {}; send fewer rows per request",
                prompts.len(),
                limits.max_rows
            ),
        ));
    }
    let context = policy.context();
    let most = most_tokens(policy, limits);
    if max_tokens == 0 || max_tokens > most {
        return Err(ApiError::bad(
            "max_tokens",
            format!("must be in 1..={most}, got {max_tokens}"),
        ));
    }
    for (i, p) in prompts.iter().enumerate() {
        if p.len() + max_tokens > context {
            return Err(ApiError::bad(
                if p.len() >= context {
                    "prompt"
                } else {
                    "max_tokens"
                },
                format!(
                    "the model's context is {context} tokens, and row {i} asks for {} ({} in the \
                     prompt, {max_tokens} to generate); shorten the prompt or lower max_tokens",
                    p.len() + max_tokens,
                    p.len()
                ),
            ));
        }
    }
    let tokens: usize = prompts.iter().map(|p| (p.len() + max_tokens) * n).sum();
    if tokens > limits.max_batch_tokens {
        return Err(ApiError::bad(
            "max_tokens",
            format!(
                "the request holds {tokens} tokens over its samples (prompt and max_tokens, \
                 times n), more than the server's --max-batch-tokens {}; send fewer rows, a \
                 smaller n or a lower max_tokens",
                limits.max_batch_tokens
            ),
        ));
    }
    Ok(n)
}

/// The sampler's settings of the request (temperature, filters, stops, seed), checked.
fn sampling_config(
    s: &Sampling,
    max_tokens: usize,
    policy: &Policy,
) -> Result<SamplingConfig, ApiError> {
    let temperature = s.temperature.unwrap_or(1.0);
    if !(temperature.is_finite() && temperature >= 0.0) {
        return Err(ApiError::bad(
            "temperature",
            format!("must be a finite number ≥ 0 (0: greedy), got {temperature}"),
        ));
    }
    let top_p = s.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::bad(
            "top_p",
            format!("must be in (0, 1] (1: off), got {top_p}"),
        ));
    }
    let top_k = match s.top_k.unwrap_or(0) {
        -1 | 0 => 0,
        k if k > 0 => k as usize,
        k => {
            return Err(ApiError::bad(
                "top_k",
                format!("must be ≥ 1, or 0 or -1 for off, got {k}"),
            ));
        }
    };
    let min_p = s.min_p.unwrap_or(0.0);
    if !(0.0..1.0).contains(&min_p) {
        return Err(ApiError::bad(
            "min_p",
            format!("must be in [0, 1) (0: off), got {min_p}"),
        ));
    }
    let stops = s.stop.as_ref().map(|s| s.strings()).unwrap_or_default();
    if stops.iter().any(String::is_empty) {
        return Err(ApiError::bad("stop", "a stop string is empty"));
    }
    let stop_ids = s.stop_token_ids.clone().unwrap_or_default();
    if let Some(&id) = stop_ids
        .iter()
        .find(|&&id| id as usize >= policy.config.vocab_size)
    {
        return Err(ApiError::bad(
            "stop_token_ids",
            format!(
                "token id {id} is outside the vocabulary (0..{})",
                policy.config.vocab_size
            ),
        ));
    }
    Ok(SamplingConfig::new()
        .with_temperature(temperature)
        .with_top_p(top_p)
        .with_top_k(top_k)
        .with_min_p(min_p)
        .with_max_new_tokens(max_tokens)
        .with_seed(s.seed.unwrap_or(0))
        .with_stop_strings(stops)
        .with_stop_token_ids(stop_ids)
        .with_ignore_eos(s.ignore_eos.unwrap_or(false))
        .with_rescore(s.rescore.unwrap_or(false))
        .with_sample_on(s.sample_on.unwrap_or_default()))
}

/// Computes `job` on `policy`: one sampler call over every row, prompt-major.
///
/// # Errors
/// The sampler's error (a 500: the request was checked), naming a non-finite logit.
pub fn run(job: &Job, policy: &Policy) -> Result<Vec<Sample>, ApiError> {
    run_with(job, policy, |_| ControlFlow::Continue(()))
}

/// As [`run`], calling `on_token` as each token is chosen (row `i` is choice `i`); a `Break`
/// ends the generation with an error.
///
/// # Errors
/// As [`run`].
pub fn run_with(
    job: &Job,
    policy: &Policy,
    on_token: impl FnMut(&Sampled<'_>) -> ControlFlow<()>,
) -> Result<Vec<Sample>, ApiError> {
    let rows: Vec<Vec<u32>> = job
        .prompts
        .iter()
        .flat_map(|p| std::iter::repeat_n(p.clone(), job.n))
        .collect();
    let sampler = Sampler::new(&policy.model, Some(&policy.tokenizer));
    let out = sampler
        .generate_with(&rows, &job.cfg, on_token)
        .map_err(|e| internal(e.to_string()))?;
    out.into_iter()
        .map(|completion| {
            let text = sample_text(
                &completion.tokens,
                completion.finish_reason,
                &job.cfg.stop_strings,
                policy,
            )?;
            Ok(Sample { completion, text })
        })
        .collect()
}

/// A 500.
pub fn internal(message: String) -> ApiError {
    ApiError::new(axum::http::StatusCode::INTERNAL_SERVER_ERROR, message)
}

/// A sample's text: special tokens left out, cut before the first stop string.
///
/// # Errors
/// A token the tokenizer cannot decode (a 500).
pub fn sample_text(
    tokens: &[u32],
    finish: FinishReason,
    stops: &[String],
    policy: &Policy,
) -> Result<String, ApiError> {
    let mut text = policy
        .tokenizer
        .decode(tokens, true)
        .map_err(|e| internal(e.to_string()))?;
    if finish == FinishReason::Stop
        && let Some(cut) = stops.iter().filter_map(|s| text.find(s.as_str())).min()
    {
        text.truncate(cut);
    }
    Ok(text)
}

/// OpenAI's `finish_reason`.
pub fn finish_reason(c: &Completion) -> String {
    finish_name(c.finish_reason).into()
}

/// OpenAI's `finish_reason` of a [`FinishReason`].
pub fn finish_name(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Length => "length",
        FinishReason::Eos | FinishReason::Stop => "stop",
    }
}

/// rlft's name of a [`FinishReason`] (the `finish` of [`RlftChoice`]).
pub fn finish_kind(f: FinishReason) -> Finish {
    match f {
        FinishReason::Eos => Finish::Eos,
        FinishReason::Stop => Finish::Stop,
        FinishReason::Length => Finish::Length,
    }
}

/// rlft's extensions of a sample's choice.
pub fn extension(c: &Completion, job: &Job, version: u64) -> RlftChoice {
    RlftChoice {
        token_ids: c.tokens.clone(),
        logprobs: c.logprobs.clone(),
        token_versions: vec![version; c.tokens.len()],
        finish: finish_kind(c.finish_reason),
        log_kept_mass: c.log_kept_mass.clone(),
        kept_ids: job.kept.then(|| c.kept_ids.clone()),
        routing: if job.routing { c.routing.clone() } else { None },
    }
}

/// Each token's text, as `logprobs.tokens` shows it.
pub fn token_texts(c: &Completion, as_ids: bool, policy: &Policy) -> Vec<String> {
    c.tokens
        .iter()
        .map(|&id| token_text(id, as_ids, policy))
        .collect()
}

/// One token's text, as `logprobs.tokens` shows it (`token_id:<id>` with `as_ids`).
pub fn token_text(id: u32, as_ids: bool, policy: &Policy) -> String {
    if as_ids {
        format!("token_id:{id}")
    } else {
        policy.tokenizer.decode(&[id], false).unwrap_or_default()
    }
}
