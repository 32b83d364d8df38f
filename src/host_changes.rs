//! Changes that other programs make under a host route's root, reported to the kernel's caches
//! of the mount, so that long cache lifetimes never hide them.
//!
//! One fanotify group watches the filesystems holding the host roots and those mounted
//! beneath them (`FAN_MARK_FILESYSTEM`, events naming the directory by file handle and the
//! entry by name; `nested` follows the mount table). Each event outside the
//! daemon's own process is mapped back to a virtual path (the directory's current host path,
//! under which root) and handed to the engine's [`ChangeObserver`], the same path tool-door
//! changes take, once for every route whose root holds it (roots may nest). Changes the daemon
//! makes itself are skipped, since the kernel made them through the mount and already knows,
//! unless the file is also seen through a second, nesting route; the files the daemon writes
//! all the time (sqlite databases) carry ignore marks, so their events are not even queued.
//! When the queue overflows, every cached name is invalidated.
//!
//! Delivery is asynchronous and batched (reads at most every 5 ms): a change made on the host
//! shows through the mount within milliseconds, not at the instant the host's system call
//! returns.

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::engine::ChangeObserver;
use crate::vpath::VPath;

mod nested;
use nested::RouteRoot;
pub use nested::Unwatched;

const EVENTS: u64 = libc::FAN_CREATE
    | libc::FAN_DELETE
    | libc::FAN_MOVED_FROM
    | libc::FAN_MOVED_TO
    | libc::FAN_ATTRIB
    | libc::FAN_MODIFY
    | libc::FAN_ONDIR;

/// The events that change which node a name leads to (fanotify may merge several into one).
const NAME_EVENTS: u64 = libc::FAN_CREATE | libc::FAN_DELETE | libc::FAN_MOVED_FROM | libc::FAN_MOVED_TO;

/// How long events may gather between two reads.
const BATCH: std::time::Duration = std::time::Duration::from_millis(5);

/// Directory handles resolved to virtual paths, kept up to this many entries.
const RESOLVED_CAP: usize = 65_536;

/// A host route: its virtual prefix and its root directory on the host.
struct Root {
    prefix: VPath,
    host: PathBuf,
    /// Any descriptor on the root's filesystem, for `open_by_handle_at`: a route's root,
    /// held; none for a filesystem mounted beneath one (which is how those are told apart),
    /// opened when needed (a descriptor held on it would keep it from being unmounted).
    fd: Option<OwnedFd>,
    /// That filesystem's id, as events report it.
    fsid: [u8; 8],
}

/// Marks the filesystem holding `host` (`FAN_MARK_FILESYSTEM`) and makes a root seeing it as
/// `prefix`, with no descriptor held (the caller opens one for a route's own root).
fn mark(fanotify: &OwnedFd, prefix: VPath, host: &Path) -> Result<Root, String> {
    let c = CString::new(host.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    let flags = libc::FAN_MARK_ADD | libc::FAN_MARK_FILESYSTEM;
    let ret = unsafe { libc::fanotify_mark(fanotify.as_raw_fd(), flags, EVENTS, libc::AT_FDCWD, c.as_ptr()) };
    if ret < 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } < 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    // `fsid_t` is two ints, as the events' `__kernel_fsid_t`.
    let fsid: [u8; 8] = unsafe { std::mem::transmute(st.f_fsid) };
    Ok(Root { prefix, host: host.to_path_buf(), fd: None, fsid })
}

/// Whether a host file is seen through two roots: one lies inside another on one filesystem.
fn roots_nest(roots: &[Root]) -> bool {
    roots
        .iter()
        .any(|a| roots.iter().any(|b| !std::ptr::eq(a, b) && a.fsid == b.fsid && a.host.starts_with(&b.host)))
}

pub struct HostChanges {
    fanotify: OwnedFd,
    roots: Vec<Root>,
    /// One root lies inside another: a host file is then seen through two routes, and a
    /// change the daemon makes through one must still be invalidated in the other.
    nested: bool,
    /// The host routes, for finding the filesystems mounted beneath their roots.
    routes: Vec<RouteRoot>,
    /// Those mount points, watched or not, with the id of the mount on top of each.
    mounts: HashMap<PathBuf, u64>,
    /// Where beneath the roots a mounted filesystem is not watched.
    pub unwatched: Unwatched,
    /// The daemon's own mountpoint, which may lie beneath a root and is never watched.
    own_mountpoint: Option<PathBuf>,
    /// Events read so far, the daemon's own included (`status` shows it).
    pub events: Arc<AtomicU64>,
}

impl HostChanges {
    /// Starts watching the filesystems of `roots` (virtual prefix, host directory, the cache
    /// lifetime the route has unwatched), and those mounted beneath them, but not at
    /// `own_mountpoint`. Needs CAP_SYS_ADMIN and a filesystem that reports file handles; the
    /// error says which failed.
    pub fn new(roots: &[(VPath, PathBuf, Duration)], own_mountpoint: &Path) -> Result<HostChanges, String> {
        let flags = libc::FAN_CLASS_NOTIF | libc::FAN_CLOEXEC | libc::FAN_REPORT_DFID_NAME;
        let fd = unsafe { libc::fanotify_init(flags, (libc::O_RDONLY | libc::O_CLOEXEC) as u32) };
        if fd < 0 {
            return Err(format!("fanotify_init: {}", std::io::Error::last_os_error()));
        }
        let fanotify = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut watched = Vec::new();
        let mut routes = Vec::new();
        for (prefix, host, unwatched_ttl) in roots {
            let host = host.canonicalize().map_err(|e| format!("{}: {e}", host.display()))?;
            let mut root = mark(&fanotify, prefix.clone(), &host)
                .map_err(|e| format!("watching {}: {e}", host.display()))?;
            // A route's root is held open: it is the route's, and stays mounted anyway.
            root.fd = Some(OwnedFd::from(
                std::fs::File::open(&host).map_err(|e| format!("{}: {e}", host.display()))?,
            ));
            routes.push(RouteRoot {
                prefix: prefix.clone(),
                host: host.clone(),
                unwatched_ttl: *unwatched_ttl,
            });
            watched.push(root);
        }
        let nested = roots_nest(&watched);
        let mut changes = HostChanges {
            fanotify,
            roots: watched,
            nested,
            routes,
            mounts: HashMap::new(),
            unwatched: Unwatched::default(),
            own_mountpoint: own_mountpoint.canonicalize().ok(),
            events: Arc::default(),
        };
        changes.rescan_mounts(None);
        Ok(changes)
    }

    /// Drops the events of a file the daemon itself writes all the time (a sqlite route's
    /// database, its WAL and its shared memory), with an ignore mark on the file: on a watched
    /// filesystem each of its writes was otherwise queued as an event (the kernel encoding a
    /// file handle for it) only to be skipped as the daemon's own. Returns whether the file
    /// got the mark (not when it is missing).
    pub fn ignore_own_file(&self, path: &Path) -> Result<bool, String> {
        let path = match path.canonicalize() {
            Ok(p) => p,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        let c = CString::new(path.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
        let flags = libc::FAN_MARK_ADD | libc::FAN_MARK_IGNORED_MASK | libc::FAN_MARK_IGNORED_SURV_MODIFY;
        let mask = EVENTS & !libc::FAN_ONDIR;
        let ret = unsafe {
            libc::fanotify_mark(self.fanotify.as_raw_fd(), flags, mask, libc::AT_FDCWD, c.as_ptr())
        };
        if ret < 0 {
            return Err(format!("{}: {}", path.display(), std::io::Error::last_os_error()));
        }
        Ok(true)
    }

    /// Reports changes to `observer` from a thread of their own, and calls `overflowed` when
    /// events were lost.
    pub fn start(self, observer: Arc<dyn ChangeObserver>, overflowed: impl Fn() + Send + 'static) {
        std::thread::Builder::new()
            .name("host-changes".into())
            .spawn(move || {
                let mut changes = self;
                changes.run(&*observer, &overflowed)
            })
            .expect("spawning the host-changes thread");
    }

    fn run(&mut self, observer: &dyn ChangeObserver, overflowed: &dyn Fn()) {
        let me = std::process::id() as i32;
        let mut resolved: HashMap<Vec<u8>, Vec<VPath>> = HashMap::new();
        let mut buf = vec![0u8; 64 * 1024];
        // The mount table signals a change with POLLPRI (proc(5)): a filesystem mounted or
        // unmounted beneath a root is then watched or forgotten.
        let mount_table = std::fs::File::open("/proc/self/mountinfo").ok();
        loop {
            let mut fds = [
                libc::pollfd { fd: self.fanotify.as_raw_fd(), events: libc::POLLIN, revents: 0 },
                libc::pollfd {
                    fd: mount_table.as_ref().map_or(-1, |f| f.as_raw_fd()),
                    events: libc::POLLPRI,
                    revents: 0,
                },
            ];
            if unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) } < 0 {
                continue;
            }
            if fds[1].revents & (libc::POLLPRI | libc::POLLERR) != 0 {
                // Read to the end, or poll reports the same change again.
                if let Some(mut table) = mount_table.as_ref() {
                    use std::io::{Read, Seek};
                    let _ = table.seek(std::io::SeekFrom::Start(0));
                    let _ = std::io::copy(&mut table.by_ref(), &mut std::io::sink());
                }
                self.rescan_mounts(Some(observer));
                resolved.clear();
            }
            if fds[0].revents & libc::POLLIN == 0 {
                continue;
            }
            let n = unsafe { libc::read(self.fanotify.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n < 0 {
                if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                tracing::error!(
                    "host changes: {}; host-route caches now expire by TTL only",
                    std::io::Error::last_os_error()
                );
                return;
            }
            // Let events gather before the next read: the daemon's own changes to a watched
            // filesystem (every host-route request) raise events too, and waking for each one
            // cost ~5 context switches per file in an untar. This bounds how late a host
            // change shows through the mount at a few milliseconds.
            let batch_until = std::time::Instant::now() + BATCH;
            for event in Events::new(&buf[..n as usize]) {
                self.events.fetch_add(1, Ordering::Relaxed);
                if event.mask & libc::FAN_Q_OVERFLOW != 0 {
                    resolved.clear();
                    overflowed();
                    continue;
                }
                // The daemon's own changes came through the mount, and the kernel knows them,
                // unless the file is also seen through another route.
                let own = event.pid == me;
                if own && !self.nested {
                    continue;
                }
                // A directory moved or removed: handles may now name other paths.
                if event.mask & libc::FAN_ONDIR != 0
                    && event.mask & (libc::FAN_MOVED_FROM | libc::FAN_MOVED_TO | libc::FAN_DELETE) != 0
                {
                    resolved.clear();
                }
                let Some((dir, name)) = event.dir_and_name else { continue };
                if resolved.len() >= RESOLVED_CAP {
                    resolved.clear();
                }
                if !resolved.contains_key(dir.key) {
                    resolved.insert(dir.key.to_vec(), self.resolve(dir));
                }
                let Some(views) = resolved.get(dir.key) else { continue };
                if own && views.len() < 2 {
                    continue;
                }
                // An event on a directory itself (its mode, owner or times changed) names the
                // directory with the name ".".
                if name == b"." {
                    for dir in views {
                        observer.content_changed(dir);
                    }
                    continue;
                }
                let Ok(name) = VPath::check_name(name) else { continue };
                for dir in views {
                    // A write or chmod leaves the name and the directory as they were:
                    // invalidating them too would make the kernel look the name up again
                    // (every file written through passthrough raises such an event, from the
                    // writing process).
                    if event.mask & NAME_EVENTS == 0 {
                        observer.content_changed(&dir.join(name));
                    } else {
                        observer.changed(&dir.join(name));
                    }
                }
            }
            std::thread::sleep(batch_until.saturating_duration_since(std::time::Instant::now()));
        }
    }

    /// The virtual paths of a directory an event names: one per root that holds it (several
    /// when roots nest), none when it lies outside every root. The handle is opened through
    /// each root on its filesystem, so a filesystem mounted twice (a bind mount beneath a
    /// root) is seen at each place.
    fn resolve(&self, dir: DirHandle<'_>) -> Vec<VPath> {
        // `open_by_handle_at` wants the handle aligned as a `struct file_handle`.
        let mut aligned = vec![0u32; dir.handle.len().div_ceil(4)];
        unsafe {
            std::ptr::copy_nonoverlapping(
                dir.handle.as_ptr(),
                aligned.as_mut_ptr().cast::<u8>(),
                dir.handle.len(),
            )
        };
        let mut paths = Vec::new();
        for root in self.roots.iter().filter(|r| dir.key.starts_with(&r.fsid)) {
            let opened;
            let mount_fd = match &root.fd {
                Some(fd) => fd,
                None => match std::fs::File::open(&root.host) {
                    Ok(file) => {
                        opened = OwnedFd::from(file);
                        &opened
                    }
                    Err(_) => continue,
                },
            };
            let raw = unsafe {
                libc::syscall(
                    libc::SYS_open_by_handle_at,
                    mount_fd.as_raw_fd(),
                    aligned.as_ptr(),
                    libc::O_PATH | libc::O_CLOEXEC,
                )
            };
            if raw < 0 {
                continue;
            }
            let fd = unsafe { OwnedFd::from_raw_fd(raw as i32) };
            let Ok(host) = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())) else { continue };
            if let Some(path) = virtual_path(&root.prefix, &root.host, &host) {
                if !paths.contains(&path) {
                    paths.push(path);
                }
            }
        }
        paths
    }
}

/// `host` seen through the route `prefix` whose root is `root`, if it lies beneath it.
fn virtual_path(prefix: &VPath, root: &Path, host: &Path) -> Option<VPath> {
    let rel = host.strip_prefix(root).ok()?;
    let mut path = prefix.clone();
    for part in rel.components() {
        path = path.join(VPath::check_name(part.as_os_str().as_bytes()).ok()?);
    }
    Some(path)
}

/// One event: its mask, the process that caused it, and the directory and entry name it
/// reports.
struct Event<'a> {
    mask: u64,
    pid: i32,
    dir_and_name: Option<(DirHandle<'a>, &'a [u8])>,
}

/// A directory as an event names it.
#[derive(Clone, Copy)]
struct DirHandle<'a> {
    /// The filesystem id and the handle together: unique across the watched filesystems.
    key: &'a [u8],
    /// `struct file_handle`: 4-byte size, 4-byte type, the bytes.
    handle: &'a [u8],
}

/// The events in one `read` of a fanotify descriptor (`struct fanotify_event_metadata`, each
/// followed by information records).
struct Events<'a> {
    buf: &'a [u8],
}

impl<'a> Events<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Events { buf }
    }
}

impl<'a> Iterator for Events<'a> {
    type Item = Event<'a>;

    fn next(&mut self) -> Option<Event<'a>> {
        const META: usize = std::mem::size_of::<libc::fanotify_event_metadata>();
        if self.buf.len() < META {
            return None;
        }
        let meta: libc::fanotify_event_metadata =
            unsafe { std::ptr::read_unaligned(self.buf.as_ptr().cast()) };
        let len = (meta.event_len as usize).min(self.buf.len());
        if len < META {
            return None;
        }
        let (event, rest) = self.buf.split_at(len);
        self.buf = rest;
        if meta.fd >= 0 {
            // Not a handle-reporting event; close what the kernel opened for us.
            unsafe { libc::close(meta.fd) };
        }
        Some(Event {
            mask: meta.mask,
            pid: meta.pid,
            dir_and_name: dir_and_name(&event[meta.metadata_len as usize..]),
        })
    }
}

/// The `FAN_EVENT_INFO_TYPE_DFID_NAME` record among `records`: the directory and the entry's
/// name.
fn dir_and_name(mut records: &[u8]) -> Option<(DirHandle<'_>, &[u8])> {
    const HEADER: usize = 4;
    const FSID: usize = 8;
    while records.len() >= HEADER {
        let (kind, len) = (records[0], u16::from_ne_bytes([records[2], records[3]]) as usize);
        if len < HEADER || len > records.len() {
            return None;
        }
        let (record, rest) = records.split_at(len);
        records = rest;
        if kind != libc::FAN_EVENT_INFO_TYPE_DFID_NAME {
            continue;
        }
        let fsid_handle_name = record.get(HEADER..)?;
        let size = u32::from_ne_bytes(fsid_handle_name.get(FSID..FSID + 4)?.try_into().ok()?) as usize;
        let (key, name) = fsid_handle_name.split_at_checked(FSID + 8 + size)?;
        let name = CStr::from_bytes_until_nul(name).ok()?.to_bytes();
        return Some((DirHandle { key, handle: &key[FSID..] }, name));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(kind: u8, handle: &[u8], name: &str) -> Vec<u8> {
        let mut body = vec![0u8; 8]; // fsid
        body.extend((handle.len() as u32).to_ne_bytes());
        body.extend(1i32.to_ne_bytes()); // handle type
        body.extend(handle);
        body.extend(name.as_bytes());
        body.push(0);
        let len = 4 + body.len();
        let mut out = vec![kind, 0];
        out.extend((len as u16).to_ne_bytes());
        out.extend(body);
        out
    }

    #[test]
    fn the_dir_record_gives_handle_and_name() {
        let mut records = record(1, b"xxxx", "ignored");
        records.extend(record(libc::FAN_EVENT_INFO_TYPE_DFID_NAME, b"abcdefgh", "file.txt"));
        let (dir, name) = dir_and_name(&records).unwrap();
        assert_eq!(&dir.handle[..4], &8u32.to_ne_bytes());
        assert_eq!(&dir.handle[8..], b"abcdefgh");
        assert_eq!(dir.key.len(), 8 + dir.handle.len());
        assert_eq!(name, b"file.txt");
        assert!(dir_and_name(&records[..3]).is_none());
        assert!(dir_and_name(&record(1, b"x", "n")).is_none());
    }

    #[test]
    fn host_paths_map_beneath_their_root_only() {
        let prefix = VPath::parse("/workspace").unwrap();
        let root = Path::new("/home/u/project");
        let at = |p: &str| virtual_path(&prefix, root, Path::new(p)).map(|v| v.to_string());
        assert_eq!(at("/home/u/project").as_deref(), Some("/workspace"));
        assert_eq!(at("/home/u/project/src/a").as_deref(), Some("/workspace/src/a"));
        assert_eq!(at("/home/u/projects/x"), None);
        assert_eq!(at("/home/u"), None);
    }
}
