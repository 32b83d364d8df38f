//! Whether the program inside `agentvfs run` could change the `--config` file of the next
//! run: through the tree, under every path a mount gives the file.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

use super::{in_mount, virtual_cwd};
use crate::vpath::VPath;

/// Refuses a `--config` file the program could change: it says which socket, home, variables
/// and network the next `agentvfs run` gives its program, so a program that may rewrite it
/// would choose its own next sandbox. Out of reach means not in the tree (outside the mount and
/// every host route), hidden there (the daemon hides its own config), or not writable there:
/// by the rules (a deny, or an interrupt, which a human answers) or by the user's permissions
/// on the file and on every directory on its way. Run with the user's (effective) ids.
pub(super) fn config_out_of_reach(
    file: &Path,
    socket: &Path,
    mountpoint: &Path,
    mount_real: &Path,
    hosts: &[(VPath, PathBuf)],
) -> Result<()> {
    // As written and where its links lead (a link in the tree to a file outside it could be
    // pointed elsewhere by the program as well), and wherever a mount shows the same file (a
    // directory bind-mounted under a host route's root, which the route follows).
    let real = file.canonicalize().unwrap_or_else(|_| file.to_path_buf());
    let mut spellings = vec![file.to_path_buf(), real.clone()];
    spellings.extend(
        std::fs::read_to_string("/proc/self/mountinfo")
            .map(|m| other_spellings(&real, &m))
            .unwrap_or_default(),
    );
    for spelling in &spellings {
        config_spelling_out_of_reach(file, spelling, socket, mountpoint, mount_real, hosts)?;
    }
    Ok(())
}

/// [`config_out_of_reach`] for one spelling of the file's path.
fn config_spelling_out_of_reach(
    file: &Path,
    spelling: &Path,
    socket: &Path,
    mountpoint: &Path,
    mount_real: &Path,
    hosts: &[(VPath, PathBuf)],
) -> Result<()> {
    use nix::fcntl::AtFlags;
    use nix::unistd::{faccessat, AccessFlags};
    let Some(at) = virtual_cwd(spelling, mount_real, hosts) else { return Ok(()) };
    let inside = in_mount(mountpoint, &at);
    if std::fs::symlink_metadata(&inside).is_err() {
        return Ok(());
    }
    let params = serde_json::json!({"operation": "write", "path": at.as_str()});
    let verdict = super::connect(socket)?.call("vfs/explain", Some(params))?;
    if verdict["decision"] != "allow" {
        return Ok(());
    }
    // Writing the file, or a directory on its way (where it, or a directory holding it, could
    // be renamed away and made again), changes it. Asked with the effective ids: under sudo
    // this runs before root's are dropped, with the user's switched in (see `run`).
    let writable = |p: &Path| faccessat(None, p, AccessFlags::W_OK, AtFlags::AT_EACCESS).is_ok();
    if !writable(&inside) && !at.ancestors().any(|a| writable(&in_mount(mountpoint, &a))) {
        return Ok(());
    }
    bail!(
        "the config file {} is {} in the tree, and the program could change it (and with it what the next \
         `agentvfs run` gives its program: socket, home, environment, network). Keep it outside the tree, \
         or deny writes to it with a rule",
        crate::display::escape(&file.to_string_lossy()),
        crate::display::escape(at.as_str())
    )
}

/// A mount of `/proc/self/mountinfo`: its device, the directory of that file system it shows
/// (`root`), and where.
struct Mount {
    id: u64,
    device: (u32, u32),
    root: PathBuf,
    at: PathBuf,
}

/// The mounts `mountinfo` lists (paths unescaped: the kernel writes space, tab, newline and
/// backslash as `\ooo`).
fn mounts(mountinfo: &str) -> Vec<Mount> {
    let unescape = |field: &str| -> PathBuf {
        let bytes = field.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            let octal = bytes
                .get(i + 1..i + 4)
                .and_then(|d| u8::from_str_radix(std::str::from_utf8(d).ok()?, 8).ok());
            match (bytes[i], octal) {
                (b'\\', Some(byte)) => {
                    out.push(byte);
                    i += 4;
                }
                (byte, _) => {
                    out.push(byte);
                    i += 1;
                }
            }
        }
        PathBuf::from(<std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(out))
    };
    mountinfo
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let id = fields.next()?.parse().ok()?;
            let (major, minor) = fields.nth(1)?.split_once(':')?;
            let device = (major.parse().ok()?, minor.parse().ok()?);
            Some(Mount { id, device, root: unescape(fields.next()?), at: unescape(fields.next()?) })
        })
        .collect()
}

/// Every other path under which a mount of `mountinfo` shows the file at `real` (a canonical
/// path): the file's path within its file system, from the mount that holds it, under each
/// mount of the same device whose root holds that path.
fn other_spellings(real: &Path, mountinfo: &str) -> Vec<PathBuf> {
    let all = mounts(mountinfo);
    // The mount that holds the file, by its id; where `statx` cannot say, the last listed (the
    // topmost) of the longest mountpoint of the file's device (which a btrfs subvolume's
    // `st_dev` does not match: the id is the sure answer).
    let by_id = mount_id(real).and_then(|id| all.iter().find(|m| m.id == id));
    let by_device = || {
        let meta = std::fs::metadata(real).ok()?;
        let device = (libc::major(meta.dev()), libc::minor(meta.dev()));
        all.iter()
            .filter(|m| m.device == device && real.starts_with(&m.at))
            .max_by_key(|m| m.at.components().count())
    };
    let Some(holder) = by_id.or_else(by_device) else { return Vec::new() };
    let device = holder.device;
    let Ok(rest) = real.strip_prefix(&holder.at) else { return Vec::new() };
    let in_fs = holder.root.join(rest);
    all.iter()
        .filter(|m| m.device == device)
        .filter_map(|m| Some(m.at.join(in_fs.strip_prefix(&m.root).ok()?)))
        .filter(|p| p != real)
        .collect()
}

/// The id of the mount that holds `path` (`statx`'s `stx_mnt_id`: mountinfo's first field).
fn mount_id(path: &Path) -> Option<u64> {
    let path = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str())).ok()?;
    // SAFETY: `path` is a valid C string and `out` a zeroed statx the call fills.
    unsafe {
        let mut out: libc::statx = std::mem::zeroed();
        let done = libc::statx(libc::AT_FDCWD, path.as_ptr(), 0, libc::STATX_MNT_ID, &mut out);
        (done == 0 && out.stx_mask & libc::STATX_MNT_ID != 0).then_some(out.stx_mnt_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines_are_read_with_their_escapes() {
        let info = "36 35 98:0 /mnt1 /mnt/parent\\040dir rw,noatime master:1 - ext3 /dev/root rw\n\
                    37 36 8:1 / / rw - ext4 /dev/sda1 rw\n";
        let m = mounts(info);
        assert_eq!(m.len(), 2);
        assert_eq!((m[0].id, m[1].id), (36, 37));
        assert_eq!(
            (m[0].device, m[0].root.as_path(), m[0].at.as_path()),
            ((98, 0), Path::new("/mnt1"), Path::new("/mnt/parent dir"))
        );
        assert_eq!((m[1].device, m[1].at.as_path()), ((8, 1), Path::new("/")));
    }
}
