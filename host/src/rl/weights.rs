//! Where the trainer's weights go after each step: the colocated engine (tensors copied in
//! memory, no disk) or remote OpenAI-compatible servers (a folder published atomically under
//! `OUTPUT/weights/step_N`, loaded by each server through `POST /update_weights`; the two
//! newest folders are kept).

use std::path::PathBuf;
use std::sync::Arc;

use super::checkpoint::publish_dir;
use super::trainer::Trainer;
use crate::engine::{Engine, WeightSource};
use crate::rollout::OpenAiPool;

/// The receiver of each step's weights.
pub enum WeightSink {
    /// The in-process engine.
    Engine(Engine),
    /// Remote servers, reading folders under `root`.
    Servers {
        /// The servers.
        pool: Arc<OpenAiPool>,
        /// Where step folders are written.
        root: PathBuf,
    },
}

impl WeightSink {
    /// Hands the trainer's weights after `step` steps over; returns the policy version the
    /// generators now serve.
    pub fn publish(
        &self,
        rt: &tokio::runtime::Runtime,
        trainer: &Trainer,
        step: usize,
    ) -> anyhow::Result<u64> {
        match self {
            Self::Engine(e) => {
                Ok(rt.block_on(e.update_weights(WeightSource::Tensors(trainer.weights())))?)
            }
            Self::Servers { pool, root } => {
                let dst = publish_dir(root, &format!("step_{step}"), |tmp| {
                    Ok(trainer.model.save(tmp)?)
                })?;
                let mut version = step as u64;
                for c in pool.clients() {
                    if let Some(v) = rt.block_on(c.update_weights(&dst))? {
                        version = v;
                    }
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
