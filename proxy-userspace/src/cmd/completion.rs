//! `ebpf-proxy completion SHELL`: a completion script for the shell, made
//! from the command definition itself (clap_complete), so it never lags
//! behind the flags.
use clap::CommandFactory as _;

use crate::args::Cli;

/// The completion script for `shell`.
#[must_use]
pub(crate) fn script(shell: clap_complete::Shell) -> Vec<u8> {
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "ebpf-proxy", &mut out);
    out
}

/// Runs `ebpf-proxy completion`: prints the completion script for `shell`.
pub fn run(shell: clap_complete::Shell) -> anyhow::Result<()> {
    super::output::print(&String::from_utf8_lossy(&script(shell)))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap_complete::Shell;

    use super::script;

    #[test]
    fn every_shell_gets_a_script_naming_the_subcommands() {
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish, Shell::Elvish, Shell::PowerShell] {
            let text = String::from_utf8(script(shell)).unwrap();
            for word in ["service", "status", "cleanup", "completion"] {
                assert!(text.contains(word), "{shell}: no {word}");
            }
        }
    }
}
