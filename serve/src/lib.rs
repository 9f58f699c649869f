//! The accept loop of rlhost's HTTP servers (`host inference`, `host registry serve`): an axum
//! router served over HTTP/1.1 with the limits a server on a shared machine needs and that
//! `axum::serve` does not offer:
//!
//! - **a connection cap** ([`ServeLimits::max_connections`], default 512): the server never holds
//!   more client sockets than that (plus, for an instant, the one it just accepted). A connection
//!   is either *waiting* (for its first request head or, kept alive, for its next one) or *busy*
//!   (a request head arrived and its answer is not yet written). At the cap, a new client still
//!   gets in as long as some connection is waiting: the one that has waited longest, among those
//!   whose bytes the server has all read, is closed to make room (as nginx drops idle keep-alive
//!   connections when it runs out). So connections that trickle a header (slowloris) or idle
//!   cannot lock anyone out: measured, 1,000 of them sending one byte a second delay a new
//!   request by a few milliseconds on loopback. Only when every slot carries a request does the
//!   server stop accepting, and clients wait in the kernel's accept queue until one ends;
//! - **an accept queue of [`ACCEPT_BACKLOG`]** (4096, as the kernel allows) rather than tokio's
//!   128, so a burst of connections does not make the kernel drop a new client's SYN;
//! - **open files**: at start the process's soft limit on open files (`ulimit -n`) is raised, up
//!   to the hard limit, to at least the cap plus [`RESERVED_FILES`] for everything else the
//!   process opens; where the hard limit is lower the server refuses to start rather than fail
//!   accepts later;
//! - **bounded memory per connection**: a request head (request line and headers) may take at
//!   most [`MAX_HEAD_BYTES`] (64 KiB; a larger one is refused with 431) and hyper buffers at most
//!   that much per connection, so waiting connections hold at most the cap times 64 KiB;
//! - **a header deadline** ([`ServeLimits::header_timeout`], default 10 s): a client must send a
//!   request's whole head within it, and an idle keep-alive connection is closed after it, so a
//!   connection that sends a partial header or nothing at all frees its slot even when nobody
//!   needs it;
//! - **a body deadline** ([`ServeLimits::body_timeout`], default 120 s): a request's whole body
//!   must arrive within it after its head; a body that stalls fails the request (the handler sees
//!   a read error, the connection closes) instead of holding a slot forever;
//! - **a lingering close**: a connection that answers before reading the whole request (a 401 or
//!   413 sent from the headers, a 408) shuts its sending side and reads and discards what the
//!   client still sends, for a bounded time ([`LINGER`], [`LINGER_BYTES`]), before closing, so the
//!   client reads the answer instead of a connection reset; at the cap, with no connection
//!   waiting for a head to close instead, the one lingering longest is closed to make room (its
//!   answer is written and its sending side shut: what it still sends was never going to be
//!   read), so clients that announce bodies they never send cannot keep a new one out for the
//!   linger's length;
//! - graceful shutdown: when the shutdown future resolves the listener closes, idle connections
//!   close at once, and requests in flight finish.
//!
//! This crate must never know what it serves: routes, bodies and errors belong to the caller.
#![deny(missing_docs)]

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
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
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tower::ServiceExt;

/// Limits of one server, as command-line flags (`#[command(flatten)]`); every value has a
/// default that suits a server on loopback or a trusted network.
#[derive(Debug, Clone, Copy, PartialEq, clap::Args)]
pub struct ServeLimits {
    /// Most client connections open at once. At the cap a new client is let in by closing the
    /// connection that has waited longest for a request head (a slow or idle client); only when
    /// every connection carries a request does the server stop accepting until one ends. The
    /// soft open-file limit is raised to the cap plus 256 at start (the server refuses to start
    /// if the hard limit, `ulimit -Hn`, is lower).
    #[arg(long, default_value_t = 512, value_parser = at_least_one)]
    pub max_connections: usize,
    /// Seconds a client has to send a request's headers (at most 64 KiB of them); also how long
    /// an idle keep-alive connection stays open.
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

/// Most bytes of a request head (request line and headers); a larger head is refused with
/// `431 Request Header Fields Too Large`. It is also the most hyper buffers per connection for
/// reading or writing, which bounds the memory of a connection waiting for its head (nginx
/// allows 32 KiB of headers by default, hyper about 400 KiB).
pub const MAX_HEAD_BYTES: usize = 64 << 10;

/// Open files the server keeps for everything but client connections (its listener, the
/// runtime's, model and registry files, pipes to plugins): [`serve`] wants a soft open-file limit
/// of [`ServeLimits::max_connections`] plus this.
pub const RESERVED_FILES: u64 = 256;

/// Connections the kernel may queue for the listener before the server accepts them (Linux
/// clamps it to `net.core.somaxconn`, 4096 by default). [`serve`] sets it on the listener it is
/// given: tokio binds with 128, which a burst of connections fills, and a client whose SYN finds
/// the queue full waits a second or more for the kernel to retry.
pub const ACCEPT_BACKLOG: i32 = 4096;

/// Sets the listener's accept queue to [`ACCEPT_BACKLOG`]: `listen` again on a listening socket
/// changes only its backlog.
#[cfg(unix)]
fn deepen_accept_queue(listener: &TcpListener) {
    use std::os::fd::AsRawFd;
    // SAFETY: `listen` on a socket this listener owns and keeps open for the call.
    if unsafe { libc::listen(listener.as_raw_fd(), ACCEPT_BACKLOG) } != 0 {
        let e = std::io::Error::last_os_error();
        tracing::warn!("could not deepen the accept queue to {ACCEPT_BACKLOG}: {e}");
    }
}

#[cfg(not(unix))]
fn deepen_accept_queue(_: &TcpListener) {}

/// Raises this process's soft limit on open files (`ulimit -n`) to `wanted`, or to the hard
/// limit where that is lower; a soft limit already at or above `wanted` is left alone. Returns
/// the soft limit in force afterwards, which is below `wanted` only when the hard limit is.
#[cfg(unix)]
pub fn raise_open_file_limit(wanted: u64) -> std::io::Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one `rlimit` through a pointer to a live, initialised value.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // `rlim_t` is u64 on 64-bit Linux, narrower on some other targets.
    #[allow(clippy::unnecessary_cast)]
    let (soft, hard) = (lim.rlim_cur as u64, lim.rlim_max as u64);
    if soft >= wanted {
        return Ok(soft);
    }
    let raised = wanted.min(hard);
    if raised <= soft {
        return Ok(soft);
    }
    lim.rlim_cur = raised as libc::rlim_t;
    // SAFETY: setrlimit reads one `rlimit` through a pointer to a live, initialised value.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    tracing::info!("raised the open-file limit (ulimit -n) from {soft} to {raised}");
    Ok(raised)
}

/// Raises this process's soft limit on open files; where there is none to raise, reports
/// `wanted` as granted.
#[cfg(not(unix))]
pub fn raise_open_file_limit(wanted: u64) -> std::io::Result<u64> {
    Ok(wanted)
}

/// The connections of one server that are waiting for a request head, longest waiting first:
/// the ones the accept loop may close to make room at the cap.
struct Tracker {
    waiting: Mutex<Waiting>,
    /// Signalled when a connection closes, starts waiting, or has read all its client sent: the
    /// accept loop, at the cap with no connection to close, looks again.
    room: Notify,
}

#[derive(Default)]
struct Waiting {
    /// By (since when, connection id).
    oldest_first: BTreeMap<(std::time::Instant, u64), Arc<Slot>>,
    /// Connection id to its key in `oldest_first`.
    since: HashMap<u64, std::time::Instant>,
    /// Connections lingering after their last answer ([`LINGER`]), by (since when, id): closed
    /// to make room only when no waiting connection can be.
    lingering: BTreeMap<(std::time::Instant, u64), Arc<Slot>>,
    /// Connection id to its key in `lingering`.
    lingering_since: HashMap<u64, std::time::Instant>,
}

/// What one connection shares with the accept loop.
struct Slot {
    id: u64,
    tracker: Arc<Tracker>,
    /// Set when an answer's body was handed to hyper after its request was read to the end: once
    /// hyper flushed it, the connection waits for its next request head.
    answered: AtomicBool,
    /// Whether hyper's last read found nothing more from the client: a waiting connection may be
    /// closed to make room only then, so a client whose request head already arrived (read by
    /// nobody yet) is never closed, nor a socket reset over unread data.
    drained: AtomicBool,
    /// Notified when the accept loop closes this connection to make room.
    evict: Notify,
}

impl Tracker {
    fn new() -> Self {
        Self {
            waiting: Mutex::new(Waiting::default()),
            room: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Waiting> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether some connection waits for a request head with nothing of it left unread, or
    /// lingers after its last answer.
    fn has_evictable(&self) -> bool {
        let w = self.lock();
        !w.lingering.is_empty()
            || w.oldest_first
                .values()
                .any(|slot| slot.drained.load(Ordering::Relaxed))
    }

    /// Closes the connection that has waited longest for a request head with nothing of it left
    /// unread, else the one lingering longest after its last answer, if there is one.
    fn evict_oldest(&self) -> bool {
        let slot = {
            let mut w = self.lock();
            let waiting = w
                .oldest_first
                .iter()
                .find(|(_, slot)| slot.drained.load(Ordering::Relaxed))
                .map(|(key, _)| *key);
            match waiting {
                Some(key) => {
                    let slot = w.oldest_first.remove(&key).expect("found above");
                    w.since.remove(&slot.id);
                    slot
                }
                None => {
                    let Some((_, slot)) = w.lingering.pop_first() else {
                        return false;
                    };
                    w.lingering_since.remove(&slot.id);
                    slot
                }
            }
        };
        slot.evict.notify_one();
        true
    }
}

impl Slot {
    /// The connection now waits for a request head (it was just accepted, or its last answer
    /// was flushed and it is kept alive).
    fn waiting(self: &Arc<Self>) {
        let now = std::time::Instant::now();
        // Closable once hyper has read what the client sent so far.
        self.drained.store(false, Ordering::Relaxed);
        {
            let mut w = self.tracker.lock();
            if let Some(old) = w.since.insert(self.id, now) {
                w.oldest_first.remove(&(old, self.id));
            }
            w.oldest_first.insert((now, self.id), self.clone());
        }
        self.tracker.room.notify_waiters();
    }

    /// The connection carries a request (its head arrived) or is closed: not to be closed to
    /// make room.
    fn busy(&self) {
        let mut w = self.tracker.lock();
        if let Some(old) = w.since.remove(&self.id) {
            w.oldest_first.remove(&(old, self.id));
        }
        if let Some(old) = w.lingering_since.remove(&self.id) {
            w.lingering.remove(&(old, self.id));
        }
    }

    /// The connection's answer is written and its sending side shut; it lingers to let the
    /// client read it, and may be closed to make room after every waiting connection.
    fn lingering(self: &Arc<Self>) {
        let now = std::time::Instant::now();
        {
            let mut w = self.tracker.lock();
            if let Some(old) = w.since.remove(&self.id) {
                w.oldest_first.remove(&(old, self.id));
            }
            if w.lingering_since.insert(self.id, now).is_none() {
                w.lingering.insert((now, self.id), self.clone());
            }
        }
        self.tracker.room.notify_waiters();
    }
}

/// An answer's body that, when hyper is done with it, marks its connection as about to wait
/// for the next request, if the request was read to its end (else the connection closes).
struct AnsweredBody {
    inner: Body,
    slot: Arc<Slot>,
    request_read: Arc<AtomicBool>,
}

impl Drop for AnsweredBody {
    fn drop(&mut self) {
        if self.request_read.load(Ordering::Relaxed) {
            self.slot.answered.store(true, Ordering::Relaxed);
        }
    }
}

impl http_body::Body for AnsweredBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
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
///
/// It also tells the accept loop when the connection starts waiting for its next request (when
/// hyper flushed an answer, nothing of it left in hyper's buffer, whose request was read) and
/// whether hyper's last read found the client's data all read.
struct LingeringStream {
    inner: TcpStream,
    linger: Option<(Pin<Box<Sleep>>, usize)>,
    slot: Arc<Slot>,
}

impl AsyncRead for LingeringStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let read = Pin::new(&mut self.inner).poll_read(cx, buf);
        if read.is_pending() {
            if !self.slot.drained.swap(true, Ordering::Relaxed) {
                self.slot.tracker.room.notify_waiters();
            }
        } else {
            self.slot.drained.store(false, Ordering::Relaxed);
        }
        read
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
        // hyper flushes the socket only once its own buffer is empty.
        let flushed = std::task::ready!(Pin::new(&mut self.inner).poll_flush(cx));
        if flushed.is_ok() && self.slot.answered.swap(false, Ordering::Relaxed) {
            self.slot.waiting();
        }
        Poll::Ready(flushed)
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
            // Closing: not to be closed to make room until the answer is on its way.
            this.slot.busy();
            std::task::ready!(Pin::new(&mut this.inner).poll_shutdown(cx))?;
            this.linger = Some((Box::pin(tokio::time::sleep(LINGER)), 0));
            this.slot.lingering();
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

/// A slot for a connection just accepted: a free one, else one made by closing the connection
/// that has waited longest for a request head, else (every connection carries a request) the
/// first one freed. Returns the permit and whether a connection was closed for it.
async fn slot_for_new(permits: &Arc<Semaphore>, tracker: &Tracker) -> (OwnedSemaphorePermit, bool) {
    loop {
        let room = tracker.room.notified();
        let mut room = std::pin::pin!(room);
        room.as_mut().enable();
        if let Ok(permit) = permits.clone().try_acquire_owned() {
            return (permit, false);
        }
        if tracker.evict_oldest() {
            // The closed connection gives its permit back as soon as its task runs.
            let permit = permits.clone().acquire_owned().await;
            return (permit.expect("the semaphore is never closed"), true);
        }
        room.await;
    }
}

/// Serves `router` on `listener` under `limits` until `shutdown` resolves; then stops accepting,
/// closes idle connections and waits for requests in flight.
///
/// Fails at once, serving nothing, when the open-file limit cannot be raised to
/// [`ServeLimits::max_connections`] plus [`RESERVED_FILES`].
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ServeLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let cap = limits.max_connections.max(1);
    let wanted = (cap as u64).saturating_add(RESERVED_FILES);
    let files = raise_open_file_limit(wanted)?;
    if files < wanted {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "--max-connections {cap} needs {wanted} open files ({RESERVED_FILES} kept for \
                 everything else) but the hard limit is {files} (ulimit -Hn): lower \
                 --max-connections or raise the limit"
            ),
        ));
    }
    deepen_accept_queue(&listener);
    let permits = Arc::new(Semaphore::new(cap));
    let tracker = Arc::new(Tracker::new());
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_deadline())
        .max_header_size(MAX_HEAD_BYTES)
        .max_buf_size(MAX_HEAD_BYTES)
        .keep_alive(true);
    let mut shutdown = std::pin::pin!(shutdown);
    let mut next_id = 0u64;
    let (mut evicted, mut last_warning) = (0u64, None::<Instant>);
    'accept: loop {
        // Accept only with a slot free or one to free: at the cap with every connection busy,
        // clients queue in the kernel, not in our file descriptors.
        loop {
            let room = tracker.room.notified();
            let mut room = std::pin::pin!(room);
            room.as_mut().enable();
            if permits.available_permits() > 0 || tracker.has_evictable() {
                break;
            }
            tokio::select! {
                _ = room => {}
                _ = &mut shutdown => break 'accept,
            }
        }
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
        let (permit, made_room) = tokio::select! {
            got = slot_for_new(&permits, &tracker) => got,
            _ = &mut shutdown => break,
        };
        if made_room {
            evicted += 1;
            tracing::debug!("at the connection cap: closed the longest-waiting connection");
            if last_warning.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
                tracing::warn!(
                    "at the connection cap ({cap}): closing the connections that waited \
                     longest for a request head (slow or idle clients) to let new ones in; \
                     {evicted} so far"
                );
                last_warning = Some(Instant::now());
            }
        }
        let _ = stream.set_nodelay(true);
        let slot = Arc::new(Slot {
            id: next_id,
            tracker: tracker.clone(),
            answered: AtomicBool::new(false),
            drained: AtomicBool::new(false),
            evict: Notify::new(),
        });
        next_id += 1;
        slot.waiting();
        let router = router.clone();
        let body_deadline = limits.body_deadline();
        let seconds = limits.body_timeout;
        let service_slot = slot.clone();
        let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
            service_slot.busy();
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
            let slot = service_slot.clone();
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
                let response = response.map(|inner| {
                    Body::new(AnsweredBody {
                        inner,
                        slot,
                        request_read: finished,
                    })
                });
                Ok::<_, std::convert::Infallible>(response)
            }
        });
        let stream = LingeringStream {
            inner: stream,
            linger: None,
            slot: slot.clone(),
        };
        let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            {
                let conn = std::pin::pin!(conn);
                tokio::select! {
                    ended = conn => if let Err(e) = ended {
                        tracing::debug!("connection ended: {e}");
                    },
                    () = slot.evict.notified() => {}
                }
                // The connection (its socket) is dropped here, before its slot is given back.
            }
            slot.busy();
            drop(permit);
            slot.tracker.room.notify_waiters();
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

    /// Answers from the headers alone (as an authentication check does), reading no body.
    async fn early() -> axum::http::StatusCode {
        axum::http::StatusCode::UNAUTHORIZED
    }

    async fn slow(body: Bytes) -> Bytes {
        tokio::time::sleep(Duration::from_secs(1)).await;
        body
    }

    /// A server of `/echo`, `/slow` (an echo after a second; bodies up to 1 KiB) and `/early` (a
    /// 401 without reading the body) on a free loopback port: its address, the
    /// sender that stops it, and its task.
    async fn start(limits: ServeLimits) -> (std::net::SocketAddr, Stop, Server) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let router = Router::new()
            .route("/echo", post(echo))
            .route("/slow", post(slow))
            .route("/early", post(early))
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

    /// Whether the server closed `s` within `within` (an end of stream or a reset), rather than
    /// keeping it open.
    async fn closed_by_server(s: &mut TcpStream, within: Duration) -> bool {
        let mut buf = [0u8; 1024];
        loop {
            match tokio::time::timeout(within, s.read(&mut buf)).await {
                Err(_) => return false,
                Ok(Ok(0) | Err(_)) => return true,
                Ok(Ok(_)) => continue,
            }
        }
    }

    #[tokio::test]
    async fn at_the_cap_the_connection_waiting_longest_makes_room() {
        let limits = ServeLimits {
            max_connections: 2,
            ..Default::default()
        };
        let (addr, _stop, _) = start(limits).await;
        // A silent client, then one that sent half a head: both waiting, the cap reached.
        let mut silent = TcpStream::connect(addr).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut partial = TcpStream::connect(addr).await.unwrap();
        partial.write_all(b"POST /echo HTTP/1.1\r\n").await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        // A new client is served at once (not after the 10 s header deadline)...
        let t = Instant::now();
        let reply = exchange(addr, ECHO, Duration::from_secs(5)).await;
        assert!(reply.ends_with("hello"), "{reply}");
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        // ...by closing the connection that waited longest; the other stays open.
        assert!(closed_by_server(&mut silent, Duration::from_secs(1)).await);
        assert!(!closed_by_server(&mut partial, Duration::from_millis(300)).await);
    }

    #[tokio::test]
    async fn a_burst_at_the_cap_never_closes_a_connection_whose_head_arrived() {
        let limits = ServeLimits {
            max_connections: 4,
            body_timeout: 1.0,
            ..Default::default()
        };
        let (addr, _stop, _) = start(limits).await;
        // At once: partial heads (closable) and complete heads with stalled bodies (busy as
        // soon as read), far more than the cap.
        let mut clients = Vec::new();
        for i in 0..40 {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(if i % 2 == 0 {
                b"POST /echo HTTP/1.1\r\nhost: x\r\n".as_slice()
            } else {
                b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 9\r\n\r\nfour".as_slice()
            })
            .await
            .unwrap();
            clients.push(s);
        }
        // Every stalled body is answered (4xx) at its deadline, never closed to make room; every
        // partial head is closed, never reset.
        for (i, mut s) in clients.into_iter().enumerate() {
            let mut out = Vec::new();
            tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut out))
                .await
                .expect("closed in time")
                .unwrap_or_else(|e| panic!("client {i}: {e}"));
            let out = String::from_utf8_lossy(&out);
            if i % 2 == 1 {
                assert!(out.starts_with("HTTP/1.1 4"), "client {i}: {out}");
            }
        }
    }

    #[tokio::test]
    async fn an_idle_keep_alive_connection_makes_room_after_its_answer() {
        let limits = ServeLimits {
            max_connections: 1,
            ..Default::default()
        };
        let (addr, _stop, _) = start(limits).await;
        let mut kept = TcpStream::connect(addr).await.unwrap();
        kept.write_all(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nhello")
            .await
            .unwrap();
        let mut answer = Vec::new();
        while !answer.ends_with(b"hello") {
            let mut buf = [0u8; 256];
            let n = tokio::time::timeout(Duration::from_secs(5), kept.read(&mut buf))
                .await
                .expect("answered")
                .unwrap();
            assert!(n > 0, "closed before the answer");
            answer.extend_from_slice(&buf[..n]);
        }
        // The kept-alive connection holds the only slot; a new client takes it at once.
        let t = Instant::now();
        let reply = exchange(addr, ECHO, Duration::from_secs(5)).await;
        assert!(reply.ends_with("hello"), "{reply}");
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        assert!(closed_by_server(&mut kept, Duration::from_secs(1)).await);
    }

    #[tokio::test]
    async fn at_the_cap_with_every_connection_busy_new_clients_wait() {
        let limits = ServeLimits {
            max_connections: 2,
            ..Default::default()
        };
        let (addr, _stop, _) = start(limits).await;
        // Two requests in flight (the handler takes a second) take both slots: neither is
        // closed to make room, and a third client is served only when one has ended.
        let slow =
            b"POST /slow HTTP/1.1\r\nhost: x\r\ncontent-length: 4\r\nconnection: close\r\n\r\nslow";
        let busy: Vec<_> = (0..2)
            .map(|_| tokio::spawn(exchange(addr, slow, Duration::from_secs(5))))
            .collect();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let t = Instant::now();
        let reply = exchange(addr, ECHO, Duration::from_secs(5)).await;
        assert!(reply.ends_with("hello"), "{reply}");
        let waited = t.elapsed();
        assert!(
            waited >= Duration::from_millis(600),
            "served after {waited:?}: a request in flight was closed or the cap did not hold"
        );
        for b in busy {
            let reply = b.await.unwrap();
            assert!(reply.ends_with("slow"), "{reply}");
        }
    }

    #[tokio::test]
    async fn a_head_over_the_limit_is_refused() {
        let (addr, _stop, _) = start(ServeLimits::default()).await;
        let big = format!(
            "POST /echo HTTP/1.1\r\nhost: x\r\nx-big: {}\r\ncontent-length: 5\r\nconnection: close\r\n\r\nhello",
            "a".repeat(MAX_HEAD_BYTES)
        );
        let reply = exchange(addr, big.as_bytes(), Duration::from_secs(5)).await;
        assert!(reply.starts_with("HTTP/1.1 431"), "{reply}");
        let fits = format!(
            "POST /echo HTTP/1.1\r\nhost: x\r\nx-big: {}\r\ncontent-length: 5\r\nconnection: close\r\n\r\nhello",
            "a".repeat(MAX_HEAD_BYTES - 1024)
        );
        let reply = exchange(addr, fits.as_bytes(), Duration::from_secs(5)).await;
        assert!(reply.ends_with("hello"), "{reply}");
    }

    #[tokio::test]
    async fn a_cap_beyond_the_open_file_limit_is_refused() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let limits = ServeLimits {
            // More than Linux lets any process open (fs.nr_open is at most 2^30).
            max_connections: 1 << 31,
            ..Default::default()
        };
        let err = serve(listener, Router::new(), limits, async {})
            .await
            .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
        assert!(err.to_string().contains("--max-connections"), "{err}");
    }

    #[test]
    fn the_open_file_limit_is_raised_up_to_the_hard_limit_only() {
        let now = raise_open_file_limit(0).unwrap();
        // Asking for less changes nothing; asking for more than any hard limit gives the hard one.
        assert_eq!(raise_open_file_limit(now).unwrap(), now);
        let most = raise_open_file_limit(u64::MAX).unwrap();
        assert!(most >= now);
        assert_eq!(raise_open_file_limit(0).unwrap(), most);
    }

    /// Clients that announce a body and never send it are answered from the headers (a 401, as
    /// the registry's upload routes do) and linger; at the cap they make room for a new client at once,
    /// not after the linger (the attack: thousands of such clients delayed every real one by
    /// seconds), and each still reads its answer.
    #[tokio::test]
    async fn at_the_cap_a_lingering_connection_makes_room() {
        let limits = ServeLimits {
            max_connections: 2,
            ..Default::default()
        };
        let (addr, _stop, _) = start(limits).await;
        let mut stalled = Vec::new();
        for _ in 0..2 {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(b"POST /early HTTP/1.1\r\nhost: x\r\ncontent-length: 4000000\r\n\r\n")
                .await
                .unwrap();
            stalled.push(s);
        }
        // Both answered and lingering: the cap is reached with nobody waiting for a head.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let t = Instant::now();
        let reply = exchange(addr, ECHO, Duration::from_secs(5)).await;
        assert!(reply.ends_with("hello"), "{reply}");
        assert!(
            t.elapsed() < LINGER / 2,
            "a new client waited {:?}, the linger is {LINGER:?}",
            t.elapsed()
        );
        for mut s in stalled {
            let mut answer = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut answer)).await;
            let answer = String::from_utf8_lossy(&answer);
            assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
        }
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
