//! Test support: what a piece of telemetry logs and the metrics it leaves.

use std::sync::{Arc, Mutex};

use metrics_exporter_prometheus::PrometheusBuilder;

/// Log lines written while a test's subscriber is the default.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl tracing_subscriber::fmt::MakeWriter<'_> for Captured {
    type Writer = Captured;
    fn make_writer(&self) -> Captured {
        self.clone()
    }
}

/// What `report` logs (as text) and the metrics it leaves (as Prometheus renders them), with
/// its own subscriber and recorder.
pub(super) fn logged_and_exported(report: impl FnOnce()) -> (String, String) {
    let captured = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(captured.clone())
        .with_ansi(false)
        .finish();
    let recorder = PrometheusBuilder::new().build_recorder();
    tracing::subscriber::with_default(subscriber, || {
        metrics::with_local_recorder(&recorder, report);
    });
    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    (text, recorder.handle().render())
}
