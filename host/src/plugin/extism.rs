//! Extism plugins: core WebAssembly modules built with any Extism PDK, speaking the JSON ABI of
//! `sdk/extism.md` ([`rlhost_sdk::extism`]), behind the same traits and limits as components.
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
use extism::{CompiledPlugin, CurrentPlugin, Function, PTR, Plugin, PluginBuilder, UserData, Val};
use rlhost_sdk::extism as abi_extism;
use rlhost_sdk::extism::Outcome;
use rlhost_sdk::native::requests;
use rlhost_sdk::types::{
    DatasetPage, EnvInfo, EnvStep, EpisodeStart, Example, Message, Metric,
    PluginError as GuestError, PythonOutput, RewardInfo, Rollout,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::Mutex;

use super::abi::{self, ExportedWorld};
use super::component::{HostClock, with_deadline};
use super::host_api::HostContext;
use super::{
    EnvSession, Environment, HostParts, PluginError, PluginErrorKind, PluginFolder, PluginId,
    PluginLimits, RewardFn, validate,
};

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

fn host_functions() -> Vec<Function> {
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
struct Shared {
    compiled: CompiledPlugin,
    host: Arc<HostContext>,
    limits: PluginLimits,
}

impl Shared {
    /// Compiles the module in `folder` and checks that it implements `want` at a supported ABI
    /// version, reading the ABI export before anything else; returns the instance it asked.
    async fn load(
        folder: &PluginFolder,
        parts: HostParts,
        want: ExportedWorld,
    ) -> Result<(Arc<Self>, Option<Plugin>), PluginError> {
        let id = &folder.id;
        let bytes = std::fs::read(&folder.artifact).map_err(|e| {
            PluginErrorKind::Io {
                path: folder.artifact.clone(),
                message: e.to_string(),
            }
            .of(id)
        })?;
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
                r.map_err(|e| {
                    PluginErrorKind::Malformed(format!("cannot load the Extism plugin: {e:#}"))
                })
            })
            .map_err(|k| k.of(id))?;
        let shared = Arc::new(Self {
            compiled,
            host: Arc::new(parts.context(folder)),
            limits,
        });
        let mut first = shared.instance()?;
        let declared = shared
            .call_raw(
                &mut first,
                "abi-version",
                abi_extism::ABI_VERSION_EXPORT,
                None,
                0,
            )
            .await
            .map_err(|k| k.of(id))?;
        let (world, version) = abi::parse_export_name(declared.trim())
            .map_err(|m| PluginErrorKind::Malformed(m).of(id))?
            .ok_or_else(|| {
                PluginErrorKind::Malformed(format!(
                    "`{}` returned {declared:?}, not an rlhost:env interface name such as \
                     \"rlhost:env/env@{}\"",
                    abi_extism::ABI_VERSION_EXPORT,
                    rlhost_sdk::ABI_VERSION
                ))
                .of(id)
            })?;
        if abi::supported_for(&version).is_none() {
            return Err(PluginErrorKind::AbiMismatch {
                found: version,
                supported: abi::supported_description(),
            }
            .of(id));
        }
        if world != want {
            return Err(PluginErrorKind::Malformed(format!(
                "plugin.toml says {want} but the plugin implements {world}"
            ))
            .of(id));
        }
        let declared_in_manifest = folder.manifest.abi_version();
        if !abi::compatible(&declared_in_manifest, &version) {
            return Err(PluginErrorKind::Malformed(format!(
                "plugin.toml says rlhost:env@{declared_in_manifest} but the plugin implements \
                 rlhost:env@{version}"
            ))
            .of(id));
        }
        let exports = match want {
            ExportedWorld::Environment => abi_extism::ENVIRONMENT_EXPORTS,
            ExportedWorld::Reward => abi_extism::REWARD_EXPORTS,
        };
        if let Some(missing) = exports
            .iter()
            .find(|name| !first.as_ref().is_some_and(|p| p.function_exists(name)))
        {
            return Err(PluginErrorKind::Malformed(format!(
                "implements {world} but does not export `{missing}`"
            ))
            .of(id));
        }
        Ok((shared, first))
    }

    fn id(&self) -> &PluginId {
        &self.host.plugin
    }

    /// A fresh instance.
    fn instance(&self) -> Result<Option<Plugin>, PluginError> {
        Plugin::new_from_compiled(&self.compiled)
            .map(Some)
            .map_err(|e| {
                PluginErrorKind::Malformed(format!("cannot instantiate: {e:#}")).of(self.id())
            })
    }

    /// Calls `export` on `plugin` (taken out while the call runs; left `None` if the call failed
    /// in a way that may have broken the instance) with the deadline, and returns its output.
    async fn call_raw(
        &self,
        plugin: &mut Option<Plugin>,
        call: &'static str,
        export: &'static str,
        input: Option<Vec<u8>>,
        seed: u64,
    ) -> Result<String, PluginErrorKind> {
        let mut instance = plugin.take().ok_or(PluginErrorKind::Poisoned)?;
        let cancel = instance.cancel_handle();
        let clock = Arc::new(HostClock::default());
        let ctx = CallCtx {
            host: self.host.clone(),
            seed,
            runtime: tokio::runtime::Handle::current(),
            clock: clock.clone(),
        };
        let mut task = tokio::task::spawn_blocking(move || {
            let input = input.unwrap_or_default();
            let out = instance
                .call_with_host_context::<&[u8], &[u8], CallCtx>(export, input.as_slice(), ctx)
                .map(<[u8]>::to_vec);
            (instance, out)
        });
        let limit = self.limits.call_timeout;
        let timed_out = match with_deadline(limit, &clock, &mut task).await {
            Ok(joined) => {
                return match joined {
                    Err(join) => Err(PluginErrorKind::Crash {
                        call,
                        message: join.to_string(),
                    }),
                    Ok((instance, Ok(out))) => {
                        *plugin = Some(instance);
                        String::from_utf8(out).map_err(|e| PluginErrorKind::InvalidReturn {
                            call,
                            message: format!("not UTF-8: {e}"),
                        })
                    }
                    // The instance is dropped: after a trap it cannot be trusted.
                    Ok((_, Err(e))) => Err(self.classify(call, &e)),
                };
            }
            Err(_) => true,
        };
        debug_assert!(timed_out);
        // Interrupt the guest and wait for its thread to come back.
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

    /// One JSON call: encodes `input`, decodes the output as `O`.
    async fn call<O: DeserializeOwned>(
        &self,
        plugin: &mut Option<Plugin>,
        call: &'static str,
        export: &'static str,
        input: Option<&impl Serialize>,
        seed: u64,
    ) -> Result<O, PluginError> {
        let input = input.map(serde_json::to_vec).transpose().map_err(|e| {
            PluginErrorKind::Malformed(format!("cannot encode the request: {e}")).of(self.id())
        })?;
        let out = self
            .call_raw(plugin, call, export, input, seed)
            .await
            .map_err(|k| k.of(self.id()))?;
        serde_json::from_str(&out).map_err(|e| {
            PluginErrorKind::InvalidReturn {
                call,
                message: e.to_string(),
            }
            .of(self.id())
        })
    }

    /// A call whose WIT return type is `result<T, plugin-error>`.
    async fn call_result<O: DeserializeOwned>(
        &self,
        plugin: &mut Option<Plugin>,
        call: &'static str,
        export: &'static str,
        input: &impl Serialize,
        seed: u64,
    ) -> Result<O, PluginError> {
        let outcome: Outcome<O> = self.call(plugin, call, export, Some(input), seed).await?;
        Result::from(outcome).map_err(|error| PluginErrorKind::Guest { call, error }.of(self.id()))
    }
}

/// An Extism environment, loaded.
pub(crate) struct ExtismEnvironment {
    shared: Arc<Shared>,
    info: EnvInfo,
    /// The instance that serves `dataset` (replaced after a failure).
    dataset_instance: Mutex<Option<Plugin>>,
}

impl ExtismEnvironment {
    pub(crate) async fn load(folder: PluginFolder, parts: HostParts) -> Result<Self, PluginError> {
        // The instance that answered the ABI check serves `info` (and, for environments, `dataset`).
        let (shared, mut instance) =
            Shared::load(&folder, parts, ExportedWorld::Environment).await?;
        let info: EnvInfo = shared
            .call(&mut instance, "info", "info", None::<&()>, 0)
            .await?;
        let info = validate::checked(&folder.id, "info", info, validate::env_info)?;
        Ok(Self {
            shared,
            info,
            dataset_instance: Mutex::new(instance),
        })
    }
}

#[async_trait]
impl Environment for ExtismEnvironment {
    fn id(&self) -> &PluginId {
        self.shared.id()
    }

    fn info(&self) -> &EnvInfo {
        &self.info
    }

    async fn dataset(
        &self,
        split: &str,
        offset: u64,
        limit: u32,
    ) -> Result<DatasetPage, PluginError> {
        let mut slot = self.dataset_instance.lock().await;
        if slot.is_none() {
            *slot = self.shared.instance()?;
        }
        let req = requests::Dataset {
            split: split.to_owned(),
            offset,
            limit,
        };
        self.shared
            .call_result(&mut slot, "dataset", "dataset", &req, 0)
            .await
    }

    async fn start(&self, seed: u64) -> Result<Box<dyn EnvSession>, PluginError> {
        Ok(Box::new(ExtismEnvSession {
            plugin: self.shared.instance()?,
            shared: self.shared.clone(),
            seed,
        }))
    }
}

/// One rollout's instance of an Extism environment.
struct ExtismEnvSession {
    shared: Arc<Shared>,
    /// `None` once a call broke it.
    plugin: Option<Plugin>,
    seed: u64,
}

#[async_trait]
impl EnvSession for ExtismEnvSession {
    async fn initial_prompt(
        &mut self,
        example: &Example,
        env_args: &str,
    ) -> Result<EpisodeStart, PluginError> {
        let req = requests::InitialPrompt {
            example: example.clone(),
            env_args: env_args.to_owned(),
        };
        self.shared
            .call_result(
                &mut self.plugin,
                "initial-prompt",
                "initial_prompt",
                &req,
                self.seed,
            )
            .await
    }

    async fn env_response(
        &mut self,
        conversation: &[Message],
        state: &str,
    ) -> Result<EnvStep, PluginError> {
        let req = requests::EnvResponse {
            conversation: conversation.to_vec(),
            state: state.to_owned(),
        };
        self.shared
            .call_result(
                &mut self.plugin,
                "env-response",
                "env_response",
                &req,
                self.seed,
            )
            .await
    }

    async fn score(&mut self, rollout: &Rollout) -> Result<Vec<Metric>, PluginError> {
        let req = requests::Score {
            rollout: rollout.clone(),
        };
        let metrics: Vec<Metric> = self
            .shared
            .call_result(&mut self.plugin, "score", "score", &req, self.seed)
            .await?;
        validate::checked(self.shared.id(), "score", metrics, |m| validate::metrics(m))
    }
}

/// An Extism reward function, loaded.
pub(crate) struct ExtismReward {
    shared: Arc<Shared>,
    info: RewardInfo,
}

impl ExtismReward {
    pub(crate) async fn load(folder: PluginFolder, parts: HostParts) -> Result<Self, PluginError> {
        // The instance that answered the ABI check serves `info` (and, for environments, `dataset`).
        let (shared, mut instance) = Shared::load(&folder, parts, ExportedWorld::Reward).await?;
        let info: RewardInfo = shared
            .call(&mut instance, "info", "info", None::<&()>, 0)
            .await?;
        let info = validate::checked(&folder.id, "info", info, validate::reward_info)?;
        Ok(Self { shared, info })
    }
}

#[async_trait]
impl RewardFn for ExtismReward {
    fn id(&self) -> &PluginId {
        self.shared.id()
    }

    fn info(&self) -> &RewardInfo {
        &self.info
    }

    async fn score(
        &self,
        completion: &str,
        answer: &str,
        info: &str,
        seed: u64,
    ) -> Result<Vec<Metric>, PluginError> {
        let req = requests::RewardScore {
            completion: completion.to_owned(),
            answer: answer.to_owned(),
            info: info.to_owned(),
        };
        let mut instance = self.shared.instance()?;
        let metrics: Vec<Metric> = self
            .shared
            .call_result(&mut instance, "score", "score", &req, seed)
            .await?;
        validate::checked(self.shared.id(), "score", metrics, |m| validate::metrics(m))
    }
}
