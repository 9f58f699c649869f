//! `host bench serve`: rlhost's OpenAI-compatible server (`host inference`) against vLLM's on the
//! same model folder, over HTTP, with the same client (the rollout loop's [`OpenAiClient`]), the
//! same requests and the same concurrency levels. Two workloads: independent prompts, and the
//! RL loop's shared-prefix groups (one long system prompt for every example, each problem sent
//! `group_size` times at once, as GRPO sends an example's rollouts). Per side and level:
//! completion tokens per second over the wall time, p50 and p95 request latency, the ratio.
//!
//! The two servers are measured one after the other at each level, never at the same time, so
//! neither competes with the other for the cores and both see the same machine state. Servers
//! this benchmark starts are its own process groups, stopped when it ends, even on an error or
//! Ctrl-C; servers given by URL are left running.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures_util::StreamExt;
use serde::Serialize;

use crate::device::Precision;
use crate::openai::{ChatCompletion, ChatMessage, ChatRequest, GenerationParams, Role};
use crate::rollout::{GenError, OpenAiClient};

/// A request pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// Every request its own short prompt: nothing for a prefix cache to reuse.
    Independent,
    /// The RL loop's: one long system prompt shared by every request, and each problem sent
    /// `group_size` times in a row (an example's rollouts).
    SharedPrefix,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::Independent => "independent",
            Workload::SharedPrefix => "shared-prefix",
        }
    }
}

/// Where a side's server is: already running, or started by the benchmark.
#[derive(Debug, Clone)]
pub enum ServerSource {
    /// An OpenAI-compatible base URL ending in `/v1`.
    Url(String),
    /// Start `host inference` from this executable.
    SpawnHost(PathBuf),
    /// Start vLLM's OpenAI server with this interpreter.
    SpawnVllm(PathBuf),
}

/// Options of the benchmark.
#[derive(Debug, Clone)]
pub struct ServeBenchOptions {
    /// The model folder both servers serve (servers given by URL must serve it too).
    pub model: PathBuf,
    /// rlhost's server.
    pub host: ServerSource,
    /// vLLM's server.
    pub vllm: ServerSource,
    /// Requests in flight at once, one level per entry.
    pub concurrency: Vec<usize>,
    /// Requests per level (raised to the level's concurrency, and to whole groups).
    pub requests: usize,
    /// Completion tokens per request (end-of-sequence ignored on both sides).
    pub max_tokens: usize,
    /// Request patterns to measure.
    pub workloads: Vec<Workload>,
    /// Requests sharing one problem in the shared-prefix workload (`rollouts_per_example`).
    pub group_size: usize,
    /// Words of the shared system prompt.
    pub system_words: usize,
    /// Words of each problem (the whole prompt of an independent request).
    pub problem_words: usize,
    /// Most tokens per sequence on both servers, when the benchmark starts them.
    pub max_model_len: usize,
    /// How long a started server may take to answer `GET /v1/models`.
    pub startup_timeout: Duration,
    /// Weights and activations of the servers the benchmark starts (both sides).
    pub dtype: Precision,
}

/// One side's figures at one level.
#[derive(Debug, Clone, Serialize)]
pub struct SideFigures {
    /// Completion tokens the server reported (`usage`), all requests.
    pub completion_tokens: u64,
    /// Prompt tokens the server reported, all requests.
    pub prompt_tokens: u64,
    /// Prompt tokens served from its prefix cache, when the server reports them.
    pub cached_prompt_tokens: Option<u64>,
    /// From the first request sent to the last answer read.
    pub wall_s: f64,
    /// `completion_tokens / wall_s`.
    pub tokens_per_s: f64,
    /// Median request latency (send to whole response).
    pub p50_latency_s: f64,
    /// 95th percentile request latency.
    pub p95_latency_s: f64,
}

/// One workload at one concurrency level.
#[derive(Debug, Clone, Serialize)]
pub struct ServeRow {
    /// The request pattern.
    pub workload: Workload,
    /// Requests in flight at once.
    pub concurrency: usize,
    /// Requests sent to each side.
    pub requests: usize,
    /// rlhost's server.
    pub rlhost: SideFigures,
    /// vLLM's server.
    pub vllm: SideFigures,
    /// rlhost tokens/s over vLLM tokens/s.
    pub ratio: f64,
}

/// What `host bench serve` measured: one row per workload and concurrency level.
#[derive(Debug, Clone, Serialize)]
pub struct ServeReport {
    /// The model folder.
    pub model: String,
    /// rlhost's server URL.
    pub rlhost_url: String,
    /// vLLM's server URL.
    pub vllm_url: String,
    /// Completion tokens asked per request.
    pub max_tokens: usize,
    /// Requests per problem in the shared-prefix workload.
    pub group_size: usize,
    /// Seconds the benchmark took, server start-up included.
    pub wall_s: f64,
    /// The dtype both servers started here ran in (`f32`, `bf16`).
    pub dtype: String,
    /// The CPU it ran on ([`crate::device::cpu_summary`]).
    pub cpu: String,
    /// One row per workload and level.
    pub rows: Vec<ServeRow>,
}

/// The `q`-quantile (0..=1) of `values` by nearest rank: the smallest value with at least a
/// fraction `q` of the values at or below it. `None` for no values.
pub fn percentile(values: &[f64], q: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = (q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.saturating_sub(1)])
}

/// A server process the benchmark started: its own process group (vLLM runs its engine in a
/// child process), its output in a temporary log shown when it fails. Dropping it stops the
/// group: SIGTERM, then SIGKILL after 20 s.
struct ServerProcess {
    name: &'static str,
    child: Child,
    log: tempfile::NamedTempFile,
}

impl ServerProcess {
    fn spawn(name: &'static str, mut cmd: Command) -> anyhow::Result<Self> {
        use std::os::unix::process::CommandExt;
        let log = tempfile::Builder::new()
            .prefix(&format!("rlhost-bench-serve-{name}-"))
            .suffix(".log")
            .tempfile()
            .context("creating a log file")?;
        let out = log.reopen()?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting {name}: {cmd:?}"))?;
        tracing::debug!(
            "started {name} (pid {}), log {}",
            child.id(),
            log.path().display()
        );
        Ok(Self { name, child, log })
    }

    /// The log's last 40 lines.
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.log.path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Fails with the log when the process has exited.
    fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            anyhow::bail!(
                "{} exited ({status}); the end of its log ({}):\n{}",
                self.name,
                self.log.path().display(),
                self.log_tail()
            );
        }
        Ok(())
    }

    /// Waits until `url` (or, when `None`, the URL `find_url` reads from the log) answers
    /// `GET /models`.
    async fn wait_ready(
        &mut self,
        url: Option<String>,
        find_url: impl Fn(&str) -> Option<String>,
        timeout: Duration,
    ) -> anyhow::Result<String> {
        let http = reqwest::Client::new();
        let started = Instant::now();
        loop {
            self.check_alive()?;
            let url = url.clone().or_else(|| {
                find_url(&std::fs::read_to_string(self.log.path()).unwrap_or_default())
            });
            if let Some(url) = url {
                let ok = http
                    .get(format!("{url}/models"))
                    .timeout(Duration::from_secs(5))
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success());
                if ok {
                    tracing::info!(
                        "{} answers on {url} after {:.0} s",
                        self.name,
                        started.elapsed().as_secs_f64()
                    );
                    return Ok(url);
                }
            }
            if started.elapsed() > timeout {
                anyhow::bail!(
                    "{} did not answer GET /v1/models within {} s; the end of its log ({}):\n{}",
                    self.name,
                    timeout.as_secs(),
                    self.log.path().display(),
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        let group = format!("-{}", self.child.id());
        let signal = |sig: &str| {
            let _ = Command::new("kill")
                .args([sig, "--", &group])
                .stderr(Stdio::null())
                .status();
        };
        signal("-TERM");
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(100));
        }
        // Also what the leader left behind (vLLM's engine process), if it outlived it.
        signal("-KILL");
        let _ = self.child.wait();
    }
}

/// A port nobody listens on now (the OS's pick for port 0), for a server that cannot report
/// the one it bound itself.
fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(l.local_addr()?.port())
}

/// The served name the benchmark gives the servers it starts.
const SERVED_NAME: &str = "bench";

/// Starts `host inference` on a port of its choosing; its first output line names the URL.
async fn start_host(
    exe: &Path,
    o: &ServeBenchOptions,
    max_concurrency: usize,
) -> anyhow::Result<(ServerProcess, String)> {
    let mut cmd = Command::new(exe);
    cmd.arg("inference")
        .arg("--model")
        .arg(&o.model)
        .args(["--host", "127.0.0.1", "--port", "0"])
        .args(["--served-model-name", SERVED_NAME])
        .args(["--max-model-len", &o.max_model_len.to_string()])
        .args([
            "--dtype",
            match o.dtype {
                Precision::F32 => "f32",
                Precision::Bf16 => "bf16",
            },
        ]);
    // The default batch (32) covers the default levels; a deeper level gets a batch to match.
    if max_concurrency > 32 {
        cmd.args(["--max-batch-size", &max_concurrency.to_string()]);
    }
    let mut p = ServerProcess::spawn("host inference", cmd)?;
    let find = |log: &str| {
        log.lines()
            .find(|l| l.starts_with("serving "))
            .and_then(|l| l.rsplit(" on ").next())
            .map(|u| u.trim().to_string())
    };
    let url = p.wait_ready(None, find, o.startup_timeout).await?;
    Ok((p, url))
}

/// Starts vLLM's OpenAI server on the CPU, as the interop tests run it.
async fn start_vllm(
    python: &Path,
    o: &ServeBenchOptions,
) -> anyhow::Result<(ServerProcess, String)> {
    let port = free_port()?;
    let mut cmd = Command::new(python);
    cmd.args(["-m", "vllm.entrypoints.openai.api_server", "--model"])
        .arg(&o.model)
        .args([
            "--dtype",
            match o.dtype {
                Precision::F32 => "float32",
                Precision::Bf16 => "bfloat16",
            },
        ])
        .args(["--max-model-len", &o.max_model_len.to_string()])
        .arg("--enforce-eager")
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--served-model-name", SERVED_NAME])
        .args(["--generation-config", "vllm"])
        // So its usage reports cached prompt tokens, as rlhost's does.
        .arg("--enable-prompt-tokens-details")
        .env("VLLM_TARGET_DEVICE", "cpu")
        .env("VLLM_CPU_KVCACHE_SPACE", "1");
    if o.concurrency.iter().any(|&c| c > 256) {
        let most = o.concurrency.iter().max().copied().unwrap_or(1);
        cmd.args(["--max-num-seqs", &most.to_string()]);
    }
    let mut p = ServerProcess::spawn("vLLM", cmd)?;
    let url = format!("http://127.0.0.1:{port}/v1");
    let url = p.wait_ready(Some(url), |_| None, o.startup_timeout).await?;
    Ok((p, url))
}

/// A server under test: its client, the model name it serves, and its process when started here.
struct Side {
    label: &'static str,
    client: OpenAiClient,
    model: String,
    _process: Option<ServerProcess>,
}

impl Side {
    async fn open(
        label: &'static str,
        source: &ServerSource,
        o: &ServeBenchOptions,
        progress: &dyn Fn(&str, usize, usize),
    ) -> anyhow::Result<Self> {
        let max_concurrency = o.concurrency.iter().copied().max().unwrap_or(1);
        let (process, url) = match source {
            ServerSource::Url(url) => (None, url.trim_end_matches('/').to_string()),
            ServerSource::SpawnHost(exe) => {
                progress(&format!("starting {label}"), 0, 0);
                let (p, url) = start_host(exe, o, max_concurrency).await?;
                (Some(p), url)
            }
            ServerSource::SpawnVllm(python) => {
                progress(&format!("starting {label} (cold start ~40 s)"), 0, 0);
                let (p, url) = start_vllm(python, o).await?;
                (Some(p), url)
            }
        };
        let client = OpenAiClient::new(&url, None, Duration::from_secs(900));
        let model = client
            .first_model()
            .await
            .with_context(|| format!("asking {label} at {url} for its model"))?;
        Ok(Self {
            label,
            client,
            model,
            _process: process,
        })
    }
}

/// Deterministic filler text: `words` words drawn from a small vocabulary by `seed`.
fn filler(seed: u64, words: usize) -> String {
    const WORDS: &[&str] = &[
        "the",
        "sum",
        "of",
        "two",
        "numbers",
        "is",
        "equal",
        "to",
        "a",
        "prime",
        "integer",
        "when",
        "each",
        "side",
        "triangle",
        "has",
        "length",
        "find",
        "value",
        "x",
        "such",
        "that",
        "and",
        "product",
        "square",
        "root",
        "circle",
        "radius",
        "area",
        "let",
        "be",
        "positive",
        "real",
        "solve",
        "for",
        "given",
        "answer",
        "in",
        "simplest",
        "form",
        "how",
        "many",
        "ways",
        "can",
        "we",
        "choose",
        "from",
        "set",
        "remainder",
        "divided",
        "by",
        "seven",
        "digits",
        "total",
        "probability",
        "random",
        "point",
        "inside",
        "rectangle",
        "with",
        "perimeter",
        "twelve",
        "angle",
        "degrees",
    ];
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut out = Vec::with_capacity(words);
    for _ in 0..words {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        out.push(WORDS[(state >> 33) as usize % WORDS.len()]);
    }
    out.join(" ")
}

/// SplitMix64's finaliser: distinct inputs give unrelated outputs.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e3779b97f4a7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
    z ^ (z >> 31)
}

/// The conversations of one timed run. A number drawn from `run` opens every prompt, so no run
/// reuses another run's prefixes (the servers' caches outlive a run) and the comparison at each
/// level starts cold on both sides: only sharing inside the run can be reused. It comes first,
/// in a few tokens, because prefix caches match whole blocks from the start (16 tokens for
/// rlhost): a marker later in the prompt would leave the first block shared between runs.
fn conversations(
    workload: Workload,
    run: u64,
    n: usize,
    o: &ServeBenchOptions,
) -> Vec<Vec<ChatMessage>> {
    match workload {
        Workload::Independent => (0..n)
            .map(|i| {
                let text = format!(
                    "[#{}] Problem: {}?",
                    mix(run ^ mix(i as u64)) % 1_000_000_000,
                    filler(i as u64 + 1, o.problem_words)
                );
                vec![ChatMessage::text(Role::User, text)]
            })
            .collect(),
        Workload::SharedPrefix => {
            let system = format!(
                "[#{}] You are a careful math tutor. Reason step by step, then give the final \
                 answer in \\boxed{{}}. {}.",
                mix(run) % 1_000_000_000,
                filler(0, o.system_words)
            );
            (0..n)
                .map(|i| {
                    let group = i / o.group_size.max(1);
                    let problem = format!(
                        "Problem {group}: {}?",
                        filler(group as u64 + 1, o.problem_words)
                    );
                    vec![
                        ChatMessage::text(Role::System, system.clone()),
                        ChatMessage::text(Role::User, problem),
                    ]
                })
                .collect()
        }
    }
}

/// The RL loop's request shape (log-probs and token ids asked for), greedy, a fixed length.
fn request(model: &str, messages: Vec<ChatMessage>, max_tokens: usize) -> ChatRequest {
    ChatRequest {
        messages,
        params: GenerationParams {
            model: Some(model.to_string()),
            temperature: Some(0.0),
            max_tokens: Some(max_tokens as i64),
            ignore_eos: true,
            return_token_ids: true,
            ..Default::default()
        },
        logprobs: true,
        ..Default::default()
    }
}

/// Sends every conversation to `side`, `concurrency` at a time, in order (a group's requests
/// are in flight together), and measures.
async fn measure(
    side: &Side,
    convs: &[Vec<ChatMessage>],
    concurrency: usize,
    max_tokens: usize,
    what: &str,
    progress: &dyn Fn(&str, usize, usize),
) -> anyhow::Result<SideFigures> {
    let total = convs.len();
    progress(what, 0, total);
    let started = Instant::now();
    let mut answers = futures_util::stream::iter(convs.iter().cloned().map(|messages| {
        let req = request(&side.model, messages, max_tokens);
        async move {
            let sent = Instant::now();
            let c: Result<ChatCompletion, GenError> = side.client.chat(&req).await;
            (c, sent.elapsed().as_secs_f64())
        }
    }))
    .buffer_unordered(concurrency.max(1));
    let (mut latencies, mut completion, mut prompt, mut cached) =
        (Vec::with_capacity(total), 0u64, 0u64, Some(0u64));
    while let Some((answer, latency)) = answers.next().await {
        let c = answer
            .map_err(|e| anyhow::anyhow!("{e}"))
            .with_context(|| format!("{}: a request failed ({what})", side.label))?;
        let usage = c.usage.with_context(|| {
            format!(
                "{}: a response has no usage to count tokens from",
                side.label
            )
        })?;
        completion += usage.completion_tokens;
        prompt += usage.prompt_tokens;
        cached = match (cached, usage.prompt_tokens_details) {
            (Some(sum), Some(d)) => Some(sum + d.cached_tokens),
            _ => None,
        };
        latencies.push(latency);
        progress(what, latencies.len(), total);
    }
    let wall_s = started.elapsed().as_secs_f64();
    let expected = (total * max_tokens) as u64;
    if completion != expected {
        tracing::warn!(
            "{}: {completion} completion tokens where {expected} were asked ({what})",
            side.label
        );
    }
    Ok(SideFigures {
        completion_tokens: completion,
        prompt_tokens: prompt,
        cached_prompt_tokens: cached,
        wall_s,
        tokens_per_s: completion as f64 / wall_s,
        p50_latency_s: percentile(&latencies, 0.5).unwrap_or(0.0),
        p95_latency_s: percentile(&latencies, 0.95).unwrap_or(0.0),
    })
}

/// Requests of a level: at least one per slot of concurrency, whole groups for shared prefixes.
fn requests_at(workload: Workload, concurrency: usize, o: &ServeBenchOptions) -> usize {
    let n = o.requests.max(concurrency).max(1);
    match workload {
        Workload::Independent => n,
        Workload::SharedPrefix => n.div_ceil(o.group_size.max(1)) * o.group_size.max(1),
    }
}

/// Runs the benchmark; `progress` hears what is measured and how many requests are done of
/// how many (0 of 0 while a server starts).
pub async fn run(
    o: &ServeBenchOptions,
    progress: &dyn Fn(&str, usize, usize),
) -> anyhow::Result<ServeReport> {
    anyhow::ensure!(!o.concurrency.is_empty(), "no concurrency level to measure");
    anyhow::ensure!(!o.workloads.is_empty(), "no workload to measure");
    anyhow::ensure!(o.max_tokens > 0, "--max-tokens must be at least 1");
    let began = Instant::now();
    // Servers start one at a time: two cold starts at once would slow both for nothing.
    let host = Side::open("rlhost", &o.host, o, progress).await?;
    let vllm = Side::open("vLLM", &o.vllm, o, progress).await?;
    // A salt per benchmark process, so a server given by URL and measured twice starts cold.
    let salt = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    // Warm-up: first requests fault in kernels, allocate caches and start worker threads.
    let most = o.concurrency.iter().copied().max().unwrap_or(1);
    for side in [&host, &vllm] {
        for &w in &o.workloads {
            let convs = conversations(w, mix(salt ^ u64::MAX), most, o);
            measure(
                side,
                &convs,
                most,
                o.max_tokens.min(8),
                &format!("warming up {} ({})", side.label, w.name()),
                progress,
            )
            .await?;
        }
    }
    let mut rows = Vec::new();
    for (wi, &workload) in o.workloads.iter().enumerate() {
        for (li, &concurrency) in o.concurrency.iter().enumerate() {
            let n = requests_at(workload, concurrency, o);
            let run = mix(salt ^ mix(((wi as u64) << 32) | li as u64));
            let convs = conversations(workload, run, n, o);
            // Alternate which side goes first, so neither always follows the other's run.
            let order = if (wi + li) % 2 == 0 {
                [&host, &vllm]
            } else {
                [&vllm, &host]
            };
            let mut figures = Vec::new();
            for side in order {
                let what = format!("{} c={concurrency} {}", workload.name(), side.label);
                let f = measure(side, &convs, concurrency, o.max_tokens, &what, progress).await?;
                figures.push((side.label, f));
            }
            let pick = |label: &str| {
                figures
                    .iter()
                    .find(|(l, _)| *l == label)
                    .map(|(_, f)| f.clone())
                    .expect("both sides measured")
            };
            let (ours, theirs) = (pick(host.label), pick(vllm.label));
            rows.push(ServeRow {
                workload,
                concurrency,
                requests: n,
                ratio: ours.tokens_per_s / theirs.tokens_per_s,
                rlhost: ours,
                vllm: theirs,
            });
        }
    }
    Ok(ServeReport {
        model: o.model.display().to_string(),
        rlhost_url: host.client.base_url().to_string(),
        vllm_url: vllm.client.base_url().to_string(),
        max_tokens: o.max_tokens,
        group_size: o.group_size,
        wall_s: began.elapsed().as_secs_f64(),
        dtype: match o.dtype {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
        }
        .to_owned(),
        cpu: crate::device::cpu_summary(),
        rows,
    })
}

impl ServeReport {
    /// The table `host bench serve` prints without `--json`.
    pub fn to_text(&self) -> String {
        let mut s = format!(
            "chat completions over HTTP, greedy, {} completion tokens per request (EOS ignored), \
             shared-prefix groups of {}, {}\n{}\nrlhost {}  vs  vLLM {}\nCPU: {}\n",
            self.max_tokens,
            self.group_size,
            self.dtype,
            self.model,
            self.rlhost_url,
            self.vllm_url,
            self.cpu
        );
        s.push_str(&format!(
            "{:<14} {:>4} {:>5} {:>7} | {:>9} {:>7} {:>7} {:>7} | {:>9} {:>7} {:>7} {:>7} | {:>6}\n",
            "workload",
            "conc",
            "reqs",
            "prompt",
            "rlhost/s",
            "p50 s",
            "p95 s",
            "cached%",
            "vLLM/s",
            "p50 s",
            "p95 s",
            "cached%",
            "ratio"
        ));
        let cached = |f: &SideFigures| {
            f.cached_prompt_tokens.map_or("-".to_string(), |c| {
                format!("{:.0}", 100.0 * c as f64 / f.prompt_tokens.max(1) as f64)
            })
        };
        for r in &self.rows {
            s.push_str(&format!(
                "{:<14} {:>4} {:>5} {:>7} | {:>9.0} {:>7.3} {:>7.3} {:>7} | {:>9.0} {:>7.3} {:>7.3} {:>7} | {:>5.2}x\n",
                r.workload.name(),
                r.concurrency,
                r.requests,
                r.rlhost.prompt_tokens / r.requests.max(1) as u64,
                r.rlhost.tokens_per_s,
                r.rlhost.p50_latency_s,
                r.rlhost.p95_latency_s,
                cached(&r.rlhost),
                r.vllm.tokens_per_s,
                r.vllm.p50_latency_s,
                r.vllm.p95_latency_s,
                cached(&r.vllm),
                r.ratio
            ));
        }
        s.push_str(&format!(
            "tok/s: completion tokens (from usage) / wall time; prompt: mean prompt tokens; \
             cached%: prompt tokens served from the prefix cache; ratio: rlhost/vLLM tok/s. \
             {:.0} s in all.\n",
            self.wall_s
        ));
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=20).rev().map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), Some(10.0));
        assert_eq!(percentile(&v, 0.95), Some(19.0));
        assert_eq!(percentile(&v, 1.0), Some(20.0));
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(percentile(&[3.0], 0.95), Some(3.0));
        assert_eq!(percentile(&[2.0, 1.0], 0.5), Some(1.0));
        assert_eq!(percentile(&[], 0.5), None);
    }

    #[test]
    fn shared_prefix_runs_are_whole_groups_of_one_problem() {
        let o = ServeBenchOptions {
            model: PathBuf::from("m"),
            host: ServerSource::Url(String::new()),
            vllm: ServerSource::Url(String::new()),
            concurrency: vec![1],
            requests: 10,
            max_tokens: 4,
            workloads: vec![Workload::SharedPrefix],
            group_size: 4,
            system_words: 20,
            problem_words: 5,
            max_model_len: 2048,
            startup_timeout: Duration::from_secs(1),
            dtype: Precision::F32,
        };
        let n = requests_at(Workload::SharedPrefix, 1, &o);
        assert_eq!(n, 12);
        let convs = conversations(Workload::SharedPrefix, 1, n, &o);
        assert!(convs.iter().all(|c| c[0] == convs[0][0]));
        assert_eq!(convs[0], convs[3]);
        assert_ne!(convs[3][1], convs[4][1]);
        let other = conversations(Workload::SharedPrefix, 2, n, &o);
        assert_ne!(other[0][0], convs[0][0], "runs must not share prefixes");
        let ind = conversations(Workload::Independent, 1, 3, &o);
        let opening = |c: &[ChatMessage]| match &c[0].content {
            Some(crate::openai::MessageContent::Text(t)) => t.chars().take(12).collect::<String>(),
            _ => String::new(),
        };
        assert_ne!(
            opening(&ind[0]),
            opening(&ind[1]),
            "requests must differ early"
        );
        let later = conversations(Workload::Independent, 2, 3, &o);
        assert_ne!(
            opening(&ind[0]),
            opening(&later[0]),
            "runs must differ early"
        );
    }
}
