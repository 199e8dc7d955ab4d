//! Per-endpoint admission: how many requests may be in flight to an endpoint, and how fast they
//! may start.
//!
//! A [`Lane`] combines an adaptive concurrency limit with an optional token bucket:
//! - The limit starts at the endpoint's configured `max_in_flight` (the operator's word on what
//!   the receiver takes; starting lower would throttle every lane rebuilt after a rebalance or an
//!   idle eviction) and adapts AIMD-style: an overload signal (timeout, 408, 429, 5xx) halves it,
//!   down to 1; each healthy answer adds `1/limit`, so a full window of healthy answers adds one,
//!   up to the ceiling. Overload signals from requests sent before the last decrease are ignored,
//!   so a burst of timeouts from one window halves the limit once, not once per request.
//! - The token bucket (`rate_limit_per_s`, burst `max(1, rate)`) caps how fast requests start.
//!
//! There is no queue inside a lane: [`Lane::try_acquire`] either hands out a [`LanePermit`] or
//! says the lane is [`Full`], and the caller parks the record durably in a delay tier. Memory is
//! bounded by construction, however slow the endpoint.
//!
//! [`Lanes`] owns a lane and a [`Breaker`] per endpoint for one partition, evicts idle ones, and
//! bounds how many it holds. It also keeps a moving average of each endpoint's answer time, so
//! that [`Lanes::throughput`] can say how many requests a second the endpoint completes at its
//! current limit: the caller bounds what it queues for a slow endpoint by that. Everything is plain data on injected time (`tokio::time::Instant`);
//! the partition's task owns it and calls it from one place, so there is no locking.
//!
//! Permits are explicit values rather than drop guards: the permit travels with the in-flight
//! request (through a spawned task and back over a channel), and giving it back needs `&mut` to
//! the lane, which only the partition task has. A permit is `#[must_use]` and not `Clone`.

use std::collections::HashMap;
use std::time::Duration;

use serde::Deserialize;
use tokio::time::Instant;

use crate::breaker::{Admission, Breaker, BreakerConfig, BreakerState, Outcome, Transition};
use crate::id::EndpointId;

pub use crate::endpoint::{MAX_IN_FLIGHT_CEILING, MAX_RATE_PER_S, MIN_RATE_PER_S};
/// Factor applied to the concurrency limit on an overload signal.
const DECREASE_FACTOR: f64 = 0.5;
/// How long an answer time counts in an endpoint's average: its weight falls by e each
/// `ANSWER_TIME_HORIZON` after it. The average follows what an endpoint did over about the
/// last second, however many answers that is: a receiver that slows down shows within a
/// second or two, and one request held up a moment (a pause on a busy machine) among a fast
/// endpoint's thousands does not make it look slow.
const ANSWER_TIME_HORIZON: Duration = Duration::from_secs(1);

/// How many times as long as the other endpoints' answers an endpoint's must take for its
/// answer time to be its own (see [`Lanes::throughput`]). Healthy endpoints slowed down
/// together, in a process short of CPU, differ by less.
const SLOWER_THAN_THE_REST: f64 = 4.0;

/// How many answers, weighted by age, the other endpoints must have given for their mean to
/// count (see [`Lanes::others_answer_time`]): half a second of one slow endpoint's (16 slots,
/// 1 s answers).
const MIN_OTHER_ANSWERS: f64 = 8.0;

/// One endpoint's admission settings, taken from the endpoint's record.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LaneConfig {
    /// The concurrency ceiling: never more requests in flight than this.
    pub max_in_flight: u32,
    /// Requests started per second at most (burst `max(1, rate)`); `None` for no rate limit.
    #[serde(default)]
    pub rate_limit_per_s: Option<f64>,
}

/// A [`LaneConfig`] that cannot work: which key, and what it must be.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LaneConfigError {
    /// `max_in_flight` is out of range.
    #[error("endpoint.max_in_flight must be between 1 and {MAX_IN_FLIGHT_CEILING}, got {0}")]
    MaxInFlight(u32),
    /// `rate_limit_per_s` is out of range or not a number.
    #[error(
        "endpoint.rate_limit_per_s must be between {MIN_RATE_PER_S} and {MAX_RATE_PER_S}, got {0}"
    )]
    RateLimit(f64),
}

impl LaneConfig {
    /// Checks the settings, naming the key that is wrong.
    pub fn validate(&self) -> Result<(), LaneConfigError> {
        if !(1..=MAX_IN_FLIGHT_CEILING).contains(&self.max_in_flight) {
            return Err(LaneConfigError::MaxInFlight(self.max_in_flight));
        }
        if let Some(rate) = self.rate_limit_per_s
            && !(MIN_RATE_PER_S..=MAX_RATE_PER_S).contains(&rate)
        {
            return Err(LaneConfigError::RateLimit(rate));
        }
        Ok(())
    }

    /// The settings with every value forced into range, so a bad endpoint record slows its own
    /// endpoint down rather than stalling the partition.
    fn clamped(self) -> LaneConfig {
        LaneConfig {
            max_in_flight: self.max_in_flight.clamp(1, MAX_IN_FLIGHT_CEILING),
            rate_limit_per_s: self.rate_limit_per_s.map(|r| {
                if r.is_nan() {
                    MIN_RATE_PER_S
                } else {
                    r.clamp(MIN_RATE_PER_S, MAX_RATE_PER_S)
                }
            }),
        }
    }
}

/// Why a lane admitted nothing. The caller parks the record; the lane keeps no queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// As many requests are in flight as the current limit allows. When one finishes is
    /// unknown, so there is no `retry_at`.
    Concurrency,
    /// The rate limit's bucket is empty; the next token arrives at `retry_at`.
    RateLimited {
        /// When a request may start.
        retry_at: Instant,
    },
}

impl Full {
    /// When to try again, if known.
    pub fn retry_at(&self) -> Option<Instant> {
        match self {
            Full::Concurrency => None,
            Full::RateLimited { retry_at } => Some(*retry_at),
        }
    }
}

/// One admitted request's slot in a [`Lane`]; give it back with [`Lane::release`].
#[must_use = "a permit not released holds its lane slot forever"]
#[derive(Debug, PartialEq, Eq)]
pub struct LanePermit {
    /// The lane's decrease epoch when the request started.
    epoch: u64,
}

#[derive(Debug, Clone)]
struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    /// `None` until first used: a bucket starts full.
    refilled_at: Option<Instant>,
}

impl TokenBucket {
    fn new(rate: f64) -> TokenBucket {
        let burst = rate.max(1.0);
        TokenBucket {
            rate,
            burst,
            tokens: burst,
            refilled_at: None,
        }
    }

    fn refill(&mut self, now: Instant) {
        if let Some(at) = self.refilled_at {
            let elapsed = now.saturating_duration_since(at).as_secs_f64();
            self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        }
        self.refilled_at = Some(now);
    }

    /// `Ok` when a token is available, else when the next one will be.
    fn check(&mut self, now: Instant) -> Result<(), Instant> {
        self.refill(now);
        // Float refills drift by ulps; a token that is all but there counts.
        if self.tokens >= 1.0 - 1e-9 {
            Ok(())
        } else {
            let wait = (1.0 - self.tokens) / self.rate;
            // Rounded up, so the caller coming back at `retry_at` finds the token there.
            Err(now + Duration::from_secs_f64(wait) + Duration::from_nanos(1))
        }
    }

    fn take(&mut self) {
        self.tokens = (self.tokens - 1.0).max(0.0);
    }
}

/// One endpoint's admission control.
#[derive(Debug, Clone)]
pub struct Lane {
    config: LaneConfig,
    /// The adaptive limit, in `[1, max_in_flight]`; admission uses its floor.
    limit: f64,
    in_flight: u32,
    /// Bumped at each decrease; permits from older epochs carry no overload signal.
    epoch: u64,
    bucket: Option<TokenBucket>,
}

impl Lane {
    /// A lane at full concurrency with a full token bucket. Out-of-range settings are clamped
    /// (validate them where the endpoint is written).
    pub fn new(config: LaneConfig) -> Lane {
        let config = config.clamped();
        Lane {
            config,
            limit: f64::from(config.max_in_flight),
            in_flight: 0,
            epoch: 0,
            bucket: config.rate_limit_per_s.map(TokenBucket::new),
        }
    }

    /// Admits one request, or says why not. A refusal changes nothing but the bucket's refill.
    pub fn try_acquire(&mut self, now: Instant) -> Result<LanePermit, Full> {
        self.check(now)?;
        Ok(self.take())
    }

    fn check(&mut self, now: Instant) -> Result<(), Full> {
        if self.in_flight >= self.limit() {
            return Err(Full::Concurrency);
        }
        if let Some(bucket) = &mut self.bucket {
            bucket
                .check(now)
                .map_err(|retry_at| Full::RateLimited { retry_at })?;
        }
        Ok(())
    }

    fn take(&mut self) -> LanePermit {
        if let Some(bucket) = &mut self.bucket {
            bucket.take();
        }
        self.in_flight += 1;
        LanePermit { epoch: self.epoch }
    }

    /// Gives a slot back with what the request said about the endpoint (`None`: nothing, e.g.
    /// the request was never sent).
    pub fn release(&mut self, permit: LanePermit, outcome: Option<Outcome>) {
        self.in_flight = self.in_flight.saturating_sub(1);
        let ceiling = f64::from(self.config.max_in_flight);
        match outcome {
            Some(Outcome::Healthy) => {
                self.limit = (self.limit + 1.0 / self.limit).min(ceiling);
            }
            Some(Outcome::Overload) if permit.epoch == self.epoch => {
                self.limit = (self.limit * DECREASE_FACTOR).max(1.0);
                self.epoch += 1;
            }
            // Unreachable says nothing about capacity (the breaker handles it); an overload from
            // before the last decrease was already answered by it.
            Some(Outcome::Overload | Outcome::Unreachable) | None => {}
        }
    }

    /// Requests in flight now.
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// The current concurrency limit (at least 1, at most `max_in_flight`).
    pub fn limit(&self) -> u32 {
        // Truncation is the point: 2.9 admits 2. The limit never leaves [1, 10_000].
        self.limit as u32
    }

    /// The settings in use (after clamping).
    pub fn config(&self) -> LaneConfig {
        self.config
    }

    /// Applies new endpoint settings. A limit that had not been cut by overload follows a raised
    /// ceiling at once (the operator asked for more); a cut limit keeps earning its way back. A
    /// lowered ceiling applies at once; requests already in flight finish.
    pub fn update_config(&mut self, config: LaneConfig) {
        let config = config.clamped();
        if config == self.config {
            return;
        }
        let old_ceiling = f64::from(self.config.max_in_flight);
        let new_ceiling = f64::from(config.max_in_flight);
        self.limit = if self.limit >= old_ceiling {
            new_ceiling
        } else {
            self.limit.min(new_ceiling)
        };
        if config.rate_limit_per_s != self.config.rate_limit_per_s {
            let carried = self.bucket.take();
            self.bucket = config.rate_limit_per_s.map(|rate| {
                let mut bucket = TokenBucket::new(rate);
                // Changing the rate must not hand out a fresh burst.
                if let Some(old) = carried {
                    bucket.tokens = old.tokens.min(bucket.burst);
                    bucket.refilled_at = old.refilled_at;
                }
                bucket
            });
        }
        self.config = config;
    }
}

/// Settings of the per-partition lane map (`delivery.lanes` in the configuration file).
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LanesConfig {
    /// How many endpoints one partition keeps lanes for at most.
    pub max_lanes: usize,
    /// A lane with nothing in flight and no use for this long is dropped by
    /// [`Lanes::evict_idle`]; its signals are stale by then.
    #[serde(with = "humantime_serde")]
    pub idle_after: Duration,
    /// The breaker settings every endpoint's breaker uses.
    pub breaker: BreakerConfig,
}

impl Default for LanesConfig {
    /// 10 000 lanes, idle after 10 min, default breaker.
    fn default() -> Self {
        LanesConfig {
            max_lanes: 10_000,
            idle_after: Duration::from_secs(600),
            breaker: BreakerConfig::default(),
        }
    }
}

/// A [`LanesConfig`] that cannot work.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LanesConfigError {
    /// `max_lanes` is zero.
    #[error("delivery.lanes.max_lanes must be >= 1")]
    MaxLanes,
    /// `idle_after` is zero.
    #[error("delivery.lanes.idle_after must be greater than zero")]
    IdleAfter,
    /// The breaker settings are wrong.
    #[error(transparent)]
    Breaker(#[from] crate::breaker::BreakerConfigError),
}

impl LanesConfig {
    /// Checks the settings, naming the key that is wrong.
    pub fn validate(&self) -> Result<(), LanesConfigError> {
        if self.max_lanes == 0 {
            return Err(LanesConfigError::MaxLanes);
        }
        if self.idle_after.is_zero() {
            return Err(LanesConfigError::IdleAfter);
        }
        self.breaker.validate()?;
        Ok(())
    }
}

/// Why [`Lanes::try_acquire`] admitted nothing: park the record until `retry_at()` (or the
/// smallest delay tier when it is `None`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The endpoint's breaker is open; the next probe may go at `retry_at`.
    BreakerOpen {
        /// When the next probe may go.
        retry_at: Instant,
    },
    /// The lane's concurrency limit is reached.
    Concurrency,
    /// The lane's rate limit is reached.
    RateLimited {
        /// When the next request may start.
        retry_at: Instant,
    },
    /// The partition holds `max_lanes` lanes and none is idle enough to evict.
    TooManyLanes,
}

impl Refusal {
    /// When to try again, if known.
    pub fn retry_at(&self) -> Option<Instant> {
        match self {
            Refusal::BreakerOpen { retry_at } | Refusal::RateLimited { retry_at } => {
                Some(*retry_at)
            }
            Refusal::Concurrency | Refusal::TooManyLanes => None,
        }
    }

    /// The stable string form, for metric labels.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Refusal::BreakerOpen { .. } => "breaker_open",
            Refusal::Concurrency => "concurrency",
            Refusal::RateLimited { .. } => "rate_limited",
            Refusal::TooManyLanes => "too_many_lanes",
        }
    }
}

impl From<Full> for Refusal {
    fn from(full: Full) -> Refusal {
        match full {
            Full::Concurrency => Refusal::Concurrency,
            Full::RateLimited { retry_at } => Refusal::RateLimited { retry_at },
        }
    }
}

/// One admitted request to an endpoint: a lane slot plus the breaker's admission. Give it back
/// with [`Lanes::release`].
#[must_use = "a permit not released holds its lane slot (and maybe the breaker's probe)"]
#[derive(Debug)]
pub struct Permit {
    endpoint: EndpointId,
    /// When the request was admitted: its answer time is measured from here.
    started: Instant,
    /// Which incarnation of the endpoint's entry issued it: a permit outliving its lane (removed,
    /// evicted and re-created) must not touch the new one.
    generation: u64,
    lane: LanePermit,
    admission: Admission,
}

impl Permit {
    /// The endpoint this permit is for.
    pub fn endpoint(&self) -> &EndpointId {
        &self.endpoint
    }

    /// Whether this request is the half-open breaker's probe.
    pub fn is_probe(&self) -> bool {
        self.admission == Admission::Probe
    }
}

/// How long an endpoint takes to answer, measured from admission to release: the mean of its
/// answers, each weighted down by its age (see [`ANSWER_TIME_HORIZON`]). Known once its
/// answers span a horizon: from one round of answers after a quiet spell it is `None`.
///
/// Weighting by age rather than by count matters for fast endpoints: with each answer given a
/// fixed share, an endpoint answering thousands of requests a second would be judged by its
/// last few milliseconds, and a single slow request would put its average far above its
/// usual answers. Its send rate would then read far below what it sends, and the delivery
/// stage would park a healthy backlog as if the endpoint were slow.
///
/// The first answers after a quiet spell are no evidence on their own: a burst after a pause
/// opens new connections (and TLS sessions) and meets a busy machine, so its first round of
/// answers comes slowly; judged by it, the endpoint's backlog would be parked.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct AnswerTime {
    /// The answers' seconds and their count, both weighted by age as of `at`.
    secs: f64,
    weight: f64,
    /// When the last answer came.
    at: Option<Instant>,
    /// When the first answer after the last quiet spell came.
    since: Option<Instant>,
}

impl AnswerTime {
    fn observe(&mut self, took: Duration, now: Instant) {
        // Quiet: no answer for three horizons, or three answer times for a slow endpoint
        // (whose rounds come that far apart).
        let quiet = ANSWER_TIME_HORIZON
            .as_secs_f64()
            .max(self.mean().unwrap_or(0.0))
            * 3.0;
        if self
            .at
            .is_none_or(|at| now.saturating_duration_since(at).as_secs_f64() > quiet)
        {
            self.since = Some(now);
        }
        let keep = self.kept(now);
        self.secs = self.secs * keep + took.as_secs_f64();
        self.weight = self.weight * keep + 1.0;
        self.at = Some(now);
    }

    fn mean(self) -> Option<f64> {
        (self.weight > 0.0)
            .then(|| self.secs / self.weight)
            .filter(|s| *s > 0.0)
    }

    /// How much of its weight the answers so far keep at `now` (no earlier than the last
    /// answer): 1/e per horizon since the last answer, nothing before the first.
    fn kept(self, now: Instant) -> f64 {
        self.at.map_or(0.0, |at| {
            let age = now.saturating_duration_since(at).as_secs_f64();
            (-age / ANSWER_TIME_HORIZON.as_secs_f64()).exp()
        })
    }

    /// The answers' weighted seconds and count as of `now` (no earlier than the last answer).
    fn sums_at(self, now: Instant) -> (f64, f64) {
        let keep = self.kept(now);
        (self.secs * keep, self.weight * keep)
    }

    /// The average in seconds, once the answers since the last quiet spell span a horizon and
    /// took measurable time.
    fn secs(self) -> Option<f64> {
        let span = self.at?.saturating_duration_since(self.since?);
        if span < ANSWER_TIME_HORIZON {
            return None;
        }
        self.mean()
    }
}

#[derive(Debug)]
struct Entry {
    lane: Lane,
    breaker: Breaker,
    answer_time: AnswerTime,
    generation: u64,
    last_used: Instant,
    /// When the lane last made progress: a request finished, or one started on an idle lane.
    progress_at: Instant,
}

/// The lanes and breakers of one partition's endpoints.
#[derive(Debug)]
pub struct Lanes {
    config: LanesConfig,
    entries: HashMap<EndpointId, Entry>,
    next_generation: u64,
    /// Every endpoint's answers together: what an answer takes here at all (see
    /// [`Lanes::throughput`]).
    all_answers: AnswerTime,
}

impl Lanes {
    /// An empty map, for a freshly assigned partition (state is rebuilt from nothing after a
    /// rebalance). `config` should have passed [`LanesConfig::validate`].
    pub fn new(config: LanesConfig) -> Lanes {
        Lanes {
            config,
            entries: HashMap::new(),
            next_generation: 0,
            all_answers: AnswerTime::default(),
        }
    }

    /// Admits one request to `endpoint`, creating its lane from `lane_config` if needed (and
    /// applying `lane_config` if it changed). Checks the breaker first, so an open endpoint
    /// reports when its probe may go; a probe the lane cannot take is given back.
    pub fn try_acquire(
        &mut self,
        endpoint: &EndpointId,
        lane_config: LaneConfig,
        now: Instant,
    ) -> Result<Permit, Refusal> {
        if !self.entries.contains_key(endpoint) {
            if self.entries.len() >= self.config.max_lanes && !self.evict_one() {
                return Err(Refusal::TooManyLanes);
            }
            self.next_generation += 1;
            self.entries.insert(
                endpoint.clone(),
                Entry {
                    lane: Lane::new(lane_config),
                    breaker: Breaker::new(self.config.breaker),
                    answer_time: AnswerTime::default(),
                    generation: self.next_generation,
                    last_used: now,
                    progress_at: now,
                },
            );
        }
        let entry = self
            .entries
            .get_mut(endpoint)
            .expect("inserted above when missing");
        entry.last_used = now;
        entry.lane.update_config(lane_config);
        let admission = entry.breaker.admit(now);
        if let Admission::Rejected { retry_at } = admission {
            return Err(Refusal::BreakerOpen { retry_at });
        }
        if let Err(full) = entry.lane.check(now) {
            entry.breaker.abandon(admission);
            return Err(full.into());
        }
        if entry.lane.in_flight() == 0 {
            entry.progress_at = now;
        }
        Ok(Permit {
            endpoint: endpoint.clone(),
            started: now,
            generation: entry.generation,
            lane: entry.lane.take(),
            admission,
        })
    }

    /// Gives a permit back with what the request said about the endpoint (`None` when it was
    /// never sent). Returns the breaker transition it caused, for telemetry. A permit whose lane
    /// is gone is dropped quietly. A request the endpoint answered in time, and not with an
    /// overload status, counts its time from admission to `now` in the endpoint's answer time.
    /// Timeouts do not: a receiver that hung for a while would otherwise be taken, once it
    /// answers again, for one that takes the whole HTTP timeout per request, and its backlog
    /// would be parked and handed back at that pace long after it recovered (the breaker and
    /// the stalled check deal with a hanging endpoint).
    pub fn release(
        &mut self,
        permit: Permit,
        outcome: Option<Outcome>,
        now: Instant,
    ) -> Option<Transition> {
        self.release_answered(permit, outcome, now, now)
    }

    /// [`Lanes::release`] for a request whose answer came at `answered`: its answer time ends
    /// there, not when its stage got round to the release. A stage behind on its work is no
    /// slower endpoint.
    pub fn release_answered(
        &mut self,
        permit: Permit,
        outcome: Option<Outcome>,
        now: Instant,
        answered: Instant,
    ) -> Option<Transition> {
        let entry = self.entries.get_mut(&permit.endpoint)?;
        if entry.generation != permit.generation {
            return None;
        }
        entry.last_used = now;
        entry.progress_at = now;
        if outcome == Some(Outcome::Healthy) {
            let took = answered.saturating_duration_since(permit.started);
            let at = answered.min(now);
            entry.answer_time.observe(took, at);
            self.all_answers.observe(took, at);
        }
        entry.lane.release(permit.lane, outcome);
        match outcome {
            Some(outcome) => entry.breaker.record(permit.admission, outcome, now),
            None => {
                entry.breaker.abandon(permit.admission);
                None
            }
        }
    }

    /// Applies an endpoint's changed settings to its lane, if it has one.
    pub fn update_config(&mut self, endpoint: &EndpointId, lane_config: LaneConfig) {
        if let Some(entry) = self.entries.get_mut(endpoint) {
            entry.lane.update_config(lane_config);
        }
    }

    /// Drops an endpoint's lane and breaker (endpoint deleted or disabled). Permits still out
    /// for it are ignored when released.
    pub fn remove(&mut self, endpoint: &EndpointId) -> bool {
        self.entries.remove(endpoint).is_some()
    }

    /// Drops every lane with nothing in flight that was last used `idle_after` ago or earlier.
    /// Returns how many were dropped. Call it now and then (e.g. on each commit tick); it walks
    /// every lane.
    pub fn evict_idle(&mut self, now: Instant) -> usize {
        let before = self.entries.len();
        let idle_after = self.config.idle_after;
        self.entries.retain(|_, e| {
            e.lane.in_flight() > 0 || now.saturating_duration_since(e.last_used) < idle_after
        });
        before - self.entries.len()
    }

    /// Makes room for one lane: drops the least recently used lane with nothing in flight,
    /// preferring closed breakers (an open breaker's state is worth more than a closed one's).
    fn evict_one(&mut self) -> bool {
        let victim = self
            .entries
            .iter()
            .filter(|(_, e)| e.lane.in_flight() == 0)
            .min_by_key(|(_, e)| (e.breaker.state() != BreakerState::Closed, e.last_used))
            .map(|(id, _)| id.clone());
        match victim {
            Some(id) => self.entries.remove(&id).is_some(),
            None => false,
        }
    }

    /// Whether `endpoint` is stalled: every slot its lane admits is taken and not one request has
    /// finished for `after` (counted from the last finish, or from the first start on an idle
    /// lane). A receiver that hangs looks like this long before its requests time out; a slow
    /// but working one keeps finishing requests and does not.
    pub fn stalled(&self, endpoint: &EndpointId, now: Instant, after: Duration) -> bool {
        self.entries.get(endpoint).is_some_and(|e| {
            // The limit is at least 1, so a full lane has something in flight.
            e.lane.in_flight() >= e.lane.limit()
                && now.saturating_duration_since(e.progress_at) >= after
        })
    }

    /// Requests a second `endpoint` completes at its current concurrency limit: the limit over
    /// its average answer time (Little's law). `None` before its first answer, or when it has
    /// no lane. A receiver that takes 1 s an answer with a limit of 2 completes 2 a second
    /// however many records wait for it; a rate limit, if any, is the caller's to apply too.
    ///
    /// An endpoint whose answers take less than [`SLOWER_THAN_THE_REST`] times as long as the
    /// other endpoints' here (see [`Lanes::others_answer_time`]) has no known rate either: its
    /// answer time is then mostly what any answer takes in this process. On a machine short of
    /// CPU every endpoint's answers slow down together, by hookline's own wait and the
    /// machine's; without this check healthy endpoints would have their backlogs parked as if
    /// each were slow.
    pub fn throughput(&self, endpoint: &EndpointId) -> Option<f64> {
        let entry = self.entries.get(endpoint)?;
        let secs = entry.answer_time.secs()?;
        if self
            .others_answer_time(entry)
            .is_some_and(|rest| secs < rest * SLOWER_THAN_THE_REST)
        {
            return None;
        }
        Some(f64::from(entry.lane.limit()) / secs)
    }

    /// The mean answer time of every endpoint but `entry`'s, weighted by age as an endpoint's
    /// own is; `None` until they gave [`MIN_OTHER_ANSWERS`] answers' worth.
    fn others_answer_time(&self, entry: &Entry) -> Option<f64> {
        let now = self.all_answers.at?;
        let (all_secs, all_weight) = self.all_answers.sums_at(now);
        let (own_secs, own_weight) = entry.answer_time.sums_at(now);
        let weight = all_weight - own_weight;
        (weight >= MIN_OTHER_ANSWERS).then(|| (all_secs - own_secs).max(0.0) / weight)
    }

    /// An endpoint's lane, if it has one (metrics, admin API, tests).
    pub fn lane(&self, endpoint: &EndpointId) -> Option<&Lane> {
        self.entries.get(endpoint).map(|e| &e.lane)
    }

    /// An endpoint's breaker state, if it has a lane.
    pub fn breaker_state(&self, endpoint: &EndpointId) -> Option<BreakerState> {
        self.entries.get(endpoint).map(|e| e.breaker.state())
    }

    /// How many breakers are open or half-open (`hookline_breakers_open`). Walks every lane.
    pub fn open_breakers(&self) -> usize {
        self.entries
            .values()
            .filter(|e| e.breaker.state() != BreakerState::Closed)
            .count()
    }

    /// How many lanes the partition holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the partition holds no lanes.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Requests in flight across every lane.
    pub fn in_flight(&self) -> u64 {
        self.entries
            .values()
            .map(|e| u64::from(e.lane.in_flight()))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::breaker::OpenReason;
    use tokio::time::advance;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    fn cfg(max_in_flight: u32, rate_limit_per_s: Option<f64>) -> LaneConfig {
        LaneConfig {
            max_in_flight,
            rate_limit_per_s,
        }
    }

    fn ep(s: &str) -> EndpointId {
        EndpointId::parse(s).unwrap()
    }

    /// Takes every slot the lane gives right now.
    fn fill(lane: &mut Lane) -> Vec<LanePermit> {
        let mut permits = vec![];
        while let Ok(p) = lane.try_acquire(Instant::now()) {
            permits.push(p);
        }
        permits
    }

    #[tokio::test(start_paused = true)]
    async fn starts_at_the_ceiling_and_refuses_without_queueing() {
        let mut lane = Lane::new(cfg(4, None));
        assert_eq!(lane.limit(), 4);
        let permits = fill(&mut lane);
        assert_eq!(permits.len(), 4);
        for _ in 0..10_000 {
            assert_eq!(lane.try_acquire(Instant::now()), Err(Full::Concurrency));
        }
        assert_eq!(lane.in_flight(), 4, "refusals hold nothing");
        for p in permits {
            lane.release(p, Some(Outcome::Healthy));
        }
        assert_eq!(lane.in_flight(), 0);
        assert_eq!(lane.limit(), 4, "never above the ceiling");
    }

    #[tokio::test(start_paused = true)]
    async fn one_window_of_timeouts_halves_the_limit_once() {
        let mut lane = Lane::new(cfg(16, None));
        let permits = fill(&mut lane);
        for p in permits {
            lane.release(p, Some(Outcome::Overload));
        }
        assert_eq!(lane.limit(), 8);
        // Unreachable and unsignalled releases leave the limit alone.
        let p = lane.try_acquire(Instant::now()).unwrap();
        lane.release(p, Some(Outcome::Unreachable));
        let p = lane.try_acquire(Instant::now()).unwrap();
        lane.release(p, None);
        assert_eq!(lane.limit(), 8);
    }

    #[tokio::test(start_paused = true)]
    async fn aimd_converges_down_on_overload_and_recovers() {
        let mut lane = Lane::new(cfg(64, None));
        // Phase 1: the receiver chokes on everything. Each round trip halves the limit to 1.
        let mut limits = vec![];
        for _ in 0..8 {
            for p in fill(&mut lane) {
                lane.release(p, Some(Outcome::Overload));
            }
            limits.push(lane.limit());
            advance(MS(100)).await;
        }
        assert_eq!(limits, [32, 16, 8, 4, 2, 1, 1, 1]);

        // Phase 2: the receiver takes 10 at a time and times out above that. The limit climbs
        // back, then saw-tooths around the receiver's capacity without running away.
        let capacity: u32 = 10;
        let mut seen = vec![];
        for _ in 0..400 {
            let permits = fill(&mut lane);
            let overloaded = permits.len() > capacity as usize;
            for p in permits {
                let outcome = if overloaded {
                    Outcome::Overload
                } else {
                    Outcome::Healthy
                };
                lane.release(p, Some(outcome));
            }
            seen.push(lane.limit());
            advance(MS(100)).await;
        }
        let settled = &seen[100..];
        assert!(
            settled.iter().all(|&l| (5..=11).contains(&l)),
            "{settled:?}"
        );
        assert_eq!(
            settled.iter().max(),
            Some(&(capacity + 1)),
            "probes just past capacity"
        );

        // Phase 3: the receiver recovers fully; the limit climbs back to the ceiling.
        for _ in 0..2000 {
            for p in fill(&mut lane) {
                lane.release(p, Some(Outcome::Healthy));
            }
            advance(MS(100)).await;
        }
        assert_eq!(lane.limit(), 64);
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limiter_admits_at_the_configured_rate() {
        let mut lane = Lane::new(cfg(1000, Some(10.0)));
        let start = Instant::now();
        let mut admitted = 0;
        // Try every millisecond for 10 s: the burst of 10, then 10 per second.
        while Instant::now() - start < Duration::from_secs(10) {
            if let Ok(p) = lane.try_acquire(Instant::now()) {
                admitted += 1;
                lane.release(p, Some(Outcome::Healthy));
            }
            advance(MS(1)).await;
        }
        assert!((109..=111).contains(&admitted), "admitted {admitted}");
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limited_retry_at_is_when_the_token_arrives() {
        let mut lane = Lane::new(cfg(10, Some(0.5)));
        let p = lane.try_acquire(Instant::now()).unwrap();
        lane.release(p, None);
        let Err(Full::RateLimited { retry_at }) = lane.try_acquire(Instant::now()) else {
            panic!("burst of a 0.5/s bucket is 1");
        };
        let wait = retry_at - Instant::now();
        assert!(wait >= Duration::from_secs(2) && wait < Duration::from_secs(2) + MS(1));
        tokio::time::sleep_until(retry_at).await;
        assert!(lane.try_acquire(Instant::now()).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn config_updates() {
        let mut lane = Lane::new(cfg(10, None));
        lane.update_config(cfg(20, None));
        assert_eq!(lane.limit(), 20, "an uncut limit follows a raised ceiling");
        for p in fill(&mut lane) {
            lane.release(p, Some(Outcome::Overload));
        }
        assert_eq!(lane.limit(), 10);
        lane.update_config(cfg(40, None));
        assert_eq!(lane.limit(), 10, "a cut limit earns its way back");
        lane.update_config(cfg(3, None));
        assert_eq!(lane.limit(), 3, "a lowered ceiling applies at once");
        assert_eq!(lane.config().max_in_flight, 3);

        // A rate change keeps the tokens already spent.
        lane.update_config(cfg(3, Some(1.0)));
        let p = lane.try_acquire(Instant::now()).unwrap();
        lane.release(p, None);
        lane.update_config(cfg(3, Some(100.0)));
        assert!(matches!(
            lane.try_acquire(Instant::now()),
            Err(Full::RateLimited { .. })
        ));
        advance(MS(10)).await;
        assert!(lane.try_acquire(Instant::now()).is_ok());
        // Out-of-range settings are clamped rather than trusted.
        let lane = Lane::new(cfg(0, Some(f64::NAN)));
        assert_eq!(lane.config(), cfg(1, Some(MIN_RATE_PER_S)));
    }

    #[test]
    fn lane_config_validation_names_the_key() {
        assert_eq!(cfg(1, Some(5.0)).validate(), Ok(()));
        assert!(
            cfg(0, None)
                .validate()
                .unwrap_err()
                .to_string()
                .starts_with("endpoint.max_in_flight")
        );
        assert!(cfg(MAX_IN_FLIGHT_CEILING + 1, None).validate().is_err());
        for rate in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(
                cfg(1, Some(rate))
                    .validate()
                    .unwrap_err()
                    .to_string()
                    .starts_with("endpoint.rate_limit_per_s"),
                "{rate}"
            );
        }
    }

    #[test]
    fn lanes_config_parses_and_validates() {
        let c: LanesConfig = toml::from_str(
            "max_lanes = 50\nidle_after = \"5m\"\n[breaker]\nfailure_threshold = 3\n",
        )
        .unwrap();
        assert_eq!(c.max_lanes, 50);
        assert_eq!(c.idle_after, Duration::from_secs(300));
        assert_eq!(c.breaker.failure_threshold, 3);
        assert_eq!(c.breaker.cool_down, Duration::from_secs(30));
        assert_eq!(c.validate(), Ok(()));
        let bad = LanesConfig { max_lanes: 0, ..c };
        assert_eq!(
            bad.validate().unwrap_err().to_string(),
            "delivery.lanes.max_lanes must be >= 1"
        );
        let bad = LanesConfig {
            breaker: BreakerConfig {
                failure_threshold: 0,
                ..c.breaker
            },
            ..c
        };
        assert_eq!(
            bad.validate().unwrap_err().to_string(),
            "delivery.breaker.failure_threshold must be >= 1"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_endpoint_opens_its_breaker_and_one_probe_closes_it() {
        let mut lanes = Lanes::new(LanesConfig::default());
        let sick = ep("ep_sick");
        let well = ep("ep_well");
        let c = cfg(100, None);
        let mut opened = None;
        for _ in 0..5 {
            let p = lanes.try_acquire(&sick, c, Instant::now()).unwrap();
            opened = lanes.release(p, Some(Outcome::Unreachable), Instant::now());
        }
        let Some(Transition::Opened {
            reason: OpenReason::ConsecutiveFailures,
            retry_at,
            ..
        }) = opened
        else {
            panic!("expected the breaker to open, got {opened:?}");
        };
        assert_eq!(lanes.breaker_state(&sick), Some(BreakerState::Open));
        let refusal = lanes.try_acquire(&sick, c, Instant::now()).unwrap_err();
        assert_eq!(refusal, Refusal::BreakerOpen { retry_at });
        assert_eq!(refusal.retry_at(), Some(retry_at));
        // The healthy endpoint in the same partition is unaffected.
        let p = lanes.try_acquire(&well, c, Instant::now()).unwrap();
        assert!(!p.is_probe());
        assert_eq!(
            lanes.release(p, Some(Outcome::Healthy), Instant::now()),
            None
        );

        tokio::time::sleep_until(retry_at).await;
        let probe = lanes.try_acquire(&sick, c, Instant::now()).unwrap();
        assert!(probe.is_probe());
        assert_eq!(probe.endpoint(), &sick);
        assert!(matches!(
            lanes.try_acquire(&sick, c, Instant::now()),
            Err(Refusal::BreakerOpen { .. })
        ));
        assert_eq!(
            lanes.release(probe, Some(Outcome::Healthy), Instant::now()),
            Some(Transition::Closed)
        );
        let p = lanes.try_acquire(&sick, c, Instant::now()).unwrap();
        lanes.release(p, Some(Outcome::Healthy), Instant::now());
        assert_eq!(lanes.in_flight(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn open_breakers_counts_each_breaker_once_and_forgets_dropped_lanes() {
        let mut lanes = Lanes::new(LanesConfig {
            idle_after: Duration::from_secs(60),
            ..LanesConfig::default()
        });
        let c = cfg(100, None);
        let open = |lanes: &mut Lanes, e: &EndpointId| {
            for _ in 0..5 {
                let p = lanes.try_acquire(e, c, Instant::now()).unwrap();
                lanes.release(p, Some(Outcome::Unreachable), Instant::now());
            }
            assert_eq!(lanes.breaker_state(e), Some(BreakerState::Open));
        };
        let (a, b) = (ep("ep_a"), ep("ep_b"));
        open(&mut lanes, &a);
        open(&mut lanes, &b);
        assert_eq!(lanes.open_breakers(), 2);
        // a's probe fails: it opens again, and is still one open breaker.
        advance(Duration::from_secs(30)).await;
        let probe = lanes.try_acquire(&a, c, Instant::now()).unwrap();
        assert!(probe.is_probe());
        assert_eq!(lanes.open_breakers(), 2, "half-open is not closed");
        assert!(matches!(
            lanes.release(probe, Some(Outcome::Unreachable), Instant::now()),
            Some(Transition::Opened { .. })
        ));
        assert_eq!(lanes.open_breakers(), 2);
        // b is deleted, then a sits idle until its lane is dropped, breaker still open.
        assert!(lanes.remove(&b));
        assert_eq!(lanes.open_breakers(), 1);
        advance(Duration::from_secs(61)).await;
        assert_eq!(lanes.evict_idle(Instant::now()), 1);
        assert_eq!(lanes.open_breakers(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_the_lane_cannot_take_is_given_back() {
        let mut lanes = Lanes::new(LanesConfig::default());
        let e = ep("ep_1");
        let c = cfg(1, None);
        // A slow request admitted while closed still holds a slot when the breaker opens.
        let slow = lanes.try_acquire(&e, cfg(2, None), Instant::now()).unwrap();
        let mut opened = None;
        for _ in 0..5 {
            let p = lanes.try_acquire(&e, cfg(2, None), Instant::now()).unwrap();
            opened = lanes.release(p, Some(Outcome::Unreachable), Instant::now());
        }
        assert!(opened.is_some());
        advance(Duration::from_secs(30)).await;
        assert_eq!(
            lanes.try_acquire(&e, c, Instant::now()).unwrap_err(),
            Refusal::Concurrency
        );
        assert_eq!(lanes.breaker_state(&e), Some(BreakerState::HalfOpen));
        // The stale request's outcome does not decide; its slot frees the probe.
        assert_eq!(
            lanes.release(slow, Some(Outcome::Healthy), Instant::now()),
            None
        );
        let probe = lanes.try_acquire(&e, c, Instant::now()).unwrap();
        assert!(probe.is_probe(), "the probe was given back, not lost");
        // A probe that never went out (refused before sending) is given back too.
        assert_eq!(lanes.release(probe, None, Instant::now()), None);
        let probe = lanes.try_acquire(&e, c, Instant::now()).unwrap();
        assert!(probe.is_probe());
        lanes.release(probe, Some(Outcome::Healthy), Instant::now());
    }

    #[tokio::test(start_paused = true)]
    async fn the_map_is_bounded_and_evicts_idle_lanes() {
        let mut lanes = Lanes::new(LanesConfig {
            max_lanes: 3,
            idle_after: Duration::from_secs(60),
            ..LanesConfig::default()
        });
        let c = cfg(1, None);
        let held: Vec<Permit> = (0..3)
            .map(|i| {
                lanes
                    .try_acquire(&ep(&format!("ep_{i}")), c, Instant::now())
                    .unwrap()
            })
            .collect();
        // Every lane busy: new endpoints are refused, and the map does not grow.
        for i in 3..1000 {
            assert_eq!(
                lanes
                    .try_acquire(&ep(&format!("ep_{i}")), c, Instant::now())
                    .unwrap_err(),
                Refusal::TooManyLanes
            );
        }
        assert_eq!(lanes.len(), 3);
        assert_eq!(lanes.evict_idle(Instant::now()), 0);

        // Free ep_0 and ep_1 (ep_1 later); a new endpoint evicts the least recently used: ep_0.
        let mut held = held.into_iter();
        lanes.release(held.next().unwrap(), None, Instant::now());
        advance(Duration::from_secs(1)).await;
        lanes.release(held.next().unwrap(), None, Instant::now());
        let p = lanes.try_acquire(&ep("ep_new"), c, Instant::now()).unwrap();
        assert!(lanes.lane(&ep("ep_0")).is_none());
        assert!(lanes.lane(&ep("ep_1")).is_some());
        lanes.release(p, None, Instant::now());

        // Idle eviction spares the busy lane.
        advance(Duration::from_secs(60)).await;
        assert_eq!(lanes.evict_idle(Instant::now()), 2);
        assert_eq!(lanes.len(), 1);
        assert_eq!(lanes.lane(&ep("ep_2")).unwrap().in_flight(), 1);
        lanes.release(held.next().unwrap(), None, Instant::now());
        assert!(!lanes.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_permit_outliving_its_lane_does_not_touch_the_next_one() {
        let mut lanes = Lanes::new(LanesConfig::default());
        let e = ep("ep_1");
        let old = lanes.try_acquire(&e, cfg(2, None), Instant::now()).unwrap();
        assert!(lanes.remove(&e));
        assert!(!lanes.remove(&e));
        let new = lanes.try_acquire(&e, cfg(2, None), Instant::now()).unwrap();
        assert_eq!(
            lanes.release(old, Some(Outcome::Overload), Instant::now()),
            None
        );
        let lane = lanes.lane(&e).unwrap();
        assert_eq!((lane.in_flight(), lane.limit()), (1, 2));
        lanes.release(new, None, Instant::now());
        lanes.update_config(&e, cfg(5, None));
        assert_eq!(lanes.lane(&e).unwrap().limit(), 5);
        lanes.update_config(&ep("ep_unknown"), cfg(5, None));
        assert_eq!(lanes.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_lane_without_a_finish_for_the_threshold_is_stalled() {
        let mut lanes = Lanes::new(LanesConfig::default());
        let e = ep("ep_1");
        let after = MS(1000);
        assert!(
            !lanes.stalled(&e, Instant::now(), after),
            "no lane, no stall"
        );
        advance(MS(5000)).await;
        let mut held = vec![];
        while let Ok(p) = lanes.try_acquire(&e, cfg(3, None), Instant::now()) {
            held.push(p);
        }
        assert_eq!(held.len(), 3);
        advance(MS(999)).await;
        assert!(
            !lanes.stalled(&e, Instant::now(), after),
            "the clock starts when the idle lane got busy, not at its creation"
        );
        advance(MS(1)).await;
        assert!(lanes.stalled(&e, Instant::now(), after));
        // One finish is progress: the clock starts again, and the lane has a free slot.
        lanes.release(held.pop().unwrap(), Some(Outcome::Healthy), Instant::now());
        assert!(!lanes.stalled(&e, Instant::now(), after));
        held.push(lanes.try_acquire(&e, cfg(3, None), Instant::now()).unwrap());
        advance(MS(400)).await;
        assert!(!lanes.stalled(&e, Instant::now(), after));
        advance(MS(600)).await;
        assert!(lanes.stalled(&e, Instant::now(), after));
        for p in held {
            lanes.release(p, None, Instant::now());
        }
        advance(MS(5000)).await;
        assert!(
            !lanes.stalled(&e, Instant::now(), after),
            "nothing in flight"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_lane_with_free_slots_is_never_stalled() {
        let mut lanes = Lanes::new(LanesConfig::default());
        let e = ep("ep_1");
        let one = lanes.try_acquire(&e, cfg(2, None), Instant::now()).unwrap();
        advance(MS(60_000)).await;
        assert!(
            !lanes.stalled(&e, Instant::now(), MS(1000)),
            "a slow request beside a free slot is not a stall"
        );
        lanes.release(one, Some(Outcome::Healthy), Instant::now());
    }

    /// Empty lanes, and the endpoint and settings the answer-time tests use: `ep_1`, 16 slots.
    fn one_endpoint_of_16_slots() -> (Lanes, EndpointId, LaneConfig) {
        (
            Lanes::new(LanesConfig::default()),
            ep("ep_1"),
            cfg(16, None),
        )
    }

    fn close(a: Option<f64>, b: f64) -> bool {
        a.is_some_and(|a| (a - b).abs() < 1e-9)
    }

    #[test]
    fn the_answer_time_is_a_mean_weighted_by_age() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + MS(ms);
        let mut t = AnswerTime::default();
        assert_eq!(t.secs(), None);
        t.observe(Duration::ZERO, at(0));
        t.observe(Duration::ZERO, at(1000));
        assert_eq!(t.secs(), None, "answers in no time say nothing");
        t.observe(Duration::from_secs(2), at(1000));
        let k = (-1.0f64).exp();
        assert!(
            close(t.secs(), 2.0 / (k + 2.0)),
            "two answers at once weigh the same, one a horizon older 1/e: {t:?}"
        );

        let mut t = AnswerTime::default();
        t.observe(Duration::from_secs(2), at(0));
        assert_eq!(t.secs(), None, "one answer is no evidence yet");
        t.observe(Duration::from_secs(2), at(999));
        assert_eq!(t.secs(), None, "nor answers spanning less than a horizon");
        // One horizon after the first, it weighs 1/e against the new one's 1.
        t.observe(Duration::from_secs(6), at(1000));
        let k999 = (-0.001f64).exp();
        let (sum, weight) = ((2.0 * k + 2.0 * k999) + 6.0, (k + k999) + 1.0);
        assert!(close(t.secs(), sum / weight), "{t:?}");
        // After a quiet spell (three horizons, or three answer times if longer), the evidence
        // starts again: what came before is next to nothing by then.
        t.observe(MS(500), at(60_000));
        assert_eq!(t.secs(), None, "one answer after a quiet spell");
        t.observe(MS(500), at(61_000));
        assert!((t.secs().unwrap() - 0.5).abs() < 1e-3, "{t:?}");
        // A slow endpoint's rounds come an answer time apart: that is no quiet spell.
        let mut t = AnswerTime::default();
        t.observe(Duration::from_secs(5), at(5000));
        t.observe(Duration::from_secs(5), at(10_000));
        assert!(close(t.secs(), 5.0), "{t:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_cold_first_round_after_a_quiet_spell_is_no_evidence() {
        // A fast endpoint (16 slots, 5 ms answers) is idle, then a burst: its first 16
        // answers take 200 ms (new connections on a busy machine), the rest 5 ms.
        let (mut lanes, e, c) = one_endpoint_of_16_slots();
        let round = lanes.try_acquire(&e, c, Instant::now()).unwrap();
        advance(MS(5)).await;
        lanes.release(round, Some(Outcome::Healthy), Instant::now());
        advance(Duration::from_secs(30)).await;
        let round: Vec<_> = (0..16)
            .map(|_| lanes.try_acquire(&e, c, Instant::now()).unwrap())
            .collect();
        advance(MS(200)).await;
        for p in round {
            lanes.release(p, Some(Outcome::Healthy), Instant::now());
        }
        // Taken at its word, 16 / 0.2 = 80 a second, and its backlog beyond 80 times the
        // shortest tier would be parked.
        assert_eq!(
            lanes.throughput(&e),
            None,
            "a cold round alone says nothing"
        );
        for _ in 0..200 {
            let p = lanes.try_acquire(&e, c, Instant::now()).unwrap();
            advance(MS(5)).await;
            lanes.release(p, Some(Outcome::Healthy), Instant::now());
        }
        let rate = lanes.throughput(&e).unwrap();
        assert!(rate > 1000.0, "{rate:.0}/s");
    }

    #[tokio::test(start_paused = true)]
    async fn one_slow_answer_among_many_fast_ones_barely_moves_the_rate() {
        // A fast endpoint: 16 slots, answers in 5 ms. One request is held up 2 s (a pause on
        // a busy machine) while the others go on answering in 5 ms.
        let (mut lanes, e, c) = one_endpoint_of_16_slots();
        for _ in 0..300 {
            let p = lanes.try_acquire(&e, c, Instant::now()).unwrap();
            advance(MS(5)).await;
            lanes.release(p, Some(Outcome::Healthy), Instant::now());
        }
        let fast = lanes.throughput(&e).unwrap();
        assert!((fast - 16.0 / 0.005).abs() < 1.0, "{fast}");
        let held = lanes.try_acquire(&e, c, Instant::now()).unwrap();
        for _ in 0..400 {
            let p = lanes.try_acquire(&e, c, Instant::now()).unwrap();
            advance(MS(5)).await;
            lanes.release(p, Some(Outcome::Healthy), Instant::now());
        }
        lanes.release(held, Some(Outcome::Healthy), Instant::now());
        // Its ~175 answers of the last second against the one of 2 s: about 16 ms on average,
        // 16 / 0.016 = 1,000 a second. With each answer given a quarter, it read 16 / 0.5 = 32.
        let after = lanes.throughput(&e).unwrap();
        assert!(
            after > 800.0,
            "one 2 s answer took the rate to {after:.0}/s"
        );

        // An endpoint that really turns slow shows within a few seconds.
        for _ in 0..5 {
            let ps: Vec<_> = (0..16)
                .map(|_| lanes.try_acquire(&e, c, Instant::now()).unwrap())
                .collect();
            advance(Duration::from_secs(1)).await;
            for p in ps {
                lanes.release(p, Some(Outcome::Healthy), Instant::now());
            }
        }
        let slow = lanes.throughput(&e).unwrap();
        assert!(slow < 20.0, "1 s answers for 5 s still read {slow:.0}/s");
    }

    #[tokio::test(start_paused = true)]
    async fn endpoints_slowed_down_together_have_no_rate_of_their_own() {
        // Two fast endpoints (16 slots, 5 ms answers); then for two seconds every answer
        // takes 500 ms, as on a machine short of CPU.
        let mut lanes = Lanes::new(LanesConfig::default());
        let (a, b) = (ep("ep_a"), ep("ep_b"));
        let c = cfg(16, None);
        // Rounds of 16 requests to each for `secs`: `a`'s answer after `took_a`, `b`'s after
        // `took_b` (no shorter).
        let rounds = async |lanes: &mut Lanes, took_a: Duration, took_b: Duration, secs: u32| {
            for _ in 0..(Duration::from_secs(secs.into()).as_millis() / took_b.as_millis()) {
                let pa: Vec<_> = (0..16)
                    .map(|_| lanes.try_acquire(&a, c, Instant::now()).unwrap())
                    .collect();
                let pb: Vec<_> = (0..16)
                    .map(|_| lanes.try_acquire(&b, c, Instant::now()).unwrap())
                    .collect();
                advance(took_a).await;
                for p in pa {
                    lanes.release(p, Some(Outcome::Healthy), Instant::now());
                }
                advance(took_b - took_a).await;
                for p in pb {
                    lanes.release(p, Some(Outcome::Healthy), Instant::now());
                }
            }
        };
        rounds(&mut lanes, MS(5), MS(5), 2).await;
        let fast = lanes.throughput(&a);
        assert!(fast.is_none(), "alike, neither is judged: {fast:?}");
        rounds(&mut lanes, MS(500), MS(500), 2).await;
        assert_eq!(lanes.throughput(&a), None, "slowed down together");
        assert_eq!(lanes.throughput(&b), None, "slowed down together");

        // One of them really slow beside the other: 16 / 0.5 = 32 a second.
        rounds(&mut lanes, MS(5), MS(500), 6).await;
        assert_eq!(
            lanes.throughput(&a),
            None,
            "the fast one is no slower than the rest"
        );
        let slow = lanes.throughput(&b).unwrap();
        assert!((30.0..35.0).contains(&slow), "{slow:.1}/s");
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_endpoint_is_judged_by_its_own_answers() {
        // Nothing else answers in these lanes, so nothing tells hookline's wait from the
        // endpoint's: its answer time stands.
        let (mut lanes, e, c) = one_endpoint_of_16_slots();
        for _ in 0..4 {
            let round: Vec<_> = (0..16)
                .map(|_| lanes.try_acquire(&e, c, Instant::now()).unwrap())
                .collect();
            advance(MS(500)).await;
            for p in round {
                lanes.release(p, Some(Outcome::Healthy), Instant::now());
            }
        }
        assert_eq!(lanes.throughput(&e), Some(32.0));
    }

    #[tokio::test(start_paused = true)]
    async fn the_answer_time_ends_when_the_answer_came_not_at_the_release() {
        // Answers in 5 ms that their stage gets round to 100 ms later.
        let (mut lanes, e, c) = one_endpoint_of_16_slots();
        for _ in 0..300 {
            let p = lanes.try_acquire(&e, c, Instant::now()).unwrap();
            advance(MS(5)).await;
            let answered = Instant::now();
            advance(MS(100)).await;
            let now = Instant::now();
            lanes.release_answered(p, Some(Outcome::Healthy), now, answered);
        }
        let rate = lanes.throughput(&e).unwrap();
        assert!((rate - 16.0 / 0.005).abs() < 1.0, "{rate:.0}/s");
    }

    #[tokio::test(start_paused = true)]
    async fn throughput_is_the_limit_over_the_answer_time() {
        let mut lanes = Lanes::new(LanesConfig::default());
        let e = ep("ep_1");
        assert_eq!(lanes.throughput(&e), None, "no lane");
        let c = cfg(2, None);
        let a = lanes.try_acquire(&e, c, Instant::now()).unwrap();
        let b = lanes.try_acquire(&e, c, Instant::now()).unwrap();
        assert_eq!(lanes.throughput(&e), None, "no answer yet");
        advance(Duration::from_secs(1)).await;
        // A request never sent does not count.
        lanes.release(a, None, Instant::now());
        assert_eq!(lanes.throughput(&e), None);
        lanes.release(b, Some(Outcome::Healthy), Instant::now());
        assert_eq!(lanes.throughput(&e), None, "one round is no evidence yet");
        let b = lanes.try_acquire(&e, c, Instant::now()).unwrap();
        advance(Duration::from_secs(1)).await;
        lanes.release(b, Some(Outcome::Healthy), Instant::now());
        assert_eq!(lanes.throughput(&e), Some(2.0), "2 at a time, 1 s each");

        // An answer that takes 3 s pulls the average up; the ones before it, 3 and 4 s old,
        // weigh e^-3 and e^-4.
        let a = lanes.try_acquire(&e, c, Instant::now()).unwrap();
        advance(Duration::from_secs(3)).await;
        lanes.release(a, Some(Outcome::Healthy), Instant::now());
        let (k3, k4) = ((-3.0f64).exp(), (-4.0f64).exp());
        let avg = (k4 + k3 + 3.0) / (k4 + k3 + 1.0);
        assert!(close(lanes.throughput(&e), 2.0 / avg));

        // An overload halves the limit, and what the endpoint completes with it; its time (a
        // 15 s timeout here) is not an answer time, nor is a failure to connect.
        let a = lanes.try_acquire(&e, c, Instant::now()).unwrap();
        advance(Duration::from_secs(15)).await;
        lanes.release(a, Some(Outcome::Overload), Instant::now());
        assert_eq!(lanes.lane(&e).unwrap().limit(), 1);
        assert!(close(lanes.throughput(&e), 1.0 / avg));
        let a = lanes.try_acquire(&e, c, Instant::now()).unwrap();
        advance(Duration::from_secs(10)).await;
        lanes.release(a, Some(Outcome::Unreachable), Instant::now());
        assert!(close(lanes.throughput(&e), 1.0 / avg));
        assert!(lanes.remove(&e));
        assert_eq!(lanes.throughput(&e), None, "forgotten with its lane");
    }

    #[test]
    fn refusal_labels() {
        let now = Instant::now();
        assert_eq!(Refusal::from(Full::Concurrency), Refusal::Concurrency);
        assert_eq!(
            Refusal::from(Full::RateLimited { retry_at: now }).as_str(),
            "rate_limited"
        );
        assert_eq!(Refusal::TooManyLanes.retry_at(), None);
        assert_eq!(Full::RateLimited { retry_at: now }.retry_at(), Some(now));
    }
}
