//! GRPO training (`host rl`): losses and group advantages, and the trainer's optimiser step;
//! the orchestrator, weight sync and checkpoints build on them.

pub mod config;
pub mod loss;
pub mod plot;
pub mod run;
pub mod sft;
pub mod trainer;
