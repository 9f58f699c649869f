//! Text completions (`/v1/completions`): one or more prompts, as text or ids, each generated
//! `n` times with the same sampling and constraints as chat; no template, no output reading.

use std::sync::Arc;

use crate::openai::{
    ApiError, CompletionRequest, Prompt, TextChoice, TextCompletion, TextCompletionChunk,
};

use super::wire::{header, stop_reason, text_logprobs, usage};
use super::{Pipeline, Reply, engine_error, grammar_failure, random_id, request, stream};

/// What a text completion's answer carries besides the tokens.
pub(super) struct TextPlan {
    /// Samples per prompt.
    pub n: usize,
    /// The response id (`cmpl-…`).
    pub id: String,
    /// When the request was planned (Unix seconds).
    pub created: u64,
    /// Return log-probs (`logprobs` set, to any number).
    pub logprobs: bool,
    /// Write tokens as `token_id:N`.
    pub as_ids: bool,
    /// Send a usage chunk last.
    pub include_usage: bool,
    /// Every prompt's tokens, together.
    pub prompt_tokens: usize,
    /// The LoRA adapter it runs with (by name), if any.
    pub adapter: Option<String>,
}

impl Pipeline {
    /// A text completion, whole or streamed as `req.params.stream` asks.
    pub async fn completions(
        self: &Arc<Self>,
        req: &CompletionRequest,
    ) -> Result<Reply<TextCompletion, TextCompletionChunk>, ApiError> {
        let adapter = self.check_model(&req.params.model)?;
        if req.echo {
            return Err(ApiError::bad(Some("echo".into()), "echo is not supported"));
        }
        let prompts = self.prompts(req)?;
        if req.top_logprobs.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(ApiError::bad(
                Some("top_logprobs".into()),
                "top_logprobs is a chat completions field; in /v1/completions, logprobs is the number of top log-probs returned per token (an integer, 0 to 20)",
            ));
        }
        let top = req.logprobs.unwrap_or(0);
        if top > crate::engine::sampling::MAX_TOP_LOGPROBS {
            return Err(ApiError::bad(
                Some("logprobs".into()),
                format!(
                    "logprobs must be at most {}, got {top}",
                    crate::engine::sampling::MAX_TOP_LOGPROBS
                ),
            ));
        }
        let info = self.engine.info();
        let grammar = super::constrain::output_grammar(&req.constraints)?;
        let sampling = request::sampling_params(&req.params, top, info.vocab_size)?;
        let n = request::samples(&req.params)?;
        request::best_of(req.best_of, n)?;
        let prompts = prompts
            .into_iter()
            .map(|p| request::fit_prompt(p, &req.params, info.config.max_model_len))
            .collect::<Result<Vec<_>, _>>()?;
        // Last before admission: every cheap check has passed.
        let constraint = match grammar {
            Some(g) => Some(self.grammars.compile(&self.engine, g).await?),
            None => None,
        };
        let params = request::constrained(sampling, constraint)?;
        let p = &req.params;
        let plan = TextPlan {
            n,
            id: match &p.request_id {
                Some(rid) => format!("cmpl-{rid}"),
                None => random_id("cmpl", '-'),
            },
            created: super::now(),
            logprobs: req.logprobs.is_some(),
            as_ids: p.return_tokens_as_token_ids,
            include_usage: p.stream_options.as_ref().is_some_and(|o| o.include_usage),
            prompt_tokens: prompts.iter().map(Vec::len).sum(),
            adapter,
        };
        let mut rxs = Vec::new();
        for ids in &prompts {
            rxs.push(
                self.engine
                    .submit_to(plan.adapter.as_deref(), ids.clone(), params.clone(), n)
                    .map_err(|e| engine_error(e, "prompt"))?,
            );
        }
        if p.stream {
            return Ok(Reply::Stream(stream::completion(self.clone(), rxs, plan)));
        }
        let return_ids = p.return_token_ids;
        let mut choices = Vec::new();
        let mut all = Vec::new();
        for (k, (mut rx, ids)) in rxs.into_iter().zip(&prompts).enumerate() {
            let done = crate::engine::collect(&mut rx, n, ids.len())
                .await
                .map_err(|e| engine_error(e, "prompt"))?;
            grammar_failure(&done)?;
            for c in &done {
                choices.push(TextChoice {
                    index: k * n + c.index,
                    text: c.text.clone(),
                    logprobs: plan.logprobs.then(|| text_logprobs(self, c, plan.as_ids)),
                    finish_reason: c.finish_reason.as_str().to_string(),
                    stop_reason: stop_reason(&c.stop),
                    policy_version: c.versions.last().copied(),
                    token_ids: return_ids.then(|| c.token_ids.clone()),
                    prompt_token_ids: return_ids.then(|| ids.clone()),
                });
            }
            all.extend(done);
        }
        let done: Vec<_> = all.iter().collect();
        Ok(Reply::Full(TextCompletion {
            header: header(
                &self.model_name(&plan.adapter),
                &plan.id,
                plan.created,
                "text_completion",
            ),
            choices,
            usage: Some(usage(plan.prompt_tokens, &all)),
            policy_version: Some(self.policy_version(&done)),
            prompt_token_ids: return_ids.then(|| prompts.concat()),
        }))
    }

    /// The request's prompts as token ids: text is tokenized, ids are taken as given.
    fn prompts(&self, req: &CompletionRequest) -> Result<Vec<Vec<u32>>, ApiError> {
        let encode = |t: &str| {
            self.engine
                .info()
                .tokenizer
                .encode(t)
                .map_err(|e| ApiError::bad(Some("prompt".into()), e.to_string()))
        };
        let prompts: Vec<Vec<u32>> = match &req.prompt {
            None => return Err(ApiError::bad(Some("prompt".into()), "prompt is required")),
            Some(Prompt::Text(t)) => vec![encode(t)?],
            Some(Prompt::Ids(ids)) => vec![ids.clone()],
            Some(Prompt::Texts(ts)) => ts.iter().map(|t| encode(t)).collect::<Result<_, _>>()?,
            Some(Prompt::IdLists(l)) => l.clone(),
        };
        if prompts.is_empty() {
            return Err(ApiError::bad(
                Some("prompt".into()),
                "prompt must not be empty",
            ));
        }
        Ok(prompts)
    }
}
