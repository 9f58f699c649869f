//! What rlhost's own tests share with the library: recording that a test skipped its work, and
//! the rounding-error bounds of tests that compare two computations ([`rounding`]). A skip
//! is printed and appended to the file `$RLHOST_SKIP_LOG` names, one `SKIPPED <test>: <reason>`
//! line, because cargo hides the output of tests that pass; `make test` (scripts/test-summary.py)
//! counts those lines as skipped tests and, under `CI=true`, fails the run for any skip that
//! `.ci/allowed-skips.toml` does not list. A test that cannot do its work here calls [`skip`] and
//! returns; it never returns quietly.

pub mod rounding;

/// The environment variable naming the file skips are appended to.
pub const SKIP_LOG_ENV: &str = "RLHOST_SKIP_LOG";

/// Records that `test` skipped (part of) its work and why: printed, and appended to the file named
/// by `$RLHOST_SKIP_LOG` (nothing is written where it is unset).
pub fn skip(test: &str, why: &str) {
    let why = why.trim().replace('\n', " / ");
    let line = format!("SKIPPED {test}: {why}");
    println!("{line}");
    if let Some(path) = std::env::var_os(SKIP_LOG_ENV) {
        use std::io::Write;
        match std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
        {
            // One write per line: concurrent tests append whole lines.
            Ok(mut f) => {
                if let Err(e) = f.write_all(format!("{line}\n").as_bytes()) {
                    panic!("cannot record a skip in {}: {e}", path.to_string_lossy());
                }
            }
            Err(e) => panic!("cannot open the skip log {}: {e}", path.to_string_lossy()),
        }
    }
}
