//! CPython in WebAssembly: one engine, the component compiled once (cached as `.cwasm`), and per
//! call a fresh store instantiated from its pre-initialised snapshot. Calls run on a bounded pool
//! of worker threads, each driving its calls on its own single-threaded tokio runtime; a call's
//! deadline starts when a worker picks it up, so a burst of calls queues instead of missing
//! deadlines.
//!
//! The deadline must cover everything a call can do, never only the wasm that is running: the
//! guest runs on wasmtime's async support, so a blocking WASI call (`time.sleep`, `select`, any
//! poll on a clock) suspends it instead of blocking the worker, and the whole call sits under a
//! `tokio::time::timeout` that, when it fires, drops (and so cancels) whatever the guest was
//! waiting for. Epoch interruption still traps CPU-bound code, which never reaches such a wait.
//! A wait the guest cannot even begin because nothing could ever end it (see [`waits_forever`]:
//! a lock no other thread can release, a poll on nothing) is what a real interpreter would block
//! in until killed, so the call waits out its deadline and times out the same way.

use std::path::Path;
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use async_trait::async_trait;
use rlhost_sdk::types::{PythonLimits, PythonOutput};
use wasmtime::component::{Linker, ResourceTable};
use wasmtime::{Config, Engine, Store, Trap};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use super::capture::{CapturePipe, OutputFlood};
use super::{Sandbox, SandboxError, SandboxPolicy, timeout_message};
use crate::wasm::{EPOCH_TICK, EpochTicker, MemoryCap};

mod bindings {
    wasmtime::component::bindgen!({
        world: "sandbox",
        path: "../sandbox/python/wit",
        exports: { default: async },
    });
}

/// Stack of each worker thread (the tokio runtime and wasmtime's host side of a call).
const WORKER_STACK: usize = 32 << 20;
/// The guest's stack, capped below the fiber it runs on (wasm plus the WASI host calls it
/// makes), so a runaway recursion traps cleanly instead of overflowing the fiber.
const MAX_WASM_STACK: usize = 4 << 20;
const FIBER_STACK: usize = MAX_WASM_STACK + (2 << 20);
/// Exit code reported for a call stopped by its deadline (as `timeout(1)` does).
const EXIT_TIMEOUT: i32 = 124;

struct SandboxState {
    wasi: WasiCtx,
    table: ResourceTable,
    limiter: MemoryCap,
}

impl WasiView for SandboxState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

type Job = Box<dyn FnOnce(&tokio::runtime::Runtime) + Send>;

/// A fixed set of threads with big stacks running sandbox calls in arrival order, each on its
/// own current-thread tokio runtime (a call's guest is CPU-bound between its waits, so it must
/// not run on the caller's runtime).
struct WorkerPool {
    queue: Option<mpsc::Sender<Job>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl WorkerPool {
    fn new(workers: usize) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let mut threads = Vec::new();
        for i in 0..workers.max(1) {
            let rx = rx.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("rlhost-python-{i}"))
                    .stack_size(WORKER_STACK)
                    .spawn(move || {
                        let runtime = match tokio::runtime::Builder::new_current_thread()
                            .enable_all()
                            .build()
                        {
                            Ok(rt) => rt,
                            // Jobs queued here are dropped, which their callers read as a
                            // dead worker.
                            Err(_) => return,
                        };
                        loop {
                            let job = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                            match job {
                                Ok(job) => job(&runtime),
                                Err(_) => break,
                            }
                        }
                    })?,
            );
        }
        Ok(Self {
            queue: Some(tx),
            threads,
        })
    }

    async fn run<R: Send + 'static>(
        &self,
        f: impl FnOnce(&tokio::runtime::Runtime) -> R + Send + 'static,
    ) -> Result<R, SandboxError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move |runtime| {
            let _ = tx.send(f(runtime));
        });
        self.queue
            .as_ref()
            .and_then(|q| q.send(job).ok())
            .ok_or_else(|| SandboxError::Failed("the worker pool is shut down".into()))?;
        rx.await
            .map_err(|_| SandboxError::Failed("a sandbox worker died".into()))
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        self.queue.take();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

struct Shared {
    engine: Engine,
    pre: bindings::SandboxPre<SandboxState>,
    policy: SandboxPolicy,
}

/// CPython in WebAssembly behind the [`Sandbox`] trait.
#[derive(Clone)]
pub struct WasmSandbox {
    shared: Arc<Shared>,
    pool: Arc<WorkerPool>,
    _ticker: Arc<EpochTicker>,
}

/// A live interpreter with its output captures.
struct Live {
    store: Store<SandboxState>,
    python: bindings::Sandbox,
    stdout: CapturePipe,
    stderr: CapturePipe,
}

impl WasmSandbox {
    /// Loads the sandbox component (built by `make sandbox`); the compiled form is cached in
    /// `cache_dir` (the first compile of the ~100 MB component takes a while).
    pub fn load(
        component: &Path,
        cache_dir: Option<&Path>,
        policy: SandboxPolicy,
    ) -> Result<Self, SandboxError> {
        let setup =
            |what: &str, e: &dyn std::fmt::Display| SandboxError::Setup(format!("{what}: {e}"));
        let bytes = rlhost_fs::read(component, super::COMPONENT_LIMIT)
            .map_err(|e| SandboxError::Setup(format!("{e} (build it with `make sandbox`)")))?;
        let mut config = Config::new();
        config
            .epoch_interruption(true)
            .max_wasm_stack(MAX_WASM_STACK)
            .async_stack_size(FIBER_STACK);
        let engine = Engine::new(&config).map_err(|e| setup("engine", &e))?;
        let compiled = crate::wasm::compile_cached(&engine, &bytes, cache_dir)
            .map_err(|e| setup(&format!("cannot compile {}", component.display()), &e))?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(|e| setup("WASI", &e))?;
        let pre = linker
            .instantiate_pre(&compiled)
            .and_then(bindings::SandboxPre::new)
            .map_err(|e| {
                setup(
                    &format!("{} is not the rlhost Python sandbox", component.display()),
                    &e,
                )
            })?;
        let ticker = EpochTicker::start(engine.clone()).map_err(|e| setup("epoch thread", &e))?;
        let pool = WorkerPool::new(policy.workers).map_err(|e| setup("worker threads", &e))?;
        Ok(Self {
            shared: Arc::new(Shared {
                engine,
                pre,
                policy,
            }),
            pool: Arc::new(pool),
            _ticker: Arc::new(ticker),
        })
    }

    /// The policy in force.
    pub fn policy(&self) -> &SandboxPolicy {
        &self.shared.policy
    }

    /// Runs `code` in a fresh interpreter.
    pub async fn run(
        &self,
        code: &str,
        limits: PythonLimits,
    ) -> Result<PythonOutput, SandboxError> {
        let shared = self.shared.clone();
        let code = code.to_owned();
        let limits = shared.policy.clamp(limits);
        self.pool
            .run(move |runtime| {
                let (output, _) = runtime.block_on(shared.call(None, &code, limits));
                output
            })
            .await
    }

    /// A persistent interpreter for one rollout (REPL mode).
    pub fn repl(&self) -> PythonRepl {
        PythonRepl {
            sandbox: self.clone(),
            live: None,
        }
    }
}

impl Shared {
    async fn instantiate(&self, limits: PythonLimits) -> Result<Live, wasmtime::Error> {
        let stdout = CapturePipe::new(limits.max_output_bytes as usize);
        let stderr = CapturePipe::new(limits.max_output_bytes as usize);
        let wasi = WasiCtxBuilder::new()
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        let state = SandboxState {
            wasi,
            table: ResourceTable::new(),
            limiter: MemoryCap::new((limits.memory_mib as usize) << 20),
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limiter);
        arm_deadline(&mut store, limits.timeout_ms);
        let python = self.pre.instantiate_async(&mut store).await?;
        Ok(Live {
            store,
            python,
            stdout,
            stderr,
        })
    }

    /// Runs one call, in `live` if given (REPL) or a fresh interpreter, under its deadline.
    /// Returns the output and the interpreter if it can be used again.
    async fn call(
        &self,
        live: Option<Live>,
        code: &str,
        limits: PythonLimits,
    ) -> (PythonOutput, Option<Live>) {
        let deadline = Duration::from_millis(u64::from(limits.timeout_ms));
        let mut live = match live {
            Some(l) => l,
            None => match tokio::time::timeout(deadline, self.instantiate(limits)).await {
                Ok(Ok(l)) => l,
                Ok(Err(e)) => return (crashed(&e, limits), None),
                Err(_) => return (timed_out(limits), None),
            },
        };
        arm_deadline(&mut live.store, limits.timeout_ms);
        // Dropping the call's future at the deadline cancels the host wait the guest is
        // suspended in (a sleep, a poll); the interpreter is then unusable and is discarded.
        let started = tokio::time::Instant::now();
        let result = match tokio::time::timeout(
            deadline,
            live.python
                .rlhost_sandbox_python()
                .call_run(&mut live.store, code),
        )
        .await
        {
            Ok(Err(e)) if waits_forever(&e) => {
                tokio::time::sleep_until(started + deadline).await;
                None
            }
            result => result.ok(),
        };
        let stdout = live.stdout.take(limits.max_output_bytes as usize);
        let stderr = live.stderr.take(limits.max_output_bytes as usize);
        let (stdout_cut, stderr_cut) = (stdout.truncated, stderr.truncated);
        let flooded = stdout.flooded || stderr.flooded;
        let mut out = PythonOutput {
            stdout: String::from_utf8_lossy(&stdout.bytes).into_owned(),
            stderr: String::from_utf8_lossy(&stderr.bytes).into_owned(),
            exit_code: 0,
            timed_out: false,
        };
        let note = |cut: bool| {
            cut.then(|| {
                format!(
                    "\n[output truncated after {} bytes]",
                    limits.max_output_bytes
                )
            })
        };
        if let Some(n) = note(stdout_cut) {
            out.stdout.push_str(&n);
        }
        if let Some(n) = note(stderr_cut) {
            out.stderr.push_str(&n);
        }
        let result = match result {
            Some(result) => result,
            None => {
                let t = timed_out(limits);
                out.exit_code = t.exit_code;
                out.timed_out = true;
                push_line(&mut out.stderr, &t.stderr);
                return (out, None);
            }
        };
        match result {
            Ok(code) => {
                out.exit_code = code;
                (out, Some(live))
            }
            // Stopped for printing far past the cap: the truncation note says it all.
            Err(_) if flooded => {
                out.exit_code = 1;
                (out, None)
            }
            Err(e) => {
                let (exit_code, timed_out, message) = describe_failure(&e, &live.store, limits);
                out.exit_code = exit_code;
                out.timed_out = timed_out;
                if let Some(message) = message {
                    push_line(&mut out.stderr, &message);
                }
                // `os._exit` leaves a usable instance behind no more than a trap does.
                (out, None)
            }
        }
    }
}

fn arm_deadline(store: &mut Store<SandboxState>, timeout_ms: u32) {
    let ticks = u64::from(timeout_ms).div_ceil(EPOCH_TICK.as_millis() as u64);
    store.set_epoch_deadline(ticks.max(1));
    store.epoch_deadline_trap();
}

/// Whether a call failed because its guest began a wait that nothing can ever end: wasi-libc
/// built without threads traps in `pthread_cond_wait` (no other thread could signal it: CPython's
/// own lock type acquired while held), and wasmtime refuses to poll an empty list of pollables
/// (`select`/`poll` on no descriptors without a timeout). On a real system both block for ever.
fn waits_forever(e: &wasmtime::Error) -> bool {
    if e.root_cause().to_string() == "empty poll list" {
        return true;
    }
    e.downcast_ref::<wasmtime::WasmBacktrace>()
        .and_then(|trace| trace.frames().first())
        .and_then(|frame| frame.func_name())
        == Some("pthread_cond_wait")
}

/// Appends `line` to `text` on a line of its own.
fn push_line(text: &mut String, line: &str) {
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(line);
}

/// What a call that ran out of time returns (besides the output it had made).
fn timed_out(limits: PythonLimits) -> PythonOutput {
    PythonOutput {
        stdout: String::new(),
        stderr: timeout_message(limits.timeout_ms),
        exit_code: EXIT_TIMEOUT,
        timed_out: true,
    }
}

/// Exit code, timed-out flag and the message a model should read for a failed call.
fn describe_failure(
    e: &wasmtime::Error,
    store: &Store<SandboxState>,
    limits: PythonLimits,
) -> (i32, bool, Option<String>) {
    if let Some(exit) = e.downcast_ref::<wasmtime_wasi::I32Exit>() {
        return (exit.0, false, None);
    }
    if e.downcast_ref::<OutputFlood>().is_some() {
        return (1, false, None);
    }
    match e.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => (EXIT_TIMEOUT, true, Some(timeout_message(limits.timeout_ms))),
        Some(Trap::StackOverflow) => (
            1,
            false,
            Some("RecursionError: maximum recursion depth exceeded".into()),
        ),
        _ if store.data().limiter.refused() => (1, false, Some("MemoryError".into())),
        _ => (
            1,
            false,
            Some(format!("Error: the Python interpreter crashed: {e}")),
        ),
    }
}

fn crashed(e: &wasmtime::Error, limits: PythonLimits) -> PythonOutput {
    if e.downcast_ref::<Trap>() == Some(&Trap::Interrupt) {
        return timed_out(limits);
    }
    PythonOutput {
        stdout: String::new(),
        stderr: format!("Error: the Python interpreter could not start: {e}"),
        exit_code: 1,
        timed_out: false,
    }
}

#[async_trait]
impl Sandbox for WasmSandbox {
    async fn run_python(
        &self,
        code: &str,
        limits: PythonLimits,
    ) -> Result<PythonOutput, SandboxError> {
        self.run(code, limits).await
    }
}

/// One rollout's persistent interpreter: variables survive between calls. After a crash
/// (timeout, memory, recursion) the next call starts a fresh interpreter, and the crashing call's
/// output says so.
pub struct PythonRepl {
    sandbox: WasmSandbox,
    live: Option<Live>,
}

/// What a model is told when its REPL state was lost.
pub const REPL_RESET_NOTE: &str =
    "[the Python session was reset: variables from earlier calls are gone]";

impl PythonRepl {
    /// Runs `code` in this rollout's interpreter.
    pub async fn run(
        &mut self,
        code: &str,
        limits: PythonLimits,
    ) -> Result<PythonOutput, SandboxError> {
        let shared = self.sandbox.shared.clone();
        let limits = shared.policy.clamp(limits);
        let live = self.live.take();
        let had_state = live.is_some();
        let code = code.to_owned();
        let (mut output, live) = self
            .sandbox
            .pool
            .run(move |runtime| runtime.block_on(shared.call(live, &code, limits)))
            .await?;
        if live.is_none() && (had_state || output.exit_code != 0) {
            if !output.stderr.is_empty() && !output.stderr.ends_with('\n') {
                output.stderr.push('\n');
            }
            output.stderr.push_str(REPL_RESET_NOTE);
        }
        self.live = live;
        Ok(output)
    }
}
