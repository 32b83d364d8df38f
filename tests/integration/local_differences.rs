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

/// A process that holds a file open only for reading (made with `O_CREAT|O_RDONLY`, with or
/// without `O_TRUNC`, or opened `O_RDONLY|O_TRUNC`) truncates it by name, or opens it again
/// with `O_TRUNC`, as on a local filesystem: the size change does not fail on the handle that
/// cannot write.
#[test]
fn a_process_holding_a_file_only_for_reading_truncates_it() {
    use std::os::unix::fs::OpenOptionsExt;
    let (fx, routes) = fixture();
    for route in routes {
        for (i, flags) in [libc::O_CREAT, libc::O_CREAT | libc::O_TRUNC].into_iter().enumerate() {
            let f = fx.p(&format!("{route}/ro{i}"));
            let reader = fs::OpenOptions::new().read(true).custom_flags(flags).mode(0o644).open(&f).unwrap();
            fs::OpenOptions::new().write(true).open(&f).unwrap().write_all(b"hello world").unwrap();
            nix::unistd::truncate(&f, 5).unwrap_or_else(|e| panic!("{route} {flags:#o}: truncate: {e}"));
            assert_eq!(fs::read(&f).unwrap(), b"hello", "{route}");
            let trunc = fs::OpenOptions::new().write(true).custom_flags(libc::O_TRUNC).open(&f);
            drop(trunc.unwrap_or_else(|e| panic!("{route} {flags:#o}: O_WRONLY|O_TRUNC: {e}")));
            assert_eq!(fs::metadata(&f).unwrap().len(), 0, "{route}");
            drop(reader);
        }
        let f = fx.p(&format!("{route}/ro0"));
        fs::write(&f, b"again").unwrap();
        let trunc = fs::OpenOptions::new().read(true).custom_flags(libc::O_TRUNC).open(&f);
        let _held = trunc.unwrap_or_else(|e| panic!("{route}: O_RDONLY|O_TRUNC: {e}"));
        assert_eq!(fs::metadata(&f).unwrap().len(), 0, "{route}: O_RDONLY|O_TRUNC truncates");
        nix::unistd::truncate(&f, 3).unwrap_or_else(|e| panic!("{route}: truncate: {e}"));
        assert_eq!(fs::read(&f).unwrap(), b"\0\0\0", "{route}");
    }
}

/// An `open` that races a `renameat2(RENAME_EXCHANGE)` of its name gets one of the two files,
/// whole, as on a local filesystem, never an error (as with a rename over its name).
#[test]
fn an_open_racing_an_exchange_of_its_name_gets_one_of_the_two_files() {
    use std::os::unix::ffi::OsStrExt;
    use std::sync::atomic::{AtomicBool, Ordering};
    let (fx, routes) = fixture();
    for route in routes {
        let (x, y) = (fx.p(&format!("{route}/x")), fx.p(&format!("{route}/y")));
        let (xs, ys) = (vec![b'X'; 5000], vec![b'Y'; 7000]);
        fs::write(&x, &xs).unwrap();
        fs::write(&y, &ys).unwrap();
        let stop = AtomicBool::new(false);
        let (mut opens, mut errors, mut wrong) = (0, Vec::new(), 0);
        std::thread::scope(|s| {
            let swapper = s.spawn(|| {
                let name = |p: &std::path::Path| std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
                let (a, b) = (name(&x), name(&y));
                let mut swaps = 0;
                while !stop.load(Ordering::Relaxed) {
                    let r = unsafe {
                        libc::renameat2(
                            libc::AT_FDCWD,
                            a.as_ptr(),
                            libc::AT_FDCWD,
                            b.as_ptr(),
                            libc::RENAME_EXCHANGE,
                        )
                    };
                    assert_eq!(r, 0, "exchange: {}", std::io::Error::last_os_error());
                    swaps += 1;
                }
                swaps
            });
            let until = std::time::Instant::now() + std::time::Duration::from_millis(1500);
            while std::time::Instant::now() < until {
                match fs::read(&x) {
                    Ok(data) => wrong += usize::from(data != xs && data != ys),
                    Err(e) => errors.push(e.to_string()),
                }
                opens += 1;
            }
            stop.store(true, Ordering::Relaxed);
            assert!(swapper.join().unwrap() >= 100, "{route}: too few exchanges raced the opens");
        });
        assert!(errors.is_empty(), "{route}: {} of {opens} opens failed: {:?}", errors.len(), &errors[..1]);
        assert_eq!(wrong, 0, "{route}: {opens} opens read neither file whole");
    }
}

/// Extended attributes of the namespaces a local filesystem keeps are kept; another namespace
/// answers EOPNOTSUPP, as tmpfs and ext4 do.
#[test]
fn extended_attributes_outside_the_known_namespaces_are_not_supported() {
    use std::os::unix::ffi::OsStrExt;
    let fx = Fixture::new(&format!("{MEMD}\n[fuse]\nxattrs = true\n"));
    fs::set_permissions(fx.scratch.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    for route in ROUTES.iter().copied().chain(["/memd"]) {
        let f = fx.p(&format!("{route}/xa"));
        fs::write(&f, b"").unwrap();
        let path = std::ffi::CString::new(f.as_os_str().as_bytes()).unwrap();
        let set = |name: &str| {
            let name = std::ffi::CString::new(name).unwrap();
            match unsafe { libc::setxattr(path.as_ptr(), name.as_ptr(), b"v".as_ptr().cast(), 1, 0) } {
                0 => 0,
                _ => std::io::Error::last_os_error().raw_os_error().unwrap(),
            }
        };
        assert_eq!(set("user.a"), 0, "{route}");
        assert_eq!(set("trusted.a"), 0, "{route}");
        assert_eq!(set("bogus.x"), libc::EOPNOTSUPP, "{route}");
        assert_eq!(set("system.x"), libc::EOPNOTSUPP, "{route}");
        // `trusted.` is the privileged's: the kernel refuses others before the daemon hears.
        fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
        let script = "import os, sys\ntry: os.setxattr(sys.argv[1], 'trusted.b', b'v'); print(0)\n\
                      except OSError as e: print(e.errno)";
        let out = crate::harness::sh_ok(
            &fx.mount.dir,
            &format!(
                "setpriv --reuid=65534 --regid=65534 --clear-groups /usr/bin/python3 -c \"{script}\" {}",
                f.display()
            ),
        );
        assert_eq!(out.trim(), libc::EPERM.to_string(), "{route}");
    }
}
