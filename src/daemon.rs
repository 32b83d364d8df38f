//! The daemon's lifecycle: build the engine from the config, mount, serve, and unmount
//! cleanly on SIGINT/SIGTERM (SIGHUP reloads the rules), with the control socket alongside.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use fuser::{Config as FuseConfig, MountOption, SessionACL};
use parking_lot::Mutex;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use crate::audit::Audit;
use crate::backend::host::HostBackend;
use crate::backend::memory::MemoryBackend;
use crate::backend::postgres::{LangGraphBackend, PgSettings, PostgresBackend};
use crate::backend::sqlite::SqliteBackend;
use crate::backend::Backend;
use crate::config::{BackendConfig, Config, MemoryStore, PgLayout, RouteConfig};
use crate::control::methods::{ReloadFn, Reloaded, State};
use crate::control::roles::{Roles, Socket};
use crate::control::server::{self, Listener};
use crate::engine::Engine;
use crate::fuse::inodes::Inodes;
use crate::fuse::invalidate::KernelInvalidator;
use crate::fuse::{DoorOptions, FuseDoor, MAX_WRITE};
use crate::host_changes::HostChanges;
use crate::policy::{Gate, RuleSet};
use crate::route::{Route, Router};
use crate::vpath::VPath;

pub mod stale_mount;

/// Opens the storage of one route.
/// Opens a route's backend. `own_files`: the daemon's own files under a host root, relative to
/// it, which that route leaves out.
pub fn open_backend(
    config: &BackendConfig,
    own_files: Vec<String>,
    read_only: bool,
) -> Result<Arc<dyn Backend>> {
    Ok(match config {
        BackendConfig::Host { root } => Arc::new(
            HostBackend::new(root)
                .map_err(|e| anyhow!("cannot open host root {}: {e}", root.display()))?
                .hiding(own_files),
        ),
        BackendConfig::Memory { max_bytes, store: MemoryStore::Tmpfs } => {
            match HostBackend::private_tmpfs(*max_bytes) {
                Ok(tmpfs) => Arc::new(tmpfs),
                Err(e) => {
                    tracing::warn!("memory route kept in the daemon's own memory (no private tmpfs: {e})");
                    Arc::new(MemoryBackend::new(*max_bytes))
                }
            }
        }
        BackendConfig::Memory { max_bytes, store: MemoryStore::Daemon } => {
            Arc::new(MemoryBackend::new(*max_bytes))
        }
        BackendConfig::Sqlite { database, namespace } => {
            if let Some(dir) = database.parent() {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("cannot create the directory of {}", database.display()))?;
            }
            let opened = match read_only {
                true => SqliteBackend::open_read_only(database, namespace),
                false => SqliteBackend::open(database, namespace),
            };
            Arc::new(opened.map_err(|e| anyhow!("cannot open sqlite store {}: {e}", database.display()))?)
        }
        BackendConfig::Postgres { url, schema, namespace, layout, sync_on_close } => {
            let settings = PgSettings::new(url, schema)
                .map_err(|e| anyhow!("postgres route: {e}"))?
                .sync_on_close(*sync_on_close);
            let server = settings.server();
            let fail = |e| anyhow!("cannot open postgres store {server} (schema {schema}): {e}");
            match layout {
                PgLayout::Tree => Arc::new(PostgresBackend::open(settings, namespace).map_err(fail)?),
                PgLayout::LangGraph => Arc::new(LangGraphBackend::open(settings, namespace).map_err(fail)?),
            }
        }
    })
}

/// How long the kernel may cache a host route's names and attributes when the daemon watches
/// the host for changes (and the config does not say).
const WATCHED_HOST_TTL: Duration = Duration::from_secs(3600);

/// Watches the host routes' directories for changes made by other programs. When that works,
/// their default cache lifetime becomes long (the watcher invalidates what changes); when it
/// does not (not root, a filesystem without file handles), it stays short, with a warning.
fn watch_host_routes(config: &Config, mountpoint: &Path) -> (Option<HostChanges>, Config) {
    let roots: Vec<(VPath, PathBuf, Duration)> = config
        .routes
        .iter()
        .filter_map(|r| match &r.backend {
            BackendConfig::Host { root } => Some((r.path.clone(), root.clone(), r.cache_ttl)),
            _ => None,
        })
        .collect();
    let mut config = config.clone();
    if roots.is_empty() {
        return (None, config);
    }
    match HostChanges::new(&roots, mountpoint) {
        Ok(changes) => {
            for route in &mut config.routes {
                if matches!(route.backend, BackendConfig::Host { .. }) && !route.cache_ttl_set {
                    route.cache_ttl = WATCHED_HOST_TTL;
                }
            }
            (Some(changes), config)
        }
        Err(e) => {
            tracing::warn!("host changes are not watched ({e}); host routes keep a short cache lifetime");
            (None, config)
        }
    }
}

/// The databases the daemon writes itself: the sqlite routes' and the audit log's.
fn own_databases(config: &Config) -> impl Iterator<Item = (String, &Path)> {
    let stores = config.routes.iter().filter_map(|r| match &r.backend {
        BackendConfig::Sqlite { database, .. } => {
            Some((format!("the database of {}", r.path), database.as_path()))
        }
        _ => None,
    });
    stores.chain(config.audit_database.as_deref().map(|d| ("the audit log".to_string(), d)))
}

/// The files SQLite and the daemon keep beside a database, by suffix.
const DATABASE_FILES: [&str; 5] = ["", "-wal", "-shm", "-journal", "-lock"];

/// `path` with its longest existing prefix resolved (symlinks, `..`) and the rest appended: a
/// database whose directory is not made yet is still placed where it will be.
fn resolved_as_far_as_exists(path: &Path) -> PathBuf {
    let mut rest = Vec::new();
    let mut existing = path;
    loop {
        if let Ok(mut resolved) = existing.canonicalize() {
            resolved.extend(rest.iter().rev());
            return resolved;
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name);
                existing = parent;
            }
            _ => return path.to_path_buf(),
        }
    }
}

/// Every file the daemon owns: its config file, its mountpoint, its two sockets, and each
/// database with the files SQLite keeps beside it.
fn own_files(config: &Config) -> Vec<(String, PathBuf)> {
    let mut own = Vec::new();
    if let Some(file) = &config.file {
        own.push(("the config file".to_string(), file.clone()));
    }
    // A host route showing the mountpoint would lead each lookup beneath it back into the
    // mount, and so into a daemon thread waiting on itself: a `ls` there hung the daemon.
    if let Some(mountpoint) = &config.mountpoint {
        own.push(("the mountpoint".to_string(), mountpoint.clone()));
    }
    own.push(("the control socket".to_string(), config.socket.clone()));
    own.push(("the agent socket".to_string(), config.agent_socket.clone()));
    for (what, database) in own_databases(config) {
        for suffix in DATABASE_FILES {
            let mut file = database.as_os_str().to_owned();
            file.push(suffix);
            own.push((what.clone(), PathBuf::from(file)));
        }
    }
    own
}

/// For a host route: the daemon's own files that lie under its root, relative to it. That
/// route would show them raw (a database holds every namespace in it, whatever the rules say
/// of the sqlite route's paths; the config file holds the rules themselves) and let callers
/// write under the daemon's feet, so it leaves them out, at both doors, with a warning.
fn own_files_under(backend: &BackendConfig, config: &Config) -> Vec<String> {
    let BackendConfig::Host { root } = backend else { return Vec::new() };
    let Ok(root) = root.canonicalize() else { return Vec::new() };
    let mut inside_root = Vec::new();
    let mut warned = Vec::new();
    for (what, file) in own_files(config) {
        let file = resolved_as_far_as_exists(&file);
        let Ok(inside) = file.strip_prefix(&root) else { continue };
        if !warned.contains(&what) {
            let advice = match what.as_str() {
                "the mountpoint" => "",
                _ => "; keep the daemon's files outside host roots",
            };
            tracing::warn!(
                "{what} ({}) lies inside the host root {}: the route leaves it out{advice}",
                file.display(),
                root.display()
            );
            warned.push(what);
        }
        inside_root.push(inside.to_string_lossy().into_owned());
    }
    inside_root
}

/// Keeps the daemon's own databases (with their WAL and shared memory), which it writes on
/// every commit, out of the host-changes watcher's queue (see
/// [`HostChanges::ignore_own_file`]). Call once the backends have opened them.
fn ignore_own_files(changes: &HostChanges, config: &Config) {
    for (_, database) in own_databases(config) {
        for suffix in &DATABASE_FILES[..3] {
            let mut file = database.as_os_str().to_owned();
            file.push(suffix);
            if let Err(e) = changes.ignore_own_file(Path::new(&file)) {
                tracing::debug!("host changes: cannot leave out {e}");
            }
        }
    }
}

/// Builds the engine (gate, router, audit) that both doors share.
pub fn build_engine(config: &Config) -> Result<Arc<Engine>> {
    let rules = RuleSet::new(config.rules.clone()).map_err(|e| anyhow!("{}: {e}", config.source))?;
    let mut routes = Vec::new();
    for route in &config.routes {
        let backend = open_backend(&route.backend, own_files_under(&route.backend, config), route.read_only)?;
        if config.exec.enabled {
            hand_root_to_exec(route, &*backend, config);
        }
        routes.push(Route {
            prefix: route.path.clone(),
            backend,
            ttl: route.cache_ttl,
            kind: route.backend.kind(),
            read_only: route.read_only,
        });
    }
    let audit = Audit::open(config.audit_database.as_deref(), config.audit_max_records)
        .map_err(|e| anyhow!("cannot open the audit log: {e}"))?;
    let engine = Arc::new(Engine::new(Gate::new(rules), Router::new(routes), Arc::new(audit)));
    engine.gate.approvals.set_timeout(config.interrupt_timeout);
    engine.gate.approvals.start_sweeper();
    Ok(engine)
}

/// Makes the root of a memory or sqlite route (not served read-only) belong to `execute`'s
/// user while it is as the daemon made it, so commands can create entries there as they can
/// in the workspace; host routes keep the owners and modes they have on the host.
fn hand_root_to_exec(route: &RouteConfig, backend: &dyn Backend, config: &Config) {
    if route.read_only || matches!(route.backend, BackendConfig::Host { .. }) {
        return;
    }
    let identity = &config.exec.identity;
    match crate::exec::identity::hand_over_root(backend, identity) {
        Ok(true) => tracing::info!("the root of {} now belongs to execute's {identity}", route.path),
        Ok(false) => {}
        Err(e) => tracing::warn!("cannot give the root of {} to execute's {identity}: {e}", route.path),
    }
}

/// The newest mount at `path`, from /proc/self/mountinfo (so nothing asks the mounted
/// filesystem itself): its device ("major:minor") and what it is ("<type> filesystem (<source>)").
fn mount_at(path: &Path) -> Option<(String, String)> {
    stale_mount::mount_at(path).map(|m| (m.device.clone(), m.describe()))
}

/// `path` with its parent resolved and its last component as it is: what mountinfo would list
/// if something were mounted there, found without looking at `path` itself (a wedged mount
/// hangs whoever does). `None` when there is no such form (`/`, a last `..`, a missing parent).
fn resolved_parent_of(path: &Path) -> Option<PathBuf> {
    let name = path.file_name()?;
    let parent = match path.parent()? {
        p if p.as_os_str().is_empty() => Path::new("."),
        p => p,
    };
    Some(parent.canonicalize().ok()?.join(name))
}

/// Makes `mountpoint` ready: creates it if missing, clears the mount a daemon that died left
/// there (even one the kernel still holds, see [`stale_mount`]), and refuses one that is in use.
/// Returns the resolved mountpoint and its lock, held from before the mount there was first
/// examined: keep it until the new mount is made, so that a daemon starting there meanwhile
/// finds that mount (and refuses it as busy) rather than the one this daemon cleared.
pub fn prepare_mountpoint(mountpoint: &Path) -> Result<(PathBuf, stale_mount::MountpointLock)> {
    // mountinfo first, for the path and each symlink it leads through: nothing is asked of
    // a mount before it is known not to be a dead one.
    let mut path = mountpoint.to_path_buf();
    let mut lock = None;
    for _ in 0..40 {
        let Some(candidate) = resolved_parent_of(&path) else { break };
        if stale_mount::mount_at(&candidate).is_some() {
            let held = lock.insert(stale_mount::MountpointLock::take(&candidate));
            stale_mount::clear_dead_mount(&candidate, held)?;
            path = candidate;
            break;
        }
        match std::fs::symlink_metadata(&candidate) {
            Ok(m) if m.file_type().is_symlink() => {
                let target = std::fs::read_link(&candidate)
                    .with_context(|| format!("cannot resolve mountpoint {}", mountpoint.display()))?;
                path = candidate.parent().unwrap_or(Path::new("/")).join(target);
            }
            _ => {
                path = candidate;
                break;
            }
        }
    }
    match std::fs::metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(&path)
                .with_context(|| format!("cannot create mountpoint {}", mountpoint.display()))?;
        }
        Err(e) => bail!("cannot use mountpoint {}: {e}", mountpoint.display()),
        Ok(m) if !m.is_dir() => bail!("mountpoint {} is not a directory", mountpoint.display()),
        Ok(_) => {}
    }
    let canonical =
        path.canonicalize().with_context(|| format!("cannot resolve mountpoint {}", mountpoint.display()))?;
    // One lock at a time (two daemons never wait for each other's), and always the canonical
    // path's from here to the mount.
    let lock = match lock {
        Some(held) if held.point() == canonical => held,
        other => {
            drop(other);
            stale_mount::MountpointLock::take(&canonical)
        }
    };
    // A path that had no parent form above (`/mnt/x/..`); after a clearing, a mount under
    // the cleared one; or the mount of a daemon that held the lock until it had mounted.
    stale_mount::clear_dead_mount(&canonical, &lock)?;
    if let Some((_, fstype)) = mount_at(&canonical) {
        bail!(
            "mountpoint {} is busy: a {fstype} is already mounted there (unmount it first, e.g. `umount {}`)",
            canonical.display(),
            canonical.display()
        );
    }
    // Mounting over files hides them until the unmount, as any mount does; say so, since a
    // mistyped mountpoint (a project directory) would otherwise seem emptied.
    if std::fs::read_dir(&canonical).is_ok_and(|mut entries| entries.next().is_some()) {
        tracing::warn!(
            "mountpoint {} is not empty: what it holds is hidden under the mount until it is unmounted",
            canonical.display()
        );
    }
    Ok((canonical, lock))
}

/// Whether to ask the kernel for FUSE over io_uring: configured, and both the kernel (its module
/// parameter, turned on here) and this process (rings allowed) can. Otherwise `/dev/fuse`.
fn io_uring_usable(config: &Config) -> bool {
    if !config.io_uring {
        return false;
    }
    match crate::fuse::ring::enable_in_kernel().and_then(|()| crate::fuse::ring::available()) {
        Ok(()) => true,
        Err(e) => {
            tracing::info!("FUSE over io_uring is not available ({e}); requests come by /dev/fuse");
            false
        }
    }
}

fn check_fuse_device() -> Result<()> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    // The FUSE device is the character device 10:229; anything else there (a bind mount of
    // /dev/null in a container) opens fine and fails only at mount() with EINVAL.
    if let Ok(m) = std::fs::metadata("/dev/fuse") {
        let (major, minor) = (libc::major(m.rdev()), libc::minor(m.rdev()));
        if !m.file_type().is_char_device() || (major, minor) != (10, 229) {
            bail!(
                "/dev/fuse is not the FUSE device (it is device {major}:{minor}, the FUSE device is 10:229): \
                 in a container, pass the host's through (--device /dev/fuse)"
            );
        }
    }
    match std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse") {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "/dev/fuse is missing: load the fuse kernel module (`modprobe fuse`) or, in a container, pass the device through (--device /dev/fuse)"
        ),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => bail!(
            "/dev/fuse cannot be opened ({e}): run as root or give this user access to /dev/fuse"
        ),
        Err(e) => bail!("/dev/fuse cannot be opened: {e}"),
    }
}

/// Raises the soft limit on open descriptors to the hard one. Each socket connection holds
/// four and each file open through the mount one or two, and the soft limit is often 1,024
/// (systemd's default) where the hard one is far higher.
fn raise_open_file_limit() {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit read and write the one struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                tracing::warn!("cannot raise the open file limit: {}", std::io::Error::last_os_error());
            }
        }
    }
}

/// Mounts and serves until a signal (or an external unmount) ends the session. The control
/// socket is bound before mounting (so a socket problem stops the start before anything is
/// mounted), serves once the mount is live, and is removed when the daemon exits.
pub fn run(config: Config, mountpoint: &Path, config_path: Option<PathBuf>) -> Result<()> {
    // glibc gives every thread that allocates its own arena; with a dozen threads each keeps
    // freed inode-table memory of its own, and the RSS after a `find` over 200k files was
    // 68 MiB with them against 54 MiB with one. Two arenas keep most of that saving.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, 2) };
    raise_open_file_limit();
    check_fuse_device()?;
    // The lock keeps other daemons starting on this mountpoint out until the mount is made.
    let (mountpoint, mountpoint_lock) = prepare_mountpoint(mountpoint)?;
    let (host_changes, mut engine_config) = watch_host_routes(&config, &mountpoint);
    engine_config.mountpoint = Some(mountpoint.clone());
    let engine = build_engine(&engine_config)?;
    if let Some(changes) = &host_changes {
        let _ = engine.host_change_events.set(changes.events.clone());
        let _ = engine.unwatched_mounts.set(changes.unwatched.clone());
        ignore_own_files(changes, &config);
    }
    let inodes = Arc::new(Inodes::new());
    let door = FuseDoor::new(
        engine.clone(),
        inodes.clone(),
        DoorOptions {
            passthrough: config.passthrough,
            cached_reads_max: config.cached_reads_max,
            xattrs: config.xattrs,
            io_uring: io_uring_usable(&config),
        },
    );
    let ring_door = door.clone();
    let door_expire_only = door.expire_only();
    let door_notifier = door.notifier_slot();
    let door_replaced = door.replaced_files();
    let roles = Roles::new(&config.control, &config.routes);
    let (agent_mode, control_mode) = (roles.socket_mode(Socket::Agent), roles.socket_mode(Socket::Control));
    // A directory made for the sockets lets others through only when a socket is for them.
    let dir_mode = if (agent_mode | control_mode) & 0o007 != 0 { 0o755 } else { 0o700 };
    let listeners = vec![
        Listener::bind(&config.socket, Socket::Control, control_mode, dir_mode)?,
        Listener::bind(&config.agent_socket, Socket::Agent, agent_mode, dir_mode)?,
    ];

    // Installed before mounting, so a signal that arrives early is handled rather than
    // killing the daemon with its mount in place.
    let mut signals = Signals::new([SIGINT, SIGTERM, SIGHUP]).context("cannot install signal handlers")?;

    let mut fuse_config = FuseConfig::default();
    fuse_config.mount_options = vec![
        MountOption::FSName("agentvfs".into()),
        MountOption::Subtype("agentvfs".into()),
        MountOption::DefaultPermissions,
        MountOption::Dev,
        MountOption::Suid,
    ];
    fuse_config.acl = if config.allow_other { SessionACL::All } else { SessionACL::Owner };
    fuse_config.n_threads = Some(config.fuse_threads);
    fuse_config.clone_fd = true;

    let mut session = fuser::Session::new(door, &mountpoint, &fuse_config).map_err(|e| {
        let hint = match e.raw_os_error() {
            Some(libc::EPERM) | Some(libc::EACCES) => {
                " (mounting is not permitted: run as root, or allow FUSE mounts for this user)"
            }
            _ => "",
        };
        anyhow!("cannot mount at {}: {e}{hint}", mountpoint.display())
    })?;
    // Mounted: a daemon starting here now finds this mount, served.
    drop(mountpoint_lock);
    // After the handshake, which would otherwise lower the window again to the kernel's.
    if config.read_ahead_kb > 0 {
        if let Err(e) = set_read_ahead(&mountpoint, config.read_ahead_kb) {
            tracing::warn!("cannot set the mount's readahead to {} KiB: {e}", config.read_ahead_kb);
        }
    }
    let rings = if ring_door.ring_negotiated() {
        let dispatcher = session.raw_dispatcher(ring_door);
        let (idle_class, spin) = (config.io_uring_idle_class, config.io_uring_spin);
        match crate::fuse::ring::Rings::start(session.as_fd(), dispatcher, MAX_WRITE, idle_class, spin) {
            Ok(rings) => {
                let _ = engine.fuse_rings.set(rings.counters());
                // /dev/fuse now carries only FORGETs and INTERRUPTs: read it in batches
                // rather than be woken for each inode an unlink drops.
                session.pace_device();
                Some(rings)
            }
            // The kernel holds every request until all queues are registered: stop (the session
            // unmounts as it drops) rather than leave a mount that hangs its callers.
            Err(e) => bail!(
                "cannot register the FUSE io_uring queues ({e}); set `[fuse] io_uring = false` to serve by /dev/fuse"
            ),
        }
    } else {
        None
    };
    let mut unmounter = session.unmount_callable();
    let _ = door_notifier.set(session.notifier());
    let invalidator = Arc::new(KernelInvalidator {
        inodes,
        notifier: session.notifier(),
        expire_only: door_expire_only,
        replaced: door_replaced,
    });
    engine.set_observer(invalidator.clone());
    let forgetter = invalidator.clone();
    engine.watch_shared_routes(invalidator.clone(), Arc::new(move || forgetter.forget_everything()));
    if let Some(changes) = host_changes {
        let forgetter = invalidator.clone();
        changes.start(invalidator.clone(), move || {
            tracing::warn!(
                "host changes were lost (queue overflow); every name the kernel cached is expired"
            );
            forgetter.forget_everything();
        });
    }
    let reloader = Arc::new(Reloader {
        engine: engine.clone(),
        config_path,
        in_force: config.clone(),
        invalidator,
        lock: Mutex::new(()),
    });

    let socket = listeners[0].path().to_path_buf();
    let agent_socket = listeners[1].path().to_path_buf();
    let described = roles.describe();
    let control_reloader = reloader.clone();
    let reload: ReloadFn = Box::new(move || control_reloader.reload());
    let state = Arc::new(State::new(engine.clone(), config.clone(), mountpoint.clone(), reload, roles));
    let server = server::serve(listeners, state)?;

    println!("agentvfs: mounted at {}", mountpoint.display());
    for (prefix, backend, read_only) in engine.routes() {
        let read_only = if read_only { " (read-only: every change answers EROFS)" } else { "" };
        println!("  {prefix} -> {backend}{read_only}");
    }
    println!("  {} rule(s) from {}", engine.gate.rules().len(), config.source);
    if config.exec.enabled {
        println!("  execute runs as {}, in {}", config.exec.identity, config.exec.cwd);
    }
    println!("  control socket {} (approvers: {})", socket.display(), names(&described["approvers"]));
    println!("  agent socket {} (agents: {})", agent_socket.display(), names(&described["agents"]));
    match &config.audit_database {
        Some(database) => println!("  audit log {}", database.display()),
        None => println!("  audit log: none ([audit] database unset): refusals go to this log only"),
    }
    tracing::info!(mountpoint = %mountpoint.display(), socket = %socket.display(), "mounted");
    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Ready]);

    let shown = mountpoint.clone();
    let approvals = engine.gate.approvals.clone();
    let stopping = engine.clone();
    std::thread::Builder::new().name("signals".into()).spawn(move || {
        for signal in signals.forever() {
            if signal == SIGHUP {
                // Logged by the reloader; nobody to answer here.
                let _ = reloader.reload();
                continue;
            }
            tracing::info!("signal {signal}: unmounting {}", shown.display());
            let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Stopping]);
            // Paused callers are answered (EACCES) so that none holds the unmount up.
            approvals.cancel_all();
            // Tool writes still under way end with the process: their temporaries go first.
            stopping.remove_unfinished_writes();
            if let Err(e) = unmounter.unmount() {
                tracing::warn!("unmount failed ({e}); detaching lazily");
                let _ = nix::mount::umount2(&shown, nix::mount::MntFlags::MNT_DETACH);
            }
            break;
        }
    })?;

    let served = session.run();
    drop(rings);
    // Stop answering before saying we are gone, so no client sees a half-dead daemon.
    drop(server);
    // And what a tool call started after the signal left behind.
    engine.remove_unfinished_writes();
    served.with_context(|| format!("the FUSE session at {} failed", mountpoint.display()))?;
    println!("agentvfs: unmounted {}", mountpoint.display());
    Ok(())
}

/// Re-reads the rules from the config file, for SIGHUP and `vfs/reload` alike.
pub struct Reloader {
    engine: Arc<Engine>,
    config_path: Option<PathBuf>,
    /// The config the daemon started with: of a reloaded file, the rules and the interrupt
    /// timeout are applied; any other setting that changed earns a warning naming it.
    in_force: Config,
    /// Tells the kernel to forget what the old rules let it cache.
    invalidator: Arc<KernelInvalidator>,
    /// One reload at a time, so invalidations never interleave with a newer rule set.
    lock: Mutex<()>,
}

impl Reloader {
    /// Swaps in the file's rules and makes the kernel forget every entry it cached, so that
    /// no hidden entry stays visible (or the other way round) after the change. On failure
    /// the current rules stay in force.
    pub fn reload(&self) -> Result<Reloaded, String> {
        let _one_at_a_time = self.lock.lock();
        let result = self.reload_locked();
        match &result {
            Ok(r) => {
                tracing::info!("reloaded {} rule(s) from {}", r.rules, r.config.display());
                for warning in &r.warnings {
                    tracing::warn!("{warning}");
                }
            }
            Err(e) => tracing::error!("reload failed, keeping the current rules: {e}"),
        }
        result
    }

    fn reload_locked(&self) -> Result<Reloaded, String> {
        let Some(path) = self.config_path.as_deref() else {
            return Err("the daemon runs on the embedded default config; there is no file to reload".into());
        };
        let mut config = Config::load(path).map_err(|e| e.to_string())?;
        let rules = RuleSet::new(std::mem::take(&mut config.rules))
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let count = rules.len();
        self.engine.gate.reload(rules);
        self.engine.gate.approvals.set_timeout(config.interrupt_timeout);
        self.invalidator.forget_everything();
        let unapplied = not_reloaded(&self.in_force, &config);
        let warnings = match unapplied.is_empty() {
            true => Vec::new(),
            false => vec![format!(
                "{} in {} changed; only the rules and [interrupts] are reloaded (restart the daemon to apply the rest)",
                unapplied.join(", "),
                path.display()
            )],
        };
        Ok(Reloaded { rules: count, config: path.to_path_buf(), warnings })
    }
}

/// The parts of `new` that differ from `old` and that a reload does not apply (everything
/// but the rules and `[interrupts]`), by the names the file gives them. Exhaustive: a new
/// setting must be placed here, or this does not compile.
fn not_reloaded(old: &Config, new: &Config) -> Vec<&'static str> {
    let Config {
        source: _,
        file: _,
        mountpoint,
        socket,
        agent_socket,
        control,
        routes,
        rules: _,
        interrupt_timeout: _,
        audit_database,
        audit_max_records,
        fuse_threads,
        allow_other,
        passthrough,
        cached_reads_max,
        xattrs,
        read_ahead_kb,
        io_uring,
        io_uring_idle_class,
        io_uring_spin,
        observation,
        exec,
        run,
    } = new;
    let fuse = (fuse_threads, allow_other, passthrough, cached_reads_max, xattrs, read_ahead_kb)
        != (
            &old.fuse_threads,
            &old.allow_other,
            &old.passthrough,
            &old.cached_reads_max,
            &old.xattrs,
            &old.read_ahead_kb,
        )
        || (io_uring, io_uring_idle_class, io_uring_spin)
            != (&old.io_uring, &old.io_uring_idle_class, &old.io_uring_spin);
    [
        ("mountpoint", *mountpoint != old.mountpoint),
        ("socket", (socket, agent_socket) != (&old.socket, &old.agent_socket)),
        ("[control]", *control != old.control),
        ("the routes", *routes != old.routes),
        ("[audit]", (audit_database, audit_max_records) != (&old.audit_database, &old.audit_max_records)),
        ("[fuse]", fuse),
        ("[tools]", *observation != old.observation),
        ("[exec]", *exec != old.exec),
        ("[run]", *run != old.run),
    ]
    .into_iter()
    .filter_map(|(name, changed)| changed.then_some(name))
    .collect()
}

/// A role's holders as `vfs/status` lists them, joined for the start-up lines.
fn names(list: &serde_json::Value) -> String {
    let names: Vec<&str> = list.as_array().into_iter().flatten().filter_map(|n| n.as_str()).collect();
    crate::display::escape(&names.join(", ")).into_owned()
}

/// Sets the readahead window of the mount at `mountpoint` (its backing device info in sysfs, as
/// `blockdev --setra` does for a disk; only root may). Not through `stat` of the mountpoint: that
/// would ask this daemon, which serves no request yet.
fn set_read_ahead(mountpoint: &Path, kib: u64) -> std::io::Result<()> {
    let (device, _) = mount_at(mountpoint).ok_or_else(|| {
        std::io::Error::other(format!("no mount at {} in /proc/self/mountinfo", mountpoint.display()))
    })?;
    let path = format!("/sys/class/bdi/{device}/read_ahead_kb");
    std::fs::write(&path, format!("{kib}\n"))
        .map_err(|e| std::io::Error::new(e.kind(), format!("{path}: {e}")))
}
