//! A session's one-shot seed (`POST /session/{id}/seed/`): a seed slot, the session's lock and
//! the running check, then the archives of the multipart body streamed in as they arrive.

use bytes::Bytes;
use futures::Stream;

use super::{Access, Admit, Op, Reached};
use crate::error::ApiError;
use crate::telemetry::metrics::{OutcomeLabels, observe_duration};
use crate::workspace::multipart::BoxError;
use crate::workspace::seed;
pub use crate::workspace::seed::{SKIPPED_HEADER, SeedOutcome};

/// A seed from a request body as the door received it: its `Content-Type` (which names the
/// multipart boundary) and its bytes.
pub struct Seed<S> {
    content_type: Option<String>,
    body: S,
}

impl<S> Seed<S> {
    pub fn new(content_type: Option<String>, body: S) -> Self {
        Self { content_type, body }
    }
}

impl<S, E> Op for Seed<S>
where
    S: Stream<Item = Result<Bytes, E>> + Send + Unpin + 'static,
    E: Into<BoxError> + 'static,
{
    type Output = SeedOutcome;
    const ADMIT: Admit = Admit::Seed;
    const ACCESS: Access = Access::Ordered;

    async fn apply(self, at: Reached) -> Result<SeedOutcome, ApiError> {
        let ws = at.workspace();
        let started = std::time::Instant::now();
        let outcome = seed::seed(&ws, self.content_type.as_deref(), self.body)
            .await
            .map_err(ApiError::from);
        // Labelled by the answer's status, which the class decides.
        let outcome_label = match &outcome {
            Ok(_) => "ok".to_string(),
            Err(e) => e.status().as_u16().to_string(),
        };
        let labels = OutcomeLabels {
            outcome: outcome_label,
        };
        observe_duration(
            &ws.metrics.workspace.seeds.get_or_create(&labels),
            started.elapsed(),
        );
        outcome
    }
}
