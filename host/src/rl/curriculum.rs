//! The pass-rate curriculum (`[orchestrator.curriculum]`): which examples of each training
//! environment a step draws from, by how each example's groups fared so far.
//!
//! An example whose groups were solved by every rollout the last `easy_streak` times it was
//! drawn leaves the pool (it teaches nothing more); an example drawn and never solved by any
//! rollout is drawn with weight `hard_weight` instead of 1 (it rarely teaches anything yet, but
//! may once the policy improves). Each step's groups are a seeded weighted draw without
//! replacement from its environment's pool ([`draw`]); when a pool runs dry, the whole split
//! again.
//!
//! The pool a step draws from must not depend on timing. Batches are generated up to
//! `async_level` steps ahead, so the batch of step `s` draws from the pool as it was after the
//! outcomes of steps before `s - async_level`: version `s - async_level` of [`Curriculum`]'s
//! history, which the run's loop extends in step order as it consumes batches. A checkpoint
//! after `n` steps keeps versions `n - async_level ..= n`, so a resumed run draws exactly what
//! the uninterrupted one would.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use super::config::CurriculumConfig;
use super::orchestrator::mixture;
use crate::rollout::RolloutRecord;

/// What the curriculum knows of one environment's examples (by index in its split).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EnvPool {
    /// Times in a row the example's group was solved by every rollout (reset by a group that
    /// was not).
    pub streak: Vec<u32>,
    /// Times the example was drawn (groups with an outcome).
    pub drawn: Vec<u32>,
    /// Whether any rollout ever solved it.
    pub solved: Vec<bool>,
}

/// The curriculum's state over every training environment: one version of the history.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Pool {
    /// By environment, in `[[orchestrator.env]]` order.
    pub envs: Vec<EnvPool>,
}

impl Pool {
    /// A pool where nothing has been drawn, for environments of `sizes` examples.
    pub fn new(sizes: &[usize]) -> Self {
        Self {
            envs: sizes
                .iter()
                .map(|&n| EnvPool {
                    streak: vec![0; n],
                    drawn: vec![0; n],
                    solved: vec![false; n],
                })
                .collect(),
        }
    }

    /// The weight example `i` of environment `e` is drawn with: 0 once retired, `hard_weight`
    /// when drawn and never solved, else 1.
    pub fn weight(&self, cfg: &CurriculumConfig, e: usize, i: usize) -> f64 {
        let p = &self.envs[e];
        if p.streak[i] as usize >= cfg.easy_streak {
            0.0
        } else if p.drawn[i] > 0 && !p.solved[i] {
            cfg.hard_weight
        } else {
            1.0
        }
    }

    /// Environment `e`'s counts: examples in the pool, retired (easy), down-weighted (hard).
    pub fn counts(&self, cfg: &CurriculumConfig, e: usize) -> (usize, usize, usize) {
        let n = self.envs[e].streak.len();
        let (mut retired, mut hard) = (0, 0);
        for i in 0..n {
            let w = self.weight(cfg, e, i);
            if w == 0.0 {
                retired += 1;
            } else if self.envs[e].drawn[i] > 0 && !self.envs[e].solved[i] {
                hard += 1;
            }
        }
        (n - retired, retired, hard)
    }

    /// The pool after a step whose groups were `groups` (`(environment, example)`), with
    /// `records` their rollouts (`example_index` = the group). Each example the step drew, once
    /// however many of its groups it had, with at least one rollout that did not fail counts as
    /// drawn and, when any rollout solved it ([`crate::eval::correct`]), as solved; its streak
    /// grows when two or more rollouts did not fail and every one solved it, and restarts when
    /// one did not.
    pub fn after(&self, groups: &[(usize, usize)], records: &[RolloutRecord]) -> Self {
        let mut next = self.clone();
        let mut outcome: BTreeMap<(usize, usize), (usize, usize)> = BTreeMap::new();
        for r in records.iter().filter(|r| r.error.is_none()) {
            let Some(&key) = groups.get(r.example_index) else {
                continue;
            };
            let o = outcome.entry(key).or_default();
            o.0 += 1;
            o.1 += usize::from(crate::eval::correct(r));
        }
        for ((e, i), (n, won)) in outcome {
            let p = &mut next.envs[e];
            p.drawn[i] += 1;
            p.solved[i] |= won > 0;
            if won < n {
                p.streak[i] = 0;
            } else if n >= 2 {
                p.streak[i] += 1;
            }
        }
        next
    }
}

/// `(environment, example)` of each of the `problems` groups of `step`: environments by the
/// mixture's `weights` ([`mixture`]), then within each a seeded weighted draw without
/// replacement from its pool (Efraimidis–Spirakis keys `u^(1/w)`); when the pool has fewer
/// examples than the step wants, the rest come uniformly from the whole split.
pub fn draw(
    weights: &[f64],
    pool: &Pool,
    cfg: &CurriculumConfig,
    problems: usize,
    seed: u64,
    step: usize,
) -> Vec<(usize, usize)> {
    let envs = mixture(weights, problems, seed, step);
    let mut rng = crate::engine::Rng::new(
        seed ^ 0x6375_7272 ^ (step as u64).wrapping_mul(0x94d0_49bb_1331_11eb),
    );
    let mut picked: Vec<Vec<usize>> = vec![Vec::new(); weights.len()];
    for (e, picks) in picked.iter_mut().enumerate() {
        let want = envs.iter().filter(|&&x| x == e).count();
        if want == 0 {
            continue;
        }
        let n = pool.envs[e].streak.len();
        let mut keyed: Vec<(f64, usize)> = (0..n)
            .filter_map(|i| {
                let w = pool.weight(cfg, e, i);
                (w > 0.0).then(|| (rng.uniform().max(f64::MIN_POSITIVE).powf(1.0 / w), i))
            })
            .collect();
        keyed.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        picks.extend(keyed.iter().take(want).map(|&(_, i)| i));
        while picks.len() < want {
            picks.push(rng.below(n));
        }
    }
    let mut next = vec![0usize; weights.len()];
    envs.into_iter()
        .map(|e| {
            let i = picked[e][next[e]];
            next[e] += 1;
            (e, i)
        })
        .collect()
}

/// The curriculum's history: version `v` is the pool after the outcomes of steps `0..v`.
pub struct Curriculum {
    /// Its settings.
    pub cfg: CurriculumConfig,
    async_level: usize,
    versions: Mutex<BTreeMap<usize, Arc<Pool>>>,
    /// The newest version, for the producer to wait on.
    newest: tokio::sync::watch::Sender<usize>,
}

/// What a checkpoint keeps of the curriculum.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Saved {
    /// Versions by number.
    pub versions: BTreeMap<usize, Pool>,
}

impl Curriculum {
    /// A curriculum over environments of `sizes` examples, or the one `saved` at a checkpoint
    /// after `start` steps (which must hold version `start` and those the steps generated ahead
    /// draw from).
    pub fn new(
        cfg: CurriculumConfig,
        async_level: usize,
        sizes: &[usize],
        start: usize,
        saved: Option<Saved>,
    ) -> anyhow::Result<Self> {
        let versions: BTreeMap<usize, Arc<Pool>> = match saved {
            None if start == 0 => [(0, Arc::new(Pool::new(sizes)))].into(),
            None => anyhow::bail!(
                "the checkpoint at step {start} has no curriculum state (the run was started \
                 without orchestrator.curriculum): resume it without, or start afresh"
            ),
            Some(s) => s
                .versions
                .into_iter()
                .map(|(v, p)| (v, Arc::new(p)))
                .collect(),
        };
        for v in start.saturating_sub(async_level)..=start {
            let pool = versions.get(&v).ok_or_else(|| {
                anyhow::anyhow!("the checkpoint's curriculum state lacks version {v}")
            })?;
            let got: Vec<usize> = pool.envs.iter().map(|p| p.streak.len()).collect();
            anyhow::ensure!(
                got == sizes,
                "the checkpoint's curriculum covers splits of {got:?} examples, the run's have \
                 {sizes:?}: the environments changed since"
            );
        }
        Ok(Self {
            cfg,
            async_level,
            versions: Mutex::new(versions),
            newest: tokio::sync::watch::channel(start).0,
        })
    }

    /// The pool the batch of `step` draws from (version `step - async_level`), once it exists.
    pub async fn pool_for(&self, step: usize) -> Arc<Pool> {
        let v = step.saturating_sub(self.async_level);
        let mut rx = self.newest.subscribe();
        loop {
            if let Some(p) = self.versions.lock().expect("curriculum lock").get(&v) {
                return p.clone();
            }
            if rx.changed().await.is_err() {
                // The sender lives as long as `self`: unreachable while borrowed.
                continue;
            }
        }
    }

    /// Records the outcome of `step` (its groups and rollouts): version `step + 1`. Versions no
    /// batch will draw from again are dropped.
    pub fn record(&self, step: usize, groups: &[(usize, usize)], records: &[RolloutRecord]) {
        let mut versions = self.versions.lock().expect("curriculum lock");
        let Some(base) = versions.get(&step).cloned() else {
            tracing::warn!("curriculum: no version {step} to record step {step} on");
            return;
        };
        versions.insert(step + 1, Arc::new(base.after(groups, records)));
        let keep_from = (step + 1).saturating_sub(self.async_level);
        versions.retain(|&v, _| v >= keep_from);
        drop(versions);
        self.newest.send_replace(step + 1);
    }

    /// Environment `e`'s counts in the newest version ([`Pool::counts`]).
    pub fn counts(&self, e: usize) -> (usize, usize, usize) {
        let versions = self.versions.lock().expect("curriculum lock");
        let (_, pool) = versions.iter().next_back().expect("a version");
        pool.counts(&self.cfg, e)
    }

    /// What a checkpoint after `steps` steps keeps: versions `steps - async_level ..= steps`.
    pub fn save(&self, steps: usize) -> Saved {
        let versions = self.versions.lock().expect("curriculum lock");
        Saved {
            versions: versions
                .range(steps.saturating_sub(self.async_level)..=steps)
                .map(|(&v, p)| (v, (**p).clone()))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> CurriculumConfig {
        CurriculumConfig {
            easy_streak: 2,
            hard_weight: 0.25,
        }
    }

    fn rollout(group: usize, correct: bool) -> RolloutRecord {
        let mut r = RolloutRecord {
            example_index: group,
            ..Default::default()
        };
        r.metrics
            .insert("correct".into(), f64::from(u8::from(correct)));
        r
    }

    /// Solved by all twice in a row: retired. Never solved: down-weighted. A mixed group resets
    /// the streak; a failed rollout does not count; a group of failures is not drawn.
    #[test]
    fn outcomes_retire_easy_examples_and_down_weight_hard_ones() {
        let c = cfg();
        let mut p = Pool::new(&[4]);
        let groups = [(0, 0), (0, 1), (0, 2), (0, 3)];
        let mut failed = rollout(3, true);
        failed.error = Some("server".into());
        let step = vec![
            rollout(0, true),
            rollout(0, true),
            rollout(1, false),
            rollout(1, false),
            rollout(2, true),
            rollout(2, false),
            failed,
        ];
        p = p.after(&groups, &step);
        assert_eq!(p.envs[0].drawn, [1, 1, 1, 0]);
        assert_eq!(p.envs[0].streak, [1, 0, 0, 0]);
        assert_eq!(
            (0..4).map(|i| p.weight(&c, 0, i)).collect::<Vec<_>>(),
            [1.0, 0.25, 1.0, 1.0]
        );
        p = p.after(&groups[..1], &step[..2]);
        assert_eq!(p.weight(&c, 0, 0), 0.0, "solved by all twice in a row");
        assert_eq!(p.counts(&c, 0), (3, 1, 1));
        // One rollout left is too little evidence to grow a streak; two groups of one example
        // in a step count once.
        let q = p.after(&[(0, 2)], &[rollout(0, true)]);
        assert_eq!((q.envs[0].streak[2], q.envs[0].drawn[2]), (0, 2));
        let q = q.after(
            &[(0, 2), (0, 2)],
            &[
                rollout(0, true),
                rollout(0, true),
                rollout(1, true),
                rollout(1, true),
            ],
        );
        assert_eq!((q.envs[0].streak[2], q.envs[0].drawn[2]), (1, 3));
        // A later miss would reset an unretired streak.
        let q = p.after(&[(0, 2)], &[rollout(0, true), rollout(0, true)]);
        assert_eq!(q.envs[0].streak[2], 1);
        let q = q.after(&[(0, 2)], &[rollout(0, true), rollout(0, false)]);
        assert_eq!(q.envs[0].streak[2], 0);
    }

    /// Draws are seeded, without replacement within a step, never from retired examples while
    /// the pool has enough, favour full-weight examples over down-weighted ones, and fall back
    /// to the whole split when the pool runs dry.
    #[test]
    fn draws_follow_the_pool() {
        let c = cfg();
        let mut p = Pool::new(&[10]);
        // 0..3 retired; 3..6 hard.
        for i in 0..3 {
            p.envs[0].streak[i] = 2;
            p.envs[0].drawn[i] = 2;
            p.envs[0].solved[i] = true;
        }
        for i in 3..6 {
            p.envs[0].drawn[i] = 1;
        }
        let a = draw(&[1.0], &p, &c, 5, 7, 3);
        assert_eq!(a, draw(&[1.0], &p, &c, 5, 7, 3));
        let mut idx: Vec<usize> = a.iter().map(|&(_, i)| i).collect();
        idx.sort_unstable();
        idx.dedup();
        assert_eq!(idx.len(), 5, "without replacement: {a:?}");
        assert!(idx.iter().all(|&i| i >= 3), "{a:?}");
        let (mut easy, mut hard) = (0, 0);
        for step in 0..400 {
            for (_, i) in draw(&[1.0], &p, &c, 1, 7, step) {
                assert!(i >= 3);
                if i < 6 {
                    hard += 1;
                } else {
                    easy += 1;
                }
            }
        }
        // Weights 4 × 1 against 3 × 0.25: about 84% of single draws are full-weight examples.
        assert!(easy > 4 * hard, "{easy} full-weight, {hard} hard");
        // Every example retired: the whole split again.
        for i in 0..10 {
            p.envs[0].streak[i] = 2;
        }
        assert_eq!(draw(&[1.0], &p, &c, 3, 7, 0).len(), 3);
    }

    /// Versions: a step draws from version `step - async_level`; a save after n steps keeps
    /// what the steps generated ahead need, and a curriculum restored from it draws and records
    /// exactly as the original.
    #[test]
    fn versions_survive_a_checkpoint() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let c = Curriculum::new(cfg(), 1, &[6], 0, None).unwrap();
        let groups = [(0, 1), (0, 4)];
        let outcome = [rollout(0, true), rollout(0, true), rollout(1, false)];
        for step in 0..3 {
            c.record(step, &groups, &outcome);
        }
        let v2 = rt.block_on(c.pool_for(3));
        assert_eq!(v2.envs[0].drawn[1], 2, "version 2: two steps recorded");
        let saved = c.save(3);
        assert_eq!(saved.versions.keys().copied().collect::<Vec<_>>(), [2, 3]);
        let json = serde_json::to_string(&saved).unwrap();
        let back =
            Curriculum::new(cfg(), 1, &[6], 3, serde_json::from_str(&json).unwrap()).unwrap();
        assert_eq!(*rt.block_on(back.pool_for(3)), *v2);
        assert_eq!(*rt.block_on(back.pool_for(4)), *rt.block_on(c.pool_for(4)));
        back.record(3, &groups, &outcome);
        c.record(3, &groups, &outcome);
        assert_eq!(*rt.block_on(back.pool_for(5)), *rt.block_on(c.pool_for(5)));
        // The wrong sizes, or no state at a later step, are refused.
        let err = Curriculum::new(cfg(), 1, &[7], 3, serde_json::from_str(&json).unwrap())
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("changed"), "{err}");
        assert!(Curriculum::new(cfg(), 1, &[6], 3, None).is_err());
    }
}
