//! PEFT's `adapter_config.json`, read like rlhost's own flags: every setting of PEFT's
//! `LoraConfig` (as peft [`PEFT_VERSION`] writes it) is known and either honoured (computed as
//! PEFT computes it), taken as a description of the folder, or refused by name with what to do;
//! a key that `LoraConfig` does not have is refused too unless its value says a feature is off
//! (null, false, empty), since a newer PEFT's feature would otherwise be computed as plain LoRA.
//! `target_modules` is resolved against Qwen3's modules as PEFT resolves it (`"all-linear"`, a
//! regular expression, names of which the model may lack some).
//!
//! This module must never let a setting through that changes what the adapter computes: what
//! it accepts is exactly plain LoRA on the same projections of every decoder layer, one rank,
//! one alpha.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::Qwen3Config;
use super::lora::{LoraConfig, LoraTarget};

/// The PEFT release whose `LoraConfig` [`LORA_CONFIG`] classifies, field by field.
pub const PEFT_VERSION: &str = "0.21.2";

/// How rlhost takes one setting of PEFT's `LoraConfig`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setting {
    /// Read and computed as PEFT computes it (how, in words).
    Honoured(&'static str),
    /// Says where the adapter came from or how PEFT handles it at run time, not what it
    /// computes on Qwen3's projections: any value is taken (why, in words).
    Describes(&'static str),
    /// A feature rlhost does not compute: taken only off (null, false, empty), else refused
    /// with what the feature does and what to do instead.
    Refused {
        /// What the feature does that plain LoRA does not.
        does: &'static str,
        /// What to do with such an adapter.
        todo: &'static str,
    },
}

const MERGE: &str = "merge it into its base with PEFT (`merge_and_unload()`) and serve the merged \
                     model, or serve it with PEFT";
const PEFT_ONLY: &str = "serve it with PEFT";
const CONVERT: &str = "convert it to a plain LoRA adapter of the original base with PEFT \
                       (`save_pretrained(dir, path_initial_model_for_weight_conversion=...)`)";

/// Every field of PEFT's `LoraConfig` (peft [`PEFT_VERSION`], with those of its base
/// `PeftConfig`), as `save_pretrained` writes them to `adapter_config.json`, and how rlhost
/// takes each. `tests` checks this list against the installed peft.
pub const LORA_CONFIG: &[(&str, Setting)] = &[
    // PeftConfig's.
    ("peft_type", Setting::Honoured("must be LORA")),
    (
        "task_type",
        Setting::Honoured("null or CAUSAL_LM (another task wraps another head)"),
    ),
    (
        "base_model_name_or_path",
        Setting::Honoured("kept as the adapter's base model"),
    ),
    (
        "revision",
        Setting::Describes("the base model's revision: where it came from"),
    ),
    (
        "inference_mode",
        Setting::Describes("whether PEFT trains it; rlhost's command decides"),
    ),
    (
        "auto_mapping",
        Setting::Describes("the Python class of the base model (config.json names it)"),
    ),
    (
        "peft_version",
        Setting::Describes("the PEFT that wrote the folder"),
    ),
    // LoraConfig's.
    (
        "r",
        Setting::Honoured("the rank (PEFT's default 8 when absent)"),
    ),
    (
        "lora_alpha",
        Setting::Honoured("the scale's numerator (PEFT's default 8 when absent)"),
    ),
    (
        "lora_dropout",
        Setting::Honoured("dropout on the adapter's input while training"),
    ),
    (
        "use_rslora",
        Setting::Honoured("scale alpha / sqrt(r) instead of alpha / r"),
    ),
    (
        "target_modules",
        Setting::Honoured(
            "resolved as PEFT resolves it: null (Qwen3's default q_proj, v_proj), \"all-linear\", \
             a regular expression full-matched against each module's name, or names matched as \
             suffixes (those the model lacks ignored); must select the same projections in every \
             layer",
        ),
    ),
    (
        "exclude_modules",
        Setting::Honoured("removes modules from target_modules' selection, as PEFT does"),
    ),
    (
        "layers_to_transform",
        Setting::Honoured("restricts a list's selection to these layers, as PEFT does"),
    ),
    (
        "layers_pattern",
        Setting::Honoured("where layers_to_transform finds the layer index, as PEFT does"),
    ),
    (
        "fan_in_fan_out",
        Setting::Honoured("PEFT sets it false on nn.Linear, which all of Qwen3's projections are"),
    ),
    (
        "bias",
        Setting::Honoured(
            "must be \"none\" (\"all\" and \"lora_only\" train the base model's biases)",
        ),
    ),
    (
        "init_lora_weights",
        Setting::Honoured(
            "true, false, \"gaussian\", \"orthogonal\", \"eva\": how A and B started, which the \
             tensors supersede; initialisations that change the base weights (PiSSA, OLoRA, \
             CorDA, LoRA-GA, LoftQ) or freeze B (MiCA) are refused",
        ),
    ),
    (
        "eva_config",
        Setting::Describes(
            "EVA's initialisation of A: the tensors hold its result, and the ranks it \
             redistributes are in rank_pattern",
        ),
    ),
    (
        "megatron_core",
        Setting::Describes("read by PEFT only with megatron_config, which is refused"),
    ),
    (
        "qalora_group_size",
        Setting::Describes("read by PEFT only with use_qalora, which is refused"),
    ),
    (
        "runtime_config",
        Setting::Describes("run-time options PEFT does not save (GPU offload while loading)"),
    ),
    (
        "ensure_weight_tying",
        Setting::Describes(
            "ties adapters of the tied embedding and output head, which rlhost refuses to adapt",
        ),
    ),
    (
        "modules_to_save",
        Setting::Refused {
            does: "trains and saves whole copies of other modules (lm_head, say)",
            todo: MERGE,
        },
    ),
    (
        "rank_pattern",
        Setting::Refused {
            does: "gives some modules a rank other than r",
            todo: MERGE,
        },
    ),
    (
        "alpha_pattern",
        Setting::Refused {
            does: "gives some modules an alpha other than lora_alpha",
            todo: MERGE,
        },
    ),
    (
        "megatron_config",
        Setting::Refused {
            does: "builds Megatron's tensor-parallel layers",
            todo: "save it from PEFT without megatron_config",
        },
    ),
    (
        "trainable_token_indices",
        Setting::Refused {
            does: "trains rows of the token embedding",
            todo: MERGE,
        },
    ),
    (
        "loftq_config",
        Setting::Refused {
            does: "LoftQ quantises the base model the adapter is made for",
            todo: PEFT_ONLY,
        },
    ),
    (
        "corda_config",
        Setting::Refused {
            does: "CorDA changes the base weights the adapter is made for",
            todo: CONVERT,
        },
    ),
    (
        "lora_ga_config",
        Setting::Refused {
            does: "LoRA-GA changes the base weights the adapter is made for",
            todo: CONVERT,
        },
    ),
    (
        "use_dora",
        Setting::Refused {
            does: "DoRA rescales each adapted weight by a learned magnitude",
            todo: MERGE,
        },
    ),
    (
        "velora_config",
        Setting::Refused {
            does: "VeLoRA trains through compressed activations (its forward pass is plain \
                   LoRA's, its training is not)",
            todo: "set velora_config to null to serve or train it as plain LoRA",
        },
    ),
    (
        "alora_invocation_tokens",
        Setting::Refused {
            does: "activated LoRA applies the adapter only from the invocation tokens on (rlhost \
                   applies an adapter to every token), and cannot be merged",
            todo: "serve it with PEFT or vLLM, or train a plain LoRA adapter",
        },
    ),
    (
        "use_qalora",
        Setting::Refused {
            does: "QALoRA pools the adapter's input in groups, for GPTQ-quantised bases",
            todo: PEFT_ONLY,
        },
    ),
    (
        "monteclora_config",
        Setting::Refused {
            does: "MonteCLoRA samples the adapters (variational Monte Carlo)",
            todo: PEFT_ONLY,
        },
    ),
    (
        "layer_replication",
        Setting::Refused {
            does: "repeats layers of the base model",
            todo: PEFT_ONLY,
        },
    ),
    (
        "lora_bias",
        Setting::Refused {
            does: "adds a trained bias to lora_B",
            todo: MERGE,
        },
    ),
    (
        "target_parameters",
        Setting::Refused {
            does: "adapts parameters (a mixture of experts' weights), not modules",
            todo: MERGE,
        },
    ),
    (
        "use_bdlora",
        Setting::Refused {
            does: "BD-LoRA makes A or B block-diagonal",
            todo: MERGE,
        },
    ),
    (
        "arrow_config",
        Setting::Refused {
            does: "Arrow routes each token among several adapters",
            todo: PEFT_ONLY,
        },
    ),
    (
        "kasa_config",
        Setting::Refused {
            does: "KaSA truncates the base weights' singular values and adds a learned diagonal \
                   between A and B",
            todo: MERGE,
        },
    ),
];

/// How rlhost takes the `LoraConfig` field `key`, or `None` for a key PEFT
/// [`PEFT_VERSION`] does not have.
pub fn setting(key: &str) -> Option<Setting> {
    LORA_CONFIG.iter().find(|(k, _)| *k == key).map(|(_, s)| *s)
}

/// Why a PEFT folder is refused. Each names the file and the setting at fault, and says what
/// to do.
#[derive(Debug, thiserror::Error)]
pub enum AdapterError {
    /// `adapter_config.json` is not a JSON object.
    #[error("{path}: not a PEFT adapter config (a JSON object of LoraConfig's settings)")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What the JSON parser found.
        #[source]
        source: serde_json::Error,
    },
    /// A setting's value is not of the type PEFT gives it, or out of range.
    #[error("{path}: {key} = {value}: {expected}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The setting.
        key: String,
        /// Its value (JSON, shortened).
        value: String,
        /// What it must be.
        expected: String,
    },
    /// A setting rlhost does not compute as PEFT would.
    #[error("{path}: {key} = {value}: not supported: {does}; {todo}")]
    Unsupported {
        /// The file.
        path: PathBuf,
        /// The setting.
        key: String,
        /// Its value (JSON, shortened).
        value: String,
        /// What it does that rlhost does not.
        does: String,
        /// What to do instead.
        todo: String,
    },
    /// A key PEFT's `LoraConfig` does not have, set to a value that is not off.
    #[error(
        "{path}: {key} = {value}: not a setting of PEFT {PEFT_VERSION}'s LoraConfig, the newest \
         rlhost knows; a newer PEFT's feature may change what the adapter computes, so it is \
         refused: set it to null if the feature is off, or serve the adapter with the PEFT that \
         wrote it"
    )]
    UnknownKey {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
        /// Its value (JSON, shortened).
        value: String,
    },
    /// The folder has PEFT's pickled weights and no safetensors file.
    #[error(
        "{dir}: the adapter's weights are in adapter_model.bin, a Python pickle (loading one can \
         run arbitrary code), which rlhost does not read; write adapter_model.safetensors with \
         PEFT (`PeftModel.from_pretrained(model, dir).save_pretrained(dir)`)"
    )]
    Pickle {
        /// The adapter's folder.
        dir: PathBuf,
    },
}

/// `value` as compact JSON, at most about 200 characters.
fn shown(value: &Value) -> String {
    let text = value.to_string();
    match text.char_indices().nth(200) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

/// Whether `value` says a feature is off: null, false, or empty.
fn is_off(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        Value::Number(_) => false,
    }
}

/// What a folder's `adapter_config.json` makes of an adapter rlhost computes: its settings
/// and the base model it names.
#[derive(Debug, Clone, PartialEq)]
pub struct PeftSettings {
    /// Rank, alpha, dropout, projections, rsLoRA.
    pub lora: LoraConfig,
    /// `base_model_name_or_path`, when given and not empty.
    pub base: Option<String>,
}

/// Reads the text of `path` (an `adapter_config.json`) for a model of `model`'s shape: every
/// key checked against [`LORA_CONFIG`], `target_modules` resolved against the model's
/// modules. The rank is checked against the model's shape too.
pub fn read(path: &Path, text: &str, model: &Qwen3Config) -> Result<PeftSettings, AdapterError> {
    let map: serde_json::Map<String, Value> =
        serde_json::from_str(text).map_err(|source| AdapterError::Parse {
            path: path.to_owned(),
            source,
        })?;
    let invalid = |key: &str, value: &Value, expected: &str| AdapterError::Invalid {
        path: path.to_owned(),
        key: key.to_owned(),
        value: shown(value),
        expected: expected.to_owned(),
    };
    let unsupported =
        |key: &str, value: &Value, does: &str, todo: &str| AdapterError::Unsupported {
            path: path.to_owned(),
            key: key.to_owned(),
            value: shown(value),
            does: does.to_owned(),
            todo: todo.to_owned(),
        };
    // Every key known; features rlhost does not compute only off.
    for (key, value) in &map {
        match setting(key) {
            None if !is_off(value) => {
                return Err(AdapterError::UnknownKey {
                    path: path.to_owned(),
                    key: key.clone(),
                    value: shown(value),
                });
            }
            Some(Setting::Refused { does, todo }) if !is_off(value) => {
                return Err(unsupported(key, value, does, todo));
            }
            _ => {}
        }
    }
    let get = |key: &str| map.get(key).unwrap_or(&Value::Null);

    let peft_type = get("peft_type");
    if peft_type != "LORA" {
        return Err(unsupported(
            "peft_type",
            peft_type,
            "only LoRA adapters are read",
            PEFT_ONLY,
        ));
    }
    let task_type = get("task_type");
    if !(task_type.is_null() || task_type == "CAUSAL_LM") {
        return Err(unsupported(
            "task_type",
            task_type,
            "an adapter for another task than causal language modelling goes with another head",
            "set task_type to CAUSAL_LM if it was made on Qwen3ForCausalLM",
        ));
    }
    let bias = get("bias");
    if !(bias.is_null() || bias == "none") {
        return Err(unsupported(
            "bias",
            bias,
            "trains the base model's biases",
            MERGE,
        ));
    }
    if !matches!(get("fan_in_fan_out"), Value::Null | Value::Bool(_)) {
        return Err(invalid(
            "fan_in_fan_out",
            get("fan_in_fan_out"),
            "true or false",
        ));
    }
    check_init(get("init_lora_weights")).map_err(|(does, todo)| {
        unsupported("init_lora_weights", get("init_lora_weights"), does, todo)
    })?;

    let rank = match get("r") {
        Value::Null => 8,
        v => v
            .as_u64()
            .filter(|&r| r >= 1)
            .ok_or_else(|| invalid("r", v, "a positive integer"))? as usize,
    };
    let alpha = match get("lora_alpha") {
        Value::Null => 8.0,
        v => v
            .as_f64()
            .filter(|a| a.is_finite() && *a > 0.0)
            .ok_or_else(|| invalid("lora_alpha", v, "a positive number"))?,
    };
    let dropout = match get("lora_dropout") {
        Value::Null => 0.0,
        v => v
            .as_f64()
            .filter(|d| (0.0..1.0).contains(d))
            .ok_or_else(|| invalid("lora_dropout", v, "a number in [0, 1)"))?,
    };
    let use_rslora = match get("use_rslora") {
        Value::Null => false,
        v => v
            .as_bool()
            .ok_or_else(|| invalid("use_rslora", v, "true or false"))?,
    };
    let base = match get("base_model_name_or_path") {
        Value::Null => None,
        Value::String(s) => Some(s.clone()).filter(|s| !s.is_empty()),
        v => return Err(invalid("base_model_name_or_path", v, "a string")),
    };
    let target_modules = resolve_targets(path, &map, model.num_hidden_layers as usize)?;
    let lora = LoraConfig {
        rank,
        alpha,
        dropout,
        target_modules,
        use_rslora,
    };
    lora.check_shape(model).map_err(|message| {
        // `check_shape` names `[model.lora]`'s key; the folder's is PEFT's `r`.
        let message = message.strip_prefix("rank: ").unwrap_or(&message);
        invalid("r", get("r"), message)
    })?;
    Ok(PeftSettings { lora, base })
}

/// `init_lora_weights`: `Err((what it does, what to do))` for an initialisation whose adapter
/// is not plain LoRA on the original base.
fn check_init(value: &Value) -> Result<(), (&'static str, &'static str)> {
    let changes_base = "the adapter is made for a base model whose weights its initialisation \
                        changed, which rlhost does not have";
    match value {
        Value::Null | Value::Bool(_) => Ok(()),
        Value::String(s) => match s.as_str() {
            "gaussian" | "orthogonal" | "eva" => Ok(()),
            "pissa" | "olora" | "corda" | "lora_ga" => Err((changes_base, CONVERT)),
            s if s.starts_with("pissa_niter_") => Err((changes_base, CONVERT)),
            "loftq" => Err((
                "LoftQ adapters go with the LoftQ-quantised base model",
                PEFT_ONLY,
            )),
            "mica" => Err((
                "MiCA trains A alone (B frozen), rlhost trains both",
                "set init_lora_weights to true to serve or train it as plain LoRA (its forward \
                 pass is plain LoRA's)",
            )),
            _ => Err((
                "an initialisation PEFT does not have (true, false, \"gaussian\", \
                 \"orthogonal\", \"eva\", ...)",
                "write one of those",
            )),
        },
        _ => Err(("not true, false or an initialisation's name", PEFT_ONLY)),
    }
}

/// What a module of transformers' `Qwen3ForCausalLM` is, to LoRA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ModuleKind {
    /// One of the seven linear projections of decoder layer `.0`, which rlhost adapts.
    Projection(usize, LoraTarget),
    /// `lm_head`: a linear layer PEFT adapts when named, never with `"all-linear"`.
    OutputHead,
    /// The embedding, norms, containers: PEFT adapts the embedding when named and refuses
    /// the rest.
    Other,
}

/// Every module of transformers' `Qwen3ForCausalLM` with `layers` decoder layers, by the
/// dotted name PEFT matches `target_modules` against (`named_modules()` of the model PEFT
/// wraps), in that order.
fn qwen3_modules(layers: usize) -> Vec<(String, ModuleKind)> {
    let mut out = vec![
        ("model".to_owned(), ModuleKind::Other),
        ("model.embed_tokens".to_owned(), ModuleKind::Other),
        ("model.layers".to_owned(), ModuleKind::Other),
    ];
    for i in 0..layers {
        let layer = format!("model.layers.{i}");
        out.push((layer.clone(), ModuleKind::Other));
        out.push((format!("{layer}.self_attn"), ModuleKind::Other));
        for t in &LoraTarget::ALL[..4] {
            out.push((
                format!("{layer}.{}", t.module()),
                ModuleKind::Projection(i, *t),
            ));
        }
        for norm in ["q_norm", "k_norm"] {
            out.push((format!("{layer}.self_attn.{norm}"), ModuleKind::Other));
        }
        out.push((format!("{layer}.mlp"), ModuleKind::Other));
        for t in &LoraTarget::ALL[4..] {
            out.push((
                format!("{layer}.{}", t.module()),
                ModuleKind::Projection(i, *t),
            ));
        }
        out.push((format!("{layer}.mlp.act_fn"), ModuleKind::Other));
        for norm in ["input_layernorm", "post_attention_layernorm"] {
            out.push((format!("{layer}.{norm}"), ModuleKind::Other));
        }
    }
    out.push(("model.norm".to_owned(), ModuleKind::Other));
    out.push(("model.rotary_emb".to_owned(), ModuleKind::Other));
    out.push(("lm_head".to_owned(), ModuleKind::OutputHead));
    out
}

/// A Python regular expression as PEFT applies it, compiled by the `regex` crate (the same
/// syntax but for look-around and back-references, which are refused). `anchored_end`: Python's
/// `re.fullmatch` (else `re.match`, anchored at the start only).
fn python_regex(pattern: &str, anchored_end: bool) -> Result<regex::Regex, String> {
    let full = match anchored_end {
        true => format!("^(?:{pattern})$"),
        false => format!("^(?:{pattern})"),
    };
    regex::RegexBuilder::new(&full)
        .size_limit(1 << 20)
        .build()
        .map_err(|e| {
            format!(
                "a regular expression rlhost cannot compile ({}); rlhost reads Python's syntax \
                 but for look-around and back-references",
                e.to_string().lines().last().unwrap_or_default().trim()
            )
        })
}

/// `target_modules` (or `exclude_modules`) as PEFT matches it against a module's name.
enum Pattern {
    /// A string: a regular expression full-matched against the whole name.
    Regex(regex::Regex),
    /// A list: a name equal to one of these, or ending in `.` and one of these.
    Names(Vec<String>),
}

impl Pattern {
    /// Whether `key` matches exactly or as a suffix (`Names`), or as a whole (`Regex`).
    fn matches(&self, key: &str) -> bool {
        match self {
            Self::Regex(re) => re.is_match(key),
            Self::Names(names) => names.iter().any(|n| {
                key == n
                    || key
                        .strip_suffix(n.as_str())
                        .is_some_and(|r| r.ends_with('.'))
            }),
        }
    }
}

/// `layers_to_transform` with `layers_pattern`: which layers a list of `target_modules` adapts.
struct LayerFilter {
    /// The layers adapted.
    layers: Vec<i64>,
    /// Expressions whose first group is a module's layer index (PEFT's
    /// `.*?\.{pattern}\.(\d+)\.`, or `.*?\.[^.]*\.(\d+)\.` without a pattern).
    patterns: Vec<regex::Regex>,
}

impl LayerFilter {
    /// Whether the module `key` is in one of the layers, found as PEFT finds its index.
    fn admits(&self, key: &str) -> bool {
        let index = self
            .patterns
            .iter()
            .find_map(|re| re.captures(key))
            .and_then(|c| c.get(1).and_then(|m| m.as_str().parse::<i64>().ok()));
        index.is_some_and(|i| self.layers.contains(&i))
    }
}

/// Resolves `target_modules` (with `exclude_modules`, `layers_to_transform` and
/// `layers_pattern`) against Qwen3's modules as PEFT's `check_target_module_exists` does, and
/// returns the projections adapted, which must be the same in each of the `layers` layers.
fn resolve_targets(
    path: &Path,
    map: &serde_json::Map<String, Value>,
    layers: usize,
) -> Result<Vec<LoraTarget>, AdapterError> {
    let get = |key: &str| map.get(key).unwrap_or(&Value::Null);
    let invalid = |key: &str, expected: String| AdapterError::Invalid {
        path: path.to_owned(),
        key: key.to_owned(),
        value: shown(get(key)),
        expected,
    };
    let unsupported = |key: &str, does: String| AdapterError::Unsupported {
        path: path.to_owned(),
        key: key.to_owned(),
        value: shown(get(key)),
        does,
        todo: MERGE.to_owned(),
    };
    let names = |key: &str| -> Result<Vec<String>, AdapterError> {
        get(key)
            .as_array()
            .and_then(|a| {
                a.iter()
                    .map(|v| v.as_str().map(str::to_owned))
                    .collect::<Option<Vec<_>>>()
            })
            .ok_or_else(|| invalid(key, "a string or a list of strings".into()))
    };
    let modules = qwen3_modules(layers);
    let target_value = get("target_modules");
    let target = match target_value {
        // PEFT's default for Qwen3 (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING).
        Value::Null => Pattern::Names(vec!["q_proj".into(), "v_proj".into()]),
        // Every nn.Linear but the output embeddings (`_maybe_include_all_linear_layers`).
        Value::String(s) if s.eq_ignore_ascii_case("all-linear") => Pattern::Names(
            modules
                .iter()
                .filter(|(_, k)| matches!(k, ModuleKind::Projection(..)))
                .map(|(n, _)| n.clone())
                .collect(),
        ),
        Value::String(s) => {
            Pattern::Regex(python_regex(s, true).map_err(|e| invalid("target_modules", e))?)
        }
        Value::Array(_) => Pattern::Names(names("target_modules")?),
        _ => {
            return Err(invalid(
                "target_modules",
                "null, \"all-linear\", a regular expression or a list of module names".into(),
            ));
        }
    };
    let exclude = match get("exclude_modules") {
        v if is_off(v) => None,
        Value::String(s) => Some(Pattern::Regex(
            python_regex(s, true).map_err(|e| invalid("exclude_modules", e))?,
        )),
        _ => Some(Pattern::Names(names("exclude_modules")?)),
    };
    // LoraConfig.__post_init__'s checks.
    let (to_transform, pattern) = (get("layers_to_transform"), get("layers_pattern"));
    if target_value.is_string() {
        for (key, v) in [
            ("layers_to_transform", to_transform),
            ("layers_pattern", pattern),
        ] {
            if !v.is_null() {
                return Err(invalid(
                    key,
                    "PEFT takes it only with a list of target_modules, not a string".into(),
                ));
            }
        }
    }
    if !is_off(pattern) && to_transform.is_null() {
        return Err(invalid(
            "layers_pattern",
            "PEFT takes it only with layers_to_transform".into(),
        ));
    }
    let filter = match to_transform {
        Value::Null => None,
        Value::Array(a) if a.is_empty() => None,
        v => {
            let layers: Vec<i64> = match v {
                Value::Number(n) => n.as_i64().into_iter().collect(),
                Value::Array(a) => a.iter().filter_map(Value::as_i64).collect(),
                _ => vec![],
            };
            let count = v.as_array().map_or(1, Vec::len);
            if layers.len() != count {
                return Err(invalid(
                    "layers_to_transform",
                    "a layer index or a list of them".into(),
                ));
            }
            let given: Vec<String> = match pattern {
                v if is_off(v) => vec![],
                Value::String(s) => vec![s.clone()],
                Value::Array(_) => names("layers_pattern")?,
                _ => {
                    return Err(invalid(
                        "layers_pattern",
                        "a string or a list of strings".into(),
                    ));
                }
            };
            let patterns = match given.is_empty() {
                true => vec![python_regex(r".*?\.[^.]*\.(\d+)\.", false).expect("valid")],
                false => given
                    .iter()
                    .map(|p| python_regex(&format!(r".*?\.{p}\.(\d+)\."), false))
                    .collect::<Result<_, _>>()
                    .map_err(|e| invalid("layers_pattern", e))?,
            };
            Some(LayerFilter { layers, patterns })
        }
    };

    let mut adapted: BTreeSet<(usize, LoraTarget)> = BTreeSet::new();
    let mut excluded = false;
    for (key, kind) in &modules {
        if exclude.as_ref().is_some_and(|e| e.matches(key)) {
            excluded = true;
            continue;
        }
        let selected = match &target {
            Pattern::Names(names) if names.iter().any(|n| n == key) => true,
            t @ Pattern::Names(_) => {
                t.matches(key) && filter.as_ref().is_none_or(|f| f.admits(key))
            }
            t @ Pattern::Regex(_) => t.matches(key),
        };
        if !selected {
            continue;
        }
        match kind {
            ModuleKind::Projection(i, t) => {
                adapted.insert((*i, *t));
            }
            _ => {
                return Err(unsupported(
                    "target_modules",
                    format!(
                        "selects `{key}`, which rlhost does not adapt (it adapts the linear \
                         projections of the decoder layers: {})",
                        LoraTarget::ALL.map(|t| t.name()).join(", ")
                    ),
                ));
            }
        }
    }
    if adapted.is_empty() {
        let also = match excluded {
            true => " once exclude_modules is applied",
            false => "",
        };
        return Err(invalid(
            "target_modules",
            format!(
                "selects no module of Qwen3{also} (PEFT refuses it too); name some of {}",
                LoraTarget::ALL.map(|t| t.name()).join(", ")
            ),
        ));
    }
    let in_layer = |i: usize| -> Vec<LoraTarget> {
        adapted
            .iter()
            .filter(|(l, _)| *l == i)
            .map(|(_, t)| *t)
            .collect()
    };
    let first = in_layer(0);
    if let Some(i) = (0..layers).find(|&i| in_layer(i) != first) {
        let key = match filter.is_some() {
            true => "layers_to_transform",
            false => "target_modules",
        };
        let list = |ts: &[LoraTarget]| match ts.is_empty() {
            true => "nothing".to_owned(),
            false => ts.iter().map(|t| t.name()).collect::<Vec<_>>().join(", "),
        };
        return Err(unsupported(
            key,
            format!(
                "adapts {} in layer 0 but {} in layer {i}; rlhost adapts the same projections \
                 in every layer",
                list(&first),
                list(&in_layer(i))
            ),
        ));
    }
    Ok(first)
}

/// The `adapter_config.json` rlhost writes for `lora` on the base model `base`: what PEFT
/// [`PEFT_VERSION`] reads as the same plain LoRA (each other field at its default).
pub fn written(lora: &LoraConfig, base: &str) -> Value {
    json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": lora.rank,
        "lora_alpha": lora.alpha,
        "lora_dropout": lora.dropout,
        "target_modules": lora.target_modules.iter().map(|t| t.name()).collect::<Vec<_>>(),
        "base_model_name_or_path": base,
        "use_rslora": lora.use_rslora,
        "bias": "none",
        "fan_in_fan_out": false,
        "inference_mode": true,
        "init_lora_weights": true,
        "modules_to_save": null,
        "layers_to_transform": null,
        "use_dora": false,
        "rank_pattern": {},
        "alpha_pattern": {},
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Preset;

    fn tiny() -> Qwen3Config {
        Qwen3Config::preset(Preset::Tiny)
    }

    /// `read` on `written(default)` with `changes` applied to its JSON.
    fn read_with(changes: Value) -> Result<PeftSettings, AdapterError> {
        let mut config = written(&LoraConfig::default(), "tiny");
        for (k, v) in changes.as_object().unwrap() {
            config[k] = v.clone();
        }
        read(
            Path::new("adapter_config.json"),
            &config.to_string(),
            &tiny(),
        )
    }

    fn targets(changes: Value) -> Result<Vec<&'static str>, String> {
        read_with(changes)
            .map(|s| s.lora.target_modules.iter().map(|t| t.name()).collect())
            .map_err(|e| e.to_string())
    }

    /// What rlhost writes reads back as itself.
    #[test]
    fn written_configs_read_back() {
        let lora = LoraConfig {
            rank: 4,
            alpha: 3.5,
            use_rslora: true,
            target_modules: vec![LoraTarget::KProj, LoraTarget::DownProj],
            ..LoraConfig::default()
        };
        let text = written(&lora, "base").to_string();
        let back = read(Path::new("a"), &text, &tiny()).unwrap();
        assert_eq!(back.lora, lora);
        assert_eq!(back.base.as_deref(), Some("base"));
        // Every key written is one PEFT has.
        for key in written(&lora, "base").as_object().unwrap().keys() {
            assert!(setting(key).is_some(), "{key}");
        }
    }

    /// Each refused setting of `LoraConfig`, set on, is refused naming itself and what to do;
    /// off (null, false, empty) it is taken.
    #[test]
    fn every_refused_setting_is_refused_by_name_and_taken_when_off() {
        for (key, s) in LORA_CONFIG {
            let Setting::Refused { todo, .. } = s else {
                continue;
            };
            let err = read_with(json!({ (*key): {"on": true} }))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(&format!("{key} = ")) && err.contains(todo),
                "{key}: {err}"
            );
            for off in [json!(null), json!(false), json!([]), json!({})] {
                read_with(json!({ (*key): off })).unwrap_or_else(|e| panic!("{key} off: {e}"));
            }
        }
        let err = read_with(json!({"alora_invocation_tokens": [5, 6, 7]}))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("alora_invocation_tokens = [5,6,7]")
                && err.contains("invocation tokens on")
                && err.contains("vLLM"),
            "{err}"
        );
    }

    /// A key PEFT does not have is refused by name unless off; descriptions take any value.
    #[test]
    fn unknown_keys_are_refused_unless_off() {
        let err = read_with(json!({"use_future_lora": true}))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("use_future_lora = true") && err.contains(PEFT_VERSION),
            "{err}"
        );
        assert!(read_with(json!({"future_group_size": 16})).is_err());
        for off in [json!(null), json!(false), json!(""), json!([]), json!({})] {
            read_with(json!({ "use_future_lora": off })).unwrap();
        }
        read_with(
            json!({"peft_version": "0.21.2", "revision": "main", "inference_mode": false,
                         "megatron_core": "megatron.core", "qalora_group_size": 16,
                         "auto_mapping": {"base_model_class": "Qwen3ForCausalLM"},
                         "eva_config": {"rho": 2.0}, "ensure_weight_tying": true,
                         "fan_in_fan_out": true, "init_lora_weights": "gaussian"}),
        )
        .unwrap();
    }

    /// Honoured settings with values rlhost cannot compute are refused by name.
    #[test]
    fn honoured_settings_check_their_values() {
        for (changes, culprit) in [
            (json!({"peft_type": "LOHA"}), "peft_type"),
            (json!({"task_type": "SEQ_CLS"}), "task_type"),
            (json!({"bias": "lora_only"}), "bias"),
            (json!({"init_lora_weights": "pissa"}), "init_lora_weights"),
            (
                json!({"init_lora_weights": "pissa_niter_4"}),
                "path_initial_model",
            ),
            (json!({"init_lora_weights": "olora"}), "init_lora_weights"),
            (json!({"init_lora_weights": "mica"}), "MiCA"),
            (json!({"r": 0}), "r = 0"),
            (json!({"r": 1000000}), "r = 1000000"),
            (json!({"lora_alpha": "x"}), "lora_alpha"),
            (json!({"lora_dropout": 1.0}), "lora_dropout"),
            (json!({"target_modules": 3}), "target_modules"),
        ] {
            let err = read_with(changes.clone()).unwrap_err().to_string();
            assert!(err.contains(culprit), "{changes}: {err}");
        }
        // PEFT's defaults where keys are absent.
        let bare = json!({"peft_type": "LORA"}).to_string();
        let s = read(Path::new("a"), &bare, &tiny()).unwrap();
        assert_eq!((s.lora.rank, s.lora.alpha), (8, 8.0));
        assert_eq!(
            s.lora.target_modules,
            [LoraTarget::QProj, LoraTarget::VProj]
        );
    }

    /// `target_modules` as PEFT resolves it.
    #[test]
    fn target_modules_resolve_as_peft_resolves_them() {
        let all: Vec<&str> = LoraTarget::ALL.map(|t| t.name()).to_vec();
        assert_eq!(
            targets(json!({"target_modules": "all-linear"})).unwrap(),
            all
        );
        assert_eq!(
            targets(json!({"target_modules": "ALL-LINEAR"})).unwrap(),
            all
        );
        assert_eq!(
            targets(json!({"target_modules": r".*\.(q|v)_proj"})).unwrap(),
            ["q_proj", "v_proj"]
        );
        assert_eq!(
            targets(json!({"target_modules": r".*self_attn\.[qk]_proj"})).unwrap(),
            ["q_proj", "k_proj"]
        );
        // A full match: a regex matching part of a name selects nothing.
        assert!(
            targets(json!({"target_modules": "q_proj"}))
                .unwrap_err()
                .contains("selects no module")
        );
        assert_eq!(
            targets(json!({"target_modules": ["q_proj", "qkv_proj", "gate_proj"]})).unwrap(),
            ["q_proj", "gate_proj"]
        );
        assert_eq!(
            targets(json!({"target_modules": ["self_attn.o_proj", "mlp.down_proj"]})).unwrap(),
            ["o_proj", "down_proj"]
        );
        assert!(
            targets(json!({"target_modules": ["qkv"]}))
                .unwrap_err()
                .contains("selects no module")
        );
        assert!(
            targets(json!({"target_modules": []}))
                .unwrap_err()
                .contains("selects no module")
        );
        for (name, module) in [
            ("lm_head", "lm_head"),
            ("embed_tokens", "model.embed_tokens"),
            ("q_norm", "model.layers.0.self_attn.q_norm"),
        ] {
            let err = targets(json!({ "target_modules": [name, "q_proj"] })).unwrap_err();
            assert!(err.contains(&format!("`{module}`")), "{err}");
        }
        let err = targets(json!({"target_modules": ".*"})).unwrap_err();
        assert!(err.contains("selects `model`"), "{err}");
        // exclude_modules, as a list (suffixes) or a regex.
        assert_eq!(
            targets(json!({"target_modules": "all-linear",
                           "exclude_modules": ["o_proj", "mlp.up_proj"]}))
            .unwrap(),
            ["q_proj", "k_proj", "v_proj", "gate_proj", "down_proj"]
        );
        assert_eq!(
            targets(json!({"target_modules": "all-linear", "exclude_modules": r".*mlp\..*"}))
                .unwrap(),
            ["q_proj", "k_proj", "v_proj", "o_proj"]
        );
        let err = targets(json!({"target_modules": ["q_proj"], "exclude_modules": ["q_proj"]}))
            .unwrap_err();
        assert!(err.contains("exclude_modules"), "{err}");
        // Layers: all of them is plain LoRA; some of them is refused naming the key.
        let layers = tiny().num_hidden_layers;
        let every: Vec<i64> = (0..layers).collect();
        assert_eq!(
            targets(
                json!({"target_modules": ["q_proj"], "layers_to_transform": every,
                           "layers_pattern": "layers"})
            )
            .unwrap(),
            ["q_proj"]
        );
        let err =
            targets(json!({"target_modules": ["q_proj"], "layers_to_transform": [0]})).unwrap_err();
        assert!(
            err.contains("layers_to_transform = [0]") && err.contains("every layer"),
            "{err}"
        );
        let err = targets(json!({"target_modules": ["layers.1.self_attn.q_proj"]})).unwrap_err();
        assert!(
            err.contains("target_modules") && err.contains("layer 1"),
            "{err}"
        );
        let err = targets(json!({"target_modules": "all-linear", "layers_to_transform": [0]}))
            .unwrap_err();
        assert!(err.contains("layers_to_transform"), "{err}");
        let err = targets(json!({"layers_pattern": "layers"})).unwrap_err();
        assert!(err.contains("layers_pattern"), "{err}");
        // Python syntax rlhost cannot compile is refused by name, not mismatched.
        let err = targets(json!({"target_modules": r".*(?<!o)_proj"})).unwrap_err();
        assert!(
            err.contains("target_modules") && err.contains("look-around"),
            "{err}"
        );
    }
}
