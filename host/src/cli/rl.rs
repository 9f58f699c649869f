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
    let home = crate::home::RlhostHome::from_env()?;
    let (cfg, opts) = crate::rl::config::parse(&a.args, &configs_root(&home)?)?;
    let id = cfg.orchestrator.environment.id.clone();
    let dir = crate::plugin::install::find_installed(&home, &id).map_err(|e| {
        anyhow::anyhow!(
            "environment `{id}` is not installed ({e}); install it with:\n  host env install {id}"
        )
    })?;
    let loader = super::env_loader(&home)?;
    let env = super::async_runtime()?
        .block_on(loader.load_environment(&dir))
        .with_context(|| format!("loading {id}"))?;
    let steps = cfg.trainer.max_steps.min(cfg.orchestrator.max_steps);
    let bar = ProgressBar::new(steps as u64).with_style(
        ProgressStyle::with_template(
            "rl {bar:30} {pos}/{len} steps {msg} [{elapsed_precise}<{eta_precise}]",
        )
        .expect("valid template"),
    );
    let progress = |l: &crate::rl::run::StepLine| {
        bar.set_position(l.step as u64);
        bar.set_message(format!("reward {:.3}", l.reward));
        let metrics: Vec<String> = l
            .metrics
            .iter()
            .map(|(k, v)| format!("{k} {v:.3}"))
            .collect();
        let text = format!(
            "step {:>4} | reward {:.3} | {} | solve all/none {}/{} | groups {} | samples {} | seq {:.0} | {} | {} | trunc {:.0}% | ratio {:.3} (max {:.2}) clip {:.3} | loss {:+.4} | grad {:.3} | lr {:.2e} | lag {} | {:.0} tok/s | rollouts {:.1}s train {:.1}s",
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
            l.ratio_mean,
            l.ratio_max,
            l.clipped_frac,
            l.loss,
            l.grad_norm,
            l.lr,
            l.policy_lag,
            l.tokens_per_s,
            l.rollout_s,
            l.train_s
        );
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
    let lines = crate::rl::run::run(cfg, &opts, env, &progress)?;
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
