//! A stand-in open file for tests of the bookkeeping around open files: it has no data, and
//! its backing descriptor is a real file the test chose.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd};

use super::{Attr, BackingFile, OpenFile, SetAttr};
use crate::error::FsResult;

pub struct TestFile {
    file: File,
    flags: i32,
    opened: libc::stat,
    /// Run when the file is closed (its last holder dropped it).
    on_close: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl TestFile {
    pub fn new(file: File) -> TestFile {
        let opened = nix::sys::stat::fstat(file.as_raw_fd()).unwrap();
        let flags = nix::fcntl::fcntl(file.as_raw_fd(), nix::fcntl::F_GETFL).unwrap();
        TestFile { file, flags, opened, on_close: None }
    }

    /// A file whose close runs `close` (as a backend's close may call back into the daemon).
    pub fn closing_with(file: File, close: impl FnOnce() + Send + Sync + 'static) -> TestFile {
        let mut test_file = TestFile::new(file);
        test_file.on_close = Some(Box::new(close));
        test_file
    }
}

impl Drop for TestFile {
    fn drop(&mut self) {
        if let Some(close) = self.on_close.take() {
            close();
        }
    }
}

impl OpenFile for TestFile {
    fn read(&self, _: u64, _: u32) -> FsResult<Vec<u8>> {
        unimplemented!()
    }
    fn write(&self, _: u64, _: &[u8]) -> FsResult<u32> {
        unimplemented!()
    }
    fn flush(&self) -> FsResult<()> {
        Ok(())
    }
    fn fsync(&self, _: bool) -> FsResult<()> {
        Ok(())
    }
    fn fallocate(&self, _: u64, _: u64, _: i32) -> FsResult<()> {
        unimplemented!()
    }
    fn getattr(&self) -> FsResult<Attr> {
        unimplemented!()
    }
    fn setattr(&self, _: &SetAttr) -> FsResult<Attr> {
        unimplemented!()
    }
    fn reopen(&self, _: i32) -> FsResult<Box<dyn OpenFile>> {
        unimplemented!()
    }
    fn backing(&self) -> Option<BackingFile<'_>> {
        Some(BackingFile { fd: self.file.as_fd(), flags: self.flags, opened: &self.opened })
    }
}
