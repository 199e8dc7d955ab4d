//! The README's command examples, run as written so they cannot drift from what hookline does.
//!
//! An example is the first `sh` block under its heading. It runs in `sh` with the built
//! `hookline` first on `PATH` and stderr joined to stdout. Each `# text` line in the block is a
//! line of output the commands before it must print, in order; a trailing `(exit N)` is the exit
//! status of the command just before it.

use std::path::Path;
use std::process::Command;

use crate::support::hookline_bin;

/// The first ```sh block after the line `heading` in README.md.
fn example(heading: &str) -> String {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("read README.md");
    let (_, after) = readme
        .split_once(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("README.md has no heading {heading:?}"));
    let (_, block) = after
        .split_once("```sh\n")
        .unwrap_or_else(|| panic!("no ```sh block under {heading:?}"));
    let (block, _) = block
        .split_once("\n```")
        .unwrap_or_else(|| panic!("the ```sh block under {heading:?} is not closed"));
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

/// Runs the example under `heading` and checks its output against its comments.
fn check_example(heading: &str) {
    let (printed, promised, script) = run(&example(heading));
    assert!(
        !promised.is_empty(),
        "{heading}: the example promises nothing"
    );
    assert_eq!(
        printed, promised,
        "{heading}: what the example printed, then what README.md says it prints; script:\n{script}"
    );
}

#[test]
fn the_sign_example_prints_what_the_readme_shows() {
    check_example("### `hookline sign`");
}

#[test]
fn the_verify_example_prints_what_the_readme_shows() {
    check_example("### `hookline verify`");
}

#[test]
fn a_promised_exit_status_is_checked_too() {
    let (printed, promised, _) = run("echo valid\nfalse\n# valid  (exit 0)");
    assert_eq!(promised, ["valid", "(exit 0)"]);
    assert_eq!(printed, ["valid", "(exit 1)"]);
}
