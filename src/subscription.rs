//! Which endpoints an event goes to: event-type filters and the index the fan-out queries.
//!
//! Filters are exact types (`order.created`), dot-prefix wildcards (`order.*`, matching
//! `order.created` and `order.item.added` but neither `order` nor `orders.x`) or `*` (everything).
//! The index keeps, per tenant, a map of exact types, a map of prefixes and a match-all set, so a
//! lookup costs one hash probe per dot in the event type plus the size of the answer, however many
//! endpoints the tenant has. Tenants never see each other's endpoints: the tenant is the first key.

use std::collections::{BTreeSet, HashMap};
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::event_type::{MAX_EVENT_TYPE_LEN, is_event_type_byte};
use crate::id::{EndpointId, Tenant};

/// Most filters one endpoint may have.
pub const MAX_FILTERS: usize = 64;

/// One event-type filter.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct EventFilter(Pattern);

#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Pattern {
    /// `*`.
    All,
    /// `a.b.*`, stored as `a.b.` (with the trailing dot).
    Prefix(String),
    /// `a.b`.
    Exact(String),
}

/// Why a filter pattern is not valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FilterError {
    /// The pattern is empty.
    #[error("filter must not be empty")]
    Empty,
    /// The pattern is longer than an event type can be.
    #[error("filter {0:?} is longer than {MAX_EVENT_TYPE_LEN} bytes")]
    TooLong(String),
    /// A character outside `[A-Za-z0-9._:-]` and `*`.
    #[error("filter {0:?} may contain only A-Z, a-z, 0-9, '.', '_', ':', '-' and a final '*'")]
    BadChar(String),
    /// A segment between dots is empty (`a..b`, `.a`, `a.`).
    #[error("filter {0:?} has an empty segment")]
    EmptySegment(String),
    /// `*` somewhere other than alone or as the whole final segment (`a*`, `*.a`, `a.*.b`).
    #[error("filter {0:?}: '*' may only stand alone or as the whole last segment (e.g. order.*)")]
    MisplacedWildcard(String),
    /// More than [`MAX_FILTERS`] filters for one endpoint.
    #[error("an endpoint may have at most {MAX_FILTERS} filters, got {0}")]
    TooMany(usize),
    /// One of a list of filters is invalid.
    #[error("filter #{index}: {source}")]
    InList {
        /// Position in the list (from 0).
        index: usize,
        /// What is wrong with it.
        #[source]
        source: Box<FilterError>,
    },
}

impl EventFilter {
    /// Parses and validates a pattern.
    pub fn parse(s: &str) -> Result<EventFilter, FilterError> {
        if s.is_empty() {
            return Err(FilterError::Empty);
        }
        if s.len() > MAX_EVENT_TYPE_LEN {
            return Err(FilterError::TooLong(s.chars().take(32).collect()));
        }
        if !s.bytes().all(|b| b == b'*' || is_event_type_byte(b)) {
            return Err(FilterError::BadChar(s.to_owned()));
        }
        if s == "*" {
            return Ok(EventFilter(Pattern::All));
        }
        let segments: Vec<&str> = s.split('.').collect();
        if segments.iter().any(|seg| seg.is_empty()) {
            return Err(FilterError::EmptySegment(s.to_owned()));
        }
        let (last, init) = segments.split_last().expect("split yields at least one");
        if init.iter().any(|seg| seg.contains('*')) || (last.contains('*') && *last != "*") {
            return Err(FilterError::MisplacedWildcard(s.to_owned()));
        }
        Ok(EventFilter(if *last == "*" {
            Pattern::Prefix(s[..s.len() - 1].to_owned())
        } else {
            Pattern::Exact(s.to_owned())
        }))
    }

    /// Whether an event type matches this filter.
    pub fn matches(&self, event_type: &str) -> bool {
        match &self.0 {
            Pattern::All => true,
            Pattern::Prefix(p) => event_type.len() > p.len() && event_type.starts_with(p.as_str()),
            Pattern::Exact(e) => e == event_type,
        }
    }

    /// The pattern as written (`*`, `order.*`, `order.created`).
    pub fn as_pattern(&self) -> String {
        match &self.0 {
            Pattern::All => "*".to_owned(),
            Pattern::Prefix(p) => format!("{p}*"),
            Pattern::Exact(e) => e.clone(),
        }
    }
}

/// Parses an endpoint's list of patterns, bounded by [`MAX_FILTERS`]; errors name the position.
pub fn parse_filters<S: AsRef<str>>(patterns: &[S]) -> Result<Vec<EventFilter>, FilterError> {
    if patterns.len() > MAX_FILTERS {
        return Err(FilterError::TooMany(patterns.len()));
    }
    patterns
        .iter()
        .enumerate()
        .map(|(index, p)| {
            EventFilter::parse(p.as_ref()).map_err(|e| FilterError::InList {
                index,
                source: Box::new(e),
            })
        })
        .collect()
}

impl TryFrom<String> for EventFilter {
    type Error = FilterError;
    fn try_from(s: String) -> Result<EventFilter, FilterError> {
        EventFilter::parse(&s)
    }
}

impl From<EventFilter> for String {
    fn from(f: EventFilter) -> String {
        f.as_pattern()
    }
}

impl fmt::Display for EventFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.as_pattern())
    }
}

impl fmt::Debug for EventFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EventFilter({:?})", self.as_pattern())
    }
}

/// What the index remembers about an endpoint, to undo its entries on update or removal.
#[derive(Debug, Clone)]
struct Registration {
    tenant: Tenant,
    filters: Vec<EventFilter>,
    enabled: bool,
}

/// One tenant's enabled endpoints, by how they subscribe.
#[derive(Debug, Default)]
struct TenantIndex {
    exact: HashMap<String, BTreeSet<EndpointId>>,
    /// Keyed by prefix including its trailing dot.
    prefix: HashMap<String, BTreeSet<EndpointId>>,
    all: BTreeSet<EndpointId>,
}

impl TenantIndex {
    fn slot(&mut self, filter: &EventFilter) -> &mut BTreeSet<EndpointId> {
        match &filter.0 {
            Pattern::All => &mut self.all,
            Pattern::Prefix(p) => self.prefix.entry(p.clone()).or_default(),
            Pattern::Exact(e) => self.exact.entry(e.clone()).or_default(),
        }
    }

    fn remove(&mut self, filter: &EventFilter, id: &EndpointId) {
        let map = match &filter.0 {
            Pattern::All => {
                self.all.remove(id);
                return;
            }
            Pattern::Prefix(_) => &mut self.prefix,
            Pattern::Exact(_) => &mut self.exact,
        };
        let key = match &filter.0 {
            Pattern::Prefix(k) | Pattern::Exact(k) => k.as_str(),
            Pattern::All => unreachable!("handled above"),
        };
        if let Some(set) = map.get_mut(key) {
            set.remove(id);
            if set.is_empty() {
                map.remove(key);
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.prefix.is_empty() && self.all.is_empty()
    }
}

/// Every endpoint's subscriptions, indexed for the fan-out's question: which enabled endpoints
/// of this tenant want this event type?
#[derive(Debug, Default)]
pub struct SubscriptionIndex {
    endpoints: HashMap<EndpointId, Registration>,
    tenants: HashMap<Tenant, TenantIndex>,
}

impl SubscriptionIndex {
    /// An empty index.
    pub fn new() -> SubscriptionIndex {
        SubscriptionIndex::default()
    }

    /// Adds or replaces an endpoint's subscriptions (as read from the endpoints topic). A
    /// disabled endpoint, or one without filters, matches nothing.
    pub fn upsert(
        &mut self,
        id: EndpointId,
        tenant: Tenant,
        filters: impl IntoIterator<Item = EventFilter>,
        enabled: bool,
    ) {
        self.remove(&id);
        let mut filters: Vec<EventFilter> = filters.into_iter().collect();
        filters.sort();
        filters.dedup();
        if enabled {
            let index = self.tenants.entry(tenant.clone()).or_default();
            for f in &filters {
                index.slot(f).insert(id.clone());
            }
        }
        self.endpoints.insert(
            id,
            Registration {
                tenant,
                filters,
                enabled,
            },
        );
    }

    /// Forgets an endpoint (deleted, or a tombstone on the endpoints topic). Returns whether it
    /// was known.
    pub fn remove(&mut self, id: &EndpointId) -> bool {
        let Some(reg) = self.endpoints.remove(id) else {
            return false;
        };
        if reg.enabled
            && let Some(index) = self.tenants.get_mut(&reg.tenant)
        {
            for f in &reg.filters {
                index.remove(f, id);
            }
            if index.is_empty() {
                self.tenants.remove(&reg.tenant);
            }
        }
        true
    }

    /// The enabled endpoints of `tenant` subscribed to `event_type`, sorted by id, each once.
    pub fn matching(&self, tenant: &Tenant, event_type: &str) -> Vec<EndpointId> {
        self.matching_refs(tenant, event_type)
            .into_iter()
            .cloned()
            .collect()
    }

    /// Like [`matching`](Self::matching), borrowing the ids instead of cloning them.
    pub fn matching_refs(&self, tenant: &Tenant, event_type: &str) -> Vec<&EndpointId> {
        let Some(index) = self.tenants.get(tenant) else {
            return Vec::new();
        };
        let mut sets: Vec<&BTreeSet<EndpointId>> = Vec::new();
        if !index.all.is_empty() {
            sets.push(&index.all);
        }
        if let Some(set) = index.exact.get(event_type) {
            sets.push(set);
        }
        if !index.prefix.is_empty() {
            // Every proper dot-prefix of the type, trailing dot included: `a.b.c` probes `a.`
            // and `a.b.`. A prefix ending the type (`a.` for type `a.`) does not match.
            for (i, b) in event_type.bytes().enumerate() {
                if b == b'.'
                    && i + 1 < event_type.len()
                    && let Some(set) = index.prefix.get(&event_type[..=i])
                {
                    sets.push(set);
                }
            }
        }
        merge_sorted(&sets)
    }

    /// Number of endpoints known (enabled or not).
    pub fn len(&self) -> usize {
        self.endpoints.len()
    }

    /// Whether no endpoint is known.
    pub fn is_empty(&self) -> bool {
        self.endpoints.is_empty()
    }
}

/// Merges sorted sets into one sorted list without duplicates. There are few sets (one per
/// dot in the type, plus exact and match-all), so a linear scan for the smallest head is cheaper
/// than a heap, and far cheaper than concatenating and sorting.
fn merge_sorted<'a>(sets: &[&'a BTreeSet<EndpointId>]) -> Vec<&'a EndpointId> {
    match sets {
        [] => Vec::new(),
        [only] => only.iter().collect(),
        _ => {
            let mut out = Vec::with_capacity(sets.iter().map(|s| s.len()).max().unwrap_or(0));
            let mut iters: Vec<_> = sets.iter().map(|s| s.iter().peekable()).collect();
            while let Some(min) = iters.iter_mut().filter_map(|it| it.peek().copied()).min() {
                for it in &mut iters {
                    if it.peek() == Some(&min) {
                        it.next();
                    }
                }
                out.push(min);
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ep(s: &str) -> EndpointId {
        EndpointId::parse(s).unwrap()
    }

    fn tenant(s: &str) -> Tenant {
        Tenant::parse(s).unwrap()
    }

    fn filters(p: &[&str]) -> Vec<EventFilter> {
        parse_filters(p).unwrap()
    }

    fn ids(v: Vec<EndpointId>) -> Vec<String> {
        v.into_iter().map(String::from).collect()
    }

    #[test]
    fn filter_semantics() {
        let f = EventFilter::parse("order.*").unwrap();
        assert!(f.matches("order.created"));
        assert!(f.matches("order.item.added"));
        assert!(!f.matches("order"));
        assert!(!f.matches("order."));
        assert!(!f.matches("orders.x"));
        let e = EventFilter::parse("order.created").unwrap();
        assert!(e.matches("order.created"));
        assert!(!e.matches("order.created.v2"));
        assert!(EventFilter::parse("*").unwrap().matches("anything"));
        assert!(EventFilter::parse("a.b.*").unwrap().matches("a.b.c"));
        assert!(!EventFilter::parse("a.b.*").unwrap().matches("a.bc"));
        for p in ["*", "order.*", "a:b-c_d.e"] {
            assert_eq!(EventFilter::parse(p).unwrap().to_string(), p);
            let json = serde_json::to_string(&EventFilter::parse(p).unwrap()).unwrap();
            assert_eq!(
                serde_json::from_str::<EventFilter>(&json)
                    .unwrap()
                    .as_pattern(),
                p
            );
        }
    }

    #[test]
    fn bad_patterns_say_why() {
        use FilterError::*;
        assert_eq!(EventFilter::parse(""), Err(Empty));
        for p in ["a*", "*.a", "a.*.b", "a.b*", "**", "a.**"] {
            assert!(
                matches!(EventFilter::parse(p), Err(MisplacedWildcard(_))),
                "{p}"
            );
        }
        for p in ["a..b", ".a", "a.", ".*", "a..*"] {
            assert!(matches!(EventFilter::parse(p), Err(EmptySegment(_))), "{p}");
        }
        for p in ["a b", "a/b", "é", "a?"] {
            assert!(matches!(EventFilter::parse(p), Err(BadChar(_))), "{p}");
        }
        assert!(matches!(
            EventFilter::parse(&"a".repeat(257)),
            Err(TooLong(_))
        ));
        let err = parse_filters(&["ok", "a*"]).unwrap_err();
        assert!(
            err.to_string().starts_with("filter #1: filter \"a*\""),
            "{err}"
        );
        let many: Vec<String> = (0..=MAX_FILTERS).map(|i| format!("t{i}")).collect();
        assert_eq!(parse_filters(&many), Err(TooMany(MAX_FILTERS + 1)));
        assert!(serde_json::from_str::<EventFilter>("\"a*\"").is_err());
    }

    #[test]
    fn index_matches_sorted_unique_enabled() {
        let mut idx = SubscriptionIndex::new();
        let t = tenant("acme");
        idx.upsert(ep("ep_c"), t.clone(), filters(&["order.created"]), true);
        idx.upsert(
            ep("ep_a"),
            t.clone(),
            filters(&["order.*", "order.created"]),
            true,
        );
        idx.upsert(ep("ep_b"), t.clone(), filters(&["*"]), true);
        idx.upsert(ep("ep_d"), t.clone(), filters(&["order.item.*"]), true);
        idx.upsert(ep("ep_e"), t.clone(), filters(&["*"]), false);
        idx.upsert(ep("ep_f"), t.clone(), filters(&[]), true);
        assert_eq!(
            ids(idx.matching(&t, "order.created")),
            ["ep_a", "ep_b", "ep_c"]
        );
        assert_eq!(
            ids(idx.matching(&t, "order.item.added")),
            ["ep_a", "ep_b", "ep_d"]
        );
        assert_eq!(ids(idx.matching(&t, "order")), ["ep_b"]);
        assert_eq!(ids(idx.matching(&t, "order.")), ["ep_b"]);
        assert_eq!(ids(idx.matching(&t, "orders.x")), ["ep_b"]);
        assert_eq!(idx.len(), 6);

        // Disabling, re-filtering and removing take effect at once.
        idx.upsert(ep("ep_b"), t.clone(), filters(&["*"]), false);
        idx.upsert(ep("ep_a"), t.clone(), filters(&["user.*"]), true);
        assert_eq!(ids(idx.matching(&t, "order.created")), ["ep_c"]);
        assert!(idx.remove(&ep("ep_c")));
        assert!(!idx.remove(&ep("ep_c")));
        assert!(idx.matching(&t, "order.created").is_empty());
        idx.upsert(ep("ep_e"), t.clone(), filters(&["*"]), true);
        assert_eq!(ids(idx.matching(&t, "user.x")), ["ep_a", "ep_e"]);
    }

    #[test]
    fn tenants_are_isolated() {
        let mut idx = SubscriptionIndex::new();
        let (a, b) = (tenant("acme"), tenant("globex"));
        idx.upsert(ep("ep_1"), a.clone(), filters(&["*"]), true);
        idx.upsert(ep("ep_2"), b.clone(), filters(&["*", "x"]), true);
        assert_eq!(ids(idx.matching(&a, "x")), ["ep_1"]);
        assert_eq!(ids(idx.matching(&b, "x")), ["ep_2"]);
        assert!(idx.matching(&tenant("initech"), "x").is_empty());
        // Moving an endpoint to another tenant removes it from the first.
        idx.upsert(ep("ep_1"), b.clone(), filters(&["*"]), true);
        assert!(idx.matching(&a, "x").is_empty());
        assert_eq!(ids(idx.matching(&b, "x")), ["ep_1", "ep_2"]);
        // Emptied tenants are dropped, so the index does not grow with churn.
        assert!(!idx.tenants.contains_key(&a));
    }

    proptest! {
        /// The index answers exactly what checking every endpoint's filters would.
        #[test]
        fn index_agrees_with_brute_force(
            regs in proptest::collection::vec((
                0u8..20,
                0u8..3,
                proptest::collection::vec("(\\*|[ab](\\.[ab]){0,2}(\\.\\*)?)", 0..4),
                any::<bool>(),
            ), 0..40),
            types in proptest::collection::vec("[ab](\\.[ab]){0,3}", 1..10),
        ) {
            let mut idx = SubscriptionIndex::new();
            let mut model: HashMap<EndpointId, (Tenant, Vec<EventFilter>, bool)> = HashMap::new();
            for (id, t, pats, enabled) in regs {
                let id = ep(&format!("ep_{id}"));
                let t = tenant(&format!("t{t}"));
                let fs = parse_filters(&pats).unwrap();
                idx.upsert(id.clone(), t.clone(), fs.clone(), enabled);
                model.insert(id, (t, fs, enabled));
            }
            for t in 0..3 {
                let t = tenant(&format!("t{t}"));
                for ty in &types {
                    let mut want: Vec<EndpointId> = model
                        .iter()
                        .filter(|(_, (mt, fs, en))| *en && *mt == t && fs.iter().any(|f| f.matches(ty)))
                        .map(|(id, _)| id.clone())
                        .collect();
                    want.sort();
                    prop_assert_eq!(idx.matching(&t, ty), want);
                }
            }
        }
    }
}
