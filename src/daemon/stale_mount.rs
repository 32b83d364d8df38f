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
//! - the mount answers `statfs` with ENOTCONN or ECONNABORTED (the kernel ended the
//!   connection), or it does not answer within [`PROBE_WAIT`] (or answers ECANCELED: its
//!   io_uring queues are gone) while a dying process holds its connection. A silent mount with
//!   no holder in sight is not cleared: with no holder at all the kernel would have ended the
//!   connection, so some process this one cannot see (another PID namespace) serves it;
//!   that is refused with the commands that would end it.
//!
//! Daemons starting on one mountpoint take turns: each holds a [`MountpointLock`] from before
//! it looks at the mount there until its own mount is made, so none examines a mount another
//! is replacing. And just before the connection is aborted, the mount at the mountpoint and the
//! connection's holders are looked at again: the same mount (id and device) must still be
//! there, still with no live holder, since connection numbers are reused at once.
//!
//! Then its connection is aborted through fusectl (the connection's number is the minor of the
//! mount's device; fusectl is mounted for that if it is not, and unmounted again), the mount is
//! detached, and the dying daemon's exit is awaited, since until then it keeps its sockets and
//! store locks. A mount a live process serves is never touched: it is "busy".

use crate::mountinfo::unescape;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

/// How long a mount has to answer `statfs` before it is taken for wedged (when only dying
/// processes hold its connection).
pub const PROBE_WAIT: Duration = Duration::from_secs(5);

/// How long a dying daemon is given to leave once its connection is aborted.
const EXIT_WAIT: Duration = Duration::from_secs(10);

/// Where fusectl shows the kernel's FUSE connections.
const FUSECTL: &str = "/sys/fs/fuse/connections";

/// Where root's daemons keep their mountpoint locks (see [`MountpointLock`]).
pub const LOCK_DIR: &str = "/run/agentvfs-mountpoints";

/// The newest mount at a path, as `/proc/self/mountinfo` lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct MountEntry {
    /// The mount's id (mountinfo's first field): a mount made later at the same path, even of
    /// the same device, has another.
    pub id: u64,
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

    /// The same mount: same id and device (a mount id is reused only once its mount is gone).
    fn same_mount(&self, other: &MountEntry) -> bool {
        (self.id, &self.device) == (other.id, &other.device)
    }
}

/// The newest mount at path `want` in the text of a mountinfo file.
fn find_mount(info: &str, want: &[u8]) -> Option<MountEntry> {
    info.lines().rev().find_map(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        if unescape(fields.get(4)?) != want {
            return None;
        }
        let sep = fields.iter().position(|f| *f == "-")?;
        Some(MountEntry {
            id: fields.first()?.parse().ok()?,
            device: fields.get(2)?.to_string(),
            fstype: fields.get(sep + 1)?.to_string(),
            source: String::from_utf8_lossy(&unescape(fields.get(sep + 2)?)).into_owned(),
        })
    })
}

/// The newest mount at `path`, from `/proc/self/mountinfo`: nothing asks the mounted
/// filesystem itself.
pub fn mount_at(path: &Path) -> Option<MountEntry> {
    use std::os::unix::ffi::OsStrExt;
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    find_mount(&info, path.as_os_str().as_bytes())
}

fn busy(point: &Path, entry: &MountEntry, why: &str) -> anyhow::Error {
    anyhow!(
        "mountpoint {} is busy: a {} is already mounted there{why} (unmount it first, e.g. `umount {}`)",
        point.display(),
        entry.describe(),
        point.display()
    )
}

/// The refusal for a mount of agentvfs whose state cannot be told safely, with the commands
/// that end it by hand.
fn cannot_tell(point: &Path, conn: u32, why: &str) -> anyhow::Error {
    anyhow!(
        "mountpoint {} holds a mount of agentvfs that is not cleared: {why}; if no daemon serves it, end it \
         with `echo 1 > {FUSECTL}/{conn}/abort` and `umount -l {}`",
        point.display(),
        point.display()
    )
}

/// An exclusive `flock` on a file named after one mountpoint, which daemons starting there
/// take in turn: held from before the mount there is examined until the daemon's own mount is
/// made (or it gives up), so that no daemon examines, aborts or unmounts a mount another is
/// replacing. The file is `<dir>/<sha256 of the path>.lock`, `dir` [`LOCK_DIR`] for root and
/// `$XDG_RUNTIME_DIR/agentvfs-mountpoints` otherwise; the lock goes with the descriptor, so a
/// daemon that dies releases it. When no lock can be had (no such directory can be made, or
/// it is not this user's alone), the daemon still mounts where nothing is mounted, but clears
/// nothing.
#[derive(Debug)]
pub struct MountpointLock {
    point: PathBuf,
    held: std::result::Result<std::fs::File, String>,
}

impl MountpointLock {
    /// Takes the lock of `point` (a resolved path), waiting while another daemon holds it.
    pub fn take(point: &Path) -> MountpointLock {
        let dir = match nix::unistd::geteuid().is_root() {
            true => Some(PathBuf::from(LOCK_DIR)),
            false => dirs::runtime_dir().map(|d| d.join("agentvfs-mountpoints")),
        };
        let lock = match dir {
            Some(dir) => Self::take_in(&dir, point),
            None => MountpointLock { point: point.to_path_buf(), held: Err("no runtime directory".into()) },
        };
        if let Err(why) = &lock.held {
            tracing::warn!(
                "cannot lock mountpoint {} against other daemons starting there ({why}); a stale mount there \
                 will not be cleared",
                point.display()
            );
        }
        lock
    }

    /// Takes the lock of `point` in directory `dir` (made, mode 0700, if missing).
    pub fn take_in(dir: &Path, point: &Path) -> MountpointLock {
        let held = Self::lock_file(dir, point).and_then(|file| {
            if flock(&file, libc::LOCK_EX | libc::LOCK_NB).is_err() {
                tracing::info!(
                    "another agentvfs daemon is preparing mountpoint {}; waiting for it to mount or give up",
                    point.display()
                );
                flock(&file, libc::LOCK_EX).map_err(|e| format!("cannot lock {}: {e}", dir.display()))?;
            }
            Ok(file)
        });
        MountpointLock { point: point.to_path_buf(), held }
    }

    fn lock_file(dir: &Path, point: &Path) -> std::result::Result<std::fs::File, String> {
        use sha2::{Digest, Sha256};
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
        let shown = dir.display();
        match std::fs::DirBuilder::new().mode(0o700).create(dir) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
                return Err(format!("cannot create {shown}: {e}"))
            }
            _ => {}
        }
        let meta = std::fs::symlink_metadata(dir).map_err(|e| format!("{shown}: {e}"))?;
        if !meta.is_dir() || meta.uid() != nix::unistd::geteuid().as_raw() || meta.mode() & 0o022 != 0 {
            return Err(format!("{shown} is not a directory this user alone may write"));
        }
        let digest = Sha256::digest(point.as_os_str().as_bytes());
        let name: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        let file = dir.join(format!("{name}.lock"));
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&file)
            .map_err(|e| format!("cannot open {}: {e}", file.display()))
    }

    /// The mountpoint this lock is for.
    pub fn point(&self) -> &Path {
        &self.point
    }

    /// Whether the lock is held (else why not).
    pub fn is_held(&self) -> std::result::Result<(), &str> {
        self.held.as_ref().map(|_| ()).map_err(String::as_str)
    }
}

fn flock(file: &std::fs::File, how: libc::c_int) -> io::Result<()> {
    loop {
        // SAFETY: flock on a descriptor this function borrows.
        if unsafe { libc::flock(file.as_raw_fd(), how) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Who holds `/dev/fuse` descriptors of one connection.
#[derive(Debug, PartialEq)]
enum Holders {
    /// No process that this one can see.
    Nobody,
    /// Dying processes, killed with threads still in the kernel, and no live one this process
    /// can see. (One whose descriptors it may not read could hold the connection too; but a
    /// silent mount a dying daemon holds is the wedge the module describes, where a live
    /// daemon would answer.)
    Dying(Vec<u32>),
    /// A live process: it serves the mount.
    Live(u32),
    /// No holder seen, and a live process whose descriptors this process may not read (a
    /// process with capabilities this one lacks, or another user's when not root).
    Unknown(u32),
}

/// The fdinfo directories of process `pid`: the process's own, or, once its first thread has
/// exited (a zombie leader lists none), those of a thread still in it.
fn fdinfo_dirs(pid: &str) -> Vec<PathBuf> {
    let base = Path::new("/proc").join(pid);
    let mut dirs = vec![base.clone()];
    if let Ok(tasks) = std::fs::read_dir(base.join("task")) {
        dirs.extend(tasks.flatten().map(|t| t.path()));
    }
    dirs.into_iter().map(|d| d.join("fdinfo")).collect()
}

/// The FUSE connection a descriptor's fdinfo names: only a `/dev/fuse` descriptor attached to
/// a connection has a `fuse_connection:` line.
fn connection_in(fdinfo: &str) -> Option<u32> {
    fdinfo.lines().find_map(|l| l.strip_prefix("fuse_connection:")?.trim().parse().ok())
}

/// The connections of the `/dev/fuse` descriptors `pid` holds, or an error when its
/// descriptors cannot be read. Known by their fdinfo alone: the link of a descriptor may name
/// the device by a path this process does not see it by (`/srv/x/dev/fuse` in a chroot), and
/// the descriptor itself is never looked at (a `stat` of one on a wedged mount would hang).
fn fuse_connections(pid: &str) -> io::Result<Vec<u32>> {
    let mut last_error = None;
    for info_dir in fdinfo_dirs(pid) {
        let entries = match std::fs::read_dir(&info_dir) {
            Ok(entries) => entries.flatten().collect::<Vec<_>>(),
            Err(e) => {
                last_error.get_or_insert(e);
                continue;
            }
        };
        if entries.is_empty() {
            continue;
        }
        let infos = entries.iter().filter_map(|e| std::fs::read_to_string(e.path()).ok());
        return Ok(infos.filter_map(|info| connection_in(&info)).collect());
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
        match fuse_connections(&name) {
            Ok(conns) if conns.contains(&conn) => match dying(pid) {
                false => return Holders::Live(pid),
                true => dying_ones.push(pid),
            },
            Ok(_) => {}
            Err(_) if !dying(pid) => unknown = unknown.or(Some(pid)),
            Err(_) => {}
        }
    }
    match unknown {
        _ if !dying_ones.is_empty() => Holders::Dying(dying_ones),
        Some(pid) => Holders::Unknown(pid),
        None => Holders::Nobody,
    }
}

/// How a mount answered `statfs`.
#[derive(Debug)]
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

/// What to do with a mount of agentvfs, given who holds its connection and how it answered.
#[derive(Debug, PartialEq)]
enum Action {
    /// It is served: refused as busy (by this process, when known).
    Busy(Option<u32>),
    /// Whether anything serves it cannot be told: refused, with the commands that end it.
    CannotTell(String),
    /// Nothing serves it: aborted and unmounted (why, for the log).
    Clear(String),
    /// `statfs` failed otherwise: refused with that error.
    Fail(String),
}

fn decide(holders: &Holders, probe: &Probe) -> Action {
    match (holders, probe) {
        (Holders::Live(pid), _) => Action::Busy(Some(*pid)),
        (_, Probe::Answered) => Action::Busy(None),
        (_, Probe::Failed(e)) => Action::Fail(e.to_string()),
        // Ended: nothing can serve it any more, whoever holds it.
        (_, Probe::Ended(e)) => Action::Clear(format!("statfs answers {e}")),
        // A dying daemon that cannot finish dying: the wedge the module describes.
        (Holders::Dying(_), Probe::Silent(how)) => Action::Clear(how.clone()),
        (Holders::Unknown(pid), Probe::Silent(how)) => Action::CannotTell(format!(
            "it does not answer ({how}), and whether process {pid} serves it cannot be told here"
        )),
        // With no holder at all the kernel ends the connection (and statfs answers ENOTCONN):
        // a holder this process cannot see (another PID namespace) keeps it.
        (Holders::Nobody, Probe::Silent(how)) => Action::CannotTell(format!(
            "it does not answer ({how}), yet no process seen here holds its connection, so a daemon this \
             process cannot see (in another PID namespace) may serve it"
        )),
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

/// Clears the mount at `point` (a path with no symlink in it, whose `lock` this process holds)
/// when it is one of agentvfs whose daemon is gone, as the module says; refuses a mount in use,
/// or any other, as busy, and one whose state cannot be told with the commands that clear it.
/// Nothing mounted there: nothing to do.
pub fn clear_dead_mount(point: &Path, lock: &MountpointLock) -> Result<()> {
    debug_assert_eq!(lock.point(), point);
    let Some(entry) = mount_at(point) else { return Ok(()) };
    let Some(conn) = entry.connection().filter(|_| entry.is_agentvfs()) else {
        return Err(busy(point, &entry, ""));
    };
    if let Holders::Live(pid) = holders(conn) {
        return Err(busy(point, &entry, &format!(", served by process {pid}")));
    }
    let probed = probe(point, PROBE_WAIT);
    // Looked at again just before the abort: the probe took up to PROBE_WAIT, and an abort
    // by number reaches whatever connection has that number now.
    let Some(now) = mount_at(point) else { return Ok(()) };
    if !now.same_mount(&entry) {
        bail!(
            "mountpoint {} changed while its mount was examined (now a {}); not clearing it",
            point.display(),
            now.describe()
        );
    }
    let held = holders(conn);
    let how = match decide(&held, &probed) {
        Action::Busy(Some(pid)) => return Err(busy(point, &entry, &format!(", served by process {pid}"))),
        Action::Busy(None) => return Err(busy(point, &entry, "")),
        Action::Fail(e) => bail!("cannot use mountpoint {}: {e}", point.display()),
        Action::CannotTell(why) => return Err(cannot_tell(point, conn, &why)),
        Action::Clear(how) => how,
    };
    if let Err(why) = lock.is_held() {
        let why = format!("no other daemon starting there can be kept out meanwhile ({why})");
        return Err(cannot_tell(point, conn, &why));
    }
    tracing::warn!(
        "{} holds a mount of agentvfs whose daemon died ({how}); ending its connection {conn} and clearing it",
        point.display()
    );
    if let Err(e) = abort_connection(conn) {
        tracing::warn!("cannot abort FUSE connection {conn} ({e:#}); its callers may stay blocked");
    }
    match mount_at(point) {
        Some(now) if now.same_mount(&entry) => {
            nix::mount::umount2(point, nix::mount::MntFlags::MNT_DETACH)
                .with_context(|| format!("cannot clear the stale mount at {}", point.display()))?
        }
        Some(now) => bail!(
            "mountpoint {} changed while its mount was cleared (now a {}); not unmounting it",
            point.display(),
            now.describe()
        ),
        None => {}
    }
    // A dying daemon keeps its sockets and store locks until its last thread leaves the
    // kernel, which the abort lets it do; its descriptors go together then, but not at once:
    // it has let go of the connection before its store's lock, so all of them are awaited.
    if let Holders::Dying(pids) = held {
        let deadline = Instant::now() + EXIT_WAIT;
        // Through its threads too: a zombie leader lists no descriptors while a thread still
        // in the kernel holds them all (the store's lock among them).
        let holds_any = |pid: &u32| {
            fdinfo_dirs(&pid.to_string())
                .iter()
                .any(|dir| std::fs::read_dir(dir).is_ok_and(|mut fds| fds.next().is_some()))
        };
        while matches!(self::holders(conn), Holders::Dying(_)) || pids.iter().any(holds_any) {
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
    fn the_newest_mount_at_a_path_is_found_with_its_id() {
        let info = "\
22 1 0:21 / /tmp rw,nosuid - tmpfs tmpfs rw
87 22 0:52 / /tmp/a\\040b rw,nosuid shared:1 - fuse agentvfs rw,user_id=0
91 87 0:53 / /tmp/a\\040b rw - fuse agentvfs rw,user_id=0
";
        let found = find_mount(info, b"/tmp/a b").unwrap();
        let want =
            MountEntry { id: 91, device: "0:53".into(), fstype: "fuse".into(), source: "agentvfs".into() };
        assert_eq!(found, want);
        assert!(find_mount(info, b"/tmp/a").is_none());
        // The same device mounted again is another mount.
        assert!(!found.same_mount(&MountEntry { id: 87, ..want.clone() }));
        assert!(!found.same_mount(&MountEntry { device: "0:52".into(), ..want.clone() }));
        assert!(found.same_mount(&want));
    }

    #[test]
    fn the_connection_is_the_minor_of_an_agentvfs_mount() {
        let entry =
            MountEntry { id: 1, device: "0:52".into(), fstype: "fuse".into(), source: "agentvfs".into() };
        assert!(entry.is_agentvfs());
        assert_eq!(entry.connection(), Some(52));
        let other =
            MountEntry { id: 2, device: "0:53".into(), fstype: "fuse.sshfs".into(), source: "h:/".into() };
        assert!(!other.is_agentvfs());
    }

    #[test]
    fn a_fuse_descriptor_is_known_by_its_fdinfo() {
        assert_eq!(
            connection_in("pos:\t0\nflags:\t02100002\nmnt_id:\t24\nino:\t89\nfuse_connection:\t52\n"),
            Some(52)
        );
        // A descriptor of /dev/fuse not attached to a mount yet, and any other file.
        assert_eq!(connection_in("pos:\t0\nflags:\t02100002\nmnt_id:\t24\nino:\t89\n"), None);
        assert_eq!(connection_in("pos:\t0\nflags:\t0100000\nmnt_id:\t30\nino:\t1234\n"), None);
    }

    #[test]
    fn a_live_process_is_not_dying() {
        assert!(!dying(std::process::id()));
    }

    fn silent() -> Probe {
        Probe::Silent("statfs has no answer within 5 s".into())
    }

    fn ended() -> Probe {
        Probe::Ended(io::Error::from_raw_os_error(libc::ENOTCONN))
    }

    fn cleared(action: Action) -> bool {
        matches!(action, Action::Clear(_))
    }

    fn cannot_be_told(action: Action) -> bool {
        matches!(action, Action::CannotTell(_))
    }

    #[test]
    fn a_live_holder_or_an_answer_means_busy() {
        for probe in [Probe::Answered, silent(), ended()] {
            assert_eq!(decide(&Holders::Live(7), &probe), Action::Busy(Some(7)));
        }
        for holders in [Holders::Nobody, Holders::Dying(vec![3]), Holders::Unknown(4)] {
            assert_eq!(decide(&holders, &Probe::Answered), Action::Busy(None));
        }
    }

    #[test]
    fn an_ended_connection_is_cleared_whoever_holds_it() {
        for holders in [Holders::Nobody, Holders::Dying(vec![3]), Holders::Unknown(4)] {
            assert!(cleared(decide(&holders, &ended())), "{holders:?}");
        }
        let aborted = Probe::Ended(io::Error::from_raw_os_error(libc::ECONNABORTED));
        assert!(cleared(decide(&Holders::Nobody, &aborted)));
    }

    #[test]
    fn a_silent_mount_is_cleared_only_when_a_dying_daemon_holds_it() {
        assert!(cleared(decide(&Holders::Dying(vec![3]), &silent())));
        let canceled = Probe::Silent("statfs answers Operation canceled (os error 125)".into());
        assert!(cleared(decide(&Holders::Dying(vec![3]), &canceled)));
        // No holder in sight yet the kernel keeps the connection: one this process cannot see.
        assert!(cannot_be_told(decide(&Holders::Nobody, &silent())));
        assert!(cannot_be_told(decide(&Holders::Nobody, &canceled)));
        assert!(cannot_be_told(decide(&Holders::Unknown(4), &silent())));
    }

    #[test]
    fn another_statfs_error_is_reported() {
        let probe = Probe::Failed(io::Error::from_raw_os_error(libc::EIO));
        assert!(matches!(decide(&Holders::Nobody, &probe), Action::Fail(e) if e.contains("os error 5")));
    }

    #[test]
    fn daemons_take_turns_on_one_mountpoint() {
        let dir = tempfile::tempdir().unwrap();
        let locks = dir.path().join("locks");
        let first = MountpointLock::take_in(&locks, Path::new("/mnt/a"));
        assert_eq!(first.is_held(), Ok(()));
        // Another mountpoint has its own lock.
        let other = MountpointLock::take_in(&locks, Path::new("/mnt/b"));
        assert_eq!(other.is_held(), Ok(()));
        // A second taker of /mnt/a (here another descriptor) waits until the first lets go.
        let (tx, rx) = mpsc::channel();
        let waiting = {
            let locks = locks.clone();
            std::thread::spawn(move || {
                let second = MountpointLock::take_in(&locks, Path::new("/mnt/a"));
                tx.send(second.is_held().is_ok()).unwrap();
            })
        };
        assert!(rx.recv_timeout(Duration::from_millis(300)).is_err(), "taken twice at once");
        drop(first);
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)), Ok(true));
        waiting.join().unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&locks).unwrap().permissions().mode() & 0o777, 0o700);
    }

    #[test]
    fn a_lock_directory_others_may_write_is_not_used() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let lock = MountpointLock::take_in(dir.path(), Path::new("/mnt/a"));
        assert!(lock.is_held().unwrap_err().contains("this user alone"), "{lock:?}");
    }
}
