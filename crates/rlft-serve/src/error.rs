//! The server's errors: [`ServeError`] for the library (a server that cannot start), and
//! [`ApiError`], the JSON error a request gets (OpenAI's shape:
//! `{"error": {"message", "type", "param", "code"}}`).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// Why a server could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The address could not be bound.
    #[error(
        "cannot listen on {addr}: {source}; choose another --host or --port (0: any free port)"
    )]
    Bind {
        /// `host:port`.
        addr: String,
        /// The system's reason.
        source: std::io::Error,
    },
    /// A setting out of range.
    #[error("{0}")]
    Config(String),
    /// The runtime or the listener failed.
    #[error("the server failed: {0}")]
    Runtime(String),
}

/// A request's error: an HTTP status and a message naming the field (`param`) at fault.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// 4xx for the client's mistakes, 5xx for the server's.
    pub status: StatusCode,
    /// What was wrong and how to fix it.
    pub message: String,
    /// The request field at fault.
    pub param: Option<String>,
}

impl ApiError {
    /// A 400 naming `param`.
    pub fn bad(param: &str, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: format!("{param}: {}", message.into()),
            param: Some(param.into()),
        }
    }

    /// An error of `status` about no one field.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            param: None,
        }
    }

    /// OpenAI's error type for the status.
    fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::BAD_REQUEST => "BadRequestError",
            StatusCode::UNAUTHORIZED => "AuthenticationError",
            StatusCode::FORBIDDEN => "PermissionDeniedError",
            StatusCode::REQUEST_TIMEOUT => "RequestTimeoutError",
            StatusCode::UNSUPPORTED_MEDIA_TYPE => "UnsupportedMediaTypeError",
            StatusCode::MISDIRECTED_REQUEST => "MisdirectedRequestError",
            StatusCode::NOT_FOUND => "NotFoundError",
            StatusCode::PAYLOAD_TOO_LARGE => "RequestTooLargeError",
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => {
                "ServiceUnavailableError"
            }
            _ => "InternalServerError",
        }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind(),
                "param": self.param,
                "code": self.status.as_u16(),
            }
        })
    }
}

impl IntoResponse for ApiError {
    /// The JSON body. A refusal sent before the request's body was read (a stalled, too large
    /// or refused request: 401, 403, 408, 413, 415, 421) also closes the connection, and says
    /// so, so that no client reuses a connection whose unread body is still on the wire.
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if matches!(
            self.status,
            StatusCode::UNAUTHORIZED
                | StatusCode::FORBIDDEN
                | StatusCode::REQUEST_TIMEOUT
                | StatusCode::PAYLOAD_TOO_LARGE
                | StatusCode::UNSUPPORTED_MEDIA_TYPE
                | StatusCode::MISDIRECTED_REQUEST
        ) {
            r.headers_mut().insert(
                axum::http::header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_their_field_in_openais_shape() {
        let e = ApiError::bad("temperature", "must be ≥ 0, got -1");
        let b = e.body();
        assert_eq!(b["error"]["param"], "temperature");
        assert_eq!(b["error"]["code"], 400);
        assert_eq!(b["error"]["type"], "BadRequestError");
        assert!(
            b["error"]["message"]
                .as_str()
                .unwrap()
                .starts_with("temperature: ")
        );
        let e = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "busy");
        assert_eq!(e.body()["error"]["param"], serde_json::Value::Null);
    }
}
