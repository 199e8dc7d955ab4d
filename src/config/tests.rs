//! Loading end to end: a file and environment in, a `Config` or an error message out.

use std::time::Duration;

use super::env::SECTIONS;
use super::*;
use crate::id::Tenant;
use crate::retry_policy::RetryPolicy;

fn load(file: &str, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
    Config::from_sources(
        Some(("test.toml", file)),
        env.iter().map(|(k, v)| (k.to_string(), v.to_string())),
    )
}

fn err(file: &str, env: &[(&str, &str)]) -> String {
    load(file, env).unwrap_err().to_string()
}

/// A CQL password is whatever the variable holds, even what would read as a number or a
/// broken array; and no error or Debug output shows it.
#[test]
fn the_cql_password_is_taken_verbatim_and_never_shown() {
    let file = "[store.scylla]\nusername = \"hookline\"";
    for raw in [
        "98765432123",
        "[pw-not-toml",
        "\"pw-quoted\"",
        "pw with spaces",
    ] {
        let c = load(file, &[("HOOKLINE_STORE__SCYLLA__PASSWORD", raw)]).unwrap();
        let password = c.store.scylla.password.as_ref().expect("password set");
        assert_eq!(password.expose(), raw);
        let shown = format!("{c:?}");
        assert!(!shown.contains(raw), "{raw}: {shown}");
    }
    let e = err(&format!("{file}\npassword = 98765432123"), &[]);
    assert!(e.contains("store.scylla.password"), "{e}");
    assert!(!e.contains("98765432123"), "{e}");
    let e = err(file, &[("HOOKLINE_STORE__SCYLLA__USERNAME", "12345")]);
    assert!(e.contains("store.scylla.password is missing"), "{e}");
}

#[test]
fn the_payload_limit_follows_the_producers_record_limit() {
    let most = load("[http]\nmax_payload_bytes = 934464", &[]).unwrap();
    assert_eq!(most.http.max_payload_bytes, 934_464);
    let larger = load(
        "[http]\nmax_payload_bytes = 1400000\n[kafka.client]\n\"message.max.bytes\" = \"1500000\"",
        &[],
    )
    .unwrap();
    assert_eq!(larger.http.max_payload_bytes, 1_400_000);
}

#[test]
fn a_section_variable_with_one_underscore_is_an_error_that_spells_it() {
    assert_eq!(
        err("", &[("HOOKLINE_KAFKA_BOOTSTRAP_SERVERS", "k:9092")]),
        "environment variable HOOKLINE_KAFKA_BOOTSTRAP_SERVERS: is not read: configuration \
         variables separate the section from the key with __, e.g. \
         HOOKLINE_KAFKA__BOOTSTRAP_SERVERS"
    );
    // The rest of an admin variable's name may be a token, and is not repeated.
    let admin = err("", &[("HOOKLINE_ADMIN_TENANT_TOKENS_s3cr3t-token", "acme")]);
    assert!(!admin.contains("s3cr3t"), "{admin}");
    assert!(admin.starts_with("environment variable HOOKLINE_ADMIN_...: is not read"));
    // Others without __ are none of the config's business.
    for var in [
        "HOOKLINE_LOG",
        "HOOKLINE_HELM",
        "HOOKLINE_KAFKAESQUE",
        "HOOKLINE_BENCH_EVENTS",
    ] {
        assert!(load("", &[(var, "x")]).is_ok(), "{var}");
    }
    // Every section named is one the file has.
    for section in SECTIONS {
        assert!(load(&format!("[{section}]"), &[]).is_ok(), "{section}");
    }
}

#[test]
fn defaults_are_valid_and_as_documented() {
    let c = Config::from_sources(None, vec![]).unwrap();
    assert_eq!(c.kafka.topics.deliveries, "hookline.deliveries");
    assert_eq!(c.kafka.topics.endpoints, "hookline.endpoints");
    assert_eq!(c.retry.policy(), RetryPolicy::default());
    assert_eq!(c.retry.tiers.len(), 6);
    assert_eq!(
        c.tier_topics()
            .into_iter()
            .map(|(_, n)| n)
            .collect::<Vec<_>>(),
        [
            "hookline.retry.5s",
            "hookline.retry.30s",
            "hookline.retry.2m",
            "hookline.retry.10m",
            "hookline.retry.1h",
            "hookline.retry.6h"
        ]
    );
    assert_eq!(c.http.connect_timeout, Duration::from_secs(3));
    assert_eq!(c.http.max_payload_bytes, 262_144);
    assert_eq!(c.admin.listen.to_string(), "127.0.0.1:8080");
    assert_eq!(c.metrics.listen.to_string(), "127.0.0.1:9464");
    assert!(c.security.master_key.is_none());
    assert!(
        c.require_master_key()
            .unwrap_err()
            .to_string()
            .contains("security.master_key is required")
    );
    assert_eq!(c.store.kind, StoreKind::Scylla);
    Config::dev_defaults().validate().unwrap();
    assert!(Config::dev_defaults().require_master_key().is_ok());
}

#[test]
fn the_example_file_parses_to_the_defaults() {
    let text = include_str!("../../schemas/hookline.example.toml");
    let c = load(text, &[]).unwrap();
    assert_eq!(format!("{c:?}"), format!("{:?}", Config::default()));
}

#[test]
fn file_values_are_read() {
    let c = load(
        r#"
        [kafka]
        bootstrap_servers = "k1:9092,k2:9092"
        partitions = 24
        events_partitions = 3
        input_topics = ["outbox.event.order"]
        input_pattern = '^outbox\..*'
        [kafka.client]
        "linger.ms" = 0
        "security.protocol" = "ssl"
        [retry]
        base = "10s"
        multiplier = 3
        cap = "30m"
        window = "2h"
        tiers = ["1s", "90s", "1d"]
        [http]
        allow_cidrs = ["10.1.0.0/16"]
        dns_servers = ["10.0.0.2:53"]
        [admin]
        operator_tokens = ["op-token-0123456789"]
        tenant_tokens = { "tenant-token-0123456789" = "acme" }
        [security]
        master_key = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="
        [store]
        kind = "memory"
        [store.scylla]
        attempt_ttl = "7d"
        "#,
        &[],
    )
    .unwrap();
    assert_eq!(c.kafka.partitions, 24);
    assert_eq!(c.kafka.events_partitions, Some(3));
    assert_eq!(c.kafka.client["linger.ms"], "0");
    assert_eq!(c.retry.multiplier, 3.0);
    assert_eq!(
        c.tier_topics()
            .into_iter()
            .map(|(_, n)| n)
            .collect::<Vec<_>>(),
        [
            "hookline.retry.1s",
            "hookline.retry.90s",
            "hookline.retry.1d"
        ]
    );
    assert_eq!(c.http.allow_cidrs[0].to_string(), "10.1.0.0/16");
    assert_eq!(
        c.admin.principal("op-token-0123456789"),
        Some(Principal::Operator)
    );
    assert_eq!(
        c.admin.principal("tenant-token-0123456789"),
        Some(Principal::Tenant(Tenant::parse("acme").unwrap()))
    );
    assert_eq!(c.admin.principal("op-token-012345678"), None);
    assert!(c.require_master_key().is_ok());
    assert_eq!(c.store.kind, StoreKind::Memory);
    assert_eq!(c.store.scylla.attempt_ttl, Duration::from_secs(7 * 86_400));
    let rd = c.kafka.client_config();
    assert_eq!(rd.get("bootstrap.servers"), Some("k1:9092,k2:9092"));
    assert_eq!(rd.get("security.protocol"), Some("ssl"));
    // Secrets never print.
    let dbg = format!("{c:?}");
    assert!(!dbg.contains("op-token") && !dbg.contains("tenant-token") && !dbg.contains("AAAA"));
}

#[test]
fn env_overrides_file_and_defaults() {
    let c = load(
        "[kafka]\nbootstrap_servers = \"file:9092\"\npartitions = 6\n",
        &[
            ("HOOKLINE_KAFKA__BOOTSTRAP_SERVERS", "env:9092"),
            ("HOOKLINE_KAFKA__CLIENT__SECURITY_PROTOCOL", "ssl"),
            ("HOOKLINE_KAFKA__CLIENT__LINGER_MS", "0"),
            ("HOOKLINE_RETRY__TIERS", r#"["5s","1m"]"#),
            ("HOOKLINE_RETRY__MULTIPLIER", "1.5"),
            ("HOOKLINE_ADMIN__LISTEN", "0.0.0.0:9000"),
            ("HOOKLINE_HTTP__DANGEROUS_ALLOW_HTTP", "true"),
            ("HOOKLINE_STORE__SCYLLA__KEYSPACE", "\"ks2024\""),
            ("HOOKLINE_STORE__SCYLLA__REPLICATION_FACTOR", "3"),
            ("HOOKLINE_LOG", "debug"),
            ("PATH", "/bin"),
        ],
    )
    .unwrap();
    assert_eq!(c.kafka.bootstrap_servers, "env:9092");
    assert_eq!(c.kafka.partitions, 6, "file value kept where env is silent");
    assert_eq!(c.kafka.client["security.protocol"], "ssl");
    assert_eq!(c.kafka.client["linger.ms"], "0");
    assert_eq!(
        c.retry.tiers,
        [Duration::from_secs(5), Duration::from_secs(60)]
    );
    assert_eq!(c.retry.multiplier, 1.5);
    assert_eq!(c.admin.listen.to_string(), "0.0.0.0:9000");
    assert!(c.http.dangerous_allow_http);
    assert_eq!(c.store.scylla.keyspace, "ks2024");
    assert_eq!(c.store.scylla.replication_factor, Some(3));
    assert_eq!(
        c.store.scylla.replication().unwrap(),
        crate::storage::scylla::Replication::Simple(3)
    );
}

#[test]
fn validation_messages_name_the_key_and_say_why() {
    assert_eq!(
        err("[retry]\ntiers = [\"5s\", \"30s\", \"0s\"]", &[]),
        "retry.tiers[2] = \"0s\" must be greater than zero (set by test.toml)"
    );
    assert_eq!(
        err("[kafka]\nbootstrap_server = \"x\"", &[]),
        "unknown key kafka.bootstrap_server (did you mean bootstrap_servers?) (set by test.toml)"
    );
    assert_eq!(
        err("", &[("HOOKLINE_KAFKA__BOOTSTRAP_SERVER", "x")]),
        "unknown key kafka.bootstrap_server (did you mean bootstrap_servers?) (set by \
         HOOKLINE_KAFKA__BOOTSTRAP_SERVER)"
    );
    assert_eq!(
        err("[admin]\nlisten = \"x\"", &[]),
        "admin.listen = \"x\" is not an address (ip:port, e.g. \"127.0.0.1:8080\") (set by test.toml)"
    );
    assert!(err("[nope]", &[]).starts_with("unknown key nope"));
    let cases: &[(&str, &str)] = &[
        (
            "[retry]\ntiers = [\"5s\", \"5s\"]",
            "retry.tiers[1] = \"5s\" must be greater than retry.tiers[0]",
        ),
        (
            "[retry]\ntiers = [\"30s\", \"5s\"]",
            "retry.tiers[1] = \"5s\" must be greater",
        ),
        (
            "[retry]\ntiers = [\"8d\"]",
            "retry.tiers[0] = \"8days\" must be at most 7d",
        ),
        (
            "[retry]\ntiers = []",
            "retry.tiers must list at least one tier",
        ),
        (
            "[retry]\ntiers = [\"5s\", \"soon\"]",
            "retry.tiers[1] = \"soon\" is not a duration",
        ),
        (
            "[retry]\nbase = \"0s\"",
            "retry.base must be greater than zero",
        ),
        (
            "[retry]\nmultiplier = 0.5",
            "retry.multiplier must be a finite number >= 1",
        ),
        (
            "[retry]\ncap = \"1s\"",
            "retry.cap (1s) must be at least retry.base",
        ),
        (
            "[kafka]\npartitions = 0",
            "kafka.partitions = 0 must be between 1 and 10000",
        ),
        (
            "[kafka]\npartitions = \"x\"",
            "kafka.partitions is wrong: invalid type: string \"x\"",
        ),
        (
            "[kafka]\nevents_partitions = 0",
            "kafka.events_partitions = 0 must be between 1 and 10000",
        ),
        (
            "[kafka]\ninput_pattern = 'outbox'",
            "kafka.input_pattern = \"outbox\" must start with ^",
        ),
        (
            "[kafka]\ninput_pattern = '^outbox(('",
            "kafka.input_pattern = \"^outbox((\" is not a valid regex",
        ),
        (
            "[kafka]\ninput_pattern = '^hookline\\..*'",
            "matches hookline's own topic \"hookline.deliveries\"",
        ),
        (
            "[kafka]\ninput_topics = [\"hookline.dlq\"]",
            "kafka.input_topics[0] = \"hookline.dlq\" is one of hookline's own topics",
        ),
        (
            "[kafka]\ninput_topics = [\"bad topic\"]",
            "kafka.input_topics[0] = \"bad topic\" is not a Kafka topic name",
        ),
        (
            "[kafka.topics]\ndlq = \"hookline.deliveries\"",
            "kafka.topics.dlq = \"hookline.deliveries\" is already used",
        ),
        (
            "[kafka]\nbootstrap_servers = \"\"",
            "kafka.bootstrap_servers must not be empty",
        ),
        (
            "[delivery]\nmax_in_flight = 0",
            "delivery.max_in_flight = 0 must be between 1 and",
        ),
        (
            "[delivery]\npartition_max_in_flight = 4",
            "delivery.partition_max_in_flight = 4 must be between",
        ),
        (
            "[delivery]\nbreaker_cooldown = \"0s\"",
            "delivery.breaker_cooldown = \"0s\" must be greater than zero",
        ),
        (
            "[delivery]\nbreaker_cooldown = \"2h\"",
            "delivery.breaker_cooldown = \"2h\" must be at most 1h",
        ),
        (
            "[delivery]\nstall_after = \"0s\"",
            "delivery.stall_after = \"0s\" must be greater than zero",
        ),
        (
            "[http]\ntotal_timeout = \"1s\"",
            "http.total_timeout = \"1s\" must be at least http.connect_timeout",
        ),
        (
            "[http]\nmax_payload_bytes = 2000000",
            "http.max_payload_bytes = 2000000 must be between",
        ),
        (
            // A payload of a whole record leaves no room for what the fan-out adds.
            "[http]\nmax_payload_bytes = 1000000",
            "http.max_payload_bytes = 1000000 must be between 1 and 934464: a payload rides \
             in one Kafka record of at most 1000000 bytes",
        ),
        (
            "[http]\nmax_payload_bytes = 2000000\n[kafka.client]\n\"message.max.bytes\" = \"1500000\"",
            "http.max_payload_bytes = 2000000 must be between 1 and 1434464",
        ),
        (
            "[kafka.outbox]\ntype_header = \"\"",
            "kafka.outbox.type_header = \"\" must be a header name of 1 to 256 characters",
        ),
        (
            "[kafka.outbox]\ntenant_header = \"id\"",
            "kafka.outbox.tenant_header = \"id\" is the header of the event id",
        ),
        (
            "[kafka.outbox]\ntype_header = \"t\"\ntenant_header = \"t\"",
            "kafka.outbox.tenant_header = \"t\" is kafka.outbox.type_header as well",
        ),
        (
            "[kafka.outbox]\ntype = \"t\"",
            "unknown key kafka.outbox.type",
        ),
        (
            "[kafka.client]\n\"message.max.bytes\" = \"1MB\"",
            "kafka.client.\"message.max.bytes\" = \"1MB\" is not a number of bytes",
        ),
        (
            "[http]\nallow_cidrs = [\"10.0.0.0/33\"]",
            "http.allow_cidrs[0] = \"10.0.0.0/33\" is not a CIDR",
        ),
        (
            "[http]\ndns_servers = [\"8.8.8.8\"]",
            "http.dns_servers[0] = \"8.8.8.8\" is not an address",
        ),
        (
            "[store.memory]\ncapacity = 0",
            "store.memory.capacity = 0 must be between 1 and 10000000",
        ),
        ("[store.memory]\ncapacity = -5", "store.memory.capacity"),
        (
            "[admin]\noperator_tokens = [\"short\"]",
            "admin.operator_tokens[0] must be 16 to 1024 characters (got 5)",
        ),
        (
            "[admin]\noperator_tokens = [\"0123456789abcdef\", \"0123456789abcdef\"]",
            "admin.operator_tokens[1] repeats another admin token",
        ),
        (
            "[metrics]\nlisten = \"127.0.0.1:8080\"",
            "metrics.listen = \"127.0.0.1:8080\" is the same address as admin.listen",
        ),
        (
            "[security]\nmaster_key = \"AAAA\"",
            "security.master_key is wrong: is not usable: master key must be 32 bytes, got 3",
        ),
        (
            "[store]\nkind = \"postgres\"",
            "store.kind is wrong: unknown variant `postgres`",
        ),
        (
            "[store.scylla]\nkeyspace = \"1ks\"",
            "store.scylla.keyspace = \"1ks\" must be 1 to 48 lowercase letters",
        ),
        (
            "[store.scylla]\nkeyspace = \"Hookline\"",
            "store.scylla.keyspace = \"Hookline\" must be 1 to 48 lowercase letters",
        ),
        (
            "[store.scylla]\nnodes = []",
            "store.scylla.nodes must list at least one host:port",
        ),
        (
            "[store.scylla]\nnodes = [\"db1:9042\", \"db2\"]",
            "store.scylla.nodes[1] = \"db2\" is not host:port",
        ),
        (
            "[store.scylla]\nattempt_ttl = \"30y\"",
            "store.scylla.attempt_ttl = \"30years\" must be between 1s and 20 years",
        ),
        (
            "[store.scylla]\nwrite_timeout = \"soon\"",
            "store.scylla.write_timeout = \"soon\" is not a duration",
        ),
        (
            "[store.scylla]\nreplication_factor = 3\nreplication = { dc1 = 3 }",
            "store.scylla.replication and replication_factor are both set",
        ),
        (
            "[store.scylla]\nkeyspac = \"x\"",
            "unknown key store.scylla.keyspac (did you mean keyspace?)",
        ),
        ("[kafka", "config file test.toml is not valid TOML"),
    ];
    for (file, want) in cases {
        let got = err(file, &[]);
        assert!(
            got.starts_with(want) || got.contains(want),
            "{file:?}: got {got:?}, want {want:?}"
        );
    }
    // Key material never appears in an error.
    let key_err = err(
        "[security]\nmaster_key = \"c2VjcmV0LWtleS1tYXRlcmlhbA==\"",
        &[],
    );
    assert!(!key_err.contains("c2VjcmV0"), "{key_err}");
}

#[test]
fn env_reaches_every_store_scylla_key() {
    let c = load(
        "[store.scylla]\nnodes = [\"file:9042\"]\nkeyspace = \"from_file\"\n",
        &[
            (
                "HOOKLINE_STORE__SCYLLA__NODES",
                r#"["db1:9042","db2:9042"]"#,
            ),
            (
                "HOOKLINE_STORE__SCYLLA__REPLICATION",
                "{ dc1 = 3, dc2 = 2 }",
            ),
            ("HOOKLINE_STORE__SCYLLA__WRITE_TIMEOUT", "750ms"),
            ("HOOKLINE_STORE__SCYLLA__AUDIT_TTL", "90d"),
            ("HOOKLINE_STORE__SCYLLA__MAX_CONCURRENT_WRITES", "32"),
            ("HOOKLINE_STORE__SCYLLA__LOCAL_DC", "dc1"),
        ],
    )
    .unwrap();
    let s = &c.store.scylla;
    assert_eq!(s.nodes, ["db1:9042", "db2:9042"]);
    assert_eq!(
        s.keyspace, "from_file",
        "file value kept where env is silent"
    );
    assert_eq!(
        s.replication().unwrap().cql(),
        "{'class': 'NetworkTopologyStrategy', 'dc1': 3, 'dc2': 2}"
    );
    assert_eq!(s.write_timeout, Duration::from_millis(750));
    assert_eq!(s.audit_ttl, Duration::from_secs(90 * 86_400));
    assert_eq!(s.max_concurrent_writes, 32);
    assert_eq!(s.local_dc.as_deref(), Some("dc1"));
    // Errors in nested keys say which variable set them.
    assert_eq!(
        err(
            "",
            &[("HOOKLINE_STORE__SCYLLA__NODES", r#"["db1:9042","db2"]"#)]
        ),
        "store.scylla.nodes[1] = \"db2\" is not host:port (e.g. \"10.0.0.1:9042\") (set by \
         HOOKLINE_STORE__SCYLLA__NODES)"
    );
    assert_eq!(
        err("", &[("HOOKLINE_STORE__SCYLLA__KEYSPACE", "Prod")]),
        "store.scylla.keyspace = \"Prod\" must be 1 to 48 lowercase letters, digits or '_', \
         starting with a letter (set by HOOKLINE_STORE__SCYLLA__KEYSPACE)"
    );
    assert!(
        err("", &[("HOOKLINE_STORE__SCYLLA__NODEZ", "[]")])
            .starts_with("unknown key store.scylla.nodez (did you mean nodes?)")
    );
}

#[test]
fn env_errors_say_which_variable() {
    assert_eq!(
        err(
            "[admin]\nlisten = \"127.0.0.1:1\"",
            &[("HOOKLINE_ADMIN__LISTEN__PORT", "1")]
        ),
        "environment variable HOOKLINE_ADMIN__LISTEN__PORT: admin.listen is a value, not a section"
    );
    assert!(err("", &[("HOOKLINE_RETRY__TIERS", "[\"5s\"")]).contains("not valid TOML"));
    assert_eq!(
        err("", &[("HOOKLINE_ADMIN__LISTEN", "nowhere")]),
        "admin.listen = \"nowhere\" is not an address (ip:port, e.g. \"127.0.0.1:8080\") (set by HOOKLINE_ADMIN__LISTEN)"
    );
    assert!(err("", &[("HOOKLINE_KAFKA____X", "1")]).contains("empty key segment"));
    // A clash with a default is not blamed on the file.
    assert_eq!(
        err("[admin]\nlisten = \"127.0.0.1:9464\"", &[]),
        "metrics.listen = \"127.0.0.1:9464\" is the same address as admin.listen"
    );
}

#[test]
fn secrets_never_appear_in_config_errors() {
    const OP: &str = "supersecret_operator_token_123";
    const TEN: &str = "supersecret_tenant_token_456";
    const KEY: &str = "c2VjcmV0LWtleS1tYXRlcmlhbA";
    let file_cases: &[(&str, &str)] = &[
        (
            "[admin.tenant_tokens]\n\"supersecret_tenant_token_456\" = \"\"",
            "admin.tenant_tokens (a token) is wrong: tenant must not be empty (set by test.toml)",
        ),
        (
            "[admin.tenant_tokens]\n\"supersecret_tenant_token_456\" = 5",
            "admin.tenant_tokens (a token) is wrong: invalid type: integer `5`",
        ),
        (
            "[admin]\noperator_tokens = \"supersecret_operator_token_123\"",
            "admin.operator_tokens is wrong: expected a list of tokens, got a string (value not \
             shown: it is a secret) (set by test.toml)",
        ),
        (
            "[admin]\noperator_tokens = [\"supersecret_operator_token_123\", 5]",
            "admin.operator_tokens[1] is wrong: expected a token, got an integer",
        ),
        (
            "[admin]\ntenant_tokens = \"supersecret_tenant_token_456\"",
            "admin.tenant_tokens is wrong: expected a table of token = tenant, got a string",
        ),
        (
            "[security]\nmaster_key = [\"c2VjcmV0LWtleS1tYXRlcmlhbA\"]",
            "security.master_key is wrong: expected base64 of 32 bytes, got a list",
        ),
        (
            "[kafka.client]\n\"sasl.password\" = [\"supersecret_operator_token_123\"]",
            "kafka.client",
        ),
    ];
    let env_cases: &[(&str, &str, &str)] = &[
        (
            "HOOKLINE_ADMIN__TENANT_TOKENS",
            "{ \"supersecret_tenant_token_456\" = \"\" }",
            "admin.tenant_tokens (a token) is wrong: tenant must not be empty (set by \
             HOOKLINE_ADMIN__TENANT_TOKENS)",
        ),
        (
            "HOOKLINE_ADMIN__TENANT_TOKENS",
            "{ \"supersecret_tenant_token_456\" = 5 }",
            "admin.tenant_tokens (a token) is wrong",
        ),
        (
            "HOOKLINE_ADMIN__OPERATOR_TOKENS",
            OP,
            "admin.operator_tokens is wrong: expected a list of tokens, got a string (value not \
             shown: it is a secret) (set by HOOKLINE_ADMIN__OPERATOR_TOKENS)",
        ),
        (
            "HOOKLINE_ADMIN__TENANT_TOKENS",
            TEN,
            "admin.tenant_tokens is wrong: expected a table of token = tenant, got a string \
             (value not shown: it is a secret) (set by HOOKLINE_ADMIN__TENANT_TOKENS)",
        ),
        (
            "HOOKLINE_ADMIN__OPERATOR_TOKENS",
            "[\"supersecret_operator_token_123",
            "environment variable HOOKLINE_ADMIN__OPERATOR_TOKENS: value for \
             admin.operator_tokens is not valid TOML",
        ),
        (
            "HOOKLINE_ADMIN__TENANT_TOKENS__SUPERSECRET_TENANT_TOKEN_456",
            "acme",
            "environment variable HOOKLINE_ADMIN__TENANT_TOKENS__...: a token cannot be part",
        ),
        (
            "HOOKLINE_SECURITY__MASTER_KEY",
            "[\"c2VjcmV0LWtleS1tYXRlcmlhbA\"]",
            "security.master_key is wrong: expected base64 of 32 bytes, got a list",
        ),
    ];
    let got = file_cases
        .iter()
        .map(|(file, want)| (*file, err(file, &[]), *want))
        .chain(
            env_cases
                .iter()
                .map(|(var, value, want)| (*var, err("", &[(var, value)]), *want)),
        );
    for (input, got, want) in got {
        assert!(got.starts_with(want), "{input}: got {got:?}, want {want:?}");
        let lower = got.to_ascii_lowercase();
        for secret in [OP, TEN, KEY] {
            assert!(
                !lower.contains(&secret.to_ascii_lowercase()),
                "{input}: {got}"
            );
        }
    }
}

#[test]
fn secret_kafka_client_properties_are_redacted_in_debug() {
    let c = load(
        "[kafka.client]\n\"sasl.password\" = \"supersecret_sasl\"\n\
         \"ssl.key.pem\" = \"supersecret_pem\"\n\"sasl.username\" = \"hookline\"",
        &[(
            "HOOKLINE_KAFKA__CLIENT__SASL_OAUTHBEARER_CLIENT_SECRET",
            "supersecret_oauth",
        )],
    )
    .unwrap();
    assert_eq!(c.kafka.client["sasl.password"], "supersecret_sasl");
    let dbg = format!("{c:?}");
    assert!(!dbg.contains("supersecret"), "{dbg}");
    assert!(dbg.contains("\"sasl.password\": \"<redacted>\""), "{dbg}");
    assert!(dbg.contains("\"sasl.username\": \"hookline\""), "{dbg}");
}

#[test]
fn an_env_variable_below_a_value_is_named() {
    assert_eq!(
        err("", &[("HOOKLINE_KAFKA__PARTITIONS__X", "1")]),
        "kafka.partitions is wrong: invalid type: map, expected u32 (set by \
         HOOKLINE_KAFKA__PARTITIONS__X)"
    );
}

#[test]
fn tenant_ceilings_and_the_public_url_are_read_and_checked() {
    let c = load(
        "[tenants]\nmax_endpoints = 5\nmax_in_flight = 8\nrate_limit_per_s = 2.5\n\
         [admin]\npublic_url = \"https://hooks.example.com/\"",
        &[],
    )
    .unwrap();
    let d = c.tenant_defaults();
    assert_eq!(
        (
            d.ceilings.max_endpoints,
            d.ceilings.max_in_flight,
            d.ceilings.rate_limit_per_s
        ),
        (Some(5), Some(8), Some(2.5))
    );
    assert_eq!(d.default_max_in_flight, c.delivery.max_in_flight);
    assert_eq!(c.admin.public_base(), "https://hooks.example.com");
    assert_eq!(
        Config::default().admin.public_base(),
        "http://127.0.0.1:8080"
    );
    for (text, expected) in [
        (
            "[tenants]\nmax_in_flight = 0",
            "tenants.max_in_flight = 0 must be between 1 and",
        ),
        (
            "[tenants]\nmax_endpoints = 2000000",
            "tenants.max_endpoints = 2000000 must be at most",
        ),
        (
            "[tenants]\nrate_limit_per_s = 0.0",
            "tenants.rate_limit_per_s = 0 must be between",
        ),
        ("[tenants]\nmax_endpoint = 1", "max_endpoint"),
        (
            "[admin]\npublic_url = \"ftp://x\"",
            "admin.public_url = \"ftp://x\" must be an http",
        ),
        (
            "[admin]\npublic_url = \"https://x/?a=1\"",
            "must not carry a query",
        ),
        (
            "[admin]\npublic_url = \"nope\"",
            "admin.public_url = \"nope\" is not a URL",
        ),
    ] {
        let err = load(text, &[]).unwrap_err().to_string();
        assert!(err.contains(expected), "{text}: {err}");
    }
    let env = load("", &[("HOOKLINE_TENANTS__MAX_IN_FLIGHT", "4")]).unwrap();
    assert_eq!(env.tenants.max_in_flight, 4);
}
