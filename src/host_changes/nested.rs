//! Filesystems mounted beneath a host route's root (a tmpfs, a bind mount, another disk): the
//! watch on the root's filesystem does not see them, so each is watched on its own, found in
//! `/proc/self/mountinfo` at start and again whenever the mount table changes. One that
//! cannot be watched (no file handles) keeps the route's short cache lifetime beneath it.

use std::collections::HashMap;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use super::{virtual_path, HostChanges};
use crate::engine::ChangeObserver;
use crate::mountinfo::unescape;
use crate::vpath::VPath;

/// Virtual paths beneath which a mounted filesystem is not watched, each with the cache
/// lifetime its route has unwatched (`Engine::ttl` reads it).
pub type Unwatched = Arc<ArcSwap<Vec<(VPath, Duration)>>>;

/// A host route as the watcher knows it.
pub(super) struct RouteRoot {
    pub prefix: VPath,
    /// Canonical.
    pub host: PathBuf,
    /// Its cache lifetime were it not watched.
    pub unwatched_ttl: Duration,
}

/// The mount points strictly beneath `root` in a `mountinfo` text (field 5, with `\ooo`
/// escapes for space, tab, newline and backslash), each with the id of the mount on top there
/// (field 1; mounts stacked on one point are listed in the order made, the top one last).
pub(super) fn mounts_beneath(mountinfo: &str, root: &Path) -> HashMap<PathBuf, u64> {
    let mut found = HashMap::new();
    for line in mountinfo.lines() {
        let mut fields = line.split(' ');
        let (Some(id), Some(point)) = (fields.next(), fields.nth(3)) else { continue };
        let (Ok(id), point) =
            (id.parse::<u64>(), PathBuf::from(std::ffi::OsString::from_vec(unescape(point))))
        else {
            continue;
        };
        if point != root && point.starts_with(root) {
            found.insert(point, id);
        }
    }
    found
}

impl HostChanges {
    /// Brings the watched mounts beneath the roots up to date with the mount table: a new one
    /// is watched (or, failing that, its path keeps the short cache lifetime), a gone one is
    /// forgotten, and the kernel is told that each such path changed (what it cached there
    /// belonged to the filesystem before). The daemon's own mountpoint is left alone.
    pub(super) fn rescan_mounts(&mut self, observer: Option<&dyn ChangeObserver>) {
        let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else { return };
        let mut now: HashMap<PathBuf, (u64, Vec<VPath>)> = HashMap::new();
        for route in &self.routes {
            for (point, id) in mounts_beneath(&mountinfo, &route.host) {
                if Some(&point) == self.own_mountpoint.as_ref() {
                    continue;
                }
                if let Some(path) = virtual_path(&route.prefix, &route.host, &point) {
                    // Seen through each route whose root holds it (roots may nest).
                    now.entry(point).or_insert((id, Vec::new())).1.push(path);
                }
            }
        }
        // Gone, or another mount on top there now (stacked, moved, or unmounted and mounted
        // again between two looks): what was watched there is forgotten.
        let gone: Vec<PathBuf> = self
            .mounts
            .iter()
            .filter(|(point, id)| now.get(*point).is_none_or(|(now_id, _)| now_id != *id))
            .map(|(point, _)| point.clone())
            .collect();
        let mut changed = Vec::new();
        let mut unwatched: Vec<(VPath, Duration)> = self.unwatched.load().to_vec();
        for point in gone {
            self.mounts.remove(&point);
            self.roots.retain(|r| !(r.fd.is_none() && r.host == point));
            for path in self.routes.iter().filter_map(|r| virtual_path(&r.prefix, &r.host, &point)) {
                unwatched.retain(|(p, _)| *p != path);
            }
            changed.push(point);
        }
        for (point, (id, paths)) in &now {
            if self.mounts.contains_key(point) {
                continue;
            }
            for path in paths {
                match super::mark(&self.fanotify, path.clone(), point) {
                    Ok(root) => self.roots.push(root),
                    Err(e) => {
                        let ttl =
                            self.routes.iter().find(|r| path.starts_with(&r.prefix)).map(|r| r.unwatched_ttl);
                        let ttl = ttl.unwrap_or(Duration::from_secs(1));
                        tracing::warn!(
                            "host changes: the filesystem mounted at {} cannot be watched ({e}); {} keeps a {}s cache lifetime",
                            crate::display::Escaped(&point.display().to_string()),
                            crate::display::Escaped(path.as_str()),
                            ttl.as_secs_f64()
                        );
                        unwatched.push((path.clone(), ttl));
                    }
                }
            }
            self.mounts.insert(point.clone(), *id);
            changed.push(point.clone());
        }
        self.unwatched.store(Arc::new(unwatched));
        self.nested = super::roots_nest(&self.roots);
        if let Some(observer) = observer {
            for point in changed {
                for route in &self.routes {
                    if let Some(path) = virtual_path(&route.prefix, &route.host, &point) {
                        observer.changed(&path);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_points_beneath_a_root_are_read_from_mountinfo() {
        let mountinfo = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
40 22 0:35 / /home/u/project rw shared:2 - ext4 /dev/sdb1 rw
41 40 0:36 / /home/u/project/cache rw shared:3 - tmpfs t rw
42 40 0:37 / /home/u/project/with\\040space rw shared:4 - tmpfs t rw
43 22 0:38 / /home/u/projects rw shared:5 - tmpfs t rw
44 41 0:39 / /home/u/project/cache rw shared:6 - tmpfs t rw
";
        let found = mounts_beneath(mountinfo, Path::new("/home/u/project"));
        let want =
            [(PathBuf::from("/home/u/project/cache"), 44), (PathBuf::from("/home/u/project/with space"), 42)];
        assert_eq!(found, want.into_iter().collect::<HashMap<_, _>>(), "the top mount of a stack");
    }
}
