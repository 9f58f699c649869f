//! Where runs are watched besides `metrics.jsonl` and the terminal: TensorBoard event files
//! ([`tensorboard`]), an MLflow tracking server ([`mlflow`]) and, for commands that run an
//! engine, Prometheus metrics on a port. One [`MonitorConfig`] is `host rl`'s `[monitor]`
//! section and the `--monitor.*` flags of `host sft` and `host eval`, so every command takes
//! the same keys with the same help.
//!
//! Monitors fail soft: a tracker that goes away is logged (once per outage) and retried, and a
//! local write that fails is logged and tried again with a new file; neither stops the run,
//! and `metrics.jsonl` keeps everything either way. What fails hard is what the user can fix
//! before the run starts: a key that does not apply ([`MonitorConfig::check`]) or a
//! TensorBoard folder that cannot be made.

pub mod mlflow;
pub mod prometheus_port;
pub mod tensorboard;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use self::prometheus_port::PrometheusPort;

use self::mlflow::{MlflowRun, MlflowTarget};
use self::tensorboard::EventWriter;

/// The experiment of runs that name none.
pub const DEFAULT_EXPERIMENT: &str = "rlhost";

/// Monitors of a run, any combination at once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, clap::Args)]
#[serde(deny_unknown_fields, default)]
pub struct MonitorConfig {
    /// TensorBoard: write event files (every scalar per step, the configuration as text) to
    /// this folder; watch with `tensorboard --logdir` on it or on its parent to compare runs.
    #[arg(long = "monitor.tensorboard", value_name = "DIR")]
    pub tensorboard: Option<PathBuf>,
    /// Prometheus: serve the engine's metrics (vLLM's names, as `host inference`'s `/metrics`)
    /// and the last step's figures on this port while the run lasts (`host rl` and `host eval
    /// -m`, which run an engine).
    #[arg(long = "monitor.prometheus-port", value_name = "PORT")]
    pub prometheus_port: Option<u16>,
    /// Address the Prometheus port listens on (`0.0.0.0`: scraped from other machines too).
    #[arg(long = "monitor.prometheus-host", value_name = "ADDR", default_value = DEFAULT_PROMETHEUS_HOST)]
    pub prometheus_host: String,
    /// MLflow: the run's params and metrics go to this tracking server.
    #[command(flatten)]
    pub mlflow: MlflowConfig,
}

/// Where the Prometheus port listens unless told otherwise: this machine only.
pub const DEFAULT_PROMETHEUS_HOST: &str = "127.0.0.1";

impl Default for MonitorConfig {
    fn default() -> Self {
        Self {
            tensorboard: None,
            mlflow: MlflowConfig::default(),
            prometheus_port: None,
            prometheus_host: DEFAULT_PROMETHEUS_HOST.to_owned(),
        }
    }
}

/// An MLflow tracking server and the names of the run in it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, clap::Args)]
#[serde(deny_unknown_fields, default)]
pub struct MlflowConfig {
    /// The tracking server's address (`http://127.0.0.1:5000`); unset: no MLflow.
    #[arg(long = "monitor.mlflow.tracking-uri", value_name = "URI")]
    pub tracking_uri: Option<String>,
    /// The experiment the run goes in (made when missing).
    #[arg(long = "monitor.mlflow.experiment", value_name = "NAME", default_value = DEFAULT_EXPERIMENT)]
    pub experiment: String,
    /// The run's name (default: the output folder's name).
    #[arg(long = "monitor.mlflow.run-name", value_name = "NAME")]
    pub run_name: Option<String>,
}

impl Default for MlflowConfig {
    fn default() -> Self {
        Self {
            tracking_uri: None,
            experiment: DEFAULT_EXPERIMENT.to_owned(),
            run_name: None,
        }
    }
}

/// A monitor key set to something the run cannot honour.
#[derive(Debug, thiserror::Error)]
#[error("monitor.{key}: {reason}")]
pub struct MonitorRefused {
    /// The key under `monitor.` (`mlflow.run_name`).
    pub key: &'static str,
    /// Why, and what to do instead.
    pub reason: String,
}

/// What can stop monitors from starting.
#[derive(Debug, thiserror::Error)]
pub enum MonitorError {
    /// A key does not apply.
    #[error(transparent)]
    Refused(#[from] MonitorRefused),
    /// The TensorBoard folder cannot be made or written.
    #[error("monitor.tensorboard: cannot write event files in {}", dir.display())]
    TensorBoard {
        /// The folder.
        dir: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl MonitorConfig {
    /// Refuses keys that would do nothing: MLflow names without a tracking server, a
    /// tracking URI that is not HTTP, a Prometheus port where `engine` says no engine runs
    /// (the reason given).
    pub fn check(&self, engine: Result<(), &str>) -> Result<(), MonitorRefused> {
        let m = &self.mlflow;
        match &m.tracking_uri {
            None if m.run_name.is_some() => {
                return Err(MonitorRefused {
                    key: "mlflow.run_name",
                    reason: "no MLflow server: set monitor.mlflow.tracking_uri".into(),
                });
            }
            None if m.experiment != DEFAULT_EXPERIMENT => {
                return Err(MonitorRefused {
                    key: "mlflow.experiment",
                    reason: "no MLflow server: set monitor.mlflow.tracking_uri".into(),
                });
            }
            Some(uri) if !(uri.starts_with("http://") || uri.starts_with("https://")) => {
                return Err(MonitorRefused {
                    key: "mlflow.tracking_uri",
                    reason: format!(
                        "{uri:?}: an MLflow server's http:// or https:// address (`mlflow server` \
                         prints it; file stores are not written directly)"
                    ),
                });
            }
            _ => {}
        }
        if m.tracking_uri.is_some() && m.experiment.trim().is_empty() {
            return Err(MonitorRefused {
                key: "mlflow.experiment",
                reason: "is empty".into(),
            });
        }
        if self.prometheus_port.is_none() && self.prometheus_host != DEFAULT_PROMETHEUS_HOST {
            return Err(MonitorRefused {
                key: "prometheus_host",
                reason: "no Prometheus port: set monitor.prometheus_port".into(),
            });
        }
        if self.prometheus_host.parse::<std::net::IpAddr>().is_err() {
            return Err(MonitorRefused {
                key: "prometheus_host",
                reason: format!("{:?} is not an IP address", self.prometheus_host),
            });
        }
        if let (Some(_), Err(why)) = (self.prometheus_port, engine) {
            return Err(MonitorRefused {
                key: "prometheus_port",
                reason: why.to_owned(),
            });
        }
        Ok(())
    }

    /// Whether any monitor is asked for.
    pub fn any(&self) -> bool {
        self.tensorboard.is_some()
            || self.mlflow.tracking_uri.is_some()
            || self.prometheus_port.is_some()
    }
}

/// What monitors are told about the run when it starts.
#[derive(Debug, Clone)]
pub struct RunInfo {
    /// The command (`host rl`), an MLflow tag and the TensorBoard text's heading.
    pub command: String,
    /// The run's name when the config names none (the output folder's name).
    pub default_name: String,
    /// The resolved configuration, flattened to dotted keys: MLflow params.
    pub params: Vec<(String, String)>,
    /// The resolved configuration as text (TOML), TensorBoard's `config` text.
    pub config_text: String,
    /// Where the MLflow run's id is kept, for a resumed run to reopen the same run.
    pub state_dir: Option<PathBuf>,
    /// The run goes on from an earlier one: reopen its MLflow run and let TensorBoard drop
    /// the earlier run's points from the first step logged now on.
    pub resume: bool,
}

/// File in `state_dir` holding the MLflow run a resumed run reopens.
const MLFLOW_RUN_FILE: &str = "mlflow-run.json";

/// The monitors of one run: [`Monitors::log`] each step's scalars, [`Monitors::finish`] at
/// the end (dropping them unfinished marks the MLflow run `FAILED`).
pub struct Monitors {
    tb: Option<Tb>,
    mlflow: Option<MlflowRun>,
    resume: bool,
    logged: bool,
}

/// The TensorBoard writer, replaced by a new file after a failed write.
struct Tb {
    dir: PathBuf,
    writer: Option<EventWriter>,
    files: u32,
    failing: bool,
}

impl Tb {
    fn with(&mut self, what: impl FnOnce(&mut EventWriter) -> std::io::Result<()>) {
        let result = match &mut self.writer {
            Some(w) => what(w),
            None => match EventWriter::create(&self.dir, self.files) {
                Ok(mut w) => {
                    self.files += 1;
                    let r = what(&mut w);
                    self.writer = Some(w);
                    r
                }
                Err(e) => Err(e),
            },
        };
        match result {
            Ok(()) if self.failing => {
                tracing::info!("tensorboard: writing to {} again", self.dir.display());
                self.failing = false;
            }
            Ok(()) => {}
            Err(e) => {
                if !self.failing {
                    tracing::warn!(
                        "tensorboard: writing in {}: {e}; training goes on, the next step goes \
                         to a new event file (metrics.jsonl has every step)",
                        self.dir.display()
                    );
                }
                self.failing = true;
                self.writer = None;
            }
        }
    }
}

impl Monitors {
    /// No monitor at all.
    pub fn none() -> Self {
        Self {
            tb: None,
            mlflow: None,
            resume: false,
            logged: false,
        }
    }

    /// Starts the monitors `cfg` asks for (not the Prometheus port: the command serves it
    /// from its engine). Fails only when the TensorBoard folder cannot be written.
    pub fn start(cfg: &MonitorConfig, run: &RunInfo) -> Result<Self, MonitorError> {
        let tb = match &cfg.tensorboard {
            Some(dir) => {
                let tb_err = |source| MonitorError::TensorBoard {
                    dir: dir.clone(),
                    source,
                };
                let mut w = EventWriter::create(dir, 0).map_err(tb_err)?;
                let text = format!(
                    "`{}`\n\n```toml\n{}\n```",
                    run.command,
                    run.config_text.trim_end()
                );
                w.text(0, "config", &text).map_err(tb_err)?;
                tracing::info!("tensorboard: writing {}", w.path().display());
                Some(Tb {
                    dir: dir.clone(),
                    writer: Some(w),
                    files: 1,
                    failing: false,
                })
            }
            None => None,
        };
        let mlflow = cfg.mlflow.tracking_uri.as_ref().map(|uri| {
            let run_id_file = run.state_dir.as_ref().map(|d| d.join(MLFLOW_RUN_FILE));
            let run_id = match (&run_id_file, run.resume) {
                (Some(f), true) => earlier_run(f, uri),
                _ => None,
            };
            MlflowRun::start(
                MlflowTarget {
                    tracking_uri: uri.clone(),
                    experiment: cfg.mlflow.experiment.clone(),
                    run_name: cfg
                        .mlflow
                        .run_name
                        .clone()
                        .unwrap_or_else(|| run.default_name.clone()),
                    run_id,
                    run_id_file,
                    tags: vec![
                        ("mlflow.source.name".into(), run.command.clone()),
                        ("mlflow.source.type".into(), "LOCAL".into()),
                        ("rlhost.version".into(), crate::VERSION.into()),
                    ],
                },
                run.params.clone(),
            )
        });
        Ok(Self {
            tb,
            mlflow,
            resume: run.resume,
            logged: false,
        })
    }

    /// Whether any monitor listens (so callers can skip gathering figures).
    pub fn active(&self) -> bool {
        self.tb.is_some() || self.mlflow.is_some()
    }

    /// Logs `values` at `step` to every monitor.
    pub fn log(&mut self, step: u64, values: &BTreeMap<String, f64>) {
        let first = !std::mem::replace(&mut self.logged, true);
        if let Some(tb) = &mut self.tb {
            if first && self.resume {
                tb.with(|w| w.session_start(step));
            }
            tb.with(|w| w.scalars(step, values));
        }
        if let Some(m) = &self.mlflow {
            m.log(step, values);
        }
    }

    /// Ends the run: `FINISHED`, or `FAILED` when `failed`. Waits a little for a tracker
    /// that is down (see [`mlflow::FINISH_WAIT`]).
    pub fn finish(mut self, failed: bool) {
        if let Some(m) = self.mlflow.take() {
            m.finish(failed);
        }
    }
}

/// The run id a resumed run reopens: the one recorded in `file` for the same server.
fn earlier_run(file: &Path, uri: &str) -> Option<String> {
    #[derive(Deserialize)]
    struct Recorded {
        tracking_uri: String,
        run_id: String,
    }
    let text = std::fs::read_to_string(file).ok()?;
    let r: Recorded = serde_json::from_str(&text).ok()?;
    (r.tracking_uri == uri).then_some(r.run_id)
}

/// The scalars of a report line (a `metrics.jsonl` line): every number, with nested maps'
/// keys joined by `/` (`metrics/correct`), booleans as 0 or 1, and the line's `step` left out
/// (it is the x axis).
pub fn scalars(line: &impl Serialize) -> BTreeMap<String, f64> {
    fn walk(prefix: &str, v: &serde_json::Value, out: &mut BTreeMap<String, f64>) {
        match v {
            serde_json::Value::Number(n) => {
                if let Some(x) = n.as_f64() {
                    out.insert(prefix.to_owned(), x);
                }
            }
            serde_json::Value::Bool(b) => {
                out.insert(prefix.to_owned(), f64::from(u8::from(*b)));
            }
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    let key = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}/{k}")
                    };
                    walk(&key, v, out);
                }
            }
            _ => {}
        }
    }
    let mut out = BTreeMap::new();
    if let Ok(v) = serde_json::to_value(line) {
        walk("", &v, &mut out);
    }
    out.remove("step");
    out
}

/// A configuration flattened to dotted keys and text values, MLflow's params: tables
/// recurse, array elements are numbered (`orchestrator.env.0.id`), unset options are left
/// out. Values longer than MLflow's limit (6000 characters) are cut.
pub fn params(config: &impl Serialize) -> Vec<(String, String)> {
    fn walk(prefix: &str, v: &serde_json::Value, out: &mut Vec<(String, String)>) {
        let join = |k: &str| {
            if prefix.is_empty() {
                k.to_owned()
            } else {
                format!("{prefix}.{k}")
            }
        };
        match v {
            serde_json::Value::Null => {}
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    walk(&join(k), v, out);
                }
            }
            serde_json::Value::Array(items)
                if items.iter().any(|i| i.is_object() || i.is_array()) =>
            {
                for (i, v) in items.iter().enumerate() {
                    walk(&join(&i.to_string()), v, out);
                }
            }
            serde_json::Value::String(s) => out.push((prefix.to_owned(), cut(s))),
            other => out.push((prefix.to_owned(), cut(&other.to_string()))),
        }
    }
    fn cut(s: &str) -> String {
        match s.char_indices().nth(6000) {
            Some((i, _)) => s[..i].to_owned(),
            None => s.to_owned(),
        }
    }
    let mut out = Vec::new();
    if let Ok(v) = serde_json::to_value(config) {
        walk("", &v, &mut out);
    }
    out.into_iter()
        .map(|(k, v)| (mlflow::mlflow_key(&k), v))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Line {
        step: usize,
        reward: f64,
        skipped: bool,
        metrics: BTreeMap<String, f64>,
        note: String,
    }

    #[test]
    fn scalars_flatten_a_line_without_its_step() {
        let line = Line {
            step: 3,
            reward: 0.5,
            skipped: true,
            metrics: [("correct".to_owned(), 0.25)].into(),
            note: "text".into(),
        };
        let s = scalars(&line);
        assert_eq!(
            s.into_iter().collect::<Vec<_>>(),
            [
                ("metrics/correct".to_owned(), 0.25),
                ("reward".to_owned(), 0.5),
                ("skipped".to_owned(), 1.0)
            ]
        );
    }

    #[test]
    fn params_are_dotted_keys_with_lists_numbered() {
        let cfg = serde_json::json!({
            "trainer": {"optim": {"lr": 3e-6}, "seed": null},
            "orchestrator": {"env": [{"id": "arith", "weight": 1.0}], "stop": ["a", "b"]},
            "name": "x@y",
        });
        let p = params(&cfg);
        assert!(
            p.contains(&("trainer.optim.lr".into(), "3e-6".into())),
            "{p:?}"
        );
        assert!(p.contains(&("orchestrator.env.0.id".into(), "arith".into())));
        assert!(p.contains(&("orchestrator.stop".into(), r#"["a","b"]"#.into())));
        assert!(p.contains(&("name".into(), "x@y".into())));
        assert!(!p.iter().any(|(k, _)| k.starts_with("trainer.seed")));
        assert_eq!(mlflow::mlflow_key("eval/arith/avg@4"), "eval/arith/avg_4");
    }

    #[test]
    fn check_refuses_keys_that_would_do_nothing() {
        let mut c = MonitorConfig::default();
        assert!(c.check(Ok(())).is_ok());
        c.mlflow.run_name = Some("x".into());
        assert_eq!(c.check(Ok(())).unwrap_err().key, "mlflow.run_name");
        c.mlflow.tracking_uri = Some("./mlruns".into());
        assert_eq!(c.check(Ok(())).unwrap_err().key, "mlflow.tracking_uri");
        c.mlflow.tracking_uri = Some("http://127.0.0.1:5000".into());
        assert!(c.check(Ok(())).is_ok());
        c.prometheus_port = Some(9100);
        let e = c.check(Err("host sft runs no engine")).unwrap_err();
        assert_eq!(e.key, "prometheus_port");
        assert!(e.to_string().contains("host sft runs no engine"), "{e}");
    }
}
