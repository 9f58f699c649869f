//! The rlhost plugin SDK: write environment and reward plugins for rlhost.
//!
//! Implement [`Environment`] (or [`RewardFunction`]) and export it with one line:
//!
//! ```text
//! use rlhost_sdk::prelude::*;
//!
//! struct Arith;
//!
//! impl Environment for Arith {
//!     fn info() -> EnvInfo { /* name, rubric, splits … */ }
//!     fn dataset(split: &str, offset: u64, limit: u32) -> Result<DatasetPage, PluginError> { … }
//!     fn initial_prompt(example: Example, env_args: &str) -> Result<EpisodeStart, PluginError> { … }
//!     fn score(rollout: Rollout) -> Result<Vec<Metric>, PluginError> { … }
//! }
//!
//! rlhost_sdk::export_environment!(Arith);
//! ```
//!
//! Built with `cargo build --release --target wasm32-wasip2` the crate becomes a sandboxed
//! WebAssembly component targeting the ABI in `sdk/wit/v0.1.0/` (`rlhost:env@0.1.0`); built for
//! the host target it becomes a native plugin (a C-ABI shared library, see [`native`]), which the
//! host loads only with `--allow-native`. Give the crate `crate-type = ["cdylib"]`.
//!
//! The SDK must never depend on the host.
#![deny(missing_docs)]

// The generated bindings refer to `::rlhost_sdk::…` so they also resolve inside plugin crates.
extern crate self as rlhost_sdk;

pub mod answer;
pub mod dataset;
pub mod extism;
pub mod host;
pub mod messages;
pub mod native;
pub mod plugin;
pub mod rubric;
pub mod schema;
pub mod types;

#[cfg(target_arch = "wasm32")]
#[doc(hidden)]
pub mod __wasm {
    //! Component glue; reached only through the export macros.
    pub use crate::wasm::*;
}
#[cfg(target_arch = "wasm32")]
mod wasm;

pub use plugin::{Environment, RewardFunction};
pub use schemars;
pub use serde_json;

/// The plugin ABI (WIT package) version this SDK builds against.
pub const ABI_VERSION: &str = "0.1.0";
/// The WIT package name.
pub const ABI_PACKAGE: &str = "rlhost:env";

/// Everything a plugin usually imports.
pub mod prelude {
    pub use crate::answer::{extract_boxed, extract_boxed_with};
    pub use crate::messages::{assistant, system, tool_result, user};
    pub use crate::plugin::{Environment, RewardFunction};
    pub use crate::rubric::{Rubric, flag, metric};
    pub use crate::types::*;
}

/// Exports a type implementing [`Environment`] as this crate's plugin: a WebAssembly component
/// on `wasm32`, a native C-ABI library elsewhere.
#[macro_export]
macro_rules! export_environment {
    ($ty:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            type __RlhostEnvironment = $crate::__wasm::EnvAdapter<$ty>;
            $crate::__wasm::env_world::__export_environment_world!(
                __RlhostEnvironment with_types_in $crate::__wasm::env_world
            );
        };
        $crate::__native_exports!(rlhost_environment_v0, $crate::native::env_vtable::<$ty>);
    };
}

/// Exports a type implementing [`RewardFunction`] as this crate's plugin: a WebAssembly
/// component on `wasm32`, a native C-ABI library elsewhere.
#[macro_export]
macro_rules! export_reward {
    ($ty:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            type __RlhostReward = $crate::__wasm::RewardAdapter<$ty>;
            $crate::__wasm::reward_world::__export_reward_world!(
                __RlhostReward with_types_in $crate::__wasm::reward_world
            );
        };
        $crate::__native_exports!(rlhost_reward_v0, $crate::native::reward_vtable::<$ty>);
    };
}

/// The native entry points: the ABI-version symbol and the kind's vtable symbol.
#[doc(hidden)]
#[macro_export]
macro_rules! __native_exports {
    ($entry:ident, $make_vtable:expr) => {
        #[cfg(not(target_arch = "wasm32"))]
        const _: () = {
            /// ABI version of this native plugin.
            #[unsafe(no_mangle)]
            pub extern "C" fn rlhost_abi_version() -> *const ::core::ffi::c_char {
                $crate::native::ABI_VERSION_C.as_ptr()
            }

            /// The plugin's vtable.
            #[unsafe(no_mangle)]
            pub extern "C" fn $entry() -> *const $crate::native::PluginVtable {
                static VTABLE: ::std::sync::OnceLock<$crate::native::PluginVtable> =
                    ::std::sync::OnceLock::new();
                VTABLE.get_or_init($make_vtable)
            }
        };
    };
}
