//! The tokenizer rlhost builds for the models it creates (`host model init --preset tiny`): a
//! byte-level BPE in the layout of Qwen3's — NFC, Qwen's split pattern (every digit its own
//! piece, which keeps arithmetic learnable), byte-level pieces, merges learnt from a built-in
//! corpus of the text the environments exchange (chat turns, tool schemas, math prompts, LaTeX,
//! Python, numbers) — with Qwen3's chat and tool markers appended after the learnt vocabulary.
//! Any text round-trips (every byte is a token). Saved as a standard `tokenizer.json`, with a
//! `tokenizer_config.json` that carries the chat template (Qwen3's wire format, written by
//! rlhost: [`CHAT_TEMPLATE`]), so `transformers` and rlhost load the folder the same way.

use std::path::Path;

use tokenizers::models::TrainerWrapper;
use tokenizers::models::bpe::{BPE, BpeTrainer};
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use super::ModelError;

/// The chat template written into the folders rlhost creates: Qwen3's wire format (ChatML turns,
/// hermes `<tool_call>` JSON, `<tool_response>` blocks, `<think>` reasoning).
pub const CHAT_TEMPLATE: &str = include_str!("chatml_tools.jinja");

/// Qwen's pre-tokenization pattern: contractions, words, single digits, punctuation runs,
/// newlines, spaces.
const SPLIT_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Added tokens, in id order after the learnt vocabulary: `(content, special)`. Qwen3 marks the
/// ChatML markers special (dropped by `decode(skip_special)`) and the tool/think tags not.
pub const ADDED_TOKENS: [(&str, bool); 9] = [
    ("<|endoftext|>", true),
    ("<|im_start|>", true),
    ("<|im_end|>", true),
    ("<tool_call>", false),
    ("</tool_call>", false),
    ("<tool_response>", false),
    ("</tool_response>", false),
    ("<think>", false),
    ("</think>", false),
];

/// Smallest vocabulary [`build`] accepts: the 256 bytes plus the added tokens.
pub const MIN_VOCAB: usize = 256 + ADDED_TOKENS.len();

fn tok_err(e: impl std::fmt::Display) -> ModelError {
    ModelError::Tokenizer(e.to_string())
}

/// Builds the tokenizer with exactly `vocab_size` tokens (learnt merges + added tokens).
/// Deterministic: the same size gives the same `tokenizer.json`.
pub fn build(vocab_size: usize) -> Result<tokenizers::Tokenizer, ModelError> {
    if vocab_size < MIN_VOCAB {
        return Err(ModelError::Tokenizer(format!(
            "a byte-level tokenizer needs at least {MIN_VOCAB} tokens (256 bytes + {} markers), \
             the config asks for {vocab_size}",
            ADDED_TOKENS.len()
        )));
    }
    let split = Split::new(
        SplitPattern::Regex(SPLIT_PATTERN.into()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(tok_err)?;
    let byte_level = ByteLevel::new(false, false, false);
    let mut tokenizer = tokenizers::Tokenizer::new(BPE::default());
    tokenizer
        .with_normalizer(Some(NFC))
        .map_err(tok_err)?
        .with_pre_tokenizer(Some(Sequence::new(vec![split.into(), byte_level.into()])))
        .with_post_processor(Some(byte_level))
        .with_decoder(Some(byte_level));
    let mut trainer = TrainerWrapper::BpeTrainer(
        BpeTrainer::builder()
            .vocab_size(vocab_size - ADDED_TOKENS.len())
            .min_frequency(2)
            .show_progress(false)
            .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
            .build(),
    );
    tokenizer
        .train(&mut trainer, corpus().into_iter())
        .map_err(tok_err)?;
    let learnt = tokenizer.get_vocab_size(false);
    if learnt + ADDED_TOKENS.len() != vocab_size {
        // The corpus ran out of pairs to merge before the target size.
        return Err(ModelError::Tokenizer(format!(
            "the built-in corpus yields {learnt} tokens, fewer than the {} asked for",
            vocab_size - ADDED_TOKENS.len()
        )));
    }
    for (content, special) in ADDED_TOKENS {
        let token = AddedToken::from(content, special).normalized(false);
        if special {
            tokenizer.add_special_tokens([token]).map_err(tok_err)?;
        } else {
            tokenizer.add_tokens([token]).map_err(tok_err)?;
        }
    }
    Ok(tokenizer)
}

/// Writes `tokenizer.json`, `tokenizer_config.json` (special tokens + [`CHAT_TEMPLATE`]) and
/// `generation_config.json` for a tokenizer of `vocab_size` tokens into `dir`. Returns the ids of
/// `<|endoftext|>` (padding, BOS) and `<|im_end|>` (end of turn) for `config.json`.
pub fn write(dir: &Path, vocab_size: usize) -> Result<(u32, u32), ModelError> {
    let tokenizer = build(vocab_size)?;
    let id = |t: &str| tokenizer.token_to_id(t).expect("added token");
    let (endoftext, im_end) = (id("<|endoftext|>"), id("<|im_end|>"));
    let added: serde_json::Map<String, serde_json::Value> = ADDED_TOKENS
        .iter()
        .map(|&(content, special)| {
            (
                id(content).to_string(),
                serde_json::json!({
                    "content": content, "lstrip": false, "normalized": false,
                    "rstrip": false, "single_word": false, "special": special,
                }),
            )
        })
        .collect();
    let config = serde_json::json!({
        "add_bos_token": false,
        "add_prefix_space": false,
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": null,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": false,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": false,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": null,
    });
    let generation = serde_json::json!({
        "bos_token_id": endoftext,
        "eos_token_id": [im_end, endoftext],
        "pad_token_id": endoftext,
    });
    let json = tokenizer.to_string(true).map_err(tok_err)?;
    for (name, text) in [
        ("tokenizer.json", json),
        (
            "tokenizer_config.json",
            serde_json::to_string_pretty(&config).expect("json") + "\n",
        ),
        (
            "generation_config.json",
            serde_json::to_string_pretty(&generation).expect("json") + "\n",
        ),
    ] {
        let path = dir.join(name);
        rlhost_fs::write_atomically(&path, text.as_bytes()).map_err(|e| ModelError::Io {
            path,
            message: e.to_string(),
        })?;
    }
    Ok((endoftext, im_end))
}

/// A small deterministic PRNG (xorshift64*) for the generated part of the corpus.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// The training text: the phrases the environments and the chat template write, weighted by
/// repetition, plus generated arithmetic, LaTeX and Python.
fn corpus() -> Vec<String> {
    const PHRASES: &[&str] = &[
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n",
        "<|im_start|>user\n",
        "<|im_start|>assistant\n<think>\n\n</think>\n\n",
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are \
         provided with function signatures within <tools></tools> XML tags:\n<tools>\n",
        "For each function call, return a json object with function name and arguments within \
         <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \
         \"arguments\": <args-json-object>}\n</tool_call>",
        "{\"type\": \"function\", \"function\": {\"name\": \"python\", \"description\": \"Evaluate \
         Python code and return its output.\", \"parameters\": {\"type\": \"object\", \
         \"properties\": {\"code\": {\"type\": \"string\", \"description\": \"The code to \
         run.\"}}, \"required\": [\"code\"]}}}",
        "<tool_call>\n{\"name\": \"python\", \"arguments\": {\"code\": \"print(",
        "<tool_response>\nOut[1]: ",
        "Solve the following math problem. Explain your reasoning and put the final answer in \
         \\boxed{}.",
        "Please reason step by step, and put your final answer within \\boxed{}.",
        "Use python for all calculations. Give your answer in the form \\boxed{answer}.",
        "What is the value of the expression? Compute the sum, the product and the difference.",
        "Let x be a real number such that the equation holds. Find the number of integers n.",
        "The answer is \\boxed{",
        "Therefore, the final answer is ",
        "Traceback (most recent call last):\nSyntaxError: invalid syntax\nNameError: name is \
         not defined\n",
        "import math\nimport numpy as np\nfrom sympy import symbols, solve, simplify, Rational\n",
        "def f(x):\n    return x ** 2 + 2 * x + 1\n\nfor i in range(10):\n    print(i, f(i))\n",
        "\\frac{1}{2} \\sqrt{3} \\cdot \\times \\pi \\left( \\right) \\le \\ge \\neq \\infty \
         x^{2} a_{n} \\sin \\cos \\log \\text{ cm} \\dfrac{3}{4} \\mathrm{d}x \\int_0^1 \\sum_{k=1}^{n}",
    ];
    let mut lines: Vec<String> = Vec::new();
    for _ in 0..8 {
        lines.extend(PHRASES.iter().map(|s| s.to_string()));
    }
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let ops = ["+", "-", "*", "/", "="];
    for _ in 0..400 {
        let a = rng.below(100_000);
        let b = rng.below(1_000);
        let op = ops[rng.below(ops.len() as u64) as usize];
        lines.push(format!(
            "What is {a} {op} {b}? Compute {a}{op}{b} with python: print({a} {op} {b}) \
             gives the answer \\boxed{{{}}}.",
            rng.below(1_000_000)
        ));
        lines.push(format!(
            "\\frac{{{a}}}{{{b}}} + x^{{{}}} = {}",
            rng.below(10),
            rng.below(1000)
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_size_markers_last_and_deterministic() {
        let t = build(512).unwrap();
        assert_eq!(t.get_vocab_size(true), 512);
        for (i, (content, _)) in ADDED_TOKENS.iter().enumerate() {
            assert_eq!(
                t.token_to_id(content),
                Some((512 - ADDED_TOKENS.len() + i) as u32)
            );
        }
        // Training hashes with random seeds; the result must not depend on them.
        assert_eq!(
            t.to_string(false).unwrap(),
            build(512).unwrap().to_string(false).unwrap()
        );
    }

    #[test]
    fn too_small_a_vocabulary_is_an_error() {
        let e = build(100).err().unwrap().to_string();
        assert!(e.contains("at least 265"), "{e}");
    }
}
