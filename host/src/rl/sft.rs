//! Supervised fine-tuning (`host sft`): the warm start before RL. Conversations (chat messages
//! and the tools offered) are cut into one sample per assistant turn, exactly as the rollout loop
//! sees them: the prompt is the chat template's render of the messages before the turn with the
//! generation prompt (masked), the target is what the template renders for the turn itself up to
//! and including its end-of-turn marker (trained, negative log-likelihood per token).
//!
//! Input lines are `{"messages": [...], "tools": [...]}` (OpenAI shape) or the rollouts
//! `host eval -s` writes (`prompt` + `completion` + `tools`, with `metrics`), so traces of a
//! stronger policy (a teacher) become training data directly.

use std::path::Path;

use serde_json::Value;

use super::trainer::{Objective, OptimConfig, Sample, StepStats, TrainError, Trainer};
use crate::model::{ChatTemplate, Tokenizer};
use crate::openai::{ChatMessage, ToolDef};
use crate::rollout::History;

/// Errors of SFT data.
#[derive(Debug, thiserror::Error)]
pub enum SftError {
    /// A line cannot be used.
    #[error("{file}:{line}: {message}")]
    Line {
        /// The file.
        file: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// Reading failed.
    #[error("{0}")]
    Io(String),
}

/// One conversation: OpenAI-shaped messages and tools.
#[derive(Debug, Clone)]
pub struct Conversation {
    /// The messages.
    pub messages: Vec<ChatMessage>,
    /// The tools (OpenAI function schemas), if any.
    pub tools: Option<Vec<ToolDef>>,
}

/// A conversations file (`results.jsonl` of `host eval`, or any JSONL of chats): 10,000
/// rollouts of 4k-token conversations are about 200 MB; it is read whole, so 8 GiB bounds the
/// memory a mistaken path (`/dev/zero`, a FIFO, a disk image) could take.
pub const DATA_FILE: rlhost_fs::FileLimit =
    rlhost_fs::FileLimit::new("conversations file", 8 << 30);

/// Reads conversations from a JSONL file; with `only_correct`, eval rollouts whose `correct`
/// metric is below 0.5 (or that failed) are skipped.
pub fn read(path: &Path, only_correct: bool) -> Result<Vec<Conversation>, SftError> {
    let text =
        rlhost_fs::read_to_string(path, DATA_FILE).map_err(|e| SftError::Io(e.to_string()))?;
    let mut out = Vec::new();
    for (i, l) in text.lines().enumerate() {
        if l.trim().is_empty() {
            continue;
        }
        let bad = |message: String| SftError::Line {
            file: path.display().to_string(),
            line: i + 1,
            message,
        };
        let v: Value = serde_json::from_str(l).map_err(|e| bad(e.to_string()))?;
        if v.get("prompt").is_some() && v.get("completion").is_some() {
            // A rollout from `host eval -s`: SDK-shaped messages.
            if only_correct
                && (!v["error"].is_null() || v["metrics"]["correct"].as_f64().unwrap_or(0.0) < 0.5)
            {
                continue;
            }
            let mut msgs: Vec<rlhost_sdk::types::Message> =
                serde_json::from_value(v["prompt"].clone())
                    .map_err(|e| bad(format!("prompt: {e}")))?;
            msgs.extend(
                serde_json::from_value::<Vec<rlhost_sdk::types::Message>>(v["completion"].clone())
                    .map_err(|e| bad(format!("completion: {e}")))?,
            );
            let tools: Vec<rlhost_sdk::types::Tool> =
                serde_json::from_value(v.get("tools").cloned().unwrap_or(Value::Array(vec![])))
                    .map_err(|e| bad(format!("tools: {e}")))?;
            out.push(Conversation {
                messages: msgs.iter().map(ChatMessage::from).collect(),
                tools: (!tools.is_empty()).then(|| tools.iter().map(ToolDef::from).collect()),
            });
        } else {
            if !v["messages"].is_array() {
                return Err(bad(
                    "expected {\"messages\": [...]} or a host eval rollout".into()
                ));
            }
            let messages: Vec<ChatMessage> = serde_json::from_value(v["messages"].clone())
                .map_err(|e| bad(format!("messages: {e}")))?;
            let tools: Option<Vec<ToolDef>> = match v.get("tools") {
                Some(t) if t.is_array() => Some(
                    serde_json::from_value(t.clone()).map_err(|e| bad(format!("tools: {e}")))?,
                ),
                _ => None,
            };
            out.push(Conversation { messages, tools });
        }
    }
    Ok(out)
}

/// The samples of a conversation. With [`History::Template`], one per assistant turn, its
/// prompt the template's render of everything before it (as a plain OpenAI client sends it).
/// With [`History::AsProduced`], one token stream per conversation, the way rollouts see it: each
/// assistant turn as the model writes it when it is the latest turn (the template's render of
/// it as the last message: Qwen3 keeps its think block there and drops it from a re-rendered
/// history), then the template's delta for the messages after it; turns past `max_len` tokens
/// are left out. Every assistant turn is trained, everything else masked.
pub fn samples(
    template: &ChatTemplate,
    tok: &Tokenizer,
    conv: &Conversation,
    max_len: usize,
    history: History,
) -> Result<Vec<Sample>, String> {
    let messages =
        crate::chat::request::template_messages(&conv.messages).map_err(|e| e.message)?;
    let tools = conv
        .tools
        .as_ref()
        .map(|t| serde_json::to_value(t).expect("tools serialise"));
    let list = messages.as_array().expect("an array");
    let none = serde_json::Map::new();
    let mut out = Vec::new();
    let mut stream: Option<Sample> = None;
    let mut previous: Option<usize> = None;
    for (i, m) in list.iter().enumerate() {
        if m["role"] != "assistant" {
            continue;
        }
        let (p, t) = turn_tokens(template, tok, tools.as_ref(), list, i)?;
        if history == History::AsProduced
            && let (Some(s), Some(k)) = (stream.as_mut(), previous)
        {
            let delta = template
                .render_delta(tok, &list[..=k], &list[k + 1..i], tools.as_ref(), &none)
                .map_err(|e| e.to_string())?;
            if s.ids.len() + delta.ids.len() + t.len() > max_len || t.is_empty() {
                break;
            }
            s.ids.extend(&delta.ids);
            s.turn_starts.push(s.ids.len());
            s.ids.extend(&t);
            s.mask.extend(std::iter::repeat_n(false, delta.ids.len()));
            s.mask.extend(std::iter::repeat_n(true, t.len()));
            previous = Some(i);
            continue;
        }
        if p.len() + t.len() > max_len || t.is_empty() {
            match history {
                History::Template => continue,
                // The stream starts with the first turn or not at all.
                History::AsProduced => break,
            }
        }
        let mut mask = vec![false; p.len()];
        mask.extend(std::iter::repeat_n(true, t.len()));
        let mut ids = p;
        ids.extend(t);
        let sample = Sample {
            old_logprobs: Vec::new(),
            ids,
            mask,
            advantage: 0.0,
            group: 0,
            turn_starts: Vec::new(),
        };
        match history {
            History::Template => out.push(sample),
            History::AsProduced => {
                stream = Some(sample);
                previous = Some(i);
            }
        }
    }
    out.extend(stream);
    for s in &mut out {
        s.old_logprobs = vec![0.0; s.ids.len()];
    }
    Ok(out)
}

/// Assistant message `i` of `list`: the template's render of everything before it (with the
/// generation prompt) and its own tokens, up to and including the end-of-turn marker.
fn turn_tokens(
    template: &ChatTemplate,
    tok: &Tokenizer,
    tools: Option<&Value>,
    list: &[Value],
    i: usize,
) -> Result<(Vec<u32>, Vec<u32>), String> {
    let none = serde_json::Map::new();
    let before = Value::Array(list[..i].to_vec());
    let through = Value::Array(list[..=i].to_vec());
    let prompt = template
        .render(&before, tools, true, &none)
        .map_err(|e| e.to_string())?;
    let full = template
        .render(&through, tools, false, &none)
        .map_err(|e| e.to_string())?;
    let Some(rest) = full.strip_prefix(&prompt) else {
        return Err(format!(
            "the template's render of assistant turn {i} does not extend its prompt"
        ));
    };
    // Up to and including the end-of-turn marker: what the model emits before stopping.
    let target = rest.trim_end_matches('\n');
    let p = tok.encode(&prompt).map_err(|e| e.to_string())?;
    let t = tok.encode(target).map_err(|e| e.to_string())?;
    Ok((p, t))
}

/// Options of an SFT run.
#[derive(Debug, Clone)]
pub struct SftOptions {
    /// Optimiser steps.
    pub steps: usize,
    /// Samples per step.
    pub batch_size: usize,
    /// Longest sample.
    pub max_len: usize,
    /// Micro-batch token budget.
    pub micro_batch_tokens: usize,
    /// AdamW and schedule.
    pub optim: OptimConfig,
    /// Shuffling seed.
    pub seed: u64,
}

/// Trains `trainer` on `samples` for `opts.steps` steps of shuffled batches; `after_step` hears
/// each step (1-based) with the trainer, and may save it; its error stops training.
pub fn train(
    trainer: &mut Trainer,
    samples: &[Sample],
    opts: &SftOptions,
    after_step: &mut dyn FnMut(usize, &StepStats, &Trainer) -> Result<(), TrainError>,
) -> Result<(), TrainError> {
    let mut order: Vec<usize> = (0..samples.len()).collect();
    let mut rng = crate::engine::Rng::new(opts.seed ^ 0x5f7);
    let mut cursor = order.len();
    for step in 0..opts.steps {
        let mut batch = Vec::with_capacity(opts.batch_size);
        while batch.len() < opts.batch_size.min(samples.len()) {
            if cursor >= order.len() {
                for i in (1..order.len()).rev() {
                    let j = rng.below(i + 1);
                    order.swap(i, j);
                }
                cursor = 0;
            }
            batch.push(samples[order[cursor]].clone());
            cursor += 1;
        }
        let stats = trainer.step_with(&batch, Objective::Likelihood)?;
        after_step(step + 1, &stats, trainer)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A tool round trip as one stream: each turn as the model writes it (its think block kept,
    /// which a re-render of the history drops), the tool result between them, both turns
    /// trained; the per-turn form trains the same tokens with re-rendered histories.
    #[test]
    fn as_produced_conversations_are_one_stream_of_turns_as_written() {
        let dir = tempfile::tempdir().unwrap();
        crate::model::tiny_tokenizer::write(dir.path(), 512).unwrap();
        let tok = Tokenizer::load(dir.path()).unwrap();
        let tpl = ChatTemplate::load(dir.path()).unwrap();
        let conv = Conversation {
            messages: serde_json::from_value(json!([
                {"role": "user", "content": "What is 6 times 7?"},
                {"role": "assistant", "content": "", "tool_calls": [{"id": "c1",
                    "type": "function", "function": {"name": "python",
                    "arguments": "{\"code\": \"print(6 * 7)\"}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "42"},
                {"role": "assistant", "content": "The answer is 42."},
            ]))
            .unwrap(),
            tools: Some(
                serde_json::from_value(json!([{"type": "function", "function": {"name": "python",
                "description": "Run Python.", "parameters": {"type": "object",
                "properties": {"code": {"type": "string"}}}}}]))
                .unwrap(),
            ),
        };
        let per_turn = samples(&tpl, &tok, &conv, 4096, History::Template).unwrap();
        let stream = samples(&tpl, &tok, &conv, 4096, History::AsProduced).unwrap();
        assert_eq!((per_turn.len(), stream.len()), (2, 1));
        let s = &stream[0];
        let trained = |s: &Sample| -> Vec<u32> {
            s.ids
                .iter()
                .zip(&s.mask)
                .filter(|(_, m)| **m)
                .map(|(i, _)| *i)
                .collect()
        };
        // Turn 1 exactly as its own sample; turn 2's trained tokens as its own sample's.
        assert_eq!(s.ids[..per_turn[0].ids.len()], per_turn[0].ids[..]);
        assert_eq!(s.turn_starts.len(), 1);
        assert_eq!(s.ids[s.turn_starts[0]..], trained(&per_turn[1])[..]);
        let mut both = trained(&per_turn[0]);
        both.extend(trained(&per_turn[1]));
        assert_eq!(trained(s), both);
        assert_eq!(s.old_logprobs.len(), s.ids.len());
        // The history keeps turn 1's think block; the template's re-render drops it.
        let text = tok.decode(&s.ids, false).unwrap();
        assert_eq!(text.matches("<think>").count(), 2, "{text}");
        let rerendered = tok.decode(&per_turn[1].ids, false).unwrap();
        assert_eq!(rerendered.matches("<think>").count(), 1, "{rerendered}");
        // Too long for the second turn: the stream keeps the first.
        let short = samples(&tpl, &tok, &conv, s.turn_starts[0], History::AsProduced).unwrap();
        assert_eq!(short.len(), 1);
        assert_eq!(short[0].ids, per_turn[0].ids);
    }
}
