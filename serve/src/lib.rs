//! The accept loop of rlhost's HTTP servers (`host inference`, `host registry serve`): an axum
//! router served over HTTP/1.1 with the limits a server on a shared machine needs and that
//! `axum::serve` does not offer:
//!
//! - **a connection cap** ([`ServeLimits::max_connections`]): at the cap the server stops
//!   accepting, so clients wait in the kernel's accept queue instead of exhausting the process's
//!   file descriptors;
//! - **a header deadline** ([`ServeLimits::header_timeout`]): a client must send a request's
//!   whole head within it, and an idle keep-alive connection is closed after it, so connections
//!   that send a partial header (slowloris) or nothing at all free their slot;
//! - **a body deadline** ([`ServeLimits::body_timeout`]): a request's whole body must arrive
//!   within it after its head; a body that stalls fails the request (the handler sees a read
//!   error, the connection closes) instead of holding a slot forever;
//! - **a lingering close**: a connection that answers before reading the whole request (a 401 or
//!   413 sent from the headers, a 408) shuts its sending side and reads and discards what the
//!   client still sends, for a bounded time ([`LINGER`], [`LINGER_BYTES`]), before closing, so the
//!   client reads the answer instead of a connection reset;
//! - graceful shutdown: when the shutdown future resolves the listener closes, idle connections
//!   close at once, and requests in flight finish.
//!
//! This crate must never know what it serves: routes, bodies and errors belong to the caller.
#![deny(missing_docs)]

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::{Instant, Sleep};
use tower::ServiceExt;

/// Limits of one server, as command-line flags (`#[command(flatten)]`); every value has a
/// default that suits a server on loopback or a trusted network.
#[derive(Debug, Clone, Copy, PartialEq, clap::Args)]
pub struct ServeLimits {
    /// Most client connections open at once. At the cap the server stops accepting until one
    /// closes; keep it below the process's open-file limit (`ulimit -n`).
    #[arg(long, default_value_t = 512, value_parser = at_least_one)]
    pub max_connections: usize,
    /// Seconds a client has to send a request's headers; also how long an idle keep-alive
    /// connection stays open.
    #[arg(long, default_value_t = 10.0, value_parser = positive_seconds)]
    pub header_timeout: f64,
    /// Seconds a client has to send a request's whole body once its headers arrived.
    #[arg(long, default_value_t = 120.0, value_parser = positive_seconds)]
    pub body_timeout: f64,
}

impl Default for ServeLimits {
    fn default() -> Self {
        Self {
            max_connections: 512,
            header_timeout: 10.0,
            body_timeout: 120.0,
        }
    }
}

fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        Ok(_) => Err("must be at least 1".into()),
        Err(e) => Err(e.to_string()),
    }
}

fn positive_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 86_400.0 => Ok(v),
        Ok(v) => Err(format!("{v} is not a number of seconds in (0, 86400]")),
        Err(e) => Err(e.to_string()),
    }
}

impl ServeLimits {
    fn header_deadline(&self) -> Duration {
        Duration::from_secs_f64(self.header_timeout)
    }

    fn body_deadline(&self) -> Duration {
        Duration::from_secs_f64(self.body_timeout)
    }
}

/// A request body that fails once its deadline passes before its last byte arrived, and records
/// whether it was read to its end.
struct DeadlineBody {
    inner: Body,
    deadline: Pin<Box<Sleep>>,
    seconds: f64,
    finished: Arc<AtomicBool>,
}

/// The error a [`DeadlineBody`] reports: the client did not send its body in time.
#[derive(Debug)]
pub struct BodyTimeout {
    seconds: f64,
}

impl std::fmt::Display for BodyTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the request body did not arrive within {} s (--body-timeout)",
            self.seconds
        )
    }
}

impl std::error::Error for BodyTimeout {}

impl http_body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            if frame.is_none() || this.inner.is_end_stream() {
                this.finished.store(true, Ordering::Relaxed);
            }
            return Poll::Ready(frame);
        }
        if this.deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(axum::Error::new(BodyTimeout {
                seconds: this.seconds,
            }))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Longest a closing connection keeps reading what its client still sends.
pub const LINGER: Duration = Duration::from_secs(2);
/// Most bytes a closing connection reads and discards before it closes anyway.
pub const LINGER_BYTES: usize = 16 << 20;

/// A client socket whose shutdown lingers: hyper shuts a connection down once its last answer is
/// written, possibly while the client is still sending a body nobody read. Closing a socket with
/// unread data makes the kernel send a reset, which can destroy the answer before the client
/// reads it; so shutdown closes the sending side first (the client sees the end of the answer),
/// then drains the receiving side until the client closes, [`LINGER`] passes or [`LINGER_BYTES`]
/// were discarded.
struct LingeringStream {
    inner: TcpStream,
    linger: Option<(Pin<Box<Sleep>>, usize)>,
}

impl AsyncRead for LingeringStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for LingeringStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        if this.linger.is_none() {
            std::task::ready!(Pin::new(&mut this.inner).poll_shutdown(cx))?;
            this.linger = Some((Box::pin(tokio::time::sleep(LINGER)), 0));
        }
        let (deadline, drained) = this.linger.as_mut().expect("set above");
        let mut scratch = [0u8; 16 << 10];
        loop {
            if deadline.as_mut().poll(cx).is_ready() || *drained >= LINGER_BYTES {
                return Poll::Ready(Ok(()));
            }
            let mut buf = ReadBuf::new(&mut scratch);
            match Pin::new(&mut this.inner).poll_read(cx, &mut buf) {
                Poll::Ready(Ok(())) if buf.filled().is_empty() => return Poll::Ready(Ok(())),
                Poll::Ready(Ok(())) => *drained += buf.filled().len(),
                // The client is gone: nothing left to protect.
                Poll::Ready(Err(_)) => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// Whether an accept error concerns one connection only (the next accept may succeed at once).
fn is_connection_error(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    )
}

/// Serves `router` on `listener` under `limits` until `shutdown` resolves; then stops accepting,
/// closes idle connections and waits for requests in flight.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ServeLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_deadline())
        .keep_alive(true);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        // Take a slot before accepting: at the cap, clients queue in the kernel, not in our fds.
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => p.expect("the semaphore is never closed"),
            _ = &mut shutdown => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) if is_connection_error(&e) => continue,
                Err(e) => {
                    // Out of file descriptors, say: wait rather than spin.
                    tracing::warn!("accepting a connection failed: {e}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let router = router.clone();
        let body_deadline = limits.body_deadline();
        let seconds = limits.body_timeout;
        let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
            let finished = Arc::new(AtomicBool::new(http_body::Body::is_end_stream(req.body())));
            let req = req.map(|incoming| {
                Body::new(DeadlineBody {
                    inner: Body::new(incoming),
                    deadline: Box::pin(tokio::time::sleep_until(Instant::now() + body_deadline)),
                    seconds,
                    finished: finished.clone(),
                })
            });
            let answer = router.clone().oneshot(req);
            async move {
                let mut response = answer.await?;
                // Answered before the body was read (a 401, 413 or 408): this connection
                // cannot carry another request, and the client must know before it tries.
                if !finished.load(Ordering::Relaxed) {
                    response.headers_mut().insert(
                        axum::http::header::CONNECTION,
                        axum::http::HeaderValue::from_static("close"),
                    );
                }
                Ok::<_, std::convert::Infallible>(response)
            }
        });
        let stream = LingeringStream {
            inner: stream,
            linger: None,
        };
        let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!("connection ended: {e}");
            }
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::post;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    async fn echo(body: Bytes) -> Bytes {
        body
    }

    /// A server of `/echo` (bodies up to 1 KiB) on a free loopback port: its address, the
    /// sender that stops it, and its task.
    async fn start(limits: ServeLimits) -> (std::net::SocketAddr, Stop, Server) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let router = Router::new()
            .route("/echo", post(echo))
            .layer(axum::extract::DefaultBodyLimit::max(1024));
        let server = tokio::spawn(serve(listener, router, limits, async {
            let _ = rx.await;
        }));
        (addr, tx, server)
    }

    type Stop = tokio::sync::oneshot::Sender<()>;
    type Server = tokio::task::JoinHandle<std::io::Result<()>>;

    /// Sends `request` and reads until the server closes (bounded by `within`).
    async fn exchange(addr: std::net::SocketAddr, request: &[u8], within: Duration) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(request).await.unwrap();
        let mut out = Vec::new();
        tokio::time::timeout(within, s.read_to_end(&mut out))
            .await
            .expect("the server answered and closed in time")
            .unwrap();
        String::from_utf8_lossy(&out).into_owned()
    }

    const ECHO: &[u8] =
        b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\nconnection: close\r\n\r\nhello";

    #[tokio::test]
    async fn partial_headers_and_idle_connections_are_closed_at_the_header_deadline() {
        let limits = ServeLimits {
            header_timeout: 0.5,
            ..Default::default()
        };
        let (addr, _stop, _) = start(limits).await;
        let t = Instant::now();
        let mut partial = TcpStream::connect(addr).await.unwrap();
        partial
            .write_all(b"POST /echo HTTP/1.1\r\nhost: x\r\n")
            .await
            .unwrap();
        let mut idle = TcpStream::connect(addr).await.unwrap();
        let mut buf = Vec::new();
        for s in [&mut partial, &mut idle] {
            tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf))
                .await
                .expect("closed by the server")
                .ok();
        }
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
        assert!(
            exchange(addr, ECHO, Duration::from_secs(5))
                .await
                .ends_with("hello")
        );
    }

    #[tokio::test]
    async fn a_stalled_body_fails_its_request_at_the_body_deadline() {
        let limits = ServeLimits {
            body_timeout: 0.5,
            ..Default::default()
        };
        let (addr, _stop, _) = start(limits).await;
        let t = Instant::now();
        let reply = exchange(
            addr,
            b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\nonly ten b",
            Duration::from_secs(5),
        )
        .await;
        assert!(reply.starts_with("HTTP/1.1 4"), "{reply}");
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    }

    #[tokio::test]
    async fn at_the_connection_cap_new_clients_wait_for_a_free_slot() {
        let limits = ServeLimits {
            max_connections: 2,
            header_timeout: 1.0,
            ..Default::default()
        };
        let (addr, _stop, _) = start(limits).await;
        // Two silent clients take both slots; a third is accepted only when they time out.
        let _a = TcpStream::connect(addr).await.unwrap();
        let _b = TcpStream::connect(addr).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let t = Instant::now();
        let reply = exchange(addr, ECHO, Duration::from_secs(5)).await;
        assert!(reply.ends_with("hello"), "{reply}");
        let waited = t.elapsed();
        assert!(
            waited >= Duration::from_millis(700),
            "served after {waited:?}: the cap did not hold"
        );
    }

    #[tokio::test]
    async fn an_early_answer_reaches_a_client_still_sending_its_body() {
        let (addr, _stop, _) = start(ServeLimits::default()).await;
        // 4 MiB against a 1 KiB limit: the 413 comes while the client is still writing.
        for _ in 0..10 {
            let mut s = TcpStream::connect(addr).await.unwrap();
            let body = vec![b'x'; 4 << 20];
            let head = format!(
                "POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n",
                body.len()
            );
            s.write_all(head.as_bytes()).await.unwrap();
            // The client writes its whole body before it reads (as simple clients do); the
            // server answered long before and must not reset the connection under it.
            let _ = tokio::time::timeout(Duration::from_secs(10), s.write_all(&body)).await;
            let mut answer = Vec::new();
            tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut answer))
                .await
                .expect("answered in time")
                .expect("the answer arrives, not a reset");
            let answer = String::from_utf8_lossy(&answer);
            assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
            assert!(answer.contains("connection: close\r\n"), "{answer}");
        }
    }

    #[tokio::test]
    async fn shutdown_stops_accepting_and_finishes() {
        let (addr, tx, server) = start(ServeLimits::default()).await;
        assert!(
            exchange(addr, ECHO, Duration::from_secs(5))
                .await
                .ends_with("hello")
        );
        let _idle = TcpStream::connect(addr).await.unwrap();
        tx.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("the server stopped")
            .unwrap()
            .unwrap();
        assert!(TcpStream::connect(addr).await.is_err());
    }
}
