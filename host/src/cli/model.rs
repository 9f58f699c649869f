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
