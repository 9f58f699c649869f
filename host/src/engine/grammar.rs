//! Grammar-constrained decoding: a request may carry a [`Constraint`] (a compiled Lark grammar,
//! JSON schemas inside it, from `llguidance`), and every sequence of that request then samples
//! only tokens that keep its output inside the grammar. Each decode step the engine asks each
//! constrained sequence's [`SequenceGrammar`] for its token mask, the sampler sets the other
//! tokens' logits to -inf before it samples (greedy and sampled rows alike), and the sampled token
//! is fed back. When the grammar is complete only end-of-sequence tokens are allowed, so the
//! sequence finishes with `stop`; a grammar that fails (no allowed token, a rejected token) ends
//! its sequence with [`FinishReason::Error`](super::FinishReason::Error), never a panic.
//!
//! **Log-probabilities.** The mask counts as truncation, like top-k and top-p: the reported
//! log-probability of a token is still the sampler's `log_softmax(logits / T)` over the whole
//! vocabulary (see [`super::sampling`]), not the renormalised masked distribution. That is what
//! the trainer recomputes from the weights, so importance ratios stay exact; a masked token's
//! log-probability can be far below what the sampling distribution gave it.
//!
//! **Cost.** The token table ([`GrammarTokens`]) is built once per engine, the first time a
//! constrained request arrives (unconstrained engines never build it); masks are computed only
//! for the rows that carry a constraint, so unconstrained requests pay nothing.
//!
//! This module never chooses what a grammar is (that is the server's: tool calls, response
//! formats); it only compiles grammars and applies them to sequences.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, SimpleVob, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory, TokenParser};

use crate::model::Tokenizer;

/// Why a grammar could not be built, compiled or followed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrammarError {
    /// The tokenizer cannot be described byte by byte (not a byte-level BPE).
    #[error("grammar-constrained decoding needs a byte-level BPE tokenizer: {0}")]
    Tokenizer(String),
    /// The grammar (or a JSON schema or regex inside it) does not compile; llguidance's message.
    #[error("{0}")]
    Compile(String),
    /// The grammar refused the sequence's next step.
    #[error("grammar-constrained decoding failed: {0}")]
    Step(String),
}

/// Every token of a model as bytes, with its end-of-sequence ids: what llguidance needs to turn a
/// grammar into token masks. Built once per engine ([`GrammarTokens::new`]); cheap to share.
pub struct GrammarTokens {
    factory: ParserFactory,
    build_seconds: f64,
}

/// GPT-2's byte-level alphabet, reversed: the printable stand-in character of each byte.
fn byte_level_chars() -> std::collections::HashMap<char, u8> {
    let direct = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut map = std::collections::HashMap::with_capacity(256);
    let mut next = 256u32;
    for b in 0..=255u8 {
        if direct(b) {
            map.insert(char::from(b), b);
        } else {
            map.insert(char::from_u32(next).expect("a valid char"), b);
            next += 1;
        }
    }
    map
}

impl GrammarTokens {
    /// The token table of `tokenizer` for a model whose logits have `vocab` columns (more than
    /// the tokenizer's ids: the rest are never allowed), ending sequences with `eos`. Pieces of
    /// the byte-level vocabulary become their bytes; added tokens marked special (`<|im_end|>`)
    /// are special tokens to llguidance (reachable only by id), other added tokens
    /// (`<tool_call>`) are their text, so a grammar's `"<tool_call>"` accepts the one token or
    /// any spelling of it in pieces.
    pub fn new(tokenizer: &Tokenizer, eos: &[u32], vocab: usize) -> Result<Self, GrammarError> {
        let started = std::time::Instant::now();
        let bad = |m: String| GrammarError::Tokenizer(m);
        if !tokenizer.is_byte_level() {
            return Err(bad("its decoder is not ByteLevel".into()));
        }
        let chars = byte_level_chars();
        let added = tokenizer.added_tokens();
        let n = vocab.max(tokenizer.vocab_size());
        let mut words: Vec<Vec<u8>> = vec![Vec::new(); n];
        for (id, word) in words.iter_mut().enumerate().take(tokenizer.vocab_size()) {
            let id = id as u32;
            let Some(piece) = tokenizer.piece(id) else {
                continue;
            };
            *word = match added.get(&id).copied() {
                Some(true) => {
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend_from_slice(piece.as_bytes());
                    w
                }
                Some(false) => piece.into_bytes(),
                None => piece
                    .chars()
                    .map(|c| chars.get(&c).copied())
                    .collect::<Option<Vec<u8>>>()
                    .ok_or_else(|| bad(format!("token {id} ({piece:?}) is not byte-level")))?,
            };
        }
        let eos: Vec<u32> = eos.iter().copied().filter(|&e| (e as usize) < n).collect();
        let Some(&first) = eos.first() else {
            return Err(bad("the model has no end-of-sequence token".into()));
        };
        let info = TokRxInfo::new(n as u32, first);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&eos);
        let env: llguidance::toktrie::TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| bad(e.to_string()))?;
        factory.quiet();
        Ok(Self {
            factory,
            build_seconds: started.elapsed().as_secs_f64(),
        })
    }

    /// Seconds [`GrammarTokens::new`] took (logged: at Qwen3's 151k tokens it is noticeable).
    pub fn build_seconds(&self) -> f64 {
        self.build_seconds
    }

    /// Tokens in a mask (the model's logits width).
    pub fn vocab_size(&self) -> usize {
        self.factory.tok_env().tok_trie().vocab_size()
    }

    /// Compiles a Lark grammar (llguidance's dialect: `%json {…}` embeds a JSON schema). The
    /// error is llguidance's message.
    pub fn compile_lark(&self, lark: &str) -> Result<Constraint, GrammarError> {
        let parser = self
            .factory
            .create_parser(TopLevelGrammar::from_lark(lark.to_string()))
            .map_err(|e| GrammarError::Compile(e.to_string()))?;
        Ok(Constraint {
            parser,
            source: lark.to_string(),
        })
    }
}

/// A compiled grammar for one request: each of its sequences follows a copy.
#[derive(Clone)]
pub struct Constraint {
    parser: TokenParser,
    source: String,
}

impl Constraint {
    /// The Lark source it was compiled from.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// A fresh matcher at the start of the grammar.
    pub fn start(&self) -> SequenceGrammar {
        SequenceGrammar {
            matcher: Matcher::new(Ok(self.parser.clone())),
        }
    }
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("source", &self.source)
            .finish()
    }
}

impl PartialEq for Constraint {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

/// One sequence's place in its grammar.
pub struct SequenceGrammar {
    matcher: Matcher,
}

impl SequenceGrammar {
    /// The tokens allowed next (end-of-sequence only once the grammar is complete), as bit words:
    /// bit `i % 32` of word `i / 32` is token `i`. An empty set is an error.
    pub fn mask(&mut self) -> Result<SimpleVob, GrammarError> {
        let m = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| GrammarError::Step(e.to_string()))?;
        if m.is_zero() {
            return Err(GrammarError::Step(
                "the grammar allows no token here".into(),
            ));
        }
        Ok(m)
    }

    /// Advances past a sampled token.
    pub fn consume(&mut self, token: u32) -> Result<(), GrammarError> {
        self.matcher
            .consume_token(token)
            .map_err(|e| GrammarError::Step(e.to_string()))
    }

    /// Whether the output so far is a complete sentence of the grammar.
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> (tempfile::TempDir, Tokenizer) {
        let dir = tempfile::tempdir().unwrap();
        crate::model::tiny_tokenizer::write(dir.path(), 512).unwrap();
        let tok = Tokenizer::load(dir.path()).unwrap();
        (dir, tok)
    }

    /// The mask is exactly the set of tokens whose bytes keep the output a prefix of the
    /// grammar's language, checked token by token against a direct test of the language
    /// (`a` digits then `;`, or the word `none`).
    #[test]
    fn the_mask_equals_a_direct_check_of_every_token() {
        let (_d, tok) = tiny();
        let eos = tok.token_id("<|im_end|>").unwrap();
        // 600 columns: more than the tokenizer's 512 ids, the rest never allowed.
        let g = GrammarTokens::new(&tok, &[eos], 600).unwrap();
        assert_eq!(g.vocab_size(), 600);
        let c = g
            .compile_lark(r#"start: /[0-9]{1,3}/ ";" | "none""#)
            .unwrap();
        // In the language: digits (1-3) then ';', or exactly "none".
        let viable = |s: &str| -> bool {
            let digits = s.chars().take_while(char::is_ascii_digit).count();
            let rest = &s[digits..];
            let numeric = (1..=3).contains(&digits) && (rest.is_empty() || rest == ";")
                || (digits == 0 && rest.is_empty());
            numeric || "none".starts_with(s)
        };
        for prefix in ["", "1", "12", "no"] {
            let mut seq = c.start();
            for t in tok.encode(prefix).unwrap() {
                seq.consume(t).unwrap();
            }
            let mask = seq.mask().unwrap();
            let added = tok.added_tokens();
            for id in 0..600u32 {
                let want = if (id as usize) < 512 && !added.contains_key(&id) {
                    let text = tok.decode(&[id], false).unwrap();
                    let whole = format!("{prefix}{text}");
                    !text.is_empty() && !text.contains('\u{FFFD}') && viable(&whole)
                } else {
                    false
                };
                assert_eq!(
                    mask.is_allowed(id),
                    want,
                    "token {id} {:?} after {prefix:?}",
                    tok.decode(&[id], false)
                );
            }
        }
        // Complete ("12;"): only end-of-sequence is left.
        let mut seq = c.start();
        for t in tok.encode("12;").unwrap() {
            seq.consume(t).unwrap();
        }
        assert!(seq.is_accepting());
        let mask = seq.mask().unwrap();
        assert_eq!(mask.to_list(), vec![eos]);
    }

    #[test]
    fn a_token_outside_the_grammar_is_an_error_not_a_panic() {
        let (_d, tok) = tiny();
        let eos = tok.token_id("<|im_end|>").unwrap();
        let g = GrammarTokens::new(&tok, &[eos], 512).unwrap();
        let c = g.compile_lark(r#"start: "yes" | "no""#).unwrap();
        let mut seq = c.start();
        let x = tok.encode("x").unwrap()[0];
        assert!(matches!(seq.consume(x), Err(GrammarError::Step(_))));
        // The matcher stays failed: its next mask is an error too.
        assert!(seq.mask().is_err());
        let e = g
            .compile_lark("start: %json {\"type\": \"nope\"}")
            .unwrap_err();
        assert!(matches!(e, GrammarError::Compile(_)), "{e}");
    }

    /// Both parsers' call grammars accept the calls the parsers read, with schema-typed values,
    /// and refuse an undeclared parameter.
    #[test]
    fn parser_call_grammars_accept_their_own_format() {
        use crate::model::tool_parsers::{Hermes, Qwen3Coder, ToolCallParser};
        let (_d, tok) = tiny();
        let eos = tok.token_id("<|im_end|>").unwrap();
        let g = GrammarTokens::new(&tok, &[eos], 512).unwrap();
        let schema = serde_json::json!({"type": "object", "properties": {
            "code": {"type": "string"}, "n": {"type": "integer", "minimum": 0, "maximum": 9},
            "mode": {"type": "string", "enum": ["a", "b"]}}, "required": ["code", "n"]});
        let accepts = |p: &dyn ToolCallParser, text: &str| -> bool {
            let lark = format!("start: c\n{}", p.call_grammar("c", "python", &schema));
            let mut seq = g.compile_lark(&lark).unwrap().start();
            tok.encode(text)
                .unwrap()
                .into_iter()
                .all(|t| seq.consume(t).is_ok())
                && seq.is_accepting()
        };
        let hermes = "<tool_call>\n{\"name\": \"python\", \"arguments\": {\"code\": \"print(1)\", \"n\": 3}}\n</tool_call>";
        assert!(accepts(&Hermes, hermes));
        assert!(!accepts(&Hermes, &hermes.replace("3", "12")));
        let coder = "<tool_call>\n<function=python>\n<parameter=code>\nif a < b:\n    print('</x>')\n</parameter>\n<parameter=n>\n7\n</parameter>\n<parameter=mode>\nb\n</parameter>\n</function>\n</tool_call>";
        assert!(accepts(&Qwen3Coder, coder));
        let read = Qwen3Coder.parse(
            coder,
            &[rlhost_sdk::types::Tool {
                name: "python".into(),
                description: String::new(),
                parameters: schema.to_string(),
            }],
        );
        assert_eq!(read.calls.len(), 1);
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&read.calls[0].arguments).unwrap(),
            serde_json::json!({"code": "if a < b:\n    print('</x>')", "n": 7, "mode": "b"})
        );
        assert!(!accepts(
            &Qwen3Coder,
            &coder.replace("<parameter=mode>\nb", "<parameter=mode>\nc")
        ));
        assert!(!accepts(
            &Qwen3Coder,
            &coder.replace("parameter=n>\n7", "parameter=n>\nx")
        ));
    }

    /// Added tokens that are not special (`<tool_call>`) are text: the grammar's literal accepts
    /// the single token; special ones are reachable only as end-of-sequence.
    #[test]
    fn added_tokens_are_text_and_special_tokens_are_not() {
        let (_d, tok) = tiny();
        let eos = tok.token_id("<|im_end|>").unwrap();
        let g = GrammarTokens::new(&tok, &[eos], 512).unwrap();
        let c = g.compile_lark(r#"start: "<tool_call>" "x""#).unwrap();
        let mut seq = c.start();
        let mask = seq.mask().unwrap();
        let call = tok.token_id("<tool_call>").unwrap();
        assert!(mask.is_allowed(call));
        assert!(!mask.is_allowed(tok.token_id("<|im_start|>").unwrap()));
        assert!(!mask.is_allowed(eos));
    }
}
