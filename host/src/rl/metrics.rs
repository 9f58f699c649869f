//! What a run reports: one [`StepLine`] per step, appended to `OUTPUT/metrics.jsonl` and
//! shown on the terminal, and `OUTPUT/curves.png` (reward, loss and each evaluation's reward
//! per step) drawn from the whole log.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use serde::Serialize;

use super::loss::LossStats;
use super::orchestrator::Batch;
use super::trainer::StepStats;

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
    /// The objective's statistics: importance ratios, clipped and masked shares, the KL to
    /// the reference and `mismatch_kl` (trainer vs sampler on the same tokens).
    #[serde(flatten)]
    pub loss_stats: LossStats,
    /// Mean entropy of the policy over the trained tokens (at the sampling temperature).
    pub entropy: f64,
    /// Trainer policy version minus the oldest sample's.
    pub policy_lag: u64,
    /// Rollout generation seconds (overlaps training when async).
    pub rollout_s: f64,
    /// Training seconds.
    pub train_s: f64,
    /// Trained tokens per training second.
    pub tokens_per_s: f64,
    /// Generated tokens per rollout second.
    pub rollout_tokens_per_s: f64,
    /// Seconds handing the new weights to the engine or servers.
    pub sync_s: f64,
    /// Seconds of evaluation after this step (0 without one).
    pub eval_s: f64,
    /// Rollouts dropped because weights more than `max_off_policy_steps` older than the
    /// trainer's generated them.
    pub stale_dropped: usize,
    /// Per training environment: `env/<id>/rollouts`, `env/<id>/groups`, `env/<id>/reward`
    /// and `env/<id>/<metric>` (means over its rollouts of the step).
    #[serde(flatten)]
    pub by_env: BTreeMap<String, f64>,
    /// After an evaluation step: `eval/<id>/reward`, `eval/<id>/<metric>`, `eval/<id>/avg@k`,
    /// `eval/<id>/pass@k` of the weights after this step.
    #[serde(flatten)]
    pub eval: BTreeMap<String, f64>,
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

/// Seconds of a step's phases after generation.
#[derive(Debug, Clone, Copy)]
pub struct Phases {
    /// The trainer's step.
    pub train_s: f64,
    /// Handing the weights over.
    pub sync_s: f64,
    /// Evaluating (0 without an evaluation).
    pub eval_s: f64,
}

impl StepLine {
    /// The line of the step that trained `batch` with `stats`, after which the generators
    /// serve policy `version`; `eval` holds the evaluation after it, if any.
    pub fn new(
        batch: &Batch,
        stats: &StepStats,
        phases: Phases,
        version: u64,
        eval: BTreeMap<String, f64>,
    ) -> Self {
        let n = batch.records.len().max(1) as f64;
        let mut metrics: BTreeMap<String, f64> = BTreeMap::new();
        for r in &batch.records {
            for (k, v) in &r.metrics {
                *metrics.entry(k.clone()).or_default() += v / n;
            }
        }
        let generated: u64 = batch.records.iter().map(|r| r.completion_tokens).sum();
        Self {
            step: batch.step + 1,
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
            loss_stats: stats.loss_stats,
            entropy: stats.entropy,
            policy_lag: version.saturating_sub(1).saturating_sub(batch.min_version),
            rollout_s: batch.seconds,
            train_s: phases.train_s,
            tokens_per_s: stats.tokens as f64 / phases.train_s.max(1e-9),
            rollout_tokens_per_s: generated as f64 / batch.seconds.max(1e-9),
            sync_s: phases.sync_s,
            eval_s: phases.eval_s,
            stale_dropped: batch.stale_dropped,
            by_env: batch.by_env.clone(),
            eval,
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
        }
    }

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

/// The step of one line of a per-step log, if it is such a line.
fn step_of(line: &str) -> Option<usize> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    usize::try_from(v.get("step")?.as_u64()?).ok()
}

/// Keeps the lines of the per-step log `path` of steps up to `step` and drops the rest (and
/// any torn line), replacing the file atomically (tmp + rename): a crash meanwhile leaves the
/// old file or the new one. Returns how many lines went; an absent file is left absent.
pub fn keep_steps_up_to(path: &Path, step: usize) -> anyhow::Result<usize> {
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

/// Appends `line` to the per-step log `path`.
pub fn append(path: &Path, line: &StepLine) -> anyhow::Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    writeln!(f, "{}", serde_json::to_string(line)?)?;
    Ok(())
}

/// Draws `out/curves.png` from the per-step log `log`: reward and loss per step, and the
/// reward of each environment evaluated during training (at its steps).
pub fn write_curves(log: &Path, out: &Path) -> anyhow::Result<()> {
    let all: Vec<serde_json::Value> = std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let curve = |k: &str| -> Vec<f64> {
        all.iter()
            .map(|l| l[k].as_f64().unwrap_or(f64::NAN))
            .collect()
    };
    let mut names: Vec<String> = vec!["reward".into(), "loss".into()];
    for l in &all {
        if let Some(obj) = l.as_object() {
            for k in obj.keys() {
                if k.starts_with("eval/") && k.ends_with("/reward") && !names.contains(k) {
                    names.push(k.clone());
                }
            }
        }
    }
    let series: Vec<(&str, Vec<f64>)> = names.iter().map(|n| (n.as_str(), curve(n))).collect();
    super::plot::write_png(out, &series).with_context(|| format!("writing {}", out.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

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
