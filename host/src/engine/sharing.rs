//! Which rows of a decode step read a shared prefix's keys once ([`groups`]). Every running
//! sequence keeps its whole prompt in its own slot (a cached prefix is copied in, a request's
//! samples copy their prompt's slot), so rows that share a prompt prefix hold the same keys
//! there: the RL loop's rollouts of one problem share all of it, and every request of a run
//! shares its system prompt. Attention over those positions is the same product for all of
//! them; [`crate::model::Qwen3::forward_slots_sharing`] reads them once per group instead of
//! once per row, which is what decode at high concurrency over long shared prompts spends its
//! memory bandwidth on.
//!
//! Pure: rows in, groups out, tested without a model. Two rows' keys at a position are the same
//! only when their tokens up to it are, and the same weights computed them: the same adapter
//! and the same policy version of the prompt's keys (a weight update between two prefills
//! makes them differ). Only prompt positions are shared: generated ones may have been computed
//! after a weight update.

use crate::model::SharedPrefix;

/// What decides a running sequence's prompt keys.
#[derive(Debug, Clone, Copy)]
pub struct RowKeys<'a> {
    /// Its prompt's tokens.
    pub prompt: &'a [u32],
    /// The adapter it runs with (0: the base model).
    pub adapter: u32,
    /// The policy version whose weights computed its prompt's keys.
    pub version: u64,
}

/// Fewest positions a group shares.
pub const MIN_SHARED: usize = 32;

/// What a group costs over reading its rows' slots whole, in positions of one row: its own
/// matrix products and copies per layer (a handful of small ops). A group pays off when its rows
/// after the first read more than this many shared positions fewer.
const GROUP_COST: usize = 64;

/// The groups of `rows` that share prefix keys, each with the length they share: at least
/// [`MIN_SHARED`] positions, chosen to save the most positions read (a group of `r` rows sharing
/// `len` saves `(r - 1) · len`, less [`GROUP_COST`]), so a run's 32 rollouts sharing a system
/// prompt form one group, and two sets of rows with different system prompts two. Rows in no
/// group are left out (they read their own slots). Within a group, the first row is the one
/// whose slot is read.
pub fn groups(rows: &[RowKeys<'_>]) -> Vec<SharedPrefix> {
    if rows.len() < 2 {
        return Vec::new();
    }
    let mut order: Vec<usize> = (0..rows.len()).collect();
    order.sort_by(|&a, &b| {
        let (x, y) = (&rows[a], &rows[b]);
        (x.adapter, x.version, x.prompt).cmp(&(y.adapter, y.version, y.prompt))
    });
    // Shared positions of neighbours in that order; a sorted range shares its smallest.
    let lcp: Vec<usize> = order
        .windows(2)
        .map(|w| {
            let (x, y) = (&rows[w[0]], &rows[w[1]]);
            if (x.adapter, x.version) != (y.adapter, y.version) {
                return 0;
            }
            x.prompt
                .iter()
                .zip(y.prompt)
                .take_while(|(a, b)| a == b)
                .count()
        })
        .collect();
    let mut picked = Vec::new();
    best(&lcp, 0, rows.len() - 1, &mut picked);
    picked
        .into_iter()
        .map(|(a, b, len)| SharedPrefix {
            rows: order[a..=b].iter().map(|&r| r as i64).collect(),
            len: len as i64,
        })
        .collect()
}

/// The groups of sorted rows `a..=b` that save the most (pushed onto `out`), and what they save:
/// the whole range as one group at its smallest shared length, or the best of each side of
/// that weakest link.
fn best(lcp: &[usize], a: usize, b: usize, out: &mut Vec<(usize, usize, usize)>) -> usize {
    if a == b {
        return 0;
    }
    let (m, len) = (a..b)
        .map(|i| (i, lcp[i]))
        .min_by_key(|&(i, l)| (l, i))
        .expect("a range of two rows or more");
    let mark = out.len();
    let split = best(lcp, a, m, out) + best(lcp, m + 1, b, out);
    let whole = ((b - a) * len).saturating_sub(GROUP_COST);
    if len >= MIN_SHARED && whole >= split && whole > 0 {
        out.truncate(mark);
        out.push((a, b, len));
        whole
    } else {
        split
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prompt(parts: &[(u32, usize)]) -> Vec<u32> {
        parts
            .iter()
            .flat_map(|&(t, n)| std::iter::repeat_n(t, n))
            .collect()
    }

    fn keys(prompts: &[Vec<u32>]) -> Vec<RowKeys<'_>> {
        prompts
            .iter()
            .map(|p| RowKeys {
                prompt: p,
                adapter: 0,
                version: 0,
            })
            .collect()
    }

    fn sorted(mut g: Vec<SharedPrefix>) -> Vec<(Vec<i64>, i64)> {
        for s in &mut g {
            s.rows.sort();
        }
        let mut v: Vec<_> = g.into_iter().map(|s| (s.rows, s.len)).collect();
        v.sort();
        v
    }

    /// The RL loop's batch: a system prompt every row shares, then problems shared by groups
    /// of rows: one group of all, at the system prompt's length (reading it once beats reading
    /// it once per problem).
    #[test]
    fn a_shared_system_prompt_makes_one_group_of_every_row() {
        let prompts: Vec<Vec<u32>> = (0..32)
            .map(|i| prompt(&[(1, 1000), (10 + i / 8, 40), (99, i as usize % 3)]))
            .collect();
        let g = sorted(groups(&keys(&prompts)));
        assert_eq!(g, vec![((0..32).collect(), 1000)]);
    }

    /// Two clients with different system prompts: two groups; a row that shares nothing (or
    /// too little) is in none.
    #[test]
    fn different_prefixes_make_different_groups_and_loners_none() {
        let mut prompts: Vec<Vec<u32>> = (0..4).map(|i| prompt(&[(1, 400), (50 + i, 9)])).collect();
        prompts.extend((0..3).map(|i| prompt(&[(2, 300), (60 + i, 9)])));
        prompts.push(prompt(&[(3, 500)]));
        // Shares 20 tokens with the first four: under MIN_SHARED.
        prompts.push(prompt(&[(1, 20), (7, 300)]));
        let g = sorted(groups(&keys(&prompts)));
        assert_eq!(g, vec![(vec![0, 1, 2, 3], 400), (vec![4, 5, 6], 300)]);
    }

    /// Rows of the same prompt computed by other weights (another policy version or adapter)
    /// never share; a pair sharing a short prefix is not worth a group.
    #[test]
    fn other_weights_never_share_and_small_savings_are_skipped() {
        let p = prompt(&[(1, 500)]);
        let rows = [
            RowKeys {
                prompt: &p,
                adapter: 0,
                version: 0,
            },
            RowKeys {
                prompt: &p,
                adapter: 0,
                version: 1,
            },
            RowKeys {
                prompt: &p,
                adapter: 2,
                version: 1,
            },
        ];
        assert!(groups(&rows).is_empty());
        let short = [prompt(&[(1, 40), (2, 5)]), prompt(&[(1, 40), (3, 5)])];
        assert!(groups(&keys(&short)).is_empty(), "40 - 64 saves nothing");
        let three = [
            prompt(&[(1, 40), (2, 5)]),
            prompt(&[(1, 40), (3, 5)]),
            prompt(&[(1, 40), (4, 5)]),
        ];
        assert_eq!(sorted(groups(&keys(&three))), vec![(vec![0, 1, 2], 40)]);
    }

    /// When sub-groups share much more than the whole, they win: 2 × 8 rows each sharing
    /// 2,000 positions but only 100 between them.
    #[test]
    fn long_private_prefixes_split_the_group() {
        let prompts: Vec<Vec<u32>> = (0..16)
            .map(|i| prompt(&[(1, 100), (2 + i / 8, 2000), (30 + i, 1)]))
            .collect();
        let g = sorted(groups(&keys(&prompts)));
        assert_eq!(g, vec![((0..8).collect(), 2100), ((8..16).collect(), 2100)]);
    }
}
