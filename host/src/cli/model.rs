//! `host model …`: create Qwen3-architecture models and inspect model folders.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};

use crate::device::{DeviceSpec, Precision};
use crate::model::{Preset, Qwen3, Qwen3Config, Tokenizer, tiny_tokenizer};

/// Copies the tokenizer files of `from` into `out`, growing `cfg`'s vocabulary to fit and
/// taking its end-of-sequence id. Returns a one-line summary.
fn copy_tokenizer(
    from: &std::path::Path,
    out: &std::path::Path,
    cfg: &mut Qwen3Config,
) -> anyhow::Result<String> {
    let tok = Tokenizer::load(from).with_context(|| {
        format!(
            "--tokenizer {}: expected a folder with tokenizer.json (and tokenizer_config.json)",
            from.display()
        )
    })?;
    crate::model::tokenizer::copy_files(from, out)?;
    let size = tok.vocab_size() as i64;
    if size > cfg.vocab_size {
        cfg.vocab_size = size;
    }
    if let Some(eos) = tok.eos {
        cfg.extra.insert("eos_token_id".into(), eos.into());
    }
    Ok(format!(
        "{} tokens copied from {}",
        tok.vocab_size(),
        from.display()
    ))
}

/// Arguments of `host model`.
#[derive(Debug, Args)]
pub struct ModelArgs {
    #[command(subcommand)]
    command: ModelCommand,
}

#[derive(Debug, Subcommand)]
enum ModelCommand {
    /// Create a Qwen3 model with random weights and save it as a Hugging Face folder
    /// (config.json + model.safetensors) that `transformers` and rlhost load.
    Init {
        /// Shape: `tiny` (about 1M parameters, for the CPU) or a real Qwen3 size.
        #[arg(long, value_enum, default_value = "tiny")]
        preset: Preset,
        /// The folder to write (created; must not hold a model already).
        #[arg(long)]
        out: PathBuf,
        /// Seed of the random initialisation.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Give the output layer its own matrix instead of sharing the embedding's.
        #[arg(long)]
        untied: bool,
        /// Storage dtype of the checkpoint (default: the preset's: f32 for tiny, bf16 otherwise).
        #[arg(long, value_enum)]
        dtype: Option<Precision>,
        /// Copy the tokenizer (and chat template) of this model folder, e.g. a Qwen3 checkpoint;
        /// the vocabulary grows to fit it. Needed for the real sizes; `tiny` builds its own.
        #[arg(long)]
        tokenizer: Option<PathBuf>,
    },
    /// Copy a model folder with its output layer untied: `lm_head.weight` a copy of the
    /// embedding, the same outputs. vLLM needs it to reload weights of a tied model (its
    /// `reload_weights` cannot reload a tied output layer); serve the copy, train the original.
    Untie {
        /// The model folder (config.json + safetensors + tokenizer).
        model: PathBuf,
        /// The folder to write (created; must not hold a model already).
        #[arg(long)]
        out: PathBuf,
    },
    /// Fold a LoRA adapter (a PEFT folder: adapter_config.json + adapter_model.safetensors)
    /// into its base model and write a plain model folder (the base's tokenizer and configs
    /// copied): the outputs of base + adapter, for servers without LoRA.
    MergeLora {
        /// The base model folder the adapter was trained on.
        #[arg(long)]
        base: PathBuf,
        /// The adapter's PEFT folder.
        #[arg(long)]
        adapter: PathBuf,
        /// The folder to write (created; must not exist).
        #[arg(long)]
        out: PathBuf,
    },
    /// Print a model folder's architecture, parameter count and dtype.
    Info {
        /// A model folder (config.json + safetensors) or a Hugging Face id (`Qwen/Qwen3-8B`),
        /// found in the local HF cache or downloaded.
        model: String,
        /// Also load the weights (checks every tensor's name and shape).
        #[arg(long)]
        check: bool,
    },
}

pub(super) fn run(args: ModelArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        ModelCommand::Init {
            preset,
            out,
            seed,
            untied,
            dtype,
            tokenizer,
        } => {
            if out.join("model.safetensors").exists() || out.join("config.json").exists() {
                anyhow::bail!(
                    "{} already holds a model; choose another --out",
                    out.display()
                );
            }
            let mut cfg = Qwen3Config::preset(preset);
            if untied {
                cfg.tie_word_embeddings = false;
            }
            if let Some(d) = dtype {
                cfg.torch_dtype = match d {
                    Precision::F32 => "float32",
                    Precision::Bf16 => "bfloat16",
                }
                .into();
            }
            if tokenizer.is_none() && preset != Preset::Tiny {
                anyhow::bail!(
                    "the {preset} preset needs Qwen3's tokenizer: pass --tokenizer DIR, a folder \
                     with tokenizer.json and tokenizer_config.json (e.g. ../shared/models/qwen3 or \
                     a downloaded Qwen/Qwen3-0.6B)"
                );
            }
            std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
            let summary = match &tokenizer {
                Some(from) => copy_tokenizer(from, &out, &mut cfg)?,
                None => {
                    let (endoftext, im_end) = tiny_tokenizer::write(&out, cfg.vocab_size as usize)
                        .context("building the tokenizer")?;
                    cfg.extra.insert("bos_token_id".into(), endoftext.into());
                    cfg.extra.insert("eos_token_id".into(), im_end.into());
                    format!(
                        "a {}-token byte-level BPE built by rlhost, Qwen3 chat template",
                        cfg.vocab_size
                    )
                }
            };
            let device = DeviceSpec::Cpu.resolve(crate::device::CudaStatus::probe())?;
            let model = Qwen3::new(cfg, device, tch::Kind::Float, seed)
                .context("initialising the model")?;
            model
                .save(&out)
                .with_context(|| format!("writing {}", out.display()))?;
            println!(
                "wrote a {} Qwen3 ({} parameters, {}) to {}\n  tokenizer: {summary}",
                preset,
                model.cfg.parameters(),
                model.cfg.torch_dtype,
                out.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        ModelCommand::Untie { model, out } => {
            untie(&model, &out)?;
            Ok(ExitCode::SUCCESS)
        }
        ModelCommand::MergeLora { base, adapter, out } => {
            let mut m = Qwen3::load(&base, tch::Device::Cpu, tch::Kind::Float)
                .with_context(|| format!("loading --base {}", base.display()))?;
            let lora =
                crate::model::Lora::load_peft(&adapter, &m.cfg, tch::Device::Cpu, tch::Kind::Float)
                    .with_context(|| format!("loading --adapter {}", adapter.display()))?;
            let summary = format!(
                "rank {}, alpha {}, on {}",
                lora.config().rank,
                lora.config().alpha,
                lora.config()
                    .target_modules
                    .iter()
                    .map(|t| t.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            // An adapter whose change would overflow is refused before anything is written,
            // and so is a merge whose result is not a model the engine would serve.
            crate::engine::check_adapter(&lora)
                .map_err(|e| anyhow::anyhow!("--adapter {}: refused: {e}", adapter.display()))?;
            m.set_lora(Some(lora));
            m.merge_lora();
            let merged: std::collections::BTreeMap<String, tch::Tensor> =
                m.vs.variables().into_iter().collect();
            crate::engine::check_weights(&merged).map_err(|e| {
                anyhow::anyhow!(
                    "merging --adapter {} into --base {} gives weights no engine would serve, \
                     nothing written: {e}",
                    adapter.display(),
                    base.display()
                )
            })?;
            rewrite(&base, &out, |tmp| Ok(m.save(tmp)?))?;
            println!(
                "wrote {}: {} with the adapter {} ({summary}) merged in",
                out.display(),
                base.display(),
                adapter.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        ModelCommand::Info { model, check } => {
            let dir = crate::model::hub::resolve(&model)?;
            let cfg = Qwen3Config::load(&dir)?;
            println!("{}", dir.display());
            println!(
                "  architecture: Qwen3ForCausalLM, {} layers, hidden {}, {} query / {} key-value heads of {}, MLP {}",
                cfg.num_hidden_layers,
                cfg.hidden_size,
                cfg.num_attention_heads,
                cfg.num_key_value_heads,
                cfg.head_dim,
                cfg.intermediate_size
            );
            println!(
                "  parameters: {} ({}), vocabulary {}, embeddings {}",
                cfg.parameters(),
                cfg.torch_dtype,
                cfg.vocab_size,
                if cfg.tie_word_embeddings {
                    "tied"
                } else {
                    "untied"
                }
            );
            println!(
                "  rope theta {}, max positions {}, rms eps {}",
                cfg.rope_theta, cfg.max_position_embeddings, cfg.rms_norm_eps
            );
            if dir.join("tokenizer.json").is_file() {
                let tok = crate::model::Tokenizer::load(&dir)?;
                let name = |id: Option<u32>| match id {
                    Some(id) => tok.decode(&[id], false).unwrap_or_else(|_| id.to_string()),
                    None => "none".into(),
                };
                println!(
                    "  tokenizer: {} tokens ({} special), eos {}, pad {}",
                    tok.vocab_size(),
                    tok.special.len(),
                    name(tok.eos),
                    name(tok.pad)
                );
            } else {
                println!("  tokenizer: none in this folder");
            }
            if check {
                Qwen3::load(&dir, tch::Device::Cpu, tch::Kind::Float)
                    .with_context(|| format!("loading the weights of {}", dir.display()))?;
                println!("  weights: every tensor present with the right shape");
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `host model untie`: `model` copied to `out` with an untied output layer.
fn untie(model: &std::path::Path, out: &std::path::Path) -> anyhow::Result<()> {
    let cfg = Qwen3Config::load(model)?;
    let m = Qwen3::load(model, tch::Device::Cpu, tch::Kind::Float)
        .with_context(|| format!("loading {}", model.display()))?;
    rewrite(model, out, |tmp| Ok(m.save_untied(tmp)?))?;
    println!(
        "wrote {} with an untied output layer ({}; the same outputs as {})",
        out.display(),
        if cfg.tie_word_embeddings {
            "lm_head.weight copied from the embedding"
        } else {
            "it was untied already"
        },
        model.display()
    );
    Ok(())
}

/// Writes `out` (which must not exist) as a copy of the model folder `model` whose weights and
/// `config.json` `weights` writes; the other files (tokenizer, chat template, generation
/// config) are copied as they are. Written beside `out` and renamed into place, so a failure
/// leaves no half folder.
fn rewrite(
    model: &std::path::Path,
    out: &std::path::Path,
    weights: impl FnOnce(&std::path::Path) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    if out.exists() {
        anyhow::bail!("{} exists; choose another --out", out.display());
    }
    let name = out
        .file_name()
        .with_context(|| format!("--out {} has no folder name", out.display()))?;
    let tmp = out.with_file_name(format!(
        "{}.tmp.{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let written = (|| -> anyhow::Result<()> {
        for entry in std::fs::read_dir(model)? {
            let entry = entry?;
            let file = entry.file_name();
            let file = file.to_string_lossy();
            let weights = file.ends_with(".safetensors") || file == "model.safetensors.index.json";
            if weights || file == "config.json" || !entry.file_type()?.is_file() {
                continue;
            }
            std::fs::copy(entry.path(), tmp.join(&*file))
                .with_context(|| format!("copying {}", entry.path().display()))?;
        }
        weights(&tmp).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, out).with_context(|| format!("renaming to {}", out.display()))?;
        Ok(())
    })();
    if written.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    written
}
