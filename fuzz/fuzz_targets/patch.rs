#![no_main]
//! Fuzzes `stowage::fuzzing::patch` (see that function for the input layout).

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = stowage::fuzzing::patch(data);
});
