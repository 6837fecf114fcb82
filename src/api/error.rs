//! The one HTTP error type: `{"error": {"code", "message"}}` with the status
//! SPEC §9 assigns. Storage errors are logged and hidden behind a 500; bad
//! input never becomes a 500.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::creation::CreateError;
use crate::db::DbError;
use crate::delivery::DeliverError;

/// An error answer.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing or unknown bearer token (send `Authorization: Bearer <token>`)",
        )
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "conflict", message)
    }

    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("request body is larger than {limit} bytes ([server] max_body_bytes)"),
        )
    }

    /// 422 naming the field.
    pub fn invalid(field: &str, message: impl std::fmt::Display) -> Self {
        Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_field",
            format!("{field}: {message}"),
        )
    }

    pub fn limit(message: impl Into<String>) -> Self {
        Self::new(StatusCode::TOO_MANY_REQUESTS, "limit_reached", message)
    }

    pub fn internal(context: &str, e: impl std::fmt::Display) -> Self {
        tracing::error!(error = %e, "{context}");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("{context}; see the server log"),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(json!({"error": {"code": self.code, "message": self.message}})),
        )
            .into_response()
    }
}

impl From<DbError> for ApiError {
    fn from(e: DbError) -> Self {
        match e {
            DbError::NotFound { what, id } => Self::not_found(format!("{what} `{id}` not found")),
            DbError::Conflict(m) => Self::conflict(m),
            DbError::Invalid(m) => Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid", m),
            DbError::Limit(m) => Self::limit(m),
            other => Self::internal("storage error", other),
        }
    }
}

impl From<CreateError> for ApiError {
    fn from(e: CreateError) -> Self {
        match e {
            CreateError::Invalid { field, message } => Self::invalid(field, message),
            CreateError::Limit(m) => Self::limit(m),
            CreateError::Db(d) => d.into(),
        }
    }
}

impl From<DeliverError> for ApiError {
    fn from(e: DeliverError) -> Self {
        match e {
            DeliverError::Closed(_) | DeliverError::Final(..) => Self::conflict(e.to_string()),
            DeliverError::Db(d) => d.into(),
        }
    }
}
