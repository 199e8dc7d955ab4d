//! Republishing one dead letter to the deliveries topic as a replay, and noting it in the
//! attempt log so that another replay leaves the delivery alone until its attempt is logged.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rdkafka::error::KafkaError;
use tokio_util::sync::CancellationToken;

use super::error::kafka_failure;
use super::{ReplayError, ReplayTarget};
use crate::kafka::{producer_config, refused_for_good};
use crate::record::DeliveryRecord;
use crate::stage::{Produced, outgoing, produce_unless_refused};
use crate::storage::{DeliveryStore, ReplayMark};
use crate::telemetry;

/// Republishes dead letters to the deliveries topic as replays.
pub(super) struct Republisher {
    producer: crate::kafka::Producer,
    /// The deliveries topic.
    pub(super) deliveries: Arc<str>,
    never: CancellationToken,
}

impl Republisher {
    /// A producer to `target`'s deliveries topic.
    pub(super) fn new(target: &ReplayTarget) -> Result<Republisher, ReplayError> {
        // One record per produce request: a replay sends many records at once, and the broker
        // refuses a batch whole, so a record it refuses (larger than the deliveries topic
        // takes, say) would take the records batched with it down too, retry after retry.
        let producer = producer_config(&target.bootstrap, &target.client)
            .set("batch.num.messages", "1")
            .create_with_context(crate::kafka::ProducerLog::default())
            .map_err(kafka_failure(target, "creating the producer".into()))?;
        Ok(Republisher {
            producer,
            deliveries: Arc::from(target.deliveries.as_str()),
            never: CancellationToken::new(),
        })
    }

    /// Republishes `record` as replay `replay_id` (a fresh window); whether the deliveries
    /// topic acknowledged it within `deadline`. Once it did, notes the replay in `store`
    /// ([`ReplayMark`]) so that another replay leaves the delivery alone until this one's
    /// attempt is logged. A mark the store does not take is logged and counted, not fatal:
    /// the record is on its way all the same, and the worst it leads to is a second replay
    /// sending it twice, with the same `webhook-id`.
    pub(super) async fn republish(
        &self,
        record: DeliveryRecord,
        replay_id: &str,
        deadline: Duration,
        store: &dyn DeliveryStore,
    ) -> Republished {
        let delivery_id = record.delivery_id.clone();
        let out = outgoing(self.deliveries.clone(), &record.for_replay(replay_id));
        let sent = tokio::time::timeout(
            deadline,
            produce_unless_refused(&self.producer, out, &self.never, refused_for_good),
        )
        .await;
        match sent {
            Ok(Produced::Acked) => {}
            Ok(Produced::Refused(e)) => return Republished::Refused(e),
            Ok(Produced::Stopped) | Err(_) => return Republished::NotAcknowledged,
        }
        let mark = ReplayMark {
            delivery_id,
            replay_id: replay_id.to_owned(),
            at: SystemTime::now(),
        };
        if let Err(error) = store.record_replay_mark(&mark).await {
            telemetry::replay_mark_failed();
            tracing::warn!(delivery = %mark.delivery_id, replay_id, %error,
                "replayed, but the store did not take the replay's mark: a second replay before \
                 this one's attempt is logged would send the delivery again");
        }
        Republished::Yes
    }
}

/// Whether [`Republisher::republish`] got its record into the deliveries topic.
pub(super) enum Republished {
    /// Acknowledged (and noted).
    Yes,
    /// Refused with an error that sending it again meets the same way (larger than the topic
    /// takes, say); nothing was written.
    Refused(KafkaError),
    /// Not acknowledged in time: it may still be written.
    NotAcknowledged,
}
