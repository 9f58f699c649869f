//! The engine's admission policy, pure: which waiting requests start this step and how.
//! [`plan_step`] reads the queue front to back and decides for each request, within the free
//! decode slots and the step's token budget (`max_num_batched_tokens`, less what a chunked
//! prefill under way already took):
//! - a request whose client is gone is dropped;
//! - a request with the very same prompt as one admitted this step follows it (one prefill for
//!   both, its samples take slots but no budget);
//! - a request whose uncached prompt fits the budget is prefilled this step;
//! - one too long for any step is prefilled in chunks in the staging slot, one at a time.
//!
//! The queue is served first come, first served: the first request that cannot start stops the
//! step (no smaller request overtakes it), so a long prompt is never starved by short ones.
//! The prefix cache is consulted through `lookup` (its chain of cached blocks for a prompt in
//! the weights the request runs with: the base model or one of its adapters), and nothing else is touched:
//! no tensors, no model. The worker carries the plan out. Requests for different adapters are
//! admitted in the same order and share steps: an adapter never waits for another.

/// A waiting request as the scheduler sees it.
pub trait Queued {
    /// The prompt's token ids.
    fn prompt(&self) -> &[u32];
    /// Samples asked for: each takes a decode slot.
    fn samples(&self) -> usize;
    /// Whether its client is gone.
    fn abandoned(&self) -> bool;
    /// The weights it runs with: 0 the base model, else the id of an adapter the engine serves.
    /// Only requests of the same weights share a prefill or cached blocks.
    fn weights(&self) -> u32;
}

/// What one step may still take on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// Decode slots in all (`max_batch_size`).
    pub slots: usize,
    /// Slots taken by running sequences and a chunked prefill under way.
    pub used: usize,
    /// Prompt tokens this step may still compute.
    pub budget: usize,
    /// A chunked prefill is under way (only one at a time).
    pub chunking: bool,
    /// Tokens per prefix-cache block.
    pub block_size: usize,
}

/// The scheduler's decision for one waiting request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// Its client is gone: dropped, counted as aborted.
    Dropped,
    /// The same prompt as the `leader`-th prefill of this step: it shares that prefill.
    Follows {
        /// Index among this step's [`Admission::Prefill`]s.
        leader: usize,
    },
    /// Prefilled this step: its first `cached` tokens come from the prefix-cache blocks
    /// `chain`, the rest is computed.
    Prefill {
        /// Prefix-cache blocks holding its cached prefix.
        chain: Vec<u32>,
        /// Prompt tokens those blocks hold.
        cached: usize,
    },
    /// Too long for this step's budget: prefilled chunk by chunk in the staging slot.
    Chunked {
        /// Prefix-cache blocks holding its cached prefix.
        chain: Vec<u32>,
        /// Prompt tokens those blocks hold.
        cached: usize,
    },
}

/// One step's admissions: decisions for the first `admissions.len()` waiting requests, in
/// queue order; the rest wait.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepPlan {
    /// A decision per request taken off the front of the queue.
    pub admissions: Vec<Admission>,
    /// Prompt tokens the step's prefills compute.
    pub computed: usize,
}

/// Plans one step's admissions from `waiting` (front first) within `cap`; `lookup(weights,
/// prompt, limit)` gives the prefix cache's blocks computed by `weights` for the first `limit`
/// tokens of `prompt` (the last prompt token is always computed: its logits start the
/// generation).
pub fn plan_step<'a, Q: Queued + 'a>(
    waiting: impl IntoIterator<Item = &'a Q>,
    cap: Capacity,
    mut lookup: impl FnMut(u32, &[u32], usize) -> Vec<u32>,
) -> StepPlan {
    let mut plan = StepPlan::default();
    let (mut used, mut budget, mut chunking) = (cap.used, cap.budget, cap.chunking);
    // Prompts prefilled this step, and their index among the prefills.
    let mut leaders: Vec<(u32, &[u32])> = Vec::new();
    for q in waiting {
        if q.abandoned() {
            plan.admissions.push(Admission::Dropped);
            continue;
        }
        if used + q.samples() > cap.slots {
            break;
        }
        if let Some(leader) = leaders
            .iter()
            .position(|&(ns, p)| ns == q.weights() && p == q.prompt())
        {
            used += q.samples();
            plan.admissions.push(Admission::Follows { leader });
            continue;
        }
        if budget == 0 {
            break;
        }
        let prompt = q.prompt();
        let chain = lookup(q.weights(), prompt, prompt.len().saturating_sub(1));
        let cached = chain.len() * cap.block_size;
        let rest = prompt.len() - cached;
        if rest > budget {
            if chunking {
                break;
            }
            chunking = true;
            used += q.samples();
            plan.admissions.push(Admission::Chunked { chain, cached });
            continue;
        }
        budget -= rest;
        used += q.samples();
        plan.computed += rest;
        leaders.push((q.weights(), prompt));
        plan.admissions.push(Admission::Prefill { chain, cached });
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Req {
        prompt: Vec<u32>,
        n: usize,
        gone: bool,
        ns: u32,
    }

    impl Queued for Req {
        fn prompt(&self) -> &[u32] {
            &self.prompt
        }
        fn samples(&self) -> usize {
            self.n
        }
        fn abandoned(&self) -> bool {
            self.gone
        }
        fn weights(&self) -> u32 {
            self.ns
        }
    }

    fn req(len: usize, first: u32, n: usize) -> Req {
        Req {
            prompt: (first..first + len as u32).collect(),
            n,
            gone: false,
            ns: 0,
        }
    }

    fn cap(slots: usize, used: usize, budget: usize) -> Capacity {
        Capacity {
            slots,
            used,
            budget,
            chunking: false,
            block_size: 4,
        }
    }

    /// No prefix cache: nothing cached.
    fn cold(_: u32, _: &[u32], _: usize) -> Vec<u32> {
        Vec::new()
    }

    fn prefill(cached: usize) -> Admission {
        Admission::Prefill {
            chain: vec![0; cached / 4],
            cached,
        }
    }

    #[test]
    fn prefills_fill_the_token_budget_in_queue_order() {
        let q = [req(10, 0, 1), req(10, 100, 1), req(10, 200, 1)];
        let plan = plan_step(&q, cap(8, 0, 25), cold);
        // 10 + 10 fit; the third (10 more than the 5 left) is chunked.
        assert_eq!(
            plan.admissions,
            vec![
                prefill(0),
                prefill(0),
                Admission::Chunked {
                    chain: vec![],
                    cached: 0
                }
            ]
        );
        assert_eq!(plan.computed, 20);
        // With a chunked prefill under way, it waits instead.
        let mut c = cap(8, 0, 25);
        c.chunking = true;
        let plan = plan_step(&q, c, cold);
        assert_eq!(plan.admissions, vec![prefill(0), prefill(0)]);
    }

    #[test]
    fn slots_bound_samples_and_the_queue_is_first_come_first_served() {
        // Two slots left: a request for 3 samples blocks the queue; the 1-sample request behind
        // it does not overtake it.
        let q = [req(4, 0, 3), req(4, 100, 1)];
        let plan = plan_step(&q, cap(8, 6, 100), cold);
        assert!(plan.admissions.is_empty());
        // Once slots free up, both start, in order.
        let plan = plan_step(&q, cap(8, 4, 100), cold);
        assert_eq!(plan.admissions, vec![prefill(0), prefill(0)]);
        // An exhausted budget stops the step too.
        let plan = plan_step(&q, cap(8, 0, 0), cold);
        assert!(plan.admissions.is_empty());
    }

    #[test]
    fn identical_prompts_fold_into_one_prefill() {
        let q = [req(6, 0, 2), req(6, 100, 1), req(6, 0, 3)];
        let plan = plan_step(&q, cap(8, 0, 12), cold);
        assert_eq!(
            plan.admissions,
            vec![prefill(0), prefill(0), Admission::Follows { leader: 0 }]
        );
        // The follower costs no budget, only its slots.
        assert_eq!(plan.computed, 12);
        // Without the slots it waits.
        let plan = plan_step(&q, cap(7, 2, 12), cold);
        assert_eq!(plan.admissions, vec![prefill(0), prefill(0)]);
    }

    /// Requests for different adapters never fold into one prefill, and each looks up its
    /// own weights.
    #[test]
    fn identical_prompts_of_different_adapters_prefill_apart() {
        let mut other = req(6, 0, 1);
        other.ns = 3;
        let q = [req(6, 0, 1), other, req(6, 0, 1)];
        let mut asked = Vec::new();
        let plan = plan_step(&q, cap(8, 0, 100), |ns: u32, _: &[u32], _| {
            asked.push(ns);
            Vec::new()
        });
        assert_eq!(
            plan.admissions,
            vec![prefill(0), prefill(0), Admission::Follows { leader: 0 }]
        );
        assert_eq!((plan.computed, asked), (12, vec![0, 3]));
    }

    #[test]
    fn cached_prefixes_cost_no_budget_and_the_last_token_is_computed() {
        // The cache holds whole blocks of 4 of whatever is asked, up to `limit`.
        let mut asked = Vec::new();
        let lookup = |_: u32, p: &[u32], limit: usize| {
            asked.push((p.len(), limit));
            vec![7; limit / 4]
        };
        let q = [req(9, 0, 1), req(8, 50, 1)];
        let plan = plan_step(&q, cap(8, 0, 2), lookup);
        // 9 tokens: 8 cached, 1 computed; 8 tokens: limit 7, so 4 cached, 4 to compute (> 1
        // left): chunked.
        assert_eq!(
            plan.admissions,
            vec![
                Admission::Prefill {
                    chain: vec![7, 7],
                    cached: 8
                },
                Admission::Chunked {
                    chain: vec![7],
                    cached: 4
                }
            ]
        );
        assert_eq!(plan.computed, 1);
        assert_eq!(asked, vec![(9, 8), (8, 7)]);
    }

    #[test]
    fn abandoned_requests_are_dropped_without_taking_anything() {
        let mut gone = req(50, 0, 8);
        gone.gone = true;
        let q = [gone, req(4, 100, 1)];
        let plan = plan_step(&q, cap(1, 0, 4), cold);
        assert_eq!(plan.admissions, vec![Admission::Dropped, prefill(0)]);
    }
}
