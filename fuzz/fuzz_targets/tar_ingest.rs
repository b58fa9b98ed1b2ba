#![no_main]
//! Fuzzes `stowage::fuzzing::tar_ingest` (see that function for the input layout).

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = stowage::fuzzing::tar_ingest(data);
});
