#![no_main]
// See sql_pseudo_trigger::fuzzing::storage_connection_string for what is checked; tests/fuzz_corpora.rs replays the corpus.
libfuzzer_sys::fuzz_target!(|data: &[u8]| sql_pseudo_trigger::fuzzing::storage_connection_string(data));
