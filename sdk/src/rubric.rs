//! Building a rubric: named metrics with weights. The host computes the reward as the weighted
//! sum of the metric values a plugin returns.

use crate::types::{Metric, MetricWeight};

/// A rubric under construction.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rubric {
    weights: Vec<MetricWeight>,
}

impl Rubric {
    /// An empty rubric.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a metric with a weight (0 = reported, not rewarded).
    ///
    /// # Panics
    /// On a duplicate name or a non-finite weight: both are authoring mistakes.
    pub fn metric(mut self, name: &str, weight: f64) -> Self {
        assert!(
            weight.is_finite(),
            "rubric weight of {name:?} is not finite"
        );
        assert!(
            self.weights.iter().all(|w| w.name != name),
            "rubric metric {name:?} listed twice"
        );
        self.weights.push(MetricWeight {
            name: name.to_owned(),
            weight,
        });
        self
    }

    /// The finished list, for [`EnvInfo::rubric`](crate::types::EnvInfo::rubric).
    pub fn build(self) -> Vec<MetricWeight> {
        self.weights
    }
}

/// A metric value.
pub fn metric(name: &str, value: f64) -> Metric {
    Metric {
        name: name.to_owned(),
        value,
    }
}

/// 1.0 for true, 0.0 for false.
pub fn flag(name: &str, value: bool) -> Metric {
    metric(name, if value { 1.0 } else { 0.0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_in_order() {
        let r = Rubric::new()
            .metric("correct", 1.0)
            .metric("format", 0.0)
            .build();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].name, "correct");
        assert_eq!(r[1].weight, 0.0);
        assert_eq!(flag("x", true).value, 1.0);
    }

    #[test]
    #[should_panic(expected = "listed twice")]
    fn duplicate_metric_is_refused() {
        let _ = Rubric::new().metric("a", 1.0).metric("a", 2.0);
    }
}
