//! The agent's home in the tree: made through the mount when missing, and used only when no
//! one but root and the user could have put anything in it or above it (see `doc/run.md`).
//!
//! The program trusts its home (a shell runs `.bashrc`, an agent CLI reads its settings), so a
//! home another user could have planted, or could swap for one of their making (by renaming it,
//! or a directory above it, away), must not be handed to it: the same rule as ssh's
//! `StrictModes`.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use anyhow::{bail, Context, Result};

use super::{in_mount, User};
use crate::vpath::VPath;

/// Who makes the missing directories on the way to the home.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Maker {
    /// This process as it is: the user (started as the user, or under sudo with the effective
    /// ids switched to the user's), so the tree's file modes decide what may be made.
    User,
    /// Root (under sudo, for the default home or one a config of root's names): the
    /// directories above the home are root's, the home is then given to the user.
    Root,
}

/// What makes a directory on the home's way untrustworthy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Flaw {
    /// It belongs to this uid, neither root nor the user.
    Owner(u32),
    /// Its group may write it (rename entries in it, or make the home's name first).
    GroupWritable,
    /// Anyone may write it.
    OtherWritable,
}

/// Whether a directory of owner `uid` and `mode` may be on the way to `user`'s home (`is_home`:
/// it is the home itself). It must be root's or the user's, and no one else's to write; a
/// sticky directory of root's (as `/tmp`) may be writable by all above the home, since no one
/// may rename there what is not theirs, but never as the home (anyone could add files to it).
pub(super) fn flaw(uid: u32, mode: u32, user: u32, is_home: bool) -> Option<Flaw> {
    if uid != 0 && uid != user {
        return Some(Flaw::Owner(uid));
    }
    if uid == 0 && !is_home && mode & libc::S_ISVTX != 0 {
        return None;
    }
    if mode & 0o002 != 0 {
        return Some(Flaw::OtherWritable);
    }
    if mode & 0o020 != 0 {
        return Some(Flaw::GroupWritable);
    }
    None
}

/// `uid N (name)`, the name when the user database has one.
fn who(uid: u32) -> String {
    match nix::unistd::User::from_uid(uid.into()).ok().flatten() {
        Some(u) => format!("uid {uid} ({})", u.name),
        None => format!("uid {uid}"),
    }
}

/// Why `run` refuses `home`: the directory `at` (shown at `host` through the mount) of owner
/// `uid` and `mode` has `flaw`, `user` being the user it runs as.
pub(super) fn refusal(
    home: &VPath,
    at: &VPath,
    host: &Path,
    (uid, mode): (u32, u32),
    flaw: Flaw,
    user: u32,
) -> String {
    let is_home = at == home;
    let what = match (is_home, at.is_root()) {
        (true, _) => "the home itself".to_string(),
        (false, true) => "the tree's root /, above it,".to_string(),
        (false, false) => format!("{at}, above it,"),
    };
    let host = crate::display::escape(&host.to_string_lossy()).to_string();
    let (fault, fix) = match (flaw, is_home) {
        (Flaw::Owner(_), true) => (
            "so its owner may have put files in it (start-up files such as .bashrc or .profile, an \
             agent's settings) that the program would trust",
            format!(
                "Move it away as root (`sudo mv {host} {host}.untrusted`), look at what is in it before \
                 using any of it, and run again through sudo for a fresh home"
            ),
        ),
        (Flaw::Owner(_), false) => (
            "so its owner could rename what is in it and put a home of their own making in its place",
            format!("Give it to root (`sudo chown root: {host}`), or set [run] home elsewhere"),
        ),
        (_, true) => (
            "so others may put files in it (start-up files such as .bashrc or .profile, an agent's \
             settings) that the program would trust",
            format!("Check what is in it, then `sudo chmod go-w {host}`; or set [run] home elsewhere"),
        ),
        (_, false) => (
            "so others could rename what is in it and put a home of their own making in its place",
            format!("Take the write permission away (`sudo chmod go-w {host}`), or set [run] home elsewhere"),
        ),
    };
    let whose = match flaw {
        Flaw::Owner(o) => format!("belongs to {}", who(o)),
        Flaw::GroupWritable => format!("belongs to {} and its group may write it", who(uid)),
        Flaw::OtherWritable => format!("belongs to {} and anyone may write it", who(uid)),
    };
    format!(
        "HOME {home}: {what} {whose} (mode {:04o}), {fault}. agentvfs run uses a home only when it and every \
         directory above it in the tree belong to root or to this user ({}) and no one else may write them \
         (a sticky directory of root's above the home aside, as /tmp). {fix}",
        mode & 0o7777,
        who(user)
    )
}

/// Opens the directory `name` (relative to `at`, or as it is), never through a symlink.
fn open_dir(at: Option<&OwnedFd>, name: &Path) -> nix::Result<OwnedFd> {
    use nix::fcntl::{openat, OFlag};
    let flags = OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_RDONLY;
    // SAFETY: openat returns a new descriptor that nothing else owns.
    openat(at.map(|fd| fd.as_raw_fd()), name, flags, nix::sys::stat::Mode::empty())
        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Makes `home` (and missing parents) through the mount, as `maker` says, and refuses it unless
/// it and every directory above it in the tree pass [`flaw`] (each looked at through the
/// descriptor the walk holds, so what is judged is what is used). Made by root, the parents
/// are root's (0755) and the home is given to `user` (0700); made by the user, they are the
/// user's. An existing home that passes is left as it is.
pub(super) fn ensure_home(mountpoint: &Path, home: &VPath, user: &User, maker: Maker) -> Result<()> {
    use nix::sys::stat::{fchmod, fstat, mkdirat, Mode};
    // Walked one directory descriptor at a time, never following a symlink: as root, a name
    // another session's program swapped for a link must not lead the mkdir or the chown out
    // of the tree (the mountpoint's own path is the caller's, and trusted).
    let mut dir = open_dir(None, mountpoint).with_context(|| format!("opening {}", mountpoint.display()))?;
    let mut at = VPath::root();
    let check = |dir: &OwnedFd, at: &VPath| -> Result<()> {
        let stat = fstat(dir.as_raw_fd())
            .map_err(std::io::Error::from)
            .with_context(|| format!("HOME {home}: {at}"))?;
        let (uid, mode) = (stat.st_uid, stat.st_mode);
        if let Some(f) = flaw(uid, mode, user.uid, at == home) {
            // (The tree's root is the mountpoint itself, without a trailing slash.)
            let host = if at.is_root() { mountpoint.to_path_buf() } else { in_mount(mountpoint, at) };
            bail!("{}", refusal(home, at, &host, (uid, mode), f, user.uid));
        }
        Ok(())
    };
    check(&dir, &at)?;
    for part in home.components() {
        at = at.join(part);
        let mode = if at == *home { 0o700 } else { 0o755 };
        let made = match mkdirat(Some(dir.as_raw_fd()), part, Mode::from_bits_truncate(mode)) {
            Ok(()) => true,
            Err(nix::errno::Errno::EEXIST) => false,
            Err(e) => bail!(
                "cannot create HOME {home} in the tree: mkdir {at}: {}. Create it once as root (`sudo agentvfs \
                 run ...` from this user's shell does, for the default home or one a config of root's names, \
                 and gives it to the user), or set [run] home to a directory this user may create (e.g. \
                 under a host route the user owns)",
                std::io::Error::from(e)
            ),
        };
        dir = match open_dir(Some(&dir), Path::new(part)) {
            Ok(next) => next,
            Err(nix::errno::Errno::ENOTDIR | nix::errno::Errno::ELOOP) => bail!(
                "HOME {home}: {at} exists in the tree and is not a directory; set [run] home to another path"
            ),
            Err(e) => bail!("HOME {home}: cannot look at {at}: {}", std::io::Error::from(e)),
        };
        if made {
            // The mode asked for, whatever the umask took away or left (a umask of 002 would
            // leave the parents writable by their group, and refused).
            fchmod(dir.as_raw_fd(), Mode::from_bits_truncate(mode))
                .map_err(std::io::Error::from)
                .with_context(|| format!("HOME {home}: chmod {at}"))?;
        }
        if made && maker == Maker::Root && at == *home {
            nix::unistd::fchown(dir.as_raw_fd(), Some(user.uid.into()), Some(user.gid.into()))
                .map_err(std::io::Error::from)
                .with_context(|| format!("giving HOME {home} to uid {}", user.uid))?;
        }
        check(&dir, &at)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_root_and_the_user_may_own_or_write_the_way_to_the_home() {
        let me = 1000;
        // Above the home.
        assert_eq!(flaw(0, 0o40755, me, false), None);
        assert_eq!(flaw(me, 0o40755, me, false), None);
        assert_eq!(flaw(me, 0o40700, me, false), None);
        assert_eq!(flaw(1001, 0o40755, me, false), Some(Flaw::Owner(1001)));
        assert_eq!(flaw(1001, 0o41777, me, false), Some(Flaw::Owner(1001)));
        assert_eq!(flaw(0, 0o40775, me, false), Some(Flaw::GroupWritable));
        assert_eq!(flaw(0, 0o40777, me, false), Some(Flaw::OtherWritable));
        assert_eq!(flaw(0, 0o40757, me, false), Some(Flaw::OtherWritable));
        assert_eq!(flaw(me, 0o40770, me, false), Some(Flaw::GroupWritable));
        // root's sticky directory (as /tmp) above the home; the user's is not enough (its
        // owner is trusted, but a sticky bit is kept only for root's).
        assert_eq!(flaw(0, 0o41777, me, false), None);
        assert_eq!(flaw(me, 0o41777, me, false), Some(Flaw::OtherWritable));
        // The home itself.
        assert_eq!(flaw(me, 0o40700, me, true), None);
        assert_eq!(flaw(me, 0o40755, me, true), None);
        assert_eq!(flaw(0, 0o40755, me, true), None);
        assert_eq!(flaw(1001, 0o40700, me, true), Some(Flaw::Owner(1001)));
        assert_eq!(flaw(0, 0o41777, me, true), Some(Flaw::OtherWritable));
        assert_eq!(flaw(me, 0o40702, me, true), Some(Flaw::OtherWritable));
    }

    #[test]
    fn a_refusal_names_the_directory_its_owner_and_mode_and_what_to_do() {
        let v = |s: &str| VPath::parse(s).unwrap();
        let (home, mnt) = (v("/home/me"), Path::new("/mnt/agent/home"));
        let text = refusal(&home, &v("/home"), mnt, (4242424, 0o40755), Flaw::Owner(4242424), 4242425);
        assert_eq!(
            text,
            "HOME /home/me: /home, above it, belongs to uid 4242424 (mode 0755), so its owner could rename \
             what is in it and put a home of their own making in its place. agentvfs run uses a home only \
             when it and every directory above it in the tree belong to root or to this user (uid 4242425) \
             and no one else may write them (a sticky directory of root's above the home aside, as /tmp). \
             Give it to root (`sudo chown root: /mnt/agent/home`), or set [run] home elsewhere"
        );
        let mnt = Path::new("/mnt/agent/home/me");
        let text = refusal(&home, &home, mnt, (4242425, 0o40770), Flaw::GroupWritable, 4242425);
        assert!(
            text.starts_with(
                "HOME /home/me: the home itself belongs to uid 4242425 and its group may write it (mode 0770), \
                 so others may put files in it"
            ),
            "{text}"
        );
        assert!(
            text.ends_with(
                "Check what is in it, then `sudo chmod go-w /mnt/agent/home/me`; or set [run] home elsewhere"
            ),
            "{text}"
        );
        let text = refusal(&home, &home, mnt, (4242424, 0o40700), Flaw::Owner(4242424), 4242425);
        assert!(
            text.contains("the home itself belongs to uid 4242424 (mode 0700), so its owner may have put"),
            "{text}"
        );
        assert!(text.contains("`sudo mv /mnt/agent/home/me /mnt/agent/home/me.untrusted`"), "{text}");
        assert!(!text.contains("  "), "{text}");
        let text =
            refusal(&home, &VPath::root(), Path::new("/mnt/agent"), (0, 0o40777), Flaw::OtherWritable, 1);
        assert!(
            text.starts_with(
                "HOME /home/me: the tree's root /, above it, belongs to uid 0 (root) and anyone may write it \
                 (mode 0777), so others could rename"
            ),
            "{text}"
        );
        assert!(text.ends_with("(`sudo chmod go-w /mnt/agent`), or set [run] home elsewhere"), "{text}");
    }
}
