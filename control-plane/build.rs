//! Puts the Swagger UI release that `GET {api}/docs` serves into the binary.
//!
//! The release archive comes from the crate `utoipa-swagger-ui-vendored`, which carries it, so
//! the build needs crates.io and nothing else (no download from a CDN or GitHub, as
//! `utoipa-swagger-ui`'s own build script does without its `vendored` feature). Only the files
//! the page loads, and the licence that must travel with them, are extracted to `OUT_DIR`;
//! `routes/docs.rs` embeds them with `include_bytes!`. The page and its initialiser are ours
//! (`routes/docs/`), so the Content-Security-Policy can forbid inline scripts.

use std::io::{Cursor, Read};
use std::path::PathBuf;

/// What the page needs from the release, relative to its top folder.
const FILES: &[&str] = &[
    "dist/swagger-ui-bundle.js",
    "dist/swagger-ui.css",
    "dist/favicon-32x32.png",
    "LICENSE",
    "NOTICE",
];

fn main() {
    // The archive is a build dependency: cargo reruns this when its version changes.
    println!("cargo::rerun-if-changed=build.rs");
    let out =
        PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("swagger-ui");
    std::fs::create_dir_all(&out).expect("create OUT_DIR/swagger-ui");

    let bytes = utoipa_swagger_ui_vendored::SWAGGER_UI_VENDORED;
    let mut archive =
        zip::ZipArchive::new(Cursor::new(bytes)).expect("the vendored Swagger UI is a zip archive");
    // `swagger-ui-<version>/...`
    let top = archive
        .file_names()
        .filter_map(|name| name.ok()?.split('/').next().map(str::to_string))
        .find(|top| top.starts_with("swagger-ui-"))
        .expect("the archive has a swagger-ui-<version> folder");

    for file in FILES {
        let mut entry = archive
            .by_name(&format!("{top}/{file}"))
            .unwrap_or_else(|e| panic!("{top}/{file} is not in the vendored Swagger UI: {e}"));
        let mut content = Vec::new();
        entry
            .read_to_end(&mut content)
            .unwrap_or_else(|e| panic!("read {top}/{file}: {e}"));
        let name = file.rsplit('/').next().unwrap_or(file);
        std::fs::write(out.join(name), content).unwrap_or_else(|e| panic!("write {name}: {e}"));
    }
    // Apache-2.0 asks for the licence and the NOTICE with the code: one file, NOTICE first.
    let notice = std::fs::read(out.join("NOTICE")).expect("read NOTICE");
    let licence = std::fs::read(out.join("LICENSE")).expect("read LICENSE");
    std::fs::write(
        out.join("LICENSE"),
        [notice, b"\n".to_vec(), licence].concat(),
    )
    .expect("write LICENSE");
}
