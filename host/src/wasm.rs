//! wasmtime pieces shared by the plugin runtime and the Python sandbox: the epoch ticker, the
//! on-disk cache of compiled components, the memory cap, frozen clocks and seeded randomness.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

/// How often the epoch advances. A guest whose store yields on each epoch gives the async
/// runtime a chance to run (and to enforce deadlines) this often.
pub const EPOCH_TICK: Duration = Duration::from_millis(5);

/// Advances an engine's epoch every [`EPOCH_TICK`] of wall-clock time until dropped. It counts
/// ticks from its start time, so when the thread is descheduled (a busy machine) it catches up
/// on the ticks it missed instead of letting deadlines drift.
pub struct EpochTicker {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl EpochTicker {
    /// Starts the ticker thread for `engine`.
    pub fn start(engine: Engine) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("rlhost-epoch".into())
            .spawn(move || {
                let started = Instant::now();
                let mut done: u128 = 0;
                while !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(EPOCH_TICK);
                    let due = started.elapsed().as_nanos() / EPOCH_TICK.as_nanos();
                    while done < due {
                        engine.increment_epoch();
                        done += 1;
                    }
                }
            })?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Caps linear memory and remembers having refused, so an out-of-memory crash can be told
/// apart from other traps (and a guest that handles the refusal itself, like Python raising
/// `MemoryError`, keeps running).
pub struct MemoryCap {
    max_bytes: usize,
    refused: bool,
}

impl MemoryCap {
    /// A cap of `max_bytes` of linear memory.
    pub fn new(max_bytes: usize) -> Self {
        Self {
            max_bytes,
            refused: false,
        }
    }

    /// Whether a growth was refused.
    pub fn refused(&self) -> bool {
        self.refused
    }
}

impl wasmtime::ResourceLimiter for MemoryCap {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let ok = desired <= self.max_bytes;
        self.refused |= !ok;
        Ok(ok)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 1 << 20)
    }
}

/// Frozen clocks: guests get no time beyond what the host gives them.
pub struct FrozenClock;

impl wasmtime_wasi::HostWallClock for FrozenClock {
    fn resolution(&self) -> Duration {
        Duration::from_secs(1)
    }
    fn now(&self) -> Duration {
        Duration::ZERO
    }
}

impl wasmtime_wasi::HostMonotonicClock for FrozenClock {
    fn resolution(&self) -> u64 {
        1_000_000_000
    }
    fn now(&self) -> u64 {
        0
    }
}

/// Deterministic bytes from a seed (SplitMix64), for WASI randomness.
pub fn seeded_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Compiles a component, or loads it from `cache_dir/components/`, keyed by its content hash,
/// the engine's compatibility hash and the wasmtime version. A corrupt entry is recompiled.
pub fn compile_cached(
    engine: &Engine,
    bytes: &[u8],
    cache_dir: Option<&Path>,
) -> wasmtime::Result<Component> {
    let Some(dir) = cache_dir else {
        return Component::new(engine, bytes);
    };
    let path = dir.join("components").join(cache_key(engine, bytes));
    if path.is_file() {
        // SAFETY: the file was written by `precompile_component` of an engine with the same
        // compatibility hash (part of the key), in a cache only rlhost writes.
        match unsafe { Component::deserialize_file(engine, &path) } {
            Ok(c) => return Ok(c),
            Err(e) => tracing::warn!("ignoring unusable cache entry {}: {e:#}", path.display()),
        }
    }
    let compiled = engine.precompile_component(bytes)?;
    if let Err(e) = rlhost_fs::write_atomically(&path, &compiled) {
        tracing::warn!("cannot cache compiled component at {}: {e}", path.display());
    }
    // SAFETY: the bytes were produced just now by this engine.
    unsafe { Component::deserialize(engine, &compiled) }
}

fn cache_key(engine: &Engine, bytes: &[u8]) -> String {
    use std::hash::{Hash, Hasher};
    let mut engine_hash = std::collections::hash_map::DefaultHasher::new();
    engine
        .precompile_compatibility_hash()
        .hash(&mut engine_hash);
    let digest = Sha256::digest(bytes);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{hex}-{:016x}-wasmtime{}.cwasm",
        engine_hash.finish(),
        env!("RLHOST_BUILD_WASMTIME_VERSION")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_bytes_are_deterministic_and_seed_dependent() {
        assert_eq!(seeded_bytes(1, 64), seeded_bytes(1, 64));
        assert_ne!(seeded_bytes(1, 64), seeded_bytes(2, 64));
        assert_eq!(seeded_bytes(3, 13).len(), 13);
    }

    #[test]
    fn ticker_interrupts_a_spinning_guest() {
        // (module (func (export "spin") (loop (br 0))))
        const SPIN: &[u8] = &[
            0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, // magic, version
            0x01, 0x04, 0x01, 0x60, 0x00, 0x00, // type: [] -> []
            0x03, 0x02, 0x01, 0x00, // func 0: type 0
            0x07, 0x08, 0x01, 0x04, b's', b'p', b'i', b'n', 0x00, 0x00, // export "spin"
            0x0a, 0x09, 0x01, 0x07, 0x00, 0x03, 0x40, 0x0c, 0x00, 0x0b, 0x0b, // loop br 0
        ];
        let engine = Engine::new(wasmtime::Config::new().epoch_interruption(true)).unwrap();
        let _ticker = EpochTicker::start(engine.clone()).unwrap();
        let module = wasmtime::Module::new(&engine, SPIN).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut store = wasmtime::Store::new(&engine, ());
            store.set_epoch_deadline(4);
            store.epoch_deadline_trap();
            let instance = wasmtime::Instance::new(&mut store, &module, &[]).unwrap();
            let spin = instance
                .get_typed_func::<(), ()>(&mut store, "spin")
                .unwrap();
            let _ = tx.send(spin.call(&mut store, ()));
        });
        let result = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the ticker never interrupted the guest");
        let err = result.unwrap_err();
        assert_eq!(
            err.downcast_ref::<wasmtime::Trap>(),
            Some(&wasmtime::Trap::Interrupt)
        );
    }
}
