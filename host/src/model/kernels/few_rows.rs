//! `y = x Wᵀ` for few rows of `x` (a decode step: one row per running sequence), on x86 CPUs
//! with AVX2 and FMA, with `W` in f32 or bf16 ([`Weights`]: bf16 weights are widened to f32 in
//! registers, so a bf16 model reads half the bytes and computes the same f32 sums). Such a product streams the weight matrix `W` `[n, k]` from memory
//! with little arithmetic per weight, and libtorch's general kernels reach a fraction of the
//! memory bandwidth there (`host bench products` on a 2-core AMD EPYC at Qwen3-0.6B's shapes,
//! 8 rows: MKL 5.5 GB/s, oneDNN 10.4, this kernel 13.9; one row: 14.0, 19.3, 23.0; see
//! [`crate::model::kernels::SMALL_PRODUCT_ROWS`]).
//! It reads `W` where it lies, once: each block of [`NR`] weight rows is multiplied with every
//! row of `x` while it is in L1 (blocks of [`MR`] rows of `x`, `MR × NR` vector accumulators
//! along `k`), and the columns of `y` are split between libtorch's OpenMP threads. Every output
//! is the same dot product whatever the number of rows or threads: a row's result does not
//! depend on the batch it is in.

use std::ffi::{c_int, c_uint, c_void};

/// Rows of `x` per register block.
pub const MR: usize = 4;
/// Rows of `W` per register block (`MR × NR` accumulators + `NR` weight vectors + one `x`
/// vector = the 16 AVX2 registers).
pub const NR: usize = 3;

/// Whether this CPU runs the kernel (x86-64 with AVX2 and FMA).
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Multiply-adds below which a part is not worth another thread (waking one costs tens of
/// microseconds; this is about as long on one core).
const MIN_WORK: usize = 1 << 20;

/// A pointer to hand to worker threads that write disjoint columns of one output.
#[derive(Clone, Copy)]
pub(super) struct Out(pub(super) *mut f32);
// SAFETY: each worker writes only its own columns (disjoint ranges of `n`), and the caller
// waits for every worker before the output is read.
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

/// OpenMP's entry points in the libgomp libtorch loaded: `GOMP_parallel` (what `#pragma omp
/// parallel` compiles to), `omp_get_thread_num` and `omp_get_num_threads`.
struct Gomp {
    parallel: unsafe extern "C" fn(extern "C" fn(*mut c_void), *mut c_void, c_uint, c_uint),
    thread_num: unsafe extern "C" fn() -> c_int,
    num_threads: unsafe extern "C" fn() -> c_int,
}

/// libtorch's OpenMP threads, when its libgomp is in the process. The kernel's parts run on
/// them rather than on threads of its own: the same threads as every other op of the step, so
/// none waits (or spins, as OpenMP threads do by default) beside another.
fn gomp() -> Option<&'static Gomp> {
    static GOMP: std::sync::OnceLock<Option<Gomp>> = std::sync::OnceLock::new();
    GOMP.get_or_init(|| {
        let this = libloading::os::unix::Library::this();
        // SAFETY: the signatures of libgomp's GOMP_parallel and omp_get_thread_num; the
        // process's own handle stays valid (the functions live as long as libtorch, i.e. the
        // process).
        unsafe {
            let parallel = *this
                .get::<unsafe extern "C" fn(extern "C" fn(*mut c_void), *mut c_void, c_uint, c_uint)>(
                    b"GOMP_parallel\0",
                )
                .ok()?;
            let thread_num = *this
                .get::<unsafe extern "C" fn() -> c_int>(b"omp_get_thread_num\0")
                .ok()?;
            let num_threads = *this
                .get::<unsafe extern "C" fn() -> c_int>(b"omp_get_num_threads\0")
                .ok()?;
            std::mem::forget(this);
            Some(Gomp {
                parallel,
                thread_num,
                num_threads,
            })
        }
    })
    .as_ref()
}

/// What each OpenMP thread of [`on_threads`] runs.
struct Job<'a> {
    run: &'a (dyn Fn(usize) + Sync),
    parts: usize,
    gomp: &'a Gomp,
}

extern "C" fn job_part(data: *mut c_void) {
    // SAFETY: `data` is the `Job` `on_threads` passed, alive until GOMP_parallel returns.
    let job = unsafe { &*(data as *const Job<'_>) };
    // SAFETY: called inside the parallel region GOMP_parallel opened.
    let (t, team) = unsafe { ((job.gomp.thread_num)(), (job.gomp.num_threads)()) };
    // The team may be smaller than asked (nested regions, thread limits): every part still
    // runs, each on one thread.
    let team = team.max(1) as usize;
    let mut part = t.max(0) as usize;
    while part < job.parts {
        (job.run)(part);
        part += team;
    }
}

/// Runs `run(0)`, …, `run(parts - 1)` at once, on libtorch's OpenMP threads (the caller is
/// one), or on scoped threads where libgomp is absent; returns when all are done.
fn on_threads(parts: usize, run: &(dyn Fn(usize) + Sync)) {
    match gomp() {
        Some(g) => {
            let job = Job {
                run,
                parts,
                gomp: g,
            };
            // SAFETY: `job` outlives the call, which returns after every thread ran
            // `job_part`; `run` is Sync, so calling it from several threads is sound.
            unsafe {
                (g.parallel)(
                    job_part,
                    &job as *const Job<'_> as *mut c_void,
                    parts as c_uint,
                    0,
                )
            };
        }
        None => std::thread::scope(|s| {
            for part in 1..parts {
                s.spawn(move || run(part));
            }
            run(0);
        }),
    }
}

/// The weights `W` `[n, k]` of a product, row-major and contiguous, in the dtype they are held
/// in: f32, or bf16 (the raw 16-bit patterns: a bf16 value is the high half of an f32's, so
/// each is widened to f32 exactly in a register and the products and sums run in f32 as for
/// f32 weights: half the bytes read from memory, the same arithmetic).
#[derive(Debug, Clone, Copy)]
pub enum Weights<'a> {
    /// f32 values.
    F32(&'a [f32]),
    /// bf16 values, as their bit patterns.
    Bf16(&'a [u16]),
}

impl Weights<'_> {
    fn len(&self) -> usize {
        match self {
            Weights::F32(w) => w.len(),
            Weights::Bf16(w) => w.len(),
        }
    }
}

/// The f32 value of a bf16 bit pattern (exact: the pattern is an f32's high half).
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// `y[i, j] = Σ_p x[i, p] · w[j, p]` for `x` `[m, k]`, `w` `[n, k]`, `y` `[m, n]`, all
/// row-major and contiguous, on up to `threads` threads.
///
/// # Panics
/// When the slices' lengths are not `m·k`, `n·k` and `m·n`, or [`available`] is false.
pub fn matmul_nt(
    x: &[f32],
    w: &[f32],
    y: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
    threads: usize,
) {
    matmul_nt_weights(x, Weights::F32(w), y, m, k, n, threads);
}

/// [`matmul_nt`] for weights held in f32 or bf16 ([`Weights`]); `x` and `y` are f32. A bf16
/// product reads half the bytes of an f32 one and computes the same sums of the widened values:
/// its result is the f32 product of the bf16 values (in this kernel's summation order), before
/// any rounding of `y` to bf16, which is the caller's.
///
/// # Panics
/// As [`matmul_nt`].
pub fn matmul_nt_weights(
    x: &[f32],
    w: Weights<'_>,
    y: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
    threads: usize,
) {
    assert_eq!(x.len(), m * k, "x is [m, k]");
    assert_eq!(w.len(), n * k, "w is [n, k]");
    assert_eq!(y.len(), m * n, "y is [m, n]");
    assert!(available(), "the few-rows kernel needs AVX2 and FMA");
    if m == 0 || n == 0 {
        return;
    }
    let (parts, per) = split(m, k, n, NR, threads);
    let out = Out(y.as_mut_ptr());
    let run = |part: usize| {
        let (lo, hi) = (part * per, ((part + 1) * per).min(n));
        if lo < hi {
            // SAFETY: lengths checked above; AVX2 and FMA checked by `available`; this part
            // writes columns lo..hi of y only.
            unsafe {
                match w {
                    Weights::F32(w) => {
                        columns::<false>(x.as_ptr(), w.as_ptr().cast(), out, m, k, n, lo, hi)
                    }
                    Weights::Bf16(w) => {
                        columns::<true>(x.as_ptr(), w.as_ptr().cast(), out, m, k, n, lo, hi)
                    }
                }
            }
        }
    };
    run_parts(parts, &run);
}

/// How a product of `m` rows, depth `k` and `n` columns is split between up to `threads`
/// threads: `(parts, columns per part)`, whole blocks of `nr` weight rows per part, at least 8
/// blocks and enough work to pay for waking a thread ([`MIN_WORK`]) each.
pub(super) fn split(m: usize, k: usize, n: usize, nr: usize, threads: usize) -> (usize, usize) {
    let blocks = n.div_ceil(nr);
    let parts = threads
        .min(blocks.div_ceil(8))
        .min((m * n * k).div_ceil(MIN_WORK))
        .max(1);
    (parts, blocks.div_ceil(parts) * nr)
}

/// Runs `run(0)`, …, `run(parts - 1)`: on the calling thread alone when `parts` is 1, else
/// at once on libtorch's OpenMP threads ([`on_threads`]).
pub(super) fn run_parts(parts: usize, run: &(dyn Fn(usize) + Sync)) {
    if parts == 1 {
        run(0);
    } else {
        on_threads(parts, run);
    }
}

/// Columns `lo..hi` of `y`; `w` points at f32 weights, or bf16 ones when `BF16`.
///
/// # Safety
/// `x`, `w`, `y` hold `m·k`, `n·k`, `m·n` values; the CPU has AVX2 and FMA; nothing else
/// writes columns `lo..hi` of `y` meanwhile.
#[allow(clippy::too_many_arguments)]
unsafe fn columns<const BF16: bool>(
    x: *const f32,
    w: *const u8,
    y: Out,
    m: usize,
    k: usize,
    n: usize,
    lo: usize,
    hi: usize,
) {
    let mut j = lo;
    while j < hi {
        let nr = (hi - j).min(NR);
        let mut i = 0;
        while i < m {
            let mr = (m - i).min(MR);
            // SAFETY: rows i..i+mr of x and j..j+nr of w exist; the caller's contract.
            unsafe {
                let size = if BF16 { 2 } else { 4 };
                let (xp, wp, yp) = (x.add(i * k), w.add(j * k * size), y.0.add(i * n + j));
                match (mr, nr) {
                    (4, 3) => block::<BF16, 4, 3>(xp, wp, yp, k, n),
                    (4, 2) => block::<BF16, 4, 2>(xp, wp, yp, k, n),
                    (4, 1) => block::<BF16, 4, 1>(xp, wp, yp, k, n),
                    (3, 3) => block::<BF16, 3, 3>(xp, wp, yp, k, n),
                    (3, 2) => block::<BF16, 3, 2>(xp, wp, yp, k, n),
                    (3, 1) => block::<BF16, 3, 1>(xp, wp, yp, k, n),
                    (2, 3) => block::<BF16, 2, 3>(xp, wp, yp, k, n),
                    (2, 2) => block::<BF16, 2, 2>(xp, wp, yp, k, n),
                    (2, 1) => block::<BF16, 2, 1>(xp, wp, yp, k, n),
                    (1, 3) => block::<BF16, 1, 3>(xp, wp, yp, k, n),
                    (1, 2) => block::<BF16, 1, 2>(xp, wp, yp, k, n),
                    _ => block::<BF16, 1, 1>(xp, wp, yp, k, n),
                }
            }
            i += mr;
        }
        j += nr;
    }
}

/// `y[a, b] = x[a, ..k] · w[b, ..k]` for `a < M`, `b < N`; `x`, `w` rows `k` values apart,
/// `y` rows `ldy` apart; `w` holds f32 values, or bf16 ones (widened to f32 as they are loaded)
/// when `BF16`.
///
/// # Safety
/// As [`columns`], for these rows.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn block<const BF16: bool, const M: usize, const N: usize>(
    x: *const f32,
    w: *const u8,
    y: *mut f32,
    k: usize,
    ldy: usize,
) {
    use std::arch::x86_64::*;
    let (wf, wh) = (w.cast::<f32>(), w.cast::<u16>());
    // Weight `t` of row `b`, as f32.
    let weight = |b: usize, t: usize| -> f32 {
        if BF16 {
            bf16_to_f32(unsafe { *wh.add(b * k + t) })
        } else {
            unsafe { *wf.add(b * k + t) }
        }
    };
    let mut acc = [[_mm256_setzero_ps(); N]; M];
    let mut p = 0;
    // Eight bf16 weights of row `b` from `t` on, widened: the high halves of eight f32 lanes.
    let widened = |b: usize, t: usize| {
        let h = unsafe { _mm_loadu_si128(wh.add(b * k + t).cast()) };
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
    };
    // SAFETY (loads): p + 8 ≤ k within rows of k values.
    while p + 8 <= k {
        // Once per cache line, the next block's rows at this position: a block's end is then
        // in cache, not a new stream for the hardware prefetcher to find (`host bench
        // products`, 2-core AMD EPYC, 8 rows of Qwen3-0.6B's layers: 129-139 ms against
        // 158-161 in f32, 124-133 against 143-151 in bf16; one row unchanged). A prefetch
        // past the weights' end is a hint that never faults.
        let size = if BF16 { 2 } else { 4 };
        if (p * size).is_multiple_of(64) {
            for b in 0..N {
                let ahead = w.wrapping_add(((N + b) * k + p) * size);
                _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
            }
        }
        let mut wv = [_mm256_setzero_ps(); N];
        for (b, v) in wv.iter_mut().enumerate() {
            *v = if BF16 {
                widened(b, p)
            } else {
                unsafe { _mm256_loadu_ps(wf.add(b * k + p)) }
            };
        }
        for (a, row) in acc.iter_mut().enumerate() {
            let xv = unsafe { _mm256_loadu_ps(x.add(a * k + p)) };
            for (b, s) in row.iter_mut().enumerate() {
                *s = _mm256_fmadd_ps(xv, wv[b], *s);
            }
        }
        p += 8;
    }
    for (a, row) in acc.iter().enumerate() {
        for (b, s) in row.iter().enumerate() {
            // Sum of the eight lanes, then the k % 8 tail.
            let mut total = hsum(*s);
            for t in p..k {
                total += unsafe { *x.add(a * k + t) } * weight(b, t);
            }
            unsafe { *y.add(a * ldy + b) = total };
        }
    }
}

/// The sum of eight lanes, as a fixed tree (halves, then pairs): the same bits whatever calls it.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) fn hsum(s: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    let hi = _mm256_extractf128_ps(s, 1);
    let q = _mm_add_ps(_mm256_castps256_ps128(s), hi);
    let q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    let q = _mm_add_ss(q, _mm_shuffle_ps(q, q, 1));
    _mm_cvtss_f32(q)
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn block<const BF16: bool, const M: usize, const N: usize>(
    _x: *const f32,
    _w: *const u8,
    _y: *mut f32,
    _k: usize,
    _ldy: usize,
) {
    unreachable!("`available` is false off x86-64")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Equals a plain f64 dot product for every edge of the register blocks (rows of `x` and
    /// `w` not multiples of 4 and 3, `k` not a multiple of 8), on one thread and split between
    /// two, and gives a row the same values whatever rows it comes with: f32 weights, and bf16
    /// ones (against the product of the bf16 values).
    #[test]
    fn equals_the_plain_product_at_every_block_edge() {
        if !available() {
            crate::testing::skip(
                "few_rows::equals_the_plain_product_at_every_block_edge",
                "this CPU lacks AVX2 or FMA: the few-rows kernel does not run here",
            );
            return;
        }
        let mut seed = 7u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        };
        for (m, k, n) in [
            (1, 8, 1),
            (5, 13, 7),
            (8, 1024, 96),
            (33, 71, 50),
            (2, 3, 400),
            // Large enough to be split between two threads.
            (3, 515, 2000),
            (1, 1024, 4099),
        ] {
            let x: Vec<f32> = (0..m * k).map(|_| next()).collect();
            let w: Vec<f32> = (0..n * k).map(|_| next()).collect();
            // The same weights held in bf16 (rounded to nearest even on the high half, as a
            // bf16 tensor holds them); the reference is the product of the values held.
            let bits: Vec<u16> = w
                .iter()
                .map(|v| {
                    let b = v.to_bits();
                    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
                })
                .collect();
            let held: Vec<f32> = bits.iter().map(|&b| bf16_to_f32(b)).collect();
            for (weights, w) in [(Weights::F32(&w), &w), (Weights::Bf16(&bits), &held)] {
                for threads in [1, 2] {
                    let mut y = vec![f32::NAN; m * n];
                    matmul_nt_weights(&x, weights, &mut y, m, k, n, threads);
                    for i in 0..m {
                        for j in 0..n {
                            let want: f64 = (0..k)
                                .map(|p| f64::from(x[i * k + p]) * f64::from(w[j * k + p]))
                                .sum();
                            let got = f64::from(y[i * n + j]);
                            assert!(
                                (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                                "{weights:?} m={m} k={k} n={n} threads={threads} y[{i},{j}] = {got}, want {want}"
                            );
                        }
                    }
                    // Row 0 alone: bit for bit what it was among the others.
                    let mut alone = vec![f32::NAN; n];
                    matmul_nt_weights(&x[..k], weights, &mut alone, 1, k, n, threads);
                    assert_eq!(
                        alone,
                        y[..n],
                        "m={m} k={k} n={n}: row 0 depends on its batch"
                    );
                }
            }
        }
    }
}
