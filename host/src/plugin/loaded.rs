//! The one implementation of [`Environment`] and [`RewardFn`], whatever the backend: the
//! plugin's identity, its `info` (read once at load and checked here), and the checks on what
//! `score` returns. A backend (components; the JSON transport of Extism and native plugins)
//! supplies only its calls, through [`EnvBackend`] and [`RewardBackend`], with the SDK's request
//! types as arguments. This module must never contain logic specific to one backend.

use async_trait::async_trait;
use rlhost_sdk::native::requests;
use rlhost_sdk::types::{DatasetPage, EnvInfo, Metric, RewardInfo};

use super::{CapabilityStatus, EnvSession, Environment, PluginError, PluginId, RewardFn, validate};

/// What a backend does for a loaded environment.
#[async_trait]
pub(crate) trait EnvBackend: Send + Sync + 'static {
    /// The plugin's identity in errors.
    fn id(&self) -> &PluginId;

    /// What the plugin runs without, and what it lost while running.
    fn capabilities(&self) -> &CapabilityStatus;

    /// A page of a split, as the plugin answers it.
    async fn dataset(&self, request: &requests::Dataset) -> Result<DatasetPage, PluginError>;

    /// A session of its own for one rollout, seeded with `seed`. Its `score` checks the
    /// metrics with [`checked_metrics`].
    async fn start(&self, seed: u64) -> Result<Box<dyn EnvSession>, PluginError>;
}

/// What a backend does for a loaded reward function.
#[async_trait]
pub(crate) trait RewardBackend: Send + Sync + 'static {
    /// The plugin's identity in errors.
    fn id(&self) -> &PluginId;

    /// What the plugin runs without, and what it lost while running.
    fn capabilities(&self) -> &CapabilityStatus;

    /// Scores in a fresh instance seeded with `seed`; the metrics as the plugin answers them.
    async fn score(
        &self,
        request: &requests::RewardScore,
        seed: u64,
    ) -> Result<Vec<Metric>, PluginError>;
}

/// `score`'s metrics, checked (unique names, finite values).
pub(crate) fn checked_metrics(
    id: &PluginId,
    metrics: Vec<Metric>,
) -> Result<Vec<Metric>, PluginError> {
    validate::checked(id, "score", metrics, |m| validate::metrics(m))
}

/// An environment, loaded: its backend and its checked `info`.
pub(crate) struct LoadedEnvironment<B> {
    backend: B,
    info: EnvInfo,
}

impl<B: EnvBackend> LoadedEnvironment<B> {
    /// Wraps `backend` once its `info` answered; refuses an invalid `info`.
    pub(crate) fn new(backend: B, info: EnvInfo) -> Result<Self, PluginError> {
        let info = validate::checked(backend.id(), "info", info, validate::env_info)?;
        Ok(Self { backend, info })
    }
}

#[async_trait]
impl<B: EnvBackend> Environment for LoadedEnvironment<B> {
    fn id(&self) -> &PluginId {
        self.backend.id()
    }

    fn info(&self) -> &EnvInfo {
        &self.info
    }

    fn capabilities(&self) -> &CapabilityStatus {
        self.backend.capabilities()
    }

    async fn dataset(
        &self,
        split: &str,
        offset: u64,
        limit: u32,
    ) -> Result<DatasetPage, PluginError> {
        let request = requests::Dataset {
            split: split.to_owned(),
            offset,
            limit,
        };
        self.backend.dataset(&request).await
    }

    async fn start(&self, seed: u64) -> Result<Box<dyn EnvSession>, PluginError> {
        self.backend.start(seed).await
    }
}

/// A reward function, loaded: its backend and its checked `info`.
pub(crate) struct LoadedReward<B> {
    backend: B,
    info: RewardInfo,
}

impl<B: RewardBackend> LoadedReward<B> {
    /// Wraps `backend` once its `info` answered; refuses an invalid `info`.
    pub(crate) fn new(backend: B, info: RewardInfo) -> Result<Self, PluginError> {
        let info = validate::checked(backend.id(), "info", info, validate::reward_info)?;
        Ok(Self { backend, info })
    }
}

#[async_trait]
impl<B: RewardBackend> RewardFn for LoadedReward<B> {
    fn id(&self) -> &PluginId {
        self.backend.id()
    }

    fn info(&self) -> &RewardInfo {
        &self.info
    }

    fn capabilities(&self) -> &CapabilityStatus {
        self.backend.capabilities()
    }

    async fn score(
        &self,
        completion: &str,
        answer: &str,
        info: &str,
        seed: u64,
    ) -> Result<Vec<Metric>, PluginError> {
        let request = requests::RewardScore {
            completion: completion.to_owned(),
            answer: answer.to_owned(),
            info: info.to_owned(),
        };
        let metrics = self.backend.score(&request, seed).await?;
        checked_metrics(self.backend.id(), metrics)
    }
}
