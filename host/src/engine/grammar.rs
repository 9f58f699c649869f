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
//! for the rows that carry a constraint, so unconstrained requests pay nothing. Building the
//! table and compiling a grammar take from milliseconds to seconds of CPU: callers run them off
//! the threads that serve requests (the server's grammar pool, `chat::constrain`).
//!
//! **Validation.** llguidance compiles parts of a grammar lazily (JSON schemas' `$ref`s, the
//! lexer) and applies its parser's limits from the first step, so a grammar that compiles can
//! still fail on its first token (a `$ref` cycle that never reaches a type, more alternatives at
//! one point than the parser allows). [`GrammarTokens::compile_lark`] therefore computes the
//! first mask too, and keeps it for every sequence that starts with the grammar.
//!
//! **Panics.** llguidance catches its own panics and returns them as errors whose text carries a
//! backtrace. Every error leaving this module is one line a client may read: a panic becomes
//! [`GrammarError::Internal`] with the panic's message alone, and the full text is logged.
//!
//! This module never chooses what a grammar is (that is the server's: tool calls, response
//! formats); it only compiles grammars and applies them to sequences.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, SimpleVob, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory, TokenParser};

use crate::model::Tokenizer;

/// Why a grammar could not be built, compiled or followed. Every message is fit for a client:
/// no parser state, grammar dump or backtrace (those are logged).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrammarError {
    /// The tokenizer cannot be described byte by byte (not a byte-level BPE).
    #[error("grammar-constrained decoding needs a byte-level BPE tokenizer: {0}")]
    Tokenizer(String),
    /// The grammar (or a JSON schema or regex inside it) does not compile; llguidance's message.
    #[error("{0}")]
    Compile(String),
    /// The grammar compiles but cannot start: it admits no output, or its first step is beyond
    /// the parser's limits.
    #[error("{0}")]
    Unusable(String),
    /// The grammar refused the sequence's next step.
    #[error("grammar-constrained decoding failed: {0}")]
    Step(String),
    /// llguidance panicked (and caught it) on this grammar: the panic's message, one line.
    #[error("the grammar library failed on this grammar (an internal error, logged): {0}")]
    Internal(String),
}

/// llguidance's error text as a [`GrammarError`] a client may read, logging the full text.
/// A panic llguidance caught reads `panic: MESSAGE` then a `<backtrace>`: it becomes
/// [`GrammarError::Internal`] with the message's first line. Other errors keep their text up to
/// the parser-state, grammar or backtrace dump llguidance appends (`kind` wraps it).
fn from_llguidance(
    e: impl std::fmt::Display,
    doing: &str,
    kind: fn(String) -> GrammarError,
) -> GrammarError {
    let full = e.to_string();
    if let Some(panic) = full.trim_start().strip_prefix("panic: ") {
        tracing::error!("llguidance panicked while {doing}: {full}");
        let first = panic.lines().next().unwrap_or_default().trim();
        return GrammarError::Internal(first.to_string());
    }
    let cut = [
        "\n<state>",
        "\n<non-verbose/>",
        "\n<backtrace>",
        "\nStack backtrace:",
    ]
    .iter()
    .filter_map(|m| full.find(m))
    .min()
    .unwrap_or(full.len());
    if cut < full.len() {
        tracing::debug!("llguidance refused a grammar while {doing}: {full}");
    }
    kind(full[..cut].trim_end().to_string())
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

    /// Compiles a Lark grammar (llguidance's dialect: `%json {…}` embeds a JSON schema) and
    /// validates it by computing its first mask: a grammar that compiles but cannot start is
    /// [`GrammarError::Unusable`]. Errors carry llguidance's message (a panic's, one line).
    /// Costs up to seconds of CPU for large grammars: never call it on a thread that serves
    /// requests.
    pub fn compile_lark(&self, lark: &str) -> Result<Constraint, GrammarError> {
        let parser = self
            .factory
            .create_parser(TopLevelGrammar::from_lark(lark.to_string()))
            .map_err(|e| from_llguidance(e, "compiling a grammar", GrammarError::Compile))?;
        let mut probe = SequenceGrammar {
            matcher: Matcher::new(Ok(parser.clone())),
            first: None,
        };
        let first = probe.mask().map_err(|e| match e {
            GrammarError::Step(m) if m.contains("NoExtensionBias") => GrammarError::Unusable(
                "the grammar admits no output: no token can start it (a JSON schema whose \
                 $ref chain never reaches a type does this)"
                    .into(),
            ),
            GrammarError::Step(m) => {
                GrammarError::Unusable(format!("the grammar cannot start: {m}"))
            }
            other => other,
        })?;
        // llguidance applies its parser's width limit (2,000 items in a row) once a token is
        // consumed, not at the start: one step is probed with the shortest allowed token (the
        // one that keeps the most alternatives open), so an alternation too wide is refused here
        // rather than at a sequence's second token.
        let trie = self.factory.tok_env().tok_trie();
        let mut shortest: Option<(usize, u32)> = None;
        first.iter_set_entries(|t| {
            let t = t as u32;
            if !trie.eos_tokens().contains(&t) {
                let len = trie.token(t).len();
                if shortest.is_none_or(|(l, _)| len < l) {
                    shortest = Some((len, t));
                }
            }
        });
        if let Some((_, t)) = shortest {
            probe
                .consume(t)
                .and_then(|()| probe.mask())
                .map_err(|e| match e {
                    GrammarError::Step(m) => GrammarError::Unusable(format!(
                        "the grammar cannot go on past its first token: {m}"
                    )),
                    other => other,
                })?;
        }
        Ok(Constraint {
            parser,
            first,
            source: lark.to_string(),
        })
    }
}

/// A compiled, validated grammar for one request: each of its sequences follows a copy.
#[derive(Clone)]
pub struct Constraint {
    parser: TokenParser,
    /// The mask at the grammar's start (computed when it was validated).
    first: SimpleVob,
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
            first: Some(self.first.clone()),
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
    /// The first mask, computed when the grammar was validated; taken by the first [`mask`].
    ///
    /// [`mask`]: SequenceGrammar::mask
    first: Option<SimpleVob>,
}

impl SequenceGrammar {
    /// The tokens allowed next (end-of-sequence only once the grammar is complete), as bit words:
    /// bit `i % 32` of word `i / 32` is token `i`. An empty set is an error.
    pub fn mask(&mut self) -> Result<SimpleVob, GrammarError> {
        if let Some(m) = self.first.take() {
            return Ok(m);
        }
        let m = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| from_llguidance(e, "computing a token mask", GrammarError::Step))?;
        if m.is_zero() {
            return Err(GrammarError::Step(
                "the grammar allows no token here".into(),
            ));
        }
        Ok(m)
    }

    /// Advances past a sampled token.
    pub fn consume(&mut self, token: u32) -> Result<(), GrammarError> {
        self.first = None;
        self.matcher
            .consume_token(token)
            .map_err(|e| from_llguidance(e, "advancing past a token", GrammarError::Step))
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

    /// llguidance's error texts as clients see them: a caught panic is its message's first
    /// line (no backtrace, no file path), other errors stop before the state dump.
    #[test]
    fn llguidance_errors_are_one_line_reasons() {
        let panic = "panic: assertion failed: grammar.symbols.len() < u16::MAX as usize - 10\n\
                     <backtrace>\n   0: llguidance::panic_utils::catch_unwind\n             at \
                     /root/.cargo/registry/src/llguidance-1.9.1/src/panic_utils.rs:40:29\n\
                     </backtrace>";
        let e = from_llguidance(panic, "compiling", GrammarError::Compile);
        assert_eq!(
            e,
            GrammarError::Internal(
                "assertion failed: grammar.symbols.len() < u16::MAX as usize - 10".into()
            )
        );
        let shown = e.to_string();
        assert!(!shown.contains('\n') && !shown.contains(".rs") && !shown.contains("backtrace"));
        let e = from_llguidance(
            "Parser Error: Current row has 20001 items; max is 2000\n<state>\nTokens: ⟦w⟧\n</state>",
            "masking",
            GrammarError::Step,
        );
        assert_eq!(
            e,
            GrammarError::Step("Parser Error: Current row has 20001 items; max is 2000".into())
        );
        // A compile error's own lines (a regex and its caret) stay: they are the reason.
        let e = from_llguidance(
            "regex parse error:\n    (?=a)\n    ^",
            "c",
            GrammarError::Compile,
        );
        assert_eq!(
            e,
            GrammarError::Compile("regex parse error:\n    (?=a)\n    ^".into())
        );
    }

    /// Grammars llguidance compiles but cannot start are refused when compiled, not when a
    /// sequence first needs a mask: a JSON schema whose `$ref`s only cycle (it admits no
    /// output), and an alternation wider than the parser's 2,000 items per row.
    #[test]
    fn grammars_that_cannot_start_are_refused_at_compile_time() {
        let (_d, tok) = tiny();
        let eos = tok.token_id("<|im_end|>").unwrap();
        let g = GrammarTokens::new(&tok, &[eos], 512).unwrap();
        for schema in [
            r##"{"$ref": "#"}"##,
            r##"{"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}"##,
            r##"{"$defs": {"a": {"allOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"}"##,
        ] {
            let e = g
                .compile_lark(&format!("start: %json {schema}"))
                .unwrap_err();
            assert!(
                matches!(&e, GrammarError::Unusable(m) if m.contains("admits no output")),
                "{schema}: {e:?}"
            );
        }
        // A recursive schema that does reach a type is fine.
        g.compile_lark(
            r##"start: %json {"$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}}}, "$ref": "#/$defs/n"}"##,
        )
        .unwrap();
        let wide: Vec<String> = (0..2500).map(|i| format!("\"a{i}\"")).collect();
        let e = g
            .compile_lark(&format!("start: {}", wide.join(" | ")))
            .map(|_| "compiled")
            .unwrap_err();
        assert!(
            matches!(&e, GrammarError::Unusable(m) if m.contains("2000")),
            "{e}"
        );
        assert!(!e.to_string().contains("<state>"), "{e}");
    }

    /// A grammar llguidance panics on (over 65k symbols: here 34,000 rules) is refused with the
    /// panic's one-line message; the backtrace llguidance attaches is not in it.
    #[test]
    fn a_panic_inside_llguidance_is_a_one_line_internal_error() {
        let (_d, tok) = tiny();
        let eos = tok.token_id("<|im_end|>").unwrap();
        let g = GrammarTokens::new(&tok, &[eos], 512).unwrap();
        let n = 34_000;
        let names: Vec<String> = (0..n).map(|i| format!("r{i}")).collect();
        let rules: Vec<String> = (0..n).map(|i| format!("r{i}: \"a{i}\" \"b\"")).collect();
        let lark = format!("start: {}\n{}\n", names.join(" | "), rules.join("\n"));
        let e = g.compile_lark(&lark).map(|_| "compiled").unwrap_err();
        assert!(matches!(e, GrammarError::Internal(_)), "{e:?}");
        let shown = e.to_string();
        assert!(shown.contains("assertion failed"), "{shown}");
        assert!(!shown.contains('\n') && !shown.contains("backtrace") && !shown.contains(".rs:"));
    }

    /// The first mask, computed when the grammar was validated, is the one a sequence gets at
    /// its start; after a token, masks are computed again.
    #[test]
    fn the_validated_first_mask_starts_every_sequence() {
        let (_d, tok) = tiny();
        let eos = tok.token_id("<|im_end|>").unwrap();
        let g = GrammarTokens::new(&tok, &[eos], 512).unwrap();
        let c = g.compile_lark(r#"start: "ab" | "cd""#).unwrap();
        let mut fresh = SequenceGrammar {
            matcher: Matcher::new(Ok(c.parser.clone())),
            first: None,
        };
        let want = fresh.mask().unwrap();
        let mut seq = c.start();
        assert_eq!(seq.mask().unwrap().to_list(), want.to_list());
        let a = tok.encode("a").unwrap()[0];
        seq.consume(a).unwrap();
        let next = seq.mask().unwrap();
        assert_ne!(next.to_list(), want.to_list());
        assert!(next.is_allowed(tok.encode("b").unwrap()[0]));
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
