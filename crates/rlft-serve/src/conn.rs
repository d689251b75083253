//! The connections: accepted on the listener and served by hyper's HTTP/1 with a header read
//! timeout, each on a task of its own; a stop closes the listener, lets the requests in flight
//! finish for `shutdown_grace_s`, and then drops whatever is left, so no client can keep a
//! server from stopping.

use crate::error::ServeError;
use crate::state::State;
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Serves `app` on `listener` until `stop` fires (or is dropped), then shuts down within the
/// grace period.
///
/// # Errors
/// None today: a failed accept (too many open files, a reset) is retried after a pause.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    st: Arc<State>,
    stop: tokio::sync::oneshot::Receiver<()>,
) -> Result<(), ServeError> {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs_f64(st.config.header_timeout_s))
        .keep_alive(true);
    let graceful = GracefulShutdown::new();
    let mut stop = stop;
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = &mut stop => break,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let conn =
            builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        let watched = graceful.watch(conn);
        let st = st.clone();
        tokio::spawn(async move {
            if let Err(e) = watched.await
                && e.is_timeout()
            {
                st.counters.timed_out.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    drop(listener);
    let grace = Duration::from_secs_f64(st.config.shutdown_grace_s);
    let _ = tokio::time::timeout(grace, graceful.shutdown()).await;
    Ok(())
}
