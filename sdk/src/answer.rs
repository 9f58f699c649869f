//! Finding the final answer in a completion: `\boxed{…}` (and `\fbox{…}`, `\boxed 5`) with
//! balanced braces, as math graders expect.

/// Which boxed answer to take when there are several.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick {
    /// The first one.
    First,
    /// The last one (the usual convention: the model's final answer).
    Last,
}

/// The content of the last `\boxed{…}` / `\fbox{…}` in `text`, braces balanced.
pub fn extract_boxed(text: &str) -> Option<&str> {
    extract_boxed_with(text, Pick::Last)
}

/// The content of the first or last boxed answer in `text`.
pub fn extract_boxed_with(text: &str, pick: Pick) -> Option<&str> {
    let mut found = None;
    let mut rest_start = 0;
    while let Some((start, end)) = next_boxed(text, rest_start) {
        let content = &text[start..end];
        if pick == Pick::First {
            return Some(content);
        }
        found = Some(content);
        rest_start = end;
    }
    found
}

/// Finds the next boxed answer at or after byte `from`; returns the content's byte range.
fn next_boxed(text: &str, from: usize) -> Option<(usize, usize)> {
    let mut search = from;
    loop {
        let hay = &text[search..];
        let (pos, macro_len) = ["\\boxed", "\\fbox"]
            .iter()
            .filter_map(|m| hay.find(m).map(|p| (p, m.len())))
            .min_by_key(|(p, _)| *p)?;
        let after = search + pos + macro_len;
        let tail = &text[after..];
        if let Some(inner) = tail.strip_prefix('{') {
            let open = after + 1;
            let mut depth = 1usize;
            for (i, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some((open, open + i));
                        }
                    }
                    _ => {}
                }
            }
            return None; // unbalanced: no answer
        }
        if let Some(spaced) = tail.strip_prefix(' ') {
            // `\boxed 5`: up to the next whitespace or `$`.
            let start = after + 1;
            let len = spaced
                .find(|c: char| c.is_whitespace() || c == '$')
                .unwrap_or(spaced.len());
            if len > 0 {
                return Some((start, start + len));
            }
        }
        search = after; // `\boxedx` or similar: not an answer, keep looking
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_boxed_with_nested_braces() {
        let t = r"First \boxed{1}, then \boxed{\frac{1}{2}} is final.";
        assert_eq!(extract_boxed(t), Some(r"\frac{1}{2}"));
        assert_eq!(extract_boxed_with(t, Pick::First), Some("1"));
    }

    #[test]
    fn fbox_and_space_forms() {
        assert_eq!(extract_boxed(r"so \fbox{42}"), Some("42"));
        assert_eq!(extract_boxed(r"$\boxed 7$"), Some("7"));
    }

    #[test]
    fn unbalanced_or_absent_is_none() {
        assert_eq!(extract_boxed(r"\boxed{1"), None);
        assert_eq!(extract_boxed("no answer here"), None);
        assert_eq!(extract_boxed(r"\boxedx{3}"), None);
    }

    #[test]
    fn multibyte_text_is_fine() {
        assert_eq!(extract_boxed("ответ: \\boxed{π²}"), Some("π²"));
    }
}
