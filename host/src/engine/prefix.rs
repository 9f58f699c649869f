//! Automatic prefix caching: keys and values of token prefixes already computed, kept in
//! fixed-size blocks so a new request prefills only what no earlier request computed.
//!
//! A block holds the keys and values of `block` consecutive positions of every layer. It is
//! identified by its tokens *and* its parent block (the block before it), so a block stands for
//! the whole prefix that ends with it: two prompts share a block only when they agree on every
//! token up to its end, which is exactly when its keys and values are the same. Blocks form a
//! tree (a radix tree over block-sized steps); a lookup walks it from the root with the prompt's
//! tokens and returns the longest chain of matching blocks.
//!
//! Storage is one pool per layer, `[blocks, kv_heads, block, head_dim]` for keys and the same for
//! values, grown by doubling up to the budget. The engine decodes from its contiguous slots
//! ([`SlotCache`]); a hit copies the chain's blocks into the request's slot (a memory copy, a
//! small fraction of the arithmetic that recomputing them takes), and finished prefills and
//! finished sequences copy their new full blocks into the pool.
//!
//! Eviction is least-recently-used among leaves (blocks no other block continues), so a chain is
//! always whole from the root. Entries carry the policy version of the weights that computed
//! them; a weight update empties the cache, and a sequence whose keys span a weight update never
//! enters it: no request ever attends to keys of older weights.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeSet, HashMap};
use std::hash::{Hash, Hasher};

use tch::{Kind, Tensor};

use crate::model::Qwen3;
use crate::model::qwen3::SlotCache;

/// No parent: the block starts at position 0.
const ROOT: u32 = u32::MAX;

struct Block {
    /// The block's tokens (empty while the block is free).
    tokens: Vec<u32>,
    parent: u32,
    /// Blocks that continue this one.
    children: u32,
    /// Tick of the last lookup or store that used it.
    last_used: u64,
    /// Hash of (parent, tokens): the index key.
    hash: u64,
}

/// What the cache has done since the engine started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixStats {
    /// Blocks in use.
    pub blocks: usize,
    /// Most blocks the budget allows.
    pub max_blocks: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// Blocks evicted to make room.
    pub evicted: u64,
}

/// The block store (see the module docs). Lives on the engine thread.
pub struct PrefixCache {
    block: usize,
    max_blocks: usize,
    /// Per layer, key and value pools `[allocated, kv_heads, block, head_dim]`.
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    blocks: Vec<Block>,
    free: Vec<u32>,
    /// Hash of (parent, tokens) → blocks with that hash (collisions are told apart by tokens).
    index: HashMap<u64, Vec<u32>>,
    /// Evictable blocks (no children), oldest first.
    leaves: BTreeSet<(u64, u32)>,
    tick: u64,
    evicted: u64,
    shape: [i64; 3],
    kind: Kind,
    device: tch::Device,
}

fn key_hash(parent: u32, tokens: &[u32]) -> u64 {
    let mut h = DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

impl PrefixCache {
    /// An empty cache for `model` of at most `max_tokens` tokens in blocks of `block` tokens.
    /// Nothing is allocated until the first block is stored.
    pub fn new(model: &Qwen3, block: usize, max_tokens: usize) -> Self {
        let c = &model.cfg;
        let block = block.max(1);
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
            block,
            max_blocks: max_tokens / block,
            k: empty(),
            v: empty(),
            blocks: Vec::new(),
            free: Vec::new(),
            index: HashMap::new(),
            leaves: BTreeSet::new(),
            tick: 0,
            evicted: 0,
            shape,
            kind,
            device,
        }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block
    }

    /// Counts for reports.
    pub fn stats(&self) -> PrefixStats {
        PrefixStats {
            blocks: self.blocks.len() - self.free.len(),
            max_blocks: self.max_blocks,
            block_size: self.block,
            evicted: self.evicted,
        }
    }

    /// Tokens the cache holds now.
    pub fn cached_tokens(&self) -> usize {
        (self.blocks.len() - self.free.len()) * self.block
    }

    /// Forgets every entry (new weights, or `POST /reset_prefix_cache`); the pool's memory is
    /// kept for reuse.
    pub fn clear(&mut self) {
        self.index.clear();
        self.leaves.clear();
        self.free = (0..self.blocks.len() as u32).rev().collect();
        for b in &mut self.blocks {
            b.tokens.clear();
            b.children = 0;
            b.parent = ROOT;
        }
    }

    fn find(&self, parent: u32, tokens: &[u32]) -> Option<u32> {
        let ids = self.index.get(&key_hash(parent, tokens))?;
        ids.iter().copied().find(|&id| {
            let b = &self.blocks[id as usize];
            b.parent == parent && b.tokens == tokens
        })
    }

    fn touch(&mut self, id: u32) {
        let b = &mut self.blocks[id as usize];
        if b.children == 0 {
            self.leaves.remove(&(b.last_used, id));
            self.leaves.insert((self.tick, id));
        }
        self.blocks[id as usize].last_used = self.tick;
    }

    /// The longest chain of cached blocks that `tokens[..limit]` starts with (marked as just
    /// used).
    pub fn lookup(&mut self, tokens: &[u32], limit: usize) -> Vec<u32> {
        self.tick += 1;
        let mut chain = Vec::new();
        let mut parent = ROOT;
        for piece in tokens[..limit.min(tokens.len())].chunks_exact(self.block) {
            match self.find(parent, piece) {
                Some(id) => {
                    self.touch(id);
                    chain.push(id);
                    parent = id;
                }
                None => break,
            }
        }
        chain
    }

    /// Copies `chain`'s keys and values into positions `0..chain.len() × block` of `slot`.
    pub fn load(&self, chain: &[u32], cache: &mut SlotCache, slot: i64) {
        if chain.is_empty() {
            return;
        }
        let len = (chain.len() * self.block) as i64;
        cache.reserve(len);
        let index: Vec<i64> = chain.iter().map(|&b| i64::from(b)).collect();
        let index = Tensor::from_slice(&index).to_device(self.device);
        let [kv, bs, hd] = self.shape;
        let m = chain.len() as i64;
        tch::no_grad(|| {
            for ((k, v), (pk, pv)) in cache.layers_mut().zip(self.k.iter().zip(&self.v)) {
                for (dst, pool) in [(k, pk), (v, pv)] {
                    // [m, kv, bs, hd] → the slot's [kv, m·bs, hd] seen as [kv, m, bs, hd].
                    let src = pool.index_select(0, &index).permute([1, 0, 2, 3]);
                    dst.select(0, slot)
                        .narrow(1, 0, len)
                        .view([kv, m, bs, hd])
                        .copy_(&src);
                }
            }
        });
    }

    /// Stores the full blocks of `tokens[..valid]` that are not cached yet, copying their keys
    /// and values out of `slot` (which must hold them at positions `0..valid`). Stops early when
    /// the budget is full of blocks this very chain needs.
    pub fn store(&mut self, tokens: &[u32], valid: usize, cache: &mut SlotCache, slot: i64) {
        if self.max_blocks == 0 {
            return;
        }
        self.tick += 1;
        let pieces: Vec<&[u32]> = tokens[..valid.min(tokens.len())]
            .chunks_exact(self.block)
            .collect();
        let mut parent = ROOT;
        let mut new: Vec<u32> = Vec::new();
        let mut first_new = pieces.len();
        for (i, piece) in pieces.iter().enumerate() {
            if new.is_empty()
                && let Some(id) = self.find(parent, piece)
            {
                self.touch(id);
                parent = id;
                continue;
            }
            let Some(id) = self.allocate(parent) else {
                break;
            };
            if new.is_empty() {
                first_new = i;
            }
            self.link(id, parent, piece);
            new.push(id);
            parent = id;
        }
        if new.is_empty() {
            return;
        }
        let index: Vec<i64> = new.iter().map(|&b| i64::from(b)).collect();
        let index = Tensor::from_slice(&index).to_device(self.device);
        let [kv, bs, hd] = self.shape;
        let m = new.len() as i64;
        let start = (first_new * self.block) as i64;
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

    /// Enters block `id` into the tree under `parent`.
    fn link(&mut self, id: u32, parent: u32, tokens: &[u32]) {
        let hash = key_hash(parent, tokens);
        if parent != ROOT {
            let p = &mut self.blocks[parent as usize];
            if p.children == 0 {
                self.leaves.remove(&(p.last_used, parent));
            }
            p.children += 1;
        }
        let b = &mut self.blocks[id as usize];
        b.tokens = tokens.to_vec();
        b.parent = parent;
        b.children = 0;
        b.last_used = self.tick;
        b.hash = hash;
        self.index.entry(hash).or_default().push(id);
        self.leaves.insert((self.tick, id));
    }

    /// A free block: from the free list, by growing the pool, or by evicting the least recently
    /// used leaf. `None` when the only candidate is `keep` (the chain being extended) or newer.
    fn allocate(&mut self, keep: u32) -> Option<u32> {
        if let Some(id) = self.free.pop() {
            return Some(id);
        }
        if self.blocks.len() < self.max_blocks {
            self.grow();
            return self.free.pop();
        }
        let &(used, victim) = self.leaves.iter().next()?;
        if victim == keep || used == self.tick {
            return None;
        }
        self.leaves.remove(&(used, victim));
        let b = &mut self.blocks[victim as usize];
        let (hash, parent) = (b.hash, b.parent);
        b.tokens.clear();
        if let Some(ids) = self.index.get_mut(&hash) {
            ids.retain(|&i| i != victim);
            if ids.is_empty() {
                self.index.remove(&hash);
            }
        }
        if parent != ROOT {
            let p = &mut self.blocks[parent as usize];
            p.children -= 1;
            if p.children == 0 {
                let used = p.last_used;
                self.leaves.insert((used, parent));
            }
        }
        self.evicted += 1;
        Some(victim)
    }

    /// Doubles the pool (at least 16 blocks, at most the budget).
    fn grow(&mut self) {
        let old = self.blocks.len();
        let new = (old * 2).max(16).min(self.max_blocks);
        let [kv, bs, hd] = self.shape;
        let opts = (self.kind, self.device);
        tch::no_grad(|| {
            for t in self.k.iter_mut().chain(self.v.iter_mut()) {
                let g = Tensor::zeros([new as i64, kv, bs, hd], opts);
                g.narrow(0, 0, old as i64).copy_(t);
                *t = g;
            }
        });
        for _ in old..new {
            self.blocks.push(Block {
                tokens: Vec::new(),
                parent: ROOT,
                children: 0,
                last_used: 0,
                hash: 0,
            });
        }
        // Lowest ids first out of the free list.
        self.free.extend((old as u32..new as u32).rev());
    }
}
