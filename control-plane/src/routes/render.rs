//! The routes' rendering of an error class ([`ApiError`], the service's): FastAPI's
//! `{"detail": ...}` body (with `code` where the route is not the reference's) and
//! `Retry-After`; the extractors whose rejections must have the same shape ([`ApiJson`],
//! [`ApiQuery`]); and the API key check as a middleware. MCP and E2B render the same class
//! their own ways.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::auth::{HEADER, check_key};
use crate::config::Config;
use crate::error::{ApiError, ErrorBody};

/// An error class on its way out of a route: anything the service's [`ApiError`] is made from
/// converts into it (`?` on a cause, an op's error or an `ApiError` alike).
#[derive(Debug)]
pub struct HttpError(pub ApiError);

impl<E: Into<ApiError>> From<E> for HttpError {
    fn from(e: E) -> Self {
        HttpError(e.into())
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let e = self.0;
        let status = e.status();
        e.log();
        let retry_after = e.retry_after();
        let mut response = (
            status,
            Json(ErrorBody {
                detail: e.to_string(),
                code: e.code().map(str::to_string),
            }),
        )
            .into_response();
        if let Some(after) = retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(after));
        }
        response
    }
}

/// The `{"detail"}` response of an error class (for code that answers a `Response`, not a
/// `Result`).
pub fn respond(e: impl Into<ApiError>) -> Response {
    HttpError(e.into()).into_response()
}

/// `X-API-Key` on every API route (health and version stay open): the service's one key check,
/// refused as 403 `{"detail"}` as the reference does.
pub async fn require_api_key(
    State(config): State<Arc<Config>>,
    req: Request,
    next: Next,
) -> Result<Response, HttpError> {
    let given = req.headers().get(HEADER).map(|v| v.as_bytes());
    check_key(&config, given)?;
    Ok(next.run(req).await)
}

/// `axum::Json` whose rejections (bad JSON, wrong types, wrong content type) answer 422 with the
/// same `{"detail": ...}` shape as every other error.
pub struct ApiJson<T>(pub T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    axum::Json<T>: FromRequest<S, Rejection = JsonRejection>,
    S: Send + Sync,
{
    type Rejection = HttpError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(v)) => Ok(ApiJson(v)),
            Err(rejection) => Err(ApiError::Unprocessable(rejection.body_text()).into()),
        }
    }
}

/// `axum::extract::Query` whose rejections (a value of the wrong type) answer 422 with the
/// `{"detail": ...}` shape, like [`ApiJson`]'s, instead of axum's plain-text 400.
pub struct ApiQuery<T>(pub T);

impl<S, T> FromRequestParts<S> for ApiQuery<T>
where
    T: serde::de::DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(v)) => Ok(ApiQuery(v)),
            Err(rejection) => Err(ApiError::Unprocessable(rejection.body_text()).into()),
        }
    }
}
