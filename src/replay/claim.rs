//! Claims: where a delivery stands for a replay ([`Standing`]), and claiming it so that of two
//! replays at once, one sends it.

use std::time::{Duration, SystemTime};

use super::ReplayError;
use crate::id::DeliveryId;
use crate::storage::{DeliveryState, DeliveryStatus, DeliveryStore, ReplayMark, StoreError};

/// How long a replay's claim on a delivery keeps other replays off it while it has not
/// republished it. A replay through the API republishes within [`API_PUBLISH_DEADLINE`] of
/// claiming, and then marks it; a claim this old with neither a mark nor an attempt of its
/// replay was left by a process that stopped in between, and no longer holds the delivery.
pub const CLAIM_LIMIT: Duration = Duration::from_secs(120);

/// How many times [`claim`] reads and tries again when another replay's claim came in between.
const CLAIM_TRIES: usize = 3;

/// Whether a delivery may be replayed now.
#[derive(Debug, Clone, PartialEq)]
pub enum Standing {
    /// Dead, and no replay of it is on its way: replaying it sends it again.
    Dead,
    /// Delivered (a 2xx), and no replay of it is on its way: replaying it by its id sends it
    /// again from its record in the deliveries topic, while that is kept.
    Delivered,
    /// Dead in the attempt log, but the replay `0` names republished it and no attempt of that
    /// replay is logged yet: it is on its way, and replaying it again would send it twice.
    OnItsWay(ReplayMark),
    /// Dead in the attempt log, and claimed less than [`CLAIM_LIMIT`] ago by the replay `0`
    /// names, which has not republished it yet: it is about to.
    BeingReplayed(ReplayMark),
    /// Neither dead nor delivered: being retried, or not attempted yet.
    NotDead(DeliveryStatus),
}

/// Where `delivery` stands for a replay: dead in the attempt log, and then whether its latest
/// replay (its [`ReplayMark`]) has had an attempt logged, and whether a replay has claimed it
/// and not republished it yet. A replay is settled by an attempt that carries its id, whenever
/// either was written; only a claim's age is read against the clock.
pub async fn standing(
    store: &dyn DeliveryStore,
    delivery: &DeliveryState,
) -> Result<Standing, StoreError> {
    Ok(look(store, delivery).await?.0)
}

/// [`standing`], and the delivery's latest claim, which a replay of a [`Standing::Dead`]
/// delivery claims it over.
async fn look(
    store: &dyn DeliveryStore,
    delivery: &DeliveryState,
) -> Result<(Standing, Option<ReplayMark>), StoreError> {
    let free = match delivery.status {
        DeliveryStatus::Dead => Standing::Dead,
        DeliveryStatus::Succeeded => Standing::Delivered,
        other => return Ok((Standing::NotDead(other), None)),
    };
    let (busy, claim) = in_flight(store, &delivery.delivery_id).await?;
    Ok((busy.unwrap_or(free), claim))
}

/// Whether another replay of `id` is on its way ([`Standing::OnItsWay`]) or about to be
/// ([`Standing::BeingReplayed`]), and the delivery's latest claim, which a replay claims it
/// over.
async fn in_flight(
    store: &dyn DeliveryStore,
    id: &DeliveryId,
) -> Result<(Option<Standing>, Option<ReplayMark>), StoreError> {
    // Read side by side: one store round trip instead of two. Whichever order the two reads
    // reach the store in, a replay seen half-way (claimed and not yet marked, or marked and
    // its claim read before it was made) stands as busy, and a claim made after the claim
    // read makes this replay's own claim, which is conditional on what was read, fail.
    let (mark, claim) = tokio::try_join!(store.replay_mark(id), store.replay_claim(id))?;
    if mark.is_none() && claim.is_none() {
        return Ok((None, None));
    }
    let (attempts, state) = tokio::try_join!(store.attempts(id), store.delivery(id))?;
    // Settled by an attempt carrying its id, or by the delivery stage dead-lettering the
    // replayed record unsent (endpoint gone or disabled) since: the delivery is dead, and its
    // latest entry is a dead note (later than every attempt) written after the replay.
    let noted_dead_since = |replay: &ReplayMark| {
        state.as_ref().is_some_and(|s| {
            s.status == DeliveryStatus::Dead
                && s.updated_at > replay.at
                && attempts.iter().all(|a| a.started_at < s.updated_at)
        })
    };
    let carried = |replay: &ReplayMark| {
        noted_dead_since(replay)
            || attempts
                .iter()
                .any(|a| a.replay_id.as_deref() == Some(replay.replay_id.as_str()))
    };
    if let Some(mark) = mark.as_ref().filter(|m| !carried(m)) {
        return Ok((Some(Standing::OnItsWay(mark.clone())), claim));
    }
    let marked = |c: &ReplayMark| mark.as_ref().is_some_and(|m| m.replay_id == c.replay_id);
    let young = |c: &ReplayMark| {
        SystemTime::now()
            .duration_since(c.at)
            .map_or(true, |age| age < CLAIM_LIMIT)
    };
    if let Some(claimed) = claim
        .as_ref()
        .filter(|c| !marked(c) && !carried(c) && young(c))
    {
        return Ok((Some(Standing::BeingReplayed(claimed.clone())), claim));
    }
    Ok((None, claim))
}

/// Claims delivery `id` for replay `replay_id` of a range of DLQ offsets, whatever the attempt
/// log says of it (an operator's range is sent as asked), unless another replay of it is on
/// its way or about to be; whether it claimed it. Of two replays at once, one sends it.
pub(super) async fn claim_in_range(
    store: &dyn DeliveryStore,
    id: &DeliveryId,
    replay_id: &str,
) -> Result<bool, StoreError> {
    for _ in 0..CLAIM_TRIES {
        let (busy, claim) = in_flight(store, id).await?;
        if busy.is_some() {
            return Ok(false);
        }
        if claim_over(store, id, replay_id, claim.as_ref()).await? {
            return Ok(true);
        }
    }
    // Claimed by another replay each time it looked: one of them is sending it.
    Ok(false)
}

/// Claims `id` for replay `replay_id`, now, over `latest`, the claim it read
/// ([`DeliveryStore::claim_replay`]); whether no other claim came in between.
async fn claim_over(
    store: &dyn DeliveryStore,
    id: &DeliveryId,
    replay_id: &str,
    latest: Option<&ReplayMark>,
) -> Result<bool, StoreError> {
    let mine = ReplayMark {
        delivery_id: id.clone(),
        replay_id: replay_id.to_owned(),
        at: SystemTime::now(),
    };
    store
        .claim_replay(&mine, latest.map(|c| c.replay_id.as_str()))
        .await
}

/// Why a delivery standing so cannot be replayed by its id now, for the caller; `None` for
/// [`Standing::Dead`] and [`Standing::Delivered`].
pub fn refusal(id: &DeliveryId, standing: &Standing) -> Option<String> {
    let time = |t: SystemTime| humantime::format_rfc3339_millis(t).to_string();
    match standing {
        Standing::Dead | Standing::Delivered => None,
        Standing::NotDead(status) => Some(format!(
            "delivery {id} is {}: only a dead-lettered or a delivered delivery can be \
             replayed (one being retried will be attempted again anyway)",
            status.as_str()
        )),
        Standing::OnItsWay(mark) => Some(format!(
            "delivery {id} was replayed at {} (replay {}) and that replay's attempt is not \
             logged yet: it is on its way; replay it again once it shows dead again",
            time(mark.at),
            mark.replay_id
        )),
        Standing::BeingReplayed(claim) => Some(format!(
            "delivery {id} is being replayed by replay {} (started at {}), which has not sent it \
             on yet: replay it again once that replay's attempt shows it dead again, or after {} \
             if that replay stops before sending it",
            claim.replay_id,
            time(claim.at),
            time(claim.at + CLAIM_LIMIT)
        )),
    }
}

/// Claims `delivery` for replay `replay_id` ([`DeliveryStore::claim_replay`]) while it is
/// [`Standing::Dead`] (or [`Standing::Delivered`], when `delivered` too): of two replays that
/// find it so at the same moment, one claims it and the other is refused, so it is sent once.
/// [`ReplayError::Refused`] when it stands otherwise or another replay has it;
/// [`ReplayError::Store`] when the store does not answer.
pub(super) async fn claim(
    store: &dyn DeliveryStore,
    delivery: &DeliveryState,
    replay_id: &str,
    delivered: bool,
) -> Result<(), ReplayError> {
    let id = &delivery.delivery_id;
    for _ in 0..CLAIM_TRIES {
        let (standing, latest) = look(store, delivery).await.map_err(ReplayError::Store)?;
        if let Some(why) = refusal(id, &standing) {
            return Err(ReplayError::Refused(why));
        }
        if standing == Standing::Delivered && !delivered {
            return Err(ReplayError::Refused(format!(
                "delivery {id} is succeeded: this replay sends dead deliveries only"
            )));
        }
        if claim_over(store, id, replay_id, latest.as_ref())
            .await
            .map_err(ReplayError::Store)?
        {
            return Ok(());
        }
    }
    Err(ReplayError::Refused(format!(
        "delivery {id} was claimed by {CLAIM_TRIES} other replays while this one tried to: \
         replay it again in a moment"
    )))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use async_trait::async_trait;
    use tokio::sync::Barrier;

    use super::*;
    use crate::dead_reason::DeadReason;
    use crate::storage::AttemptOutcome;
    use crate::storage::conformance::attempt_row;
    use crate::storage::hooked::{Hooked, Hooks};
    use crate::storage::memory::MemoryStore;

    /// The first two claim reads wait for each other: two replays that both found a delivery
    /// unclaimed, then race to claim it.
    struct Race {
        reads: AtomicUsize,
        both_read: Barrier,
    }

    #[async_trait]
    impl Hooks for Race {
        async fn after_replay_claim_read(&self) {
            if self.reads.fetch_add(1, Ordering::SeqCst) < 2 {
                self.both_read.wait().await;
            }
        }
    }

    async fn dead_delivery(store: &dyn DeliveryStore) -> DeliveryState {
        let mut row = attempt_row("evt_race", "ep_race", 1);
        row.outcome = AttemptOutcome::Dead {
            reason: DeadReason::HttpStatus,
        };
        store.record_attempt(&row).await.unwrap();
        store.delivery(&row.delivery_id).await.unwrap().unwrap()
    }

    #[tokio::test]
    async fn of_two_replays_that_found_a_delivery_unclaimed_one_claims_it() {
        let race = Race {
            reads: AtomicUsize::new(0),
            both_read: Barrier::new(2),
        };
        let store = Hooked::new(race, 16);
        let delivery = dead_delivery(&store).await;
        let (a, b) = tokio::join!(
            claim(&store, &delivery, "rpl_a", false),
            claim(&store, &delivery, "rpl_b", false)
        );
        let claimed = store.replay_claim(&delivery.delivery_id).await.unwrap();
        let winner = claimed.expect("one claimed it").replay_id;
        let (won, lost) = if winner == "rpl_a" { (a, b) } else { (b, a) };
        won.expect("the winner's claim");
        match lost {
            Err(ReplayError::Refused(why)) => assert!(
                why.contains(&format!("is being replayed by replay {winner}")),
                "{why}"
            ),
            other => panic!("the other replay is refused, not {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_claim_holds_the_delivery_until_its_replay_settles() {
        let store = MemoryStore::default();
        let delivery = dead_delivery(&store).await;
        let id = &delivery.delivery_id;
        claim(&store, &delivery, "rpl_b", false).await.unwrap();
        assert!(matches!(
            claim(&store, &delivery, "rpl_x", false).await,
            Err(ReplayError::Refused(_))
        ));
        // rpl_b republished it and marked it: on its way until its attempt is logged.
        let mark = ReplayMark {
            delivery_id: id.clone(),
            replay_id: "rpl_b".into(),
            at: SystemTime::now(),
        };
        store.record_replay_mark(&mark).await.unwrap();
        assert_eq!(
            standing(&store, &delivery).await.unwrap(),
            Standing::OnItsWay(mark)
        );
        let mut again = attempt_row("evt_race", "ep_race", 1);
        again.replay_id = Some("rpl_b".into());
        again.outcome = AttemptOutcome::Dead {
            reason: DeadReason::HttpStatus,
        };
        store.record_attempt(&again).await.unwrap();
        assert_eq!(standing(&store, &delivery).await.unwrap(), Standing::Dead);
        claim(&store, &delivery, "rpl_c", false).await.unwrap();
    }

    /// A replayed record the delivery stage dead-lettered unsent (its endpoint disabled since,
    /// say) leaves a dead note and no attempt: its replay is settled, and a later one may send
    /// the delivery again.
    #[tokio::test]
    async fn a_replay_dead_lettered_unsent_no_longer_holds_the_delivery() {
        let store = MemoryStore::default();
        let delivery = dead_delivery(&store).await;
        let id = &delivery.delivery_id;
        let mark = ReplayMark {
            delivery_id: id.clone(),
            replay_id: "rpl_b".into(),
            at: SystemTime::now(),
        };
        store.record_replay_mark(&mark).await.unwrap();
        assert!(matches!(
            standing(&store, &delivery).await.unwrap(),
            Standing::OnItsWay(_)
        ));
        let note = crate::storage::DeliveryNote {
            delivery_id: id.clone(),
            event_id: delivery.event_id.clone(),
            endpoint_id: delivery.endpoint_id.clone(),
            tenant: delivery.tenant.clone(),
            event_type: delivery.event_type.clone(),
            at: mark.at + Duration::from_millis(5),
            kind: crate::storage::NoteKind::Dead {
                reason: DeadReason::EndpointDisabled,
            },
            replay_id: Some("rpl_b".into()),
        };
        store.record_note(&note).await.unwrap();
        let delivery = store.delivery(id).await.unwrap().unwrap();
        assert_eq!(standing(&store, &delivery).await.unwrap(), Standing::Dead);
        claim(&store, &delivery, "rpl_c", false)
            .await
            .expect("claimed by the next replay");
    }
}
