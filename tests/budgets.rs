//! Budgets that hold the shape of the house: the lines and the `unsafe` blocks of each crate's
//! sources, and the `unsafe` blocks of each of the core's FFI readers. A change that grows one
//! past its budget fails here. The budgets are the counts of 2026-11-28. Lower a budget when the
//! code shrinks; raise one only with the reason written beside it.
//!
//! Lines are all the lines of the `.rs` files under a folder (tests and comments included: they
//! are read too). An `unsafe` block is a line whose code, without its `//` comment, opens one
//! (`unsafe {`), as `style.rs` finds them.

mod common;

use std::path::Path;

use common::{code, rust_files};

/// A crate's sources: (folder, lines, unsafe blocks, why the numbers are what they are).
const CRATES: &[(&str, usize, usize, &str)] = &[
    (
        "src",
        25_020,
        199,
        "the core: the conversions, the FFI readers and writers (DLPack, the array interfaces, \
         the Arrow C device interface), the kernels, CUDA and batches; 21,913 lines and 232 \
         blocks on 2026-11-28, 200 blocks the aim of issue 55. Then `decide.rs` gathered the 20 \
         refusals (141 lines with its tests), a C stream is read without a C adapter, and the list \
         view test and the stream's callbacks are each read in one place; then the test modules' \
         producers taken through one helper each (195 blocks, 27 lines more), and the order of a \
         call's offers named in `consume::Entry` (37 lines); `batches`' keyword rules (a shuffle's \
         seed, a state's adopted settings) moved in from the binding, with a test (50 lines); a conversion finished at the core's \
         two exits, so that the binding no longer hands `nulls` back (51 lines with a test); the \
         Parquet reader of issue 56 (`parquet/`: the footer, the direct page decoder, the \
         hybrid decoder, the page cursor that fills row tiles, their tests and fuzz harness, and the \
         table of a file, 1,053 lines; its one block maps the file); then `dlframe.batches` of \
         Parquet paths through it (`parquet/files.rs`, the files as one source of units read in \
         groups, and `arrow/rows.rs`, a matrix as an array of rows and their gather, 475 lines \
         with their tests); and the page headers of compressed chunks read ahead of arrow-rs's page \
         reader, so that a decompression bomb is refused before it is allocated (`parquet/headers.rs`, \
         259 lines with its tests); dictionary indices unpacked eight at a time by a decoder per \
         width, a page's level and index buffers reused, and a tile's dictionary lookups made before its \
         writes (101 lines with their tests); the pool's thread count compiled only with the reader that \
         asks for it (1 line); then the CUDA plan holding the spec's `Made` instead of restating its \
         fields (28 lines fewer); a dictionary page read where the page holds it, with a test of \
         large dictionaries against arrow-rs (50 lines); the refusal of nulls by name and the mask's \
         rule each written once in `NullPolicy`, where four and two places wrote them (8 lines); \
         packed indices read in place but for a run's last groups, which the value-by-value unpacking reads (6 lines); then what a conversion does with nulls decided in one call \
         (`NullPolicy::decide`) and the fill checked once and kept as its bytes, which every writer \
         (the CPU kernels, the CUDA plan, the Parquet reader) takes as it is, with tests of the kept \
         bytes and of the Parquet reader now refusing an inexact fill as the conversion does (20 lines); a conversion made \
         complete where it is made, so that no exit finishes it again (11 lines fewer); \
         then from the binding: the array interfaces' tensors made by the descriptions that checked \
         them (`ArrayInterface::import`, `SyclInterface::import`, 2 blocks where the binding had 3), \
         and each DLPack capsule's name held by its managed tensor's type (63 lines); the fill's check beside the \
         other casts of one value, the dtype dispatch defined before the modules that use it (2 lines); the \
         fill's inexact check written out for the line width (4 lines); `Layout::of`, which \
         the binding wrote (10 lines); a boolean column's nulls refused before its cast, as they were before the \
         decision moved, with a test (7 lines); the decision's unread null count dropped, \
         and `kernels/cast.rs`'s tests moved to `kernels/cast/tests.rs` (9 lines fewer); a Parquet \
         tile without nulls written a whole row at a time from its pages' values or dictionary \
         indices in place (a whole-file read 20% faster from PLAIN pages, 29% from dictionary pages), \
         with a test of PLAIN and dictionary columns and of row and column writes mixed in one row \
         group (138 lines); the direct path's own page reader (`parquet/chunk.rs`: each page's \
         header read by `headers.rs`, its bytes in place or decompressed into a buffer the thread \
         kept from an earlier page, where arrow-rs's reader allocated, zeroed and freed one a page: \
         snappy and zstd reads 15-18% faster), with its tests against arrow-rs's page reader for \
         every codec and page version, and the pre-pass over compressed chunks' headers gone \
         (412 lines); a dictionary page's indices checked by their largest (2 lines); the reused page \
         buffers bounded in bytes too, with a test (7 lines); the tests' list of the direct path's codecs \
         written once (3 lines fewer); the binding's rule of the tensors pyarrow's DLPack import \
         takes as the Arrow path would (`arrow::is_plain_1d`, beside numpy's struct rule) and an \
         `__array_struct__` struct that holds its tensor, where the binding held it in the \
         capsule's context, each with a test (46 lines); the page headers of the compressed chunks \
         that arrow-rs's reader reads checked against their chunks' sizes in the footer first, so \
         that a decompression bomb is refused before arrow-rs allocates for it (33 lines); the walk \
         from one page header to the next written once (`headers::page_at`), for the direct \
         path's page reader and that check (10 lines); the direct path's codecs listed once, for the file's check and the page reader, with a test (27 lines); \
         a tile of columns of one kind written without asking each value's kind, and its \
         dictionary lookups without a check of their own (`pages::Lookups`: the indices checked \
         when their page was read; 1 block), a dictionary epoch in 9% less time; a zstd context kept by \
         each thread for its next chunk; each with a test (87 lines); a router's runs that \
         follow each other into one split cut as one part, so that a batch across two row \
         groups of one read shares it, with tests (42 lines); a dictionary's lookups typed by \
         the value their indices were checked for (`Lookups<T>`, `Rows<T>`), with a test of a \
         chunk whose second dictionary is smaller than its first (54 lines)",
    ),
    (
        "python/src",
        2_798,
        39,
        "the binding: pyo3 on public APIs; 2,981 lines on 2026-11-28, 2,957 with pyo3's buffer \
         views; 3,053 with the typed input (`input.rs`, 234 lines: the one order of a call's \
         offers, and the Arrow reading it gathered from `convert.rs` and `importer.rs`, less the \
         keyword rules that went to the core); 3,039 once the core finishes its parts; 3,058 with the path of a Parquet file as an input; 3,104 with Parquet files as a source of \
         batches (`ParquetFiles`, and the pass reading it without the GIL); 3,117 with the Arrow methods of each \
         type learnt once and the two small calls' fast paths ahead of the typed input (issue 55's \
         per-call benchmarks had found them 25% and 120% slower than before the typed input); 2,898 and 41 blocks \
         once the capsules, the array interfaces' tensors and the Arrow export share what they had each written, \
         the ladder's failures are read in one place, and the reader threads live with the batches they read. 2,874 with a fresh `max_version` dict for each \
         producer, where a cached one was copied, and the layout of a source read by the core; 2,840 with \
         one error for a bad batches keyword, one for a NULL exchange argument, and the plain tensor's \
         pyarrow import inside `host_to_pyarrow`; 2,798 and 39 blocks with the two exchange exports \
         through one reader of the object, the tensor of an `__array_struct__` capsule held by its \
         struct, the rule of a plain tensor in the core, one error for an object with no \
         protocol, and an exporter released through `Python::try_attach`. The aim was 2,800; its \
         blocks are the capsules, the exchange table and the array-interface structs",
    ),
    ("udfs/datafusion/src", 1_728, 0, "the SQL functions: safe Rust over the core"),
    ("udfs/polars/src", 327, 0, "the Polars plugin: safe Rust over the core"),
    ("cli/src", 493, 0, "the command: SQL to a file"),
    (
        "serve/src",
        7_277,
        6,
        "the services (7,004 lines, then the table kinds named in one place, with a test; then the \
         scheduler's random job ids, which make a job's id the capability to read its results, 38 lines \
         with their test; then a query's run apart from the service's dispatch, \
         `flight/service/query.rs`, so that neither file passes 600 lines, 24 lines of its header and \
         imports; then a call bounded by a multiple of its arguments summed per argument, a batch \
         of numbers not measured row by row, with a test: `benches/flight.py --load` 15-30% \
         faster, 67 lines; then the queries' runtimes kept between queries, `flight/threads.rs` with its \
         test, 102 lines: a thread started per query was 5-15% of `--load`'s p50; then that runtime \
         dropped without blocking wherever it is dropped, 17 lines); the blocks are the \
         socket peek and the descriptor limit (libc) and the bounded buffers of a prepared \
         statement's parameters",
    ),
];

/// The core's FFI readers and writers, by file: (file, unsafe blocks). Each reads or writes
/// structs that another library owns, so its blocks are where a fault would be.
const READERS: &[(&str, usize)] = &[
    ("src/arrow/device_stream.rs", 19),
    ("src/arrow/device.rs", 21),
    ("src/arrow/device_export.rs", 2),
    ("src/dlpack/import.rs", 13),
    ("src/dlpack/export.rs", 12),
    ("src/dlpack/allocate.rs", 8),
    ("src/interface/ndarray.rs", 6),
    ("src/interface/array_struct.rs", 5),
    ("src/ffi/exchange.rs", 6),
];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// What opens an unsafe block, written so that this file's own code does not contain it.
const OPENS: &str = concat!("unsafe", " {");

/// The unsafe blocks opened in `text`.
fn unsafe_blocks(text: &str) -> usize {
    text.lines().filter(|l| code(l).contains(OPENS)).count()
}

/// (lines, unsafe blocks) of the `.rs` files under `dir`.
fn count(dir: &str) -> (usize, usize) {
    let mut lines = 0;
    let mut blocks = 0;
    for file in rust_files(&[dir]) {
        let text = std::fs::read_to_string(&file).unwrap();
        lines += text.lines().count();
        blocks += unsafe_blocks(&text);
    }
    (lines, blocks)
}

#[test]
fn an_unsafe_block_is_counted_where_code_opens_one() {
    let text = "let a = OPEN f() };\n// OPEN in a comment }\nunsafe fn g() {}\nx(); // OPEN\n"
        .replace("OPEN", OPENS);
    assert_eq!(unsafe_blocks(&text), 1);
}

#[test]
fn every_crate_is_within_its_budget() {
    let mut over = Vec::new();
    for &(dir, max_lines, max_blocks, _) in CRATES {
        let (lines, blocks) = count(dir);
        assert!(lines > 0, "{dir}: no sources read");
        if lines > max_lines {
            over.push(format!("{dir}: {lines} lines, over its budget of {max_lines}"));
        }
        if blocks > max_blocks {
            over.push(format!("{dir}: {blocks} unsafe blocks, over its budget of {max_blocks}"));
        }
    }
    assert!(over.is_empty(), "{}", over.join("\n"));
}

#[test]
fn every_ffi_reader_is_within_its_budget() {
    let mut over = Vec::new();
    for &(file, max) in READERS {
        let text = std::fs::read_to_string(root().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        let blocks = unsafe_blocks(&text);
        if blocks > max {
            over.push(format!("{file}: {blocks} unsafe blocks, over its budget of {max}"));
        }
    }
    assert!(over.is_empty(), "{}", over.join("\n"));
}

/// A new crate gets a budget too: every folder of the workspace's sources is listed.
#[test]
fn every_crate_has_a_budget() {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let members = manifest.split("members = [").nth(1).and_then(|m| m.split(']').next()).unwrap();
    for member in members.split(',').map(|m| m.trim().trim_matches('"')).filter(|m| !m.is_empty()) {
        let src = if member == "." { "src".to_string() } else { format!("{member}/src") };
        assert!(CRATES.iter().any(|(dir, ..)| *dir == src), "{src}: no budget in tests/budgets.rs");
    }
}
