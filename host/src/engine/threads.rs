//! The engine's choice of CPU threads per forward call: libtorch's thread count is per calling
//! thread, and on 2–16 cores a small step (a decode of a few rows) often runs faster on one
//! thread than on all of them, a large one (a prefill) never. Each step size is timed on both and
//! keeps the faster. On a GPU the CPU threads do no arithmetic and nothing is tuned. Owns no
//! tensors; never changes the threads of another thread (a trainer beside the engine).

use std::collections::HashMap;
use std::time::Instant;

use tch::Device;

/// Intra-op threads per forward call on the CPU (see [`EngineConfig::threads`]). libtorch's
/// thread count is per calling thread (OpenMP's and MKL's local settings), so the engine's
/// choice does not touch a trainer running beside it.
pub(super) struct ThreadTuner {
    /// Threads when tuning: 1 or this.
    max: i32,
    /// No tuning: this count throughout.
    fixed: bool,
    current: i32,
    buckets: HashMap<(bool, u32), Tune>,
}

/// Trials of one step size: best seconds per token with 1 and with `max` threads.
#[derive(Default)]
struct Tune {
    best: [f64; 2],
    tried: [u32; 2],
    choice: Option<usize>,
    uses: u32,
}

/// A timed trial in progress.
pub(super) struct Probe {
    key: (bool, u32),
    candidate: usize,
    tokens: usize,
    started: Instant,
}

impl ThreadTuner {
    const TRIALS: u32 = 5;
    /// A first trial of each count this many times slower than the other settles it.
    const DECISIVE: f64 = 1.5;
    /// Seconds of a step on all cores from which all cores are kept without a trial on one.
    const LARGE_STEP: f64 = 0.05;
    const RECHECK: u32 = 2000;

    pub(super) fn new(threads: Option<usize>, device: Device) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let n = threads.unwrap_or(cores).max(1) as i32;
        Self {
            max: n,
            fixed: threads.is_some() || device != Device::Cpu || n == 1,
            current: 0,
            buckets: HashMap::new(),
        }
    }

    fn set(&mut self, n: i32) {
        if n != self.current {
            tch::set_num_threads(n);
            self.current = n;
        }
    }

    /// Sets the threads for a step of `tokens` tokens; a trial to time when still tuning.
    pub(super) fn start(&mut self, prefill: bool, tokens: usize) -> Option<Probe> {
        if self.fixed {
            self.set(self.max);
            return None;
        }
        let key = (prefill, usize::BITS - tokens.leading_zeros());
        let t = self.buckets.entry(key).or_default();
        t.uses += 1;
        if t.uses.is_multiple_of(Self::RECHECK) {
            *t = Tune {
                uses: t.uses,
                ..Tune::default()
            };
        }
        // All cores first: a large step is faster on them, and a small one loses little there.
        let candidate = t.choice.unwrap_or(usize::from(t.tried[1] <= t.tried[0]));
        // The first step of a size is not timed: it pays one-off costs (allocations, kernels
        // prepared for new shapes) that would decide against whichever count ran it.
        let probe = (t.choice.is_none() && t.uses > 1).then(|| Probe {
            key,
            candidate,
            tokens: tokens.max(1),
            started: Instant::now(),
        });
        self.set(if candidate == 0 { 1 } else { self.max });
        probe.map(|p| Probe {
            started: Instant::now(),
            ..p
        })
    }

    /// Records a trial's time; after enough of both, the faster count is kept.
    pub(super) fn finish(&mut self, probe: Option<Probe>) {
        let Some(p) = probe else { return };
        let elapsed = p.started.elapsed().as_secs_f64();
        let per_token = elapsed / p.tokens as f64;
        let t = self.buckets.entry(p.key).or_default();
        let c = p.candidate;
        if c == 1 && elapsed >= Self::LARGE_STEP {
            // What one thread could win (the cores' synchronisation, microseconds per op) is
            // nothing against a step this long, and losing would double it.
            t.choice = Some(1);
            tracing::debug!(
                prefill = p.key.0,
                tokens_log2 = p.key.1,
                "engine threads: {} ({:.0} ms steps)",
                self.max,
                1e3 * elapsed
            );
            return;
        }
        t.best[c] = if t.tried[c] == 0 {
            per_token
        } else {
            t.best[c].min(per_token)
        };
        t.tried[c] += 1;
        // Five trials each, or one each when one count is clearly faster (at real model sizes
        // a trial step on the wrong count costs hundreds of milliseconds).
        let decisive = t.tried.iter().all(|&n| n >= 1)
            && t.best[0].max(t.best[1]) > Self::DECISIVE * t.best[0].min(t.best[1]);
        if decisive || t.tried.iter().all(|&n| n >= Self::TRIALS) {
            let choice = usize::from(t.best[1] < t.best[0]);
            t.choice = Some(choice);
            tracing::debug!(
                prefill = p.key.0,
                tokens_log2 = p.key.1,
                "engine threads: {} ({:.1} vs {:.1} us/token with 1 and {})",
                if choice == 0 { 1 } else { self.max },
                1e6 * t.best[0],
                1e6 * t.best[1],
                self.max
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn tuner() -> ThreadTuner {
        ThreadTuner {
            max: 2,
            fixed: false,
            current: 0,
            buckets: HashMap::new(),
        }
    }

    /// Runs one step of `tokens` tokens that takes `seconds` on one thread and
    /// `seconds / speedup` on all cores; returns the count it ran on.
    fn step(t: &mut ThreadTuner, tokens: usize, seconds: f64, speedup: f64) -> i32 {
        let probe = t.start(false, tokens);
        let ran = t.current;
        let took = if ran == 1 { seconds } else { seconds / speedup };
        let probe = probe.map(|p| Probe {
            started: Instant::now() - Duration::from_secs_f64(took),
            ..p
        });
        t.finish(probe);
        ran
    }

    /// A size's first step runs on all cores untimed; long steps keep all cores without a
    /// trial on one; short ones are tried on both and keep the faster, after one trial each
    /// when they are far apart and five each when close.
    #[test]
    fn the_thread_tuner_tries_one_thread_only_where_it_can_win() {
        let mut t = tuner();
        // Long steps (a large prefill): never on one thread.
        let ran: Vec<i32> = (0..6).map(|_| step(&mut t, 1024, 2.0, 1.8)).collect();
        assert_eq!(ran, vec![2; 6]);
        // Short steps where one thread is 3x faster: one trial each, then one thread.
        let ran: Vec<i32> = (0..6).map(|_| step(&mut t, 4, 0.003, 1.0 / 3.0)).collect();
        assert_eq!(ran, vec![2, 2, 1, 1, 1, 1]);
        // Short steps 1.2x apart (all cores faster): five trials each, then all cores.
        let ran: Vec<i32> = (0..14).map(|_| step(&mut t, 16, 0.004, 1.2)).collect();
        assert_eq!(ran[0], 2, "the first step, untimed, on all cores");
        assert_eq!(ran[1..11].iter().filter(|&&n| n == 1).count(), 5);
        assert_eq!(&ran[11..], &[2, 2, 2]);
    }
}
