//! The RL loop behind `host rl`: an orchestrator produces batches of scored rollouts from the
//! environment's train split through the shared rollout loop; the trainer takes a step on each;
//! new weights go to the engine (colocated: in memory, no disk). With `async_level` ≥ 1 the
//! orchestrator generates the next batches while the trainer trains (at most `async_level`
//! batches ahead); every sample carries the policy version that produced it and the step line
//! reports the lag. Checkpoints (trainer weights + optimiser + counters, orchestrator step) are
//! written atomically every `ckpt.interval` steps; `--resume` continues from the newest.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use rlhost_sdk::types::Example;
use serde::Serialize;

use super::config::{RlConfig, RunOptions};
use super::loss::advantages;
use super::trainer::{Sample, Trainer};
use crate::engine::{Engine, EngineConfig, WeightSource};
use crate::plugin::Environment;
use crate::rollout::{Generator, RolloutRecord, RolloutSpec, Sampling, TurnTokens, run_rollout};

/// One step's worth of training data.
struct Batch {
    step: usize,
    records: Vec<RolloutRecord>,
    samples: Vec<Sample>,
    /// Groups kept after filtering.
    groups: usize,
    solve_all: usize,
    solve_none: usize,
    min_version: u64,
    seconds: f64,
    /// Multi-turn rollouts that became one merged sample.
    merged_rollouts: usize,
    /// Multi-turn rollouts that became one sample per turn.
    unmerged_rollouts: usize,
    /// Tokens of the per-turn samples the batch's rollouts make (before merging).
    sample_tokens: usize,
}

/// What one step reports (a line of `metrics.jsonl`).
#[derive(Debug, Clone, Serialize)]
pub struct StepLine {
    /// Step (1-based).
    pub step: usize,
    /// Mean reward of the batch's rollouts.
    pub reward: f64,
    /// Mean of each metric.
    pub metrics: BTreeMap<String, f64>,
    /// Groups where every rollout succeeded / failed.
    pub solve_all: usize,
    /// See `solve_all`.
    pub solve_none: usize,
    /// Groups trained on, after online difficulty filtering (the effective batch).
    pub groups: usize,
    /// Samples trained on.
    pub samples: usize,
    /// Mean sample length in tokens.
    pub seq_len: f64,
    /// Share of truncated rollouts.
    pub truncated: f64,
    /// Failed rollouts.
    pub failed: usize,
    /// The trainer's step statistics.
    pub loss: f64,
    /// Gradient norm.
    pub grad_norm: f64,
    /// Learning rate.
    pub lr: f64,
    /// Mean importance ratio.
    pub ratio_mean: f64,
    /// Largest importance ratio.
    pub ratio_max: f64,
    /// Clipped token share.
    pub clipped_frac: f64,
    /// Trainer policy version minus the oldest sample's.
    pub policy_lag: u64,
    /// Rollout generation seconds (overlaps training when async).
    pub rollout_s: f64,
    /// Training seconds.
    pub train_s: f64,
    /// Trained tokens per training second.
    pub tokens_per_s: f64,
    /// The step was skipped (non-finite).
    pub skipped: bool,
    /// Multi-turn rollouts trained as one sample (every turn's prompt extends the previous
    /// turn's prompt and completion exactly).
    pub merged_rollouts: usize,
    /// Multi-turn rollouts trained as one sample per turn: the chat template rewrote history
    /// (a turn's prompt does not extend the previous turn's prompt and completion exactly).
    pub unmerged_rollouts: usize,
    /// Tokens of the step's per-turn samples: what training every model turn as a sample of its
    /// own, in full, would compute.
    pub sample_tokens: usize,
    /// Tokens the trainer's forward passes covered, after merging turns and running each
    /// group's shared prompt once.
    pub train_tokens_computed: usize,
    /// Prompt tokens the step's rollouts sent to the engine (every turn's prompt in full).
    pub prefill_tokens: u64,
    /// Of those, the tokens the engine computed: the rest came from its prefix cache.
    pub prefill_computed: u64,
}

impl StepLine {
    /// Training tokens computed of the per-turn samples' tokens, compact (`tok 12.3k/40.1k`),
    /// for the terminal's step line.
    pub fn train_tokens_figure(&self) -> String {
        fn short(n: usize) -> String {
            match n {
                0..1_000 => n.to_string(),
                1_000..1_000_000 => format!("{:.1}k", n as f64 / 1e3),
                _ => format!("{:.1}M", n as f64 / 1e6),
            }
        }
        format!(
            "tok {}/{}",
            short(self.train_tokens_computed),
            short(self.sample_tokens)
        )
    }

    /// Prompt tokens the engine computed of those the rollouts asked for, compact
    /// (`prefill 1.2k/40.1k`).
    pub fn prefill_figure(&self) -> String {
        let short = |n: u64| match n {
            0..1_000 => n.to_string(),
            1_000..1_000_000 => format!("{:.1}k", n as f64 / 1e3),
            _ => format!("{:.1}M", n as f64 / 1e6),
        };
        format!(
            "prefill {}/{}",
            short(self.prefill_computed),
            short(self.prefill_tokens)
        )
    }
}

fn success(r: &RolloutRecord) -> bool {
    match r.metrics.get("correct") {
        Some(&c) => c >= 0.5,
        None => r.reward > 0.0,
    }
}

/// The samples one rollout makes.
#[derive(Debug, Default)]
struct RolloutSamples {
    samples: Vec<Sample>,
    /// For a rollout of two turns or more: whether its turns became one merged sample.
    merged: Option<bool>,
    /// Tokens of its per-turn samples (those within `seq_len`).
    per_turn_tokens: usize,
    /// The oldest policy version of the turns trained on.
    min_version: Option<u64>,
}

/// The samples of one rollout's model turns (turns that generated nothing have nothing to
/// train). When every turn's prompt extends the previous turn's prompt + completion exactly,
/// one sample: the last turn's prompt + completion, trained on each turn's generated tokens
/// (with its sampler log-probs) and on nothing else, each turn normalised as a sequence of its
/// own. Otherwise one sample per turn. A turn longer than `seq_len` is left out either way (a
/// merged sample ends with the last turn that fits: turns only grow).
fn rollout_samples(
    r: &RolloutRecord,
    advantage: f32,
    group: usize,
    masked: bool,
    seq_len: usize,
) -> anyhow::Result<RolloutSamples> {
    let turns: Vec<&TurnTokens> = r
        .turns
        .iter()
        .filter(|t| !t.completion_ids.is_empty())
        .collect();
    for t in &turns {
        anyhow::ensure!(
            !t.prompt_ids.is_empty() && t.logprobs.len() == t.completion_ids.len(),
            "the generation server returned no token ids or log-probs; RL needs both \
             (rlhost's server and vLLM >= 0.10.2 return them when asked)"
        );
    }
    let len = |t: &TurnTokens| t.prompt_ids.len() + t.completion_ids.len();
    let fits = |t: &TurnTokens| {
        let n = len(t);
        if n > seq_len {
            tracing::warn!("a {n}-token turn exceeds seq_len {seq_len}: left out");
        }
        n <= seq_len
    };
    let extends = turns.windows(2).all(|w| {
        let (a, b) = (&w[0].prompt_ids, &w[1].prompt_ids);
        b.starts_with(a) && b[a.len()..].starts_with(&w[0].completion_ids)
    });
    let mut out = RolloutSamples {
        merged: (turns.len() > 1).then_some(extends),
        ..Default::default()
    };
    let mut add = |turns: &[&TurnTokens]| {
        let Some(last) = turns.last() else {
            return;
        };
        let ids: Vec<u32> = last
            .prompt_ids
            .iter()
            .chain(&last.completion_ids)
            .copied()
            .collect();
        let mut mask = vec![false; ids.len()];
        let mut old = vec![0f32; ids.len()];
        let mut turn_starts = Vec::new();
        for (k, t) in turns.iter().enumerate() {
            let (a, b) = (t.prompt_ids.len(), len(t));
            mask[a..b].fill(!masked);
            old[a..b].copy_from_slice(&t.logprobs);
            if k > 0 {
                turn_starts.push(a);
            }
            out.per_turn_tokens += b;
            if let Some(v) = t.policy_version {
                out.min_version = Some(out.min_version.map_or(v, |m| m.min(v)));
            }
        }
        out.samples.push(Sample {
            ids,
            mask,
            old_logprobs: old,
            advantage,
            group,
            turn_starts,
        });
    };
    if extends {
        let fitting: Vec<&TurnTokens> = turns.into_iter().filter(|t| fits(t)).collect();
        add(&fitting);
    } else {
        for t in turns.into_iter().filter(|t| fits(t)) {
            add(&[t]);
        }
    }
    Ok(out)
}

/// Turns a step's rollouts into samples ([`rollout_samples`]: one per rollout where its turns
/// merge exactly, else one per model turn), each trained with its group's advantage and
/// carrying its group (the example index) so the trainer runs the group's prompt once.
fn build_batch(
    cfg: &RlConfig,
    step: usize,
    records: Vec<RolloutRecord>,
    seconds: f64,
) -> anyhow::Result<Batch> {
    let seq_len = cfg.trainer.data.seq_len;
    // A step where nothing could be generated trains nothing: stop with the reason instead of
    // stepping on (a server without token ids, a broken environment).
    if let Some(first) = records.first().and_then(|r| r.error.as_ref())
        && records.iter().all(|r| r.error.is_some())
    {
        anyhow::bail!(
            "every rollout of step {step} failed ({} of them); the first: {first}",
            records.len()
        );
    }
    let mut groups: BTreeMap<usize, Vec<&RolloutRecord>> = BTreeMap::new();
    for r in &records {
        groups.entry(r.example_index).or_default().push(r);
    }
    let mut samples = Vec::new();
    let (mut kept, mut solve_all, mut solve_none) = (0, 0, 0);
    let (mut merged, mut unmerged, mut sample_tokens) = (0, 0, 0);
    let mut min_version = u64::MAX;
    for (&example, group) in &groups {
        let wins = group.iter().filter(|r| success(r)).count();
        if wins == group.len() {
            solve_all += 1;
        }
        if wins == 0 {
            solve_none += 1;
        }
        let rewards: Vec<f64> = group.iter().map(|r| r.reward).collect();
        let same = rewards.iter().all(|&x| (x - rewards[0]).abs() < 1e-12);
        if cfg.orchestrator.online_difficulty_filtering && same {
            continue;
        }
        kept += 1;
        let adv = advantages(cfg.orchestrator.advantage, &rewards);
        for (r, a) in group.iter().zip(adv) {
            if r.error.is_some() {
                continue;
            }
            let masked = cfg.orchestrator.mask_truncated_completions && r.truncated;
            let made = rollout_samples(r, a as f32, example, masked, seq_len)?;
            match made.merged {
                Some(true) => merged += 1,
                Some(false) => unmerged += 1,
                None => {}
            }
            sample_tokens += made.per_turn_tokens;
            if let Some(v) = made.min_version {
                min_version = min_version.min(v);
            }
            samples.extend(made.samples);
        }
    }
    Ok(Batch {
        step,
        records,
        samples,
        groups: kept,
        solve_all,
        solve_none,
        min_version: if min_version == u64::MAX {
            0
        } else {
            min_version
        },
        seconds,
        merged_rollouts: merged,
        unmerged_rollouts: unmerged,
        sample_tokens,
    })
}

/// Everything the orchestrator needs to produce batches.
struct Producer {
    env: Arc<dyn Environment>,
    generator: Arc<dyn Generator>,
    model: String,
    examples: Vec<Example>,
    order: Vec<usize>,
    cfg: RlConfig,
    env_args: String,
}

impl Producer {
    async fn batch(&self, step: usize) -> anyhow::Result<Batch> {
        let o = &self.cfg.orchestrator;
        let started = Instant::now();
        let problems = (o.batch_size / o.rollouts_per_example).max(1);
        let sampling = Sampling {
            max_tokens: Some(o.sampling.max_tokens),
            temperature: Some(o.sampling.temperature),
            seed: Some(o.seed.wrapping_add(step as u64 * 7919)),
            history: o.history,
            ..Default::default()
        };
        let mut jobs = Vec::new();
        for p in 0..problems {
            let idx = self.order[(step * problems + p) % self.order.len()];
            for r in 0..o.rollouts_per_example {
                jobs.push((p, idx, r));
            }
        }
        use futures_util::StreamExt;
        let records: Vec<RolloutRecord> =
            futures_util::stream::iter(jobs.into_iter().map(|(p, idx, r)| {
                let spec = RolloutSpec {
                    env: self.env.as_ref(),
                    rewards: &[],
                    generator: self.generator.as_ref(),
                    model: &self.model,
                    example: &self.examples[idx],
                    example_index: p,
                    rollout_index: r,
                    env_args: &self.env_args,
                    sampling: &sampling,
                    seed: o
                        .seed
                        .wrapping_mul(0x9e37_79b9)
                        .wrapping_add((step * 1_000_003 + p * o.rollouts_per_example + r) as u64),
                    retries: 3,
                    require_tokens: true,
                };
                run_rollout(spec)
            }))
            .buffer_unordered(o.max_concurrent.max(1))
            .collect()
            .await;
        build_batch(&self.cfg, step, records, started.elapsed().as_secs_f64())
    }
}

/// A deterministic permutation of `n` (Fisher-Yates with the run's seed).
fn permutation(n: usize, seed: u64) -> Vec<usize> {
    let mut rng = crate::engine::Rng::new(seed ^ 0xda7a);
    let mut v: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = ((rng.uniform() * (i + 1) as f64) as usize).min(i);
        v.swap(i, j);
    }
    v
}

/// The newest complete checkpoint under `dir` and its step.
pub fn latest_checkpoint(dir: &Path) -> Option<(usize, PathBuf)> {
    let mut best: Option<(usize, PathBuf)> = None;
    for entry in std::fs::read_dir(dir.join("checkpoints")).ok()?.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let Some(step) = name
            .strip_prefix("step_")
            .and_then(|s| s.parse::<usize>().ok())
        else {
            continue;
        };
        // Complete only: the orchestrator's state is written last.
        if !entry.path().join("orchestrator_state.json").is_file() {
            continue;
        }
        if best.as_ref().is_none_or(|(s, _)| step > *s) {
            best = Some((step, entry.path()));
        }
    }
    best
}

fn save_checkpoint(out: &Path, trainer: &Trainer, step: usize, keep: usize) -> anyhow::Result<()> {
    let root = out.join("checkpoints");
    std::fs::create_dir_all(&root)?;
    let tmp = root.join(format!(".step_{step}.tmp"));
    let _ = std::fs::remove_dir_all(&tmp);
    trainer.save(&tmp)?;
    rlhost_fs::write_atomically(
        &tmp.join("orchestrator_state.json"),
        serde_json::json!({"step": step}).to_string().as_bytes(),
    )?;
    let dst = root.join(format!("step_{step}"));
    let _ = std::fs::remove_dir_all(&dst);
    std::fs::rename(&tmp, &dst).with_context(|| format!("publishing {}", dst.display()))?;
    // Keep the newest `keep`.
    let mut steps: Vec<usize> = std::fs::read_dir(&root)?
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_string_lossy()
                .strip_prefix("step_")?
                .parse()
                .ok()
        })
        .collect();
    steps.sort_unstable();
    for s in steps.iter().take(steps.len().saturating_sub(keep.max(1))) {
        let _ = std::fs::remove_dir_all(root.join(format!("step_{s}")));
    }
    Ok(())
}

/// The step of one line of a per-step log, if it is such a line.
fn step_of(line: &str) -> Option<usize> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    usize::try_from(v.get("step")?.as_u64()?).ok()
}

/// Keeps the lines of the per-step log `path` of steps up to `step` and drops the rest (and
/// any torn line), replacing the file atomically (tmp + rename): a crash meanwhile leaves the
/// old file or the new one. Returns how many lines went; an absent file is left absent.
fn keep_steps_up_to(path: &Path, step: usize) -> anyhow::Result<usize> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e.into()),
    };
    let total = text.lines().count();
    let mut kept = String::new();
    for line in text.lines() {
        if step_of(line).is_some_and(|s| s <= step) {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    let dropped = total - kept.lines().count();
    // Rewritten even when nothing is dropped if the file does not end a line, so the next
    // append starts on a line of its own.
    if dropped > 0 || !(text.is_empty() || text.ends_with('\n')) {
        rlhost_fs::write_atomically(path, kept.as_bytes())?;
    }
    Ok(dropped)
}

/// Removes the per-step folders `step_N` under `root` with N past `step` (weights published
/// to remote servers by steps a resumed run redoes).
fn remove_step_folders_after(root: &Path, step: usize) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if name
            .strip_prefix("step_")
            .and_then(|s| s.parse::<usize>().ok())
            .is_some_and(|s| s > step)
        {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Runs `host rl`. `progress` hears each finished step.
pub fn run(
    cfg: RlConfig,
    opts: &RunOptions,
    env: Arc<dyn Environment>,
    progress: &dyn Fn(&StepLine),
) -> anyhow::Result<Vec<StepLine>> {
    let out = opts
        .output_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("outputs/rl"));
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    // A fresh run must not mix with an earlier one: its metrics would be cut and a later
    // `--resume` would pick up the earlier run's newer checkpoints.
    if !opts.resume {
        let logged = std::fs::metadata(out.join("metrics.jsonl")).is_ok_and(|m| m.len() > 0);
        let earlier = match latest_checkpoint(&out) {
            Some((step, dir)) => Some(format!(
                "its newest checkpoint is step {step}, {}",
                dir.display()
            )),
            None if logged => Some("its metrics.jsonl is not empty".to_owned()),
            None => None,
        };
        if let Some(what) = earlier {
            anyhow::bail!(
                "{} holds an earlier run ({what}): pass --resume to continue it, or choose \
                 another --output-dir",
                out.display()
            );
        }
    }
    anyhow::ensure!(
        cfg.orchestrator.rollouts_per_example >= 2,
        "orchestrator.rollouts_per_example must be at least 2 (group advantages)"
    );
    let device = cfg
        .trainer
        .device
        .parse::<crate::device::DeviceSpec>()?
        .resolve(crate::device::CudaStatus::probe())?;
    let policy_dir = crate::model::hub::resolve(&cfg.trainer.model.name)?;
    let policy = crate::model::Qwen3::load(&policy_dir, device, tch::Kind::Float)
        .with_context(|| format!("loading the policy {}", policy_dir.display()))?;
    let max_steps = cfg.trainer.max_steps.min(cfg.orchestrator.max_steps);
    if cfg.trainer.max_steps != cfg.orchestrator.max_steps {
        tracing::warn!(
            "trainer.max_steps = {} and orchestrator.max_steps = {} differ: running {max_steps} steps",
            cfg.trainer.max_steps,
            cfg.orchestrator.max_steps
        );
    }
    let mut trainer = Trainer::new(
        policy,
        cfg.trainer.optim.clone(),
        cfg.trainer.loss.clone(),
        cfg.orchestrator.sampling.temperature,
        cfg.trainer.data.seq_len * cfg.trainer.data.micro_batch_size.max(1),
        max_steps,
    )?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let remote = !cfg.orchestrator.client.base_urls.is_empty();
    // Colocated: an engine in this process gets the weights in memory. Remote: the servers
    // load each step's weights from a folder the trainer writes.
    let (engine, generator, pool, served): (
        Option<Engine>,
        Arc<dyn Generator>,
        Option<Arc<crate::rollout::OpenAiPool>>,
        String,
    ) = if remote {
        let key = cfg
            .orchestrator
            .client
            .api_key_var
            .as_ref()
            .and_then(|v| std::env::var(v).ok());
        let clients: Vec<crate::rollout::OpenAiClient> = cfg
            .orchestrator
            .client
            .base_urls
            .iter()
            .map(|u| {
                crate::rollout::OpenAiClient::new(
                    u,
                    key.clone(),
                    std::time::Duration::from_secs(600),
                )
            })
            .collect();
        let served = rt.block_on(clients[0].first_model()).with_context(|| {
            format!(
                "asking {} for its model",
                cfg.orchestrator.client.base_urls[0]
            )
        })?;
        let pool = Arc::new(crate::rollout::OpenAiPool::new(clients));
        (None, pool.clone(), Some(pool), served)
    } else {
        let serve_dir = crate::model::hub::resolve(&cfg.inference.model.name)?;
        let engine_kind = match device {
            tch::Device::Cpu => tch::Kind::Float,
            _ => tch::Kind::BFloat16,
        };
        let engine = Engine::load(
            &serve_dir,
            &cfg.inference.model.name,
            device,
            engine_kind,
            EngineConfig {
                max_batch_size: cfg.inference.max_batch_size,
                max_model_len: cfg.inference.max_model_len,
                max_queue: usize::MAX,
                prefix_caching: cfg.inference.enable_prefix_caching,
                kv_cache_tokens: cfg.inference.kv_cache_tokens,
                block_size: cfg.inference.block_size,
                max_num_batched_tokens: cfg.inference.max_num_batched_tokens,
                threads: cfg.inference.threads,
            },
        )?;
        let api = Arc::new(
            crate::server::Api::new(
                engine.clone(),
                crate::server::ServerConfig {
                    served_name: cfg.inference.model.name.clone(),
                    enable_auto_tool_choice: true,
                    tool_call_parser: cfg.inference.tool_call_parser.clone(),
                },
            )
            .map_err(|e| anyhow::anyhow!(e))?,
        );
        (
            Some(engine),
            Arc::new(crate::rollout::InProcess::new(api)),
            None,
            cfg.inference.model.name.clone(),
        )
    };
    let mut start = 0;
    if opts.resume {
        match latest_checkpoint(&out) {
            Some((step, dir)) => {
                trainer
                    .restore(&dir)
                    .with_context(|| format!("restoring {}", dir.display()))?;
                start = step;
                tracing::info!("resuming from {} (step {step})", dir.display());
            }
            None => tracing::warn!(
                "--resume: no checkpoint under {}; starting fresh",
                out.display()
            ),
        }
    }
    // Hands the trainer's weights to whoever generates; returns the new policy version.
    let sync_weights = |trainer: &Trainer, step: usize| -> anyhow::Result<u64> {
        match (&engine, &pool) {
            (Some(e), _) => {
                Ok(rt.block_on(e.update_weights(WeightSource::Tensors(trainer.weights())))?)
            }
            (None, Some(pool)) => {
                let root = out.join("weights");
                std::fs::create_dir_all(&root)?;
                let tmp = root.join(format!(".step_{step}.tmp"));
                let dst = root.join(format!("step_{step}"));
                let _ = std::fs::remove_dir_all(&tmp);
                trainer.model.save(&tmp)?;
                let _ = std::fs::remove_dir_all(&dst);
                std::fs::rename(&tmp, &dst)?;
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
            _ => unreachable!("an engine or servers"),
        }
    };
    if start > 0 {
        sync_weights(&trainer, start)?;
    }
    let split = cfg.orchestrator.environment.split.clone();
    let examples = rt.block_on(async {
        let plan = crate::eval::EvalPlan {
            env: env.clone(),
            rewards: Vec::new(),
            split: split.clone(),
            num_examples: None,
            rollouts: 1,
            env_args: String::new(),
        };
        crate::eval::examples(&plan).await
    })?;
    anyhow::ensure!(
        !examples.is_empty(),
        "split `{split}` of {} is empty",
        env.id()
    );
    let env_args = serde_json::to_string(&cfg.orchestrator.environment.args)?;
    let producer = Arc::new(Producer {
        env: env.clone(),
        generator,
        model: served,
        order: permutation(examples.len(), cfg.orchestrator.seed),
        examples,
        cfg: cfg.clone(),
        env_args,
    });
    // The orchestrator starts the batch of step s once the trainer has finished step
    // s - async_level, so no batch comes from a policy more than `async_level` steps old.
    let level = cfg.orchestrator.async_level;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<anyhow::Result<Batch>>(level.max(1));
    let (done_tx, done_rx) = tokio::sync::watch::channel(start);
    let p = producer.clone();
    rt.spawn(async move {
        let mut done_rx = done_rx;
        for step in start..max_steps {
            while *done_rx.borrow() + level < step {
                if done_rx.changed().await.is_err() {
                    return;
                }
            }
            let b = p.batch(step).await;
            if tx.send(b).await.is_err() {
                return;
            }
        }
    });
    // The run goes on from `start`: per-step records of later steps (written before a crash,
    // after the checkpoint resumed from) are redone, so they go now, not after the new ones.
    let metrics_path = out.join("metrics.jsonl");
    let dropped = keep_steps_up_to(&metrics_path, start)
        .with_context(|| format!("trimming {} to step {start}", metrics_path.display()))?;
    if dropped > 0 {
        tracing::info!(
            "{}: dropped {dropped} lines past step {start} (they are redone)",
            metrics_path.display()
        );
    }
    remove_step_folders_after(&out.join("weights"), start);
    let mut lines = Vec::new();
    for step in start..max_steps {
        let batch = rt
            .block_on(rx.recv())
            .ok_or_else(|| anyhow::anyhow!("the orchestrator stopped"))??;
        debug_assert_eq!(batch.step, step);
        let t0 = Instant::now();
        let stats = trainer.train_step(&batch.samples)?;
        let train_s = t0.elapsed().as_secs_f64();
        let version = sync_weights(&trainer, step + 1)?;
        let _ = done_tx.send(step + 1);
        let n = batch.records.len().max(1) as f64;
        let mut metrics: BTreeMap<String, f64> = BTreeMap::new();
        for r in &batch.records {
            for (k, v) in &r.metrics {
                *metrics.entry(k.clone()).or_default() += v / n;
            }
        }
        let line = StepLine {
            step: step + 1,
            reward: batch.records.iter().map(|r| r.reward).sum::<f64>() / n,
            metrics,
            solve_all: batch.solve_all,
            solve_none: batch.solve_none,
            groups: batch.groups,
            samples: batch.samples.len(),
            seq_len: batch
                .samples
                .iter()
                .map(|s| s.ids.len() as f64)
                .sum::<f64>()
                / batch.samples.len().max(1) as f64,
            truncated: batch.records.iter().filter(|r| r.truncated).count() as f64 / n,
            failed: batch.records.iter().filter(|r| r.error.is_some()).count(),
            loss: stats.loss,
            grad_norm: stats.grad_norm,
            lr: stats.lr,
            ratio_mean: stats.loss_stats.ratio_mean,
            ratio_max: stats.loss_stats.ratio_max,
            clipped_frac: stats.loss_stats.clipped_frac,
            policy_lag: (version - 1).saturating_sub(batch.min_version),
            rollout_s: batch.seconds,
            train_s,
            tokens_per_s: stats.tokens as f64 / train_s.max(1e-9),
            skipped: stats.skipped,
            merged_rollouts: batch.merged_rollouts,
            unmerged_rollouts: batch.unmerged_rollouts,
            sample_tokens: batch.sample_tokens,
            train_tokens_computed: stats.computed_tokens,
            prefill_tokens: batch.records.iter().map(|r| r.prompt_tokens).sum(),
            prefill_computed: batch
                .records
                .iter()
                .map(|r| r.prompt_tokens.saturating_sub(r.cached_prompt_tokens))
                .sum(),
        };
        {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&metrics_path)?;
            writeln!(f, "{}", serde_json::to_string(&line)?)?;
        }
        progress(&line);
        lines.push(line);
        let done = step + 1;
        let interval = cfg.trainer.ckpt.interval;
        if (interval > 0 && done % interval == 0) || done == max_steps {
            save_checkpoint(&out, &trainer, done, cfg.trainer.ckpt.keep)?;
        }
    }
    // Reward and loss curves of the whole run (metrics.jsonl includes resumed parts, trimmed to
    // the resume point above, so each step has one line).
    let all: Vec<serde_json::Value> = std::fs::read_to_string(&metrics_path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let curve = |k: &str| -> Vec<f64> {
        all.iter()
            .map(|l| l[k].as_f64().unwrap_or(f64::NAN))
            .collect()
    };
    super::plot::write_png(
        &out.join("curves.png"),
        &[("reward", curve("reward")), ("loss", curve("loss"))],
    )
    .with_context(|| format!("writing {}", out.join("curves.png").display()))?;
    // The trained policy as a plain model folder, ready for `host eval -m`.
    let final_dir = out.join("final");
    trainer.model.save(&final_dir)?;
    crate::model::tokenizer::copy_files(&policy_dir, &final_dir)?;
    if let Some(e) = &engine {
        e.shutdown();
    }
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(prompt: &[u32], completion: &[u32], version: u64) -> TurnTokens {
        TurnTokens {
            prompt_ids: prompt.to_vec(),
            completion_ids: completion.to_vec(),
            logprobs: completion.iter().map(|&t| -(t as f32) / 100.0).collect(),
            finish_reason: "stop".into(),
            policy_version: Some(version),
        }
    }

    fn rollout(example: usize, reward: f64, turns: Vec<TurnTokens>) -> RolloutRecord {
        RolloutRecord {
            example_index: example,
            reward,
            turns,
            ..Default::default()
        }
    }

    fn cat(parts: &[&[u32]]) -> Vec<u32> {
        parts.concat()
    }

    /// Rollouts whose turns extend each other exactly become one sample (trained on each turn's
    /// tokens with its log-probs, one sequence per turn); a rewritten history falls back to one
    /// sample per turn and is counted; single-turn rollouts count as neither; turns over
    /// `seq_len` are left out of both paths; `sample_tokens` is what per-turn samples hold.
    #[test]
    fn multi_turn_rollouts_merge_exactly_or_fall_back_per_turn() {
        let p: Vec<u32> = (1..=20).collect();
        let (c1, tool1, c2, tool2, c3) = (
            [100, 101, 102],
            [200, 201],
            [103, 104],
            [202],
            [105, 106, 107],
        );
        let p2 = cat(&[&p, &c1, &tool1]);
        let p3 = cat(&[&p2, &c2, &tool2]);
        let exact = rollout(
            0,
            1.0,
            vec![
                turn(&p, &c1, 4),
                turn(&p2, &c2, 3),
                turn(&p3, &[], 3),
                turn(&p3, &c3, 5),
            ],
        );
        // The template re-rendered turn 1 differently (999 for 100 101 102).
        let rewritten = rollout(
            0,
            0.0,
            vec![turn(&p, &c1, 4), turn(&cat(&[&p, &[999], &tool1]), &c2, 4)],
        );
        let single = rollout(0, 0.5, vec![turn(&p, &c3, 4)]);
        // Exact, but its second turn (42 tokens) is over seq_len 40: merged of what fits.
        let long = rollout(
            1,
            1.0,
            vec![
                turn(&p, &c1, 6),
                turn(&cat(&[&p, &c1, &[7; 18]]), &c2[..1], 6),
            ],
        );
        let failed = RolloutRecord {
            error: Some("boom".into()),
            ..rollout(1, 0.0, vec![turn(&p, &c1, 1)])
        };
        let mut cfg = RlConfig::default();
        cfg.trainer.data.seq_len = 40;
        let records = vec![exact, rewritten, single, long, failed];
        let batch = build_batch(&cfg, 0, records, 0.0).unwrap();
        assert_eq!(
            (batch.merged_rollouts, batch.unmerged_rollouts),
            (2, 1),
            "the exact and the long rollout merge, the rewritten one does not"
        );
        let s = &batch.samples;
        assert_eq!(s.len(), 5, "1 merged + 2 per-turn + 1 single + 1 merged");
        let merged = &s[0];
        assert_eq!(merged.ids, cat(&[&p3, &c3]));
        assert_eq!(merged.group, 0);
        let trained: Vec<usize> = (0..merged.ids.len()).filter(|&i| merged.mask[i]).collect();
        assert_eq!(trained, [20, 21, 22, 25, 26, 28, 29, 30]);
        assert_eq!(merged.turn_starts, [25, 28]);
        for &i in &trained {
            let want = -(merged.ids[i] as f32) / 100.0;
            assert_eq!(merged.old_logprobs[i], want, "token {i}");
        }
        assert!(
            (0..merged.ids.len())
                .filter(|i| !merged.mask[*i])
                .all(|i| merged.old_logprobs[i] == 0.0)
        );
        // The rewritten rollout: its own turn samples, as without merging.
        assert_eq!(s[1].ids, cat(&[&p, &c1]));
        assert_eq!(s[2].ids, cat(&[&p, &[999], &tool1, &c2]));
        assert!(s[1..3].iter().all(|x| x.turn_starts.is_empty()));
        assert_eq!(s[2].mask.iter().filter(|&&m| m).count(), 2);
        assert_eq!(s[3].ids, cat(&[&p, &c3]));
        // Group 1: the long rollout's first turn only; the failed rollout trains nothing.
        assert_eq!((s[4].ids.len(), s[4].group), (23, 1));
        assert!(s[4].turn_starts.is_empty());
        assert!(s[0].advantage > 0.0 && s[1].advantage < 0.0 && s[4].advantage > 0.0);
        // Per-turn tokens: exact 23 + 27 + 31, rewritten 23 + 25, single 23, long 23.
        assert_eq!(batch.sample_tokens, 23 + 27 + 31 + 23 + 25 + 23 + 23);
        assert_eq!(batch.min_version, 3);
        // Masked truncated rollouts keep their shape, trained on nothing.
        cfg.orchestrator.mask_truncated_completions = true;
        let truncated = RolloutRecord {
            truncated: true,
            ..rollout(0, 1.0, vec![turn(&p, &c1, 0), turn(&p2, &c2, 0)])
        };
        let other = rollout(0, 0.0, vec![turn(&p, &c1, 0)]);
        let batch = build_batch(&cfg, 0, vec![truncated, other], 0.0).unwrap();
        assert_eq!(batch.samples[0].turn_starts, [25]);
        assert!(batch.samples[0].mask.iter().all(|&m| !m));
        assert_eq!(batch.samples[1].mask.iter().filter(|&&m| m).count(), 3);
    }

    #[test]
    fn per_step_logs_keep_the_steps_up_to_the_resume_point() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("metrics.jsonl");
        assert_eq!(keep_steps_up_to(&p, 3).unwrap(), 0);
        assert!(!p.exists(), "an absent log stays absent");
        let lines: Vec<String> = [1, 2, 3, 4, 5, 6]
            .iter()
            .map(|s| format!("{{\"step\":{s},\"reward\":0.{s}}}"))
            .collect();
        std::fs::write(&p, lines.join("\n") + "\n{\"step\":7,\"rew").unwrap();
        assert_eq!(keep_steps_up_to(&p, 4).unwrap(), 3);
        assert_eq!(
            std::fs::read_to_string(&p).unwrap(),
            lines[..4].join("\n") + "\n",
            "lines kept byte for byte"
        );
        assert_eq!(keep_steps_up_to(&p, 4).unwrap(), 0);
        assert_eq!(
            keep_steps_up_to(&p, 0).unwrap(),
            4,
            "a fresh start empties it"
        );
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "");
    }
}
