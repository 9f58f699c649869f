//! verifiers' `python` tool as its `math_python` environment uses it (Aug 2025):
//! the cell runs like a Jupyter cell in a fresh interpreter (a trailing expression's value is
//! printed with `print`, i.e. `str()`), with a 10 s timeout, and the result is the first 1000
//! characters of the stripped stderr if there is any stderr, else of the stripped stdout.
//!
//! The cell is rewritten exactly as verifiers does (`ast` parse, trailing expression to
//! `_ = …; if _ is not None: print(_)`) by a small Python driver run inside rlhost's sandbox, so
//! line numbers in tracebacks match; a syntax error becomes the message of the `SyntaxError`
//! (what verifiers' tool raised and its environment returned).

use rlhost_sdk::types::PythonLimits;

/// Description the model sees.
pub const DESCRIPTION: &str = "Evaluates Python code like a Jupyter notebook cell, returning output and/or the last expression value.";
/// The tool's one argument's description.
pub const CODE_DESCRIPTION: &str = "A block of Python code";
/// What a call that runs out of time returns.
pub const TIMEOUT_TEXT: &str = "Error: Code execution timed out after 10 seconds";
/// Characters of output kept.
pub const OUTPUT_CHARS: usize = 1000;

/// The driver: rewrites the cell like verifiers' `_jupyterize` and runs it in a fresh
/// `__main__` namespace, after replaying earlier cells silently when the session persists.
const DRIVER: &str = r#"def _rlhost_python_tool(prior, src):
    import ast, io, sys, textwrap, traceback

    def jupyterize(s):
        s = textwrap.dedent(s)
        tree = ast.parse(s, mode="exec")
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = tree.body.pop()
            body = ast.unparse(ast.Module(tree.body, []))
            return body + "\n_ = " + ast.unparse(last.value) + "\nif _ is not None: print(_)"
        return s

    ns = {"__name__": "__main__", "__builtins__": __builtins__}
    if prior:
        saved = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = io.StringIO()
        try:
            for cell in prior:
                try:
                    exec(compile(jupyterize(cell), "<string>", "exec"), ns)
                except BaseException:
                    pass
        finally:
            sys.stdout, sys.stderr = saved
    try:
        code = jupyterize(src)
    except SyntaxError as e:
        sys.stderr.write(str(e))
        return
    try:
        exec(compile(code, "<string>", "exec"), ns)
    except SystemExit as e:
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    except BaseException as e:
        traceback.print_exception(type(e), e, e.__traceback__.tb_next)


_rlhost_python_tool(PRIOR, SRC)
"#;

/// The program run in the sandbox for `code`, after `prior` cells (persistent sessions).
pub fn program(code: &str, prior: &[String]) -> String {
    let src = serde_json::to_string(code).expect("a string serialises");
    let prior = serde_json::to_string(prior).expect("strings serialise");
    DRIVER.replace("PRIOR, SRC", &format!("{prior}, {src}"))
}

/// Limits of one call: verifiers' 10 s.
pub fn limits() -> PythonLimits {
    PythonLimits {
        timeout_ms: 10_000,
        memory_mib: 1024,
        max_output_bytes: 256 * 1024,
    }
}

/// The tool's result from what the program printed (verifiers' rules).
pub fn result_text(stdout: &str, stderr: &str, timed_out: bool) -> String {
    if timed_out {
        return TIMEOUT_TEXT.to_string();
    }
    let cut = |s: &str| s.trim().chars().take(OUTPUT_CHARS).collect::<String>();
    let err = cut(stderr);
    if !err.is_empty() {
        return err;
    }
    cut(stdout)
}

/// Runs one call in the host's sandbox and returns what the model sees.
pub fn run(code: &str, prior: &[String]) -> String {
    match rlhost_sdk::host::run_python(&program(code, prior), limits()) {
        Ok(out) => result_text(&out.stdout, &out.stderr, out.timed_out),
        Err(e) => format!("Error: the Python sandbox is unavailable: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stderr_wins_and_output_is_cut() {
        assert_eq!(result_text(" 42\n", "", false), "42");
        assert_eq!(
            result_text("42", "Traceback…\nNameError", false),
            "Traceback…\nNameError"
        );
        assert_eq!(result_text(&"x".repeat(5000), "", false).len(), 1000);
        assert_eq!(result_text("partial", "", true), TIMEOUT_TEXT);
    }

    #[test]
    fn program_embeds_code_as_literals() {
        let p = program("print(\"hi\")\n'''", &["x = 1".into()]);
        assert!(p.ends_with("_rlhost_python_tool([\"x = 1\"], \"print(\\\"hi\\\")\\n'''\")\n"));
    }
}
