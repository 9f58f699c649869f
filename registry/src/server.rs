//! `host registry serve`: an rlhost registry over HTTP (axum), backed by a directory registry.
//!
//! | route | what |
//! |---|---|
//! | `GET /config.json` | download template and accepted publisher keys |
//! | `GET /index/{owner}/{name}` | the package's index file (JSON lines) |
//! | `GET /artifacts/{cksum}.rlpkg` | a package, content-addressed |
//! | `GET /api/v1/packages` | every `owner/name` |
//! | `GET /api/v1/search?q=` | newest version of matching packages |
//! | `PUT /api/v1/publish?sig=&key=[&min_host=]` | upload a signed package (bearer token of its owner) |
//! | `POST /api/v1/yank` | `{"name", "version", "yanked"}` (bearer token of the owner) |
//! | `PUT /api/v1/evals?sig=&key=` | publish an evaluation summary (bearer token of the publisher) |
//! | `GET /` `?q=` | the hub: search box, environments and reward functions (HTML) |
//! | `GET /{owner}` | one publisher's keys and packages (HTML) |
//! | `GET /{owner}/{name}` `?version=` | a package: README, versions, signature, data, evaluations (HTML) |
//! | `GET /{owner}/{name}/evals/{id}.json` | a published evaluation's summary, the exact bytes signed |
//! | `GET /api/v1/hub?q=`, `/api/v1/owners/{owner}`, `/api/v1/packages/{owner}/{name}` | the pages' data as JSON |
//! | `GET /static/{file}` | the pages' stylesheet, script and icon |
//!
//! The HTML pages answer JSON (the same data) to `Accept: application/json`. Pages carry a
//! strict Content-Security-Policy (nothing from elsewhere, no inline script), an ETag and
//! `Cache-Control: no-cache` (revalidated, answered 304 when unchanged); content-addressed
//! artifacts and versioned static files are immutable.
//!
//! Errors are JSON `{"error": …}` with 400 (invalid package, name, key or signature, naming the
//! field), 401 (no or unknown token), 403 (another owner's package, or a key not accepted for the
//! owner), 404, 408 (a body that did not arrive in time), 409 (version exists with other bytes),
//! 413 (upload over the size limit) and 500. No error body names a path of the server: internal
//! failures are logged and answered with a generic message.
//!
//! Every package name in a route or a body passes [`PackageName`]'s check before anything else,
//! so it never reaches the filesystem unless it is exactly `owner/name` slugs. Every write route
//! (publish, yank, evaluations) authenticates its bearer token from the headers before anything
//! else: before its query is parsed and before a byte of its body is read, so an unauthenticated
//! client learns nothing but 401 and holds no upload turn. Then a declared length over the limit
//! is a 413, still unread; at most [`MAX_CONCURRENT_UPLOADS`] bodies are read at once, and the
//! accept loop ([`rlhost_serve`]) caps connections and gives headers and bodies deadlines.
//!
//! Keys and signatures are stored canonical (lowercase hex, [`crate::sign`]): a malformed `sig`
//! or `key` is a 400 naming it. Anything stored that goes into a header is checked again on the
//! way out, so a stored value can never turn an answer into a 500.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Path as UrlPath, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use rlhost_serve::ServeLimits;

use crate::dir::DirRegistry;
use crate::error::RegistryError;
use crate::hub::render::{Pages, asset, asset_version};
use crate::hub::{Hub, HubError};
use crate::name::PackageName;
use crate::package::PackageError;
use crate::tokens::TokenStore;

/// Owner names no package may use: the first segment of the server's own routes, which would
/// hide the owner's pages (`/static/x` is a file, not the package `static/x`).
pub const RESERVED_OWNERS: &[&str] = &["api", "static", "index", "artifacts"];

/// Largest upload accepted.
pub const MAX_UPLOAD_BYTES: usize = 256 << 20;
/// Largest body of any other request (a yank).
pub const MAX_REQUEST_BYTES: usize = 64 << 10;
/// Uploads whose bodies are read at once; later ones wait (authenticated) for a turn, so memory
/// stays under `MAX_CONCURRENT_UPLOADS * MAX_UPLOAD_BYTES` whatever the number of clients.
pub const MAX_CONCURRENT_UPLOADS: usize = 2;

struct AppState {
    registry: DirRegistry,
    hub: Hub,
    pages: Pages,
    root: PathBuf,
    uploads: tokio::sync::Semaphore,
}

type Shared = Arc<AppState>;

/// An error answer: a status and a message, sent as `{"error": message}`.
struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": self.1 }).to_string();
        let mut response =
            (self.0, [(header::CONTENT_TYPE, "application/json")], body).into_response();
        if self.0 == StatusCode::UNAUTHORIZED {
            // RFC 9110: a 401 names the scheme that would have worked.
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
        }
        response
    }
}

fn api_error(status: StatusCode, message: impl std::fmt::Display) -> ApiError {
    ApiError(status, message.to_string())
}

fn error(status: StatusCode, message: impl std::fmt::Display) -> Response {
    api_error(status, message).into_response()
}

/// What a client is told about a registry failure. Failures of the server itself (its files,
/// its data) are logged in full and answered with a generic 500 that names no path; the
/// client's own mistakes are explained, with the server's paths cut out of the message.
fn registry_api_error(state: &AppState, e: RegistryError) -> ApiError {
    let status = match &e {
        RegistryError::Conflict { .. } => StatusCode::CONFLICT,
        RegistryError::Refused { .. } => StatusCode::FORBIDDEN,
        RegistryError::Name(_) | RegistryError::Owner(_) => StatusCode::BAD_REQUEST,
        RegistryError::Malformed { .. } => StatusCode::BAD_REQUEST,
        RegistryError::NotPublished { .. } => StatusCode::NOT_FOUND,
        RegistryError::InvalidEval { .. } => StatusCode::BAD_REQUEST,
        RegistryError::Package(PackageError::Io { .. } | PackageError::Read(_)) => {
            StatusCode::INTERNAL_SERVER_ERROR
        }
        RegistryError::Package(_) => StatusCode::BAD_REQUEST,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let chain = error_chain(&e);
    if status == StatusCode::INTERNAL_SERVER_ERROR {
        tracing::error!("registry failure: {chain}");
        return api_error(
            status,
            "internal error: the registry could not handle this request (details are in the server's log)",
        );
    }
    api_error(status, redact(&chain, &state.root))
}

/// `e` and its sources as one line, `outer: inner: cause`, leaving out a source whose text the
/// line already holds (errors that print their source as well as returning it).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut chain = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !chain.contains(&text) {
            chain.push_str(": ");
            chain.push_str(&text);
        }
        source = s.source();
    }
    chain
}

/// `message` without the registry's root or the temporary folder (where uploads are unpacked).
fn redact(message: &str, root: &Path) -> String {
    let mut out = message.to_owned();
    for dir in [root.to_path_buf(), std::env::temp_dir()] {
        let shown = dir.display().to_string();
        if shown.len() > 1 {
            out = out.replace(shown.trim_end_matches('/'), "<server>");
        }
    }
    out
}

fn json(value: impl serde::Serialize) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_string(&value).expect("serialisable"),
    )
        .into_response()
}

/// The owner whose bearer token this request carries, or the error response. Reads headers only.
fn authenticate(state: &AppState, headers: &HeaderMap) -> Result<String, ApiError> {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or_else(|| api_error(StatusCode::UNAUTHORIZED, "a bearer token is required"))?;
    let tokens = TokenStore::load(&state.root).map_err(|e| registry_api_error(state, e))?;
    tokens
        .owner_of(token.trim())
        .map(str::to_owned)
        .ok_or_else(|| api_error(StatusCode::UNAUTHORIZED, "unknown token"))
}

async fn config(State(s): State<Shared>) -> Response {
    match s.registry.config() {
        Ok(c) => json(c),
        Err(e) => registry_api_error(&s, e).into_response(),
    }
}

async fn index(
    State(s): State<Shared>,
    UrlPath((owner, name)): UrlPath<(String, String)>,
) -> Response {
    // Checked before any path is built: `..%2F..` and friends are a 400, never a file read.
    let name = match PackageName::new(&owner, &name) {
        Ok(n) => n,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    match s.registry.entries(&name) {
        Ok(entries) if entries.is_empty() => {
            error(StatusCode::NOT_FOUND, format!("no package {name}"))
        }
        Ok(entries) => {
            let mut text = String::new();
            for e in entries {
                text.push_str(&serde_json::to_string(&e).expect("serialisable"));
                text.push('\n');
            }
            // Yanks and new versions change it: clients revalidate.
            ([(header::CACHE_CONTROL, "no-cache")], text).into_response()
        }
        Err(e) => registry_api_error(&s, e).into_response(),
    }
}

async fn artifact(State(s): State<Shared>, UrlPath(file): UrlPath<String>) -> Response {
    let Some(cksum) = file.strip_suffix(".rlpkg") else {
        return error(StatusCode::NOT_FOUND, "no such artifact");
    };
    if cksum.len() != 64 || !cksum.bytes().all(|b| b.is_ascii_hexdigit()) {
        return error(StatusCode::NOT_FOUND, "no such artifact");
    }
    match s.registry.artifact(cksum) {
        Ok(bytes) => (
            [
                (header::CONTENT_TYPE, "application/octet-stream"),
                // Content-addressed: these bytes never change.
                (header::CACHE_CONTROL, "public, max-age=31536000, immutable"),
            ],
            bytes,
        )
            .into_response(),
        Err(_) => error(StatusCode::NOT_FOUND, format!("no artifact {cksum}")),
    }
}

async fn packages(State(s): State<Shared>) -> Response {
    match s.registry.packages() {
        Ok(p) => json(p),
        Err(e) => registry_api_error(&s, e).into_response(),
    }
}

#[derive(serde::Deserialize)]
struct SearchQuery {
    #[serde(default)]
    q: String,
}

async fn search(State(s): State<Shared>, Query(q): Query<SearchQuery>) -> Response {
    match s.registry.search(&q.q) {
        Ok(found) => json(found),
        Err(e) => registry_api_error(&s, e).into_response(),
    }
}

#[derive(serde::Deserialize)]
struct PublishQuery {
    sig: String,
    key: String,
    min_host: Option<semver::Version>,
}

/// Refuses a body whose declared length (`content-length`) is over `limit`, from the headers
/// alone: the body is never read.
fn refuse_declared_oversize(headers: &HeaderMap, limit: usize) -> Result<(), ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    match declared {
        Some(n) if n > limit as u64 => Err(too_large(limit)),
        _ => Ok(()),
    }
}

fn too_large(limit: usize) -> ApiError {
    api_error(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("uploads here are limited to {limit} bytes"),
    )
}

/// Reads a request's body, at most `limit` bytes: a body that stalls past the body deadline is a
/// 408, one over the limit a 413, one that breaks off a 400.
async fn read_body(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        let mut source: Option<&dyn std::error::Error> = Some(&e);
        while let Some(err) = source {
            if err.is::<rlhost_serve::BodyTimeout>() {
                return api_error(StatusCode::REQUEST_TIMEOUT, err);
            }
            if err.is::<http_body_util::LengthLimitError>() {
                return too_large(limit);
            }
            source = err.source();
        }
        api_error(StatusCode::BAD_REQUEST, format!("reading the request: {e}"))
    })
}

/// Reads an upload's body once its sender is known and its headers were checked
/// ([`refuse_declared_oversize`]): at most [`MAX_CONCURRENT_UPLOADS`] bodies are read at once.
async fn read_upload(s: &AppState, body: Body, limit: usize) -> Result<Bytes, ApiError> {
    let _turn = s
        .uploads
        .acquire()
        .await
        .expect("the semaphore is never closed");
    read_body(body, limit).await
}

/// Runs a write to the registry (file I/O under its lock) off the async workers; answers its
/// result as JSON or its error.
async fn write_blocking<T: serde::Serialize + Send + 'static>(
    s: Shared,
    write: impl FnOnce(&AppState) -> Result<T, ApiError> + Send + 'static,
) -> Response {
    match tokio::task::spawn_blocking(move || write(&s)).await {
        Ok(Ok(value)) => json(value),
        Ok(Err(e)) => e.into_response(),
        Err(e) => {
            tracing::error!("registry write task failed: {e}");
            error(StatusCode::INTERNAL_SERVER_ERROR, "internal error")
        }
    }
}

/// What a write route may do before it knows who sends it: nothing. The token, from the headers
/// alone, comes before the query is parsed and before the body is read, so an unauthenticated
/// request is a 401 whatever else it carries, and its body (perhaps announced and never sent)
/// holds no upload turn. Then a declared length over `limit` is a 413, still unread.
fn authorise_write(s: &AppState, headers: &HeaderMap, limit: usize) -> Result<String, ApiError> {
    let owner = authenticate(s, headers)?;
    refuse_declared_oversize(headers, limit)?;
    Ok(owner)
}

/// A write route's query, parsed once its sender is known.
fn write_query<T>(q: PageQuery<T>) -> Result<T, ApiError> {
    q.map(|Query(q)| q)
        .map_err(|e| api_error(StatusCode::BAD_REQUEST, e.body_text()))
}

async fn publish(
    State(s): State<Shared>,
    headers: HeaderMap,
    q: PageQuery<PublishQuery>,
    body: Body,
) -> Response {
    let prepared = authorise_write(&s, &headers, MAX_UPLOAD_BYTES)
        .and_then(|owner| Ok((owner, write_query(q)?)))
        .and_then(|(owner, q)| {
            // A signature or key that cannot be one is refused from the query, before the
            // package is read (whether it verifies needs the package).
            let malformed = |param: &str, e: crate::sign::SignError| {
                api_error(
                    StatusCode::BAD_REQUEST,
                    format!("cannot publish: malformed `{param}`: {e}"),
                )
            };
            crate::sign::canonical_signature(&q.sig).map_err(|e| malformed("sig", e))?;
            crate::sign::canonical_public_key(&q.key).map_err(|e| malformed("key", e))?;
            Ok((owner, q))
        });
    let (owner, q) = match prepared {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let body = match read_upload(&s, body, MAX_UPLOAD_BYTES).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    write_blocking(s, move |state| {
        // Read the manifest first: a token may publish only under its own owner.
        let manifest = state
            .registry
            .read_package(&body)
            .map_err(|e| registry_api_error(state, e))?;
        if manifest.plugin.owner != owner {
            return Err(api_error(
                StatusCode::FORBIDDEN,
                format!(
                    "this token publishes for {owner:?}, not for {:?}",
                    manifest.plugin.owner
                ),
            ));
        }
        state
            .registry
            .add(&body, &manifest, &q.sig, &q.key, q.min_host)
            .map_err(|e| registry_api_error(state, e))
    })
    .await
}

#[derive(serde::Deserialize)]
struct YankBody {
    name: String,
    version: semver::Version,
    yanked: bool,
}

async fn yank(State(s): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    let owner = match authorise_write(&s, &headers, MAX_REQUEST_BYTES) {
        Ok(o) => o,
        Err(e) => return e.into_response(),
    };
    // Small: read without an upload turn, so a yank never waits behind a package.
    let body = match read_body(body, MAX_REQUEST_BYTES).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let req: YankBody = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    let name = match req.name.parse::<PackageName>() {
        Ok(n) => n,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    if name.owner() != owner {
        return error(
            StatusCode::FORBIDDEN,
            format!("this token acts for {owner:?}, not for {name}"),
        );
    }
    match s.registry.yank(&name, &req.version, req.yanked) {
        Ok(()) => json(serde_json::json!({"ok": true})),
        Err(e) => registry_api_error(&s, e).into_response(),
    }
}

/// The security headers of every page: nothing loads from elsewhere, no inline script runs,
/// no framing, no referrer (`safe_headers` adds `nosniff` to every answer).
const PAGE_HEADERS: [(header::HeaderName, &str); 3] = [
    (
        header::CONTENT_SECURITY_POLICY,
        "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self'; \
         form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
    ),
    (header::REFERRER_POLICY, "no-referrer"),
    (header::X_FRAME_OPTIONS, "DENY"),
];

/// Whether the client prefers JSON to HTML: `application/json` with a higher quality than
/// `text/html` (RFC 9110 q-values; `*/*` and a missing header mean HTML).
fn wants_json(headers: &HeaderMap) -> bool {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let quality = |wanted: &str| -> f32 {
        accept
            .split(',')
            .filter_map(|item| {
                let mut parts = item.split(';');
                let media = parts.next()?.trim().to_ascii_lowercase();
                let q = parts
                    .filter_map(|p| p.trim().strip_prefix("q="))
                    .find_map(|q| q.trim().parse::<f32>().ok())
                    .unwrap_or(1.0);
                (media == wanted).then_some(q)
            })
            .fold(0.0, f32::max)
    };
    let json = quality("application/json");
    json > 0.0 && json > quality("text/html")
}

/// Whether `If-None-Match` names `etag` (weakly: `W/"…"` matches `"…"`, as RFC 9110 says).
fn etag_matches(headers: &HeaderMap, etag: &str) -> bool {
    headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(',')
                .map(str::trim)
                .any(|t| t == "*" || t.strip_prefix("W/").unwrap_or(t) == etag)
        })
}

/// Headers every answer carries: no sniffing, and (unless the answer set its own, as pages do)
/// a policy under which nothing in it runs or loads.
async fn safe_headers(mut response: Response) -> Response {
    let h = response.headers_mut();
    h.entry(header::X_CONTENT_TYPE_OPTIONS)
        .or_insert(header::HeaderValue::from_static("nosniff"));
    h.entry(header::CONTENT_SECURITY_POLICY)
        .or_insert(header::HeaderValue::from_static(
            "default-src 'none'; frame-ancestors 'none'",
        ));
    response
}

/// A page or its JSON twin, with an ETag (answered 304 when the client has it) and
/// `Cache-Control: no-cache` (pages change when packages are published or yanked).
fn page(headers: &HeaderMap, status: StatusCode, content_type: &str, body: String) -> Response {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(body.as_bytes());
    let etag = format!(
        "\"{}\"",
        digest[..12]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    );
    let fresh = status == StatusCode::OK && etag_matches(headers, &etag);
    let mut response = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        (status, body).into_response()
    };
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, content_type.parse().expect("valid"));
    h.insert(header::CACHE_CONTROL, "no-cache".parse().expect("valid"));
    h.insert(header::ETAG, etag.parse().expect("hex"));
    h.insert(header::VARY, "Accept".parse().expect("valid"));
    for (name, value) in PAGE_HEADERS {
        h.insert(name, value.parse().expect("valid"));
    }
    response
}

/// Answers a hub page: its HTML, or its data as JSON when asked, or the error page.
async fn hub_page<T: serde::Serialize + Send + 'static>(
    s: Shared,
    headers: HeaderMap,
    build: impl FnOnce(&Hub) -> Result<T, HubError> + Send + 'static,
    html: impl FnOnce(&Pages, &T) -> String + Send + 'static,
) -> Response {
    let json_wanted = wants_json(&headers);
    let state = s.clone();
    let result = tokio::task::spawn_blocking(move || {
        build(&state.hub).map(|data| match json_wanted {
            true => serde_json::to_string_pretty(&data).expect("serialisable"),
            false => html(&state.pages, &data),
        })
    })
    .await;
    let (status, message) = match result {
        Ok(Ok(body)) => {
            let kind = match json_wanted {
                true => "application/json",
                false => "text/html; charset=utf-8",
            };
            return page(&headers, StatusCode::OK, kind, body);
        }
        Ok(Err(HubError::NotFound(m))) => (StatusCode::NOT_FOUND, m),
        Ok(Err(HubError::Registry(e))) => {
            let ApiError(status, m) = registry_api_error(&s, e);
            (status, m)
        }
        Err(e) => {
            tracing::error!("page task failed: {e}");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal error".to_owned(),
            )
        }
    };
    page_error(&s, &headers, status, &message)
}

/// An error as the client reads pages: JSON `{"error"}` or the error page.
fn page_error(s: &AppState, headers: &HeaderMap, status: StatusCode, message: &str) -> Response {
    if wants_json(headers) {
        return api_error(status, message).into_response();
    }
    let body = s.pages.error(status.as_u16(), message);
    page(headers, status, "text/html; charset=utf-8", body)
}

#[derive(serde::Deserialize)]
struct VersionQuery {
    version: Option<semver::Version>,
}

type PageQuery<T> = Result<Query<T>, axum::extract::rejection::QueryRejection>;
type PagePath<T> = Result<UrlPath<T>, axum::extract::rejection::PathRejection>;

/// Forces the JSON answer (the `/api/v1/…` twins of the pages).
fn as_json(mut headers: HeaderMap) -> HeaderMap {
    headers.insert(
        header::ACCEPT,
        header::HeaderValue::from_static("application/json"),
    );
    headers
}

async fn hub_index(
    State(s): State<Shared>,
    headers: HeaderMap,
    q: PageQuery<SearchQuery>,
) -> Response {
    let query = match q {
        Ok(Query(q)) => q.q.trim().to_owned(),
        Err(e) => return page_error(&s, &headers, StatusCode::BAD_REQUEST, &e.body_text()),
    };
    hub_page(s, headers, move |hub| hub.index(&query), Pages::index).await
}

async fn hub_index_json(
    state: State<Shared>,
    headers: HeaderMap,
    q: PageQuery<SearchQuery>,
) -> Response {
    hub_index(state, as_json(headers), q).await
}

async fn hub_owner(
    State(s): State<Shared>,
    headers: HeaderMap,
    owner: PagePath<String>,
) -> Response {
    let owner = match owner {
        Ok(UrlPath(o)) if crate::name::is_slug(&o) => o,
        _ => return page_error(&s, &headers, StatusCode::NOT_FOUND, "no such page"),
    };
    hub_page(s, headers, move |hub| hub.owner(&owner), Pages::owner).await
}

async fn hub_owner_json(
    state: State<Shared>,
    headers: HeaderMap,
    owner: PagePath<String>,
) -> Response {
    hub_owner(state, as_json(headers), owner).await
}

async fn hub_package(
    State(s): State<Shared>,
    headers: HeaderMap,
    path: PagePath<(String, String)>,
    q: PageQuery<VersionQuery>,
) -> Response {
    let Ok(UrlPath((owner, name))) = path else {
        return page_error(&s, &headers, StatusCode::NOT_FOUND, "no such page");
    };
    let name = match PackageName::new(&owner, &name) {
        Ok(n) => n,
        Err(e) => return page_error(&s, &headers, StatusCode::BAD_REQUEST, &e.to_string()),
    };
    let version = match q {
        Ok(Query(q)) => q.version,
        Err(e) => {
            let message = format!("?version= must be a semver version ({})", e.body_text());
            return page_error(&s, &headers, StatusCode::BAD_REQUEST, &message);
        }
    };
    hub_page(
        s,
        headers,
        move |hub| hub.package(&name, version.as_ref()),
        Pages::package,
    )
    .await
}

async fn hub_package_json(
    state: State<Shared>,
    headers: HeaderMap,
    path: PagePath<(String, String)>,
    q: PageQuery<VersionQuery>,
) -> Response {
    hub_package(state, as_json(headers), path, q).await
}

/// A published evaluation's summary: the exact bytes its publisher signed, with the signature
/// and key in headers so anyone can check them.
async fn eval_summary(
    State(s): State<Shared>,
    UrlPath((owner, name, file)): UrlPath<(String, String, String)>,
) -> Response {
    let Ok(name) = PackageName::new(&owner, &name) else {
        return error(StatusCode::NOT_FOUND, "no such evaluation");
    };
    let Some(id) = file.strip_suffix(".json") else {
        return error(StatusCode::NOT_FOUND, "no such evaluation");
    };
    match s.registry.eval(&name, id) {
        Ok(Some(e)) => {
            let mut response = (
                [
                    (header::CONTENT_TYPE, "application/json"),
                    (header::CACHE_CONTROL, "public, max-age=31536000, immutable"),
                ],
                e.summary,
            )
                .into_response();
            // Stored values go into headers only in a form that cannot fail there: the key and
            // signature canonical (one stored before they were canonicalised on the way in
            // still serves), the publisher a publisher name. A value that is neither is left
            // out and logged: the summary is still served, and a client finds it unsigned.
            let values = [
                (
                    "x-rlhost-signature",
                    crate::sign::canonical_signature(&e.sig).map_err(|e| e.to_string()),
                ),
                (
                    "x-rlhost-key",
                    crate::sign::canonical_public_key(&e.key).map_err(|e| e.to_string()),
                ),
                (
                    "x-rlhost-publisher",
                    crate::name::check_owner(&e.publisher)
                        .map(|()| e.publisher.clone())
                        .map_err(|e| e.to_string()),
                ),
            ];
            for (field, value) in values {
                let value = value
                    .and_then(|v| header::HeaderValue::from_str(&v).map_err(|e| e.to_string()));
                match value {
                    Ok(v) => {
                        response
                            .headers_mut()
                            .insert(header::HeaderName::from_static(field), v);
                    }
                    Err(why) => tracing::error!(
                        "evaluation {id} of {name}: the stored value for {field} is left out: {why}"
                    ),
                }
            }
            response
        }
        Ok(None) => error(
            StatusCode::NOT_FOUND,
            format!("no evaluation {id} of {name}"),
        ),
        Err(e) => registry_api_error(&s, e).into_response(),
    }
}

#[derive(serde::Deserialize)]
struct EvalQuery {
    sig: Option<String>,
    key: Option<String>,
}

async fn publish_eval(
    State(s): State<Shared>,
    headers: HeaderMap,
    q: PageQuery<EvalQuery>,
    body: Body,
) -> Response {
    let prepared = authorise_write(&s, &headers, crate::evals::MAX_EVAL_BYTES).and_then(|owner| {
        let (Some(sig), Some(key)) = write_query(q).map(|q| (q.sig, q.key))? else {
            return Err(api_error(
                StatusCode::BAD_REQUEST,
                "an evaluation must be signed: give sig and key (host eval --publish --key FILE signs it)",
            ));
        };
        Ok((owner, sig, key))
    });
    let (owner, sig, key) = match prepared {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let body = match read_upload(&s, body, crate::evals::MAX_EVAL_BYTES).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    write_blocking(s, move |state| {
        state
            .registry
            .add_eval(&body, &sig, &key, Some(&owner))
            .map_err(|e| registry_api_error(state, e))
    })
    .await
}

#[derive(serde::Deserialize)]
struct AssetQuery {
    v: Option<String>,
}

async fn static_file(UrlPath(file): UrlPath<String>, Query(q): Query<AssetQuery>) -> Response {
    let Some(a) = asset(&file) else {
        return error(StatusCode::NOT_FOUND, "no such file");
    };
    // Pages link `?v=<hash of the files>`: that URL's bytes never change.
    let cache = match q.v.as_deref() == Some(asset_version()) {
        true => "public, max-age=31536000, immutable",
        false => "public, max-age=300",
    };
    (
        [
            (header::CONTENT_TYPE, a.content_type),
            (header::CACHE_CONTROL, cache),
        ],
        a.bytes,
    )
        .into_response()
}

/// The router over the directory registry at `root`.
pub fn router(root: &Path) -> Result<Router, RegistryError> {
    let registry = DirRegistry::open(root, false)?;
    // Messages are redacted by the root's full path (a relative `reg` would cut words).
    let root = &root.canonicalize().unwrap_or_else(|_| root.to_owned());
    let state = Arc::new(AppState {
        hub: Hub::new(registry.clone()),
        pages: Pages::new(),
        registry,
        root: root.to_owned(),
        uploads: tokio::sync::Semaphore::new(MAX_CONCURRENT_UPLOADS),
    });
    Ok(Router::new()
        .route("/config.json", get(config))
        .route("/index/{owner}/{name}", get(index))
        .route("/artifacts/{file}", get(artifact))
        .route("/api/v1/packages", get(packages))
        .route("/api/v1/search", get(search))
        .route("/api/v1/publish", put(publish))
        .route("/api/v1/yank", post(yank))
        .route("/api/v1/evals", put(publish_eval))
        .route("/api/v1/hub", get(hub_index_json))
        .route("/api/v1/owners/{owner}", get(hub_owner_json))
        .route("/api/v1/packages/{owner}/{name}", get(hub_package_json))
        .route("/", get(hub_index))
        .route("/static/{file}", get(static_file))
        .route("/{owner}", get(hub_owner))
        .route("/{owner}/{name}", get(hub_package))
        .route("/{owner}/{name}/evals/{file}", get(eval_summary))
        .fallback(|| async { error(StatusCode::NOT_FOUND, "no such route") })
        .layer(DefaultBodyLimit::max(MAX_REQUEST_BYTES))
        .layer(axum::middleware::map_response(safe_headers))
        .with_state(state))
}

/// Serves the registry at `root` on `listener` under `limits` until `shutdown` resolves.
pub async fn serve(
    root: &Path,
    listener: tokio::net::TcpListener,
    limits: ServeLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RegistryError> {
    let app = router(root)?;
    rlhost_serve::serve(listener, app, limits, shutdown)
        .await
        .map_err(|e| RegistryError::Io {
            root: root.display().to_string(),
            path: "(server)".into(),
            source: e,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::ACCEPT, value.parse().unwrap());
        h
    }

    #[test]
    fn json_is_chosen_by_quality() {
        for (value, json) in [
            ("application/json", true),
            ("text/html", false),
            ("*/*", false),
            ("text/html,application/xhtml+xml,*/*;q=0.8", false),
            ("application/json;q=0", false),
            ("text/html;q=0, application/json", true),
            ("application/json;q=0.5, text/html;q=0.9", false),
            ("application/jsonp", false),
            ("", false),
        ] {
            assert_eq!(wants_json(&accept(value)), json, "{value}");
        }
    }

    /// A registry served on a free loopback port with one publisher, `acme`, its key and token,
    /// and `acme/demo@0.1.0` published; stopped when dropped.
    struct Served {
        addr: std::net::SocketAddr,
        root: PathBuf,
        key: crate::PublisherKey,
        token: String,
        stop: Option<tokio::sync::oneshot::Sender<()>>,
        _dir: tempfile::TempDir,
    }

    impl Drop for Served {
        fn drop(&mut self) {
            if let Some(stop) = self.stop.take() {
                let _ = stop.send(());
            }
        }
    }

    /// `.rlpkg` bytes of `acme/demo@{version}`.
    fn demo_package(version: &str) -> Vec<u8> {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("plugin.toml"),
            format!(
                "[plugin]\nowner = \"acme\"\nname = \"demo\"\nversion = \"{version}\"\n\
                 kind = \"environment\"\nabi = \"rlhost:env@0.1.0\"\nruntime = \"wasm\"\n"
            ),
        )
        .unwrap();
        std::fs::write(dir.path().join("plugin.wasm"), b"\0asm fake").unwrap();
        crate::package::pack(dir.path()).unwrap().0
    }

    async fn serve_registry() -> Served {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("registry");
        let registry = DirRegistry::open(&root, true).unwrap();
        let key = crate::PublisherKey::generate().unwrap();
        registry.add_key("acme", &key.public_hex()).unwrap();
        registry
            .publish(&demo_package("0.1.0"), &key, None)
            .unwrap();
        let token = TokenStore::issue(&root, "acme").unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served_root = root.clone();
        tokio::spawn(async move {
            let shutdown = async {
                let _ = stopped.await;
            };
            serve(&served_root, listener, ServeLimits::default(), shutdown)
                .await
                .unwrap();
        });
        Served {
            addr,
            root,
            key,
            token,
            stop: Some(stop),
            _dir: dir,
        }
    }

    /// Generous: a body read before the token is checked waits for the 120 s body deadline.
    const PROMPTLY: std::time::Duration = std::time::Duration::from_secs(30);

    /// Sends `head` (a request head announcing a body) and never the body, keeping the
    /// connection open; the status, headers and body of the answer.
    async fn ask_without_body(addr: std::net::SocketAddr, head: &str) -> (u16, String, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream.write_all(head.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        tokio::time::timeout(PROMPTLY, stream.read_to_end(&mut answer))
            .await
            .unwrap_or_else(|_| panic!("no answer within {PROMPTLY:?} to {head:?}"))
            .unwrap();
        let text = String::from_utf8_lossy(&answer).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status = head
            .get(9..12)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("not an HTTP answer: {text:?}"));
        (status, head.to_ascii_lowercase(), body.to_owned())
    }

    /// Unauthenticated bodies were read (or their query judged) before the token was checked:
    /// 3,000 slow senders held the server. Every write route answers 401 from the headers, with
    /// a body announced and never sent, whatever its query, and holds no upload turn.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn write_routes_answer_401_from_the_headers_without_reading_the_body() {
        let served = serve_registry().await;
        let addr = served.addr;
        let routes = [
            ("PUT", "/api/v1/publish?sig=00&key=00", 200u64 << 20),
            // No query, or a bad one: still a 401, not a 400 telling a stranger what is wrong.
            ("PUT", "/api/v1/publish", 200 << 20),
            (
                "PUT",
                "/api/v1/publish?sig=1&key=2&min_host=not-semver",
                200 << 20,
            ),
            ("PUT", "/api/v1/evals?sig=00&key=00", 200 << 10),
            ("PUT", "/api/v1/evals", 200 << 10),
            ("POST", "/api/v1/yank", 60 << 10),
        ];
        for (method, path, length) in routes {
            for auth in [
                "",
                "authorization: Bearer not-a-token\r\n",
                "authorization: Basic eDp5\r\n",
            ] {
                let head = format!(
                    "{method} {path} HTTP/1.1\r\nhost: {addr}\r\n{auth}content-length: {length}\r\n\r\n"
                );
                let (status, headers, body) = ask_without_body(addr, &head).await;
                assert_eq!(status, 401, "{method} {path} [{auth}]: {body}");
                assert!(headers.contains("www-authenticate: bearer"), "{headers}");
                assert!(body.contains("token"), "{body}");
            }
        }
        // Authenticated, a publish whose signature or key cannot be one is a 400 from the query,
        // before its (never sent) package is read.
        for query in ["sig=00&key=00", "sig=zz&key=00"] {
            let head = format!(
                "PUT /api/v1/publish?{query} HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {}\r\ncontent-length: {}\r\n\r\n",
                served.token,
                200u64 << 20
            );
            let (status, _, body) = ask_without_body(addr, &head).await;
            assert_eq!(status, 400, "{query}: {body}");
            assert!(body.contains("malformed `sig`"), "{query}: {body}");
        }
        // Stalled unauthenticated uploads, more than there are upload turns, stay open while a
        // publisher uploads: the publisher is not kept waiting for them.
        let mut stalled = Vec::new();
        for _ in 0..MAX_CONCURRENT_UPLOADS * 4 {
            use tokio::io::AsyncWriteExt;
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            let head = format!(
                "PUT /api/v1/evals?sig=00&key=00 HTTP/1.1\r\nhost: {addr}\r\ncontent-length: 100000\r\n\r\n"
            );
            s.write_all(head.as_bytes()).await.unwrap();
            stalled.push(s);
        }
        let registry = crate::http::HttpRegistry::new(&format!("http://{addr}"));
        let packed = demo_package("0.2.0");
        let cksum = crate::package::checksum(&packed);
        let version = semver::Version::new(0, 2, 0);
        let sig = served.key.sign("acme/demo", &version, &cksum);
        let public = served.key.public_hex();
        let publication = crate::Publication {
            packed: &packed,
            sig: &sig,
            public_key: &public,
            min_host: None,
            token: Some(&served.token),
        };
        use crate::RegistryBackend;
        let entry = tokio::time::timeout(PROMPTLY, registry.publish(publication))
            .await
            .expect("an authenticated upload waited for stalled unauthenticated ones")
            .unwrap();
        assert_eq!(entry.vers, version);
        drop(stalled);
    }

    /// A summary of `acme/demo@0.1.0` as `host eval` writes it.
    fn summary_bytes(model: &str) -> Vec<u8> {
        serde_json::to_vec_pretty(&serde_json::json!({
            "plugin": "acme/demo", "plugin_version": "0.1.0", "model": model, "split": "test",
            "examples": 1, "rollouts_per_example": 1, "rollouts": 1, "reward": 1.0,
            "metrics": [["correct", 1.0]], "avg_at_k": 1.0, "pass_at_k": [[1, 1.0]],
            "date": "2025-11-28T12:00:00Z", "host_version": "0.1.0"
        }))
        .unwrap()
    }

    async fn http_put(
        served: &Served,
        path: &str,
        query: &[(&str, &str)],
        body: Vec<u8>,
    ) -> (u16, String) {
        let response = reqwest::Client::new()
            .put(format!("http://{}{path}", served.addr))
            .query(query)
            .bearer_auth(&served.token)
            .body(body)
            .send()
            .await
            .unwrap();
        (response.status().as_u16(), response.text().await.unwrap())
    }

    /// A key or signature with a non-ASCII character panicked the decoder: a 500. It is a 400
    /// naming the query parameter, on both upload routes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn malformed_keys_and_signatures_are_a_400_naming_the_parameter() {
        let served = serve_registry().await;
        let packed = demo_package("0.3.0");
        let version = semver::Version::new(0, 3, 0);
        let sig = served
            .key
            .sign("acme/demo", &version, &crate::package::checksum(&packed));
        let public = served.key.public_hex();
        // Same byte length as a good value, a two-byte character in the middle.
        let bad_key = format!("{}é{}", &public[..30], &public[32..]);
        let bad_sig = format!("{}€{}", &sig[..60], &sig[63..]);
        let summary = summary_bytes("tiny");
        let eval_sig = served.key.sign_eval(
            "acme/demo",
            &semver::Version::new(0, 1, 0),
            &crate::package::checksum(&summary),
        );
        for (path, body, sig) in [
            ("/api/v1/publish", packed.clone(), sig.as_str()),
            ("/api/v1/evals", summary.clone(), eval_sig.as_str()),
        ] {
            let (status, text) = http_put(
                &served,
                path,
                &[("sig", sig), ("key", &bad_key)],
                body.clone(),
            )
            .await;
            assert_eq!(status, 400, "{path}: {text}");
            assert!(
                text.contains("malformed `key`: invalid public key") && text.contains("U+00E9"),
                "{text}"
            );
            let (status, text) =
                http_put(&served, path, &[("sig", &bad_sig), ("key", &public)], body).await;
            assert_eq!(status, 400, "{path}: {text}");
            assert!(
                text.contains("malformed `sig`: invalid signature") && text.contains("U+20AC"),
                "{text}"
            );
        }
        // Nothing was stored.
        let registry = DirRegistry::open(&served.root, false).unwrap();
        let name: PackageName = "acme/demo".parse().unwrap();
        assert_eq!(registry.entries(&name).unwrap().len(), 1);
        assert!(registry.eval_ids(&name).unwrap().is_empty());
    }

    /// A signature sent with a trailing newline verified, was stored as sent, and its
    /// evaluation's page answered 500 for good (the value goes into a header). Keys and
    /// signatures are stored canonical and served as such.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn signatures_are_stored_canonical_and_their_evaluations_served() {
        let served = serve_registry().await;
        let public = served.key.public_hex();
        let loose_key = format!("{}\n", public.to_uppercase());
        let packed = demo_package("0.4.0");
        let version = semver::Version::new(0, 4, 0);
        let sig = served
            .key
            .sign("acme/demo", &version, &crate::package::checksum(&packed));
        let (status, text) = http_put(
            &served,
            "/api/v1/publish",
            &[("sig", &format!("{sig}\n")), ("key", &loose_key)],
            packed,
        )
        .await;
        assert_eq!(status, 200, "{text}");
        let entry: crate::IndexEntry = serde_json::from_str(&text).unwrap();
        assert_eq!(
            (entry.sig.as_deref(), entry.key.as_deref()),
            (Some(sig.as_str()), Some(public.as_str()))
        );

        let summary = summary_bytes("tiny");
        let id = crate::package::checksum(&summary);
        let v010 = semver::Version::new(0, 1, 0);
        let eval_sig = served.key.sign_eval("acme/demo", &v010, &id);
        let (status, text) = http_put(
            &served,
            "/api/v1/evals",
            &[
                ("sig", &format!("{}\n", eval_sig.to_uppercase())),
                ("key", &loose_key),
            ],
            summary.clone(),
        )
        .await;
        assert_eq!(status, 200, "{text}");
        let response = reqwest::get(format!("http://{}/acme/demo/evals/{id}.json", served.addr))
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 200);
        let header = |name: &str| response.headers()[name].to_str().unwrap().to_owned();
        assert_eq!(header("x-rlhost-signature"), eval_sig);
        assert_eq!(header("x-rlhost-key"), public);
        assert_eq!(header("x-rlhost-publisher"), "acme");
        crate::sign::verify_eval(
            &header("x-rlhost-key"),
            &header("x-rlhost-signature"),
            "acme/demo",
            &v010,
            &id,
        )
        .unwrap();
        assert_eq!(response.bytes().await.unwrap().as_ref(), summary.as_slice());
    }

    /// Evaluations stored before values were canonicalised (or edited by hand) still serve:
    /// a loose signature is served canonical, a value that cannot be a header is left out.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn stored_values_never_break_the_evaluations_answer() {
        let served = serve_registry().await;
        let summary = String::from_utf8(summary_bytes("tiny")).unwrap();
        let id = crate::package::checksum(summary.as_bytes());
        let sig = served
            .key
            .sign_eval("acme/demo", &semver::Version::new(0, 1, 0), &id);
        let dir = served.root.join("evals/acme/demo");
        std::fs::create_dir_all(&dir).unwrap();
        let store = |sig: &str, key: &str, publisher: &str| {
            let stored = crate::evals::StoredEval {
                cksum: id.clone(),
                publisher: publisher.into(),
                key: key.into(),
                sig: sig.into(),
                summary: summary.clone(),
            };
            std::fs::write(
                dir.join(format!("{id}.json")),
                serde_json::to_vec(&stored).unwrap(),
            )
            .unwrap();
        };
        let url = format!("http://{}/acme/demo/evals/{id}.json", served.addr);
        store(
            &format!("{sig}\n"),
            &format!(" {}\r\n", served.key.public_hex()),
            "acme",
        );
        let response = reqwest::get(&url).await.unwrap();
        assert_eq!(response.status().as_u16(), 200);
        assert_eq!(response.headers()["x-rlhost-signature"], sig.as_str());
        assert_eq!(
            response.headers()["x-rlhost-key"],
            served.key.public_hex().as_str()
        );
        store("not\nhex", "zz\u{202E}", "ac\nme");
        let response = reqwest::get(&url).await.unwrap();
        assert_eq!(response.status().as_u16(), 200);
        for left_out in ["x-rlhost-signature", "x-rlhost-key", "x-rlhost-publisher"] {
            assert!(response.headers().get(left_out).is_none(), "{left_out}");
        }
        assert_eq!(response.text().await.unwrap(), summary);
    }

    #[test]
    fn weak_etags_match_strong_ones() {
        let mut h = HeaderMap::new();
        h.insert(header::IF_NONE_MATCH, "W/\"ab\", \"cd\"".parse().unwrap());
        assert!(etag_matches(&h, "\"ab\""));
        assert!(etag_matches(&h, "\"cd\""));
        assert!(!etag_matches(&h, "\"ef\""));
        assert!(!etag_matches(&HeaderMap::new(), "\"ab\""));
    }
}
