//! The docs' command examples, run as written so they cannot drift from what hookline does, and
//! their relative links, followed so they cannot point at nothing.
//!
//! An example is the first `sh` block under its heading in a doc (README.md or a file under
//! docs/). It runs in `sh` with the built `hookline` first on `PATH` and stderr joined to stdout.
//! Each `# text` line in the block is a line of output the commands before it must print, in
//! order; a trailing `(exit N)` is the exit status of the command just before it.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::hookline_bin;

/// The crate root, where README.md and docs/ live.
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The text of `file`, a path under the crate root.
fn read_doc(file: &str) -> String {
    std::fs::read_to_string(root().join(file)).unwrap_or_else(|e| panic!("read {file}: {e}"))
}

/// The first ```sh block after the line `heading` in `file`, a path under the crate root.
fn example(file: &str, heading: &str) -> String {
    let doc = read_doc(file);
    let (_, after) = doc
        .split_once(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("{file} has no heading {heading:?}"));
    let (_, block) = after
        .split_once("```sh\n")
        .unwrap_or_else(|| panic!("{file}: no ```sh block under {heading:?}"));
    let (block, _) = block
        .split_once("\n```")
        .unwrap_or_else(|| panic!("{file}: the ```sh block under {heading:?} is not closed"));
    block.to_owned()
}

/// The script to run (the example plus a line printing each checked exit status) and the
/// output the example's comments promise.
fn script_and_promise(example: &str) -> (String, Vec<String>) {
    let mut script = String::from("exec 2>&1\n");
    let mut promised = vec![];
    for line in example.lines() {
        let Some(comment) = line.strip_prefix('#') else {
            script.push_str(line);
            script.push('\n');
            continue;
        };
        let comment = comment.trim();
        let exit = comment
            .strip_suffix(')')
            .and_then(|c| c.rsplit_once("(exit "))
            .map(|(text, code)| (text.trim_end(), code));
        match exit {
            Some((text, code)) => {
                promised.push(text.to_owned());
                promised.push(format!("(exit {code})"));
                script.push_str("echo \"(exit $?)\"\n");
            }
            None => promised.push(comment.to_owned()),
        }
    }
    (script, promised)
}

/// Runs `example` and returns what it printed and what its comments promise, with the script.
fn run(example: &str) -> (Vec<String>, Vec<String>, String) {
    let (script, promised) = script_and_promise(example);
    let bin_dir = Path::new(hookline_bin())
        .parent()
        .expect("binary directory");
    let path = std::env::join_paths(std::iter::once(bin_dir.to_path_buf()).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))
    .expect("PATH");
    let out = Command::new("sh")
        .arg("-c")
        .arg(&script)
        .env("PATH", path)
        .output()
        .expect("run sh");
    let printed = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    (printed, promised, script)
}

/// Runs the example under `heading` in `file` and checks its output against its comments.
fn check_example(file: &str, heading: &str) {
    let (printed, promised, script) = run(&example(file, heading));
    assert!(
        !promised.is_empty(),
        "{file} {heading}: the example promises nothing"
    );
    assert_eq!(
        printed, promised,
        "{file} {heading}: what the example printed, then what {file} says it prints; script:\n{script}"
    );
}

#[test]
fn the_sign_example_prints_what_the_readme_shows() {
    check_example("README.md", "### `hookline sign`");
}

#[test]
fn the_verify_example_prints_what_the_readme_shows() {
    check_example("README.md", "### `hookline verify`");
}

#[test]
fn a_promised_exit_status_is_checked_too() {
    let (printed, promised, _) = run("echo valid\nfalse\n# valid  (exit 0)");
    assert_eq!(promised, ["valid", "(exit 0)"]);
    assert_eq!(printed, ["valid", "(exit 1)"]);
}

/// The lines of `doc` outside fenced code blocks, where `#` starts a comment, not a heading.
fn prose(doc: &str) -> impl Iterator<Item = &str> {
    let mut fenced = false;
    doc.lines().filter(move |line| {
        if line.starts_with("```") {
            fenced = !fenced;
            return false;
        }
        !fenced
    })
}

/// The anchors GitHub gives the headings of `doc`: lower case, letters, digits, `-` and `_`
/// kept, spaces made `-`, everything else dropped; a repeated one gets `-1`, `-2`, ...
fn anchors(doc: &str) -> HashSet<String> {
    let mut found = HashSet::new();
    for line in prose(doc) {
        let Some(text) = line.strip_prefix('#') else {
            continue;
        };
        let slug: String = text
            .trim_start_matches('#')
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut anchor = slug.clone();
        let mut n = 0;
        while !found.insert(anchor.clone()) {
            n += 1;
            anchor = format!("{slug}-{n}");
        }
    }
    found
}

/// The targets of the inline links `[text](target)` in `doc`'s prose.
fn link_targets(doc: &str) -> Vec<String> {
    let mut targets = vec![];
    for line in prose(doc) {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let end = rest.find(')').unwrap_or(rest.len());
            targets.push(rest[..end].to_owned());
            rest = &rest[end..];
        }
    }
    targets
}

/// README.md and every Markdown file under docs/, as paths under the crate root.
fn docs() -> Vec<PathBuf> {
    let mut docs = vec![PathBuf::from("README.md")];
    let dir = std::fs::read_dir(root().join("docs")).expect("read docs/");
    let mut under: Vec<PathBuf> = dir
        .map(|entry| PathBuf::from("docs").join(entry.expect("docs/ entry").file_name()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    under.sort();
    docs.extend(under);
    docs
}

/// Every relative link in README.md and docs/*.md that does not lead where it says, as
/// "doc: target (why)".
fn broken_links() -> Vec<String> {
    let mut broken = vec![];
    for doc in docs() {
        let text = read_doc(doc.to_str().expect("UTF-8 path"));
        for target in link_targets(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = match target.split_once('#') {
                Some((file, anchor)) => (file, Some(anchor)),
                None => (target.as_str(), None),
            };
            let linked = if file.is_empty() {
                doc.clone()
            } else {
                doc.parent().expect("a doc's directory").join(file)
            };
            let path = root().join(&linked);
            if !path.exists() {
                broken.push(format!(
                    "{}: {target} (no file {})",
                    doc.display(),
                    linked.display()
                ));
                continue;
            }
            let Some(anchor) = anchor else { continue };
            let Ok(linked_text) = std::fs::read_to_string(&path) else {
                broken.push(format!("{}: {target} (not a readable file)", doc.display()));
                continue;
            };
            if !anchors(&linked_text).contains(anchor) {
                broken.push(format!(
                    "{}: {target} (no heading with that anchor in {})",
                    doc.display(),
                    linked.display()
                ));
            }
        }
    }
    broken
}

#[test]
fn every_relative_link_in_the_docs_leads_to_a_file_and_heading() {
    let broken = broken_links();
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn anchors_are_made_as_github_makes_them() {
    let found = anchors(
        "# hookline\n## The CQL store and `hookline migrate`\n```sh\n# output\n```\n\
         ### One replay at a time: marks and claims\n### `POST /v1/replays`\n## Notes\n## Notes\n",
    );
    let expected = [
        "hookline",
        "the-cql-store-and-hookline-migrate",
        "one-replay-at-a-time-marks-and-claims",
        "post-v1replays",
        "notes",
        "notes-1",
    ];
    assert_eq!(found, expected.map(str::to_owned).into());
}
