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
//!
//! Two parts: `index.rs` (the block tree, its hash index and LRU leaves: pure bookkeeping, tested
//! without a model) and `pool.rs` (the tensors, copied to and from the engine's slots).

mod index;
mod pool;

use crate::model::Qwen3;
use crate::model::SlotCache;

use index::BlockIndex;
use pool::BlockPool;

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
    index: BlockIndex,
    pool: BlockPool,
}

impl PrefixCache {
    /// An empty cache for `model` of at most `max_tokens` tokens in blocks of `block` tokens.
    /// Nothing is allocated until the first block is stored.
    pub fn new(model: &Qwen3, block: usize, max_tokens: usize) -> Self {
        let block = block.max(1);
        Self {
            index: BlockIndex::new(block, max_tokens / block),
            pool: BlockPool::new(model, block),
        }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.index.block_size()
    }

    /// Counts for reports.
    pub fn stats(&self) -> PrefixStats {
        PrefixStats {
            blocks: self.index.used(),
            max_blocks: self.index.max_blocks(),
            block_size: self.index.block_size(),
            evicted: self.index.evicted(),
        }
    }

    /// Tokens the cache holds now.
    pub fn cached_tokens(&self) -> usize {
        self.index.used() * self.index.block_size()
    }

    /// Forgets every entry (new weights, or `POST /reset_prefix_cache`); the pool's memory is
    /// kept for reuse.
    pub fn clear(&mut self) {
        self.index.clear();
    }

    /// Forgets every entry and frees the pool's memory (an engine going to sleep); it grows
    /// again as blocks are stored. Returns the bytes freed.
    pub fn release(&mut self) -> i64 {
        self.index.release();
        self.pool.release()
    }

    /// The longest chain of cached blocks that `tokens[..limit]` starts with (marked as just
    /// used), among those computed in namespace `ns` (0: the base model; each adapter an
    /// engine serves has its own).
    pub fn lookup(&mut self, ns: u16, tokens: &[u32], limit: usize) -> Vec<u32> {
        self.index.lookup(ns, tokens, limit)
    }

    /// Copies `chain`'s keys and values into positions `0..chain.len() × block` of `slot`.
    pub fn load(&self, chain: &[u32], cache: &mut SlotCache, slot: i64) {
        self.pool.read(chain, cache, slot);
    }

    /// Stores the full blocks of `tokens[..valid]` that namespace `ns` has not cached yet,
    /// copying their keys and values out of `slot` (which must hold them at positions
    /// `0..valid`). Stops early when the budget is full of blocks this very chain needs.
    pub fn store(
        &mut self,
        ns: u16,
        tokens: &[u32],
        valid: usize,
        cache: &mut SlotCache,
        slot: i64,
    ) {
        let claimed = self.index.claim(ns, tokens, valid);
        if claimed.ids.is_empty() {
            return;
        }
        self.pool.ensure(self.index.capacity());
        self.pool.write(&claimed.ids, claimed.first, cache, slot);
    }
}
