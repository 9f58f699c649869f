//! The prefix cache's block index: which token blocks are cached, under which parent, in which
//! pool slot, and which to evict. Pure bookkeeping, no tensors: [`super::pool`] holds the keys and
//! values, at the block ids this index hands out. It must never return a chain with a gap, nor
//! evict a block another block continues.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeSet, HashMap};
use std::hash::{Hash, Hasher};

/// No parent: the block starts at position 0 (a free block's parent).
const ROOT: u32 = u32::MAX;

/// The parent of a first block in namespace `ns`: keys computed by different weights (an
/// engine's adapters) live in different namespaces, so equal tokens never share a block
/// across them. Namespace 0 (the base model) has [`ROOT`].
fn root(ns: u16) -> u32 {
    ROOT - u32::from(ns)
}

/// Whether `parent` is a namespace's root rather than a block (block ids stay far below).
fn is_root(parent: u32) -> bool {
    parent >= ROOT - u32::from(u16::MAX)
}

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

/// Blocks a store claimed: pool ids for the full blocks not cached yet, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    /// Index of the first new block among the prompt's full blocks.
    pub first: usize,
    /// Their pool ids.
    pub ids: Vec<u32>,
}

/// The block tree with its free list, hash index and least-recently-used leaves.
pub struct BlockIndex {
    block: usize,
    max_blocks: usize,
    blocks: Vec<Block>,
    free: Vec<u32>,
    /// Hash of (parent, tokens) → blocks with that hash (collisions are told apart by tokens).
    index: HashMap<u64, Vec<u32>>,
    /// Evictable blocks (no children), oldest first.
    leaves: BTreeSet<(u64, u32)>,
    tick: u64,
    evicted: u64,
}

fn key_hash(parent: u32, tokens: &[u32]) -> u64 {
    let mut h = DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

impl BlockIndex {
    /// An empty index of blocks of `block` tokens, at most `max_blocks` of them.
    pub fn new(block: usize, max_blocks: usize) -> Self {
        Self {
            block: block.max(1),
            max_blocks,
            blocks: Vec::new(),
            free: Vec::new(),
            index: HashMap::new(),
            leaves: BTreeSet::new(),
            tick: 0,
            evicted: 0,
        }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block
    }

    /// Most blocks the budget allows.
    pub fn max_blocks(&self) -> usize {
        self.max_blocks
    }

    /// Block ids handed out so far (the pool must hold this many).
    pub fn capacity(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks holding a prefix now.
    pub fn used(&self) -> usize {
        self.blocks.len() - self.free.len()
    }

    /// Blocks evicted to make room, since the start.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// Forgets every entry; the ids stay allocated for reuse.
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

    /// Forgets every entry and every id (the pool's memory is freed with it): the next claims
    /// start from id 0 and the pool grows again.
    pub fn release(&mut self) {
        self.clear();
        self.blocks.clear();
        self.free.clear();
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

    /// The longest chain of cached blocks of namespace `ns` that `tokens[..limit]` starts
    /// with (marked as just used).
    pub fn lookup(&mut self, ns: u16, tokens: &[u32], limit: usize) -> Vec<u32> {
        self.tick += 1;
        let mut chain = Vec::new();
        let mut parent = root(ns);
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

    /// Enters the full blocks of `tokens[..valid]` that are not cached yet in namespace `ns`,
    /// returning their ids for the pool to fill. Stops early when the budget is full of blocks
    /// this very chain needs.
    pub fn claim(&mut self, ns: u16, tokens: &[u32], valid: usize) -> Claimed {
        let none = Claimed {
            first: 0,
            ids: Vec::new(),
        };
        if self.max_blocks == 0 {
            return none;
        }
        self.tick += 1;
        let pieces: Vec<&[u32]> = tokens[..valid.min(tokens.len())]
            .chunks_exact(self.block)
            .collect();
        let mut parent = root(ns);
        let mut claimed = none;
        for (i, piece) in pieces.iter().enumerate() {
            if claimed.ids.is_empty()
                && let Some(id) = self.find(parent, piece)
            {
                self.touch(id);
                parent = id;
                continue;
            }
            let Some(id) = self.allocate(parent) else {
                break;
            };
            if claimed.ids.is_empty() {
                claimed.first = i;
            }
            self.link(id, parent, piece);
            claimed.ids.push(id);
            parent = id;
        }
        claimed
    }

    /// Enters block `id` into the tree under `parent`.
    fn link(&mut self, id: u32, parent: u32, tokens: &[u32]) {
        let hash = key_hash(parent, tokens);
        if !is_root(parent) {
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

    /// A free block: from the free list, by growing (doubling, at least 16 ids, at most the
    /// budget), or by evicting the least recently used leaf. `None` when the only candidate is
    /// `keep` (the chain being extended) or newer.
    fn allocate(&mut self, keep: u32) -> Option<u32> {
        if let Some(id) = self.free.pop() {
            return Some(id);
        }
        if self.blocks.len() < self.max_blocks {
            let old = self.blocks.len();
            let new = (old * 2).max(16).min(self.max_blocks);
            self.blocks.extend((old..new).map(|_| Block {
                tokens: Vec::new(),
                parent: ROOT,
                children: 0,
                last_used: 0,
                hash: 0,
            }));
            // Lowest ids first out of the free list.
            self.free.extend((old as u32..new as u32).rev());
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
        if !is_root(parent) {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(xs: &[u32]) -> Vec<u32> {
        xs.to_vec()
    }

    /// A stored prefix is found whole; a prompt that differs inside a block shares only the
    /// blocks before it; partial blocks are neither stored nor matched.
    #[test]
    fn lookups_return_the_longest_whole_block_chain() {
        let mut ix = BlockIndex::new(2, 100);
        let c = ix.claim(0, &toks(&[1, 2, 3, 4, 5]), 5);
        assert_eq!((c.first, c.ids.len()), (0, 2));
        assert_eq!(ix.lookup(0, &[1, 2, 3, 4, 5, 6], 6), c.ids);
        assert_eq!(ix.lookup(0, &[1, 2, 3, 9], 4), c.ids[..1]);
        assert_eq!(ix.lookup(0, &[7, 2, 3, 4], 4), Vec::<u32>::new());
        // `limit` caps the match (the engine keeps at least one token to prefill).
        assert_eq!(ix.lookup(0, &[1, 2, 3, 4], 3), c.ids[..1]);
        // A second store of the same prefix claims only what is new.
        let more = ix.claim(0, &toks(&[1, 2, 3, 4, 5, 6]), 6);
        assert_eq!((more.first, more.ids.len()), (2, 1));
        assert_eq!(ix.used(), 3);
    }

    /// The same tokens in different namespaces (adapters) are different blocks.
    #[test]
    fn namespaces_never_share_blocks() {
        let mut ix = BlockIndex::new(2, 8);
        let base = ix.claim(0, &toks(&[1, 2, 3, 4]), 4);
        assert!(ix.lookup(7, &[1, 2, 3, 4], 4).is_empty());
        let other = ix.claim(7, &toks(&[1, 2, 3, 4]), 4);
        assert_eq!((other.first, other.ids.len()), (0, 2));
        assert!(other.ids.iter().all(|id| !base.ids.contains(id)));
        assert_eq!(ix.lookup(7, &[1, 2, 3, 4], 4), other.ids);
        assert_eq!(ix.lookup(0, &[1, 2, 3, 4], 4), base.ids);
        assert_eq!(ix.lookup(u16::MAX, &[1, 2], 2), Vec::<u32>::new());
    }

    /// The same tokens under different parents are different blocks.
    #[test]
    fn a_block_is_its_whole_prefix() {
        let mut ix = BlockIndex::new(2, 100);
        let a = ix.claim(0, &toks(&[1, 2, 5, 6]), 4);
        let b = ix.claim(0, &toks(&[3, 4, 5, 6]), 4);
        assert_ne!(a.ids[1], b.ids[1]);
        assert_eq!(ix.lookup(0, &[3, 4, 5, 6], 4), b.ids);
    }

    /// At the budget, the least recently used leaf goes first; a block another continues is
    /// never evicted (chains stay whole from the root), nor one of the chain being stored.
    #[test]
    fn eviction_takes_the_least_recently_used_leaf() {
        let mut ix = BlockIndex::new(1, 3);
        let a = ix.claim(0, &toks(&[1, 2]), 2); // chain 1 → 2
        let b = ix.claim(0, &toks(&[3]), 1);
        assert_eq!(ix.used(), 3);
        ix.lookup(0, &[3], 1); // [3] is now newer than [1, 2]'s leaf
        let c = ix.claim(0, &toks(&[4]), 1);
        // The victim was block "2" (a leaf, oldest), not "1" (it had a child), not "3".
        assert_eq!(c.ids, vec![a.ids[1]]);
        assert_eq!(ix.evicted(), 1);
        assert_eq!(ix.lookup(0, &[1, 2], 2), a.ids[..1]);
        assert_eq!(ix.lookup(0, &[3], 1), b.ids);
        // "1" is a leaf again, but the two look-ups above used it and "3" after "4" was stored:
        // "4" is the least recently used now.
        let d = ix.claim(0, &toks(&[5]), 1);
        assert_eq!(d.ids, c.ids);
        assert!(ix.lookup(0, &[4], 1).is_empty());
        assert_eq!(ix.lookup(0, &[1], 1), a.ids[..1]);
    }

    /// A chain longer than the budget stores what fits and stops rather than evict itself.
    #[test]
    fn a_chain_never_evicts_its_own_blocks() {
        let mut ix = BlockIndex::new(1, 2);
        let c = ix.claim(0, &toks(&[1, 2, 3, 4]), 4);
        assert_eq!(c.ids.len(), 2);
        assert_eq!(ix.lookup(0, &[1, 2, 3, 4], 4), c.ids);
    }

    /// Clearing forgets every prefix but keeps the ids; the pool grows by doubling, at least 16
    /// blocks, never past the budget.
    #[test]
    fn clearing_keeps_capacity_and_growth_doubles_to_the_budget() {
        let mut ix = BlockIndex::new(1, 40);
        ix.claim(0, &toks(&[1]), 1);
        assert_eq!(ix.capacity(), 16);
        ix.claim(0, &(0..20).collect::<Vec<u32>>(), 20);
        assert_eq!(ix.capacity(), 32);
        ix.claim(0, &(100..130).collect::<Vec<u32>>(), 30);
        assert_eq!(ix.capacity(), 40);
        ix.clear();
        assert_eq!((ix.used(), ix.capacity()), (0, 40));
        assert!(ix.lookup(0, &[1], 1).is_empty());
        // A zero budget stores nothing.
        let mut none = BlockIndex::new(4, 0);
        assert!(none.claim(0, &toks(&[1, 2, 3, 4]), 4).ids.is_empty());
    }
}
