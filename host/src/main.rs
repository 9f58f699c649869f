//! The `host` binary: parse the command line, set up logging, run, report errors.
//! Everything else lives in the `rlhost` library so tests and other front ends can call it.

use std::process::ExitCode;

use clap::Parser;
use rlhost::cli::Cli;

fn main() -> ExitCode {
    let cli = Cli::parse();
    rlhost::cli::init_logging(cli.verbose);
    match rlhost::cli::run(cli) {
        Ok(code) => code,
        Err(err) => {
            // `{:#}` prints the whole context chain on one line: "doing X: because Y: cause".
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
