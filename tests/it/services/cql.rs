//! The CQL store through the scylla driver hookline uses: schema changes, writes with a TTL (the
//! attempt log's retention) and reading them back.

use std::time::Duration;

use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;

use super::fixture::{cql_login, require_cql, unique};

async fn session(node: &str) -> Session {
    let (user, password) = cql_login();
    SessionBuilder::new()
        .known_node(node)
        .user(user, password)
        .connection_timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap_or_else(|e| panic!("CQL session to {node}: {e}: run `tests/services up`"))
}

#[tokio::test]
async fn write_with_ttl_and_read_back() {
    let node = require_cql().await;
    let session = session(&node).await;
    let keyspace = unique("it_cql");

    session
        .query_unpaged(
            format!(
                "CREATE KEYSPACE {keyspace} WITH replication = \
                 {{'class': 'SimpleStrategy', 'replication_factor': 1}}"
            ),
            &[],
        )
        .await
        .expect("create keyspace");
    session
        .query_unpaged(
            format!("CREATE TABLE {keyspace}.attempts (delivery_id text, attempt int, status int, PRIMARY KEY (delivery_id, attempt))"),
            &[],
        )
        .await
        .expect("create table");

    let insert = session
        .prepare(format!(
            "INSERT INTO {keyspace}.attempts (delivery_id, attempt, status) VALUES (?, ?, ?) USING TTL 600"
        ))
        .await
        .expect("prepare insert");
    session
        .execute_unpaged(&insert, ("dlv_1", 1_i32, 503_i32))
        .await
        .expect("insert");
    session
        .execute_unpaged(&insert, ("dlv_1", 2_i32, 200_i32))
        .await
        .expect("insert");

    let select = session
        .prepare(format!(
            "SELECT attempt, status, TTL(status) FROM {keyspace}.attempts WHERE delivery_id = ?"
        ))
        .await
        .expect("prepare select");
    let rows = session
        .execute_unpaged(&select, ("dlv_1",))
        .await
        .expect("select")
        .into_rows_result()
        .expect("rows");
    let rows: Vec<(i32, i32, Option<i32>)> = rows
        .rows::<(i32, i32, Option<i32>)>()
        .expect("row types")
        .collect::<Result<_, _>>()
        .expect("rows decode");

    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!((rows[0].0, rows[0].1), (1, 503));
    assert_eq!((rows[1].0, rows[1].1), (2, 200));
    for (_, _, ttl) in &rows {
        let ttl = ttl.expect("TTL(status) is set");
        assert!(ttl > 0 && ttl <= 600, "TTL(status) = {ttl}");
    }

    session
        .query_unpaged(format!("DROP KEYSPACE {keyspace}"), &[])
        .await
        .expect("drop keyspace");
}
