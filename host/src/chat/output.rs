//! What a chat choice's generated text says: reasoning (with a reasoning parser), content and
//! tool calls (when calls are parsed), read the same way from a finished output (the response)
//! and from every prefix of one (the stream), so the pieces a stream sends add up to the
//! response's message.

use rlhost_sdk::types::Tool;

use crate::model::reasoning::{ReasoningParser, partial_tag};
use crate::model::tool_parsers::{ParsedCall, ToolCallParser};

/// Where tool calls begin in the content (both parsers' calls open with it).
const CALL_MARKER: &str = "<tool_call>";

/// How a request's output is read.
pub struct Reader<'a> {
    /// The server's tool-call parser.
    pub parser: &'a dyn ToolCallParser,
    /// The server's reasoning parser, if any.
    pub reasoning: Option<&'a ReasoningParser>,
    /// The prompt ended inside a reasoning block.
    pub opened: bool,
    /// Parse tool calls at all.
    pub parse: bool,
    /// `parallel_tool_calls: false`: only the first call is read.
    pub single: bool,
    /// The tools offered.
    pub tools: &'a [Tool],
}

/// An output read: the whole of a finished one, or what may be shown of an unfinished one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct View {
    /// The reasoning, if the output has any.
    pub reasoning: Option<String>,
    /// The content: text that is not reasoning or a tool call.
    pub content: String,
    /// The calls (unfinished: each call's name and its arguments so far).
    pub calls: Vec<ParsedCall>,
    /// Why (some of) a finished output could not be read as calls.
    pub error: Option<String>,
}

impl Reader<'_> {
    /// Reads `text`, the whole output when `finished`.
    pub fn read(&self, text: &str, finished: bool) -> View {
        let (reasoning, content) = match self.reasoning {
            Some(r) => {
                let s = r.split(text, self.opened, finished);
                (s.reasoning.map(str::to_string), s.content)
            }
            None => (None, text),
        };
        let mut view = View {
            reasoning,
            ..Default::default()
        };
        if !self.parse {
            view.content = content.to_string();
            return view;
        }
        if !finished {
            let shown = match content.find(CALL_MARKER) {
                Some(i) => {
                    view.calls = self.parser.partial(content, self.tools);
                    i
                }
                None => content.len() - partial_tag(content, CALL_MARKER),
            };
            view.content = content[..shown].to_string();
        } else {
            let out = self.parser.parse(content, self.tools);
            view.error = out.error;
            if out.calls.is_empty() {
                view.content = content.to_string();
            } else {
                view.content = out.content.unwrap_or_default();
                view.calls = out.calls;
            }
        }
        if self.single {
            view.calls.truncate(1);
        }
        view
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{reasoning, tool_parsers};

    /// Every prefix's view is a prefix of the finished view, part by part.
    #[test]
    fn views_of_prefixes_are_prefixes_of_the_whole() {
        let hermes = tool_parsers::parser("hermes").unwrap();
        let qwen3 = reasoning::parser("qwen3").unwrap();
        let text = "<think>\nneed a tool\n</think>\n\nLet me compute.\n<tool_call>\n{\"name\": \"python\", \"arguments\": {\"code\": \"print(6 * 7)\"}}\n</tool_call>";
        let reader = Reader {
            parser: hermes.as_ref(),
            reasoning: Some(&qwen3),
            opened: false,
            parse: true,
            single: false,
            tools: &[],
        };
        let whole = reader.read(text, true);
        assert_eq!(whole.reasoning.as_deref(), Some("\nneed a tool\n"));
        assert_eq!(whole.content, "\n\nLet me compute.\n");
        assert_eq!(whole.calls[0].arguments, r#"{"code": "print(6 * 7)"}"#);
        for cut in (0..=text.len()).filter(|&i| text.is_char_boundary(i)) {
            let part = reader.read(&text[..cut], false);
            let r = part.reasoning.unwrap_or_default();
            assert!(whole.reasoning.as_deref().unwrap().starts_with(&r), "{cut}");
            assert!(whole.content.starts_with(&part.content), "{cut}");
            for (p, w) in part.calls.iter().zip(&whole.calls) {
                assert!(w.arguments.starts_with(&p.arguments), "{cut}");
            }
        }
        // Without parsing, everything after the reasoning is content.
        let plain = Reader {
            parse: false,
            ..reader
        };
        assert!(plain.read(text, true).content.contains("<tool_call>"));
    }
}
