#![no_main]
//! Fuzzes `stowage::fuzzing::object_decode` (see that function for the input layout).

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = stowage::fuzzing::object_decode(data);
});
