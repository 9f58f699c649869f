//! An MLflow run over MLflow's REST API (`/api/2.0/mlflow/…`), from a thread of its own so a
//! slow or absent tracking server never holds up training: the experiment is looked up by name
//! (created when missing), the run created (or, for a resumed `host rl` run, the same run
//! reopened), the resolved configuration logged as params, metrics sent in batches of at most
//! 1000 as they come, and the run's status set at the end (`FINISHED`, or `FAILED` when the
//! command failed).
//!
//! When the server cannot be reached the metrics wait in memory and are sent again with a
//! growing pause (1 s to 30 s); the outage is logged once, and again when it ends. At the end
//! the worker keeps trying for [`FINISH_WAIT`] and then says what it could not send (all of it
//! is in `metrics.jsonl` too).

use std::collections::VecDeque;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// How long the end of a run waits for an unreachable server to take what is left.
pub const FINISH_WAIT: Duration = Duration::from_secs(10);

/// Most metrics held for a server that is down; older ones go first beyond it.
const MAX_PENDING: usize = 1_000_000;

/// What went wrong talking to the tracking server.
#[derive(Debug, thiserror::Error)]
pub enum MlflowError {
    /// No answer: the server is down, unreachable or too slow (retried).
    #[error("{route}: {source}")]
    Unreachable {
        /// Route under `/api/2.0/mlflow/`, such as `runs/log-batch`.
        route: &'static str,
        /// The transport's error.
        #[source]
        source: reqwest::Error,
    },
    /// The server answered with an error status (a 5xx is retried, a 4xx is not).
    #[error("{route}: HTTP {status}: {body}")]
    Status {
        /// Route under `/api/2.0/mlflow/`, such as `runs/log-batch`.
        route: &'static str,
        /// The HTTP status.
        status: u16,
        /// MLflow's `{"error_code", "message"}` body, as sent.
        body: String,
    },
    /// The server answered 200 with a body that is not what the API documents.
    #[error("{route}: unexpected answer")]
    Answer {
        /// Route under `/api/2.0/mlflow/`, such as `runs/log-batch`.
        route: &'static str,
        #[source]
        /// The parse error.
        source: serde_json::Error,
    },
    /// A request body could not be written as JSON.
    #[error("{route}: encoding the request")]
    Encode {
        /// Route under `/api/2.0/mlflow/`, such as `runs/log-batch`.
        route: &'static str,
        /// The encoder's error.
        #[source]
        source: serde_json::Error,
    },
    /// The worker's runtime could not be set up (its async runtime or its thread).
    #[error("starting the MLflow worker")]
    Start(#[source] std::io::Error),
    /// The worker's HTTP client could not be built.
    #[error("building the MLflow HTTP client")]
    Client(#[source] reqwest::Error),
}

impl MlflowError {
    /// Whether trying again later can help (the server is away or failing), as opposed to a
    /// request the server refuses as such.
    fn transient(&self) -> bool {
        match self {
            Self::Unreachable { .. } | Self::Answer { .. } => true,
            Self::Status { status, .. } => *status >= 500 || *status == 429,
            Self::Encode { .. } | Self::Start(_) | Self::Client(_) => false,
        }
    }
}

/// Where and as what the run is tracked.
#[derive(Debug, Clone)]
pub struct MlflowTarget {
    /// The tracking server (`http://127.0.0.1:5000`).
    pub tracking_uri: String,
    /// Experiment name (made when missing).
    pub experiment: String,
    /// Run name.
    pub run_name: String,
    /// An earlier run to reopen instead of creating one (a resumed `host rl` run).
    pub run_id: Option<String>,
    /// Where to record the run's id once it exists, for a later resume.
    pub run_id_file: Option<std::path::PathBuf>,
    /// Tags set on the run (`mlflow.source.name` = `host rl`).
    pub tags: Vec<(String, String)>,
}

/// One metric value as MLflow stores it.
#[derive(Debug, Clone, Serialize)]
struct Metric {
    key: String,
    value: f64,
    timestamp: i64,
    step: i64,
}

#[derive(Serialize)]
struct KeyValue<'a> {
    key: &'a str,
    value: &'a str,
}

/// Messages from the run to the worker.
enum Msg {
    Metrics(Vec<Metric>),
    Finish {
        failed: bool,
        done: mpsc::Sender<()>,
    },
}

/// The run's side of the worker: cheap calls that never block on the server.
pub struct MlflowRun {
    tx: mpsc::Sender<Msg>,
    worker: Option<std::thread::JoinHandle<()>>,
}

/// MLflow's rules for metric and param keys: letters, digits, `_ - . / :` and spaces. Other
/// characters (`@` in `avg@4`) become `_`.
pub fn mlflow_key(key: &str) -> String {
    key.chars()
        .map(|c| {
            if c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | '/' | ':' | ' ') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Milliseconds since the epoch, MLflow's timestamps.
fn millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl MlflowRun {
    /// Starts the worker for `target` with `params` (logged once the run exists). Returns at
    /// once: the server is first contacted by the worker. Fails soft like the rest of the
    /// worker: when its thread, runtime or HTTP client cannot be set up, that is logged as an
    /// error and the run goes on without MLflow (its metrics are in `metrics.jsonl`).
    pub fn start(target: MlflowTarget, params: Vec<(String, String)>) -> Self {
        let (tx, rx) = mpsc::channel();
        let worker = std::thread::Builder::new()
            .name("mlflow".into())
            .spawn(move || match Worker::new(target, params) {
                Ok(w) => w.run(rx),
                Err(e) => tracing::error!(
                    "mlflow: {}; this run's metrics are in metrics.jsonl only",
                    crate::error_chain(&e)
                ),
            })
            .map_err(|e| {
                tracing::error!(
                    "mlflow: {}; this run's metrics are in metrics.jsonl only",
                    crate::error_chain(&MlflowError::Start(e))
                )
            })
            .ok();
        Self { tx, worker }
    }

    /// Queues `values` at `step` (non-finite values are left out: JSON cannot carry them).
    pub fn log(&self, step: u64, values: &std::collections::BTreeMap<String, f64>) {
        let timestamp = millis();
        let metrics = values
            .iter()
            .filter(|(_, v)| v.is_finite())
            .map(|(k, v)| Metric {
                key: mlflow_key(k),
                value: *v,
                timestamp,
                step: step as i64,
            })
            .collect();
        // A worker that is gone has said why.
        let _ = self.tx.send(Msg::Metrics(metrics));
    }

    /// Sends what is left, sets the run's status (`FAILED` when `failed`) and waits for the
    /// worker (at most [`FINISH_WAIT`] when the server is unreachable).
    pub fn finish(mut self, failed: bool) {
        self.close(failed);
    }

    fn close(&mut self, failed: bool) {
        let Some(worker) = self.worker.take() else {
            return;
        };
        let (done, wait) = mpsc::channel();
        if self.tx.send(Msg::Finish { failed, done }).is_ok() {
            let _ = wait.recv_timeout(FINISH_WAIT + Duration::from_secs(20));
        }
        if worker.is_finished() {
            let _ = worker.join();
        }
    }
}

impl Drop for MlflowRun {
    /// A run dropped without [`MlflowRun::finish`] ended by an error: `FAILED`.
    fn drop(&mut self) {
        self.close(true);
    }
}

#[derive(Deserialize)]
struct ExperimentAnswer {
    experiment: Experiment,
}

#[derive(Deserialize)]
struct Experiment {
    experiment_id: String,
}

#[derive(Deserialize)]
struct CreatedExperiment {
    experiment_id: String,
}

#[derive(Deserialize)]
struct RunAnswer {
    run: RunBody,
}

#[derive(Deserialize)]
struct RunBody {
    info: RunInfo,
}

#[derive(Deserialize)]
struct RunInfo {
    run_id: String,
}

#[derive(Deserialize)]
struct ErrorBody {
    #[serde(default)]
    error_code: String,
}

struct Worker {
    target: MlflowTarget,
    params: Vec<(String, String)>,
    http: reqwest::Client,
    rt: tokio::runtime::Runtime,
    run_id: Option<String>,
    params_sent: bool,
    pending: VecDeque<Metric>,
    dropped: usize,
    down: bool,
    pause: Duration,
    next_try: Instant,
}

impl Worker {
    fn new(target: MlflowTarget, params: Vec<(String, String)>) -> Result<Self, MlflowError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(MlflowError::Start)?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .connect_timeout(Duration::from_secs(3))
            // A request every step or so: a fresh connection each time, not one the server
            // may have closed as idle meanwhile.
            .pool_max_idle_per_host(0)
            .build()
            .map_err(MlflowError::Client)?;
        Ok(Self {
            run_id: target.run_id.clone(),
            target,
            params,
            http,
            rt,
            params_sent: false,
            pending: VecDeque::new(),
            dropped: 0,
            down: false,
            pause: Duration::from_secs(1),
            next_try: Instant::now(),
        })
    }

    fn url(&self, route: &str) -> String {
        format!(
            "{}/api/2.0/mlflow/{route}",
            self.target.tracking_uri.trim_end_matches('/')
        )
    }

    fn call<T: serde::de::DeserializeOwned>(
        &self,
        route: &'static str,
        body: Option<&impl Serialize>,
        query: &[(&str, &str)],
    ) -> Result<T, MlflowError> {
        let url = self.url(route);
        let req = match body {
            Some(b) => self
                .http
                .post(url)
                .header("content-type", "application/json")
                .body(
                    serde_json::to_vec(b)
                        .map_err(|source| MlflowError::Encode { route, source })?,
                ),
            None => self.http.get(url).query(query),
        };
        self.rt.block_on(async {
            let resp = req
                .send()
                .await
                .map_err(|source| MlflowError::Unreachable { route, source })?;
            let status = resp.status().as_u16();
            let bytes = resp
                .bytes()
                .await
                .map_err(|source| MlflowError::Unreachable { route, source })?;
            if status != 200 {
                return Err(MlflowError::Status {
                    route,
                    status,
                    body: String::from_utf8_lossy(&bytes).into_owned(),
                });
            }
            serde_json::from_slice(&bytes).map_err(|source| MlflowError::Answer { route, source })
        })
    }

    /// The run's id, making the experiment and the run first when needed.
    fn ensure_run(&mut self) -> Result<String, MlflowError> {
        if let Some(id) = &self.run_id {
            return Ok(id.clone());
        }
        let name = self.target.experiment.clone();
        let experiment_id = match self.call::<ExperimentAnswer>(
            "experiments/get-by-name",
            None::<&()>,
            &[("experiment_name", &name)],
        ) {
            Ok(a) => a.experiment.experiment_id,
            Err(MlflowError::Status { body, .. })
                if serde_json::from_str::<ErrorBody>(&body)
                    .is_ok_and(|e| e.error_code == "RESOURCE_DOES_NOT_EXIST") =>
            {
                self.call::<CreatedExperiment>(
                    "experiments/create",
                    Some(&serde_json::json!({ "name": name })),
                    &[],
                )?
                .experiment_id
            }
            Err(e) => return Err(e),
        };
        let tags: Vec<KeyValue> = self
            .target
            .tags
            .iter()
            .map(|(key, value)| KeyValue { key, value })
            .collect();
        let run: RunAnswer = self.call(
            "runs/create",
            Some(&serde_json::json!({
                "experiment_id": experiment_id,
                "run_name": self.target.run_name,
                "start_time": millis(),
                "tags": tags,
            })),
            &[],
        )?;
        let id = run.run.info.run_id;
        tracing::info!(
            "mlflow: run {id} ({}) in experiment {name:?} at {}",
            self.target.run_name,
            self.target.tracking_uri
        );
        if let Some(f) = &self.target.run_id_file {
            let text =
                serde_json::json!({ "tracking_uri": self.target.tracking_uri, "run_id": id });
            let written = f
                .parent()
                .map_or(Ok(()), std::fs::create_dir_all)
                .and_then(|()| rlhost_fs::write_atomically(f, text.to_string().as_bytes()));
            if let Err(e) = written {
                tracing::warn!("mlflow: recording the run id in {}: {e}", f.display());
            }
        }
        self.run_id = Some(id.clone());
        Ok(id)
    }

    /// Sends the params (once) and every pending metric, in MLflow's batch limits.
    fn flush(&mut self) -> Result<(), MlflowError> {
        let run_id = self.ensure_run()?;
        if !self.params_sent {
            for chunk in self.params.chunks(100) {
                let params: Vec<KeyValue> = chunk
                    .iter()
                    .map(|(key, value)| KeyValue { key, value })
                    .collect();
                let r = self.call::<serde_json::Value>(
                    "runs/log-batch",
                    Some(&serde_json::json!({ "run_id": run_id, "params": params })),
                    &[],
                );
                match r {
                    Ok(_) => {}
                    // A resumed run whose config changed: MLflow keeps a param's first value.
                    Err(e) if !e.transient() => {
                        tracing::warn!("mlflow: params not logged: {e}")
                    }
                    Err(e) => return Err(e),
                }
            }
            self.params_sent = true;
        }
        while !self.pending.is_empty() {
            let n = self.pending.len().min(1000);
            let batch: Vec<Metric> = self.pending.iter().take(n).cloned().collect();
            let r = self.call::<serde_json::Value>(
                "runs/log-batch",
                Some(&serde_json::json!({ "run_id": run_id, "metrics": batch })),
                &[],
            );
            match r {
                Ok(_) => {}
                Err(e) if !e.transient() => {
                    tracing::warn!("mlflow: {n} metrics refused: {e}");
                    self.dropped += n;
                }
                Err(e) => return Err(e),
            }
            self.pending.drain(..n);
        }
        Ok(())
    }

    /// Flushes when due; logs an outage once and its end once.
    fn try_flush(&mut self) {
        if Instant::now() < self.next_try {
            return;
        }
        match self.flush() {
            Ok(()) => {
                if self.down {
                    tracing::info!("mlflow: {} reachable again", self.target.tracking_uri);
                }
                self.down = false;
                self.pause = Duration::from_secs(1);
            }
            Err(e) => {
                if !self.down {
                    tracing::warn!(
                        "mlflow: {} not reachable ({e}); training goes on, metrics are kept and sent \
                         again when it answers (metrics.jsonl has them all)",
                        self.target.tracking_uri
                    );
                }
                self.down = e.transient();
                if !self.down {
                    // A refusal other than of a batch (the run cannot be made): give up.
                    self.pending.clear();
                }
                self.next_try = Instant::now() + self.pause;
                self.pause = (self.pause * 2).min(Duration::from_secs(30));
            }
        }
    }

    fn take(&mut self, metrics: Vec<Metric>) {
        self.pending.extend(metrics);
        while self.pending.len() > MAX_PENDING {
            self.pending.pop_front();
            self.dropped += 1;
        }
    }

    fn run(mut self, rx: mpsc::Receiver<Msg>) {
        loop {
            let wait = self
                .next_try
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(50));
            match rx.recv_timeout(if self.pending.is_empty() && self.run_id.is_some() {
                Duration::from_secs(3600)
            } else {
                wait
            }) {
                Ok(Msg::Metrics(m)) => {
                    self.take(m);
                    // Take whatever else is queued before talking to the server; a `Finish`
                    // among it ends the run here (it must not be lost: its sender waits).
                    loop {
                        match rx.try_recv() {
                            Ok(Msg::Metrics(m)) => self.take(m),
                            Ok(Msg::Finish { failed, done }) => {
                                self.finish(failed);
                                let _ = done.send(());
                                return;
                            }
                            Err(_) => break,
                        }
                    }
                    self.try_flush();
                }
                Ok(Msg::Finish { failed, done }) => {
                    self.finish(failed);
                    let _ = done.send(());
                    return;
                }
                Err(mpsc::RecvTimeoutError::Timeout) => self.try_flush(),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    self.finish(true);
                    return;
                }
            }
        }
    }

    fn finish(&mut self, failed: bool) {
        let deadline = Instant::now() + FINISH_WAIT;
        loop {
            self.next_try = Instant::now();
            match self.flush() {
                Ok(()) => break,
                Err(e) if Instant::now() >= deadline || !e.transient() => {
                    tracing::warn!(
                        "mlflow: {} metrics and the run's status not sent ({e}); they are in \
                         metrics.jsonl",
                        self.pending.len()
                    );
                    return;
                }
                Err(_) => std::thread::sleep(Duration::from_millis(500)),
            }
        }
        let status = if failed { "FAILED" } else { "FINISHED" };
        let Some(run_id) = self.run_id.clone() else {
            tracing::warn!("mlflow: the run was never created; its status is not set");
            return;
        };
        if let Err(e) = self.call::<serde_json::Value>(
            "runs/update",
            Some(&serde_json::json!({ "run_id": run_id, "status": status, "end_time": millis() })),
            &[],
        ) {
            tracing::warn!("mlflow: setting the run's status to {status}: {e}");
        }
        if self.dropped > 0 {
            tracing::warn!(
                "mlflow: {} metrics were refused or dropped; metrics.jsonl has them",
                self.dropped
            );
        }
    }
}
