//! What a running server holds: the served policy (swapped whole by a weight update; a request
//! keeps the policy it started with), its limits and its counters.

use crate::config::ServerConfig;
use crate::hosts::HostCheck;
use rlft_model::{Tokenizer, Transformer, TransformerConfig};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

/// Request bodies parsed at once (a body is read whole before it takes one).
pub const PARSERS: usize = 2;

/// A policy to serve: the weights, their tokenizer and architecture, and their version.
#[derive(Clone)]
pub struct Policy {
    /// The model (frozen, on the device it computes on, in its compute type).
    pub model: Transformer,
    /// Its tokenizer (EOS ids, chat template).
    pub tokenizer: Tokenizer,
    /// Its architecture; an update must have the same.
    pub config: TransformerConfig,
    /// The weight version (0 for weights loaded at start unless told otherwise).
    pub version: u64,
}

impl Policy {
    /// The longest sequence (prompt and generated tokens) the model takes.
    pub fn context(&self) -> usize {
        self.config.max_position_embeddings
    }
}

/// The server's counters (`GET /metrics`).
#[derive(Default)]
pub struct Counters {
    /// Requests being computed or waiting for a slot.
    pub in_flight: AtomicU64,
    /// Generation requests answered (successfully or not).
    pub requests: AtomicU64,
    /// Requests answered with an error.
    pub errors: AtomicU64,
    /// Tokens generated.
    pub tokens: AtomicU64,
    /// Prompt tokens read.
    pub prompt_tokens: AtomicU64,
    /// Weight updates applied.
    pub updates: AtomicU64,
    /// Weight updates being read, loaded or waiting for the one before.
    pub updates_in_flight: AtomicU64,
    /// Connections closed because a request's headers or body did not arrive in time.
    pub timed_out: AtomicU64,
    /// Streamed requests whose client went away before the end.
    pub cancelled: AtomicU64,
}

/// Shared by every request.
pub struct State {
    /// The settings.
    pub config: ServerConfig,
    policy: RwLock<Arc<Policy>>,
    /// Serialises weight updates.
    pub updating: tokio::sync::Mutex<()>,
    /// Generation slots (`max_concurrent`).
    pub slots: Arc<tokio::sync::Semaphore>,
    /// Bodies parsed at once ([`PARSERS`]), taken once a body is read whole: what a request
    /// costs before it holds a generation slot stays bounded by settings.
    pub parsing: Arc<tokio::sync::Semaphore>,
    /// The counters.
    pub counters: Counters,
    /// Requests answered so far (for response ids).
    pub serial: AtomicU64,
    /// The `Host` headers accepted.
    pub host_check: HostCheck,
}

impl State {
    /// The state of a server starting with `policy`.
    pub fn new(config: ServerConfig, policy: Policy) -> Self {
        let slots = Arc::new(tokio::sync::Semaphore::new(config.max_concurrent));
        let parsing = Arc::new(tokio::sync::Semaphore::new(PARSERS));
        let host_check = HostCheck::new(&config.host, &config.allowed_hosts);
        Self {
            host_check,
            config,
            policy: RwLock::new(Arc::new(policy)),
            updating: tokio::sync::Mutex::new(()),
            slots,
            parsing,
            counters: Counters::default(),
            serial: AtomicU64::new(0),
        }
    }

    /// The policy serving now; a request keeps it to its end.
    pub fn policy(&self) -> Arc<Policy> {
        self.policy
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Serves `policy` from now on.
    pub fn swap(&self, policy: Policy) {
        *self.policy.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(policy);
        self.counters.updates.fetch_add(1, Ordering::Relaxed);
    }

    /// The next response id's number.
    pub fn next_serial(&self) -> u64 {
        self.serial.fetch_add(1, Ordering::Relaxed)
    }

    /// The counters in Prometheus' text format.
    pub fn prometheus(&self) -> String {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let rows = [
            (
                "rlft_requests_in_flight",
                "gauge",
                "Generation requests being computed or waiting for a slot.",
                get(&c.in_flight),
            ),
            (
                "rlft_requests_total",
                "counter",
                "Generation requests answered.",
                get(&c.requests),
            ),
            (
                "rlft_request_errors_total",
                "counter",
                "Generation requests answered with an error.",
                get(&c.errors),
            ),
            (
                "rlft_tokens_generated_total",
                "counter",
                "Tokens generated.",
                get(&c.tokens),
            ),
            (
                "rlft_prompt_tokens_total",
                "counter",
                "Prompt tokens read.",
                get(&c.prompt_tokens),
            ),
            (
                "rlft_connections_timed_out_total",
                "counter",
                "Connections closed because a request's headers or body did not arrive in time \
                 (--header-timeout, --body-timeout; idle keep-alive connections included).",
                get(&c.timed_out),
            ),
            (
                "rlft_requests_cancelled_total",
                "counter",
                "Streamed requests whose client went away before the end.",
                get(&c.cancelled),
            ),
            (
                "rlft_weight_updates_in_flight",
                "gauge",
                "Weight updates being loaded or waiting for the one before.",
                get(&c.updates_in_flight),
            ),
            (
                "rlft_weight_updates_total",
                "counter",
                "Weight updates applied.",
                get(&c.updates),
            ),
            (
                "rlft_weight_version",
                "gauge",
                "The version of the weights serving now.",
                self.policy().version,
            ),
        ];
        rows.iter()
            .map(|(name, kind, help, v)| {
                format!("# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}\n")
            })
            .collect()
    }
}
