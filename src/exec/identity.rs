//! Who `execute`'s commands run as: `[exec] uid`/`gid` when set, else the user who owns the
//! work (the one who started the daemon through sudo, else the owner of the first host
//! route's root), else nobody; never root. One function decides, and the same answer, with
//! its reason, is what the sandbox uses and what `check`, `status` and the daemon's start say.

use std::os::unix::fs::MetadataExt;

use crate::backend::{Backend, Caller, FileKind, SetAttr};
use crate::config::{BackendConfig, RouteConfig};
use crate::error::FsResult;
use crate::vpath::VPath;

/// `nobody` / `nogroup`: the identity when no user owns the work (or only root does).
pub const NOBODY: u32 = 65534;

/// Where one half (uid or gid) of the identity came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// `[exec] uid` / `[exec] gid`.
    Config,
    /// `SUDO_UID` / `SUDO_GID` in the daemon's environment.
    Sudo,
    /// The owner of this host route's root directory.
    HostRoot(VPath),
    /// Nobody, and why no user was found.
    Nobody(Fallback),
}

/// Why the identity fell back to nobody.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fallback {
    /// No host route (and no sudo user).
    NoHostRoute,
    /// The first host route's root belongs to root.
    RootOwned(VPath),
    /// The user found belongs to group root, which is never taken as a default (gid only).
    GroupRoot,
}

/// The uid and gid the sandbox switches to, and where each came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
    pub uid_from: Origin,
    pub gid_from: Origin,
}

impl Origin {
    fn describe(&self, half: &str) -> String {
        match self {
            Origin::Config => format!("[exec] {half}"),
            Origin::Sudo => format!("from SUDO_{}", half.to_uppercase()),
            Origin::HostRoot(route) => format!("owner of {route}'s root"),
            Origin::Nobody(Fallback::NoHostRoute) => "nobody: no sudo user and no host route".to_string(),
            Origin::Nobody(Fallback::RootOwned(route)) => {
                format!("nobody: no sudo user and {route}'s root belongs to root")
            }
            Origin::Nobody(Fallback::GroupRoot) => "nogroup rather than group root".to_string(),
        }
    }
}

impl std::fmt::Display for Identity {
    /// `uid 1000, gid 1000 (from SUDO_UID/SUDO_GID)`, or each half with its own reason.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (u, g) = (self.uid_from.describe("uid"), self.gid_from.describe("gid"));
        match (&self.uid_from, &self.gid_from) {
            (Origin::Sudo, Origin::Sudo) => {
                write!(f, "uid {}, gid {} (from SUDO_UID/SUDO_GID)", self.uid, self.gid)
            }
            (Origin::Config, Origin::Config) => {
                write!(f, "uid {}, gid {} ([exec] uid/gid)", self.uid, self.gid)
            }
            (a, b) if a == b => write!(f, "uid {}, gid {} ({u})", self.uid, self.gid),
            _ => write!(f, "uid {} ({u}), gid {} ({g})", self.uid, self.gid),
        }
    }
}

impl Identity {
    /// The identity for `[exec] uid`/`gid` (`None` when unset): each given half wins; the
    /// other comes from `sudo` (`SUDO_UID`/`SUDO_GID`, when the uid is not root), else from
    /// `host_root` (the first host route and its root's owner, when that is not root), else
    /// it is nobody. A group root found this way is replaced by nogroup. Nothing here yields
    /// uid 0 unless `explicit_uid` says so (the config refuses that before asking).
    pub fn resolve(
        explicit_uid: Option<u32>,
        explicit_gid: Option<u32>,
        sudo: Option<(u32, u32)>,
        host_root: Option<(&VPath, u32, u32)>,
    ) -> Identity {
        let (uid, gid, from) = match (sudo, host_root) {
            (Some((uid, gid)), _) if uid != 0 => (uid, gid, Origin::Sudo),
            (_, Some((route, uid, gid))) if uid != 0 => (uid, gid, Origin::HostRoot(route.clone())),
            (_, Some((route, ..))) => (NOBODY, NOBODY, Origin::Nobody(Fallback::RootOwned(route.clone()))),
            (_, None) => (NOBODY, NOBODY, Origin::Nobody(Fallback::NoHostRoute)),
        };
        let (gid, gid_from) = match gid {
            0 => (NOBODY, Origin::Nobody(Fallback::GroupRoot)),
            _ => (gid, from.clone()),
        };
        let (uid, uid_from) = match explicit_uid {
            Some(uid) => (uid, Origin::Config),
            None => (uid, from),
        };
        let (gid, gid_from) = match explicit_gid {
            Some(gid) => (gid, Origin::Config),
            None => (gid, gid_from),
        };
        Identity { uid, gid, uid_from, gid_from }
    }

    /// [`Identity::resolve`] with the daemon's environment and the routes' host roots.
    pub fn for_routes(
        explicit_uid: Option<u32>,
        explicit_gid: Option<u32>,
        routes: &[RouteConfig],
    ) -> Identity {
        Identity::with_sudo(explicit_uid, explicit_gid, sudo_from_env(), routes)
    }

    /// [`Identity::resolve`] with `sudo` and the routes' host roots.
    pub fn with_sudo(
        explicit_uid: Option<u32>,
        explicit_gid: Option<u32>,
        sudo: Option<(u32, u32)>,
        routes: &[RouteConfig],
    ) -> Identity {
        let owner = first_host_owner(routes);
        let host = owner.as_ref().map(|(route, uid, gid)| (route, *uid, *gid));
        Identity::resolve(explicit_uid, explicit_gid, sudo, host)
    }

    /// The user who owns the work (the sudo user, else the first host root's owner), when
    /// one is found: the default agent and approver too ([`crate::control::roles`]).
    pub fn work_owner(&self) -> Option<u32> {
        matches!(self.uid_from, Origin::Sudo | Origin::HostRoot(_)).then_some(self.uid)
    }
}

/// `SUDO_UID`/`SUDO_GID` of this process, when both are numbers.
pub fn sudo_from_env() -> Option<(u32, u32)> {
    let number = |name: &str| std::env::var(name).ok()?.trim().parse::<u32>().ok();
    Some((number("SUDO_UID")?, number("SUDO_GID")?))
}

/// The first host route (in config order, `/` first) and its root's owner. A root that cannot
/// be stat'ed counts as root's (the config has already checked that it exists).
fn first_host_owner(routes: &[RouteConfig]) -> Option<(VPath, u32, u32)> {
    routes.iter().find_map(|r| match &r.backend {
        BackendConfig::Host { root } => {
            let (uid, gid) = std::fs::metadata(root).map(|m| (m.uid(), m.gid())).unwrap_or((0, 0));
            Some((r.path.clone(), uid, gid))
        }
        _ => None,
    })
}

/// Hands the root directory of a memory or sqlite route to the sandbox's user, so commands
/// can create entries in it: only while the root is as the daemon made it (a directory of
/// the daemon's own uid and gid, mode 0755), so an owner or mode someone chose stays. Returns
/// whether it changed anything.
pub fn hand_over_root(backend: &dyn Backend, identity: &Identity) -> FsResult<bool> {
    let me = Caller::daemon();
    let root = backend.getattr("")?;
    let untouched =
        root.kind == FileKind::Dir && (root.uid, root.gid) == (me.uid, me.gid) && root.perm == 0o755;
    if !untouched || (identity.uid, identity.gid) == (me.uid, me.gid) {
        return Ok(false);
    }
    let changes = SetAttr { uid: Some(identity.uid), gid: Some(identity.gid), ..SetAttr::default() };
    backend.setattr("", &changes)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::memory::MemoryBackend;

    fn ws() -> VPath {
        VPath::parse("/workspace").unwrap()
    }

    #[test]
    fn sudo_then_the_workspace_owner_then_nobody() {
        let ws = ws();
        let id = Identity::resolve(None, None, Some((1000, 1001)), Some((&ws, 33, 33)));
        assert_eq!((id.uid, id.gid, &id.uid_from, &id.gid_from), (1000, 1001, &Origin::Sudo, &Origin::Sudo));
        assert_eq!(id.to_string(), "uid 1000, gid 1001 (from SUDO_UID/SUDO_GID)");
        // sudo from a root shell names root: the workspace's owner is next.
        let id = Identity::resolve(None, None, Some((0, 0)), Some((&ws, 33, 34)));
        assert_eq!((id.uid, id.gid, &id.uid_from), (33, 34, &Origin::HostRoot(ws.clone())));
        assert_eq!(id.to_string(), "uid 33, gid 34 (owner of /workspace's root)");
        let id = Identity::resolve(None, None, None, Some((&ws, 0, 0)));
        assert_eq!((id.uid, id.gid), (NOBODY, NOBODY));
        assert_eq!(
            id.to_string(),
            "uid 65534, gid 65534 (nobody: no sudo user and /workspace's root belongs to root)"
        );
        let id = Identity::resolve(None, None, None, None);
        assert_eq!((id.uid, id.gid), (NOBODY, NOBODY));
        assert_eq!(id.to_string(), "uid 65534, gid 65534 (nobody: no sudo user and no host route)");
    }

    #[test]
    fn the_config_wins_each_half_and_group_root_is_never_guessed() {
        let ws = ws();
        let id = Identity::resolve(Some(1000), Some(100), Some((5, 5)), Some((&ws, 33, 33)));
        assert_eq!((id.uid, id.gid), (1000, 100));
        assert_eq!(id.to_string(), "uid 1000, gid 100 ([exec] uid/gid)");
        let id = Identity::resolve(Some(1000), None, Some((5, 6)), None);
        assert_eq!((id.uid, id.gid), (1000, 6));
        assert_eq!(id.to_string(), "uid 1000 ([exec] uid), gid 6 (from SUDO_GID)");
        let id = Identity::resolve(None, None, None, Some((&ws, 33, 0)));
        assert_eq!((id.uid, id.gid), (33, NOBODY));
        assert_eq!(
            id.to_string(),
            "uid 33 (owner of /workspace's root), gid 65534 (nogroup rather than group root)"
        );
        let id = Identity::resolve(None, None, Some((1000, 0)), None);
        assert_eq!((id.uid, id.gid), (1000, NOBODY));
    }

    #[test]
    fn only_a_root_as_the_daemon_made_it_is_handed_over() {
        let me = Caller::daemon();
        let id = Identity::resolve(None, None, Some((me.uid + 4242, me.gid + 4242)), None);
        let fresh = MemoryBackend::new(None);
        assert!(hand_over_root(&fresh, &id).unwrap());
        let root = fresh.getattr("").unwrap();
        assert_eq!((root.uid, root.gid, root.perm), (id.uid, id.gid, 0o755));
        // Handed over already, or chosen otherwise: left alone.
        assert!(!hand_over_root(&fresh, &id).unwrap());
        let chosen = MemoryBackend::new(None);
        chosen.setattr("", &SetAttr { mode: Some(0o700), ..SetAttr::default() }).unwrap();
        assert!(!hand_over_root(&chosen, &id).unwrap());
        assert_eq!(chosen.getattr("").unwrap().uid, me.uid);
        // The daemon's own identity needs nothing.
        let mine = Identity::resolve(Some(me.uid), Some(me.gid), None, None);
        assert!(!hand_over_root(&MemoryBackend::new(None), &mine).unwrap());
    }
}
