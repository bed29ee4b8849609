#![no_main]
// The body lives in vgate::fuzzing so tests/fuzz_replay.rs replays the corpus through it.
libfuzzer_sys::fuzz_target!(|data: &[u8]| vgate::fuzzing::media_stream(data));
