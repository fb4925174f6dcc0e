//! The documentation's shape: every relative link in README.md, CHANGELOG.md
//! and docs/ resolves (the file exists and, for an `#anchor`, a heading of
//! it has that anchor), and README.md stays a front page (at most
//! `README_MAX_LINES`). The reference pages' freshness is a unit test of
//! `ebpf_proxy::reference`, beside the code that generates them.
use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

/// README.md's most lines: a front page that points to docs/.
const README_MAX_LINES: usize = 250;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the crate is in the workspace").to_owned()
}

/// README.md, CHANGELOG.md and every Markdown file under docs/.
fn pages() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let mut out = vec![root().join("README.md")];
    if root().join("CHANGELOG.md").exists() {
        out.push(root().join("CHANGELOG.md"));
    }
    walk(&root().join("docs"), &mut out);
    out.sort();
    out
}

/// The lines of `text` outside fenced code blocks.
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|line| {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// The targets of the inline links `[text](target)` of a line, skipping
/// inline code spans.
fn links(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_code = false;
    let chars: Vec<char> = line.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '`' => in_code = !in_code,
            ']' if !in_code && chars.get(i + 1) == Some(&'(') => {
                let rest: String = chars[i + 2..].iter().collect();
                if let Some(end) = rest.find(')') {
                    out.push(rest[..end].split_whitespace().next().unwrap_or("").to_owned());
                }
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// GitHub's anchor of a heading: lower case, inline code marks and
/// punctuation but `-` and `_` dropped, spaces to `-`; a repeated anchor
/// gets `-1`, `-2`, ...
fn anchors(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in prose(text) {
        let Some(heading) = line.strip_prefix('#') else { continue };
        let heading = heading.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        let slug: String = heading
            .trim()
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect();
        let mut unique = slug.clone();
        let mut n = 0;
        while out.contains(&unique) {
            n += 1;
            unique = format!("{slug}-{n}");
        }
        out.insert(unique);
    }
    out
}

#[test]
fn every_relative_link_resolves() {
    let mut broken = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).expect("a page");
        let name = page.strip_prefix(root()).unwrap_or(&page).display().to_string();
        for (n, line) in prose(&text).into_iter().enumerate() {
            for target in links(line) {
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let (file, anchor) = target.split_once('#').map_or((target.as_str(), None), |(f, a)| (f, Some(a)));
                let path = if file.is_empty() {
                    page.clone()
                } else {
                    page.parent().expect("a page is in a directory").join(file)
                };
                if !path.exists() {
                    broken.push(format!("{name} (prose line {}): {target}: no such file", n + 1));
                    continue;
                }
                if let Some(anchor) = anchor
                    && path.extension().is_some_and(|e| e == "md")
                    && !anchors(&std::fs::read_to_string(&path).expect("a page")).contains(anchor)
                {
                    broken.push(format!("{name} (prose line {}): {target}: no heading with that anchor", n + 1));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_readme_is_a_front_page() {
    let lines = std::fs::read_to_string(root().join("README.md")).expect("README.md").lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines, more than {README_MAX_LINES}: move the detail to a page of docs/ and link it"
    );
}

#[test]
fn the_link_checker_finds_links_and_anchors() {
    assert_eq!(links("see [a](b.md#c) and `[x](y)` or [d](https://e)"), ["b.md#c", "https://e"]);
    let anchors = anchors("# Title\n```\n# not a heading\n```\n## What `--flag` does\n## Title\n");
    assert_eq!(anchors, BTreeSet::from(["title".into(), "what---flag-does".into(), "title-1".into()]));
}
