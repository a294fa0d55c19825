//! docs/RULES.md stays true: every test it names exists where it says, every rule id a test name cites
//! is documented there, and no family marked "planned" has a test yet.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// Every `.rs` file of the repository (build output excluded).
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') {
                sources(&path, out);
            }
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

/// The rule id a function name starts with (`b6` of `b6_a_hint_...`, `p` of `p_...`), if any.
fn rule_prefix(name: &str) -> Option<String> {
    let (head, _) = name.split_once('_')?;
    let mut chars = head.chars();
    let family = chars.next()?;
    let number: String = chars.collect();
    let is_id = "brsfkuldgxthoq".contains(family) && !number.is_empty() && number.chars().all(|c| c.is_ascii_digit());
    (is_id || head == "p").then(|| head.to_uppercase())
}

/// The names of the functions defined in `text`.
fn functions(text: &str) -> impl Iterator<Item = &str> {
    text.split("fn ").skip(1).filter_map(|rest| {
        let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))?;
        (end > 0).then(|| &rest[..end])
    })
}

#[test]
fn rules_md_names_only_tests_that_exist_and_documents_every_cited_rule() {
    let root = root();
    let rules = std::fs::read_to_string(root.join("docs/RULES.md")).unwrap();

    // "- `path: test_name`" lines: the test is defined in that file.
    let mut named = 0;
    for line in rules.lines() {
        let Some(entry) = line.strip_prefix("- `").and_then(|l| l.split('`').next()) else { continue };
        let Some((path, test)) = entry.split_once(": ") else { continue };
        let text = std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("RULES.md names {path}: {e}"));
        assert!(functions(&text).any(|f| f == test), "RULES.md says {path} defines {test}; it does not");
        named += 1;
    }
    assert!(named > 100, "RULES.md lists the tests of every proven rule ({named} found)");

    // Every id a function name cites is a documented rule ("### B6 · ..."), and a family whose
    // rules are all planned has no test yet.
    let documented: BTreeSet<String> = rules
        .lines()
        .filter_map(|l| l.strip_prefix("### "))
        .filter_map(|l| l.split(' ').next())
        .map(str::to_owned)
        .collect();
    let mut files = Vec::new();
    sources(&root, &mut files);
    let mut cited = BTreeSet::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for function in functions(&text) {
            // Chained names (`g10_g11_g12_...`) cite each id.
            let mut rest = function;
            while let Some(id) = rule_prefix(rest) {
                cited.insert((
                    id.clone(),
                    file.strip_prefix(&root).unwrap().display().to_string(),
                    function.to_owned(),
                ));
                rest = &rest[id.len() + 1..];
            }
        }
    }
    for (id, file, function) in &cited {
        assert!(documented.contains(id), "{file}: {function} cites {id}, which RULES.md does not document");
    }
    // The families still planned (none at the moment).
    const PLANNED: &[&str] = &[];
    for planned in PLANNED {
        let tests: Vec<_> = cited.iter().filter(|(id, ..)| id.starts_with(planned)).collect();
        assert!(tests.is_empty(), "RULES.md calls family {planned} planned, but these prove it: {tests:?}");
    }
}
