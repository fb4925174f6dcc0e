//! The reference pages under `docs/reference/`, generated from the code
//! (clap's command, the config file's parser, the metrics registry), so
//! they cannot drift from it: `cargo xtask docs` writes them, and a unit
//! test fails when a committed page differs from what the code gives.
mod cli;
mod config;
mod metrics;

use std::path::Path;

pub(crate) use cli::cli_markdown;
pub(crate) use config::config_markdown;
pub(crate) use metrics::metrics_markdown;

/// The line under each page's title.
const GENERATED: &str = "Generated from the code by `cargo xtask docs`; do not edit by hand.";

/// Every page: its path from the workspace root, and its text.
#[must_use]
pub(crate) fn pages() -> Vec<(&'static str, String)> {
    vec![
        ("docs/reference/cli.md", cli_markdown()),
        ("docs/reference/config.md", config_markdown()),
        ("docs/reference/metrics.md", metrics_markdown()),
    ]
}

/// Writes every page under `root` (the workspace root); returns the pages
/// that changed.
///
/// # Errors
///
/// When a page cannot be written.
pub fn write_all(root: &Path) -> std::io::Result<Vec<&'static str>> {
    let mut changed = Vec::new();
    for (path, text) in pages() {
        let file = root.join(path);
        if std::fs::read_to_string(&file).ok().as_deref() != Some(text.as_str()) {
            if let Some(dir) = file.parent() {
                std::fs::create_dir_all(dir)?;
            }
            std::fs::write(&file, text)?;
            changed.push(path);
        }
    }
    Ok(changed)
}

/// Help text as one Markdown line: clap's paragraphs joined, pipes escaped
/// (the text sits in table cells).
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ").replace('|', "\\|")
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    fn root() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("the crate is in the workspace").to_owned()
    }

    #[test]
    fn committed_reference_pages_are_current() {
        for (path, text) in super::pages() {
            let committed = std::fs::read_to_string(root().join(path)).unwrap_or_default();
            assert!(
                committed == text,
                "{path} differs from what the code generates: run `cargo xtask docs` and commit the result"
            );
        }
    }

    #[test]
    fn one_line_joins_paragraphs_and_escapes_pipes() {
        assert_eq!(super::one_line("a\nb\n\n  c|d"), "a b c\\|d");
    }
}
