//! [`ServerConfig`]: where a server listens and the limits of what it accepts.

use burn::config::Config;

/// How a server listens and what it accepts.
#[derive(Config, Debug)]
pub struct ServerConfig {
    /// The address to bind (loopback unless told otherwise).
    #[config(default = "String::from(\"127.0.0.1\")")]
    pub host: String,
    /// The port (0: any free one; [`Server::addr`](crate::Server::addr) tells which).
    #[config(default = 8000)]
    pub port: u16,
    /// The name requests must give as `model` (another name is a 404).
    #[config(default = "String::from(\"policy\")")]
    pub served_model_name: String,
    /// When set, every route but `/health` needs `Authorization: Bearer <key>`.
    #[config(default = "None")]
    pub api_key: Option<String>,
    /// Requests computed at once; each is one batch on its own thread.
    #[config(default = 1)]
    pub max_concurrent: usize,
    /// Requests that may wait for a slot; more get a 503.
    #[config(default = 64)]
    pub max_queue: usize,
    /// The largest `n`.
    #[config(default = 256)]
    pub max_n: usize,
    /// The most samples (prompt rows × `n`) in one request.
    #[config(default = 4096)]
    pub max_rows: usize,
    /// The largest `max_tokens` (unset: the model's context length).
    #[config(default = "None")]
    pub max_tokens: Option<usize>,
    /// The most tokens one request may hold: over its samples, prompt and `max_tokens`
    /// together (the KV cache it needs grows with it).
    #[config(default = 262_144)]
    pub max_batch_tokens: usize,
    /// The largest request body in bytes.
    #[config(default = 67_108_864)]
    pub max_body_bytes: usize,
    /// Print a line on stderr for each weight update (off for servers a trainer starts inside
    /// itself, whose updates its metrics count).
    #[config(default = true)]
    pub log_updates: bool,
}
