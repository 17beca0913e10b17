//! Weights on 2 MiB pages. A decode step streams every weight it uses
//! once, and on 4 KiB pages each new page is a TLB miss whose page walk
//! the prefetcher does not hide: a mixture-of-experts layer, whose experts
//! are matrices of 1-2 MiB read one after another, streamed at 17.6 GB/s
//! on 4 KiB pages and 30.5 GB/s on 2 MiB ones on a Zen 3 (BENCHMARKS.md,
//! session 32). Linux's transparent huge pages give them only where asked
//! (`enabled = madvise`, the common default), so `prefer_huge` asks for a
//! buffer's memory to be moved onto huge pages now (`MADV_COLLAPSE`,
//! Linux 6.1 and later): each 2 MiB-aligned span the buffer touches,
//! neighbours' bytes included (a collapse moves memory, it never changes
//! it). Where the kernel cannot (older, THP off, no free huge page), the
//! buffer stays as it was: this is a speed hint, never an error.

/// Bytes of one huge page on x86-64 and most arm64 kernels.
pub const HUGE_PAGE: usize = 2 << 20;

/// Asks the kernel to back `bytes` with huge pages; returns how many of
/// the 2 MiB spans it touches were collapsed (0 off Linux).
pub fn prefer_huge(bytes: &[u8]) -> usize {
    if bytes.len() < HUGE_PAGE / 2 {
        return 0;
    }
    let start = bytes.as_ptr() as usize / HUGE_PAGE * HUGE_PAGE;
    let end = (bytes.as_ptr() as usize + bytes.len()).div_ceil(HUGE_PAGE) * HUGE_PAGE;
    (start..end)
        .step_by(HUGE_PAGE)
        .filter(|&span| collapse(span))
        .count()
}

/// `MADV_COLLAPSE` on the 2 MiB span at `addr`.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn collapse(addr: usize) -> bool {
    // SAFETY: `madvise` never reads or writes the span's bytes; a collapse
    // copies the span's pages onto one huge page with the same contents.
    // A span not wholly mapped anonymous memory is refused with an error
    // (ENOMEM, EINVAL), which leaves it as it was.
    unsafe { libc::madvise(addr as *mut libc::c_void, HUGE_PAGE, libc::MADV_COLLAPSE) == 0 }
}

#[cfg(not(target_os = "linux"))]
fn collapse(_addr: usize) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kibibytes of `AnonHugePages` in the mapping of `/proc/self/smaps`
    /// that holds `addr`.
    #[cfg(target_os = "linux")]
    fn huge_kib_at(addr: usize) -> Option<usize> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut inside = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ')
                && let Some((a, b)) = range.split_once('-')
                && let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
            {
                inside = (a..b).contains(&addr);
            } else if inside && let Some(kib) = line.strip_prefix("AnonHugePages:") {
                return kib.trim().trim_end_matches(" kB").trim().parse().ok();
            }
        }
        None
    }

    #[test]
    fn small_buffers_are_left_alone() {
        assert_eq!(prefer_huge(&[7u8; 4096]), 0);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_large_buffer_lands_on_huge_pages_with_its_bytes_intact() {
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .unwrap_or_default();
        if thp.is_empty() || thp.contains("[never]") {
            eprintln!("skipped: transparent huge pages are off here ({thp:?})");
            return;
        }
        let bytes: Vec<u8> = (0..12 << 20).map(|i: usize| (i * 31 % 251) as u8).collect();
        let collapsed = prefer_huge(&bytes);
        // 12 MiB touch six or seven 2 MiB spans; the inner five at least
        // lie wholly in the buffer's own mapping.
        assert!(collapsed >= 5, "{collapsed} spans collapsed");
        let kib = huge_kib_at(bytes.as_ptr() as usize + (6 << 20)).expect("the buffer's mapping");
        assert!(kib >= 10 << 10, "{kib} KiB on huge pages");
        assert!(
            bytes
                .iter()
                .enumerate()
                .all(|(i, &b)| b == (i * 31 % 251) as u8)
        );
    }
}
