//! The model's compute kernels and their dispatch: matrix products `x Wᵀ` by the few-rows
//! kernel ([`few_rows`]), oneDNN or libtorch's BLAS ([`product`], chosen per shape by
//! [`ProductKernel`]), and grouped-query attention ([`grouped_attention`]). Pure functions of
//! tensors: no weights, no model state.

pub mod few_rows;

use tch::{Device, Kind, Tensor};

/// What runs a matrix product `x Wᵀ` of the model ([`crate::model::Qwen3::product_kernel`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProductKernel {
    /// [`few_rows::matmul_nt`]: x86-64 with AVX2 and FMA, f32, at most [`SMALL_PRODUCT_ROWS`].
    FewRows,
    /// oneDNN (libtorch's `mkldnn_linear`) on the weights in place: f32, at most
    /// [`SMALL_PRODUCT_ROWS`] rows, where the few-rows kernel does not run.
    OneDnn,
    /// libtorch's `linear` (its BLAS: MKL in the PyPI build, cuBLAS on CUDA): everything else,
    /// and every product of a model that is trained.
    Blas,
}

/// Rows up to which a product runs through [`few_rows::matmul_nt`] (where it runs: x86-64 with
/// AVX2 and FMA), else oneDNN (where libtorch has it), rather than the BLAS. `host bench
/// products` on a 2-core AMD EPYC (AVX2), 2 threads, the 28 layers of Qwen3-0.6B's shapes
/// streamed from memory: 1 row 77 ms (oneDNN 92, MKL 126), 8 rows 127 ms (170, 321), 32 rows
/// 238 ms (311, 444), 64 rows 411 ms (487, 594), 128 rows 863 ms (905, 1,028), and the output
/// head likewise; on the tiny model's shapes the few-rows kernel still beats the BLAS at 128
/// rows (1.06x) where oneDNN does not (0.70x). Beyond it, the BLAS: its kernels are at the
/// machine's peak there and use wider vector units where the CPU has them.
pub const SMALL_PRODUCT_ROWS: i64 = 128;

/// Cleared after oneDNN refused a product once (a libtorch built without it, or a CPU it does
/// not run on): every later product takes the BLAS.
static ONEDNN_WORKS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Whether autograd records operations on this thread now.
pub fn grad_enabled() -> bool {
    // SAFETY: sets libtorch's thread-local grad mode and at once back to what it was.
    unsafe {
        let was = torch_sys::at_grad_set_enabled(0);
        torch_sys::at_grad_set_enabled(was);
        was != 0
    }
}

/// `x Wᵀ` by [`few_rows::matmul_nt`] on libtorch's thread count; `x` `[m, k]` contiguous f32 on
/// the CPU, `w` `[n, k]` likewise.
fn few_rows_linear(x: &Tensor, w: &Tensor) -> Tensor {
    let (m, k) = x.size2().expect("x is [m, k]");
    let n = w.size()[0];
    assert!(
        x.kind() == Kind::Float && w.kind() == Kind::Float && w.size()[1] == k,
        "few-rows products are f32 [m, k] x [n, k]"
    );
    assert!(
        x.is_contiguous() && w.is_contiguous(),
        "contiguous operands"
    );
    let y = Tensor::empty([m, n], (Kind::Float, Device::Cpu));
    let (m, k, n) = (m as usize, k as usize, n as usize);
    // SAFETY: three contiguous f32 CPU tensors of m·k, n·k and m·n values (checked above; `y`
    // is new and nothing else sees it until this returns).
    unsafe {
        let xs = std::slice::from_raw_parts(x.data_ptr() as *const f32, m * k);
        let ws = std::slice::from_raw_parts(w.data_ptr() as *const f32, n * k);
        let ys = std::slice::from_raw_parts_mut(y.data_ptr() as *mut f32, m * n);
        let threads = tch::get_num_threads().max(1) as usize;
        few_rows::matmul_nt(xs, ws, ys, m, k, n, threads);
    }
    y
}

/// `x Wᵀ` by oneDNN (libtorch's `mkldnn_linear`) on `w` in place, or libtorch's error where
/// oneDNN refuses (a libtorch built without it, a CPU it does not run on). `x` `[rows, in]`, `w`
/// `[out, in]` contiguous, both f32 on the CPU.
pub fn onednn_product(x: &Tensor, w: &Tensor) -> Result<Tensor, tch::TchError> {
    x.contiguous()
        .f_to_mkldnn(None)
        .and_then(|m| m.f_mkldnn_linear(w, None::<Tensor>))
        .and_then(|m| m.f_to_dense(None, false))
}

/// Whether oneDNN has not refused a product in this process yet ([`product`] falls back to the
/// BLAS for good after the first refusal, and says so in a warning).
pub fn onednn_works() -> bool {
    ONEDNN_WORKS.load(std::sync::atomic::Ordering::Relaxed)
}

/// `x Wᵀ` for `x` `[rows, in]` and `w` `[out, in]` by `kernel`; the few-rows kernel and oneDNN
/// need f32 operands on the CPU, `w` contiguous (checked by [`crate::model::Qwen3::project`]; a bench
/// passes its own). When oneDNN refuses, the BLAS computes it, and every later oneDNN product
/// ([`onednn_works`] then says false; a caller that must know oneDNN ran calls
/// [`onednn_product`]).
pub fn product(kernel: ProductKernel, x: &Tensor, w: &Tensor) -> Tensor {
    match kernel {
        ProductKernel::FewRows => few_rows_linear(&x.contiguous(), w),
        ProductKernel::OneDnn if onednn_works() => onednn_product(x, w).unwrap_or_else(|e| {
            ONEDNN_WORKS.store(false, std::sync::atomic::Ordering::Relaxed);
            tracing::warn!("oneDNN matrix products unavailable, using the BLAS: {e}");
            x.linear::<Tensor>(w, None)
        }),
        ProductKernel::OneDnn | ProductKernel::Blas => x.linear::<Tensor>(w, None),
    }
}

/// Scaled dot-product attention of `q` `[b, heads, t, hd]` over `k`, `v` `[b, heads / group,
/// keys, hd]` with an additive `mask` (none: causal), each kv head serving `group` consecutive query heads.
/// `repeat_kv`: repeat the kv heads to the query heads' count instead of asking libtorch for
/// grouped attention (`enable_gqa`), which only its math kernel accepts with a mask; the
/// memory-efficient kernel (CUDA) then runs without materialising the scores. Both give the same
/// result (`grouped_attention_by_repeated_heads_equals_enable_gqa`).
pub fn grouped_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    scale: f64,
    group: i64,
    repeat_kv: bool,
) -> Tensor {
    // No mask: causal by position (queries and keys the same positions), which every kernel
    // (flash attention on CUDA too) runs without a mask tensor.
    let causal = mask.is_none();
    if repeat_kv && group > 1 {
        let k = k.repeat_interleave_self_int(group, 1, None);
        let v = v.repeat_interleave_self_int(group, 1, None);
        Tensor::scaled_dot_product_attention(q, &k, &v, mask, 0.0, causal, scale, false)
    } else {
        Tensor::scaled_dot_product_attention(q, k, v, mask, 0.0, causal, scale, group > 1)
    }
}
