//! Admission: a request counts in flight once its body is in, and past `max_concurrent` +
//! `max_queue` requests of its kind it gets a 503 at once.

use crate::error::ApiError;
use crate::state::State;
use axum::http::StatusCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Decrements its in-flight gauge when the request ends (answered, dropped or computed).
pub struct InFlight {
    st: Arc<State>,
    /// A weight update (counted apart from the generation requests).
    update: bool,
}

impl InFlight {
    fn gauge(&self) -> &AtomicU64 {
        let c = &self.st.counters;
        if self.update {
            &c.updates_in_flight
        } else {
            &c.in_flight
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.gauge().fetch_sub(1, Ordering::Relaxed);
    }
}

/// Counts a request in flight once its body is in (a weight update on a gauge of its own): a
/// 503 at once when `max_concurrent` + `max_queue` requests of its kind are already in, so what
/// requests hold stays bounded by settings.
pub fn admit(st: &Arc<State>, update: bool) -> Result<InFlight, ApiError> {
    let ticket = InFlight {
        st: st.clone(),
        update,
    };
    let before = ticket.gauge().fetch_add(1, Ordering::Relaxed);
    let cap = (st.config.max_concurrent + st.config.max_queue) as u64;
    if before >= cap {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the server is busy: {before} requests are running or queued (--max-concurrent \
                 {}, --max-queue {}); retry later",
                st.config.max_concurrent, st.config.max_queue
            ),
        ));
    }
    Ok(ticket)
}
