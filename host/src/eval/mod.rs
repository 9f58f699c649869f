//! Evaluation: run `rollouts_per_example` rollouts of each example of an environment through the
//! shared rollout loop, concurrently, and aggregate what vf-eval and prime-rl's eval report:
//! Reward (the rubric's weighted sum), every metric by name, Avg@k, Pass@k (the unbiased
//! estimator `1 - C(n-c, k) / C(n, k)` for k = 1, 2, 4, … ≤ n; or prime-rl's Monte-Carlo
//! Pass@(n/2); or rLLM's any-correct-of-n), completion lengths, truncation, tool-call parse
//! failures, reward-function errors, failed rollouts and wall time.
//!
//! A rollout counts as correct when its `correct` metric is at least 0.5 (environments without
//! one: when its reward is positive).

use std::collections::BTreeMap;
use std::sync::Arc;

use futures_util::StreamExt;
use rlhost_sdk::types::Example;
use serde::Serialize;

use crate::plugin::{Environment, RewardFn};
use crate::rollout::{Generator, RolloutRecord, RolloutSpec, Sampling, run_rollout};

/// How Pass@k is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize)]
pub enum PassKMode {
    /// `1 - C(n-c,k)/C(n,k)` for k = 1, 2, 4, … ≤ n (Chen et al. 2021).
    #[default]
    Unbiased,
    /// prime-rl: Monte-Carlo estimate of Pass@(n/2) (random subsets of n/2 rollouts).
    Prime,
    /// rLLM: an example passes when any of its n rollouts is correct.
    Rllm,
}

/// `1 - C(n-c, k) / C(n, k)`: the chance that k of n samples, c of them correct, include a
/// correct one. Computed as a product to stay exact for large n.
pub fn pass_at_k(n: usize, c: usize, k: usize) -> f64 {
    assert!(
        k >= 1 && k <= n && c <= n,
        "pass@k needs 1 <= k <= n and c <= n"
    );
    if n - c < k {
        return 1.0;
    }
    // C(n-c,k)/C(n,k) = prod_{i=n-c+1}^{n} (1 - k/i)
    1.0 - ((n - c + 1)..=n)
        .map(|i| 1.0 - k as f64 / i as f64)
        .product::<f64>()
}

/// Pass@k over examples, each given by the outcomes of its rollouts (see [`PassKMode`]).
/// Examples with fewer rollouts than others (an interrupted run) bound k.
pub fn pass_rates(outcomes: &[Vec<bool>], mode: PassKMode) -> Vec<(usize, f64)> {
    let k_max = outcomes.iter().map(Vec::len).min().unwrap_or(0);
    if k_max == 0 {
        return Vec::new();
    }
    let mean = |f: &dyn Fn(&[bool]) -> f64| {
        outcomes.iter().map(|o| f(o)).sum::<f64>() / outcomes.len() as f64
    };
    let count = |o: &[bool]| o.iter().filter(|&&c| c).count();
    match mode {
        PassKMode::Unbiased => std::iter::successors(Some(1usize), |k| Some(k * 2))
            .take_while(|&k| k <= k_max)
            .map(|k| (k, mean(&|o| pass_at_k(o.len(), count(o), k))))
            .collect(),
        PassKMode::Prime => {
            let k = (k_max / 2).max(1);
            let mut rng = crate::engine::Rng::new(0x5eed);
            let trials = 2000;
            let mut rates = Vec::with_capacity(outcomes.len());
            for o in outcomes {
                let mut hits = 0;
                let mut idx: Vec<usize> = (0..o.len()).collect();
                for _ in 0..trials {
                    // A random k-subset (partial Fisher-Yates).
                    let mut any = false;
                    for j in 0..k {
                        let left = idx.len() - j;
                        let pick = j + rng.below(left);
                        idx.swap(j, pick);
                        any |= o[idx[j]];
                    }
                    hits += usize::from(any);
                }
                rates.push(hits as f64 / trials as f64);
            }
            vec![(k, rates.iter().sum::<f64>() / rates.len() as f64)]
        }
        PassKMode::Rllm => vec![(k_max, mean(&|o| f64::from(u8::from(count(o) > 0))))],
    }
}

/// What one environment's evaluation needs.
pub struct EvalPlan {
    /// The environment.
    pub env: Arc<dyn Environment>,
    /// Reward plugins that also score each rollout's last assistant message, adding their metrics.
    pub rewards: Vec<Arc<dyn RewardFn>>,
    /// The split to read.
    pub split: String,
    /// Examples to evaluate (None: all).
    pub num_examples: Option<usize>,
    /// Rollouts per example.
    pub rollouts: usize,
    /// Environment arguments (JSON object text).
    pub env_args: String,
}

/// Options shared by every environment of a run.
#[derive(Clone)]
pub struct EvalOptions {
    /// Rollouts in flight at once (None: unbounded).
    pub concurrency: Option<usize>,
    /// Sampling of every turn.
    pub sampling: Sampling,
    /// Seed of the environments (rollout r of example i gets a seed derived from it).
    pub seed: u64,
    /// Retries of transient generator failures.
    pub retries: u32,
    /// The model name in requests.
    pub model: String,
}

/// Reads the examples a plan evaluates.
pub async fn examples(plan: &EvalPlan) -> Result<Vec<Example>, crate::plugin::PluginError> {
    read_examples(plan.env.as_ref(), &plan.split, plan.num_examples).await
}

/// Reads `num_examples` examples (None: all) of `split` from `env`, in pages.
pub async fn read_examples(
    env: &dyn Environment,
    split: &str,
    num_examples: Option<usize>,
) -> Result<Vec<Example>, crate::plugin::PluginError> {
    let mut out = Vec::new();
    let want = num_examples.unwrap_or(usize::MAX);
    let mut offset = 0u64;
    while out.len() < want {
        let limit = (want - out.len()).min(256) as u32;
        let page = env.dataset(split, offset, limit).await?;
        if page.examples.is_empty() {
            break;
        }
        offset += page.examples.len() as u64;
        out.extend(page.examples);
        if offset >= page.total {
            break;
        }
    }
    Ok(out)
}

/// Runs every rollout of `plan`; `on_done` hears each finished one. Stops starting new
/// rollouts once `stop` resolves (what finished is returned). A plugin losing a capability
/// while running (its sandbox died) ends the run with that error: no result after it is a score.
pub async fn run(
    plan: &EvalPlan,
    examples: &[Example],
    generator: &dyn Generator,
    options: &EvalOptions,
    on_done: &(dyn Fn(&RolloutRecord) + Sync),
    stop: impl std::future::Future<Output = ()>,
) -> Result<Vec<RolloutRecord>, crate::plugin::CapabilityLost> {
    let jobs: Vec<(usize, usize)> = (0..examples.len())
        .flat_map(|i| (0..plan.rollouts).map(move |r| (i, r)))
        .collect();
    let limit = options.concurrency.unwrap_or(jobs.len()).max(1);
    let mut stream = futures_util::stream::iter(jobs.into_iter().map(|(i, r)| {
        let spec = RolloutSpec {
            env: plan.env.as_ref(),
            rewards: &plan.rewards,
            generator,
            model: &options.model,
            example: &examples[i],
            example_index: i,
            rollout_index: r,
            env_args: &plan.env_args,
            sampling: &options.sampling,
            seed: options
                .seed
                .wrapping_mul(0x9e37_79b9)
                .wrapping_add((i * plan.rollouts + r) as u64),
            retries: options.retries,
            require_tokens: false,
        };
        run_rollout(spec)
    }))
    .buffer_unordered(limit);
    let mut done = Vec::new();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            next = stream.next() => match next {
                Some(rec) => {
                    if let Some(lost) = rec.capability_lost {
                        return Err(lost);
                    }
                    on_done(&rec);
                    done.push(rec);
                }
                None => break,
            },
            _ = &mut stop => {
                tracing::warn!("stopped: {} rollouts finished", done.len());
                break;
            }
        }
    }
    done.sort_by_key(|r| (r.example_index, r.rollout_index));
    Ok(done)
}

/// Min, max, mean and standard deviation.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Stats {
    /// Mean.
    pub mean: f64,
    /// Population standard deviation.
    pub std: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
}

impl Stats {
    fn of(xs: &[f64]) -> Self {
        if xs.is_empty() {
            return Self::default();
        }
        let n = xs.len() as f64;
        let mean = xs.iter().sum::<f64>() / n;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
        Self {
            mean,
            std: var.sqrt(),
            min: xs.iter().copied().fold(f64::INFINITY, f64::min),
            max: xs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        }
    }
}

/// One environment's results.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// The environment, `owner/name vX.Y.Z`.
    pub env: String,
    /// The model (and endpoint).
    pub model: String,
    /// The split.
    pub split: String,
    /// Examples evaluated.
    pub examples: usize,
    /// Rollouts per example asked for.
    pub rollouts_per_example: usize,
    /// Rollouts finished (failed ones included).
    pub rollouts: usize,
    /// Mean reward.
    pub reward: f64,
    /// Mean of each metric, rubric order first.
    pub metrics: Vec<(String, f64)>,
    /// Mean correctness over all rollouts (k = rollouts per example).
    pub avg_at_k: f64,
    /// Pass@k by k (per the mode).
    pub pass_at_k: Vec<(usize, f64)>,
    /// How Pass@k was computed.
    pub pass_k_mode: PassKMode,
    /// Generated tokens per rollout.
    pub completion_tokens: Stats,
    /// Prompt tokens sent over all turns of all rollouts.
    pub prompt_tokens: u64,
    /// Of those, the tokens the server's prefix cache supplied (not computed).
    pub cached_prompt_tokens: u64,
    /// Later turns whose prompt extended the previous turn's tokens exactly.
    pub turns_extending: u64,
    /// Later turns whose prompt rewrote the history (a re-rendering chat template).
    pub turns_rewriting: u64,
    /// Share of rollouts truncated (token or turn limit).
    pub truncated: f64,
    /// Turns whose tool calls could not be parsed.
    pub tool_parse_failures: u64,
    /// Reward plugin failures.
    pub reward_errors: u64,
    /// Rollouts that failed (scored 0).
    pub failed_rollouts: u64,
    /// The first few failures, for the reader.
    pub failures: Vec<String>,
    /// Capabilities a plugin declared and ran without (`--allow-missing-capabilities`): when
    /// not empty, these figures do not measure the environment as written.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub missing_capabilities: Vec<String>,
    /// Rollouts that ran without one of those capabilities.
    #[serde(skip_serializing_if = "is_zero")]
    pub rollouts_without_capabilities: u64,
    /// Wall time in seconds.
    pub seconds: f64,
    /// The run was stopped (Ctrl-C) before every planned rollout finished: these figures cover
    /// the `rollouts` that did, of `planned_rollouts` (the fast ones first, so biased).
    pub interrupted: bool,
    /// Rollouts planned (examples × rollouts per example).
    pub planned_rollouts: usize,
    /// The environment, `owner/name` (what a registry files the evaluation under).
    pub plugin: String,
    /// Its version.
    pub plugin_version: semver::Version,
    /// The sampling asked for (absent values: the generator's defaults).
    pub sampling: rlhost_registry::evals::EvalSampling,
    /// The environment arguments (JSON object text).
    pub env_args: String,
    /// When the evaluation finished (RFC 3339, UTC).
    pub date: String,
    /// This host's version.
    pub host_version: String,
}

/// `t` as RFC 3339 in UTC, to the second (`2026-11-28T12:34:56Z`).
pub fn rfc3339(t: std::time::SystemTime) -> String {
    let secs = t
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's civil_from_days, for days since 1970-01-01.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3_600,
        rem % 3_600 / 60,
        rem % 60
    )
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Whether a rollout counts as solved: its `correct` metric when the environment reports one
/// (≥ 0.5), else a positive reward. Pass@k, Avg@k and the trainer's solve-all/none use it.
pub fn correct(r: &RolloutRecord) -> bool {
    match r.metrics.get("correct") {
        Some(&c) => c >= 0.5,
        None => r.reward > 0.0,
    }
}

/// Aggregates the rollouts of `plan`, generated by `model` with `sampling`.
pub fn summarize(
    plan: &EvalPlan,
    model: &str,
    sampling: &crate::rollout::Sampling,
    records: &[RolloutRecord],
    mode: PassKMode,
    seconds: f64,
) -> Summary {
    let env = plan.env.as_ref();
    let info = env.info();
    let n = records.len().max(1) as f64;
    let mut names: Vec<String> = info.rubric.iter().map(|w| w.name.clone()).collect();
    for r in records {
        for k in r.metrics.keys() {
            if !names.contains(k) {
                names.push(k.clone());
            }
        }
    }
    let metrics = names
        .into_iter()
        .map(|name| {
            let sum: f64 = records
                .iter()
                .map(|r| r.metrics.get(&name).copied().unwrap_or(0.0))
                .sum();
            (name, sum / n)
        })
        .collect();
    // Per example, the outcomes of its rollouts.
    let mut per: BTreeMap<usize, Vec<bool>> = BTreeMap::new();
    for r in records {
        per.entry(r.example_index).or_default().push(correct(r));
    }
    let outcomes: Vec<Vec<bool>> = per.into_values().collect();
    let pass_at_k = pass_rates(&outcomes, mode);
    let lengths: Vec<f64> = records.iter().map(|r| r.completion_tokens as f64).collect();
    let mut missing_capabilities: Vec<String> = records
        .iter()
        .flat_map(|r| r.missing_capabilities.iter().cloned())
        .collect();
    missing_capabilities.sort();
    missing_capabilities.dedup();
    Summary {
        env: env.id().to_string(),
        model: model.to_string(),
        split: plan.split.clone(),
        examples: outcomes.len(),
        rollouts_per_example: plan.rollouts,
        rollouts: records.len(),
        reward: records.iter().map(|r| r.reward).sum::<f64>() / n,
        metrics,
        avg_at_k: records.iter().filter(|r| correct(r)).count() as f64 / n,
        pass_at_k,
        pass_k_mode: mode,
        completion_tokens: Stats::of(&lengths),
        prompt_tokens: records.iter().map(|r| r.prompt_tokens).sum(),
        cached_prompt_tokens: records.iter().map(|r| r.cached_prompt_tokens).sum(),
        turns_extending: records.iter().map(|r| u64::from(r.turns_extending)).sum(),
        turns_rewriting: records.iter().map(|r| u64::from(r.turns_rewriting)).sum(),
        truncated: records.iter().filter(|r| r.truncated).count() as f64 / n,
        tool_parse_failures: records
            .iter()
            .map(|r| u64::from(r.tool_parse_failures))
            .sum(),
        reward_errors: records.iter().map(|r| u64::from(r.reward_errors)).sum(),
        failed_rollouts: records.iter().filter(|r| r.error.is_some()).count() as u64,
        failures: records
            .iter()
            .filter_map(|r| r.error.clone())
            .take(5)
            .collect(),
        missing_capabilities,
        rollouts_without_capabilities: records
            .iter()
            .filter(|r| !r.missing_capabilities.is_empty())
            .count() as u64,
        seconds,
        interrupted: false,
        planned_rollouts: records.len(),
        plugin: env.id().name.clone(),
        plugin_version: env.id().version.clone(),
        sampling: eval_sampling(sampling),
        env_args: plan.env_args.clone(),
        date: rfc3339(std::time::SystemTime::now()),
        host_version: crate::VERSION.to_owned(),
    }
}

/// What an evaluation's summary records of its sampling (the registry's shape of it).
pub fn eval_sampling(sampling: &Sampling) -> rlhost_registry::evals::EvalSampling {
    rlhost_registry::evals::EvalSampling {
        temperature: sampling.temperature,
        top_p: sampling.top_p,
        max_tokens: sampling.max_tokens,
        seed: sampling.seed,
    }
}

/// Display names of the math-python rubric's metrics, as prime-rl's math-python example reports
/// them (`Correct`, `#Turns`, `#Tool calls`, `Errors`).
fn display(name: &str) -> String {
    match name {
        "correct" => "Correct".into(),
        "num_turns" => "#Turns".into(),
        "num_tool_calls" => "#Tool calls".into(),
        "num_errors" => "Errors".into(),
        other => other.to_string(),
    }
}

impl Summary {
    /// vf-eval's one-line form: `Reward: 0.704, Correct: 0.714, #Turns: 2.118, …`.
    pub fn one_line(&self) -> String {
        let mut parts = vec![format!("Reward: {:.3}", self.reward)];
        parts.extend(
            self.metrics
                .iter()
                .map(|(k, v)| format!("{}: {v:.3}", display(k))),
        );
        parts.join(", ")
    }

    /// The text `host eval` prints for the environment: a heading line, then one line per figure.
    pub fn to_text(&self) -> String {
        let k = self.rollouts_per_example;
        let mut s = format!(
            "{} on {} ({} split): {} examples x {} rollouts = {} rollouts in {:.1} s\n",
            self.model, self.env, self.split, self.examples, k, self.rollouts, self.seconds
        );
        if self.interrupted {
            s.push_str(&format!(
                "  INTERRUPTED: {} of {} planned rollouts finished (the fastest first): these \
                 figures are not the environment's\n",
                self.rollouts, self.planned_rollouts
            ));
        }
        if !self.missing_capabilities.is_empty() {
            s.push_str(&format!(
                "  WARNING: {} of {} rollouts ran without capability {} \
                 (--allow-missing-capabilities): these figures do not measure the environment\n",
                self.rollouts_without_capabilities,
                self.rollouts,
                self.missing_capabilities.join(", ")
            ));
        }
        s.push_str(&format!("  {:<28} {:>9.3}\n", "Reward", self.reward));
        for (name, v) in &self.metrics {
            s.push_str(&format!("  {:<28} {v:>9.3}\n", display(name)));
        }
        s.push_str(&format!(
            "  {:<28} {:>9.3}\n",
            format!("Avg@{k}"),
            self.avg_at_k
        ));
        for (kk, v) in &self.pass_at_k {
            let label = match self.pass_k_mode {
                PassKMode::Unbiased => format!("Pass@{kk}"),
                PassKMode::Prime => format!("Pass@{kk} (prime-rl, Monte-Carlo)"),
                PassKMode::Rllm => format!("Pass@{kk} (rLLM, any correct)"),
            };
            s.push_str(&format!("  {label:<28} {v:>9.3}\n"));
        }
        let c = &self.completion_tokens;
        s.push_str(&format!(
            "  {:<28} mean {:.1}, std {:.1}, min {:.0}, max {:.0}\n",
            "completion tokens", c.mean, c.std, c.min, c.max
        ));
        s.push_str(&format!(
            "  {:<28} {} of {} ({:.1}%)\n",
            "prompt tokens cached",
            self.cached_prompt_tokens,
            self.prompt_tokens,
            100.0 * self.cached_prompt_tokens as f64 / self.prompt_tokens.max(1) as f64
        ));
        let later = self.turns_extending + self.turns_rewriting;
        if later > 0 {
            s.push_str(&format!(
                "  {:<28} {} of {} later turns\n",
                "history kept as produced", self.turns_extending, later
            ));
        }
        s.push_str(&format!(
            "  {:<28} {:>8.1}%\n",
            "truncated",
            100.0 * self.truncated
        ));
        s.push_str(&format!(
            "  {:<28} {:>9}\n  {:<28} {:>9}\n  {:<28} {:>9}\n",
            "tool-call parse failures",
            self.tool_parse_failures,
            "reward errors/timeouts",
            self.reward_errors,
            "failed rollouts",
            self.failed_rollouts
        ));
        for f in &self.failures {
            s.push_str(&format!("    e.g. {f}\n"));
        }
        s.push_str(&format!("  {}\n", self.one_line()));
        s
    }
}

#[cfg(test)]
mod tests {
    use super::{PassKMode, pass_at_k, pass_rates, rfc3339};
    use crate::testing::rounding::gamma;
    use tch::Kind;

    #[test]
    fn dates_are_rfc3339_utc() {
        let at = |s: u64| rfc3339(std::time::UNIX_EPOCH + std::time::Duration::from_secs(s));
        assert_eq!(at(0), "1970-01-01T00:00:00Z");
        // `date -u -d @1795869296`: Sat Nov 28 12:34:56 UTC 2026; a leap day; the year 2000.
        assert_eq!(at(1_795_869_296), "2026-11-28T12:34:56Z");
        assert_eq!(at(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(at(4_107_542_399), "2100-02-28T23:59:59Z");
    }

    #[test]
    fn pass_rates_per_mode() {
        let (t, f) = (true, false);
        let outcomes = vec![vec![t, f, f, f], vec![f, f, f, f], vec![t, t, f, f]];
        // Unbiased: example pass@k averaged: k=1: (1/4 + 0 + 2/4) / 3; k=2: (1/2 + 0 + 5/6) / 3;
        // k=4: (1 + 0 + 1) / 3.
        let u = pass_rates(&outcomes, PassKMode::Unbiased);
        let want = [
            (1, 0.75 / 3.0),
            (2, (0.5 + 5.0 / 6.0) / 3.0),
            (4, 2.0 / 3.0),
        ];
        assert_eq!(u.len(), 3);
        // f64: each example's pass@k within `pass_at_k`'s bound (c ≤ 2 correct: γ₆), their
        // mean within γ₄ more, and the hand value's own few roundings.
        let bound = gamma(6, Kind::Double) + 2.0 * gamma(4, Kind::Double);
        for ((k, v), (wk, wv)) in u.iter().zip(want) {
            assert_eq!(*k, wk);
            assert!((v - wv).abs() <= bound, "pass@{k}: {v} vs {wv}");
        }
        // rLLM: any correct of n.
        assert_eq!(pass_rates(&outcomes, PassKMode::Rllm), vec![(4, 2.0 / 3.0)]);
        // prime-rl: Monte-Carlo pass@2, close to the exact value: 2,000 draws per example
        // (pass@2 of 1/2, 0 and 5/6), so the mean of three has standard deviation
        // √((1/4 + 5/36) / 2000) / 3 ≈ 0.0046; within five of them (seeded: the same draws on
        // every machine).
        let p = pass_rates(&outcomes, PassKMode::Prime);
        assert_eq!(p[0].0, 2);
        let sd = ((0.25 + 5.0 / 36.0) / 2000.0f64).sqrt() / 3.0;
        assert!((p[0].1 - want[1].1).abs() < 5.0 * sd, "{p:?}");
        assert!(pass_rates(&[], PassKMode::Unbiased).is_empty());
    }

    #[test]
    fn pass_at_k_matches_hand_computed_values() {
        // `pass_at_k` is 1 minus a product of c factors `1 − k/i` (two f64 roundings each, of
        // values at most 1), so within γ_{2c+1} of the exact value, plus the hand value's
        // own roundings (a division and a difference: γ₂ more).
        let bound = |c: usize| gamma(2 * c + 1, Kind::Double) + gamma(2, Kind::Double);
        // n=4, c=1: pass@1 = 1/4, pass@2 = 1 - C(3,2)/C(4,2) = 1 - 3/6 = 1/2, pass@4 = 1.
        assert!((pass_at_k(4, 1, 1) - 0.25).abs() <= bound(1));
        assert!((pass_at_k(4, 1, 2) - 0.5).abs() <= bound(1));
        assert_eq!(pass_at_k(4, 1, 4), 1.0);
        // n=10, c=3, k=5: 1 - C(7,5)/C(10,5) = 1 - 21/252 = 0.916666…
        assert!((pass_at_k(10, 3, 5) - (1.0 - 21.0 / 252.0)).abs() <= bound(3));
        // None correct, all correct.
        assert_eq!(pass_at_k(8, 0, 3), 0.0);
        assert_eq!(pass_at_k(8, 8, 1), 1.0);
        // pass@1 is the correct fraction.
        assert!((pass_at_k(32, 7, 1) - 7.0 / 32.0).abs() <= bound(7));
        // Large n stays finite and exact: 1 - C(990,10)/C(1000,10), from Python's math.comb
        // (printed to 17 digits).
        let p = pass_at_k(1000, 10, 10);
        assert!((p - 0.096_031_548_640_113_1).abs() <= bound(10), "{p}");
    }
}
