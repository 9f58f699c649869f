//! Evaluations during training (`[orchestrator.eval]`): each `[[orchestrator.eval.env]]`
//! through the same rollout loop as `host eval` (`eval::run`, on the run's generator: the
//! colocated engine or the remote servers), after every `interval`-th step, after the last, and
//! before the first with `at_start`.
//!
//! Which weights an evaluation sees: the run's loop calls it after a step's weight update and
//! before it consumes the next batch, and weight updates come from that loop only, so every
//! rollout of an evaluation runs on the weights after step `eval/step` (policy version
//! `eval/policy_version`) and no update lands while it runs. The orchestrator may meanwhile
//! generate the next batches on the same engine and the same weights (it shares the engine's
//! capacity, which shows in `eval_s`). Each evaluation uses the same examples and seeds, so
//! successive evaluations differ by the weights only.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::Context;
use rlhost_sdk::types::Example;
use serde::Serialize;

use super::config::RlConfig;
use crate::eval::{EvalOptions, EvalPlan, PassKMode};
use crate::plugin::install::InstalledEnvironment;
use crate::rollout::{Generator, Sampling};

/// One evaluated environment with its examples.
struct EvalEnv {
    id: String,
    plan: EvalPlan,
    examples: Vec<Example>,
    options: EvalOptions,
}

/// The evaluations a run asks for.
pub struct Evaluations {
    envs: Vec<EvalEnv>,
    /// Steps between evaluations (0: none after steps).
    interval: usize,
    at_start: bool,
}

/// One evaluation's results: in `metrics.jsonl`, keys of the line of the step it followed (a
/// line of its own with `step = 0` for the one before the first step).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Evaluation {
    /// Training steps the evaluated weights had taken.
    #[serde(rename = "eval/step")]
    pub step: usize,
    /// The policy version evaluated (the version the generators served).
    #[serde(rename = "eval/policy_version")]
    pub policy_version: u64,
    /// Wall seconds (the line's `eval_s`).
    #[serde(skip)]
    pub seconds: f64,
    /// Per environment: `eval/<id>/reward`, `eval/<id>/<metric>`, `eval/<id>/avg@k`,
    /// `eval/<id>/pass@k` (k = 1, 2, 4, … up to its `rollouts_per_example`),
    /// `eval/<id>/failed` (rollouts that failed).
    #[serde(flatten)]
    pub results: BTreeMap<String, f64>,
}

impl Evaluation {
    /// The terminal's summary: each environment's reward, `correct` and pass@k.
    pub fn summary(&self) -> String {
        let ids: std::collections::BTreeSet<&str> = self
            .results
            .keys()
            .filter_map(|k| k.strip_prefix("eval/")?.rsplit_once('/').map(|(id, _)| id))
            .collect();
        let parts: Vec<String> = ids
            .iter()
            .map(|id| {
                let get = |name: &str| self.results.get(&format!("eval/{id}/{name}")).copied();
                let mut s = format!("{id}: reward {:.3}", get("reward").unwrap_or(f64::NAN));
                for (k, v) in &self.results {
                    let name = k.strip_prefix("eval/").and_then(|k| k.strip_prefix(*id));
                    if let Some(name) = name.and_then(|n| n.strip_prefix('/'))
                        && (name == "correct" || name.starts_with("pass@"))
                    {
                        s.push_str(&format!(" {name} {v:.3}"));
                    }
                }
                s
            })
            .collect();
        format!(
            "eval after step {} (policy {}, {:.1}s): {}",
            self.step,
            self.policy_version,
            self.seconds,
            parts.join(" | ")
        )
    }
}

/// Whether an evaluation follows step `steps` of `max_steps` every `interval` steps (0:
/// never): every `interval`-th step, and the last.
fn due_after(interval: usize, steps: usize, max_steps: usize) -> bool {
    interval > 0 && (steps.is_multiple_of(interval) || steps == max_steps)
}

impl Evaluations {
    /// Reads the examples of every `[[orchestrator.eval.env]]`; `envs` holds the loaded
    /// plugins. Sampling is the entry's, else the orchestrator's.
    pub async fn prepare(
        cfg: &RlConfig,
        envs: &BTreeMap<String, InstalledEnvironment>,
        model: &str,
    ) -> anyhow::Result<Self> {
        let o = &cfg.orchestrator;
        let mut out = Vec::new();
        for (i, e) in o.eval.env.iter().enumerate() {
            let InstalledEnvironment { env, rewards } = envs
                .get(&e.id)
                .with_context(|| {
                    format!("orchestrator.eval.env[{i}].id: `{}` is not loaded", e.id)
                })?
                .clone();
            let examples = crate::eval::read_examples(env.as_ref(), &e.split, e.num_examples)
                .await
                .with_context(|| {
                    format!(
                        "orchestrator.eval.env[{i}]: reading split `{}` of {}",
                        e.split, e.id
                    )
                })?;
            anyhow::ensure!(
                !examples.is_empty(),
                "orchestrator.eval.env[{i}]: split `{}` of {} is empty",
                e.split,
                e.id
            );
            let s = e.sampling.as_ref().unwrap_or(&o.sampling);
            let seed = o.seed ^ 0xe7a1;
            out.push(EvalEnv {
                id: e.id.clone(),
                plan: EvalPlan {
                    env,
                    rewards,
                    split: e.split.clone(),
                    num_examples: e.num_examples,
                    rollouts: e.rollouts_per_example,
                    env_args: serde_json::to_string(&e.args)?,
                },
                examples,
                options: EvalOptions {
                    concurrency: Some(o.max_concurrent),
                    sampling: Sampling {
                        max_tokens: Some(s.max_tokens),
                        temperature: Some(s.temperature),
                        seed: Some(seed),
                        history: o.history,
                        ..Default::default()
                    },
                    seed,
                    retries: 3,
                    model: model.to_owned(),
                },
            });
        }
        Ok(Self {
            envs: out,
            interval: o.eval.interval,
            at_start: o.eval.at_start,
        })
    }

    /// Whether to evaluate before the first step of a run starting at step `start` (a resumed
    /// run does not evaluate its starting point again).
    pub fn due_at_start(&self, start: usize) -> bool {
        !self.envs.is_empty() && self.at_start && start == 0
    }

    /// Whether to evaluate after `steps` steps of `max_steps` (see [`due_after`]).
    pub fn due_after(&self, steps: usize, max_steps: usize) -> bool {
        !self.envs.is_empty() && due_after(self.interval, steps, max_steps)
    }

    /// Evaluates every environment on the weights the generator serves now: those after
    /// `steps` steps, policy `version`. Fails when a plugin lost a capability while running.
    pub async fn run(
        &self,
        generator: &dyn Generator,
        steps: usize,
        version: u64,
    ) -> Result<Evaluation, crate::plugin::CapabilityLost> {
        let started = Instant::now();
        let mut results = BTreeMap::new();
        for e in &self.envs {
            let t = Instant::now();
            let records = crate::eval::run(
                &e.plan,
                &e.examples,
                generator,
                &e.options,
                &|_| {},
                std::future::pending::<()>(),
            )
            .await?;
            let s = crate::eval::summarize(
                &e.plan,
                &e.options.model,
                &e.options.sampling,
                &records,
                PassKMode::Unbiased,
                t.elapsed().as_secs_f64(),
            );
            let id = &e.id;
            results.insert(format!("eval/{id}/reward"), s.reward);
            for (k, v) in &s.metrics {
                results.insert(format!("eval/{id}/{k}"), *v);
            }
            results.insert(
                format!("eval/{id}/avg@{}", s.rollouts_per_example),
                s.avg_at_k,
            );
            for (k, v) in &s.pass_at_k {
                results.insert(format!("eval/{id}/pass@{k}"), *v);
            }
            results.insert(format!("eval/{id}/failed"), s.failed_rollouts as f64);
            if s.rollouts_without_capabilities > 0 {
                results.insert(
                    format!("eval/{id}/without_capabilities"),
                    s.rollouts_without_capabilities as f64,
                );
            }
        }
        Ok(Evaluation {
            step: steps,
            policy_version: version,
            seconds: started.elapsed().as_secs_f64(),
            results,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Evaluations fall on every interval-th step and the last.
    #[test]
    fn evaluations_are_due_every_interval_and_after_the_last_step() {
        let due =
            |interval| -> Vec<usize> { (1..=5).filter(|&s| due_after(interval, s, 5)).collect() };
        assert_eq!(due(2), [2, 4, 5]);
        assert_eq!(due(1), [1, 2, 3, 4, 5]);
        assert_eq!(due(5), [5]);
        assert_eq!(due(9), [5]);
        assert!(due(0).is_empty(), "at_start only");
    }

    /// The terminal's summary names each environment with its reward, `correct` and pass@k.
    #[test]
    fn the_summary_names_each_environment() {
        let results: BTreeMap<String, f64> = [
            ("eval/arith/reward", 0.25),
            ("eval/arith/correct", 0.25),
            ("eval/arith/pass@1", 0.25),
            ("eval/arith/pass@2", 0.5),
            ("eval/arith/avg@2", 0.25),
            ("eval/arith-tools/reward", 1.0),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let e = Evaluation {
            step: 4,
            policy_version: 4,
            seconds: 1.5,
            results,
        };
        assert_eq!(
            e.summary(),
            "eval after step 4 (policy 4, 1.5s): arith: reward 0.250 correct 0.250 pass@1 0.250 \
             pass@2 0.500 | arith-tools: reward 1.000"
        );
        let json = serde_json::to_value(&e).unwrap();
        assert_eq!(json["eval/step"], 4);
        assert_eq!(json["eval/policy_version"], 4);
        assert_eq!(json["eval/arith/pass@2"], 0.5);
        assert!(json.get("seconds").is_none());
    }
}
