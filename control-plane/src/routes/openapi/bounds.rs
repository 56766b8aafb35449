//! What the service checks and the type attributes cannot say, stated in the OpenAPI document
//! so that it accepts exactly what the service accepts (found by API fuzzing, `make api-fuzz`):
//! - every operation that takes a JSON body or a query answers 422 for one it cannot parse;
//! - unsigned integers are `uint64` up to `u64::MAX` (utoipa calls them `int64`, whose range
//!   stops at `i64::MAX`);
//! - metadata keys, values and their count (`StartSessionRequest` and `ForkRequest`: the rule of
//!   [`Metadata`]);
//! - environment names and values (`StartSessionRequest` and `ForkRequest`: the rule of
//!   [`Environment`]; `StartProcessRequest`: shell variable names) and commands (no NUL);
//! - a create's body names `base_image` (not empty) or `snapshot_id` (a string), or both;
//! - a fork's `count` is at most the default `DAIV_SANDBOX_FORK_MAX_COUNT` (a static document
//!   cannot know a deployment's own setting); a snapshot's `name` has no control characters and
//!   its `ttl_seconds` is at most ten years;
//! - a run's 200 is JSON or, with `Accept: application/x-ndjson`, NDJSON (utoipa keeps only the
//!   last content type given for one status);
//! - a seed's multipart body: `repo_archive` and/or `skills_archive`, at least one;
//! - an optional JSON body (a snapshot's) may be left out, but is never `null`;
//! - raw bodies (a process's stdin) are bytes, not arrays of integers.

use utoipa::Number;
use utoipa::openapi::extensions::Extensions;
use utoipa::openapi::path::ParameterIn;
use utoipa::openapi::schema::{
    AdditionalProperties, ArrayItems, KnownFormat, Object, ObjectBuilder, Schema, SchemaFormat,
    SchemaType, Type,
};
use utoipa::openapi::{Content, OpenApi, Ref, RefOr, Required, Response, ResponseBuilder};

use crate::api::{Environment, Metadata};

/// The path parameter every snapshot route has (and a create's body field naming one).
pub(super) const SNAPSHOT_ID: &str = "snapshot_id";

/// `DAIV_SANDBOX_FORK_MAX_COUNT`'s default (see `config::snapshots`; a test checks they agree).
const FORK_MAX_DEFAULT: u32 = 16;

/// A string schema with `pattern`.
fn pattern(re: &str) -> Schema {
    Schema::Object(
        ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some(re))
            .build(),
    )
}

/// No NUL anywhere.
const NO_NUL: &str = r"^[^\x00]*$";

fn object_mut<'a>(doc: &'a mut OpenApi, name: &str) -> Option<&'a mut Object> {
    match doc.components.as_mut()?.schemas.get_mut(name)? {
        RefOr::T(Schema::Object(o)) => Some(o),
        _ => None,
    }
}

fn property_mut<'a>(doc: &'a mut OpenApi, schema: &str, property: &str) -> Option<&'a mut Object> {
    match object_mut(doc, schema)?.properties.get_mut(property)? {
        RefOr::T(Schema::Object(o)) => Some(o),
        _ => None,
    }
}

/// Names and values of an environment map.
fn environment(doc: &mut OpenApi, schema: &str, names: &str, values: &str) {
    if let Some(env) = property_mut(doc, schema, "environment") {
        env.property_names = Some(Box::new(pattern(names)));
        env.additional_properties = Some(Box::new(AdditionalProperties::RefOr(RefOr::T(pattern(
            values,
        )))));
    }
}

/// A metadata map: [`Metadata`]'s keys, values and count.
fn metadata(doc: &mut OpenApi, schema: &str) {
    if let Some(m) = property_mut(doc, schema, "metadata") {
        m.property_names = Some(Box::new(pattern(Metadata::KEY_PATTERN)));
        m.additional_properties = Some(Box::new(AdditionalProperties::RefOr(RefOr::T(
            Schema::Object(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .max_length(Some(Metadata::MAX_VALUE))
                    .build(),
            ),
        ))));
        m.max_properties = Some(Metadata::MAX_PAIRS);
    }
}

/// `int64` with `minimum: 0` is how utoipa renders `u64`: say `uint64` and its real maximum.
fn unsigned(schema: &mut Schema) {
    match schema {
        Schema::Object(o) => {
            let integer = match &o.schema_type {
                SchemaType::Type(t) => *t == Type::Integer,
                SchemaType::Array(ts) => ts.contains(&Type::Integer),
                SchemaType::AnyValue => false,
            };
            let int64 = o.format == Some(SchemaFormat::KnownFormat(KnownFormat::Int64));
            let from_zero = matches!(o.minimum, Some(Number::Int(0) | Number::UInt(0)))
                || matches!(o.minimum, Some(Number::Float(f)) if f == 0.0);
            if integer && int64 && from_zero {
                o.format = Some(SchemaFormat::Custom("uint64".to_string()));
                if o.maximum.is_none() {
                    o.maximum = Some(Number::UInt(u64::MAX as usize));
                }
            }
            for p in o.properties.values_mut() {
                if let RefOr::T(s) = p {
                    unsigned(s);
                }
            }
        }
        Schema::Array(a) => {
            if let ArrayItems::RefOrSchema(item) = &mut a.items
                && let RefOr::T(s) = item.as_mut()
            {
                unsigned(s);
            }
        }
        Schema::OneOf(o) => o.items.iter_mut().for_each(|i| {
            if let RefOr::T(s) = i {
                unsigned(s)
            }
        }),
        Schema::AllOf(o) => o.items.iter_mut().for_each(|i| {
            if let RefOr::T(s) = i {
                unsigned(s)
            }
        }),
        Schema::AnyOf(o) => o.items.iter_mut().for_each(|i| {
            if let RefOr::T(s) = i {
                unsigned(s)
            }
        }),
        _ => {}
    }
}

fn error_body(description: &str) -> RefOr<Response> {
    RefOr::T(
        ResponseBuilder::new()
            .description(description)
            .content(
                "application/json",
                Content::new(Some(Ref::from_schema_name("ErrorBody"))),
            )
            .build(),
    )
}

/// The bounds described in the module docs.
pub(super) fn bounds(doc: &mut OpenApi) {
    if let Some(components) = doc.components.as_mut() {
        components.schemas.values_mut().for_each(|s| {
            if let RefOr::T(s) = s {
                unsigned(s)
            }
        });
    }
    // One rule for every environment: a session's, a fork's, a process's.
    for schema in ["StartSessionRequest", "ForkRequest", "StartProcessRequest"] {
        environment(
            doc,
            schema,
            Environment::NAME_PATTERN,
            Environment::VALUE_PATTERN,
        );
    }
    for schema in ["StartSessionRequest", "ForkRequest"] {
        metadata(doc, schema);
    }
    if let Some(o) = object_mut(doc, "StartSessionRequest") {
        o.extensions
            .get_or_insert_with(Default::default)
            .merge(Extensions::from_iter([("anyOf", image_or_snapshot())]));
    }
    if let Some(count) = property_mut(doc, "ForkRequest", "count") {
        count.maximum = Some(Number::UInt(FORK_MAX_DEFAULT as usize));
    }
    if let Some(name) = property_mut(doc, "SnapshotRequest", "name") {
        // `char::is_control`: the C0 and C1 controls and DEL.
        name.pattern = Some(r"^[^\x00-\x1f\x7f-\x9f]*$".to_string());
    }
    if let Some(ttl) = property_mut(doc, "SnapshotRequest", "ttl_seconds") {
        ttl.maximum = Some(Number::UInt(crate::api::SNAPSHOT_TTL_MAX_SECS as usize));
    }
    if let Some(o) = object_mut(doc, "RunRequest")
        && let Some(RefOr::T(Schema::Array(commands))) = o.properties.get_mut("commands")
    {
        commands.items = ArrayItems::RefOrSchema(Box::new(RefOr::T(pattern(NO_NUL))));
    }
    for (path, item) in doc.paths.paths.iter_mut() {
        for op in [
            item.get.as_mut(),
            item.put.as_mut(),
            item.post.as_mut(),
            item.delete.as_mut(),
            item.patch.as_mut(),
        ]
        .into_iter()
        .flatten()
        {
            for p in op.parameters.iter_mut().flatten() {
                if let Some(RefOr::T(s)) = p.schema.as_mut() {
                    unsigned(s);
                }
            }
            let json_body = op
                .request_body
                .as_ref()
                .is_some_and(|b| b.content.contains_key("application/json"));
            let query = op
                .parameters
                .iter()
                .flatten()
                .any(|p| matches!(p.parameter_in, ParameterIn::Query));
            if (json_body || query) && !op.responses.responses.contains_key("422") {
                op.responses.responses.insert(
                    "422".to_string(),
                    error_body("The body or the query could not be parsed, or a value is refused."),
                );
            }
            // An optional JSON body (`request_body = Option<T>`) may be left out, but a `null`
            // body is no `T` (utoipa says `oneOf: [null, T]`, serde refuses it).
            if let Some(body) = op.request_body.as_mut()
                && !matches!(body.required, Some(Required::True))
                && let Some(json) = body.content.get_mut("application/json")
                && let Some(RefOr::T(Schema::OneOf(one))) = json.schema.as_ref()
                && let [a, b] = &one.items[..]
            {
                let null = |s: &RefOr<Schema>| matches!(s, RefOr::T(Schema::Object(o)) if o.schema_type == SchemaType::Type(Type::Null));
                let kept = match (null(a), null(b)) {
                    (true, false) => Some(b.clone()),
                    (false, true) => Some(a.clone()),
                    _ => None,
                };
                if kept.is_some() {
                    json.schema = kept;
                }
            }
            // Raw bytes (utoipa renders `Vec<u8>` as an array of integers).
            if let Some(raw) = op
                .request_body
                .as_mut()
                .and_then(|b| b.content.get_mut("application/octet-stream"))
            {
                raw.schema = Some(RefOr::T(Schema::Object(
                    ObjectBuilder::new()
                        .schema_type(Type::String)
                        .format(Some(SchemaFormat::KnownFormat(KnownFormat::Binary)))
                        .build(),
                )));
            }
            if path == "/session/{session_id}/seed/"
                && let Some(body) = op.request_body.as_mut()
                && let Some(form) = body.content.get_mut("multipart/form-data")
            {
                form.schema = Some(RefOr::T(seed_form()));
                body.required = Some(Required::True);
            }
            if path == "/session/{session_id}/"
                && let Some(RefOr::T(ok)) = op.responses.responses.get_mut("200")
                && op.request_body.is_some()
                && !ok.content.contains_key("application/json")
            {
                ok.content.insert(
                    "application/json".to_string(),
                    Content::new(Some(Ref::from_schema_name("RunResponse"))),
                );
                // JSON first: it is what a client that names no `Accept` gets.
                ok.content.sort_by(|a, _, b, _| {
                    (a != "application/json").cmp(&(b != "application/json"))
                });
            }
        }
    }
}

/// A create's body: a `base_image` that is not empty, or a `snapshot_id` (a string, not null),
/// or both (the service then checks they agree: 400). `base_image` may be empty only beside a
/// snapshot, whose own image it then is.
fn image_or_snapshot() -> serde_json::Value {
    serde_json::json!([
        { "required": ["base_image"], "properties": { "base_image": { "minLength": 1 } } },
        { "required": [SNAPSHOT_ID], "properties": { SNAPSHOT_ID: { "type": "string" } } },
    ])
}

/// `repo_archive` and/or `skills_archive`: tar archives, plain or compressed, as file parts.
fn seed_form() -> Schema {
    let archive = |what: &str| {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Binary)))
            .content_media_type("application/octet-stream")
            .description(Some(format!(
                "Tar archive (plain, gzip, bzip2, xz or zstd) extracted into {what}."
            )))
            .build()
    };
    let required = |field: &str| Schema::Object(ObjectBuilder::new().required(field).build());
    Schema::Object(
        ObjectBuilder::new()
            .property("repo_archive", archive(crate::layout::REPO))
            .property("skills_archive", archive(crate::layout::SKILLS))
            .min_properties(Some(1))
            .extensions(Some(Extensions::from_iter([(
                "anyOf",
                serde_json::to_value([required("repo_archive"), required("skills_archive")])
                    .unwrap_or_default(),
            )])))
            .build(),
    )
}
