//! The prefix cache's block pool: the keys and values of cached blocks, one tensor per layer for
//! keys and one for values, `[blocks, kv_heads, block, head_dim]`, on the engine's device, grown
//! by doubling as [`super::index::BlockIndex`] hands out ids. It copies blocks between itself and
//! the engine's slots and decides nothing: which blocks, and where, is the index's.

use tch::{Kind, Tensor};

use crate::model::Qwen3;
use crate::model::SlotCache;

/// Per-layer key and value pools.
pub struct BlockPool {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    /// `[kv_heads, block, head_dim]` of one block of one layer.
    shape: [i64; 3],
    kind: Kind,
    device: tch::Device,
}

impl BlockPool {
    /// An empty pool for `model`'s layers in blocks of `block` positions (nothing allocated).
    pub fn new(model: &Qwen3, block: usize) -> Self {
        let c = &model.cfg;
        let shape = [c.num_key_value_heads, block as i64, c.head_dim];
        let kind = model
            .vs
            .variables()
            .get("model.embed_tokens.weight")
            .map_or(Kind::Float, Tensor::kind);
        let device = model.vs.device();
        let empty = || -> Vec<Tensor> {
            (0..c.num_hidden_layers)
                .map(|_| Tensor::zeros([0, shape[0], shape[1], shape[2]], (kind, device)))
                .collect()
        };
        Self {
            k: empty(),
            v: empty(),
            shape,
            kind,
            device,
        }
    }

    /// Frees every layer's pool (nothing allocated, as new); returns the bytes freed.
    pub fn release(&mut self) -> i64 {
        let [kv, bs, hd] = self.shape;
        let mut freed = 0;
        for t in self.k.iter_mut().chain(self.v.iter_mut()) {
            freed += t.numel() as i64 * t.kind().elt_size_in_bytes() as i64;
            *t = Tensor::zeros([0, kv, bs, hd], (self.kind, self.device));
        }
        freed
    }

    fn blocks(&self) -> i64 {
        self.k.first().map_or(0, |t| t.size()[0])
    }

    /// Grows every layer's pool to hold `blocks` blocks (keeping what it holds).
    pub fn ensure(&mut self, blocks: usize) {
        let old = self.blocks();
        let new = blocks as i64;
        if new <= old {
            return;
        }
        let [kv, bs, hd] = self.shape;
        let opts = (self.kind, self.device);
        tch::no_grad(|| {
            for t in self.k.iter_mut().chain(self.v.iter_mut()) {
                let g = Tensor::zeros([new, kv, bs, hd], opts);
                g.narrow(0, 0, old).copy_(t);
                *t = g;
            }
        });
    }

    fn ids(&self, ids: &[u32]) -> Tensor {
        let index: Vec<i64> = ids.iter().map(|&b| i64::from(b)).collect();
        Tensor::from_slice(&index).to_device(self.device)
    }

    /// Copies blocks `chain` into positions `0..chain.len() × block` of `slot`.
    pub fn read(&self, chain: &[u32], cache: &mut SlotCache, slot: i64) {
        if chain.is_empty() {
            return;
        }
        let [kv, bs, hd] = self.shape;
        let m = chain.len() as i64;
        cache.reserve(m * bs);
        let index = self.ids(chain);
        tch::no_grad(|| {
            for ((k, v), (pk, pv)) in cache.layers_mut().zip(self.k.iter().zip(&self.v)) {
                for (dst, pool) in [(k, pk), (v, pv)] {
                    // [m, kv, bs, hd] → the slot's [kv, m·bs, hd] seen as [kv, m, bs, hd].
                    let src = pool.index_select(0, &index).permute([1, 0, 2, 3]);
                    dst.select(0, slot)
                        .narrow(1, 0, m * bs)
                        .view([kv, m, bs, hd])
                        .copy_(&src);
                }
            }
        });
    }

    /// Copies the `ids.len()` blocks of `slot` starting at block `first` into pool blocks `ids`.
    pub fn write(&mut self, ids: &[u32], first: usize, cache: &mut SlotCache, slot: i64) {
        if ids.is_empty() {
            return;
        }
        let [kv, bs, hd] = self.shape;
        let m = ids.len() as i64;
        let start = first as i64 * bs;
        let index = self.ids(ids);
        tch::no_grad(|| {
            for ((k, v), (pk, pv)) in cache.layers_mut().zip(self.k.iter_mut().zip(&mut self.v)) {
                for (src, pool) in [(k, pk), (v, pv)] {
                    let blocks = src
                        .select(0, slot)
                        .narrow(1, start, m * bs)
                        .view([kv, m, bs, hd])
                        .permute([1, 0, 2, 3]);
                    let _ = pool.index_copy_(0, &index, &blocks);
                }
            }
        });
    }
}
