//! The three backends the suite runs on, each opened as separate processes or replicas would open
//! it: SQLite and PostgreSQL with a pool per handle, memory with clones of one handle (it is one
//! process's memory by definition).

use std::path::PathBuf;

use toolgate_store::Location;
use toolgate_store::approval::ApprovalStore;
use toolgate_store::idempotency::IdempotencyStore;
use toolgate_store::state::StateStore;

/// The PostgreSQL server the suite uses unless `TOOLGATE_TEST_POSTGRES` names another.
pub(crate) const DEFAULT_POSTGRES: &str = "postgres://postgres@127.0.0.1:5432/test";

/// One backend under test, and what keeps it alive (the temporary directory).
#[derive(Debug)]
pub(crate) struct Backend {
    pub(crate) name: &'static str,
    pub(crate) location: Location,
    /// The SQLite file's directory (and where the kill switch's stamp lives).
    pub(crate) dir: tempfile::TempDir,
    /// The memory backend's one handle, which every "process" shares.
    memory: Option<ApprovalStore>,
}

/// A database of each kind, empty.
pub(crate) async fn all() -> Vec<Backend> {
    let dir = || tempfile::tempdir().expect("a temporary directory");
    let sqlite_dir = dir();
    let memory = Location::Memory;
    vec![
        Backend {
            name: "sqlite",
            location: Location::Dir(sqlite_dir.path().to_owned()),
            dir: sqlite_dir,
            memory: None,
        },
        Backend {
            name: "postgres",
            location: fresh_postgres().await,
            dir: dir(),
            memory: None,
        },
        Backend {
            name: "memory",
            memory: Some(ApprovalStore::at(&memory).await.expect("memory opens")),
            location: memory,
            dir: dir(),
        },
    ]
}

/// The PostgreSQL server of the suite, by URL.
pub(crate) fn postgres_url() -> String {
    // A test binary is its own program: where its database is comes from its environment.
    #[allow(clippy::disallowed_methods)]
    std::env::var("TOOLGATE_TEST_POSTGRES").unwrap_or_else(|_| DEFAULT_POSTGRES.to_owned())
}

/// A URL of the suite's server whose connections see only a new, empty schema, so that tests
/// running at once never see each other's rows.
pub(crate) async fn fresh_postgres() -> Location {
    let base = postgres_url();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&base)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "the PostgreSQL suite needs a server at {base} (set TOOLGATE_TEST_POSTGRES): {e}"
            )
        });
    let mut bytes = [0_u8; 8];
    getrandom::fill(&mut bytes).expect("randomness");
    let schema = format!(
        "tg_test_{}",
        bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
        .execute(&pool)
        .await
        .expect("a fresh schema");
    pool.close().await;
    let separator = if base.contains('?') { '&' } else { '?' };
    Location::Postgres(format!(
        "{base}{separator}options=-c%20search_path%3D{schema}"
    ))
}

impl Backend {
    /// `n` handles on this database, each as a separate process would hold it.
    pub(crate) async fn approvals(&self, n: usize) -> Vec<ApprovalStore> {
        if let Some(memory) = &self.memory {
            return vec![memory.clone(); n];
        }
        let mut handles = Vec::new();
        for _ in 0..n {
            handles.push(
                ApprovalStore::at(&self.location)
                    .await
                    .unwrap_or_else(|e| panic!("{}: {e:?}", self.name)),
            );
        }
        handles
    }

    pub(crate) async fn keys(&self, n: usize) -> Vec<IdempotencyStore> {
        self.approvals(n)
            .await
            .iter()
            .map(IdempotencyStore::beside)
            .collect()
    }

    pub(crate) async fn state(&self, n: usize) -> Vec<StateStore> {
        let dir: PathBuf = self.dir.path().to_owned();
        self.approvals(n)
            .await
            .iter()
            .map(|approvals| StateStore::beside(approvals, &dir).expect("state store"))
            .collect()
    }
}
