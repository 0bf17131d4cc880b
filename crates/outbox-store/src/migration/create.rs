//! The DDL of a table the relay creates: its columns under the mapped names, and its
//! indexes. With the default mapping it is, byte for byte, the DDL that has shipped
//! (the test `the_tables_ddl_is_as_shipped`).

use super::Context;
use crate::dialect::Dialect;
use crate::sql::{Index, PENDING};

/// `CREATE TABLE` and the indexes of a new outbox table, per backend.
pub(super) fn create_table(cx: &Context<'_>) -> Vec<String> {
    let t = cx.table;
    let c = cx.columns;
    let (id, event_id, event_type, room_id, envelope, created_at) = (
        &c.position,
        &c.event_id,
        &c.event_type,
        &c.key,
        &c.payload,
        &c.created_at,
    );
    // The line of the headers column, with the indentation of its neighbours.
    let headers = |indent: &str| match &c.headers {
        Some(headers) => format!("\n{indent}{headers} TEXT NULL,"),
        None => String::new(),
    };
    match cx.dialect {
        Dialect::Postgres => {
            let headers = headers("                    ");
            let mut statements = vec![format!(
                "CREATE TABLE IF NOT EXISTS {t} (
                    {id} BIGSERIAL PRIMARY KEY,
                    {event_id} VARCHAR(64) NOT NULL UNIQUE,
                    {event_type} VARCHAR(255) NOT NULL,
                    {room_id} VARCHAR(255) NOT NULL,
                    {envelope} TEXT NOT NULL,{headers}
                    status VARCHAR(16) NOT NULL DEFAULT {PENDING},
                    retry_count INTEGER NOT NULL DEFAULT 0,
                    last_error VARCHAR(512) NULL,
                    {created_at} TIMESTAMPTZ NOT NULL DEFAULT now(),
                    available_at TIMESTAMPTZ NOT NULL DEFAULT now(),
                    locked_by VARCHAR(128) NULL,
                    locked_until TIMESTAMPTZ NULL,
                    published_at TIMESTAMPTZ NULL)"
            )];
            statements.extend(indexes(cx));
            statements
        }
        Dialect::Sqlite => {
            let now = "(strftime('%Y-%m-%d %H:%M:%f', 'now'))";
            let headers = headers("                        ");
            let mut statements = vec![format!(
                "CREATE TABLE IF NOT EXISTS {t} (
                        {id} INTEGER PRIMARY KEY AUTOINCREMENT,
                        {event_id} VARCHAR(64) NOT NULL UNIQUE,
                        {event_type} VARCHAR(255) NOT NULL,
                        {room_id} VARCHAR(255) NOT NULL,
                        {envelope} TEXT NOT NULL,{headers}
                        status VARCHAR(16) NOT NULL DEFAULT {PENDING},
                        retry_count INTEGER NOT NULL DEFAULT 0,
                        last_error VARCHAR(512) NULL,
                        {created_at} DATETIME NOT NULL DEFAULT {now},
                        available_at DATETIME NOT NULL DEFAULT {now},
                        locked_by VARCHAR(128) NULL,
                        locked_until DATETIME NULL,
                        published_at DATETIME NULL)"
            )];
            statements.extend(indexes(cx));
            statements
        }
        // TIMESTAMP(6) is stored in UTC whatever a producer's session time zone is.
        Dialect::MySql => {
            let headers = headers("                ");
            let [pending_idx, room_idx, retention_idx, pending_room_idx] =
                mysql_indexes(cx).map(|(name, columns)| format!("INDEX {name} ({columns})"));
            vec![format!(
                "CREATE TABLE IF NOT EXISTS {t} (
                {id} BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
                {event_id} VARCHAR(64) NOT NULL UNIQUE,
                {event_type} VARCHAR(255) NOT NULL,
                {room_id} VARCHAR(255) NOT NULL,
                {envelope} LONGTEXT NOT NULL,{headers}
                status VARCHAR(16) NOT NULL DEFAULT {PENDING},
                retry_count INT NOT NULL DEFAULT 0,
                last_error VARCHAR(512) NULL,
                {created_at} TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
                available_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
                locked_by VARCHAR(128) NULL,
                locked_until TIMESTAMP(6) NULL DEFAULT NULL,
                published_at TIMESTAMP(6) NULL DEFAULT NULL,
                {pending_idx},
                {room_idx},
                {retention_idx},
                {pending_room_idx}
            ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"
            )]
        }
    }
}

/// PostgreSQL and SQLite: the four indexes on the mapped key and position columns, each
/// `IF NOT EXISTS` (an adopted table may have some already).
pub(super) fn indexes(cx: &Context<'_>) -> Vec<String> {
    let t = cx.table;
    let key = &cx.columns.key;
    // SQLite's implicit rowid ends every index entry already, and cannot be named in one.
    let (position, key_position) = if cx.rowid_position() {
        ("status".to_owned(), key.to_string())
    } else {
        let position = cx.columns.position.to_string();
        let key_position = format!("{key}, {position}");
        (position, key_position)
    };
    let pending_idx = t.index(Index::Pending);
    let room_idx = t.index(Index::Room);
    let retention_idx = t.index(Index::Retention);
    let pending_room_idx = t.index(Index::PendingRoom);
    vec![
        format!("CREATE INDEX IF NOT EXISTS {pending_idx} ON {t} ({position}) WHERE status = {PENDING}"),
        format!("CREATE INDEX IF NOT EXISTS {room_idx} ON {t} ({key_position})"),
        format!("CREATE INDEX IF NOT EXISTS {retention_idx} ON {t} (status, published_at)"),
        // Beyond the three indexes of the table's description: keeps per-room claims cheap.
        format!("CREATE INDEX IF NOT EXISTS {pending_room_idx} ON {t} ({key_position}) WHERE status = {PENDING}"),
    ]
}

/// MySQL: the names and column lists of the four indexes (no partial indexes: `status`
/// leads instead).
pub(super) fn mysql_indexes(cx: &Context<'_>) -> [(String, String); 4] {
    let t = cx.table;
    let (key, position) = (&cx.columns.key, &cx.columns.position);
    [
        (t.index(Index::Pending), format!("status, {position}")),
        (t.index(Index::Room), format!("{key}, {position}")),
        (t.index(Index::Retention), "status, published_at".to_owned()),
        (
            t.index(Index::PendingRoom),
            format!("{key}, status, {position}"),
        ),
    ]
}
