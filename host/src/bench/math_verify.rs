//! `host bench math-verify`: rlhost's math-verify reward plugin against Python `math-verify` on
//! the same answer pairs, in one run: agreement of the verdicts (per answer convention, per kind
//! of candidate, every disagreement listed) and verdicts per second.
//!
//! The pairs and Python's verdicts come from `scripts/math-verify-reference.py` (embedded here),
//! run with the reference interpreter (`.venv-ref`, which has math-verify) over the offline data;
//! rlhost's verdicts come from the reward plugin, loaded and called through the plugin runtime
//! exactly as environments use it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::plugin::RewardFn;

/// The reference script, embedded so an installed `host` can run the benchmark.
pub const REFERENCE_SCRIPT: &str = include_str!("../../../scripts/math-verify-reference.py");

/// Errors of the benchmark.
#[derive(Debug, thiserror::Error)]
pub enum MathVerifyBenchError {
    /// The reference interpreter failed.
    #[error("the Python reference failed ({python}): {message}")]
    Reference {
        /// The Python interpreter that ran the reference script.
        python: PathBuf,
        /// What it said.
        message: String,
    },
    /// A reference file is malformed.
    #[error("{path} line {line}: {message}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// Line number.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// The plugin failed on a pair.
    #[error("the reward plugin failed on pair {id}: {message}")]
    Plugin {
        /// The pair's id, `<gold id>#<n>`.
        id: String,
        /// The plugin error.
        message: String,
    },
    /// I/O.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// One answer pair with Python's verdicts.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Pair {
    /// `<gold id>#<n>`.
    pub id: String,
    /// How the candidate was made (`self`, `solution`, `decimal6`, `… near`, …).
    pub kind: String,
    /// The gold answer.
    pub gold: String,
    /// The answer judged against `gold`.
    pub pred: String,
    /// Python's verdict under verifiers' MathRubric convention.
    pub math_rubric: bool,
    /// Python's verdict under the `seed` convention (verifiers' `math_python`, bare answers).
    pub seed: bool,
}

/// Pairs and Python's timing.
#[derive(Debug, Clone)]
pub struct Reference {
    /// The pairs.
    pub pairs: Vec<Pair>,
    /// Python's verdicts per second (both conventions, `jobs` processes).
    pub python_verdicts_per_sec: f64,
    /// Processes Python used.
    pub jobs: usize,
}

#[derive(Deserialize)]
struct Timing {
    verdicts_per_second: f64,
    jobs: usize,
}

/// Reads a file written by the reference script.
pub fn load_reference(path: &Path) -> Result<Reference, MathVerifyBenchError> {
    let text = std::fs::read_to_string(path)?;
    let mut pairs = Vec::new();
    let mut timing = None;
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let bad = |message: String| MathVerifyBenchError::Malformed {
            path: path.to_owned(),
            line: n + 1,
            message,
        };
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| bad(e.to_string()))?;
        if let Some(t) = v.get("timing") {
            timing =
                Some(serde_json::from_value::<Timing>(t.clone()).map_err(|e| bad(e.to_string()))?);
        } else {
            pairs.push(serde_json::from_value::<Pair>(v).map_err(|e| bad(e.to_string()))?);
        }
    }
    let timing = timing.ok_or_else(|| MathVerifyBenchError::Malformed {
        path: path.to_owned(),
        line: text.lines().count(),
        message: "no timing line (was the reference run interrupted?)".into(),
    })?;
    Ok(Reference {
        pairs,
        python_verdicts_per_sec: timing.verdicts_per_second,
        jobs: timing.jobs,
    })
}

/// Runs the reference script: builds the pairs from `data` and judges them with `python`.
pub fn run_reference(
    python: &Path,
    data: &Path,
    golds: usize,
    jobs: usize,
) -> Result<Reference, MathVerifyBenchError> {
    let dir = tempfile::tempdir()?;
    let script = dir.path().join("math-verify-reference.py");
    std::fs::write(&script, REFERENCE_SCRIPT)?;
    let out = dir.path().join("reference.jsonl");
    let status = std::process::Command::new(python)
        .arg(&script)
        .arg("--data")
        .arg(data)
        .arg("--out")
        .arg(&out)
        .arg("--golds")
        .arg(golds.to_string())
        .arg("--jobs")
        .arg(jobs.to_string())
        .output()
        .map_err(|e| MathVerifyBenchError::Reference {
            python: python.to_owned(),
            message: e.to_string(),
        })?;
    if !status.status.success() {
        return Err(MathVerifyBenchError::Reference {
            python: python.to_owned(),
            message: String::from_utf8_lossy(&status.stderr).trim().to_string(),
        });
    }
    load_reference(&out)
}

/// rlhost's verdicts for one pair: `[math_rubric, seed]`, and whether either timed out.
#[derive(Debug, Clone, Copy, Default)]
pub struct Verdicts {
    /// Under MathRubric.
    pub math_rubric: bool,
    /// Under the `seed` convention.
    pub seed: bool,
    /// The step budget ran out on either.
    pub timed_out: bool,
}

async fn judge_one(reward: &dyn RewardFn, pair: &Pair) -> Result<Verdicts, MathVerifyBenchError> {
    let completion = format!("\\boxed{{{}}}", pair.pred);
    let mut v = Verdicts::default();
    for (convention, slot) in [("math-rubric", 0), ("seed", 1)] {
        let info = format!(r#"{{"convention":"{convention}"}}"#);
        let metrics = reward
            .score(&completion, &pair.gold, &info, 0)
            .await
            .map_err(|e| MathVerifyBenchError::Plugin {
                id: pair.id.clone(),
                message: e.to_string(),
            })?;
        let get = |name: &str| metrics.iter().any(|m| m.name == name && m.value > 0.5);
        if slot == 0 {
            v.math_rubric = get("correct");
        } else {
            v.seed = get("correct");
        }
        v.timed_out |= get("verify_timeout");
    }
    Ok(v)
}

/// Judges every pair with the plugin, `workers` at a time; returns the verdicts and the time.
pub async fn judge(
    reward: Arc<dyn RewardFn>,
    pairs: Arc<Vec<Pair>>,
    workers: usize,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<(Vec<Verdicts>, Duration), MathVerifyBenchError> {
    let started = Instant::now();
    let workers = workers.max(1);
    let done = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut set = tokio::task::JoinSet::new();
    for w in 0..workers {
        let (reward, pairs, done) = (reward.clone(), pairs.clone(), done.clone());
        set.spawn(async move {
            let mut out = Vec::new();
            for i in (w..pairs.len()).step_by(workers) {
                out.push((i, judge_one(reward.as_ref(), &pairs[i]).await?));
                done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            Ok::<_, MathVerifyBenchError>(out)
        });
    }
    let mut verdicts = vec![Verdicts::default(); pairs.len()];
    let mut last = 0;
    loop {
        tokio::select! {
            joined = set.join_next() => match joined {
                None => break,
                Some(r) => {
                    for (i, v) in r.expect("a judging task panicked")? {
                        verdicts[i] = v;
                    }
                }
            },
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
        let now = done.load(std::sync::atomic::Ordering::Relaxed);
        if now != last {
            progress(now);
            last = now;
        }
    }
    Ok((verdicts, started.elapsed()))
}

/// Agreement counts.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Agreement {
    /// Pairs.
    pub pairs: usize,
    /// Same verdict.
    pub agree: usize,
    /// `agree / pairs`.
    pub rate: f64,
}

impl Agreement {
    fn add(&mut self, same: bool) {
        self.pairs += 1;
        self.agree += usize::from(same);
        self.rate = self.agree as f64 / self.pairs as f64;
    }
}

/// A pair the two implementations judge differently.
#[derive(Debug, Clone, Serialize)]
pub struct Disagreement {
    /// `math-rubric` or `seed`.
    pub convention: String,
    /// The pair's id, `<gold id>#<n>`.
    pub id: String,
    /// Candidate kind.
    pub kind: String,
    /// Gold answer.
    pub gold: String,
    /// Candidate.
    pub pred: String,
    /// Python's verdict.
    pub python: bool,
    /// rlhost's verdict.
    pub rlhost: bool,
}

/// The benchmark's result.
#[derive(Debug, Clone, Serialize)]
pub struct MathVerifyReport {
    /// Gold answers' pairs judged.
    pub pairs: usize,
    /// Agreement under verifiers' MathRubric convention.
    pub math_rubric: Agreement,
    /// Agreement under the `seed` convention (verifiers' `math_python`, bare answers).
    pub seed: Agreement,
    /// MathRubric agreement per candidate kind.
    pub by_kind: BTreeMap<String, Agreement>,
    /// Gold answers that rlhost verifies against themselves (MathRubric), of all.
    pub gold_self_rlhost: (usize, usize),
    /// Gold answers that Python verifies against themselves (MathRubric), of all.
    pub gold_self_python: (usize, usize),
    /// Golds matching their solution's boxed answer, rlhost / Python / pairs (MathRubric).
    pub gold_solution: (usize, usize, usize),
    /// Verdicts that ran out of steps.
    pub timeouts: usize,
    /// Every disagreement.
    pub disagreements: Vec<Disagreement>,
    /// rlhost's verdicts per second (the WebAssembly component, a fresh instance per call).
    pub rlhost_verdicts_per_sec: f64,
    /// The same plugin built as a native library, when measured.
    pub native_verdicts_per_sec: Option<f64>,
    /// native / Python.
    pub native_speedup: Option<f64>,
    /// Python's verdicts per second.
    pub python_verdicts_per_sec: f64,
    /// Workers (rlhost tasks, Python processes).
    pub workers: usize,
    /// rlhost / Python.
    pub speedup: f64,
}

/// Compares the verdicts and builds the report; `native` is the native build's run, if any
/// (its verdicts must equal the component's).
pub fn report(
    reference: &Reference,
    verdicts: &[Verdicts],
    elapsed: Duration,
    native: Option<Duration>,
) -> MathVerifyReport {
    let mut r = MathVerifyReport {
        pairs: reference.pairs.len(),
        math_rubric: Agreement::default(),
        seed: Agreement::default(),
        by_kind: BTreeMap::new(),
        gold_self_rlhost: (0, 0),
        gold_self_python: (0, 0),
        gold_solution: (0, 0, 0),
        timeouts: 0,
        disagreements: vec![],
        rlhost_verdicts_per_sec: 2.0 * reference.pairs.len() as f64
            / elapsed.as_secs_f64().max(1e-9),
        native_verdicts_per_sec: native
            .map(|d| 2.0 * reference.pairs.len() as f64 / d.as_secs_f64().max(1e-9)),
        native_speedup: None,
        python_verdicts_per_sec: reference.python_verdicts_per_sec,
        workers: reference.jobs,
        speedup: 0.0,
    };
    r.speedup = r.rlhost_verdicts_per_sec / r.python_verdicts_per_sec.max(1e-9);
    r.native_speedup = r
        .native_verdicts_per_sec
        .map(|n| n / r.python_verdicts_per_sec.max(1e-9));
    for (p, v) in reference.pairs.iter().zip(verdicts) {
        r.math_rubric.add(p.math_rubric == v.math_rubric);
        r.seed.add(p.seed == v.seed);
        r.by_kind
            .entry(p.kind.clone())
            .or_default()
            .add(p.math_rubric == v.math_rubric);
        r.timeouts += usize::from(v.timed_out);
        match p.kind.as_str() {
            "self" => {
                r.gold_self_rlhost.0 += usize::from(v.math_rubric);
                r.gold_self_rlhost.1 += 1;
                r.gold_self_python.0 += usize::from(p.math_rubric);
                r.gold_self_python.1 += 1;
            }
            "solution" => {
                r.gold_solution.0 += usize::from(v.math_rubric);
                r.gold_solution.1 += usize::from(p.math_rubric);
                r.gold_solution.2 += 1;
            }
            _ => {}
        }
        for (convention, python, rlhost) in [
            ("math-rubric", p.math_rubric, v.math_rubric),
            ("seed", p.seed, v.seed),
        ] {
            if python != rlhost {
                r.disagreements.push(Disagreement {
                    convention: convention.into(),
                    id: p.id.clone(),
                    kind: p.kind.clone(),
                    gold: p.gold.clone(),
                    pred: p.pred.clone(),
                    python,
                    rlhost,
                });
            }
        }
    }
    r
}

impl MathVerifyReport {
    /// The text `host bench math-verify` prints: agreement, speed, then every disagreement.
    pub fn to_text(&self) -> String {
        let pct = |a: &Agreement| format!("{:.3}% ({}/{})", 100.0 * a.rate, a.agree, a.pairs);
        let mut s = format!(
            "math-verify: rlhost's plugin vs Python math-verify on {} answer pairs\n\
             agreement, MathRubric convention: {}\n\
             agreement, seed convention:       {}\n\
             golds verified against themselves: rlhost {}/{}, Python {}/{}\n\
             golds vs a differing boxed answer of their solution: rlhost {}/{}, Python {}/{}\n\
             verdicts that ran out of steps: {}\n\
             verdicts/s: rlhost component {:.0}, Python {:.0} ({} workers each) -> {:.1}x\n",
            self.pairs,
            pct(&self.math_rubric),
            pct(&self.seed),
            self.gold_self_rlhost.0,
            self.gold_self_rlhost.1,
            self.gold_self_python.0,
            self.gold_self_python.1,
            self.gold_solution.0,
            self.gold_solution.2,
            self.gold_solution.1,
            self.gold_solution.2,
            self.timeouts,
            self.rlhost_verdicts_per_sec,
            self.python_verdicts_per_sec,
            self.workers,
            self.speedup,
        );
        if let (Some(n), Some(x)) = (self.native_verdicts_per_sec, self.native_speedup) {
            s.push_str(&format!(
                "verdicts/s: rlhost native build {n:.0}, Python {:.0} -> {x:.1}x\n",
                self.python_verdicts_per_sec
            ));
        }
        for d in &self.disagreements {
            s.push_str(&format!(
                "  differs [{}] {}: gold {:?} pred {:?}: Python {}, rlhost {}\n",
                d.convention, d.kind, d.gold, d.pred, d.python, d.rlhost
            ));
        }
        s
    }

    /// The report as Markdown (for `--report`).
    pub fn to_markdown(&self) -> String {
        let mut s =
            String::from("# math-verify agreement (generated by `host bench math-verify`)\n\n");
        s.push_str("```text\n");
        s.push_str(&self.to_text());
        s.push_str("```\n\n| candidate kind | pairs | agreement (MathRubric) |\n|---|---|---|\n");
        for (k, a) in &self.by_kind {
            s.push_str(&format!("| {k} | {} | {:.3}% |\n", a.pairs, 100.0 * a.rate));
        }
        s.push_str("\n## Disagreements\n\n| convention | kind | gold | prediction | Python | rlhost |\n|---|---|---|---|---|---|\n");
        for d in &self.disagreements {
            let esc = |t: &str| format!("`{}`", t.replace('|', "\\|").replace('`', "'"));
            s.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} |\n",
                d.convention,
                d.kind,
                esc(&d.gold),
                esc(&d.pred),
                d.python,
                d.rlhost
            ));
        }
        s
    }
}
