//! Conversions between the engine's types and fuser's: attributes, file kinds, errnos, times,
//! the caller context of a request, and the replies made of an engine call's result.

use fuser::{
    Errno as FuseErrno, FileAttr, FileType, INodeNo, ReplyEmpty, ReplyEntry, ReplyXattr, Request, TimeOrNow,
};

use super::FuseDoor;
use crate::backend::{Attr, Caller, FileKind, TimeSet};
use crate::engine::{Ctx, Door};
use crate::error::{FsError, FsResult};
use crate::vpath::VPath;

pub fn file_type(kind: FileKind) -> FileType {
    match kind {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::BlockDevice => FileType::BlockDevice,
    }
}

pub fn fuse_attr(ino: u64, a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: a.size,
        blocks: a.blocks,
        atime: a.atime,
        mtime: a.mtime,
        ctime: a.ctime,
        crtime: a.crtime,
        kind: file_type(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: a.blksize,
        flags: 0,
    }
}

/// The attributes of a negative entry (inode 0: "this name is absent"); the kernel reads
/// only the inode number and the entry's lifetime.
pub fn absent_attr() -> FileAttr {
    let epoch = std::time::UNIX_EPOCH;
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: epoch,
        mtime: epoch,
        ctime: epoch,
        crtime: epoch,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 0,
        flags: 0,
    }
}

pub fn errno(e: &FsError) -> FuseErrno {
    FuseErrno::from_i32(e.errno as i32)
}

pub fn ctx(req: &Request) -> Ctx {
    Ctx {
        request: req.unique().0,
        ..Ctx::new(Door::Fuse, Caller { uid: req.uid(), gid: req.gid(), pid: req.pid() })
    }
}

pub fn time_set(t: TimeOrNow) -> TimeSet {
    match t {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(t) => TimeSet::At(t),
    }
}

pub fn reply_entry(door: &FuseDoor, result: FsResult<(Attr, VPath)>, reply: ReplyEntry) {
    match result {
        Ok((attr, path)) => door.entry(&path, &attr, reply),
        Err(e) => reply.error(errno(&e)),
    }
}

pub fn reply_empty(_: &FuseDoor, result: FsResult<()>, reply: ReplyEmpty) {
    match result {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(&e)),
    }
}

pub fn reply_xattr(result: FsResult<Vec<u8>>, size: u32, reply: ReplyXattr) {
    match result {
        Ok(data) if size == 0 => reply.size(data.len() as u32),
        Ok(data) if data.len() > size as usize => reply.error(FuseErrno::ERANGE),
        Ok(data) => reply.data(&data),
        Err(e) => reply.error(errno(&e)),
    }
}
