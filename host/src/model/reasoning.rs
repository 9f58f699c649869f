//! Reasoning parsers (`--reasoning-parser`, vLLM's flag): the model's thinking, written between
//! `<think>` and `</think>`, is split from its answer into `reasoning_content` (vLLM's field).
//!
//! One rule for a whole output and for every prefix of it (streaming): an output is reasoning
//! when it opens with the start tag, or when the prompt already ended inside a reasoning block
//! (templates that write `<think>` into the generation prompt). The reasoning ends at the end
//! tag; what follows is the content, where tool calls are parsed. An output without the start
//! tag is all content (Qwen3 with thinking off renders an empty block into the prompt instead).
//! An output cut inside its reasoning (by `max_tokens`) is all reasoning, streamed or not.

/// A reasoning format: the tags the model's thinking opens and closes with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReasoningParser {
    name: &'static str,
    start: &'static str,
    end: &'static str,
}

/// The parsers this build knows, by command-line name.
pub const NAMES: &[&str] = &["qwen3"];

/// The parser called `name` on the command line; an error lists [`NAMES`].
pub fn parser(name: &str) -> Result<ReasoningParser, String> {
    match name {
        "qwen3" => Ok(ReasoningParser {
            name: "qwen3",
            start: "<think>",
            end: "</think>",
        }),
        other => Err(format!(
            "unknown reasoning parser `{other}`; this build has {}",
            NAMES.join(", ")
        )),
    }
}

/// An output (or a prefix of one) split into reasoning and content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split<'a> {
    /// The reasoning, when the output has some (a prefix of an unfinished output leaves out a
    /// tail that may be the start of the end tag).
    pub reasoning: Option<&'a str>,
    /// What follows the reasoning (all of the output when it has none); empty while the output
    /// is still inside its reasoning.
    pub content: &'a str,
}

impl ReasoningParser {
    /// The command-line name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Whether a prompt ends inside a reasoning block (its text ends with the start tag, blank
    /// space aside): the output then starts in the reasoning.
    pub fn opens_in(&self, prompt_tail: &str) -> bool {
        prompt_tail.trim_end().ends_with(self.start)
    }

    /// Splits `text`; `opened`: the prompt ended inside a reasoning block; `finished`: `text`
    /// is the whole output (otherwise a tail that may begin a tag is held back).
    pub fn split<'a>(&self, text: &'a str, opened: bool, finished: bool) -> Split<'a> {
        let body = if opened {
            text
        } else if let Some(rest) = text.strip_prefix(self.start) {
            rest
        } else if !finished && self.start.starts_with(text) {
            // Too short to tell yet.
            return Split {
                reasoning: None,
                content: "",
            };
        } else {
            return Split {
                reasoning: None,
                content: text,
            };
        };
        match body.find(self.end) {
            Some(i) => Split {
                reasoning: Some(&body[..i]),
                content: &body[i + self.end.len()..],
            },
            None if finished => Split {
                reasoning: Some(body),
                content: "",
            },
            None => Split {
                reasoning: Some(&body[..body.len() - partial_tag(body, self.end)]),
                content: "",
            },
        }
    }
}

/// The length of the longest tail of `text` that is a proper prefix of `tag`.
pub fn partial_tag(text: &str, tag: &str) -> usize {
    (1..tag.len())
        .rev()
        .find(|&k| tag.is_char_boundary(k) && text.ends_with(&tag[..k]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_thinking_from_the_answer() {
        let p = parser("qwen3").unwrap();
        let s = p.split("<think>\nsix times seven\n</think>\n\n42", false, true);
        assert_eq!(s.reasoning, Some("\nsix times seven\n"));
        assert_eq!(s.content, "\n\n42");
        // No tag: all content; an opened prompt: reasoning until the end tag.
        assert_eq!(p.split("42", false, true).reasoning, None);
        let s = p.split("hmm</think>42", true, true);
        assert_eq!((s.reasoning, s.content), (Some("hmm"), "42"));
        // Cut inside the reasoning: all of it is reasoning.
        let s = p.split("<think>still going", false, true);
        assert_eq!((s.reasoning, s.content), (Some("still going"), ""));
        assert!(parser("r1").unwrap_err().contains("qwen3"));
    }

    /// Every prefix's split is a prefix of the whole split, reasoning and content alike.
    #[test]
    fn prefixes_split_as_prefixes_of_the_whole() {
        let p = parser("qwen3").unwrap();
        for (text, opened) in [
            ("<think>a</thin k</think>\n\nb<think>", false),
            ("<thi", false),
            ("plain <think> text", false),
            ("x</think>y", true),
        ] {
            let whole = p.split(text, opened, true);
            for cut in (0..=text.len()).filter(|&i| text.is_char_boundary(i)) {
                let part = p.split(&text[..cut], opened, false);
                let r = part.reasoning.unwrap_or_default();
                assert!(
                    whole.reasoning.unwrap_or_default().starts_with(r),
                    "{text:?} at {cut}: {r:?}"
                );
                assert!(whole.content.starts_with(part.content), "{text:?} at {cut}");
            }
        }
    }
}
