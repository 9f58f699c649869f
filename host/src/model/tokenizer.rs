//! Tokenizers: Hugging Face `tokenizer.json` through the `tokenizers` crate, with the special
//! tokens `tokenizer_config.json` names (end of sequence, padding, the chat and tool markers).
//! Text is encoded without adding special tokens (Qwen has no BOS; chat templates write the
//! markers themselves), as transformers does for chat rendering.

use std::path::Path;

use super::{ModelError, files};

/// A model's tokenizer.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// End-of-sequence token id (`eos_token`), when the config names one.
    pub eos: Option<u32>,
    /// Padding token id (`pad_token`), when the config names one.
    pub pad: Option<u32>,
    /// The ids of every special (added, `special: true`) token.
    pub special: Vec<u32>,
}

fn io(path: &Path, e: impl std::fmt::Display) -> ModelError {
    ModelError::Io {
        path: path.to_owned(),
        message: e.to_string(),
    }
}

impl Tokenizer {
    /// Loads `dir/tokenizer.json` and, when present, `dir/tokenizer_config.json`.
    pub fn load(dir: &Path) -> Result<Self, ModelError> {
        let file = dir.join("tokenizer.json");
        let bytes = rlhost_fs::read(&file, files::TOKENIZER)?;
        let inner = tokenizers::Tokenizer::from_bytes(bytes).map_err(|e| io(&file, e))?;
        let config = dir.join("tokenizer_config.json");
        let cfg: serde_json::Value =
            match files::read_optional_text(&config, files::TOKENIZER_CONFIG)? {
                Some(text) => serde_json::from_str(&text).map_err(|e| ModelError::Config {
                    path: config.clone(),
                    message: e.to_string(),
                })?,
                None => serde_json::Value::Null,
            };
        let token = |key: &str| -> Option<u32> {
            let v = &cfg[key];
            let name = v.as_str().or_else(|| v["content"].as_str())?;
            inner.token_to_id(name)
        };
        let mut special: Vec<u32> = inner
            .get_added_tokens_decoder()
            .iter()
            .filter(|(_, t)| t.special)
            .map(|(id, _)| *id)
            .collect();
        special.sort_unstable();
        Ok(Self {
            eos: token("eos_token"),
            pad: token("pad_token"),
            special,
            inner,
        })
    }

    /// Token ids of `text` (no special tokens added).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, ModelError> {
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| ModelError::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Token strings of `text` (byte-level pieces such as `Ġworld`).
    pub fn tokens(&self, text: &str) -> Result<Vec<String>, ModelError> {
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| ModelError::Tokenizer(e.to_string()))?;
        Ok(enc.get_tokens().to_vec())
    }

    /// Text of `ids`, with or without the special tokens.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, ModelError> {
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| ModelError::Tokenizer(e.to_string()))
    }

    /// The id of a token string, if it is in the vocabulary.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The vocabulary entry of `id` as stored: a byte-level piece (`Ġworld`) or an added
    /// token's text (`<|im_end|>`).
    pub fn piece(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The added tokens (`<|im_end|>`, Qwen3's `<tool_call>`): id → whether it is special.
    pub fn added_tokens(&self) -> std::collections::HashMap<u32, bool> {
        self.inner
            .get_added_tokens_decoder()
            .iter()
            .map(|(&id, t)| (id, t.special))
            .collect()
    }

    /// Whether pieces are byte-level (GPT-2's byte alphabet, as Qwen's): each piece's
    /// characters then stand for bytes.
    pub fn is_byte_level(&self) -> bool {
        matches!(
            self.inner.get_decoder(),
            Some(tokenizers::DecoderWrapper::ByteLevel(_))
        )
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
}

/// Files of a model folder that belong to its tokenizer and chat template.
pub const TOKENIZER_FILES: [&str; 7] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "generation_config.json",
];

/// Copies the tokenizer and chat-template files `from` has into `to` (each atomically), so a
/// folder of new weights is a complete model.
pub fn copy_files(from: &Path, to: &Path) -> Result<(), ModelError> {
    for name in TOKENIZER_FILES {
        let src = from.join(name);
        if src.is_file() {
            let bytes = rlhost_fs::read(&src, files::TOKENIZER)?;
            let dst = to.join(name);
            rlhost_fs::write_atomically(&dst, &bytes).map_err(|e| io(&dst, e))?;
        }
    }
    Ok(())
}
