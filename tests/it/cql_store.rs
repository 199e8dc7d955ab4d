//! The CQL store and `hookline migrate` against the real server (Apache Cassandra 5 standing in
//! for ScyllaDB) on 127.0.0.1:9042, started by `tests/services up`. Every test works in its own
//! keyspace and drops it at the end, pass or fail.

use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::FutureExt;
use hookline::attempt::ErrorClass;
use hookline::dead_reason::DeadReason;
use hookline::id::EndpointId;
use hookline::storage::conformance::{self, attempt_row, legacy_attempt_row};
use hookline::storage::scylla::migrate::{MIGRATIONS, MigrateError, migrate};
use hookline::storage::scylla::{
    CqlPassword, CqlTls, DeadLetter, DeadLetterQuery, ScyllaConfig, ScyllaError, ScyllaStore,
    connect_session, connect_session_with, tls_context,
};
use hookline::storage::{
    AttemptOutcome, AttemptRow, DeliveryState, DeliveryStatus, DeliveryStore, EventQuery, EventRow,
    HistoryQuery, Page, StoreError,
};
use scylla::client::session::Session;
use scylla::value::{CqlTimestamp, CqlValue};

use crate::services::fixture::{cql_login, cql_store_config, require_cql_tls};

const CQL_ADDR: &str = "127.0.0.1:9042";

/// A session on the test server and the config of a keyspace of the test's own.
pub(crate) struct Cql {
    pub(crate) session: Arc<Session>,
    pub(crate) config: ScyllaConfig,
}

/// A session on the test server and a fresh keyspace name; fails (never skips) when the server
/// is not running.
pub(crate) async fn cql() -> Cql {
    let reachable = tokio::time::timeout(
        Duration::from_secs(3),
        tokio::net::TcpStream::connect(CQL_ADDR),
    )
    .await;
    if !matches!(reachable, Ok(Ok(_))) {
        panic!(
            "no CQL server on {CQL_ADDR} ({reachable:?}): start it with `tests/services up` \
             (these tests never skip)"
        );
    }
    let keyspace = format!(
        "hl_test_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let config = ScyllaConfig {
        // A busy 2-core machine running Cassandra and builds: be patient, schema changes are slow.
        write_timeout: Duration::from_secs(20),
        ..cql_store_config(CQL_ADDR, &keyspace)
    };
    let session = connect_session(&config).await.expect("connect to CQL");
    Cql {
        session: Arc::new(session),
        config,
    }
}

impl Cql {
    pub(crate) async fn migrate(&self) -> hookline::storage::scylla::migrate::MigrationReport {
        migrate(
            &self.session,
            &self.config.keyspace,
            &self.config.replication().unwrap(),
            MIGRATIONS,
        )
        .await
        .expect("migrate")
    }

    pub(crate) async fn store(&self) -> Arc<ScyllaStore> {
        Arc::new(
            ScyllaStore::with_session(self.session.clone(), &self.config)
                .await
                .expect("open store"),
        )
    }

    /// Runs `body`, then drops the keyspace whether `body` panicked or not.
    pub(crate) async fn run<F: std::future::Future<Output = ()>>(
        self,
        body: impl FnOnce(Arc<Cql>) -> F,
    ) {
        let this = Arc::new(self);
        let outcome = AssertUnwindSafe(body(this.clone())).catch_unwind().await;
        let drop = format!("DROP KEYSPACE IF EXISTS {}", this.config.keyspace);
        if let Err(e) = this.session.query_unpaged(drop, ()).await {
            eprintln!("could not drop {}: {e}", this.config.keyspace);
        }
        if let Err(panic) = outcome {
            std::panic::resume_unwind(panic);
        }
    }
}

/// The test node asks for a login (`tests/services` turns on PasswordAuthenticator): a wrong
/// password, or none, is refused at once as a setting to fix, never retried, and the error names
/// the keys, not the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_login_is_permanent_and_names_the_keys() {
    cql().await;
    let (user, _) = cql_login();
    let wrong = "pw-wrong-0f3a9c";
    let cases = [
        (
            "wrong password",
            ScyllaConfig {
                password: Some(CqlPassword::new(wrong)),
                ..cql_store_config(CQL_ADDR, "unused")
            },
        ),
        (
            "no login",
            ScyllaConfig {
                nodes: vec![CQL_ADDR.into()],
                ..ScyllaConfig::default()
            },
        ),
    ];
    for (case, config) in cases {
        let e = connect_session(&config)
            .await
            .err()
            .unwrap_or_else(|| panic!("{case}: the node took it"));
        assert!(
            matches!(e, ScyllaError::LoginRefused { .. }) && e.is_permanent(),
            "{case}: {e:?}"
        );
        let said = e.to_string();
        assert!(
            said.contains("refused hookline's login")
                && said.contains("store.scylla.username and store.scylla.password")
                && !said.contains(wrong),
            "{case}: {said}"
        );
    }
    assert!(
        connect_session(&cql_store_config(CQL_ADDR, "unused"))
            .await
            .is_ok(),
        "the right login as {user} is taken"
    );
}

/// Whether any client of the node talks TLS, from Cassandra's own list of its connections.
async fn a_client_uses_tls(session: &Session) -> bool {
    let rows = session
        .query_unpaged("SELECT ssl_enabled FROM system_views.clients", ())
        .await
        .expect("list the node's clients")
        .into_rows_result()
        .expect("rows");
    rows.rows::<(Option<bool>,)>()
        .expect("ssl_enabled is a boolean")
        .any(|r| r.expect("decode") == (Some(true),))
}

/// TLS to the node with the CA that signed its certificate and a client certificate it takes:
/// the session works and the node lists a TLS client. The same node is refused under Mozilla's
/// roots (the default), under a `server_name` its certificate does not carry, and without a
/// client certificate, so each check really runs; the name it does carry (`localhost`) is
/// taken. Unusable files are settings errors naming their key. `hookline migrate` reads the
/// same settings from the environment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_checks_the_nodes_certificate_and_shows_hookline_s_own() {
    let c = cql().await;
    let files = require_cql_tls();
    let tls = |ca: Option<&Path>, name: Option<&str>, cert: Option<(&Path, &Path)>| ScyllaConfig {
        tls: Some(CqlTls {
            ca_file: ca.map(Path::to_path_buf),
            server_name: name.map(str::to_owned),
            cert_file: cert.map(|(c, _)| c.to_path_buf()),
            key_file: cert.map(|(_, k)| k.to_path_buf()),
        }),
        ..c.config.clone()
    };
    let mine = Some((files.cert.as_path(), files.key.as_path()));
    let ca = Some(files.ca.as_path());
    for (case, config) in [
        ("the node's IP", tls(ca, None, mine)),
        ("server_name localhost", tls(ca, Some("localhost"), mine)),
    ] {
        let session = connect_session(&config)
            .await
            .unwrap_or_else(|e| panic!("{case}: {e}"));
        assert!(a_client_uses_tls(&session).await, "{case}: no TLS client");
    }
    for (case, config, why) in [
        ("Mozilla's roots", tls(None, None, mine), "UnknownIssuer"),
        (
            "another name",
            tls(ca, Some("scylla.example.internal"), mine),
            "not valid for name",
        ),
        // The node's CertificateRequired alert may come after the driver saw the connection
        // drop, so only the failure is certain; the first case differs from this one in the
        // client certificate alone and connects.
        (
            "no client certificate",
            tls(ca, None, None),
            "cannot connect",
        ),
    ] {
        let e = connect_session(&config)
            .await
            .err()
            .unwrap_or_else(|| panic!("{case}: the handshake went through"));
        assert!(e.to_string().contains(why), "{case}: {e}");
    }
    let other = Some((files.cert.as_path(), files.other_key.as_path()));
    let not_a_key = Some((files.cert.as_path(), files.ca.as_path()));
    for (case, config, said) in [
        (
            "no CA file",
            tls(Some(Path::new("/nonexistent/ca.pem")), None, mine),
            "store.scylla.tls.ca_file = \"/nonexistent/ca.pem\" cannot be read".to_owned(),
        ),
        (
            "another certificate's key",
            tls(ca, None, other),
            format!(
                "store.scylla.tls.key_file = {:?} cannot be used with tls.cert_file",
                files.other_key.display().to_string()
            ),
        ),
        (
            "a certificate for a key",
            tls(ca, None, not_a_key),
            format!(
                "store.scylla.tls.key_file = {:?} holds no usable private key",
                files.ca.display().to_string()
            ),
        ),
    ] {
        let e = connect_session(&config).await.expect_err(case);
        assert!(
            e.is_permanent() && e.to_string().starts_with(&said),
            "{case}: {e}"
        );
    }

    let ks = c.config.keyspace.clone();
    c.run(|_| async move {
        let (user, password) = cql_login();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_hookline"))
            .args(["migrate", "--nodes", CQL_ADDR, "--keyspace", &ks])
            .env("HOOKLINE_STORE__SCYLLA__USERNAME", &user)
            .env("HOOKLINE_STORE__SCYLLA__PASSWORD", &password)
            .env("HOOKLINE_STORE__SCYLLA__TLS__CA_FILE", &files.ca)
            .env("HOOKLINE_STORE__SCYLLA__TLS__SERVER_NAME", "localhost")
            .env("HOOKLINE_STORE__SCYLLA__TLS__CERT_FILE", &files.cert)
            .env("HOOKLINE_STORE__SCYLLA__TLS__KEY_FILE", &files.key)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("at schema version 8"),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    })
    .await;
}

/// Rotated TLS files are used by the next connection made with the same settings, as the
/// driver's reconnections are: a CA that no longer names the node's issuer is refused and the
/// right one taken again; a client certificate the node does not take is refused, and the node's
/// own one taken once it is back. A change that cannot be used (a key of another certificate)
/// keeps the files read before. Each file is replaced as a rotation does, by a rename.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_tls_files_are_used_by_the_next_connection() {
    let c = cql().await;
    let files = require_cql_tls();
    let dir = tempfile::tempdir().expect("scratch directory");
    let (ca, cert, key) = (
        dir.path().join("ca.pem"),
        dir.path().join("client.pem"),
        dir.path().join("client.key"),
    );
    let rotate = |to: &Path, from: &Path| {
        let next = to.with_extension("next");
        std::fs::copy(from, &next).expect("copy a TLS file");
        std::fs::rename(&next, to).expect("rename a TLS file");
    };
    rotate(&ca, &files.ca);
    rotate(&cert, &files.cert);
    rotate(&key, &files.key);
    let config = ScyllaConfig {
        tls: Some(CqlTls {
            ca_file: Some(ca.clone()),
            server_name: None,
            cert_file: Some(cert.clone()),
            key_file: Some(key.clone()),
        }),
        ..c.config.clone()
    };
    let context = tls_context(&config).expect("TLS settings");
    let connect = || connect_session_with(&config, context.clone());
    let connects = |case: &'static str| async move {
        let session = connect().await.unwrap_or_else(|e| panic!("{case}: {e}"));
        assert!(a_client_uses_tls(&session).await, "{case}: no TLS client");
    };
    let refused = |case: &'static str, why: &'static str| async move {
        let e = connect()
            .await
            .err()
            .unwrap_or_else(|| panic!("{case}: the handshake went through"));
        assert!(e.to_string().contains(why), "{case}: {e}");
    };
    connects("as first read").await;
    rotate(&ca, &files.stranger_cert);
    refused(
        "a CA file that no longer names the node's issuer",
        "UnknownIssuer",
    )
    .await;
    rotate(&ca, &files.ca);
    connects("the node's CA back").await;
    rotate(&cert, &files.stranger_cert);
    rotate(&key, &files.stranger_key);
    refused(
        "a client certificate the node does not take",
        "cannot connect",
    )
    .await;
    // The stranger's certificate with the node's key: unusable, so the stranger's pair stays.
    rotate(&key, &files.other_key);
    refused(
        "an unusable key keeps the stranger's pair",
        "cannot connect",
    )
    .await;
    rotate(&cert, &files.cert);
    rotate(&key, &files.key);
    connects("hookline's own certificate back").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_suite_passes_on_the_real_server() {
    cql()
        .await
        .run(|c| async move {
            c.migrate().await;
            let store = c.store().await;
            conformance::run(store.as_ref()).await;
            // The suite's ids are unique per run: running it again in the same keyspace is the
            // "existing data" case.
            conformance::run(store.as_ref()).await;
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_twice_is_a_no_op_and_a_newer_schema_is_refused() {
    cql()
        .await
        .run(|c| async move {
            let first = c.migrate().await;
            assert_eq!(
                first.applied,
                [
                    (1, "initial"),
                    (2, "history_buckets"),
                    (3, "replay_marks"),
                    (4, "replay_claims"),
                    (5, "attempt_records"),
                    (6, "replay_tenants"),
                    (7, "every_delivery"),
                    (8, "event_endpoints")
                ]
            );
            assert_eq!(first.version, 8);
            let second = c.migrate().await;
            assert!(second.applied.is_empty(), "second run applies nothing");
            assert_eq!(second.version, 8);
            let ks = &c.config.keyspace;
            let recorded = hookline::storage::scylla::migrate::applied_versions(&c.session, ks)
                .await
                .unwrap();
            assert_eq!(recorded.len(), 8);
            for (recorded, m) in recorded.iter().zip(MIGRATIONS) {
                assert_eq!(
                    recorded.checksum,
                    hookline::storage::scylla::migrate::checksum(m.cql)
                );
            }

            // A later release migrated this keyspace: this binary must not touch it.
            c.session
                .query_unpaged(
                    format!(
                        "INSERT INTO {ks}.schema_migrations (version, name, checksum) \
                         VALUES (999, 'from_the_future', 'x')"
                    ),
                    (),
                )
                .await
                .unwrap();
            let err = migrate(&c.session, ks, &c.config.replication().unwrap(), MIGRATIONS)
                .await
                .unwrap_err();
            assert!(
                matches!(
                    err,
                    MigrateError::NewerSchema {
                        database: 999,
                        binary: 8,
                        ..
                    }
                ),
                "{err}"
            );
            assert!(err.to_string().contains("newer than the newest"), "{err}");
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_refuses_an_unmigrated_keyspace() {
    cql()
        .await
        .run(|c| async move {
            let err = ScyllaStore::with_session(c.session.clone(), &c.config)
                .await
                .unwrap_err();
            assert!(matches!(
                err,
                ScyllaError::SchemaBehind {
                    found: 0,
                    needed: 8,
                    ..
                }
            ));
            assert!(err.to_string().contains("hookline migrate"), "{err}");
        })
        .await;
}

/// A keyspace a release with schema version 1 migrated: this binary refuses it until
/// `hookline migrate` adds versions 2 to 8, which leave version 1's tables in place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_1_keyspace_is_refused_until_upgraded() {
    cql()
        .await
        .run(|c| async move {
            let ks = &c.config.keyspace;
            let replication = c.config.replication().unwrap();
            let old = migrate(&c.session, ks, &replication, &MIGRATIONS[..1])
                .await
                .unwrap();
            assert_eq!(old.version, 1);
            let err = ScyllaStore::with_session(c.session.clone(), &c.config)
                .await
                .unwrap_err();
            assert!(
                matches!(
                    err,
                    ScyllaError::SchemaBehind {
                        found: 1,
                        needed: 8,
                        ..
                    }
                ),
                "{err}"
            );
            let upgrade = c.migrate().await;
            assert_eq!(
                upgrade.applied,
                [
                    (2, "history_buckets"),
                    (3, "replay_marks"),
                    (4, "replay_claims"),
                    (5, "attempt_records"),
                    (6, "replay_tenants"),
                    (7, "every_delivery"),
                    (8, "event_endpoints")
                ]
            );
            assert_eq!(upgrade.version, 8);
            c.store().await;
            // Version 1's tables stay (their rows expire with their TTL).
            for table in [
                "deliveries_by_endpoint",
                "endpoint_days",
                "endpoint_buckets",
            ] {
                let found = c
                    .session
                    .query_unpaged(
                        "SELECT table_name FROM system_schema.tables \
                         WHERE keyspace_name = ? AND table_name = ?",
                        (ks.as_str(), table),
                    )
                    .await
                    .unwrap()
                    .into_rows_result()
                    .unwrap()
                    .rows_num();
                assert_eq!(found, 1, "{table}");
            }
        })
        .await;
}

/// A run stopped after version 5 added its first column (and one of version 7's), before it
/// recorded the version: the next run adds only what is missing (`ALTER TABLE ... ADD` has no
/// `IF NOT EXISTS` in ScyllaDB) and records the versions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_column_add_is_finished_by_the_next_run() {
    cql()
        .await
        .run(|c| async move {
            let ks = &c.config.keyspace;
            let replication = c.config.replication().unwrap();
            let before = migrate(&c.session, ks, &replication, &MIGRATIONS[..4])
                .await
                .unwrap();
            assert_eq!(before.version, 4);
            for added in ["record_partition int", "note text"] {
                c.session
                    .query_unpaged(
                        format!("ALTER TABLE {ks}.attempts_by_delivery ADD {added}"),
                        (),
                    )
                    .await
                    .unwrap();
            }
            let after = c.migrate().await;
            assert_eq!(
                after.applied,
                [
                    (5, "attempt_records"),
                    (6, "replay_tenants"),
                    (7, "every_delivery"),
                    (8, "event_endpoints")
                ]
            );
            assert_eq!(after.version, 8);
            for column in [
                "record_partition",
                "record_offset",
                "note",
                "park_reason",
                "request_headers",
            ] {
                let found = c
                    .session
                    .query_unpaged(
                        "SELECT column_name FROM system_schema.columns \
                         WHERE keyspace_name = ? AND table_name = ? AND column_name = ?",
                        (ks.as_str(), "attempts_by_delivery", column),
                    )
                    .await
                    .unwrap()
                    .into_rows_result()
                    .unwrap()
                    .rows_num();
                assert_eq!(found, 1, "{column}");
            }
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_migrate_command_applies_once() {
    let c = cql().await;
    let ks = c.config.keyspace.clone();
    c.run(|_| async move {
        let (user, password) = cql_login();
        let run = || {
            std::process::Command::new(env!("CARGO_BIN_EXE_hookline"))
                .args(["migrate", "--nodes", CQL_ADDR, "--keyspace", &ks])
                .env("HOOKLINE_STORE__SCYLLA__USERNAME", &user)
                .env("HOOKLINE_STORE__SCYLLA__PASSWORD", &password)
                .output()
                .unwrap()
        };
        let first = run();
        let stdout = String::from_utf8_lossy(&first.stdout);
        assert!(
            first.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&first.stderr)
        );
        assert!(stdout.contains("applied 001_initial"), "{stdout}");
        assert!(stdout.contains("applied 002_history_buckets"), "{stdout}");
        assert!(stdout.contains("applied 003_replay_marks"), "{stdout}");
        assert!(stdout.contains("applied 004_replay_claims"), "{stdout}");
        assert!(stdout.contains("applied 005_attempt_records"), "{stdout}");
        assert!(stdout.contains("applied 006_replay_tenants"), "{stdout}");
        assert!(stdout.contains("applied 007_every_delivery"), "{stdout}");
        assert!(stdout.contains("applied 008_event_endpoints"), "{stdout}");
        let second = run();
        let stdout = String::from_utf8_lossy(&second.stdout);
        assert!(second.status.success());
        assert!(stdout.contains("nothing to apply"), "{stdout}");
        assert!(stdout.contains("at schema version 8"), "{stdout}");
    })
    .await;
}

/// `t` in CQL's milliseconds.
fn row_ms(t: SystemTime) -> i64 {
    i64::try_from(
        t.duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

/// The minute bucket of `t`, in milliseconds.
fn row_bucket(t: SystemTime) -> i64 {
    let ms = row_ms(t);
    ms - ms.rem_euclid(60_000)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempt_rows_carry_the_configured_ttl() {
    let mut c = cql().await;
    c.config.attempt_ttl = Duration::from_secs(3600);
    c.run(|c| async move {
        c.migrate().await;
        let store = c.store().await;
        let row = attempt_row(
            &format!("evt_{}", uuid::Uuid::new_v4().simple()),
            "ep_ttl",
            1,
        );
        store.record_attempt(&row).await.unwrap();
        let event = EventRow {
            tenant: row.tenant.clone(),
            event_id: row.event_id.clone(),
            event_type: row.event_type.clone(),
            occurred_at: row.started_at,
            received_at: row.started_at,
            body: bytes::Bytes::from_static(b"{}"),
            fingerprint: "f".into(),
            endpoints: vec![row.endpoint_id.clone()],
        };
        store.record_event(&event).await.unwrap();
        let ks = &c.config.keyspace;
        let bucket = CqlTimestamp(row_bucket(row.started_at));
        let queries: [(&str, String, Vec<CqlValue>); 3] = [
            (
                "attempt row",
                format!(
                    "SELECT TTL(outcome) FROM {ks}.attempts_by_delivery \
                     WHERE delivery_id = ? AND started_at = ? AND attempt = 1"
                ),
                vec![
                    CqlValue::Text(row.delivery_id.to_string()),
                    CqlValue::Timestamp(CqlTimestamp(row_ms(row.started_at))),
                ],
            ),
            (
                "event row",
                format!(
                    "SELECT TTL(body) FROM {ks}.events \
                     WHERE event_key = ? AND event_id = ? AND tenant = ? AND endpoint_id = ''"
                ),
                vec![
                    CqlValue::BigInt(row.event_id.key()),
                    CqlValue::Text(row.event_id.to_string()),
                    CqlValue::Text(row.tenant.to_string()),
                ],
            ),
            (
                "tenant's events index",
                format!(
                    "SELECT TTL(event_type) FROM {ks}.events_by_tenant_bucket \
                     WHERE tenant = ? AND bucket = ? AND event_id = ? ALLOW FILTERING"
                ),
                vec![
                    CqlValue::Text(row.tenant.to_string()),
                    CqlValue::Timestamp(bucket),
                    CqlValue::Text(row.event_id.to_string()),
                ],
            ),
        ];
        for (what, cql, key) in queries {
            let (ttl,): (Option<i32>,) = c
                .session
                .query_unpaged(cql, key)
                .await
                .unwrap()
                .into_rows_result()
                .unwrap()
                .single_row()
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let ttl = ttl.unwrap_or_else(|| panic!("{what} has no TTL"));
            assert!((3000..=3600).contains(&ttl), "{what} TTL {ttl}");
        }
    })
    .await;
}

/// A delivery the fan-out recorded has one history entry, written with its event: its
/// attempts and notes add none. A delivery fanned out before version 7 (no recorded event) gets
/// one per attempt, and history lists it at its first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_delivery_has_one_history_entry() {
    cql()
        .await
        .run(|c| async move {
            c.migrate().await;
            let store = c.store().await;
            let run = uuid::Uuid::new_v4().simple().to_string();
            let endpoint = format!("ep_{run}");
            let ep = EndpointId::parse(&endpoint).unwrap();
            // The start of a minute: the retries below fall in the next one.
            let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
            let recorded = format!("evt_rec_{run}");
            let mut first = attempt_row(&recorded, &endpoint, 1);
            store
                .record_event(&EventRow {
                    tenant: first.tenant.clone(),
                    event_id: first.event_id.clone(),
                    event_type: first.event_type.clone(),
                    occurred_at: t0,
                    received_at: t0,
                    body: bytes::Bytes::from_static(b"{}"),
                    fingerprint: "f".into(),
                    endpoints: vec![ep.clone()],
                })
                .await
                .unwrap();
            let mut legacy_first = legacy_attempt_row(&format!("evt_old_{run}"), &endpoint, 1);
            let mut rows = vec![];
            for (row, at) in [(&mut first, 1), (&mut legacy_first, 2)] {
                row.started_at = t0 + Duration::from_secs(at);
                row.status = Some(503);
                row.outcome = AttemptOutcome::RetryScheduled {
                    next_attempt_at: row.started_at + Duration::from_secs(60),
                };
                let mut retry = row.clone();
                retry.attempt = 2;
                retry.started_at += Duration::from_secs(61);
                retry.status = Some(200);
                retry.outcome = AttemptOutcome::Succeeded;
                rows.extend([row.clone(), retry]);
            }
            for row in &rows {
                store.record_attempt(row).await.unwrap();
            }
            let ks = &c.config.keyspace;
            let mut entries = 0;
            for bucket in [t0, t0 + Duration::from_secs(60)] {
                entries += c
                    .session
                    .query_unpaged(
                        format!(
                            "SELECT delivery_id FROM {ks}.deliveries_by_endpoint_bucket \
                             WHERE endpoint_id = ? AND bucket = ?"
                        ),
                        (endpoint.as_str(), CqlTimestamp(row_bucket(bucket))),
                    )
                    .await
                    .unwrap()
                    .into_rows_result()
                    .unwrap()
                    .rows_num();
            }
            assert_eq!(
                entries, 3,
                "one entry for the recorded delivery, one per attempt for the older one"
            );
            let page = store
                .endpoint_deliveries(
                    &ep,
                    &HistoryQuery {
                        limit: 10,
                        ..Default::default()
                    },
                )
                .await
                .unwrap();
            let listed: Vec<_> = page
                .items
                .iter()
                .map(|s| (s.delivery_id.clone(), s.created_at, s.attempts))
                .collect();
            assert_eq!(
                listed,
                [
                    (legacy_first.delivery_id.clone(), legacy_first.started_at, 2),
                    (first.delivery_id.clone(), t0, 2),
                ],
                "each listed once, newest first, at its creation or first attempt"
            );
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_and_full_bodies_round_trip() {
    cql()
        .await
        .run(|c| async move {
            c.migrate().await;
            let store = c.store().await;
            let event = format!("evt_{}", uuid::Uuid::new_v4().simple());
            let t0 = SystemTime::UNIX_EPOCH + Duration::from_millis(1_790_000_000_456);
            let mut timeout = attempt_row(&event, "ep_rt", 1);
            timeout.started_at = t0;
            timeout.status = None;
            timeout.error_class = Some(ErrorClass::Timeout);
            timeout.response_body = vec![];
            timeout.signing_key_ids = vec![];
            timeout.latency_ms = u32::MAX;
            timeout.outcome = AttemptOutcome::RetryScheduled {
                next_attempt_at: t0 + Duration::from_secs(5),
            };
            let mut full = attempt_row(&event, "ep_rt", 2);
            full.started_at = t0 + Duration::from_secs(6);
            // Every byte value, zeros included: the body is a blob, not text.
            full.response_body = (0..4096u32).map(|i| (i % 256) as u8).collect();
            full.replay_id = Some("rpl_x".into());
            store.record_attempt(&timeout).await.unwrap();
            store.record_attempt(&full).await.unwrap();
            // Logging the same attempt again (a retried write) changes nothing.
            store.record_attempt(&full).await.unwrap();
            let rows = store.attempts(&timeout.delivery_id).await.unwrap();
            assert_eq!(rows, [timeout.clone(), full.clone()]);
            let state = store.delivery(&timeout.delivery_id).await.unwrap().unwrap();
            assert_eq!(
                state.attempts, 2,
                "a duplicate write is not a second attempt"
            );
            assert_eq!(state.first_attempt_at, Some(t0));
            // A duplicate of the older attempt logged late does not overwrite the newer status.
            store.record_attempt(&timeout).await.unwrap();
            let state = store.delivery(&timeout.delivery_id).await.unwrap().unwrap();
            assert_eq!(state.status, hookline::storage::DeliveryStatus::Succeeded);
            assert_eq!(state.last_status, Some(200));
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_paging_is_stable_while_other_tasks_insert() {
    cql()
        .await
        .run(|c| async move {
            c.migrate().await;
            let store = c.store().await;
            let endpoint = format!("ep_{}", uuid::Uuid::new_v4().simple());
            // An hour apart: every delivery in a bucket of its own, over three days.
            let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_790_000_000);
            let mut rows = vec![];
            for i in 0..60u64 {
                let mut row = legacy_attempt_row(&format!("evt_h{i}_{endpoint}"), &endpoint, 1);
                row.started_at = t0 + Duration::from_secs(i * 3_600);
                row.outcome = AttemptOutcome::RetryScheduled {
                    next_attempt_at: row.started_at + Duration::from_secs(60),
                };
                rows.push(row);
            }
            futures::future::try_join_all(rows.iter().map(|r| store.record_attempt(r)))
                .await
                .unwrap();
            let expected: Vec<_> = rows.iter().rev().map(|r| r.event_id.clone()).collect();

            // While we page: brand-new deliveries (newer than everything) and retries of the
            // deliveries being listed (new entries at later times) keep arriving.
            let writer = {
                let store = store.clone();
                let endpoint = endpoint.clone();
                let rows = rows.clone();
                tokio::spawn(async move {
                    for i in 0..40u64 {
                        let mut fresh =
                            legacy_attempt_row(&format!("evt_new{i}_{endpoint}"), &endpoint, 1);
                        fresh.started_at = t0 + Duration::from_secs(400_000 + i);
                        let mut retry = rows[(i as usize * 7) % rows.len()].clone();
                        retry.attempt = 2;
                        retry.started_at += Duration::from_secs(120);
                        retry.outcome = AttemptOutcome::Succeeded;
                        tokio::try_join!(
                            store.record_attempt(&fresh),
                            store.record_attempt(&retry)
                        )
                        .unwrap();
                    }
                })
            };
            let ep = EndpointId::parse(&endpoint).unwrap();
            let mut seen = vec![];
            let mut cursor = None;
            let mut pages = 0;
            loop {
                let page = store
                    .endpoint_deliveries(
                        &ep,
                        &HistoryQuery {
                            limit: 7,
                            cursor: cursor.clone(),
                            since: Some(t0),
                            ..Default::default()
                        },
                    )
                    .await
                    .unwrap();
                pages += 1;
                // Deliveries newer than the first page may show up on it; after that, nothing new
                // may appear and nothing may repeat or go missing.
                seen.extend(
                    page.items
                        .iter()
                        .map(|s| s.event_id.clone())
                        .filter(|e| !e.as_str().starts_with("evt_new")),
                );
                cursor = page.next_cursor;
                if cursor.is_none() {
                    break;
                }
                assert!(pages < 100, "paging terminates");
            }
            writer.await.unwrap();
            assert_eq!(seen, expected, "every original delivery once, newest first");
        })
        .await;
}

/// Ten endpoints, each event fanned out to all of them, every attempt logged at once, then
/// every event recorded at once: the rows of one (endpoint, minute) and of one (tenant, minute)
/// go in shared batches. Every call that returns `Ok` has its history entries and event index
/// rows readable, and callers that go away while their rows wait or are in flight cost no
/// other caller a row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn index_rows_logged_together_are_durable_and_outlive_dropped_callers() {
    cql()
        .await
        .run(|c| async move {
            c.migrate().await;
            let store = c.store().await;
            let run = &uuid::Uuid::new_v4().simple().to_string()[..8];
            let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_790_000_000);
            let endpoints: Vec<String> = (0..10).map(|i| format!("ep_g{i}_{run}")).collect();
            let mut rows = vec![];
            for e in 0..40u64 {
                for (i, endpoint) in endpoints.iter().enumerate() {
                    let mut row = legacy_attempt_row(&format!("evt_g{e}_{run}"), endpoint, 1);
                    row.started_at = t0 + Duration::from_millis(e * 10 + i as u64);
                    rows.push(row);
                }
            }
            let calls: Vec<_> = rows
                .iter()
                .cloned()
                .map(|row| {
                    let store = store.clone();
                    tokio::spawn(async move { store.record_attempt(&row).await })
                })
                .collect();
            tokio::time::sleep(Duration::from_millis(2)).await;
            // Every third caller goes away, wherever its rows are.
            let mut kept = vec![];
            for (i, (call, row)) in calls.into_iter().zip(&rows).enumerate() {
                if i % 3 == 0 {
                    call.abort();
                } else {
                    kept.push((call, row));
                }
            }
            for (call, row) in &mut kept {
                call.await
                    .unwrap()
                    .unwrap_or_else(|e| panic!("{}: {e}", row.delivery_id));
            }
            for endpoint in &endpoints {
                let ep = EndpointId::parse(endpoint).unwrap();
                let page = store
                    .endpoint_deliveries(
                        &ep,
                        &HistoryQuery {
                            limit: 500,
                            since: Some(t0),
                            ..Default::default()
                        },
                    )
                    .await
                    .unwrap();
                let listed: Vec<_> = page.items.iter().map(|s| &s.delivery_id).collect();
                for (_, row) in kept.iter().filter(|(_, r)| r.endpoint_id == ep) {
                    assert!(
                        listed.contains(&&row.delivery_id),
                        "{} missing from {endpoint}'s history",
                        row.delivery_id
                    );
                }
            }
            // The events recorded all at once, a third of their callers going away: every
            // event whose call returned `Ok` lists all its deliveries and is in its tenant's
            // events.
            let tenant = hookline::id::Tenant::parse(format!("tnt_{run}")).unwrap();
            let events: Vec<EventRow> = rows
                .iter()
                .step_by(endpoints.len())
                .map(|r| EventRow {
                    tenant: tenant.clone(),
                    event_id: r.event_id.clone(),
                    event_type: r.event_type.clone(),
                    occurred_at: r.started_at,
                    received_at: r.started_at,
                    body: bytes::Bytes::from_static(b"{}"),
                    fingerprint: "f".into(),
                    endpoints: endpoints
                        .iter()
                        .map(|e| EndpointId::parse(e).unwrap())
                        .collect(),
                })
                .collect();
            let calls: Vec<_> = events
                .iter()
                .cloned()
                .map(|event| {
                    let store = store.clone();
                    tokio::spawn(async move { store.record_event(&event).await })
                })
                .collect();
            tokio::time::sleep(Duration::from_millis(2)).await;
            let mut recorded = vec![];
            for (i, (call, event)) in calls.into_iter().zip(&events).enumerate() {
                if i % 3 == 0 {
                    call.abort();
                } else {
                    recorded.push((call, event));
                }
            }
            for (call, event) in &mut recorded {
                call.await
                    .unwrap()
                    .unwrap_or_else(|e| panic!("{}: {e}", event.event_id));
            }
            let listed_events = every_page(500, |cursor| {
                let (store, tenant) = (store.clone(), tenant.clone());
                async move {
                    let query = EventQuery {
                        limit: 500,
                        cursor,
                        ..Default::default()
                    };
                    store.events(&tenant, &query).await.unwrap()
                }
            })
            .await;
            for (_, event) in &recorded {
                let listed = store.event_deliveries(&event.event_id).await.unwrap();
                assert_eq!(
                    listed.len(),
                    endpoints.len(),
                    "{}'s deliveries",
                    event.event_id
                );
                assert!(
                    listed_events.iter().any(|e| e.event_id == event.event_id),
                    "{} missing from its tenant's events",
                    event.event_id
                );
            }
        })
        .await;
}

/// Every item of a listing, newest first, following its cursors from the first page of at most
/// `limit` items: only the last page may be short, and paging ends.
async fn every_page<T, F, Fut>(limit: u32, mut page: F) -> Vec<T>
where
    F: FnMut(Option<String>) -> Fut,
    Fut: std::future::Future<Output = Page<T>>,
{
    let mut items = vec![];
    let mut cursor = None;
    for _ in 0..200 {
        let page = page(cursor).await;
        assert!(page.items.len() <= limit as usize);
        if page.next_cursor.is_some() {
            assert_eq!(
                page.items.len(),
                limit as usize,
                "only the last page is short"
            );
        }
        items.extend(page.items);
        cursor = page.next_cursor;
        if cursor.is_none() {
            return items;
        }
    }
    panic!("paging does not terminate");
}

/// `row` made an attempt that dead-lettered on HTTP `status`.
fn dead_lettered(mut row: AttemptRow, status: u16, reason: DeadReason) -> AttemptRow {
    row.status = Some(status);
    row.error_class = Some(ErrorClass::HttpStatus);
    row.outcome = AttemptOutcome::Dead { reason };
    row
}

/// Deliveries spread over many one-minute buckets (a dense one, sparse ones, empty minutes in
/// between, ties within a millisecond, retries logged in later buckets): paging with a small
/// limit lists each delivery once, at its first attempt, newest first, with no gap, and
/// `since`, `status` and a schema-1 cursor behave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_pages_cross_buckets_in_order() {
    cql()
        .await
        .run(|c| async move {
            c.migrate().await;
            let store = c.store().await;
            let endpoint = format!("ep_{}", uuid::Uuid::new_v4().simple());
            let ep = EndpointId::parse(&endpoint).unwrap();
            // The start of a minute (1_800_000_000 s is one).
            let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
            let minute = Duration::from_secs(60);
            let mut starts = vec![];
            // Minute 0: dense, more entries than several requests' worth (a page of 3 reads 8
            // entries per request), two in each millisecond.
            let dense: usize = 30;
            for i in 0..dense as u64 {
                starts.push(t0 + Duration::from_millis(i / 2 * 997));
            }
            // Minutes 1..=12: a few each, on both edges of the minute.
            for m in 1..=12u32 {
                starts.push(t0 + minute * m);
                starts.push(t0 + minute * m + Duration::from_millis(25_000));
                starts.push(t0 + minute * (m + 1) - Duration::from_millis(1));
            }
            // Then single entries with empty minutes between them.
            for k in 0..6u32 {
                starts.push(t0 + minute * (20 + 7 * k) + Duration::from_secs(30));
            }
            let mut rows = vec![];
            for (i, started_at) in starts.iter().enumerate() {
                let mut row = legacy_attempt_row(&format!("evt_b{i}_{endpoint}"), &endpoint, 1);
                row.started_at = *started_at;
                if i % 4 == 0 {
                    row = dead_lettered(row, 404, DeadReason::HttpStatus);
                } else {
                    row.status = Some(503);
                    row.error_class = Some(ErrorClass::HttpStatus);
                    row.outcome = AttemptOutcome::RetryScheduled {
                        next_attempt_at: *started_at + minute,
                    };
                }
                rows.push(row);
            }
            // Retries, not listed a second time: of every delivery of the dense minute, within
            // it (so a page of it skips many entries and needs several requests), and of some
            // others, in later buckets.
            let retries: Vec<_> = rows
                .iter()
                .enumerate()
                .filter(|(i, r)| {
                    !matches!(r.outcome, AttemptOutcome::Dead { .. }) && (*i < dense || i % 5 == 0)
                })
                .map(|(i, r)| {
                    let mut retry = r.clone();
                    retry.attempt = 2;
                    retry.started_at = if i < dense {
                        r.started_at + Duration::from_secs(20)
                    } else {
                        r.started_at + minute * 3 + Duration::from_millis(7)
                    };
                    retry.status = Some(200);
                    retry.error_class = None;
                    retry.outcome = AttemptOutcome::Succeeded;
                    retry
                })
                .collect();
            futures::future::try_join_all(
                rows.iter().chain(&retries).map(|r| store.record_attempt(r)),
            )
            .await
            .unwrap();

            // Newest first; ties in a millisecond by delivery id, as CQL orders them.
            let mut by_time: Vec<_> = rows.iter().collect();
            by_time.sort_by(|a, b| {
                (b.started_at, b.delivery_id.as_str()).cmp(&(a.started_at, a.delivery_id.as_str()))
            });
            let expected = |keep: &dyn Fn(&&AttemptRow) -> bool| -> Vec<_> {
                by_time
                    .iter()
                    .filter(|r| keep(r))
                    .map(|r| r.delivery_id.clone())
                    .collect()
            };
            let page_through = |query: HistoryQuery| {
                let (store, ep) = (&store, &ep);
                every_page(query.limit, move |cursor| {
                    let query = HistoryQuery {
                        cursor,
                        ..query.clone()
                    };
                    async move { store.endpoint_deliveries(ep, &query).await.unwrap() }
                })
            };
            let ids = |states: Vec<DeliveryState>| -> Vec<_> {
                states.into_iter().map(|s| s.delivery_id).collect()
            };

            let all = page_through(HistoryQuery {
                limit: 3,
                ..Default::default()
            })
            .await;
            assert_eq!(
                ids(all),
                expected(&|_| true),
                "every delivery once, newest first"
            );

            // `since` in the middle of minute 5: its bucket is cut, older ones are not read.
            let since = t0 + minute * 5 + Duration::from_millis(25_000);
            let recent = page_through(HistoryQuery {
                limit: 4,
                since: Some(since),
                ..Default::default()
            })
            .await;
            assert_eq!(ids(recent), expected(&|r| r.started_at >= since), "since");

            let dead = page_through(HistoryQuery {
                limit: 2,
                status: Some(DeliveryStatus::Dead),
                ..Default::default()
            })
            .await;
            assert_eq!(
                ids(dead),
                expected(&|r| matches!(r.outcome, AttemptOutcome::Dead { .. })),
                "status filter"
            );

            // A cursor of schema version 1 (day.at_ms.delivery_id) is refused, not misread.
            let old = format!("20833.1800000000000.{}", rows[0].delivery_id);
            let err = store
                .endpoint_deliveries(
                    &ep,
                    &HistoryQuery {
                        limit: 3,
                        cursor: Some(old),
                        ..Default::default()
                    },
                )
                .await
                .unwrap_err();
            assert!(matches!(err, StoreError::BadCursor), "{err}");
        })
        .await;
}

/// Dead letters over several buckets page newest first, completely, from a cursor; `since`
/// bounds them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_page_across_buckets() {
    cql()
        .await
        .run(|c| async move {
            c.migrate().await;
            let store = c.store().await;
            let endpoint = format!("ep_{}", uuid::Uuid::new_v4().simple());
            let ep = EndpointId::parse(&endpoint).unwrap();
            let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
            let mut rows = vec![];
            for i in 0..17u64 {
                let mut row = attempt_row(&format!("evt_d{i}_{endpoint}"), &endpoint, 3);
                // 17 s apart: one to four in a minute, over five minutes.
                row.started_at = t0 + Duration::from_secs(i * 17);
                rows.push(dead_lettered(row, 410, DeadReason::Gone));
            }
            // Attempts that did not dead-letter are not dead letters.
            let mut alive = attempt_row(&format!("evt_ok_{endpoint}"), &endpoint, 1);
            alive.started_at = t0 + Duration::from_secs(30);
            futures::future::try_join_all(
                rows.iter().chain([&alive]).map(|r| store.record_attempt(r)),
            )
            .await
            .unwrap();

            let list = |since: Option<SystemTime>| {
                let (store, ep) = (&store, &ep);
                every_page(4, move |cursor| {
                    let query = DeadLetterQuery {
                        limit: 4,
                        cursor,
                        since,
                    };
                    async move { store.dead_letters(ep, &query).await.unwrap() }
                })
            };
            let ids = |letters: &[DeadLetter]| -> Vec<_> {
                letters.iter().map(|d| d.delivery_id.clone()).collect()
            };
            let newest_first = |since: SystemTime| -> Vec<_> {
                rows.iter()
                    .rev()
                    .filter(|r| r.started_at >= since)
                    .map(|r| r.delivery_id.clone())
                    .collect()
            };
            let all = list(None).await;
            assert_eq!(ids(&all), newest_first(t0));
            let newest = &all[0];
            let row = rows.last().unwrap();
            assert_eq!(newest.dead_at, row.started_at);
            assert_eq!(newest.event_id, row.event_id);
            assert_eq!(newest.attempt, 3);
            assert_eq!(newest.reason, DeadReason::Gone);
            assert_eq!(newest.last_status, Some(410));

            let since = t0 + Duration::from_secs(100);
            assert_eq!(ids(&list(Some(since)).await), newest_first(since));
            let bad = DeadLetterQuery {
                limit: 4,
                cursor: Some("not a cursor".into()),
                ..Default::default()
            };
            assert!(matches!(
                store.dead_letters(&ep, &bad).await,
                Err(StoreError::BadCursor)
            ));
        })
        .await;
}
