//! The names and constants statements are built from: the table name, its indexes and the
//! `status` values. What differs between backends is in `dialect.rs`.

use outbox_core::Status;
use std::fmt;
use thiserror::Error;

/// A validated table name, safe to splice into SQL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableName(String);

/// Why a `database.table` value was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("invalid table name {0:?}: use 1 to 48 lowercase letters, digits and '_', starting with a letter or '_', and no SQL reserved word (such as order or user)")]
pub struct TableNameError(pub String);

impl TableName {
    /// Accepts `[a-z_][a-z0-9_]{0,47}`: no quoting needed on any backend, and room for
    /// index-name suffixes within the 63/64-character identifier limits.
    pub fn parse(name: &str) -> Result<Self, TableNameError> {
        if is_plain_identifier(name, 48) {
            Ok(Self(name.to_owned()))
        } else {
            Err(TableNameError(name.to_owned()))
        }
    }

    /// The name as written in SQL.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// PostgreSQL: the name of the table's insert trigger and of its function, which
    /// `migrate` creates.
    pub fn notify_trigger(&self) -> String {
        format!("{}_notify", self.0)
    }

    /// PostgreSQL: the two keys of the table's wake lock, [`WAKE_LOCK_KEY`] and a 31-bit
    /// FNV-1a hash of the name (stable across builds, and across a dump and restore, unlike
    /// the table's oid), as SQL arguments: `1869968482, 123456789`. Both are positive, so
    /// `pg_get_triggerdef` prints them as written (a relay checks the trigger by them).
    pub fn wake_lock(&self) -> String {
        let hash = self.0.bytes().fold(0x811c_9dc5_u32, |hash, byte| {
            (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
        });
        format!("{WAKE_LOCK_KEY}, {}", hash & 0x7fff_ffff)
    }
}

/// PostgreSQL: the first key of the advisory lock a sleeping relay holds on its LISTEN
/// connection ("outb" in ASCII); the second is [`TableName::wake_lock`]'s. The insert
/// trigger NOTIFYs only while some session holds it: its `WHEN` tries the lock in shared
/// mode, which fails exactly then (docs/design/wake-ups.md#notify-only-a-sleeping-relay).
pub const WAKE_LOCK_KEY: i32 = 0x6f75_7462;

/// `[a-z_][a-z0-9_]*` of at most `max_len` characters, and no reserved word: a name that
/// needs no quoting on any backend (PostgreSQL folds unquoted names to lowercase).
pub(crate) fn is_plain_identifier(name: &str, max_len: usize) -> bool {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    let rest_ok = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    first_ok && rest_ok && name.len() <= max_len && !RESERVED.contains(&name)
}

/// Words PostgreSQL, MySQL/MariaDB or SQLite reserve that could pass for a table or
/// column name: unquoted, each breaks a statement on at least one backend (`key` on
/// MySQL, `user` on PostgreSQL), so they are refused by name at start.
const RESERVED: &[&str] = &[
    "all",
    "analyse",
    "analyze",
    "and",
    "any",
    "array",
    "as",
    "asc",
    "between",
    "both",
    "by",
    "case",
    "cast",
    "check",
    "collate",
    "column",
    "condition",
    "constraint",
    "create",
    "cross",
    "current_date",
    "current_time",
    "current_timestamp",
    "current_user",
    "default",
    "delete",
    "desc",
    "describe",
    "distinct",
    "div",
    "drop",
    "else",
    "end",
    "except",
    "exists",
    "false",
    "fetch",
    "for",
    "foreign",
    "from",
    "full",
    "grant",
    "group",
    "having",
    "if",
    "in",
    "index",
    "inner",
    "insert",
    "interval",
    "into",
    "is",
    "join",
    "key",
    "keys",
    "leading",
    "left",
    "like",
    "limit",
    "lock",
    "match",
    "mod",
    "natural",
    "not",
    "null",
    "offset",
    "on",
    "only",
    "or",
    "order",
    "outer",
    "primary",
    "range",
    "rank",
    "read",
    "references",
    "regexp",
    "rename",
    "replace",
    "right",
    "row",
    "rows",
    "select",
    "set",
    "show",
    "table",
    "then",
    "to",
    "trailing",
    "true",
    "union",
    "unique",
    "update",
    "usage",
    "user",
    "using",
    "values",
    "when",
    "where",
    "window",
    "with",
    "write",
];

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An index the migrations create and the queries name: `<table>_<suffix>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Index {
    /// Pending rows in id order: what a claim walks (partial on PostgreSQL and SQLite,
    /// `(status, id)` on MySQL).
    Pending,
    /// `(room_id, id)`: a room's history.
    Room,
    /// `(status, published_at)`: what retention walks, oldest first.
    Retention,
    /// A room's pending rows in id order: the per-room claim's probe.
    PendingRoom,
    /// PostgreSQL: the unique index on a position column that `migrate` added to an
    /// adopted table (outcomes find their rows by position).
    Position,
}

impl Index {
    const fn suffix(self) -> &'static str {
        match self {
            Index::Pending => "pending_idx",
            Index::Room => "room_idx",
            Index::Retention => "retention_idx",
            Index::PendingRoom => "pending_room_idx",
            Index::Position => "position_idx",
        }
    }
}

impl TableName {
    /// The name of the table's `index`.
    pub(crate) fn index(&self, index: Index) -> String {
        format!("{}_{}", self.0, index.suffix())
    }
}

/// A `status` value written into SQL as a quoted literal. A literal, not a bound value:
/// PostgreSQL and SQLite use a partial index (the pending rows) only for a query whose
/// condition names the same constant as the index's.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Literal(pub(crate) Status);

impl fmt::Display for Literal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "'{}'", self.0.as_str())
    }
}

/// The pending status, as a literal.
pub(crate) const PENDING: Literal = Literal(Status::Pending);
/// The published status, as a literal.
pub(crate) const PUBLISHED: Literal = Literal(Status::Published);
/// The dead status, as a literal.
pub(crate) const DEAD: Literal = Literal(Status::Dead);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wake_lock_of_a_table_is_the_same_in_every_build() {
        // The trigger `migrate` made names these keys; a relay built later must take the
        // same lock, or the trigger NOTIFYs nobody.
        let table = TableName::parse("room_outbox").unwrap();
        assert_eq!(table.wake_lock(), "1869968482, 1061679998");
    }

    #[test]
    fn table_names_are_plain_identifiers() {
        assert!(TableName::parse("room_outbox").is_ok());
        assert!(TableName::parse("_outbox2").is_ok());
        for bad in [
            "",
            "Room",
            "2outbox",
            "room-outbox",
            "x; drop table y",
            "order",
            &"a".repeat(49),
        ] {
            assert!(TableName::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn status_literals_are_quoted_column_values() {
        assert_eq!(PENDING.to_string(), "'pending'");
        assert_eq!(Literal(Status::Published).to_string(), "'published'");
        assert_eq!(
            TableName::parse("room_outbox")
                .unwrap()
                .index(Index::PendingRoom),
            "room_outbox_pending_room_idx"
        );
    }
}
