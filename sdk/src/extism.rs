//! The Extism plugin ABI: rlhost's WIT world as JSON over Extism's bytes-in, bytes-out calls, so a
//! plugin can be written with any Extism PDK (AssemblyScript, Go, JS, Python, C, Zig, Rust…).
//! `sdk/extism.md` is the full description; this module names its pieces for Rust users and the
//! host, which share these definitions.
//!
//! - The plugin exports [`ABI_VERSION_EXPORT`], returning the interface it implements as text,
//!   e.g. `rlhost:env/env@0.1.0` or `rlhost:env/reward-fn@0.1.0` (the names a component exports).
//!   The host calls it **before any other export** and refuses an unsupported version.
//! - Each WIT function is an export of the same name with `-` written `_` (`initial_prompt`).
//!   Inputs are the JSON objects of [`crate::native::requests`]; `info` takes no input. Outputs:
//!   `info` returns its record; functions returning `result<T, plugin-error>` in WIT return an
//!   [`Outcome`]: `{"ok": T}` or `{"err": {"kind": "unknown-split", "message": "…"}}`.
//! - The host functions (Extism namespace `extism:host/user`) mirror the WIT `host` interface; see
//!   [`HOST_FUNCTIONS`].

use serde::{Deserialize, Serialize};

use crate::types::PluginError;

/// The export the host reads first: no input, the implemented interface as UTF-8 text.
pub const ABI_VERSION_EXPORT: &str = "rlhost_abi_version";

/// The exports of an environment plugin (besides [`ABI_VERSION_EXPORT`]).
pub const ENVIRONMENT_EXPORTS: &[&str] =
    &["info", "dataset", "initial_prompt", "env_response", "score"];

/// The exports of a reward plugin (besides [`ABI_VERSION_EXPORT`]).
pub const REWARD_EXPORTS: &[&str] = &["info", "score"];

/// The Extism namespace of the host functions (Extism's default for user host functions).
pub const HOST_NAMESPACE: &str = "extism:host/user";

/// The host functions, each `(name, what it takes and returns)`. Memory handles are Extism's
/// `i64` offsets.
pub const HOST_FUNCTIONS: &[(&str, &str)] = &[
    (
        "rlhost_log",
        "(handle) -> (): JSON {\"level\": \"trace\"|\"debug\"|\"info\"|\"warn\"|\"error\", \"message\": text}",
    ),
    (
        "rlhost_read_data",
        "(handle: path text) -> handle: byte 0 then the file's bytes, or byte 1 then an error message",
    ),
    (
        "rlhost_run_python",
        "(handle: JSON {\"code\", \"limits\"}) -> handle: JSON {\"ok\": python-output} or {\"err\": text}",
    ),
    ("rlhost_rollout_seed", "() -> i64: the rollout's seed"),
];

/// First byte of a successful `rlhost_read_data` reply.
pub const READ_DATA_OK: u8 = 0;
/// First byte of a failed `rlhost_read_data` reply (the rest is the message).
pub const READ_DATA_ERR: u8 = 1;

/// A WIT `result<T, E>` as JSON: `{"ok": T}` or `{"err": E}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome<T, E = PluginError> {
    /// The call succeeded.
    Ok(T),
    /// It failed.
    Err(E),
}

impl<T, E> From<Result<T, E>> for Outcome<T, E> {
    fn from(r: Result<T, E>) -> Self {
        match r {
            Ok(v) => Outcome::Ok(v),
            Err(e) => Outcome::Err(e),
        }
    }
}

impl<T, E> From<Outcome<T, E>> for Result<T, E> {
    fn from(o: Outcome<T, E>) -> Self {
        match o {
            Outcome::Ok(v) => Ok(v),
            Outcome::Err(e) => Err(e),
        }
    }
}

/// Input of `rlhost_log`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LogRequest {
    /// Severity.
    pub level: crate::types::LogLevel,
    /// The text.
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_are_externally_tagged_like_wit_results() {
        let ok: Outcome<u32> = Outcome::Ok(3);
        assert_eq!(serde_json::to_string(&ok).unwrap(), r#"{"ok":3}"#);
        let err: Outcome<u32> = Outcome::Err(PluginError::UnknownSplit("dev".into()));
        assert_eq!(
            serde_json::to_string(&err).unwrap(),
            r#"{"err":{"kind":"unknown-split","message":"dev"}}"#
        );
        let back: Result<u32, PluginError> =
            serde_json::from_str::<Outcome<u32>>(r#"{"err":{"kind":"internal","message":"x"}}"#)
                .unwrap()
                .into();
        assert_eq!(back, Err(PluginError::Internal("x".into())));
    }
}
