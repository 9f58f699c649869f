//! Extism plugins: core WebAssembly modules built with any Extism PDK, speaking the JSON ABI of
//! `sdk/extism.md` ([`rlhost_sdk::extism`]), behind the same traits and limits as components.
//! `ExtismPlugin` is a JSON transport: the environment and reward function over it are the ones
//! native plugins share (`plugin/json_transport.rs`); this module only opens, calls and tells
//! failures apart.
//!
//! - The module is compiled once per load (Extism keeps its own wasmtime engine; the crate graph
//!   still holds one wasmtime). Every rollout, and every reward call, gets a fresh instance, so
//!   rollouts never share state and a crash poisons only its own rollout.
//! - The ABI export ([`rlhost_sdk::extism::ABI_VERSION_EXPORT`]) is read before any other call.
//! - Limits: the call deadline is the host's own (time in the Python sandbox does not count, as
//!   for components) and is enforced through Extism's cancel handle; memory through Extism's
//!   page cap; optional fuel. WASI preview 1 is linked for PDKs that need it, with nothing
//!   granted: no files, no environment, no network (Extism's HTTP is compiled out and no host
//!   is allowed). Unlike components, an Extism plugin sees real clocks; its randomness should
//!   come from `rlhost_rollout_seed`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use extism::{CompiledPlugin, CurrentPlugin, PTR, Plugin, PluginBuilder, UserData, Val};
use rlhost_sdk::extism as abi_extism;
use rlhost_sdk::extism::Outcome;
use rlhost_sdk::native::requests;
use rlhost_sdk::types::{PluginError as GuestError, PythonOutput};

use super::abi::{self, ExportedWorld};
use super::deadline::{HostClock, with_deadline};
use super::host_api::HostContext;
use super::json_transport::{Function, JsonTransport, Reply};
use super::{HostParts, PluginError, PluginErrorKind, PluginFolder, PluginId, PluginLimits};

/// What the host functions of one call act on (Extism's per-call host context).
struct CallCtx {
    host: Arc<HostContext>,
    seed: u64,
    runtime: tokio::runtime::Handle,
    clock: Arc<HostClock>,
}

fn call_ctx(plugin: &mut CurrentPlugin) -> Result<&mut CallCtx, extism::Error> {
    plugin.host_context::<CallCtx>()
}

fn host_log(
    plugin: &mut CurrentPlugin,
    inputs: &[Val],
    _: &mut [Val],
    _: UserData<()>,
) -> Result<(), extism::Error> {
    let text: String = plugin.memory_get_val(&inputs[0])?;
    let req: abi_extism::LogRequest = serde_json::from_str(&text)
        .map_err(|e| extism::Error::msg(format!("rlhost_log: invalid request: {e}")))?;
    call_ctx(plugin)?.host.log(req.level, &req.message);
    Ok(())
}

fn host_read_data(
    plugin: &mut CurrentPlugin,
    inputs: &[Val],
    outputs: &mut [Val],
    _: UserData<()>,
) -> Result<(), extism::Error> {
    let path: String = plugin.memory_get_val(&inputs[0])?;
    let reply = match call_ctx(plugin)?.host.read_data(&path) {
        Ok(mut bytes) => {
            bytes.insert(0, abi_extism::READ_DATA_OK);
            bytes
        }
        Err(message) => {
            let mut bytes = vec![abi_extism::READ_DATA_ERR];
            bytes.extend_from_slice(message.as_bytes());
            bytes
        }
    };
    plugin.memory_set_val(&mut outputs[0], reply)?;
    Ok(())
}

fn host_run_python(
    plugin: &mut CurrentPlugin,
    inputs: &[Val],
    outputs: &mut [Val],
    _: UserData<()>,
) -> Result<(), extism::Error> {
    let text: String = plugin.memory_get_val(&inputs[0])?;
    let outcome: Outcome<PythonOutput, String> =
        match serde_json::from_str::<requests::RunPython>(&text) {
            Err(e) => Outcome::Err(format!("invalid run_python request: {e}")),
            Ok(req) => {
                let cx = call_ctx(plugin)?;
                let _running = cx.clock.enter();
                cx.runtime
                    .block_on(cx.host.run_python(&req.code, req.limits))
                    .into()
            }
        };
    let reply = serde_json::to_string(&outcome)?;
    plugin.memory_set_val(&mut outputs[0], reply)?;
    Ok(())
}

fn host_rollout_seed(
    plugin: &mut CurrentPlugin,
    _: &[Val],
    outputs: &mut [Val],
    _: UserData<()>,
) -> Result<(), extism::Error> {
    // The seed travels as an i64 bit pattern.
    outputs[0] = Val::I64(call_ctx(plugin)?.seed as i64);
    Ok(())
}

fn host_functions() -> Vec<extism::Function> {
    use extism::Function;
    let ns = abi_extism::HOST_NAMESPACE;
    vec![
        Function::new("rlhost_log", [PTR], [], UserData::new(()), host_log).with_namespace(ns),
        Function::new(
            "rlhost_read_data",
            [PTR],
            [PTR],
            UserData::new(()),
            host_read_data,
        )
        .with_namespace(ns),
        Function::new(
            "rlhost_run_python",
            [PTR],
            [PTR],
            UserData::new(()),
            host_run_python,
        )
        .with_namespace(ns),
        Function::new(
            "rlhost_rollout_seed",
            [],
            [extism::ValType::I64],
            UserData::new(()),
            host_rollout_seed,
        )
        .with_namespace(ns),
    ]
}

/// How often a cancelled call is cancelled again until it stops (a cancel that arrives before
/// Extism registers the call is lost).
const CANCEL_RETRY: Duration = Duration::from_millis(50);

/// A loaded Extism module and what its calls need.
pub(crate) struct ExtismPlugin {
    compiled: CompiledPlugin,
    host: Arc<HostContext>,
    limits: PluginLimits,
}

#[async_trait]
impl JsonTransport for ExtismPlugin {
    /// `None` once a call failed in a way that may have broken it.
    type Instance = Option<Plugin>;

    const STATEFUL: bool = true;

    /// Compiles the module and reads its ABI export before anything else; the instance that
    /// answered is returned (it serves `info`, and for environments `dataset`).
    async fn open(
        folder: &PluginFolder,
        parts: HostParts,
        world: ExportedWorld,
    ) -> Result<(Self, Option<Plugin>), PluginError> {
        let plugin = Self::compile(folder, parts).await?;
        let mut first = plugin.instance()?;
        plugin
            .check_abi(folder, world, &mut first)
            .await
            .map_err(|k| k.of(&folder.id))?;
        Ok((plugin, first))
    }

    fn id(&self) -> &PluginId {
        &self.host.plugin
    }

    fn capabilities(&self) -> &super::CapabilityStatus {
        &self.host.capabilities
    }

    fn instance(&self) -> Result<Option<Plugin>, PluginError> {
        Plugin::new_from_compiled(&self.compiled)
            .map(Some)
            .map_err(|e| PluginErrorKind::backend("cannot instantiate", e).of(self.id()))
    }

    fn usable(instance: &Option<Plugin>) -> bool {
        instance.is_some()
    }

    /// Calls the export named like the WIT function (`-` written `_`); functions that return a
    /// WIT `result` answer with an [`Outcome`].
    async fn call(
        &self,
        instance: &mut Option<Plugin>,
        function: Function,
        input: Option<Vec<u8>>,
        seed: u64,
    ) -> Result<Reply, PluginErrorKind> {
        let export = match function {
            Function::EnvInfo | Function::RewardInfo => "info",
            Function::Dataset => "dataset",
            Function::InitialPrompt => "initial_prompt",
            Function::EnvResponse => "env_response",
            Function::EnvScore | Function::RewardScore => "score",
        };
        let out = self
            .call_export(instance, function.wit_name(), export, input, seed)
            .await?
            .into_bytes();
        Ok(if function.returns_result() {
            Reply::Outcome(out)
        } else {
            Reply::Value(out)
        })
    }
}

impl ExtismPlugin {
    /// Compiles the module in `folder`, with the memory cap, fuel and host functions, and no
    /// access to anything outside.
    async fn compile(folder: &PluginFolder, parts: HostParts) -> Result<Self, PluginError> {
        let id = &folder.id;
        let bytes = folder.read_artifact()?;
        if bytes.get(..8) != Some(b"\0asm\x01\0\0\0".as_slice()) {
            return Err(PluginErrorKind::Malformed(format!(
                "{}: not a core WebAssembly module (an Extism plugin is one; a component needs \
                 runtime = \"wasm\")",
                folder.artifact.display()
            ))
            .of(id));
        }
        let limits = parts.limits.clone();
        let pages = u32::try_from(limits.memory_bytes.div_ceil(64 << 10)).unwrap_or(u32::MAX);
        // No allowed hosts, no allowed paths, no config: the plugin gets nothing from outside.
        let manifest = extism::Manifest::new([extism::Wasm::data(bytes)])
            .with_memory_max(pages)
            .disallow_all_hosts();
        let mut builder = PluginBuilder::new(manifest)
            .with_wasi(true)
            .with_cache_disabled()
            .with_functions(host_functions());
        if let Some(fuel) = limits.fuel {
            builder = builder.with_fuel_limit(fuel);
        }
        let compiled = tokio::task::spawn_blocking(move || builder.compile())
            .await
            .map_err(|e| PluginErrorKind::Crash {
                call: "compile",
                message: e.to_string(),
            })
            .and_then(|r| {
                r.map_err(|e| PluginErrorKind::backend("cannot load the Extism plugin", e))
            })
            .map_err(|k| k.of(id))?;
        Ok(Self {
            compiled,
            host: Arc::new(parts.context(folder)),
            limits,
        })
    }

    /// Asks `instance` which interface it implements (the first call it gets) and checks that
    /// it is `want`, at a version this host supports and `plugin.toml` declares, with every
    /// export that interface needs.
    async fn check_abi(
        &self,
        folder: &PluginFolder,
        want: ExportedWorld,
        instance: &mut Option<Plugin>,
    ) -> Result<(), PluginErrorKind> {
        let export = abi_extism::ABI_VERSION_EXPORT;
        let declared = self
            .call_export(instance, "abi-version", export, None, 0)
            .await?;
        let (world, version) = abi::parse_export_name(declared.trim())
            .map_err(|source| PluginErrorKind::Artifact {
                path: folder.artifact.clone(),
                source,
            })?
            .ok_or_else(|| {
                PluginErrorKind::Malformed(format!(
                    "`{export}` returned {declared:?}, not an rlhost:env interface name such \
                         as \"rlhost:env/env@{}\"",
                    rlhost_sdk::ABI_VERSION
                ))
            })?;
        abi::check_reported(
            version,
            &folder.manifest.abi_version(),
            "the plugin implements",
        )?;
        if world != want {
            return Err(PluginErrorKind::Malformed(format!(
                "plugin.toml says {want} but the plugin implements {world}"
            )));
        }
        let exports = match want {
            ExportedWorld::Environment => abi_extism::ENVIRONMENT_EXPORTS,
            ExportedWorld::Reward => abi_extism::REWARD_EXPORTS,
        };
        if let Some(missing) = exports
            .iter()
            .find(|name| !instance.as_ref().is_some_and(|p| p.function_exists(name)))
        {
            return Err(PluginErrorKind::Malformed(format!(
                "implements {world} but does not export `{missing}`"
            )));
        }
        Ok(())
    }

    /// Calls `export` on `instance` (taken out while the call runs; left `None` if the call
    /// failed in a way that may have broken the instance) with the deadline, and returns its
    /// output.
    async fn call_export(
        &self,
        instance: &mut Option<Plugin>,
        call: &'static str,
        export: &'static str,
        input: Option<Vec<u8>>,
        seed: u64,
    ) -> Result<String, PluginErrorKind> {
        let mut plugin = instance.take().ok_or(PluginErrorKind::Poisoned)?;
        let cancel = plugin.cancel_handle();
        let clock = Arc::new(HostClock::default());
        let ctx = CallCtx {
            host: self.host.clone(),
            seed,
            runtime: tokio::runtime::Handle::current(),
            clock: clock.clone(),
        };
        let mut task = tokio::task::spawn_blocking(move || {
            let input = input.unwrap_or_default();
            let out = plugin
                .call_with_host_context::<&[u8], &[u8], CallCtx>(export, input.as_slice(), ctx)
                .map(<[u8]>::to_vec);
            (plugin, out)
        });
        let limit = self.limits.call_timeout;
        if let Ok(joined) = with_deadline(limit, &clock, &mut task).await {
            return match joined {
                Err(join) => Err(PluginErrorKind::Crash {
                    call,
                    message: join.to_string(),
                }),
                Ok((plugin, Ok(out))) => {
                    *instance = Some(plugin);
                    String::from_utf8(out).map_err(|e| PluginErrorKind::Undecodable {
                        call,
                        source: e.into(),
                    })
                }
                // The instance is dropped: after a trap it cannot be trusted.
                Ok((_, Err(e))) => Err(self.classify(call, &e)),
            };
        }
        // Past the deadline: interrupt the guest and wait for its thread to come back.
        loop {
            let _ = cancel.cancel();
            if tokio::time::timeout(CANCEL_RETRY, &mut task).await.is_ok() {
                break;
            }
        }
        Err(PluginErrorKind::Timeout { call, limit })
    }

    /// Tells a memory cap, fuel exhaustion, a trap and a plugin-reported error apart.
    fn classify(&self, call: &'static str, e: &extism::Error) -> PluginErrorKind {
        let messages: Vec<String> = e.chain().map(|c| c.to_string()).collect();
        if messages.iter().any(|m| m == "oom") {
            return PluginErrorKind::OutOfMemory {
                call,
                limit_mib: self.limits.memory_bytes >> 20,
            };
        }
        if messages.iter().any(|m| m.contains("ran out of fuel"))
            || e.downcast_ref::<wasmtime::Trap>() == Some(&wasmtime::Trap::OutOfFuel)
        {
            return PluginErrorKind::OutOfFuel {
                call,
                fuel: self.limits.fuel.unwrap_or(0),
            };
        }
        let trapped = e.downcast_ref::<wasmtime::Trap>().is_some()
            || e.chain()
                .any(|c| c.downcast_ref::<wasmtime::Trap>().is_some())
            || messages.iter().any(|m| m.contains("wasm trap"));
        let message = format!("{e:#}");
        if trapped {
            PluginErrorKind::Crash { call, message }
        } else {
            // The plugin set an Extism error (a PDK function returning an error).
            PluginErrorKind::Guest {
                call,
                error: GuestError::Internal(message),
            }
        }
    }
}
