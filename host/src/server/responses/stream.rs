//! A streamed response: the chat pipeline's chunks translated into Responses events (output
//! items opened, their text, reasoning and call arguments as deltas, items closed, the whole
//! response last), numbered as OpenAI numbers them. Pure: [`super::super::sse::translated`]
//! runs it. The response it ends with is the one the same request gets unstreamed.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{Answer, ItemIds, Plan, ResponseStore, finish};
use crate::chat::{Pipeline, random_id};
use crate::openai::responses::{
    FunctionCallItem, OutputItem, OutputMessage, OutputPart, ReasoningItem, StreamEvent,
    StreamEventKind,
};
use crate::openai::{ChatChunkChoice, ToolCall, ToolCallChunk, Usage};
use crate::server::sse::{Named, Translator};

/// Numbers events as OpenAI's stream does (`sequence_number` from 0, no gaps).
#[derive(Default)]
struct Events {
    seq: u64,
    out: Vec<Named>,
}

impl Events {
    fn push(&mut self, kind: StreamEventKind) {
        let name = kind.name();
        let event = StreamEvent {
            sequence_number: self.seq,
            kind,
        };
        self.seq += 1;
        self.out.push(Named::new(name, &event));
    }

    /// The events written since the last take.
    fn take(&mut self) -> Vec<Named> {
        std::mem::take(&mut self.out)
    }
}

/// The open text item of a stream: reasoning or message.
struct OpenText {
    reasoning: bool,
    output_index: usize,
    id: String,
}

/// A function call being streamed.
struct OpenCall {
    output_index: usize,
    item: FunctionCallItem,
}

/// Turns chat chunks into Responses events, keeping the answer as it grows; the last event
/// carries the whole response, which is stored when the request asks.
pub(super) struct StreamWriter {
    api: Arc<Pipeline>,
    store: Arc<ResponseStore>,
    plan: Plan,
    ev: Events,
    next_index: usize,
    text: Option<OpenText>,
    calls: BTreeMap<usize, OpenCall>,
    answer: Answer,
    ids: ItemIds,
    /// Finished items by output index: the response's output.
    done: BTreeMap<usize, OutputItem>,
    usage: Usage,
    version: Option<u64>,
}

impl StreamWriter {
    pub(super) fn new(api: Arc<Pipeline>, store: Arc<ResponseStore>, plan: Plan) -> Self {
        Self {
            api,
            store,
            plan,
            ev: Events::default(),
            next_index: 0,
            text: None,
            calls: BTreeMap::new(),
            answer: Answer {
                reasoning: String::new(),
                content: String::new(),
                calls: Vec::new(),
                finish: "stop".into(),
            },
            ids: ItemIds::default(),
            done: BTreeMap::new(),
            usage: Usage::default(),
            version: None,
        }
    }

    /// Appends reasoning or message text, opening its item (and closing the other) first.
    fn append_text(&mut self, reasoning: bool, delta: &str) {
        if delta.is_empty() {
            return;
        }
        if self.text.as_ref().is_some_and(|t| t.reasoning != reasoning) {
            self.close_text();
        }
        if self.text.is_none() {
            self.open_text(reasoning);
        }
        let open = self.text.as_ref().expect("opened above");
        let (item_id, output_index) = (open.id.clone(), open.output_index);
        let kind = if reasoning {
            self.answer.reasoning.push_str(delta);
            StreamEventKind::ReasoningTextDelta {
                item_id,
                output_index,
                content_index: 0,
                delta: delta.to_string(),
            }
        } else {
            self.answer.content.push_str(delta);
            StreamEventKind::OutputTextDelta {
                item_id,
                output_index,
                content_index: 0,
                delta: delta.to_string(),
                logprobs: Vec::new(),
            }
        };
        self.ev.push(kind);
    }

    /// Opens a reasoning or message item with its empty part.
    fn open_text(&mut self, reasoning: bool) {
        let output_index = self.next_index;
        self.next_index += 1;
        let (id, item, part) = if reasoning {
            let id = self
                .ids
                .reasoning
                .get_or_insert_with(|| random_id("rs", '_'))
                .clone();
            let item = OutputItem::Reasoning(ReasoningItem {
                id: id.clone(),
                summary: Vec::new(),
                content: Vec::new(),
                encrypted_content: None,
                status: "in_progress".into(),
            });
            let part = OutputPart::ReasoningText {
                text: String::new(),
            };
            (id, item, part)
        } else {
            let id = self
                .ids
                .message
                .get_or_insert_with(|| random_id("msg", '_'))
                .clone();
            let item = OutputItem::Message(OutputMessage {
                id: id.clone(),
                role: "assistant".into(),
                status: "in_progress".into(),
                content: Vec::new(),
            });
            (id, item, OutputPart::output_text(""))
        };
        self.text = Some(OpenText {
            reasoning,
            output_index,
            id: id.clone(),
        });
        self.ev
            .push(StreamEventKind::OutputItemAdded { output_index, item });
        self.ev.push(StreamEventKind::ContentPartAdded {
            item_id: id,
            output_index,
            content_index: 0,
            part,
        });
    }

    /// Closes the open text item, if any, with the status the answer has so far.
    fn close_text(&mut self) {
        let Some(open) = self.text.take() else {
            return;
        };
        let status = self.answer.status();
        let (item_id, output_index) = (open.id, open.output_index);
        let (done, part, item) = if open.reasoning {
            let text = self.answer.reasoning.clone();
            let part = OutputPart::ReasoningText { text: text.clone() };
            let item = OutputItem::Reasoning(ReasoningItem {
                id: item_id.clone(),
                summary: Vec::new(),
                content: vec![part.clone()],
                encrypted_content: self.plan.encrypted_reasoning.then(|| text.clone()),
                status: status.into(),
            });
            let done = StreamEventKind::ReasoningTextDone {
                item_id: item_id.clone(),
                output_index,
                content_index: 0,
                text,
            };
            (done, part, item)
        } else {
            let text = self.answer.content.clone();
            let part = OutputPart::output_text(text.clone());
            let item = OutputItem::Message(OutputMessage {
                id: item_id.clone(),
                role: "assistant".into(),
                status: status.into(),
                content: vec![part.clone()],
            });
            let done = StreamEventKind::OutputTextDone {
                item_id: item_id.clone(),
                output_index,
                content_index: 0,
                text,
                logprobs: Vec::new(),
            };
            (done, part, item)
        };
        self.done.insert(output_index, item.clone());
        self.ev.push(done);
        self.ev.push(StreamEventKind::ContentPartDone {
            item_id,
            output_index,
            content_index: 0,
            part,
        });
        self.ev
            .push(StreamEventKind::OutputItemDone { output_index, item });
    }

    /// A tool call delta: a new call opens its item, arguments are appended.
    fn append_call(&mut self, d: &ToolCallChunk) {
        let (name, args) = (d.function.name.as_deref(), d.function.arguments.as_deref());
        if !self.calls.contains_key(&d.index) {
            if self.plan.one_call && !self.calls.is_empty() {
                return;
            }
            self.close_text();
            let output_index = self.next_index;
            self.next_index += 1;
            let k = self.calls.len();
            if self.ids.calls.len() <= k {
                self.ids.calls.push(random_id("fc", '_'));
            }
            let item = FunctionCallItem {
                id: self.ids.calls[k].clone(),
                call_id: d.id.clone().unwrap_or_else(|| random_id("call", '_')),
                name: name.unwrap_or_default().to_string(),
                arguments: String::new(),
                status: "in_progress".into(),
            };
            self.calls.insert(
                d.index,
                OpenCall {
                    output_index,
                    item: item.clone(),
                },
            );
            self.ev.push(StreamEventKind::OutputItemAdded {
                output_index,
                item: OutputItem::FunctionCall(item),
            });
        } else if let (Some(call), Some(n)) = (self.calls.get_mut(&d.index), name) {
            // A fragment that repeats or continues the name.
            if !call.item.name.ends_with(n) {
                call.item.name.push_str(n);
            }
        }
        let Some(args) = args.filter(|a| !a.is_empty()) else {
            return;
        };
        let call = self.calls.get_mut(&d.index).expect("inserted above");
        call.item.arguments.push_str(args);
        let (item_id, output_index) = (call.item.id.clone(), call.output_index);
        self.ev.push(StreamEventKind::FunctionCallArgumentsDelta {
            item_id,
            output_index,
            delta: args.to_string(),
        });
    }

    /// Closes every open item; the answer is then whole.
    fn close_all(&mut self) {
        self.close_text();
        for (_, call) in std::mem::take(&mut self.calls) {
            let mut item = call.item;
            item.status = "completed".into();
            self.answer.calls.push(ToolCall::function(
                &item.call_id,
                &item.name,
                &item.arguments,
            ));
            self.done
                .insert(call.output_index, OutputItem::FunctionCall(item.clone()));
            self.ev.push(StreamEventKind::FunctionCallArgumentsDone {
                item_id: item.id.clone(),
                output_index: call.output_index,
                name: item.name.clone(),
                arguments: item.arguments.clone(),
            });
            self.ev.push(StreamEventKind::OutputItemDone {
                output_index: call.output_index,
                item: OutputItem::FunctionCall(item),
            });
        }
    }
}

impl Translator for StreamWriter {
    fn start(&mut self) {
        let start = Box::new(self.plan.skeleton.clone());
        self.ev.push(StreamEventKind::Created {
            response: start.clone(),
        });
        self.ev
            .push(StreamEventKind::InProgress { response: start });
    }

    fn text(&mut self, reasoning: bool, delta: &str) {
        self.append_text(reasoning, delta);
    }

    fn call(&mut self, call: &ToolCallChunk) {
        self.append_call(call);
    }

    fn choice(&mut self, c: &ChatChunkChoice) {
        if let Some(f) = &c.finish_reason {
            self.answer.finish = f.clone();
        }
        if c.policy_version.is_some() {
            self.version = c.policy_version;
        }
    }

    fn usage(&mut self, usage: &Usage) {
        self.usage = usage.clone();
    }

    fn cut(&mut self) {
        self.answer.finish = "abort".into();
    }

    fn finish(&mut self) {
        self.close_all();
        let output = std::mem::take(&mut self.done).into_values().collect();
        let response = finish(
            &self.api,
            &self.plan,
            &self.answer,
            output,
            &self.usage,
            self.version,
        );
        if self.plan.store {
            self.store
                .put(response.id.clone(), self.plan.stored(&self.answer));
        }
        let response = Box::new(response);
        let last = match self.answer.status() {
            "incomplete" => StreamEventKind::Incomplete { response },
            "failed" => StreamEventKind::Failed { response },
            _ => StreamEventKind::Completed { response },
        };
        self.ev.push(last);
    }

    fn take(&mut self) -> Vec<Named> {
        self.ev.take()
    }
}
