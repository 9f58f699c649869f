//! What a run reports: one [`StepLine`] per step (and an [`EvalLine`] for an evaluation before
//! the first step), appended to `OUTPUT/metrics.jsonl` and shown on the terminal, and
//! `OUTPUT/curves.png` (reward, loss and each evaluation's reward per step) drawn from the whole
//! log. Keys users compare runs by: the objective's statistics (`ratio_mean`, `ratio_max`,
//! `clipped_frac`, `masked_frac`, `mismatch_kl`, `kl`), `entropy`, `policy_lag`,
//! `stale_dropped`, and each phase's throughput or time (`rollout_tokens_per_s`,
//! `tokens_per_s` for training, `sync_s`, `eval_s`).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use serde::Serialize;

use super::evals::Evaluation;
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
    /// The trainer's policy version minus the oldest trained sample's.
    pub policy_lag: u64,
    /// Rollout generation seconds, replacements of stale rollouts included (overlaps training
    /// when async).
    pub rollout_s: f64,
    /// Training seconds.
    pub train_s: f64,
    /// Trained tokens per training second.
    pub tokens_per_s: f64,
    /// Generated tokens (discarded stale rollouts' included) per rollout second.
    pub rollout_tokens_per_s: f64,
    /// Seconds handing the new weights to the engine or servers.
    pub sync_s: f64,
    /// Seconds of evaluation after this step (0 without one).
    pub eval_s: f64,
    /// Rollouts dropped because weights more than `max_off_policy_steps` versions older than
    /// the trainer's generated one of their turns (each replaced by a fresh rollout).
    pub stale_dropped: usize,
    /// Per training environment: `env/<id>/rollouts`, `env/<id>/groups`, `env/<id>/reward`
    /// and `env/<id>/<metric>` (means over its rollouts of the step).
    #[serde(flatten)]
    pub by_env: BTreeMap<String, f64>,
    /// After an evaluation step: `eval/step`, `eval/policy_version`, `eval/<id>/reward`,
    /// `eval/<id>/<metric>`, `eval/<id>/avg@k`, `eval/<id>/pass@k` of the weights after this
    /// step.
    #[serde(flatten)]
    pub eval: Option<Evaluation>,
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

/// The line of an evaluation before the first step (`step = 0`).
#[derive(Debug, Clone, Serialize)]
pub struct EvalLine {
    /// Always 0: the initial weights.
    pub step: usize,
    /// Seconds of the evaluation.
    pub eval_s: f64,
    /// Its results.
    #[serde(flatten)]
    pub eval: Evaluation,
}

impl EvalLine {
    /// The line of `eval`, made before the first step.
    pub fn new(eval: Evaluation) -> Self {
        Self {
            step: eval.step,
            eval_s: eval.seconds,
            eval,
        }
    }
}

/// What the run tells its caller as it goes.
pub enum Report<'a> {
    /// The evaluation before the first step.
    Evaluated(&'a EvalLine),
    /// A finished step (with its evaluation, if one followed).
    Stepped(&'a StepLine),
}

/// Seconds of a step's phases after generation.
#[derive(Debug, Clone, Copy)]
pub struct Phases {
    /// The trainer's step.
    pub train_s: f64,
    /// Handing the weights over.
    pub sync_s: f64,
}

impl StepLine {
    /// The line of the step that trained `batch` with `stats`; `eval` is the evaluation after
    /// it, if any.
    pub fn new(batch: &Batch, stats: &StepStats, phases: Phases, eval: Option<Evaluation>) -> Self {
        let n = batch.records.len().max(1) as f64;
        let mut metrics: BTreeMap<String, f64> = BTreeMap::new();
        for r in &batch.records {
            for (k, v) in &r.metrics {
                *metrics.entry(k.clone()).or_default() += v / n;
            }
        }
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
            policy_lag: batch.policy_lag,
            rollout_s: batch.seconds,
            train_s: phases.train_s,
            tokens_per_s: stats.tokens as f64 / phases.train_s.max(1e-9),
            rollout_tokens_per_s: batch.generated_tokens as f64 / batch.seconds.max(1e-9),
            sync_s: phases.sync_s,
            eval_s: eval.as_ref().map_or(0.0, |e| e.seconds),
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

    /// The terminal's text for the step: one line of figures, then each environment's reward
    /// when training on a mixture, then the evaluation that followed, if any.
    pub fn terminal_text(&self) -> String {
        let metrics: Vec<String> = self
            .metrics
            .iter()
            .map(|(k, v)| format!("{k} {v:.3}"))
            .collect();
        let ls = &self.loss_stats;
        let mut text = format!(
            "step {:>4} | reward {:.3} | {} | solve all/none {}/{} | groups {} | samples {} | seq {:.0} | {} | {} | trunc {:.0}% | ratio {:.3} (max {:.2}) clip {:.3} mask {:.3} | mismatch-kl {:.4} kl {:.4} | entropy {:.3} | loss {:+.4} | grad {:.3} | lr {:.2e} | lag {} | stale {} | {:.0} gen tok/s {:.0} train tok/s | rollouts {:.1}s train {:.1}s sync {:.1}s",
            self.step,
            self.reward,
            metrics.join(", "),
            self.solve_all,
            self.solve_none,
            self.groups,
            self.samples,
            self.seq_len,
            self.prefill_figure(),
            self.train_tokens_figure(),
            100.0 * self.truncated,
            ls.ratio_mean,
            ls.ratio_max,
            ls.clipped_frac,
            ls.masked_frac,
            ls.mismatch_kl,
            ls.kl,
            self.entropy,
            self.loss,
            self.grad_norm,
            self.lr,
            self.policy_lag,
            self.stale_dropped,
            self.rollout_tokens_per_s,
            self.tokens_per_s,
            self.rollout_s,
            self.train_s,
            self.sync_s
        );
        let ids: std::collections::BTreeSet<&str> = self
            .by_env
            .keys()
            .filter_map(|k| k.strip_prefix("env/")?.rsplit_once('/').map(|(id, _)| id))
            .collect();
        if ids.len() > 1 {
            for id in ids {
                let get = |k: &str| {
                    self.by_env
                        .get(&format!("env/{id}/{k}"))
                        .copied()
                        .unwrap_or(0.0)
                };
                text.push_str(&format!(
                    "\n       {id}: reward {:.3} over {} rollouts",
                    get("reward"),
                    get("rollouts")
                ));
            }
        }
        if let Some(e) = &self.eval {
            text.push_str(&format!("\n       {}", e.summary()));
        }
        text
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
/// old file or the new one. The evaluation before the first step (`step = 0`) stays with any
/// later step, and goes with `step = 0`: a run that goes on from there redoes everything.
/// Returns how many lines went; an absent file is left absent.
pub fn keep_steps_up_to(path: &Path, step: usize) -> anyhow::Result<usize> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e.into()),
    };
    let total = text.lines().count();
    let mut kept = String::new();
    for line in text.lines() {
        if step > 0 && step_of(line).is_some_and(|s| s <= step) {
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

/// Appends `line` (a [`StepLine`] or an [`EvalLine`]) to the per-step log `path`.
pub fn append(path: &Path, line: &impl Serialize) -> anyhow::Result<()> {
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
/// reward of each environment evaluated during training (at the steps it was evaluated, the
/// evaluation before the first step at step 0).
pub fn write_curves(log: &Path, out: &Path) -> anyhow::Result<()> {
    let text = match std::fs::read_to_string(log) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", log.display())),
    };
    let series = curves(&text);
    let series: Vec<(&str, Vec<(f64, f64)>)> = series
        .iter()
        .map(|(n, p)| (n.as_str(), p.clone()))
        .collect();
    super::plot::write_png(out, &series).with_context(|| format!("writing {}", out.display()))
}

/// The curves of a per-step log: `(name, (step, value) points)` for `reward`, `loss` and each
/// `eval/<id>/reward`, in that order.
fn curves(log: &str) -> Vec<(String, Vec<(f64, f64)>)> {
    let mut out: Vec<(String, Vec<(f64, f64)>)> =
        vec![("reward".into(), Vec::new()), ("loss".into(), Vec::new())];
    for line in log.lines() {
        let Ok(serde_json::Value::Object(l)) = serde_json::from_str(line) else {
            continue;
        };
        let Some(step) = l.get("step").and_then(serde_json::Value::as_f64) else {
            continue;
        };
        for (k, v) in &l {
            let wanted =
                k == "reward" || k == "loss" || (k.starts_with("eval/") && k.ends_with("/reward"));
            let Some(v) = v.as_f64().filter(|_| wanted) else {
                continue;
            };
            match out.iter_mut().find(|(n, _)| n == k) {
                Some((_, points)) => points.push((step, v)),
                None => out.push((k.clone(), vec![(step, v)])),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Evaluation rewards are curves of their own, at the steps they were evaluated (the one
    /// before the first step at 0); reward and loss come from the step lines only.
    #[test]
    fn curves_put_each_point_at_its_step() {
        let log = [
            r#"{"step":0,"eval/step":0,"eval/arith/reward":0.1}"#,
            r#"{"step":1,"reward":0.5,"loss":0.2}"#,
            r#"{"step":2,"reward":0.6,"loss":0.1,"eval/step":2,"eval/arith/reward":0.3}"#,
            r#"{"step":3,"rew"#,
        ]
        .join("\n");
        let c = curves(&log);
        assert_eq!(
            c,
            [
                ("reward".to_owned(), vec![(1.0, 0.5), (2.0, 0.6)]),
                ("loss".to_owned(), vec![(1.0, 0.2), (2.0, 0.1)]),
                ("eval/arith/reward".to_owned(), vec![(0.0, 0.1), (2.0, 0.3)]),
            ]
        );
        let dir = tempfile::tempdir().unwrap();
        let (log_path, png) = (dir.path().join("m.jsonl"), dir.path().join("c.png"));
        std::fs::write(&log_path, &log).unwrap();
        write_curves(&log_path, &png).unwrap();
        assert_eq!(&std::fs::read(&png).unwrap()[..4], b"\x89PNG");
    }

    #[test]
    fn per_step_logs_keep_the_steps_up_to_the_resume_point() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("metrics.jsonl");
        assert_eq!(keep_steps_up_to(&p, 3).unwrap(), 0);
        assert!(!p.exists(), "an absent log stays absent");
        let lines: Vec<String> = [0, 1, 2, 3, 4, 5, 6]
            .iter()
            .map(|s| format!("{{\"step\":{s},\"reward\":0.{s}}}"))
            .collect();
        std::fs::write(&p, lines.join("\n") + "\n{\"step\":7,\"rew").unwrap();
        assert_eq!(keep_steps_up_to(&p, 4).unwrap(), 3);
        assert_eq!(
            std::fs::read_to_string(&p).unwrap(),
            lines[..5].join("\n") + "\n",
            "lines kept byte for byte, the start's evaluation with them"
        );
        assert_eq!(keep_steps_up_to(&p, 4).unwrap(), 0);
        assert_eq!(
            keep_steps_up_to(&p, 0).unwrap(),
            5,
            "a fresh start empties it, the start's evaluation included"
        );
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "");
    }
}
