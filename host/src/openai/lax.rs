//! Lax reading of numbers and booleans, as vLLM's request parser (pydantic in lax mode) reads
//! them: `"top_k": "20"`, `"temperature": "0.5"`, `"stream": "true"` are what they say. Used
//! with `deserialize_with` on request fields; a value that is none of the accepted forms is an
//! error that names what was expected, and [`super::parse`] adds the field's path.
//!
//! What pydantic 2 accepts, and so what is accepted here:
//! - integers: a JSON integer, a JSON number with no fractional part (`20.0`), or a string of one
//!   after trimming whitespace (`" 20 "`, `"+3"`, `"1_000"`, `"20.0"`);
//! - floats: a JSON number, or a string that Python's `float()` reads (`"0.5"`, `"1e-1"`,
//!   `"1_0.5"`);
//! - booleans: `true`/`false`, the integers 0 and 1, and the strings `0 1 f t n y no on off
//!   yes true false` in any case, without surrounding whitespace.
//!
//! One deliberate difference: pydantic reads `true` as the integer 1 where an integer is
//! expected; here a boolean is refused for a number, so a chat-style `"logprobs": true` sent to
//! `/v1/completions` (where it is a count) is an error rather than a silent 1.

use serde::de::{self, Deserializer, Visitor};
use std::fmt;
use std::marker::PhantomData;

/// A number type the lax readers produce.
pub trait LaxNumber: Sized {
    /// What the error says was expected.
    const EXPECTED: &'static str;
    /// From a JSON integer.
    fn from_i128(v: i128) -> Option<Self>;
    /// From a JSON float.
    fn from_f64(v: f64) -> Option<Self>;
    /// From a string, pydantic's way.
    fn from_text(s: &str) -> Option<Self>;
}

/// Python's `int()` of a string as pydantic uses it: trimmed, an optional sign, digits with
/// single underscores between them, and an optional `.000…` fraction of zeros.
fn int_text(s: &str) -> Option<i128> {
    let s = s.trim();
    let s = match s.split_once('.') {
        Some((whole, frac)) if frac.bytes().all(|b| b == b'0') => whole,
        Some(_) => return None,
        None => s,
    };
    let (neg, digits) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    if digits.is_empty()
        || digits.starts_with('_')
        || digits.ends_with('_')
        || digits.contains("__")
        || !digits.bytes().all(|b| b.is_ascii_digit() || b == b'_')
    {
        return None;
    }
    let v: i128 = digits.replace('_', "").parse().ok()?;
    Some(if neg { -v } else { v })
}

/// Python's `float()` of a string: trimmed, underscores between digits allowed, `inf` and `nan`
/// in any case.
fn float_text(s: &str) -> Option<f64> {
    let s = s.trim();
    if s.is_empty() || s.contains("__") || s.starts_with('_') || s.ends_with('_') {
        return None;
    }
    let plain = s.replace('_', "");
    let lower = plain.to_ascii_lowercase();
    let unsigned = lower.trim_start_matches(['+', '-']);
    if matches!(unsigned, "inf" | "infinity" | "nan") {
        return lower.parse().ok();
    }
    if !plain
        .bytes()
        .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-'))
    {
        return None;
    }
    plain.parse().ok()
}

macro_rules! lax_int {
    ($t:ty, $what:literal) => {
        impl LaxNumber for $t {
            const EXPECTED: &'static str = $what;
            fn from_i128(v: i128) -> Option<Self> {
                <$t>::try_from(v).ok()
            }
            fn from_f64(v: f64) -> Option<Self> {
                (v.fract() == 0.0 && v.is_finite())
                    .then(|| <$t>::try_from(v as i128).ok())
                    .flatten()
            }
            fn from_text(s: &str) -> Option<Self> {
                int_text(s).and_then(|v| <$t>::try_from(v).ok())
            }
        }
    };
}

lax_int!(i64, "an integer (or a string of one)");
lax_int!(u64, "a non-negative integer (or a string of one)");
lax_int!(usize, "a non-negative integer (or a string of one)");
lax_int!(u32, "a non-negative integer (or a string of one)");

impl LaxNumber for f64 {
    const EXPECTED: &'static str = "a number (or a string of one)";
    fn from_i128(v: i128) -> Option<Self> {
        Some(v as f64)
    }
    fn from_f64(v: f64) -> Option<Self> {
        Some(v)
    }
    fn from_text(s: &str) -> Option<Self> {
        float_text(s)
    }
}

struct NumberVisitor<T>(PhantomData<T>);

impl<'de, T: LaxNumber> Visitor<'de> for NumberVisitor<T> {
    type Value = T;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(T::EXPECTED)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<T, E> {
        T::from_i128(v.into()).ok_or_else(|| E::invalid_value(de::Unexpected::Signed(v), &self))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<T, E> {
        T::from_i128(v.into()).ok_or_else(|| E::invalid_value(de::Unexpected::Unsigned(v), &self))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<T, E> {
        T::from_f64(v).ok_or_else(|| E::invalid_value(de::Unexpected::Float(v), &self))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
        T::from_text(v).ok_or_else(|| E::invalid_value(de::Unexpected::Str(v), &self))
    }
}

struct OptionVisitor<V>(V);

impl<'de, V: Visitor<'de>> Visitor<'de> for OptionVisitor<V> {
    type Value = Option<V::Value>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        self.0.expecting(f)?;
        f.write_str(" or null")
    }
    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self.0).map(Some)
    }
}

/// A number, read laxly (see the module's docs).
pub fn number<'de, D: Deserializer<'de>, T: LaxNumber>(d: D) -> Result<T, D::Error> {
    d.deserialize_any(NumberVisitor(PhantomData))
}

/// An optional number (`null` is absent), read laxly.
pub fn opt_number<'de, D: Deserializer<'de>, T: LaxNumber>(d: D) -> Result<Option<T>, D::Error> {
    d.deserialize_option(OptionVisitor(NumberVisitor(PhantomData)))
}

struct BoolVisitor;

impl<'de> Visitor<'de> for BoolVisitor {
    type Value = bool;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(
            "a boolean (or one of 0, 1, \"true\", \"false\", \"yes\", \"no\", \"on\", \"off\")",
        )
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<bool, E> {
        Ok(v)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<bool, E> {
        match v {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(E::invalid_value(de::Unexpected::Signed(v), &self)),
        }
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<bool, E> {
        match v {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(E::invalid_value(de::Unexpected::Unsigned(v), &self)),
        }
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<bool, E> {
        if v == 0.0 {
            Ok(false)
        } else if v == 1.0 {
            Ok(true)
        } else {
            Err(E::invalid_value(de::Unexpected::Float(v), &self))
        }
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<bool, E> {
        match v.to_ascii_lowercase().as_str() {
            "1" | "t" | "y" | "on" | "yes" | "true" => Ok(true),
            "0" | "f" | "n" | "no" | "off" | "false" => Ok(false),
            _ => Err(E::invalid_value(de::Unexpected::Str(v), &self)),
        }
    }
}

/// A boolean, read laxly; `null` is `false` (the field's default).
pub fn boolean<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    Ok(d.deserialize_option(OptionVisitor(BoolVisitor))?
        .unwrap_or_default())
}

/// An optional boolean (`null` is absent), read laxly.
pub fn opt_boolean<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    d.deserialize_option(OptionVisitor(BoolVisitor))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Deserialize, Debug)]
    struct Probe {
        #[serde(default, deserialize_with = "opt_number")]
        i: Option<i64>,
        #[serde(default, deserialize_with = "opt_number")]
        u: Option<usize>,
        #[serde(default, deserialize_with = "opt_number")]
        f: Option<f64>,
        #[serde(default, deserialize_with = "opt_boolean")]
        b: Option<bool>,
    }

    fn read(json: &str) -> Result<Probe, String> {
        serde_json::from_str(json).map_err(|e| e.to_string())
    }

    /// The verdicts pydantic 2.14 gives on the same inputs (`int | None`, `float | None`,
    /// `bool | None` fields of a `BaseModel`, read with `model_validate_json`).
    #[test]
    fn numbers_and_booleans_read_as_pydantic_reads_them() {
        for (v, want) in [
            (r#""20""#, Some(20)),
            (r#"" 20 ""#, Some(20)),
            (r#""20.0""#, Some(20)),
            (r#""+3""#, Some(3)),
            (r#""-3""#, Some(-3)),
            (r#""1_000""#, Some(1000)),
            ("20.0", Some(20)),
            ("null", None),
        ] {
            assert_eq!(read(&format!(r#"{{"i": {v}}}"#)).unwrap().i, want, "{v}");
        }
        for v in [
            r#""20.5""#,
            r#""1e2""#,
            r#""0x10""#,
            r#""""#,
            "20.5",
            r#""twenty""#,
        ] {
            let e = read(&format!(r#"{{"i": {v}}}"#)).unwrap_err();
            assert!(e.contains("an integer"), "{v}: {e}");
        }
        assert_eq!(read(r#"{"u": "7"}"#).unwrap().u, Some(7));
        assert!(read(r#"{"u": "-1"}"#).is_err());
        for (v, want) in [
            (r#""0.5""#, 0.5),
            (r#"" 0.5 ""#, 0.5),
            (r#""1e-1""#, 0.1),
            (r#""1_0.5""#, 10.5),
            ("3", 3.0),
        ] {
            assert_eq!(
                read(&format!(r#"{{"f": {v}}}"#)).unwrap().f,
                Some(want),
                "{v}"
            );
        }
        assert!(read(r#"{"f": "inf"}"#).unwrap().f.unwrap().is_infinite());
        assert!(read(r#"{"f": "abc"}"#).is_err());
        for (v, want) in [
            (r#""true""#, true),
            (r#""True""#, true),
            (r#""yes""#, true),
            (r#""on""#, true),
            (r#""1""#, true),
            (r#""0""#, false),
            (r#""t""#, true),
            (r#""off""#, false),
            ("1", true),
            ("0", false),
            ("1.0", true),
        ] {
            assert_eq!(
                read(&format!(r#"{{"b": {v}}}"#)).unwrap().b,
                Some(want),
                "{v}"
            );
        }
        for v in ["2", r#"" true ""#, r#""maybe""#] {
            assert!(read(&format!(r#"{{"b": {v}}}"#)).is_err(), "{v}");
        }
        // The one departure: a boolean is not a number.
        assert!(read(r#"{"i": true}"#).is_err());
    }
}
