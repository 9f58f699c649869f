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
//!
//! Errors are JSON `{"error": …}` with 400 (invalid package or signature), 401 (no or unknown
//! token), 403 (another owner's package, or a key not accepted for the owner), 404, 409 (version
//! exists with other bytes) and 413 (upload over the size limit).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path as UrlPath, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};

use crate::dir::{DirRegistry, RegistryError};
use crate::tokens::TokenStore;

/// Largest upload accepted.
pub const MAX_UPLOAD_BYTES: usize = 256 << 20;

struct AppState {
    registry: DirRegistry,
    root: PathBuf,
}

type Shared = Arc<AppState>;

/// An error answer: a status and a message, sent as `{"error": message}`.
struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": self.1 }).to_string();
        (self.0, [(header::CONTENT_TYPE, "application/json")], body).into_response()
    }
}

fn api_error(status: StatusCode, message: impl std::fmt::Display) -> ApiError {
    ApiError(status, message.to_string())
}

fn error(status: StatusCode, message: impl std::fmt::Display) -> Response {
    api_error(status, message).into_response()
}

fn registry_api_error(e: RegistryError) -> ApiError {
    let status = match &e {
        RegistryError::Conflict { .. } => StatusCode::CONFLICT,
        RegistryError::Refused { .. } => StatusCode::FORBIDDEN,
        RegistryError::Package(_) => StatusCode::BAD_REQUEST,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    api_error(status, e)
}

fn registry_error(e: RegistryError) -> Response {
    registry_api_error(e).into_response()
}

fn json(value: impl serde::Serialize) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_string(&value).expect("serialisable"),
    )
        .into_response()
}

/// The owner whose bearer token this request carries, or the error response.
fn authenticate(state: &AppState, headers: &HeaderMap) -> Result<String, ApiError> {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or_else(|| api_error(StatusCode::UNAUTHORIZED, "a bearer token is required"))?;
    let tokens = TokenStore::load(&state.root).map_err(registry_api_error)?;
    tokens
        .owner_of(token.trim())
        .map(str::to_owned)
        .ok_or_else(|| api_error(StatusCode::UNAUTHORIZED, "unknown token"))
}

async fn config(State(s): State<Shared>) -> Response {
    match s.registry.config() {
        Ok(c) => json(c),
        Err(e) => registry_error(e),
    }
}

async fn index(
    State(s): State<Shared>,
    UrlPath((owner, name)): UrlPath<(String, String)>,
) -> Response {
    let full = format!("{owner}/{name}");
    match s.registry.entries(&full) {
        Ok(entries) if entries.is_empty() => {
            error(StatusCode::NOT_FOUND, format!("no package {full}"))
        }
        Ok(entries) => {
            let mut text = String::new();
            for e in entries {
                text.push_str(&serde_json::to_string(&e).expect("serialisable"));
                text.push('\n');
            }
            text.into_response()
        }
        Err(e) => registry_error(e),
    }
}

async fn artifact(State(s): State<Shared>, UrlPath(file): UrlPath<String>) -> Response {
    let Some(cksum) = file.strip_suffix(".rlpkg") else {
        return error(StatusCode::NOT_FOUND, "no such artifact");
    };
    match s.registry.artifact(cksum) {
        Ok(bytes) => ([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response(),
        Err(_) => error(StatusCode::NOT_FOUND, format!("no artifact {cksum}")),
    }
}

async fn packages(State(s): State<Shared>) -> Response {
    match s.registry.packages() {
        Ok(p) => json(p),
        Err(e) => registry_error(e),
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
        Err(e) => registry_error(e),
    }
}

#[derive(serde::Deserialize)]
struct PublishQuery {
    sig: String,
    key: String,
    min_host: Option<semver::Version>,
}

async fn publish(
    State(s): State<Shared>,
    headers: HeaderMap,
    Query(q): Query<PublishQuery>,
    body: Bytes,
) -> Response {
    let owner = match authenticate(&s, &headers) {
        Ok(o) => o,
        Err(e) => return e.into_response(),
    };
    let state = s.clone();
    let result = tokio::task::spawn_blocking(move || {
        // Read the manifest first: a token may publish only under its own owner.
        let manifest = state
            .registry
            .read_package(&body)
            .map_err(|e| api_error(StatusCode::BAD_REQUEST, e))?;
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
            .map_err(registry_api_error)
    })
    .await;
    match result {
        Ok(Ok(entry)) => json(entry),
        Ok(Err(e)) => e.into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

#[derive(serde::Deserialize)]
struct YankBody {
    name: String,
    version: semver::Version,
    yanked: bool,
}

async fn yank(State(s): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    let owner = match authenticate(&s, &headers) {
        Ok(o) => o,
        Err(e) => return e.into_response(),
    };
    let req: YankBody = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    if req.name.split('/').next() != Some(owner.as_str()) {
        return error(
            StatusCode::FORBIDDEN,
            format!("this token acts for {owner:?}, not for {}", req.name),
        );
    }
    match s.registry.yank(&req.name, &req.version, req.yanked) {
        Ok(()) => json(serde_json::json!({"ok": true})),
        Err(e) => error(StatusCode::NOT_FOUND, e),
    }
}

/// The router over the directory registry at `root`.
pub fn router(root: &Path) -> Result<Router, RegistryError> {
    let state = Arc::new(AppState {
        registry: DirRegistry::open(root, false)?,
        root: root.to_owned(),
    });
    Ok(Router::new()
        .route("/config.json", get(config))
        .route("/index/{owner}/{name}", get(index))
        .route("/artifacts/{file}", get(artifact))
        .route("/api/v1/packages", get(packages))
        .route("/api/v1/search", get(search))
        .route("/api/v1/publish", put(publish))
        .route("/api/v1/yank", post(yank))
        .layer(DefaultBodyLimit::max(MAX_UPLOAD_BYTES))
        .with_state(state))
}

/// Serves the registry at `root` on `listener` until `shutdown` resolves.
pub async fn serve(
    root: &Path,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RegistryError> {
    let app = router(root)?;
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|e| RegistryError::Io {
            root: root.display().to_string(),
            path: "(server)".into(),
            message: e.to_string(),
        })
}
