//! rlhost's plugin registry: the package manifest (`plugin.toml`), the `.rlpkg` package format,
//! the sparse index with semver resolution, publisher signatures with trust-on-first-use pinning,
//! and two backends behind one trait: a directory (`file://`) and an HTTP server and client.
//!
//! It knows about packages, versions and checksums; it must never know about models or training.
#![deny(missing_docs)]

pub mod backend;
pub mod dir;
pub mod fs;
pub mod http;
pub mod index;
pub mod manifest;
pub mod name;
pub mod package;
pub mod server;
pub mod sign;
pub mod tokens;

pub use backend::RegistryBackend;
pub use dir::{DirRegistry, RegistryError, TrustStore, verify_artifact};
pub use index::{IndexEntry, PackageRef, RegistryConfig, ResolveError, resolve};
pub use manifest::{Manifest, ManifestError, PluginKind, Runtime};
pub use name::{NameError, PackageName};
pub use sign::PublisherKey;

/// This crate's version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
