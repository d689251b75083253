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
    /// When set, every route but `/health` needs `Authorization: Bearer <key>`. Without one,
    /// weight updates are refused (403), and only a loopback `host` may be bound unless
    /// [`insecure_no_key`](Self::insecure_no_key) is set.
    #[config(default = "None")]
    pub api_key: Option<String>,
    /// Bind a non-loopback `host` without an API key (a warning is printed): anyone who can
    /// reach the port can then generate.
    #[config(default = false)]
    pub insecure_no_key: bool,
    /// Host names (`Host` header, without the port) accepted besides `localhost`, `127.0.0.1`
    /// and `[::1]`; `*` accepts any. On a loopback bind every other `Host` is refused with 421
    /// (no DNS rebinding); on another bind the check applies only when this list is not empty.
    #[config(default = "Vec::new()")]
    pub allowed_hosts: Vec<String>,
    /// Seconds a client may take to send a request's headers (also how long an idle
    /// keep-alive connection stays open); the connection is then closed.
    #[config(default = 10.0)]
    pub header_timeout_s: f64,
    /// Seconds a request body may go without a byte arriving; the request then gets a 408 and
    /// its connection is closed.
    #[config(default = 10.0)]
    pub body_timeout_s: f64,
    /// Seconds a stopping server waits for its requests in flight before it drops them.
    #[config(default = 3.0)]
    pub shutdown_grace_s: f64,
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
