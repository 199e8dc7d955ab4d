//! Panics hookline catches (bugs in hookline): the message they carried, and their log lines.

/// The message a panic carried (`panic!` with a literal or a formatted one), for logs and
/// answers.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

/// An attempt panicked: a bug in hookline. Its record is parked for a later attempt
/// (`hookline_parked_total{reason="panicked"}`) and the endpoint's lane slot given back.
pub fn attempt_panicked(delivery_id: &str, endpoint_id: &str, panic: &str) {
    tracing::error!(
        delivery_id,
        endpoint_id,
        panic,
        "attempt panicked; the record is parked for a later attempt"
    );
}

/// Writing a record's dead letter, parked copy or invalid-topic copy panicked: a bug in
/// hookline. The record stays unsettled and the delivery stage stops, so that hookline exits
/// and the next process reads the record again.
pub fn settling_panicked(topic: &str, partition: i32, offset: i64, panic: &str) {
    tracing::error!(
        topic,
        partition,
        offset,
        panic,
        "writing a record onward panicked; the delivery stage stops"
    );
}
