//! rlhost's plugin registry: the `.rlpkg` package format, the sparse index, publisher
//! signatures, and the directory and HTTP backends with their client and server.
//!
//! It knows about packages, versions and checksums; it must never know about models or training.
//!
//! Status: the package format and index land with the registry work; until then this crate only
//! fixes its name and place in the workspace.
#![deny(missing_docs)]

/// This crate's version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
