//! `host inference`: serve a model over the OpenAI API, with prime-rl's `inference` flags
//! (`--model.name`, `--enable-auto-tool-choice`, `--tool-call-parser`, …) or `@ infer.toml`.

use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

use crate::device::CudaStatus;
use crate::engine::{AdapterSource, Engine, EngineConfig};
use crate::rl::config::{EngineSetup, InferConfig};
use crate::server;

/// Arguments of `host inference`: the inference settings (the same type as `host rl`'s
/// `[inference]` section, same defaults), a `--no-enable-prefix-caching` switch, and the
/// listener's limits.
#[derive(Debug, Args)]
pub struct InferenceArgs {
    /// Engine and server settings.
    #[command(flatten)]
    config: InferConfig,
    /// Prefill every prompt in full (the same as `--enable-prefix-caching false`).
    #[arg(long)]
    no_enable_prefix_caching: bool,
    /// Connection cap and deadlines.
    #[command(flatten)]
    limits: rlhost_serve::ServeLimits,
}

/// Prefix caching and prefill scheduling of the engine (vLLM's flag names), shared by every
/// command that runs the engine.
#[derive(Debug, Clone, Args, serde::Serialize)]
pub struct CacheArgs {
    /// Reuse the keys and values of prompt prefixes computed before (default: true; `false`
    /// is the same as `--no-enable-prefix-caching`).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true",
          conflicts_with = "no_enable_prefix_caching")]
    enable_prefix_caching: Option<bool>,
    /// Prefill every prompt in full.
    #[arg(long)]
    no_enable_prefix_caching: bool,
    /// Budget of the prefix cache in tokens (default: on the CPU an eighth of the machine's
    /// memory, at most 4 GiB; on CUDA an eighth of the device's free memory at start; divided by
    /// the model's key-and-value bytes per token).
    #[arg(long, value_name = "TOKENS")]
    kv_cache_tokens: Option<usize>,
    /// Tokens per prefix-cache block: prefixes are reused in whole blocks.
    #[arg(long, default_value_t = 16)]
    block_size: usize,
    /// Most prompt tokens prefilled per scheduler step; longer prompts are prefilled in chunks
    /// with decode steps in between.
    #[arg(long, default_value_t = 2048)]
    max_num_batched_tokens: usize,
}

impl CacheArgs {
    /// Whether any flag differs from its default.
    pub fn changed(&self) -> bool {
        let d = EngineConfig::default();
        self.enable_prefix_caching.is_some()
            || self.no_enable_prefix_caching
            || self.kv_cache_tokens.is_some()
            || self.block_size != d.block_size
            || self.max_num_batched_tokens != d.max_num_batched_tokens
    }

    /// Sets these on `cfg`, refusing zero sizes.
    pub fn apply(&self, cfg: &mut EngineConfig) -> anyhow::Result<()> {
        if self.block_size == 0 {
            anyhow::bail!("--block-size must be at least 1");
        }
        if self.max_num_batched_tokens == 0 {
            anyhow::bail!("--max-num-batched-tokens must be at least 1");
        }
        cfg.prefix_caching =
            !self.no_enable_prefix_caching && self.enable_prefix_caching.unwrap_or(true);
        cfg.kv_cache_tokens = self.kv_cache_tokens;
        cfg.block_size = self.block_size;
        cfg.max_num_batched_tokens = self.max_num_batched_tokens;
        Ok(())
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

pub(super) fn run(args: InferenceArgs) -> anyhow::Result<ExitCode> {
    // A server lives long and serves requests of any size: what they free must not stay resident.
    crate::heap::one_arena();
    let mut config = args.config;
    if args.no_enable_prefix_caching {
        config.enable_prefix_caching = false;
    }
    let setup = config.resolve(CudaStatus::probe())?;
    if let Some(t) = config.threads {
        tch::set_num_threads(t as i32);
    }
    let EngineSetup {
        model_dir: dir,
        device,
        precision,
        engine: engine_cfg,
        server: server_cfg,
        lora_modules,
    } = setup;
    let served = server_cfg.served_name.clone();
    let batch = engine_cfg.max_batch_size;
    let engine = Engine::load(&dir, &served, device, precision.kind(), engine_cfg)
        .with_context(|| format!("loading {}", dir.display()))?;
    let router = server::router(engine.clone(), server_cfg).map_err(|e| anyhow::anyhow!(e))?;
    let (host, port) = (config.host.clone(), config.port);
    let rt = super::async_runtime()?;
    rt.block_on(async move {
        for (name, dir) in lora_modules {
            engine
                .load_adapter(&name, AdapterSource::Dir(dir.clone()), false)
                .await
                .with_context(|| format!("lora_modules: loading `{name}` from {}", dir.display()))?;
            tracing::info!("serving adapter {name} from {}", dir.display());
        }
        let listener = tokio::net::TcpListener::bind((host.as_str(), port))
            .await
            .with_context(|| format!("listening on {host}:{port}"))?;
        let addr = listener.local_addr()?;
        // Printing never kills the server (stdout may be a closed pipe).
        use std::io::Write;
        let mut out = std::io::stdout();
        let _ = writeln!(
            out,
            "serving {served} ({}, {device:?}, {precision:?}, max-model-len {}, batch {}) on http://{addr}/v1",
            dir.display(),
            engine.info().config.max_model_len,
            batch
        );
        let _ = out.flush();
        server::serve(listener, router, engine, args.limits, shutdown_signal())
            .await
            .context("serving")
    })?;
    tracing::info!("stopped");
    Ok(ExitCode::SUCCESS)
}
