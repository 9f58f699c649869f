//! The rlhost plugin SDK: what third parties depend on to write environment and reward plugins.
//!
//! It will hold the plugin ABI (one frozen WIT directory per released version under `sdk/wit/`),
//! the Rust guest bindings behind a small trait and export macro, and helpers every plugin author
//! needs. It compiles for the host and for `wasm32-wasip2`, and must never depend on the host.
//!
//! Status: the ABI and bindings land with the plugin-runtime work; until then this crate only
//! fixes its name and place in the workspace.
#![deny(missing_docs)]
#![no_std]

/// This SDK's version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
