//! GGUF files, read and written by the engine itself: the tensor types it
//! knows (`TensorType`), the directory of a file (`Gguf`: metadata and
//! tensor table, `read`), the bytes of one tensor, and a writer
//! (`write`) for the synthetic models and tests. candle's reader refuses
//! a whole file for one tensor type it does not know (IQ4_NL, IQ4_XS), so
//! the engine reads the format itself; metadata values keep candle's
//! `Value` type, which the tokenizer and RoPE readers take.

mod read;
mod write;

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};

use candle_core::quantized::GgmlDType;
pub use candle_core::quantized::gguf_file::Value;
pub use write::{WriteTensor, write};

use crate::error::{EngineError, Result};

/// A GGML tensor type the engine reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TensorType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Iq4Nl,
    Iq4Xs,
}

/// Every type, with its GGML id, name, and block (weights, bytes).
const TYPES: [(TensorType, u32, &str, usize, usize); 15] = [
    (TensorType::F32, 0, "F32", 1, 4),
    (TensorType::F16, 1, "F16", 1, 2),
    (TensorType::Q4_0, 2, "Q4_0", 32, 18),
    (TensorType::Q4_1, 3, "Q4_1", 32, 20),
    (TensorType::Q5_0, 6, "Q5_0", 32, 22),
    (TensorType::Q5_1, 7, "Q5_1", 32, 24),
    (TensorType::Q8_0, 8, "Q8_0", 32, 34),
    (TensorType::Q2K, 10, "Q2_K", 256, 84),
    (TensorType::Q3K, 11, "Q3_K", 256, 110),
    (TensorType::Q4K, 12, "Q4_K", 256, 144),
    (TensorType::Q5K, 13, "Q5_K", 256, 176),
    (TensorType::Q6K, 14, "Q6_K", 256, 210),
    (TensorType::Iq4Nl, 20, "IQ4_NL", 32, 18),
    (TensorType::Iq4Xs, 23, "IQ4_XS", 256, 136),
    (TensorType::BF16, 30, "BF16", 1, 2),
];

impl TensorType {
    fn entry(self) -> (TensorType, u32, &'static str, usize, usize) {
        TYPES.into_iter().find(|e| e.0 == self).unwrap_or(TYPES[0])
    }

    /// The type of GGML id `id`, if the engine reads it.
    pub fn from_id(id: u32) -> Option<Self> {
        TYPES.into_iter().find(|e| e.1 == id).map(|e| e.0)
    }

    /// The GGML type id.
    pub fn id(self) -> u32 {
        self.entry().1
    }

    /// The name llama.cpp uses (`Q4_K`, `IQ4_XS`).
    pub fn name(self) -> &'static str {
        self.entry().2
    }

    /// Weights per block (1 for the float types).
    pub fn block_weights(self) -> usize {
        self.entry().3
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        self.entry().4
    }

    /// The same type in candle, which reads all but the i-quants.
    pub fn candle(self) -> Option<GgmlDType> {
        Some(match self {
            Self::F32 => GgmlDType::F32,
            Self::F16 => GgmlDType::F16,
            Self::BF16 => GgmlDType::BF16,
            Self::Q4_0 => GgmlDType::Q4_0,
            Self::Q4_1 => GgmlDType::Q4_1,
            Self::Q5_0 => GgmlDType::Q5_0,
            Self::Q5_1 => GgmlDType::Q5_1,
            Self::Q8_0 => GgmlDType::Q8_0,
            Self::Q2K => GgmlDType::Q2K,
            Self::Q3K => GgmlDType::Q3K,
            Self::Q4K => GgmlDType::Q4K,
            Self::Q5K => GgmlDType::Q5K,
            Self::Q6K => GgmlDType::Q6K,
            Self::Iq4Nl | Self::Iq4Xs => return None,
        })
    }
}

/// The name of any GGML type id (for refusals of those not read).
pub fn type_name(id: u32) -> String {
    let other = match id {
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        21 => "IQ3_S",
        22 => "IQ2_S",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        34 => "TQ1_0",
        35 => "TQ2_0",
        39 => "MXFP4",
        _ => TensorType::from_id(id).map_or("", TensorType::name),
    };
    if other.is_empty() {
        format!("type {id}")
    } else {
        format!("{other} (type {id})")
    }
}

/// One entry of the tensor table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub ty: TensorType,
    /// Outermost first (`[rows, cols]` for a matrix): the reverse of the
    /// file's order, as candle and the model code use them.
    pub dims: Vec<usize>,
    /// From the start of the tensor data.
    pub offset: u64,
}

impl TensorInfo {
    /// Bytes of the tensor's data (checked against overflow by `read`).
    pub fn bytes(&self) -> usize {
        let n: usize = self.dims.iter().product();
        n / self.ty.block_weights() * self.ty.block_bytes()
    }
}

/// A GGUF file's directory: what `read` found before the tensor data.
#[derive(Debug, Clone)]
pub struct Gguf {
    pub metadata: HashMap<String, Value>,
    pub tensors: HashMap<String, TensorInfo>,
    /// Where the tensor data starts in the file.
    pub data_offset: u64,
}

impl Gguf {
    /// Reads the header, metadata and tensor table of a GGUF (v2 or v3)
    /// file: every length checked against the file's size before anything
    /// is allocated from it, every tensor checked to lie inside the file;
    /// a tensor of a type the engine does not read is refused by name.
    pub fn read<R: Read + Seek>(r: &mut R) -> Result<Self> {
        read::directory(r)
    }

    /// The entry of tensor `name`.
    pub fn info(&self, name: &str) -> Result<&TensorInfo> {
        self.tensors
            .get(name)
            .ok_or_else(|| EngineError::Load(format!("GGUF has no tensor `{name}`")))
    }

    /// The bytes of tensor `name`, as stored.
    pub fn tensor_bytes<R: Read + Seek>(&self, r: &mut R, name: &str) -> Result<Vec<u8>> {
        let t = self.info(name)?;
        let io = |e: std::io::Error| EngineError::Load(format!("tensor `{name}`: {e}"));
        r.seek(SeekFrom::Start(self.data_offset + t.offset))
            .map_err(io)?;
        let mut bytes = vec![0u8; t.bytes()];
        r.read_exact(&mut bytes).map_err(io)?;
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests;
