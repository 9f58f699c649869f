//! Training: GRPO (`host rl`) and supervised fine-tuning (`host sft`).
//!
//! - [`config`]: the trainer, orchestrator and inference configs (`@ file.toml`, dotted
//!   overrides, `configs/NAME/rl/*.toml` defaults).
//! - [`run`]: the RL loop: the orchestrator (rollouts from a colocated engine or remote
//!   servers, up to `async_level` batches ahead, group advantages, optional difficulty
//!   filtering), weight updates to the engine or the servers after each step, checkpoints and
//!   `--resume`, `metrics.jsonl` and `curves.png`.
//! - [`trainer`]: one optimiser step (AdamW, learning-rate schedules, gradient clipping,
//!   micro-batches with shared prompt prefixes) on either objective: the policy-gradient loss or
//!   the likelihood (SFT).
//! - [`loss`]: the policy-gradient losses (truncated IS, PPO clip-higher, KL k3) and group
//!   advantages (drgrpo, grpo, rloo).
//! - [`sft`]: conversations (OpenAI messages or `host eval` rollouts) into samples, one per
//!   assistant turn or one token stream per conversation as produced, and the SFT run.
//! - [`plot`]: the curves as a PNG.

pub mod config;
pub mod loss;
pub mod plot;
pub mod run;
pub mod sft;
pub mod trainer;
