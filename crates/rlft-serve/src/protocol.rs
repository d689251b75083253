//! The wire format: OpenAI's completions and chat completions requests and responses as vLLM
//! extends them (token-id prompts, `top_k`, `min_p`, `stop_token_ids`, `ignore_eos`,
//! `return_tokens_as_token_ids`, `return_token_ids`), SGLang's weight-update request, and
//! rlft's own extensions, which sit under the `rlft` field of each choice ([`RlftChoice`]).

use rlft_model::TokenRouting;
use serde::{Deserialize, Serialize};

/// The request fields every generation route shares.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Sampling {
    /// The served model's name (`--served-model-name`); another name is a 404.
    pub model: Option<String>,
    /// Samples per prompt.
    pub n: Option<usize>,
    /// Softmax temperature (0: greedy; default 1).
    pub temperature: Option<f64>,
    /// Nucleus filter (default 1: off).
    pub top_p: Option<f64>,
    /// Keep the `k` most likely tokens (0 or −1: off).
    pub top_k: Option<i64>,
    /// Drop tokens less likely than `min_p` times the most likely one (default 0: off).
    pub min_p: Option<f64>,
    /// The draw's seed (default 0): the same request gives the same tokens.
    pub seed: Option<u64>,
    /// Strings that end a sample (excluded from its text).
    pub stop: Option<Stop>,
    /// Token ids that end a sample (vLLM).
    pub stop_token_ids: Option<Vec<u32>>,
    /// Go on past EOS (vLLM).
    pub ignore_eos: Option<bool>,
    /// Answer with server-sent events, one chunk per token of each choice, `data: [DONE]` last.
    pub stream: Option<bool>,
    /// With `stream`: `{"include_usage": true}` adds a last chunk with the usage.
    pub stream_options: Option<StreamOptions>,
    /// rlft: return each token's kept set under top-k / min-p / top-p (sampling-mask replay).
    pub return_kept_ids: Option<bool>,
    /// rlft: the largest kept set recorded with `return_kept_ids` (default 1024; larger ones
    /// come back as `null`).
    pub kept_ids_max: Option<usize>,
    /// rlft: return a mixture of experts' routing of every forwarded token.
    pub return_routing: Option<bool>,
    /// rlft: recompute `log μ` with one full forward pass over the finished batch, in the
    /// learner's layout ([`SamplingConfig::rescore`](rlft_rollout::SamplingConfig::rescore)).
    pub rescore: Option<bool>,
    /// rlft: where tokens are drawn from the logits, `auto` (default), `host` or `device`
    /// ([`SampleOn`](rlft_rollout::SampleOn)).
    pub sample_on: Option<rlft_rollout::SampleOn>,
    /// Not served: a value other than 0 is refused (it would change the distribution μ is
    /// taken under).
    pub presence_penalty: Option<f64>,
    /// Not served: a value other than 0 is refused.
    pub frequency_penalty: Option<f64>,
    /// Not served (vLLM): a value other than 1 is refused.
    pub repetition_penalty: Option<f64>,
    /// Not served: a non-empty map is refused.
    pub logit_bias: Option<serde_json::Map<String, serde_json::Value>>,
    /// Not served (vLLM): a value other than 0 is refused.
    pub min_tokens: Option<usize>,
}

/// `stream_options` (OpenAI).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with `usage` and no choices (the other chunks carry `usage: null`).
    pub include_usage: Option<bool>,
}

/// `stop`: one string or several.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    /// One stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

impl Stop {
    /// The strings.
    pub fn strings(&self) -> Vec<String> {
        match self {
            Self::One(s) => vec![s.clone()],
            Self::Many(v) => v.clone(),
        }
    }
}

/// `prompt` of `/v1/completions`: a text, texts, token ids or lists of token ids.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PromptInput {
    /// One text.
    Text(String),
    /// One row per text.
    Texts(Vec<String>),
    /// One row of token ids.
    Ids(Vec<u32>),
    /// One row per list of token ids.
    IdLists(Vec<Vec<u32>>),
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    /// The prompt rows.
    pub prompt: PromptInput,
    /// Most tokens per sample (default 16, as OpenAI and vLLM).
    pub max_tokens: Option<usize>,
    /// Return the sampled token's log-prob (any value ≥ 0; alternatives are not returned).
    pub logprobs: Option<u32>,
    /// Prompt echo is not served: `true` is refused.
    pub echo: Option<bool>,
    /// Only `best_of` = `n` is served.
    pub best_of: Option<usize>,
    /// Suffixes are not served.
    pub suffix: Option<String>,
    /// vLLM: tokens in `logprobs.tokens` read `token_id:<id>`.
    pub return_tokens_as_token_ids: Option<bool>,
    /// vLLM: each choice carries `prompt_token_ids` and `token_ids`.
    pub return_token_ids: Option<bool>,
    /// The shared sampling fields, read from the same body on their own (a flattened struct
    /// would lose the name of a field at fault).
    #[serde(skip)]
    pub sampling: Sampling,
}

/// The fields [`CompletionRequest`] reads (others are ignored and logged).
pub const COMPLETION_FIELDS: &[&str] = &[
    "prompt",
    "max_tokens",
    "logprobs",
    "echo",
    "best_of",
    "suffix",
    "return_tokens_as_token_ids",
    "return_token_ids",
];

/// The fields [`Sampling`] reads.
pub const SAMPLING_FIELDS: &[&str] = &[
    "model",
    "n",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "stream",
    "stream_options",
    "return_kept_ids",
    "kept_ids_max",
    "return_routing",
    "rescore",
    "sample_on",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "min_tokens",
];

/// One chat message of a request: `content` a text or a list of text parts.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatMessageIn {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text.
    pub content: Content,
}

/// A message's content.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Parts; only `{"type": "text", "text": ...}` parts are served.
    Parts(Vec<ContentPart>),
}

/// One part of a message's content.
#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    /// The part's type: `text`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Its text.
    pub text: Option<String>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    /// The conversation.
    pub messages: Vec<ChatMessageIn>,
    /// Most tokens per sample (default: what the context leaves).
    pub max_tokens: Option<usize>,
    /// OpenAI's newer name of `max_tokens`.
    pub max_completion_tokens: Option<usize>,
    /// Return the sampled tokens' log-probs.
    pub logprobs: Option<bool>,
    /// Alternatives per token (not returned; accepted for clients that send it).
    pub top_logprobs: Option<u32>,
    /// The shared sampling fields, read from the same body on their own (a flattened struct
    /// would lose the name of a field at fault).
    #[serde(skip)]
    pub sampling: Sampling,
}

/// The fields [`ChatRequest`] reads.
pub const CHAT_FIELDS: &[&str] = &[
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "logprobs",
    "top_logprobs",
];

/// `POST /update_weights_from_disk` (SGLang's route and fields).
#[derive(Debug, Clone, Deserialize)]
pub struct UpdateWeightsRequest {
    /// A Hugging Face checkpoint folder of the served model's shape (`rlft export --hf`).
    pub model_path: String,
    /// The version the new weights are (an integer, or its text); default the current + 1.
    pub weight_version: Option<VersionInput>,
}

/// A weight version as SGLang's clients send it: a number or a string.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum VersionInput {
    /// A number.
    Number(u64),
    /// Its text.
    Text(String),
}

/// `usage`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Usage {
    /// Prompt tokens (each prompt once).
    pub prompt_tokens: usize,
    /// Generated tokens, over every sample.
    pub completion_tokens: usize,
    /// Their sum.
    pub total_tokens: usize,
}

/// `choices[i].logprobs` of a completion.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CompletionLogprobs {
    /// Each sampled token's text (or `token_id:<id>`).
    pub tokens: Vec<String>,
    /// `log μ` of each sampled token: under the distribution it was drawn from (after
    /// temperature and the top-k / min-p / top-p filters).
    pub token_logprobs: Vec<f32>,
    /// Alternatives are not returned: always `null`.
    pub top_logprobs: Option<Vec<serde_json::Value>>,
    /// Each token's character offset in the sample's text.
    pub text_offset: Vec<usize>,
}

/// Why a sample stopped, as rlft's sampler tells it apart.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Finish {
    /// An EOS token.
    Eos,
    /// A stop string or stop token id.
    Stop,
    /// `max_tokens` reached.
    Length,
}

/// rlft's extensions of a choice (the `rlft` field).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RlftChoice {
    /// The generated token ids (the EOS or stop token included).
    pub token_ids: Vec<u32>,
    /// `log μ` of each token (as `logprobs.token_logprobs`, also without `logprobs`).
    pub logprobs: Vec<f32>,
    /// The weight version that sampled each token.
    pub token_versions: Vec<u64>,
    /// Why the sample stopped: `eos`, `stop` or `length`.
    pub finish: Finish,
    /// With top-k / min-p / top-p at a temperature above 0: `log S` of each token, the log of
    /// the probability mass the filters kept (the full softmax's log-prob is
    /// `logprob + log_kept_mass`); empty without filters.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub log_kept_mass: Vec<f32>,
    /// With `return_kept_ids` and a filter: each token's kept ids (`null` where more than
    /// `kept_ids_max` were kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept_ids: Option<Vec<Option<Vec<u32>>>>,
    /// With `return_routing` on a mixture of experts: the experts of every forwarded token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing: Option<TokenRouting>,
}

/// One choice of a completion.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CompletionChoice {
    /// Prompt-major: prompt `i`'s sample `j` is choice `i·n + j`.
    pub index: usize,
    /// The sample's text (special tokens and the stop string left out).
    pub text: String,
    /// With `logprobs`.
    pub logprobs: Option<CompletionLogprobs>,
    /// `stop` (EOS, stop string or stop token) or `length`.
    pub finish_reason: String,
    /// vLLM's `return_token_ids`: the prompt's ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
    /// vLLM's `return_token_ids`: the generated ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
    /// rlft's extensions.
    pub rlft: RlftChoice,
}

/// The answer of `POST /v1/completions`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CompletionResponse {
    /// `cmpl-<n>`.
    pub id: String,
    /// `text_completion`.
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    /// The served name.
    pub model: String,
    /// Prompt-major.
    pub choices: Vec<CompletionChoice>,
    /// Token counts.
    pub usage: Usage,
}

/// One token of a chat answer's log-probs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ChatTokenLogprob {
    /// The token's text.
    pub token: String,
    /// `log μ`.
    pub logprob: f32,
    /// The token text's UTF-8 bytes.
    pub bytes: Vec<u8>,
    /// Alternatives are not returned: always empty.
    pub top_logprobs: Vec<serde_json::Value>,
}

/// `choices[i].logprobs` of a chat answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ChatLogprobs {
    /// One entry per generated token.
    pub content: Vec<ChatTokenLogprob>,
}

/// The assistant message of a chat choice.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ChatMessageOut {
    /// `assistant`.
    pub role: String,
    /// Its text.
    pub content: String,
}

/// One choice of a chat answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ChatChoice {
    /// The sample's index.
    pub index: usize,
    /// The answer.
    pub message: ChatMessageOut,
    /// With `logprobs = true`.
    pub logprobs: Option<ChatLogprobs>,
    /// `stop` or `length`.
    pub finish_reason: String,
    /// rlft's extensions.
    pub rlft: RlftChoice,
}

/// The answer of `POST /v1/chat/completions`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ChatResponse {
    /// `chatcmpl-<n>`.
    pub id: String,
    /// `chat.completion`.
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    /// The served name.
    pub model: String,
    /// The samples.
    pub choices: Vec<ChatChoice>,
    /// Token counts.
    pub usage: Usage,
}
