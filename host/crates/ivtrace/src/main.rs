//! `ivtrace`: parse arguments, run the subcommand, map the outcome to an
//! exit status (see `ivtrace --help`).

use clap::Parser;
use ivtrace_region::sanitize::Shown;

use ivtrace::cli::{Cli, Command};
use ivtrace::{hint_for, record, report, snapshot, EXIT_ERROR, EXIT_NOTHING, EXIT_OK};

fn main() {
    let cli = Cli::parse();
    let (what, result) = match &cli.command {
        Command::Record(a) => ("record failed", record::run(a)),
        Command::Report(a) => ("report failed", report::run(a)),
        Command::Snapshot(a) => ("snapshot failed", snapshot::run(a)),
        Command::Serve(a) => ("serve failed", ivtrace::serve::run(a)),
        Command::Ctl(a) => ("ctl failed", ivtrace::ctl::run(a)),
        Command::Recover(a) => ("recover failed", ivtrace::recover::run(a)),
        Command::Boot(a) => ("boot failed", ivtrace::boot::run(a)),
        Command::Export(a) => ("export failed", ivtrace::export::run(a)),
    };
    let code = match result {
        Ok(0) => {
            eprintln!("ivtrace: no events (none recorded, none lost)");
            EXIT_NOTHING
        }
        Ok(_) => EXIT_OK,
        Err(err) => {
            // Errors may quote what a guest or a file said.
            eprintln!("ivtrace: {what}: {}", Shown(&format!("{err:#}")));
            if let Some(hint) = hint_for(&err) {
                eprintln!("hint: {hint}");
            }
            EXIT_ERROR
        }
    };
    std::process::exit(code);
}
