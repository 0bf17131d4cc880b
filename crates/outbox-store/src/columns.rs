//! The column mapping: which of the producer's columns hold the event id, type, ordering
//! key, payload, headers and creation time, and which integer column gives the order of
//! inserts. Defaults are the names the relay's own table uses; an existing table (the
//! original worker's, a Debezium-shaped one) is adopted by naming its columns here.
//!
//! The relay's bookkeeping columns (`status`, `retry_count`, `last_error`, `available_at`,
//! `locked_by`, `locked_until`, `published_at`) keep their names: `migrate` adds them.

use crate::sql::{is_plain_identifier, TableName};
use std::fmt;
use thiserror::Error;

/// The relay's own columns, which a mapping may not name.
pub const BOOKKEEPING: [&str; 7] = [
    "status",
    "retry_count",
    "last_error",
    "available_at",
    "locked_by",
    "locked_until",
    "published_at",
];

/// A validated column name, safe to splice into SQL: `[a-z_][a-z0-9_]{0,62}` and no reserved
/// word, so no quoting is needed on any backend (PostgreSQL folds unquoted names to
/// lowercase).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ColumnName(String);

/// Why a column name was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("invalid column name {0:?}: use 1 to 63 lowercase letters, digits and '_', starting with a letter or '_', and no SQL reserved word (such as key or order)")]
pub struct ColumnNameError(pub String);

impl ColumnName {
    /// Accepts `[a-z_][a-z0-9_]{0,62}`.
    pub fn parse(name: &str) -> Result<Self, ColumnNameError> {
        if is_plain_identifier(name, 63) {
            Ok(Self(name.to_owned()))
        } else {
            Err(ColumnNameError(name.to_owned()))
        }
    }

    /// The name as written in SQL.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    fn of(name: &str) -> Self {
        Self(name.to_owned())
    }
}

impl fmt::Display for ColumnName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One setting of the mapping, as the settings file names it (`columns.<key>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ColumnSetting {
    /// `columns.position`: an integer column that grows with every insert (default `id`).
    Position,
    /// `columns.event_id`: AMQP `message_id` (default `event_id`).
    EventId,
    /// `columns.event_type`: AMQP `type`, routing (default `event_type`).
    EventType,
    /// `columns.key`: the ordering key (default `room_id`).
    Key,
    /// `columns.payload`: the body (default `envelope`).
    Payload,
    /// `columns.headers`: JSON object of extra headers (default `headers`; blank: none).
    Headers,
    /// `columns.created_at`: when the producer wrote the row (default `created_at`).
    CreatedAt,
}

impl ColumnSetting {
    /// Every setting, in the order the settings file lists them.
    pub const ALL: [ColumnSetting; 7] = [
        ColumnSetting::Position,
        ColumnSetting::EventId,
        ColumnSetting::EventType,
        ColumnSetting::Key,
        ColumnSetting::Payload,
        ColumnSetting::Headers,
        ColumnSetting::CreatedAt,
    ];

    /// The key under `columns`.
    pub const fn key(self) -> &'static str {
        match self {
            ColumnSetting::Position => "position",
            ColumnSetting::EventId => "event_id",
            ColumnSetting::EventType => "event_type",
            ColumnSetting::Key => "key",
            ColumnSetting::Payload => "payload",
            ColumnSetting::Headers => "headers",
            ColumnSetting::CreatedAt => "created_at",
        }
    }
}

impl fmt::Display for ColumnSetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "columns.{}", self.key())
    }
}

/// The column mapping of one outbox table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Columns {
    /// Insert order; the claim's and a room's order. An integer, unique.
    pub position: ColumnName,
    /// AMQP `message_id`.
    pub event_id: ColumnName,
    /// AMQP `type`; routing.
    pub event_type: ColumnName,
    /// The ordering key (a room).
    pub key: ColumnName,
    /// The body, published byte for byte (text, JSON, or bytes).
    pub payload: ColumnName,
    /// Extra AMQP headers as a JSON object of strings; `None`: the table has none.
    pub headers: Option<ColumnName>,
    /// When the producer wrote the row (AMQP `timestamp`, latency, age).
    pub created_at: ColumnName,
    /// Columns read beyond the mapping (routing placeholders, header columns, a content
    /// type), in the order of [`outbox_core::OutboxRecord::columns`]: the outbox's
    /// [`outbox_core::ExtraColumns::reads`]. Checked against the table at start.
    pub extra: Vec<outbox_core::ColumnRead>,
}

impl Default for Columns {
    /// The relay's own table: `id, event_id, event_type, room_id, envelope, headers,
    /// created_at`.
    fn default() -> Self {
        Self {
            position: ColumnName::of("id"),
            event_id: ColumnName::of("event_id"),
            event_type: ColumnName::of("event_type"),
            key: ColumnName::of("room_id"),
            payload: ColumnName::of("envelope"),
            headers: Some(ColumnName::of("headers")),
            created_at: ColumnName::of("created_at"),
            extra: Vec::new(),
        }
    }
}

impl Columns {
    /// The column `setting` names; `None` for a blank `headers`.
    pub fn get(&self, setting: ColumnSetting) -> Option<&ColumnName> {
        match setting {
            ColumnSetting::Position => Some(&self.position),
            ColumnSetting::EventId => Some(&self.event_id),
            ColumnSetting::EventType => Some(&self.event_type),
            ColumnSetting::Key => Some(&self.key),
            ColumnSetting::Payload => Some(&self.payload),
            ColumnSetting::Headers => self.headers.as_ref(),
            ColumnSetting::CreatedAt => Some(&self.created_at),
        }
    }

    /// Checks the mapping on its own, before any database is asked: no bookkeeping
    /// column, and no column named by two settings. Every problem is reported.
    pub fn validate(&self) -> Result<(), Vec<MappingError>> {
        let mut problems = Vec::new();
        let mut seen: Vec<(ColumnSetting, &ColumnName)> = Vec::new();
        for setting in ColumnSetting::ALL {
            let Some(column) = self.get(setting) else {
                continue;
            };
            if BOOKKEEPING.contains(&column.as_str()) {
                problems.push(MappingError {
                    setting,
                    column: column.to_string(),
                    problem: MappingProblem::Bookkeeping,
                });
            }
            if let Some((first, _)) = seen.iter().find(|(_, seen)| *seen == column) {
                problems.push(MappingError {
                    setting,
                    column: column.to_string(),
                    problem: MappingProblem::NamedTwice(*first),
                });
            }
            seen.push((setting, column));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }
}

/// One wrong setting of a mapping.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{setting}: column {column:?} {problem}")]
pub struct MappingError {
    /// The setting at fault.
    pub setting: ColumnSetting,
    /// The column it names.
    pub column: String,
    /// What is wrong.
    pub problem: MappingProblem,
}

/// What is wrong with a mapped column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MappingProblem {
    /// The table has no such column.
    Missing {
        /// The table.
        table: TableName,
    },
    /// The column's type cannot serve this setting (the type as the database names it).
    WrongType {
        /// The column's type.
        found: String,
        /// What the setting needs.
        expected: &'static str,
    },
    /// One of the relay's bookkeeping columns.
    Bookkeeping,
    /// Another setting names the same column.
    NamedTwice(ColumnSetting),
    /// The backend cannot make the column serve this setting (why, and what to do).
    Unsupported(&'static str),
}

impl fmt::Display for MappingProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MappingProblem::Missing { table } => write!(f, "does not exist in table {table}"),
            MappingProblem::WrongType { found, expected } => {
                write!(f, "is {found}; {expected}")
            }
            MappingProblem::Bookkeeping => {
                f.write_str("is one of the relay's bookkeeping columns; name a producer's column")
            }
            MappingProblem::NamedTwice(first) => write!(f, "is already named by {first}"),
            MappingProblem::Unsupported(why) => f.write_str(why),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn column_names_are_plain_identifiers() {
        assert!(ColumnName::parse("aggregateid").is_ok());
        for bad in [
            "",
            "Payload",
            "1x",
            "a-b",
            "x; drop table y",
            &"a".repeat(64),
        ] {
            assert!(ColumnName::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn a_mapping_may_not_name_bookkeeping_columns_or_one_column_twice() {
        assert_eq!(Columns::default().validate(), Ok(()));
        let columns = Columns {
            payload: ColumnName::of("status"),
            key: ColumnName::of("event_type"),
            ..Columns::default()
        };
        let problems = columns.validate().unwrap_err();
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert_eq!(
            problems[0].to_string(),
            "columns.key: column \"event_type\" is already named by columns.event_type"
        );
        assert_eq!(problems[1].setting, ColumnSetting::Payload);
    }
}
