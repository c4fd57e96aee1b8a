//! The two rules of the house for `unsafe` code, checked over every Rust source in the
//! repository: each `unsafe { ... }` block is led by a `// SAFETY:` comment (above its
//! statement, or on its line), and each `unsafe fn` has a `# Safety` section in its doc comment.

mod common;

use common::{code, rust_files};

/// The Rust sources under the repository's code folders.
fn sources() -> Vec<std::path::PathBuf> {
    rust_files(&["src", "python/src", "udfs", "cli", "serve", "tests", "benches", "fuzz"])
}

/// Whether the `unsafe {` on line `i` has its `SAFETY:` comment: on the line, or in the comment
/// block just above the statement it belongs to (a statement may run over several lines).
fn block_is_justified(lines: &[&str], i: usize) -> bool {
    if lines[i].contains("SAFETY") {
        return true;
    }
    let mut j = i;
    // Up through the earlier lines of the same statement, to the comment above it.
    while j > 0 {
        let above = lines[j - 1].trim();
        if above.starts_with("//") {
            break;
        }
        if above.is_empty() || [';', '{', '}', ','].iter().any(|&c| above.ends_with(c)) {
            return false;
        }
        j -= 1;
    }
    lines[..j].iter().rev().take_while(|l| l.trim().starts_with("//")).any(|l| l.contains("SAFETY"))
}

/// Whether the `unsafe fn` on line `i` has `# Safety` in the doc comment above it (attributes
/// may stand between).
fn fn_is_documented(lines: &[&str], i: usize) -> bool {
    lines[..i]
        .iter()
        .rev()
        .take_while(|l| {
            let t = l.trim();
            t.starts_with("///") || t.starts_with("#[")
        })
        .any(|l| l.contains("# Safety"))
}

/// Findings of both rules in one source text, as "line: text".
fn findings(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let c = code(line);
        let t = c.trim_start();
        let is_fn = {
            let rest = t.strip_prefix("pub ").or_else(|| t.strip_prefix("pub(crate) ")).unwrap_or(t);
            let rest = rest.strip_prefix("pub(super) ").unwrap_or(rest);
            rest.starts_with("unsafe fn ") || rest.starts_with("unsafe extern \"C\" fn ")
        };
        if is_fn && !fn_is_documented(&lines, i) {
            out.push(format!("{}: unsafe fn without a # Safety section: {}", i + 1, line.trim()));
        }
        // Spelt in two parts, so that this line is not a finding itself.
        let blocks = c.match_indices(concat!("unsafe", " {")).count();
        if blocks > 0 && !block_is_justified(&lines, i) {
            out.push(format!("{}: unsafe block without a SAFETY comment: {}", i + 1, line.trim()));
        }
    }
    out
}

#[test]
fn every_unsafe_block_and_fn_says_why_it_is_sound() {
    let files = sources();
    assert!(files.len() > 50, "found only {} sources: is the walk looking in the right place?", files.len());
    let mut all = Vec::new();
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap();
        all.extend(findings(&text).into_iter().map(|f| format!("{}:{f}", path.display())));
    }
    assert!(all.is_empty(), "{} findings:\n{}", all.len(), all.join("\n"));
}

#[test]
fn the_checks_catch_what_they_are_for() {
    // The samples say UNSAFE, so that this file is not a finding itself.
    let findings = |text: &str| findings(&text.replace("UNSAFE", "unsafe"));
    let unjustified = "fn f() {\n    let x = 1;\n    UNSAFE { g() };\n}\n";
    assert_eq!(findings(unjustified).len(), 1);
    let justified = "fn f() {\n    // SAFETY: g has no precondition.\n    UNSAFE { g() };\n}\n";
    assert!(findings(justified).is_empty());
    let over_lines = "fn f() {\n    // SAFETY: fine.\n    let x =\n        UNSAFE { g() };\n}\n";
    assert!(findings(over_lines).is_empty());
    let stale = "fn f() {\n    // SAFETY: fine.\n    let y = 2;\n    UNSAFE { g() };\n}\n";
    assert_eq!(findings(stale).len(), 1);
    let undocumented = "/// Does it.\npub UNSAFE fn f() {}\n";
    assert_eq!(findings(undocumented).len(), 1);
    let documented = "/// Does it.\n///\n/// # Safety\n/// None.\n#[inline]\nUNSAFE extern \"C\" fn f() {}\n";
    assert!(findings(documented).is_empty());
}
