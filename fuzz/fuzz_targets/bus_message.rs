//! A message from another replica as the fleet bus reads it
//! (`protocol::bus::decode_bus`): any bytes are refused with an error or
//! decode; a decoded message encodes to what it decodes to again. (A
//! number past f32's range reads as infinity, which JSON writes as null:
//! such a message need not read again, but must never panic.)
#![no_main]

use libfuzzer_sys::fuzz_target;
use protocol::bus::{decode_bus, encode_bus};

fuzz_target!(|bytes: &[u8]| {
    if let Ok(msg) = decode_bus(bytes) {
        let again = encode_bus(&msg);
        if let Ok(back) = decode_bus(again.as_bytes()) {
            assert_eq!(encode_bus(&back), again);
        }
    }
});
