//! The HTTP routes: reading and checking each request (a JSON error naming the field for
//! anything wrong), queueing it for a generation slot, and writing the answer.

use crate::admission::{InFlight, admit};
use crate::error::ApiError;
use crate::generate::{self, Job, Sample};
use crate::protocol::{
    CHAT_FIELDS, COMPLETION_FIELDS, ChatChoice, ChatLogprobs, ChatMessageOut, ChatRequest,
    ChatResponse, ChatTokenLogprob, CompletionChoice, CompletionLogprobs, CompletionRequest,
    CompletionResponse, SAMPLING_FIELDS, Sampling, UpdateWeightsRequest, Usage, VersionInput,
};
use crate::state::{Policy, State};
use crate::{body, stream};
use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State as Shared};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use burn::tensor::DType;
use serde::de::DeserializeOwned;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{SystemTime, UNIX_EPOCH};

/// The server's routes over `state`.
pub fn router(state: Arc<State>) -> Router {
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/models", get(models))
        .route(crate::guard::UPDATE_ROUTE, post(update_weights))
        .route("/metrics", get(metrics))
        .route("/health", get(|| async { StatusCode::OK }))
        .fallback(|req: Request| async move {
            ApiError::new(
                StatusCode::NOT_FOUND,
                format!("no route {} {}", req.method(), req.uri().path()),
            )
        })
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::guard::guard,
        ))
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(state)
}

/// Parses `value` as `T`, naming the field of any error; fields none of `known` lists are
/// ignored, and logged under `route` (not when it is empty).
fn parse<T: DeserializeOwned>(
    value: &serde_json::Value,
    known: &[&[&str]],
    route: &str,
) -> Result<T, ApiError> {
    let Some(object) = value.as_object() else {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "the body must be a JSON object",
        ));
    };
    let unknown: Vec<&str> = object
        .keys()
        .map(String::as_str)
        .filter(|k| !known.iter().any(|list| list.contains(k)))
        .collect();
    // Each body is parsed twice (its route's fields, then the sampling fields): logged once.
    if !unknown.is_empty() && !route.is_empty() {
        eprintln!("rlft serve: {route}: ignored unknown field(s) {unknown:?}");
    }
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let message = e.inner().to_string();
        let param = if path == "." {
            // serde names a missing field only in its message: missing field `prompt`.
            message.split('`').nth(1).unwrap_or("body").to_string()
        } else {
            path
        };
        ApiError::bad(&param, message)
    })
}

/// The JSON value of a body.
fn json(bytes: &[u8]) -> Result<serde_json::Value, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("the body is not valid JSON: {e}"),
        )
    })
}

/// Refuses a request for another model than the served one (vLLM's 404).
fn check_model(s: &Sampling, st: &State) -> Result<(), ApiError> {
    match &s.model {
        Some(m) if *m != st.config.served_model_name => Err(ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!(
                "The model `{m}` does not exist. This server serves `{}`.",
                st.config.served_model_name
            ),
            param: Some("model".into()),
        }),
        _ => Ok(()),
    }
}

/// Counts a generation request and its outcome.
fn answered<T: IntoResponse>(st: &State, r: Result<T, ApiError>) -> Response {
    st.counters.requests.fetch_add(1, Ordering::Relaxed);
    match r {
        Ok(v) => v.into_response(),
        Err(e) => {
            st.counters.errors.fetch_add(1, Ordering::Relaxed);
            e.into_response()
        }
    }
}

/// Reads the body whole ([`body::read`]: no slot is held meanwhile), counts the request in
/// flight, then turns the body into `T` on a blocking thread, at most [`PARSERS`] bodies at a
/// time.
///
/// [`PARSERS`]: crate::state::PARSERS
async fn accepted<T: Send + 'static>(
    st: &Arc<State>,
    headers: &HeaderMap,
    body: Body,
    prepare: impl FnOnce(&State, &[u8]) -> Result<T, ApiError> + Send + 'static,
) -> Result<(T, InFlight), ApiError> {
    let bytes = body::read(st, headers, body).await?;
    let ticket = admit(st, false)?;
    let permit =
        st.parsing.clone().acquire_owned().await.map_err(|_| {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the server is stopping")
        })?;
    let shared = st.clone();
    let prepared = tokio::task::spawn_blocking(move || {
        let out = prepare(&shared, &bytes);
        drop(permit);
        out
    })
    .await
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))??;
    Ok((prepared, ticket))
}

/// Waits for a generation slot, then computes `job` on the policy serving at that moment, on a
/// blocking thread. The slot and the ticket are held until the computation ends, also when the
/// client has gone.
async fn compute(
    st: &Arc<State>,
    job: Job,
    ticket: InFlight,
) -> Result<(Job, Vec<Sample>, Arc<Policy>), ApiError> {
    let permit =
        st.slots.clone().acquire_owned().await.map_err(|_| {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the server is stopping")
        })?;
    let policy = st.policy();
    let prompt_tokens: usize = job.prompts.iter().map(Vec::len).sum();
    let (job, out, policy) = tokio::task::spawn_blocking(move || {
        let out = generate::run(&job, &policy);
        drop((permit, ticket));
        (job, out, policy)
    })
    .await
    .map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the generation failed: {e}"),
        )
    })?;
    let samples = out?;
    let c = &st.counters;
    c.prompt_tokens
        .fetch_add(prompt_tokens as u64, Ordering::Relaxed);
    let tokens: usize = samples.iter().map(|s| s.completion.tokens.len()).sum();
    c.tokens.fetch_add(tokens as u64, Ordering::Relaxed);
    Ok((job, samples, policy))
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn usage(job: &Job, samples: &[Sample]) -> Usage {
    let prompt_tokens = job.prompts.iter().map(Vec::len).sum();
    let completion_tokens = samples.iter().map(|s| s.completion.tokens.len()).sum();
    Usage {
        prompt_tokens,
        completion_tokens,
        total_tokens: prompt_tokens + completion_tokens,
    }
}

/// A completions body read and checked: the request and the job it asks for.
fn prepare_completion(st: &State, bytes: &[u8]) -> Result<(CompletionRequest, Job), ApiError> {
    let value = json(bytes)?;
    let known = [COMPLETION_FIELDS, SAMPLING_FIELDS];
    let mut req: CompletionRequest = parse(&value, &known, "/v1/completions")?;
    req.sampling = parse(&value, &known, "")?;
    check_model(&req.sampling, st)?;
    if req.echo == Some(true) {
        return Err(ApiError::bad("echo", "echoing the prompt is not served"));
    }
    if let Some(b) = req.best_of
        && b != req.sampling.n.unwrap_or(1)
    {
        return Err(ApiError::bad(
            "best_of",
            "only best_of = n is served (every sample is returned)",
        ));
    }
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::bad("suffix", "suffixes are not served"));
    }
    // The architecture and tokenizer, which no update changes.
    let policy = st.policy();
    let prompts = generate::prompt_rows(&req.prompt, &policy)?;
    let max_tokens = req
        .max_tokens
        .unwrap_or(generate::DEFAULT_MAX_TOKENS.min(generate::most_tokens(&policy, &st.config)));
    let job = generate::job(&req.sampling, prompts, max_tokens, &policy, &st.config)?;
    Ok((req, job))
}

async fn completions(Shared(st): Shared<Arc<State>>, headers: HeaderMap, body: Body) -> Response {
    let ((req, job), ticket) = match accepted(&st, &headers, body, prepare_completion).await {
        Ok(a) => a,
        Err(e) => return answered(&st, Err::<(), _>(e)),
    };
    if let Some(include_usage) = streamed(&req.sampling) {
        let kind = stream::Kind::Completion {
            logprobs: req.logprobs.is_some(),
            as_ids: req.return_tokens_as_token_ids == Some(true),
        };
        let plan = plan(&st, kind, include_usage, "cmpl");
        return stream::respond(st, job, ticket, plan).await;
    }
    let r = completions_inner(&st, req, job, ticket).await;
    answered(&st, r)
}

/// `Some(include_usage)` when the request asks for a stream.
fn streamed(s: &Sampling) -> Option<bool> {
    (s.stream == Some(true)).then(|| {
        s.stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false)
    })
}

/// What every chunk of a streamed answer shares.
fn plan(st: &State, kind: stream::Kind, include_usage: bool, prefix: &str) -> stream::Plan {
    stream::Plan {
        kind,
        include_usage,
        id: format!("{prefix}-{}", st.next_serial()),
        created: now(),
        model: st.config.served_model_name.clone(),
    }
}

async fn completions_inner(
    st: &Arc<State>,
    req: CompletionRequest,
    job: Job,
    ticket: InFlight,
) -> Result<axum::Json<CompletionResponse>, ApiError> {
    let (job, samples, policy) = compute(st, job, ticket).await?;
    let version = policy.version;
    let as_ids = req.return_tokens_as_token_ids == Some(true);
    let choices = samples
        .iter()
        .enumerate()
        .map(|(index, s)| {
            let c = &s.completion;
            let logprobs = req.logprobs.map(|_| {
                let tokens = generate::token_texts(c, as_ids, &policy);
                let mut offset = 0;
                let text_offset = tokens
                    .iter()
                    .map(|t| {
                        let at = offset;
                        offset += t.chars().count();
                        at
                    })
                    .collect();
                CompletionLogprobs {
                    tokens,
                    token_logprobs: c.logprobs.clone(),
                    top_logprobs: None,
                    text_offset,
                }
            });
            let ids = req.return_token_ids == Some(true);
            CompletionChoice {
                index,
                text: s.text.clone(),
                logprobs,
                finish_reason: generate::finish_reason(c),
                prompt_token_ids: ids.then(|| job.prompts[index / job.n].clone()),
                token_ids: ids.then(|| c.tokens.clone()),
                rlft: generate::extension(c, &job, version),
            }
        })
        .collect();
    Ok(axum::Json(CompletionResponse {
        id: format!("cmpl-{}", st.next_serial()),
        object: "text_completion".into(),
        created: now(),
        model: st.config.served_model_name.clone(),
        usage: usage(&job, &samples),
        choices,
    }))
}

/// A chat body read and checked: the request and the job it asks for.
fn prepare_chat(st: &State, bytes: &[u8]) -> Result<(ChatRequest, Job), ApiError> {
    let value = json(bytes)?;
    let known = [CHAT_FIELDS, SAMPLING_FIELDS];
    let mut req: ChatRequest = parse(&value, &known, "/v1/chat/completions")?;
    req.sampling = parse(&value, &known, "")?;
    check_model(&req.sampling, st)?;
    let policy = st.policy();
    let prompt = generate::chat_prompt(&req.messages, &policy)?;
    let room = policy.context().saturating_sub(prompt.len()).max(1);
    let most = generate::most_tokens(&policy, &st.config).min(room);
    let max_tokens = req.max_completion_tokens.or(req.max_tokens).unwrap_or(most);
    let job = generate::job(&req.sampling, vec![prompt], max_tokens, &policy, &st.config)?;
    Ok((req, job))
}

async fn chat(Shared(st): Shared<Arc<State>>, headers: HeaderMap, body: Body) -> Response {
    let ((req, job), ticket) = match accepted(&st, &headers, body, prepare_chat).await {
        Ok(a) => a,
        Err(e) => return answered(&st, Err::<(), _>(e)),
    };
    if let Some(include_usage) = streamed(&req.sampling) {
        let kind = stream::Kind::Chat {
            logprobs: req.logprobs == Some(true),
        };
        let plan = plan(&st, kind, include_usage, "chatcmpl");
        return stream::respond(st, job, ticket, plan).await;
    }
    let r = chat_inner(&st, req, job, ticket).await;
    answered(&st, r)
}

async fn chat_inner(
    st: &Arc<State>,
    req: ChatRequest,
    job: Job,
    ticket: InFlight,
) -> Result<axum::Json<ChatResponse>, ApiError> {
    let (job, samples, policy) = compute(st, job, ticket).await?;
    let version = policy.version;
    let choices = samples
        .iter()
        .enumerate()
        .map(|(index, s)| {
            let c = &s.completion;
            let logprobs = (req.logprobs == Some(true)).then(|| ChatLogprobs {
                content: generate::token_texts(c, false, &policy)
                    .into_iter()
                    .zip(&c.logprobs)
                    .map(|(token, &logprob)| ChatTokenLogprob {
                        bytes: token.as_bytes().to_vec(),
                        token,
                        logprob,
                        top_logprobs: Vec::new(),
                    })
                    .collect(),
            });
            ChatChoice {
                index,
                message: ChatMessageOut {
                    role: "assistant".into(),
                    content: s.text.clone(),
                },
                logprobs,
                finish_reason: generate::finish_reason(c),
                rlft: generate::extension(c, &job, version),
            }
        })
        .collect();
    Ok(axum::Json(ChatResponse {
        id: format!("chatcmpl-{}", st.next_serial()),
        object: "chat.completion".into(),
        created: now(),
        model: st.config.served_model_name.clone(),
        usage: usage(&job, &samples),
        choices,
    }))
}

async fn models(Shared(st): Shared<Arc<State>>) -> Response {
    let p = st.policy();
    axum::Json(serde_json::json!({
        "object": "list",
        "data": [{
            "id": st.config.served_model_name,
            "object": "model",
            "created": now(),
            "owned_by": "rlft",
            "root": st.config.served_model_name,
            "max_model_len": p.context(),
            "weight_version": p.version,
        }],
    }))
    .into_response()
}

async fn metrics(Shared(st): Shared<Arc<State>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        st.prometheus(),
    )
        .into_response()
}

/// `POST /update_weights_from_disk`: loads the folder whole, checks it is the served model's
/// architecture, then swaps it in. Requests in flight finish on the weights they started with;
/// a refused update leaves the old version serving.
async fn update_weights(
    Shared(st): Shared<Arc<State>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    match update_inner(&st, &headers, body).await {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => {
            let mut body = e.body();
            body["success"] = false.into();
            body["message"] = e.message.clone().into();
            (e.status, axum::Json(body)).into_response()
        }
    }
}

async fn update_inner(
    st: &Arc<State>,
    headers: &HeaderMap,
    body: Body,
) -> Result<serde_json::Value, ApiError> {
    let bytes = body::read(st, headers, body).await?;
    let _ticket = admit(st, true)?;
    let value = json(&bytes)?;
    let known: &[&str] = &[
        "model_path",
        "weight_version",
        "load_format",
        "flush_cache",
        "abort_all_requests",
    ];
    let req: UpdateWeightsRequest = parse(&value, &[known], "/update_weights_from_disk")?;
    if req.model_path.trim().is_empty() {
        return Err(ApiError::bad(
            "model_path",
            "is empty; name the checkpoint folder",
        ));
    }
    let _one_at_a_time = st.updating.lock().await;
    let current = st.policy();
    let version = match req.weight_version {
        None => current.version + 1,
        Some(VersionInput::Number(v)) => v,
        Some(VersionInput::Text(t)) => t.trim().parse().map_err(|_| {
            ApiError::bad(
                "weight_version",
                format!("must be a non-negative integer, got {t:?}"),
            )
        })?,
    };
    let dir = PathBuf::from(&req.model_path);
    let shown = dir.display().to_string();
    let keep = current.version;
    let loaded = tokio::task::spawn_blocking(move || load(&dir, &current, version))
        .await
        .map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("the load failed: {e}; version {keep} keeps serving"),
            )
        })??;
    st.swap(loaded);
    if st.config.log_updates {
        eprintln!("rlft serve: weight version {version} from {shown}");
    }
    Ok(serde_json::json!({
        "success": true,
        "message": format!("loaded weight version {version} from {shown}"),
        "num_paused_requests": 0,
        "weight_version": version,
    }))
}

/// The policy in `dir`, on the served policy's device and compute type.
fn load(dir: &std::path::Path, current: &Policy, version: u64) -> Result<Policy, ApiError> {
    let device = current.model.embed_tokens.weight.device();
    let keep = current.version;
    let p = rlft_model::Pretrained::load(dir, &device, DType::F32).map_err(|e| {
        ApiError::bad(
            "model_path",
            format!("{e}; the update is refused and version {keep} keeps serving"),
        )
    })?;
    if let Some(bad) = rlft_model::first_non_finite(&p.model) {
        return Err(ApiError::bad(
            "model_path",
            format!(
                "{}: {bad}; weights that are not finite are not served: the update is refused \
                 and version {keep} keeps serving",
                dir.display()
            ),
        ));
    }
    if p.config != current.config {
        return Err(ApiError::bad(
            "model_path",
            format!(
                "{} holds a model of another architecture than the one served ({} with {} \
                 layers of width {}, against {} with {} of {}); the update is refused and \
                 version {keep} keeps serving",
                dir.display(),
                p.config.model_type,
                p.config.num_layers,
                p.config.hidden_size,
                current.config.model_type,
                current.config.num_layers,
                current.config.hidden_size
            ),
        ));
    }
    Ok(Policy {
        model: p.model.with_compute_dtype(current.model.compute_dtype),
        tokenizer: current.tokenizer.clone(),
        config: current.config.clone(),
        version,
    })
}
