#![no_main]
//! `dlframe::fuzz::parquet_file` under libFuzzer; see src/fuzz.rs for what it builds and checks.

libfuzzer_sys::fuzz_target!(|data: &[u8]| dlframe::fuzz::parquet_file(data));
