//! The `[trainer]` section of `host rl` (its `[optim]` and `[loss]` tables are
//! [`OptimConfig`] and [`LossConfig`], next to the code that reads them).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::rl::loss::LossConfig;
use crate::rl::trainer::{Checkpointing, OptimConfig};

/// The model a section uses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// The model: a Hugging Face folder or hub id (`Qwen/Qwen3-8B`, read from the local HF
    /// cache).
    #[arg(
        long = "model.name",
        visible_alias = "model",
        short = 'm',
        value_name = "MODEL"
    )]
    pub name: String,
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            name: "Qwen/Qwen3-8B".into(),
        }
    }
}

/// The model the trainer trains: [`ModelConfig`]'s name, and how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TrainerModelConfig {
    /// The model: a Hugging Face folder or hub id (`Qwen/Qwen3-8B`, read from the local HF
    /// cache).
    pub name: String,
    /// Train LoRA adapters instead of every weight (`[model.lora]` in the trainer's file:
    /// `rank`, `alpha`, `dropout`, `target_modules`, `use_rslora`; unset: full fine-tuning;
    /// `--model.lora.rank 16` sets it too). The base stays frozen; the engine serves the
    /// adapter as `policy` and takes the new one each step (remote servers load its PEFT
    /// folder in place), and `OUTPUT/final` is a PEFT folder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<crate::model::LoraConfig>,
}

impl Default for TrainerModelConfig {
    fn default() -> Self {
        Self {
            name: ModelConfig::default().name,
            lora: None,
        }
    }
}

/// Trainer data settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct DataConfig {
    /// Longest training sample in tokens (prompt + completion); longer turns are left out.
    pub seq_len: usize,
    /// Samples of `seq_len` per micro-batch: a micro-batch holds at most
    /// `seq_len × micro_batch_size` tokens (padded ones included unless `packing`).
    pub micro_batch_size: usize,
    /// Pack micro-batches: whole samples end to end in one row of at most
    /// `seq_len × micro_batch_size` tokens (a group's shared prompt counted once), each
    /// attending only to itself and its prompt (per-sequence attention), no padding. The loss,
    /// gradients and update are those of unpacked training. false: one right-padded row per
    /// sample.
    pub packing: bool,
}

impl Default for DataConfig {
    fn default() -> Self {
        Self {
            seq_len: 12_288,
            micro_batch_size: 1,
            packing: false,
        }
    }
}

/// Checkpoints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct CkptConfig {
    /// Steps between checkpoints (0: only at the end).
    pub interval: usize,
    /// Checkpoints kept; older ones are deleted (at least 1).
    pub keep: usize,
}

impl Default for CkptConfig {
    fn default() -> Self {
        Self {
            interval: 25,
            keep: 2,
        }
    }
}

/// The `[trainer]` section: the policy, its optimiser and loss, batching and checkpoints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TrainerConfig {
    /// Optimiser steps (the run takes the smaller of this and `orchestrator.max_steps`).
    pub max_steps: usize,
    /// The policy trained.
    pub model: TrainerModelConfig,
    /// AdamW and its learning-rate schedule.
    pub optim: OptimConfig,
    /// The policy-gradient objective.
    pub loss: LossConfig,
    /// Sample length and micro-batching.
    pub data: DataConfig,
    /// Checkpoints.
    pub ckpt: CkptConfig,
    /// Device of the trainer: `auto` (CUDA when present, else CPU), `cpu`, `cuda`, `cuda:N`.
    pub device: String,
    /// Compute dtype of the policy: `auto` (bf16 on CUDA, f32 on CPU), `f32`, or `bf16` (mixed
    /// precision: bf16 weights, activations and gradients; f32 master weights, AdamW moments,
    /// gradient sums over micro-batches and log-softmax).
    pub dtype: String,
    /// Activation checkpointing of the decoder layers: `none`, `full` (every layer runs again
    /// in the backward pass) or `selective` (every second layer).
    pub ac: Checkpointing,
    /// Keep AdamW's state (moments, f32 master weights) in host memory and run the update
    /// there; the device holds weights, gradients and activations only.
    pub optim_cpu_offload: bool,
    /// Run no forward or backward pass for samples of advantage 0 when the objective gives them
    /// no gradient (no `loss.kl_coef`, no dppo_kl `kl_tau`): the same update, less compute
    /// (counted per step in `zero_advantage_samples`). Their tokens still count in the loss's
    /// normalisation; a batch of nothing else updates nothing (no momentum or decay step).
    pub skip_zero_advantage: bool,
}

impl Default for TrainerConfig {
    fn default() -> Self {
        Self {
            max_steps: 300,
            model: TrainerModelConfig::default(),
            optim: OptimConfig::default(),
            loss: LossConfig::default(),
            data: DataConfig::default(),
            ckpt: CkptConfig::default(),
            device: "auto".into(),
            dtype: "auto".into(),
            ac: Checkpointing::None,
            optim_cpu_offload: false,
            skip_zero_advantage: true,
        }
    }
}

impl TrainerConfig {
    /// The precision `dtype` names on `device` ([`crate::device::Precision::for_training`]).
    pub fn precision(
        &self,
        device: tch::Device,
    ) -> Result<crate::device::Precision, crate::device::DeviceError> {
        crate::device::Precision::for_training(&self.dtype, device)
    }
}
