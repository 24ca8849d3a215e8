#![no_main]
// See sql_pseudo_trigger::fuzzing::state_document for what is checked; tests/fuzz_corpora.rs replays the corpus.
libfuzzer_sys::fuzz_target!(|data: &[u8]| sql_pseudo_trigger::fuzzing::state_document(data));
