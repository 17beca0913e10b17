//! Writing a GGUF (v2) file from metadata and tensors already in their
//! GGML bytes, with the 32-byte alignment llama.cpp reads by default: for
//! the synthetic models (`synor-genmodel`) and tests, including the types
//! candle cannot write.

use std::io::Write;

use super::{TensorType, Value};
use crate::error::{EngineError, Result};

/// Alignment of each tensor's data.
const ALIGN: usize = 32;

/// A tensor to write: its name, type, shape (outermost first, as
/// `TensorInfo::dims`) and GGML bytes.
#[derive(Debug, Clone)]
pub struct WriteTensor {
    pub name: String,
    pub ty: TensorType,
    pub dims: Vec<usize>,
    pub bytes: Vec<u8>,
}

fn string(w: &mut Vec<u8>, s: &str) {
    w.extend((s.len() as u64).to_le_bytes());
    w.extend(s.as_bytes());
}

/// The GGUF id of a value's type.
fn value_type(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn value(w: &mut Vec<u8>, v: &Value) -> Result<()> {
    match v {
        Value::U8(x) => w.push(*x),
        Value::I8(x) => w.extend(x.to_le_bytes()),
        Value::U16(x) => w.extend(x.to_le_bytes()),
        Value::I16(x) => w.extend(x.to_le_bytes()),
        Value::U32(x) => w.extend(x.to_le_bytes()),
        Value::I32(x) => w.extend(x.to_le_bytes()),
        Value::F32(x) => w.extend(x.to_le_bytes()),
        Value::Bool(x) => w.push(u8::from(*x)),
        Value::String(s) => string(w, s),
        Value::U64(x) => w.extend(x.to_le_bytes()),
        Value::I64(x) => w.extend(x.to_le_bytes()),
        Value::F64(x) => w.extend(x.to_le_bytes()),
        Value::Array(items) => {
            let ty = items.first().map_or(4, value_type);
            if items.iter().any(|i| value_type(i) != ty) {
                return Err(EngineError::Load("an array mixes value types".into()));
            }
            w.extend(ty.to_le_bytes());
            w.extend((items.len() as u64).to_le_bytes());
            for i in items {
                value(w, i)?;
            }
        }
    }
    Ok(())
}

fn pad(n: usize) -> usize {
    n.next_multiple_of(ALIGN) - n
}

/// Writes a GGUF file: metadata in the order given, then the tensor
/// table, then each tensor's bytes at the next 32-byte boundary. Refuses
/// a tensor whose bytes do not match its type and shape.
pub fn write<W: Write>(
    w: &mut W,
    metadata: &[(&str, &Value)],
    tensors: &[WriteTensor],
) -> Result<()> {
    let mut head = b"GGUF".to_vec();
    head.extend(2u32.to_le_bytes());
    head.extend((tensors.len() as u64).to_le_bytes());
    head.extend((metadata.len() as u64).to_le_bytes());
    for (key, v) in metadata {
        string(&mut head, key);
        head.extend(value_type(v).to_le_bytes());
        value(&mut head, v)?;
    }
    let mut offset = 0usize;
    for t in tensors {
        let n: usize = t.dims.iter().product();
        let want = n / t.ty.block_weights() * t.ty.block_bytes();
        if t.bytes.len() != want || !n.is_multiple_of(t.ty.block_weights()) {
            return Err(EngineError::Load(format!(
                "tensor `{}` ({}, {:?}) has {} bytes, not {want}",
                t.name,
                t.ty.name(),
                t.dims,
                t.bytes.len()
            )));
        }
        string(&mut head, &t.name);
        head.extend((t.dims.len() as u32).to_le_bytes());
        for &d in t.dims.iter().rev() {
            head.extend((d as u64).to_le_bytes());
        }
        head.extend(t.ty.id().to_le_bytes());
        head.extend((offset as u64).to_le_bytes());
        offset += t.bytes.len() + pad(t.bytes.len());
    }
    head.resize(head.len() + pad(head.len()), 0);
    let io = |e: std::io::Error| EngineError::Load(format!("writing GGUF: {e}"));
    w.write_all(&head).map_err(io)?;
    for t in tensors {
        w.write_all(&t.bytes).map_err(io)?;
        w.write_all(&vec![0u8; pad(t.bytes.len())]).map_err(io)?;
    }
    Ok(())
}
