//! [`Reads`]: how the store's statements name the mapped columns. The relay's own types are
//! read as they are (the default mapping's statements are today's); other types get the
//! cast that makes the driver accept them: sqlx decodes strictly (a PostgreSQL `uuid` is no
//! `String`, `jsonb` no text, an `integer` no `i64`).

use crate::columns::{ColumnSetting, Columns, MappingError, MappingProblem};
use crate::dialect::Dialect;
use crate::shape::{Kind, TableShape};
use crate::sql::TableName;
use outbox_core::{ColumnRead, ValueKind};

/// How a claim decodes the payload column into bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PayloadDecode {
    /// As text, whose UTF-8 bytes are the body (PostgreSQL `text`/`varchar`, and `json`/
    /// `jsonb` through `::text`). No cast for the relay's own `TEXT` column.
    Text,
    /// As bytes (PostgreSQL `bytea`; MySQL and SQLite decode any text or blob as bytes).
    Bytes,
}

/// SQLite names of the implicit row id, which `columns.position` may name on SQLite:
/// it cannot add an integer column that numbers the existing rows.
const SQLITE_ROWIDS: [&str; 3] = ["rowid", "_rowid_", "oid"];

/// The SQL of the mapped columns, for one backend and one table's types.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reads {
    /// The position column as conditions and `ORDER BY` name it.
    pub(crate) position: String,
    /// How the position is made a 64-bit signed integer when read.
    position_cast: Cast,
    /// Event id, comparable with a bound string.
    pub(crate) event_id: String,
    /// Event type, comparable with a bound string.
    pub(crate) event_type: String,
    /// The key column as is (`e.key = c.key`).
    pub(crate) key: String,
    /// The key, comparable with a bound string.
    pub(crate) key_text: String,
    /// The payload as read.
    payload: String,
    /// How the payload decodes.
    pub(crate) payload_decode: PayloadDecode,
    /// The headers, as text; `None` when the mapping has none.
    headers: Option<String>,
    /// The creation time as a comparable UTC timestamp.
    pub(crate) created_at: String,
    /// The extra columns (`Columns::extra`), each as read and decoded, selected as
    /// `extra_0`, `extra_1`, …
    pub(crate) extra: Vec<(String, Decode)>,
}

/// How a claim decodes one extra column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decode {
    /// Text.
    Text,
    /// A 64-bit integer.
    Integer,
    /// A boolean (PostgreSQL).
    Boolean,
    /// A boolean as an integer 0 or 1 (MySQL, SQLite).
    BooleanInteger,
    /// A UTC timestamp.
    Timestamp,
}

/// A cast that wraps an expression.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cast {
    None,
    /// PostgreSQL `::bigint`.
    Bigint,
    /// MySQL `CAST(… AS SIGNED)`.
    Signed,
}

impl Cast {
    fn wrap(self, expr: &str) -> String {
        match self {
            Cast::None => expr.to_owned(),
            Cast::Bigint => format!("{expr}::bigint"),
            Cast::Signed => format!("CAST({expr} AS SIGNED)"),
        }
    }
}

impl Reads {
    /// The statements for `columns` assuming the relay's own types (no casts): what a
    /// store uses until [`Reads::checked`] has seen the table.
    pub(crate) fn plain(dialect: Dialect, columns: &Columns) -> Self {
        let text = Kind::Text { long: false };
        let mut reads = Self::build(dialect, columns, |setting| match setting {
            ColumnSetting::Position => Kind::Integer {
                unsigned: false,
                big: true,
            },
            ColumnSetting::CreatedAt => Kind::Time { zoned: true },
            _ => text,
        });
        reads.extra = columns
            .extra
            .iter()
            .map(|read| extra_read(dialect, read, assumed(dialect, read.kind)))
            .collect();
        reads
    }

    /// The extra columns of `columns` on a table of `shape`, or every problem: a column
    /// the table lacks (naming the columns it has), or one whose type cannot be read as
    /// asked. Each problem names the setting that asks for the column.
    pub(crate) fn check_extra(
        &mut self,
        dialect: Dialect,
        table: &TableName,
        columns: &Columns,
        shape: &TableShape,
    ) -> Result<(), Vec<String>> {
        let mut problems = Vec::new();
        let mut extra = Vec::new();
        for read in &columns.extra {
            let (column, used_by) = (&read.column, &read.used_by);
            match shape.column(column) {
                None => {
                    let names: Vec<&str> = shape.columns.iter().map(|c| c.name.as_str()).collect();
                    problems.push(format!(
                        "{used_by}: column \"{column}\" does not exist in table {table}; its columns: {}",
                        names.join(", ")
                    ));
                }
                Some(found) if !fits(dialect, read.kind, found.kind) => problems.push(format!(
                    "{used_by}: column \"{column}\" is {}, which cannot be read as {}",
                    found.type_name, read.kind
                )),
                Some(found) => extra.push(extra_read(dialect, read, found.kind)),
            }
        }
        if problems.is_empty() {
            self.extra = extra;
            Ok(())
        } else {
            Err(problems)
        }
    }

    /// The statements for `columns` on a table of `shape`, or every problem of the mapping
    /// (a missing column, a type that cannot serve its setting).
    pub(crate) fn checked(
        dialect: Dialect,
        table: &TableName,
        columns: &Columns,
        shape: &TableShape,
    ) -> Result<Self, Vec<MappingError>> {
        let mut problems = Vec::new();
        for setting in ColumnSetting::ALL {
            let Some(column) = columns.get(setting) else {
                continue;
            };
            let name = column.as_str();
            let problem = match shape.column(name) {
                None if setting == ColumnSetting::Position
                    && dialect == Dialect::Sqlite
                    && SQLITE_ROWIDS.contains(&name) =>
                {
                    None
                }
                None => Some(MappingProblem::Missing {
                    table: table.clone(),
                }),
                Some(found) => expected(dialect, setting, found.kind).map(|expected| {
                    MappingProblem::WrongType {
                        found: found.type_name.clone(),
                        expected,
                    }
                }),
            };
            if let Some(problem) = problem {
                problems.push(MappingError {
                    setting,
                    column: name.to_owned(),
                    problem,
                });
            }
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        Ok(Self::build(dialect, columns, |setting| {
            columns
                .get(setting)
                .and_then(|column| shape.column(column.as_str()))
                .map_or(
                    Kind::Integer {
                        unsigned: false,
                        big: true,
                    },
                    |column| column.kind,
                )
        }))
    }

    fn build(dialect: Dialect, columns: &Columns, kind: impl Fn(ColumnSetting) -> Kind) -> Self {
        let text = |setting: ColumnSetting, name: &str| -> String {
            match (kind(setting), dialect) {
                (Kind::Text { .. }, _) => name.to_owned(),
                (_, Dialect::Postgres) => format!("{name}::text"),
                (_, Dialect::MySql) => format!("CAST({name} AS CHAR)"),
                (_, Dialect::Sqlite) => format!("CAST({name} AS TEXT)"),
            }
        };
        let position_cast = match (kind(ColumnSetting::Position), dialect) {
            (Kind::Integer { big: false, .. }, Dialect::Postgres) => Cast::Bigint,
            (Kind::Integer { unsigned: true, .. }, Dialect::MySql) => Cast::Signed,
            _ => Cast::None,
        };
        let payload = columns.payload.as_str();
        let (payload, payload_decode) = match (dialect, kind(ColumnSetting::Payload)) {
            (Dialect::Postgres, Kind::Bytes) => (payload.to_owned(), PayloadDecode::Bytes),
            (Dialect::Postgres, Kind::Text { .. }) => (payload.to_owned(), PayloadDecode::Text),
            (Dialect::Postgres, _) => (format!("{payload}::text"), PayloadDecode::Text),
            // MySQL 8's JSON type decodes as neither text nor bytes (MariaDB's is LONGTEXT).
            (Dialect::MySql, Kind::Json) => {
                (format!("CAST({payload} AS CHAR)"), PayloadDecode::Bytes)
            }
            (Dialect::MySql | Dialect::Sqlite, _) => (payload.to_owned(), PayloadDecode::Bytes),
        };
        let headers = columns
            .headers
            .as_ref()
            .map(|headers| text(ColumnSetting::Headers, headers.as_str()));
        let created = columns.created_at.as_str();
        let created_at = match (dialect, kind(ColumnSetting::CreatedAt)) {
            (Dialect::Postgres, Kind::Time { zoned: false }) => {
                format!("({created} AT TIME ZONE 'UTC')")
            }
            _ => created.to_owned(),
        };
        Self {
            position: columns.position.to_string(),
            position_cast,
            event_id: text(ColumnSetting::EventId, columns.event_id.as_str()),
            event_type: text(ColumnSetting::EventType, columns.event_type.as_str()),
            key: columns.key.to_string(),
            key_text: text(ColumnSetting::Key, columns.key.as_str()),
            payload,
            payload_decode,
            headers,
            created_at,
            extra: Vec::new(),
        }
    }

    /// `expr` (the position, or an aggregate of it) as a 64-bit signed integer.
    pub(crate) fn position_value(&self, expr: &str) -> String {
        self.position_cast.wrap(expr)
    }

    /// The select list of a claimed row (`crate::row::ClaimedRow`), unqualified: `id,
    /// event_id, event_type, room_id, envelope[, headers], retry_count, created_at`,
    /// each mapped column aliased to that name.
    pub(crate) fn claimed_columns(&self) -> String {
        self.claimed_columns_with(&aliased(&self.payload, "envelope"))
    }

    /// [`Reads::claimed_columns`] with the envelope only where it is at most `inline`
    /// bytes (else NULL) and its size beside it as `envelope_bytes`: PostgreSQL's claim,
    /// which reads larger envelopes in pieces (`claim/postgres.rs`).
    pub(crate) fn claimed_columns_inline(&self, inline: usize) -> String {
        let payload = &self.payload;
        self.claimed_columns_with(&format!(
            "CASE WHEN octet_length({payload}) <= {inline} THEN {payload} END AS envelope, \
             octet_length({payload}) AS envelope_bytes"
        ))
    }

    /// The select list with `envelope` for the payload's place. A claimed row is read by
    /// position (`row::Cursor`): this order is `ClaimedRow::read_columns`' order.
    fn claimed_columns_with(&self, envelope: &str) -> String {
        let position = self.position_value(&self.position);
        let mut list = vec![
            aliased(&position, "id"),
            aliased(&self.event_id, "event_id"),
            aliased(&self.event_type, "event_type"),
            aliased(&self.key_text, "room_id"),
            envelope.to_owned(),
        ];
        if let Some(headers) = &self.headers {
            list.push(aliased(headers, "headers"));
        }
        list.push("retry_count".to_owned());
        list.push(aliased(&self.created_at, "created_at"));
        for (index, (expr, _)) in self.extra.iter().enumerate() {
            list.push(format!("{expr} AS extra_{index}"));
        }
        list.join(", ")
    }

    /// The payload as the claim reads it (a text or bytes expression): what the byte
    /// budget measures.
    pub(crate) fn payload(&self) -> &str {
        &self.payload
    }

    /// The headers as text, when the mapping has a headers column.
    pub(crate) fn headers(&self) -> Option<&str> {
        self.headers.as_deref()
    }

    /// The table has a headers column (else claimed rows carry none).
    pub(crate) fn has_headers(&self) -> bool {
        self.headers.is_some()
    }
}

/// The column type a read of `kind` assumes before the table was seen.
fn assumed(dialect: Dialect, kind: ValueKind) -> Kind {
    let integer = Kind::Integer {
        unsigned: false,
        big: true,
    };
    match kind {
        ValueKind::Text => Kind::Other,
        ValueKind::Uuid => Kind::Uuid,
        ValueKind::Integer => integer,
        ValueKind::Boolean if dialect == Dialect::Postgres => Kind::Boolean,
        ValueKind::Boolean => integer,
        ValueKind::Timestamp => Kind::Time { zoned: true },
    }
}

/// Whether a column of type `found` can be read as `kind`.
fn fits(dialect: Dialect, kind: ValueKind, found: Kind) -> bool {
    match kind {
        ValueKind::Text => !matches!(found, Kind::Bytes) || dialect != Dialect::Postgres,
        ValueKind::Uuid => matches!(found, Kind::Uuid | Kind::Text { .. }),
        ValueKind::Integer => matches!(found, Kind::Integer { .. }),
        ValueKind::Boolean => matches!(found, Kind::Boolean | Kind::Integer { .. }),
        ValueKind::Timestamp => {
            matches!(found, Kind::Time { .. })
                || (dialect == Dialect::Sqlite && matches!(found, Kind::Text { .. }))
        }
    }
}

/// How one extra column of type `found` is selected and decoded as `read.kind`.
fn extra_read(dialect: Dialect, read: &ColumnRead, found: Kind) -> (String, Decode) {
    let name = read.column.as_str();
    let text = || match (found, dialect) {
        (Kind::Text { .. }, _) => name.to_owned(),
        (_, Dialect::Postgres) => format!("{name}::text"),
        (_, Dialect::MySql) => format!("CAST({name} AS CHAR)"),
        (_, Dialect::Sqlite) => format!("CAST({name} AS TEXT)"),
    };
    match read.kind {
        ValueKind::Text | ValueKind::Uuid => (text(), Decode::Text),
        ValueKind::Integer => match (dialect, found) {
            (Dialect::Postgres, Kind::Integer { big: true, .. }) => {
                (name.to_owned(), Decode::Integer)
            }
            (Dialect::Postgres, _) => (format!("{name}::bigint"), Decode::Integer),
            (Dialect::MySql, _) => (format!("CAST({name} AS SIGNED)"), Decode::Integer),
            (Dialect::Sqlite, _) => (name.to_owned(), Decode::Integer),
        },
        ValueKind::Boolean => match (dialect, found) {
            (Dialect::Postgres, Kind::Boolean) => (name.to_owned(), Decode::Boolean),
            (Dialect::Postgres, _) => (format!("({name} <> 0)"), Decode::Boolean),
            (Dialect::MySql, _) => (
                format!("CAST(({name} <> 0) AS SIGNED)"),
                Decode::BooleanInteger,
            ),
            (Dialect::Sqlite, _) => (format!("({name} <> 0)"), Decode::BooleanInteger),
        },
        ValueKind::Timestamp => match (dialect, found) {
            (Dialect::Postgres, Kind::Time { zoned: false }) => {
                (format!("({name} AT TIME ZONE 'UTC')"), Decode::Timestamp)
            }
            _ => (name.to_owned(), Decode::Timestamp),
        },
    }
}

/// `expr AS alias`, or just `expr` when it is the column of that name.
fn aliased(expr: &str, alias: &str) -> String {
    if expr == alias {
        expr.to_owned()
    } else {
        format!("{expr} AS {alias}")
    }
}

/// What `setting` needs when the column's type is `kind`; `None` when it fits.
fn expected(dialect: Dialect, setting: ColumnSetting, kind: Kind) -> Option<&'static str> {
    match setting {
        ColumnSetting::Position => (!matches!(kind, Kind::Integer { .. }))
            .then_some("columns.position needs an integer column that grows with each insert"),
        ColumnSetting::Payload => (!matches!(kind, Kind::Text { .. } | Kind::Json | Kind::Bytes))
            .then_some("columns.payload needs a text, JSON or bytes column"),
        ColumnSetting::Headers => (!matches!(kind, Kind::Text { .. } | Kind::Json))
            .then_some("columns.headers needs a text or JSON column (or \"\" for none)"),
        ColumnSetting::CreatedAt => {
            let time = matches!(kind, Kind::Time { .. })
                || (dialect == Dialect::Sqlite && matches!(kind, Kind::Text { .. }));
            (!time).then_some("columns.created_at needs a timestamp column")
        }
        ColumnSetting::EventId | ColumnSetting::EventType | ColumnSetting::Key => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::columns::ColumnName;
    use crate::shape::ShapeColumn;

    fn shape(columns: &[(&str, &str, Kind)]) -> TableShape {
        TableShape {
            columns: columns
                .iter()
                .map(|(name, type_name, kind)| ShapeColumn {
                    name: (*name).to_owned(),
                    type_name: (*type_name).to_owned(),
                    kind: *kind,
                })
                .collect(),
            indexes: Vec::new(),
        }
    }

    fn debezium() -> Columns {
        Columns {
            position: ColumnName::parse("seq").unwrap(),
            event_id: ColumnName::parse("id").unwrap(),
            event_type: ColumnName::parse("type").unwrap(),
            key: ColumnName::parse("aggregateid").unwrap(),
            payload: ColumnName::parse("payload").unwrap(),
            headers: None,
            created_at: ColumnName::parse("created_at").unwrap(),
            extra: Vec::new(),
        }
    }

    #[test]
    fn the_default_mapping_reads_todays_columns_without_casts() {
        for dialect in [Dialect::Postgres, Dialect::MySql, Dialect::Sqlite] {
            let reads = Reads::plain(dialect, &Columns::default());
            assert_eq!(
                reads.claimed_columns(),
                "id, event_id, event_type, room_id, envelope, headers, retry_count, created_at"
            );
            assert_eq!(reads.position_value("MAX(id)"), "MAX(id)");
        }
        assert_eq!(
            Reads::plain(Dialect::Postgres, &Columns::default()).payload_decode,
            PayloadDecode::Text
        );
    }

    #[test]
    fn an_inline_claim_reads_the_envelope_up_to_a_size_and_the_size_beside_it() {
        let reads = Reads::plain(Dialect::Postgres, &Columns::default());
        assert_eq!(
            reads.claimed_columns_inline(1024),
            "id, event_id, event_type, room_id, \
             CASE WHEN octet_length(envelope) <= 1024 THEN envelope END AS envelope, \
             octet_length(envelope) AS envelope_bytes, headers, retry_count, created_at"
        );
    }

    #[test]
    fn other_types_are_cast_to_what_the_driver_decodes() {
        let shape = shape(&[
            ("id", "uuid", Kind::Other),
            ("type", "character varying", Kind::Text { long: false }),
            (
                "aggregateid",
                "character varying",
                Kind::Text { long: false },
            ),
            ("payload", "jsonb", Kind::Json),
            (
                "seq",
                "integer",
                Kind::Integer {
                    unsigned: false,
                    big: false,
                },
            ),
            (
                "created_at",
                "timestamp without time zone",
                Kind::Time { zoned: false },
            ),
        ]);
        let table = TableName::parse("outbox").unwrap();
        let reads = Reads::checked(Dialect::Postgres, &table, &debezium(), &shape).unwrap();
        assert_eq!(
            reads.claimed_columns(),
            "seq::bigint AS id, id::text AS event_id, type AS event_type, aggregateid AS room_id, \
             payload::text AS envelope, retry_count, (created_at AT TIME ZONE 'UTC') AS created_at"
        );
        assert_eq!(reads.position_value("MAX(seq)"), "MAX(seq)::bigint");
        assert!(!reads.has_headers());
    }

    #[test]
    fn every_problem_of_a_mapping_is_reported_with_its_setting() {
        let shape = shape(&[
            ("id", "uuid", Kind::Other),
            ("type", "text", Kind::Text { long: false }),
            ("payload", "numeric", Kind::Other),
            ("seq", "text", Kind::Text { long: false }),
            ("created_at", "text", Kind::Text { long: false }),
        ]);
        let table = TableName::parse("outbox").unwrap();
        let problems = Reads::checked(Dialect::Postgres, &table, &debezium(), &shape).unwrap_err();
        let texts: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert_eq!(
            texts,
            [
                "columns.position: column \"seq\" is text; columns.position needs an integer column that grows with each insert",
                "columns.key: column \"aggregateid\" does not exist in table outbox",
                "columns.payload: column \"payload\" is numeric; columns.payload needs a text, JSON or bytes column",
                "columns.created_at: column \"created_at\" is text; columns.created_at needs a timestamp column",
            ]
        );
    }

    #[test]
    fn sqlite_may_order_by_the_implicit_rowid() {
        let shape = shape(&[
            ("id", "TEXT", Kind::Text { long: false }),
            ("type", "TEXT", Kind::Text { long: false }),
            ("aggregateid", "TEXT", Kind::Text { long: false }),
            ("payload", "BLOB", Kind::Bytes),
            ("created_at", "DATETIME", Kind::Time { zoned: true }),
        ]);
        let table = TableName::parse("outbox").unwrap();
        let columns = Columns {
            position: ColumnName::parse("rowid").unwrap(),
            ..debezium()
        };
        let reads = Reads::checked(Dialect::Sqlite, &table, &columns, &shape).unwrap();
        assert!(reads
            .claimed_columns()
            .starts_with("rowid AS id, id AS event_id"));
        assert!(Reads::checked(Dialect::Postgres, &table, &columns, &shape).is_err());
    }
}
