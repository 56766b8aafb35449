//! envd's `/files`: `GET` answers a file's bytes (`Range` and `Accept-Encoding: gzip` passed on to
//! the native route), `POST` writes one (`application/octet-stream`, gzip allowed) or several
//! (`multipart/form-data`: every part to `?path=` when the query names one, as envd writes them,
//! else each part to its own file name), replacing what is there in place (as envd does: a
//! watcher sees the file's own events) and creating parents; both streamed through the same
//! operations as the native `/files` route ([`crate::ops::files`]), so a file's size is bounded
//! by `FILE_MAX_BYTES` and the disk, not by memory.
//!
//! A signed URL (`signature`, `signature_expiration`) stands in for the access token for the one
//! path it was signed over: its holder (a browser, a less trusted party: the reason to sign URLs)
//! writes that path and no other, so a signed upload must carry `?path=` and no part's file name
//! is read.

use std::collections::{BTreeMap, HashMap};

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::{StreamExt, TryStreamExt};
use sandbox_protocol::wire::FsError;
use serde_json::{Value, json};

use super::super::refusal::Refusal;
use super::super::state::E2b;
use super::super::token::SignedUrl;
use super::{absolute, api_http_error, basic_user, check_user, http_error, sandbox_id};
use crate::ops::Held;
use crate::ops::files::{GuardedMultipart, Read, ReadFile, Tripwire, Write, WriteFile};
use crate::routes::files as files_route;

/// How a `/files` caller proved it may act on the sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Proof {
    /// The access token: anything the sandbox user may do.
    Token,
    /// A signed URL: the signed `?path=` only.
    Signature,
}

/// The caller of a `/files` request: its sandbox id once the token or the signature holds. A
/// signed URL may come without the sandbox header (a browser, `urllib`: the URL is all they
/// hold); its signature then names the sandbox, since only that sandbox's token makes it.
async fn authorize(
    e: &E2b,
    headers: &HeaderMap,
    params: &HashMap<String, String>,
    operation: &str,
) -> Result<(String, Proof), Refusal> {
    let named = sandbox_id(headers);
    let user = params
        .get("username")
        .cloned()
        .or_else(|| basic_user(headers));
    check_user(user.as_deref()).map_err(|e| Refusal::new(StatusCode::FORBIDDEN, e.message))?;
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let signed = params.get("signature").map(|sig| SignedUrl {
        signature: sig,
        path: params.get("path").map(String::as_str).unwrap_or(""),
        operation,
        username: user.as_deref().unwrap_or(""),
        expiration: params
            .get("signature_expiration")
            .and_then(|v| v.parse::<i64>().ok()),
    });
    let refused = || {
        Refusal::new(
            StatusCode::UNAUTHORIZED,
            "invalid or missing access token (X-Access-Token) or signature",
        )
    };
    if let Ok(id) = &named {
        let token = headers
            .get("x-access-token")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if e.tokens.check(id, token) {
            return Ok((id.clone(), Proof::Token));
        }
    }
    let Some(url) = signed else {
        return match named {
            Ok(_) => Err(refused()),
            Err(err) => Err(Refusal::new(StatusCode::NOT_FOUND, err.message)),
        };
    };
    // envd's words for a URL past its time, whoever signed it.
    if url.expiration.is_some_and(|at| at < now) {
        return Err(Refusal::new(
            StatusCode::UNAUTHORIZED,
            "signature is already expired",
        ));
    }
    if let Ok(id) = named {
        return match e.tokens.check_signature(&id, &url, now) {
            true => Ok((id, Proof::Signature)),
            false => Err(refused()),
        };
    }
    // No header: the sandbox whose token made the signature. A sandbox made since the last
    // listing is found by a fresh one.
    let listing_failed = |_| {
        Refusal::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the sandboxes could not be listed",
        )
    };
    let cached = e.live.cached(&e.ops).await.map_err(listing_failed)?;
    let found = |ids: &[String]| {
        ids.iter()
            .find(|id| e.tokens.check_signature(id, &url, now))
            .cloned()
    };
    if let Some(id) = found(&cached) {
        return Ok((id, Proof::Signature));
    }
    let fresh = e.live.refresh(&e.ops).await.map_err(listing_failed)?;
    match found(&fresh) {
        Some(id) => Ok((id, Proof::Signature)),
        None => Err(refused()),
    }
}

/// `GET /files?path=`.
pub async fn download(
    State(e): State<E2b>,
    headers: HeaderMap,
    Query(params): Query<HashMap<String, String>>,
) -> Response {
    let id = match authorize(&e, &headers, &params, "read").await {
        Ok((id, _)) => id,
        Err(r) => return http_error(&r),
    };
    let path = absolute(params.get("path").map(String::as_str).unwrap_or(""));
    let range = files_route::parse_range(&headers);
    let op = match ReadFile::new(&path, range) {
        Ok(op) => op,
        Err(err) => return http_error(&fs_refusal(err)),
    };
    let (read, hold) = match e.reach(&id, op).await {
        Ok(Held {
            answer: Read::Refused { error, .. },
            ..
        }) => return http_error(&fs_refusal(error)),
        Ok(Held { answer, hold }) => (answer, hold),
        Err(err) => return api_http_error(err),
    };
    let gz = files_route::accepts_gzip(&headers);
    match files_route::file_answer(read, range.is_some(), gz) {
        Ok(answer) => crate::routes::admit::holding(answer, hold),
        Err(err) => api_http_error(err),
    }
}

/// An fs-level refusal as the status the native route answers it with.
fn fs_refusal(e: FsError) -> Refusal {
    Refusal::new(files_route::fs_status(e.code), e.message)
}

/// `POST /files?path=`.
pub async fn upload(
    State(e): State<E2b>,
    headers: HeaderMap,
    Query(params): Query<HashMap<String, String>>,
    body: Body,
) -> Response {
    match upload_inner(&e, &headers, &params, body).await {
        Ok(written) => (StatusCode::OK, axum::Json(written)).into_response(),
        Err(r) => http_error(&r),
    }
}

async fn upload_inner(
    e: &E2b,
    headers: &HeaderMap,
    params: &HashMap<String, String>,
    body: Body,
) -> Result<Vec<Value>, Refusal> {
    let (id, proof) = authorize(e, headers, params, "write").await?;
    let metadata = metadata_of(headers)?;
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let query_path = params.get("path").filter(|p| !p.is_empty());
    if proof == Proof::Signature && query_path.is_none() {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            "a signed upload URL writes the path it was signed over: it needs ?path= (a part's \
             file name never chooses the path of a signed upload)",
        ));
    }
    if ct.starts_with("multipart/form-data") {
        let boundary = multer::parse_boundary(&ct)
            .map_err(|err| Refusal::new(StatusCode::BAD_REQUEST, format!("multipart: {err}")))?;
        // Bounded before multer buffers anything (a part's headers, the preamble, the parts).
        let tripwire = Tripwire::default();
        let guarded = GuardedMultipart::new(body.into_data_stream(), &boundary, tripwire.clone());
        let mut form = multer::Multipart::new(guarded, boundary);
        let mut written = Vec::new();
        while let Some(field) = form
            .next_field()
            .await
            .map_err(|err| match tripwire.get() {
                Some(v) => Refusal::new(StatusCode::PAYLOAD_TOO_LARGE, v.to_string()),
                None => Refusal::new(StatusCode::BAD_REQUEST, format!("multipart: {err}")),
            })?
        {
            // `?path=` takes every part, as envd writes them (the last one stays): a URL signed
            // over one path never writes another.
            let path = match (query_path, field.file_name()) {
                (Some(p), _) => p.clone(),
                (None, Some(name)) if !name.is_empty() => name.to_string(),
                _ => {
                    return Err(Refusal::new(
                        StatusCode::BAD_REQUEST,
                        "a file part without a path (give ?path= or the part's file name)",
                    ));
                }
            };
            let stream = field.map_err(std::io::Error::other);
            let body = Body::from_stream(stream);
            written.push(put(e, &id, &absolute(&path), body, None, &metadata).await?);
        }
        if written.is_empty() {
            return Err(Refusal::new(StatusCode::BAD_REQUEST, "no file in the form"));
        }
        Ok(written)
    } else {
        let path = query_path.ok_or_else(|| {
            Refusal::new(
                StatusCode::BAD_REQUEST,
                "an octet-stream upload needs ?path=",
            )
        })?;
        let encoding = headers.get(header::CONTENT_ENCODING).cloned();
        Ok(vec![
            put(e, &id, &absolute(path), body, encoding, &metadata).await?,
        ])
    }
}

/// The upload's metadata, from its `X-Metadata-<key>` headers (keys lowercased, as HTTP names
/// are): what E2B's SDK sends, checked as it checks it (a key of HTTP token characters, a value
/// of printable ASCII) and bounded by what a file system keeps beside a file.
fn metadata_of(headers: &HeaderMap) -> Result<BTreeMap<String, String>, Refusal> {
    const MAX_KEYS: usize = 32;
    const MAX_KEY: usize = 128;
    const MAX_TOTAL: usize = 3072;
    let bad = |m: String| Refusal::new(StatusCode::BAD_REQUEST, m);
    let mut out = BTreeMap::new();
    for (name, value) in headers {
        let Some(key) = name.as_str().strip_prefix("x-metadata-") else {
            continue;
        };
        // A header name is already lowercase token characters; an empty key is not one.
        if key.is_empty() || key.len() > MAX_KEY {
            return Err(bad(format!(
                "metadata key {key:?}: 1 to {MAX_KEY} characters"
            )));
        }
        let value = value
            .to_str()
            .ok()
            .filter(|v| v.bytes().all(|b| (0x20..0x7f).contains(&b)))
            .ok_or_else(|| {
                bad(format!(
                    "metadata {key:?}: the value is not printable ASCII"
                ))
            })?;
        if out.insert(key.to_string(), value.to_string()).is_some() {
            return Err(bad(format!("metadata {key:?}: given twice")));
        }
    }
    if out.len() > MAX_KEYS {
        return Err(bad(format!("metadata: at most {MAX_KEYS} keys")));
    }
    if out.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>() > MAX_TOTAL {
        return Err(bad(format!(
            "metadata: at most {MAX_TOTAL} bytes of keys and values"
        )));
    }
    Ok(out)
}

/// One file written through the native route, answered as envd's `{name, type, path}` and the
/// metadata it now has (every upload sets it: one without leaves none, as envd's does).
async fn put(
    e: &E2b,
    id: &str,
    path: &str,
    body: Body,
    encoding: Option<HeaderValue>,
    metadata: &BTreeMap<String, String>,
) -> Result<Value, Refusal> {
    let body = match encoding {
        Some(enc) if enc.as_bytes().eq_ignore_ascii_case(b"gzip") => gunzip(body),
        Some(enc) if !enc.as_bytes().eq_ignore_ascii_case(b"identity") => {
            return Err(Refusal::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!("Content-Encoding {enc:?}: only gzip"),
            ));
        }
        _ => body,
    };
    // In place, as envd writes: a watcher sees the file's own create and write events (a body
    // cut short leaves what came, as envd's does).
    let body = body
        .into_data_stream()
        .map_err(|err| std::io::Error::other(err.to_string()))
        .boxed();
    let op = WriteFile::new(path, None, body)
        .map_err(fs_refusal)?
        .atomic(false)
        .metadata(metadata.clone());
    match e.reach(id, op).await {
        Ok(Write::Written(_)) => {}
        Ok(Write::Refused(err)) => return Err(fs_refusal(err)),
        Err(err) => return Err(Refusal::from(err)),
    }
    let name = path.rsplit('/').next().unwrap_or(path);
    let mut written = json!({ "name": name, "type": "file", "path": path });
    if !metadata.is_empty() {
        written["metadata"] = json!(metadata);
    }
    Ok(written)
}

/// A gzip body decoded as it is read, on a blocking thread (flate2's decoder is synchronous); a
/// corrupt stream ends the body with an error, so the native write keeps nothing of it.
fn gunzip(body: Body) -> Body {
    let reader =
        tokio_util::io::StreamReader::new(body.into_data_stream().map_err(std::io::Error::other));
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<bytes::Bytes>>(4);
    tokio::task::spawn_blocking(move || {
        let sync = tokio_util::io::SyncIoBridge::new(reader);
        let mut decoder = flate2::read::GzDecoder::new(sync);
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let item = match std::io::Read::read(&mut decoder, &mut buf) {
                Ok(0) => return,
                Ok(n) => Ok(bytes::Bytes::copy_from_slice(&buf[..n])),
                Err(err) => Err(std::io::Error::other(format!("gzip: {err}"))),
            };
            let failed = item.is_err();
            if tx.blocking_send(item).is_err() || failed {
                return;
            }
        }
    });
    Body::from_stream(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    }))
}
