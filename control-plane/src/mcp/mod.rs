//! The MCP endpoint: the sandbox as tools for any Model Context Protocol client (Claude Code,
//! Cursor, agent frameworks), at `/mcp` on the service's port (and under the API prefix), over
//! MCP's streamable HTTP transport, and over stdio through `daiv-sandbox mcp`.
//!
//! It sits above the HTTP routes and below the composition: its tools apply the same operations
//! as the REST handlers ([`crate::ops`]: admission, the session's lock and the running check
//! taken once), never HTTP requests to the service itself, and their failures are the REST
//! API's error classes worded for a model.
//!
//! # Layout
//! - [`tools`]: each tool's arguments (schema and descriptions) and what it does.
//! - [`errors`]: a tool's own failure, `{code, cause, remediation}`.
//! - [`http`]: the streamable HTTP service, its key check, body bound and host/origin guard.
//! - [`sessions`]: the MCP sessions kept in this process, their cap and idle expiry.
//! - [`stdio`]: `daiv-sandbox mcp --url … --key-file …`, stdio bridged to a running service.

pub mod errors;
pub mod http;
pub mod sessions;
pub mod stdio;
pub mod tools;

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData,
    Implementation, ListToolsResult, PaginatedRequestParams, ProgressNotificationParam,
    ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{RoleServer, ServerHandler};

pub use errors::ToolFailure;
pub use http::router;
pub use tools::{Answer, ArgsError, Tools};

/// What the server tells a client about itself at initialisation.
const INSTRUCTIONS: &str = "Sandboxes for running code: session_create makes one (a Linux \
container, no network unless its egress policy allows hosts; credentials go in egress secrets, \
never in the environment), then run, read, write, edit, grep, glob, ls and the process tools \
work in it by session_id, and session_close removes it. Failures come back as results with \
isError and {code, cause, remediation}.";

/// The MCP server: one per MCP session (stateful) or request (stateless), all over the same
/// tools.
#[derive(Clone)]
pub struct McpServer {
    tools: Arc<Tools>,
}

impl McpServer {
    pub fn new(tools: Arc<Tools>) -> Self {
        Self { tools }
    }
}

/// A tool's answer as MCP's result: the text for the model, the value as structured content.
pub fn result(outcome: Result<Answer, ToolFailure>) -> CallToolResult {
    match outcome {
        Ok(a) => {
            let mut content = vec![ContentBlock::text(a.text)];
            content.extend(
                a.images
                    .into_iter()
                    .map(|(mime, data)| ContentBlock::image(data, mime)),
            );
            let mut r = CallToolResult::success(content);
            r.structured_content = Some(a.value);
            r
        }
        Err(f) => {
            let value = serde_json::to_value(&f).unwrap_or_default();
            let mut r = CallToolResult::error(vec![ContentBlock::text(value.to_string())]);
            r.structured_content = Some(value);
            r
        }
    }
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("daiv-sandbox", crate::VERSION))
            .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools::list().to_vec()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        // Output as progress, when the client asked for it (a progress token).
        let (progress, forwarder) = match context.meta.get_progress_token() {
            Some(token) => {
                let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(64);
                let peer = context.peer.clone();
                let forwarder = tokio::spawn(async move {
                    let mut n = 0.0;
                    while let Some(chunk) = rx.recv().await {
                        n += 1.0;
                        let mut p = ProgressNotificationParam::new(token.clone(), n);
                        p.message = Some(chunk);
                        if peer.notify_progress(p).await.is_err() {
                            return;
                        }
                    }
                });
                (Some(tx), Some(forwarder))
            }
            None => (None, None),
        };
        let name = request.name.to_string();
        let call = self.tools.call(&name, request.arguments, progress);
        // A cancelled call (notifications/cancelled, or a stateless client gone) drops the
        // tool's future: a run's stream goes with it, which kills the command.
        let outcome = tokio::select! {
            r = call => r,
            _ = context.ct.cancelled() => {
                tracing::info!(tool = %name, "MCP tool call cancelled");
                return Err(ErrorData::internal_error("the call was cancelled", None));
            }
        };
        // Every notification queued before the result goes out first (the call's sender is
        // gone with its future, so the forwarder ends once it has sent them).
        if let Some(forwarder) = forwarder {
            let _ = forwarder.await;
        }
        match outcome {
            Ok(outcome) => Ok(result(outcome).into()),
            Err(e) => Err(ErrorData::invalid_params(e.to_string(), None)),
        }
    }
}
