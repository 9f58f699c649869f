//! A capped, resettable capture of a guest's stdout or stderr. Output beyond the cap is counted
//! and dropped while the program carries on (so a program that prints too much still finishes
//! and keeps its REPL state); only a program that goes on writing far past the cap
//! ([`FLOOD_SLACK`] bytes or [`FLOOD_WRITES`] writes) is stopped, with the recognisable
//! [`OutputFlood`] error, so one printing forever does not burn its whole deadline. It must never fail a write merely because the cap
//! was reached: a failed write is a crash or a `BrokenPipeError` in the guest, not a truncation.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError, StreamResult};

/// How many bytes past its cap a stream may write (and have dropped) before the call is stopped
/// as a flood. Large enough that a program which merely prints too much runs to its end; small
/// enough that an endless printer is stopped in well under a second.
pub const FLOOD_SLACK: usize = 4 << 20;

/// How many writes past its cap a stream may make before the call is stopped as a flood: a
/// program printing short lines forever (one write per line) reaches [`FLOOD_SLACK`] slowly.
pub const FLOOD_WRITES: usize = 100_000;

/// What a writer may write beyond the room left under the cap (accepted, and dropped), so the
/// guest never waits for room that will not come. Generous, because CPython's unbuffered
/// stdio ignores short writes: what a write could not pass is lost without a trace, so the
/// write that crosses the cap must get through whole to be seen (and noted) as cut.
const DISCARD_BUDGET: usize = 1 << 20;

/// The error that stops a call whose output went [`FLOOD_SLACK`] bytes past its cap. The host
/// reports it as the truncation note, never as a crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the program kept writing far past its output cap")]
pub struct OutputFlood;

#[derive(Debug, Default)]
struct CaptureState {
    bytes: Vec<u8>,
    cap: usize,
    /// Bytes written past the cap (and dropped) during this call.
    dropped: usize,
    /// Writes that hit the cap during this call.
    dropped_writes: usize,
    /// The flood stop fired during this call.
    flooded: bool,
}

impl CaptureState {
    fn flood(&mut self) -> StreamError {
        self.flooded = true;
        StreamError::Trap(OutputFlood.into())
    }
}

/// One call's output, taken from a [`CapturePipe`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TakenOutput {
    /// The bytes kept (at most the cap).
    pub bytes: Vec<u8>,
    /// Some output was cut.
    pub truncated: bool,
    /// The call was stopped for writing far past the cap.
    pub flooded: bool,
}

/// A capped in-memory output stream; clones share the buffer.
#[derive(Debug, Clone)]
pub struct CapturePipe {
    inner: Arc<Mutex<CaptureState>>,
}

impl CapturePipe {
    /// A capture that keeps at most `cap` bytes.
    pub fn new(cap: usize) -> Self {
        Self {
            inner: Arc::new(Mutex::new(CaptureState {
                cap,
                ..Default::default()
            })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CaptureState> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes what was captured, leaving the capture empty with a new cap: one call's output for
    /// a REPL that keeps its streams.
    pub fn take(&self, next_cap: usize) -> TakenOutput {
        let mut c = self.lock();
        let out = TakenOutput {
            bytes: std::mem::take(&mut c.bytes),
            truncated: c.dropped > 0,
            flooded: c.flooded,
        };
        c.dropped = 0;
        c.dropped_writes = 0;
        c.flooded = false;
        c.cap = next_cap;
        out
    }

    fn append(&self, data: &[u8]) -> StreamResult<()> {
        let mut c = self.lock();
        if c.flooded {
            return Err(c.flood());
        }
        let room = c.cap.saturating_sub(c.bytes.len());
        let n = room.min(data.len());
        c.bytes.extend_from_slice(&data[..n]);
        if n < data.len() {
            c.dropped = c.dropped.saturating_add(data.len() - n);
            c.dropped_writes += 1;
        }
        if c.dropped > FLOOD_SLACK || c.dropped_writes > FLOOD_WRITES {
            return Err(c.flood());
        }
        Ok(())
    }
}

impl IsTerminal for CapturePipe {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CapturePipe {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[async_trait::async_trait]
impl Pollable for CapturePipe {
    async fn ready(&mut self) {}
}

impl OutputStream for CapturePipe {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.append(&bytes)
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        let mut c = self.lock();
        if c.flooded {
            return Err(c.flood());
        }
        // Past the cap there is still room: what is written there is dropped.
        Ok(c.cap.saturating_sub(c.bytes.len()) + DISCARD_BUDGET)
    }
}

impl tokio::io::AsyncWrite for CapturePipe {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::task::Poll::Ready(match self.append(buf) {
            Ok(()) => Ok(buf.len()),
            Err(_) => Err(std::io::Error::other(OutputFlood)),
        })
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_up_to_the_cap_then_drops_quietly() {
        let mut p = CapturePipe::new(10);
        assert_eq!(p.check_write().unwrap(), 10 + DISCARD_BUDGET);
        p.write(Bytes::from_static(b"hello ")).unwrap();
        p.write(Bytes::from_static(b"world!")).unwrap();
        // Full: writes still succeed (and are dropped), so the program carries on.
        assert!(p.check_write().unwrap() > 0);
        p.write(Bytes::from_static(b"more")).unwrap();
        let got = p.take(4);
        assert_eq!(got.bytes, b"hello worl");
        assert!(got.truncated && !got.flooded);
        p.write(Bytes::from_static(b"ok")).unwrap();
        assert_eq!(
            p.take(4),
            TakenOutput {
                bytes: b"ok".to_vec(),
                ..Default::default()
            }
        );
    }

    #[test]
    fn endless_short_writes_are_a_flood_too() {
        let mut p = CapturePipe::new(1);
        let line = Bytes::from_static(b"1\n");
        let n = (0..FLOOD_WRITES * 2)
            .position(|_| p.write(line.clone()).is_err())
            .expect("the flood stop fired");
        assert_eq!(n, FLOOD_WRITES);
        assert!(p.take(1).flooded);
    }

    #[test]
    fn an_endless_writer_is_stopped_with_a_recognised_error() {
        let mut p = CapturePipe::new(10);
        let chunk = Bytes::from(vec![b'x'; 1 << 20]);
        let mut stopped = None;
        for i in 0..100 {
            if let Err(e) = p.write(chunk.clone()) {
                stopped = Some((i, e));
                break;
            }
        }
        let (i, e) = stopped.expect("the flood stop fired");
        assert_eq!(i, FLOOD_SLACK >> 20);
        match e {
            StreamError::Trap(e) => assert!(e.downcast_ref::<OutputFlood>().is_some()),
            other => panic!("not the flood error: {other:?}"),
        }
        assert!(p.check_write().is_err());
        let got = p.take(10);
        assert_eq!(got.bytes.len(), 10);
        assert!(got.truncated && got.flooded);
        // The next call starts clean.
        p.write(Bytes::from_static(b"ok")).unwrap();
        assert!(!p.take(10).flooded);
    }
}
