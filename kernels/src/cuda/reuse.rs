//! The small tables a forward pass uploads for every layer (rope rows, KV
//! slots, attention's query info and block tables) are the same in every
//! layer of one pass: `Reused` keeps the last upload of one kind with its
//! host bits and hands the same device buffer back while a new table has
//! the same bits, so a pass uploads each once instead of once a layer.
//!
//! A buffer is never written after its upload (the kernels only read
//! these tables), and one replaced here is freed in stream order, after
//! the launches queued before that read it.

use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::{CudaSlice, DeviceRepr};

/// Values compared by their bits (so `0.0` and `-0.0`, or two NaNs, are
/// told apart as the kernels would see them).
pub(super) trait Bits: Copy {
    fn bits(self) -> u32;
}

impl Bits for u32 {
    fn bits(self) -> u32 {
        self
    }
}

impl Bits for f32 {
    fn bits(self) -> u32 {
        self.to_bits()
    }
}

/// A table's host values and its device copy.
type Uploaded<T> = (Vec<T>, Arc<CudaSlice<T>>);

/// The last table of one kind and its device copy.
#[derive(Debug)]
pub(super) struct Reused<T> {
    last: Mutex<Option<Uploaded<T>>>,
}

impl<T> Default for Reused<T> {
    fn default() -> Self {
        Self {
            last: Mutex::new(None),
        }
    }
}

impl<T: Bits + DeviceRepr> Reused<T> {
    /// The device copy of `host`: the last one when its bits are the same,
    /// else a new one from `upload`.
    pub(super) fn get(
        &self,
        host: Vec<T>,
        upload: impl FnOnce(&[T]) -> CudaSlice<T>,
    ) -> Arc<CudaSlice<T>> {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((bits, buf)) = last.as_ref()
            && same_bits(bits, &host)
        {
            return Arc::clone(buf);
        }
        let buf = Arc::new(upload(&host));
        *last = Some((host, Arc::clone(&buf)));
        buf
    }
}

fn same_bits<T: Bits>(a: &[T], b: &[T]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.bits() == y.bits())
}

#[cfg(test)]
mod tests {
    use super::same_bits;

    #[test]
    fn tables_are_the_same_only_bit_for_bit() {
        assert!(same_bits(&[1u32, 2, 3], &[1, 2, 3]));
        assert!(!same_bits(&[1u32, 2, 3], &[1, 2]));
        assert!(!same_bits(&[1u32, 2, 3], &[1, 2, 4]));
        assert!(same_bits(&[0.5f32, -1.0], &[0.5, -1.0]));
        assert!(!same_bits(&[0.0f32], &[-0.0]), "signed zeros differ");
        assert!(same_bits(&[f32::NAN], &[f32::NAN]), "the same NaN bits");
    }
}
