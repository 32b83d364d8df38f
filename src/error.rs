//! The error type every layer returns: an errno for the kernel plus context for people.

use std::fmt;

pub use nix::errno::Errno;

/// Why an operation failed. The errno is what the FUSE door replies; `denied_by` is set when the
/// policy gate (not the backend) refused, so the control door can word its answer accordingly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsError {
    pub errno: Errno,
    pub context: String,
    /// Index of the rule that refused the operation, when the gate refused it.
    pub denied_by: Option<usize>,
    /// Set when the refusal is an interrupt rule's: a door may ask a human instead.
    pub interrupt: Option<Box<crate::policy::approvals::Interrupted>>,
}

pub type FsResult<T> = Result<T, FsError>;

impl FsError {
    pub fn new(errno: Errno, context: impl Into<String>) -> Self {
        FsError { errno, context: context.into(), denied_by: None, interrupt: None }
    }

    pub fn errno(errno: Errno) -> Self {
        FsError { errno, context: String::new(), denied_by: None, interrupt: None }
    }

    pub fn denied(errno: Errno, rule: usize, context: impl Into<String>) -> Self {
        FsError { errno, context: context.into(), denied_by: Some(rule), interrupt: None }
    }

    pub fn not_found(what: impl Into<String>) -> Self {
        Self::new(Errno::ENOENT, what)
    }

    /// Adds context to an error that has none, keeping the errno.
    pub fn with_context(mut self, context: impl Into<String>) -> Self {
        if self.context.is_empty() {
            self.context = context.into();
        }
        self
    }

    pub fn is(&self, errno: Errno) -> bool {
        self.errno == errno
    }
}

impl fmt::Display for FsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.context.is_empty() {
            write!(f, "{}", self.errno.desc())
        } else {
            write!(f, "{}: {}", self.context, self.errno.desc())
        }
    }
}

impl std::error::Error for FsError {}

impl From<Errno> for FsError {
    fn from(errno: Errno) -> Self {
        FsError::errno(errno)
    }
}

impl From<std::io::Error> for FsError {
    fn from(err: std::io::Error) -> Self {
        let errno = err.raw_os_error().map(Errno::from_raw).unwrap_or(Errno::EIO);
        FsError::new(errno, err.to_string())
    }
}

impl From<rusqlite::Error> for FsError {
    fn from(err: rusqlite::Error) -> Self {
        // A full disk is the one storage failure callers must be able to tell apart.
        let errno = match &err {
            rusqlite::Error::SqliteFailure(e, _) if e.code == rusqlite::ErrorCode::DiskFull => Errno::ENOSPC,
            _ => Errno::EIO,
        };
        FsError::new(errno, format!("sqlite: {err}"))
    }
}
