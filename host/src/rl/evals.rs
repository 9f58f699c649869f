//! Evaluations during training (`[orchestrator.eval]`): each `[[orchestrator.eval.env]]`
//! through the same rollout loop as `host eval` (`eval::run`, on the run's generator), on the
//! weights after the step it follows: the main loop runs it between a step's weight update and
//! the next step, so no update lands while it runs (the orchestrator may meanwhile generate
//! the next batches on the same weights). Results are `eval/<id>/…` keys of that step's line.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use rlhost_sdk::types::Example;

use super::config::RlConfig;
use crate::eval::{EvalOptions, EvalPlan, PassKMode};
use crate::plugin::Environment;
use crate::rollout::{Generator, Sampling};

/// One evaluated environment with its examples.
pub struct EvalEnv {
    /// Its id.
    pub id: String,
    /// What `eval::run` takes.
    pub plan: EvalPlan,
    /// The examples evaluated.
    pub examples: Vec<Example>,
    /// Its sampling.
    pub sampling: Sampling,
}

/// Loads the examples of every `[[orchestrator.eval.env]]`; `envs` holds the loaded plugins.
pub async fn prepare(
    cfg: &RlConfig,
    envs: &BTreeMap<String, Arc<dyn Environment>>,
) -> anyhow::Result<Vec<EvalEnv>> {
    let o = &cfg.orchestrator;
    let mut out = Vec::new();
    for (i, e) in o.eval.env.iter().enumerate() {
        let env = envs
            .get(&e.id)
            .with_context(|| format!("orchestrator.eval.env[{i}].id: `{}` is not loaded", e.id))?
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
        out.push(EvalEnv {
            id: e.id.clone(),
            plan: EvalPlan {
                env,
                rewards: Vec::new(),
                split: e.split.clone(),
                num_examples: e.num_examples,
                rollouts: e.rollouts_per_example,
                env_args: serde_json::to_string(&e.args)?,
            },
            examples,
            sampling: Sampling {
                max_tokens: Some(s.max_tokens),
                temperature: Some(s.temperature),
                seed: Some(o.seed ^ 0xe7a1),
                history: o.history,
                ..Default::default()
            },
        });
    }
    Ok(out)
}

/// Evaluates every environment on the generator's current weights: `eval/<id>/reward`,
/// `eval/<id>/<metric>`, `eval/<id>/avg@k`, `eval/<id>/pass@k`, `eval/<id>/failed`.
pub async fn evaluate(
    envs: &[EvalEnv],
    generator: &dyn Generator,
    model: &str,
    cfg: &RlConfig,
) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for e in envs {
        let started = Instant::now();
        let options = EvalOptions {
            concurrency: Some(cfg.orchestrator.max_concurrent),
            sampling: e.sampling.clone(),
            seed: cfg.orchestrator.seed ^ 0xe7a1,
            retries: 3,
            model: model.to_owned(),
        };
        let records = crate::eval::run(
            &e.plan,
            &e.examples,
            generator,
            &options,
            &|_| {},
            std::future::pending::<()>(),
        )
        .await;
        let s = crate::eval::summarize(
            e.plan.env.as_ref(),
            model,
            &e.plan.split,
            &records,
            e.plan.rollouts,
            PassKMode::Unbiased,
            started.elapsed().as_secs_f64(),
        );
        let id = &e.id;
        out.insert(format!("eval/{id}/reward"), s.reward);
        for (k, v) in &s.metrics {
            out.insert(format!("eval/{id}/{k}"), *v);
        }
        out.insert(
            format!("eval/{id}/avg@{}", s.rollouts_per_example),
            s.avg_at_k,
        );
        for (k, v) in &s.pass_at_k {
            out.insert(format!("eval/{id}/pass@{k}"), *v);
        }
        out.insert(format!("eval/{id}/failed"), s.failed_rollouts as f64);
    }
    out
}
