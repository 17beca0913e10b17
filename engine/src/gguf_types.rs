//! Naming the tensor a GGUF reader choked on. candle's reader refuses a
//! tensor type it does not know (IQ4_NL, IQ4_XS, the other i-quants,
//! MXFP4) with "unknown dtype" and no tensor name; this walks the file's
//! header itself (every length checked against the bytes there, nothing
//! allocated from a length) to find the first tensor of such a type, so
//! the refusal can say which tensor, of which type.

use std::io::Read;

/// The GGML type ids candle reads.
const READ: [u32; 15] = [0, 1, 2, 3, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 30];

/// Bytes of the header looked at (metadata with a 256k vocabulary fits).
const LIMIT: u64 = 64 << 20;

/// The name of a GGML type id.
pub fn type_name(id: u32) -> String {
    let known = match id {
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        34 => "TQ1_0",
        35 => "TQ2_0",
        39 => "MXFP4",
        _ => "",
    };
    if known.is_empty() {
        format!("type {id}")
    } else {
        format!("{known} (type {id})")
    }
}

/// The first tensor of `path` whose type candle cannot read, as
/// `(name, type id)`; `None` when there is none or the header cannot be
/// walked.
pub fn unreadable_tensor(path: &std::path::Path) -> Option<(String, u32)> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .ok()?
        .take(LIMIT)
        .read_to_end(&mut bytes)
        .ok()?;
    let mut c = Cursor { b: &bytes, at: 0 };
    if c.take(4)? != b"GGUF" || !(2..=3).contains(&c.u32()?) {
        return None;
    }
    let (tensors, kvs) = (c.u64()?, c.u64()?);
    for _ in 0..kvs {
        c.string()?;
        let ty = c.u32()?;
        c.value(ty, 0)?;
    }
    for _ in 0..tensors {
        let name = String::from_utf8_lossy(c.string()?).into_owned();
        let dims = c.u32()?;
        c.take(8 * dims as usize)?;
        let ty = c.u32()?;
        c.u64()?;
        if !READ.contains(&ty) {
            return Some((name, ty));
        }
    }
    None
}

/// A bounds-checked reader over the header bytes.
struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(n)?;
        let s = self.b.get(self.at..end)?;
        self.at = end;
        Some(s)
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    fn string(&mut self) -> Option<&'a [u8]> {
        let n = usize::try_from(self.u64()?).ok()?;
        self.take(n)
    }

    /// Skips one metadata value of type `ty` (arrays nest at most once).
    fn value(&mut self, ty: u32, depth: u8) -> Option<()> {
        let fixed = match ty {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            10..=12 => 8,
            8 => {
                self.string()?;
                return Some(());
            }
            9 if depth == 0 => {
                let inner = self.u32()?;
                let n = self.u64()?;
                for _ in 0..n {
                    self.value(inner, 1)?;
                }
                return Some(());
            }
            _ => return None,
        };
        self.take(fixed).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GGUF v3 header: one string key, then tensors of these types.
    fn header(types: &[u32]) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend((types.len() as u64).to_le_bytes());
        b.extend(1u64.to_le_bytes());
        let s = |b: &mut Vec<u8>, t: &str| {
            b.extend((t.len() as u64).to_le_bytes());
            b.extend(t.as_bytes());
        };
        s(&mut b, "general.architecture");
        b.extend(8u32.to_le_bytes());
        s(&mut b, "llama");
        for (i, ty) in types.iter().enumerate() {
            s(&mut b, &format!("blk.{i}.attn_q.weight"));
            b.extend(2u32.to_le_bytes());
            b.extend(32u64.to_le_bytes());
            b.extend(4u64.to_le_bytes());
            b.extend(ty.to_le_bytes());
            b.extend(0u64.to_le_bytes());
        }
        b
    }

    fn scan(bytes: &[u8]) -> Option<(String, u32)> {
        let path = std::env::temp_dir().join(format!("synor-types-{}.gguf", std::process::id()));
        std::fs::write(&path, bytes).expect("write");
        let got = unreadable_tensor(&path);
        let _ = std::fs::remove_file(path);
        got
    }

    #[test]
    fn the_first_tensor_of_an_unread_type_is_named() {
        assert_eq!(
            scan(&header(&[2, 12, 20, 23])),
            Some(("blk.2.attn_q.weight".into(), 20))
        );
        assert_eq!(scan(&header(&[0, 14, 30])), None);
        assert_eq!(type_name(20), "IQ4_NL (type 20)");
        assert_eq!(type_name(99), "type 99");
        // Cut anywhere, it gives up instead of guessing (or panicking).
        let b = header(&[2, 23]);
        for end in 0..b.len() {
            let got = scan(&b[..end]);
            assert!(
                got.is_none() || got == Some(("blk.1.attn_q.weight".into(), 23)),
                "{end}: {got:?}"
            );
        }
    }
}
