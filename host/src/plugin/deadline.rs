//! A plugin call's deadline counts the guest's own time only: time it spends in slow host
//! imports (the Python sandbox, which has a deadline of its own) extends it. Shared by every
//! backend; it must never know which backend it times.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Time a plugin call spends in slow host imports, and whether one is running now.
#[derive(Debug, Default)]
pub(crate) struct HostClock {
    spent_ns: AtomicU64,
    inflight: AtomicU64,
}

/// Counts one host import while alive.
pub(crate) struct HostClockGuard<'a> {
    clock: &'a HostClock,
    started: Instant,
}

impl HostClock {
    /// Starts a new call.
    pub(crate) fn reset(&self) {
        self.spent_ns.store(0, Ordering::Relaxed);
    }

    /// Marks a host import as running until the guard drops.
    pub(crate) fn enter(&self) -> HostClockGuard<'_> {
        self.inflight.fetch_add(1, Ordering::Relaxed);
        HostClockGuard {
            clock: self,
            started: Instant::now(),
        }
    }

    fn spent(&self) -> Duration {
        Duration::from_nanos(self.spent_ns.load(Ordering::Relaxed))
    }

    fn busy(&self) -> bool {
        self.inflight.load(Ordering::Relaxed) > 0
    }
}

impl Drop for HostClockGuard<'_> {
    fn drop(&mut self) {
        let ns = u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.clock.spent_ns.fetch_add(ns, Ordering::Relaxed);
        self.clock.inflight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A guest call ran past its deadline.
pub(crate) struct TimedOut;

/// Runs `call` with `limit` of the guest's own time: time spent in slow host imports (see
/// [`HostClock`]; the caller resets it first) extends the deadline, and a deadline that falls
/// while such an import is running waits for it.
pub(crate) async fn with_deadline<F: Future>(
    limit: Duration,
    clock: &HostClock,
    call: F,
) -> Result<F::Output, TimedOut> {
    let start = tokio::time::Instant::now();
    tokio::pin!(call);
    loop {
        let mut deadline = start + limit + clock.spent();
        if clock.busy() {
            deadline = deadline.max(tokio::time::Instant::now() + Duration::from_millis(20));
        }
        match tokio::time::timeout_at(deadline, &mut call).await {
            Ok(out) => return Ok(out),
            Err(_)
                if clock.busy() || start + limit + clock.spent() > tokio::time::Instant::now() =>
            {
                continue;
            }
            Err(_) => return Err(TimedOut),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn time_in_host_imports_does_not_count() {
        let clock = HostClock::default();
        let limit = Duration::from_millis(50);
        // 200 ms inside a host import, 20 ms of its own: within a 50 ms limit.
        let slow_import = async {
            {
                let _running = clock.enter();
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            7
        };
        assert!(matches!(
            with_deadline(limit, &clock, slow_import).await,
            Ok(7)
        ));
        // 200 ms of its own: past the limit.
        clock.reset();
        let slow_guest = tokio::time::sleep(Duration::from_millis(200));
        assert!(with_deadline(limit, &clock, slow_guest).await.is_err());
    }
}
