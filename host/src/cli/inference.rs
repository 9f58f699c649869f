//! `host inference`: serve a model over the OpenAI API, with prime-rl's `inference` flags
//! (`--model.name`, `--enable-auto-tool-choice`, `--tool-call-parser`, …) or `@ infer.toml`.

use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

use crate::device::{CudaStatus, DeviceSpec, Precision};
use crate::engine::{Engine, EngineConfig};
use crate::server::{self, ServerConfig};

/// Arguments of `host inference`.
#[derive(Debug, Args)]
pub struct InferenceArgs {
    /// The model: a Hugging Face folder or hub id (`Qwen/Qwen3-8B`, from the local HF cache).
    #[arg(long = "model.name", visible_alias = "model", short = 'm')]
    model: String,
    /// The name clients use in requests (default: `--model.name` as given).
    #[arg(long)]
    served_model_name: Option<String>,
    /// Parse tool calls from the model's output into OpenAI `tool_calls` (`tool_choice: auto`).
    #[arg(long)]
    enable_auto_tool_choice: bool,
    /// Tool-call wire format: `hermes` (Qwen3) or `qwen3_coder`.
    #[arg(long, default_value = "hermes")]
    tool_call_parser: String,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port; the address is printed).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Weight precision: `auto` (f32 on CPU, bf16 on CUDA), `f32`, `bf16`.
    #[arg(long, default_value = "auto")]
    dtype: String,
    /// `auto`, `cpu`, `cuda` or `cuda:N`.
    #[arg(long, default_value = "auto")]
    device: DeviceSpec,
    /// Most tokens per sequence, prompt included (default: the model's limit).
    #[arg(long)]
    max_model_len: Option<usize>,
    /// Most sequences decoded together.
    #[arg(long, default_value_t = 32)]
    max_batch_size: usize,
    /// Most requests in flight before new ones get 503.
    #[arg(long, default_value_t = 1024)]
    max_queue: usize,
    /// CPU threads for libtorch (default: libtorch's choice).
    #[arg(long)]
    threads: Option<usize>,
    /// Prefix caching and prefill scheduling.
    #[command(flatten)]
    cache: CacheArgs,
    /// Connection cap and deadlines.
    #[command(flatten)]
    limits: rlhost_serve::ServeLimits,
}

/// Prefix caching and prefill scheduling of the engine (vLLM's flag names), shared by every
/// command that runs the engine.
#[derive(Debug, Clone, Args)]
pub struct CacheArgs {
    /// Reuse the keys and values of prompt prefixes computed before (default: true; `false`
    /// is the same as `--no-enable-prefix-caching`).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true",
          conflicts_with = "no_enable_prefix_caching")]
    enable_prefix_caching: Option<bool>,
    /// Prefill every prompt in full.
    #[arg(long)]
    no_enable_prefix_caching: bool,
    /// Budget of the prefix cache in tokens (default: an eighth of the machine's memory, at
    /// most 4 GiB, divided by the model's key-and-value bytes per token).
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
    crate::model::tool_parsers::parser(&args.tool_call_parser)
        .map_err(|e| anyhow::anyhow!("--tool-call-parser: {e}"))?;
    let dir = crate::model::hub::resolve(&args.model)?;
    let device = args.device.resolve(CudaStatus::probe())?;
    let precision = match args.dtype.as_str() {
        "auto" => Precision::default_for(device),
        other => other
            .parse::<Precision>()
            .map_err(|e| anyhow::anyhow!("--dtype: {e}"))?,
    };
    if let Some(t) = args.threads {
        tch::set_num_threads(t as i32);
    }
    let cfg = crate::model::Qwen3Config::load(&dir)?;
    let max_model_len = args
        .max_model_len
        .unwrap_or(cfg.max_position_embeddings as usize);
    if args.max_batch_size == 0 {
        anyhow::bail!("--max-batch-size must be at least 1");
    }
    let served = args.served_model_name.unwrap_or(args.model.clone());
    let mut engine_cfg = EngineConfig {
        max_batch_size: args.max_batch_size,
        max_model_len,
        max_queue: args.max_queue,
        threads: args.threads,
        ..EngineConfig::default()
    };
    args.cache.apply(&mut engine_cfg)?;
    let engine = Engine::load(&dir, &served, device, precision.kind(), engine_cfg)
        .with_context(|| format!("loading {}", dir.display()))?;
    let router = server::router(
        engine.clone(),
        ServerConfig {
            served_name: served.clone(),
            enable_auto_tool_choice: args.enable_auto_tool_choice,
            tool_call_parser: args.tool_call_parser.clone(),
        },
    )
    .map_err(|e| anyhow::anyhow!(e))?;
    let rt = super::async_runtime()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
            .await
            .with_context(|| format!("listening on {}:{}", args.host, args.port))?;
        let addr = listener.local_addr()?;
        // Printing never kills the server (stdout may be a closed pipe).
        use std::io::Write;
        let mut out = std::io::stdout();
        let _ = writeln!(
            out,
            "serving {served} ({}, {device:?}, {precision:?}, max-model-len {}, batch {}) on http://{addr}/v1",
            dir.display(),
            engine.info().config.max_model_len,
            args.max_batch_size
        );
        let _ = out.flush();
        server::serve(listener, router, engine, args.limits, shutdown_signal())
            .await
            .context("serving")
    })?;
    tracing::info!("stopped");
    Ok(ExitCode::SUCCESS)
}
