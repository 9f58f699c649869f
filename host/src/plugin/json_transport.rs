//! Plugins reached by exchanging JSON documents, one call per WIT function: the Extism and native
//! backends. Both speak the same requests ([`rlhost_sdk::native::requests`]) and replies (the
//! SDK's types), so their environment and reward backends and their [`EnvSession`] are
//! implemented once, here, over a [`JsonTransport`]: reading `info` at load, which instance
//! serves which call, encoding requests, decoding replies. (The checks of `info` and metrics,
//! which components share, are in `loaded.rs`.)
//!
//! A transport provides only what differs: how it opens the artifact and checks its ABI, how a
//! call reaches the plugin, under which limits, and how its failures map to
//! [`PluginErrorKind`]. This module must never contain logic specific to one transport.

use std::sync::Arc;

use async_trait::async_trait;
use rlhost_sdk::extism::Outcome;
use rlhost_sdk::native::requests;
use rlhost_sdk::types::{
    DatasetPage, EnvInfo, EnvStep, EpisodeStart, Example, Message, Metric, RewardInfo, Rollout,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::Mutex;

use super::abi::ExportedWorld;
use super::loaded::{EnvBackend, LoadedEnvironment, LoadedReward, RewardBackend, checked_metrics};
use super::{EnvSession, HostParts, PluginError, PluginErrorKind, PluginFolder, PluginId};

/// A function of the `env` or `reward-fn` interface, as the JSON transports call it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Function {
    /// `env.info`: no input, returns [`EnvInfo`].
    EnvInfo,
    /// `env.dataset`: [`requests::Dataset`].
    Dataset,
    /// `env.initial-prompt`: [`requests::InitialPrompt`].
    InitialPrompt,
    /// `env.env-response`: [`requests::EnvResponse`].
    EnvResponse,
    /// `env.score`: [`requests::Score`].
    EnvScore,
    /// `reward-fn.info`: no input, returns [`RewardInfo`].
    RewardInfo,
    /// `reward-fn.score`: [`requests::RewardScore`].
    RewardScore,
}

impl Function {
    /// Its WIT name (`initial-prompt`), which errors name.
    pub(crate) fn wit_name(self) -> &'static str {
        match self {
            Function::EnvInfo | Function::RewardInfo => "info",
            Function::Dataset => "dataset",
            Function::InitialPrompt => "initial-prompt",
            Function::EnvResponse => "env-response",
            Function::EnvScore | Function::RewardScore => "score",
        }
    }

    /// Whether WIT declares it `-> result<T, plugin-error>` (all but `info`).
    pub(crate) fn returns_result(self) -> bool {
        !matches!(self, Function::EnvInfo | Function::RewardInfo)
    }
}

/// What a successful call returned, as its transport frames it.
pub(crate) enum Reply {
    /// The function's value as JSON: the transport has told a plugin error apart already
    /// (native status codes), or the function cannot fail (`info`).
    Value(Vec<u8>),
    /// A WIT `result<T, plugin-error>` as JSON ([`Outcome`]): `{"ok": T}` or `{"err": …}`.
    Outcome(Vec<u8>),
}

impl Reply {
    /// The value of `call`, or the plugin's own error.
    fn decode<O: DeserializeOwned>(self, call: &'static str) -> Result<O, PluginErrorKind> {
        let invalid = |e: serde_json::Error| PluginErrorKind::Undecodable {
            call,
            source: e.into(),
        };
        match self {
            Reply::Value(json) => serde_json::from_slice(&json).map_err(invalid),
            Reply::Outcome(json) => {
                let outcome: Outcome<O> = serde_json::from_slice(&json).map_err(invalid)?;
                Result::from(outcome).map_err(|error| PluginErrorKind::Guest { call, error })
            }
        }
    }
}

/// How a JSON plugin is opened and called: the Extism and native backends.
#[async_trait]
pub(crate) trait JsonTransport: Sized + Send + Sync + 'static {
    /// What a rollout holds between its calls: an Extism instance, or nothing for native plugins
    /// (their state travels in the JSON).
    type Instance: Send + 'static;

    /// Whether an instance keeps state between calls. Then `dataset` is served by one
    /// long-lived instance, calls taking turns, so a plugin that parses its data once keeps it;
    /// otherwise pages are served concurrently.
    const STATEFUL: bool;

    /// Opens the artifact of `folder`, checks that it implements `world` at an ABI this host
    /// supports (before calling anything else), and returns it with the instance that answered.
    async fn open(
        folder: &PluginFolder,
        parts: HostParts,
        world: ExportedWorld,
    ) -> Result<(Self, Self::Instance), PluginError>;

    /// Its identity in errors.
    fn id(&self) -> &PluginId;

    /// What it runs without, and what it lost while running.
    fn capabilities(&self) -> &super::CapabilityStatus;

    /// A new instance, sharing no state with earlier ones (each rollout gets its own).
    fn instance(&self) -> Result<Self::Instance, PluginError>;

    /// Whether `instance` can serve calls (one that failed in a way that may have broken it
    /// cannot).
    fn usable(instance: &Self::Instance) -> bool;

    /// Calls `function` on `instance` for the rollout seeded with `seed`, with its JSON request
    /// (none for `info`), under the call's limits.
    async fn call(
        &self,
        instance: &mut Self::Instance,
        function: Function,
        input: Option<Vec<u8>>,
        seed: u64,
    ) -> Result<Reply, PluginErrorKind>;
}

/// One call: encodes `request`, calls, decodes the reply as `O`.
async fn call<T: JsonTransport, O: DeserializeOwned>(
    transport: &T,
    instance: &mut T::Instance,
    function: Function,
    request: Option<&(impl Serialize + Sync)>,
    seed: u64,
) -> Result<O, PluginError> {
    let id = transport.id();
    let call = function.wit_name();
    let input = request
        .map(serde_json::to_vec)
        .transpose()
        .map_err(|source| PluginErrorKind::Encode { call, source }.of(id))?;
    transport
        .call(instance, function, input, seed)
        .await
        .and_then(|reply| reply.decode(call))
        .map_err(|kind| kind.of(id))
}

/// An Extism or native environment: which instance serves which call.
pub(crate) struct JsonEnvironment<T: JsonTransport> {
    transport: Arc<T>,
    /// The instance that serves `dataset` when instances keep state (replaced after a failure).
    dataset_instance: Mutex<T::Instance>,
}

impl<T: JsonTransport> JsonEnvironment<T> {
    /// Opens the environment in `folder` and reads its `info`; the instance that answered then
    /// serves `dataset`.
    pub(crate) async fn load(
        folder: PluginFolder,
        parts: HostParts,
    ) -> Result<LoadedEnvironment<Self>, PluginError> {
        let (transport, mut first) = T::open(&folder, parts, ExportedWorld::Environment).await?;
        let info: EnvInfo = call(&transport, &mut first, Function::EnvInfo, None::<&()>, 0).await?;
        let backend = Self {
            transport: Arc::new(transport),
            dataset_instance: Mutex::new(first),
        };
        LoadedEnvironment::new(backend, info)
    }
}

#[async_trait]
impl<T: JsonTransport> EnvBackend for JsonEnvironment<T> {
    fn id(&self) -> &PluginId {
        self.transport.id()
    }

    fn capabilities(&self) -> &super::CapabilityStatus {
        self.transport.capabilities()
    }

    async fn dataset(&self, request: &requests::Dataset) -> Result<DatasetPage, PluginError> {
        let function = Function::Dataset;
        if !T::STATEFUL {
            let mut instance = self.transport.instance()?;
            return call(&*self.transport, &mut instance, function, Some(request), 0).await;
        }
        let mut slot = self.dataset_instance.lock().await;
        if !T::usable(&*slot) {
            *slot = self.transport.instance()?;
        }
        call(&*self.transport, &mut *slot, function, Some(request), 0).await
    }

    async fn start(&self, seed: u64) -> Result<Box<dyn EnvSession>, PluginError> {
        Ok(Box::new(JsonEnvSession {
            instance: self.transport.instance()?,
            transport: self.transport.clone(),
            seed,
        }))
    }
}

/// One rollout of an Extism or native environment.
struct JsonEnvSession<T: JsonTransport> {
    transport: Arc<T>,
    instance: T::Instance,
    seed: u64,
}

impl<T: JsonTransport> JsonEnvSession<T> {
    async fn call<O: DeserializeOwned>(
        &mut self,
        function: Function,
        request: &(impl Serialize + Sync),
    ) -> Result<O, PluginError> {
        let transport = &*self.transport;
        call(
            transport,
            &mut self.instance,
            function,
            Some(request),
            self.seed,
        )
        .await
    }
}

#[async_trait]
impl<T: JsonTransport> EnvSession for JsonEnvSession<T> {
    async fn initial_prompt(
        &mut self,
        example: &Example,
        env_args: &str,
    ) -> Result<EpisodeStart, PluginError> {
        let request = requests::InitialPrompt {
            example: example.clone(),
            env_args: env_args.to_owned(),
        };
        self.call(Function::InitialPrompt, &request).await
    }

    async fn env_response(
        &mut self,
        conversation: &[Message],
        state: &str,
    ) -> Result<EnvStep, PluginError> {
        let request = requests::EnvResponse {
            conversation: conversation.to_vec(),
            state: state.to_owned(),
        };
        self.call(Function::EnvResponse, &request).await
    }

    async fn score(&mut self, rollout: &Rollout) -> Result<Vec<Metric>, PluginError> {
        let request = requests::Score {
            rollout: rollout.clone(),
        };
        let metrics = self.call(Function::EnvScore, &request).await?;
        checked_metrics(self.transport.id(), metrics)
    }
}

/// An Extism or native reward function. Every `score` gets a fresh instance.
pub(crate) struct JsonReward<T: JsonTransport> {
    transport: T,
}

impl<T: JsonTransport> JsonReward<T> {
    /// Opens the reward function in `folder` and reads its `info`.
    pub(crate) async fn load(
        folder: PluginFolder,
        parts: HostParts,
    ) -> Result<LoadedReward<Self>, PluginError> {
        let (transport, mut first) = T::open(&folder, parts, ExportedWorld::Reward).await?;
        let info: RewardInfo =
            call(&transport, &mut first, Function::RewardInfo, None::<&()>, 0).await?;
        LoadedReward::new(Self { transport }, info)
    }
}

#[async_trait]
impl<T: JsonTransport> RewardBackend for JsonReward<T> {
    fn id(&self) -> &PluginId {
        self.transport.id()
    }

    fn capabilities(&self) -> &super::CapabilityStatus {
        self.transport.capabilities()
    }

    async fn score(
        &self,
        request: &requests::RewardScore,
        seed: u64,
    ) -> Result<Vec<Metric>, PluginError> {
        let mut instance = self.transport.instance()?;
        let function = Function::RewardScore;
        call(
            &self.transport,
            &mut instance,
            function,
            Some(request),
            seed,
        )
        .await
    }
}
