//! WebAssembly component plugins, run by wasmtime.
//!
//! - One [`ComponentRuntime`] per process: the engine, one linker per supported ABI version
//!   (WASI p2 with nothing granted but the plugin's data folder, read-only, at `/data`, and that
//!   version's `host` imports), and an epoch ticker thread that lets calls yield and be
//!   interrupted.
//! - The ABI version is read from the component before it is compiled; `versions.rs` maps it to
//!   the module of that version (`v0_1_0`), which owns its bindings, host imports and
//!   conversions. Everything else here speaks the SDK's types.
//! - Components are compiled once and cached on disk (`<cache>/components/*.cwasm`, keyed by
//!   the content hash and the engine's compatibility hash), then pre-instantiated
//!   (`InstancePre`); each rollout instantiates into a fresh `Store`, so rollouts never share
//!   state and a crash poisons only its own rollout.
//! - Limits: a wall-clock deadline per call (the guest yields every epoch tick, so a
//!   `tokio::time::timeout` can drop it while other rollouts run), a memory cap (a limiter that
//!   remembers it said no, so the error says "out of memory"), optional fuel.
//! - Determinism: clocks are frozen and WASI randomness is derived from the rollout seed.

mod v0_1_0;
#[cfg(test)]
mod v0_2_0_fixture;
mod versions;

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use rlhost_registry::manifest::PluginKind;
use rlhost_sdk::native::requests;
use rlhost_sdk::types::{
    DatasetPage, EnvInfo, EnvStep, EpisodeStart, Example, Message, Metric, RewardInfo, Rollout,
};
use tokio::sync::Mutex;
use wasmtime::component::{Component, Linker, ResourceTable};
use wasmtime::{Config, Engine, Store, Trap};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use self::versions::{EnvExports, EnvPre, GuestResult, RewardExports, RewardPre};
use super::abi::{self, AbiVersion, ExportedWorld};
use super::deadline::{HostClock, TimedOut, with_deadline};
use super::host_api::HostContext;
use super::loaded::{EnvBackend, LoadedEnvironment, LoadedReward, RewardBackend, checked_metrics};
use super::{
    BoxError, EnvSession, HostParts, PluginError, PluginErrorKind, PluginFolder, PluginId,
    PluginLimits,
};

/// Guest stderr kept for error messages (a panic message lands here).
const STDERR_CAPACITY: usize = 64 * 1024;

/// What a store holds for one instance.
pub(crate) struct GuestState {
    wasi: WasiCtx,
    table: ResourceTable,
    limiter: crate::wasm::MemoryCap,
    host: Arc<HostContext>,
    seed: u64,
    /// Time the current call spends in slow host imports (the Python sandbox, which has its
    /// own deadline): it does not count against the plugin's call timeout.
    host_clock: Arc<HostClock>,
}

impl GuestState {
    /// The clock of slow host imports.
    pub(crate) fn host_clock(&self) -> Arc<HostClock> {
        self.host_clock.clone()
    }
}

impl WasiView for GuestState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// The engine, linkers and compile cache shared by all component plugins.
pub struct ComponentRuntime {
    engine: Engine,
    /// One per supported ABI version, in the order of [`AbiVersion::ALL`].
    linkers: Vec<Linker<GuestState>>,
    cache_dir: Option<PathBuf>,
    _ticker: crate::wasm::EpochTicker,
}

fn runtime_id() -> PluginId {
    PluginId {
        name: "(plugin runtime)".into(),
        version: semver::Version::new(0, 0, 0),
    }
}

impl ComponentRuntime {
    /// Builds the engine for `limits` (fuel metering is compiled in only when asked for) and
    /// caches compiled components in `cache_dir`.
    pub fn new(limits: &PluginLimits, cache_dir: Option<PathBuf>) -> Result<Self, PluginError> {
        let fail = |what: &str, e: BoxError| PluginErrorKind::backend(what, e).of(&runtime_id());
        let mut config = Config::new();
        config
            .epoch_interruption(true)
            .consume_fuel(limits.fuel.is_some())
            .max_wasm_stack(1 << 20)
            .async_stack_size(4 << 20);
        // Pooled instances: a fresh instance per rollout (and per reward call) is the design,
        // so its cost matters. Slots are reused; the first pages of a memory are reset with
        // memset (cheaper than returning them to the kernel, which interrupts every core).
        let n = limits.max_instances.max(1);
        let mut pool = wasmtime::PoolingAllocationConfig::default();
        pool.total_component_instances(n)
            .total_core_instances(n.saturating_mul(8))
            .total_memories(n.saturating_mul(2))
            .total_tables(n.saturating_mul(8))
            .total_stacks(n)
            .max_memories_per_component(4)
            .max_core_instances_per_component(32)
            .max_memory_size(limits.memory_bytes)
            .linear_memory_keep_resident(4 << 20)
            .table_keep_resident(64 << 10)
            .async_stack_keep_resident(256 << 10);
        config.allocation_strategy(wasmtime::InstanceAllocationStrategy::Pooling(pool));
        let engine =
            Engine::new(&config).map_err(|e| fail("cannot create the engine", e.into()))?;
        let linkers = AbiVersion::ALL
            .iter()
            .map(|&abi| versions::linker(&engine, abi))
            .collect::<wasmtime::Result<_>>()
            .map_err(|e| fail("cannot link WASI and the host API", e.into()))?;
        let ticker = crate::wasm::EpochTicker::start(engine.clone())
            .map_err(|e| fail("cannot start the epoch thread", e.into()))?;
        Ok(Self {
            engine,
            linkers,
            cache_dir,
            _ticker: ticker,
        })
    }

    /// Links `component`, of ABI `abi`, with that version's linker.
    fn instantiate_pre(
        &self,
        abi: AbiVersion,
        component: &Component,
    ) -> wasmtime::Result<wasmtime::component::InstancePre<GuestState>> {
        let at = AbiVersion::ALL.iter().position(|&a| a == abi);
        let linker = &self.linkers[at.expect("every version has a linker")];
        linker.instantiate_pre(component)
    }

    /// Reads, checks and compiles (or loads from cache) a plugin's component; returns it with
    /// the ABI version it was built against.
    fn compile(&self, folder: &PluginFolder) -> Result<(Component, AbiVersion), PluginError> {
        let id = &folder.id;
        let bytes = folder.read_artifact()?;
        let (world, version) = abi::read_component_abi(&bytes).map_err(|source| {
            let path = folder.artifact.clone();
            PluginErrorKind::Artifact { path, source }.of(id)
        })?;
        let want = match folder.manifest.plugin.kind {
            PluginKind::Environment => ExportedWorld::Environment,
            PluginKind::Reward => ExportedWorld::Reward,
        };
        if world != want {
            return Err(PluginErrorKind::Malformed(format!(
                "plugin.toml says {want} but the component exports {world}"
            ))
            .of(id));
        }
        let declared = folder.manifest.abi_version();
        let abi = abi::check_reported(version, &declared, "the component exports")
            .map_err(|k| k.of(id))?;
        let cache = self.cache_dir.as_deref();
        let component = crate::wasm::compile_cached(&self.engine, &bytes, cache)
            .map_err(|e| PluginErrorKind::backend("cannot compile the component", e).of(id))?;
        Ok((component, abi))
    }

    /// Loads an environment component.
    pub(crate) async fn load_environment(
        &self,
        folder: PluginFolder,
        parts: HostParts,
    ) -> Result<LoadedEnvironment<ComponentEnvironment>, PluginError> {
        let (component, abi) = self.compile(&folder)?;
        let pre = self
            .instantiate_pre(abi, &component)
            .and_then(|pre| EnvPre::new(abi, pre))
            .map_err(|e| cannot_link(&folder, e))?;
        let shared = Arc::new(EnvShared {
            host: Arc::new(parts.context(&folder)),
            limits: parts.limits,
            pre,
            runtime: self.handle(),
        });
        let mut first = ComponentEnvSession::start(&shared, 0).await?;
        let info = first.info().await?;
        let backend = ComponentEnvironment {
            shared,
            dataset_session: Mutex::new(Some(first)),
        };
        LoadedEnvironment::new(backend, info)
    }

    /// Loads a reward-function component.
    pub(crate) async fn load_reward(
        &self,
        folder: PluginFolder,
        parts: HostParts,
    ) -> Result<LoadedReward<ComponentReward>, PluginError> {
        let (component, abi) = self.compile(&folder)?;
        let pre = self
            .instantiate_pre(abi, &component)
            .and_then(|pre| RewardPre::new(abi, pre))
            .map_err(|e| cannot_link(&folder, e))?;
        let reward = ComponentReward {
            host: Arc::new(parts.context(&folder)),
            limits: parts.limits,
            pre,
            runtime: self.handle(),
        };
        let info = reward.read_info().await?;
        LoadedReward::new(reward, info)
    }

    fn handle(&self) -> RuntimeHandle {
        RuntimeHandle {
            engine: self.engine.clone(),
        }
    }
}

fn cannot_link(folder: &PluginFolder, e: wasmtime::Error) -> PluginError {
    PluginErrorKind::backend("cannot link", e).of(&folder.id)
}

/// What sessions need of the runtime (the engine; the ticker lives as long as the runtime).
#[derive(Clone)]
struct RuntimeHandle {
    engine: Engine,
}

impl RuntimeHandle {
    /// A fresh store for one instance: WASI with nothing granted but `/data` (read-only),
    /// frozen clocks, seeded randomness, captured stderr, memory cap, epoch yielding, fuel.
    fn store(
        &self,
        host: &Arc<HostContext>,
        limits: &PluginLimits,
        seed: u64,
        stderr: &MemoryOutputPipe,
    ) -> Result<Store<GuestState>, PluginError> {
        let mut wasi = WasiCtxBuilder::new();
        wasi.allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .wall_clock(crate::wasm::FrozenClock)
            .monotonic_clock(crate::wasm::FrozenClock)
            .secure_random(wasmtime_wasi::Deterministic::new(
                crate::wasm::seeded_bytes(seed, 4096),
            ))
            .insecure_random(wasmtime_wasi::Deterministic::new(
                crate::wasm::seeded_bytes(!seed, 4096),
            ))
            .insecure_random_seed(u128::from(seed))
            .stderr(stderr.clone());
        if let Some(data) = &host.data {
            wasi.preopened_dir(data.root(), "/data", wasmtime_wasi::FsPerms::ReadOnly)
                .map_err(|e| {
                    let doing = format!("cannot read {}", data.root().display());
                    PluginErrorKind::backend(doing, e).of(&host.plugin)
                })?;
        }
        let state = GuestState {
            wasi: wasi.build(),
            table: ResourceTable::new(),
            limiter: crate::wasm::MemoryCap::new(limits.memory_bytes),
            host: host.clone(),
            seed,
            host_clock: Default::default(),
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limiter);
        store.set_epoch_deadline(1);
        store.epoch_deadline_async_yield_and_update(1);
        if let Some(fuel) = limits.fuel {
            store
                .set_fuel(fuel)
                .map_err(|e| PluginErrorKind::backend("cannot set fuel", e).of(&host.plugin))?;
        }
        Ok(store)
    }
}

/// Turns the outcome of a guarded guest call into a result, telling timeouts, memory
/// exhaustion, fuel exhaustion and crashes apart.
fn settle<R>(
    store: &Store<GuestState>,
    stderr: &MemoryOutputPipe,
    limits: &PluginLimits,
    call: &'static str,
    outcome: Result<wasmtime::Result<R>, TimedOut>,
) -> Result<R, PluginErrorKind> {
    let err = match outcome {
        Ok(Ok(r)) => return Ok(r),
        Err(_) => {
            return Err(PluginErrorKind::Timeout {
                call,
                limit: limits.call_timeout,
            });
        }
        Ok(Err(e)) => e,
    };
    if store.data().limiter.refused() {
        return Err(PluginErrorKind::OutOfMemory {
            call,
            limit_mib: limits.memory_bytes >> 20,
        });
    }
    match err.downcast_ref::<Trap>() {
        Some(Trap::OutOfFuel) => Err(PluginErrorKind::OutOfFuel {
            call,
            fuel: limits.fuel.unwrap_or(0),
        }),
        Some(Trap::Interrupt) => Err(PluginErrorKind::Timeout {
            call,
            limit: limits.call_timeout,
        }),
        _ => {
            let headline = err.to_string();
            let printed = String::from_utf8_lossy(&stderr.contents())
                .trim()
                .to_owned();
            let message = if printed.is_empty() {
                headline
            } else {
                // The tail holds the panic message, if the guest panicked.
                let tail: String = printed
                    .chars()
                    .rev()
                    .take(2000)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect();
                format!("{headline}; plugin stderr: {tail}")
            };
            Err(PluginErrorKind::Crash { call, message })
        }
    }
}

/// One instance of a component in its own store: a rollout's environment, or one reward call.
/// `B` is its exports, of whichever ABI version it was built against.
pub(crate) struct Instance<B> {
    host: Arc<HostContext>,
    limits: PluginLimits,
    store: Store<GuestState>,
    stderr: MemoryOutputPipe,
    exports: B,
    /// A call failed in a way that may have left the instance broken (trap, timeout).
    poisoned: bool,
}

impl<B> Instance<B> {
    /// Instantiates into a fresh store, under the call deadline.
    async fn new(
        runtime: &RuntimeHandle,
        host: &Arc<HostContext>,
        limits: &PluginLimits,
        seed: u64,
        make: impl AsyncFnOnce(&mut Store<GuestState>) -> wasmtime::Result<B>,
    ) -> Result<Self, PluginError> {
        let stderr = MemoryOutputPipe::new(STDERR_CAPACITY);
        let mut store = runtime.store(host, limits, seed, &stderr)?;
        let outcome = tokio::time::timeout(limits.call_timeout, make(&mut store))
            .await
            .map_err(|_| TimedOut);
        let exports = settle(&store, &stderr, limits, "instantiate", outcome)
            .map_err(|k| k.of(&host.plugin))?;
        Ok(Self {
            host: host.clone(),
            limits: limits.clone(),
            store,
            stderr,
            exports,
            poisoned: false,
        })
    }

    /// Runs one guest call with the deadline and fuel, settles it, and poisons the instance if
    /// it may be broken: anything but a return, the plugin reporting an error being a return.
    async fn call<T>(
        &mut self,
        call: &'static str,
        guest: impl AsyncFnOnce(&B, &mut Store<GuestState>) -> GuestResult<T>,
    ) -> Result<T, PluginError> {
        let plugin = &self.host.plugin;
        if self.poisoned {
            return Err(PluginErrorKind::Poisoned.of(plugin));
        }
        if let Some(fuel) = self.limits.fuel {
            self.store
                .set_fuel(fuel)
                .map_err(|e| PluginErrorKind::backend("cannot set fuel", e).of(plugin))?;
        }
        let host_clock = self.store.data().host_clock();
        host_clock.reset();
        let running = guest(&self.exports, &mut self.store);
        let outcome = with_deadline(self.limits.call_timeout, &host_clock, running).await;
        let settled = settle(&self.store, &self.stderr, &self.limits, call, outcome);
        if settled.is_err() {
            self.poisoned = true;
        }
        settled
            .map_err(|kind| kind.of(plugin))?
            .map_err(|error| PluginErrorKind::Guest { call, error }.of(plugin))
    }
}

struct EnvShared {
    host: Arc<HostContext>,
    limits: PluginLimits,
    pre: EnvPre,
    runtime: RuntimeHandle,
}

/// One rollout's instance of an environment component.
type ComponentEnvSession = Instance<EnvExports>;

impl ComponentEnvSession {
    async fn start(shared: &EnvShared, seed: u64) -> Result<Self, PluginError> {
        let pre = shared.pre.clone();
        Self::new(
            &shared.runtime,
            &shared.host,
            &shared.limits,
            seed,
            async move |store: &mut Store<GuestState>| pre.instantiate(store).await,
        )
        .await
    }

    /// `info`, as the plugin answers it.
    async fn info(&mut self) -> Result<EnvInfo, PluginError> {
        self.call("info", async |e, s| e.info(s).await).await
    }

    async fn dataset(&mut self, request: &requests::Dataset) -> Result<DatasetPage, PluginError> {
        let requests::Dataset {
            split,
            offset,
            limit,
        } = request;
        self.call("dataset", async |e, s| {
            e.dataset(s, split, *offset, *limit).await
        })
        .await
    }
}

#[async_trait]
impl EnvSession for ComponentEnvSession {
    async fn initial_prompt(
        &mut self,
        example: &Example,
        env_args: &str,
    ) -> Result<EpisodeStart, PluginError> {
        self.call("initial-prompt", async |e, s| {
            e.initial_prompt(s, example, env_args).await
        })
        .await
    }

    async fn env_response(
        &mut self,
        conversation: &[Message],
        state: &str,
    ) -> Result<EnvStep, PluginError> {
        self.call("env-response", async |e, s| {
            e.env_response(s, conversation, state).await
        })
        .await
    }

    async fn score(&mut self, rollout: &Rollout) -> Result<Vec<Metric>, PluginError> {
        let metrics = self
            .call("score", async |e, s| e.score(s, rollout).await)
            .await?;
        checked_metrics(&self.host.plugin, metrics)
    }
}

/// An environment component: its instances.
pub(crate) struct ComponentEnvironment {
    shared: Arc<EnvShared>,
    /// Dataset pages are served by one long-lived instance, so a plugin parses its data once.
    dataset_session: Mutex<Option<ComponentEnvSession>>,
}

#[async_trait]
impl EnvBackend for ComponentEnvironment {
    fn id(&self) -> &PluginId {
        &self.shared.host.plugin
    }

    fn capabilities(&self) -> &super::CapabilityStatus {
        &self.shared.host.capabilities
    }

    async fn dataset(&self, request: &requests::Dataset) -> Result<DatasetPage, PluginError> {
        let mut slot = self.dataset_session.lock().await;
        if slot.as_ref().is_none_or(|s| s.poisoned) {
            *slot = Some(ComponentEnvSession::start(&self.shared, 0).await?);
        }
        let session = slot.as_mut().expect("filled above");
        session.dataset(request).await
    }

    async fn start(&self, seed: u64) -> Result<Box<dyn EnvSession>, PluginError> {
        Ok(Box::new(
            ComponentEnvSession::start(&self.shared, seed).await?,
        ))
    }
}

/// A reward-function component. Every `score` runs in a fresh instance.
pub(crate) struct ComponentReward {
    host: Arc<HostContext>,
    limits: PluginLimits,
    pre: RewardPre,
    runtime: RuntimeHandle,
}

impl ComponentReward {
    async fn instance(&self, seed: u64) -> Result<Instance<RewardExports>, PluginError> {
        let pre = self.pre.clone();
        Instance::new(
            &self.runtime,
            &self.host,
            &self.limits,
            seed,
            async move |store: &mut Store<GuestState>| pre.instantiate(store).await,
        )
        .await
    }

    /// `info`, as the plugin answers it.
    async fn read_info(&self) -> Result<RewardInfo, PluginError> {
        let mut instance = self.instance(0).await?;
        instance.call("info", async |e, s| e.info(s).await).await
    }
}

#[async_trait]
impl RewardBackend for ComponentReward {
    fn id(&self) -> &PluginId {
        &self.host.plugin
    }

    fn capabilities(&self) -> &super::CapabilityStatus {
        &self.host.capabilities
    }

    async fn score(
        &self,
        request: &requests::RewardScore,
        seed: u64,
    ) -> Result<Vec<Metric>, PluginError> {
        let requests::RewardScore {
            completion,
            answer,
            info,
        } = request;
        let mut instance = self.instance(seed).await?;
        instance
            .call("score", async |e, s| {
                e.score(s, completion, answer, info).await
            })
            .await
    }
}
