//! The event type: the name subscriptions filter on and receivers see in the body's `type`.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Longest event type accepted.
pub const MAX_EVENT_TYPE_LEN: usize = 256;

/// An event type: 1 to 256 characters of `[A-Za-z0-9._:-]`. Dots separate the segments that
/// subscription filters match on.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct EventType(String);

/// Why a string is not a valid event type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventTypeError {
    /// Empty.
    #[error("event type must not be empty")]
    Empty,
    /// Longer than [`MAX_EVENT_TYPE_LEN`].
    #[error("event type is {0} bytes long; at most {MAX_EVENT_TYPE_LEN} are allowed")]
    TooLong(usize),
    /// A character outside `[A-Za-z0-9._:-]`.
    #[error("event type may contain only A-Z, a-z, 0-9, '.', '_', ':' and '-'")]
    BadChar,
}

impl EventType {
    /// Checks and wraps an event type.
    pub fn parse(s: impl Into<String>) -> Result<EventType, EventTypeError> {
        let s = s.into();
        if s.is_empty() {
            return Err(EventTypeError::Empty);
        }
        if s.len() > MAX_EVENT_TYPE_LEN {
            return Err(EventTypeError::TooLong(s.len()));
        }
        if !s.bytes().all(is_event_type_byte) {
            return Err(EventTypeError::BadChar);
        }
        Ok(EventType(s))
    }

    /// The type as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Whether a byte may appear in an event type.
pub(crate) fn is_event_type_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-')
}

impl TryFrom<String> for EventType {
    type Error = EventTypeError;
    fn try_from(s: String) -> Result<EventType, EventTypeError> {
        EventType::parse(s)
    }
}

impl From<EventType> for String {
    fn from(t: EventType) -> String {
        t.0
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EventType({:?})", self.0)
    }
}

impl AsRef<str> for EventType {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_type_rules() {
        assert!(EventType::parse("a.B_c:d-9").is_ok());
        assert_eq!(EventType::parse(""), Err(EventTypeError::Empty));
        assert_eq!(
            EventType::parse("x".repeat(257)),
            Err(EventTypeError::TooLong(257))
        );
        assert_eq!(EventType::parse("a*"), Err(EventTypeError::BadChar));
        assert!(serde_json::from_str::<EventType>("\"é\"").is_err());
    }
}
