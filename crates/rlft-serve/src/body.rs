//! Reading a request body whole: at most `max_body_bytes`, with no more than `body_timeout_s`
//! between two reads. A body cut short is a 400 that says so; a stalled one a 408 that closes
//! the connection and is counted.

use crate::error::ApiError;
use crate::state::State;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode, header};
use http_body_util::BodyExt;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// The body, whole. Holds no slot of the server: slots are taken once it is in.
///
/// # Errors
/// 413 past the limit (at once when `Content-Length` says so), 408 when no byte arrived for
/// `body_timeout_s`, 400 when the connection ended before the body did.
pub async fn read(st: &State, headers: &HeaderMap, body: Body) -> Result<Bytes, ApiError> {
    let limit = st.config.max_body_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large(limit));
    }
    let idle = Duration::from_secs_f64(st.config.body_timeout_s);
    let mut body = body;
    let mut buf: Vec<u8> = Vec::new();
    loop {
        let frame = match tokio::time::timeout(idle, body.frame()).await {
            Err(_) => {
                st.counters.timed_out.fetch_add(1, Ordering::Relaxed);
                return Err(ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    format!(
                        "no byte of the body arrived for {:.1} s after {} bytes (--body-timeout); \
                         the connection is closed",
                        st.config.body_timeout_s,
                        buf.len()
                    ),
                ));
            }
            Ok(None) => break,
            Ok(Some(Err(e))) => {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "the body was cut short: the connection ended after {} of {} bytes \
                         ({e}); send the whole body",
                        buf.len(),
                        declared.map_or("the declared".into(), |n| n.to_string())
                    ),
                ));
            }
            Ok(Some(Ok(frame))) => frame,
        };
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.len() > limit {
                return Err(too_large(limit));
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(Bytes::from(buf))
}

fn too_large(limit: usize) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!(
            "the body is larger than the server's limit of {limit} bytes (--max-body-bytes); \
             send fewer rows per request"
        ),
    )
}
