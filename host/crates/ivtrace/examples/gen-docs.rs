//! Writes the man pages and shell completions of `ivtrace` from its clap
//! definition (the same `Cli` the binary parses), so they cannot drift
//! from the options. A build step, not a subcommand: the shipped binary
//! carries no generator.
//!
//! ```sh
//! cargo run --release --locked --example gen-docs -- OUTDIR
//! ```
//!
//! writes `OUTDIR/man/ivtrace.1` and `OUTDIR/man/ivtrace-<sub>.1` (one
//! page per subcommand, `SEE ALSO` linking them), and
//! `OUTDIR/completions/{ivtrace.bash,_ivtrace,ivtrace.fish}`.
//! `make gen-docs` (into build/gen-docs/) and the Debian package build
//! (debian/rules) run it.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::CommandFactory;
use clap_complete::Shell;

use ivtrace::cli::Cli;

/// The section-1 page of `cmd`, rendered in full (options, help text,
/// the after-help examples and exit status as an EXTRA section).
fn render_page(cmd: &clap::Command) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let man = clap_mangen::Man::new(cmd.clone()).date(build_date());
    man.render_title(&mut out)?;
    man.render_name_section(&mut out)?;
    man.render_synopsis_section(&mut out)?;
    man.render_description_section(&mut out)?;
    if cmd.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(&mut out)?;
    }
    if cmd.has_subcommands() {
        man.render_subcommands_section(&mut out)?;
    }
    if cmd.get_after_long_help().or(cmd.get_after_help()).is_some() {
        man.render_extra_section(&mut out)?;
    }
    if cmd.get_version().is_some() {
        man.render_version_section(&mut out)?;
    }
    Ok(out)
}

/// The date in the pages' footer: SOURCE_DATE_EPOCH when set (Debian
/// builds set it from the changelog, so rebuilds are reproducible), else
/// empty rather than today's date.
fn build_date() -> String {
    let Some(secs) = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
    else {
        return String::new();
    };
    let days = secs.div_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02}")
}

/// Days since 1970-01-01 to a proleptic Gregorian date (H. Hinnant's
/// algorithm), to avoid a date crate for one footer.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// `ivtrace.1` and one `ivtrace-<sub>.1` per subcommand.
fn write_man_pages(dir: &Path) -> Result<Vec<PathBuf>> {
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    // clap's implicit `help` subcommand gets no page of its own.
    let mut root = Cli::command().disable_help_subcommand(true);
    root.build();
    let mut written = Vec::new();
    let mut write = |name: String, cmd: &clap::Command| -> Result<()> {
        let path = dir.join(format!("{name}.1"));
        fs::write(&path, render_page(cmd)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
        written.push(path);
        Ok(())
    };
    write("ivtrace".into(), &root)?;
    for sub in root.get_subcommands().filter(|s| !s.is_hide_set()) {
        // The page's title says `ivtrace-serve`, as man(1) finds it; the
        // synopsis keeps the bin name `ivtrace serve` that build() set.
        let name = format!("ivtrace-{}", sub.get_name());
        write(name.clone(), &sub.clone().display_name(name))?;
    }
    Ok(written)
}

/// bash, zsh and fish completions, named as each shell's directory expects.
fn write_completions(dir: &Path) -> Result<Vec<PathBuf>> {
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut written = Vec::new();
    for (shell, file) in [
        (Shell::Bash, "ivtrace.bash"),
        (Shell::Zsh, "_ivtrace"),
        (Shell::Fish, "ivtrace.fish"),
    ] {
        let mut buf = Vec::new();
        clap_complete::generate(shell, &mut Cli::command(), "ivtrace", &mut buf);
        let path = dir.join(file);
        fs::write(&path, buf).with_context(|| format!("cannot write {}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [outdir] = args.as_slice() else {
        bail!("usage: gen-docs OUTDIR (writes OUTDIR/man/*.1 and OUTDIR/completions/*)");
    };
    let outdir = Path::new(outdir);
    let mut all = write_man_pages(&outdir.join("man"))?;
    all.extend(write_completions(&outdir.join("completions"))?);
    for p in &all {
        println!("{}", p.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::civil_from_days;

    #[test]
    fn dates_from_days() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }
}
