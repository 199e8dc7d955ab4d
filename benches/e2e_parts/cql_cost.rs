//! What the CQL store costs the CQL node per delivery: the mutations it applied to the run's
//! keyspace (`system_views.local_write_latency`, which counts each partition update once, so a
//! single-partition batch is one) and the CPU of the node's process when it runs here.

use hookline::config::Config;
use hookline::storage::scylla::connect_session;
use scylla::client::session::Session;

use crate::common::{TICKS_PER_S, local_server_pid, process_ticks};

/// The main class on the command line of a Cassandra node started here.
const CASSANDRA_MAIN: &[u8] = b"org.apache.cassandra.service.CassandraDaemon";

/// A CQL session on the run's node and where its process is.
pub struct CqlMeter {
    session: Session,
    keyspace: String,
    pid: Option<String>,
}

/// One reading: mutations applied to the keyspace so far, and the node's CPU ticks.
#[derive(Debug, Clone, Copy)]
pub struct CqlSample {
    mutations: u64,
    ticks: Option<u64>,
}

/// The CQL node's work per delivery between two readings.
#[derive(Debug, Clone, Copy)]
pub struct CqlCost {
    /// Mutations applied per delivery.
    pub mutations: f64,
    /// The node's CPU per delivery (µs), when it runs here.
    pub cpu_us: Option<f64>,
}

impl CqlMeter {
    /// A meter on the store of `config` (its CQL store must be the one in use).
    pub async fn connect(config: &Config) -> CqlMeter {
        let cql = &config.store.scylla;
        let session = connect_session(cql)
            .await
            .expect("CQL session for the bench's cost meter");
        CqlMeter {
            session,
            keyspace: cql.keyspace.clone(),
            pid: local_server_pid(&cql.nodes.join(","), CASSANDRA_MAIN),
        }
    }

    /// Reads the counters now.
    pub async fn sample(&self) -> CqlSample {
        let rows = self
            .session
            .query_unpaged(
                "SELECT count FROM system_views.local_write_latency WHERE keyspace_name = ?",
                (self.keyspace.as_str(),),
            )
            .await
            .expect("system_views.local_write_latency (Cassandra 4.0 or newer)")
            .into_rows_result()
            .expect("rows");
        let mutations = rows
            .rows::<(i64,)>()
            .expect("count column")
            .map(|r| r.map_or(0, |(n,)| u64::try_from(n).unwrap_or(0)))
            .sum();
        CqlSample {
            mutations,
            ticks: self.pid.as_deref().and_then(process_ticks),
        }
    }
}

impl CqlSample {
    /// What the node did per delivery from `self` to `after`.
    pub fn cost_to(self, after: CqlSample, delivered: u64) -> CqlCost {
        let n = delivered.max(1) as f64;
        CqlCost {
            mutations: after.mutations.saturating_sub(self.mutations) as f64 / n,
            cpu_us: self
                .ticks
                .zip(after.ticks)
                .map(|(a, b)| b.saturating_sub(a) as f64 * 1e6 / TICKS_PER_S / n),
        }
    }
}
