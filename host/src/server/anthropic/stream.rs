//! A streamed message: the chat pipeline's chunks translated into Anthropic's events (a block
//! opened per thinking, text or `tool_use` part, its deltas, the block closed, then the stop
//! reason and usage). Pure: `server/sse.rs` runs it. The blocks it streams add up to the
//! content the same request gets unstreamed.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

use super::{Answer, Plan, aborted, anthropic_usage, stop};
use crate::chat::{Pipeline, random_id};
use crate::openai::anthropic::{
    AnthropicUsage, BlockDelta, MessageDelta, MessagesEvent, MessagesResponse, ResponseBlock,
    StreamError,
};
use crate::openai::{ChatChunkChoice, ToolCall, ToolCallChunk, Usage};
use crate::server::sse::{Named, Translator};

/// The open block of a stream.
#[derive(Clone, Copy, PartialEq)]
enum Open {
    Thinking(usize),
    Text(usize),
    /// A tool use: the chat call's index, the block's index.
    Call(usize, usize),
}

/// Turns chat chunks into Messages events.
pub(super) struct MessagesWriter {
    api: Arc<Pipeline>,
    plan: Plan,
    out: Vec<Named>,
    next: usize,
    open: Option<Open>,
    /// Chat call index → block index and call so far.
    calls: BTreeMap<usize, (usize, ToolCall)>,
    answer: Answer,
    usage: Usage,
    finish: String,
    /// The generated token ids (with `return_token_ids`), to name a stop sequence.
    ids: Vec<u32>,
}

impl MessagesWriter {
    pub(super) fn new(api: Arc<Pipeline>, plan: Plan) -> Self {
        Self {
            api,
            plan,
            out: Vec::new(),
            next: 0,
            open: None,
            calls: BTreeMap::new(),
            answer: Answer {
                thinking: String::new(),
                text: String::new(),
                calls: Vec::new(),
            },
            usage: Usage::default(),
            finish: "stop".into(),
            ids: Vec::new(),
        }
    }

    fn send(&mut self, e: MessagesEvent) {
        self.out.push(Named::new(e.name(), &e));
    }

    fn close(&mut self) {
        if let Some(Open::Thinking(index) | Open::Text(index) | Open::Call(_, index)) =
            self.open.take()
        {
            self.send(MessagesEvent::ContentBlockStop { index });
        }
    }

    /// More thinking or text, opening its block (and closing the open one) first.
    fn append_text(&mut self, thinking: bool, delta: &str) {
        if delta.is_empty() {
            return;
        }
        let index = match self.open {
            Some(Open::Thinking(i)) if thinking => i,
            Some(Open::Text(i)) if !thinking => i,
            _ => {
                self.close();
                let index = self.next;
                self.next += 1;
                let content_block = if thinking {
                    self.open = Some(Open::Thinking(index));
                    ResponseBlock::Thinking {
                        thinking: String::new(),
                        signature: String::new(),
                    }
                } else {
                    self.open = Some(Open::Text(index));
                    ResponseBlock::Text {
                        text: String::new(),
                    }
                };
                self.send(MessagesEvent::ContentBlockStart {
                    index,
                    content_block,
                });
                index
            }
        };
        let delta = if thinking {
            self.answer.thinking.push_str(delta);
            BlockDelta::ThinkingDelta {
                thinking: delta.into(),
            }
        } else {
            self.answer.text.push_str(delta);
            BlockDelta::TextDelta { text: delta.into() }
        };
        self.send(MessagesEvent::ContentBlockDelta { index, delta });
    }

    /// A tool call delta: a new call opens a `tool_use` block, arguments stream as JSON pieces.
    fn append_call(&mut self, d: &ToolCallChunk) {
        let (name, args) = (d.function.name.as_deref(), d.function.arguments.as_deref());
        if !self.calls.contains_key(&d.index) {
            if self.plan.one_call && !self.calls.is_empty() {
                return;
            }
            self.close();
            let index = self.next;
            self.next += 1;
            let call = ToolCall::function(
                &d.id.clone().unwrap_or_else(|| random_id("toolu", '_')),
                name.unwrap_or_default(),
                "",
            );
            let content_block = ResponseBlock::ToolUse {
                id: call.id.clone(),
                name: call.function.name.clone(),
                input: Value::Object(Default::default()),
            };
            self.calls.insert(d.index, (index, call));
            self.open = Some(Open::Call(d.index, index));
            self.send(MessagesEvent::ContentBlockStart {
                index,
                content_block,
            });
        }
        let Some(args) = args.filter(|a| !a.is_empty()) else {
            return;
        };
        let (index, call) = self.calls.get_mut(&d.index).expect("inserted above");
        call.function.arguments.push_str(args);
        let index = *index;
        // Pieces of a call whose block was closed (the chat stream went back to an earlier
        // call) still count in the answer but cannot be streamed.
        if self.open != Some(Open::Call(d.index, index)) {
            return;
        }
        self.send(MessagesEvent::ContentBlockDelta {
            index,
            delta: BlockDelta::InputJsonDelta {
                partial_json: args.to_string(),
            },
        });
    }
}

impl Translator for MessagesWriter {
    fn start(&mut self) {
        let start = MessagesResponse {
            id: random_id("msg", '_'),
            kind: "message".into(),
            role: "assistant".into(),
            model: self.plan.model.clone(),
            content: Vec::new(),
            stop_reason: None,
            stop_sequence: None,
            usage: AnthropicUsage::default(),
        };
        self.send(MessagesEvent::MessageStart {
            message: Box::new(start),
        });
    }

    fn text(&mut self, thinking: bool, delta: &str) {
        self.append_text(thinking, delta);
    }

    fn call(&mut self, call: &ToolCallChunk) {
        self.append_call(call);
    }

    fn choice(&mut self, c: &ChatChunkChoice) {
        self.ids.extend(c.delta.token_ids.iter().flatten());
        if let Some(f) = &c.finish_reason {
            self.finish = f.clone();
        }
    }

    fn usage(&mut self, usage: &Usage) {
        self.usage = usage.clone();
    }

    fn cut(&mut self) {
        self.finish = "abort".into();
    }

    fn finish(&mut self) {
        self.close();
        if self.finish == "abort" {
            let e = aborted();
            self.send(MessagesEvent::Error {
                error: StreamError {
                    kind: "api_error".into(),
                    message: e.message,
                },
            });
        } else {
            let (stop_reason, stop_sequence) = stop(&self.api, &self.plan, &self.finish, &self.ids);
            let usage = anthropic_usage(&self.usage);
            self.send(MessagesEvent::MessageDelta {
                delta: MessageDelta {
                    stop_reason: Some(stop_reason),
                    stop_sequence,
                },
                usage,
            });
            self.send(MessagesEvent::MessageStop);
        }
    }

    fn take(&mut self) -> Vec<Named> {
        std::mem::take(&mut self.out)
    }
}
