//! The injected clock. Everything that stamps or compares times asks a
//! `Clock` instead of the system, so tests can pin or advance time; SQL gets
//! `now` as a parameter and never calls the database's clock.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use chrono::{DateTime, SecondsFormat, TimeZone, Utc};

/// A source of "now" in milliseconds since the Unix epoch.
#[derive(Clone)]
pub struct Clock(Arc<Source>);

enum Source {
    System,
    Manual(AtomicI64),
}

impl Clock {
    /// The real wall clock.
    pub fn system() -> Self {
        Self(Arc::new(Source::System))
    }

    /// A clock that only moves when told to.
    pub fn manual(start_ms: i64) -> Self {
        Self(Arc::new(Source::Manual(AtomicI64::new(start_ms))))
    }

    /// Milliseconds since the Unix epoch.
    pub fn now_ms(&self) -> i64 {
        match &*self.0 {
            Source::System => Utc::now().timestamp_millis(),
            Source::Manual(t) => t.load(Ordering::SeqCst),
        }
    }

    /// Now as a chrono timestamp.
    pub fn now(&self) -> DateTime<Utc> {
        ms_to_datetime(self.now_ms())
    }

    /// Moves a manual clock forward; a system clock ignores it.
    pub fn advance_ms(&self, ms: i64) {
        if let Source::Manual(t) = &*self.0 {
            t.fetch_add(ms, Ordering::SeqCst);
        }
    }
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &*self.0 {
            Source::System => f.write_str("Clock::system"),
            Source::Manual(t) => write!(f, "Clock::manual({})", t.load(Ordering::SeqCst)),
        }
    }
}

/// Milliseconds since the epoch as a UTC timestamp.
pub fn ms_to_datetime(ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms)
        .single()
        .unwrap_or(DateTime::<Utc>::UNIX_EPOCH)
}

/// Milliseconds since the epoch as RFC 3339 with milliseconds, `Z` suffix.
pub fn rfc3339(ms: i64) -> String {
    ms_to_datetime(ms).to_rfc3339_opts(SecondsFormat::Millis, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let c = Clock::manual(1_000);
        assert_eq!(c.now_ms(), 1_000);
        c.advance_ms(500);
        assert_eq!(c.now_ms(), 1_500);
        assert_eq!(rfc3339(1_500), "1970-01-01T00:00:01.500Z");
    }
}
