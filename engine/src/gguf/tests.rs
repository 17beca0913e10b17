//! The GGUF reader and writer: round trips of every value and tensor
//! type, the same bytes as candle's writer, and refusals by name.

use std::io::Cursor;

use candle_core::quantized::{GgmlDType, QTensor, gguf_file};
use candle_core::{Device, Tensor};

use super::*;

fn tensor(name: &str, ty: TensorType, dims: &[usize], seed: u8) -> WriteTensor {
    let n: usize = dims.iter().product();
    let len = n / ty.block_weights() * ty.block_bytes();
    WriteTensor {
        name: name.into(),
        ty,
        dims: dims.to_vec(),
        bytes: (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect(),
    }
}

fn file(meta: &[(&str, &Value)], tensors: &[WriteTensor]) -> Vec<u8> {
    let mut out = Vec::new();
    write(&mut out, meta, tensors).expect("write");
    out
}

fn sample() -> Vec<u8> {
    let tokens = Value::Array(vec![Value::String("a".into()), Value::String("bc".into())]);
    let meta: Vec<(&str, Value)> = vec![
        ("general.architecture", Value::String("llama".into())),
        ("llama.block_count", Value::U32(2)),
        ("f", Value::F32(0.5)),
        ("i", Value::I64(-3)),
        ("b", Value::Bool(true)),
        ("u8", Value::U8(7)),
        ("tokenizer.ggml.tokens", tokens),
        (
            "nested",
            Value::Array(vec![Value::Array(vec![Value::U16(1)])]),
        ),
    ];
    let refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (*k, v)).collect();
    file(
        &refs,
        &[
            tensor("a", TensorType::Iq4Xs, &[3, 512], 1),
            tensor("b", TensorType::Iq4Nl, &[2, 64], 2),
            tensor("c", TensorType::F32, &[5], 3),
            tensor("d", TensorType::Q6K, &[1, 256], 4),
        ],
    )
}

#[test]
fn every_value_and_tensor_type_round_trips() {
    let bytes = sample();
    let mut r = Cursor::new(bytes.clone());
    let g = Gguf::read(&mut r).expect("read");
    assert_eq!(g.data_offset % 32, 0);
    assert!(matches!(g.metadata["llama.block_count"], Value::U32(2)));
    assert!(matches!(g.metadata["i"], Value::I64(-3)));
    let Value::Array(t) = &g.metadata["tokenizer.ggml.tokens"] else {
        panic!("tokens")
    };
    assert_eq!(t.len(), 2);
    for (name, ty, dims, seed) in [
        ("a", TensorType::Iq4Xs, vec![3, 512], 1),
        ("b", TensorType::Iq4Nl, vec![2, 64], 2),
        ("c", TensorType::F32, vec![5], 3),
        ("d", TensorType::Q6K, vec![1, 256], 4),
    ] {
        let info = g.info(name).expect("present");
        assert_eq!((info.ty, &info.dims), (ty, &dims), "{name}");
        let got = g.tensor_bytes(&mut r, name).expect("bytes");
        assert_eq!(got, tensor(name, ty, &dims, seed).bytes, "{name}");
    }
    assert!(g.info("e").is_err());
}

#[test]
fn the_writer_gives_candles_bytes_for_the_types_candle_writes() {
    let w = Tensor::from_vec(
        (0..512)
            .map(|i| (i as f32 * 0.37).sin())
            .collect::<Vec<_>>(),
        (2, 256),
        &Device::Cpu,
    )
    .expect("w");
    let meta = [("general.architecture", Value::String("llama".into()))];
    let refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (*k, v)).collect();
    for (dt, ty) in [
        (GgmlDType::Q4K, TensorType::Q4K),
        (GgmlDType::Q8_0, TensorType::Q8_0),
        (GgmlDType::F32, TensorType::F32),
    ] {
        let qt = QTensor::quantize(&w, dt).expect("quantize");
        let mut theirs = Cursor::new(Vec::new());
        gguf_file::write(&mut theirs, &refs, &[("w", &qt)]).expect("candle");
        let ours = file(
            &refs,
            &[WriteTensor {
                name: "w".into(),
                ty,
                dims: vec![2, 256],
                bytes: qt.data().expect("data").to_vec(),
            }],
        );
        assert_eq!(ours, theirs.into_inner(), "{ty:?}");
    }
}

#[test]
fn a_type_not_read_is_refused_naming_the_tensor() {
    let mut bytes = sample();
    // Tensor "b" is IQ4_NL (20): make it IQ2_XXS (16). Its entry: the
    // name's length and byte, two dimensions of 8 bytes, then the type.
    let entry = [&1u64.to_le_bytes()[..], b"b", &2u32.to_le_bytes()].concat();
    let at = bytes
        .windows(entry.len())
        .position(|w| w == entry)
        .expect("the entry")
        + entry.len()
        + 16;
    assert_eq!(bytes[at..at + 4], 20u32.to_le_bytes());
    bytes[at..at + 4].copy_from_slice(&16u32.to_le_bytes());
    let err = Gguf::read(&mut Cursor::new(bytes)).expect_err("refused");
    let msg = err.to_string();
    assert!(
        msg.contains("`b`") && msg.contains("IQ2_XXS (type 16)"),
        "{msg}"
    );
    assert_eq!(type_name(23), "IQ4_XS (type 23)");
    assert_eq!(type_name(99), "type 99");
}

#[test]
fn cut_anywhere_the_file_is_refused_without_a_panic() {
    let bytes = sample();
    let g = Gguf::read(&mut Cursor::new(bytes.clone())).expect("whole");
    let d = g.info("d").expect("d");
    // The last tensor's data ends before the file's final padding.
    let data_end = (g.data_offset + d.offset) as usize + d.bytes();
    for end in 0..bytes.len() {
        let r = Gguf::read(&mut Cursor::new(bytes[..end].to_vec()));
        // Cut inside a tensor's data, the directory still reads but that
        // tensor runs past the end: refused too.
        assert_eq!(r.is_err(), end < data_end, "cut at {end}");
    }
}

#[test]
fn the_writer_refuses_bytes_that_do_not_match_the_shape() {
    let mut t = tensor("x", TensorType::Q4_0, &[2, 32], 0);
    t.bytes.pop();
    assert!(write(&mut Vec::new(), &[], &[t]).is_err());
}
