//! docs/reference/cli.md: every subcommand and flag, from clap's command.
use std::fmt::Write as _;

use clap::{Arg, Command, CommandFactory as _};

use crate::args::Cli;

/// The command-line reference: the top level (kube-proxy's flags), then
/// each subcommand, nested ones after their parent.
#[must_use]
pub(crate) fn cli_markdown() -> String {
    let cli = Cli::command();
    let mut out = format!(
        "# Command-line reference\n\n{}\n\n`ebpf-proxy SUBCOMMAND --help` prints the same text. \
         Each flag's default and range are in its description; a value out of range is refused \
         before anything starts.\n",
        super::GENERATED
    );
    command(&mut out, &cli, "ebpf-proxy");
    out
}

fn command(out: &mut String, cmd: &Command, path: &str) {
    let _ = write!(out, "\n## `{path}`\n\n");
    if let Some(about) = cmd.get_long_about().or_else(|| cmd.get_about()) {
        let _ = writeln!(out, "{}\n", about.to_string().trim());
    }
    let subcommands: Vec<&Command> = cmd.get_subcommands().filter(|c| !c.is_hide_set()).collect();
    if !subcommands.is_empty() {
        let _ = writeln!(out, "Subcommands:\n");
        for sub in &subcommands {
            let name = sub.get_name();
            let about = sub.get_about().map(|a| super::one_line(&a.to_string())).unwrap_or_default();
            let _ = writeln!(out, "- [`{name}`](#{}): {about}", anchor(&format!("{path} {name}")));
        }
        out.push('\n');
    }
    let args: Vec<&Arg> = cmd.get_arguments().filter(|a| !a.is_hide_set()).collect();
    let mut heading: Option<&str> = None;
    if !args.is_empty() {
        out.push_str("| argument | description |\n|---|---|\n");
    }
    for arg in args {
        if arg.get_help_heading() != heading {
            heading = arg.get_help_heading();
            if let Some(h) = heading {
                let _ = writeln!(out, "| **{}** | |", super::one_line(h));
            }
        }
        let _ = writeln!(out, "| {} | {} |", usage(arg).replace('|', "\\|"), description(arg));
    }
    for sub in subcommands {
        command(out, sub, &format!("{path} {}", sub.get_name()));
    }
}

/// `--flag <VALUE>`, `-o, --output <OUTPUT>`, `<FRONTEND>`.
fn usage(arg: &Arg) -> String {
    let value = || {
        arg.get_value_names()
            .and_then(|names| names.first())
            .map_or_else(|| arg.get_id().as_str().to_uppercase(), ToString::to_string)
    };
    if arg.is_positional() {
        return format!("`<{}>`", value());
    }
    let mut names = Vec::new();
    if let Some(short) = arg.get_short() {
        names.push(format!("-{short}"));
    }
    if let Some(long) = arg.get_long() {
        names.push(format!("--{long}"));
    }
    let mut text = names.join(", ");
    if arg.get_action().takes_values() {
        let _ = write!(text, " <{}>", value());
    }
    format!("`{text}`")
}

/// The help text, then what clap adds: default, choices, environment.
fn description(arg: &Arg) -> String {
    let mut text =
        arg.get_long_help().or_else(|| arg.get_help()).map(|h| super::one_line(&h.to_string())).unwrap_or_default();
    let mut extra = Vec::new();
    let defaults: Vec<String> = arg.get_default_values().iter().map(|v| v.to_string_lossy().into_owned()).collect();
    if !defaults.is_empty() {
        extra.push(format!("default: `{}`", defaults.join(",")));
    }
    let choices: Vec<String> =
        arg.get_possible_values().iter().filter(|v| !v.is_hide_set()).map(|v| format!("`{}`", v.get_name())).collect();
    if !choices.is_empty() && arg.get_action().takes_values() {
        extra.push(format!("one of {}", choices.join(", ")));
    }
    if let Some(env) = arg.get_env() {
        extra.push(format!("environment: `{}`", env.to_string_lossy()));
    }
    if arg.is_global_set() {
        extra.push("also after the subcommands".to_owned());
    }
    if !extra.is_empty() {
        if !text.is_empty() {
            text.push(' ');
        }
        let _ = write!(text, "[{}]", extra.join("; "));
    }
    text
}

/// GitHub's anchor of a heading `` `TEXT` ``: lower case, spaces to `-`,
/// punctuation but `-` and `_` dropped.
fn anchor(text: &str) -> String {
    text.to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_subcommand_and_run_flag_is_listed() {
        let page = cli_markdown();
        for sub in
            ["run", "demo", "cleanup", "service", "service list", "service get", "status", "completion", "explain"]
        {
            assert!(page.contains(&format!("## `ebpf-proxy {sub}`")), "{sub} missing");
        }
        let run = Cli::command();
        let run = run.find_subcommand("run").expect("run");
        for arg in run.get_arguments().filter_map(Arg::get_long) {
            assert!(page.contains(&format!("`--{arg}")), "--{arg} missing");
        }
        assert!(page.contains("[`run`](#ebpf-proxy-run)"), "links to each subcommand's heading");
    }
}
