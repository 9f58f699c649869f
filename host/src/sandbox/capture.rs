//! A capped, resettable capture of a guest's stdout or stderr. Output beyond the cap is cut and
//! the stream then reports itself closed, so a program printing forever fails fast (its next
//! write raises) instead of running to its deadline.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError, StreamResult};

#[derive(Debug, Default)]
struct Captured {
    bytes: Vec<u8>,
    cap: usize,
    truncated: bool,
}

/// A capped in-memory output stream; clones share the buffer.
#[derive(Debug, Clone)]
pub struct CapturePipe {
    inner: Arc<Mutex<Captured>>,
}

impl CapturePipe {
    /// A capture that keeps at most `cap` bytes.
    pub fn new(cap: usize) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Captured {
                bytes: Vec::new(),
                cap,
                truncated: false,
            })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Captured> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes what was captured (and whether some was cut), leaving the capture empty with a
    /// new cap: one call's output for a REPL that keeps its streams.
    pub fn take(&self, next_cap: usize) -> (Vec<u8>, bool) {
        let mut c = self.lock();
        let out = (std::mem::take(&mut c.bytes), c.truncated);
        c.truncated = false;
        c.cap = next_cap;
        out
    }

    fn append(&self, data: &[u8]) -> StreamResult<()> {
        let mut c = self.lock();
        let room = c.cap.saturating_sub(c.bytes.len());
        if room == 0 {
            c.truncated |= !data.is_empty();
            return Err(StreamError::Closed);
        }
        let n = room.min(data.len());
        c.bytes.extend_from_slice(&data[..n]);
        c.truncated |= n < data.len();
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
        match c.cap.saturating_sub(c.bytes.len()) {
            0 => {
                // WASI writers ask for room before writing: asking when full means output
                // was about to be lost.
                c.truncated = true;
                Err(StreamError::Closed)
            }
            room => Ok(room),
        }
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
            Err(_) => Err(std::io::ErrorKind::BrokenPipe.into()),
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
    fn keeps_up_to_the_cap_then_closes() {
        let mut p = CapturePipe::new(10);
        assert_eq!(p.check_write().unwrap(), 10);
        p.write(Bytes::from_static(b"hello ")).unwrap();
        p.write(Bytes::from_static(b"world!")).unwrap();
        assert!(matches!(p.check_write(), Err(StreamError::Closed)));
        assert!(p.write(Bytes::from_static(b"more")).is_err());
        let (bytes, truncated) = p.take(4);
        assert_eq!(bytes, b"hello worl");
        assert!(truncated);
        p.write(Bytes::from_static(b"ok")).unwrap();
        assert_eq!(p.take(4), (b"ok".to_vec(), false));
    }
}
