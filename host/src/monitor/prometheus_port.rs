//! The Prometheus port of a run (`monitor.prometheus_port`): `GET /metrics` answers with the
//! engine's metrics (the names of `host inference`'s `/metrics`) followed by the last step's
//! figures as gauges, `rlhost:train_step` and `rlhost:train_figure{key="…"}` (every key of the
//! step's `metrics.jsonl` line, nested keys joined by `/`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use crate::prometheus::{escape_label_value, format_float};

/// The last step's figures, as the port shows them.
#[derive(Default)]
struct Figures {
    step: Option<u64>,
    values: BTreeMap<String, f64>,
}

/// A running Prometheus port; stops when dropped.
pub struct PrometheusPort {
    figures: Arc<Mutex<Figures>>,
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

/// The port cannot be opened.
#[derive(Debug, thiserror::Error)]
#[error("monitor.prometheus_port: cannot listen on {addr}")]
pub struct PortError {
    /// The address asked for.
    pub addr: String,
    /// Why (in use, not permitted).
    #[source]
    pub source: std::io::Error,
}

impl PrometheusPort {
    /// Listens on `host:port` (bound before this returns, so a port in use fails the command
    /// before it starts working) and serves `engine()`'s text plus the figures given to
    /// [`PrometheusPort::set_step`], on `rt`.
    pub fn start(
        rt: &tokio::runtime::Runtime,
        host: &str,
        port: u16,
        engine: impl Fn() -> String + Send + Sync + 'static,
    ) -> Result<Self, PortError> {
        let want = format!("{host}:{port}");
        let listener = rt
            .block_on(tokio::net::TcpListener::bind(&want))
            .map_err(|source| PortError {
                addr: want.clone(),
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| PortError {
            addr: want.clone(),
            source,
        })?;
        let figures = Arc::new(Mutex::new(Figures::default()));
        let shown = figures.clone();
        let source = move || {
            let mut text = engine();
            text.push_str(&render(&shown.lock().unwrap_or_else(|p| p.into_inner())));
            text
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        rt.spawn(async move {
            let shutdown = async {
                let _ = stopped.await;
            };
            if let Err(e) = crate::server::serve_metrics(listener, source, shutdown).await {
                tracing::warn!("prometheus: the port at {addr} stopped: {e}");
            }
        });
        tracing::info!("prometheus: serving http://{addr}/metrics");
        Ok(Self {
            figures,
            addr,
            stop: Some(stop),
        })
    }

    /// The address listened on (the port chosen when 0 was asked for).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Shows `values` as the figures of `step` from now on.
    pub fn set_step(&self, step: u64, values: &BTreeMap<String, f64>) {
        let mut f = self.figures.lock().unwrap_or_else(|p| p.into_inner());
        f.step = Some(step);
        f.values = values.clone();
    }
}

impl Drop for PrometheusPort {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// The figures in Prometheus' text format (nothing before the first step).
fn render(f: &Figures) -> String {
    let Some(step) = f.step else {
        return String::new();
    };
    let mut s = String::from(
        "# HELP rlhost:train_step The last step reported (0: the evaluation before the first).\n\
         # TYPE rlhost:train_step gauge\n",
    );
    s.push_str(&format!(
        "rlhost:train_step {}\n",
        format_float(step as f64)
    ));
    s.push_str(
        "# HELP rlhost:train_figure The last step's figures, by their metrics.jsonl key.\n\
         # TYPE rlhost:train_figure gauge\n",
    );
    for (k, v) in &f.values {
        s.push_str(&format!(
            "rlhost:train_figure{{key=\"{}\"}} {}\n",
            escape_label_value(k),
            format_float(*v)
        ));
    }
    s
}
