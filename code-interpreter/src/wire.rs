//! E2B's code-interpreter wire: the request bodies, and the NDJSON lines an execution answers
//! with, made from the kernel's IOPub messages. Pure functions, so the mapping is tested without
//! a kernel.

use std::collections::BTreeMap;

use jupyter_protocol::{JupyterMessageContent, Media, Stdio};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

/// `POST /execute`.
#[derive(Debug, Deserialize)]
pub struct ExecuteBody {
    pub code: String,
    #[serde(default)]
    pub context_id: Option<String>,
    #[serde(default)]
    pub language: Option<String>,
    #[serde(default)]
    pub env_vars: Option<BTreeMap<String, String>>,
    /// Seconds the execution may run before the kernel is interrupted (this server's addition;
    /// E2B's SDK bounds its request instead, and a request that goes away interrupts too).
    #[serde(default)]
    pub timeout: Option<f64>,
}

/// `POST /contexts`.
#[derive(Debug, Default, Deserialize)]
pub struct ContextBody {
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub language: Option<String>,
}

/// A context as `POST /contexts` and `GET /contexts` answer it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ContextInfo {
    pub id: String,
    pub language: String,
    pub cwd: String,
}

/// A language's canonical name (E2B's SDK sends `python` or nothing for Python).
pub fn language(name: Option<&str>) -> String {
    match name.map(str::trim).filter(|s| !s.is_empty()) {
        None => "python".into(),
        Some(s) => match s.to_ascii_lowercase().as_str() {
            "python" | "python3" | "py" => "python".into(),
            "bash" | "sh" | "shell" => "bash".into(),
            other => other.into(),
        },
    }
}

/// Now, in nanoseconds since the epoch (the SDK's `OutputMessage.timestamp`).
fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// The result formats E2B's SDK names, by the MIME type a kernel sends.
const FORMATS: [(&str, &str); 10] = [
    ("text/plain", "text"),
    ("text/html", "html"),
    ("text/markdown", "markdown"),
    ("image/svg+xml", "svg"),
    ("image/png", "png"),
    ("image/jpeg", "jpeg"),
    ("application/pdf", "pdf"),
    ("text/latex", "latex"),
    ("application/json", "json"),
    ("application/javascript", "javascript"),
];

/// A display's MIME bundle as one `result` line: the formats the SDK knows by name, the rest in
/// `extra`. Images come base64 from the kernel, as the SDK wants them; a trailing newline some
/// kernels add is dropped.
pub fn result_line(data: &Media, is_main_result: bool) -> Value {
    let bundle = match serde_json::to_value(data) {
        Ok(Value::Object(m)) => m,
        _ => Map::new(),
    };
    let mut out = Map::new();
    out.insert("type".into(), json!("result"));
    let mut extra = Map::new();
    for (mime, value) in bundle {
        match FORMATS.iter().find(|(m, _)| *m == mime) {
            Some((_, name)) => {
                let value = match value {
                    Value::String(s) if mime.starts_with("image/") && mime != "image/svg+xml" => {
                        Value::String(s.trim_end().to_string())
                    }
                    // Text formats may come as a list of lines (nbformat).
                    Value::Array(lines) if *name != "json" => Value::String(
                        lines
                            .iter()
                            .filter_map(Value::as_str)
                            .collect::<Vec<_>>()
                            .concat(),
                    ),
                    v => v,
                };
                out.insert((*name).into(), value);
            }
            None => {
                extra.insert(mime, value);
            }
        }
    }
    out.insert("is_main_result".into(), json!(is_main_result));
    if !extra.is_empty() {
        out.insert("extra".into(), Value::Object(extra));
    }
    Value::Object(out)
}

/// An exception as one `error` line (the traceback's lines joined, as the SDK prints it).
pub fn error_line(name: &str, value: &str, traceback: &[String]) -> Value {
    json!({
        "type": "error",
        "name": name,
        "value": value,
        "traceback": traceback.join("\n"),
    })
}

/// What one IOPub message of an execution becomes on the wire, if anything.
pub fn line_for(content: &JupyterMessageContent) -> Option<Value> {
    match content {
        JupyterMessageContent::StreamContent(s) => {
            let kind = match s.name {
                Stdio::Stdout => "stdout",
                Stdio::Stderr => "stderr",
            };
            Some(json!({ "type": kind, "text": s.text, "timestamp": now_ns() }))
        }
        JupyterMessageContent::ExecuteResult(r) => Some(result_line(&r.data, true)),
        JupyterMessageContent::DisplayData(d) => Some(result_line(&d.data, false)),
        JupyterMessageContent::ErrorOutput(e) => {
            Some(error_line(&e.ename, &e.evalue, &e.traceback))
        }
        JupyterMessageContent::ExecuteInput(i) => Some(json!({
            "type": "number_of_executions",
            "execution_count": i.execution_count.0,
        })),
        _ => None,
    }
}

/// A line a quiet execution sends now and then (clients skip types they do not know).
pub fn keepalive_line() -> Value {
    json!({ "type": "keepalive" })
}

/// The line that ends every execution.
pub fn end_line() -> Value {
    json!({ "type": "end_of_execution" })
}

/// Whether `name` can be an environment variable set around an execution (a shell identifier:
/// the bash kernel's `export` takes nothing else).
pub fn valid_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Code that sets `vars` for one execution in `language`'s kernel, and code that puts back what
/// was there before. Run silently around the caller's code.
pub fn env_code(language: &str, vars: &BTreeMap<String, String>) -> Option<(String, String)> {
    if vars.is_empty() {
        return None;
    }
    match language {
        "python" => {
            // A JSON object of strings is a Python dict literal.
            let literal = serde_json::to_string(vars).ok()?;
            let set = format!(
                "import os as _daiv_os\n_daiv_env = {{k: _daiv_os.environ.get(k) for k in {literal}}}\n_daiv_os.environ.update({literal})\n"
            );
            let reset = "for _daiv_k, _daiv_v in _daiv_env.items():\n    if _daiv_v is None:\n        _daiv_os.environ.pop(_daiv_k, None)\n    else:\n        _daiv_os.environ[_daiv_k] = _daiv_v\ndel _daiv_env, _daiv_os\n".to_string();
            Some((set, reset))
        }
        "bash" => {
            let mut set = String::new();
            let mut reset = String::new();
            for (k, v) in vars {
                let saved = format!("__daiv_saved_{k}");
                set.push_str(&format!(
                    "if [ \"${{{k}+set}}\" = set ]; then {saved}=\"${k}\"; else unset {saved}; fi; export {k}={}\n",
                    shell_quote(v)
                ));
                reset.push_str(&format!(
                    "if [ \"${{{saved}+set}}\" = set ]; then export {k}=\"${saved}\"; unset {saved}; else unset {k}; fi\n"
                ));
            }
            Some((set, reset))
        }
        _ => None,
    }
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use jupyter_protocol::{
        DisplayData, ErrorOutput, ExecuteResult, ExecutionCount, StreamContent,
    };

    fn media(v: Value) -> Media {
        serde_json::from_value(v).expect("a MIME bundle")
    }

    #[test]
    fn a_figure_is_a_png_result_and_a_dataframe_html_and_text() {
        let fig = DisplayData::new(media(json!({
            "image/png": "iVBORw0KGgo=\n",
            "text/plain": "<Figure size 640x480 with 1 Axes>",
        })));
        let line = line_for(&JupyterMessageContent::DisplayData(fig)).expect("a line");
        assert_eq!(line["type"], "result");
        assert_eq!(line["png"], "iVBORw0KGgo=");
        assert_eq!(line["text"], "<Figure size 640x480 with 1 Axes>");
        assert_eq!(line["is_main_result"], false);

        let df = ExecuteResult::new(
            ExecutionCount::new(3),
            media(
                json!({"text/html": "<table></table>", "text/plain": "   a\n0  1",
                         "application/vnd.custom": {"x": 1}}),
            ),
        );
        let line = line_for(&JupyterMessageContent::ExecuteResult(df)).expect("a line");
        assert_eq!(line["html"], "<table></table>");
        assert_eq!(line["text"], "   a\n0  1");
        assert_eq!(line["is_main_result"], true);
        assert_eq!(line["extra"]["application/vnd.custom"]["x"], 1);
    }

    #[test]
    fn streams_errors_and_counts_take_the_sdks_shapes() {
        let out = line_for(&JupyterMessageContent::StreamContent(
            StreamContent::stderr("oops\n"),
        ))
        .expect("a line");
        assert_eq!(out["type"], "stderr");
        assert_eq!(out["text"], "oops\n");
        assert!(out["timestamp"].as_u64().is_some_and(|t| t > 0));
        let err = line_for(&JupyterMessageContent::ErrorOutput(ErrorOutput {
            ename: "ZeroDivisionError".into(),
            evalue: "division by zero".into(),
            traceback: vec!["Traceback".into(), "line 1".into()],
        }))
        .expect("a line");
        assert_eq!(err["name"], "ZeroDivisionError");
        assert_eq!(err["traceback"], "Traceback\nline 1");
    }

    #[test]
    fn environment_names_and_values_cannot_break_out_of_the_code_around_them() {
        assert!(valid_env_name("A_1"));
        for bad in ["", "1A", "A-B", "A B", "A;B", "A=B"] {
            assert!(!valid_env_name(bad), "{bad}");
        }
        let vars = BTreeMap::from([("K".to_string(), "a'b\"c\n$(x)".to_string())]);
        let (set, _) = env_code("bash", &vars).expect("bash");
        assert!(set.contains(r#"export K='a'\''b"c"#), "{set}");
        let (set, reset) = env_code("python", &vars).expect("python");
        assert!(set.contains(r#"{"K":"a'b\"c\n$(x)"}"#), "{set}");
        assert!(reset.contains("del _daiv_env"));
        assert_eq!(language(None), "python");
        assert_eq!(language(Some("Python3")), "python");
        assert_eq!(language(Some("bash")), "bash");
    }
}
