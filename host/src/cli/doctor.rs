//! `host doctor`: print the installation report; exit 1 when it lists problems.

use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

/// Arguments of `host doctor`.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Print the report as JSON (for scripts and bug reports).
    #[arg(long)]
    json: bool,
}

pub(super) fn run(args: DoctorArgs) -> anyhow::Result<ExitCode> {
    let report = crate::doctor::collect();
    if args.json {
        let json = serde_json::to_string_pretty(&report).context("serialising the report")?;
        println!("{json}");
    } else {
        print!("{}", report.to_text());
    }
    Ok(if report.problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
