//! `host bench plugins`: the plugin runtime's overhead per rollout, for one plugin folder against
//! a peer: the same environment built as a native library (the floor: no sandbox, no copies
//! across a component boundary), or in another flavour (a Rust component against its Python or
//! Extism twin).
//!
//! A rollout here is what the rollout loop asks of an environment: `start` (a fresh instance for
//! components) + `initial-prompt` + `env-response` + `score`, with an assistant message of
//! `message_bytes`. The model's time is not included: this is pure plugin overhead.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::plugin::{Environment, PluginError, PluginLoader};
use rlhost_sdk::messages::assistant;
use rlhost_sdk::types::{Example, Rollout};

/// What to measure.
#[derive(Debug, Clone)]
pub struct PluginBenchOptions {
    /// Rollouts per backend.
    pub rollouts: usize,
    /// Size of the assistant message in each rollout.
    pub message_bytes: usize,
    /// Calls in the calls-per-second measurement.
    pub calls: usize,
}

impl Default for PluginBenchOptions {
    fn default() -> Self {
        Self {
            rollouts: 2_000,
            message_bytes: 2_048,
            calls: 5_000,
        }
    }
}

/// Timings of one backend.
#[derive(Debug, Clone, Serialize)]
pub struct BackendTimings {
    /// The plugin measured.
    pub plugin: String,
    /// How it runs: `component`, `extism` or `native`.
    pub runtime: String,
    /// Mean microseconds per rollout.
    pub rollout_mean_us: f64,
    /// Median microseconds per rollout.
    pub rollout_p50_us: f64,
    /// 99th percentile microseconds per rollout.
    pub rollout_p99_us: f64,
    /// `env-response` calls per second on one instance, with the whole conversation passed in.
    pub calls_per_sec: f64,
}

/// What `host bench plugins` measured: the plugin's timings and, when one was given, its peer's.
#[derive(Debug, Clone, Serialize)]
pub struct PluginBenchReport {
    /// Rollouts per backend.
    pub rollouts: usize,
    /// Assistant message size.
    pub message_bytes: usize,
    /// The plugin measured.
    pub component: BackendTimings,
    /// The peer (a native build, or another flavour), if one was given.
    pub native: Option<BackendTimings>,
    /// Measured mean / peer mean.
    pub rollout_ratio: Option<f64>,
    /// Peer calls/s / measured calls/s.
    pub calls_ratio: Option<f64>,
}

/// The per-rollout budget the plugin runtime is designed for.
pub const GOAL_US_PER_ROLLOUT: f64 = 100.0;

/// Measures the plugin in `component_dir` and, if given, the peer in `native_dir`.
pub async fn run(
    loader: &PluginLoader,
    component_dir: &Path,
    native_dir: Option<&Path>,
    options: &PluginBenchOptions,
    progress: &dyn Fn(&str, usize, usize),
) -> Result<PluginBenchReport, PluginError> {
    let component = loader.load_environment(component_dir).await?;
    let component = measure(component, runtime_of(component_dir), options, progress).await?;
    let native = match native_dir {
        Some(dir) => {
            let env = loader.load_environment(dir).await?;
            Some(measure(env, runtime_of(dir), options, progress).await?)
        }
        None => None,
    };
    let rollout_ratio = native
        .as_ref()
        .map(|n| component.rollout_mean_us / n.rollout_mean_us);
    let calls_ratio = native
        .as_ref()
        .map(|n| n.calls_per_sec / component.calls_per_sec);
    Ok(PluginBenchReport {
        rollouts: options.rollouts,
        message_bytes: options.message_bytes,
        component,
        native,
        rollout_ratio,
        calls_ratio,
    })
}

/// A plugin folder's runtime, in words (the folder loaded, so its manifest is valid).
fn runtime_of(dir: &Path) -> String {
    use rlhost_registry::manifest::Runtime;
    match crate::plugin::read_manifest(dir).map(|m| m.plugin.runtime) {
        Ok(Runtime::Wasm) => "component",
        Ok(Runtime::Extism) => "extism",
        Ok(Runtime::Native) => "native",
        Err(_) => "?",
    }
    .to_owned()
}

async fn measure(
    env: Arc<dyn Environment>,
    runtime: String,
    options: &PluginBenchOptions,
    progress: &dyn Fn(&str, usize, usize),
) -> Result<BackendTimings, PluginError> {
    let name = env.id().to_string();
    let split = env.info().splits.first().cloned().unwrap_or_default();
    let examples = env.dataset(&split, 0, 64).await?.examples;
    let fallback = Example {
        id: "bench".into(),
        prompt: vec![],
        question: "What is 1 + 1?".into(),
        answer: "2".into(),
        info: "{}".into(),
    };
    let filler = "x".repeat(options.message_bytes.saturating_sub(16));

    let warmup = (options.rollouts / 10).clamp(10, 200);
    let mut samples = Vec::with_capacity(options.rollouts);
    for i in 0..warmup + options.rollouts {
        let example = examples.get(i % examples.len().max(1)).unwrap_or(&fallback);
        let started = Instant::now();
        let mut session = env.start(i as u64).await?;
        let start = session.initial_prompt(example, "{}").await?;
        let mut messages = start.messages;
        messages.push(assistant(format!("{filler} \\boxed{{{}}}", example.answer)));
        let step = session.env_response(&messages, &start.state).await?;
        messages.extend(step.messages);
        session
            .score(&Rollout {
                example: example.clone(),
                messages,
                state: step.state,
                truncated: false,
            })
            .await?;
        if i >= warmup {
            samples.push(started.elapsed());
            if samples.len() % 100 == 0 {
                progress(&name, samples.len(), options.rollouts);
            }
        }
    }
    samples.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let mean = samples.iter().map(|d| us(*d)).sum::<f64>() / samples.len().max(1) as f64;
    let pct = |p: f64| us(samples[((samples.len() - 1) as f64 * p) as usize]);

    // Calls per second: env-response on one instance with a conversation of the same size.
    let example = examples.first().unwrap_or(&fallback);
    let mut session = env.start(0).await?;
    let start = session.initial_prompt(example, "{}").await?;
    let mut messages = start.messages;
    messages.push(assistant(format!("{filler} \\boxed{{{}}}", example.answer)));
    let started = Instant::now();
    for _ in 0..options.calls {
        session.env_response(&messages, &start.state).await?;
    }
    let calls_per_sec = options.calls as f64 / started.elapsed().as_secs_f64();

    Ok(BackendTimings {
        plugin: name,
        runtime,
        rollout_mean_us: mean,
        rollout_p50_us: pct(0.5),
        rollout_p99_us: pct(0.99),
        calls_per_sec,
    })
}

impl PluginBenchReport {
    /// The table `host bench plugins` prints without `--json`.
    pub fn to_text(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "plugin overhead per rollout (start + initial-prompt + env-response + score, \
             {}-byte assistant message, {} rollouts each)\n",
            self.message_bytes, self.rollouts
        );
        let _ = writeln!(
            out,
            "{:<34} {:>10} {:>10} {:>10} {:>14}",
            "backend", "mean µs", "p50 µs", "p99 µs", "env-response/s"
        );
        let mut row = |t: &BackendTimings| {
            let _ = writeln!(
                out,
                "{:<34} {:>10.1} {:>10.1} {:>10.1} {:>14.0}",
                format!("{} {}", t.runtime, t.plugin),
                t.rollout_mean_us,
                t.rollout_p50_us,
                t.rollout_p99_us,
                t.calls_per_sec
            );
        };
        row(&self.component);
        if let Some(n) = &self.native {
            row(n);
        }
        out.push('\n');
        if let (Some(r), Some(c), Some(n)) = (self.rollout_ratio, self.calls_ratio, &self.native) {
            let (a, b) = (&self.component.runtime, &n.runtime);
            let _ = writeln!(
                out,
                "{a} / {b} time per rollout: {r:.2}x; {b} / {a} calls per second: {c:.2}x"
            );
        }
        let verdict = if self.component.rollout_mean_us < GOAL_US_PER_ROLLOUT {
            "met"
        } else {
            "NOT met"
        };
        let _ = writeln!(
            out,
            "goal: {} overhead < {GOAL_US_PER_ROLLOUT} µs per rollout: {verdict} ({:.1} µs)",
            self.component.runtime, self.component.rollout_mean_us
        );
        out
    }
}
