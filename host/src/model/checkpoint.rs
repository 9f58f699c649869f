//! Checkpoints as Hugging Face writes them: the parameter names and shapes a configuration
//! implies ([`parameter_shapes`]) and every tensor of a folder's `model.safetensors` or its
//! shards ([`read_checkpoint`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use tch::Tensor;

use super::{ModelError, Qwen3Config, safetensors};

/// HF names and shapes of every parameter `cfg` implies.
pub fn parameter_shapes(cfg: &Qwen3Config) -> Vec<(String, Vec<i64>)> {
    let (h, hd) = (cfg.hidden_size, cfg.head_dim);
    let (q, kv) = (cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd);
    let mut out = vec![(
        "model.embed_tokens.weight".to_string(),
        vec![cfg.vocab_size, h],
    )];
    for i in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{i}");
        for (n, s) in [
            ("self_attn.q_proj.weight", vec![q, h]),
            ("self_attn.k_proj.weight", vec![kv, h]),
            ("self_attn.v_proj.weight", vec![kv, h]),
            ("self_attn.o_proj.weight", vec![h, q]),
            ("self_attn.q_norm.weight", vec![hd]),
            ("self_attn.k_norm.weight", vec![hd]),
            ("input_layernorm.weight", vec![h]),
            ("post_attention_layernorm.weight", vec![h]),
            ("mlp.gate_proj.weight", vec![cfg.intermediate_size, h]),
            ("mlp.up_proj.weight", vec![cfg.intermediate_size, h]),
            ("mlp.down_proj.weight", vec![h, cfg.intermediate_size]),
        ] {
            out.push((format!("{p}.{n}"), s));
        }
    }
    out.push(("model.norm.weight".into(), vec![h]));
    if !cfg.tie_word_embeddings {
        out.push(("lm_head.weight".into(), vec![cfg.vocab_size, h]));
    }
    out
}

/// Every tensor of the checkpoint in `dir`: `model.safetensors`, or the shards that
/// `model.safetensors.index.json` lists.
pub fn read_checkpoint(dir: &Path) -> Result<BTreeMap<String, Tensor>, ModelError> {
    let mut files: BTreeSet<std::path::PathBuf> = BTreeSet::new();
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        let text = std::fs::read_to_string(&index).map_err(|e| ModelError::Io {
            path: index.clone(),
            message: e.to_string(),
        })?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| ModelError::Malformed {
                path: index.clone(),
                message: e.to_string(),
            })?;
        let map = v["weight_map"]
            .as_object()
            .ok_or_else(|| ModelError::Malformed {
                path: index.clone(),
                message: "no weight_map".into(),
            })?;
        files.extend(map.values().filter_map(|f| f.as_str()).map(|f| dir.join(f)));
    } else {
        files.insert(dir.join("model.safetensors"));
    }
    let mut found: BTreeMap<String, Tensor> = BTreeMap::new();
    for f in &files {
        found.extend(safetensors::read(f)?);
    }
    Ok(found)
}
