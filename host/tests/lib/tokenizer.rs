//! The real Qwen3 tokenizer (`../shared/models/qwen3/`) against the golden tokenizations made with
//! Hugging Face `tokenizers` 0.23.3 / transformers 5.23 (`golden/tokenization_cases.json`): ids,
//! token strings and both decodings, for every case. And the tokenizer rlhost builds for its
//! tiny models against `transformers`.

use std::path::{Path, PathBuf};

use rlhost::model::Tokenizer;

use crate::common;

fn qwen3() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/models/qwen3");
    assert!(
        dir.join("tokenizer.json").is_file(),
        "{} is missing: ../shared must sit beside the repository",
        dir.display()
    );
    dir
}

#[test]
fn qwen3_tokenizer_matches_the_golden_cases() {
    let dir = qwen3();
    let tok = Tokenizer::load(&dir).unwrap();
    assert_eq!(tok.eos, tok.token_id("<|im_end|>"));
    assert_eq!(tok.eos, Some(151_645));
    assert_eq!(tok.pad, Some(151_643));
    assert!(tok.special.contains(&151_644), "<|im_start|> is special");
    let golden: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("golden/tokenization_cases.json")).unwrap(),
    )
    .unwrap();
    let cases = golden["cases"].as_array().unwrap();
    assert!(cases.len() >= 20);
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want: Vec<u32> = serde_json::from_value(case["ids"].clone()).unwrap();
        assert_eq!(tok.encode(text).unwrap(), want, "ids of {text:?}");
        let tokens: Vec<String> = serde_json::from_value(case["tokens"].clone()).unwrap();
        assert_eq!(tok.tokens(text).unwrap(), tokens, "tokens of {text:?}");
        assert_eq!(
            tok.decode(&want, false).unwrap(),
            case["decoded"].as_str().unwrap(),
            "decode {text:?}"
        );
        assert_eq!(
            tok.decode(&want, true).unwrap(),
            case["decoded_skip_special"].as_str().unwrap(),
            "decode (skip special) {text:?}"
        );
    }
}

#[test]
fn a_missing_or_broken_tokenizer_names_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let err = Tokenizer::load(tmp.path()).err().unwrap().to_string();
    assert!(err.contains("tokenizer.json"), "{err}");
    std::fs::write(tmp.path().join("tokenizer.json"), "{not json").unwrap();
    let err = Tokenizer::load(tmp.path()).err().unwrap().to_string();
    assert!(err.contains("tokenizer.json"), "{err}");
}

/// The tokenizer rlhost builds for its tiny models, saved as a HF folder, gives in `transformers`
/// (`AutoTokenizer`) the same ids, decodings and chat renders as in rlhost.
#[test]
fn the_tiny_tokenizer_matches_transformers() {
    use rlhost::model::{ChatTemplate, tiny_tokenizer};
    let tmp = tempfile::tempdir().unwrap();
    let (endoftext, im_end) = tiny_tokenizer::write(tmp.path(), 512).unwrap();
    let tok = Tokenizer::load(tmp.path()).unwrap();
    assert_eq!(tok.vocab_size(), 512);
    assert_eq!((tok.eos, tok.pad), (Some(im_end), Some(endoftext)));
    let texts = [
        "What is 12345 + 678?",
        "\\boxed{\\frac{1}{2}} and \\sqrt{3}\\cdot\\pi",
        "def f(x):\n    return x ** 2\n\n\nprint(f(3))\n",
        "  leading and trailing spaces  \t\n\r\n",
        "Cafe\u{301} café 数学 🙂 naïve Ω≈ç",
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\nok\n</think>\n\n",
        "<tool_call>\n{\"name\": \"python\", \"arguments\": {\"code\": \"print(1)\"}}\n</tool_call>",
        "<tool_response>\n42\n</tool_response><|endoftext|>",
        "I'll say it's 3.14159, isn't it? 1,000,000 -- 2^{10} = 1024",
    ];
    let golden: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(qwen3().join("golden/chat_template_cases.json")).unwrap(),
    )
    .unwrap();
    let conversations: Vec<serde_json::Value> = golden["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["template"].as_str().unwrap().starts_with("qwen3/"))
        .map(|c| serde_json::json!({"messages": c["messages"], "tools": c["tools"], "kwargs": c["kwargs"]}))
        .collect();
    // rlhost's side: every text round-trips; the markers are single tokens.
    let template = ChatTemplate::load(tmp.path()).unwrap();
    for text in texts {
        let ids = tok.encode(text).unwrap();
        assert_eq!(
            tok.decode(&ids, false).unwrap(),
            text.replace("e\u{301}", "é")
        );
    }
    for (marker, _) in tiny_tokenizer::ADDED_TOKENS {
        assert_eq!(
            tok.encode(marker).unwrap(),
            vec![tok.token_id(marker).unwrap()]
        );
    }
    let Some(python) = common::reference_python("the_tiny_tokenizer_matches_transformers") else {
        return;
    };
    let inputs = tmp.path().join("inputs.json");
    std::fs::write(
        &inputs,
        serde_json::json!({"texts": texts, "conversations": conversations}).to_string(),
    )
    .unwrap();
    let out = tmp.path().join("out.json");
    common::run_ok(
        common::qwen3_reference(&python)
            .args(["tokenize", "--model"])
            .arg(tmp.path())
            .arg("--inputs")
            .arg(&inputs)
            .arg("--out")
            .arg(&out),
    );
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    for (i, text) in texts.iter().enumerate() {
        let ids = tok.encode(text).unwrap();
        let want: Vec<u32> = serde_json::from_value(reference["ids"][i].clone()).unwrap();
        assert_eq!(ids, want, "ids of {text:?}");
        assert_eq!(
            tok.decode(&ids, false).unwrap(),
            reference["decoded"][i],
            "{text:?}"
        );
        assert_eq!(
            tok.decode(&ids, true).unwrap(),
            reference["decoded_skip"][i],
            "{text:?}"
        );
    }
    for (i, conv) in conversations.iter().enumerate() {
        let rendered = template
            .apply(
                &conv["messages"],
                Some(&conv["tools"]),
                conv["kwargs"].as_object().unwrap(),
            )
            .unwrap();
        assert_eq!(rendered, reference["renders"][i], "render {i}");
        let want: Vec<u32> = serde_json::from_value(reference["render_ids"][i].clone()).unwrap();
        assert_eq!(tok.encode(&rendered).unwrap(), want, "render ids {i}");
    }
}
