//! `host rl`: GRPO training against an installed environment plugin, configured like
//! prime-rl (`--trainer @ train.toml --orchestrator @ orch.toml`, dotted overrides).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

/// Arguments of `host rl`: `--plugin NAME`, `--trainer @ FILE`, `--orchestrator @ FILE`,
/// `--inference @ FILE`, `--SECTION.KEY VALUE` overrides (`--trainer.optim.lr 3e-6`),
/// `--model.name DIR`, `--output-dir DIR`, `--resume`.
#[derive(Debug, Args)]
#[command(disable_help_flag = true)]
pub struct RlArgs {
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "FLAGS"
    )]
    args: Vec<String>,
}

/// Where `--plugin NAME` finds `NAME/rl/*.toml`: `./configs`, else `$RLHOST_SOURCE`'s or the
/// install prefix's `configs/`, else the presets built into the binary.
fn configs_root(home: &crate::home::RlhostHome) -> anyhow::Result<PathBuf> {
    let local = PathBuf::from("configs");
    if local.is_dir() {
        return Ok(local);
    }
    if let Some(shipped) = crate::home::shipped("configs") {
        return Ok(shipped);
    }
    home.rl_presets_dir().with_context(|| {
        format!(
            "writing the built-in presets under {}",
            home.root().display()
        )
    })
}

pub(super) fn run(a: RlArgs) -> anyhow::Result<ExitCode> {
    if a.args.iter().any(|x| x == "--help" || x == "-h") {
        print!("{}", crate::rl::config::help());
        return Ok(ExitCode::SUCCESS);
    }
    let home = crate::home::RlhostHome::from_env()?;
    let (cfg, opts) = crate::rl::config::parse(&a.args, &configs_root(&home)?)?;
    // Every environment the run names (training mixture and evaluations), each loaded once.
    let loader = super::env_loader(&home)?;
    let rt = super::async_runtime()?;
    let mut envs = std::collections::BTreeMap::new();
    let ids = cfg
        .orchestrator
        .env
        .iter()
        .map(|e| &e.id)
        .chain(cfg.orchestrator.eval.env.iter().map(|e| &e.id));
    for id in ids {
        if envs.contains_key(id) {
            continue;
        }
        let dir = crate::plugin::install::find_installed(&home, id).map_err(|e| {
            anyhow::anyhow!(
                "environment `{id}` is not installed ({e}); install it with:\n  host env install {id}"
            )
        })?;
        let env = rt
            .block_on(loader.load_environment(&dir))
            .with_context(|| format!("loading {id}"))?;
        envs.insert(id.clone(), env);
    }
    let steps = cfg.trainer.max_steps.min(cfg.orchestrator.max_steps);
    let bar = ProgressBar::new(steps as u64).with_style(
        ProgressStyle::with_template(
            "rl {bar:30} {pos}/{len} steps {msg} [{elapsed_precise}<{eta_precise}]",
        )
        .expect("valid template"),
    );
    let progress = |l: &crate::rl::metrics::StepLine| {
        bar.set_position(l.step as u64);
        bar.set_message(format!("reward {:.3}", l.reward));
        let metrics: Vec<String> = l
            .metrics
            .iter()
            .map(|(k, v)| format!("{k} {v:.3}"))
            .collect();
        let ls = &l.loss_stats;
        let mut text = format!(
            "step {:>4} | reward {:.3} | {} | solve all/none {}/{} | groups {} | samples {} | seq {:.0} | {} | {} | trunc {:.0}% | ratio {:.3} (max {:.2}) clip {:.3} mask {:.3} | mismatch-kl {:.4} kl {:.4} | entropy {:.3} | loss {:+.4} | grad {:.3} | lr {:.2e} | lag {} | stale {} | {:.0} gen tok/s {:.0} train tok/s | rollouts {:.1}s train {:.1}s sync {:.1}s",
            l.step,
            l.reward,
            metrics.join(", "),
            l.solve_all,
            l.solve_none,
            l.groups,
            l.samples,
            l.seq_len,
            l.prefill_figure(),
            l.train_tokens_figure(),
            100.0 * l.truncated,
            ls.ratio_mean,
            ls.ratio_max,
            ls.clipped_frac,
            ls.masked_frac,
            ls.mismatch_kl,
            ls.kl,
            l.entropy,
            l.loss,
            l.grad_norm,
            l.lr,
            l.policy_lag,
            l.stale_dropped,
            l.rollout_tokens_per_s,
            l.tokens_per_s,
            l.rollout_s,
            l.train_s,
            l.sync_s
        );
        // Per environment when training on a mixture, and evaluations when there are some.
        let ids: std::collections::BTreeSet<&str> = l
            .by_env
            .keys()
            .filter_map(|k| k.strip_prefix("env/")?.rsplit_once('/').map(|(id, _)| id))
            .collect();
        if ids.len() > 1 {
            for id in ids {
                let get = |k: &str| {
                    l.by_env
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
        if !l.eval.is_empty() {
            let shown: Vec<String> = l.eval.iter().map(|(k, v)| format!("{k} {v:.3}")).collect();
            text.push_str(&format!("\n       {} ({:.1}s)", shown.join(", "), l.eval_s));
        }
        if bar.is_hidden() {
            println!("{text}");
        } else {
            bar.println(text);
        }
    };
    let out = opts
        .output_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("outputs/rl"));
    let lines = crate::rl::run::run(cfg, &opts, envs, &progress)?;
    bar.finish_and_clear();
    if let (Some(first), Some(last)) = (lines.first(), lines.last()) {
        println!(
            "trained {} steps: reward {:.3} -> {:.3}; metrics in {}, checkpoints in {}, final model in {}",
            lines.len(),
            first.reward,
            last.reward,
            out.join("metrics.jsonl").display(),
            out.join("checkpoints").display(),
            out.join("final").display()
        );
    } else {
        println!("nothing to do: the run is complete (see {})", out.display());
    }
    Ok(ExitCode::SUCCESS)
}
