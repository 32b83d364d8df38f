//! The mount a killed daemon left at the mountpoint, found and cleared without asking it
//! anything.
//!
//! `kill -9` does not always end a FUSE connection. The kernel ends it when the last
//! descriptor of `/dev/fuse` for it is closed, and a process's descriptors are closed only
//! once its last thread has left the kernel. A thread of the daemon that is inside a
//! `/dev/fuse` write (a notification: "forget this name", which waits for the directory's
//! lock) while a caller holding that lock waits for the daemon's answer never leaves: the
//! caller waits for a reply the dead daemon will not send, and the daemon's thread waits for
//! the caller. The daemon stays a zombie, the mount answers nothing (or ECANCELED, by
//! io_uring), and only aborting the connection through fusectl releases both.
//!
//! So the mountpoint is looked up in `/proc/self/mountinfo` (a wedged mount hangs whoever
//! stats it), and a mount found there is cleared only when all of these hold:
//!
//! - it is agentvfs's: a FUSE mount named `agentvfs`;
//! - no live process holds a `/dev/fuse` descriptor of its connection: each such descriptor's
//!   `fdinfo` names its connection (`fuse_connection:`), and a process counts as dying when
//!   every one of its threads is a zombie or has SIGKILL pending;
//! - the mount does not answer `statfs` within [`PROBE_WAIT`], or answers ENOTCONN or
//!   ECONNABORTED (the kernel ended the connection) or ECANCELED (its io_uring queues are
//!   gone).
//!
//! Then its connection is aborted through fusectl (the connection's number is the minor of the
//! mount's device; fusectl is mounted for that if it is not, and unmounted again), the mount is
//! detached, and the dying daemon's exit is awaited, since until then it keeps its sockets and
//! store locks. A mount a live process serves is never touched: it is "busy".

use std::io;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

/// How long a mount has to answer `statfs` before it is taken for wedged (when no live process
/// serves it).
pub const PROBE_WAIT: Duration = Duration::from_secs(5);

/// How long a dying daemon is given to leave once its connection is aborted.
const EXIT_WAIT: Duration = Duration::from_secs(10);

/// Where fusectl shows the kernel's FUSE connections.
const FUSECTL: &str = "/sys/fs/fuse/connections";

/// The newest mount at a path, as `/proc/self/mountinfo` lists it.
#[derive(Debug, Clone)]
pub struct MountEntry {
    /// "major:minor".
    pub device: String,
    pub fstype: String,
    pub source: String,
}

impl MountEntry {
    /// "<type> filesystem (<source>)", as the busy message names it.
    pub fn describe(&self) -> String {
        format!("{} filesystem ({})", self.fstype, self.source)
    }

    /// Mounted by agentvfs: FUSE (`fuse`, or `fuse.agentvfs` through fusermount) named agentvfs.
    pub fn is_agentvfs(&self) -> bool {
        matches!(self.fstype.as_str(), "fuse" | "fuse.agentvfs") && self.source == "agentvfs"
    }

    /// The FUSE connection's number: the minor of the mount's device.
    pub fn connection(&self) -> Option<u32> {
        self.device.split_once(':')?.1.parse().ok()
    }
}

/// Undoes mountinfo's octal escapes (`\040` for a space, `\134` for a backslash, ...).
fn unescape(field: &str) -> Vec<u8> {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let digits = bytes.get(i + 1..i + 4);
        match digits {
            Some(d) if bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)) => {
                out.push(d.iter().fold(0u8, |n, c| n.wrapping_mul(8) + (c - b'0')));
                i += 4;
            }
            _ => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    out
}

/// The newest mount at `path`, from `/proc/self/mountinfo`: nothing asks the mounted
/// filesystem itself.
pub fn mount_at(path: &Path) -> Option<MountEntry> {
    use std::os::unix::ffi::OsStrExt;
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = path.as_os_str().as_bytes();
    info.lines().rev().find_map(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        if unescape(fields.get(4)?) != want {
            return None;
        }
        let sep = fields.iter().position(|f| *f == "-")?;
        Some(MountEntry {
            device: fields.get(2)?.to_string(),
            fstype: fields.get(sep + 1)?.to_string(),
            source: String::from_utf8_lossy(&unescape(fields.get(sep + 2)?)).into_owned(),
        })
    })
}

fn busy(point: &Path, entry: &MountEntry, why: &str) -> anyhow::Error {
    anyhow!(
        "mountpoint {} is busy: a {} is already mounted there{why} (unmount it first, e.g. `umount {}`)",
        point.display(),
        entry.describe(),
        point.display()
    )
}

/// Who holds `/dev/fuse` descriptors of one connection.
#[derive(Debug, PartialEq)]
enum Holders {
    /// No process (that this one can see).
    Nobody,
    /// Only dying processes: killed, with threads still in the kernel.
    Dying(Vec<u32>),
    /// A live process: it serves the mount.
    Live(u32),
    /// A live process whose FUSE descriptors (or whose descriptors at all) this process cannot
    /// tell apart: a kernel whose fdinfo does not name the connection, or no permission.
    Unknown(u32),
}

/// The descriptors of process `pid`, as `(fd link dir, fdinfo dir)`: the process's own, or,
/// once its first thread has exited (a zombie leader lists none), those of a thread still in it.
fn fd_dirs(pid: &str) -> Vec<(PathBuf, PathBuf)> {
    let base = Path::new("/proc").join(pid);
    let mut dirs = vec![base.clone()];
    if let Ok(tasks) = std::fs::read_dir(base.join("task")) {
        dirs.extend(tasks.flatten().map(|t| t.path()));
    }
    dirs.into_iter().map(|d| (d.join("fd"), d.join("fdinfo"))).collect()
}

/// The connections of `/dev/fuse` descriptors `pid` holds (`None` for one fdinfo does not
/// name), or an error when its descriptors cannot be read.
fn fuse_connections(pid: &str) -> io::Result<Vec<Option<u32>>> {
    let mut last_error = None;
    for (fd_dir, info_dir) in fd_dirs(pid) {
        let entries = match std::fs::read_dir(&fd_dir) {
            Ok(entries) => entries.flatten().collect::<Vec<_>>(),
            Err(e) => {
                last_error.get_or_insert(e);
                continue;
            }
        };
        if entries.is_empty() {
            continue;
        }
        let mut found = Vec::new();
        for entry in entries {
            if std::fs::read_link(entry.path()).ok().as_deref() != Some(Path::new("/dev/fuse")) {
                continue;
            }
            let info = std::fs::read_to_string(info_dir.join(entry.file_name())).unwrap_or_default();
            found.push(info.lines().find_map(|l| l.strip_prefix("fuse_connection:")?.trim().parse().ok()));
        }
        return Ok(found);
    }
    match last_error {
        // A process with no descriptors (exited threads, a zombie) or one gone meanwhile.
        Some(e) if e.kind() == io::ErrorKind::PermissionDenied => Err(e),
        _ => Ok(Vec::new()),
    }
}

/// Is process `pid` dying: each of its threads a zombie, or with SIGKILL pending (a thread in
/// an uninterruptible wait keeps it pending)? A process that is gone counts too.
fn dying(pid: u32) -> bool {
    const SIGKILL_BIT: u64 = 1 << (libc::SIGKILL - 1);
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return true };
    tasks.flatten().all(|task| {
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else { return true };
        let field = |name: &str| status.lines().find_map(|l| l.strip_prefix(name)).map(str::trim);
        let zombie = field("State:").is_some_and(|s| s.starts_with('Z') || s.starts_with('X'));
        let killed = ["SigPnd:", "ShdPnd:"].iter().any(|f| {
            field(f).and_then(|m| u64::from_str_radix(m, 16).ok()).is_some_and(|m| m & SIGKILL_BIT != 0)
        });
        zombie || killed
    })
}

/// Who holds connection `conn`, by every process's descriptors in `/proc`.
fn holders(conn: u32) -> Holders {
    let own = std::process::id().to_string();
    let Ok(procs) = std::fs::read_dir("/proc") else { return Holders::Unknown(0) };
    let (mut dying_ones, mut unknown) = (Vec::new(), None);
    for entry in procs.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Ok(pid) = name.parse::<u32>() else { continue };
        if name == own {
            continue;
        }
        let (holds, unnamed) = match fuse_connections(&name) {
            Ok(conns) => (conns.contains(&Some(conn)), conns.contains(&None)),
            Err(_) => (false, true),
        };
        if !holds && !unnamed {
            continue;
        }
        match (holds, dying(pid)) {
            (true, false) => return Holders::Live(pid),
            (true, true) => dying_ones.push(pid),
            (false, false) => unknown = unknown.or(Some(pid)),
            (false, true) => {}
        }
    }
    match unknown {
        Some(pid) => Holders::Unknown(pid),
        None if dying_ones.is_empty() => Holders::Nobody,
        None => Holders::Dying(dying_ones),
    }
}

/// How a mount answered `statfs`.
enum Probe {
    Answered,
    /// The kernel ended the connection (ENOTCONN, ECONNABORTED): nothing can serve it.
    Ended(io::Error),
    /// No answer in time, or ECANCELED (the connection's io_uring queues are gone).
    Silent(String),
    Failed(io::Error),
}

/// `statfs` on `point` (which always reaches the daemon; `stat` may be answered from the
/// kernel's cache), given `wait` to answer. A thread left waiting is released when the
/// connection is aborted.
fn probe(point: &Path, wait: Duration) -> Probe {
    let (tx, rx) = mpsc::channel();
    let path = point.to_path_buf();
    let spawned = std::thread::Builder::new().name("mount-probe".into()).spawn(move || {
        let _ = tx.send(nix::sys::statvfs::statvfs(&path));
    });
    if let Err(e) = spawned {
        return Probe::Failed(e);
    }
    match rx.recv_timeout(wait) {
        Ok(Ok(_)) => Probe::Answered,
        Ok(Err(e)) => {
            let error = io::Error::from_raw_os_error(e as i32);
            match e {
                nix::errno::Errno::ENOTCONN | nix::errno::Errno::ECONNABORTED => Probe::Ended(error),
                nix::errno::Errno::ECANCELED => Probe::Silent(format!("statfs answers {error}")),
                _ => Probe::Failed(error),
            }
        }
        Err(_) => Probe::Silent(format!("statfs has no answer within {} s", wait.as_secs())),
    }
}

/// Aborts FUSE connection `conn` through fusectl, mounting fusectl at
/// `/sys/fs/fuse/connections` for that if it is not mounted (and unmounting it again). A
/// connection fusectl no longer lists is gone already.
pub fn abort_connection(conn: u32) -> Result<()> {
    let dir = Path::new(FUSECTL);
    let mounted_here = if mount_at(dir).is_some_and(|m| m.fstype == "fusectl") {
        false
    } else {
        nix::mount::mount(Some("fusectl"), dir, Some("fusectl"), nix::mount::MsFlags::empty(), None::<&str>)
            .with_context(|| format!("cannot mount fusectl at {FUSECTL}"))?;
        true
    };
    let abort = dir.join(conn.to_string()).join("abort");
    let written = match std::fs::write(&abort, "1") {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other.with_context(|| format!("cannot write {}", abort.display())),
    };
    if mounted_here {
        let _ = nix::mount::umount2(dir, nix::mount::MntFlags::MNT_DETACH);
    }
    written
}

/// Clears the mount at `point` (a path with no symlink in it) when it is one of agentvfs whose
/// daemon is gone, as the module says; refuses a mount in use, or any other, as busy. Nothing
/// mounted there: nothing to do.
pub fn clear_dead_mount(point: &Path) -> Result<()> {
    let Some(entry) = mount_at(point) else { return Ok(()) };
    let Some(conn) = entry.connection().filter(|_| entry.is_agentvfs()) else {
        return Err(busy(point, &entry, ""));
    };
    let holders = holders(conn);
    if let Holders::Live(pid) = holders {
        return Err(busy(point, &entry, &format!(", served by process {pid}")));
    }
    let how = match probe(point, PROBE_WAIT) {
        Probe::Answered => return Err(busy(point, &entry, "")),
        Probe::Failed(e) => bail!("cannot use mountpoint {}: {e}", point.display()),
        Probe::Ended(e) => format!("statfs answers {e}"),
        Probe::Silent(how) => {
            if let Holders::Unknown(pid) = holders {
                bail!(
                    "mountpoint {} holds a mount of agentvfs that does not answer ({how}), and whether process {pid} \
                     serves it cannot be told here; if no daemon serves it, end it with \
                     `echo 1 > {FUSECTL}/{conn}/abort` and `umount -l {}`",
                    point.display(),
                    point.display()
                );
            }
            how
        }
    };
    tracing::warn!(
        "{} holds a mount of agentvfs whose daemon died ({how}); ending its connection {conn} and clearing it",
        point.display()
    );
    if let Err(e) = abort_connection(conn) {
        tracing::warn!("cannot abort FUSE connection {conn} ({e:#}); its callers may stay blocked");
    }
    nix::mount::umount2(point, nix::mount::MntFlags::MNT_DETACH)
        .with_context(|| format!("cannot clear the stale mount at {}", point.display()))?;
    // A dying daemon keeps its sockets and store locks until its last thread leaves the
    // kernel, which the abort lets it do.
    if let Holders::Dying(pids) = holders {
        let deadline = Instant::now() + EXIT_WAIT;
        while matches!(self::holders(conn), Holders::Dying(_)) {
            if Instant::now() > deadline {
                tracing::warn!("the daemon that died (process {pids:?}) has not exited yet");
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape(r"/tmp/a\040b\134c"), b"/tmp/a b\\c");
        assert_eq!(unescape(r"/tmp/x\04"), b"/tmp/x\\04");
    }

    #[test]
    fn the_connection_is_the_minor_of_an_agentvfs_mount() {
        let entry = MountEntry { device: "0:52".into(), fstype: "fuse".into(), source: "agentvfs".into() };
        assert!(entry.is_agentvfs());
        assert_eq!(entry.connection(), Some(52));
        let other = MountEntry { device: "0:53".into(), fstype: "fuse.sshfs".into(), source: "h:/".into() };
        assert!(!other.is_agentvfs());
    }

    #[test]
    fn a_live_process_is_not_dying() {
        assert!(!dying(std::process::id()));
    }
}
