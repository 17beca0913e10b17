//! The server's control message as a worker reads it
//! (`protocol::decode_from_server`): any text is refused with an error or
//! decodes; a decoded message encodes and decodes to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    if let Ok(msg) = protocol::decode_from_server(text) {
        let again = protocol::encode(&msg);
        assert_eq!(
            protocol::decode_from_server(&again).expect("decodes again"),
            msg
        );
    }
});
