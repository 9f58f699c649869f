//! The size limit of every kind of model file rlhost reads from a folder someone named (`-m`,
//! `--lora-modules`, a request's `model_path` or `lora_path`, a run's config), each with why it
//! is that size. Every such file is read through [`rlhost_fs`]'s bounded reader: regular files
//! only (a FIFO or a link to `/dev/zero` is refused at once), the size checked before a byte is
//! read, a deadline on every chunk. Safetensors files are read header first
//! ([`super::safetensors::SafetensorsFile`]).
//!
//! Files rlhost wrote itself and reads back (its caches, a run's own state) need none of this.

use std::path::Path;

use rlhost_fs::FileLimit;

use super::ModelError;

/// `config.json`: Qwen3's is 0.7 KB and a multimodal config with its vision tower about 10 KB;
/// 4 MiB is hundreds of times that, and small enough to parse at once.
pub const CONFIG: FileLimit = FileLimit::new("model config", 4 << 20);

/// `generation_config.json`: a few hundred bytes in every published model.
pub const GENERATION_CONFIG: FileLimit = FileLimit::new("generation config", 1 << 20);

/// `tokenizer.json` (and the other tokenizer files copied with a model: `vocab.json`,
/// `merges.txt`): Qwen3's is 11 MB, the largest vocabularies published (262k tokens) about
/// 33 MB; 256 MiB leaves room for larger ones and none for a file that is not a tokenizer.
pub const TOKENIZER: FileLimit = FileLimit::new("tokenizer", 256 << 20);

/// `tokenizer_config.json`: Qwen3's is 10 KB; some embed several chat templates and a list of
/// every added token (a few MB). 32 MiB.
pub const TOKENIZER_CONFIG: FileLimit = FileLimit::new("tokenizer config", 32 << 20);

/// `chat_template.jinja`: Qwen3's is 4 KB, the longest published templates (tool-calling
/// models) about 30 KB; 4 MiB.
pub const CHAT_TEMPLATE: FileLimit = FileLimit::new("chat template", 4 << 20);

/// `model.safetensors.index.json`: about 100 bytes per tensor; a 235B mixture of experts has
/// ~100k tensors (10 MB). 64 MiB.
pub const CHECKPOINT_INDEX: FileLimit = FileLimit::new("checkpoint index", 64 << 20);

/// One safetensors file of a checkpoint: an unsharded f32 Qwen3-32B (the largest dense Qwen3)
/// is 131 GB, 122 GiB; Hugging Face shards are 5 GB. 128 GiB. The tensors are read only after
/// the header has been checked against the file's size (and, for new weights, against the
/// model's shapes), so this limit bounds what a file may claim, not what is read blindly.
pub const CHECKPOINT: FileLimit = FileLimit::new("checkpoint", 128 << 30);

/// PEFT's `adapter_config.json`: about 1 KB; rank and alpha patterns that list every module
/// of a 100-layer model stay under 200 KB. 1 MiB.
pub const ADAPTER_CONFIG: FileLimit = FileLimit::new("adapter config", 1 << 20);

/// PEFT's `adapter_model.safetensors`: rank 1,024 on all seven projections of Qwen3-8B in f32
/// is 11 GB (rank 64, the usual, 0.7 GB). 16 GiB. Its header is checked against the model's
/// shapes before any tensor is read, so an adapter costs what the model implies.
pub const ADAPTER_WEIGHTS: FileLimit = FileLimit::new("adapter", 16 << 30);

/// The whole of the text file `path` under `limit`.
pub fn read_text(path: &Path, limit: FileLimit) -> Result<String, ModelError> {
    Ok(rlhost_fs::read_to_string(path, limit)?)
}

/// The text file `path` under `limit`, or `None` when it does not exist (anything else where it
/// should be, a FIFO or a file over the limit, is an error, not "absent").
pub fn read_optional_text(path: &Path, limit: FileLimit) -> Result<Option<String>, ModelError> {
    Ok(rlhost_fs::read_optional_text(path, limit)?)
}
