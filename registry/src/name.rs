//! Package names: `owner/name`, each part a slug of 1-64 characters of `[a-z0-9-]` that does not
//! start with `-`. This is the one check every name passes before it becomes a path under a
//! registry's root, a URL of a registry server or a folder of installed plugins: the manifest,
//! references typed by users, every server route and every client method use it, so a name like
//! `acme/../zeta/victim` or `..%2F..%2Fetc/passwd` never reaches the filesystem.
//!
//! It also holds the checks of every other user-supplied text the hub shows (publisher names,
//! [`check_owner`]; descriptions, tags, model and metric names, [`check_name_text`] and
//! [`check_prose_text`]): no control character, and none of the invisible or bidirectional
//! characters that make a name look like another (`Trojan Source`, CVE-2021-42574).

use std::fmt;
use std::path::{Component, Path, PathBuf};
use std::str::FromStr;

/// Longest owner or name part.
pub const MAX_SLUG_LEN: usize = 64;

/// Whether `s` is a valid owner or name part: 1-64 of `[a-z0-9-]`, not starting with `-`.
pub fn is_slug(s: &str) -> bool {
    (1..=MAX_SLUG_LEN).contains(&s.len())
        && !s.starts_with('-')
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// A string that is not a package name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{given:?} is not a package name: expected owner/name, each 1-64 of [a-z0-9-] not starting with '-'"
)]
pub struct NameError {
    /// What was given (cut to 100 characters).
    pub given: String,
}

impl NameError {
    fn new(given: &str) -> Self {
        Self {
            given: given.chars().take(100).collect(),
        }
    }
}

/// A string that is not a publisher (owner) name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{given:?} is not a publisher name: expected 1-64 of [a-z0-9-], not starting with '-'")]
pub struct OwnerError {
    /// What was given (cut to 100 characters).
    pub given: String,
}

/// Checks a publisher name given alone (a key's or a token's owner): the owner part of a
/// package name, so every owner the registry knows can publish and has a page.
pub fn check_owner(owner: &str) -> Result<(), OwnerError> {
    match is_slug(owner) {
        true => Ok(()),
        false => Err(OwnerError {
            given: owner.chars().take(100).collect(),
        }),
    }
}

/// User-supplied text the hub would show that holds a character it must not.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} {problem}")]
pub struct TextError {
    /// The field, as its author wrote it (`model`, `plugin.description`, …).
    pub field: String,
    /// What is wrong and what was expected.
    pub problem: String,
}

/// Why `c` may not appear in a name shown to people, if it may not.
///
/// - controls (C0, C1, DEL) and the line and paragraph separators: they break a name over lines
///   or into a terminal's escape sequences;
/// - the bidirectional controls: embeddings and overrides (U+202A–U+202E), isolates
///   (U+2066–U+2069) and the marks (U+200E, U+200F, U+061C), which reorder what is shown
///   (`model`, U+202E, `kcab` reads as `modelback`);
/// - invisible characters: zero-width spaces and joiners (U+200B–U+200D, U+2060–U+2064, U+FEFF),
///   the soft hyphen, the combining grapheme joiner, Mongolian selectors and vowel separator,
///   Khmer inherent vowels, Hangul fillers, variation selectors, other format characters
///   (U+FFF9–U+FFFB, U+206A–U+206F, Arabic and Syriac number signs) and the tag characters and
///   their neighbours (U+E0000–U+E0FFF, which carry hidden ASCII), so two names that look alike
///   are alike.
fn hidden_in_name(c: char) -> Option<&'static str> {
    match u32::from(c) {
        _ if c.is_control() => Some("a control character"),
        0x2028 | 0x2029 => Some("a line or paragraph separator"),
        0x202A..=0x202E | 0x2066..=0x2069 | 0x200E | 0x200F | 0x061C => {
            Some("a bidirectional control character")
        }
        0x00AD
        | 0x034F
        | 0x0600..=0x0605
        | 0x06DD
        | 0x070F
        | 0x0890
        | 0x0891
        | 0x08E2
        | 0x115F
        | 0x1160
        | 0x17B4
        | 0x17B5
        | 0x180B..=0x180F
        | 0x200B..=0x200D
        | 0x2060..=0x2064
        | 0x206A..=0x206F
        | 0x3164
        | 0xFE00..=0xFE0F
        | 0xFEFF
        | 0xFFA0
        | 0xFFF9..=0xFFFB
        | 0x1D173..=0x1D17A
        | 0xE0000..=0xE0FFF => Some("an invisible character"),
        _ => None,
    }
}

/// Why `c` may not appear in prose shown to people (a description, a note), if it may not:
/// what [`hidden_in_name`] refuses except line breaks, tabs, and the characters real text in
/// some scripts needs (the joiners U+200C/U+200D of Persian, Indic scripts and emoji, the
/// direction marks U+200E/U+200F/U+061C of right-to-left text, variation selectors of emoji).
/// The embeddings, overrides and isolates stay refused: no prose needs to reorder what follows.
fn hidden_in_prose(c: char) -> Option<&'static str> {
    match u32::from(c) {
        0x0A | 0x0D | 0x09 => None,
        0x200C..=0x200F | 0x061C | 0xFE00..=0xFE0F => None,
        _ => hidden_in_name(c),
    }
}

fn check_text(
    field: &str,
    value: &str,
    hidden: fn(char) -> Option<&'static str>,
) -> Result<(), TextError> {
    match value
        .chars()
        .enumerate()
        .find_map(|(i, c)| Some((i, c, hidden(c)?)))
    {
        None => Ok(()),
        Some((at, c, kind)) => Err(TextError {
            field: field.to_owned(),
            problem: format!(
                "has {kind}, U+{:04X}, at character {}: names and text shown on the hub must not \
                 hide or reorder what people read; remove it",
                u32::from(c),
                at + 1
            ),
        }),
    }
}

/// Checks a one-line name the hub shows (a model, a split, a metric, a tag, a license): no
/// control, separator, bidirectional or invisible character. The error names `field`.
pub fn check_name_text(field: &str, value: &str) -> Result<(), TextError> {
    check_text(field, value, hidden_in_name)
}

/// Checks prose the hub shows (a description, a dataset note): as [`check_name_text`], but line
/// breaks, tabs, joiners and direction marks are allowed. The error names `field`.
pub fn check_prose_text(field: &str, value: &str) -> Result<(), TextError> {
    check_text(field, value, hidden_in_prose)
}

/// A valid `owner/name`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PackageName {
    full: String,
    slash: usize,
}

impl PackageName {
    /// The name from its two parts.
    pub fn new(owner: &str, name: &str) -> Result<Self, NameError> {
        format!("{owner}/{name}").parse()
    }

    /// The owner part.
    pub fn owner(&self) -> &str {
        &self.full[..self.slash]
    }

    /// The name part.
    pub fn name(&self) -> &str {
        &self.full[self.slash + 1..]
    }

    /// `owner/name`.
    pub fn as_str(&self) -> &str {
        &self.full
    }

    /// `base/owner/name`, checked to lie inside `base`: the parts are slugs, so the join has
    /// exactly two more plain components (no `..`, no root, no separator inside a part).
    pub fn path_under(&self, base: &Path) -> PathBuf {
        let path = base.join(self.owner()).join(self.name());
        let rel = path
            .strip_prefix(base)
            .expect("a path joined onto base starts with base");
        assert!(
            rel.components().count() == 2
                && rel.components().all(|c| matches!(c, Component::Normal(_))),
            "package name {} escaped {}",
            self.full,
            base.display()
        );
        path
    }
}

impl FromStr for PackageName {
    type Err = NameError;
    fn from_str(s: &str) -> Result<Self, NameError> {
        match s.split_once('/') {
            Some((owner, name)) if is_slug(owner) && is_slug(name) => Ok(Self {
                full: s.to_owned(),
                slash: owner.len(),
            }),
            _ => Err(NameError::new(s)),
        }
    }
}

impl fmt::Display for PackageName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.full)
    }
}

impl AsRef<str> for PackageName {
    fn as_ref(&self) -> &str {
        &self.full
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_owner_slash_name() {
        let n: PackageName = "acme/em-2".parse().unwrap();
        assert_eq!(
            (n.owner(), n.name(), n.as_str()),
            ("acme", "em-2", "acme/em-2")
        );
        assert_eq!(
            n.path_under(Path::new("/r/index")),
            PathBuf::from("/r/index/acme/em-2")
        );
        assert_eq!(PackageName::new("a", "b").unwrap().to_string(), "a/b");
    }

    #[test]
    fn refuses_every_shape_that_could_leave_a_folder() {
        let long = "a".repeat(65);
        let long_name = format!("acme/{long}");
        for bad in [
            "",
            "acme",
            "acme/",
            "/em",
            "acme/../zeta/victim",
            "acme/../../../../etc/index/acme/em",
            "../../etc/passwd",
            "acme/em/extra",
            "acme/..",
            "../em",
            "./em",
            "acme/.",
            "acme/em\0",
            "acme/em%2F..",
            "acme\\..\\em",
            "Acme/em",
            "acme/-em",
            "-acme/em",
            "acme/em.x",
            "acme/ em",
            "acme/é",
            long_name.as_str(),
        ] {
            assert!(bad.parse::<PackageName>().is_err(), "{bad:?} was accepted");
        }
    }

    /// Names with bidi overrides, isolates, marks and invisible characters were accepted and
    /// shown on the hub as something else.
    #[test]
    fn names_refuse_every_hidden_or_reordering_character() {
        let mut hidden: Vec<char> = (0x202A..=0x202E)
            .chain(0x2066..=0x2069)
            .map(|c| char::from_u32(c).unwrap())
            .collect();
        hidden.extend([
            '\u{200E}',
            '\u{200F}',
            '\u{061C}',
            '\u{200B}',
            '\u{200C}',
            '\u{200D}',
            '\u{2060}',
            '\u{FEFF}',
            '\u{00AD}',
            '\u{2028}',
            '\u{2029}',
            '\u{E0041}',
            '\u{3164}',
            '\0',
            '\n',
            '\t',
            '\u{1b}',
            '\u{7f}',
            '\u{85}',
        ]);
        for c in hidden {
            let e = check_name_text("model", &format!("qwen{c}3")).unwrap_err();
            assert_eq!(e.field, "model");
            let m = e.to_string();
            assert!(
                m.starts_with("model has ") && m.contains(&format!("U+{:04X}", u32::from(c))),
                "{m}"
            );
            assert!(m.contains("at character 5"), "{m}");
            assert!(!m.contains(c), "the message carries the character: {m:?}");
        }
        for good in [
            "Qwen3-4B",
            "qwen3 @ http://127.0.0.1:8000/v1",
            "模型",
            "café",
            "رياضيات",
        ] {
            check_name_text("model", good).unwrap();
        }
    }

    #[test]
    fn prose_allows_line_breaks_and_script_joiners_but_not_reordering() {
        check_prose_text(
            "d",
            "two\nlines\tand a ZWNJ: می\u{200C}خواهم, an RLM \u{200F}",
        )
        .unwrap();
        for c in [
            '\u{202E}',
            '\u{2067}',
            '\u{200B}',
            '\u{E0041}',
            '\u{1b}',
            '\0',
        ] {
            let e = check_prose_text("plugin.description", &format!("a{c}b")).unwrap_err();
            assert!(e.to_string().starts_with("plugin.description has"), "{e}");
        }
    }

    #[test]
    fn owners_are_slugs() {
        check_owner("acme-2").unwrap();
        for bad in [
            "",
            "Acme",
            "ac me",
            "a/b",
            "-a",
            "ac\u{202E}me",
            "..",
            &"a".repeat(65),
        ] {
            let e = check_owner(bad).unwrap_err().to_string();
            assert!(e.contains("not a publisher name"), "{e}");
        }
    }

    #[test]
    fn errors_name_the_input_without_echoing_megabytes() {
        let huge = "x".repeat(10_000);
        let e = huge.parse::<PackageName>().unwrap_err().to_string();
        assert!(e.len() < 300, "{e}");
        assert!(e.contains("expected owner/name"));
    }
}
