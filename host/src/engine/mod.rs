//! The generation engine: one thread owns the model and a [`SlotCache`]; requests arrive on a
//! channel and join the running batch between decode steps (continuous batching); finished
//! sequences leave at once. A request with `n` samples is prefilled once and its prompt's keys
//! copied to `n` slots. Every token comes back as an [`Event`] with the sampler's
//! log-probability and the policy version that produced it; [`Engine::generate`] collects them
//! into [`Completion`]s. Weights can be replaced between steps ([`Engine::update_weights`]),
//! which bumps the policy version.
//!
//! The engine is in-process: the RL loop calls it directly, and `host inference` serves it over
//! HTTP (`crate::server`).

pub mod detok;
pub mod sampling;

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};

use tch::{Device, Kind, Tensor};
use tokio::sync::{mpsc as tmpsc, oneshot};

use crate::model::qwen3::{SlotCache, read_checkpoint};
use crate::model::{ChatTemplate, ModelError, Qwen3, Tokenizer};
use detok::TextState;
pub use sampling::{Rng, SamplingParams};

/// Errors of the engine.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The request is invalid; the message names the problem.
    #[error("{0}")]
    Invalid(String),
    /// Too many requests are waiting.
    #[error("the engine is overloaded: {0} requests are waiting; retry later")]
    Overloaded(usize),
    /// The engine has stopped.
    #[error("the engine has shut down")]
    Stopped,
    /// Loading the model or new weights failed.
    #[error(transparent)]
    Model(#[from] ModelError),
}

/// Limits of an engine.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Most sequences decoded together (KV-cache slots).
    pub max_batch_size: usize,
    /// Most tokens (prompt + output) per sequence.
    pub max_model_len: usize,
    /// Most requests admitted but not finished before new ones are refused.
    pub max_queue: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            max_batch_size: 32,
            max_model_len: 4096,
            max_queue: 1024,
        }
    }
}

/// Why a sequence ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence token, a stop token or a stop string.
    Stop,
    /// `max_tokens` or the context limit.
    Length,
    /// Cancelled (shutdown).
    Abort,
}

impl FinishReason {
    /// The OpenAI name.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        }
    }
}

/// What the engine reports about one request, sample by sample (`index` < n).
#[derive(Debug, Clone)]
pub enum Event {
    /// A token was generated.
    Token {
        /// Which sample.
        index: usize,
        /// The token id.
        id: u32,
        /// The sampler's log-probability of it.
        logprob: f32,
        /// Alternatives, best first (when asked for).
        top: Vec<(u32, f32)>,
        /// Text that became visible with it (may be empty).
        text: String,
        /// Policy version of the weights that produced it.
        version: u64,
    },
    /// The sample ended; `text` is visible text not yet reported.
    Finished {
        /// Which sample.
        index: usize,
        /// Why.
        reason: FinishReason,
        /// The stop string or token that ended it, if any.
        stop: Option<String>,
        /// Remaining visible text.
        text: String,
    },
}

/// One finished sample.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// Which sample of the request.
    pub index: usize,
    /// Generated token ids (the end-of-sequence token included when one ended it).
    pub token_ids: Vec<u32>,
    /// The sampler's log-probability of each.
    pub logprobs: Vec<f32>,
    /// Alternatives per token (when asked for).
    pub top_logprobs: Vec<Vec<(u32, f32)>>,
    /// The visible text.
    pub text: String,
    /// Why it ended.
    pub finish_reason: FinishReason,
    /// Policy version of each token's weights.
    pub versions: Vec<u64>,
    /// Prompt length in tokens.
    pub prompt_tokens: usize,
}

impl Completion {
    /// A sample with nothing generated yet.
    pub fn empty(index: usize, prompt_tokens: usize) -> Self {
        Self {
            index,
            token_ids: Vec::new(),
            logprobs: Vec::new(),
            top_logprobs: Vec::new(),
            text: String::new(),
            finish_reason: FinishReason::Abort,
            versions: Vec::new(),
            prompt_tokens,
        }
    }

    /// Appends one generated token (what an [`Event::Token`] carries).
    pub fn push_token(
        &mut self,
        id: u32,
        logprob: f32,
        top: Vec<(u32, f32)>,
        text: &str,
        version: u64,
    ) {
        self.token_ids.push(id);
        self.logprobs.push(logprob);
        self.top_logprobs.push(top);
        self.text.push_str(text);
        self.versions.push(version);
    }
}

/// Refuses weights that hold a NaN or an infinity, naming the first such tensor (and how many
/// of its elements are NaN / infinite). A model with one non-finite weight answers garbage for
/// every request after it, so no path into the engine (`POST /update_weights`, the trainer's
/// in-process update, loading) may let one through.
///
/// The test is one sum per floating-point tensor, in the tensor's own dtype (f16 in f32): any
/// NaN or infinity makes the sum non-finite, and it is one vectorised pass with no temporary
/// the size of the tensor (`isfinite().all()` allocates one and took 15-20x longer on a 0.6B
/// checkpoint). Only when a sum is not finite are the NaNs and infinities counted, which also
/// clears a sum that merely overflowed (finite weights, huge total): the test is exact.
pub fn check_finite(weights: &BTreeMap<String, Tensor>) -> Result<(), String> {
    tch::no_grad(|| {
        for (name, t) in weights {
            if !t.is_floating_point() {
                continue;
            }
            let acc = match t.kind() {
                Kind::Half => Kind::Float,
                k => k,
            };
            if t.sum(acc).double_value(&[]).is_finite() {
                continue;
            }
            let nan = t.isnan().sum(Kind::Int64).int64_value(&[]);
            let inf = t.isinf().sum(Kind::Int64).int64_value(&[]);
            if nan + inf > 0 {
                return Err(format!(
                    "tensor `{name}` is not finite: {nan} NaN and {inf} infinite values among its {} elements",
                    t.numel()
                ));
            }
        }
        Ok(())
    })
}

/// New weights for a running engine.
pub enum WeightSource {
    /// A Hugging Face folder (safetensors) of the same architecture.
    Dir(PathBuf),
    /// Tensors under their Hugging Face names (e.g. straight from the trainer).
    Tensors(BTreeMap<String, Tensor>),
}

enum Command {
    Generate(Box<Pending>),
    UpdateWeights(
        BTreeMap<String, Tensor>,
        oneshot::Sender<Result<u64, String>>,
    ),
    Shutdown,
}

struct Pending {
    prompt: Vec<u32>,
    params: Arc<SamplingParams>,
    n: usize,
    events: tmpsc::UnboundedSender<Event>,
}

/// What clients may read about a running engine.
pub struct EngineInfo {
    /// The model's name as served.
    pub name: String,
    /// Tokenizer of the model.
    pub tokenizer: Arc<Tokenizer>,
    /// Chat template of the model, if it has one.
    pub template: Option<ChatTemplate>,
    /// Token ids that end a sequence (generation config + tokenizer).
    pub eos: Vec<u32>,
    /// Limits.
    pub config: EngineConfig,
    /// Vocabulary size of the model.
    pub vocab_size: usize,
    version: AtomicU64,
    in_flight: AtomicUsize,
}

impl EngineInfo {
    /// The current policy version (0 at start, +1 per weight update).
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::SeqCst)
    }

    /// Requests admitted and not yet finished.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }
}

/// A handle on a running engine; cheap to clone, usable from any thread or task.
#[derive(Clone)]
pub struct Engine {
    tx: mpsc::Sender<Command>,
    info: Arc<EngineInfo>,
    thread: Arc<Mutex<Option<std::thread::JoinHandle<()>>>>,
}

/// End-of-sequence ids from `generation_config.json` (one id or a list), else the tokenizer's.
fn eos_ids(dir: &Path, tok: &Tokenizer) -> Vec<u32> {
    let mut ids: Vec<u32> = std::fs::read_to_string(dir.join("generation_config.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .map(|v| match &v["eos_token_id"] {
            serde_json::Value::Number(n) => n.as_u64().into_iter().map(|x| x as u32).collect(),
            serde_json::Value::Array(a) => a
                .iter()
                .filter_map(|x| x.as_u64())
                .map(|x| x as u32)
                .collect(),
            _ => Vec::new(),
        })
        .unwrap_or_default();
    if let Some(e) = tok.eos
        && !ids.contains(&e)
    {
        ids.push(e);
    }
    ids
}

impl Engine {
    /// Loads the model folder `dir` and starts an engine serving it as `name`.
    pub fn load(
        dir: &Path,
        name: &str,
        device: Device,
        kind: Kind,
        config: EngineConfig,
    ) -> Result<Self, EngineError> {
        let model = Qwen3::load(dir, device, kind)?;
        let weights: BTreeMap<String, Tensor> = model.vs.variables().into_iter().collect();
        check_finite(&weights).map_err(|e| {
            EngineError::Invalid(format!("refusing to serve {}: {e}", dir.display()))
        })?;
        let tokenizer = Tokenizer::load(dir)?;
        let template = match ChatTemplate::load(dir) {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::warn!("{}: no usable chat template ({e})", dir.display());
                None
            }
        };
        let eos = eos_ids(dir, &tokenizer);
        Ok(Self::start(model, tokenizer, template, eos, name, config))
    }

    /// Starts an engine on a loaded model.
    pub fn start(
        mut model: Qwen3,
        tokenizer: Tokenizer,
        template: Option<ChatTemplate>,
        eos: Vec<u32>,
        name: &str,
        mut config: EngineConfig,
    ) -> Self {
        model.fuse_projections();
        config.max_model_len = config
            .max_model_len
            .min(model.cfg.max_position_embeddings as usize);
        let info = Arc::new(EngineInfo {
            name: name.to_string(),
            tokenizer: Arc::new(tokenizer),
            template,
            eos,
            vocab_size: model.cfg.vocab_size as usize,
            config,
            version: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
        });
        let (tx, rx) = mpsc::channel();
        let worker = Worker::new(model, info.clone());
        let thread = std::thread::Builder::new()
            .name("rlhost-engine".into())
            .spawn(move || worker.run(rx))
            .expect("spawn the engine thread");
        Self {
            tx,
            info,
            thread: Arc::new(Mutex::new(Some(thread))),
        }
    }

    /// The engine's model, tokenizer and limits.
    pub fn info(&self) -> &Arc<EngineInfo> {
        &self.info
    }

    /// Validates a request and queues it; events arrive on the returned receiver. Dropping the
    /// receiver cancels the request.
    pub fn submit(
        &self,
        prompt: Vec<u32>,
        params: SamplingParams,
        n: usize,
    ) -> Result<tmpsc::UnboundedReceiver<Event>, EngineError> {
        params.validate().map_err(EngineError::Invalid)?;
        let cfg = &self.info.config;
        if n == 0 || n > cfg.max_batch_size {
            return Err(EngineError::Invalid(format!(
                "n must be between 1 and the batch size {}, got {n}",
                cfg.max_batch_size
            )));
        }
        if prompt.is_empty() {
            return Err(EngineError::Invalid("the prompt is empty".into()));
        }
        if prompt.len() >= cfg.max_model_len {
            return Err(EngineError::Invalid(format!(
                "the prompt has {} tokens; the model's context is {} (max-model-len), leaving no room to generate",
                prompt.len(),
                cfg.max_model_len
            )));
        }
        if let Some(bad) = prompt.iter().find(|&&t| t as usize >= self.info.vocab_size) {
            return Err(EngineError::Invalid(format!(
                "token id {bad} is outside the vocabulary of {} tokens",
                self.info.vocab_size
            )));
        }
        let queued = self.info.in_flight.fetch_add(1, Ordering::SeqCst);
        if queued >= cfg.max_queue {
            self.info.in_flight.fetch_sub(1, Ordering::SeqCst);
            return Err(EngineError::Overloaded(queued));
        }
        let (events, rx) = tmpsc::unbounded_channel();
        let pending = Pending {
            prompt,
            params: Arc::new(params),
            n,
            events,
        };
        if self.tx.send(Command::Generate(Box::new(pending))).is_err() {
            self.info.in_flight.fetch_sub(1, Ordering::SeqCst);
            return Err(EngineError::Stopped);
        }
        Ok(rx)
    }

    /// Generates `n` samples for `prompt` and returns them when all have finished.
    pub async fn generate(
        &self,
        prompt: Vec<u32>,
        params: SamplingParams,
        n: usize,
    ) -> Result<Vec<Completion>, EngineError> {
        let prompt_tokens = prompt.len();
        let mut rx = self.submit(prompt, params, n)?;
        collect(&mut rx, n, prompt_tokens).await
    }

    /// Replaces the weights between two decode steps; returns the new policy version. Weights
    /// with a NaN or an infinity are refused ([`check_finite`]) and the engine keeps serving its
    /// current ones: nothing changes unless every tensor is present, shaped right and finite.
    pub async fn update_weights(&self, source: WeightSource) -> Result<u64, EngineError> {
        let refused = |e: String| EngineError::Invalid(format!("new weights refused: {e}"));
        // Read and checked off the engine thread, so decoding goes on meanwhile.
        let weights = tokio::task::spawn_blocking(move || -> Result<_, String> {
            let weights = match source {
                WeightSource::Dir(dir) => read_checkpoint(&dir).map_err(|e| e.to_string())?,
                WeightSource::Tensors(map) => map,
            };
            check_finite(&weights)?;
            Ok(weights)
        })
        .await
        .map_err(|e| refused(format!("reading the weights failed: {e}")))?
        .map_err(refused)?;
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Command::UpdateWeights(weights, reply))
            .map_err(|_| EngineError::Stopped)?;
        rx.await.map_err(|_| EngineError::Stopped)?.map_err(refused)
    }

    /// Stops the engine: running and waiting requests finish with [`FinishReason::Abort`].
    /// Waits for the engine thread.
    pub fn shutdown(&self) {
        let _ = self.tx.send(Command::Shutdown);
        let handle = self.thread.lock().map(|mut t| t.take()).unwrap_or(None);
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}

/// Gathers the events of one request into completions.
pub async fn collect(
    rx: &mut tmpsc::UnboundedReceiver<Event>,
    n: usize,
    prompt_tokens: usize,
) -> Result<Vec<Completion>, EngineError> {
    let mut out: Vec<Completion> = (0..n)
        .map(|index| Completion::empty(index, prompt_tokens))
        .collect();
    let mut done = 0;
    while done < n {
        match rx.recv().await.ok_or(EngineError::Stopped)? {
            Event::Token {
                index,
                id,
                logprob,
                top,
                text,
                version,
            } => out[index].push_token(id, logprob, top, &text, version),
            Event::Finished {
                index,
                reason,
                text,
                ..
            } => {
                out[index].text.push_str(&text);
                out[index].finish_reason = reason;
                done += 1;
            }
        }
    }
    Ok(out)
}

/// A running sequence; sequence `i` of `Worker::running` lives in cache slot `i`.
struct Seq {
    index: usize,
    request: Arc<RequestState>,
    ids: Vec<u32>,
    prompt_len: usize,
    rng: Rng,
    text: TextState,
}

/// What the samples of one request share.
struct RequestState {
    params: Arc<SamplingParams>,
    events: tmpsc::UnboundedSender<Event>,
    remaining: AtomicUsize,
}

/// The worker's cache, created on first use.
fn slot_cache<'a>(
    model: &Qwen3,
    cache: &'a mut Option<SlotCache>,
    slots: i64,
) -> &'a mut SlotCache {
    cache.get_or_insert_with(|| SlotCache::new(model, slots, 256))
}

struct Worker {
    model: Qwen3,
    info: Arc<EngineInfo>,
    cache: Option<SlotCache>,
    running: Vec<Seq>,
    waiting: VecDeque<Pending>,
}

impl Worker {
    fn new(model: Qwen3, info: Arc<EngineInfo>) -> Self {
        Self {
            model,
            info,
            cache: None,
            running: Vec::new(),
            waiting: VecDeque::new(),
        }
    }

    fn run(mut self, rx: mpsc::Receiver<Command>) {
        let _guard = tch::no_grad_guard();
        loop {
            // Block only when there is nothing to do.
            let mut next = if self.running.is_empty() && self.waiting.is_empty() {
                match rx.recv() {
                    Ok(c) => Some(c),
                    Err(_) => return,
                }
            } else {
                rx.try_recv().ok()
            };
            while let Some(cmd) = next.take() {
                match cmd {
                    Command::Generate(p) => self.waiting.push_back(*p),
                    Command::UpdateWeights(source, reply) => {
                        let _ = reply.send(self.update(source));
                    }
                    Command::Shutdown => {
                        self.abort_all();
                        return;
                    }
                }
                next = rx.try_recv().ok();
            }
            self.admit();
            if !self.running.is_empty() {
                self.decode_step();
            }
        }
    }

    /// Copies in weights already read and checked finite by [`Engine::update_weights`].
    fn update(&mut self, weights: BTreeMap<String, Tensor>) -> Result<u64, String> {
        self.model.assign(weights).map_err(|e| e.to_string())?;
        Ok(self.info.version.fetch_add(1, Ordering::SeqCst) + 1)
    }

    fn abort_all(&mut self) {
        for seq in self.running.drain(..) {
            let _ = seq.request.events.send(Event::Finished {
                index: seq.index,
                reason: FinishReason::Abort,
                stop: None,
                text: String::new(),
            });
            self.info.in_flight.fetch_sub(
                usize::from(seq.request.remaining.fetch_sub(1, Ordering::SeqCst) == 1),
                Ordering::SeqCst,
            );
        }
        for p in self.waiting.drain(..) {
            for index in 0..p.n {
                let _ = p.events.send(Event::Finished {
                    index,
                    reason: FinishReason::Abort,
                    stop: None,
                    text: String::new(),
                });
            }
            self.info.in_flight.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Prefills waiting requests while slots are free, and samples their first tokens.
    fn admit(&mut self) {
        let max = self.info.config.max_batch_size;
        while let Some(p) = self.waiting.front() {
            if p.events.is_closed() {
                let p = self.waiting.pop_front().expect("front");
                drop(p);
                self.info.in_flight.fetch_sub(1, Ordering::SeqCst);
                continue;
            }
            if self.running.len() + p.n > max {
                break;
            }
            let p = self.waiting.pop_front().expect("front");
            self.prefill(p);
        }
    }

    fn prefill(&mut self, p: Pending) {
        let first = self.running.len() as i64;
        let len = p.prompt.len() as i64;
        let device = self.model.vs.device();
        let ids: Vec<i64> = p.prompt.iter().map(|&t| i64::from(t)).collect();
        let ids = Tensor::from_slice(&ids).to_device(device).unsqueeze(0);
        let positions = Tensor::arange(len, (Kind::Int64, device)).unsqueeze(0);
        let slots = self.info.config.max_batch_size as i64;
        let cache = slot_cache(&self.model, &mut self.cache, slots);
        let logits = self
            .model
            .forward_slots(&ids, &positions, cache, first, len);
        for i in 1..p.n as i64 {
            cache.copy_slot(first, first + i, len);
        }
        let last = logits.select(1, -1).to_kind(Kind::Float);
        let request = Arc::new(RequestState {
            params: p.params.clone(),
            events: p.events,
            remaining: AtomicUsize::new(p.n),
        });
        let seed = p.params.seed;
        for index in 0..p.n {
            self.running.push(Seq {
                index,
                request: request.clone(),
                ids: p.prompt.clone(),
                prompt_len: p.prompt.len(),
                rng: seed.map_or_else(Rng::from_entropy, |s| {
                    Rng::new(s.wrapping_add(index as u64))
                }),
                text: TextState::default(),
            });
        }
        let from = first as usize;
        let logits = last.expand([p.n as i64, -1], false);
        self.sample_and_advance(&logits, from);
    }

    /// One decode step for every running sequence.
    fn decode_step(&mut self) {
        let b = self.running.len() as i64;
        let device = self.model.vs.device();
        let last: Vec<i64> = self
            .running
            .iter()
            .map(|s| i64::from(*s.ids.last().expect("non-empty")))
            .collect();
        let pos: Vec<i64> = self
            .running
            .iter()
            .map(|s| s.ids.len() as i64 - 1)
            .collect();
        let key_len = pos.iter().max().copied().unwrap_or(0) + 1;
        let ids = Tensor::from_slice(&last).to_device(device).unsqueeze(1);
        let positions = Tensor::from_slice(&pos).to_device(device).unsqueeze(1);
        let slots = self.info.config.max_batch_size as i64;
        let cache = slot_cache(&self.model, &mut self.cache, slots);
        let logits = self
            .model
            .forward_slots(&ids, &positions, cache, 0, key_len);
        let logits = logits.select(1, 0);
        debug_assert_eq!(logits.size()[0], b);
        self.sample_and_advance(&logits, 0);
    }

    /// Samples a token for sequences `from..` (one logits row each), reports them, and retires
    /// the sequences that finished.
    fn sample_and_advance(&mut self, logits: &Tensor, from: usize) {
        let version = self.info.version();
        let sampled = {
            let mut rows: Vec<sampling::Row<'_>> = self.running[from..]
                .iter_mut()
                .map(|s| sampling::Row {
                    params: &s.request.params,
                    rng: &mut s.rng,
                    seen: &s.ids,
                })
                .collect();
            sampling::sample(logits, &mut rows)
        };
        let max_len = self.info.config.max_model_len;
        let mut finished: Vec<usize> = Vec::new();
        for (k, s) in sampled.into_iter().enumerate() {
            let i = from + k;
            let seq = &mut self.running[i];
            let s_token = s.token;
            let params = seq.request.params.clone();
            seq.ids.push(s.token);
            let generated = seq.ids.len() - seq.prompt_len;
            let eos = !params.ignore_eos && self.info.eos.contains(&s.token);
            let stop_token = params.stop_token_ids.contains(&s.token);
            // The text of a stop or end-of-sequence token is not part of the output.
            let stop_str = !(eos || stop_token)
                && seq.text.push(
                    &self.info.tokenizer,
                    &seq.ids[seq.prompt_len..],
                    params.skip_special_tokens,
                    &params.stop,
                );
            let length =
                params.max_tokens.is_some_and(|m| generated >= m) || seq.ids.len() >= max_len;
            let reason = if eos || stop_token || stop_str {
                Some(FinishReason::Stop)
            } else if length {
                Some(FinishReason::Length)
            } else {
                None
            };
            let text = seq.text.take_ready(&params.stop, reason.is_some());
            let alive = seq
                .request
                .events
                .send(Event::Token {
                    index: seq.index,
                    id: s.token,
                    logprob: s.logprob,
                    top: s.top,
                    text,
                    version,
                })
                .is_ok();
            if let Some(reason) = reason {
                // Capacity is released before the client hears of the end, so a client that
                // submits again at once is never refused for its own finished request.
                if seq.request.remaining.fetch_sub(1, Ordering::SeqCst) == 1 {
                    self.info.in_flight.fetch_sub(1, Ordering::SeqCst);
                }
                let _ = seq.request.events.send(Event::Finished {
                    index: seq.index,
                    reason,
                    stop: if stop_str {
                        seq.text.stopped_by.clone()
                    } else if eos || stop_token {
                        self.info.tokenizer.decode(&[s_token], false).ok()
                    } else {
                        None
                    },
                    text: String::new(),
                });
                finished.push(i);
            } else if !alive {
                // The client went away: free the slot.
                if seq.request.remaining.fetch_sub(1, Ordering::SeqCst) == 1 {
                    self.info.in_flight.fetch_sub(1, Ordering::SeqCst);
                }
                finished.push(i);
            }
        }
        // Retire from the back so indices stay valid; the last sequence moves into each hole.
        for &i in finished.iter().rev() {
            let last = self.running.len() - 1;
            self.running.swap_remove(i);
            if i != last {
                let len = self.running[i].ids.len() as i64 - 1;
                if let Some(c) = self.cache.as_mut() {
                    c.copy_slot(last as i64, i as i64, len);
                }
            }
        }
    }
}
