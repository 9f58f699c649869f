//! Slowloris against the accept loop, on loopback: connections that send their request heads a
//! byte a second must neither lock new clients out nor make the server hold more connections
//! than its cap.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use rlhost_serve::{ServeLimits, raise_open_file_limit, serve};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

/// A server of `GET /hello` on a free loopback port under `limits`; it stops when the sender
/// is dropped.
async fn start(limits: ServeLimits) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let router = Router::new().route("/hello", get(|| async { "hello" }));
    tokio::spawn(serve(listener, router, limits, async {
        let _ = rx.await;
    }));
    (addr, tx)
}

/// Enough open files for `n` client sockets in this process besides the server's.
fn room_for(n: u64) {
    let wanted = n + 512 + 256;
    let got = raise_open_file_limit(wanted).unwrap();
    assert!(
        got >= wanted,
        "this test needs {wanted} open files; the hard limit is {got} (ulimit -Hn)"
    );
}

/// The head a slowloris client sends, a byte at a time; it never ends.
const SLOW_HEAD: &[u8] = b"GET /hello HTTP/1.1\r\nhost: x\r\nx-slow: ";

/// One slowloris client until `stop` is set (or 30 s passed): connects, sends one byte of a
/// request head a second, and connects again whenever the server closed it. Counts its first
/// connection in `connected`; returns how many times it connected.
async fn slowloris(addr: SocketAddr, stop: Arc<AtomicBool>, connected: Arc<AtomicUsize>) -> usize {
    let until = Instant::now() + Duration::from_secs(30);
    let mut connects = 0;
    let mut stream: Option<TcpStream> = None;
    let mut sent = 0;
    while !stop.load(Ordering::Relaxed) && Instant::now() < until {
        let Some(s) = stream.as_mut() else {
            match tokio::time::timeout(Duration::from_secs(1), TcpStream::connect(addr)).await {
                Ok(Ok(s)) => {
                    stream = Some(s);
                    sent = 0;
                    connects += 1;
                    if connects == 1 {
                        connected.fetch_add(1, Ordering::Relaxed);
                    }
                }
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
            continue;
        };
        let byte = SLOW_HEAD.get(sent).copied().unwrap_or(b'a');
        if s.write_all(&[byte]).await.is_err() {
            stream = None;
            continue;
        }
        sent += 1;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    connects
}

/// The time a `GET /hello` takes to be connected (up to 15 s) and answered in full, the
/// connection closed by the server after it (up to 15 s more).
async fn time_a_request(addr: SocketAddr) -> Duration {
    let t = Instant::now();
    let mut s = tokio::time::timeout(Duration::from_secs(15), TcpStream::connect(addr))
        .await
        .expect("connected within 15 s")
        .unwrap();
    s.write_all(b"GET /hello HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(15), s.read_to_end(&mut answer))
        .await
        .expect("answered within 15 s")
        .expect("answered, not reset");
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.ends_with("hello"),
        "{answer}"
    );
    t.elapsed()
}

/// Issue 36: 1,000 connections sending headers a byte a second (reconnecting when closed), with
/// the default limits (512 connections, a 10 s header deadline): a new request is still answered
/// within a second, more than once during the attack.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_slowloris_connections_do_not_delay_a_request() {
    const ATTACKERS: usize = 1000;
    room_for(ATTACKERS as u64 + 16);
    let (addr, _stop) = start(ServeLimits::default()).await;
    assert!(time_a_request(addr).await < Duration::from_secs(1));
    let stop = Arc::new(AtomicBool::new(false));
    let connected = Arc::new(AtomicUsize::new(0));
    let attack: Vec<_> = (0..ATTACKERS)
        .map(|_| tokio::spawn(slowloris(addr, stop.clone(), connected.clone())))
        .collect();
    let t = Instant::now();
    while connected.load(Ordering::Relaxed) < ATTACKERS && t.elapsed() < Duration::from_secs(2) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let in_place = connected.load(Ordering::Relaxed);
    eprintln!(
        "{in_place} slowloris clients connected in {:?}",
        t.elapsed()
    );
    // The attackers trickle their heads; ask twice while they do.
    let mut delays = Vec::new();
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        delays.push(time_a_request(addr).await);
    }
    eprintln!("a request under {ATTACKERS} slowloris connections took {delays:?}");
    stop.store(true, Ordering::Relaxed);
    let mut connects = 0;
    for a in attack {
        connects += a.await.unwrap();
    }
    eprintln!("the slowloris clients connected {connects} times in all");
    for d in &delays {
        assert!(*d < Duration::from_secs(1), "delayed {delays:?}");
    }
    // The attack was real: every client connected at once (a full accept queue would have
    // dropped their SYNs), and the server had to close some to make room.
    assert_eq!(in_place, ATTACKERS);
    assert!(
        connects > ATTACKERS,
        "no slowloris connection was ever closed"
    );
}

/// However many connections arrive, the server keeps at most `--max-connections` of them open:
/// of 300 slow heads over a cap of 64, exactly 236 are closed (the ones that waited longest),
/// before any deadline, and a new client is still served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_holds_at_most_the_cap_of_connections() {
    const CAP: usize = 64;
    const CLIENTS: usize = 300;
    room_for(CLIENTS as u64 + 16);
    let limits = ServeLimits {
        max_connections: CAP,
        ..Default::default()
    };
    let (addr, _stop) = start(limits).await;
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /hello HTTP/1.1\r\n").await.unwrap();
        clients.push(s);
    }
    // The accept queue drains within a moment (the header deadline is 10 s away).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let checks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(i, mut s)| {
            tokio::spawn(async move {
                let mut buf = [0u8; 64];
                let closed = matches!(
                    tokio::time::timeout(Duration::from_millis(500), s.read(&mut buf)).await,
                    Ok(Ok(0) | Err(_))
                );
                (i, closed, s)
            })
        })
        .collect();
    let mut open = Vec::new();
    let mut closed = 0;
    for c in checks {
        let (i, was_closed, s) = c.await.unwrap();
        if was_closed {
            closed += 1;
        } else {
            open.push((i, s));
        }
    }
    assert_eq!(closed, CLIENTS - CAP, "open: {}", open.len());
    // The oldest were closed; the newest are kept.
    assert!(
        open.iter().all(|(i, _)| *i >= CLIENTS - CAP - 8),
        "{:?}",
        open.iter().map(|(i, _)| i).collect::<Vec<_>>()
    );
    assert!(time_a_request(addr).await < Duration::from_secs(1));
}
