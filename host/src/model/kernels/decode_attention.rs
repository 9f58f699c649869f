//! Decode attention (one query per row and head) on the CPU reading the keys and values where
//! the cache holds them, in f32 or bf16, once per kv head for its whole group of query heads.
//!
//! libtorch computes a decode step's attention as two batched products (`q Kᵀ`, then `P V`)
//! of `group` rows each (2 for Qwen3-0.6B): too few rows for its BLAS to reach the memory's
//! speed, and on CPUs without bf16 instructions its bf16 products are emulated. At 432 keys and
//! 8 rows of Qwen3-0.6B's shape (2-core AMD EPYC, AVX2) the two products took 135 ms a step in
//! f32 and 290 in bf16, more than the step's weight products. Here each key row is read once,
//! widened to f32 in registers when bf16, and dotted with every query of its group
//! ([`scores`]); the softmax is libtorch's, in f32; each value row is read once and added,
//! weighted, into every query's output ([`weighted_values`]). Sums run in f32 and nothing is
//! rounded between the steps (libtorch's bf16 path rounds the scores and the probabilities to
//! bf16). Every (row, kv head) is computed alone, so a row's result does not depend on its batch
//! or on the threads.

use tch::{Device, Kind, Tensor};

#[cfg(target_arch = "x86_64")]
use super::few_rows::hsum;
use super::few_rows::{self, Out, run_parts};

/// Query heads per kv head this kernel takes (Qwen3: 2 to 4).
pub const MAX_GROUP: i64 = 8;

/// Multiply-adds below which the work stays on one thread.
const MIN_WORK: usize = 1 << 18;

/// Whether this CPU runs the kernel (x86-64 with AVX2 and FMA, as [`few_rows`]).
pub fn available() -> bool {
    few_rows::available()
}

/// The attention of one query per row over its keys, or `None` where this kernel does not take
/// it (not the CPU, an operand that requires grad, a dtype other than f32 and bf16, a head size
/// not a multiple of 8, more than [`MAX_GROUP`] query heads per kv head, a head's elements not
/// contiguous, a CPU without AVX2): the caller's libtorch path then runs.
///
/// `q` `[b, heads, 1, hd]`; `k`, `v` `[b, heads / group, keys, hd]` (views of a cache: any
/// strides but the last); `mask` additive, `b · keys` values (`-inf` hides a key). Returns `[b,
/// 1, heads × hd]` in `q`'s dtype.
pub fn attend(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    scale: f64,
    group: i64,
) -> Option<Tensor> {
    let kind = q.kind();
    let (b, heads, t, hd) = q.size4().ok()?;
    let (kb, nkv, keys, khd) = k.size4().ok()?;
    let applies = available()
        && t == 1
        && kb == b
        && khd == hd
        && heads == nkv * group
        && q.device() == Device::Cpu
        && matches!(kind, Kind::Float | Kind::BFloat16)
        && k.kind() == kind
        && v.kind() == kind
        && !(q.requires_grad() || k.requires_grad() || v.requires_grad())
        && hd % 8 == 0
        && (1..=MAX_GROUP).contains(&group)
        && k.size() == v.size()
        && k.stride()[3] == 1
        && v.stride()[3] == 1
        && keys >= 1;
    if !applies {
        return None;
    }
    let q = q
        .reshape([b * nkv, group, hd])
        .to_kind(Kind::Float)
        .contiguous();
    let mut s = scores(&q, k, scale);
    if let Some(mask) = mask {
        s += super::per_kv_head(mask, b, nkv, keys);
    }
    let p = s.softmax(-1, Kind::Float);
    Some(
        weighted_values(&p, v)
            .to_kind(kind)
            .reshape([b, 1, nkv * group * hd]),
    )
}

/// Where one (row, kv head)'s rows of a `[b, kv, keys, hd]` view start, and the bytes between
/// its key rows.
struct Slabs {
    /// The view's first element's address.
    base: usize,
    /// Bytes between rows of the batch, kv heads, keys.
    strides: [usize; 3],
    kv: usize,
    bf16: bool,
}

impl Slabs {
    fn of(t: &Tensor) -> Self {
        let size = t.kind().elt_size_in_bytes();
        let st = t.stride();
        Slabs {
            base: t.data_ptr() as usize,
            strides: [
                st[0] as usize * size,
                st[1] as usize * size,
                st[2] as usize * size,
            ],
            kv: t.size()[1] as usize,
            bf16: t.kind() == Kind::BFloat16,
        }
    }

    /// The first key row of task `task` (row `task / kv`, kv head `task % kv`).
    fn slab(&self, task: usize) -> *const u8 {
        (self.base as *const u8)
            .wrapping_add((task / self.kv) * self.strides[0] + (task % self.kv) * self.strides[1])
    }
}

/// `scale · q Kᵀ` per (row, kv head): `q` `[b · kv, group, hd]` f32 contiguous, `k` `[b, kv,
/// keys, hd]` f32 or bf16, the last dimension contiguous. Returns `[b · kv, group, keys]` f32.
fn scores(q: &Tensor, k: &Tensor, scale: f64) -> Tensor {
    let (tasks, group, hd) = q.size3().expect("q is [tasks, group, hd]");
    let keys = k.size()[2];
    let out = Tensor::empty([tasks, group, keys], (Kind::Float, Device::Cpu));
    let (tasks, group, hd, keys) = (tasks as usize, group as usize, hd as usize, keys as usize);
    let slabs = Slabs::of(k);
    let (qp, op) = (
        q.data_ptr() as *const f32 as usize,
        Out(out.data_ptr() as *mut f32),
    );
    let scale = scale as f32;
    let run = |task: usize| {
        let k = slabs.slab(task);
        let ks = slabs.strides[2];
        // SAFETY: `q` holds tasks·group·hd f32, `out` tasks·group·keys; task `task`'s slab
        // holds `keys` rows of `hd` values `ks` bytes apart (the view's strides); each task
        // writes its own outputs only; AVX2 and FMA checked by `attend`.
        unsafe {
            let q = (qp as *const f32).add(task * group * hd);
            let out = &op;
            let o = out.0.add(task * group * keys);
            macro_rules! by_group {
                ($bf16:literal) => {
                    match group {
                        1 => scores_task::<$bf16, 1>(q, k, ks, keys, hd, scale, o),
                        2 => scores_task::<$bf16, 2>(q, k, ks, keys, hd, scale, o),
                        3 => scores_task::<$bf16, 3>(q, k, ks, keys, hd, scale, o),
                        4 => scores_task::<$bf16, 4>(q, k, ks, keys, hd, scale, o),
                        5 => scores_task::<$bf16, 5>(q, k, ks, keys, hd, scale, o),
                        6 => scores_task::<$bf16, 6>(q, k, ks, keys, hd, scale, o),
                        7 => scores_task::<$bf16, 7>(q, k, ks, keys, hd, scale, o),
                        _ => scores_task::<$bf16, 8>(q, k, ks, keys, hd, scale, o),
                    }
                };
            }
            if slabs.bf16 {
                by_group!(true)
            } else {
                by_group!(false)
            }
        }
    };
    on_tasks(tasks, tasks * group * keys * hd, &run);
    out
}

/// `P V` per (row, kv head): `p` `[b · kv, group, keys]` f32 contiguous, `v` `[b, kv, keys, hd]`
/// f32 or bf16, the last dimension contiguous. Returns `[b · kv, group, hd]` f32.
fn weighted_values(p: &Tensor, v: &Tensor) -> Tensor {
    let (tasks, group, keys) = p.size3().expect("p is [tasks, group, keys]");
    let hd = v.size()[3];
    let out = Tensor::empty([tasks, group, hd], (Kind::Float, Device::Cpu));
    let (tasks, group, hd, keys) = (tasks as usize, group as usize, hd as usize, keys as usize);
    let slabs = Slabs::of(v);
    let (pp, op) = (
        p.data_ptr() as *const f32 as usize,
        Out(out.data_ptr() as *mut f32),
    );
    let run = |task: usize| {
        let v = slabs.slab(task);
        let vs = slabs.strides[2];
        // SAFETY: as in `scores`, for `p` tasks·group·keys, `out` tasks·group·hd.
        unsafe {
            let p = (pp as *const f32).add(task * group * keys);
            let out = &op;
            let o = out.0.add(task * group * hd);
            // Accumulators `group × CB` + `CB` value vectors + a broadcast ≤ 16 registers.
            macro_rules! by_group {
                ($bf16:literal) => {
                    match group {
                        1 => values_task::<$bf16, 1, 4>(p, v, vs, keys, hd, o),
                        2 => values_task::<$bf16, 2, 4>(p, v, vs, keys, hd, o),
                        3 => values_task::<$bf16, 3, 3>(p, v, vs, keys, hd, o),
                        4 => values_task::<$bf16, 4, 2>(p, v, vs, keys, hd, o),
                        5 => values_task::<$bf16, 5, 1>(p, v, vs, keys, hd, o),
                        6 => values_task::<$bf16, 6, 1>(p, v, vs, keys, hd, o),
                        7 => values_task::<$bf16, 7, 1>(p, v, vs, keys, hd, o),
                        _ => values_task::<$bf16, 8, 1>(p, v, vs, keys, hd, o),
                    }
                };
            }
            if slabs.bf16 {
                by_group!(true)
            } else {
                by_group!(false)
            }
        }
    };
    on_tasks(tasks, tasks * group * keys * hd, &run);
    out
}

/// Runs `run(task)` for every task, split in contiguous ranges between libtorch's threads when
/// the `work` (multiply-adds) pays for waking them.
fn on_tasks(tasks: usize, work: usize, run: &(dyn Fn(usize) + Sync)) {
    let threads = tch::get_num_threads().max(1) as usize;
    let parts = threads.min(tasks).min(work.div_ceil(MIN_WORK)).max(1);
    let per = tasks.div_ceil(parts);
    run_parts(parts, &|part| {
        for task in part * per..((part + 1) * per).min(tasks) {
            run(task);
        }
    });
}

/// Eight values from `p + i` (elements), as f32: bf16 ones widened.
///
/// # Safety
/// Eight values exist there; AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn load8<const BF16: bool>(p: *const u8, i: usize) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    // SAFETY: the caller's contract.
    unsafe {
        if BF16 {
            let h = _mm_loadu_si128(p.cast::<u16>().add(i).cast());
            _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
        } else {
            _mm256_loadu_ps(p.cast::<f32>().add(i))
        }
    }
}

/// `o[g, j] = scale · q[g] · k[j]` for `g < G` (the group), `j < keys`: each key row read once
/// for the whole group.
///
/// # Safety
/// `q` holds `G·hd` f32, `k` `keys` rows of `hd` values `ks` bytes apart, `o` `G·keys` f32;
/// `hd` is a multiple of 8; AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn scores_task<const BF16: bool, const G: usize>(
    q: *const f32,
    k: *const u8,
    ks: usize,
    keys: usize,
    hd: usize,
    scale: f32,
    o: *mut f32,
) {
    use std::arch::x86_64::*;
    for j in 0..keys {
        let kr = k.wrapping_add(j * ks);
        let mut acc = [_mm256_setzero_ps(); G];
        let mut c = 0;
        while c < hd {
            // SAFETY: c + 8 ≤ hd (hd a multiple of 8) within the key row and each query row.
            unsafe {
                let kv = load8::<BF16>(kr, c);
                for (g, a) in acc.iter_mut().enumerate() {
                    *a = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(g * hd + c)), kv, *a);
                }
            }
            c += 8;
        }
        for (g, a) in acc.iter().enumerate() {
            // SAFETY: o holds G·keys values.
            unsafe { *o.add(g * keys + j) = hsum(*a) * scale };
        }
    }
}

/// `o[g] = Σ_j p[g, j] · v[j]` for `g < G` (the group): `CB` vectors of 8 columns at a time in
/// registers for the whole group, each value row's columns read once for the group.
///
/// # Safety
/// `p` holds `G·keys` f32, `v` `keys` rows of `hd` values `vs` bytes apart, `o` `G·hd` f32;
/// `hd` is a multiple of 8; AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn values_task<const BF16: bool, const G: usize, const CB: usize>(
    p: *const f32,
    v: *const u8,
    vs: usize,
    keys: usize,
    hd: usize,
    o: *mut f32,
) {
    let mut c = 0;
    while c + 8 * CB <= hd {
        // SAFETY: the caller's contract; columns c..c + 8·CB exist.
        unsafe { values_columns::<BF16, G, CB>(p, v, vs, keys, hd, c, o) };
        c += 8 * CB;
    }
    while c < hd {
        // SAFETY: as above, for 8 columns.
        unsafe { values_columns::<BF16, G, 1>(p, v, vs, keys, hd, c, o) };
        c += 8;
    }
}

/// Columns `c..c + 8·CB` of [`values_task`]'s outputs.
///
/// # Safety
/// As [`values_task`], with `c + 8·CB ≤ hd`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn values_columns<const BF16: bool, const G: usize, const CB: usize>(
    p: *const f32,
    v: *const u8,
    vs: usize,
    keys: usize,
    hd: usize,
    c: usize,
    o: *mut f32,
) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm256_setzero_ps(); CB]; G];
    for j in 0..keys {
        let vr = v.wrapping_add(j * vs);
        let mut vv = [_mm256_setzero_ps(); CB];
        for (b, x) in vv.iter_mut().enumerate() {
            // SAFETY: c + 8·CB ≤ hd within the value row.
            *x = unsafe { load8::<BF16>(vr, c + 8 * b) };
        }
        for (g, row) in acc.iter_mut().enumerate() {
            // SAFETY: p holds G·keys values.
            let w = _mm256_set1_ps(unsafe { *p.add(g * keys + j) });
            for (a, x) in row.iter_mut().zip(&vv) {
                *a = _mm256_fmadd_ps(w, *x, *a);
            }
        }
    }
    for (g, row) in acc.iter().enumerate() {
        for (b, a) in row.iter().enumerate() {
            // SAFETY: o holds G·hd values; c + 8·CB ≤ hd.
            unsafe { _mm256_storeu_ps(o.add(g * hd + c + 8 * b), *a) };
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn scores_task<const BF16: bool, const G: usize>(
    _q: *const f32,
    _k: *const u8,
    _ks: usize,
    _keys: usize,
    _hd: usize,
    _scale: f32,
    _o: *mut f32,
) {
    unreachable!("`available` is false off x86-64")
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn values_task<const BF16: bool, const G: usize, const CB: usize>(
    _p: *const f32,
    _v: *const u8,
    _vs: usize,
    _keys: usize,
    _hd: usize,
    _o: *mut f32,
) {
    unreachable!("`available` is false off x86-64")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// libtorch's attention of one query per row in f32 (the reference): `q` `[b, heads, 1,
    /// hd]`, `k`, `v` `[b, kv, keys, hd]`, an additive mask `[b, keys]`.
    fn reference(q: &Tensor, k: &Tensor, v: &Tensor, mask: &Tensor, scale: f64) -> Tensor {
        let (b, nh, _, hd) = q.size4().unwrap();
        let (_, nkv, keys, _) = k.size4().unwrap();
        let group = nh / nkv;
        let f = |t: &Tensor| t.to_kind(Kind::Float);
        let k = f(k).repeat_interleave_self_int(group, 1, None);
        let v = f(v).repeat_interleave_self_int(group, 1, None);
        let s = f(q).matmul(&k.transpose(2, 3)) * scale + mask.view([b, 1, 1, keys]);
        s.softmax(-1, Kind::Float)
            .matmul(&v)
            .reshape([b, 1, nh * hd])
    }

    /// Against libtorch's f32 attention on cache views (keys narrowed out of a longer slab, as
    /// the engine's slots hold them), f32 and bf16, every group size up to 8, head sizes 48 and
    /// 128, one key to hundreds, hidden keys; one and two threads; each row the same bits alone
    /// as in its batch.
    #[test]
    fn equals_libtorchs_attention_on_cache_views() {
        if !available() {
            crate::testing::skip(
                "decode_attention::equals_libtorchs_attention_on_cache_views",
                "this CPU lacks AVX2 or FMA: the decode attention kernel does not run here",
            );
            return;
        }
        tch::manual_seed(5);
        let cpu = Device::Cpu;
        for (b, nkv, group, hd, keys) in [
            (3, 2, 2, 48, 1),
            (2, 2, 1, 48, 37),
            (5, 8, 2, 128, 432),
            (2, 3, 3, 64, 70),
            (1, 2, 4, 128, 129),
            (2, 1, 5, 16, 9),
            (2, 1, 8, 32, 200),
        ] {
            let nh = nkv * group;
            for kind in [Kind::Float, Kind::BFloat16] {
                let slab = |seed: i64| {
                    tch::manual_seed(seed);
                    Tensor::randn([b, nkv, keys + 11, hd], (Kind::Float, cpu)).to_kind(kind)
                };
                let (kslab, vslab) = (slab(b * 7 + keys), slab(b * 7 + keys + 1));
                let k = kslab.narrow(2, 0, keys);
                let v = vslab.narrow(2, 0, keys);
                let q = Tensor::randn([b, nh, 1, hd], (Kind::Float, cpu)).to_kind(kind);
                // The last row hides its first keys (padding), when it has more than one.
                let mask = Tensor::zeros([b, keys], (Kind::Float, cpu));
                if keys > 1 {
                    let _ = mask
                        .get(b - 1)
                        .narrow(0, 0, keys / 2)
                        .fill_(f64::NEG_INFINITY);
                }
                let scale = (hd as f64).powf(-0.5);
                let want = reference(&q, &k, &v, &mask, scale);
                for threads in [1, 2] {
                    tch::set_num_threads(threads);
                    let got = attend(&q, &k, &v, Some(&mask), scale, group).expect("applies");
                    assert_eq!(got.kind(), kind);
                    let got = got.to_kind(Kind::Float);
                    // f32: other summation orders; bf16: the output rounded once.
                    let tol = if kind == Kind::Float { 1e-5 } else { 8e-3 };
                    let over = ((&got - &want).abs() - (want.abs() * tol + tol))
                        .max()
                        .double_value(&[]);
                    assert!(
                        over <= 0.0,
                        "{kind:?} b={b} kv={nkv} group={group} hd={hd} keys={keys} \
                         threads={threads}: off libtorch by {over} beyond {tol}"
                    );
                    let alone = attend(
                        &q.narrow(0, b - 1, 1),
                        &k.narrow(0, b - 1, 1),
                        &v.narrow(0, b - 1, 1),
                        Some(&mask.narrow(0, b - 1, 1)),
                        scale,
                        group,
                    )
                    .unwrap()
                    .to_kind(Kind::Float);
                    assert!(
                        alone.equal(&got.narrow(0, b - 1, 1)),
                        "{kind:?} b={b} group={group}: the last row depends on its batch"
                    );
                }
            }
        }
        tch::set_num_threads(1);
    }

    /// What the kernel does not take is left to the caller: a head size not a multiple of 8,
    /// more than 8 query heads per kv head, an operand that requires grad, shapes that do not
    /// agree.
    #[test]
    fn declines_what_it_does_not_take() {
        let cpu = (Kind::Float, Device::Cpu);
        let q = Tensor::randn([1, 2, 1, 12], cpu);
        let k = Tensor::randn([1, 1, 5, 12], cpu);
        assert!(attend(&q, &k, &k, None, 0.3, 2).is_none(), "hd 12");
        let q = Tensor::randn([1, 9, 1, 16], cpu);
        let k = Tensor::randn([1, 1, 5, 16], cpu);
        assert!(attend(&q, &k, &k, None, 0.3, 9).is_none(), "group 9");
        let q = Tensor::randn([1, 2, 1, 16], cpu).set_requires_grad(true);
        let k = Tensor::randn([1, 1, 5, 16], cpu);
        assert!(attend(&q, &k, &k, None, 0.3, 2).is_none(), "grad");
        let q = Tensor::randn([1, 2, 1, 16], cpu);
        assert!(
            attend(&q, &k, &k, None, 0.3, 1).is_none(),
            "heads ≠ kv × group"
        );
        let two = Tensor::randn([2, 1, 5, 16], cpu);
        assert!(attend(&q, &two, &two, None, 0.3, 2).is_none(), "batch");
        let q2 = Tensor::randn([1, 2, 2, 16], cpu);
        assert!(
            attend(&q2, &k, &k, None, 0.3, 2).is_none(),
            "two queries per row"
        );
        assert_eq!(
            attend(&q, &k, &k, None, 0.3, 2).is_some(),
            available(),
            "what it takes, where the CPU runs it"
        );
    }
}
