//! The e2e suites' one API client: every request carries an API key, JSON bodies go out, and the
//! answers come back as status and JSON, or decoded into the control plane's own wire types
//! (`sandbox_service::api`) where a test wants them typed, so a change of wire shape shows here.
//!
//! [`ControlPlane`](crate::ControlPlane) holds one (`cp.api()`); a service started some other way
//! (in a container, by compose) gets its own with [`Client::new`]. [`Client::with_key`] and
//! [`Client::with_prefix`] share the connection pool: another key (a second deployment's, a wrong
//! one), or another prefix (DAIV's client posts relative paths to the bare service URL).

use std::time::Duration;

use anyhow::{Context, Result, bail};
use reqwest::{Method, RequestBuilder};
use serde_json::{Value, json};

pub use sandbox_service::api::{RunResponse, RunResult, StartSessionResponse};

/// The header the service reads the API key from.
pub const API_KEY_HEADER: &str = "X-API-Key";

#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    prefix: String,
    key: String,
}

impl Client {
    /// A client for the routes under `prefix` (for example `http://127.0.0.1:8000/api/v1`), with
    /// `key`; requests time out after 300 s.
    pub fn new(prefix: &str, key: &str) -> Result<Self> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(300))
            .build()?;
        Ok(Self {
            http,
            prefix: prefix.trim_end_matches('/').to_string(),
            key: key.to_string(),
        })
    }

    /// The same client (connection pool, prefix) with another API key.
    pub fn with_key(&self, key: &str) -> Self {
        Self {
            key: key.to_string(),
            ..self.clone()
        }
    }

    /// The same client (connection pool, key) for the routes under another prefix.
    pub fn with_prefix(&self, prefix: &str) -> Self {
        Self {
            prefix: prefix.trim_end_matches('/').to_string(),
            ..self.clone()
        }
    }

    /// The underlying HTTP client (no key), for requests that must go out without one.
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    /// `prefix` + `path` (`path` starts with `/`).
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.prefix)
    }

    /// A request to `path` with the API key; the caller adds a body or headers and sends it.
    pub fn request(&self, method: Method, path: &str) -> RequestBuilder {
        self.http
            .request(method, self.url(path))
            .header(API_KEY_HEADER, &self.key)
    }

    /// A request with the API key and `body` as JSON; returns the status and the JSON body
    /// (`Null` when empty; a body that is not JSON as a string).
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<(u16, Value)> {
        let mut req = self.request(method, path);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await?;
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await?;
        let value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
        };
        Ok((status, value))
    }

    /// `POST /session/`; anything but a 200 is an error.
    pub async fn create_session(&self, body: Value) -> Result<StartSessionResponse> {
        let (status, resp) = self.call(Method::POST, "/session/", Some(body)).await?;
        if status != 200 {
            bail!("create session: {status} {resp}");
        }
        serde_json::from_value(resp).context("create session: the response")
    }

    /// `POST /session/{id}/` (a run); anything but a 200 is an error.
    pub async fn run(&self, session_id: &str, body: Value) -> Result<RunResponse> {
        let (status, resp) = self
            .call(Method::POST, &format!("/session/{session_id}/"), Some(body))
            .await?;
        if status != 200 {
            bail!("run: {status} {resp}");
        }
        serde_json::from_value(resp).context("run: the response")
    }

    /// Runs one command; its result.
    pub async fn sh(&self, session_id: &str, command: &str) -> Result<RunResult> {
        let resp = self
            .run(session_id, json!({ "commands": [command] }))
            .await?;
        resp.results.into_iter().next().context("no result")
    }

    /// `DELETE /session/{id}/?force=true`; returns the status.
    pub async fn force_close(&self, session_id: &str) -> Result<u16> {
        let path = format!("/session/{session_id}/?force=true");
        Ok(self.call(Method::DELETE, &path, None).await?.0)
    }
}
