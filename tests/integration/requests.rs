//! Requests the daemon answers without serving them (ioctl, SEEK_DATA/SEEK_HOLE, copy_file_range,
//! poll, locks, O_TMPFILE): each gets a plain filesystem's answer, and none adds to the log.

use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::Command;

use crate::harness::{scratch, Fixture, ROUTES};

fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(-1)
}

/// A system call's result: its value, or the errno.
fn outcome(ret: i64) -> Result<i64, i32> {
    if ret < 0 {
        Err(last_errno())
    } else {
        Ok(ret)
    }
}

fn log_len(fx: &Fixture) -> usize {
    fx.mount.log_text().len()
}

/// What the daemon logged since `from`, for the failure message.
fn logged_since(fx: &Fixture, from: usize) -> String {
    let text = fx.mount.log_text();
    let new = text.get(from..).unwrap_or_default();
    new.chars().take(2000).collect()
}

/// `ioctl(fd, TCGETS)`, what `isatty` asks.
fn tcgets(fd: i32) -> Result<i64, i32> {
    let mut termios: libc::termios = unsafe { std::mem::zeroed() };
    outcome(unsafe { libc::ioctl(fd, libc::TCGETS, &mut termios) } as i64)
}

fn open_dir(path: &Path) -> fs::File {
    use std::os::unix::fs::OpenOptionsExt;
    fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECTORY).open(path).unwrap()
}

#[test]
fn ioctl_bursts_answer_enotty_and_add_nothing_to_the_log() {
    // Requests come by io_uring where the kernel offers it (the default), else by /dev/fuse.
    ioctl_burst(Fixture::new(""));
    ioctl_burst(Fixture::with_config("", |text| format!("{text}\n[fuse]\nio_uring = false\n")));
}

fn ioctl_burst(fx: Fixture) {
    let plain = scratch();
    fs::write(plain.path().join("f"), b"data").unwrap();
    let plain_file = fs::File::open(plain.path().join("f")).unwrap();
    assert_eq!(tcgets(plain_file.as_raw_fd()), Err(libc::ENOTTY), "a plain file");
    assert_eq!(tcgets(open_dir(plain.path()).as_raw_fd()), Err(libc::ENOTTY), "a plain directory");
    for route in ROUTES {
        fs::write(fx.p(&format!("{route}/f")), b"data").unwrap();
    }
    let before = log_len(&fx);
    for route in ROUTES {
        let path = fx.p(&format!("{route}/f"));
        let file = fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
        for i in 0..5_000 {
            assert_eq!(tcgets(file.as_raw_fd()), Err(libc::ENOTTY), "{route}: ioctl #{i}");
        }
        let dir = open_dir(&fx.p(route));
        for i in 0..500 {
            assert_eq!(tcgets(dir.as_raw_fd()), Err(libc::ENOTTY), "{route}: directory ioctl #{i}");
        }
        // lsattr's question: the kernel asks the daemon (opening the file itself first).
        let mut flags: libc::c_long = 0;
        let got = outcome(unsafe { libc::ioctl(file.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut flags) } as i64);
        assert_eq!(got, Err(libc::ENOTTY), "{route}: FS_IOC_GETFLAGS");
    }
    let grown = log_len(&fx) - before;
    assert!(grown < 4096, "the log grew by {grown} bytes:\n{}", logged_since(&fx, before));
}

#[test]
fn python_open_works_and_adds_nothing_to_the_log() {
    let fx = Fixture::new("");
    let script = "import sys\n\
                  for p in sys.argv[1:]:\n\
                  \x20   with open(p, 'w') as f: f.write('hello\\n')\n\
                  \x20   with open(p) as f: assert f.read() == 'hello\\n', p\n\
                  \x20   with open(p, 'rb') as f: assert f.read() == b'hello\\n', p\n\
                  \x20   with open(p, 'a') as f: f.write('more\\n')\n\
                  print('ok')\n";
    let paths: Vec<_> = ROUTES.iter().map(|r| fx.p(&format!("{r}/py.txt"))).collect();
    let before = log_len(&fx);
    let out = Command::new("python3").arg("-c").arg(script).args(&paths).output().unwrap();
    assert!(out.status.success(), "python: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok\n");
    for p in &paths {
        assert_eq!(fs::read_to_string(p).unwrap(), "hello\nmore\n", "{}", p.display());
    }
    assert_eq!(log_len(&fx), before, "python's open() logged:\n{}", logged_since(&fx, before));
}

/// What a sequence of calls the daemon does not serve itself answers in `dir`: lseek's
/// SEEK_DATA / SEEK_HOLE, copy_file_range, poll, OFD, flock and POSIX locks.
fn outcomes(dir: &Path) -> Vec<(&'static str, Result<i64, i32>)> {
    let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
    let (src, dst) = (dir.join("src.bin"), dir.join("dst.bin"));
    fs::write(&src, &data).unwrap();
    fs::write(&dst, b"").unwrap();
    let rw = || fs::OpenOptions::new().read(true).write(true).open(&src).unwrap();
    let (a, b) = (rw(), rw());
    let (fd, fd2) = (a.as_raw_fd(), b.as_raw_fd());
    let out = fs::OpenOptions::new().write(true).open(&dst).unwrap();
    let seek = |offset: i64, whence: i32| outcome(unsafe { libc::lseek(fd, offset, whence) });
    let mut got = vec![
        ("SEEK_DATA 0", seek(0, libc::SEEK_DATA)),
        ("SEEK_DATA 4096", seek(4096, libc::SEEK_DATA)),
        ("SEEK_HOLE 0", seek(0, libc::SEEK_HOLE)),
        ("SEEK_HOLE 9999", seek(9999, libc::SEEK_HOLE)),
        ("SEEK_DATA at the end", seek(10_000, libc::SEEK_DATA)),
        ("SEEK_HOLE at the end", seek(10_000, libc::SEEK_HOLE)),
        ("SEEK_DATA past the end", seek(20_000, libc::SEEK_DATA)),
        ("SEEK_END", seek(-10, libc::SEEK_END)),
    ];
    let copy = |from: i64, to: i64, len: usize| {
        let (mut from, mut to) = (from, to);
        let n = unsafe { libc::copy_file_range(fd, &mut from, out.as_raw_fd(), &mut to, len, 0) };
        outcome(n as i64)
    };
    got.push(("copy_file_range", copy(100, 0, 5000)));
    got.push(("copy_file_range past the end", copy(9000, 5000, 5000)));
    got.push(("copy_file_range at the end", copy(10_000, 6000, 10)));
    let copied = fs::read(&dst).unwrap();
    let expected = [&data[100..5100], &data[9000..]].concat();
    got.push(("copied bytes as expected", Ok((copied == expected) as i64)));
    let events = libc::POLLIN | libc::POLLOUT | libc::POLLPRI | libc::POLLRDNORM | libc::POLLWRNORM;
    let mut poll = [libc::pollfd { fd, events, revents: 0 }];
    got.push(("poll", outcome(unsafe { libc::poll(poll.as_mut_ptr(), 1, 0) } as i64)));
    got.push(("poll revents", Ok(poll[0].revents as i64)));
    // Open file description locks: a second open of the file conflicts with the first's.
    let lock = |kind: i32| libc::flock {
        l_type: kind as i16,
        l_whence: libc::SEEK_SET as i16,
        l_start: 0,
        l_len: 0,
        l_pid: 0,
    };
    let fcntl_lock =
        |fd: i32, cmd: i32, l: &mut libc::flock| outcome(unsafe { libc::fcntl(fd, cmd, l) } as i64);
    got.push(("OFD write lock", fcntl_lock(fd, libc::F_OFD_SETLK, &mut lock(libc::F_WRLCK))));
    got.push(("OFD conflicting lock", fcntl_lock(fd2, libc::F_OFD_SETLK, &mut lock(libc::F_RDLCK))));
    let mut probe = lock(libc::F_RDLCK);
    got.push(("OFD getlk", fcntl_lock(fd2, libc::F_OFD_GETLK, &mut probe)));
    got.push(("OFD getlk type", Ok(probe.l_type as i64)));
    got.push(("OFD getlk pid", Ok(probe.l_pid as i64)));
    got.push(("OFD unlock", fcntl_lock(fd, libc::F_OFD_SETLK, &mut lock(libc::F_UNLCK))));
    got.push(("OFD lock once free", fcntl_lock(fd2, libc::F_OFD_SETLK, &mut lock(libc::F_WRLCK))));
    got.push(("OFD unlock again", fcntl_lock(fd2, libc::F_OFD_SETLK, &mut lock(libc::F_UNLCK))));
    // flock(2) locks.
    got.push(("flock", outcome(unsafe { libc::flock(fd, libc::LOCK_EX) } as i64)));
    got.push((
        "flock conflicting",
        outcome(unsafe { libc::flock(fd2, libc::LOCK_EX | libc::LOCK_NB) } as i64),
    ));
    got.push(("flock unlock", outcome(unsafe { libc::flock(fd, libc::LOCK_UN) } as i64)));
    // Process-associated POSIX locks: held by this process, refused to another.
    got.push(("POSIX write lock", fcntl_lock(fd, libc::F_SETLK, &mut lock(libc::F_WRLCK))));
    let mut own = lock(libc::F_WRLCK);
    got.push(("POSIX getlk by the holder", fcntl_lock(fd2, libc::F_GETLK, &mut own)));
    got.push(("POSIX getlk type by the holder", Ok(own.l_type as i64)));
    let other = Command::new("python3")
        .arg("-c")
        .arg(
            "import fcntl, sys\n\
             f = open(sys.argv[1], 'r+')\n\
             try:\n\
             \x20   fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n\
             except OSError as e:\n\
             \x20   sys.exit(e.errno)\n",
        )
        .arg(std::ffi::OsStr::from_bytes(src.as_os_str().as_bytes()))
        .status()
        .unwrap();
    got.push(("POSIX lock by another process", Err(other.code().unwrap_or(-1))));
    got.push(("POSIX unlock", fcntl_lock(fd, libc::F_SETLK, &mut lock(libc::F_UNLCK))));
    got
}

#[test]
fn seek_copy_poll_and_locks_answer_as_in_a_plain_directory() {
    let fx = Fixture::new("");
    let plain = scratch();
    let expected = outcomes(plain.path());
    // The plain directory's answers, so that a change of the test itself shows.
    let want = |name: &str| expected.iter().find(|(n, _)| *n == name).unwrap().1;
    assert_eq!(want("SEEK_HOLE 0"), Ok(10_000));
    assert_eq!(want("SEEK_DATA at the end"), Err(libc::ENXIO));
    assert_eq!(want("copy_file_range past the end"), Ok(1000));
    assert_eq!(want("OFD conflicting lock"), Err(libc::EAGAIN));
    assert_eq!(want("flock conflicting"), Err(libc::EWOULDBLOCK));
    assert_eq!(want("POSIX lock by another process"), Err(libc::EAGAIN));
    let before = log_len(&fx);
    for route in ROUTES {
        assert_eq!(outcomes(&fx.p(route)), expected, "{route}");
    }
    assert_eq!(log_len(&fx), before, "the daemon logged:\n{}", logged_since(&fx, before));
}

#[test]
fn o_tmpfile_is_not_supported_and_says_so_quietly() {
    use std::os::unix::fs::OpenOptionsExt;
    let fx = Fixture::new("");
    let before = log_len(&fx);
    for route in ROUTES {
        for attempt in 0..3 {
            let err = fs::OpenOptions::new()
                .read(true)
                .write(true)
                .mode(0o600)
                .custom_flags(libc::O_TMPFILE)
                .open(fx.p(route))
                .unwrap_err();
            assert_eq!(err.raw_os_error(), Some(libc::EOPNOTSUPP), "{route}: O_TMPFILE #{attempt}");
        }
    }
    assert_eq!(log_len(&fx), before, "the daemon logged:\n{}", logged_since(&fx, before));
}
