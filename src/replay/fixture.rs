//! What the replay tests share: a request, dead letters on a mock cluster's DLQ, and a store
//! whose claims fail.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use tokio_util::sync::CancellationToken;

use super::{ReplayRequest, ReplayTarget};
use crate::kafka::producer_config;
use crate::record::DeliveryRecord;
use crate::stage::{outgoing, produce_until_acked};
use crate::storage::StoreError;

/// A replay of `hookline.dlq` partition 3, offsets 10..=20, for an operator's reason.
pub(super) fn request() -> ReplayRequest {
    ReplayRequest {
        partition: 3,
        from_offset: 10,
        to_offset: 20,
        endpoint: None,
        actor: "oncall".into(),
        reason: "receiver fixed".into(),
        dry_run: false,
    }
}

/// Fails every claim after the first `0`.
pub(super) struct ClaimsFailAfter(pub(super) AtomicUsize);

#[async_trait::async_trait]
impl crate::storage::hooked::Hooks for ClaimsFailAfter {
    async fn before_claim_replay(&self) -> Result<(), StoreError> {
        let left = self.0.load(Ordering::SeqCst);
        if left == 0 {
            return Err(StoreError::Unavailable("no CQL node answered".into()));
        }
        self.0.store(left - 1, Ordering::SeqCst);
        Ok(())
    }
}

/// Dead letter `n`, of a tenant's `order.created` event.
pub(super) fn dead_letter(n: usize) -> DeliveryRecord {
    crate::storage::conformance::dead_letter(&format!("evt_{n}"), 0)
}

/// A mock cluster with a DLQ and a deliveries topic, and a replay target on it.
pub(super) struct MockDlq {
    /// The cluster, which lives as long as this.
    pub(super) cluster: MockCluster<'static, DefaultProducerContext>,
    /// Where replay reads and writes on it.
    pub(super) target: ReplayTarget,
}

/// A mock cluster whose DLQ (one partition) holds `letters` from offset 0, and a replay
/// target on it.
pub(super) async fn mock_dlq(letters: &[DeliveryRecord]) -> MockDlq {
    let cluster = MockCluster::new(1).unwrap();
    let target = ReplayTarget {
        bootstrap: cluster.bootstrap_servers(),
        client: std::collections::BTreeMap::new().into(),
        dlq: "t.dlq".into(),
        deliveries: "t.deliveries".into(),
    };
    cluster.create_topic(&target.dlq, 1, 1).unwrap();
    cluster.create_topic(&target.deliveries, 1, 1).unwrap();
    let producer: crate::kafka::Producer = producer_config(&target.bootstrap, &target.client)
        .create_with_context(crate::kafka::ProducerLog::default())
        .unwrap();
    let never = CancellationToken::new();
    for letter in letters {
        let out = outgoing(Arc::from(target.dlq.as_str()), letter);
        assert!(produce_until_acked(&producer, out, &never).await);
    }
    MockDlq { cluster, target }
}
