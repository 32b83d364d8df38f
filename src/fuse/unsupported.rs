//! The answers to the requests the door does not serve, each with why; the trait methods in
//! `mod.rs` only send them. doc/semantics.md has the table of every request's answer.

use fuser::Errno;

/// `ioctl` (files and directories): ENOTTY, what a local filesystem answers for an ioctl it
/// does not know (ext4 for `TCGETS`, which `isatty` and so Python's `open()` send). The kernel
/// turns ENOSYS into ENOTTY too, but does not remember it: every ioctl is asked anyway.
pub const IOCTL: Errno = Errno::ENOTTY;

/// `lseek` with `SEEK_DATA` or `SEEK_HOLE` (the kernel answers the other whences itself):
/// ENOSYS, which the kernel remembers, answering from then on as for a file without holes.
pub const LSEEK: Errno = Errno::ENOSYS;

/// `copy_file_range`: ENOSYS, which the kernel remembers, copying through the page cache from
/// then on (the data still goes through `read` and `write`, so through the gate's handles).
pub const COPY_FILE_RANGE: Errno = Errno::ENOSYS;

/// `poll`: ENOSYS, which the kernel remembers, answering from then on as for any regular file
/// (ready for reading and writing).
pub const POLL: Errno = Errno::ENOSYS;

/// `getlk` and `setlk`: never sent. `init` asks for neither `FUSE_POSIX_LOCKS` nor
/// `FUSE_FLOCK_LOCKS`, so the kernel keeps every `fcntl` and `flock` lock itself.
pub const LOCKS: Errno = Errno::ENOSYS;

/// `bmap`: sent only for mounts on a block device (`fuseblk`), so never.
pub const BMAP: Errno = Errno::ENOSYS;
