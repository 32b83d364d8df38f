//! The daemon's lifecycle: build the engine from the config, mount, serve, and unmount
//! cleanly on SIGINT/SIGTERM (SIGHUP reloads the rules).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use fuser::{Config as FuseConfig, MountOption, SessionACL};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use crate::audit::Audit;
use crate::backend::host::HostBackend;
use crate::backend::memory::MemoryBackend;
use crate::backend::sqlite::SqliteBackend;
use crate::backend::Backend;
use crate::config::{BackendConfig, Config};
use crate::engine::Engine;
use crate::fuse::inodes::Inodes;
use crate::fuse::FuseDoor;
use crate::policy::{Gate, RuleSet};
use crate::route::{Route, Router};

/// Opens the storage of one route.
pub fn open_backend(config: &BackendConfig) -> Result<Arc<dyn Backend>> {
    Ok(match config {
        BackendConfig::Host { root } => Arc::new(
            HostBackend::new(root).map_err(|e| anyhow!("cannot open host root {}: {e}", root.display()))?,
        ),
        BackendConfig::Memory { max_bytes } => Arc::new(MemoryBackend::new(*max_bytes)),
        BackendConfig::Sqlite { database, namespace } => {
            if let Some(dir) = database.parent() {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("cannot create the directory of {}", database.display()))?;
            }
            Arc::new(
                SqliteBackend::open(database, namespace)
                    .map_err(|e| anyhow!("cannot open sqlite store {}: {e}", database.display()))?,
            )
        }
    })
}

/// Builds the engine (gate, router, audit) that both doors share.
pub fn build_engine(config: &Config) -> Result<Arc<Engine>> {
    let rules = RuleSet::new(config.rules.clone()).map_err(|e| anyhow!("{}: {e}", config.source))?;
    let mut routes = Vec::new();
    for route in &config.routes {
        routes.push(Route {
            prefix: route.path.clone(),
            backend: open_backend(&route.backend)?,
            ttl: route.cache_ttl,
            kind: route.backend.kind(),
        });
    }
    let audit = Audit::open(config.audit_database.as_deref())
        .map_err(|e| anyhow!("cannot open the audit log: {e}"))?;
    Ok(Arc::new(Engine::new(Gate::new(rules), Router::new(routes), Arc::new(audit))))
}

/// Is `path` itself a mount point right now? (from /proc/self/mountinfo)
fn mounted_at(path: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = path.to_string_lossy();
    info.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        let point = fields.get(4)?.replace("\\040", " ");
        let sep = fields.iter().position(|f| *f == "-")?;
        let (fstype, source) = (fields.get(sep + 1)?, fields.get(sep + 2)?);
        (point == want).then(|| format!("{fstype} filesystem ({source})"))
    })
}

/// Makes `mountpoint` ready: creates it if missing, clears a stale mount a crashed daemon left
/// (ENOTCONN), and refuses one that is in use.
pub fn prepare_mountpoint(mountpoint: &Path) -> Result<PathBuf> {
    match std::fs::metadata(mountpoint) {
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            tracing::warn!(
                "{} holds a stale mount from a daemon that died; clearing it",
                mountpoint.display()
            );
            nix::mount::umount2(mountpoint, nix::mount::MntFlags::MNT_DETACH)
                .with_context(|| format!("cannot clear the stale mount at {}", mountpoint.display()))?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(mountpoint)
                .with_context(|| format!("cannot create mountpoint {}", mountpoint.display()))?;
        }
        Err(e) => bail!("cannot use mountpoint {}: {e}", mountpoint.display()),
        Ok(m) if !m.is_dir() => bail!("mountpoint {} is not a directory", mountpoint.display()),
        Ok(_) => {}
    }
    let canonical = mountpoint
        .canonicalize()
        .with_context(|| format!("cannot resolve mountpoint {}", mountpoint.display()))?;
    // A dead FUSE mount can still answer stat from the kernel's cache; statfs always asks
    // the daemon, so ENOTCONN there is the reliable sign.
    if mounted_at(&canonical).is_some()
        && nix::sys::statvfs::statvfs(&canonical).err() == Some(nix::errno::Errno::ENOTCONN)
    {
        tracing::warn!("{} holds a stale mount from a daemon that died; clearing it", canonical.display());
        nix::mount::umount2(&canonical, nix::mount::MntFlags::MNT_DETACH)
            .with_context(|| format!("cannot clear the stale mount at {}", canonical.display()))?;
    }
    if let Some(fstype) = mounted_at(&canonical) {
        bail!(
            "mountpoint {} is busy: a {fstype} is already mounted there (unmount it first, e.g. `umount {}`)",
            canonical.display(),
            canonical.display()
        );
    }
    Ok(canonical)
}

fn check_fuse_device() -> Result<()> {
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

/// Mounts and serves until a signal (or an external unmount) ends the session.
pub fn run(config: Config, mountpoint: &Path, config_path: Option<PathBuf>) -> Result<()> {
    check_fuse_device()?;
    let mountpoint = prepare_mountpoint(mountpoint)?;
    let engine = build_engine(&config)?;
    let inodes = Arc::new(Inodes::new());
    let door = FuseDoor::new(engine.clone(), inodes.clone());

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
    let mut unmounter = session.unmount_callable();
    let notifier = session.notifier();
    engine.set_observer(Arc::new(crate::fuse::invalidate::KernelInvalidator {
        inodes: inodes.clone(),
        notifier: session.notifier(),
    }));

    println!("agentvfs: mounted at {}", mountpoint.display());
    for route in engine.router.routes() {
        println!("  {} -> {}", route.prefix, route.backend.describe());
    }
    println!("  {} rule(s) from {}", engine.gate.rules().len(), config.source);
    tracing::info!(mountpoint = %mountpoint.display(), "mounted");
    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Ready]);

    let mut signals = Signals::new([SIGINT, SIGTERM, SIGHUP]).context("cannot install signal handlers")?;
    let signal_engine = engine.clone();
    let shown = mountpoint.clone();
    std::thread::Builder::new().name("signals".into()).spawn(move || {
        for signal in signals.forever() {
            if signal == SIGHUP {
                reload(&signal_engine, config_path.as_deref(), &inodes, &notifier);
                continue;
            }
            tracing::info!("signal {signal}: unmounting {}", shown.display());
            let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Stopping]);
            if let Err(e) = unmounter.unmount() {
                tracing::warn!("unmount failed ({e}); detaching lazily");
                let _ = nix::mount::umount2(&shown, nix::mount::MntFlags::MNT_DETACH);
            }
            break;
        }
    })?;

    session.run().with_context(|| format!("the FUSE session at {} failed", mountpoint.display()))?;
    println!("agentvfs: unmounted {}", mountpoint.display());
    Ok(())
}

/// Re-reads the rules and makes the kernel forget every entry it cached, so that no hidden
/// entry stays visible (or the other way round) after the change.
pub fn reload(engine: &Engine, config_path: Option<&Path>, inodes: &Inodes, notifier: &fuser::Notifier) {
    let Some(path) = config_path else {
        tracing::warn!("reload requested, but the daemon runs on the embedded default config");
        return;
    };
    let rules = Config::load(path).map_err(|e| e.to_string()).and_then(|c| RuleSet::new(c.rules));
    match rules {
        Ok(rules) => {
            let count = rules.len();
            engine.gate.reload(rules);
            for (parent, name) in inodes.known_entries() {
                let _ = notifier.inval_entry(fuser::INodeNo(parent), std::ffi::OsStr::new(&name));
            }
            tracing::info!("reloaded {count} rule(s) from {}", path.display());
        }
        Err(e) => tracing::error!("reload failed, keeping the current rules: {e}"),
    }
}
