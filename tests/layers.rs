//! The core's layers (docs/design.md, "Layers"): no module of `src/` uses one above it, read
//! from the `crate::` paths of its code (its `#[cfg(test)]` part and its comments aside).

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::{code, rust_files};

/// Each module's layer, bottom-up, as docs/design.md draws them. Modules of one layer may use
/// each other, but not in a circle (checked separately).
const LAYERS: &[&[&str]] = &[
    &["ffi"],
    &["dtype", "device", "error", "options", "decide"],
    &["tensor"],
    &["kernels", "interface"],
    &["arrow"],
    &["polars", "cuda"],
    &["transfer"],
    &["dlpack", "table"],
    &["batches", "parquet"],
];

/// The crate root's re-exports, by the module they come from.
const REEXPORTS: &[(&str, &str)] = &[
    ("Device", "device"),
    ("ForeignTensor", "dlpack"),
    ("export_legacy", "dlpack"),
    ("export_versioned", "dlpack"),
    ("DType", "dtype"),
    // `#[macro_export]` puts the dtype table's macro at the crate root.
    ("dtype_table", "dtype"),
    ("Error", "error"),
    ("ErrorKind", "error"),
    ("Result", "error"),
    ("Tensor", "tensor"),
];

/// Test helpers, not layers of the library.
const HELPERS: &[&str] = &["testing", "fuzz"];

fn layer(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// The module a `crate::` path's first segment names.
fn target(first: &str) -> String {
    REEXPORTS.iter().find(|(name, _)| *name == first).map_or(first, |(_, m)| m).to_string()
}

/// The first segments of the `crate::` paths in `code`: `crate::a::b` gives `a`, and
/// `crate::{a::X, b}` gives `a` and `b`.
fn crate_paths(code: &str) -> Vec<String> {
    paths_after(code, "crate::")
}

/// The first segments of the paths after `prefix` in `code` (`crate::`, `super::`), as
/// [`crate_paths`] reads them.
fn paths_after(code: &str, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (at, _) in code.match_indices(prefix) {
        if code[..at].ends_with("::") {
            continue; // `super::super::x` is read once, at its first `super::`
        }
        let rest = &code[at + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let end = group
                .char_indices()
                .find(|&(_, c)| {
                    depth += (c == '{') as i32 - (c == '}') as i32;
                    depth < 0
                })
                .map_or(group.len(), |(i, _)| i);
            let mut level = 0;
            let mut item = String::new();
            for c in group[..end].chars().chain([',']) {
                match c {
                    '{' => level += 1,
                    '}' => level -= 1,
                    ',' if level == 0 => {
                        let first = item.trim().split("::").next().unwrap_or("").trim().to_string();
                        if !first.is_empty() && first != "self" {
                            out.push(first);
                        }
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                if level == 0 {
                    item.push(c);
                }
            }
        } else {
            let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            if !name.is_empty() {
                out.push(name);
            }
        }
    }
    out
}

/// For each module of `src/`, the modules its code uses, with a place of each use.
fn uses() -> BTreeMap<String, BTreeMap<String, String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut graph: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for path in rust_files(&["src"]) {
        let rel = path.strip_prefix(&src).unwrap();
        let top = rel.components().next().unwrap().as_os_str().to_string_lossy().replace(".rs", "");
        if top == "lib" || HELPERS.contains(&top.as_str()) {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let text = &text[..text.find("#[cfg(test)]").unwrap_or(text.len())];
        for (n, line) in text.lines().enumerate() {
            for first in crate_paths(code(line)) {
                let to = target(&first);
                if to != top {
                    let place = format!("{}:{}", rel.display(), n + 1);
                    graph.entry(top.clone()).or_default().entry(to).or_insert(place);
                }
            }
        }
    }
    graph
}

/// The pairs of modules of `graph` (each with the modules it uses) that use each other,
/// directly or through others: a depth-first walk from each use back to its user.
fn circles(graph: &BTreeMap<String, Vec<String>>) -> Vec<(String, String)> {
    fn reaches(graph: &BTreeMap<String, Vec<String>>, from: &str, to: &str, seen: &mut Vec<String>) -> bool {
        if seen.iter().any(|s| s == from) {
            return false;
        }
        seen.push(from.to_string());
        graph.get(from).is_some_and(|tos| tos.iter().any(|n| n == to || reaches(graph, n, to, seen)))
    }
    graph
        .iter()
        .flat_map(|(from, tos)| tos.iter().map(move |to| (from, to)))
        .filter(|(from, to)| graph.contains_key(*to) && reaches(graph, to, from, &mut Vec::new()))
        .map(|(from, to)| (from.clone(), to.clone()))
        .collect()
}

#[test]
fn no_module_uses_one_above_it_or_goes_round() {
    let graph = uses();
    assert!(graph.len() >= 10, "read only {} modules: is the walk looking in the right place?", graph.len());
    let mut wrong = Vec::new();
    for (from, tos) in &graph {
        let Some(own) = layer(from) else {
            wrong.push(format!("{from} has no layer in this test (add it where docs/design.md puts it)"));
            continue;
        };
        for (to, place) in tos {
            if HELPERS.contains(&to.as_str()) {
                wrong.push(format!("{place}: {from} uses the test helpers {to} outside its tests"));
                continue;
            }
            match layer(to) {
                None => wrong.push(format!("{place}: {from} uses {to}, which has no layer in this test")),
                Some(l) if l > own => {
                    wrong.push(format!("{place}: {from} (layer {own}) uses {to} (layer {l})"))
                }
                Some(_) => {}
            }
        }
    }
    // Within a layer: no circle.
    let names: BTreeMap<String, Vec<String>> =
        graph.iter().map(|(m, tos)| (m.clone(), tos.keys().cloned().collect())).collect();
    wrong.extend(
        circles(&names)
            .into_iter()
            .map(|(a, b)| format!("{a} and {b} use each other, directly or through others")),
    );
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Within each module of `src/` that is a directory, its files (submodules) that use each other,
/// directly or through others (`super::x`, `crate::<module>::x`): none may.
#[test]
fn no_submodules_go_round() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut checked = 0;
    for dir in std::fs::read_dir(&src).unwrap().flatten().map(|e| e.path()).filter(|p| p.is_dir()) {
        let module = dir.file_name().unwrap().to_string_lossy().to_string();
        let mut graph: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for path in rust_files(&[&format!("src/{module}")]) {
            let rel = path.strip_prefix(&dir).unwrap();
            let sub = rel.components().next().unwrap().as_os_str().to_string_lossy().replace(".rs", "");
            if sub == "mod" || sub == "tests" {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let text = &text[..text.find("#[cfg(test)]").unwrap_or(text.len())];
            let own = format!("crate::{module}::");
            let uses = graph.entry(sub.clone()).or_default();
            for line in text.lines() {
                let line = code(line);
                // A file below a submodule's directory (copy/tests.rs) reaches its siblings
                // through super::super; those are read as uses of the submodule itself.
                if rel.components().count() == 1 {
                    uses.extend(paths_after(line, "super::"));
                }
                uses.extend(paths_after(line, &own));
            }
            uses.retain(|u| *u != sub);
            uses.sort();
            uses.dedup();
        }
        checked += graph.len();
        let found: Vec<String> = circles(&graph)
            .into_iter()
            .map(|(a, b)| format!("src/{module}: {a} and {b} use each other, directly or through others"))
            .collect();
        assert!(found.is_empty(), "{}", found.join("\n"));
    }
    assert!(checked >= 20, "read only {checked} submodules");
}

/// Modules of the binding (`python/src`, one file each) that use each other, directly or
/// through others: none may, as in the core.
#[test]
fn the_binding_has_no_circles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("python").join("src");
    let mut graph: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for path in rust_files(&["python/src"]) {
        let module = path.strip_prefix(&src).unwrap().to_string_lossy().replace(".rs", "");
        let text = std::fs::read_to_string(&path).unwrap();
        let text = &text[..text.find("#[cfg(test)]").unwrap_or(text.len())];
        let mut uses: Vec<String> =
            text.lines().flat_map(|l| crate_paths(code(l))).filter(|m| *m != module).collect();
        uses.sort();
        uses.dedup();
        graph.insert(module, uses);
    }
    assert!(graph.len() >= 10, "read only {} modules of python/src", graph.len());
    let circles: Vec<String> = circles(&graph)
        .into_iter()
        .map(|(a, b)| format!("python/src: {a} and {b} use each other, directly or through others"))
        .collect();
    assert!(circles.is_empty(), "{}", circles.join("\n"));
}

#[test]
fn the_reader_finds_paths_in_every_form() {
    assert_eq!(crate_paths("use crate::arrow::read;"), ["arrow"]);
    assert_eq!(
        crate_paths("use crate::{dtype::DType, tensor::{Tensor, layout}, self};"),
        ["dtype", "tensor"]
    );
    assert_eq!(crate_paths("let t = crate::kernels::fill(x) + crate::Tensor::new();"), ["kernels", "Tensor"]);
    assert_eq!(target("Tensor"), "tensor");
    assert_eq!(layer("ffi"), Some(0));
    assert!(layer("transfer") > layer("cuda") && layer("dlpack") > layer("transfer"));
}
