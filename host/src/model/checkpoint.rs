//! Checkpoints as Hugging Face writes them: the parameter names and shapes a configuration
//! implies ([`parameter_shapes`]) and every tensor of a folder's `model.safetensors` or its
//! shards ([`read_checkpoint`]; [`read_checkpoint_for`] checks the names and shapes against a
//! model's before reading any tensor), every file read bounded ([`super::files`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use tch::Tensor;

use super::safetensors::SafetensorsFile;
use super::{ModelError, Qwen3Config, files};

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

/// The safetensors files of the checkpoint in `dir`, opened with their headers validated and
/// no tensor read: `model.safetensors`, or the shards `model.safetensors.index.json` lists
/// (plain file names in `dir`; a name with a folder in it is refused). A tensor in two files
/// is refused.
fn open_checkpoint(dir: &Path) -> Result<Vec<SafetensorsFile>, ModelError> {
    let mut paths: BTreeSet<std::path::PathBuf> = BTreeSet::new();
    let index = dir.join("model.safetensors.index.json");
    let bad = |message: String| ModelError::Malformed {
        path: index.clone(),
        message,
    };
    match files::read_optional_text(&index, files::CHECKPOINT_INDEX)? {
        Some(text) => {
            let v: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
            let map = v["weight_map"]
                .as_object()
                .ok_or_else(|| bad("no weight_map".into()))?;
            for f in map.values() {
                let name = f
                    .as_str()
                    .ok_or_else(|| bad(format!("weight_map names {f}: not a file name")))?;
                // A shard lives in the checkpoint's folder: "../x" or "/dev/zero" does not.
                let plain = Path::new(name).file_name().is_some_and(|n| n == name);
                if !plain {
                    return Err(bad(format!(
                        "weight_map names {name:?}: a shard must be a file name in {}",
                        dir.display()
                    )));
                }
                paths.insert(dir.join(name));
            }
        }
        None => {
            paths.insert(dir.join("model.safetensors"));
        }
    }
    let opened = paths
        .iter()
        .map(|f| SafetensorsFile::open(f, files::CHECKPOINT))
        .collect::<Result<Vec<_>, _>>()?;
    let mut seen: BTreeMap<&str, &Path> = BTreeMap::new();
    for f in &opened {
        for e in f.entries() {
            if let Some(first) = seen.insert(&e.name, f.path()) {
                return Err(ModelError::Malformed {
                    path: f.path().to_owned(),
                    message: format!("tensor {} is also in {}", e.name, first.display()),
                });
            }
        }
    }
    Ok(opened)
}

/// Reads every tensor of the opened files.
fn read_all(opened: &[SafetensorsFile]) -> Result<BTreeMap<String, Tensor>, ModelError> {
    let mut found = BTreeMap::new();
    for f in opened {
        found.extend(f.read_all()?);
    }
    Ok(found)
}

/// Every tensor of the checkpoint in `dir`: `model.safetensors`, or the shards that
/// `model.safetensors.index.json` lists; every header is validated before any tensor is read.
pub fn read_checkpoint(dir: &Path) -> Result<BTreeMap<String, Tensor>, ModelError> {
    read_all(&open_checkpoint(dir)?)
}

/// [`read_checkpoint`] for a model of `cfg`'s shape: the names and shapes in the headers are
/// checked against [`parameter_shapes`] (a tied model's file may also carry `lm_head.weight`)
/// before any tensor is read, so a checkpoint that claims other or larger tensors costs one
/// header read, not their bytes. Errors as [`super::Qwen3::assign`] gives them.
pub fn read_checkpoint_for(
    dir: &Path,
    cfg: &Qwen3Config,
) -> Result<BTreeMap<String, Tensor>, ModelError> {
    let opened = open_checkpoint(dir)?;
    let claimed: BTreeMap<&str, &[i64]> = opened
        .iter()
        .flat_map(|f| f.entries())
        .map(|e| (e.name.as_str(), e.shape.as_slice()))
        .collect();
    let shapes = parameter_shapes(cfg);
    for (name, shape) in &shapes {
        match claimed.get(name.as_str()) {
            None => {
                return Err(ModelError::Missing {
                    name: name.clone(),
                    expected: shape.clone(),
                });
            }
            Some(found) if found != shape => {
                return Err(ModelError::Shape {
                    name: name.clone(),
                    found: found.to_vec(),
                    expected: shape.clone(),
                });
            }
            Some(_) => {}
        }
    }
    let extra: Vec<&str> = claimed
        .keys()
        .copied()
        .filter(|n| !shapes.iter().any(|(s, _)| s == n))
        .filter(|n| !(cfg.tie_word_embeddings && *n == "lm_head.weight"))
        .take(8)
        .collect();
    if !extra.is_empty() {
        return Err(ModelError::Unexpected(extra.join(", ")));
    }
    read_all(&opened)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Preset, safetensors};
    use tch::{Device, Kind};

    type Named = Vec<(String, Tensor)>;

    /// Zeros of every shape `cfg` implies, under their HF names.
    fn zeros(cfg: &Qwen3Config) -> Named {
        parameter_shapes(cfg)
            .into_iter()
            .map(|(n, s)| (n, Tensor::zeros(s, (Kind::Float, Device::Cpu))))
            .collect()
    }

    /// Names and shapes are checked from the headers (missing, misshapen, unexpected tensors
    /// refused with the name; a tied model's file may carry its head), a tensor in two shards
    /// and a shard outside the folder are refused, and a whole checkpoint reads back.
    #[test]
    fn headers_are_checked_against_the_model_before_reading() {
        let mut cfg = Qwen3Config::preset(Preset::Tiny);
        cfg.tie_word_embeddings = true;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("model.safetensors");
        let mut tensors = zeros(&cfg);
        tensors.push((
            "lm_head.weight".into(),
            Tensor::zeros(
                [cfg.vocab_size, cfg.hidden_size],
                (Kind::Float, Device::Cpu),
            ),
        ));
        safetensors::write(&file, &tensors, None).unwrap();
        let read = read_checkpoint_for(dir.path(), &cfg).unwrap();
        assert_eq!(read.len(), tensors.len());
        let mut untied = cfg.clone();
        untied.tie_word_embeddings = false;
        let norm = "model.norm.weight";
        let edit = |f: &dyn Fn(&mut Named)| {
            let mut t = zeros(&untied);
            f(&mut t);
            safetensors::write(&file, &t, None).unwrap();
            read_checkpoint_for(dir.path(), &untied).unwrap_err()
        };
        let e = edit(&|t| t.retain(|(n, _)| n != norm));
        assert!(
            matches!(&e, ModelError::Missing { name, .. } if name == norm),
            "{e}"
        );
        let e = edit(&|t| {
            t.retain(|(n, _)| n != norm);
            t.push((norm.into(), Tensor::zeros([3], (Kind::Float, Device::Cpu))));
        });
        assert!(
            matches!(&e, ModelError::Shape { found, .. } if found == &[3]),
            "{e}"
        );
        let e = edit(&|t| {
            t.push((
                "extra".into(),
                Tensor::zeros([1], (Kind::Float, Device::Cpu)),
            ))
        });
        assert!(
            matches!(&e, ModelError::Unexpected(names) if names == "extra"),
            "{e}"
        );
        // Two shards, one tensor in both.
        let one = dir.path().join("one.safetensors");
        let two = dir.path().join("two.safetensors");
        safetensors::write(&one, &zeros(&untied), None).unwrap();
        safetensors::write(&two, &zeros(&untied)[..1], None).unwrap();
        let index = dir.path().join("model.safetensors.index.json");
        let map =
            serde_json::json!({"weight_map": {"a": "one.safetensors", "b": "two.safetensors"}});
        std::fs::write(&index, map.to_string()).unwrap();
        let e = read_checkpoint(dir.path()).unwrap_err().to_string();
        assert!(e.contains("is also in"), "{e}");
        for outside in [
            "../model.safetensors",
            "/dev/zero",
            "sub/x.safetensors",
            "..",
        ] {
            let map = serde_json::json!({"weight_map": {"a": outside}});
            std::fs::write(&index, map.to_string()).unwrap();
            let e = read_checkpoint(dir.path()).unwrap_err().to_string();
            assert!(e.contains("a shard must be a file name"), "{outside}: {e}");
        }
    }
}
