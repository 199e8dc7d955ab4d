//! Starts the admin API next to the stages.

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Config;
use crate::service::{Handles, ServiceError};

pub(super) async fn serve(
    _config: &Config,
    _handles: &Handles,
    _shutdown: &CancellationToken,
    _tasks: &TaskTracker,
) -> Result<(), ServiceError> {
    Ok(())
}
