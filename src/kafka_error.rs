//! What a Kafka error means to hookline: a lost broker (which librdkafka recovers from by itself)
//! or something else, and the kind under which a repeat-limited log counts it.

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// Whether `error` says a client has lost its brokers: every connection down, or one of them
/// failing. librdkafka reconnects by itself and repeats these every few seconds per client.
pub fn is_broker_outage(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(RDKafkaErrorCode::AllBrokersDown | RDKafkaErrorCode::BrokerTransportFailure)
    )
}

/// The [`RepeatLog`](crate::repeat_log::RepeatLog) kind of a Kafka `error` met by `scope` (a topic, a stage): the scope and
/// librdkafka's error code, so that a new error in the same scope logs at once.
pub fn kind(scope: &str, error: &KafkaError) -> String {
    match error.rdkafka_error_code() {
        Some(code) => format!("{scope} {code:?}"),
        None => scope.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_lost_brokers_count_as_an_outage() {
        assert!(is_broker_outage(&KafkaError::Global(
            RDKafkaErrorCode::AllBrokersDown
        )));
        assert!(is_broker_outage(&KafkaError::MessageConsumption(
            RDKafkaErrorCode::BrokerTransportFailure
        )));
        assert!(!is_broker_outage(&KafkaError::Global(
            RDKafkaErrorCode::UnknownTopicOrPartition
        )));
    }
}
