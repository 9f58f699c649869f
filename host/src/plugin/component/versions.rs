//! The component ABI versions, dispatched: for each [`AbiVersion`], the linker, pre-instantiated
//! bindings and calls of the module that adapts it (`v0_1_0`: bindings, host imports,
//! conversions to the SDK's types). This is the one file of the backend that names a version
//! module; the rest speaks the SDK's types. A new version adds its module, a variant to each enum
//! here and an arm to each `match`; the modules of older versions are not edited.

use rlhost_sdk::types::{
    DatasetPage, EnvInfo, EnvStep, EpisodeStart, Example, Message, Metric,
    PluginError as GuestError, RewardInfo, Rollout,
};
use wasmtime::component::{InstancePre, Linker};
use wasmtime::{Engine, Store};

use super::GuestState;
use super::v0_1_0;
#[cfg(test)]
use super::v0_2_0_fixture;
use crate::plugin::abi::AbiVersion;

/// A guest call's outcome: a trap or host failure (outer), else the plugin's own answer.
pub(super) type GuestResult<T> = wasmtime::Result<Result<T, GuestError>>;

/// The linker for components of `abi`: WASI, and the host imports of that version.
pub(super) fn linker(engine: &Engine, abi: AbiVersion) -> wasmtime::Result<Linker<GuestState>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
    match abi {
        AbiVersion::V0_1_0 => v0_1_0::add_to_linker(&mut linker)?,
        #[cfg(test)]
        AbiVersion::V0_2_0Fixture => v0_2_0_fixture::add_to_linker(&mut linker)?,
    }
    Ok(linker)
}

/// An environment component, pre-instantiated with the bindings of its version.
#[derive(Clone)]
pub(super) enum EnvPre {
    V0_1_0(v0_1_0::env_world::EnvironmentPre<GuestState>),
    #[cfg(test)]
    V0_2_0Fixture(v0_2_0_fixture::env_world::EnvironmentPre<GuestState>),
}

impl EnvPre {
    /// Checks that `pre` exports the `env` interface of `abi`.
    pub(super) fn new(abi: AbiVersion, pre: InstancePre<GuestState>) -> wasmtime::Result<Self> {
        Ok(match abi {
            AbiVersion::V0_1_0 => Self::V0_1_0(v0_1_0::env_world::EnvironmentPre::new(pre)?),
            #[cfg(test)]
            AbiVersion::V0_2_0Fixture => {
                Self::V0_2_0Fixture(v0_2_0_fixture::env_world::EnvironmentPre::new(pre)?)
            }
        })
    }

    /// A fresh instance in `store`.
    pub(super) async fn instantiate(
        &self,
        store: &mut Store<GuestState>,
    ) -> wasmtime::Result<EnvExports> {
        Ok(match self {
            Self::V0_1_0(pre) => EnvExports::V0_1_0(pre.instantiate_async(store).await?),
            #[cfg(test)]
            Self::V0_2_0Fixture(pre) => {
                EnvExports::V0_2_0Fixture(pre.instantiate_async(store).await?)
            }
        })
    }
}

/// An environment instance's exports, by version.
pub(super) enum EnvExports {
    V0_1_0(v0_1_0::env_world::Environment),
    #[cfg(test)]
    V0_2_0Fixture(v0_2_0_fixture::env_world::Environment),
}

/// Runs `$body` with `$env` bound to the `env` export of whichever version `$exports` holds and
/// `$m` naming that version's module (its conversions): for the calls every version makes alike.
/// A version whose function differs gets an arm of its own in that call instead.
macro_rules! on_env {
    ($exports:expr, |$env:ident, $m:ident| $body:expr) => {
        match $exports {
            EnvExports::V0_1_0(world) => {
                use v0_1_0 as $m;
                let $env = $m::env(world);
                $body
            }
            #[cfg(test)]
            EnvExports::V0_2_0Fixture(world) => {
                use v0_2_0_fixture as $m;
                let $env = $m::env(world);
                $body
            }
        }
    };
}

impl EnvExports {
    pub(super) async fn info(&self, store: &mut Store<GuestState>) -> GuestResult<EnvInfo> {
        on_env!(self, |env, m| Ok(Ok(m::env_info_out(
            env.call_info(store).await?
        ))))
    }

    pub(super) async fn dataset(
        &self,
        store: &mut Store<GuestState>,
        split: &str,
        offset: u64,
        limit: u32,
    ) -> GuestResult<DatasetPage> {
        on_env!(self, |env, m| {
            let page = env.call_dataset(store, split, offset, limit).await?;
            Ok(page.map(m::page_out).map_err(m::error_out))
        })
    }

    pub(super) async fn initial_prompt(
        &self,
        store: &mut Store<GuestState>,
        example: &Example,
        env_args: &str,
    ) -> GuestResult<EpisodeStart> {
        on_env!(self, |env, m| {
            let example = m::example_in(example);
            let start = env.call_initial_prompt(store, &example, env_args).await?;
            Ok(start.map(m::episode_start_out).map_err(m::error_out))
        })
    }

    pub(super) async fn env_response(
        &self,
        store: &mut Store<GuestState>,
        conversation: &[Message],
        state: &str,
    ) -> GuestResult<EnvStep> {
        on_env!(self, |env, m| {
            let conversation: Vec<_> = conversation.iter().map(m::message_in).collect();
            let step = env.call_env_response(store, &conversation, state).await?;
            Ok(step.map(m::env_step_out).map_err(m::error_out))
        })
    }

    pub(super) async fn score(
        &self,
        store: &mut Store<GuestState>,
        rollout: &Rollout,
    ) -> GuestResult<Vec<Metric>> {
        on_env!(self, |env, m| {
            let rollout = m::rollout_in(rollout);
            let metrics = env.call_score(store, &rollout).await?;
            Ok(metrics.map(m::metrics_out).map_err(m::error_out))
        })
    }
}

/// A reward-function component, pre-instantiated with the bindings of its version.
#[derive(Clone)]
pub(super) enum RewardPre {
    V0_1_0(v0_1_0::reward_world::RewardPre<GuestState>),
}

impl RewardPre {
    /// Checks that `pre` exports the `reward-fn` interface of `abi`.
    pub(super) fn new(abi: AbiVersion, pre: InstancePre<GuestState>) -> wasmtime::Result<Self> {
        match abi {
            AbiVersion::V0_1_0 => Ok(Self::V0_1_0(v0_1_0::reward_world::RewardPre::new(pre)?)),
            // The fixture version declares an environment world only.
            #[cfg(test)]
            AbiVersion::V0_2_0Fixture => {
                wasmtime::bail!("rlhost:env@0.2.0-fixture has no reward world")
            }
        }
    }

    /// A fresh instance in `store`.
    pub(super) async fn instantiate(
        &self,
        store: &mut Store<GuestState>,
    ) -> wasmtime::Result<RewardExports> {
        Ok(match self {
            Self::V0_1_0(pre) => RewardExports::V0_1_0(pre.instantiate_async(store).await?),
        })
    }
}

/// A reward instance's exports, by version.
pub(super) enum RewardExports {
    V0_1_0(v0_1_0::reward_world::Reward),
}

impl RewardExports {
    pub(super) async fn info(&self, store: &mut Store<GuestState>) -> GuestResult<RewardInfo> {
        match self {
            Self::V0_1_0(world) => {
                let info = v0_1_0::reward_fn(world).call_info(store).await?;
                Ok(Ok(v0_1_0::reward_info_out(info)))
            }
        }
    }

    pub(super) async fn score(
        &self,
        store: &mut Store<GuestState>,
        completion: &str,
        answer: &str,
        info: &str,
    ) -> GuestResult<Vec<Metric>> {
        match self {
            Self::V0_1_0(world) => {
                let metrics = v0_1_0::reward_fn(world)
                    .call_score(store, completion, answer, info)
                    .await?;
                Ok(metrics.map(v0_1_0::metrics_out).map_err(v0_1_0::error_out))
            }
        }
    }
}
