//! `Qwen3Config`: `config.json` of a Hugging Face Qwen3 model, and the presets `host model init`
//! creates (a tiny CPU model, and the real 0.6B / 4B / 8B shapes).

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::ModelError;

/// The fields of a Qwen3 `config.json` rlhost uses (others are kept when read and written back).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Qwen3Config {
    /// Vocabulary size (rows of the embedding).
    pub vocab_size: i64,
    /// Model width.
    pub hidden_size: i64,
    /// Decoder layers.
    pub num_hidden_layers: i64,
    /// Query heads.
    pub num_attention_heads: i64,
    /// Key/value heads (grouped-query attention when fewer than query heads).
    pub num_key_value_heads: i64,
    /// Width of one head (Qwen3 sets it explicitly; not always hidden / heads).
    pub head_dim: i64,
    /// MLP width.
    pub intermediate_size: i64,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// Rotary base (transformers 5 writes it inside `rope_parameters`; both are read).
    #[serde(default = "unset")]
    pub rope_theta: f64,
    /// Longest position the model was trained for.
    pub max_position_embeddings: i64,
    /// `lm_head` shares the embedding matrix.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Storage dtype of the checkpoint (`float32`, `bfloat16`, …).
    #[serde(default = "default_dtype", alias = "dtype")]
    pub torch_dtype: String,
    /// Attention projections have biases (false for Qwen3).
    #[serde(default)]
    pub attention_bias: bool,
    /// Everything else in the file, written back unchanged.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

fn unset() -> f64 {
    f64::NAN
}

fn default_dtype() -> String {
    "float32".into()
}

/// Sizes `host model init` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Preset {
    /// About 1.7M parameters: 4 layers, width 192, GQA (4 query / 2 key-value heads of 48), a
    /// 512-token vocabulary; for CPU tests and the demo.
    Tiny,
    /// Qwen3-0.6B's shape.
    #[value(name = "0.6b")]
    P0_6b,
    /// Qwen3-1.7B's shape (published config: width 2048, 28 layers, 16 query / 8 key-value
    /// heads, MLP 6144, tied embeddings).
    #[value(name = "1.7b")]
    P1_7b,
    /// Qwen3-4B's shape.
    #[value(name = "4b")]
    P4b,
    /// Qwen3-8B's shape.
    #[value(name = "8b")]
    P8b,
}

impl std::fmt::Display for Preset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Preset::Tiny => "tiny",
            Preset::P0_6b => "0.6b",
            Preset::P1_7b => "1.7b",
            Preset::P4b => "4b",
            Preset::P8b => "8b",
        })
    }
}

impl Qwen3Config {
    /// Reads `dir/config.json`.
    pub fn load(dir: &Path) -> Result<Self, ModelError> {
        let path = dir.join("config.json");
        let text = super::files::read_text(&path, super::files::CONFIG)?;
        let mut cfg: Self = serde_json::from_str(&text).map_err(|e| ModelError::Config {
            path: path.clone(),
            message: e.to_string(),
        })?;
        if cfg.rope_theta.is_nan() {
            let params = cfg.extra.get("rope_parameters");
            match params
                .and_then(|p| p.get("rope_theta"))
                .and_then(|t| t.as_f64())
            {
                Some(t) => cfg.rope_theta = t,
                None => {
                    return Err(ModelError::Config {
                        path,
                        message: "no rope_theta (nor rope_parameters.rope_theta)".into(),
                    });
                }
            }
        }
        cfg.validate()
            .map_err(|message| ModelError::Config { path, message })?;
        Ok(cfg)
    }

    /// Checks what the implementation relies on.
    pub fn validate(&self) -> Result<(), String> {
        let model_type = self.extra.get("model_type").and_then(|v| v.as_str());
        if let Some(t) = model_type.filter(|t| *t != "qwen3") {
            return Err(format!("model_type is {t:?}: only \"qwen3\" is supported"));
        }
        for (name, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("intermediate_size", self.intermediate_size),
        ] {
            if v <= 0 {
                return Err(format!("{name} must be positive, got {v}"));
            }
        }
        if self.num_attention_heads % self.num_key_value_heads != 0 {
            return Err(format!(
                "num_attention_heads ({}) must be a multiple of num_key_value_heads ({})",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if self.head_dim % 2 != 0 {
            return Err(format!(
                "head_dim must be even for rotary embeddings, got {}",
                self.head_dim
            ));
        }
        if self.attention_bias {
            return Err("attention_bias = true is not supported (Qwen3 has none)".into());
        }
        let unsupported = |k: &str| {
            self.extra
                .get(k)
                .is_some_and(|v| !v.is_null() && *v != serde_json::Value::Bool(false))
        };
        if unsupported("rope_scaling") {
            return Err("rope_scaling is not supported yet".into());
        }
        let rope_type = self
            .extra
            .get("rope_parameters")
            .and_then(|p| p.get("rope_type"))
            .and_then(|t| t.as_str());
        if let Some(t) = rope_type.filter(|t| *t != "default") {
            return Err(format!(
                "rope_type {t:?} is not supported yet (only \"default\")"
            ));
        }
        if unsupported("use_sliding_window") {
            return Err("sliding-window attention is not supported yet".into());
        }
        Ok(())
    }

    /// A preset's config.
    pub fn preset(p: Preset) -> Self {
        let base = |vocab, hidden, layers, heads, kv, head_dim, inter, tie, max_pos| Self {
            vocab_size: vocab,
            hidden_size: hidden,
            num_hidden_layers: layers,
            num_attention_heads: heads,
            num_key_value_heads: kv,
            head_dim,
            intermediate_size: inter,
            rms_norm_eps: 1e-6,
            rope_theta: 1_000_000.0,
            max_position_embeddings: max_pos,
            tie_word_embeddings: tie,
            torch_dtype: "bfloat16".into(),
            attention_bias: false,
            extra: serde_json::Map::new(),
        };
        let mut c = match p {
            Preset::Tiny => {
                let mut c = base(512, 192, 4, 4, 2, 48, 512, true, 4096);
                c.torch_dtype = "float32".into();
                c.rope_theta = 10_000.0;
                c
            }
            Preset::P0_6b => base(151_936, 1024, 28, 16, 8, 128, 3072, true, 40_960),
            Preset::P1_7b => base(151_936, 2048, 28, 16, 8, 128, 6144, true, 40_960),
            Preset::P4b => base(151_936, 2560, 36, 32, 8, 128, 9728, true, 40_960),
            Preset::P8b => base(151_936, 4096, 36, 32, 8, 128, 12_288, false, 40_960),
        };
        for (k, v) in [
            ("architectures", serde_json::json!(["Qwen3ForCausalLM"])),
            ("model_type", serde_json::json!("qwen3")),
            ("hidden_act", serde_json::json!("silu")),
            ("attention_dropout", serde_json::json!(0.0)),
            ("initializer_range", serde_json::json!(0.02)),
            ("rope_scaling", serde_json::Value::Null),
            ("sliding_window", serde_json::Value::Null),
            ("use_sliding_window", serde_json::json!(false)),
            ("use_cache", serde_json::json!(true)),
            ("bos_token_id", serde_json::Value::Null),
            ("eos_token_id", serde_json::Value::Null),
        ] {
            c.extra.insert(k.into(), v);
        }
        if p != Preset::Tiny {
            c.extra
                .insert("bos_token_id".into(), serde_json::json!(151_643));
            c.extra
                .insert("eos_token_id".into(), serde_json::json!(151_645));
            c.extra.insert(
                "max_window_layers".into(),
                serde_json::json!(c.num_hidden_layers),
            );
        }
        c
    }

    /// Number of parameters.
    pub fn parameters(&self) -> i64 {
        let (h, i, v) = (self.hidden_size, self.intermediate_size, self.vocab_size);
        let q = self.num_attention_heads * self.head_dim;
        let kv = self.num_key_value_heads * self.head_dim;
        let layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h + 2 * self.head_dim;
        let head = if self.tie_word_embeddings { 0 } else { v * h };
        v * h + self.num_hidden_layers * layer + h + head
    }

    /// The storage dtype as a tch kind.
    pub fn kind(&self) -> Result<tch::Kind, String> {
        match self.torch_dtype.as_str() {
            "float32" | "float" => Ok(tch::Kind::Float),
            "bfloat16" => Ok(tch::Kind::BFloat16),
            "float16" | "half" => Ok(tch::Kind::Half),
            other => Err(format!("unsupported torch_dtype {other:?}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_match_the_published_shapes() {
        let shared =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/models/qwen3/configs");
        for (p, file) in [
            (Preset::P0_6b, "Qwen3-0.6B.config.json"),
            (Preset::P4b, "Qwen3-4B.config.json"),
            (Preset::P8b, "Qwen3-8B.config.json"),
        ] {
            let Ok(text) = std::fs::read_to_string(shared.join(file)) else {
                continue;
            };
            let real: Qwen3Config = serde_json::from_str(&text).unwrap();
            let mine = Qwen3Config::preset(p);
            assert_eq!(
                (
                    real.hidden_size,
                    real.num_hidden_layers,
                    real.num_attention_heads,
                    real.num_key_value_heads
                ),
                (
                    mine.hidden_size,
                    mine.num_hidden_layers,
                    mine.num_attention_heads,
                    mine.num_key_value_heads
                ),
                "{file}"
            );
            assert_eq!(
                (
                    real.head_dim,
                    real.intermediate_size,
                    real.vocab_size,
                    real.tie_word_embeddings
                ),
                (
                    mine.head_dim,
                    mine.intermediate_size,
                    mine.vocab_size,
                    mine.tie_word_embeddings
                ),
                "{file}"
            );
            assert_eq!(real.rope_theta, mine.rope_theta);
            real.validate().unwrap();
        }
        let tiny = Qwen3Config::preset(Preset::Tiny);
        assert!(
            (1_000_000..5_000_000).contains(&tiny.parameters()),
            "{}",
            tiny.parameters()
        );
        // Qwen3-0.6B has about 0.6B parameters (0.44B without the embedding).
        let p = Qwen3Config::preset(Preset::P0_6b).parameters();
        assert!((590_000_000..610_000_000).contains(&p), "{p}");
    }
}
