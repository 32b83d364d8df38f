//! The names of a tool's temporary files (a whole write's new content, renamed over its file
//! once written): made here, and recognised here so that the gate hides every one of them.
//!
//! A temporary is the daemon's own while it is written: through the mount or a tool it could
//! otherwise be opened, written or linked before the rename, and what an approver approved
//! would not be what landed (or an unapproved writer would keep a descriptor or a second
//! name of the approved file). So every name of this form is hidden from both doors, under
//! any rule set: absent from listings, ENOENT to look up, EACCES to create. That covers the
//! ones a crash left behind too.

/// The name of a whole write's temporary file beside `name`: `.NAME.agentvfs-PID-N.tmp`, with
/// `NAME` cut short (at a character boundary) so that the whole stays within the 255 bytes a
/// name may have, since `NAME` itself may have up to 255.
pub fn temporary_name(name: &str, pid: u32, serial: u64) -> String {
    let suffix = format!(".agentvfs-{pid}-{serial}.tmp");
    let room = 255 - 1 - suffix.len();
    format!(".{}{suffix}", crate::display::prefix_within(name, room))
}

/// Whether `name` has the form [`temporary_name`] gives (any daemon's, any file's).
pub fn is_temporary_name(name: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let Some(rest) = name.strip_suffix(".tmp") else { return false };
    let Some((rest, serial)) = rest.rsplit_once('-') else { return false };
    let Some((prefix, pid)) = rest.rsplit_once(".agentvfs-") else { return false };
    digits(serial) && digits(pid) && prefix.starts_with('.')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_temporary_name_fits_beside_the_longest_name_and_is_recognised() {
        assert_eq!(temporary_name("f.txt", 12, 3), ".f.txt.agentvfs-12-3.tmp");
        for name in ["f.txt".to_string(), "n".repeat(255), "é".repeat(127), format!("{}é", "n".repeat(228))]
        {
            let temporary = temporary_name(&name, u32::MAX, u64::MAX);
            assert!(temporary.len() <= 255, "{}", temporary.len());
            assert!(crate::vpath::VPath::check_name(temporary.as_bytes()).is_ok());
            assert!(is_temporary_name(&temporary), "{temporary}");
        }
        assert!(
            is_temporary_name("..agentvfs-1-2.tmp"),
            "a temporary of the name `.agentvfs-1-2.tmp`... or `.`"
        );
        for other in [
            "f.txt",
            ".f.txt.agentvfs-12-3.tmp~",
            "f.txt.agentvfs-12-3.tmp",
            ".f.txt.agentvfs-12-.tmp",
            ".f.txt.agentvfs--3.tmp",
            ".f.txt.agentvfs-1x-3.tmp",
            ".f.txt.agentvfs-12-3",
            ".agentvfs-12-3.tmp",
        ] {
            assert!(!is_temporary_name(other), "{other}");
        }
    }
}
