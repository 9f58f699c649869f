//! Where the trainer's weights go after each step: the colocated engine (tensors copied in
//! memory, no disk) or remote OpenAI-compatible servers (a folder published atomically under
//! `OUTPUT/weights/step_N`, loaded by each server through the route of its kind,
//! [`crate::rollout::WeightSync`]; the two newest folders are kept). With LoRA, only the
//! adapter moves: the engine copies the trainer's adapter tensors in place, servers load its
//! PEFT folder in place; both serve it as [`POLICY_ADAPTER`].

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;

use super::checkpoint::publish_dir;
use super::trainer::Trainer;
use crate::engine::{AdapterSource, Engine, WeightSource};
use crate::rollout::{OpenAiPool, SyncTarget, WeightSync};

/// The name under which generators serve the adapter a LoRA run trains (rollouts ask for it).
pub const POLICY_ADAPTER: &str = "policy";

/// The receiver of each step's weights.
pub enum WeightSink {
    /// The in-process engine.
    Engine(Engine),
    /// Remote servers, reading folders under `root`.
    Servers {
        /// The servers.
        pool: Arc<OpenAiPool>,
        /// How each server (in the pool's order) takes weights.
        targets: Vec<SyncTarget>,
        /// Where step folders are written.
        root: PathBuf,
    },
}

impl WeightSink {
    /// The sink of remote `pool`, each server checked for `sync` ([`OpenAiPool`]'s clients'
    /// `prepare_sync`: the route exists, vLLM's model is untied).
    pub fn servers(
        rt: &tokio::runtime::Runtime,
        pool: Arc<OpenAiPool>,
        sync: WeightSync,
        root: PathBuf,
        adapters: bool,
    ) -> anyhow::Result<Self> {
        let mut targets = Vec::new();
        for c in pool.clients() {
            let t = rt
                .block_on(c.prepare_sync(sync, adapters))
                .with_context(|| format!("orchestrator.client.weight_sync = {:?}", sync.name()))?;
            tracing::info!("{}: weights through {}", c.base_url(), t.kind.name());
            targets.push(t);
        }
        // Servers that report no version are tracked from the steps published; where they
        // share the pool with rlhost servers, those are counted the same way.
        if targets.iter().any(|t| t.kind != WeightSync::Rlhost) {
            for c in pool.clients() {
                c.pin_versions();
            }
        }
        Ok(Self::Servers {
            pool,
            targets,
            root,
        })
    }

    /// Brings the generators to the trainer's weights before the first step (`start`, 0 for a
    /// new run) and returns the policy version they serve: the engine and rlhost servers hold
    /// the initial weights already (a resumed run publishes its own); where servers that report
    /// no version take part, every server is loaded the weights of `start` in any case (version
    /// `start`), so what they served before the run cannot leak into it.
    pub fn initial(
        &self,
        rt: &tokio::runtime::Runtime,
        trainer: &Trainer,
        start: usize,
    ) -> anyhow::Result<u64> {
        let untracked = match self {
            Self::Engine(_) => false,
            Self::Servers { targets, .. } => targets.iter().any(|t| t.kind != WeightSync::Rlhost),
        };
        // A LoRA run's adapter is loaded before the first rollouts, which ask for it.
        if start > 0 || untracked || trainer.model.lora().is_some() {
            self.publish(rt, trainer, start)
        } else {
            Ok(0)
        }
    }

    /// Hands the trainer's weights after `step` steps over; returns the policy version the
    /// generators now serve (`step` where servers report none).
    pub fn publish(
        &self,
        rt: &tokio::runtime::Runtime,
        trainer: &Trainer,
        step: usize,
    ) -> anyhow::Result<u64> {
        let lora = trainer.model.lora();
        match self {
            Self::Engine(e) => Ok(match lora {
                Some(l) => {
                    let source = AdapterSource::Lora(l.shallow_clone());
                    rt.block_on(e.load_adapter(POLICY_ADAPTER, source, true))?
                }
                None => rt.block_on(e.update_weights(WeightSource::Tensors(trainer.weights())))?,
            }),
            Self::Servers {
                pool,
                targets,
                root,
            } => {
                let untied = targets.iter().any(SyncTarget::needs_untied);
                let dst = publish_dir(root, &format!("step_{step}"), |tmp| {
                    match lora {
                        Some(l) => l.save_peft(tmp, l.base().unwrap_or_default(), None)?,
                        None if untied => trainer.model.save_untied(tmp)?,
                        None => trainer.model.save(tmp)?,
                    }
                    Ok(())
                })?;
                let what = if lora.is_some() { "adapter" } else { "weights" };
                let mut version = step as u64;
                for (c, t) in pool.clients().iter().zip(targets) {
                    let loaded = match lora {
                        Some(_) => {
                            rt.block_on(c.load_adapter(POLICY_ADAPTER, &dst, t, step as u64))
                        }
                        None => rt.block_on(c.update_weights(&dst, t, step as u64)),
                    };
                    version = loaded.with_context(|| {
                        format!(
                            "loading the {what} of step {step} into {} ({})",
                            c.base_url(),
                            t.kind.name()
                        )
                    })?;
                }
                // Servers have loaded it; keep only the newest two folders.
                if step >= 2 {
                    let _ = std::fs::remove_dir_all(root.join(format!("step_{}", step - 2)));
                }
                Ok(version)
            }
        }
    }

    /// Stops the in-process engine (servers are left running).
    pub fn shutdown(&self) {
        if let Self::Engine(e) = self {
            e.shutdown();
        }
    }
}
