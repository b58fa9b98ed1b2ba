#![no_main]
//! Fuzzes `stowage::fuzzing::docker_config` (see that function for the input layout).

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = stowage::fuzzing::docker_config(data);
});
