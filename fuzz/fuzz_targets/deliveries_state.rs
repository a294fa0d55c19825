#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sim::fuzzing::deliveries_state(data));
