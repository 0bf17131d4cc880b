//! Whether the connected role may do what the relay does to its tables: read and update
//! the outbox (and delete from it, with retention), and lock its `<table>_lock` row for
//! claims. Asked at start so that a missing grant is named, with the statement that gives
//! it, instead of failing the first claim (docs/security.md#database-privileges).
//!
//! PostgreSQL answers from its catalogue (`has_table_privilege`); MySQL and MariaDB by
//! statements that touch no row (`WHERE 1 = 0`), which they refuse with error 1142 when
//! the privilege is missing; SQLite has no privileges (its file's permissions decide).

use crate::dialect::Dialect;
use crate::error::Error;
use crate::sql::TableName;
use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, RuntimeErr, Statement};

/// A privilege the relay needs and the connected role lacks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingPrivilege {
    /// The role, as the database names it (`relay`, `'relay'@'%'`).
    pub role: String,
    /// `SELECT`, `UPDATE`, `DELETE`.
    pub privilege: &'static str,
    /// The table, qualified by its schema or database (`public.orders_outbox`).
    pub table: String,
}

impl std::fmt::Display for MissingPrivilege {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Self {
            role,
            privilege,
            table,
        } = self;
        write!(
            f,
            "role {role} lacks {privilege} on {table} (GRANT {privilege} ON {table} TO {role})"
        )
    }
}

/// What the relay does to each of its tables: `(suffix of the table's name, privileges)`.
fn needs(delete: bool) -> Vec<(&'static str, Vec<&'static str>)> {
    let mut outbox = vec!["SELECT", "UPDATE"];
    if delete {
        outbox.push("DELETE");
    }
    // Claims lock the row of `<table>_lock` (`SELECT … FOR UPDATE`).
    vec![("", outbox), ("_lock", vec!["SELECT", "UPDATE"])]
}

/// The privileges that `run` needs on `table` and its `<table>_lock` and the connected
/// role lacks (`delete`: the relay deletes old rows, `relay.retention`). A table that
/// does not exist is skipped: that is for [`crate::SeaOrmStore::check_columns`] or
/// `migrate` to say.
pub async fn missing_privileges(
    db: &DatabaseConnection,
    table: &TableName,
    delete: bool,
) -> Result<Vec<MissingPrivilege>, Error> {
    let mut missing = Vec::new();
    match Dialect::of(db) {
        Dialect::Sqlite => {}
        Dialect::Postgres => {
            for (suffix, privileges) in needs(delete) {
                let name = format!("{table}{suffix}");
                missing.extend(postgres(db, &name, &privileges).await?);
            }
        }
        Dialect::MySql => {
            let role = mysql_role(db).await?;
            for (suffix, privileges) in needs(delete) {
                let name = format!("{table}{suffix}");
                missing.extend(mysql(db, &role, &name, &privileges).await?);
            }
        }
    }
    Ok(missing)
}

/// PostgreSQL: the catalogue's answer for `name` as the search path finds it.
async fn postgres(
    db: &DatabaseConnection,
    name: &str,
    privileges: &[&'static str],
) -> Result<Vec<MissingPrivilege>, Error> {
    // `has_any_column_privilege`: a grant on the table or on some of its columns (what
    // a role given `UPDATE (status, …)` has), as the statements need no more.
    let checks: Vec<String> = privileges
        .iter()
        .map(|privilege| match *privilege {
            "DELETE" => "has_table_privilege(c.oid, 'DELETE')".to_owned(),
            other => format!("has_any_column_privilege(c.oid, '{other}')"),
        })
        .enumerate()
        .map(|(index, check)| format!("{check} AS p{index}"))
        .collect();
    let sql = format!(
        "SELECT current_user::text AS role, quote_ident(n.nspname) || '.' || \
         quote_ident(c.relname) AS qualified, {} FROM pg_class c \
         JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)",
        checks.join(", ")
    );
    let statement = Statement::from_sql_and_values(db.get_database_backend(), sql, [name.into()]);
    let Some(row) = db.query_one(statement).await? else {
        return Ok(Vec::new());
    };
    let role: String = row.try_get("", "role")?;
    let table: String = row.try_get("", "qualified")?;
    let mut missing = Vec::new();
    for (index, privilege) in privileges.iter().enumerate() {
        let granted: bool = row.try_get("", &format!("p{index}"))?;
        if !granted {
            missing.push(MissingPrivilege {
                role: role.clone(),
                privilege,
                table: table.clone(),
            });
        }
    }
    Ok(missing)
}

/// MySQL and MariaDB: `CURRENT_USER()` (the account the grants are checked against) as
/// `GRANT` writes it, `'relay'@'%'`.
async fn mysql_role(db: &DatabaseConnection) -> Result<String, Error> {
    let sql = "SELECT CURRENT_USER() AS role";
    let statement = Statement::from_string(db.get_database_backend(), sql);
    let role: String = match db.query_one(statement).await? {
        Some(row) => row.try_get("", "role")?,
        None => String::new(),
    };
    Ok(match role.rsplit_once('@') {
        Some((user, host)) => format!("'{user}'@'{host}'"),
        None => role,
    })
}

/// MySQL and MariaDB: each privilege tried with a statement that touches no row.
async fn mysql(
    db: &DatabaseConnection,
    role: &str,
    name: &str,
    privileges: &[&'static str],
) -> Result<Vec<MissingPrivilege>, Error> {
    // Bookkeeping columns every migrated table has: `status`, and the lock's `name`.
    let column = if name.ends_with("_lock") {
        "name"
    } else {
        "status"
    };
    let mut missing = Vec::new();
    for privilege in privileges {
        let sql = match *privilege {
            "SELECT" => format!("SELECT 1 FROM {name} WHERE 1 = 0"),
            "UPDATE" => format!("UPDATE {name} SET {column} = {column} WHERE 1 = 0"),
            _ => format!("DELETE FROM {name} WHERE 1 = 0"),
        };
        match db.execute_unprepared(&sql).await {
            Ok(_) => {}
            Err(error) => match mysql_number(&error) {
                // Denied: the privilege, or (for a role that sees nothing of it) the table.
                Some(1142 | 1143) => missing.push(MissingPrivilege {
                    role: role.to_owned(),
                    privilege,
                    table: format!("{}.{name}", mysql_database(db).await?),
                }),
                // No such table or column: not migrated yet, said elsewhere.
                Some(1146 | 1054) => return Ok(missing),
                _ => return Err(error.into()),
            },
        }
    }
    Ok(missing)
}

/// The current database, for a qualified table name in a `GRANT`.
async fn mysql_database(db: &DatabaseConnection) -> Result<String, Error> {
    let statement = Statement::from_string(db.get_database_backend(), "SELECT DATABASE() AS db");
    Ok(match db.query_one(statement).await? {
        Some(row) => row.try_get::<Option<String>>("", "db")?.unwrap_or_default(),
        None => String::new(),
    })
}

/// The MySQL error number of a refused statement.
fn mysql_number(error: &DbErr) -> Option<u16> {
    let (DbErr::Exec(RuntimeErr::SqlxError(error)) | DbErr::Query(RuntimeErr::SqlxError(error))) =
        error
    else {
        return None;
    };
    let database = error.as_database_error()?;
    database
        .try_downcast_ref::<sea_orm::sqlx::mysql::MySqlDatabaseError>()
        .map(|error| error.number())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_privilege_names_the_role_the_table_and_the_grant() {
        let missing = MissingPrivilege {
            role: "relay".into(),
            privilege: "UPDATE",
            table: "public.orders_outbox".into(),
        };
        assert_eq!(
            missing.to_string(),
            "role relay lacks UPDATE on public.orders_outbox \
             (GRANT UPDATE ON public.orders_outbox TO relay)"
        );
    }

    #[test]
    fn delete_is_needed_only_with_retention() {
        assert_eq!(needs(false)[0].1, vec!["SELECT", "UPDATE"]);
        assert_eq!(needs(true)[0].1, vec!["SELECT", "UPDATE", "DELETE"]);
        assert_eq!(needs(true)[1].0, "_lock");
    }
}
