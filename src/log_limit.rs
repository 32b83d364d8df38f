//! Log lines a caller can provoke as often as it likes, let through a few times a second per
//! kind, the next one that goes out saying how many were held back.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

/// At most one line of a kind per this many milliseconds: four a second.
const SPACING_MS: u64 = 250;

/// One kind of log line: a `static` at the line's call site.
///
/// ```ignore
/// static BAD: RateLimited = RateLimited::new();
/// if let Some(held) = BAD.admit() {
///     tracing::warn!("bad request: {e}{held}");
/// }
/// ```
pub struct RateLimited {
    /// When the last line went out: milliseconds since [`now_ms`]'s origin (0: never).
    last: AtomicU64,
    /// Lines held back since.
    held: AtomicU64,
}

impl RateLimited {
    pub const fn new() -> RateLimited {
        RateLimited { last: AtomicU64::new(0), held: AtomicU64::new(0) }
    }

    /// Whether a line of this kind may go out now; if so, how many were held back before it.
    pub fn admit(&self) -> Option<Held> {
        self.admit_at(now_ms())
    }

    fn admit_at(&self, now: u64) -> Option<Held> {
        let last = self.last.load(Ordering::Relaxed);
        let early = last != 0 && now.saturating_sub(last) < SPACING_MS;
        // Of threads that find the spacing over at once, one goes out.
        if early || self.last.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_err() {
            self.held.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(Held(self.held.swap(0, Ordering::Relaxed)))
    }
}

impl Default for RateLimited {
    fn default() -> RateLimited {
        RateLimited::new()
    }
}

/// How many lines of a kind were held back before this one: shown at its end, if any.
#[derive(Debug, PartialEq, Eq)]
pub struct Held(pub u64);

impl fmt::Display for Held {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            0 => Ok(()),
            n => write!(f, " ({n} more like it held back)"),
        }
    }
}

/// Milliseconds since the first call, plus one (so that 0 means "never").
fn now_ms() -> u64 {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    ORIGIN.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lets_a_few_through_a_second_and_counts_the_rest() {
        let limit = RateLimited::new();
        assert_eq!(limit.admit_at(1), Some(Held(0)));
        for t in 2..251 {
            assert_eq!(limit.admit_at(t), None, "at {t} ms");
        }
        assert_eq!(limit.admit_at(251), Some(Held(249)));
        assert_eq!(limit.admit_at(300), None);
        assert_eq!(limit.admit_at(10_000), Some(Held(1)));
        assert_eq!(limit.admit_at(10_250), Some(Held(0)));
        // A burst of a million in one second: four lines.
        let limit = RateLimited::new();
        let out = (0..1_000_000u64).filter(|i| limit.admit_at(i / 1000 + 1).is_some()).count();
        assert_eq!(out, 4);
    }

    #[test]
    fn held_shows_only_when_some_were() {
        assert_eq!(format!("x{}", Held(0)), "x");
        assert_eq!(format!("x{}", Held(3)), "x (3 more like it held back)");
    }
}
