//! Streamed answers as typed chunks: a chat stream's [`ChatCompletionChunk`]s and a text
//! completion's [`TextCompletionChunk`]s, sent on a bounded channel that closes when the
//! answer is whole (or the receiver is gone: the task then stops reading the engine, whose
//! dropped receiver cancels the request).

use std::sync::Arc;

use tokio::sync::mpsc as tmpsc;

use crate::engine::{Completion, Event};
use crate::openai::{
    ChatChunkChoice, ChatCompletionChunk, ChatLogprobs, Delta, FunctionCallDelta, TextChunkChoice,
    TextCompletionChunk, TextLogprobs, ToolCallChunk, Usage,
};

use super::completions::TextPlan;
use super::output::View;
use super::wire::{header, logprob_item, stop_reason, token_text, top_map, usage};
use super::{ChatPlan, Chunks, Pipeline, chunks, random_id};

/// Streams a chat completion: a role chunk per choice, then reasoning, content and tool-call
/// pieces as tokens arrive (text that may start a tool call or end the reasoning held back; a
/// call's id and name once its name is complete, then its arguments as they grow), the rest and
/// the finish reason at the end, then usage if asked. The pieces of a choice add up to the
/// message the same request gets unstreamed.
pub(super) fn chat(
    p: Arc<Pipeline>,
    mut rx: tmpsc::UnboundedReceiver<Event>,
    plan: ChatPlan,
) -> Chunks<ChatCompletionChunk> {
    let (tx, ended, out) = chunks();
    tokio::spawn(async move {
        let n = plan.n;
        let chunk = |choices: Vec<ChatChunkChoice>, usage: Option<Usage>| ChatCompletionChunk {
            header: header(
                &p.model_name(&plan.adapter),
                &plan.id,
                plan.created,
                "chat.completion.chunk",
            ),
            choices,
            usage,
        };
        let choice = |index: usize, delta: Delta| ChatChunkChoice {
            index,
            delta,
            logprobs: None,
            finish_reason: None,
            stop_reason: None,
            policy_version: None,
            tool_call_error: None,
        };
        let reader = plan.reader(&p);
        let mut sent = vec![Sent::default(); n];
        let mut done: Vec<Completion> = Vec::new();
        let mut partial: Vec<Completion> = (0..n)
            .map(|index| Completion::empty(index, plan.prompt_ids.len()))
            .collect();
        for index in 0..n {
            let delta = Delta {
                role: Some("assistant".into()),
                content: Some(String::new()),
                ..Default::default()
            };
            if tx
                .send(chunk(vec![choice(index, delta)], None))
                .await
                .is_err()
            {
                return;
            }
        }
        while done.len() < n {
            let Some(ev) = rx.recv().await else { break };
            match ev {
                Event::Token {
                    index,
                    id,
                    logprob,
                    top,
                    text,
                    version,
                } => {
                    partial[index].push_token(id, logprob, top.clone(), &text, version);
                    let view = reader.read(&partial[index].text, false);
                    let mut delta = sent[index].advance(&view);
                    let lp = plan.logprobs.then(|| ChatLogprobs {
                        content: vec![logprob_item(&p, id, logprob, &top, plan.as_ids)],
                    });
                    if delta != Delta::default() || lp.is_some() || plan.return_ids {
                        delta.token_ids = plan.return_ids.then(|| vec![id]);
                        if delta.content.is_none()
                            && delta.reasoning_content.is_none()
                            && delta.tool_calls.is_none()
                        {
                            delta.content = Some(String::new());
                        }
                        let mut c = choice(index, delta);
                        c.logprobs = lp;
                        if tx.send(chunk(vec![c], None)).await.is_err() {
                            return;
                        }
                    }
                }
                Event::Finished {
                    index,
                    reason,
                    stop,
                    text,
                    cached_tokens,
                    error,
                } => {
                    let mut c = std::mem::replace(
                        &mut partial[index],
                        Completion::empty(index, plan.prompt_ids.len()),
                    );
                    c.finish(reason, stop, &text, cached_tokens, error);
                    let answer = p.read(&plan, c);
                    let view = View {
                        reasoning: answer.reasoning.clone(),
                        content: answer.content.clone().unwrap_or_default(),
                        calls: answer.calls.clone(),
                        error: None,
                    };
                    let c = answer.completion;
                    let mut last = choice(index, sent[index].advance(&view));
                    last.finish_reason = Some(answer.finish_reason.to_string());
                    last.stop_reason = stop_reason(&c.stop);
                    last.policy_version = c.versions.last().copied();
                    last.tool_call_error = answer.tool_call_error;
                    if tx.send(chunk(vec![last], None)).await.is_err() {
                        return;
                    }
                    done.push(c);
                }
            }
        }
        if plan.include_usage {
            let u = usage(plan.prompt_ids.len(), &done);
            let _ = tx.send(chunk(Vec::new(), Some(u))).await;
        }
        let _ = ended.send(());
    });
    out
}

/// What a chat stream has sent of one choice.
#[derive(Debug, Clone, Default)]
struct Sent {
    reasoning: String,
    content: String,
    /// Each call's id and the arguments sent.
    calls: Vec<(String, String)>,
}

impl Sent {
    /// The delta that brings what was sent up to `view`, and notes it as sent. A part that no
    /// longer extends what was sent (a finished output read differently from its prefixes: a
    /// call that turned out malformed) sends nothing more; the last chunk says why.
    fn advance(&mut self, view: &View) -> Delta {
        let mut delta = Delta::default();
        let piece = |text: &str, sent: &mut String| {
            (text.len() > sent.len() && text.starts_with(sent.as_str())).then(|| {
                let p = text[sent.len()..].to_string();
                sent.push_str(&p);
                p
            })
        };
        if let Some(r) = &view.reasoning {
            delta.reasoning_content = piece(r, &mut self.reasoning);
        }
        delta.content = piece(&view.content, &mut self.content);
        let mut calls = Vec::new();
        for (i, call) in view.calls.iter().enumerate() {
            if i == self.calls.len() {
                self.calls
                    .push((random_id("call", '-'), call.arguments.clone()));
                calls.push(ToolCallChunk {
                    index: i,
                    id: Some(self.calls[i].0.clone()),
                    kind: Some("function".into()),
                    function: FunctionCallDelta {
                        name: Some(call.name.clone()),
                        arguments: Some(call.arguments.clone()),
                    },
                });
            } else if let Some(p) = piece(&call.arguments, &mut self.calls[i].1) {
                calls.push(ToolCallChunk {
                    index: i,
                    id: None,
                    kind: None,
                    function: FunctionCallDelta {
                        name: None,
                        arguments: Some(p),
                    },
                });
            }
        }
        delta.tool_calls = (!calls.is_empty()).then_some(calls);
        delta
    }
}

/// Streams a text completion: a chunk per token with text or log-probs, each sample's finish
/// reason on its own chunk, then usage if asked. Prompts are streamed one after another.
pub(super) fn completion(
    p: Arc<Pipeline>,
    rxs: Vec<tmpsc::UnboundedReceiver<Event>>,
    plan: TextPlan,
) -> Chunks<TextCompletionChunk> {
    let (tx, ended, out) = chunks();
    tokio::spawn(async move {
        let n = plan.n;
        let chunk = |choices: Vec<TextChunkChoice>, usage: Option<Usage>| TextCompletionChunk {
            header: header(
                &p.model_name(&plan.adapter),
                &plan.id,
                plan.created,
                "text_completion",
            ),
            choices,
            usage,
        };
        let mut completion_tokens = 0usize;
        let mut cached = 0usize;
        for (k, mut rx) in rxs.into_iter().enumerate() {
            let mut finished = 0;
            while finished < n {
                let Some(ev) = rx.recv().await else { break };
                let (index, text, finish, lp, stop) = match ev {
                    Event::Token {
                        index,
                        id,
                        logprob,
                        top,
                        text,
                        ..
                    } => {
                        completion_tokens += 1;
                        let lp = plan.logprobs.then(|| TextLogprobs {
                            tokens: vec![token_text(&p, id, plan.as_ids)],
                            token_logprobs: vec![logprob],
                            top_logprobs: vec![top_map(&p, &top, plan.as_ids)],
                            text_offset: None,
                        });
                        (index, text, None, lp, None)
                    }
                    Event::Finished {
                        index,
                        reason,
                        stop,
                        text,
                        cached_tokens,
                        ..
                    } => {
                        finished += 1;
                        if index == 0 {
                            cached += cached_tokens;
                        }
                        let stop = stop_reason(&stop);
                        (index, text, Some(reason.as_str().to_string()), None, stop)
                    }
                };
                if text.is_empty() && finish.is_none() && lp.is_none() {
                    continue;
                }
                let c = TextChunkChoice {
                    index: k * n + index,
                    text,
                    logprobs: lp,
                    finish_reason: finish,
                    stop_reason: stop,
                };
                if tx.send(chunk(vec![c], None)).await.is_err() {
                    return;
                }
            }
        }
        if plan.include_usage {
            let u = Usage::new(
                plan.prompt_tokens as u64,
                completion_tokens as u64,
                cached as u64,
            );
            let _ = tx.send(chunk(Vec::new(), Some(u))).await;
        }
        let _ = ended.send(());
    });
    out
}
