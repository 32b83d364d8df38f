//! Roles at the control door: who may use which of the daemon's two sockets, and which
//! methods each socket serves.
//!
//! The **agent socket** serves what an agent needs to work (the tools, the path mappings and
//! their prompt, explain); the **control socket** serves everything, and is the approvers':
//! they answer interrupts and operate the daemon (reload, status). `[control]` maps users and
//! groups to roles: `agents` may use the agent socket, `approvers` the control socket. Root
//! may always use both, and so may the daemon's own user (who owns the daemon's memory, and
//! so every answer, anyway). A list the file leaves out holds the *default user*: the one who
//! started the daemon through sudo (`SUDO_UID`), else the owner of the first host route's
//! root, else the daemon's own user. Peers are told apart by their credentials at connect
//! time: SO_PEERCRED's uid and gid, and SO_PEERGROUPS' supplementary groups.

use std::fmt;
use std::path::Path;

use serde_json::{json, Value};

use crate::config::{ControlConfig, RouteConfig};
use crate::control::proto::{self, RpcError};
pub use crate::engine::Socket;

/// A user or a group that a role list names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Member {
    User { uid: u32, name: String },
    Group { gid: u32, name: String },
}

impl Member {
    /// `alice` or `group:wheel`, looked up in the user and group databases (getpwnam,
    /// getgrnam). The error says what is wrong, without the config key.
    pub fn lookup(text: &str) -> Result<Member, String> {
        if let Some(name) = text.strip_prefix("group:") {
            if name.is_empty() {
                return Err(format!("{text:?} names no group (write \"group:NAME\")"));
            }
            return match nix::unistd::Group::from_name(name) {
                Ok(Some(group)) => Ok(Member::Group { gid: group.gid.as_raw(), name: name.to_string() }),
                Ok(None) => Err(format!("unknown group {name:?}")),
                Err(e) => Err(format!("cannot look up group {name:?}: {e}")),
            };
        }
        if text.is_empty() {
            return Err("an empty user name".to_string());
        }
        match nix::unistd::User::from_name(text) {
            Ok(Some(user)) => Ok(Member::User { uid: user.uid.as_raw(), name: text.to_string() }),
            Ok(None) => Err(format!("unknown user {text:?} (a group is written \"group:NAME\")")),
            Err(e) => Err(format!("cannot look up user {text:?}: {e}")),
        }
    }

    /// The user with `uid`, named as the user database names it (`uid N` without an entry).
    pub fn user(uid: u32) -> Member {
        let name = match nix::unistd::User::from_uid(uid.into()) {
            Ok(Some(user)) => user.name,
            _ => format!("uid {uid}"),
        };
        Member::User { uid, name }
    }

    fn holds(&self, who: &Credentials) -> bool {
        match self {
            Member::User { uid, .. } => *uid == who.uid,
            Member::Group { gid, .. } => *gid == who.gid || who.groups.contains(gid),
        }
    }
}

impl fmt::Display for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Member::User { name, .. } => f.write_str(name),
            Member::Group { name, .. } => write!(f, "group:{name}"),
        }
    }
}

/// A connecting peer, as the kernel tells it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credentials {
    pub pid: u32,
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (empty when the kernel cannot say).
    pub groups: Vec<u32>,
}

/// One socket's list: from `[control]`, or the default user.
#[derive(Clone, Debug)]
struct Members {
    list: Vec<Member>,
    configured: bool,
}

impl Members {
    fn new(configured: &Option<Vec<Member>>, default: &Member) -> Members {
        match configured {
            Some(list) => Members { list: list.clone(), configured: true },
            None => Members { list: vec![default.clone()], configured: false },
        }
    }
}

/// Who may use which socket.
#[derive(Clone, Debug)]
pub struct Roles {
    agents: Members,
    approvers: Members,
    /// The daemon's own user, who may use both, as root may.
    daemon_uid: u32,
}

/// The default user: the one who owns the work, as `execute` finds it
/// ([`crate::exec::identity::Identity`]: `SUDO_UID`, else the owner of the first host route's
/// root, never root), else the daemon's own user. Root holds both roles anyway.
pub fn default_user(sudo: Option<(u32, u32)>, routes: &[RouteConfig], daemon_uid: u32) -> u32 {
    crate::exec::identity::Identity::with_sudo(None, None, sudo, routes).work_owner().unwrap_or(daemon_uid)
}

impl Roles {
    /// The roles of a daemon started with `control` and `routes`, in this process's
    /// environment (`SUDO_UID`) and with its user.
    pub fn new(control: &ControlConfig, routes: &[RouteConfig]) -> Roles {
        let me = nix::unistd::geteuid().as_raw();
        let sudo = crate::exec::identity::sudo_from_env();
        Roles::with(control, &Member::user(default_user(sudo, routes, me)), me)
    }

    pub fn with(control: &ControlConfig, default: &Member, daemon_uid: u32) -> Roles {
        Roles {
            agents: Members::new(&control.agents, default),
            approvers: Members::new(&control.approvers, default),
            daemon_uid,
        }
    }

    fn members(&self, socket: Socket) -> &Members {
        match socket {
            Socket::Agent => &self.agents,
            Socket::Control => &self.approvers,
        }
    }

    fn always(&self, uid: u32) -> bool {
        uid == 0 || uid == self.daemon_uid
    }

    /// Whether `who` may use `socket`.
    pub fn admits(&self, socket: Socket, who: &Credentials) -> bool {
        self.always(who.uid) || self.members(socket).list.iter().any(|m| m.holds(who))
    }

    /// Why `who` may not use `socket` (the error line it is sent), or `None` when it may.
    /// `agent_socket` is named to an agent that knocked on the control socket.
    pub fn refusal(&self, socket: Socket, who: &Credentials, agent_socket: &Path) -> Option<String> {
        if self.admits(socket, who) {
            return None;
        }
        let (name, key) = match socket {
            Socket::Agent => ("agent", "agents"),
            Socket::Control => ("control", "approvers"),
        };
        let members = self.members(socket);
        let mut always = vec!["root".to_string()];
        if self.daemon_uid != 0 {
            always.push(format!("uid {}", self.daemon_uid));
        }
        let admitted = if members.configured {
            format!("{} and the users and groups in [control] {key}", always.join(", "))
        } else {
            let mut who = always;
            for m in &members.list {
                if let Member::User { uid, .. } = m {
                    if !self.always(*uid) {
                        who.push(format!("uid {uid}"));
                    }
                }
            }
            let only =
                if who.len() == 1 { "only root".to_string() } else { format!("only {}", who.join(" and ")) };
            format!("{only}, as [control] {key} is unset")
        };
        let mut why = format!(
            "permission denied: uid {} may not use this socket (the {name} socket admits {admitted}",
            who.uid
        );
        if socket == Socket::Control && self.admits(Socket::Agent, who) {
            why += &format!("; uid {} is an agent, whose socket is {}", who.uid, agent_socket.display());
        }
        why.push(')');
        Some(why)
    }

    /// The mode of `socket`'s file: `0600` when only root and the daemon's user may use it
    /// (the kernel's check then keeps everyone else out first), else `0666`, which lets the
    /// listed users reach it; the peer check decides either way.
    pub fn socket_mode(&self, socket: Socket) -> u32 {
        let private = self.members(socket).list.iter().all(|m| match m {
            Member::User { uid, .. } => self.always(*uid),
            Member::Group { .. } => false,
        });
        if private {
            0o600
        } else {
            0o666
        }
    }

    /// Who holds each role, for `vfs/status`: root (and the daemon's user) first, then the
    /// list, marked `(default)` when `[control]` left it out.
    pub fn describe(&self) -> Value {
        let names = |members: &Members| -> Vec<String> {
            let mut names = vec!["root".to_string()];
            if self.daemon_uid != 0 {
                names.push(Member::user(self.daemon_uid).to_string());
            }
            for m in &members.list {
                let holds_always = matches!(m, Member::User { uid, .. } if self.always(*uid));
                if !holds_always {
                    let default = if members.configured { "" } else { " (default)" };
                    names.push(format!("{m}{default}"));
                }
            }
            names
        };
        json!({"agents": names(&self.agents), "approvers": names(&self.approvers)})
    }
}

/// What a method needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The agent socket's methods (also served on the control socket).
    Agent,
    /// Interrupts: list, resolve, subscribe.
    Approver,
    /// Reload and status.
    Operator,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Agent => "agent",
            Role::Approver => "approver",
            Role::Operator => "operator",
        }
    }
}

/// The role a method needs; `None` for a method the daemon does not have.
pub fn role_of(method: &str) -> Option<Role> {
    match method {
        "initialize" | "ping" | "tools/list" | "tools/call" | "vfs/paths" | "vfs/explain" | "vfs/upload"
        | "vfs/download" => Some(Role::Agent),
        "interrupts/list" | "interrupts/resolve" | "interrupts/subscribe" => Some(Role::Approver),
        "vfs/status" | "vfs/reload" => Some(Role::Operator),
        _ => None,
    }
}

/// Whether `socket` serves `method`: the control socket serves every method; the agent socket
/// the agent's, and answers the others with a permission error naming the role they need
/// (an unknown method is left to answer "method not found").
pub fn check_method(socket: Socket, method: &str) -> Result<(), RpcError> {
    match (socket, role_of(method)) {
        (Socket::Agent, Some(role @ (Role::Approver | Role::Operator))) => {
            Err(needs(method, role, "this is the agent socket"))
        }
        _ => Ok(()),
    }
}

/// The permission error for `method`, which needs `role`; `here` says where it was asked.
pub fn needs(method: &str, role: Role, here: &str) -> RpcError {
    RpcError::new(
        proto::PEER_REFUSED,
        format!("permission denied: {method} needs the {} role (the control socket); {here}", role.as_str()),
    )
}

#[cfg(test)]
#[path = "roles_tests.rs"]
mod tests;
