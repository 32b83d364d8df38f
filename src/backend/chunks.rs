//! File content in fixed-size chunks, as the database backends (sqlite, postgres) store it:
//! which chunks a byte range touches, and how a write or a read meets one chunk.
//!
//! A chunk may be shorter than [`CHUNK_SIZE`] or missing altogether: bytes below the file size
//! that no chunk holds read as zeros (sparse files). Invariant: no chunk holds bytes at or past
//! the file size, so growing a file never exposes old data.

use crate::error::{Errno, FsError, FsResult};

/// Size of one content row. A 4 KiB write into a large file rewrites one chunk (two if it
/// straddles a boundary).
pub const CHUNK_SIZE: u64 = 64 * 1024;

/// The largest file: chunk indexes up to 2^28 (the sqlite store's key layout), 16 TiB.
pub const MAX_FILE_SIZE: u64 = CHUNK_SIZE << 28;

const FALLOC_FL_KEEP_SIZE: i32 = 1;

/// The end of a write or allocation of `len` bytes at `offset`; EFBIG past [`MAX_FILE_SIZE`].
pub fn end_of(offset: u64, len: u64) -> FsResult<u64> {
    offset.checked_add(len).filter(|&e| e <= MAX_FILE_SIZE).ok_or_else(|| FsError::errno(Errno::EFBIG))
}

/// The size an `fallocate(mode, offset, length)` asks for, `None` when it leaves the size as
/// it is (`FALLOC_FL_KEEP_SIZE`: the database stores reserve no space). Other modes are
/// EOPNOTSUPP, an empty range EINVAL.
pub fn fallocate_end(offset: u64, length: u64, mode: i32) -> FsResult<Option<u64>> {
    if mode & !FALLOC_FL_KEEP_SIZE != 0 {
        return Err(FsError::errno(Errno::EOPNOTSUPP));
    }
    if length == 0 {
        return Err(FsError::errno(Errno::EINVAL));
    }
    let end = end_of(offset, length)?;
    Ok((mode & FALLOC_FL_KEEP_SIZE == 0).then_some(end))
}

/// The part of a byte range that falls in one chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub idx: u64,
    /// Offset of the range's first byte within the chunk.
    pub within: usize,
    /// Bytes of the range in this chunk.
    pub len: usize,
    /// Offset of those bytes within the range.
    pub from: usize,
}

/// The chunks that `[offset, offset + len)` touches, in order.
pub fn spans(offset: u64, len: u64) -> impl Iterator<Item = Span> {
    let end = offset + len;
    let mut pos = offset;
    std::iter::from_fn(move || {
        if pos >= end {
            return None;
        }
        let idx = pos / CHUNK_SIZE;
        let within = pos - idx * CHUNK_SIZE;
        let n = (CHUNK_SIZE - within).min(end - pos);
        let span = Span { idx, within: within as usize, len: n as usize, from: (pos - offset) as usize };
        pos += n;
        Some(span)
    })
}

/// The first and last chunk that `[offset, end)` touches (`end > offset`).
pub fn chunk_range(offset: u64, end: u64) -> (u64, u64) {
    (offset / CHUNK_SIZE, (end - 1) / CHUNK_SIZE)
}

/// How many bytes of chunk `idx` lie below a file size of `size`.
pub fn valid_bytes(idx: u64, size: u64) -> usize {
    size.saturating_sub(idx * CHUNK_SIZE).min(CHUNK_SIZE) as usize
}

/// Whether a write of `span` must read the stored chunk first: it keeps bytes of the chunk
/// below the file size `size` that it does not overwrite.
pub fn needs_base(span: &Span, size: u64) -> bool {
    let valid = valid_bytes(span.idx, size);
    valid != 0 && !(span.within == 0 && span.len >= valid)
}

/// Writes `src` into the chunk content `buf` at `within`, extending it as needed (a hole before
/// the write reads as zeros); returns by how many bytes `buf` grew.
pub fn splice(buf: &mut Vec<u8>, within: usize, src: &[u8]) -> usize {
    let before = buf.len();
    if buf.len() < within {
        buf.resize(within, 0);
    }
    // Overwrite what exists, append the rest (no zero-fill that is overwritten at once).
    let overlap = buf.len().min(within + src.len()) - within;
    buf[within..within + overlap].copy_from_slice(&src[..overlap]);
    buf.extend_from_slice(&src[overlap..]);
    buf.len() - before
}

/// Copies the part of chunk `idx` (holding `data`) that falls in `[offset, offset+out.len())`.
pub fn copy_chunk(idx: u64, data: &[u8], offset: u64, out: &mut [u8]) {
    copy_at(idx * CHUNK_SIZE, data, offset, out);
}

/// Copies the part of `data`, which lies at file offset `start`, that falls in
/// `[offset, offset+out.len())`.
pub fn copy_at(start: u64, data: &[u8], offset: u64, out: &mut [u8]) {
    let from = start.max(offset);
    let to = (start + data.len() as u64).min(offset + out.len() as u64);
    if from < to {
        out[(from - offset) as usize..(to - offset) as usize]
            .copy_from_slice(&data[(from - start) as usize..(to - start) as usize]);
    }
}

/// A truncation to `size`: chunks from the returned index on go, and the chunk before keeps
/// `tail` bytes when `tail` is not zero.
pub fn truncation(size: u64) -> (u64, u64) {
    (size.div_ceil(CHUNK_SIZE), size % CHUNK_SIZE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_split_at_chunk_boundaries() {
        let c = CHUNK_SIZE;
        let got: Vec<Span> = spans(c - 10, 20).collect();
        assert_eq!(
            got,
            vec![
                Span { idx: 0, within: (c - 10) as usize, len: 10, from: 0 },
                Span { idx: 1, within: 0, len: 10, from: 10 }
            ]
        );
        assert_eq!(spans(5, 0).count(), 0);
        assert_eq!(spans(0, 3 * c).map(|s| s.len).sum::<usize>(), 3 * c as usize);
    }

    #[test]
    fn splice_pads_overwrites_and_appends() {
        let mut buf = b"abc".to_vec();
        assert_eq!(splice(&mut buf, 5, b"xy"), 4);
        assert_eq!(buf, b"abc\0\0xy");
        assert_eq!(splice(&mut buf, 1, b"ZZ"), 0);
        assert_eq!(buf, b"aZZ\0\0xy");
        assert_eq!(splice(&mut buf, 6, b"123"), 2);
        assert_eq!(buf, b"aZZ\0\0x123");
    }

    #[test]
    fn bases_are_read_only_for_kept_bytes() {
        let full = Span { idx: 1, within: 0, len: CHUNK_SIZE as usize, from: 0 };
        assert!(!needs_base(&full, 10 * CHUNK_SIZE));
        let part = Span { idx: 1, within: 10, len: 5, from: 0 };
        assert!(needs_base(&part, 10 * CHUNK_SIZE));
        assert!(!needs_base(&part, CHUNK_SIZE)); // nothing stored in chunk 1 yet
        assert_eq!(truncation(CHUNK_SIZE + 3), (2, 3));
        assert_eq!(truncation(2 * CHUNK_SIZE), (2, 0));
    }
}
