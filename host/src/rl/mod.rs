//! GRPO training (`host rl`): losses and group advantages today; the orchestrator, trainer,
//! weight sync and checkpoints build on them.

pub mod loss;
