//! [`TableShape`]: a table's columns and their types as the database describes them
//! (PostgreSQL and MySQL: `information_schema.columns` of the current schema; SQLite:
//! `pragma_table_info`), and [`Kind`], what the relay can make of a column's type.
//! Checking a mapping ([`crate::SeaOrmStore::check_columns`]) and adopting an existing
//! table ([`crate::migrate_columns`]) start from it.

use crate::dialect::{Dialect, Params};
use sea_orm::{ConnectionTrait, DbErr};

/// What the relay can make of a column's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// An integer; `unsigned` on MySQL (read through a signed cast).
    Integer {
        /// MySQL's `UNSIGNED`.
        unsigned: bool,
        /// PostgreSQL `bigint`, MySQL `BIGINT`, SQLite `INTEGER`: read as is.
        big: bool,
    },
    /// Character data.
    Text {
        /// MySQL `TEXT`/`LONGTEXT`…: no index without a prefix length.
        long: bool,
    },
    /// A JSON type (PostgreSQL `json`/`jsonb`, MySQL 8 `JSON`).
    Json,
    /// Bytes (`bytea`, `BLOB`, `VARBINARY`, SQLite without a declared type).
    Bytes,
    /// A point in time; `zoned: false` for PostgreSQL's `timestamp without time zone`
    /// (read as UTC).
    Time {
        /// `timestamptz`, or a backend that stores UTC anyway.
        zoned: bool,
    },
    /// A boolean (PostgreSQL `boolean`; MySQL's BOOLEAN is a TINYINT).
    Boolean,
    /// A UUID (PostgreSQL `uuid`, MariaDB `UUID`).
    Uuid,
    /// Anything else (numeric, …).
    Other,
}

/// One column of a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ShapeColumn {
    /// Its name, lowercased.
    pub(crate) name: String,
    /// Its type as the database names it (for messages).
    pub(crate) type_name: String,
    /// What that type is to the relay.
    pub(crate) kind: Kind,
}

/// The columns of one table, in table order, and (MySQL) its index names.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct TableShape {
    /// The columns.
    pub(crate) columns: Vec<ShapeColumn>,
    /// The names of its indexes (MySQL only: PostgreSQL and SQLite say `IF NOT EXISTS`).
    pub(crate) indexes: Vec<String>,
}

impl TableShape {
    /// The column named `name`.
    pub(crate) fn column(&self, name: &str) -> Option<&ShapeColumn> {
        self.columns.iter().find(|column| column.name == name)
    }

    /// The table has a column `name`.
    pub(crate) fn has(&self, name: &str) -> bool {
        self.column(name).is_some()
    }

    /// Reads the shape of `table` on `db`; `None` when there is no such table.
    pub(crate) async fn read<C: ConnectionTrait>(
        db: &C,
        table: &str,
    ) -> Result<Option<TableShape>, DbErr> {
        let dialect = Dialect::of(db);
        let mut params = Params::new(dialect);
        let name = params.bind(table);
        let sql = match dialect {
            Dialect::Postgres => format!(
                "SELECT column_name::text AS name, data_type::text AS type_name, \
                 udt_name::text AS detail FROM information_schema.columns \
                 WHERE table_schema = current_schema() AND table_name = {name} \
                 ORDER BY ordinal_position"
            ),
            Dialect::MySql => format!(
                "SELECT CAST(column_name AS CHAR) AS name, CAST(data_type AS CHAR) AS type_name, \
                 CAST(column_type AS CHAR) AS detail FROM information_schema.columns \
                 WHERE table_schema = DATABASE() AND table_name = {name} \
                 ORDER BY ordinal_position"
            ),
            Dialect::Sqlite => format!(
                "SELECT name, type AS type_name, type AS detail FROM pragma_table_info({name}) \
                 ORDER BY cid"
            ),
        };
        let rows = db.query_all(params.statement(sql)).await?;
        if rows.is_empty() {
            return Ok(None);
        }
        let mut shape = TableShape::default();
        for row in rows {
            let name: String = row.try_get("", "name")?;
            let type_name: String = row.try_get("", "type_name")?;
            let detail: String = row.try_get("", "detail")?;
            shape.columns.push(ShapeColumn {
                name: name.to_lowercase(),
                kind: classify(dialect, &type_name, &detail),
                type_name: if type_name.is_empty() {
                    "untyped".to_owned()
                } else {
                    type_name.to_lowercase()
                },
            });
        }
        if dialect == Dialect::MySql {
            let mut params = Params::new(dialect);
            let name = params.bind(table);
            let rows = db
                .query_all(params.statement(format!(
                    "SELECT DISTINCT CAST(index_name AS CHAR) AS name FROM information_schema.statistics \
                     WHERE table_schema = DATABASE() AND table_name = {name}"
                )))
                .await?;
            for row in rows {
                shape.indexes.push(row.try_get("", "name")?);
            }
        }
        Ok(Some(shape))
    }
}

/// What `type_name` (and `detail`: PostgreSQL's `udt_name`, MySQL's `column_type`, SQLite's
/// declared type) is to the relay.
pub(crate) fn classify(dialect: Dialect, type_name: &str, detail: &str) -> Kind {
    let type_name = type_name.to_lowercase();
    let detail = detail.to_lowercase();
    match dialect {
        Dialect::Postgres => match detail.as_str() {
            "int8" => Kind::Integer {
                unsigned: false,
                big: true,
            },
            "int2" | "int4" => Kind::Integer {
                unsigned: false,
                big: false,
            },
            "text" | "varchar" | "bpchar" | "name" => Kind::Text { long: false },
            "json" | "jsonb" => Kind::Json,
            "bytea" => Kind::Bytes,
            "timestamptz" => Kind::Time { zoned: true },
            "timestamp" => Kind::Time { zoned: false },
            "bool" => Kind::Boolean,
            "uuid" => Kind::Uuid,
            _ => Kind::Other,
        },
        Dialect::MySql => match type_name.as_str() {
            "tinyint" | "smallint" | "mediumint" | "int" | "integer" | "bigint" => Kind::Integer {
                unsigned: detail.contains("unsigned"),
                big: type_name == "bigint",
            },
            "char" | "varchar" => Kind::Text { long: false },
            "tinytext" | "text" | "mediumtext" | "longtext" => Kind::Text { long: true },
            "json" => Kind::Json,
            "binary" | "varbinary" | "tinyblob" | "blob" | "mediumblob" | "longblob" => Kind::Bytes,
            "datetime" | "timestamp" => Kind::Time { zoned: true },
            "uuid" => Kind::Uuid,
            _ => Kind::Other,
        },
        // Declared types by SQLite's affinity rules (https://sqlite.org/datatype3.html),
        // with times (DATETIME, TIMESTAMP, DATE) and JSON told apart from NUMERIC.
        Dialect::Sqlite => {
            if type_name.contains("int") {
                Kind::Integer {
                    unsigned: false,
                    big: true,
                }
            } else if type_name.contains("char")
                || type_name.contains("clob")
                || type_name.contains("text")
            {
                Kind::Text { long: false }
            } else if type_name.is_empty() || type_name.contains("blob") {
                Kind::Bytes
            } else if type_name.contains("json") {
                Kind::Json
            } else if type_name.contains("date") || type_name.contains("time") {
                Kind::Time { zoned: true }
            } else if type_name.contains("bool") {
                Kind::Boolean
            } else {
                Kind::Other
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_types_are_classified_by_their_udt_name() {
        let pg = |t, udt| classify(Dialect::Postgres, t, udt);
        assert_eq!(
            pg("bigint", "int8"),
            Kind::Integer {
                unsigned: false,
                big: true
            }
        );
        assert_eq!(
            pg("integer", "int4"),
            Kind::Integer {
                unsigned: false,
                big: false
            }
        );
        assert_eq!(
            pg("character varying", "varchar"),
            Kind::Text { long: false }
        );
        assert_eq!(pg("jsonb", "jsonb"), Kind::Json);
        assert_eq!(pg("bytea", "bytea"), Kind::Bytes);
        assert_eq!(
            pg("timestamp without time zone", "timestamp"),
            Kind::Time { zoned: false }
        );
        assert_eq!(pg("uuid", "uuid"), Kind::Uuid);
        assert_eq!(pg("boolean", "bool"), Kind::Boolean);
        assert_eq!(pg("numeric", "numeric"), Kind::Other);
    }

    #[test]
    fn mysql_types_are_classified_by_data_type_and_column_type() {
        let my = |t, c| classify(Dialect::MySql, t, c);
        assert_eq!(
            my("bigint", "bigint(20) unsigned"),
            Kind::Integer {
                unsigned: true,
                big: true
            }
        );
        assert_eq!(my("longtext", "longtext"), Kind::Text { long: true });
        assert_eq!(my("varchar", "varchar(255)"), Kind::Text { long: false });
        assert_eq!(my("json", "json"), Kind::Json);
        assert_eq!(my("blob", "blob"), Kind::Bytes);
        assert_eq!(my("datetime", "datetime(6)"), Kind::Time { zoned: true });
        assert_eq!(my("decimal", "decimal(10,2)"), Kind::Other);
    }

    #[test]
    fn sqlite_types_are_classified_by_affinity() {
        let lite = |t| classify(Dialect::Sqlite, t, t);
        assert!(matches!(lite("INTEGER"), Kind::Integer { .. }));
        assert!(matches!(lite("BIGINT"), Kind::Integer { .. }));
        assert_eq!(lite("VARCHAR(64)"), Kind::Text { long: false });
        assert_eq!(lite("TEXT"), Kind::Text { long: false });
        assert_eq!(lite("BLOB"), Kind::Bytes);
        assert_eq!(lite(""), Kind::Bytes);
        assert_eq!(lite("DATETIME"), Kind::Time { zoned: true });
        assert_eq!(lite("JSON"), Kind::Json);
        assert_eq!(lite("REAL"), Kind::Other);
    }
}
