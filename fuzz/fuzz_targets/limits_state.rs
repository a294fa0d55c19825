#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sim::fuzzing::limits_state(data));
