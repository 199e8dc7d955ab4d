//! The replays the admin API starts ([`ApiReplayer`]), and [`KafkaReplayer`], which runs them
//! on the process's cluster and store within the API's time.

use std::sync::Arc;
use std::time::Duration;

use super::request::Asked;
use super::{
    DeliveryReplay, EndpointReplay, EndpointReplayRequest, ReplayError, ReplayRequest,
    ReplaySummary, ReplayTarget, check, replay_delivery, replay_endpoint,
};
use crate::storage::{DeliveryState, DeliveryStore};

/// How long a replay through the admin API waits on the brokers.
pub(super) const API_IDLE_LIMIT: Duration = Duration::from_secs(5);
pub(super) const API_PUBLISH_DEADLINE: Duration = Duration::from_secs(10);

/// The replays the admin API starts.
#[async_trait::async_trait]
pub trait ApiReplayer: Send + Sync {
    /// Replays `delivery` (dead in the attempt log), as [`replay_delivery`] does.
    async fn replay(
        &self,
        delivery: &DeliveryState,
        asked: Asked,
    ) -> Result<DeliveryReplay, ReplayError>;

    /// Replays an endpoint's dead deliveries, as [`replay_endpoint`] does.
    async fn replay_endpoint(
        &self,
        request: &EndpointReplayRequest,
    ) -> Result<EndpointReplay, ReplayError>;

    /// Replays a range of DLQ offsets, as `hookline replay` does, within the API's time; the
    /// audit entry records `asked_by` as the credential that asked.
    async fn replay_range(
        &self,
        request: &ReplayRequest,
        asked_by: String,
    ) -> Result<ReplaySummary, ReplayError>;
}

/// [`ApiReplayer`] on the cluster and store the process runs on.
pub struct KafkaReplayer {
    /// Where the DLQ and the deliveries topic are.
    pub target: ReplayTarget,
    /// Where the audit entry goes, and what says whether a delivery is still dead.
    pub store: Arc<dyn DeliveryStore>,
}

#[async_trait::async_trait]
impl ApiReplayer for KafkaReplayer {
    async fn replay(
        &self,
        delivery: &DeliveryState,
        asked: Asked,
    ) -> Result<DeliveryReplay, ReplayError> {
        replay_delivery(&self.target, self.store.as_ref(), delivery, asked).await
    }

    async fn replay_endpoint(
        &self,
        request: &EndpointReplayRequest,
    ) -> Result<EndpointReplay, ReplayError> {
        replay_endpoint(&self.target, self.store.as_ref(), request).await
    }

    async fn replay_range(
        &self,
        request: &ReplayRequest,
        asked_by: String,
    ) -> Result<ReplaySummary, ReplayError> {
        check(&self.target, request)
            .await?
            .asked_by(asked_by)
            .idle_limit(API_IDLE_LIMIT)
            .publish_deadline(API_PUBLISH_DEADLINE)
            .run(self.store.as_ref(), &mut |_, _| {})
            .await
    }
}
