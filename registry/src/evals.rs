//! Evaluations published to a registry: `host eval … --publish` uploads an environment's
//! `summary.json`, signed by the publisher's key over the environment's identity and the
//! summary's sha256 ([`crate::sign::eval_message`]). The registry checks the signature, that the
//! key is accepted for the publishing owner, that the environment version is published here and
//! that the run was not interrupted, then keeps the exact bytes, so anyone can verify them again.
//!
//! Stored as `evals/<owner>/<name>/<sha256>.json`, one [`StoredEval`] per file, written
//! atomically; the same bytes published twice are one evaluation.

use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

/// Largest summary accepted.
pub const MAX_EVAL_BYTES: usize = 256 << 10;
/// Evaluations one publisher may keep on one package.
pub const MAX_EVALS_PER_PUBLISHER: usize = 100;
/// Longest model name, split or metric name shown.
pub const MAX_NAME_CHARS: usize = 200;
/// Most metrics, and most Pass@k values, in a summary.
pub const MAX_FIGURES: usize = 64;
/// How far ahead of the registry's clock an evaluation's date may be. `host eval` stamps a
/// summary with its own clock when the run ends, so a date in the future is either a clock
/// running ahead or a date made up to sort first (pages list evaluations newest first) for
/// years. Ten minutes covers a machine whose clock is not kept by NTP (which holds clocks within
/// a second) drifting for weeks, and lets a made-up date lead the list for ten minutes at most.
pub const MAX_CLOCK_SKEW: Duration = Duration::from_secs(10 * 60);

/// The sampling an evaluation ran with.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EvalSampling {
    /// Sampling temperature (the server's default when absent).
    #[serde(default)]
    pub temperature: Option<f64>,
    /// Nucleus mass.
    #[serde(default)]
    pub top_p: Option<f64>,
    /// Most new tokens per turn.
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// Seed of sampling and environments.
    #[serde(default)]
    pub seed: Option<u64>,
}

/// What the registry reads of an evaluation summary (`host eval`'s `summary.json`; the rest of
/// the summary is kept, unread, in the stored bytes).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalSummary {
    /// The environment, `owner/name`.
    pub plugin: String,
    /// Its version.
    pub plugin_version: semver::Version,
    /// The model (and endpoint) evaluated.
    pub model: String,
    /// The dataset split.
    pub split: String,
    /// Examples evaluated.
    pub examples: usize,
    /// Rollouts per example.
    pub rollouts_per_example: usize,
    /// Rollouts finished.
    pub rollouts: usize,
    /// Mean reward.
    pub reward: f64,
    /// Mean of each metric.
    pub metrics: Vec<(String, f64)>,
    /// Avg@k (k = rollouts per example).
    pub avg_at_k: f64,
    /// Pass@k by k.
    pub pass_at_k: Vec<(usize, f64)>,
    /// Sampling.
    #[serde(default)]
    pub sampling: EvalSampling,
    /// Environment arguments (a JSON object's text).
    #[serde(default)]
    pub env_args: String,
    /// When the evaluation finished (RFC 3339, UTC).
    pub date: String,
    /// The host version that ran it.
    pub host_version: String,
    /// The run was stopped before every planned rollout finished.
    #[serde(default)]
    pub interrupted: bool,
}

/// An evaluation as the registry keeps it: the exact summary bytes and who vouches for them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoredEval {
    /// Hex sha256 of `summary` (its bytes): the evaluation's id.
    pub cksum: String,
    /// The owner who published it.
    pub publisher: String,
    /// The publisher's public key (hex).
    pub key: String,
    /// The signature over [`crate::sign::eval_message`] (hex).
    pub sig: String,
    /// The summary, exactly as signed.
    pub summary: String,
}

impl StoredEval {
    /// The summary's fields the registry shows (checked when it was published).
    pub fn parsed(&self) -> Result<EvalSummary, serde_json::Error> {
        serde_json::from_str(&self.summary)
    }
}

/// An evaluation to publish.
#[derive(Debug, Clone, Copy)]
pub struct EvalPublication<'a> {
    /// The summary's bytes, as written to `summary.json`.
    pub summary: &'a [u8],
    /// The signature (hex) over [`crate::sign::eval_message`].
    pub sig: &'a str,
    /// The publisher's public key (hex).
    pub public_key: &'a str,
    /// Authenticates the publisher to a server.
    pub token: Option<&'a str>,
}

/// Why an evaluation was refused before anything was stored.
pub(crate) fn check_summary(bytes: &[u8]) -> Result<EvalSummary, String> {
    if bytes.len() > MAX_EVAL_BYTES {
        return Err(format!(
            "the summary is {} bytes, over the {MAX_EVAL_BYTES}-byte limit",
            bytes.len()
        ));
    }
    let summary: EvalSummary = serde_json::from_slice(bytes)
        .map_err(|e| format!("not an evaluation summary of host eval: {e}"))?;
    if summary.interrupted {
        return Err(
            "the evaluation was interrupted: its figures cover the fastest rollouts only".into(),
        );
    }
    summary.check()?;
    Ok(summary)
}

impl EvalSummary {
    /// The figures hold together: names of sane length without control, invisible or
    /// bidirectional characters, finite values, rates in [0, 1],
    /// `rollouts = examples × rollouts_per_example`, Pass@k for k in 1..=rollouts per example,
    /// an RFC 3339 UTC date that exists on the calendar and is not later than now plus
    /// [`MAX_CLOCK_SKEW`]. A summary that fails this was not written by `host eval`.
    pub fn check(&self) -> Result<(), String> {
        self.check_at(SystemTime::now())
    }

    /// [`EvalSummary::check`] with `now` as the registry's clock.
    pub fn check_at(&self, now: SystemTime) -> Result<(), String> {
        let name_ok = |what: &str, s: &str| {
            if s.is_empty() || s.chars().count() > MAX_NAME_CHARS {
                return Err(format!(
                    "{what} must be 1-{MAX_NAME_CHARS} printable characters"
                ));
            }
            crate::name::check_name_text(what, s).map_err(|e| e.to_string())
        };
        name_ok("model", &self.model)?;
        name_ok("split", &self.split)?;
        name_ok("host_version", &self.host_version)?;
        if self.metrics.len() > MAX_FIGURES || self.pass_at_k.len() > MAX_FIGURES {
            return Err(format!("at most {MAX_FIGURES} metrics and Pass@k values"));
        }
        for (i, (name, value)) in self.metrics.iter().enumerate() {
            name_ok(&format!("metric name {}", i + 1), name)?;
            if !value.is_finite() {
                return Err(format!("metric {name} is not finite"));
            }
        }
        if !self.reward.is_finite() {
            return Err("reward is not finite".into());
        }
        let rate = |what: &str, x: f64| match (0.0..=1.0).contains(&x) {
            true => Ok(()),
            false => Err(format!("{what} is {x}, not a rate in [0, 1]")),
        };
        rate("avg_at_k", self.avg_at_k)?;
        if self.examples == 0 || self.rollouts_per_example == 0 {
            return Err("an evaluation of no example or no rollout".into());
        }
        if self.examples.checked_mul(self.rollouts_per_example) != Some(self.rollouts) {
            return Err(format!(
                "rollouts is {}, not examples × rollouts_per_example = {} × {}",
                self.rollouts, self.examples, self.rollouts_per_example
            ));
        }
        for &(k, p) in &self.pass_at_k {
            if k == 0 || k > self.rollouts_per_example {
                return Err(format!(
                    "pass@{k} with {} rollouts per example",
                    self.rollouts_per_example
                ));
            }
            rate(&format!("pass@{k}"), p)?;
        }
        if self.env_args.len() > 4096 {
            return Err("env_args is over 4096 bytes".into());
        }
        crate::name::check_prose_text("env_args", &self.env_args).map_err(|e| e.to_string())?;
        let shown: String = self.date.chars().take(40).collect();
        let finished = unix_seconds_of_rfc3339_utc(&self.date)
            .map_err(|why| format!("date {shown:?} {why}"))?;
        // A clock before 1970 is no clock: every date is then in its future.
        let now = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        let ahead = finished.saturating_sub(now);
        if ahead > MAX_CLOCK_SKEW.as_secs() as i64 {
            return Err(format!(
                "date {shown:?} is {ahead} s ahead of the registry's clock: an evaluation \
                 cannot have finished in the future (at most {} s of clock skew is allowed)",
                MAX_CLOCK_SKEW.as_secs()
            ));
        }
        Ok(())
    }
}

/// Days in `month` (1-12) of `year` (proleptic Gregorian: leap years are divisible by 4, except
/// centuries not divisible by 400).
fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        4 | 6 | 9 | 11 => 30,
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        _ => 31,
    }
}

/// Days from 1970-01-01 to `year-month-day` (a valid date), by Howard Hinnant's
/// `days_from_civil`.
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Seconds since the Unix epoch of `YYYY-MM-DDTHH:MM:SSZ` (what `host eval` writes), refusing
/// dates that do not exist (`2026-02-30`, `2026-02-29`) and times past `23:59:59` (a leap
/// second, `23:59:60`, counts as the next second). The error says what is wrong.
fn unix_seconds_of_rfc3339_utc(s: &str) -> Result<i64, String> {
    let format = || "is not RFC 3339 UTC (YYYY-MM-DDTHH:MM:SSZ)".to_owned();
    let b = s.as_bytes();
    if b.len() != 20
        || (b[4], b[7], b[10], b[13], b[16], b[19]) != (b'-', b'-', b'T', b':', b':', b'Z')
    {
        return Err(format());
    }
    // Fields of ASCII digits only (no sign, no space), parsed from bytes: no slicing of `s`.
    let field = |r: std::ops::Range<usize>| -> Result<u32, String> {
        let digits = b.get(r).ok_or_else(format)?;
        if !digits.iter().all(u8::is_ascii_digit) {
            return Err(format());
        }
        Ok(digits.iter().fold(0, |n, d| n * 10 + u32::from(d - b'0')))
    };
    let (year, month, day) = (i64::from(field(0..4)?), field(5..7)?, field(8..10)?);
    let (hour, minute, second) = (field(11..13)?, field(14..16)?, field(17..19)?);
    if !(1..=12).contains(&month) {
        return Err(format!("is not a real date: there is no month {month:02}"));
    }
    let days = days_in_month(year, month);
    if !(1..=days).contains(&day) {
        return Err(format!(
            "is not a real date: month {month:02} of {year:04} has {days} days"
        ));
    }
    let leap_second = (hour, minute, second) == (23, 59, 60);
    if hour > 23 || minute > 59 || (second > 59 && !leap_second) {
        return Err(format!(
            "is not a real time of day: {hour:02}:{minute:02}:{second:02}"
        ));
    }
    Ok(days_from_civil(year, month, day) * 86_400
        + i64::from(hour) * 3600
        + i64::from(minute) * 60
        + i64::from(second))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good() -> serde_json::Value {
        serde_json::json!({
            "plugin": "rlhost/arith", "plugin_version": "0.1.0", "model": "tiny", "split": "test",
            "examples": 2, "rollouts_per_example": 2, "rollouts": 4, "reward": 0.5,
            "metrics": [["correct", 0.5]], "avg_at_k": 0.5, "pass_at_k": [[1, 0.5], [2, 0.75]],
            "date": "2025-11-28T12:00:00Z", "host_version": "0.1.0"
        })
    }

    #[test]
    fn summaries_must_hold_together() {
        let check = |v: &serde_json::Value| check_summary(v.to_string().as_bytes());
        check(&good()).unwrap();
        let bad = |path: &str, value: serde_json::Value, why: &str| {
            let mut v = good();
            v[path] = value;
            let err = check(&v).unwrap_err();
            assert!(err.contains(why), "{path}: {err}");
        };
        bad("avg_at_k", serde_json::json!(1e308), "not a rate");
        bad("pass_at_k", serde_json::json!([[3, 0.5]]), "pass@3 with 2");
        bad("pass_at_k", serde_json::json!([[1, 5.0]]), "not a rate");
        bad("rollouts", serde_json::json!(0), "rollouts is 0");
        bad("examples", serde_json::json!(0), "no example");
        bad("date", serde_json::json!("9999-99-99"), "RFC 3339");
        bad("model", serde_json::json!("z".repeat(201)), "model must be");
        bad("model", serde_json::json!(""), "model must be");
        bad("interrupted", serde_json::json!(true), "interrupted");
        bad("metrics", serde_json::json!([["x\ny", 0.5]]), "metric name");
        let huge = serde_json::json!("x".repeat(MAX_EVAL_BYTES));
        bad("env_args", huge, "over the");
    }

    fn summary_dated(date: &str) -> EvalSummary {
        let mut v = good();
        v["date"] = serde_json::json!(date);
        serde_json::from_value(v).unwrap()
    }

    /// `2026-02-30` passed a check of "day 1-31".
    #[test]
    fn dates_must_exist_on_the_calendar() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(4_102_444_800); // 2100-01-01
        for (date, why) in [
            ("2026-02-30T12:00:00Z", "month 02 of 2026 has 28 days"),
            ("2026-02-29T12:00:00Z", "month 02 of 2026 has 28 days"),
            ("2100-02-29T12:00:00Z", "month 02 of 2100 has 28 days"), // a century, not /400
            ("2026-04-31T00:00:00Z", "month 04 of 2026 has 30 days"),
            ("2026-00-10T00:00:00Z", "no month 00"),
            ("2026-13-10T00:00:00Z", "no month 13"),
            ("2026-01-00T00:00:00Z", "has 31 days"),
            ("2026-01-10T24:00:00Z", "not a real time of day"),
            ("2026-01-10T12:60:00Z", "not a real time of day"),
            ("2026-01-10T12:00:60Z", "not a real time of day"),
            ("2026-01-10 12:00:00Z", "RFC 3339"),
            ("+026-01-10T12:00:00Z", "RFC 3339"),
            ("2026-01-1éT12:00:00Z", "RFC 3339"),
            ("2026-01-10T12:00:00+01:00", "RFC 3339"),
        ] {
            let e = summary_dated(date).check_at(now).unwrap_err();
            assert!(e.contains(why) && e.starts_with("date "), "{date}: {e}");
        }
        for date in [
            "2024-02-29T12:00:00Z",
            "2000-02-29T12:00:00Z",
            "2026-12-31T23:59:60Z",
            "1999-12-31T23:59:59Z",
        ] {
            summary_dated(date).check_at(now).unwrap();
        }
        assert_eq!(unix_seconds_of_rfc3339_utc("1970-01-01T00:00:00Z"), Ok(0));
        // `date -u -d 2026-11-28T12:34:56Z +%s`
        assert_eq!(
            unix_seconds_of_rfc3339_utc("2026-11-28T12:34:56Z"),
            Ok(1_795_869_296)
        );
        assert_eq!(
            unix_seconds_of_rfc3339_utc("2000-03-01T00:00:00Z"),
            Ok(951_868_800)
        );
    }

    /// A date years ahead sorted first on the package's page for good.
    #[test]
    fn dates_beyond_the_clock_skew_are_refused() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_869_296); // 2026-11-28T12:34:56Z
        let skew = MAX_CLOCK_SKEW.as_secs();
        summary_dated("2026-11-28T12:34:56Z").check_at(now).unwrap();
        summary_dated("2020-01-01T00:00:00Z").check_at(now).unwrap();
        // Within the skew: a clock a little ahead.
        let at = |s: u64| now + Duration::from_secs(s);
        let date = |t: SystemTime| {
            let secs = t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs() as i64;
            let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
            // 2026-11-28 is day 20_785; the test stays within that day.
            assert_eq!(days, 20_785);
            format!(
                "2026-11-28T{:02}:{:02}:{:02}Z",
                rest / 3600,
                rest % 3600 / 60,
                rest % 60
            )
        };
        summary_dated(&date(at(skew))).check_at(now).unwrap();
        let e = summary_dated(&date(at(skew + 1)))
            .check_at(now)
            .unwrap_err();
        assert!(e.contains(&format!("{} s ahead", skew + 1)), "{e}");
        for far in ["2027-01-01T00:00:00Z", "9999-12-31T23:59:59Z"] {
            let e = summary_dated(far).check_at(now).unwrap_err();
            assert!(e.contains("cannot have finished in the future"), "{e}");
        }
    }

    /// Model, split and metric names with bidi controls were shown on the hub reordered.
    #[test]
    fn names_with_hidden_characters_are_refused_by_field() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_869_296);
        let refused = |v: serde_json::Value| {
            serde_json::from_value::<EvalSummary>(v)
                .unwrap()
                .check_at(now)
                .unwrap_err()
        };
        for c in [
            '\u{202E}',
            '\u{2066}',
            '\u{200F}',
            '\u{061C}',
            '\u{200B}',
            '\u{E0041}',
        ] {
            for (field, starts) in [
                ("model", "model has"),
                ("split", "split has"),
                ("host_version", "host_version has"),
            ] {
                let mut v = good();
                v[field] = serde_json::json!(format!("a{c}b"));
                let e = refused(v);
                assert!(
                    e.starts_with(starts) && e.contains(&format!("U+{:04X}", u32::from(c))),
                    "{e}"
                );
            }
            let mut v = good();
            v["metrics"] = serde_json::json!([["correct", 0.5], [format!("n{c}"), 0.5]]);
            let e = refused(v);
            assert!(e.starts_with("metric name 2 has"), "{e}");
            let mut v = good();
            v["env_args"] = serde_json::json!(format!("{{\"x\": \"{c}\"}}"));
            if c != '\u{200F}' && c != '\u{061C}' {
                let e = refused(v);
                assert!(e.starts_with("env_args has"), "{e}");
            }
        }
    }
}
