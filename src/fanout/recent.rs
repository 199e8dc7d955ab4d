//! The events one input partition fanned out lately, so that a repeat arriving moments after
//! its first copy is told apart without asking the store.

use std::collections::{HashMap, VecDeque};

use crate::id::{EventId, Tenant};

/// Event ids remembered per input partition.
const RECENT_IDS: usize = 100_000;

/// What [`Recent::check`] found of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Seen {
    /// Not among the partition's recent events: now it is.
    New,
    /// The same event (tenant, id and fingerprint) came lately: a repeat.
    Same,
    /// Another event with this tenant and id came lately: this one reuses its id.
    Different,
}

/// Recently seen (tenant, event id) pairs of one partition with the start of each event's
/// fingerprint, bounded. Event ids are unique per tenant, so two tenants may use the same id.
/// Eight bytes of a SHA-256 tell two payloads apart as well as the whole would, in an eighth of
/// the memory.
#[derive(Default)]
pub(super) struct Recent {
    seen: HashMap<(Tenant, EventId), u64>,
    order: VecDeque<(Tenant, EventId)>,
}

impl Recent {
    /// Whether the event of `tenant` and `id`, whose fingerprint starts with `fingerprint`, came
    /// lately; remembers it when it did not.
    pub(super) fn check(&mut self, tenant: &Tenant, id: &EventId, fingerprint: u64) -> Seen {
        let key = (tenant.clone(), id.clone());
        if let Some(known) = self.seen.get(&key) {
            return if *known == fingerprint {
                Seen::Same
            } else {
                Seen::Different
            };
        }
        if self.order.len() == RECENT_IDS
            && let Some(old) = self.order.pop_front()
        {
            self.seen.remove(&old);
        }
        self.seen.insert(key.clone(), fingerprint);
        self.order.push_back(key);
        Seen::New
    }
}

/// The first eight bytes of a fingerprint in lowercase hex (as `InputEvent::fingerprint_hex`
/// writes it), as a number; 0 for a string too short to hold them.
pub(super) fn fingerprint_start(hex: &str) -> u64 {
    hex.get(..16)
        .and_then(|s| u64::from_str_radix(s, 16).ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeat_is_told_from_a_reused_id_and_tenants_are_apart() {
        let mut recent = Recent::default();
        let (acme, globex) = (
            Tenant::parse("acme").unwrap(),
            Tenant::parse("globex").unwrap(),
        );
        let id = EventId::parse("evt_1").unwrap();
        assert_eq!(recent.check(&acme, &id, 7), Seen::New);
        assert_eq!(recent.check(&acme, &id, 7), Seen::Same);
        assert_eq!(recent.check(&acme, &id, 8), Seen::Different);
        assert_eq!(
            recent.check(&globex, &id, 8),
            Seen::New,
            "another tenant's id"
        );
    }

    #[test]
    fn the_oldest_event_is_forgotten_first() {
        let mut recent = Recent::default();
        let acme = Tenant::parse("acme").unwrap();
        let id = |n: usize| EventId::parse(format!("evt_{n}")).unwrap();
        for n in 0..=RECENT_IDS {
            assert_eq!(recent.check(&acme, &id(n), 1), Seen::New);
        }
        assert_eq!(recent.check(&acme, &id(RECENT_IDS), 1), Seen::Same);
        assert_eq!(recent.check(&acme, &id(0), 1), Seen::New, "forgotten");
    }

    #[test]
    fn the_start_of_a_fingerprint_is_read_from_its_hex() {
        assert_eq!(fingerprint_start("00000000000000ff99"), 0xff);
        assert_eq!(fingerprint_start("ffffffffffffffff"), u64::MAX);
        assert_eq!(fingerprint_start("abc"), 0);
    }
}
