//! A memory file's contents: 4 KiB pages, present only where data was written or space was
//! reserved (`fallocate`), so a hole costs nothing and the size cap counts pages, as tmpfs does.

use std::collections::BTreeMap;

/// The unit of allocation, and of the size cap: tmpfs's page.
pub const PAGE: u64 = 4096;

/// Symlink targets this long or longer take a page, as on tmpfs (shorter ones live in the
/// inode): tmpfs keeps a target inline when it fits 128 bytes with its terminating NUL.
pub const INLINE_SYMLINK_MAX: usize = 127;

/// A regular file's data.
#[derive(Default)]
pub struct Pages {
    /// The file's size in bytes.
    len: u64,
    /// The allocated pages by index. A page holds its bytes from its start up to the last one
    /// written (never past the end of the file); the rest of it reads as zeros. Pages at or
    /// past the end of the file come from `fallocate(FALLOC_FL_KEEP_SIZE)` and are empty.
    pages: BTreeMap<u64, Vec<u8>>,
}

/// The pages that `[start, end)` touches, as an inclusive range of page indices.
fn span(start: u64, end: u64) -> (u64, u64) {
    (start / PAGE, (end - 1) / PAGE)
}

impl Pages {
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Allocated pages, each charged whole against the cap.
    pub fn allocated(&self) -> u64 {
        self.pages.len() as u64
    }

    /// Up to `size` bytes from `offset`, holes as zeros; short at the end of the file.
    pub fn read(&self, offset: u64, size: u32) -> Vec<u8> {
        let end = offset.saturating_add(u64::from(size)).min(self.len);
        if offset >= end {
            return Vec::new();
        }
        let mut out = vec![0u8; (end - offset) as usize];
        let (first, last) = span(offset, end);
        for (&i, page) in self.pages.range(first..=last) {
            let from = (i * PAGE).max(offset);
            let to = (i * PAGE + page.len() as u64).min(end);
            if from < to {
                let src = &page[(from - i * PAGE) as usize..(to - i * PAGE) as usize];
                out[(from - offset) as usize..(to - offset) as usize].copy_from_slice(src);
            }
        }
        out
    }

    /// Pages `[start, end)` would allocate (those it touches that are not allocated yet).
    pub fn missing(&self, start: u64, end: u64) -> u64 {
        if start >= end {
            return 0;
        }
        let (first, last) = span(start, end);
        last - first + 1 - self.pages.range(first..=last).count() as u64
    }

    /// Where a write of `[start, end)` must stop when only `free` more pages may be
    /// allocated: at the first page it touches that would be one too many (tmpfs stops there
    /// too, and the write returns what it wrote so far). `start` when nothing fits.
    pub fn fitting_end(&self, start: u64, end: u64, free: u64) -> u64 {
        if start >= end {
            return end;
        }
        let (first, last) = span(start, end);
        let (mut missing, mut next) = (0, first);
        let present = self.pages.range(first..=last).map(|(&i, _)| i);
        for upto in present.chain(std::iter::once(last + 1)) {
            let gap = upto - next;
            if missing + gap > free {
                return ((next + free - missing) * PAGE).max(start);
            }
            missing += gap;
            next = upto + 1;
        }
        end
    }

    /// Writes `data` at `offset`, allocating the pages it needs (the caller checked the cap)
    /// and growing the file to cover it. Returns the pages allocated.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> u64 {
        if data.is_empty() {
            return 0;
        }
        let end = offset + data.len() as u64;
        let before = self.allocated();
        let (first, last) = span(offset, end);
        for i in first..=last {
            let base = i * PAGE;
            let (from, to) = (offset.max(base), end.min(base + PAGE));
            let page = self.pages.entry(i).or_default();
            let (a, b) = ((from - base) as usize, (to - base) as usize);
            let src = &data[(from - offset) as usize..(to - offset) as usize];
            // Grown by doubling, but never past a page: small files stay small in memory.
            if page.capacity() < b {
                let want = (page.capacity() * 2).clamp(b, PAGE as usize);
                page.reserve_exact(want - page.len());
            }
            if page.len() <= a {
                page.resize(a, 0);
                page.extend_from_slice(src);
            } else {
                if page.len() < b {
                    page.resize(b, 0);
                }
                page[a..b].copy_from_slice(src);
            }
        }
        self.len = self.len.max(end);
        self.allocated() - before
    }

    /// Allocates the missing pages of `[start, end)` without writing them (`fallocate`); the
    /// size grows to `end` unless `keep_size`. Returns the pages allocated.
    pub fn reserve(&mut self, start: u64, end: u64, keep_size: bool) -> u64 {
        let before = self.allocated();
        if start < end {
            let (first, last) = span(start, end);
            for i in first..=last {
                self.pages.entry(i).or_default();
            }
        }
        if !keep_size {
            self.len = self.len.max(end);
        }
        self.allocated() - before
    }

    /// Sets the size. Growing allocates nothing (the new bytes are a hole); a size at or below
    /// the current one frees every page past it, reserved ones included (as tmpfs does).
    /// Returns the pages freed.
    pub fn set_len(&mut self, len: u64) -> u64 {
        let before = self.allocated();
        if len <= self.len {
            drop(self.pages.split_off(&len.div_ceil(PAGE)));
            if let Some(page) = self.pages.get_mut(&(len / PAGE)) {
                page.truncate((len % PAGE) as usize);
            }
        }
        self.len = len;
        before - self.allocated()
    }

    /// Deallocates `[start, end)` (`FALLOC_FL_PUNCH_HOLE`): the pages wholly inside it are
    /// freed, the bytes of the others zeroed; the size stays. Returns the pages freed.
    pub fn punch(&mut self, start: u64, end: u64) -> u64 {
        if start >= end {
            return 0;
        }
        let before = self.allocated();
        let (first, last) = span(start, end);
        let whole = |i: u64| i * PAGE >= start && (i + 1) * PAGE <= end;
        let touched: Vec<u64> = self.pages.range(first..=last).map(|(&i, _)| i).collect();
        for i in touched {
            if whole(i) {
                self.pages.remove(&i);
                continue;
            }
            let page = self.pages.get_mut(&i).expect("listed above");
            let base = i * PAGE;
            let (a, b) = ((start.max(base) - base) as usize, (end.min(base + PAGE) - base) as usize);
            if b >= page.len() {
                page.truncate(a);
            } else {
                page[a..b].fill(0);
            }
        }
        before - self.allocated()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// The same file kept plainly: every byte, and the set of allocated pages.
    #[derive(Default)]
    struct Model {
        bytes: Vec<u8>,
        pages: BTreeSet<u64>,
    }

    impl Model {
        fn touch(&mut self, start: u64, end: u64) {
            if start < end {
                self.pages.extend(start / PAGE..=(end - 1) / PAGE);
            }
        }
    }

    /// Random writes, reservations, truncations and punches, each checked against the model:
    /// contents, size and allocated pages; and `missing`/`fitting_end` against counting.
    #[test]
    fn pages_agree_with_a_plain_model() {
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = |below: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % below
        };
        for _ in 0..200 {
            let (mut p, mut m) = (Pages::default(), Model::default());
            for _ in 0..40 {
                let (start, len) = (next(12 * PAGE), 1 + next(3 * PAGE));
                let end = start + len;
                let missing = (start / PAGE..=(end - 1) / PAGE).filter(|i| !m.pages.contains(i)).count();
                assert_eq!(p.missing(start, end), missing as u64);
                let free = next(4);
                let fits = p.fitting_end(start, end, free);
                // What fits needs at most `free` new pages, and stops only at a page one too many.
                let (written, stop) = match fits == start {
                    true => (0..0, start / PAGE),
                    false => (start / PAGE..fits.div_ceil(PAGE), fits.div_ceil(PAGE)),
                };
                let within = written.filter(|i| !m.pages.contains(i)).count() as u64;
                assert!(within <= free, "{start} {end} {free}");
                assert!(fits == end || (!m.pages.contains(&stop) && within == free), "{start} {end} {free}");
                match next(4) {
                    0 => {
                        let data: Vec<u8> = (0..len).map(|_| 1 + next(255) as u8).collect();
                        p.write(start, &data);
                        if m.bytes.len() < end as usize {
                            m.bytes.resize(end as usize, 0);
                        }
                        m.bytes[start as usize..end as usize].copy_from_slice(&data);
                        m.touch(start, end);
                    }
                    1 => {
                        let keep = next(2) == 0;
                        p.reserve(start, end, keep);
                        if !keep && m.bytes.len() < end as usize {
                            m.bytes.resize(end as usize, 0);
                        }
                        m.touch(start, end);
                    }
                    2 => {
                        let len = next(12 * PAGE);
                        p.set_len(len);
                        if len <= m.bytes.len() as u64 {
                            m.pages.retain(|&i| i < len.div_ceil(PAGE));
                        }
                        m.bytes.resize(len as usize, 0);
                    }
                    _ => {
                        p.punch(start, end);
                        m.pages.retain(|&i| !(i * PAGE >= start && (i + 1) * PAGE <= end));
                        let to = (end as usize).min(m.bytes.len());
                        if (start as usize) < to {
                            m.bytes[start as usize..to].fill(0);
                        }
                    }
                }
                assert_eq!(p.len(), m.bytes.len() as u64);
                assert_eq!(p.read(0, u32::MAX), m.bytes);
                assert!(p.pages.keys().eq(m.pages.iter()), "allocated pages");
                let off = next(13 * PAGE);
                let want = m.bytes.get(off as usize..).map_or(&[][..], |r| &r[..r.len().min(5000)]);
                assert_eq!(p.read(off, 5000), want);
            }
        }
    }
}
