//! Issue 36: slowloris against both HTTP servers (`host inference`, `host registry serve`) with
//! their default limits (512 connections, a 10 s header deadline). 1,000 connections sending
//! request heads a byte a second, reconnecting whenever the server closes them, must not delay
//! a normal request by a second, and the server must not hold more client sockets than its cap.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::common;

/// Slowloris clients.
const ATTACKERS: usize = 1000;
/// The servers' default `--max-connections`.
const CAP: usize = 512;

/// 1,000 slowloris clients on one thread: each connects, sends one byte of a request head that
/// never ends a second, and connects again when the server closed it; until dropped.
struct Slowloris {
    stop: Arc<AtomicBool>,
    /// Clients connected at least once.
    connected: Arc<AtomicUsize>,
    /// Connections made in all.
    connects: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Slowloris {
    /// Starts the attack on `addr` (`HOST:PORT`) and waits (up to 5 s) until every client has
    /// connected.
    fn start(addr: &str, head: &'static [u8]) -> Self {
        let addr: std::net::SocketAddr = addr.parse().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let connected = Arc::new(AtomicUsize::new(0));
        let connects = Arc::new(AtomicUsize::new(0));
        let (s, c, n) = (stop.clone(), connected.clone(), connects.clone());
        let thread = std::thread::spawn(move || {
            let connect = || {
                let s = TcpStream::connect_timeout(&addr, Duration::from_millis(250)).ok()?;
                s.set_write_timeout(Some(Duration::from_millis(100))).ok()?;
                n.fetch_add(1, Ordering::Relaxed);
                Some(s)
            };
            let mut clients: Vec<(Option<TcpStream>, usize)> = Vec::new();
            for _ in 0..ATTACKERS {
                clients.push((connect(), 0));
            }
            c.store(
                clients.iter().filter(|(s, _)| s.is_some()).count(),
                Ordering::Relaxed,
            );
            // Bounded: the test stops it within seconds; 60 rounds at the most.
            for _ in 0..60 {
                let round = Instant::now();
                for (stream, sent) in clients.iter_mut() {
                    if s.load(Ordering::Relaxed) {
                        return;
                    }
                    let Some(conn) = stream.as_mut() else {
                        (*stream, *sent) = (connect(), 0);
                        continue;
                    };
                    let byte = head.get(*sent).copied().unwrap_or(b'a');
                    if conn.write_all(&[byte]).is_ok() {
                        *sent += 1;
                    } else {
                        (*stream, *sent) = (connect(), 0);
                    }
                }
                while round.elapsed() < Duration::from_secs(1) {
                    if s.load(Ordering::Relaxed) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        });
        let t = Instant::now();
        while connected.load(Ordering::Relaxed) == 0 && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        Self {
            stop,
            connected,
            connects,
            thread: Some(thread),
        }
    }

    /// Stops the attack; returns how many connections it made in all.
    fn stop(mut self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        self.connects.load(Ordering::Relaxed)
    }
}

impl Drop for Slowloris {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Open file descriptors of process `pid` (its sockets among them).
fn open_files(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// Sends `request` (which asks the server to close after answering) to `addr` and reads the
/// whole answer; the answer and how long connecting and answering took (each bounded at 15 s).
fn timed(addr: &str, request: &str) -> (String, Duration) {
    let t = Instant::now();
    let addr: std::net::SocketAddr = addr.parse().unwrap();
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(15)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).unwrap();
    (String::from_utf8_lossy(&answer).into_owned(), t.elapsed())
}

/// Runs the attack on the server process `pid` at `addr` and checks, twice during it, that
/// `request` is answered (`200`) within a second and that the server holds at most the cap of
/// client sockets.
fn survives_slowloris(pid: u32, addr: &str, request: &str, slow_head: &'static [u8]) {
    // This process opens the 1,000 client sockets.
    let wanted = ATTACKERS as u64 + 1024;
    let files = rlhost_serve::raise_open_file_limit(wanted).unwrap();
    assert!(
        files >= wanted,
        "needs {wanted} open files; ulimit -Hn is {files}"
    );
    let (answer, before) = timed(addr, request);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let idle_files = open_files(pid);
    let attack = Slowloris::start(addr, slow_head);
    let connected = attack.connected.load(Ordering::Relaxed);
    let mut delays = Vec::new();
    let mut most_files = 0;
    for _ in 0..2 {
        std::thread::sleep(Duration::from_millis(1500));
        most_files = most_files.max(open_files(pid));
        let (answer, took) = timed(addr, request);
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        delays.push(took);
    }
    let connects = attack.stop();
    eprintln!(
        "{addr}: unloaded {before:?}; under {ATTACKERS} slowloris connections {delays:?}; \
         server files {idle_files} idle, {most_files} under attack; {connects} attack connections"
    );
    assert_eq!(connected, ATTACKERS, "the attack did not connect in full");
    for d in &delays {
        assert!(*d < Duration::from_secs(1), "delayed {delays:?}");
    }
    // The cap held: at most 512 client sockets (and the one just accepted) beyond the idle set.
    assert!(
        most_files <= idle_files + CAP + 1,
        "{most_files} open files, {idle_files} idle"
    );
    // The attack really filled the cap: the server closed connections to make room.
    assert!(
        connects > ATTACKERS,
        "the server never closed a slow connection"
    );
}

#[test]
fn slowloris_does_not_delay_the_inference_server() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny");
    common::tiny_model(&model, 0);
    let server = common::InferenceServer::start(&model, &[]);
    survives_slowloris(
        server.child.id(),
        common::addr_of(&server.url),
        "GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-slow: ",
    );
}

#[test]
fn slowloris_does_not_delay_the_registry_server() {
    let dir = tempfile::tempdir().unwrap();
    let (root, home) = (dir.path().join("registry"), dir.path().join("home"));
    common::run_ok(
        common::host(&home)
            .args(["registry", "init", "--root"])
            .arg(&root),
    );
    let child = common::host(&home)
        .args(["registry", "serve", "--addr", "127.0.0.1:0", "--root"])
        .arg(&root)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .unwrap();
    let mut server = Killed(child);
    let line = common::first_line(&mut server.0);
    let url = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    survives_slowloris(
        server.0.id(),
        common::addr_of(&url),
        "GET /config.json HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        b"GET /config.json HTTP/1.1\r\nhost: x\r\nx-slow: ",
    );
}

/// A child process killed when dropped.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
