//! End-to-end: rlhost's math-verify reward plugin against Python math-verify (the reference
//! verifiers' math environments score with), through `host bench math-verify` as a user runs it:
//! every MATH-500 and MATH test gold answer against itself, its solution's boxed answer, equivalent
//! rewrites and near-misses, judged by both under both answer conventions.

use crate::common::{host, reference_python, repo_root, run, texts};

#[test]
fn rlhost_agrees_with_python_math_verify() {
    let Some(python) = reference_python("rlhost_agrees_with_python_math_verify") else {
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let report = repo_root().join("target/math-verify-agreement.md");
    let out = run(host(home.path()).args([
        "bench",
        "math-verify",
        "--json",
        "--python",
        python.to_str().unwrap(),
        "--plugin",
        repo_root()
            .join("plugins/target/dist/math-verify")
            .to_str()
            .unwrap(),
        "--report",
        report.to_str().unwrap(),
    ]));
    let (stdout, stderr) = texts(&out);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let r: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let pairs = r["pairs"].as_u64().unwrap();
    assert!(
        pairs > 40_000,
        "all 5000 golds with their candidates: {pairs}"
    );
    let rate = |c: &str| r[c]["rate"].as_f64().unwrap();
    assert!(
        rate("math_rubric") >= 0.99,
        "MathRubric agreement {}",
        rate("math_rubric")
    );
    assert!(
        rate("seed") >= 0.99,
        "seed-convention agreement {}",
        rate("seed")
    );
    // Every gold answer verifies against itself.
    assert_eq!(r["gold_self_rlhost"][0], r["gold_self_rlhost"][1]);
    assert_eq!(r["gold_self_rlhost"][1].as_u64(), Some(5000));
    // No verdict ran out of its step budget on real answers.
    assert_eq!(r["timeouts"].as_u64(), Some(0));
    // Every disagreement is listed, in the JSON and in the report.
    let disagree = |c: &str| r[c]["pairs"].as_u64().unwrap() - r[c]["agree"].as_u64().unwrap();
    let listed = r["disagreements"].as_array().unwrap();
    assert_eq!(
        listed.len() as u64,
        disagree("math_rubric") + disagree("seed")
    );
    let md = std::fs::read_to_string(&report).unwrap();
    for d in listed {
        let gold = d["gold"].as_str().unwrap().replace('|', "\\|");
        assert!(md.contains(&gold), "the report lists {gold}");
    }
    // The native build gives the same verdicts (the bench fails otherwise) and was measured.
    assert!(r["native_verdicts_per_sec"].as_f64().unwrap() > 0.0);
}
