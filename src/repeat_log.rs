//! A log for lasting problems: each kind is logged once when it starts, then at most every
//! [`LOG_REPEAT`] with how many reports were held back.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often a lasting problem is logged again while it lasts: a client that has lost every
/// broker, a topic that refuses records, an attempt log that cannot be written.
pub const LOG_REPEAT: Duration = Duration::from_secs(30);

/// Reports of lasting problems by kind, so that each kind is logged once when it starts and then
/// at most every [`LOG_REPEAT`] with how many reports were held back, instead of once by every
/// record that meets it. Every unsettled record retries on its own, so a topic that refuses
/// records or a store that is down fails thousands of them every few seconds. Most kinds come
/// from fixed sets (a topic and an error code, a store error's kind); where they do not (an
/// endpoint), the log keeps at most `max_kinds`, forgetting those last logged a repeat interval
/// ago or more when it is full (they would be logged again anyway).
#[derive(Debug)]
pub struct RepeatLog {
    /// Per kind, when it was last logged and how many reports came since.
    kinds: Mutex<BTreeMap<String, (Instant, u64)>>,
    max_kinds: usize,
}

impl RepeatLog {
    /// An empty log, for a `static`.
    pub const fn new() -> Self {
        Self::bounded(usize::MAX)
    }

    /// An empty log keeping at most `max_kinds` kinds.
    pub const fn bounded(max_kinds: usize) -> Self {
        RepeatLog {
            kinds: Mutex::new(BTreeMap::new()),
            max_kinds,
        }
    }

    /// `None` when this report of `kind` is held back, else how many were held back before it.
    /// A new kind that finds the log full of kinds logged within the repeat interval is
    /// logged, but not kept.
    pub fn admit(&self, kind: &str, now: Instant) -> Option<u64> {
        let mut kinds = self.kinds.lock().unwrap_or_else(|e| e.into_inner());
        match kinds.get_mut(kind) {
            Some((at, held)) if now.saturating_duration_since(*at) < LOG_REPEAT => {
                *held += 1;
                None
            }
            Some(last) => {
                let held = last.1;
                *last = (now, 0);
                Some(held)
            }
            None => {
                if kinds.len() >= self.max_kinds {
                    kinds.retain(|_, (at, _)| now.saturating_duration_since(*at) < LOG_REPEAT);
                }
                if kinds.len() < self.max_kinds {
                    kinds.insert(kind.to_owned(), (now, 0));
                }
                Some(0)
            }
        }
    }
}

impl Default for RepeatLog {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lasting_problems_are_logged_once_per_kind_then_every_repeat_interval() {
        let log = RepeatLog::new();
        let t0 = Instant::now();
        assert_eq!(log.admit("dlq MessageSizeTooLarge", t0), Some(0));
        assert_eq!(log.admit("retry.5s MessageSizeTooLarge", t0), Some(0));
        assert_eq!(
            log.admit("dlq MessageTimedOut", t0),
            Some(0),
            "a new error on the same topic is logged at once"
        );
        for ms in [1, 10, 1_000, 29_999] {
            let at = t0 + Duration::from_millis(ms);
            assert_eq!(log.admit("dlq MessageSizeTooLarge", at), None, "at {ms} ms");
        }
        assert_eq!(
            log.admit("dlq MessageSizeTooLarge", t0 + LOG_REPEAT),
            Some(4)
        );
        assert_eq!(
            log.admit("retry.5s MessageSizeTooLarge", t0 + LOG_REPEAT),
            Some(0)
        );
        assert_eq!(
            log.admit("dlq MessageSizeTooLarge", t0 + LOG_REPEAT * 2),
            Some(0),
            "nothing held back since the last line"
        );
    }

    /// A log of endpoints stays bounded: full, it forgets the kinds not logged within the
    /// repeat interval; full of recent ones, a new kind is logged but not kept.
    #[test]
    fn a_bounded_repeat_log_forgets_old_kinds_when_full() {
        let log = RepeatLog::bounded(2);
        let t0 = Instant::now();
        let later = t0 + LOG_REPEAT;
        for (kind, at, want, why) in [
            ("ep_a", t0, Some(0), "new"),
            ("ep_b", t0, Some(0), "new"),
            ("ep_c", t0, Some(0), "logged although the log is full"),
            ("ep_c", t0, Some(0), "and not kept"),
            ("ep_a", t0, None, "the kept ones are held back"),
            ("ep_d", later, Some(0), "the old ones make room"),
            ("ep_d", later, None, "kept"),
        ] {
            assert_eq!(log.admit(kind, at), want, "{kind}: {why}");
        }
        assert_eq!(log.kinds.lock().unwrap().len(), 1);
    }
}
