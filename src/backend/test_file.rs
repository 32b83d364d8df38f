//! A stand-in open file for tests of the bookkeeping around open files: it has no data, and
//! its backing descriptor is a real file the test chose.

use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd};

use super::{Attr, OpenFile, SetAttr};
use crate::error::FsResult;

pub struct TestFile(pub File);

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
    fn backing_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.0.as_fd())
    }
}
