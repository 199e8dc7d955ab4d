//! The layers of `docs/architecture.md`, held against the code: every module imports only from
//! its own layer or a lower one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The layers of `docs/architecture.md`'s table, lowest first: each module's rank and the
/// layer's name.
fn layer_table(doc: &str) -> BTreeMap<String, (usize, String)> {
    let (_, after) = doc
        .split_once("\n## The layers\n")
        .expect("docs/architecture.md has a \"## The layers\" section");
    let mut table = BTreeMap::new();
    let rows = after
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2);
    for (rank, row) in rows.enumerate() {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let (layer, modules) = (cells[1], cells[2]);
        for module in modules.split_whitespace() {
            let module = module.trim_matches('`').to_owned();
            let earlier = table.insert(module.clone(), (rank, layer.to_owned()));
            assert!(earlier.is_none(), "{module} is in two layers");
        }
    }
    assert!(!table.is_empty(), "the layer table has no rows");
    table
}

/// The top-level module a file under `src/` belongs to (`src/deliver/stage.rs` -> `deliver`).
fn module_of(relative: &Path) -> String {
    let first = relative
        .components()
        .next()
        .expect("a path under src/")
        .as_os_str()
        .to_string_lossy()
        .into_owned();
    first.strip_suffix(".rs").unwrap_or(&first).to_owned()
}

/// The crate modules a file's code names (`crate::admin::listen` -> `admin`; in `main.rs`,
/// `hookline::...`), with the line each is named on. Comments are not code.
fn imports(source: &str, crate_name: &str) -> Vec<(usize, String, String)> {
    let prefix = format!("{crate_name}::");
    let mut found = vec![];
    for (n, line) in source.lines().enumerate() {
        let code = line.trim_start();
        if code.starts_with("//") {
            continue;
        }
        let mut rest = code;
        while let Some(at) = rest.find(&prefix) {
            let before = rest[..at].chars().next_back();
            rest = &rest[at + prefix.len()..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let module: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !module.is_empty() {
                found.push((n + 1, module, code.to_owned()));
            }
        }
    }
    found
}

/// Every import in `files` (path under `src/`, source) that climbs a layer, as one line each.
fn climbing_imports(
    table: &BTreeMap<String, (usize, String)>,
    files: &[(PathBuf, String)],
) -> Vec<String> {
    let mut problems = vec![];
    for (path, source) in files {
        let module = module_of(path);
        if module == "lib" {
            continue;
        }
        let Some((rank, layer)) = table.get(&module) else {
            problems.push(format!(
                "src/{}: module {module} is in no layer of docs/architecture.md",
                path.display()
            ));
            continue;
        };
        let crate_name = if module == "main" {
            "hookline"
        } else {
            "crate"
        };
        for (line, imported, code) in imports(source, crate_name) {
            let Some((their_rank, their_layer)) = table.get(&imported) else {
                problems.push(format!(
                    "src/{}:{line}: {imported} is in no layer of docs/architecture.md: {code}",
                    path.display()
                ));
                continue;
            };
            if their_rank > rank {
                problems.push(format!(
                    "src/{}:{line}: {module} ({layer}) imports {imported} ({their_layer}), a \
                     higher layer: {code}",
                    path.display()
                ));
            }
        }
    }
    problems
}

/// Every `.rs` file under `dir`, by its path relative to `root`.
fn sources(root: &Path, dir: &Path, into: &mut Vec<(PathBuf, String)>) {
    for entry in std::fs::read_dir(dir).expect("read src/") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(root, &path, into);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let source = std::fs::read_to_string(&path).expect("read a source file");
            into.push((path.strip_prefix(root).unwrap().to_path_buf(), source));
        }
    }
}

fn doc() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/architecture.md"))
        .expect("read docs/architecture.md")
}

#[test]
fn every_module_imports_only_from_its_own_layer_or_lower_ones() {
    let table = layer_table(&doc());
    let root = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src"));
    let mut files = vec![];
    sources(root, root, &mut files);
    assert!(files.len() > 20, "found only {} files in src/", files.len());
    let problems = climbing_imports(&table, &files);
    assert!(
        problems.is_empty(),
        "imports that climb the layers of docs/architecture.md:\n{}",
        problems.join("\n")
    );
}

#[test]
fn a_vocabulary_file_importing_the_admin_api_is_named_with_its_import() {
    let table = layer_table(&doc());
    let files = [(
        PathBuf::from("id.rs"),
        "//! ids\nuse crate::admin::listen;\nuse crate::attempt::ErrorClass;\n".to_owned(),
    )];
    assert_eq!(
        climbing_imports(&table, &files),
        [
            "src/id.rs:2: id (vocabulary) imports admin (edges), a higher layer: \
          use crate::admin::listen;"
        ]
    );
}

#[test]
fn comments_and_longer_names_are_not_imports() {
    let found = imports(
        "// crate::admin is mentioned\nlet x = my_crate::admin::y;\nz(crate::id::Tenant)",
        "crate",
    );
    let modules: Vec<&str> = found.iter().map(|(_, m, _)| m.as_str()).collect();
    assert_eq!(modules, ["id"]);
}
