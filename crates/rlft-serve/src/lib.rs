//! # rlft-serve
//!
//! rlft's inference server: a policy behind OpenAI's completions protocol as vLLM extends it,
//! with SGLang's weight-update route, computed by rlft's own sampler (host decode kernels, KV
//! cache). `rlft serve MODEL` runs it; a trainer embeds it with [`ServerConfig::start`].
//!
//! | route | what |
//! |---|---|
//! | `POST /v1/completions` | `prompt` as text, texts, token ids or lists of them; `max_tokens`, `n`, `temperature`, `top_p`, `top_k`, `min_p`, `seed`, `stop`, `stop_token_ids`, `ignore_eos`, `logprobs`, `return_tokens_as_token_ids`, `return_token_ids`; rlft's `return_kept_ids`, `kept_ids_max`, `return_routing` |
//! | `POST /v1/chat/completions` | `messages` through the model's chat template (400 without one) |
//! | `GET /v1/models` | the served name, context length and weight version |
//! | `POST /update_weights_from_disk` | `{"model_path": DIR, "weight_version": K}` (SGLang's route and fields) |
//! | `GET /metrics` | Prometheus text: `rlft_requests_in_flight`, `rlft_requests_total`, `rlft_tokens_generated_total`, `rlft_weight_version`, … |
//! | `GET /health` | 200 |
//!
//! A request is one batch of its own — its rows in order, each prompt's `n` samples side by
//! side, drawn with its `seed` (default 0) as rlft's sampler draws for one call — and never
//! shares a batch with another, so the same request on the same weights gives the same tokens.
//! Every choice carries rlft's extensions under `rlft` ([`protocol::RlftChoice`]): the token
//! ids, `log μ` of each token, the weight version that sampled it, why the sample stopped, and
//! on request the kept sets and the routing.

#![warn(missing_docs)]

mod admission;
mod body;
pub mod client;
mod config;
mod conn;
pub mod error;
pub mod generate;
pub mod guard;
pub mod hosts;
pub mod protocol;
mod routes;
pub mod state;
mod stream;

pub use client::{Client, ClientError, Protocol, Remote};
pub use config::ServerConfig;
pub use error::{ApiError, ServeError};
pub use state::Policy;

use std::net::SocketAddr;
use std::sync::Arc;

/// A running server; dropping it stops it.
pub struct Server {
    addr: SocketAddr,
    state: Arc<state::State>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<(), ServeError>>>,
}

impl ServerConfig {
    /// Binds the address and serves `policy` on a runtime of its own threads until the
    /// [`Server`] is stopped or dropped.
    ///
    /// # Errors
    /// An address that cannot be bound, a limit of 0, a runtime that cannot start.
    pub fn start(&self, policy: Policy) -> Result<Server, ServeError> {
        for (key, v) in [
            ("max_concurrent", self.max_concurrent),
            ("max_n", self.max_n),
            ("max_rows", self.max_rows),
            ("max_body_bytes", self.max_body_bytes),
            ("max_batch_tokens", self.max_batch_tokens),
            ("max_tokens", self.max_tokens.unwrap_or(1)),
        ] {
            if v == 0 {
                return Err(ServeError::Config(format!("{key} must be at least 1")));
            }
        }
        if self.api_key.as_deref().is_some_and(|k| k.trim().is_empty()) {
            return Err(ServeError::Config(
                "the API key is empty; give a key or none".into(),
            ));
        }
        for (key, v) in [
            ("header_timeout_s", self.header_timeout_s),
            ("body_timeout_s", self.body_timeout_s),
            ("shutdown_grace_s", self.shutdown_grace_s),
        ] {
            if !(v.is_finite() && v > 0.0 && v <= 86_400.0) {
                return Err(ServeError::Config(format!(
                    "{key} must be a number of seconds in (0, 86400], got {v}"
                )));
            }
        }
        if !hosts::is_loopback(&self.host) && self.api_key.is_none() {
            if !self.insecure_no_key {
                return Err(ServeError::Config(format!(
                    "--host {} is not a loopback address, and without --api-key anyone who can                      reach the port could use the server: give --api-key KEY (or                      --api-key-file PATH, or RLFT_API_KEY), or --insecure-no-key to serve                      without one",
                    self.host
                )));
            }
            eprintln!(
                "rlft serve: warning: serving on {} without an API key (--insecure-no-key):                  anyone who can reach the port can generate",
                self.host
            );
        }
        let addr = format!("{}:{}", self.host, self.port);
        let listener = std::net::TcpListener::bind(&addr).map_err(|source| ServeError::Bind {
            addr: addr.clone(),
            source,
        })?;
        let local = listener
            .local_addr()
            .map_err(|e| ServeError::Runtime(e.to_string()))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| ServeError::Runtime(e.to_string()))?;
        let state = Arc::new(state::State::new(self.clone(), policy));
        let app = routes::router(state.clone());
        let served_state = state.clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("rlft-serve")
            .enable_all()
            .build()
            .map_err(|e| ServeError::Runtime(e.to_string()))?;
        let thread = std::thread::Builder::new()
            .name(format!("rlft-serve-{}", local.port()))
            .spawn(move || {
                let served = runtime.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener)
                        .map_err(|e| ServeError::Runtime(e.to_string()))?;
                    conn::serve(listener, app, served_state, stopped).await
                });
                // Tasks still running past the grace period (a stalled client) are dropped.
                runtime.shutdown_timeout(std::time::Duration::from_millis(500));
                served
            })
            .map_err(|e| ServeError::Runtime(e.to_string()))?;
        Ok(Server {
            addr: local,
            state,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Server {
    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its base URL, `http://host:port`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The weight version serving now.
    pub fn version(&self) -> u64 {
        self.state.policy().version
    }

    /// Stops accepting connections, lets the requests in flight finish (for at most
    /// [`ServerConfig::shutdown_grace_s`]), and returns.
    ///
    /// # Errors
    /// The server had failed.
    pub fn stop(mut self) -> Result<(), ServeError> {
        self.shutdown()
    }

    /// Blocks until the server stops by itself (it fails) or `stop` is set.
    ///
    /// # Errors
    /// The server failed.
    pub fn wait(mut self, stop: &std::sync::atomic::AtomicBool) -> Result<(), ServeError> {
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            if self.thread.as_ref().is_some_and(|t| t.is_finished()) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<(), ServeError> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        match self.thread.take().map(std::thread::JoinHandle::join) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(ServeError::Runtime("the server thread panicked".into())),
            None => Ok(()),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}
