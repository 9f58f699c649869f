//! The RL loop behind `host rl`: the orchestrator ([`super::orchestrator`]) produces each
//! step's rollouts from the training environments; the trainer takes a step on them; the new
//! weights go to the generators ([`super::weights`]: the colocated engine in memory, or remote
//! servers from a published folder); evaluations run every `orchestrator.eval.interval` steps
//! ([`super::evals`]); each step's line goes to `metrics.jsonl` ([`super::metrics`]);
//! checkpoints are published atomically every `ckpt.interval` steps
//! ([`super::checkpoint`]), and `--resume` continues from the newest. With `async_level` ≥ 1
//! the orchestrator generates the next batches while the trainer trains (at most
//! `async_level` batches ahead); every sample carries the policy version that produced it, the
//! step line reports the lag, and `max_off_policy_steps` drops what is too old when consumed.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;

use super::checkpoint;
use super::config::{RlConfig, RunOptions};
use super::evals;
use super::metrics::{self, Phases, StepLine};
use super::orchestrator::{Generated, Producer, TrainEnv, build_batch};
use super::trainer::Trainer;
use super::weights::WeightSink;
use crate::engine::Engine;
use crate::plugin::Environment;
use crate::rollout::Generator;

pub use super::checkpoint::latest_checkpoint;

/// Refuses to write a fresh run into a folder that holds an earlier one: its metrics would be
/// cut and a later `--resume` would pick up the earlier run's newer checkpoints.
fn refuse_mixing(out: &std::path::Path, resume: bool) -> anyhow::Result<()> {
    if resume {
        return Ok(());
    }
    let logged = std::fs::metadata(out.join("metrics.jsonl")).is_ok_and(|m| m.len() > 0);
    let earlier = match latest_checkpoint(out) {
        Some((step, dir)) => Some(format!(
            "its newest checkpoint is step {step}, {}",
            dir.display()
        )),
        None if logged => Some("its metrics.jsonl is not empty".to_owned()),
        None => None,
    };
    match earlier {
        Some(what) => anyhow::bail!(
            "{} holds an earlier run ({what}): pass --resume to continue it, or choose another \
             --output-dir",
            out.display()
        ),
        None => Ok(()),
    }
}

/// The generators of rollouts, the sink of weights and the model name requests use: remote
/// servers when `orchestrator.client.base_urls` is set, else an engine in this process built
/// from the `[inference]` section.
fn generators(
    cfg: &RlConfig,
    rt: &tokio::runtime::Runtime,
    out: &std::path::Path,
) -> anyhow::Result<(Arc<dyn Generator>, WeightSink, String)> {
    let client = &cfg.orchestrator.client;
    if !client.base_urls.is_empty() {
        let key = client.api_key_var.as_ref().map(|v| {
            std::env::var(v)
                .with_context(|| format!("orchestrator.client.api_key_var: ${v} is not set"))
        });
        let key = key.transpose()?;
        let clients: Vec<crate::rollout::OpenAiClient> = client
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
        let served = rt
            .block_on(clients[0].first_model())
            .with_context(|| format!("asking {} for its model", client.base_urls[0]))?;
        let pool = Arc::new(crate::rollout::OpenAiPool::new(clients));
        let sink = WeightSink::Servers {
            pool: pool.clone(),
            root: out.join("weights"),
        };
        return Ok((pool, sink, served));
    }
    let setup = cfg
        .inference
        .resolve(crate::device::CudaStatus::probe())
        .context("the [inference] section")?;
    let engine = Engine::load(
        &setup.model_dir,
        &setup.server.served_name,
        setup.device,
        setup.precision.kind(),
        setup.engine.clone(),
    )?;
    let served = setup.server.served_name.clone();
    let api = Arc::new(
        crate::server::Api::new(engine.clone(), setup.server.clone())
            .map_err(|e| anyhow::anyhow!(e))?,
    );
    Ok((
        Arc::new(crate::rollout::InProcess::new(api)),
        WeightSink::Engine(engine),
        served,
    ))
}

/// The training environments with their examples.
async fn train_envs(
    cfg: &RlConfig,
    envs: &BTreeMap<String, Arc<dyn Environment>>,
) -> anyhow::Result<Vec<TrainEnv>> {
    let mut out = Vec::new();
    for (i, e) in cfg.orchestrator.env.iter().enumerate() {
        let env = envs
            .get(&e.id)
            .with_context(|| format!("orchestrator.env[{i}].id: `{}` is not loaded", e.id))?
            .clone();
        let examples = crate::eval::read_examples(env.as_ref(), &e.split, None)
            .await
            .with_context(|| {
                format!(
                    "orchestrator.env[{i}]: reading split `{}` of {}",
                    e.split, e.id
                )
            })?;
        anyhow::ensure!(
            !examples.is_empty(),
            "orchestrator.env[{i}]: split `{}` of {} is empty",
            e.split,
            e.id
        );
        out.push(TrainEnv {
            id: e.id.clone(),
            env,
            examples,
            args: serde_json::to_string(&e.args)?,
            weight: e.weight,
        });
    }
    Ok(out)
}

/// Runs `host rl` on the loaded environments `envs` (every id the configuration names, for
/// training and evaluation). `progress` hears each finished step.
pub fn run(
    cfg: RlConfig,
    opts: &RunOptions,
    envs: BTreeMap<String, Arc<dyn Environment>>,
    progress: &dyn Fn(&StepLine),
) -> anyhow::Result<Vec<StepLine>> {
    let out = opts
        .output_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("outputs/rl"));
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    refuse_mixing(&out, opts.resume)?;
    let device = cfg
        .trainer
        .device
        .parse::<crate::device::DeviceSpec>()?
        .resolve(crate::device::CudaStatus::probe())
        .context("trainer.device")?;
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
        cfg.trainer.data.seq_len * cfg.trainer.data.micro_batch_size,
        max_steps,
    )?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let (generator, sink, served) = generators(&cfg, &rt, &out)?;
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
    let mut version = if start > 0 {
        sink.publish(&rt, &trainer, start)?
    } else {
        0
    };
    let train = rt.block_on(train_envs(&cfg, &envs))?;
    let env_ids: Vec<String> = train.iter().map(|e| e.id.clone()).collect();
    let eval_envs = rt.block_on(evals::prepare(&cfg, &envs))?;
    let producer = Arc::new(Producer {
        envs: train,
        generator: generator.clone(),
        model: served.clone(),
        cfg: cfg.clone(),
    });
    // The orchestrator starts the batch of step s once the trainer has finished step
    // s - async_level, so no batch comes from a policy more than `async_level` steps old.
    let level = cfg.orchestrator.async_level;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Generated>(level.max(1));
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
            if tx.send(p.generate(step).await).await.is_err() {
                return;
            }
        }
    });
    // The run goes on from `start`: per-step records of later steps (written before a crash,
    // after the checkpoint resumed from) are redone, so they go now, not after the new ones.
    let metrics_path = out.join("metrics.jsonl");
    let dropped = metrics::keep_steps_up_to(&metrics_path, start)
        .with_context(|| format!("trimming {} to step {start}", metrics_path.display()))?;
    if dropped > 0 {
        tracing::info!(
            "{}: dropped {dropped} lines past step {start} (they are redone)",
            metrics_path.display()
        );
    }
    checkpoint::remove_steps_after(&out.join("weights"), start);
    let eval = &cfg.orchestrator.eval;
    if eval.at_start && start == 0 && !eval_envs.is_empty() {
        let results = rt.block_on(evals::evaluate(
            &eval_envs,
            generator.as_ref(),
            &served,
            &cfg,
        ));
        let mut line = serde_json::json!({"step": 0});
        for (k, v) in results {
            line[k] = serde_json::json!(v);
        }
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&metrics_path)
            .and_then(|mut f| {
                use std::io::Write;
                writeln!(f, "{line}")
            })
            .with_context(|| format!("appending to {}", metrics_path.display()))?;
    }
    let mut lines = Vec::new();
    for step in start..max_steps {
        let generated = rt
            .block_on(rx.recv())
            .ok_or_else(|| anyhow::anyhow!("the orchestrator stopped"))?;
        debug_assert_eq!(generated.step, step);
        let batch = build_batch(&cfg, generated, &env_ids, Some(version))?;
        let t0 = Instant::now();
        let stats = trainer.train_step(&batch.samples)?;
        let train_s = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        version = sink.publish(&rt, &trainer, step + 1)?;
        let sync_s = t1.elapsed().as_secs_f64();
        let _ = done_tx.send(step + 1);
        let done = step + 1;
        let evaluate = !eval_envs.is_empty()
            && eval.interval > 0
            && (done % eval.interval == 0 || done == max_steps);
        let t2 = Instant::now();
        let eval_results = if evaluate {
            rt.block_on(evals::evaluate(
                &eval_envs,
                generator.as_ref(),
                &served,
                &cfg,
            ))
        } else {
            BTreeMap::new()
        };
        let eval_s = if evaluate {
            t2.elapsed().as_secs_f64()
        } else {
            0.0
        };
        let line = StepLine::new(
            &batch,
            &stats,
            Phases {
                train_s,
                sync_s,
                eval_s,
            },
            version,
            eval_results,
        );
        metrics::append(&metrics_path, &line)?;
        progress(&line);
        lines.push(line);
        let interval = cfg.trainer.ckpt.interval;
        if (interval > 0 && done % interval == 0) || done == max_steps {
            checkpoint::save(&out, &trainer, done, cfg.trainer.ckpt.keep)?;
        }
    }
    // Curves of the whole run (metrics.jsonl includes resumed parts, trimmed to the resume
    // point above, so each step has one line).
    metrics::write_curves(&metrics_path, &out.join("curves.png"))?;
    // The trained policy as a plain model folder, ready for `host eval -m`.
    let final_dir = out.join("final");
    trainer.model.save(&final_dir)?;
    crate::model::tokenizer::copy_files(&policy_dir, &final_dir)?;
    sink.shutdown();
    Ok(lines)
}
