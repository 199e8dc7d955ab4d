//! `hookline migrate`: create the keyspace and apply the missing CQL schema versions.
//!
//! Prints one line per applied version and a final `keyspace K at schema version N`; exit 0 when
//! the keyspace is current (also when there was nothing to do), 1 when the migration failed or
//! was refused (newer schema, edited migration), 2 for usage errors (unreadable or invalid
//! config).

use std::process::ExitCode;

use super::MigrateArgs;
use crate::config::Config;
use crate::storage::scylla::migrate::{MIGRATIONS, migrate};
use crate::storage::scylla::{ScyllaConfig, connect_session};

const USAGE_ERROR: u8 = 2;

pub(super) fn run(args: &MigrateArgs) -> ExitCode {
    let config = match config(args) {
        Ok(c) => c,
        Err(message) => {
            eprintln!("error: {message}");
            return ExitCode::from(USAGE_ERROR);
        }
    };
    let runtime = match super::runtime(super::Threads::One) {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let result = runtime.block_on(async {
        let replication = config.replication().map_err(|e| e.to_string())?;
        let session = connect_session(&config).await.map_err(|e| e.to_string())?;
        migrate(&session, &config.keyspace, &replication, MIGRATIONS)
            .await
            .map_err(|e| e.to_string())
    });
    match result {
        Ok(report) => {
            for (version, name) in &report.applied {
                println!("applied {version:03}_{name}");
            }
            if report.applied.is_empty() {
                println!("nothing to apply");
            }
            println!(
                "keyspace {} at schema version {}",
                report.keyspace, report.version
            );
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// The whole layered config (defaults < `--config` < `HOOKLINE_*` environment, validated), then
/// the flags on top; `[store.scylla]` is what migrate uses.
fn config(args: &MigrateArgs) -> Result<ScyllaConfig, String> {
    let mut config = Config::load(args.config.as_deref())
        .map_err(|e| e.to_string())?
        .store
        .scylla;
    if !args.nodes.is_empty() {
        config.nodes = args.nodes.clone();
    }
    if let Some(ks) = &args.keyspace {
        config.keyspace = ks.clone();
    }
    // The flags are checked like the file: the message names the key they replace.
    config.validate().map_err(|e| e.to_string())?;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_the_file() {
        let dir = std::env::temp_dir().join(format!("hl_migrate_{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("hookline.toml");
        std::fs::write(
            &path,
            "[store.scylla]\nnodes = [\"a:9042\"]\nkeyspace = \"from_file\"\n",
        )
        .unwrap();
        let args = MigrateArgs {
            config: Some(path.clone()),
            nodes: vec![],
            keyspace: Some("from_flag".into()),
        };
        let c = config(&args).unwrap();
        assert_eq!(c.nodes, ["a:9042"]);
        assert_eq!(c.keyspace, "from_flag");
        std::fs::write(&path, "[store.scylla]\nbogus = 1\n").unwrap();
        let err = config(&args).unwrap_err();
        assert!(err.starts_with("unknown key store.scylla.bogus"), "{err}");
        // The whole file is read and validated, not only [store.scylla].
        std::fs::write(&path, "[retry]\ntiers = []\n").unwrap();
        let err = config(&args).unwrap_err();
        assert!(err.starts_with("retry.tiers must list"), "{err}");
        let bad_flag = MigrateArgs {
            config: None,
            nodes: vec!["nohost".into()],
            keyspace: None,
        };
        let err = config(&bad_flag).unwrap_err();
        assert!(err.starts_with("store.scylla.nodes[0]"), "{err}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
