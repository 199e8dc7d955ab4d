//! `[metrics]`: the Prometheus listener.

use std::net::SocketAddr;

use serde::Deserialize;

use super::admin::AdminConfig;
use super::error::{ConfigError, invalid};
use crate::serde_field::addr;

/// `[metrics]`: the Prometheus listener.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// Listen address.
    #[serde(deserialize_with = "addr")]
    pub listen: SocketAddr,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 9464)),
        }
    }
}

impl MetricsConfig {
    /// A listener apart from the admin API's (port 0 picks a free port for each).
    pub(super) fn validate(&self, admin: &AdminConfig) -> Result<(), ConfigError> {
        if admin.listen == self.listen && admin.listen.port() != 0 {
            return Err(invalid(
                "metrics.listen",
                format!("= \"{}\" is the same address as admin.listen", admin.listen),
            ));
        }
        Ok(())
    }
}
