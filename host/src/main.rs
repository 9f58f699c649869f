//! The `host` binary: parse the command line, set up logging, run, report errors.
//! Everything else lives in the `rlhost` library so tests and other front ends can call it.

use std::process::ExitCode;

use clap::{CommandFactory, Parser};
use rlhost::cli::Cli;

fn main() -> ExitCode {
    // `@ file.toml` on the command line stands for the flags in the file.
    let args = match rlhost::config::expand(std::env::args_os().collect(), &Cli::command()) {
        Ok(a) => a,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::from(2);
        }
    };
    let cli = match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(err) if err.kind() == clap::error::ErrorKind::InvalidSubcommand => {
            let _ = err.print();
            if let Some(list) = rlhost::cli::unknown_subcommand_help(&args) {
                eprintln!("\n{list}");
            }
            return ExitCode::from(2);
        }
        Err(err) => err.exit(),
    };
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
