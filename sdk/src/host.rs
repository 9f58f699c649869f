//! What the host offers a plugin: logging, the Python sandbox, the plugin's own data files and a
//! per-rollout seed. Nothing else exists (no network, no host files, no clock).
//!
//! The same functions work in both kinds of plugin: in a component they call the WIT imports; in
//! a native plugin they call the host's vtable for the call in progress. Outside any host (a
//! plugin's own unit tests) `log` prints to stderr, `rollout_seed` is 0 and the rest fail with
//! "no host".

use crate::types::{LogLevel, PythonLimits, PythonOutput};

#[cfg(not(target_arch = "wasm32"))]
const NO_HOST: &str = "no host: this function works only inside a plugin call made by rlhost";

/// Writes to the host's log (tagged with the plugin's name and version by the host).
pub fn log(level: LogLevel, message: &str) {
    #[cfg(target_arch = "wasm32")]
    crate::__wasm::log(level, message);
    #[cfg(not(target_arch = "wasm32"))]
    match crate::native::current_host() {
        // SAFETY: the vtable is live for the call; the message pointer/length are valid.
        Some(h) => unsafe { (h.log)(h.ctx, level as u32, message.as_ptr(), message.len()) },
        None => eprintln!("[{level:?}] {message}"),
    }
}

/// Runs Python code in the host's sandbox. Needs the `sandbox.python` capability.
pub fn run_python(code: &str, limits: PythonLimits) -> Result<PythonOutput, String> {
    #[cfg(target_arch = "wasm32")]
    return crate::__wasm::run_python(code, limits);
    #[cfg(not(target_arch = "wasm32"))]
    {
        let host = crate::native::current_host().ok_or(NO_HOST)?;
        let req = crate::native::requests::RunPython {
            code: code.to_owned(),
            limits,
        };
        let req = serde_json::to_vec(&req).map_err(|e| e.to_string())?;
        let (status, bytes) = native_host_call(host, |out| {
            // SAFETY: valid request buffer and out pointer; the vtable is live for the call.
            unsafe { (host.run_python)(host.ctx, req.as_ptr(), req.len(), out) }
        });
        if status == 0 {
            serde_json::from_slice(&bytes).map_err(|e| format!("host sent invalid output: {e}"))
        } else {
            Err(String::from_utf8_lossy(&bytes).into_owned())
        }
    }
}

/// Reads a file from the plugin's own packaged data folder (`path` relative, no `..`).
pub fn read_data(path: &str) -> Result<Vec<u8>, String> {
    #[cfg(target_arch = "wasm32")]
    return crate::__wasm::read_data(path);
    #[cfg(not(target_arch = "wasm32"))]
    {
        let host = crate::native::current_host().ok_or(NO_HOST)?;
        let (status, bytes) = native_host_call(host, |out| {
            // SAFETY: valid path buffer and out pointer; the vtable is live for the call.
            unsafe { (host.read_data)(host.ctx, path.as_ptr(), path.len(), out) }
        });
        if status == 0 {
            Ok(bytes)
        } else {
            Err(String::from_utf8_lossy(&bytes).into_owned())
        }
    }
}

/// A deterministic seed for the current rollout: the same for every call within one rollout.
pub fn rollout_seed() -> u64 {
    #[cfg(target_arch = "wasm32")]
    return crate::__wasm::rollout_seed();
    #[cfg(not(target_arch = "wasm32"))]
    match crate::native::current_host() {
        // SAFETY: the vtable is live for the call.
        Some(h) => unsafe { (h.rollout_seed)(h.ctx) },
        None => 0,
    }
}

/// Calls a host function that fills a host-owned buffer, copies it out and frees it.
#[cfg(not(target_arch = "wasm32"))]
fn native_host_call(
    host: &crate::native::HostVtable,
    f: impl FnOnce(*mut crate::native::Buffer) -> i32,
) -> (i32, Vec<u8>) {
    let mut out = crate::native::Buffer::empty();
    let status = f(&mut out);
    // SAFETY: the host filled `out` (or left it empty); we copy before handing it back.
    let bytes = unsafe { out.as_slice() }.to_vec();
    // SAFETY: `out` came from the host's allocator and is freed exactly once, by the host.
    unsafe { (host.free_buffer)(out) };
    (status, bytes)
}
