//! Registry credentials for pulls, found the way the Docker CLI finds them, so a deployment that
//! mounts its host's `~/.docker/config.json` (as DAIV's does) pulls private images.
//!
//! The config is `$DOCKER_CONFIG/config.json`, else `$HOME/.docker/config.json`. For an image's
//! registry ([`Registry::of_image`]: Docker Hub for names without a registry part, under the
//! CLI's key `https://index.docker.io/v1/`):
//! 1. a credential helper, `credHelpers[registry]`, else `credsStore`: `docker-credential-NAME
//!    get`, the server on stdin, `{"Username","Secret"}` out (username `<token>`: an identity
//!    token). A helper takes precedence over `auths`, as in the CLI.
//! 2. `auths[registry]`: `auth` (base64 `user:password`), or `username`/`password`, plus
//!    `identitytoken` and `registrytoken`. Keys are matched exactly, else by host (a key may
//!    carry a scheme and a path: `https://registry.example.com/v1/`).
//!
//! The file is read again for every lookup (one small read per pull, never per request), so a
//! rotated token is in force for the next pull without a restart. Nothing secret leaves this
//! module except inside [`RegistryCredential`], whose `Debug` hides it; errors name files,
//! registries and helpers, never a value (not even serde's messages, which quote values).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use base64::Engine as _;
use serde::Deserialize;
use tokio::io::AsyncWriteExt;

use sandbox_common::secret::Secret;

/// The Docker CLI's key for Docker Hub (`registry.IndexServer`): in `auths`, in `credHelpers`,
/// and what it hands a helper.
pub const DOCKER_HUB_SERVER: &str = "https://index.docker.io/v1/";
/// A client config is a few KiB; anything this large is not one.
const MAX_CONFIG_BYTES: u64 = 1024 * 1024;
/// A helper that has not answered by then (a keychain prompt nobody sees) fails the lookup.
const HELPER_TIMEOUT: Duration = Duration::from_secs(10);
/// What helpers print when they hold nothing for a server (`credentials.ErrCredentialsNotFound`).
const HELPER_NOT_FOUND: &str = "credentials not found in native keychain";

/// The registry an image is pulled from, as the Docker CLI normalises references: a first path
/// component with a `.` or `:`, `localhost`, or upper case names a registry; anything else
/// (including no `/` at all) is Docker Hub.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registry {
    /// Lower-case host (and port); `docker.io` for Docker Hub.
    host: String,
}

impl Registry {
    pub fn of_image(image: &str) -> Self {
        let domain = match image.split_once('/') {
            Some((first, _))
                if first == "localhost"
                    || first.contains(['.', ':'])
                    || first.chars().any(|c| c.is_ascii_uppercase()) =>
            {
                first
            }
            _ => "docker.io",
        };
        Self {
            host: host_of(domain),
        }
    }

    pub fn is_docker_hub(&self) -> bool {
        self.host == "docker.io"
    }

    /// The key the CLI files this registry's credentials under, and the server it asks a
    /// helper about: [`DOCKER_HUB_SERVER`] for Docker Hub, else the host (`host:port`).
    pub fn server(&self) -> &str {
        if self.is_docker_hub() {
            DOCKER_HUB_SERVER
        } else {
            &self.host
        }
    }
}

/// Whether `key` (an `auths` or `credHelpers` key) names `registry`.
fn key_matches(key: &str, registry: &Registry) -> bool {
    key == registry.server() || host_of(key) == registry.host
}

/// The host of a config key or reference domain: scheme and path dropped, lower case, and
/// Docker Hub's aliases as `docker.io`.
fn host_of(key: &str) -> String {
    let rest = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    let host = rest.split('/').next().unwrap_or(rest).to_ascii_lowercase();
    match host.as_str() {
        "index.docker.io" | "registry-1.docker.io" => "docker.io".to_string(),
        _ => host,
    }
}

/// Credentials for one registry, as the engine passes them to the daemon.
#[derive(Clone)]
pub struct RegistryCredential {
    /// The registry they are for, as the CLI names it ([`Registry::server`]).
    pub server: String,
    pub username: Option<String>,
    pub password: Option<Secret>,
    /// An OAuth refresh token the daemon exchanges for access (`identitytoken`).
    pub identity_token: Option<Secret>,
    /// A bearer token the daemon sends as is (`registrytoken`).
    pub registry_token: Option<Secret>,
    pub source: CredentialSource,
}

impl fmt::Debug for RegistryCredential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistryCredential")
            .field("server", &self.server)
            .field("username", &self.username)
            .field("password", &self.password)
            .field("identity_token", &self.identity_token)
            .field("registry_token", &self.registry_token)
            .field("source", &self.source)
            .finish()
    }
}

/// Where a credential came from, for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CredentialSource {
    /// `auths` in the config file.
    Auths,
    /// `docker-credential-NAME`.
    Helper(String),
}

impl fmt::Display for CredentialSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CredentialSource::Auths => f.write_str("auths"),
            CredentialSource::Helper(name) => write!(f, "docker-credential-{name}"),
        }
    }
}

/// Why no credential could be looked up. Never carries a value from the file or a helper.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    #[error("cannot read {}: {source}", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is over {MAX_CONFIG_BYTES} bytes: not a Docker client config", .path.display())]
    TooLarge { path: PathBuf },
    /// Line and column only: serde's message would quote the offending value.
    #[error("{} is not a valid Docker client config (line {line}, column {column})", .path.display())]
    Malformed {
        path: PathBuf,
        line: usize,
        column: usize,
    },
    #[error("the `auth` of {server:?} in {} is not base64 of `user:password`", .path.display())]
    BadAuth { path: PathBuf, server: String },
    #[error("credential helper docker-credential-{helper} for {server}: {failure}")]
    Helper {
        helper: String,
        server: String,
        failure: HelperFailure,
    },
}

#[derive(Debug)]
pub enum HelperFailure {
    /// A name that is not a plain word (a `/` would make it a path).
    BadName,
    CannotRun(std::io::ErrorKind),
    TimedOut(Duration),
    /// Exited non-zero; its output is not repeated (it may hold anything).
    Failed(std::process::ExitStatus),
    /// Exited zero without `{"Username","Secret"}`.
    BadOutput,
}

impl fmt::Display for HelperFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HelperFailure::BadName => f.write_str("not a valid helper name"),
            HelperFailure::CannotRun(kind) => write!(f, "cannot run it ({kind})"),
            HelperFailure::TimedOut(after) => write!(f, "no answer within {after:?}"),
            HelperFailure::Failed(status) => write!(f, "failed ({status})"),
            HelperFailure::BadOutput => f.write_str("its answer is not {\"Username\",\"Secret\"}"),
        }
    }
}

/// `config.json`, the parts this module reads; everything else is ignored.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct ConfigFile {
    auths: Option<BTreeMap<String, AuthEntry>>,
    creds_store: Option<String>,
    cred_helpers: Option<BTreeMap<String, String>>,
}

/// One `auths` entry. No `Debug`: it holds secrets.
#[derive(Deserialize, Default)]
struct AuthEntry {
    auth: Option<String>,
    username: Option<String>,
    password: Option<String>,
    identitytoken: Option<String>,
    registrytoken: Option<String>,
}

/// A helper's answer to `get`.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct HelperAnswer {
    username: String,
    secret: String,
}

/// The Docker client config of this process, read at every lookup.
#[derive(Clone)]
pub struct CredentialStore {
    /// `None`: neither `DOCKER_CONFIG` nor `HOME` is set, so there is no config.
    path: Option<PathBuf>,
    helper_timeout: Duration,
    /// Where helpers are looked for instead of the process's `PATH` (tests).
    helper_path: Option<OsString>,
}

impl CredentialStore {
    /// The config the Docker CLI of this process would read: `$DOCKER_CONFIG/config.json`, else
    /// `$HOME/.docker/config.json` (empty variables count as unset).
    pub fn from_env() -> Self {
        let var = |k| std::env::var_os(k).filter(|v| !v.is_empty());
        let dir = var("DOCKER_CONFIG")
            .map(PathBuf::from)
            .or_else(|| var("HOME").map(|h| Path::new(&h).join(".docker")));
        Self::new(dir.map(|d| d.join("config.json")))
    }

    /// The config in directory `dir` (as `DOCKER_CONFIG=dir`).
    pub fn in_dir(dir: impl AsRef<Path>) -> Self {
        Self::new(Some(dir.as_ref().join("config.json")))
    }

    /// No config: every pull is anonymous.
    pub fn none() -> Self {
        Self::new(None)
    }

    fn new(path: Option<PathBuf>) -> Self {
        Self {
            path,
            helper_timeout: HELPER_TIMEOUT,
            helper_path: None,
        }
    }

    /// The file looked up, whether or not it exists.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The credential to pull `image` with; `None` when the config has none for its registry
    /// (or there is no config file).
    pub async fn for_image(
        &self,
        image: &str,
    ) -> Result<Option<RegistryCredential>, CredentialError> {
        self.lookup(&Registry::of_image(image)).await
    }

    pub async fn lookup(
        &self,
        registry: &Registry,
    ) -> Result<Option<RegistryCredential>, CredentialError> {
        let Some(path) = &self.path else {
            return Ok(None);
        };
        let Some(config) = read_config(path).await? else {
            return Ok(None);
        };
        if let Some(helper) = helper_for(&config, registry) {
            return self.ask_helper(&helper, registry).await;
        }
        from_auths(&config, registry).map_err(|()| CredentialError::BadAuth {
            path: path.clone(),
            server: registry.server().to_string(),
        })
    }

    /// Runs `docker-credential-NAME get` with the server on stdin.
    async fn ask_helper(
        &self,
        name: &str,
        registry: &Registry,
    ) -> Result<Option<RegistryCredential>, CredentialError> {
        let server = registry.server();
        let failed = |failure| CredentialError::Helper {
            helper: name.to_string(),
            server: server.to_string(),
            failure,
        };
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return Err(failed(HelperFailure::BadName));
        }
        let mut cmd = tokio::process::Command::new(format!("docker-credential-{name}"));
        cmd.arg("get")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        if let Some(p) = &self.helper_path {
            cmd.env("PATH", p);
        }
        let run = async {
            let mut child = cmd
                .spawn()
                .map_err(|e| HelperFailure::CannotRun(e.kind()))?;
            if let Some(mut stdin) = child.stdin.take() {
                // As the CLI does: the server, no newline. A helper that exits without reading
                // is judged by its exit status, not by this write.
                let _ = stdin.write_all(server.as_bytes()).await;
            }
            child
                .wait_with_output()
                .await
                .map_err(|e| HelperFailure::CannotRun(e.kind()))
        };
        let out = tokio::time::timeout(self.helper_timeout, run)
            .await
            .map_err(|_| failed(HelperFailure::TimedOut(self.helper_timeout)))?
            .map_err(failed)?;
        parse_helper_answer(out.status.success(), &out.stdout)
            .map(|answer| {
                answer.map(|(username, secret)| {
                    credential(
                        registry,
                        CredentialSource::Helper(name.to_string()),
                        username,
                        secret,
                    )
                })
            })
            .map_err(|()| {
                failed(if out.status.success() {
                    HelperFailure::BadOutput
                } else {
                    HelperFailure::Failed(out.status)
                })
            })
    }
}

/// The config at `path`; `None` when there is no such file.
async fn read_config(path: &Path) -> Result<Option<ConfigFile>, CredentialError> {
    let read_err = |source| CredentialError::Read {
        path: path.to_path_buf(),
        source,
    };
    let bytes = match tokio::fs::metadata(path).await {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(read_err(e)),
        Ok(m) if m.len() > MAX_CONFIG_BYTES => {
            return Err(CredentialError::TooLarge {
                path: path.to_path_buf(),
            });
        }
        Ok(_) => match tokio::fs::read(path).await {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            other => other.map_err(read_err)?,
        },
    };
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(CredentialError::TooLarge {
            path: path.to_path_buf(),
        });
    }
    parse_config(&bytes)
        .map(Some)
        .map_err(|e| CredentialError::Malformed {
            path: path.to_path_buf(),
            line: e.line(),
            column: e.column(),
        })
}

fn parse_config(bytes: &[u8]) -> Result<ConfigFile, serde_json::Error> {
    // An empty file is what some tools leave behind: no credentials, not an error.
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(ConfigFile::default());
    }
    serde_json::from_slice(bytes)
}

/// The helper that holds `registry`'s credentials: its `credHelpers` entry (exact key first,
/// then by host), else the `credsStore`.
fn helper_for(config: &ConfigFile, registry: &Registry) -> Option<String> {
    let helpers = config.cred_helpers.as_ref();
    let exact = helpers.and_then(|h| h.get(registry.server()));
    let by_host = || {
        helpers.and_then(|h| {
            h.iter()
                .find(|(k, _)| key_matches(k, registry))
                .map(|(_, v)| v)
        })
    };
    exact
        .or_else(by_host)
        .filter(|h| !h.is_empty())
        .or(config.creds_store.as_ref().filter(|s| !s.is_empty()))
        .cloned()
}

/// `registry`'s `auths` entry (exact key first, then by host) as a credential; `Err` when its
/// `auth` does not decode.
fn from_auths(config: &ConfigFile, registry: &Registry) -> Result<Option<RegistryCredential>, ()> {
    let Some(auths) = &config.auths else {
        return Ok(None);
    };
    let entry = auths.get(registry.server()).or_else(|| {
        auths
            .iter()
            .find(|(k, _)| key_matches(k, registry))
            .map(|(_, v)| v)
    });
    let Some(entry) = entry else {
        return Ok(None);
    };
    let nonempty = |v: &Option<String>| v.clone().filter(|s| !s.is_empty());
    // As the CLI: a non-empty `auth` wins over `username`/`password`.
    let (username, password) = match nonempty(&entry.auth) {
        Some(auth) => {
            let (u, p) = decode_auth(&auth)?;
            (Some(u), Some(p))
        }
        None => (nonempty(&entry.username), nonempty(&entry.password)),
    };
    let credential = RegistryCredential {
        server: registry.server().to_string(),
        username: username.filter(|u| !u.is_empty()),
        password: password.filter(|p| !p.is_empty()).map(Secret::new),
        identity_token: nonempty(&entry.identitytoken).map(Secret::new),
        registry_token: nonempty(&entry.registrytoken).map(Secret::new),
        source: CredentialSource::Auths,
    };
    let empty = credential.username.is_none()
        && credential.password.is_none()
        && credential.identity_token.is_none()
        && credential.registry_token.is_none();
    Ok((!empty).then_some(credential))
}

/// `auth`: base64 (padding optional) of `user:password`; the password may contain `:`.
fn decode_auth(auth: &str) -> Result<(String, String), ()> {
    let engine = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    let decoded = engine.decode(auth.trim()).map_err(|_| ())?;
    let decoded = String::from_utf8(decoded).map_err(|_| ())?;
    let (user, password) = decoded.split_once(':').ok_or(())?;
    Ok((user.to_string(), password.to_string()))
}

/// A helper's `get` answer: `Ok(Some((username, secret)))`, `Ok(None)` when it holds nothing for
/// the server (it says so and exits non-zero, or answers an empty secret), `Err` otherwise.
fn parse_helper_answer(success: bool, stdout: &[u8]) -> Result<Option<(String, String)>, ()> {
    if !success {
        return if String::from_utf8_lossy(stdout).trim() == HELPER_NOT_FOUND {
            Ok(None)
        } else {
            Err(())
        };
    }
    let answer: HelperAnswer = serde_json::from_slice(stdout).map_err(|_| ())?;
    Ok((!answer.secret.is_empty()).then_some((answer.username, answer.secret)))
}

/// A helper's `(username, secret)`: the username `<token>` marks an identity token.
fn credential(
    registry: &Registry,
    source: CredentialSource,
    username: String,
    secret: String,
) -> RegistryCredential {
    let token = username == "<token>";
    RegistryCredential {
        server: registry.server().to_string(),
        username: (!token && !username.is_empty()).then_some(username),
        password: (!token).then(|| Secret::new(secret.clone())),
        identity_token: token.then(|| Secret::new(secret)),
        registry_token: None,
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    fn config(json: &str) -> ConfigFile {
        parse_config(json.as_bytes()).expect("valid config")
    }

    fn auths_for(json: &str, image: &str) -> Option<RegistryCredential> {
        from_auths(&config(json), &Registry::of_image(image)).expect("decodable")
    }

    fn user_pass(c: &RegistryCredential) -> (Option<&str>, Option<&str>) {
        (
            c.username.as_deref(),
            c.password.as_ref().map(Secret::expose),
        )
    }

    #[test]
    fn references_name_their_registry_as_the_cli_does() {
        for (image, server) in [
            ("busybox", DOCKER_HUB_SERVER),
            ("busybox:1.36", DOCKER_HUB_SERVER),
            ("library/busybox@sha256:abc", DOCKER_HUB_SERVER),
            ("srtab/daiv-sandbox:latest", DOCKER_HUB_SERVER),
            ("docker.io/library/busybox", DOCKER_HUB_SERVER),
            ("index.docker.io/library/busybox", DOCKER_HUB_SERVER),
            ("ghcr.io/org/img:1", "ghcr.io"),
            ("127.0.0.1:5000/private/busybox:x", "127.0.0.1:5000"),
            ("localhost/img", "localhost"),
            ("localhost:5000/img", "localhost:5000"),
            ("Registry/img", "registry"),
            ("registry.Example.COM/a/b/c:tag", "registry.example.com"),
            ("[::1]:5000/img", "[::1]:5000"),
        ] {
            assert_eq!(Registry::of_image(image).server(), server, "{image}");
        }
    }

    #[test]
    fn an_auth_field_decodes_to_user_and_password() {
        let json = format!(
            r#"{{"auths": {{"127.0.0.1:5000": {{"auth": "{}"}}}}}}"#,
            b64("alice:pa:ss")
        );
        let c = auths_for(&json, "127.0.0.1:5000/img:1").expect("credential");
        assert_eq!(user_pass(&c), (Some("alice"), Some("pa:ss")));
        assert_eq!(c.server, "127.0.0.1:5000");
        assert_eq!(c.source, CredentialSource::Auths);
        // Without padding too (some tools strip it).
        let unpadded = b64("bob:pw").trim_end_matches('=').to_string();
        let json = format!(r#"{{"auths": {{"127.0.0.1:5000": {{"auth": "{unpadded}"}}}}}}"#);
        let c = auths_for(&json, "127.0.0.1:5000/img").expect("credential");
        assert_eq!(user_pass(&c), (Some("bob"), Some("pw")));
    }

    #[test]
    fn auth_wins_over_username_and_password_fields() {
        let json = format!(
            r#"{{"auths": {{"r.test": {{"auth": "{}", "username": "old", "password": "old"}}}}}}"#,
            b64("new:new")
        );
        let c = auths_for(&json, "r.test/img").expect("credential");
        assert_eq!(user_pass(&c), (Some("new"), Some("new")));
        let json = r#"{"auths": {"r.test": {"username": "u", "password": "p"}}}"#;
        let c = auths_for(json, "r.test/img").expect("credential");
        assert_eq!(user_pass(&c), (Some("u"), Some("p")));
    }

    #[test]
    fn tokens_are_passed_along() {
        let json =
            r#"{"auths": {"r.test": {"identitytoken": "refresh", "registrytoken": "bearer"}}}"#;
        let c = auths_for(json, "r.test/img").expect("credential");
        assert_eq!(
            c.identity_token.as_ref().map(Secret::expose),
            Some("refresh")
        );
        assert_eq!(
            c.registry_token.as_ref().map(Secret::expose),
            Some("bearer")
        );
        assert_eq!(user_pass(&c), (None, None));
    }

    #[test]
    fn an_auth_that_does_not_decode_is_an_error_not_an_anonymous_pull() {
        let lookup = |auth: &str| {
            let json = format!(r#"{{"auths": {{"r.test": {{"auth": "{auth}"}}}}}}"#);
            from_auths(&config(&json), &Registry::of_image("r.test/i"))
        };
        for bad in [
            "%%%".to_string(),
            b64("no-colon"),
            base64::engine::general_purpose::STANDARD.encode([0xff, b':', b'x']),
        ] {
            assert!(lookup(&bad).is_err(), "{bad}");
        }
        // An empty auth is no auth: the entry holds nothing.
        assert!(matches!(lookup(""), Ok(None)));
    }

    #[test]
    fn docker_hub_is_found_under_its_cli_key_and_aliases() {
        for key in [
            "https://index.docker.io/v1/",
            "index.docker.io",
            "docker.io",
            "https://registry-1.docker.io",
        ] {
            let json = format!(
                r#"{{"auths": {{"{key}": {{"auth": "{}"}}}}}}"#,
                b64("hub:pw")
            );
            for image in ["busybox", "library/busybox:1", "docker.io/org/img"] {
                let c = auths_for(&json, image).unwrap_or_else(|| panic!("{key} for {image}"));
                assert_eq!(user_pass(&c), (Some("hub"), Some("pw")));
                assert_eq!(c.server, DOCKER_HUB_SERVER);
            }
        }
    }

    #[test]
    fn keys_with_a_scheme_or_path_match_by_host() {
        for key in [
            "https://registry.example.com",
            "http://registry.example.com/v2/",
            "registry.example.com/v1/",
            "REGISTRY.example.com",
        ] {
            let json = format!(r#"{{"auths": {{"{key}": {{"auth": "{}"}}}}}}"#, b64("u:p"));
            assert!(
                auths_for(&json, "registry.example.com/team/img:1").is_some(),
                "{key}"
            );
        }
        // The port is part of the host.
        let json = format!(
            r#"{{"auths": {{"registry.example.com:5000": {{"auth": "{}"}}}}}}"#,
            b64("u:p")
        );
        assert!(auths_for(&json, "registry.example.com/img").is_none());
    }

    #[test]
    fn an_exact_key_wins_over_a_host_match() {
        let json = format!(
            r#"{{"auths": {{"https://r.test/v1/": {{"auth": "{}"}}, "r.test": {{"auth": "{}"}}}}}}"#,
            b64("by-host:p"),
            b64("exact:p")
        );
        let c = auths_for(&json, "r.test/img").expect("credential");
        assert_eq!(c.username.as_deref(), Some("exact"));
    }

    #[test]
    fn an_unknown_registry_gets_no_credentials() {
        let json = format!(
            r#"{{"auths": {{"ghcr.io": {{"auth": "{}"}}, "https://index.docker.io/v1/": {{"auth": "{}"}}}}}}"#,
            b64("u:p"),
            b64("hub:p")
        );
        assert!(auths_for(&json, "quay.io/org/img").is_none());
        assert!(auths_for(&json, "127.0.0.1:5000/img").is_none());
        // `ghcr.io` in a Hub path is not the ghcr.io registry.
        assert_eq!(
            auths_for(&json, "ghcrio/img").and_then(|c| c.username),
            Some("hub".to_string())
        );
        assert!(auths_for(r#"{"auths": {"quay.io": {}}}"#, "quay.io/img").is_none());
        assert!(auths_for("{}", "busybox").is_none());
        assert!(auths_for("", "busybox").is_none());
    }

    #[test]
    fn helpers_are_chosen_per_registry_then_the_store() {
        let c = config(
            r#"{"credsStore": "desktop", "credHelpers": {"ghcr.io": "gh", "https://index.docker.io/v1/": "hub", "r.test": ""}}"#,
        );
        let helper = |image| helper_for(&c, &Registry::of_image(image));
        assert_eq!(helper("ghcr.io/a/b").as_deref(), Some("gh"));
        assert_eq!(helper("busybox").as_deref(), Some("hub"));
        assert_eq!(helper("quay.io/a").as_deref(), Some("desktop"));
        // An empty entry falls back to the store, as in the CLI.
        assert_eq!(helper("r.test/a").as_deref(), Some("desktop"));
        let no_store = config(r#"{"credHelpers": {"ghcr.io": "gh"}, "credsStore": ""}"#);
        assert_eq!(
            helper_for(&no_store, &Registry::of_image("quay.io/a")),
            None
        );
    }

    #[test]
    fn helper_answers_are_parsed() {
        let ok = br#"{"ServerURL": "r.test", "Username": "alice", "Secret": "s3"}"#;
        assert_eq!(
            parse_helper_answer(true, ok),
            Ok(Some(("alice".into(), "s3".into())))
        );
        assert_eq!(
            parse_helper_answer(false, b"credentials not found in native keychain\n"),
            Ok(None)
        );
        assert_eq!(parse_helper_answer(false, b"boom"), Err(()));
        assert_eq!(parse_helper_answer(true, b"not json"), Err(()));
        assert_eq!(parse_helper_answer(true, br#"{"Username": "u"}"#), Err(()));
        let token = credential(
            &Registry::of_image("r.test/i"),
            CredentialSource::Helper("x".into()),
            "<token>".into(),
            "refresh".into(),
        );
        assert_eq!(user_pass(&token), (None, None));
        assert_eq!(
            token.identity_token.as_ref().map(Secret::expose),
            Some("refresh")
        );
    }

    #[test]
    fn debug_and_errors_never_show_a_secret() {
        let c = credential(
            &Registry::of_image("r.test/i"),
            CredentialSource::Auths,
            "alice".into(),
            "hunter2-secret".into(),
        );
        assert!(!format!("{c:?}").contains("hunter2"), "{c:?}");
        // serde would quote the value that has the wrong type.
        let e = parse_config(br#"{"auths": {"r.test": "hunter2-secret"}}"#)
            .err()
            .expect("malformed");
        let ours = CredentialError::Malformed {
            path: "/c.json".into(),
            line: e.line(),
            column: e.column(),
        };
        assert!(!ours.to_string().contains("hunter2"), "{ours}");
    }

    /// A directory with `config.json` and helper scripts, removed on drop.
    struct Dir(PathBuf);

    impl Dir {
        fn new(tag: &str) -> Self {
            let p = std::env::temp_dir().join(format!(
                "daiv-cred-{tag}-{}-{}",
                std::process::id(),
                rand::random::<u32>()
            ));
            std::fs::create_dir_all(&p).expect("temp dir");
            Self(p)
        }

        fn write(&self, name: &str, content: &str) {
            std::fs::write(self.0.join(name), content).expect("write");
        }

        fn helper(&self, name: &str, script: &str) {
            use std::os::unix::fs::PermissionsExt;
            let path = self.0.join(format!("docker-credential-{name}"));
            std::fs::write(&path, format!("#!/bin/sh\n{script}\n")).expect("write");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        }

        fn store(&self) -> CredentialStore {
            let mut s = CredentialStore::in_dir(&self.0);
            // This directory first, then the usual PATH (the scripts need `sleep`).
            let inherited = std::env::var_os("PATH").unwrap_or_default();
            let dirs = std::iter::once(self.0.clone()).chain(std::env::split_paths(&inherited));
            s.helper_path = std::env::join_paths(dirs).ok();
            s.helper_timeout = Duration::from_secs(2);
            s
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[tokio::test]
    async fn the_file_is_read_again_at_every_lookup() {
        let d = Dir::new("reread");
        let store = d.store();
        assert!(
            store
                .for_image("r.test/i")
                .await
                .expect("no file")
                .is_none()
        );
        let write = |user: &str| {
            d.write(
                "config.json",
                &format!(
                    r#"{{"auths": {{"r.test": {{"auth": "{}"}}}}}}"#,
                    b64(&format!("{user}:pw"))
                ),
            )
        };
        write("first");
        let c = store.for_image("r.test/i").await.expect("lookup");
        assert_eq!(c.and_then(|c| c.username).as_deref(), Some("first"));
        write("second");
        let c = store.for_image("r.test/i").await.expect("lookup");
        assert_eq!(c.and_then(|c| c.username).as_deref(), Some("second"));
        d.write("config.json", "{not json");
        assert!(matches!(
            store.for_image("r.test/i").await,
            Err(CredentialError::Malformed { .. })
        ));
    }

    #[tokio::test]
    async fn a_helper_is_asked_with_the_server_on_stdin() {
        let d = Dir::new("helper");
        // Answers only for the server it is asked about, as real helpers do.
        d.helper(
            "test",
            r#"[ "$1" = get ] || exit 3
read -r server || true
case "$server" in
  r.test) echo '{"ServerURL":"r.test","Username":"alice","Secret":"from-helper"}' ;;
  https://index.docker.io/v1/) echo '{"Username":"<token>","Secret":"hub-refresh"}' ;;
  *) echo 'credentials not found in native keychain'; exit 1 ;;
esac"#,
        );
        d.write(
            "config.json",
            &format!(
                r#"{{"credsStore": "test", "auths": {{"r.test": {{"auth": "{}"}}}}}}"#,
                b64("ignored:because-helper")
            ),
        );
        let store = d.store();
        let c = store
            .for_image("r.test/i:1")
            .await
            .expect("lookup")
            .expect("credential");
        assert_eq!(user_pass(&c), (Some("alice"), Some("from-helper")));
        assert_eq!(c.source, CredentialSource::Helper("test".into()));
        let hub = store
            .for_image("busybox")
            .await
            .expect("lookup")
            .expect("credential");
        assert_eq!(
            hub.identity_token.as_ref().map(Secret::expose),
            Some("hub-refresh")
        );
        assert!(
            store
                .for_image("quay.io/x")
                .await
                .expect("not found")
                .is_none()
        );
    }

    #[tokio::test]
    async fn a_missing_failing_or_hung_helper_is_an_error_without_its_output() {
        let d = Dir::new("badhelper");
        d.helper("loud", "echo 'hunter2-secret'; exit 2");
        d.helper("garbled", "echo 'hunter2-secret'");
        d.helper("hung", "exec sleep 30");
        let store = d.store();
        for (name, want) in [
            ("absent", "cannot run it"),
            ("loud", "failed"),
            ("garbled", "not {\"Username\",\"Secret\"}"),
            ("hung", "no answer within"),
            ("../../bin/sh", "not a valid helper name"),
        ] {
            d.write("config.json", &format!(r#"{{"credsStore": "{name}"}}"#));
            let e = store.for_image("r.test/i").await.expect_err(name);
            let text = e.to_string();
            assert!(text.contains(want), "{name}: {text}");
            assert!(!text.contains("hunter2"), "{name}: {text}");
        }
    }
}
