//! What every request passes before its route runs: the `Host` it names (no DNS rebinding into
//! a loopback server: [`crate::hosts`]), the API key (compared in constant time), the media type of a POST body
//! (no cross-origin `text/plain` posts), and the rule that weights are swapped only on a server
//! with a key.

use crate::error::ApiError;
use crate::hosts::HostCheck;
use crate::state::State;
use axum::extract::{Request, State as Shared};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// The route that swaps the served weights.
pub const UPDATE_ROUTE: &str = "/update_weights_from_disk";

/// The middleware: refuses a request that fails any check, else runs its route.
pub async fn guard(Shared(st): Shared<Arc<State>>, req: Request, next: Next) -> Response {
    match check(&st, req.method(), req.uri().path(), req.headers()) {
        Ok(()) => next.run(req).await,
        Err(e) => e.into_response(),
    }
}

/// The checks, in the order an attacker meets them: the host, the key, the media type, the
/// key-less weight update.
fn check(st: &State, method: &Method, path: &str, headers: &HeaderMap) -> Result<(), ApiError> {
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    if !st.host_check.accepts(host) {
        return Err(ApiError::new(
            StatusCode::MISDIRECTED_REQUEST,
            format!(
                "this server does not answer to Host {:?}: it accepts {}; start it with \
                 --allowed-hosts NAME to add a name",
                host.unwrap_or("(none)"),
                match &st.host_check {
                    HostCheck::Only(names) => names.join(", "),
                    HostCheck::Any => "any".into(),
                }
            ),
        ));
    }
    if let Some(key) = &st.config.api_key
        && path != "/health"
        && !key_matches(headers, key)
    {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "a missing or wrong API key: send the server's key as Authorization: Bearer <key>",
        ));
    }
    if *method == Method::POST {
        let want = media_type(path);
        let given = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok());
        if !given.is_some_and(|g| is_media_type(g, want)) {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!(
                    "POST {path} takes Content-Type: {want}, got {}",
                    given.map_or("none".into(), |g| format!("{g:?}"))
                ),
            ));
        }
    }
    if path == UPDATE_ROUTE && st.config.api_key.is_none() {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "weight updates need an API key: start the server with --api-key KEY (or \
             --api-key-file PATH, or RLFT_API_KEY) and send it as Authorization: Bearer KEY",
        ));
    }
    Ok(())
}

/// The media type a POST route takes.
fn media_type(_path: &str) -> &'static str {
    "application/json"
}

/// Whether a `Content-Type` value is `want`: case-insensitive, parameters (`; charset=utf-8`)
/// allowed.
pub fn is_media_type(value: &str, want: &str) -> bool {
    value
        .split(';')
        .next()
        .is_some_and(|t| t.trim().eq_ignore_ascii_case(want))
}

/// A fresh API key from the system's random source: 32 bytes as 64 hex digits (a trainer's
/// own servers get one per run).
///
/// # Errors
/// The system has no random source to read.
pub fn random_key() -> Result<String, crate::ServeError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)
        .map_err(|e| crate::ServeError::Runtime(format!("no random bytes for an API key: {e}")))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Whether `Authorization: Bearer <key>` carries `key`, compared in constant time.
fn key_matches(headers: &HeaderMap, key: &str) -> bool {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|given| bool::from(given.as_bytes().ct_eq(key.as_bytes())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_keys_differ() {
        let (a, b) = (random_key().unwrap(), random_key().unwrap());
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
    }

    #[test]
    fn media_types() {
        for ok in [
            "application/json",
            "Application/JSON",
            "application/json; charset=utf-8",
        ] {
            assert!(is_media_type(ok, "application/json"), "{ok}");
        }
        for bad in ["text/plain", "application/jsonx", "", "multipart/form-data"] {
            assert!(!is_media_type(bad, "application/json"), "{bad}");
        }
    }
}
