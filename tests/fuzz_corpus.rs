//! Replays the fuzz corpora kept in `fuzz/corpus/<target>/` and the crash reproducers in
//! `fuzz/regressions/<target>/` through the harnesses in `dlframe::fuzz`, plus a few thousand
//! pseudo-random inputs each, on stable Rust in every test run. A harness panics on a finding.

use std::path::Path;

use dlframe::fuzz::{Outcome, dlpack_import, dlpack_import_outcome, tensor_metadata, typestr};

type Harness = fn(&[u8]);

#[cfg(not(feature = "parquet"))]
const TARGETS: [(&str, Harness); 3] =
    [("dlpack_import", dlpack_import), ("typestr", typestr), ("tensor_metadata", tensor_metadata)];
#[cfg(feature = "parquet")]
const TARGETS: [(&str, Harness); 4] = [
    ("dlpack_import", dlpack_import),
    ("typestr", typestr),
    ("tensor_metadata", tensor_metadata),
    ("parquet_file", dlframe::fuzz::parquet_file),
];

fn files(dir: &Path) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut out: Vec<_> = entries.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.is_file()).collect();
    out.sort();
    out
}

#[test]
fn kept_corpora_and_regressions_replay_cleanly() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut replayed = 0;
    for (name, harness) in TARGETS {
        for sub in ["corpus", "regressions"] {
            for path in files(&root.join(sub).join(name)) {
                let bytes = std::fs::read(&path).expect("a readable corpus file");
                let outcome = std::panic::catch_unwind(|| harness(&bytes));
                assert!(outcome.is_ok(), "{name}: {} fails", path.display());
                replayed += 1;
            }
        }
    }
    println!("replayed {replayed} kept inputs");
    assert!(replayed > 0, "no corpus found under {}", root.display());
}

#[test]
fn pseudo_random_inputs_are_refused_or_handled() {
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for (name, harness) in TARGETS {
        for i in 0..3000 {
            let len = (next() % 160) as usize;
            let bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let outcome = std::panic::catch_unwind(|| harness(&bytes));
            assert!(outcome.is_ok(), "{name}: input {i} {bytes:?} fails");
        }
    }
}

#[test]
fn hand_written_seeds() {
    // The bytes in the order the harness reads them (src/fuzz.rs, dlpack_import_outcome).
    let head = |device: &[u8]| -> Vec<u8> {
        let mut b = vec![1u8, 1]; // versioned, version 1.1
        b.extend([0u8; 8]); // flags 0 ...
        b.push(1); // ... masked to the two known bits
        b.extend(device);
        b
    };
    // A 2x3 f32 C-order tensor into the arena on the CPU: accepted and read.
    let mut ok = head(&[3]); // the CPU
    ok.extend([4u8, 1, 5]); // ndim 2; dtype from the table: f32
    ok.extend([2 << 2 | 1, 3 << 2 | 1]); // shape (2, 3)
    ok.extend([1u8, 3 << 2 | 1, 1 << 2 | 1]); // strides present: (3, 1)
    ok.extend([1u8, 0, 1]); // byte offset 0; data in the arena
    assert_eq!(dlpack_import_outcome(&ok), Outcome::Read, "the 2x3 f32 seed is accepted and read");
    // ndim -1, 65 and i32::MAX: refused before reading.
    for ndim in [-1i32, 65, i32::MAX] {
        let mut b = head(&[3, 0]); // the CPU; ndim given raw
        b.extend(ndim.to_le_bytes());
        b.extend(ok[head(&[3]).len() + 1..].iter().copied());
        assert_eq!(dlpack_import_outcome(&b), Outcome::Refused, "ndim {ndim} is refused");
    }
    typestr(b"<f8");
    typestr(b"|b1");
    typestr(b"<M8[ns]");
    typestr(b"<f99999999999999999999");
    tensor_metadata(b"\x06{\"shape\": [2, 3], \"permutation\": [1, 0]}");
    tensor_metadata(b"\x06{\"shape\": [18446744073709551615, 2]}");
    tensor_metadata(b"\x06{\"shape\": [2, 3], \"permutation\": [0, 0]}");
    tensor_metadata(b"\x05{\"shape\": [2, 3]}");
}
