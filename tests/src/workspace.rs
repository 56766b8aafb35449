//! Helpers for the workspace tests: archives built in memory (hostile ones included), seeding
//! through multipart, and fs calls whose every 200 body is validated against DAIV's wire schemas.

use std::io::Write;
use std::path::PathBuf;
use std::sync::OnceLock;

use anyhow::{Context, Result, anyhow, bail};
use reqwest::Method;
use serde_json::Value;

use crate::{ControlPlane, Session};

/// One archive member. Names and link targets are written raw, so `..` and absolute names can
/// be built (the `tar` crate's setters refuse them).
pub enum Member<'a> {
    File(&'a str, &'a [u8], u32),
    Dir(&'a str, u32),
    Symlink(&'a str, &'a str),
    Hardlink(&'a str, &'a str),
    Fifo(&'a str),
    CharDevice(&'a str),
}

fn raw_header(name: &str, kind: tar::EntryType, mode: u32, size: u64) -> Result<tar::Header> {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(size);
    h.set_mtime(1_700_000_000);
    let bytes = name.as_bytes();
    let field = &mut h.as_old_mut().name;
    if bytes.len() > field.len() {
        bail!("test member name too long for a raw header: {name}");
    }
    field[..bytes.len()].copy_from_slice(bytes);
    Ok(h)
}

/// A plain tar of `members`, in order.
pub fn tar_of(members: &[Member<'_>]) -> Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    for m in members {
        match m {
            Member::File(name, data, mode) => {
                let mut h = raw_header(name, tar::EntryType::Regular, *mode, data.len() as u64)?;
                h.set_cksum();
                b.append(&h, *data)?;
            }
            Member::Dir(name, mode) => {
                let mut h = raw_header(name, tar::EntryType::Directory, *mode, 0)?;
                h.set_cksum();
                b.append(&h, std::io::empty())?;
            }
            Member::Symlink(name, target) | Member::Hardlink(name, target) => {
                let kind = if matches!(m, Member::Symlink(..)) {
                    tar::EntryType::Symlink
                } else {
                    tar::EntryType::Link
                };
                let mut h = raw_header(name, kind, 0o777, 0)?;
                let t = target.as_bytes();
                h.as_old_mut().linkname[..t.len()].copy_from_slice(t);
                h.set_cksum();
                b.append(&h, std::io::empty())?;
            }
            Member::Fifo(name) => {
                let mut h = raw_header(name, tar::EntryType::Fifo, 0o644, 0)?;
                h.set_cksum();
                b.append(&h, std::io::empty())?;
            }
            Member::CharDevice(name) => {
                let mut h = raw_header(name, tar::EntryType::Char, 0o666, 0)?;
                h.set_cksum();
                b.append(&h, std::io::empty())?;
            }
        }
    }
    Ok(b.into_inner()?)
}

pub fn gzip(data: &[u8]) -> Result<Vec<u8>> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data)?;
    Ok(e.finish()?)
}

pub fn bzip2(data: &[u8]) -> Result<Vec<u8>> {
    let mut e = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::fast());
    e.write_all(data)?;
    Ok(e.finish()?)
}

pub fn xz(data: &[u8]) -> Result<Vec<u8>> {
    let mut e = liblzma::write::XzEncoder::new(Vec::new(), 1);
    e.write_all(data)?;
    Ok(e.finish()?)
}

pub fn zstd(data: &[u8]) -> Result<Vec<u8>> {
    Ok(zstd::encode_all(data, 3)?)
}

/// The result of a seed call.
#[derive(Debug)]
pub struct Seeded {
    pub status: u16,
    pub skipped: Option<u64>,
    pub body: Value,
}

/// `POST /session/{id}/seed/` with the given multipart fields (name, bytes).
pub async fn seed(cp: &ControlPlane, s: &Session, fields: Vec<(&str, Vec<u8>)>) -> Result<Seeded> {
    let mut form = reqwest::multipart::Form::new();
    for (name, bytes) in fields {
        let part = reqwest::multipart::Part::bytes(bytes).file_name(format!("{name}.tar"));
        form = form.part(name.to_string(), part);
    }
    seed_form(cp, s, form).await
}

pub async fn seed_form(
    cp: &ControlPlane,
    s: &Session,
    form: reqwest::multipart::Form,
) -> Result<Seeded> {
    let resp = cp
        .request(Method::POST, &format!("/session/{}/seed/", s.id))
        .multipart(form)
        .send()
        .await?;
    let status = resp.status().as_u16();
    let skipped = resp
        .headers()
        .get("x-seed-skipped-members")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let bytes = resp.bytes().await?;
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Ok(Seeded {
        status,
        skipped,
        body,
    })
}

fn schemas() -> Result<&'static Value> {
    static SCHEMAS: OnceLock<Value> = OnceLock::new();
    if let Some(s) = SCHEMAS.get() {
        return Ok(s);
    }
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/spec/daiv-client-wire-schemas.json");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("read the wire schemas at {}", path.display()))?;
    let v: Value = serde_json::from_str(&text)?;
    Ok(SCHEMAS.get_or_init(|| v))
}

/// Validates `body` against the named top-level schema (each carries its own `$defs`).
pub fn validate(schema_name: &str, body: &Value) -> Result<()> {
    let schema = schemas()?
        .get(schema_name)
        .with_context(|| format!("no schema {schema_name}"))?;
    let validator =
        jsonschema::validator_for(schema).map_err(|e| anyhow!("schema {schema_name}: {e}"))?;
    let errors: Vec<String> = validator.iter_errors(body).map(|e| e.to_string()).collect();
    if !errors.is_empty() {
        bail!("{schema_name} rejects {body}: {errors:?}");
    }
    Ok(())
}

/// `POST /session/{id}/fs/{op}`; a 200 body is validated against `Fs{Op}Response`.
pub async fn fs(cp: &ControlPlane, s: &Session, op: &str, body: Value) -> Result<(u16, Value)> {
    let (status, resp) = cp
        .call(
            reqwest::Method::POST,
            &format!("/session/{}/fs/{op}", s.id),
            Some(body),
        )
        .await?;
    if status == 200 {
        let mut name = String::from("Fs");
        let mut chars = op.chars();
        if let Some(c) = chars.next() {
            name.push(c.to_ascii_uppercase());
            name.extend(chars);
        }
        name.push_str("Response");
        validate(&name, &resp)?;
    }
    Ok((status, resp))
}

/// Like [`fs`], but insists on 200 and returns the body.
pub async fn fs_ok(cp: &ControlPlane, s: &Session, op: &str, body: Value) -> Result<Value> {
    let (status, resp) = fs(cp, s, op, body).await?;
    if status != 200 {
        bail!("fs/{op}: {status} {resp}");
    }
    Ok(resp)
}

/// The error code of an fs response (`None` on success).
pub fn code(resp: &Value) -> Option<&str> {
    resp["error"]["code"].as_str()
}
