//! Planning a chat request: everything decided before the engine sees it. The tool choice
//! (auto, named, required) and the grammar it implies, `response_format`, the chat template's
//! kwargs (`reasoning_effort`), the prompt's ids (rendered, given as tokens, or a token history
//! continued), sampling and the number of samples. Every refusal here is a 400 naming its field,
//! and it happens before admission: a refused request costs the engine nothing.

use crate::engine::SamplingParams;
use crate::openai::{ApiError, ChatRequest};

use super::request::{self, ToolChoice};
use super::{Pipeline, constrain, output, random_id};

/// A chat request ready for the engine, and how its output is to be read and written.
pub struct ChatPlan {
    /// The prompt's token ids.
    pub prompt_ids: Vec<u32>,
    /// Sampling, with the grammar constraint when one applies.
    pub params: SamplingParams,
    /// Samples to generate.
    pub n: usize,
    /// How the output is read.
    pub reading: Reading,
    /// The response id (`chatcmpl-…`; `request_id` when the client gave one).
    pub id: String,
    /// When the request was planned (Unix seconds).
    pub created: u64,
    /// Return each token's log-prob.
    pub logprobs: bool,
    /// Write tokens as `token_id:N` (`return_tokens_as_token_ids`).
    pub as_ids: bool,
    /// Return prompt and completion token ids (`return_token_ids`).
    pub return_ids: bool,
    /// Send a usage chunk last (`stream_options.include_usage`).
    pub include_usage: bool,
    /// The LoRA adapter it runs with (by name), if any.
    pub adapter: Option<String>,
}

/// How a chat request's output is read.
pub struct Reading {
    /// Parse calls at all.
    pub parse: bool,
    /// `parallel_tool_calls: false`: at most the first call is returned.
    pub single: bool,
    /// The tools offered.
    pub tools: Vec<rlhost_sdk::types::Tool>,
    /// The prompt ends inside a reasoning block (the output starts in the reasoning).
    pub opened: bool,
}

/// What a request's tools decide: the tools as the template sees them, how the output is read,
/// and the grammar decoding must follow (a forced call, or `response_format`).
struct Tooling {
    tools_json: Option<serde_json::Value>,
    reading: Reading,
    grammar: Option<constrain::GrammarSource>,
}

impl ChatPlan {
    /// The output reader for this plan with `p`'s parsers.
    pub fn reader<'a>(&'a self, p: &'a Pipeline) -> output::Reader<'a> {
        output::Reader {
            parser: p.parser.as_ref(),
            reasoning: p.reasoning.as_ref(),
            opened: self.reading.opened,
            parse: self.reading.parse,
            single: self.reading.single,
            tools: &self.reading.tools,
        }
    }
}

impl Pipeline {
    /// Plans `req`; `prompt`, when given, is the prompt's ids instead of the messages'
    /// rendering. The request's grammar, if any, is compiled last: every cheap check passes
    /// first.
    pub async fn plan(
        &self,
        req: &ChatRequest,
        prompt: Option<&[u32]>,
    ) -> Result<ChatPlan, ApiError> {
        let adapter = self.check_model(&req.params.model)?;
        let messages = request::template_messages(&req.messages)?;
        let Tooling {
            tools_json,
            mut reading,
            grammar,
        } = self.tooling(req)?;
        let ids = self.prompt_ids(req, &messages, prompt, tools_json.as_ref())?;
        let top = top_logprobs(req)?;
        let info = self.engine.info();
        if let Some(r) = &self.reasoning {
            let tail_from = ids.len().saturating_sub(8);
            let tail = info
                .tokenizer
                .decode(&ids[tail_from..], false)
                .unwrap_or_default();
            reading.opened = r.opens_in(&tail);
        }
        let sampling = request::sampling_params(&req.params, top, info.vocab_size)?;
        let n = request::samples(&req.params)?;
        let ids = request::fit_prompt(ids, &req.params, info.config.max_model_len)?;
        // Last before admission: every cheap check has passed.
        let constraint = match grammar {
            Some(g) => Some(self.grammars.compile(&self.engine, g).await?),
            None => None,
        };
        let params = request::constrained(sampling, constraint)?;
        let p = &req.params;
        Ok(ChatPlan {
            adapter,
            prompt_ids: ids,
            params,
            n,
            reading,
            id: match &p.request_id {
                Some(rid) => format!("chatcmpl-{rid}"),
                None => random_id("chatcmpl", '-'),
            },
            created: super::now(),
            logprobs: req.logprobs,
            as_ids: p.return_tokens_as_token_ids,
            return_ids: p.return_token_ids,
            include_usage: p.stream_options.as_ref().is_some_and(|o| o.include_usage),
        })
    }

    /// The tools offered and how the output is read: the tool choice checked against the
    /// tools, and the grammar a forced call (named or `required`) or `response_format` implies.
    fn tooling(&self, req: &ChatRequest) -> Result<Tooling, ApiError> {
        let (tools_json, tools) = request::tools(req.tools.as_deref())?;
        let choice = request::tool_choice(req.tool_choice.as_ref())?;
        let explicit_auto = choice == ToolChoice::Auto && req.tool_choice.is_some();
        if explicit_auto && tools_json.is_some() && !self.cfg.enable_auto_tool_choice {
            return Err(ApiError::bad(
                Some("tool_choice".into()),
                "\"auto\" tool choice requires the server to run with --enable-auto-tool-choice",
            ));
        }
        let forced_name = match &choice {
            ToolChoice::Named(name) => {
                if !tools.iter().any(|t| &t.name == name) {
                    return Err(ApiError::bad(
                        Some("tool_choice".into()),
                        format!("tool_choice names `{name}`, which is not among the tools"),
                    ));
                }
                Some(Some(name.as_str()))
            }
            ToolChoice::Required => {
                if tools.is_empty() {
                    return Err(ApiError::bad(
                        Some("tool_choice".into()),
                        "tool_choice `required` needs tools",
                    ));
                }
                Some(None)
            }
            _ => None,
        };
        let parallel = req.parallel_tool_calls.unwrap_or(true);
        let mut grammar = constrain::output_grammar(&req.constraints)?;
        if let Some(only) = forced_name {
            if let Some(g) = &grammar {
                return Err(ApiError::bad(
                    Some(g.param.clone()),
                    format!(
                        "{} cannot be combined with tool_choice {}: the output is a tool call",
                        g.param,
                        only.map_or("\"required\"".to_string(), |n| format!("naming `{n}`"))
                    ),
                ));
            }
            grammar = Some(constrain::tool_call_grammar(
                self.parser.as_ref(),
                &tools,
                only,
                parallel,
            )?);
        }
        let reading = Reading {
            parse: forced_name.is_some()
                || (choice == ToolChoice::Auto
                    && self.cfg.enable_auto_tool_choice
                    && !tools.is_empty()),
            single: !parallel,
            tools,
            opened: false,
        };
        Ok(Tooling {
            tools_json,
            reading,
            grammar,
        })
    }

    /// The prompt's ids: `prompt` as given, the token history continued, or the messages
    /// rendered by the chat template (with `reasoning_effort` among its kwargs when it reads it).
    fn prompt_ids(
        &self,
        req: &ChatRequest,
        messages: &serde_json::Value,
        prompt: Option<&[u32]>,
        tools_json: Option<&serde_json::Value>,
    ) -> Result<Vec<u32>, ApiError> {
        let info = self.engine.info();
        let template = info.template.as_ref().ok_or_else(|| {
            ApiError::bad(
                None,
                "this model has no chat template (tokenizer_config.json chat_template or chat_template.jinja); use /v1/completions",
            )
        })?;
        let mut kwargs = req.chat_template_kwargs.clone().unwrap_or_default();
        if let Some(effort) = &req.reasoning_effort {
            let param = || Some("reasoning_effort".to_string());
            if !["low", "medium", "high"].contains(&effort.as_str()) {
                return Err(ApiError::bad(
                    param(),
                    format!("reasoning_effort must be low, medium or high, got {effort:?}"),
                ));
            }
            if !template.reads("reasoning_effort") {
                return Err(ApiError::bad(
                    param(),
                    "reasoning_effort cannot be honoured: this model's chat template does not read \
                     `reasoning_effort` (Qwen3 templates switch thinking on and off with \
                     chat_template_kwargs {\"enable_thinking\": false})",
                ));
            }
            kwargs
                .entry("reasoning_effort")
                .or_insert_with(|| effort.as_str().into());
        }
        let ids = match (prompt, &req.history_token_ids) {
            (Some(_), Some(_)) => {
                return Err(ApiError::bad(
                    Some("history_token_ids".into()),
                    "history_token_ids and tokens both give the prompt's ids; send one",
                ));
            }
            (Some(tokens), None) => tokens.to_vec(),
            (None, Some(history)) => continue_history(
                &info.tokenizer,
                template,
                history,
                messages,
                tools_json,
                &kwargs,
            )?,
            (None, None) => {
                let prompt = template
                    .render(
                        messages,
                        tools_json,
                        req.add_generation_prompt.unwrap_or(true),
                        &kwargs,
                    )
                    .map_err(|e| {
                        ApiError::bad(
                            Some("messages".into()),
                            format!("rendering the chat template: {e}"),
                        )
                    })?;
                info.tokenizer
                    .encode(&prompt)
                    .map_err(|e| ApiError::bad(Some("messages".into()), e.to_string()))?
            }
        };
        Ok(ids)
    }
}

/// How many top alternatives per token to return. As vLLM: `top_logprobs` only means
/// something with `logprobs: true`; a request asking for top tokens without it gets a 400, not
/// a response that silently lacks them.
fn top_logprobs(req: &ChatRequest) -> Result<usize, ApiError> {
    Ok(match (req.logprobs, req.top_logprobs) {
        (true, top) => top.unwrap_or(0),
        (false, Some(k)) if k > 0 => {
            return Err(ApiError::bad(
                Some("top_logprobs".into()),
                format!(
                    "top_logprobs ({k}) requires logprobs: true; when using top_logprobs, logprobs must be set to true"
                ),
            ));
        }
        (false, _) => 0,
    })
}

/// The prompt of a conversation whose history is given as tokens (`history_token_ids`): those
/// ids, then the template's rendering of the messages after the last assistant message (tool
/// results, a user turn) up to the generation prompt. When the history does not end with the
/// template's end-of-turn marker (a stop string ended the turn), the marker is added first, as
/// a re-render would.
pub fn continue_history(
    tokenizer: &crate::model::Tokenizer,
    template: &crate::model::ChatTemplate,
    history: &[u32],
    messages: &serde_json::Value,
    tools: Option<&serde_json::Value>,
    kwargs: &serde_json::Map<String, serde_json::Value>,
) -> Result<Vec<u32>, ApiError> {
    let param = || Some("history_token_ids".to_string());
    let list = messages.as_array().map(Vec::as_slice).unwrap_or_default();
    let last = list
        .iter()
        .rposition(|m| m["role"] == "assistant")
        .ok_or_else(|| {
            ApiError::bad(
                param(),
                "history_token_ids needs an assistant message in messages: the ids stand for \
                 the conversation up to and including the last one",
            )
        })?;
    if history.is_empty() {
        return Err(ApiError::bad(param(), "history_token_ids is empty"));
    }
    let delta = template
        .render_delta(tokenizer, &list[..=last], &list[last + 1..], tools, kwargs)
        .map_err(|e| {
            ApiError::bad(
                Some("messages".into()),
                format!("rendering the chat template: {e}"),
            )
        })?;
    let mut text = String::new();
    let closes = template.eos_token.as_deref().is_none_or(|eos| {
        eos.is_empty()
            || tokenizer
                .decode(&history[history.len() - 1..], false)
                .ok()
                .as_deref()
                == Some(eos)
    });
    if !closes {
        text.push_str(template.eos_token.as_deref().unwrap_or_default());
    }
    text.push_str(&delta.text);
    let mut ids = history.to_vec();
    ids.extend(
        tokenizer
            .encode(&text)
            .map_err(|e| ApiError::bad(Some("messages".into()), e.to_string()))?,
    );
    Ok(ids)
}
