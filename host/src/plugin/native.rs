//! Native plugins: C-ABI shared libraries built with `rlhost-sdk` for the host target.
//!
//! **Not sandboxed**: a native plugin runs with the host's rights, so the loader refuses them
//! unless native plugins are allowed. They exist for trusted, speed-critical reward code.
//! The protocol is in [`rlhost_sdk::native`]: the ABI-version symbol is checked before anything
//! else is called, then the versioned vtable (with its `struct_size`) is fetched, and every call
//! exchanges JSON in plugin-owned buffers. Calls run on blocking threads; a call past its deadline
//! is reported as a timeout, but its thread cannot be stopped and finishes in the background.
//! `NativePlugin` is a JSON transport: the environment and reward function over it are the ones
//! Extism plugins share (`plugin/json_transport.rs`); this module only opens, calls and tells
//! failures apart.

use std::ffi::{CStr, c_char, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use async_trait::async_trait;
use libloading::Library;
use rlhost_sdk::native::{
    self as abi_native, Buffer, EnvMethod, HostVtable, PluginVtable, RewardMethod, requests,
};
use rlhost_sdk::types::{LogLevel, PluginError as GuestError};

use super::abi::{self, ExportedWorld};
use super::deadline::{HostClock, with_deadline};
use super::host_api::HostContext;
use super::json_transport::{Function, JsonTransport, Reply};
use super::{HostParts, PluginError, PluginErrorKind, PluginFolder, PluginId, PluginLimits};

/// A loaded library and its vtable (which points into the library, so both live together).
struct NativeLib {
    vtable: *const PluginVtable,
    _lib: Library,
}

// SAFETY: the vtable is immutable data inside the loaded library, which stays loaded as long as
// this value lives; plugin functions are stateless `extern "C"` entry points that the SDK glue
// makes safe to call from any thread (state travels in the JSON).
unsafe impl Send for NativeLib {}
// SAFETY: see above.
unsafe impl Sync for NativeLib {}

impl NativeLib {
    fn vtable(&self) -> &PluginVtable {
        // SAFETY: checked non-null and of sufficient size at load; lives as long as `_lib`.
        unsafe { &*self.vtable }
    }

    /// Opens the library, checks its ABI version before calling anything else, then fetches
    /// the vtable through `entry`.
    fn open(folder: &PluginFolder, entry: &[u8]) -> Result<Self, PluginError> {
        let id = &folder.id;
        let path = &folder.artifact;
        let bad = |m: String| PluginErrorKind::Malformed(m).of(id);
        // SAFETY: loading runs the library's initialisers: that is why native plugins must be
        // explicitly allowed (trusted code only).
        let lib = unsafe { Library::new(path) }.map_err(|e| {
            PluginErrorKind::backend(format!("cannot load {}", path.display()), e).of(id)
        })?;

        // SAFETY: the symbol's type is fixed by the native ABI.
        let version_fn = unsafe {
            lib.get::<unsafe extern "C" fn() -> *const c_char>(abi_native::ABI_VERSION_SYMBOL)
        }
        .map_err(|_| {
            bad(format!(
                "{} has no `rlhost_abi_version` symbol: not an rlhost native plugin",
                path.display()
            ))
        })?;
        // SAFETY: calling the version function is the one call allowed before the check.
        let ptr = unsafe { version_fn() };
        if ptr.is_null() {
            return Err(bad("`rlhost_abi_version` returned null".into()));
        }
        // SAFETY: the ABI requires a NUL-terminated static string.
        let text = unsafe { CStr::from_ptr(ptr) }
            .to_str()
            .map_err(|_| bad("`rlhost_abi_version` is not UTF-8".into()))?;
        let version = semver::Version::parse(text).map_err(|source| {
            let source = abi::AbiReadError::NativeVersion {
                text: text.to_owned(),
                source,
            };
            let path = path.clone();
            PluginErrorKind::Artifact { path, source }.of(id)
        })?;
        abi::check_reported(
            version,
            &folder.manifest.abi_version(),
            "the library reports",
        )
        .map_err(|k| k.of(id))?;

        let entry_name = String::from_utf8_lossy(&entry[..entry.len() - 1]).into_owned();
        // SAFETY: the symbol's type is fixed by the native ABI.
        let entry_fn =
            unsafe { lib.get::<unsafe extern "C" fn() -> *const PluginVtable>(entry) }
                .map_err(|_| bad(format!("{} has no `{entry_name}` symbol", path.display())))?;
        // SAFETY: the ABI version matched, so the entry point has the expected signature.
        let vtable = unsafe { entry_fn() };
        if vtable.is_null() {
            return Err(bad(format!("`{entry_name}` returned null")));
        }
        // SAFETY: non-null; the first field is readable in every ABI version.
        let size = unsafe { (*vtable).struct_size };
        if size < std::mem::size_of::<PluginVtable>() {
            return Err(bad(format!(
                "`{entry_name}` vtable is {size} bytes, expected at least {}",
                std::mem::size_of::<PluginVtable>()
            )));
        }
        Ok(Self { vtable, _lib: lib })
    }
}

/// What a call's host callbacks act on; lives on the calling thread's stack during the call.
struct CallCtx {
    host: Arc<HostContext>,
    seed: u64,
    runtime: tokio::runtime::Handle,
    /// Time spent in the Python sandbox during this call (not counted against its timeout).
    clock: Arc<HostClock>,
}

fn ctx<'a>(p: *mut c_void) -> &'a CallCtx {
    // SAFETY: the host passes a pointer to a live `CallCtx` for the duration of the call.
    unsafe { &*(p as *const CallCtx) }
}

fn bytes<'a>(ptr: *const u8, len: usize) -> &'a [u8] {
    if ptr.is_null() || len == 0 {
        return &[];
    }
    // SAFETY: the plugin passes `len` readable bytes for the duration of the callback.
    unsafe { std::slice::from_raw_parts(ptr, len) }
}

fn reply(out: *mut Buffer, status: i32, data: Vec<u8>) -> i32 {
    if !out.is_null() {
        // SAFETY: the plugin passes a writable out-pointer.
        unsafe { out.write(Buffer::from_vec(data)) };
    }
    status
}

unsafe extern "C" fn host_log(c: *mut c_void, level: u32, msg: *const u8, len: usize) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let level = match level {
            0 => LogLevel::Trace,
            1 => LogLevel::Debug,
            2 => LogLevel::Info,
            3 => LogLevel::Warn,
            _ => LogLevel::Error,
        };
        ctx(c)
            .host
            .log(level, &String::from_utf8_lossy(bytes(msg, len)));
    }));
}

unsafe extern "C" fn host_read_data(
    c: *mut c_void,
    path: *const u8,
    len: usize,
    out: *mut Buffer,
) -> i32 {
    let r = catch_unwind(AssertUnwindSafe(|| {
        let path = String::from_utf8_lossy(bytes(path, len));
        ctx(c).host.read_data(&path)
    }));
    match r {
        Ok(Ok(data)) => reply(out, 0, data),
        Ok(Err(msg)) => reply(out, 1, msg.into_bytes()),
        Err(_) => reply(out, 1, b"host error while reading data".to_vec()),
    }
}

unsafe extern "C" fn host_run_python(
    c: *mut c_void,
    req: *const u8,
    len: usize,
    out: *mut Buffer,
) -> i32 {
    let r = catch_unwind(AssertUnwindSafe(|| -> Result<Vec<u8>, String> {
        let req: requests::RunPython = serde_json::from_slice(bytes(req, len))
            .map_err(|e| format!("invalid run_python request: {e}"))?;
        let cx = ctx(c);
        let output = {
            let _running = cx.clock.enter();
            cx.runtime
                .block_on(cx.host.run_python(&req.code, req.limits))
        }?;
        serde_json::to_vec(&output).map_err(|e| e.to_string())
    }));
    match r {
        Ok(Ok(data)) => reply(out, 0, data),
        Ok(Err(msg)) => reply(out, 1, msg.into_bytes()),
        Err(_) => reply(out, 1, b"host error while running python".to_vec()),
    }
}

unsafe extern "C" fn host_rollout_seed(c: *mut c_void) -> u64 {
    ctx(c).seed
}

/// A loaded native library and what its calls need.
pub(crate) struct NativePlugin {
    lib: Arc<NativeLib>,
    host: Arc<HostContext>,
    limits: PluginLimits,
}

#[async_trait]
impl JsonTransport for NativePlugin {
    /// Nothing: a native plugin's state travels in the JSON.
    type Instance = ();

    const STATEFUL: bool = false;

    async fn open(
        folder: &PluginFolder,
        parts: HostParts,
        world: ExportedWorld,
    ) -> Result<(Self, ()), PluginError> {
        let entry = match world {
            ExportedWorld::Environment => abi_native::ENVIRONMENT_ENTRY_SYMBOL,
            ExportedWorld::Reward => abi_native::REWARD_ENTRY_SYMBOL,
        };
        let lib = NativeLib::open(folder, entry)?;
        let plugin = Self {
            lib: Arc::new(lib),
            host: Arc::new(parts.context(folder)),
            limits: parts.limits,
        };
        Ok((plugin, ()))
    }

    fn id(&self) -> &PluginId {
        &self.host.plugin
    }

    fn capabilities(&self) -> &super::CapabilityStatus {
        &self.host.capabilities
    }

    fn instance(&self) -> Result<(), PluginError> {
        Ok(())
    }

    fn usable(_: &()) -> bool {
        true
    }

    /// One call through the vtable on a blocking thread, under the deadline (a call past it is
    /// reported, but its thread cannot be stopped and finishes in the background). The status
    /// tells a value from the plugin's error, a panic and a refused request.
    async fn call(
        &self,
        _: &mut (),
        function: Function,
        input: Option<Vec<u8>>,
        seed: u64,
    ) -> Result<Reply, PluginErrorKind> {
        let call = function.wit_name();
        let method = match function {
            Function::EnvInfo => EnvMethod::Info as u32,
            Function::Dataset => EnvMethod::Dataset as u32,
            Function::InitialPrompt => EnvMethod::InitialPrompt as u32,
            Function::EnvResponse => EnvMethod::EnvResponse as u32,
            Function::EnvScore => EnvMethod::Score as u32,
            Function::RewardInfo => RewardMethod::Info as u32,
            Function::RewardScore => RewardMethod::Score as u32,
        };
        // `info` takes `null` in the native ABI.
        let input = input.unwrap_or_else(|| b"null".to_vec());
        let lib = self.lib.clone();
        let host = self.host.clone();
        let runtime = tokio::runtime::Handle::current();
        let clock = Arc::new(HostClock::default());
        let in_call = clock.clone();
        let task = tokio::task::spawn_blocking(move || {
            let cx = CallCtx {
                host,
                seed,
                runtime,
                clock: in_call,
            };
            let host = HostVtable {
                struct_size: std::mem::size_of::<HostVtable>(),
                ctx: &cx as *const CallCtx as *mut c_void,
                log: host_log,
                read_data: host_read_data,
                run_python: host_run_python,
                rollout_seed: host_rollout_seed,
                free_buffer: abi_native::free_buffer,
            };
            let vt = lib.vtable();
            let mut out = Buffer::empty();
            // SAFETY: valid host vtable and buffers for the duration of the call; the plugin's
            // ABI version was checked at load.
            let status = unsafe { (vt.call)(&host, method, input.as_ptr(), input.len(), &mut out) };
            // SAFETY: the plugin filled `out` (or left it empty); copy, then let it free it.
            let data = unsafe { out.as_slice() }.to_vec();
            // SAFETY: `out` came from the plugin's allocator and is freed once, by the plugin.
            unsafe { (vt.free_buffer)(out) };
            (status, data)
        });
        let limit = self.limits.call_timeout;
        let (status, data) = match with_deadline(limit, &clock, task).await {
            Err(_) => return Err(PluginErrorKind::Timeout { call, limit }),
            Ok(Err(join)) => {
                return Err(PluginErrorKind::Crash {
                    call,
                    message: join.to_string(),
                });
            }
            Ok(Ok(r)) => r,
        };
        let text = || String::from_utf8_lossy(&data).into_owned();
        match status {
            abi_native::STATUS_OK => Ok(Reply::Value(data)),
            abi_native::STATUS_PLUGIN_ERROR => {
                let error = serde_json::from_slice::<GuestError>(&data)
                    .unwrap_or_else(|_| GuestError::Internal(text()));
                Err(PluginErrorKind::Guest { call, error })
            }
            abi_native::STATUS_PANIC => Err(PluginErrorKind::Crash {
                call,
                message: format!("panicked: {}", text()),
            }),
            abi_native::STATUS_BAD_REQUEST => Err(PluginErrorKind::Malformed(format!(
                "refused the `{call}` request: {}",
                text()
            ))),
            other => Err(PluginErrorKind::InvalidReturn {
                call,
                message: format!("unknown status {other}"),
            }),
        }
    }
}
