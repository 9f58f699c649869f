//! Math answer verification in pure Rust, after HF `math-verify` (which verifiers' math
//! environments score with): find the answer in a text, normalise its LaTeX, parse it into an
//! expression, set, interval, tuple, relation or matrix, and decide whether it equals the gold
//! answer.
//!
//! ```
//! use rlhost_math_verify::{Convention, check};
//! assert!(check(Convention::MathRubric, r"\frac{1}{2}", "0.5").correct);
//! assert!(check(Convention::MathRubric, r"(1, 2) \cup (3, \infty)", r"(3,\infty)\cup(1,2)").correct);
//! assert!(!check(Convention::MathRubric, "3", "4").correct);
//! ```
//!
//! Every call is bounded: parsing and comparison spend from a step [`Budget`], and a text over
//! [`MAX_CHARS`] is refused, so a pathological answer gets "incorrect, timed out", never a hang.
//! No I/O, no clock, no randomness (sample points are hashed from variable names): verdicts are
//! deterministic.

pub mod expr;
mod extract;
pub mod latex;
pub mod normalize;
pub mod num;
mod scan;
mod verify;

pub use expr::{Expr, Value};
pub use extract::parse;
pub use verify::verify;

/// Longest text verified (longer ones are incorrect), as verifiers' `MathRubric` does.
pub const MAX_CHARS: usize = 50_000;
/// Steps one verdict may spend.
pub const DEFAULT_STEPS: u64 = 2_000_000;

/// A step allowance that bounds parsing and comparison.
#[derive(Debug, Clone)]
pub struct Budget {
    left: u64,
    ran_out: bool,
}

impl Budget {
    /// `steps` steps.
    pub fn new(steps: u64) -> Self {
        Self {
            left: steps,
            ran_out: false,
        }
    }

    /// Spends a step; `false` once none are left.
    pub fn step(&mut self) -> bool {
        if self.left == 0 {
            self.ran_out = true;
            return false;
        }
        self.left -= 1;
        true
    }

    /// Whether the budget ran out.
    pub fn exhausted(&self) -> bool {
        self.ran_out
    }
}

/// One reading of an answer: a parsed value, or the extracted text when nothing parsed.
#[derive(Debug, Clone, PartialEq)]
pub enum Parsed {
    /// A parsed mathematical object.
    Value(Value),
    /// The text that was matched (compared as a string).
    Text(String),
}

/// How the prediction and the gold answer are handed to the verifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Convention {
    /// verifiers' `MathRubric`: gold first, both wrapped in `\boxed{}`:
    /// `verify(parse("\boxed{gold}"), parse("\boxed{pred}"))`.
    #[default]
    MathRubric,
    /// verifiers' `math_python` rubric (Aug 2025): the bare answers, prediction first:
    /// `verify(parse(pred), parse(gold))`. Named `seed` because prime-rl's math-python example,
    /// the setup rlhost first reproduced, trains with it. Bare LaTeX without `$…$` is often not
    /// extracted at all under this convention, which is why it rejects many correct answers.
    Seed,
}

impl std::str::FromStr for Convention {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "math-rubric" | "mathrubric" => Ok(Self::MathRubric),
            "seed" => Ok(Self::Seed),
            other => Err(format!(
                "unknown answer convention {other:?} (expected \"math-rubric\" or \"seed\")"
            )),
        }
    }
}

/// A verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// The prediction equals the gold answer.
    pub correct: bool,
    /// The step budget ran out (the verdict is then "incorrect").
    pub timed_out: bool,
}

/// verifiers' `extract_boxed_answer`: the content of the first `\boxed{…}` (braces balanced),
/// or the whole text when there is none or it does not close.
pub fn first_boxed(text: &str) -> &str {
    let Some(start) = text.find("\\boxed{") else {
        return text;
    };
    let content = start + "\\boxed{".len();
    let mut depth = 1;
    for (i, c) in text[content..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return &text[content..content + i];
                }
            }
            _ => {}
        }
    }
    text
}

/// Whether the answer `pred` (already extracted, e.g. with [`first_boxed`]) equals `gold`.
pub fn check(convention: Convention, pred: &str, gold: &str) -> Verdict {
    check_with(convention, pred, gold, DEFAULT_STEPS)
}

/// [`check`] with an explicit step budget.
pub fn check_with(convention: Convention, pred: &str, gold: &str, steps: u64) -> Verdict {
    let incorrect = Verdict {
        correct: false,
        timed_out: false,
    };
    if pred.is_empty() || pred.len() > MAX_CHARS || gold.len() > MAX_CHARS {
        return incorrect;
    }
    let mut budget = Budget::new(steps);
    let correct = match convention {
        Convention::MathRubric => {
            let g = parse(&format!("\\boxed{{{gold}}}"), &mut budget);
            let p = parse(&format!("\\boxed{{{pred}}}"), &mut budget);
            verify(&g, &p, &mut budget)
        }
        Convention::Seed => {
            let p = parse(pred, &mut budget);
            let g = parse(gold, &mut budget);
            verify(&p, &g, &mut budget)
        }
    };
    Verdict {
        correct: correct && !budget.exhausted(),
        timed_out: budget.exhausted(),
    }
}

#[cfg(test)]
mod tests;
