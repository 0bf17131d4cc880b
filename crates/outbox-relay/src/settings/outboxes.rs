//! `[[outboxes]]` and `[database.columns]`: from the entries as written to one
//! [`OutboxConfig`] each, blank keys filled in from the top-level sections. Every problem is
//! reported at once, each naming its outbox (`outboxes[1] (orders): table: …`).

use super::check::{Report, Section};
use super::config::{DatabaseConfig, OutboxConfig};
use super::shape::{AmqpSection, ColumnsSettings, HeaderColumnSettings, OutboxSettings, Settings};
use super::validate::url_setting;
use super::ConfigError;
use crate::secrets::{self, PasswordKeys};
use outbox_amqp::{AmqpSettings, Routing};
use outbox_core::{ExtraColumns, Ordering, PublishedRows, RelayOptions, Router, ValueKind};
use outbox_store::{ColumnName, Columns, TableName};
use std::sync::Arc;

/// The schemes a database URL may have.
pub(super) const DATABASE_SCHEMES: &[&str] =
    &["sqlite", "postgres", "postgresql", "mysql", "mariadb"];

/// The headers the relay sets itself, which `key_header` may not name.
const OWN_HEADERS: [&str; 3] = ["outbox_id", "retry_count", "node_id"];

/// The validated top-level sections an outbox inherits from.
pub(super) struct Inherited<'a> {
    pub(super) database: &'a DatabaseConfig,
    pub(super) amqp: &'a AmqpSettings,
    pub(super) relay: &'a RelayOptions,
}

/// Every outbox of `settings`: its `[[outboxes]]`, or the one of `database.table`.
pub(super) fn validate(
    settings: &Settings,
    inherited: &Inherited<'_>,
    report: &mut Report,
) -> Option<Vec<OutboxConfig>> {
    if settings.outboxes.is_empty() {
        let database = inherited.database;
        return Some(vec![OutboxConfig {
            name: database.table.to_string(),
            table: database.table.clone(),
            database_url: database.url.clone(),
            redacted_database_url: database.redacted_url.clone(),
            columns: Columns {
                extra: inherited.amqp.extra.reads().to_vec(),
                ..database.columns.clone()
            },
            routing: Arc::new(inherited.amqp.routing()),
            ordering: inherited.relay.ordering,
            publishers: inherited.relay.publishers,
            published_rows: inherited.relay.published_rows,
        }]);
    }
    let errors_before = report.errors.len();
    let mut outboxes = Vec::new();
    // (label, name, table, database URL) of the entries before, as written.
    let mut seen: Vec<(String, &str, &str, &str)> = Vec::new();
    for (index, entry) in settings.outboxes.iter().enumerate() {
        let name = match entry.name.trim() {
            "" => entry.table.trim(),
            name => name,
        };
        let label = format!("outboxes[{index}] ({name})");
        let mut problems = Vec::new();
        outboxes.push(entry.validate(name, settings, inherited, &mut problems));
        let (table, url) = (entry.table.trim(), entry.database_url.trim());
        let url = if url.is_empty() {
            settings.database.url.trim()
        } else {
            url
        };
        for (earlier, earlier_name, earlier_table, earlier_url) in &seen {
            if *earlier_name == name {
                problems.push(format!(
                    "name: {name:?} is also the name of {earlier}; names must be unique"
                ));
            }
            if *earlier_table == table && *earlier_url == url && !table.is_empty() {
                problems.push(format!(
                    "table: {table} of the same database is also the table of {earlier}; \
                     each table is relayed by one outbox"
                ));
            }
        }
        for problem in problems {
            report.errors.push(ConfigError::Outbox {
                outbox: label.clone(),
                problem,
            });
        }
        seen.push((label, name, table, url));
    }
    if report.errors.len() > errors_before {
        return None;
    }
    outboxes.into_iter().collect()
}

impl OutboxSettings {
    /// This entry with its blanks filled in; records every problem in `problems`.
    fn validate(
        &self,
        name: &str,
        settings: &Settings,
        inherited: &Inherited<'_>,
        problems: &mut Vec<String>,
    ) -> Option<OutboxConfig> {
        let valid_name = valid_name(name);
        if !valid_name {
            problems.push(format!(
                "name: {name:?} is invalid: use lowercase letters, digits, '_', '.' and '-'"
            ));
        }
        let table = match self.table.trim() {
            "" => {
                problems.push("table: required (the outbox table)".into());
                None
            }
            table => TableName::parse(table)
                .map_err(|error| problems.push(format!("table: {error}")))
                .ok(),
        };
        let url = self.database_url(inherited.database, problems);
        let columns = outbox_columns(&settings.database.columns, &self.columns, problems);
        let routing = self.routing(&settings.amqp, inherited.amqp, problems);
        let ordering = match self.ordering.trim() {
            "" => Some(inherited.relay.ordering),
            text => match super::field::Field::<Ordering>::new(text).parsed() {
                Ok(ordering) => Some(*ordering),
                Err(accepted) => {
                    problems.push(format!("ordering: {text:?} is invalid: {accepted}"));
                    None
                }
            },
        };
        let published_rows = match self.published_rows.trim() {
            "" => Some(inherited.relay.published_rows),
            text => match super::field::Field::<PublishedRows>::new(text).parsed() {
                Ok(rows) => Some(*rows),
                Err(accepted) => {
                    problems.push(format!("published_rows: {text:?} is invalid: {accepted}"));
                    None
                }
            },
        };
        let publishers = match self.publishers {
            0 => inherited.relay.publishers,
            n if n < 0 => {
                problems.push(format!(
                    "publishers: {n} is invalid: a whole number from 1 up, or 0 for relay.publishers"
                ));
                return None;
            }
            n => usize::try_from(n).unwrap_or(usize::MAX),
        };
        let (database_url, redacted_database_url) = url?;
        valid_name.then_some(())?;
        let routing = routing?;
        let columns = Columns {
            extra: routing.extra.reads().to_vec(),
            ..columns?
        };
        Some(OutboxConfig {
            name: name.to_owned(),
            table: table?,
            database_url,
            redacted_database_url,
            columns,
            routing: Arc::new(routing),
            ordering: ordering?,
            publishers,
            published_rows: published_rows?,
        })
    }

    /// Its database URL (blank: `database.url`, with `database.password(_file)` in it),
    /// with its own `database_password(_file)` put in. `database.password` is never put
    /// into an entry's own URL: that is another database, with its own credentials.
    fn database_url(
        &self,
        database: &DatabaseConfig,
        problems: &mut Vec<String>,
    ) -> Option<(String, String)> {
        let own_password =
            !self.database_password.is_empty() || !self.database_password_file.trim().is_empty();
        if self.database_url.trim().is_empty() {
            if own_password {
                problems.push(
                    "database_password is set, but database_url is blank: this outbox uses \
                     database.url, whose password is database.password (or \
                     database.password_file); give the entry its own database_url, or leave \
                     database_password and database_password_file empty"
                        .into(),
                );
                return None;
            }
            return Some((database.url.clone(), database.redacted_url.clone()));
        }
        let url = url_setting("database_url", self.database_url.trim(), DATABASE_SCHEMES)
            .map_err(|error| problems.push(error.to_string()))
            .ok()?;
        let keys = PasswordKeys {
            url: "database_url".into(),
            password: "database_password".into(),
            file: "database_password_file".into(),
        };
        secrets::with_password(
            &keys,
            url,
            &self.database_password,
            &self.database_password_file,
        )
        .map_err(|error| problems.push(error.to_string()))
        .ok()
    }

    /// Its routing: `[amqp]` with this entry's non-blank keys over it.
    fn routing(
        &self,
        section: &AmqpSection,
        amqp: &AmqpSettings,
        problems: &mut Vec<String>,
    ) -> Option<Routing> {
        let pick = |own: &str, top: &str| match own.trim() {
            "" => top.to_owned(),
            own => own.to_owned(),
        };
        let merged = AmqpSection {
            exchange: pick(&self.exchange, &section.exchange),
            exchange_type: pick(&self.exchange_type, &section.exchange_type),
            routing_key: pick(&self.routing_key, &section.routing_key),
            key_header: pick(&self.key_header, &amqp.key_header),
            content_type: pick(&self.content_type, &section.content_type),
            content_type_column: match self.content_type_column.trim() {
                "-" => String::new(),
                _ => pick(&self.content_type_column, &section.content_type_column),
            },
            routes: self
                .routes
                .clone()
                .unwrap_or_else(|| section.routes.clone()),
            header_columns: self
                .header_columns
                .clone()
                .unwrap_or_else(|| section.header_columns.clone()),
            ..section.clone()
        };
        // The same checks as [amqp], keys named without the section.
        let mut report = Report::default();
        let routing = merged.routing(&mut report.section(""));
        problems.extend(report.errors.iter().map(ToString::to_string));
        routing
    }
}

impl AmqpSection {
    /// `router`, `exchange_type` and `key_header`, checked.
    pub(super) fn routing(&self, check: &mut Section<'_>) -> Option<Routing> {
        let exchange_type = match self.exchange_type.as_str() {
            "topic" | "direct" | "fanout" | "headers" => Some(()),
            custom if custom.starts_with("x-") => Some(()),
            other => check.reject(
                "exchange_type",
                other,
                "one of \"topic\", \"direct\", \"fanout\", \"headers\" or a plugin type \"x-…\"",
            ),
        };
        let key_header = match self.key_header.trim() {
            header if header.is_empty() || header.len() > 255 => check.reject(
                "key_header",
                &self.key_header,
                "a header name of 1 to 255 bytes, such as \"room_id\"",
            ),
            header if OWN_HEADERS.contains(&header) => check.reject(
                "key_header",
                &self.key_header,
                format!(
                    "a header name other than the relay's own ({})",
                    OWN_HEADERS.join(", ")
                ),
            ),
            header => Some(header.to_owned()),
        };
        let router = self.router(check);
        let content_type = match self.content_type.trim() {
            "" => check.reject(
                "content_type",
                &self.content_type,
                "a MIME type such as \"application/json\"",
            ),
            text if text.len() > 255 => check.reject(
                "content_type",
                text,
                "at most 255 bytes (an AMQP short string)",
            ),
            text => Some(text.to_owned()),
        };
        exchange_type?;
        let (router, key_header) = (router?, key_header?);
        let extra = self.extra_columns(&router, &key_header, check)?;
        Some(Routing {
            router,
            exchange_type: self.exchange_type.clone(),
            key_header,
            content_type: Some(content_type?),
            extra,
        })
    }

    /// The columns `router`, `header_columns` and `content_type_column` read beyond the
    /// mapping; each header name checked (not the relay's own, nor `key_header`).
    fn extra_columns(
        &self,
        router: &Router,
        key_header: &str,
        check: &mut Section<'_>,
    ) -> Option<ExtraColumns> {
        let mut extra = ExtraColumns::default();
        let mut valid = true;
        for column in router.columns() {
            extra.read(
                column,
                ValueKind::Text,
                "routing (a {column} placeholder or a route's column)",
            );
        }
        for (header, entry) in &self.header_columns {
            let key = format!("header_columns.{header}");
            let (column, kind) = match entry {
                HeaderColumnSettings::Column(column) => (column.as_str(), ""),
                HeaderColumnSettings::Typed { column, kind } => (column.as_str(), kind.trim()),
            };
            if header.is_empty() || header.len() > 255 {
                valid = false;
                check.reject::<()>(&key, header, "a header name of 1 to 255 bytes");
                continue;
            }
            if OWN_HEADERS.contains(&header.as_str()) || header == key_header {
                valid = false;
                check.reject::<()>(
                        &key,
                        header,
                        format!(
                            "a header name other than the relay's own ({}, and key_header {key_header:?})",
                            OWN_HEADERS.join(", ")
                        ),
                    );
                continue;
            }
            if let Err(error) = ColumnName::parse(column.trim()) {
                valid = false;
                check.reject::<()>(&key, column, error.to_string());
                continue;
            }
            let kind = match kind {
                "" => ValueKind::Text,
                kind => match kind.parse::<ValueKind>() {
                    Ok(kind) => kind,
                    Err(why) => {
                        valid = false;
                        check.reject::<()>(&format!("{key}.type"), kind, why);
                        continue;
                    }
                },
            };
            extra.add_header(header, column.trim(), kind);
        }
        match self.content_type_column.trim() {
            "" => {}
            column => match ColumnName::parse(column) {
                Ok(_) => extra.set_content_type_column(column),
                Err(error) => {
                    valid = false;
                    check.reject::<()>("content_type_column", column, error.to_string());
                }
            },
        }
        valid.then_some(extra)
    }
}

/// `[a-z0-9_.-]+`.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '.' | '-'))
}

/// `[database.columns]` as a mapping; problems are recorded under `database.columns.*`.
pub(super) fn database_columns(
    columns: &ColumnsSettings,
    check: &mut Section<'_>,
) -> Option<Columns> {
    let mut problems = Vec::new();
    let mapping = mapping(columns, &mut problems);
    for problem in problems {
        check.take::<()>(Err(ConfigError::Outbox {
            outbox: "database".into(),
            problem,
        }));
    }
    mapping
}

/// An outbox's mapping: its own keys over `[database.columns]`.
fn outbox_columns(
    top: &ColumnsSettings,
    own: &super::shape::OutboxColumnsSettings,
    problems: &mut Vec<String>,
) -> Option<Columns> {
    let pick = |own: &Option<String>, top: &String| own.clone().unwrap_or_else(|| top.clone());
    let merged = ColumnsSettings {
        position: pick(&own.position, &top.position),
        event_id: pick(&own.event_id, &top.event_id),
        event_type: pick(&own.event_type, &top.event_type),
        key: pick(&own.key, &top.key),
        payload: pick(&own.payload, &top.payload),
        headers: pick(&own.headers, &top.headers),
        created_at: pick(&own.created_at, &top.created_at),
    };
    mapping(&merged, problems)
}

/// The mapping `columns` names: each name valid, then `Columns::validate`.
fn mapping(columns: &ColumnsSettings, problems: &mut Vec<String>) -> Option<Columns> {
    let before = problems.len();
    let mut column = |key: &str, name: &str| match ColumnName::parse(name.trim()) {
        Ok(column) => Some(column),
        Err(error) => {
            problems.push(format!("columns.{key}: {error}"));
            None
        }
    };
    let position = column("position", &columns.position);
    let event_id = column("event_id", &columns.event_id);
    let event_type = column("event_type", &columns.event_type);
    let key = column("key", &columns.key);
    let payload = column("payload", &columns.payload);
    let headers = match columns.headers.trim() {
        "" => Some(None),
        name => column("headers", name).map(Some),
    };
    let created_at = column("created_at", &columns.created_at);
    if problems.len() > before {
        return None;
    }
    let mapping = Columns {
        position: position?,
        event_id: event_id?,
        event_type: event_type?,
        key: key?,
        payload: payload?,
        headers: headers?,
        created_at: created_at?,
        extra: Vec::new(),
    };
    match mapping.validate() {
        Ok(()) => Some(mapping),
        Err(errors) => {
            problems.extend(errors.iter().map(ToString::to_string));
            None
        }
    }
}
