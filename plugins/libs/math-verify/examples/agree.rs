//! Development aid: the library's verdicts against a reference file written by
//! `scripts/math-verify-reference.py`, natively and without the host (the agreement check that
//! gates CI runs through the plugin: `host bench math-verify`, `host/tests/e2e/math_verify.rs`).
//!
//! `cargo run --release --target <host triple> -p rlhost-math-verify --example agree -- FILE [math_rubric|seed]`
//!
//! It first prints the one-off costs a fresh process (a fresh plugin instance) pays: the first
//! normalisation and the first verdict of each convention, against the same calls warm.

use rlhost_math_verify::{Convention, check};

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args.next().expect("usage: agree FILE [math_rubric|seed]");
    let key = args.next().unwrap_or_else(|| "math_rubric".into());
    let convention = if key == "seed" {
        Convention::Seed
    } else {
        Convention::MathRubric
    };
    cold_costs();
    let text = std::fs::read_to_string(&path).expect("a readable reference file");
    let started = std::time::Instant::now();
    let (mut n, mut agree) = (0u64, 0u64);
    for line in text.lines() {
        let row: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
        if row.get("timing").is_some() {
            continue;
        }
        let s = |k: &str| row[k].as_str().expect("a string field").to_string();
        let want = row[key.as_str()].as_bool().expect("a verdict");
        let got = check(convention, &s("pred"), &s("gold")).correct;
        n += 1;
        if got == want {
            agree += 1;
        } else {
            println!(
                "{:>16} want={want} got={got} gold={:?} pred={:?}",
                s("kind"),
                s("gold"),
                s("pred")
            );
        }
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "agreement {agree}/{n} = {:.3}% ({:.0} verdicts/s on one thread)",
        100.0 * agree as f64 / n as f64,
        n as f64 / secs
    );
}

/// The first calls' costs in this process against the same calls again (the cold start every
/// fresh plugin instance pays once).
fn cold_costs() {
    use rlhost_math_verify::normalize::{Boxed, normalize};
    let time = |what: &str, f: &dyn Fn()| {
        let t = std::time::Instant::now();
        f();
        println!("{what:<28} {:>10.1?}", t.elapsed());
    };
    time("normalize, cold", &|| {
        normalize("5", Some(Boxed::Last));
    });
    time("normalize \\frac, first", &|| {
        normalize("\\frac{1}{2}", Some(Boxed::Last));
    });
    time("normalize, warm", &|| {
        normalize("5", Some(Boxed::Last));
    });
    for (name, c) in [
        ("math_rubric", Convention::MathRubric),
        ("seed", Convention::Seed),
    ] {
        time(&format!("check {name}, first"), &|| {
            check(c, "5", "5");
        });
        time(&format!("check {name}, warm"), &|| {
            check(c, "5", "5");
        });
    }
}
