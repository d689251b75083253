//! A server for the client's tests: records every request (route with its query, and body)
//! and answers each route with a canned status and body.

use axum::body::Bytes;
use axum::http::{StatusCode, Uri};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The requests a mock received: (route with query, body as JSON, or null).
pub type Log = Arc<Mutex<Vec<(String, Value)>>>;

/// A running mock; dropping it stops it.
pub struct Mock {
    /// `http://127.0.0.1:port`.
    pub url: String,
    /// What it received.
    pub log: Log,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Mock {
    /// Answers each route in `answers` (route without query → (status, body)); any other
    /// route gets a 404.
    pub fn start(answers: HashMap<&'static str, (u16, String)>) -> Self {
        let log: Log = Arc::default();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let seen = log.clone();
        let answers = Arc::new(answers);
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let app = axum::Router::new().fallback(move |uri: Uri, body: Bytes| {
                    let (seen, answers) = (seen.clone(), answers.clone());
                    async move {
                        let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
                        seen.lock().unwrap().push((uri.to_string(), body));
                        let (status, text) = answers
                            .get(uri.path())
                            .cloned()
                            .unwrap_or((404, "{}".into()));
                        (StatusCode::from_u16(status).unwrap(), text)
                    }
                });
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                axum::serve(listener, app)
                    .with_graceful_shutdown(async move {
                        let _ = stopped.await;
                    })
                    .await
                    .unwrap();
            });
        });
        Self {
            url,
            log,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// The routes received, in order.
    pub fn routes(&self) -> Vec<String> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .map(|(r, _)| r.clone())
            .collect()
    }
}

impl Drop for Mock {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A fixture of `tests/data/protocols`.
pub fn fixture(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/protocols")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}
