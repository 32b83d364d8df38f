//! Unit tests of the roles: names looked up, the default user, who each socket admits and
//! what it says to the others, socket modes, and which methods the agent socket serves.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use serde_json::json;

use super::*;
use crate::config::Config;

fn peer(uid: u32, gid: u32, groups: &[u32]) -> Credentials {
    Credentials { pid: 4242, uid, gid, groups: groups.to_vec() }
}

fn user(uid: u32, name: &str) -> Member {
    Member::User { uid, name: name.to_string() }
}

/// agents: nobody and group 500; approvers: unset (the default user, 1000); the daemon is root.
fn roles() -> Roles {
    let control = ControlConfig {
        agents: Some(vec![user(65534, "nobody"), Member::Group { gid: 500, name: "agents".into() }]),
        approvers: None,
    };
    Roles::with(&control, &user(1000, "alice"), 0)
}

#[test]
fn names_are_looked_up() {
    assert_eq!(Member::lookup("root"), Ok(user(0, "root")));
    assert_eq!(Member::lookup("group:root"), Ok(Member::Group { gid: 0, name: "root".into() }));
    assert_eq!(Member::lookup("group:root").unwrap().to_string(), "group:root");
    assert_eq!(
        Member::lookup("no-such-user-x"),
        Err("unknown user \"no-such-user-x\" (a group is written \"group:NAME\")".into())
    );
    assert_eq!(Member::lookup("group:no-such-group-x"), Err("unknown group \"no-such-group-x\"".into()));
    assert_eq!(Member::lookup("group:"), Err("\"group:\" names no group (write \"group:NAME\")".into()));
    assert_eq!(Member::lookup(""), Err("an empty user name".into()));
    assert_eq!(Member::user(0).to_string(), "root");
    assert_eq!(Member::user(4_000_000_000).to_string(), "uid 4000000000");
}

#[test]
fn the_default_user_is_the_sudo_user_else_the_workspace_owner_else_the_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "[[routes]]\npath = \"/workspace\"\nbackend = \"host\"\nroot = \"{}\"\n",
        dir.path().display()
    );
    let routes = Config::parse_str(&text, "t.toml", Path::new("/")).unwrap().routes;
    let owner = std::fs::metadata(dir.path()).map(|m| m.uid()).unwrap();
    assert_eq!(default_user(Some((1000, 1000)), &routes, 7), 1000);
    // sudo from a root shell, and a root-owned workspace, say nothing: root has both roles.
    let after_sudo = if owner == 0 { 7 } else { owner };
    assert_eq!(default_user(Some((0, 0)), &routes, 7), after_sudo);
    assert_eq!(default_user(None, &[], 7), 7);
    if nix::unistd::chown(dir.path(), Some(65534.into()), None).is_ok() {
        assert_eq!(default_user(None, &routes, 7), 65534);
    }
}

#[test]
fn each_socket_admits_its_role_and_root() {
    let r = roles();
    let agent = Path::new("/run/a-agent.sock");
    for socket in [Socket::Agent, Socket::Control] {
        assert!(r.admits(socket, &peer(0, 0, &[])), "root, {socket:?}");
    }
    assert!(r.admits(Socket::Agent, &peer(65534, 65534, &[])));
    assert!(r.admits(Socket::Agent, &peer(1234, 500, &[])), "by primary group");
    assert!(r.admits(Socket::Agent, &peer(1234, 100, &[7, 500])), "by a supplementary group");
    assert!(r.admits(Socket::Control, &peer(1000, 1000, &[])), "the default user approves");
    assert!(!r.admits(Socket::Agent, &peer(1000, 1000, &[])), "agents are listed: not the default");
    assert_eq!(
        r.refusal(Socket::Control, &peer(65534, 65534, &[]), agent).unwrap(),
        "permission denied: uid 65534 may not use this socket (the control socket admits only root and uid 1000, as [control] approvers is unset; uid 65534 is an agent, whose socket is /run/a-agent.sock)"
    );
    assert_eq!(
        r.refusal(Socket::Agent, &peer(1, 1, &[]), agent).unwrap(),
        "permission denied: uid 1 may not use this socket (the agent socket admits root and the users and groups in [control] agents)"
    );
    assert_eq!(r.refusal(Socket::Agent, &peer(65534, 65534, &[]), agent), None);
    // A daemon running as another user admits that user too.
    let r = Roles::with(&ControlConfig::default(), &user(0, "root"), 1000);
    assert!(r.admits(Socket::Control, &peer(1000, 1000, &[])));
    assert_eq!(
        r.refusal(Socket::Agent, &peer(1, 1, &[]), agent).unwrap(),
        "permission denied: uid 1 may not use this socket (the agent socket admits only root and uid 1000, as [control] agents is unset)"
    );
    let r = Roles::with(&ControlConfig::default(), &user(0, "root"), 0);
    assert_eq!(
        r.refusal(Socket::Control, &peer(1, 1, &[]), agent).unwrap(),
        "permission denied: uid 1 may not use this socket (the control socket admits only root, as [control] approvers is unset)"
    );
}

#[test]
fn a_socket_only_root_may_use_stays_private() {
    let r = roles();
    assert_eq!((r.socket_mode(Socket::Agent), r.socket_mode(Socket::Control)), (0o666, 0o666));
    let r = Roles::with(&ControlConfig::default(), &user(0, "root"), 0);
    assert_eq!((r.socket_mode(Socket::Agent), r.socket_mode(Socket::Control)), (0o600, 0o600));
    let only_groups =
        ControlConfig { agents: None, approvers: Some(vec![Member::Group { gid: 0, name: "root".into() }]) };
    let r = Roles::with(&only_groups, &user(0, "root"), 0);
    assert_eq!((r.socket_mode(Socket::Agent), r.socket_mode(Socket::Control)), (0o600, 0o666));
    assert_eq!(
        roles().describe(),
        json!({"agents": ["root", "nobody", "group:agents"], "approvers": ["root", "alice (default)"]})
    );
}

#[test]
fn the_agent_socket_serves_the_agents_methods() {
    for method in [
        "initialize",
        "ping",
        "tools/list",
        "tools/call",
        "vfs/paths",
        "vfs/explain",
        "vfs/upload",
        "vfs/download",
        "frobnicate",
    ] {
        assert_eq!(check_method(Socket::Agent, method), Ok(()), "{method}");
    }
    assert_eq!(role_of("vfs/upload"), Some(Role::Agent));
    assert_eq!(role_of("vfs/download"), Some(Role::Agent));
    for (method, role) in [
        ("interrupts/list", "approver"),
        ("interrupts/resolve", "approver"),
        ("interrupts/subscribe", "approver"),
        ("vfs/reload", "operator"),
        ("vfs/status", "operator"),
    ] {
        let e = check_method(Socket::Agent, method).unwrap_err();
        assert_eq!(e.code, proto::PEER_REFUSED);
        assert_eq!(
            e.message,
            format!("permission denied: {method} needs the {role} role (the control socket); this is the agent socket")
        );
        assert_eq!(check_method(Socket::Control, method), Ok(()));
    }
}

fn parse(text: &str) -> Result<Config, crate::config::ConfigError> {
    Config::parse_str(text, "t.toml", Path::new("/etc"))
}

#[test]
fn control_names_users_and_groups_and_a_misspelt_one_is_an_error_with_its_line() {
    let c = parse("[control]\nagents = [\"nobody\", \"group:root\", \"nobody\"]\napprovers = [\"root\"]\n")
        .unwrap();
    let nobody = Member::lookup("nobody").unwrap();
    let root_group = Member::lookup("group:root").unwrap();
    assert_eq!(c.control.agents, Some(vec![nobody, root_group]), "repeats are dropped");
    assert_eq!(c.control.approvers, Some(vec![user(0, "root")]));
    assert_eq!(parse("").unwrap().control, ControlConfig::default());
    let e = parse("socket = \"/run/x.sock\"\n\n[control]\nagents = [\"root\",\n  \"no-such-user-x\"]\n")
        .unwrap_err();
    assert_eq!(
        (e.line, e.message.as_str()),
        (Some(5), "[control] agents: unknown user \"no-such-user-x\" (a group is written \"group:NAME\")")
    );
    assert_eq!(e.to_string(), format!("t.toml:5: {}", e.message));
    let e = parse("[control]\napprovers = [\"group:no-such-group-x\"]\n").unwrap_err();
    assert_eq!(
        (e.line, e.message.as_str()),
        (Some(2), "[control] approvers: unknown group \"no-such-group-x\"")
    );
    let e = parse("[control]\noperators = []\n").unwrap_err();
    assert!(e.message.contains("unknown field `operators`"), "{e}");
}

#[test]
fn the_agent_socket_sits_beside_the_control_socket() {
    let c = parse("socket = \"run/agentvfs.sock\"\n").unwrap();
    assert_eq!(c.socket, Path::new("/etc/run/agentvfs.sock"));
    assert_eq!(c.agent_socket, Path::new("/etc/run/agentvfs-agent.sock"));
    let c = parse("socket = \"/run/ctl\"\nagent_socket = \"agents.sock\"\n").unwrap();
    assert_eq!(c.agent_socket, Path::new("/etc/agents.sock"));
    assert_eq!(crate::config::default_agent_socket(Path::new("/run/ctl")), Path::new("/run/ctl-agent.sock"));
    let e = parse("socket = \"/run/a.sock\"\n\nagent_socket = \"/run/a.sock\"\n").unwrap_err();
    assert_eq!(
        (e.line, e.message.as_str()),
        (Some(3), "agent_socket \"/run/a.sock\" is the control socket too; give it a path of its own")
    );
}
