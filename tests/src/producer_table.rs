//! [`ProducerTable`]: a table made by hand the way a producer made it, beside the test
//! database's own outbox, for the tests that adopt existing tables.

use crate::{test_settings, unique_name, Backend, TestBroker, TestDatabase};
use outbox_relay::settings::{ColumnsSettings, Settings};
use outbox_store::TableName;
use sea_orm::{ConnectionTrait, DbBackend, Statement};

/// The test database (with its own default table) and a table of the test's own.
pub struct ProducerTable {
    /// The test database.
    pub database: TestDatabase,
    /// The hand-made table.
    pub table: TableName,
    /// Drops the table if the test fails before [`ProducerTable::finish`].
    guard: TableGuard,
}

impl ProducerTable {
    /// Settings of the binary on this table, mapped as Debezium's outbox router reads it
    /// ([`debezium_columns`]), each key in the header `aggregate_id`; then `adjust`.
    pub fn debezium_settings(
        &self,
        broker: &TestBroker,
        adjust: impl FnOnce(&mut Settings),
    ) -> Settings {
        test_settings(&self.database, broker, |settings| {
            settings.database.table = self.table.as_str().to_owned();
            settings.database.columns = debezium_columns(self.database.backend());
            settings.amqp.key_header = "aggregate_id".into();
            adjust(settings);
        })
    }

    /// A fresh test database on `backend`; the table's name starts with `prefix` and is
    /// not created yet.
    pub async fn new(backend: Backend, prefix: &str) -> Self {
        let database = TestDatabase::new(backend).await;
        let table = TableName::parse(&unique_name(prefix)).expect("a valid table name");
        let guard = TableGuard::new(&database, &table);
        Self {
            database,
            table,
            guard,
        }
    }

    /// The database's backend.
    pub fn backend(&self) -> DbBackend {
        self.database.backend()
    }

    /// Runs `sql` (`{t}`: the table).
    pub async fn execute(&self, sql: &str) {
        let sql = sql.replace("{t}", self.table.as_str());
        self.database
            .db()
            .execute(Statement::from_string(self.backend(), sql.clone()))
            .await
            .unwrap_or_else(|error| panic!("{sql}: {error}"));
    }

    /// The text column `column` of every row of `sql` (`{t}`: the table).
    pub async fn texts(&self, sql: &str, column: &str) -> Vec<Option<String>> {
        let sql = sql.replace("{t}", self.table.as_str());
        self.database
            .db()
            .query_all(Statement::from_string(self.backend(), sql.clone()))
            .await
            .unwrap_or_else(|error| panic!("{sql}: {error}"))
            .iter()
            .map(|row| row.try_get("", column).unwrap())
            .collect()
    }

    /// Name and type of each column of `table`, in table order; empty when it does not
    /// exist.
    pub async fn shape_of(&self, table: &str) -> Vec<(String, String)> {
        let sql = match self.backend() {
            DbBackend::Postgres => format!(
                "SELECT column_name::text AS name, data_type::text AS type FROM information_schema.columns \
                 WHERE table_schema = current_schema() AND table_name = '{table}' ORDER BY ordinal_position"
            ),
            DbBackend::MySql => format!(
                "SELECT CAST(column_name AS CHAR) AS name, CAST(column_type AS CHAR) AS type \
                 FROM information_schema.columns WHERE table_schema = DATABASE() \
                 AND table_name = '{table}' ORDER BY ordinal_position"
            ),
            DbBackend::Sqlite => {
                format!("SELECT name, type FROM pragma_table_info('{table}') ORDER BY cid")
            }
        };
        self.database
            .db()
            .query_all(Statement::from_string(self.backend(), sql))
            .await
            .unwrap()
            .iter()
            .map(|row| {
                (
                    row.try_get("", "name").unwrap(),
                    row.try_get("", "type").unwrap(),
                )
            })
            .collect()
    }

    /// Names of `table`'s columns, in table order; empty when it does not exist.
    pub async fn columns_of(&self, table: &str) -> Vec<String> {
        self.shape_of(table)
            .await
            .into_iter()
            .map(|(name, _)| name)
            .collect()
    }

    /// The payload column of the row whose `id` is `id`, as the database gives it back
    /// (PostgreSQL `jsonb`: the text it prints).
    pub async fn payload_of(&self, id: &str) -> Vec<u8> {
        let expr = match self.backend() {
            DbBackend::Postgres => "convert_to(payload::text, 'UTF8')",
            DbBackend::MySql | DbBackend::Sqlite => "payload",
        };
        let sql = format!("SELECT {expr} AS p FROM {} WHERE id = '{id}'", self.table);
        self.database
            .db()
            .query_one(Statement::from_string(self.backend(), sql))
            .await
            .unwrap()
            .expect("the row exists")
            .try_get("", "p")
            .unwrap()
    }

    /// Drops the table, its companions and the test database's own table.
    pub async fn finish(self) {
        self.database.drop_outbox(&self.table).await;
        self.guard.disarm();
        self.database.drop_table().await;
    }
}

/// A UUID-shaped event id: `n` in the last group, `fill` repeated in the first.
pub fn uuid(n: u8, fill: char) -> String {
    format!(
        "{}-0000-4000-8000-0000000000{n:02}",
        fill.to_string().repeat(8)
    )
}

/// Drops a table of the test's own beside its [`TestDatabase`] (and what migrations made
/// beside it) when dropped, unless disarmed: the cleanup of a test that failed before
/// dropping it. Off the test's runtime (which may be unwinding), bounded by 10 s; a
/// failure is logged, not raised, so the failed test keeps its own message.
pub struct TableGuard {
    url: String,
    table: TableName,
    backend: DbBackend,
    armed: bool,
}

impl TableGuard {
    /// Armed for `table` in `database`'s server.
    pub fn new(database: &TestDatabase, table: &TableName) -> Self {
        Self {
            url: database.url.clone(),
            table: table.clone(),
            backend: database.backend(),
            armed: true,
        }
    }

    /// The test dropped the table itself.
    pub fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for TableGuard {
    fn drop(&mut self) {
        if !self.armed || self.backend == DbBackend::Sqlite {
            return;
        }
        let (url, table, backend) = (self.url.clone(), self.table.clone(), self.backend);
        crate::database::drop_table_off_runtime(url, table, backend);
    }
}

/// The mapping of a Debezium-shaped table as Debezium's outbox router reads it (`id`,
/// `type`, `aggregateid`, `payload`, `created_at`; no headers column), ordered by
/// `position`: `seq` (which `migrate` adds), or `rowid` on SQLite.
pub fn debezium_columns(backend: DbBackend) -> ColumnsSettings {
    ColumnsSettings {
        position: if backend == DbBackend::Sqlite {
            "rowid"
        } else {
            "seq"
        }
        .into(),
        event_id: "id".into(),
        event_type: "type".into(),
        key: "aggregateid".into(),
        payload: "payload".into(),
        headers: "".into(),
        created_at: "created_at".into(),
    }
}
