//! What the tests that read the repository's own sources share (`style.rs`, `layers.rs`).

use std::path::{Path, PathBuf};

/// The `.rs` files under each of `dirs` (relative to the repository root), at any depth,
/// leaving out build folders named `target`.
pub fn rust_files(dirs: &[&str]) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    let mut stack: Vec<PathBuf> = dirs.iter().map(|d| root.join(d)).collect();
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() && path.file_name().is_some_and(|n| n != "target") {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out
}

/// The code of a line, without a trailing `//` comment (near enough: no source here puts `//`
/// inside a string on a line these tests look at).
pub fn code(line: &str) -> &str {
    line.split("//").next().unwrap_or("")
}
