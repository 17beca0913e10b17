//! Parsing a GGUF file's directory (header, metadata, tensor table) with
//! every length checked against the bytes the file still holds, so that a
//! truncated or mangled file is refused with a message, never a panic or
//! an allocation sized by an attacker.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};

use super::{Gguf, TensorInfo, TensorType, Value, type_name};
use crate::error::{EngineError, Result};

/// The most dimensions a GGML tensor has.
const MAX_DIMS: u32 = 4;
/// Alignment of the tensor data when the file does not say.
const DEFAULT_ALIGNMENT: u64 = 32;

fn bad(msg: impl std::fmt::Display) -> EngineError {
    EngineError::Load(format!("not a readable GGUF file: {msg}"))
}

/// A reader that knows how many bytes the file still holds.
struct Src<'a, R> {
    r: &'a mut R,
    at: u64,
    len: u64,
}

impl<R: Read> Src<'_, R> {
    fn left(&self) -> u64 {
        self.len.saturating_sub(self.at)
    }

    fn fixed<const N: usize>(&mut self) -> Result<[u8; N]> {
        if (N as u64) > self.left() {
            return Err(bad(format!("truncated at byte {}", self.at)));
        }
        let mut b = [0u8; N];
        self.r.read_exact(&mut b).map_err(bad)?;
        self.at += N as u64;
        Ok(b)
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.fixed()?))
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.fixed()?))
    }

    /// A count of items of at least `min` bytes each, checked against what
    /// is left of the file.
    fn count(&mut self, min: u64, what: &str) -> Result<usize> {
        let n = self.u64()?;
        if n.saturating_mul(min) > self.left() {
            return Err(bad(format!(
                "{n} {what} cannot fit in the {} bytes left",
                self.left()
            )));
        }
        usize::try_from(n).map_err(bad)
    }

    fn string(&mut self) -> Result<String> {
        let n = self.count(1, "string bytes")?;
        let mut b = vec![0u8; n];
        self.r.read_exact(&mut b).map_err(bad)?;
        self.at += n as u64;
        String::from_utf8(b).map_err(|e| bad(format!("a string is not UTF-8: {e}")))
    }

    /// One metadata value of type `ty`; arrays may hold arrays, once.
    fn value(&mut self, ty: u32, depth: u8) -> Result<Value> {
        Ok(match ty {
            0 => Value::U8(self.fixed::<1>()?[0]),
            1 => Value::I8(i8::from_le_bytes(self.fixed()?)),
            2 => Value::U16(u16::from_le_bytes(self.fixed()?)),
            3 => Value::I16(i16::from_le_bytes(self.fixed()?)),
            4 => Value::U32(self.u32()?),
            5 => Value::I32(i32::from_le_bytes(self.fixed()?)),
            6 => Value::F32(f32::from_le_bytes(self.fixed()?)),
            7 => Value::Bool(self.fixed::<1>()?[0] != 0),
            8 => Value::String(self.string()?),
            9 if depth < 2 => {
                let inner = self.u32()?;
                let n = self.count(min_size(inner), "array items")?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.value(inner, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(self.u64()?),
            11 => Value::I64(i64::from_le_bytes(self.fixed()?)),
            12 => Value::F64(f64::from_le_bytes(self.fixed()?)),
            other => return Err(bad(format!("metadata value type {other}"))),
        })
    }

    /// One entry of the tensor table.
    fn tensor(&mut self) -> Result<(String, TensorInfo)> {
        let name = self.string()?;
        let n_dims = self.u32()?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(bad(format!("tensor `{name}` has {n_dims} dimensions")));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            let d = self.u64()?;
            dims.push(usize::try_from(d).map_err(bad)?);
        }
        let id = self.u32()?;
        let Some(ty) = TensorType::from_id(id) else {
            return Err(EngineError::Load(format!(
                "tensor `{name}` is {}, a type this engine does not read \
                 (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K-Q6_K, IQ4_NL, IQ4_XS)",
                type_name(id)
            )));
        };
        let offset = self.u64()?;
        check_size(&name, ty, &dims, self.len)?;
        dims.reverse();
        Ok((name, TensorInfo { ty, dims, offset }))
    }
}

/// The smallest encoding of a value of type `ty` (an unknown type counts
/// one byte: it is refused when read).
fn min_size(ty: u32) -> u64 {
    match ty {
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        9 => 12,
        _ => 1,
    }
}

/// Refuses a tensor whose element count overflows, exceeds the file, or
/// is not whole blocks of its type along its rows.
fn check_size(name: &str, ty: TensorType, dims: &[usize], file_len: u64) -> Result<()> {
    let n = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    let row = dims.first().copied().unwrap_or(0);
    let fits = n.and_then(|n| {
        (n / ty.block_weights())
            .checked_mul(ty.block_bytes())
            .filter(|&b| b as u64 <= file_len)
    });
    if fits.is_none() || n == Some(0) {
        return Err(bad(format!(
            "tensor `{name}` ({}) has shape {dims:?}, more than the file holds",
            ty.name()
        )));
    }
    if !row.is_multiple_of(ty.block_weights()) {
        return Err(EngineError::Load(format!(
            "tensor `{name}` ({}) has rows of {row}, not whole blocks of {}",
            ty.name(),
            ty.block_weights()
        )));
    }
    Ok(())
}

/// The alignment of the tensor data: `general.alignment`, a power of two.
fn alignment(metadata: &HashMap<String, Value>) -> Result<u64> {
    let a = match metadata.get("general.alignment") {
        None => return Ok(DEFAULT_ALIGNMENT),
        Some(Value::U32(v)) => u64::from(*v),
        Some(other) => return Err(bad(format!("general.alignment is {other:?}"))),
    };
    if a.is_power_of_two() {
        Ok(a)
    } else {
        Err(bad(format!("general.alignment is {a}, not a power of two")))
    }
}

/// Reads the directory of the GGUF file `r` (see `Gguf::read`).
pub(super) fn directory<R: Read + Seek>(r: &mut R) -> Result<Gguf> {
    let len = r.seek(SeekFrom::End(0)).map_err(bad)?;
    r.seek(SeekFrom::Start(0)).map_err(bad)?;
    let mut s = Src { r, at: 0, len };
    if &s.fixed::<4>()? != b"GGUF" {
        return Err(bad("no GGUF magic"));
    }
    let version = s.u32()?;
    if !(2..=3).contains(&version) {
        return Err(bad(format!("version {version} (2 and 3 are read)")));
    }
    let n_tensors = s.u64()?;
    let n_kv = s.count(13, "metadata entries")?;
    let mut metadata = HashMap::with_capacity(n_kv);
    for _ in 0..n_kv {
        let key = s.string()?;
        let ty = s.u32()?;
        let v = s.value(ty, 0)?;
        metadata.insert(key, v);
    }
    if n_tensors.saturating_mul(24) > s.left() {
        return Err(bad(format!("{n_tensors} tensors cannot fit in the file")));
    }
    let mut tensors = HashMap::new();
    for _ in 0..n_tensors {
        let (name, info) = s.tensor()?;
        if tensors.insert(name.clone(), info).is_some() {
            return Err(bad(format!("tensor `{name}` appears twice")));
        }
    }
    let align = alignment(&metadata)?;
    let data_offset = s.at.div_ceil(align) * align;
    for (name, t) in &tensors {
        let end = data_offset
            .checked_add(t.offset)
            .and_then(|o| o.checked_add(t.bytes() as u64));
        if end.is_none_or(|e| e > len) {
            return Err(bad(format!(
                "tensor `{name}` ({}) at offset {} runs past the end of the file",
                t.ty.name(),
                t.offset
            )));
        }
    }
    Ok(Gguf {
        metadata,
        tensors,
        data_offset,
    })
}
