#![no_main]
//! Fuzzes `stowage::fuzzing::list_query` (see that function for the input layout).

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = stowage::fuzzing::list_query(data);
});
