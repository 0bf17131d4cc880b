//! A fresh outbox table per test, on PostgreSQL, SQLite or MySQL/MariaDB.

use crate::unique_name;
use outbox_store::{OutboxRow, SeaOrmStore, TableName};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, FromQueryResult, Statement};
use std::path::PathBuf;

/// Which database a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// `OUTBOX_TEST_DATABASE_URL`, default the local PostgreSQL.
    Postgres,
    /// A temporary SQLite file.
    Sqlite,
    /// `OUTBOX_TEST_MYSQL_URL`, default the local MariaDB.
    MySql,
}

/// A migrated, empty outbox table of its own.
pub struct TestDatabase {
    /// Connection URL.
    pub url: String,
    /// The test's table.
    pub table: TableName,
    /// A store on it.
    pub store: SeaOrmStore,
    /// The SQLite file to remove afterwards.
    file: Option<PathBuf>,
    /// Set once [`TestDatabase::drop_table`] ran; until then, dropping cleans up.
    dropped: bool,
}

impl TestDatabase {
    /// A fresh table on `backend`.
    pub async fn new(backend: Backend) -> Self {
        let (url, file, how_to_start) = match backend {
            Backend::Postgres => (
                crate::services::database_url(backend),
                None,
                "start it with `pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start` \
                 or point OUTBOX_TEST_DATABASE_URL at one",
            ),
            Backend::MySql => (
                crate::services::database_url(backend),
                None,
                "start it with `start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd` \
                 or point OUTBOX_TEST_MYSQL_URL at one",
            ),
            Backend::Sqlite => {
                let file = std::env::temp_dir().join(format!("{}.db", unique_name("outbox_e2e")));
                (format!("sqlite://{}?mode=rwc", file.display()), Some(file), "")
            }
        };
        let db = outbox_store::connect(&url, 10)
            .await
            .unwrap_or_else(|error| {
                panic!("{backend:?} is not reachable at {url}: {error}; {how_to_start}")
            });
        let table = TableName::parse(&unique_name("e2e")).expect("a valid table name");
        outbox_store::migrate(db.connection(), &table)
            .await
            .expect("migration runs");
        let store = SeaOrmStore::new(db, table.clone());
        Self {
            url,
            table,
            store,
            file,
            dropped: false,
        }
    }

    /// The connection pool.
    pub fn db(&self) -> &DatabaseConnection {
        self.store.connection()
    }

    /// Every row, by id.
    pub async fn rows(&self) -> Vec<OutboxRow> {
        // The columns by name, not `*`: sqlx caches a statement's columns, and on SQLite a
        // statement prepared before a test's `ALTER TABLE … ADD COLUMN` is prepared again by
        // SQLite with one column more than sqlx knows, which panics in sqlx-sqlite 0.8
        // (`index out of bounds` in `SqliteRow::current`).
        let sql = format!(
            "SELECT id, event_id, event_type, room_id, envelope, headers, status, retry_count, \
             last_error, created_at, available_at, locked_by, locked_until, published_at \
             FROM {} ORDER BY id",
            self.table
        );
        OutboxRow::find_by_statement(Statement::from_string(self.backend(), sql))
            .all(self.db())
            .await
            .expect("rows readable")
    }

    /// Waits until every row is `published` (and there is at least one: an empty table
    /// is a mistake of the test, not a finished run).
    pub async fn wait_all_published(&self, deadline: std::time::Duration) {
        crate::eventually("every row published", deadline, || async {
            let rows = self.rows().await;
            !rows.is_empty() && rows.iter().all(|row| row.status == "published")
        })
        .await;
    }

    /// Waits until exactly `count` rows are `dead`.
    pub async fn wait_dead(&self, count: usize, deadline: std::time::Duration) {
        let what = format!("{count} dead events");
        crate::eventually(&what, deadline, || async {
            self.rows()
                .await
                .iter()
                .filter(|row| row.status == "dead")
                .count()
                == count
        })
        .await;
    }

    /// The rows `node` holds: pending, under its lease.
    pub async fn held_by(&self, node: &str) -> Vec<OutboxRow> {
        let mut rows = self.rows().await;
        rows.retain(|row| row.status == "pending" && row.locked_by.as_deref() == Some(node));
        rows
    }

    /// The row of `event_id`.
    pub async fn row(&self, event_id: &str) -> OutboxRow {
        self.rows()
            .await
            .into_iter()
            .find(|row| row.event_id == event_id)
            .unwrap_or_else(|| panic!("no row {event_id}"))
    }

    /// Runs one statement on the test's table (`{t}` stands for its name).
    pub async fn execute(&self, sql: &str) {
        let sql = sql.replace("{t}", self.table.as_str());
        self.db()
            .execute(Statement::from_string(self.backend(), sql.clone()))
            .await
            .unwrap_or_else(|error| panic!("{sql}: {error}"));
    }

    /// Moves every lease an hour into the past, as if its node had died.
    pub async fn expire_leases(&self) {
        self.execute(match self.backend() {
            DbBackend::Postgres => "UPDATE {t} SET locked_until = locked_until - interval '1 hour'",
            DbBackend::MySql => "UPDATE {t} SET locked_until = locked_until - INTERVAL 1 HOUR",
            DbBackend::Sqlite => {
                "UPDATE {t} SET locked_until = strftime('%Y-%m-%d %H:%M:%f', locked_until, '-1 hour')"
            }
        })
        .await;
    }

    /// A SQL expression for the time `minutes` ago (negative: ahead) in this backend's
    /// column representation, for making rows look old.
    pub fn minutes_ago(&self, minutes: i64) -> String {
        match self.backend() {
            DbBackend::Postgres => format!("now() - interval '{minutes} minutes'"),
            DbBackend::MySql => format!("CURRENT_TIMESTAMP(6) - INTERVAL {minutes} MINUTE"),
            DbBackend::Sqlite => {
                format!(
                    "strftime('%Y-%m-%d %H:%M:%f', 'now', '{:+} minutes')",
                    -minutes
                )
            }
        }
    }

    /// Settings for running the binary on this database's table: migrated already, no
    /// metrics endpoint, the broker left at its default (commands like `purge` need none).
    pub fn binary_settings(&self) -> outbox_relay::settings::Settings {
        let mut settings = outbox_relay::settings::Settings::default();
        settings.database.url = self.url.clone();
        settings.database.table = self.table.as_str().to_owned();
        settings.database.migrate_on_start = false;
        settings.metrics.listen = "".into();
        settings
    }

    /// The backend of the test's database.
    pub fn backend(&self) -> DbBackend {
        self.db().get_database_backend()
    }

    /// Drops `table` of this database and what its migrations made beside it.
    pub async fn drop_outbox(&self, table: &TableName) {
        for sql in drop_statements(table, self.backend()) {
            let _ = self
                .db()
                .execute(Statement::from_string(self.backend(), sql))
                .await;
        }
    }

    /// Drops the table (and the SQLite file). Call at the end of a passing test; a test
    /// that fails before it is cleaned up when the value is dropped.
    pub async fn drop_table(mut self) {
        self.drop_outbox(&self.table).await;
        let _ = self.db().clone().close().await;
        self.dropped = true;
        remove_sqlite_file(self.file.take());
    }
}

impl Drop for TestDatabase {
    /// Teardown after a failed test (or one that forgot [`TestDatabase::drop_table`]): drops
    /// the table on a connection of its own, off the test's runtime, bounded; logs instead of
    /// panicking, so an unwinding test keeps its own message.
    fn drop(&mut self) {
        if self.dropped {
            return;
        }
        let (url, table, backend) = (self.url.clone(), self.table.clone(), self.backend());
        remove_sqlite_file(self.file.take());
        if backend == DbBackend::Sqlite {
            return;
        }
        drop_table_off_runtime(url, table, backend);
    }
}

fn remove_sqlite_file(file: Option<PathBuf>) {
    if let Some(file) = file {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
        }
    }
}

/// What [`TestDatabase::drop_outbox`] runs: `table` and what its migrations made beside it.
/// Teardown after a failed test: drops `table` (and its companions) on `url` through a
/// connection of its own, off the test's runtime ([`crate::services::cleanup_off_runtime`]).
pub(crate) fn drop_table_off_runtime(url: String, table: TableName, backend: DbBackend) {
    crate::services::cleanup_off_runtime(format!("table {table}"), move || async move {
        let db = outbox_store::connect(&url, 1)
            .await
            .map_err(|error| error.to_string())?
            .into_connection();
        for sql in drop_statements(&table, backend) {
            let _ = db.execute(Statement::from_string(backend, sql)).await;
        }
        let _ = db.close().await;
        Ok(())
    });
}

fn drop_statements(table: &TableName, backend: DbBackend) -> Vec<String> {
    let t = table.as_str();
    let mut drops = vec![
        format!("DROP TABLE IF EXISTS {t}"),
        format!("DROP TABLE IF EXISTS {t}_migrations"),
        format!("DROP TABLE IF EXISTS {t}_lock"),
    ];
    if backend == DbBackend::Postgres {
        drops.push(format!("DROP FUNCTION IF EXISTS {t}_notify()"));
    }
    drops
}

/// The original `room_outbox` worker's table, as its repository writes it, in the nearest
/// types of `backend`; `{t}` stands for the table's name. The relay's names without
/// `headers`, `available_at`, `locked_by` and `locked_until`.
pub fn original_worker_table(backend: DbBackend) -> &'static str {
    match backend {
        DbBackend::Postgres => {
            "CREATE TABLE {t} (id BIGSERIAL PRIMARY KEY, event_id VARCHAR(64) NOT NULL UNIQUE, \
             event_type VARCHAR(255) NOT NULL, room_id VARCHAR(255) NOT NULL, envelope TEXT NOT NULL, \
             status VARCHAR(16) NOT NULL DEFAULT 'pending', retry_count INTEGER NOT NULL DEFAULT 0, \
             last_error TEXT NULL, created_at TIMESTAMPTZ NOT NULL DEFAULT now(), \
             published_at TIMESTAMPTZ NULL)"
        }
        DbBackend::MySql => {
            "CREATE TABLE {t} (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, \
             event_id VARCHAR(64) NOT NULL UNIQUE, event_type VARCHAR(255) NOT NULL, \
             room_id VARCHAR(255) NOT NULL, envelope TEXT NOT NULL, \
             status VARCHAR(16) NOT NULL DEFAULT 'pending', retry_count INT NOT NULL DEFAULT 0, \
             last_error TEXT NULL, created_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), \
             published_at TIMESTAMP(6) NULL DEFAULT NULL)"
        }
        DbBackend::Sqlite => {
            "CREATE TABLE {t} (id INTEGER PRIMARY KEY AUTOINCREMENT, event_id VARCHAR(64) NOT NULL UNIQUE, \
             event_type VARCHAR(255) NOT NULL, room_id VARCHAR(255) NOT NULL, envelope TEXT NOT NULL, \
             status VARCHAR(16) NOT NULL DEFAULT 'pending', retry_count INTEGER NOT NULL DEFAULT 0, \
             last_error TEXT NULL, created_at DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP, \
             published_at DATETIME NULL)"
        }
    }
}
