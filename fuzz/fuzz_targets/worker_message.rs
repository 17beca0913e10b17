//! A worker's control message (`protocol::decode`): any text is refused
//! with an error or decodes; a decoded message encodes and decodes to
//! itself.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    if let Ok(msg) = protocol::decode(text) {
        let again = serde_json::to_string(&msg).expect("a decoded message encodes");
        assert_eq!(protocol::decode(&again).expect("and decodes again"), msg);
    }
});
