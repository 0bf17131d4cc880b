//! Wake-ups on PostgreSQL: the migration adds a statement-level trigger that NOTIFYs the
//! channel named after the table on every insert; [`InsertListener`] LISTENs to it, so the
//! relay claims at once instead of at the next poll. Polling stays as the fallback.

use crate::sql::TableName;
use sea_orm::sqlx::postgres::PgListener;

/// A LISTEN connection on the table's channel. Reconnects by itself when the connection
/// is lost.
pub struct InsertListener {
    listener: PgListener,
}

impl std::fmt::Debug for InsertListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InsertListener")
    }
}

impl InsertListener {
    /// Connects to `url` (PostgreSQL; plain text unless the URL asks for TLS, like the
    /// pool) and listens on `table`'s channel.
    pub async fn connect(url: &str, table: &TableName) -> Result<Self, sea_orm::sqlx::Error> {
        let mut listener = PgListener::connect(&crate::connection_url(url)).await?;
        listener.listen(table.as_str()).await?;
        Ok(Self { listener })
    }

    /// Waits for a reason to claim: rows were inserted, or the connection was lost and
    /// re-established (notifications may have been missed meanwhile). An error means the
    /// reconnection failed; calling again retries it.
    pub async fn wait(&mut self) -> Result<(), sea_orm::sqlx::Error> {
        self.listener.try_recv().await.map(|_| ())
    }
}
