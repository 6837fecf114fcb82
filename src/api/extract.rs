//! Request extractors: the authenticated user and a JSON body read under
//! the size limit, with 400 for malformed JSON, 413 for oversized bodies and
//! 422 naming the field for valid JSON of the wrong shape.

use std::sync::Arc;

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::header::{AUTHORIZATION, CONTENT_LENGTH};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use super::error::ApiError;
use crate::core::{Core, User};

/// The caller, authenticated by bearer token.
pub struct AuthUser(pub User);

impl FromRequestParts<Arc<Core>> for AuthUser {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        core: &Arc<Core>,
    ) -> Result<Self, Self::Rejection> {
        let token = parts
            .headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .map(str::trim);
        core.auth
            .authenticate(token)
            .map(AuthUser)
            .ok_or_else(ApiError::unauthorized)
    }
}

/// A JSON body deserialised into `T`.
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned> FromRequest<Arc<Core>> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, core: &Arc<Core>) -> Result<Self, Self::Rejection> {
        let limit = core.cfg.server.max_body_bytes;
        let declared = req
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        if declared.is_some_and(|n| n > limit) {
            return Err(ApiError::too_large(limit));
        }
        let bytes = axum::body::to_bytes(req.into_body(), limit)
            .await
            .map_err(|_| ApiError::too_large(limit))?;
        parse_json(&bytes).map(JsonBody)
    }
}

/// Parses a JSON body: 400 when it is not JSON, 422 naming the field when it
/// does not fit `T`.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request(
            "request body is empty; send a JSON object",
        ));
    }
    let value: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("request body is not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::bad_request("request body must be a JSON object"));
    }
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        let field = if path == "." {
            // Missing or unknown fields are reported at the root; the
            // message itself names the field.
            inner
                .split('`')
                .nth(1)
                .map(str::to_string)
                .unwrap_or_else(|| "body".into())
        } else {
            path
        };
        ApiError::invalid(&field, inner)
    })
}
