//! Training: GRPO (`host rl`) and supervised fine-tuning (`host sft`).
//!
//! - [`config`]: the trainer, orchestrator and inference configs (`@ file.toml`, dotted
//!   overrides, `configs/NAME/rl/*.toml` defaults).
//! - [`run`]: the RL loop, reading as the loop: batches in, a trainer step, weights out,
//!   evaluations, the step line, checkpoints.
//! - [`orchestrator`]: each step's rollouts from the weighted mixture of training
//!   environments (up to `async_level` batches ahead), dynamic sampling, group advantages
//!   (failed rollouts left out; length penalty, overlong punishment, difficulty filtering),
//!   merged multi-turn samples, the off-policy drop, per-env statistics.
//! - [`curriculum`]: the pass-rate curriculum: which examples a step draws, its history by
//!   step so batches generated ahead and resumed runs draw the same.
//! - [`weights`]: the weight sink: the colocated engine in memory, or remote servers.
//! - [`checkpoint`]: checkpoints and published weight folders (one atomic-publish helper).
//! - [`evals`]: evaluations during training (`[orchestrator.eval]`).
//! - [`metrics`]: the step line, `metrics.jsonl` and `curves.png`.
//! - [`trainer`]: one optimiser step (AdamW, learning-rate schedules, gradient clipping,
//!   micro-batches with shared prompt prefixes) on either objective: the policy-gradient loss or
//!   the likelihood (SFT).
//! - [`loss`]: the objectives (truncated IS, PPO clip-higher, IcePop, GSPO, CISPO, DPPO), the
//!   KL penalty, group advantages (drgrpo, grpo, rloo) and the length penalty.
//! - [`sft`]: conversations (OpenAI messages or `host eval` rollouts) into samples, one per
//!   assistant turn or one token stream per conversation as produced, and the SFT run.
//! - [`plot`]: the curves as a PNG.

pub mod checkpoint;
pub mod config;
pub mod curriculum;
pub mod evals;
pub mod logprobs;
pub mod loss;
pub mod metrics;
pub mod orchestrator;
pub mod plot;
pub mod run;
pub mod sft;
pub mod trainer;
pub mod weights;
