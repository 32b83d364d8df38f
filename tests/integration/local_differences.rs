//! Cases where the mount once differed from a local filesystem (found by comparing random
//! operation sequences with tmpfs and ext4), each on every route, the daemon-kept memory
//! store included.

use std::fs;
use std::io::Write;
use std::os::fd::AsRawFd;

use crate::harness::{Fixture, ROUTES};

/// The daemon-kept memory store, beside the standard routes.
const MEMD: &str = "[[routes]]\npath = \"/memd\"\nbackend = \"memory\"\nstore = \"daemon\"\n";

fn fixture() -> (Fixture, Vec<&'static str>) {
    (Fixture::new(MEMD), ROUTES.iter().copied().chain(["/memd"]).collect())
}

/// A store through `mmap` of a file open with `O_APPEND` lands where it was made: the kernel
/// writes the page back on the `O_APPEND` handle, and that is no append.
#[test]
fn an_mmap_store_through_an_append_descriptor_lands_at_its_offset() {
    let (fx, routes) = fixture();
    for route in routes {
        let f = fx.p(&format!("{route}/mm"));
        let mut file = fs::OpenOptions::new().read(true).append(true).create(true).open(&f).unwrap();
        file.write_all(&[b'a'; 10000]).unwrap();
        unsafe {
            let len = 10000;
            let prot = libc::PROT_READ | libc::PROT_WRITE;
            let p = libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, file.as_raw_fd(), 0);
            assert_ne!(p, libc::MAP_FAILED, "{route}: mmap");
            std::slice::from_raw_parts_mut(p as *mut u8, len)[5000..5003].copy_from_slice(b"XYZ");
            assert_eq!(libc::msync(p, len, libc::MS_SYNC), 0, "{route}");
            libc::munmap(p, len);
        }
        drop(file);
        let data = fs::read(&f).unwrap();
        assert_eq!(data.len(), 10000, "{route}: size");
        assert_eq!(&data[4999..5004], b"aXYZa", "{route}: the store at its offset");
        // A plain write through such a descriptor still appends.
        let mut file = fs::OpenOptions::new().append(true).open(&f).unwrap();
        file.write_all(b"end").unwrap();
        drop(file);
        let data = fs::read(&f).unwrap();
        assert_eq!(&data[9998..], b"aaend", "{route}");
    }
}
