//! The pipeline's answers in OpenAI's chat and text-completion objects: token log-probs as
//! token text (or `token_id:N`), usage, stop reasons, tool calls with ids. Only answers that
//! leave the process are written here; the in-process generator reads [`super::ChatOutput`].

use crate::engine::{Completion, StopCause};
use crate::openai::{
    ChatChoice, ChatCompletion, ChatLogprobs, ResponseHeader, ResponseMessage, StopReason,
    TextLogprobs, TokenLogprob, ToolCall, TopLogprob, TopLogprobMap, Usage,
};

use super::{ChatOutput, ChatPlan, Pipeline, random_id};

/// A whole chat completion from a typed answer.
pub(super) fn chat_completion(p: &Pipeline, plan: &ChatPlan, out: ChatOutput) -> ChatCompletion {
    let done: Vec<&Completion> = out.answers.iter().map(|a| &a.completion).collect();
    let usage = usage(out.prompt_ids.len(), done.iter().copied());
    let policy_version = p.policy_version(&done);
    let choices = out
        .answers
        .into_iter()
        .map(|a| {
            let c = &a.completion;
            ChatChoice {
                index: c.index,
                logprobs: plan.logprobs.then(|| ChatLogprobs {
                    content: logprob_items(p, c, plan.as_ids),
                }),
                finish_reason: a.finish_reason.to_string(),
                stop_reason: stop_reason(&c.stop),
                policy_version: Some(
                    c.versions
                        .last()
                        .copied()
                        .unwrap_or(p.engine.info().version()),
                ),
                token_ids: plan.return_ids.then(|| c.token_ids.clone()),
                message: ResponseMessage {
                    role: "assistant".into(),
                    content: a.content,
                    tool_calls: a
                        .calls
                        .iter()
                        .map(|call| {
                            ToolCall::function(&random_id("call", '-'), &call.name, &call.arguments)
                        })
                        .collect(),
                    reasoning_content: a.reasoning,
                },
                tool_call_error: a.tool_call_error,
            }
        })
        .collect();
    ChatCompletion {
        header: header(
            &p.model_name(&plan.adapter),
            &plan.id,
            plan.created,
            "chat.completion",
        ),
        choices,
        usage: Some(usage),
        policy_version: Some(policy_version),
        prompt_token_ids: plan.return_ids.then_some(out.prompt_ids),
    }
}

/// A response header: `id`, object kind `object`, the served model.
pub(super) fn header(model: &str, id: &str, created: u64, object: &str) -> ResponseHeader {
    ResponseHeader {
        id: id.to_string(),
        object: object.into(),
        created,
        model: model.to_owned(),
    }
}

/// Token usage; `prompt_tokens_details.cached_tokens` counts each request's prompt tokens that
/// came from the prefix cache (once per request, as its samples share one prefill).
pub(super) fn usage<'a>(prompt: usize, done: impl IntoIterator<Item = &'a Completion>) -> Usage {
    let (mut completion, mut cached) = (0usize, 0usize);
    for c in done {
        completion += c.token_ids.len();
        if c.index == 0 {
            cached += c.cached_tokens;
        }
    }
    Usage::new(prompt as u64, completion as u64, cached as u64)
}

/// vLLM's `stop_reason` for what the engine says stopped a sample.
pub(super) fn stop_reason(c: &Option<StopCause>) -> Option<StopReason> {
    c.as_ref().map(|c| match c {
        StopCause::Text(s) => StopReason::Text(s.clone()),
        StopCause::Token(t) => StopReason::Token(*t),
    })
}

/// A token as log-prob entries write it: its text, or `token_id:N`.
pub(super) fn token_text(p: &Pipeline, id: u32, as_ids: bool) -> String {
    if as_ids {
        format!("token_id:{id}")
    } else {
        p.engine
            .info()
            .tokenizer
            .decode(&[id], false)
            .unwrap_or_default()
    }
}

/// One token's chat log-prob entry with its alternatives.
pub(super) fn logprob_item(
    p: &Pipeline,
    id: u32,
    lp: f32,
    top: &[(u32, f32)],
    as_ids: bool,
) -> TokenLogprob {
    let token = token_text(p, id, as_ids);
    TokenLogprob {
        bytes: Some(token.as_bytes().to_vec()),
        token,
        logprob: lp,
        top_logprobs: top
            .iter()
            .map(|&(t, l)| {
                let token = token_text(p, t, as_ids);
                TopLogprob {
                    bytes: Some(token.as_bytes().to_vec()),
                    token,
                    logprob: l,
                }
            })
            .collect(),
    }
}

fn logprob_items(p: &Pipeline, c: &Completion, as_ids: bool) -> Vec<TokenLogprob> {
    c.token_ids
        .iter()
        .zip(&c.logprobs)
        .zip(&c.top_logprobs)
        .map(|((&id, &lp), top)| logprob_item(p, id, lp, top, as_ids))
        .collect()
}

/// The alternatives at one position as a text completion lists them.
pub(super) fn top_map(p: &Pipeline, top: &[(u32, f32)], as_ids: bool) -> TopLogprobMap {
    TopLogprobMap(
        top.iter()
            .map(|&(t, l)| (token_text(p, t, as_ids), l))
            .collect(),
    )
}

/// Legacy completions log-probs: parallel lists.
pub(super) fn text_logprobs(p: &Pipeline, c: &Completion, as_ids: bool) -> TextLogprobs {
    let tokens: Vec<String> = c
        .token_ids
        .iter()
        .map(|&t| token_text(p, t, as_ids))
        .collect();
    let mut offset = 0usize;
    let offsets: Vec<usize> = tokens
        .iter()
        .map(|t| {
            let o = offset;
            offset += t.len();
            o
        })
        .collect();
    TextLogprobs {
        tokens,
        token_logprobs: c.logprobs.clone(),
        top_logprobs: c
            .top_logprobs
            .iter()
            .map(|top| top_map(p, top, as_ids))
            .collect(),
        text_offset: Some(offsets),
    }
}
