//! The process heap: giving memory that was freed back to the system. glibc's allocator keeps
//! freed memory in its arenas (one per thread that allocated, up to eight per core) and returns
//! only what lies at the top of each: a request that builds large transients (a prompt rendered
//! from 12,000 tool schemas, its tokens) leaves the server's resident size where they took it,
//! and the next such request on another thread's arena takes it higher (a tiny-model server:
//! 177 MB, then 505, 580, 601 MB after three such requests; `malloc_trim(0)` afterwards: 246 MB).
//! `host bench` also trims before it measures a resident size.

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
