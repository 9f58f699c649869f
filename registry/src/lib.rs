//! rlhost's plugin registry: the package manifest (`plugin.toml`), and — as the registry work
//! lands — the `.rlpkg` package format, the sparse index, publisher signatures, and the directory
//! and HTTP backends with their client and server.
//!
//! It knows about packages, versions and checksums; it must never know about models or training.
#![deny(missing_docs)]

pub mod manifest;

pub use manifest::{Manifest, ManifestError, PluginKind, Runtime};

/// This crate's version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
