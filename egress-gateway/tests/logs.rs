//! Secrets never reach a log: neither the audit lines nor the diagnostic log (captured at trace
//! level), whatever happens to the request. Its own test binary, because it installs the
//! process-wide tracing subscriber.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use common::{Trust, start};
use serde_json::json;

const SECRET: &str = "sekrit-value-4f1c9a";
const QUERY_SECRET: &str = "query-token-77aa";

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut v) = self.0.lock() {
            v.extend_from_slice(buf);
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secret_values_never_appear_in_logs() {
    let capture = Capture::default();
    let writer = capture.clone();
    tracing_subscriber::fmt()
        .json()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .init();

    let h = start(json!({
        "policy": {"default": "deny", "rules": [
            {"host": "upstream.test", "methods": ["GET"], "inject": "tok"},
            {"host": "other.test", "inject": "tok"}
        ]},
        "secrets": {"tok": {"header": "Authorization", "value": format!("Bearer {SECRET}")}}
    }))
    .await;
    let client = h.client(Trust::Gateway, false);
    let h1 = h.client(Trust::Gateway, true);
    let url = |host: &str| h.https_url(host, &format!("/echo?token={QUERY_SECRET}"));
    // Allowed + injected (h2 and h1), denied by method, plaintext refused, host mismatch.
    let body = client
        .get(url("upstream.test"))
        .send()
        .await
        .expect("send")
        .text()
        .await
        .expect("body");
    assert!(body.contains(SECRET), "the upstream did get the credential");
    h1.get(url("upstream.test")).send().await.expect("send");
    assert_eq!(
        client
            .post(url("upstream.test"))
            .send()
            .await
            .expect("send")
            .status(),
        403
    );
    assert_eq!(
        client
            .get(h.http_url("other.test", &format!("/?token={QUERY_SECRET}")))
            .send()
            .await
            .expect("send")
            .status(),
        403
    );
    assert_eq!(
        h1.get(url("upstream.test"))
            .header("host", "other.test")
            .send()
            .await
            .expect("send")
            .status(),
        403
    );
    // A policy reload that fails, and one that works.
    common::write_policy(
        &h.policy_path,
        &format!("{{\"secrets\": {{\"x\": \"{SECRET}\"}}"),
    );
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;

    let audit = h.audit.lines().join("\n");
    let diagnostics = String::from_utf8_lossy(&capture.0.lock().expect("capture")).into_owned();
    assert!(audit.contains("\"injected\":\"Authorization\""), "{audit}");
    assert!(diagnostics.contains("policy unusable"), "the capture works");
    assert!(
        diagnostics.len() > 10_000,
        "trace-level capture is not empty"
    );
    for (name, text) in [("audit", &audit), ("diagnostics", &diagnostics)] {
        assert!(!text.contains(SECRET), "{name} log leaked the secret");
        assert!(
            !text.contains(QUERY_SECRET),
            "{name} log leaked a query string"
        );
    }
}
