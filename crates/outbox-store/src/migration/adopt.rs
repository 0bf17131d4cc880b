//! Adopting a producer's existing table: `ALTER TABLE … ADD COLUMN` for each bookkeeping
//! column it lacks (and a missing mapped headers, creation-time or position column), then
//! the relay's indexes. Producer columns and rows are never altered or dropped: existing
//! rows get the new columns' defaults, so they become pending unless the table already
//! had a `status` of its own (the original worker's table keeps its published rows).

use super::create::{indexes, mysql_indexes};
use super::Context;
use crate::columns::{ColumnSetting, MappingError, MappingProblem};
use crate::dialect::Dialect;
use crate::error::Error;
use crate::reads::Reads;
use crate::shape::{Kind, TableShape};

/// SQLite adds no column with a non-constant default (`now`): a time before any row, so
/// an added `available_at` makes every row available at once, as `now` would.
const SQLITE_EPOCH: &str = "'1970-01-01 00:00:00.000'";

/// The statements that make the existing table of `shape` an outbox for `cx.columns`, or
/// every problem of the mapping that `migrate` cannot mend.
pub(super) fn adopt(cx: &Context<'_>, shape: &TableShape) -> Result<Vec<String>, Error> {
    check(cx, shape)?;
    let t = cx.table;
    let dialect = cx.dialect;
    let add = |column: &str, ddl: &str| format!("ALTER TABLE {t} ADD COLUMN {column} {ddl}");
    let mut statements = Vec::new();
    for (column, ddl) in bookkeeping(dialect) {
        if !shape.has(column) {
            statements.push(add(column, ddl));
        }
    }
    statements.extend(mapped_columns(cx, shape));
    match dialect {
        // Built CONCURRENTLY once the rows are numbered, outside any transaction
        // (`online.rs`): a plain CREATE INDEX would block inserts while it reads the table.
        Dialect::Postgres => {}
        Dialect::Sqlite => statements.extend(indexes(cx)),
        // InnoDB builds a secondary index in place while writes go on; a server that
        // cannot refuses the statement rather than locking the table.
        Dialect::MySql => {
            for (name, columns) in mysql_indexes(cx) {
                if !shape.indexes.contains(&name) {
                    statements.push(format!(
                        "CREATE INDEX {name} ON {t} ({columns}) ALGORITHM=INPLACE LOCK=NONE"
                    ));
                }
            }
        }
    }
    Ok(statements)
}

/// The mapped columns `migrate` adds when the table lacks them: headers, created_at and
/// position (with its unique index). Also what a mapping changed after adoption needs
/// ([`super::add_mapped_columns`]).
pub(super) fn mapped_columns(cx: &Context<'_>, shape: &TableShape) -> Vec<String> {
    let t = cx.table;
    let add = |column: &str, ddl: &str| format!("ALTER TABLE {t} ADD COLUMN {column} {ddl}");
    let mut statements = Vec::new();
    if let Some(headers) = &cx.columns.headers {
        if !shape.has(headers.as_str()) {
            statements.push(add(headers.as_str(), "TEXT NULL"));
        }
    }
    let created_at = cx.columns.created_at.as_str();
    if !shape.has(created_at) {
        statements.extend(add_created_at(cx, created_at));
    }
    let position = cx.columns.position.as_str();
    if !shape.has(position) && !cx.rowid_position() {
        match cx.dialect {
            // No rewrite: a nullable column and a sequence default; the existing rows are
            // numbered and the unique index built afterwards (`online.rs`).
            Dialect::Postgres => statements.extend(super::online::add_position(cx, position)),
            Dialect::MySql => {
                statements.push(add(position, "BIGINT NOT NULL AUTO_INCREMENT UNIQUE"));
            }
            // `check` refused it.
            Dialect::Sqlite => {}
        }
    }
    statements
}

/// The mapped columns an adopted table lacks after its mapping changed, or the problems
/// of the mapping that adding them cannot mend.
pub(super) fn changed_mapping(cx: &Context<'_>, shape: &TableShape) -> Result<Vec<String>, Error> {
    check(cx, shape)?;
    Ok(mapped_columns(cx, shape))
}

/// The bookkeeping columns as `ADD COLUMN` writes them, in the order of the relay's table.
fn bookkeeping(dialect: Dialect) -> [(&'static str, &'static str); 7] {
    let (now, time) = match dialect {
        Dialect::Postgres => ("TIMESTAMPTZ NOT NULL DEFAULT now()", "TIMESTAMPTZ NULL"),
        Dialect::MySql => (
            "TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)",
            "TIMESTAMP(6) NULL DEFAULT NULL",
        ),
        Dialect::Sqlite => (
            "DATETIME NOT NULL DEFAULT '1970-01-01 00:00:00.000'",
            "DATETIME NULL",
        ),
    };
    let (status, retry_count) = match dialect {
        Dialect::MySql => (
            "VARCHAR(16) NOT NULL DEFAULT 'pending'",
            "INT NOT NULL DEFAULT 0",
        ),
        Dialect::Postgres | Dialect::Sqlite => (
            "VARCHAR(16) NOT NULL DEFAULT 'pending'",
            "INTEGER NOT NULL DEFAULT 0",
        ),
    };
    [
        ("status", status),
        ("retry_count", retry_count),
        ("last_error", "VARCHAR(512) NULL"),
        ("available_at", now),
        ("locked_by", "VARCHAR(128) NULL"),
        ("locked_until", time),
        ("published_at", time),
    ]
}

/// A creation time that defaults to the insert's time; existing rows get the time of the
/// migration. SQLite: a constant default, then a trigger that writes the insert's time.
fn add_created_at(cx: &Context<'_>, column: &str) -> Vec<String> {
    let t = cx.table;
    match cx.dialect {
        Dialect::Postgres => vec![format!(
            "ALTER TABLE {t} ADD COLUMN {column} TIMESTAMPTZ NOT NULL DEFAULT now()"
        )],
        Dialect::MySql => vec![format!(
            "ALTER TABLE {t} ADD COLUMN {column} TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)"
        )],
        Dialect::Sqlite => {
            let now = "strftime('%Y-%m-%d %H:%M:%f', 'now')";
            vec![
                format!(
                    "ALTER TABLE {t} ADD COLUMN {column} DATETIME NOT NULL DEFAULT {SQLITE_EPOCH}"
                ),
                format!("UPDATE {t} SET {column} = {now}"),
                format!(
                    "CREATE TRIGGER IF NOT EXISTS {t}_{column} AFTER INSERT ON {t} \
                     WHEN NEW.{column} = {SQLITE_EPOCH} \
                     BEGIN UPDATE {t} SET {column} = {now} WHERE rowid = NEW.rowid; END"
                ),
            ]
        }
    }
}

/// The mapping's problems that adopting cannot mend: a missing producer column (event id,
/// type, key, payload), a type that cannot serve its setting, a missing position on
/// SQLite (which cannot add one; `rowid` can serve), a TEXT key on MySQL (no index
/// without a prefix length).
fn check(cx: &Context<'_>, shape: &TableShape) -> Result<(), Error> {
    let mut problems = match Reads::checked(cx.dialect, cx.table, cx.columns, shape) {
        Ok(_) => Vec::new(),
        Err(problems) => problems
            .into_iter()
            .filter(|problem| {
                !(matches!(problem.problem, MappingProblem::Missing { .. })
                    && super::adds(problem.setting)
                    && !(problem.setting == ColumnSetting::Position
                        && cx.dialect == Dialect::Sqlite))
            })
            .map(|mut problem| {
                if problem.setting == ColumnSetting::Position
                    && matches!(problem.problem, MappingProblem::Missing { .. })
                {
                    problem.problem = MappingProblem::Unsupported(
                        "does not exist, and SQLite cannot add an integer column that numbers existing rows; \
                         set columns.position = \"rowid\"",
                    );
                }
                problem
            })
            .collect(),
    };
    if cx.dialect == Dialect::MySql {
        let key = cx.columns.key.as_str();
        if let Some(column) = shape.column(key) {
            if matches!(column.kind, Kind::Text { long: true } | Kind::Bytes) {
                problems.push(MappingError {
                    setting: ColumnSetting::Key,
                    column: key.to_owned(),
                    problem: MappingProblem::Unsupported(
                        "is a TEXT or BLOB column, which MySQL cannot index without a prefix \
                         length; make it a VARCHAR",
                    ),
                });
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::Mapping {
            table: cx.table.clone(),
            problems,
        })
    }
}
