//! Post-processing of the generated OpenAPI document: [OpenAPI links] from the responses that
//! hand out ids to the operations that take them, so a client (or a stateful API fuzzer such as
//! schemathesis) can follow a session from its creation through every session route.
//!
//! - `POST /session/` (200, `session_id` in the body) → every operation under
//!   `/session/{session_id}/` that needs no other path parameter: run, status, close, seed, the
//!   fs ops, egress, the process list and start, info, timeout, metrics; and the listing.
//! - A seed (204) → the same operations on the seeded session (`$request.path.session_id`).
//! - `POST /session/{session_id}/processes/` (201, `process_id` in the body) → the operations on
//!   that process (poll, stdin, kill) and the process list.
//! - `POST /session/{session_id}/snapshot/` (201, `snapshot_id` in the body) → the operations on
//!   that snapshot (get, delete), and `POST /session/` with it as the body's `snapshot_id` (a
//!   session from the snapshot).
//! - `POST /session/{session_id}/fork/` (201, `session_ids` in the body) → every operation under
//!   `/session/{session_id}/` on the first fork.
//!
//! The links are derived from the paths themselves, so a route added later is linked without
//! touching this file.
//!
//! The bounds the type attributes cannot say are added first (the sibling module `bounds`).
//!
//! [OpenAPI links]: https://spec.openapis.org/oas/v3.1.0#link-object

use utoipa::openapi::extensions::Extensions;
use utoipa::openapi::link::{Link, LinkBuilder};
use utoipa::openapi::path::{Operation, ParameterIn, PathItem};
use utoipa::openapi::{OpenApi, RefOr};

use super::bounds::SNAPSHOT_ID;

/// The path parameter every session route has.
const SESSION_ID: &str = "session_id";
/// The path parameter every process route has.
const PROCESS_ID: &str = "process_id";

/// Adds the links and the bounds described in the module docs.
pub struct SessionLinks;

/// One operation of the document: where it is, and how a link names it.
struct Target {
    path: String,
    method: &'static str,
    /// `operationId`, else an `operationRef` to the operation.
    name: String,
    by_id: bool,
    /// Its path parameters, in order.
    params: Vec<String>,
}

impl Target {
    /// utoipa 5 serialises `Link`'s own `operation_id`/`operation_ref` fields in snake case,
    /// which no OpenAPI tool reads; the spec's `operationId`/`operationRef` go through the
    /// flattened extensions instead (the fields stay empty, so they are not serialised).
    fn link(&self, parameters: &[(&str, &str)], description: &str) -> Link {
        self.link_with_body(parameters, None, description)
    }

    /// The same with a `requestBody` (utoipa's own `request_body` field would be snake case too):
    /// tools such as schemathesis merge it into the body they generate.
    fn link_with_body(
        &self,
        parameters: &[(&str, &str)],
        body: Option<serde_json::Value>,
        description: &str,
    ) -> Link {
        let key = if self.by_id {
            "operationId"
        } else {
            "operationRef"
        };
        let mut target = Extensions::from_iter([(key, self.name.as_str())]);
        if let Some(body) = body {
            target.merge(Extensions::from_iter([("requestBody", body)]));
        }
        parameters
            .iter()
            .fold(
                LinkBuilder::new().description(description),
                |b, (name, expr)| b.parameter(*name, *expr),
            )
            .extensions(Some(target))
            .build()
    }
}

/// The operations of a path item with their method names.
fn operations(item: &PathItem) -> [(&'static str, Option<&Operation>); 5] {
    [
        ("get", item.get.as_ref()),
        ("put", item.put.as_ref()),
        ("post", item.post.as_ref()),
        ("delete", item.delete.as_ref()),
        ("patch", item.patch.as_ref()),
    ]
}

fn operation_mut<'a>(item: &'a mut PathItem, method: &str) -> Option<&'a mut Operation> {
    match method {
        "get" => item.get.as_mut(),
        "put" => item.put.as_mut(),
        "post" => item.post.as_mut(),
        "delete" => item.delete.as_mut(),
        "patch" => item.patch.as_mut(),
        _ => None,
    }
}

/// A JSON pointer to an operation, for `operationRef` (`/` is `~1`, `~` is `~0`).
fn operation_ref(path: &str, method: &str) -> String {
    format!(
        "#/paths/{}/{method}",
        path.replace('~', "~0").replace('/', "~1")
    )
}

fn targets(doc: &OpenApi) -> Vec<Target> {
    let mut out = Vec::new();
    for (path, item) in &doc.paths.paths {
        for (method, op) in operations(item) {
            let Some(op) = op else { continue };
            let params = op
                .parameters
                .iter()
                .flatten()
                .chain(item.parameters.iter().flatten())
                .filter(|p| matches!(p.parameter_in, ParameterIn::Path))
                .map(|p| p.name.clone())
                .collect();
            let (name, by_id) = match &op.operation_id {
                Some(id) => (id.clone(), true),
                None => (operation_ref(path, method), false),
            };
            out.push(Target {
                path: path.clone(),
                method,
                name,
                by_id,
                params,
            });
        }
    }
    out
}

/// Adds `links` to the `status` response of `method path`, if the document has it.
fn add_links(
    doc: &mut OpenApi,
    path: &str,
    method: &str,
    status: &str,
    links: Vec<(String, Link)>,
) {
    let Some(op) = doc
        .paths
        .paths
        .get_mut(path)
        .and_then(|item| operation_mut(item, method))
    else {
        return;
    };
    let Some(RefOr::T(response)) = op.responses.responses.get_mut(status) else {
        return;
    };
    for (name, link) in links {
        response.links.insert(name, RefOr::T(link));
    }
}

/// The first operation whose path and method match, and its 2xx status: 201 where it has one
/// (a process start answers 201; 200 only for a start repeated under the client's id).
fn find<'a>(
    targets: &'a [Target],
    doc: &OpenApi,
    path: &str,
    method: &str,
) -> Option<(&'a Target, String)> {
    let t = targets.iter().find(|t| {
        t.path.trim_end_matches('/') == path.trim_end_matches('/') && t.method == method
    })?;
    let item = doc.paths.paths.get(&t.path)?;
    let (_, op) = operations(item).into_iter().find(|(m, _)| *m == method)?;
    let status = op?
        .responses
        .responses
        .keys()
        .filter(|s| s.starts_with('2'))
        .min_by_key(|s| (s.as_str() != "201", s.as_str()))?
        .clone();
    Some((t, status))
}

impl utoipa::Modify for SessionLinks {
    fn modify(&self, doc: &mut OpenApi) {
        super::bounds::bounds(doc);
        let targets = targets(doc);
        let session_only = |t: &&Target| t.params == [SESSION_ID];
        let with_process = |t: &&Target| t.params == [SESSION_ID, PROCESS_ID];

        // POST /session/ → every session route.
        if let Some((create, status)) = find(&targets, doc, "/session/", "post") {
            let mut links: Vec<(String, Link)> = targets
                .iter()
                .filter(session_only)
                .map(|t| {
                    let link = t.link(
                        &[(SESSION_ID, "$response.body#/session_id")],
                        "The session just created.",
                    );
                    (t.name.clone(), link)
                })
                .collect();
            // The listing, the session just created among them.
            if let Some((list, _)) = find(&targets, doc, "/sessions/", "get") {
                let link = list.link(&[], "The sessions, the one just created among them.");
                links.push((list.name.clone(), link));
            }
            let (path, method) = (create.path.clone(), create.method);
            add_links(doc, &path, method, &status, links);
        }
        // A seed → the routes of the seeded session.
        if let Some((seed, status)) = find(&targets, doc, "/session/{session_id}/seed/", "post") {
            let links = targets
                .iter()
                .filter(session_only)
                .filter(|t| !(t.path == seed.path && t.method == seed.method))
                .map(|t| {
                    let link = t.link(
                        &[(SESSION_ID, "$request.path.session_id")],
                        "The session just seeded.",
                    );
                    (t.name.clone(), link)
                })
                .collect();
            let (path, method) = (seed.path.clone(), seed.method);
            add_links(doc, &path, method, &status, links);
        }
        // A started process → the routes of that process, and the list it is in.
        if let Some((start, status)) =
            find(&targets, doc, "/session/{session_id}/processes/", "post")
        {
            let mut links: Vec<(String, Link)> = targets
                .iter()
                .filter(with_process)
                .map(|t| {
                    let link = t.link(
                        &[
                            (SESSION_ID, "$request.path.session_id"),
                            (PROCESS_ID, "$response.body#/process_id"),
                        ],
                        "The process just started.",
                    );
                    (t.name.clone(), link)
                })
                .collect();
            links.extend(
                targets
                    .iter()
                    .filter(session_only)
                    .filter(|t| t.path == start.path && t.method != start.method)
                    .map(|t| {
                        let link = t.link(
                            &[(SESSION_ID, "$request.path.session_id")],
                            "The session the process runs in.",
                        );
                        (t.name.clone(), link)
                    }),
            );
            let (path, method) = (start.path.clone(), start.method);
            add_links(doc, &path, method, &status, links);
        }
        // A snapshot → the routes of that snapshot, and a session made from it.
        if let Some((take, status)) = find(&targets, doc, "/session/{session_id}/snapshot/", "post")
        {
            let mut links: Vec<(String, Link)> = targets
                .iter()
                .filter(|t| t.params == [SNAPSHOT_ID])
                .map(|t| {
                    let link = t.link(
                        &[(SNAPSHOT_ID, "$response.body#/snapshot_id")],
                        "The snapshot just taken.",
                    );
                    (t.name.clone(), link)
                })
                .collect();
            if let Some((create, _)) = find(&targets, doc, "/session/", "post") {
                let body = serde_json::json!({ SNAPSHOT_ID: "$response.body#/snapshot_id" });
                let link = create.link_with_body(
                    &[],
                    Some(body),
                    "A session from the snapshot just taken.",
                );
                links.push((create.name.clone(), link));
            }
            let (path, method) = (take.path.clone(), take.method);
            add_links(doc, &path, method, &status, links);
        }
        // A fork → the routes of the first fork (each fork is a session like any other).
        if let Some((fork, status)) = find(&targets, doc, "/session/{session_id}/fork/", "post") {
            let links = targets
                .iter()
                .filter(session_only)
                .map(|t| {
                    let link = t.link(
                        &[(SESSION_ID, "$response.body#/session_ids/0")],
                        "The first fork just made.",
                    );
                    (t.name.clone(), link)
                })
                .collect();
            let (path, method) = (fork.path.clone(), fork.method);
            add_links(doc, &path, method, &status, links);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use utoipa::OpenApi as _;

    /// Every operation under `/session/{session_id}/` is reachable from `POST /session/`, and
    /// every process operation from a started process.
    #[test]
    fn every_session_route_is_linked_from_create() {
        let doc = serde_json::to_value(crate::routes::openapi::ApiDoc::openapi()).unwrap();
        let paths = doc["paths"].as_object().unwrap();
        let links = |path: &str, method: &str, status: &str| {
            paths[path][method]["responses"][status]["links"]
                .as_object()
                .cloned()
                .unwrap_or_default()
        };
        let from_create = links("/session/", "post", "200");
        let from_start = links("/session/{session_id}/processes/", "post", "201");
        let from_seed = links("/session/{session_id}/seed/", "post", "204");
        let mut session_ops = 0;
        for (path, item) in paths {
            for (method, op) in item.as_object().unwrap() {
                let Some(id) = op["operationId"].as_str() else {
                    continue;
                };
                if path.contains("{process_id}") {
                    let l = &from_start[id];
                    assert_eq!(l["operationId"], id, "{method} {path}");
                    assert_eq!(l["parameters"]["process_id"], "$response.body#/process_id");
                    assert_eq!(l["parameters"]["session_id"], "$request.path.session_id");
                } else if path.contains("{session_id}") {
                    session_ops += 1;
                    let l = &from_create[id];
                    assert_eq!(l["operationId"], id, "{method} {path}");
                    assert_eq!(l["parameters"]["session_id"], "$response.body#/session_id");
                    if !path.ends_with("/seed/") {
                        assert_eq!(
                            from_seed[id]["parameters"]["session_id"],
                            "$request.path.session_id"
                        );
                    }
                }
            }
        }
        assert!(session_ops >= 14, "{session_ops} session operations");
        // utoipa's own field names would be snake case, which no OpenAPI tool reads.
        let text = doc.to_string();
        assert!(!text.contains("\"operation_id\"") && !text.contains("\"operation_ref\""));
        // And the listing, the session just created among them.
        assert_eq!(from_create["list_sessions"]["operationId"], "list_sessions");
        assert_eq!(from_create.len(), session_ops + 1);
    }

    /// What API fuzzing found the document letting through: it now says what the service checks.
    #[test]
    fn the_document_states_the_services_bounds() {
        let doc = serde_json::to_value(crate::routes::openapi::ApiDoc::openapi()).unwrap();
        let s = &doc["components"]["schemas"];
        let start = &s["StartSessionRequest"]["properties"];
        assert_eq!(start["base_image"]["maxLength"], 512);
        assert_eq!(start["memory_bytes"]["minimum"], 6291456);
        assert!(start["environment"]["propertyNames"]["pattern"].is_string());
        assert_eq!(s["RunRequest"]["properties"]["timeout"]["maximum"], 604800);
        assert_eq!(s["FsWriteRequest"]["properties"]["mode"]["maximum"], 4095);
        assert_eq!(
            s["FsReadRequest"]["properties"]["offset"]["format"],
            "uint64"
        );
        let paths = &doc["paths"];
        let run_ok = &paths["/session/{session_id}/"]["post"]["responses"]["200"]["content"];
        assert!(
            run_ok["application/json"].is_object() && run_ok["application/x-ndjson"].is_object()
        );
        assert!(paths["/session/{session_id}/"]["delete"]["responses"]["422"].is_object());
        let seed = &paths["/session/{session_id}/seed/"]["post"]["requestBody"];
        assert_eq!(seed["required"], true);
        assert!(seed["content"]["multipart/form-data"]["schema"]["anyOf"].is_array());
        let stdin = &paths["/session/{session_id}/processes/{process_id}/stdin"]["post"];
        assert_eq!(
            stdin["requestBody"]["content"]["application/octet-stream"]["schema"]["format"],
            "binary"
        );
    }

    /// Links name operations by `operationId`, which is therefore unique (OpenAPI requires it).
    #[test]
    fn operation_ids_are_unique() {
        let doc = serde_json::to_value(crate::routes::openapi::ApiDoc::openapi()).unwrap();
        let mut seen = std::collections::BTreeMap::new();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                let id = op["operationId"].as_str().unwrap().to_string();
                if let Some(other) = seen.insert(id.clone(), format!("{method} {path}")) {
                    panic!("operationId {id} of {method} {path} and {other}");
                }
            }
        }
    }

    /// A snapshot links to its own routes and to a session made from it; a fork to the routes of
    /// its first session.
    #[test]
    fn snapshots_and_forks_are_linked() {
        let doc = serde_json::to_value(crate::routes::openapi::ApiDoc::openapi()).unwrap();
        let paths = &doc["paths"];
        let taken = &paths["/session/{session_id}/snapshot/"]["post"]["responses"]["201"]["links"];
        for id in ["get_snapshot", "delete_snapshot"] {
            assert_eq!(taken[id]["operationId"], id);
            assert_eq!(
                taken[id]["parameters"]["snapshot_id"],
                "$response.body#/snapshot_id"
            );
        }
        assert_eq!(taken["create"]["operationId"], "create");
        assert_eq!(
            taken["create"]["requestBody"]["snapshot_id"],
            "$response.body#/snapshot_id"
        );
        assert!(taken["create"].get("parameters").is_none());
        let forked = paths["/session/{session_id}/fork/"]["post"]["responses"]["201"]["links"]
            .as_object()
            .unwrap();
        for id in [
            "run",
            "status",
            "close",
            "take_snapshot",
            "fork",
            "pause",
            "seed",
        ] {
            assert_eq!(forked[id]["operationId"], id);
            assert_eq!(
                forked[id]["parameters"]["session_id"],
                "$response.body#/session_ids/0"
            );
        }
        let from_create = paths["/session/"]["post"]["responses"]["200"]["links"]
            .as_object()
            .unwrap();
        // Every session route of the first fork; the listing only from a create.
        assert_eq!(forked.len() + 1, from_create.len());
        assert!(!doc.to_string().contains("\"request_body\""));
    }

    /// `base_image` or `snapshot_id`: read by a minimal evaluator of the document's own `anyOf`
    /// (`required`, `minLength`, `type: string`), body by body as the service answers them.
    #[test]
    fn a_create_names_an_image_or_a_snapshot() {
        use serde_json::{Value, json};
        let doc = serde_json::to_value(crate::routes::openapi::ApiDoc::openapi()).unwrap();
        let start = &doc["components"]["schemas"]["StartSessionRequest"];
        let branches = start["anyOf"].as_array().unwrap();
        let matches = |body: &Value, branch: &Value| {
            let required = branch["required"].as_array().unwrap();
            required
                .iter()
                .all(|r| body.get(r.as_str().unwrap()).is_some())
                && branch["properties"]
                    .as_object()
                    .unwrap()
                    .iter()
                    .all(|(name, rule)| match body.get(name) {
                        None => true,
                        Some(v) => {
                            let min = rule["minLength"].as_u64().unwrap_or(0) as usize;
                            let string = rule["type"] != "string" || v.is_string();
                            string && v.as_str().is_none_or(|s| s.chars().count() >= min)
                        }
                    })
        };
        let accepted = |body: Value| branches.iter().any(|b| matches(&body, b));
        // The service: 422 (no image), else a session, a 404 (unknown snapshot) or a 400 (an
        // image that is not the snapshot's): all past the document.
        assert!(!accepted(json!({})));
        assert!(!accepted(json!({"base_image": ""})));
        assert!(!accepted(json!({"base_image": "", "snapshot_id": null})));
        assert!(!accepted(json!({"snapshot_id": null, "cpus": 1})));
        assert!(accepted(json!({"base_image": "busybox"})));
        assert!(accepted(
            json!({"base_image": "busybox", "snapshot_id": null})
        ));
        assert!(accepted(json!({"snapshot_id": "0123"})));
        assert!(accepted(json!({"base_image": "", "snapshot_id": "0123"})));
        assert!(accepted(
            json!({"base_image": "busybox", "snapshot_id": "0123"})
        ));
        // Neither property is required on its own.
        assert!(start.get("required").is_none_or(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .all(|n| n != "base_image" && n != "snapshot_id")
        }));
        let create = &doc["paths"]["/session/"]["post"]["responses"];
        assert!(create["404"].is_object() && create["400"].is_object());
    }

    /// What the snapshot and fork routes check, and what they may answer.
    #[test]
    fn the_document_states_the_snapshot_bounds() {
        let doc = serde_json::to_value(crate::routes::openapi::ApiDoc::openapi()).unwrap();
        let s = &doc["components"]["schemas"];
        let fork = &s["ForkRequest"]["properties"];
        let config = crate::config::for_tests("k", &[]);
        assert_eq!(fork["count"]["minimum"], 1);
        assert_eq!(fork["count"]["maximum"], config.snapshots.fork_max);
        assert!(fork["environment"]["propertyNames"]["pattern"].is_string());
        assert!(fork["environment"]["additionalProperties"]["pattern"].is_string());
        let snap = &s["SnapshotRequest"]["properties"];
        assert_eq!(snap["name"]["maxLength"], crate::api::SNAPSHOT_NAME_MAX);
        assert!(snap["name"]["pattern"].is_string());
        assert_eq!(
            snap["ttl_seconds"]["maximum"],
            crate::api::SNAPSHOT_TTL_MAX_SECS
        );
        let paths = &doc["paths"];
        let take = &paths["/session/{session_id}/snapshot/"]["post"];
        // No body asks for the defaults; `null` is no body.
        assert_ne!(take["requestBody"]["required"], true);
        assert_eq!(
            take["requestBody"]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/SnapshotRequest"
        );
        for op in [take, &paths["/session/{session_id}/fork/"]["post"]] {
            let r = &op["responses"];
            for status in ["201", "404", "409", "422", "503"] {
                assert!(r[status].is_object(), "{status}: {op}");
            }
            assert!(r["429"]["headers"]["Retry-After"].is_object());
        }
        let pause = &paths["/session/{session_id}/pause/"]["post"]["responses"];
        for status in ["204", "404", "409", "503"] {
            assert!(pause[status].is_object(), "{status}");
        }
    }

    #[test]
    fn operation_refs_are_json_pointers() {
        assert_eq!(
            super::operation_ref("/session/{session_id}/", "get"),
            "#/paths/~1session~1{session_id}~1/get"
        );
    }
}
