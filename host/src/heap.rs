//! The process heap: giving memory that was freed back to the system (what `host bench`
//! does before it measures a resident size). glibc's allocator keeps freed memory in its arenas
//! (one per thread that allocated, up to eight per core) and returns only what lies at the top
//! of each. This module must never allocate or free anything itself.

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
