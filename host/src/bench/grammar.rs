//! `host bench grammar`: what grammar-constrained decoding costs per token at a real vocabulary.
//! With a model folder's tokenizer (Qwen3's 151k tokens), it times building the token table,
//! compiling a forced tool-call grammar (hermes, JSON-schema arguments), and the
//! mask of every token of a valid call replayed through the matcher; then, on a model of the
//! chosen preset's shape with random weights and that vocabulary, the engine's decode step per
//! token with and without the same constraint (batch 1, greedy), in the same run. The ratio is
//! the constrained step's extra time over the unconstrained step.

use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;
use tch::{Device, Kind};

use crate::chat::constrain;
use crate::engine::{Engine, EngineConfig, Event, SamplingParams};
use crate::model::tool_parsers::Hermes;
use crate::model::{Preset, Qwen3, Qwen3Config, Tokenizer};

/// Options of the benchmark.
#[derive(Debug, Clone)]
pub struct GrammarBenchOptions {
    /// A model folder with `tokenizer.json` (its weights are not read).
    pub tokenizer: PathBuf,
    /// The shape of the random-weights model timed for the decode step.
    pub preset: Preset,
    /// Tokens generated unconstrained.
    pub new_tokens: usize,
    /// CPU threads of the engine.
    pub threads: Option<usize>,
}

/// What `host bench grammar` measured: the grammar's one-off costs, its mask cost per token, and
/// the decode step with and without it.
#[derive(Debug, Clone, Serialize)]
pub struct GrammarReport {
    /// Tokens in the table (the model's logits width).
    pub vocab: usize,
    /// Building the token table, seconds (once per engine).
    pub table_s: f64,
    /// Compiling the tool-call grammar, seconds (once per request).
    pub compile_s: f64,
    /// Tokens of the replayed call.
    pub replay_tokens: usize,
    /// Mask + advance per token of the replayed call, microseconds: mean and worst.
    pub mask_us_mean: f64,
    /// Worst token.
    pub mask_us_max: f64,
    /// The preset timed.
    pub preset: String,
    /// Unconstrained decode step per token, milliseconds.
    pub step_ms: f64,
    /// Constrained decode step per token (mask, masked sampling, advance included), ms.
    pub constrained_step_ms: f64,
    /// Tokens the constrained run generated.
    pub constrained_tokens: usize,
    /// (constrained − unconstrained) / unconstrained.
    pub overhead_ratio: f64,
}

impl GrammarReport {
    /// The text `host bench grammar` prints without `--json`.
    pub fn to_text(&self) -> String {
        format!(
            "vocabulary {} tokens: token table {:.3} s (once per engine), tool-call grammar compiled in {:.1} ms\n\
             mask + advance per token (replayed call of {} tokens): mean {:.1} us, worst {:.1} us\n\
             decode step, {} preset (random weights), batch 1: {:.2} ms unconstrained, {:.2} ms constrained ({} tokens): overhead {:+.1}%\n",
            self.vocab,
            self.table_s,
            1e3 * self.compile_s,
            self.replay_tokens,
            self.mask_us_mean,
            self.mask_us_max,
            self.preset,
            self.step_ms,
            self.constrained_step_ms,
            self.constrained_tokens,
            100.0 * self.overhead_ratio
        )
    }
}

fn tools() -> Vec<rlhost_sdk::types::Tool> {
    let tool = |name: &str, params: serde_json::Value| rlhost_sdk::types::Tool {
        name: name.into(),
        description: String::new(),
        parameters: params.to_string(),
    };
    vec![
        tool(
            "get_weather",
            serde_json::json!({"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 40},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 14},
            }, "required": ["city", "unit", "days"], "additionalProperties": false}),
        ),
        tool(
            "python",
            serde_json::json!({"type": "object", "properties": {"code": {"type": "string"}},
                "required": ["code"]}),
        ),
    ]
}

const CALL: &str = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"San Francisco, California\", \"unit\": \"celsius\", \"days\": 7}}\n</tool_call>";

/// Per-token seconds between the first and the last token of a generation.
async fn decode_seconds(
    engine: &Engine,
    prompt: Vec<u32>,
    params: SamplingParams,
) -> anyhow::Result<(f64, usize)> {
    let mut rx = engine.submit(prompt, params, 1)?;
    let mut stamps = Vec::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Token { .. } => stamps.push(Instant::now()),
            Event::Finished { error, .. } => {
                anyhow::ensure!(error.is_none(), "generation failed: {error:?}");
                break;
            }
        }
    }
    anyhow::ensure!(stamps.len() > 2, "too few tokens generated");
    let span = (stamps[stamps.len() - 1] - stamps[0]).as_secs_f64();
    Ok((span / (stamps.len() - 1) as f64, stamps.len()))
}

/// Runs the benchmark.
pub fn run(o: &GrammarBenchOptions, progress: &dyn Fn(&str)) -> anyhow::Result<GrammarReport> {
    progress("building the token table");
    let tok = Tokenizer::load(&o.tokenizer)?;
    let mut cfg = Qwen3Config::preset(o.preset);
    cfg.vocab_size = cfg.vocab_size.max(tok.vocab_size() as i64);
    let vocab = cfg.vocab_size as usize;
    let mut eos: Vec<u32> = tok.eos.into_iter().collect();
    eos.extend(tok.token_id("<|im_end|>"));
    let started = Instant::now();
    let table = crate::engine::grammar::GrammarTokens::new(&tok, &eos, vocab)?;
    let table_s = started.elapsed().as_secs_f64();
    let tools = tools();
    // Named, so a random model's greedy call stays bounded (`python`'s code is unbounded text).
    let g = constrain::tool_call_grammar(&Hermes, &tools, Some("get_weather"), false)
        .map_err(|e| anyhow::anyhow!(e.message))?;
    progress("compiling and replaying the call");
    let started = Instant::now();
    let constraint = table.compile_lark(&g.lark)?;
    let compile_s = started.elapsed().as_secs_f64();
    let ids = tok.encode(CALL)?;
    let mut seq = constraint.start();
    let mut times = Vec::with_capacity(ids.len());
    for &t in &ids {
        let started = Instant::now();
        let mask = seq.mask()?;
        anyhow::ensure!(
            mask.is_allowed(t),
            "the grammar refused token {t} of the call"
        );
        seq.consume(t)?;
        times.push(started.elapsed().as_secs_f64() * 1e6);
    }
    anyhow::ensure!(seq.is_accepting(), "the replayed call is incomplete");
    let mask_us_mean = times.iter().sum::<f64>() / times.len() as f64;
    let mask_us_max = times.iter().copied().fold(0.0, f64::max);

    progress("timing decode steps");
    let model = Qwen3::new(cfg, Device::Cpu, Kind::Float, 1)?;
    let engine = Engine::start(
        model,
        Tokenizer::load(&o.tokenizer)?,
        None,
        eos,
        "bench",
        EngineConfig {
            max_batch_size: 1,
            max_model_len: 2048,
            threads: o.threads,
            prefix_caching: false,
            ..EngineConfig::default()
        },
    );
    let prompt = tok.encode("Plan a trip and check the weather first.")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let free = SamplingParams {
        temperature: 0.0,
        max_tokens: Some(o.new_tokens),
        ignore_eos: true,
        ..SamplingParams::default()
    };
    let constrained = SamplingParams {
        temperature: 0.0,
        max_tokens: Some(400),
        constraint: Some(std::sync::Arc::new(constraint)),
        ..SamplingParams::default()
    };
    // Warm-up, then the two interleaved twice; the best of each counts.
    rt.block_on(decode_seconds(&engine, prompt.clone(), free.clone()))?;
    let (mut step, mut cstep, mut ctokens) = (f64::INFINITY, f64::INFINITY, 0);
    for _ in 0..2 {
        let (s, _) = rt.block_on(decode_seconds(&engine, prompt.clone(), free.clone()))?;
        step = step.min(s);
        let (c, n) = rt.block_on(decode_seconds(&engine, prompt.clone(), constrained.clone()))?;
        cstep = cstep.min(c);
        ctokens = n;
    }
    engine.shutdown();
    Ok(GrammarReport {
        vocab,
        table_s,
        compile_s,
        replay_tokens: ids.len(),
        mask_us_mean,
        mask_us_max,
        preset: o.preset.to_string(),
        step_ms: 1e3 * step,
        constrained_step_ms: 1e3 * cstep,
        constrained_tokens: ctokens,
        overhead_ratio: (cstep - step) / step,
    })
}
