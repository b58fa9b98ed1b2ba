#![no_main]
//! Fuzzes `stowage::fuzzing::range_headers` (see that function for the input layout).

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = stowage::fuzzing::range_headers(data);
});
