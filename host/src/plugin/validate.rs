//! Checks on what plugins return, shared by every backend: a plugin's output is untrusted input
//! to the rest of the host.

use std::collections::HashSet;

use rlhost_sdk::types::{EnvInfo, Metric, RewardInfo};

use super::{PluginError, PluginErrorKind, PluginId};

/// Passes `value` through `check`, turning a complaint into an "invalid return" error of `call`.
pub fn checked<T>(
    id: &PluginId,
    call: &'static str,
    value: T,
    check: impl FnOnce(&T) -> Result<(), String>,
) -> Result<T, PluginError> {
    check(&value).map_err(|message| PluginErrorKind::InvalidReturn { call, message }.of(id))?;
    Ok(value)
}

/// An environment's self-description makes sense.
pub fn env_info(info: &EnvInfo) -> Result<(), String> {
    if info.name.trim().is_empty() {
        return Err("empty name".into());
    }
    if info.max_turns == 0 {
        return Err("max_turns is 0".into());
    }
    let mut seen = HashSet::new();
    for m in &info.rubric {
        if !seen.insert(m.name.as_str()) {
            return Err(format!("rubric lists {:?} twice", m.name));
        }
        if !m.weight.is_finite() {
            return Err(format!("rubric weight of {:?} is {}", m.name, m.weight));
        }
    }
    for tool in &info.tools {
        serde_json::from_str::<serde_json::Value>(&tool.parameters).map_err(|e| {
            format!(
                "tool {:?} has a parameters schema that is not JSON: {e}",
                tool.name
            )
        })?;
    }
    Ok(())
}

/// A reward function's self-description makes sense.
pub fn reward_info(info: &RewardInfo) -> Result<(), String> {
    if info.name.trim().is_empty() {
        return Err("empty name".into());
    }
    Ok(())
}

/// Metric values are named, unique and finite.
pub fn metrics(metrics: &[Metric]) -> Result<(), String> {
    let mut seen = HashSet::new();
    for m in metrics {
        if m.name.is_empty() {
            return Err("a metric has an empty name".into());
        }
        if !seen.insert(m.name.as_str()) {
            return Err(format!("metric {:?} returned twice", m.name));
        }
        if !m.value.is_finite() {
            return Err(format!("metric {:?} is {}", m.name, m.value));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(name: &str, value: f64) -> Metric {
        Metric {
            name: name.into(),
            value,
        }
    }

    #[test]
    fn metrics_must_be_unique_and_finite() {
        assert!(metrics(&[m("a", 1.0), m("b", 0.0)]).is_ok());
        assert!(
            metrics(&[m("a", 1.0), m("a", 0.0)])
                .unwrap_err()
                .contains("twice")
        );
        assert!(metrics(&[m("a", f64::NAN)]).unwrap_err().contains("NaN"));
        assert!(metrics(&[m("", 1.0)]).is_err());
    }
}
