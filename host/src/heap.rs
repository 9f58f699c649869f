//! The process heap: giving memory that was freed back to the system. glibc's allocator keeps
//! freed memory in its arenas (one per thread that allocated, up to eight per core) and returns
//! only what lies at the top of each: a request that builds large transients (a prompt rendered
//! from 12,000 tool schemas, its tokens) leaves the server's resident size where they took it,
//! and the next such request on another thread's arena takes it higher (a tiny-model server:
//! 177 MB, then 505, 580, 601 MB after three such requests; `malloc_trim(0)` afterwards: 246 MB).
//! `host bench` also trims before it measures a resident size.
//!
//! `malloc_trim` alone is not enough: it releases the free pages inside every arena but the top
//! of the main arena only, and another thread's arena gives its top back only on a `free` that
//! leaves it larger than the trim threshold, which glibc raises to twice the largest mmapped
//! block freed so far (up to 64 MiB: a 2.4 MB request body is such a block). After nine
//! requests with 12,000 tools, a tiny-model server that held 182 MB after one small request
//! held 229-277 MB with the trim alone (its two worker threads' arenas); with every thread on
//! the main arena ([`one_arena`]) 178-180 MB. Fixing the thresholds instead (which glibc's own
//! variables can do) maps every large tensor afresh on each step.

/// Puts every thread's allocations in glibc's main arena (`M_ARENA_MAX` = 1), whose top
/// [`release_free_memory`] gives back whole: for a long-running server, where memory a request
/// freed must not stay resident (module docs). Small blocks still come from each thread's own
/// cache without a lock; larger ones take the arena's lock, which the engine's thread, holding
/// most of them, rarely shares. Call before the server's threads start (a thread keeps the
/// arena it has). Where the user set `MALLOC_ARENA_MAX` (or `GLIBC_TUNABLES` naming
/// `glibc.malloc.arena_max`) it is left as set. Elsewhere than glibc, a no-op.
pub fn one_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let user_set = std::env::var_os("MALLOC_ARENA_MAX").is_some()
            || std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("arena_max"));
        if user_set {
            tracing::debug!("glibc's arena count left as the environment sets it");
            return;
        }
        const M_ARENA_MAX: std::ffi::c_int = -8;
        unsafe extern "C" {
            fn mallopt(param: std::ffi::c_int, value: std::ffi::c_int) -> std::ffi::c_int;
        }
        // SAFETY: mallopt sets one of glibc's allocator parameters under its lock; it returns 0
        // for a value it refuses (1 is in range).
        if unsafe { mallopt(M_ARENA_MAX, 1) } == 0 {
            tracing::warn!("glibc refused one malloc arena: freed memory may stay resident");
        }
    }
}

/// Bytes of request body from which a served request is followed by [`release_soon`]: small
/// requests leave little behind, and a trim walks the heap (milliseconds per GB), so only
/// requests that can build transients of many megabytes pay for it.
pub const RELEASE_AFTER_BODY_BYTES: u64 = 256 * 1024;

/// How long after a large request's answer [`release_soon`] trims: the request's own buffers
/// (its body, its parsed JSON, the rendered prompt) are dropped as its task ends, just after the
/// answer is handed back, and a trim before that finds them still live.
const RELEASE_DELAY: std::time::Duration = std::time::Duration::from_millis(200);

/// [`release_free_memory`] [`RELEASE_DELAY`] from now, on a blocking thread (needs a tokio
/// runtime).
pub fn release_soon() {
    tokio::spawn(async {
        tokio::time::sleep(RELEASE_DELAY).await;
        let _ = tokio::task::spawn_blocking(release_free_memory).await;
    });
}

/// Returns the heap's free memory to the system (glibc's `malloc_trim(0)`, which since 2.8
/// releases free pages inside every arena, not only at their tops). Elsewhere a no-op.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        unsafe extern "C" {
            fn malloc_trim(pad: usize) -> std::ffi::c_int;
        }
        // SAFETY: glibc's malloc_trim only releases free memory; it takes the arenas' locks.
        unsafe { malloc_trim(0) };
    }
}
