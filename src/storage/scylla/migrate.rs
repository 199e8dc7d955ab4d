//! `hookline migrate`: creates the keyspace and applies the CQL migrations in `schemas/cql/`
//! that it does not have yet, in order, recording each in `schema_migrations`.
//!
//! Idempotent: every statement in the files is `IF NOT EXISTS`, or an `ALTER TABLE ... ADD`
//! that runs only while the column is missing, and a version is recorded only
//! after all its statements ran, so an interrupted run is finished by the next one. Refuses to
//! touch a keyspace that has a version newer than this binary knows (an older binary must not
//! "repair" a newer schema), and one whose applied file no longer matches the embedded text
//! (someone edited a released migration: add a new file instead).
//!
//! Run one migrator at a time: concurrent schema changes from several clients can leave a
//! Cassandra cluster in schema disagreement.

use std::time::{Duration, SystemTime};

use futures::StreamExt;
use scylla::DeserializeRow;
use scylla::client::session::Session;
use scylla::statement::unprepared::Statement;
use scylla::value::CqlTimestamp;
use sha2::{Digest, Sha256};

use super::config::{Replication, valid_keyspace};

/// One versioned schema file, embedded in the binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Migration {
    /// The `NNN` of `schemas/cql/NNN_name.cql`.
    pub version: u32,
    /// The `name` of `schemas/cql/NNN_name.cql`.
    pub name: &'static str,
    /// The file's text.
    pub cql: &'static str,
}

/// Every migration this binary knows, oldest first. Append; never edit a released one.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "initial",
        cql: include_str!("../../../schemas/cql/001_initial.cql"),
    },
    Migration {
        version: 2,
        name: "history_buckets",
        cql: include_str!("../../../schemas/cql/002_history_buckets.cql"),
    },
    Migration {
        version: 3,
        name: "replay_marks",
        cql: include_str!("../../../schemas/cql/003_replay_marks.cql"),
    },
    Migration {
        version: 4,
        name: "replay_claims",
        cql: include_str!("../../../schemas/cql/004_replay_claims.cql"),
    },
    Migration {
        version: 5,
        name: "attempt_records",
        cql: include_str!("../../../schemas/cql/005_attempt_records.cql"),
    },
    Migration {
        version: 6,
        name: "replay_tenants",
        cql: include_str!("../../../schemas/cql/006_replay_tenants.cql"),
    },
    Migration {
        version: 7,
        name: "every_delivery",
        cql: include_str!("../../../schemas/cql/007_every_delivery.cql"),
    },
    Migration {
        version: 8,
        name: "event_endpoints",
        cql: include_str!("../../../schemas/cql/008_event_endpoints.cql"),
    },
];

/// The newest schema version this binary knows (and needs).
pub const LATEST_VERSION: u32 = 8;

/// A version recorded in `schema_migrations`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppliedVersion {
    /// The version number.
    pub version: u32,
    /// The file's name part.
    pub name: String,
    /// SHA-256 of the file's text when it was applied, hex.
    pub checksum: String,
}

/// What a migration run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationReport {
    /// The keyspace.
    pub keyspace: String,
    /// Versions applied by this run, oldest first (empty: nothing to do).
    pub applied: Vec<(u32, &'static str)>,
    /// The keyspace's version after the run.
    pub version: u32,
}

/// Why a migration run stopped.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// The keyspace name is not one hookline accepts.
    #[error("invalid keyspace name {0:?}: use 1 to 48 lowercase letters, digits or _")]
    BadKeyspace(String),
    /// The database is ahead of this binary.
    #[error(
        "keyspace {keyspace:?} has schema version {database} ({name}), newer than the newest \
         this hookline knows ({binary}); refusing to migrate: run `hookline migrate` from a \
         release that ships version {database} or later"
    )]
    NewerSchema {
        /// The keyspace.
        keyspace: String,
        /// The newest version recorded in the database.
        database: u32,
        /// Its recorded name.
        name: String,
        /// The newest version this binary knows.
        binary: u32,
    },
    /// An applied version's file was changed after it was applied.
    #[error(
        "schema version {version} ({name}) was applied with checksum {applied} but this \
         hookline's file has {embedded}: released migrations must not be edited; add a new \
         version instead"
    )]
    ChecksumMismatch {
        /// The version.
        version: u32,
        /// Its name.
        name: &'static str,
        /// Checksum recorded in the database.
        applied: String,
        /// Checksum of the embedded file.
        embedded: String,
    },
    /// A CQL statement failed.
    #[error("CQL failed during migration (version {version}): {detail}\n  statement: {statement}")]
    Cql {
        /// The version being applied (0: keyspace and bookkeeping).
        version: u32,
        /// The statement, first line.
        statement: String,
        /// The driver's message.
        detail: String,
    },
}

/// SHA-256 of a migration's text, lowercase hex.
pub fn checksum(cql: &str) -> String {
    Sha256::digest(cql.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Splits a CQL file into statements: `;` ends a statement unless it is inside a quoted string,
/// and `--` / `//` start a comment that runs to the end of the line. Empty statements are
/// dropped.
pub fn split_statements(cql: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut chars = cql.chars().peekable();
    let mut quote: Option<char> = None;
    while let Some(c) = chars.next() {
        if let Some(q) = quote {
            current.push(c);
            if c == q {
                // A doubled quote is an escaped quote, still inside the string.
                if chars.peek() == Some(&q) {
                    current.push(chars.next().unwrap_or(q));
                } else {
                    quote = None;
                }
            }
            continue;
        }
        match c {
            '\'' | '"' => {
                quote = Some(c);
                current.push(c);
            }
            '-' | '/' if chars.peek() == Some(&c) => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        current.push('\n');
                        break;
                    }
                }
            }
            ';' => {
                let s = current.trim();
                if !s.is_empty() {
                    out.push(s.to_owned());
                }
                current.clear();
            }
            _ => current.push(c),
        }
    }
    let s = current.trim();
    if !s.is_empty() {
        out.push(s.to_owned());
    }
    out
}

/// The migrations to apply, oldest first, given what the database has; refuses a newer schema
/// or a changed file. Pure, so every case is unit-tested.
pub fn plan<'m>(
    keyspace: &str,
    known: &'m [Migration],
    applied: &[AppliedVersion],
) -> Result<Vec<&'m Migration>, MigrateError> {
    let binary = known.iter().map(|m| m.version).max().unwrap_or(0);
    if let Some(newest) = applied.iter().max_by_key(|a| a.version)
        && newest.version > binary
    {
        return Err(MigrateError::NewerSchema {
            keyspace: keyspace.to_owned(),
            database: newest.version,
            name: newest.name.clone(),
            binary,
        });
    }
    let mut todo = Vec::new();
    for m in known {
        match applied.iter().find(|a| a.version == m.version) {
            Some(a) => {
                let embedded = checksum(m.cql);
                if a.checksum != embedded {
                    return Err(MigrateError::ChecksumMismatch {
                        version: m.version,
                        name: m.name,
                        applied: a.checksum.clone(),
                        embedded,
                    });
                }
            }
            None => todo.push(m),
        }
    }
    Ok(todo)
}

/// The table and column of an `ALTER TABLE <table> ADD <column> <type>` statement (one
/// column, no `IF NOT EXISTS`), lowercased as CQL folds unquoted names; `None` for any other
/// statement. Such a statement is idempotent only by a look at the schema first (see
/// [`migrate`]): `ADD IF NOT EXISTS` is Cassandra's alone.
pub fn added_column(statement: &str) -> Option<(String, String)> {
    let words: Vec<String> = statement
        .split_whitespace()
        .map(str::to_ascii_lowercase)
        .collect();
    match words.as_slice() {
        [alter, table_kw, table, add, column, _ty]
            if alter == "alter" && table_kw == "table" && add == "add" =>
        {
            let plain =
                |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            (plain(table) && plain(column)).then(|| (table.clone(), column.clone()))
        }
        _ => None,
    }
}

/// Whether `keyspace.table` has `column`.
async fn has_column(
    session: &Session,
    keyspace: &str,
    table: &str,
    column: &str,
) -> Result<bool, String> {
    let rows = session
        .query_unpaged(
            "SELECT column_name FROM system_schema.columns \
             WHERE keyspace_name = ? AND table_name = ? AND column_name = ?",
            (keyspace, table, column),
        )
        .await
        .map_err(|e| e.to_string())?
        .into_rows_result()
        .map_err(|e| e.to_string())?;
    Ok(rows.rows_num() > 0)
}

fn cql_error(version: u32, statement: &str, e: impl std::fmt::Display) -> MigrateError {
    MigrateError::Cql {
        version,
        statement: statement.lines().next().unwrap_or("").to_owned(),
        detail: e.to_string(),
    }
}

/// Schema changes wait for every node to agree; on a busy cluster that takes far longer than
/// the store's per-write timeout, which must not apply here.
const DDL_TIMEOUT: Duration = Duration::from_secs(120);

async fn run_ddl(session: &Session, version: u32, statement: &str) -> Result<(), MigrateError> {
    let mut ddl = Statement::new(statement);
    ddl.set_request_timeout(Some(DDL_TIMEOUT));
    session
        .query_unpaged(ddl, ())
        .await
        .map(|_| ())
        .map_err(|e| cql_error(version, statement, e))
}

#[derive(DeserializeRow)]
struct AppliedCols {
    version: i32,
    name: Option<String>,
    checksum: Option<String>,
}

/// The versions recorded in `keyspace.schema_migrations` (empty when the keyspace or the table
/// does not exist yet), oldest first.
pub async fn applied_versions(
    session: &Session,
    keyspace: &str,
) -> Result<Vec<AppliedVersion>, MigrateError> {
    if !valid_keyspace(keyspace) {
        return Err(MigrateError::BadKeyspace(keyspace.to_owned()));
    }
    let exists = session
        .query_unpaged(
            "SELECT table_name FROM system_schema.tables WHERE keyspace_name = ? AND table_name = ?",
            (keyspace, "schema_migrations"),
        )
        .await
        .map_err(|e| cql_error(0, "SELECT FROM system_schema.tables", e))?
        .into_rows_result()
        .map_err(|e| cql_error(0, "SELECT FROM system_schema.tables", e))?
        .rows_num()
        > 0;
    if !exists {
        return Ok(vec![]);
    }
    // The table holds one row per version: a full read is a handful of rows.
    let statement = format!("SELECT version, name, checksum FROM {keyspace}.schema_migrations");
    let mut rows = session
        .query_iter(statement.as_str(), ())
        .await
        .map_err(|e| cql_error(0, &statement, e))?
        .rows_stream::<AppliedCols>()
        .map_err(|e| cql_error(0, &statement, e))?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().await {
        let row = row.map_err(|e| cql_error(0, &statement, e))?;
        out.push(AppliedVersion {
            version: u32::try_from(row.version).unwrap_or(0),
            name: row.name.unwrap_or_default(),
            checksum: row.checksum.unwrap_or_default(),
        });
    }
    out.sort_by_key(|a| a.version);
    Ok(out)
}

/// Creates `keyspace` with `replication` if it does not exist (an existing keyspace keeps its
/// replication: change that with `ALTER KEYSPACE`), then applies the missing migrations of
/// `known` in order. Sets `keyspace` as the session's keyspace (the files use unqualified
/// names).
pub async fn migrate(
    session: &Session,
    keyspace: &str,
    replication: &Replication,
    known: &'static [Migration],
) -> Result<MigrationReport, MigrateError> {
    if !valid_keyspace(keyspace) {
        return Err(MigrateError::BadKeyspace(keyspace.to_owned()));
    }
    run_ddl(
        session,
        0,
        &format!(
            "CREATE KEYSPACE IF NOT EXISTS {keyspace} WITH replication = {}",
            replication.cql()
        ),
    )
    .await?;
    run_ddl(
        session,
        0,
        &format!(
            "CREATE TABLE IF NOT EXISTS {keyspace}.schema_migrations (version int PRIMARY KEY, \
             name text, checksum text, applied_at timestamp) \
             WITH comment = 'hookline: applied schema versions'"
        ),
    )
    .await?;
    let applied = applied_versions(session, keyspace).await?;
    let todo = plan(keyspace, known, &applied)?;
    session
        .use_keyspace(keyspace, false)
        .await
        .map_err(|e| cql_error(0, &format!("USE {keyspace}"), e))?;
    let mut done = Vec::new();
    for m in todo {
        for statement in split_statements(m.cql) {
            if let Some((table, column)) = added_column(&statement)
                && has_column(session, keyspace, &table, &column)
                    .await
                    .map_err(|e| cql_error(m.version, "SELECT FROM system_schema.columns", e))?
            {
                continue;
            }
            run_ddl(session, m.version, &statement).await?;
        }
        let record = format!(
            "INSERT INTO {keyspace}.schema_migrations (version, name, checksum, applied_at) \
             VALUES (?, ?, ?, ?)"
        );
        let version = i32::try_from(m.version).unwrap_or(i32::MAX);
        session
            .query_unpaged(
                record.as_str(),
                (
                    version,
                    m.name,
                    checksum(m.cql),
                    CqlTimestamp(
                        SystemTime::now()
                            .duration_since(SystemTime::UNIX_EPOCH)
                            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
                    ),
                ),
            )
            .await
            .map_err(|e| cql_error(m.version, &record, e))?;
        done.push((m.version, m.name));
    }
    let version = applied
        .iter()
        .map(|a| a.version)
        .chain(done.iter().map(|d| d.0))
        .max()
        .unwrap_or(0);
    Ok(MigrationReport {
        keyspace: keyspace.to_owned(),
        applied: done,
        version,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn applied(version: u32, cql: &str) -> AppliedVersion {
        AppliedVersion {
            version,
            name: format!("v{version}"),
            checksum: checksum(cql),
        }
    }

    const KNOWN: &[Migration] = &[
        Migration {
            version: 1,
            name: "one",
            cql: "CREATE TABLE a (x int PRIMARY KEY);",
        },
        Migration {
            version: 2,
            name: "two",
            cql: "CREATE TABLE b (x int PRIMARY KEY);",
        },
    ];

    #[test]
    fn an_added_column_is_read_from_its_statement() {
        assert_eq!(
            added_column("ALTER TABLE attempts_by_delivery ADD record_offset bigint"),
            Some(("attempts_by_delivery".into(), "record_offset".into()))
        );
        assert_eq!(
            added_column("alter table T\n  add Col int"),
            Some(("t".into(), "col".into())),
            "any case, any spacing"
        );
        for other in [
            "ALTER TABLE t ADD IF NOT EXISTS c int",
            "ALTER TABLE t ADD (a int, b int)",
            "ALTER TABLE t DROP c",
            "ALTER TABLE t ADD \"Quoted\" int",
            "CREATE TABLE IF NOT EXISTS t (x int PRIMARY KEY)",
        ] {
            assert_eq!(added_column(other), None, "{other}");
        }
    }

    #[test]
    fn plans_what_is_missing_in_order() {
        let todo = plan("ks", KNOWN, &[]).unwrap();
        assert_eq!(todo.iter().map(|m| m.version).collect::<Vec<_>>(), [1, 2]);
        let todo = plan("ks", KNOWN, &[applied(1, KNOWN[0].cql)]).unwrap();
        assert_eq!(todo.iter().map(|m| m.version).collect::<Vec<_>>(), [2]);
        let all = [applied(1, KNOWN[0].cql), applied(2, KNOWN[1].cql)];
        assert!(
            plan("ks", KNOWN, &all).unwrap().is_empty(),
            "no-op when current"
        );
    }

    #[test]
    fn refuses_a_newer_schema_with_a_clear_message() {
        let err = plan("ks", KNOWN, &[applied(1, KNOWN[0].cql), applied(7, "x")]).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(
            err,
            MigrateError::NewerSchema {
                database: 7,
                binary: 2,
                ..
            }
        ));
        assert!(msg.contains("version 7") && msg.contains("newer"), "{msg}");
    }

    #[test]
    fn detects_an_edited_migration() {
        let err = plan("ks", KNOWN, &[applied(1, "something else")]).unwrap_err();
        assert!(
            matches!(err, MigrateError::ChecksumMismatch { version: 1, .. }),
            "{err}"
        );
    }

    #[test]
    fn splits_statements_outside_strings_and_comments() {
        let cql = "-- header; with a semicolon\nCREATE TABLE a (x int) WITH comment = 'a;b''c';\n\
                   // another; comment\n  INSERT INTO a (x) VALUES (1) -- trailing;\n;\n;";
        assert_eq!(
            split_statements(cql),
            [
                "CREATE TABLE a (x int) WITH comment = 'a;b''c'",
                "INSERT INTO a (x) VALUES (1)"
            ]
        );
    }

    #[test]
    fn embedded_migrations_match_the_schema_directory() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas/cql");
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".cql"))
            .collect();
        files.sort();
        let expected: Vec<String> = MIGRATIONS
            .iter()
            .map(|m| format!("{:03}_{}.cql", m.version, m.name))
            .collect();
        assert_eq!(
            files, expected,
            "every schemas/cql file is embedded, in order"
        );
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(m.version as usize, i + 1, "versions are 1, 2, 3, ...");
            assert_eq!(std::fs::read_to_string(dir.join(&files[i])).unwrap(), m.cql);
            let statements = split_statements(m.cql);
            assert!(!statements.is_empty());
            assert!(
                statements
                    .iter()
                    .all(|s| s.contains("IF NOT EXISTS") || added_column(s).is_some()),
                "every statement of {} is idempotent",
                files[i]
            );
        }
        assert_eq!(LATEST_VERSION, MIGRATIONS.last().unwrap().version);
    }

    #[test]
    fn released_migrations_are_unchanged() {
        // Keyspaces in the field recorded these checksums; a changed file makes `migrate`
        // refuse them. Add a new version instead of editing one of these.
        let released = [
            (
                1,
                "4c5d5a8481222df809ab6cb4d204e6f2227a527e9ed9cf58774a8f9784ef4d07",
            ),
            (
                2,
                "8bbb0d9257eb2cf74e64e1d5323c48ac7244dc39a44779f6cbf632ebdef6f31d",
            ),
            (
                3,
                "6bd81bd422673bb1ad0347999c81fae3bd05820052dcea9f21147548b835e618",
            ),
            (
                4,
                "3da9db5ef009d74b5b161218c520e107563c72b86ef90768b053962e04a2889a",
            ),
            (
                5,
                "4690a335784d02086d41b2f9e07c1821a4db68a89df38b4fc3be37badb6c2810",
            ),
        ];
        for (version, sha) in released {
            let m = MIGRATIONS.iter().find(|m| m.version == version).unwrap();
            assert_eq!(checksum(m.cql), sha, "schema version {version} was edited");
        }
    }
}
