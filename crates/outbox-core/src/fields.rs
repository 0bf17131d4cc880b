//! Columns of the outbox table beyond the mapping: the ones a routing template or a route
//! names (`{aggregatetype}`), copied into AMQP headers (`amqp.header_columns`), or giving a
//! row its `content_type` (`amqp.content_type_column`). A claim reads each of them
//! ([`ExtraColumns::reads`]) into [`OutboxRecord::columns`], in the same order.

use crate::OutboxRecord;
use chrono::{DateTime, Utc};
use std::fmt;
use std::str::FromStr;

/// What a column is read as, and so the type of the AMQP header it becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ValueKind {
    /// Any column, as its text (a long string header).
    Text,
    /// An integer column (a signed 64-bit long-long-int header).
    Integer,
    /// A boolean (or, on MySQL and SQLite, an integer: non-zero is true).
    Boolean,
    /// A UUID, as its canonical text (AMQP has no UUID type: a long string header).
    Uuid,
    /// A point in time (an AMQP timestamp header: seconds since the epoch, UTC).
    Timestamp,
}

impl ValueKind {
    /// Every kind, as settings name them.
    pub const ALL: [ValueKind; 5] = [
        ValueKind::Text,
        ValueKind::Integer,
        ValueKind::Boolean,
        ValueKind::Uuid,
        ValueKind::Timestamp,
    ];

    /// The name in settings.
    pub const fn as_str(self) -> &'static str {
        match self {
            ValueKind::Text => "text",
            ValueKind::Integer => "integer",
            ValueKind::Boolean => "boolean",
            ValueKind::Uuid => "uuid",
            ValueKind::Timestamp => "timestamp",
        }
    }
}

impl fmt::Display for ValueKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ValueKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ValueKind::ALL
            .into_iter()
            .find(|kind| kind.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = ValueKind::ALL.iter().map(|k| k.as_str()).collect();
                format!("{s:?} is not a type; accepted: {}", names.join(", "))
            })
    }
}

/// One column a claim reads beyond the mapping, and as what.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ColumnRead {
    /// The column's name in the table.
    pub column: String,
    /// What it is read as.
    pub kind: ValueKind,
    /// The setting that asks for it (for messages): `amqp.routing_key`,
    /// `amqp.header_columns.tenant`, …
    pub used_by: String,
}

/// The value of one extra column of one row (a NULL is `None` beside it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ColumnValue {
    /// Text (also a UUID's canonical form).
    Text(String),
    /// An integer.
    Integer(i64),
    /// A boolean.
    Boolean(bool),
    /// A point in time.
    Timestamp(DateTime<Utc>),
}

impl ColumnValue {
    /// The value as text, when it is text.
    pub fn as_text(&self) -> Option<&str> {
        match self {
            ColumnValue::Text(text) => Some(text),
            _ => None,
        }
    }
}

/// One `amqp.header_columns` entry: header `header` carries column `read` of
/// [`ExtraColumns::reads`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderColumn {
    /// The AMQP header's name.
    pub header: String,
    /// Index into [`ExtraColumns::reads`].
    pub read: usize,
}

/// The extra columns of one outbox and what each serves. Empty for the relay's own table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExtraColumns {
    reads: Vec<ColumnRead>,
    headers: Vec<HeaderColumn>,
    content_type: Option<usize>,
}

impl ExtraColumns {
    /// What a claim reads, in the order of [`OutboxRecord::columns`].
    pub fn reads(&self) -> &[ColumnRead] {
        &self.reads
    }

    /// No column beyond the mapping is read.
    pub fn is_empty(&self) -> bool {
        self.reads.is_empty()
    }

    /// Reads `column` as `kind` (once, however many settings ask); its index.
    pub fn read(&mut self, column: &str, kind: ValueKind, used_by: &str) -> usize {
        if let Some(index) = self
            .reads
            .iter()
            .position(|read| read.column == column && read.kind == kind)
        {
            return index;
        }
        self.reads.push(ColumnRead {
            column: column.to_owned(),
            kind,
            used_by: used_by.to_owned(),
        });
        self.reads.len() - 1
    }

    /// Copies `column`, read as `kind`, into header `header`.
    pub fn add_header(&mut self, header: &str, column: &str, kind: ValueKind) {
        let read = self.read(column, kind, &format!("header_columns.{header}"));
        self.headers.push(HeaderColumn {
            header: header.to_owned(),
            read,
        });
    }

    /// Takes each row's `content_type` from `column` (text; NULL: the outbox's own).
    pub fn set_content_type_column(&mut self, column: &str) {
        self.content_type = Some(self.read(column, ValueKind::Text, "content_type_column"));
    }

    /// The header columns, in settings order.
    pub fn headers(&self) -> &[HeaderColumn] {
        &self.headers
    }

    /// The value of `record`'s extra column `index`; `None` for NULL (or a record read
    /// without it).
    pub fn value<'r>(&self, record: &'r OutboxRecord, index: usize) -> Option<&'r ColumnValue> {
        record.columns.get(index).and_then(Option::as_ref)
    }

    /// The text of `record`'s column `column` (read as text); `None` for NULL.
    pub fn text<'r>(&self, record: &'r OutboxRecord, column: &str) -> Option<&'r str> {
        let index = self
            .reads
            .iter()
            .position(|read| read.column == column && read.kind == ValueKind::Text)?;
        self.value(record, index).and_then(ColumnValue::as_text)
    }

    /// The row's own `content_type`, when a column gives one and it is not NULL.
    pub fn content_type<'r>(&self, record: &'r OutboxRecord) -> Option<&'r str> {
        self.value(record, self.content_type?)
            .and_then(ColumnValue::as_text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_column_asked_for_twice_as_the_same_kind_is_read_once() {
        let mut extra = ExtraColumns::default();
        assert_eq!(
            extra.read("aggregatetype", ValueKind::Text, "amqp.routing_key"),
            0
        );
        extra.add_header("aggregate", "aggregatetype", ValueKind::Text);
        extra.add_header("attempt", "attempt", ValueKind::Integer);
        extra.set_content_type_column("ctype");
        assert_eq!(extra.reads().len(), 3);
        assert_eq!(extra.headers()[0].read, 0);
        assert_eq!(extra.headers()[1].read, 1);
    }

    #[test]
    fn kinds_are_named_as_settings_write_them() {
        for kind in ValueKind::ALL {
            assert_eq!(kind.as_str().parse(), Ok(kind));
        }
        let error = "int".parse::<ValueKind>().unwrap_err();
        assert!(error.contains("integer"), "{error}");
    }
}
