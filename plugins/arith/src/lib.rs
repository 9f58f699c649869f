//! `arith`: multi-digit arithmetic for tiny models and the CPU demo. The python tool makes it
//! easy; mental arithmetic makes it hard. Same tool contract as `will/math-python` (a fresh
//! interpreter per call, 10 s, verifiers' output rules) and the same rubric metrics, scored by
//! math-verify.
//!
//! The dataset is generated, not shipped: row `i` of a split is fixed forever (a hash of the
//! split and `i`). Difficulty is a split: `train` and `test` are level 2; `train-d1` …
//! `train-d5` and `test-d1` … `test-d5` pick a level (1: two small numbers; 5: four
//! operations on five-digit numbers). Train and test never share a question: every question
//! belongs to exactly one side by a hash of its text.
//!
//! Environment arguments are math-python's: `{"tools": "none"}` asks for mental arithmetic
//! (single turn), `{"max_turns": N}`, `{"python_state": "persistent"}`, …

use rlhost_math_env::Spec;
use rlhost_math_verify::Convention;
use rlhost_sdk::prelude::*;

struct Arith;

const SPEC: Spec = Spec {
    name: "arith",
    description: "Multi-digit arithmetic with a difficulty knob; the python tool makes it easy",
    splits: &[],
    system_prompt: "Use python for all calculations (variables do not persist). Give your answer inside \\boxed{}.",
    prompts: &[],
    no_tools_prompt: Some("Compute the result and give the final answer inside \\boxed{}."),
    tools: true,
    max_turns: 3,
    convention: Convention::MathRubric,
    error_weight: -0.1,
};

/// Rows per split.
const TRAIN_ROWS: u64 = 10_000;
const TEST_ROWS: u64 = 500;
/// Default level of `train` / `test`.
const DEFAULT_LEVEL: u8 = 2;

fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Candidate question `j` of a level: the text and its value.
fn question(level: u8, j: u64) -> (String, i64) {
    let mut k = 0u64;
    let mut next = |m: u64| {
        k += 1;
        mix(j.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (u64::from(level) << 56) ^ k) % m
    };
    let ops = ['+', '-', '*'];
    let (terms, digits): (usize, &[u32]) = match level {
        1 => (2, &[1, 2]),
        2 => (2, &[3, 3]),
        3 => (3, &[3, 3, 2]),
        4 => (3, &[4, 3, 3]),
        _ => (4, &[5, 4, 3, 3]),
    };
    let mut values: Vec<i64> = Vec::with_capacity(terms);
    let mut text = String::new();
    let mut pending: Vec<char> = Vec::new();
    for (t, d) in digits.iter().enumerate().take(terms) {
        let lo = 10u64.pow(*d - 1);
        let v = (lo + next(9 * lo)) as i64;
        if t > 0 {
            let op = ops[next(3) as usize];
            text.push_str(&format!(" {op} "));
            pending.push(op);
        }
        text.push_str(&v.to_string());
        values.push(v);
    }
    // Precedence: products first, then sums and differences left to right.
    let mut sums: Vec<i64> = vec![values[0]];
    let mut signs: Vec<char> = vec![];
    for (op, v) in pending.iter().zip(&values[1..]) {
        if *op == '*' {
            let last = sums.last_mut().expect("a term");
            *last *= v;
        } else {
            sums.push(*v);
            signs.push(*op);
        }
    }
    let mut value = sums[0];
    for (op, v) in signs.iter().zip(&sums[1..]) {
        value = if *op == '+' { value + v } else { value - v };
    }
    (format!("What is {text}?"), value)
}

/// Whether a question belongs to the test side.
fn is_test(text: &str) -> bool {
    let h = text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    mix(h).is_multiple_of(8)
}

/// `(level, test side, rows)` of a split name.
fn split(name: &str) -> Option<(u8, bool, u64)> {
    let (side, level) = match name.split_once("-d") {
        Some((side, l)) => (side, l.parse::<u8>().ok().filter(|l| (1..=5).contains(l))?),
        None => (name, DEFAULT_LEVEL),
    };
    match side {
        "train" => Some((level, false, TRAIN_ROWS)),
        "test" => Some((level, true, TEST_ROWS)),
        _ => None,
    }
}

fn split_names() -> Vec<String> {
    let mut out = vec!["train".to_string(), "test".to_string()];
    for l in 1..=5 {
        out.push(format!("train-d{l}"));
        out.push(format!("test-d{l}"));
    }
    out
}

impl Environment for Arith {
    fn info() -> EnvInfo {
        let mut info = SPEC.info(env!("CARGO_PKG_VERSION"));
        info.splits = split_names();
        info.sampling.max_tokens = Some(256);
        info
    }

    fn dataset(name: &str, offset: u64, limit: u32) -> Result<DatasetPage, PluginError> {
        let (level, test, total) =
            split(name).ok_or_else(|| PluginError::UnknownSplit(name.into()))?;
        let end = offset.saturating_add(u64::from(limit)).min(total);
        let mut examples = Vec::new();
        let mut row = 0u64;
        let mut j = 0u64;
        // Walk the candidates of this level, keeping those on this side, until `end`.
        while row < end {
            let (q, value) = question(level, j);
            j += 1;
            if is_test(&q) != test {
                continue;
            }
            if row >= offset {
                examples.push(Example {
                    id: format!("{name}-{row}"),
                    prompt: vec![],
                    question: q,
                    answer: value.to_string(),
                    info: format!(r#"{{"level":{level}}}"#),
                });
            }
            row += 1;
        }
        Ok(DatasetPage { examples, total })
    }

    fn initial_prompt(example: Example, env_args: &str) -> Result<EpisodeStart, PluginError> {
        SPEC.initial_prompt(example, env_args)
    }

    fn env_response(conversation: Vec<Message>, state: String) -> Result<EnvStep, PluginError> {
        SPEC.env_response(conversation, state)
    }

    fn score(rollout: Rollout) -> Result<Vec<Metric>, PluginError> {
        SPEC.score(rollout)
    }
}

rlhost_sdk::export_environment!(Arith);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn questions_evaluate_with_precedence() {
        for level in 1..=5 {
            for j in 0..200 {
                let (q, v) = question(level, j);
                let expr = q.trim_start_matches("What is ").trim_end_matches('?');
                // Re-evaluate independently: split sums, then products.
                let mut total = 0i64;
                let mut sign = 1i64;
                let tokens: Vec<&str> = expr.split(' ').collect();
                let mut product = tokens[0].parse::<i64>().unwrap();
                let mut i = 1;
                while i < tokens.len() {
                    let (op, n) = (tokens[i], tokens[i + 1].parse::<i64>().unwrap());
                    match op {
                        "*" => product *= n,
                        _ => {
                            total += sign * product;
                            sign = if op == "+" { 1 } else { -1 };
                            product = n;
                        }
                    }
                    i += 2;
                }
                total += sign * product;
                assert_eq!(total, v, "{q}");
            }
        }
    }

    #[test]
    fn train_and_test_are_disjoint_and_stable() {
        for level in 1..=5 {
            let train = Arith::dataset(&format!("train-d{level}"), 0, 10_000).unwrap();
            let test = Arith::dataset(&format!("test-d{level}"), 0, 500).unwrap();
            assert_eq!((train.total, test.total), (10_000, 500));
            let seen: std::collections::HashSet<&str> =
                train.examples.iter().map(|e| e.question.as_str()).collect();
            assert!(
                test.examples
                    .iter()
                    .all(|e| !seen.contains(e.question.as_str()))
            );
        }
        let a = Arith::dataset("train", 5, 3).unwrap();
        let b = Arith::dataset("train", 0, 8).unwrap();
        assert_eq!(a.examples, b.examples[5..8].to_vec());
        assert_eq!(a.examples[0].id, "train-5");
        assert!(Arith::dataset("train-d9", 0, 1).is_err());
        assert!(Arith::dataset("validation", 0, 1).is_err());
    }

    #[test]
    fn tool_contract_is_math_pythons() {
        assert_eq!(
            rlhost_math_env::tool::TIMEOUT_TEXT,
            "Error: Code execution timed out after 10 seconds"
        );
    }
}
