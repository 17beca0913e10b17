//! A binary KV frame (`protocol::frame_transfer` as the gateway relays it,
//! `protocol::decode_frame` as a decode worker reads it): any bytes are
//! refused or decode; a decoded frame is exactly the frame its header
//! says (payload length, geometry, checksum) and re-encodes to its bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use protocol::ServedModel;

fuzz_target!(|bytes: &[u8]| {
    let model = ServedModel {
        name: "m".into(),
        layers: 4,
        kv_heads: 1,
        head_dim: 2,
        block_size: 16,
        context_length: 4096,
    };
    let relayed = protocol::frame_transfer(bytes);
    if let Ok((h, payload)) = protocol::decode_frame(bytes, &model) {
        assert_eq!(
            relayed,
            Ok(h.transfer),
            "a frame a worker takes is one the gateway relays"
        );
        assert_eq!(
            payload.len() as u64,
            u64::from(h.tokens) * model.kv_bytes_per_token()
        );
        let again = protocol::encode_frame(h.transfer, h.layer, h.first_token, h.tokens, payload);
        assert_eq!(again, bytes);
    }
});
