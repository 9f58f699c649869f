//! rlhost's plugin registry: the package manifest (`plugin.toml`), the `.rlpkg` package format,
//! the sparse index with semver resolution, publisher signatures with trust-on-first-use pinning,
//! and two backends behind one trait: a directory (`file://`) and an HTTP server and client.
//!
//! It knows about packages, versions and checksums; it must never know about models or training.
#![deny(missing_docs)]

pub mod backend;
pub mod dir;
pub mod error;
pub mod evals;
pub mod http;
pub mod hub;
pub mod index;
pub mod manifest;
pub mod name;
pub mod package;
pub mod server;
pub mod sign;
pub mod tokens;
pub mod trust;

pub use backend::{Publication, RegistryBackend};
pub use dir::{DirBackend, DirRegistry};
pub use error::RegistryError;
pub use index::{IndexEntry, PackageRef, RegistryConfig, ResolveError, resolve};
pub use manifest::{ArgType, EnvArg, Manifest, ManifestError, PluginKind, Runtime};
pub use name::{NameError, PackageName};
pub use sign::PublisherKey;
pub use trust::{TrustStore, verify_artifact};

/// This crate's version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Opens the registry at `url`: `file://PATH` (a folder) or `http(s)://…` (a registry server).
pub fn open(url: &str) -> Result<Box<dyn RegistryBackend>, RegistryError> {
    if let Some(path) = url.strip_prefix("file://") {
        let dir = DirRegistry::open(std::path::Path::new(path), false)?;
        return Ok(Box::new(DirBackend::new(url.to_owned(), dir)));
    }
    if url.starts_with("http://") || url.starts_with("https://") {
        return Ok(Box::new(http::HttpRegistry::new(url)));
    }
    Err(RegistryError::Corrupt {
        root: url.to_owned(),
        message: "expected a file://PATH, http:// or https:// registry URL".into(),
    })
}
