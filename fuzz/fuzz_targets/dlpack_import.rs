#![no_main]
//! `dlframe::fuzz::dlpack_import` under libFuzzer; see src/fuzz.rs for what it builds and checks.

libfuzzer_sys::fuzz_target!(|data: &[u8]| dlframe::fuzz::dlpack_import(data));
