//! `[[outboxes]]` and `[database.columns]`: inheritance from the top-level sections, and
//! every problem reported at once naming its outbox.

use super::load;
use outbox_core::Ordering;

#[test]
fn without_entries_there_is_one_outbox_named_after_the_table() {
    let config = load("", &[]).unwrap();
    assert_eq!(config.outboxes.len(), 1);
    let outbox = &config.outboxes[0];
    assert_eq!(outbox.name, "room_outbox");
    assert_eq!(outbox.table.as_str(), "room_outbox");
    assert_eq!(outbox.columns, outbox_store::Columns::default());
    assert_eq!(outbox.routing.key_header, "room_id");
    assert_eq!(outbox.routing.router.exchange.to_string(), "room.events");
    assert_eq!(outbox.database_url, config.database.url);
    assert_eq!(outbox.publishers, config.relay.publishers);
    assert_eq!(config.relay.outbox, "room_outbox");
    assert_eq!(config.amqp.topology.len(), 1);
}

#[test]
fn the_top_level_mapping_and_key_header_apply_to_the_one_outbox() {
    let config = load(
        "[database]\ntable = \"outbox\"\n[database.columns]\nkey = \"aggregateid\"\nheaders = \"\"\n\
         [amqp]\nkey_header = \"aggregate\"",
        &[],
    )
    .unwrap();
    let outbox = &config.outboxes[0];
    assert_eq!(outbox.name, "outbox");
    assert_eq!(outbox.columns.key.as_str(), "aggregateid");
    assert_eq!(outbox.columns.headers, None, "blank: no headers column");
    assert_eq!(outbox.columns.payload.as_str(), "envelope");
    assert_eq!(outbox.routing.key_header, "aggregate");
    assert_eq!(config.database.columns, outbox.columns);
}

#[test]
fn blank_keys_of_an_entry_inherit_the_top_level_values() {
    let config = load(
        r#"
[database]
url = "postgres://relay:topsecret@db/app"
[database.columns]
payload = "body"
[amqp]
exchange = "top.events"
key_header = "tenant"
[relay]
publishers = 3
ordering = "none"

[[outboxes]]
table = "orders_outbox"

[[outboxes]]
name = "rooms"
table = "room_outbox"
database_url = "postgres://other@db2/app2"
exchange = "rooms.events"
exchange_type = "fanout"
routing_key = "{room_id}"
key_header = "room"
ordering = "per_room"
publishers = 2
routes = [ { event_type = "room.#", exchange = "room.special" } ]
[outboxes.columns]
key = "aggregateid"
"#,
        &[],
    )
    .unwrap();
    assert_eq!(config.outboxes.len(), 2);
    let (orders, rooms) = (&config.outboxes[0], &config.outboxes[1]);
    assert_eq!(orders.name, "orders_outbox", "blank name: the table");
    assert_eq!(orders.database_url, "postgres://relay:topsecret@db/app");
    assert_eq!(orders.columns.payload.as_str(), "body");
    assert_eq!(orders.routing.router.exchange.to_string(), "top.events");
    assert_eq!(orders.routing.exchange_type, "topic");
    assert_eq!(orders.routing.key_header, "tenant");
    assert_eq!(orders.ordering, Ordering::None);
    assert_eq!(orders.publishers, 3);

    assert_eq!(rooms.name, "rooms");
    assert_eq!(rooms.redacted_database_url, "postgres://other@db2/app2");
    assert_eq!(rooms.columns.key.as_str(), "aggregateid");
    assert_eq!(
        rooms.columns.payload.as_str(),
        "body",
        "absent key: [database.columns]"
    );
    assert_eq!(rooms.routing.router.exchange.to_string(), "rooms.events");
    assert_eq!(rooms.routing.router.routes.len(), 1);
    assert_eq!(rooms.routing.exchange_type, "fanout");
    assert_eq!(rooms.routing.key_header, "room");
    assert_eq!(rooms.ordering, Ordering::PerRoom);
    assert_eq!(rooms.publishers, 2);

    assert_eq!(config.amqp.topology.len(), 2, "every outbox's exchanges");
    assert_eq!(config.relay.outbox, "orders_outbox", "the first outbox's");
    assert_eq!(config.relay.ordering, Ordering::None);
    assert_eq!(config.outbox_names(), ["orders_outbox", "rooms"]);
    assert!(config.select_outboxes(Some("rooms")).is_ok());
    let unknown = config.select_outboxes(Some("nope")).unwrap_err();
    assert!(unknown.contains("orders_outbox, rooms"), "{unknown}");
    // Where the start waits: each database once, masked.
    assert_eq!(
        config.redacted_database_urls(None),
        "postgres://relay:***@db/app, postgres://other@db2/app2"
    );
    assert_eq!(
        config.redacted_database_urls(Some("rooms")),
        "postgres://other@db2/app2"
    );
}

#[test]
fn every_problem_of_every_entry_is_reported_naming_the_outbox() {
    let error = load(
        r#"
[[outboxes]]
name = "orders"
table = "Orders"
[outboxes.columns]
key = "Aggregate Id"

[[outboxes]]
name = "orders"
table = "orders_outbox"
ordering = "global"
[outboxes.columns]
payload = "status"

[[outboxes]]
name = "copy"
table = "orders_outbox"

[[outboxes]]
name = "Bad Name"
table = "x"
routing_key = "{no pe}"
"#,
        &[],
    )
    .unwrap_err();
    let lines: Vec<&str> = error.lines().collect();
    for expected in [
        "outboxes[0] (orders): table: invalid table name \"Orders\"",
        "outboxes[0] (orders): columns.key: invalid column name \"Aggregate Id\"",
        "outboxes[1] (orders): ordering: \"global\" is invalid",
        "outboxes[1] (orders): columns.payload: column \"status\" is one of the relay's bookkeeping columns",
        "outboxes[2] (copy): table: orders_outbox of the same database is also the table of outboxes[1] (orders)",
        "outboxes[3] (Bad Name): name: \"Bad Name\" is invalid",
        "outboxes[3] (Bad Name): routing_key",
    ] {
        assert!(
            lines.iter().any(|line| line.starts_with(expected)),
            "missing {expected:?} in:\n{error}"
        );
    }
}

#[test]
fn duplicate_names_are_rejected() {
    let error = load(
        "[[outboxes]]\nname = \"a\"\ntable = \"t1\"\n[[outboxes]]\nname = \"a\"\ntable = \"t2\"",
        &[],
    )
    .unwrap_err();
    assert!(
        error.contains("outboxes[1] (a): name: \"a\" is also the name of outboxes[0] (a)"),
        "{error}"
    );
}

#[test]
fn a_table_is_required_and_unknown_keys_are_rejected() {
    let error = load("[[outboxes]]\nname = \"a\"", &[]).unwrap_err();
    assert!(
        error.contains("outboxes[0] (a): table: required"),
        "{error}"
    );
    let error = load("[[outboxes]]\ntable = \"a\"\ntabel = \"b\"", &[]).unwrap_err();
    assert!(error.contains("tabel"), "{error}");
    let error = load(
        "[[outboxes]]\ntable = \"a\"\n[outboxes.columns]\nkeys = \"k\"",
        &[],
    )
    .unwrap_err();
    assert!(error.contains("keys"), "{error}");
}

#[test]
fn the_top_level_mapping_is_checked_too() {
    let error = load(
        "[database.columns]\nkey = \"event_id\"\nposition = \"Id\"\n[amqp]\nkey_header = \"node_id\"",
        &[],
    )
    .unwrap_err();
    assert!(
        error.contains("database: columns.position: invalid column name \"Id\""),
        "{error}"
    );
    assert!(error.contains("amqp.key_header"), "{error}");
    let error = load("[database.columns]\nkey = \"event_id\"", &[]).unwrap_err();
    assert!(
        error.contains(
            "database: columns.key: column \"event_id\" is already named by columns.event_id"
        ),
        "{error}"
    );
}

#[test]
fn an_outbox_database_password_is_redacted_and_scrubbed() {
    let config = load(
        "[[outboxes]]\ntable = \"a\"\ndatabase_url = \"postgres://relay:hunter2@db/app\"",
        &[],
    )
    .unwrap();
    let outbox = &config.outboxes[0];
    assert_eq!(outbox.redacted_database_url, "postgres://relay:***@db/app");
    assert!(!format!("{outbox:?}").contains("hunter2"));
    assert!(!format!("{config:?}").contains("hunter2"));
    let shown = toml::to_string(&config.effective).unwrap();
    assert!(
        !shown.contains("hunter2") && shown.contains("***"),
        "{shown}"
    );
    assert_eq!(
        config.secrets.scrub("at postgres://relay:hunter2@db/app"),
        "at postgres://relay:***@db/app"
    );
}

#[test]
fn the_database_password_stays_with_database_url_and_an_outbox_has_its_own() {
    let config = load(
        "[database]\nurl = \"postgres://relay@db/app\"\npassword = \"s3cret\"\n\
         [[outboxes]]\ntable = \"a\"\n\
         [[outboxes]]\ntable = \"b\"\ndatabase_url = \"mysql://app@maria/other\"\n\
         [[outboxes]]\nname = \"orders\"\ntable = \"c\"\ndatabase_url = \"postgres://relay@db2/x\"",
        &[
            ("OUTBOX_RELAY__OUTBOXES__1__DATABASE_PASSWORD", "0123456789"),
            ("OUTBOX_RELAY__OUTBOXES__ORDERS__DATABASE_PASSWORD", "true"),
        ],
    )
    .unwrap();
    assert_eq!(
        config.outboxes[0].database_url, "postgres://relay:s3cret@db/app",
        "no URL of its own: database.url, with database.password"
    );
    assert_eq!(
        config.outboxes[1].database_url,
        "mysql://app:0123456789@maria/other"
    );
    assert_eq!(
        config.outboxes[2].database_url,
        "postgres://relay:true@db2/x"
    );
    // Longer than any process id, which the default node_id holds.
    let shown = format!("{config:?}{}", toml::to_string(&config.effective).unwrap());
    assert!(
        !shown.contains("0123456789") && !shown.contains(":true@"),
        "{shown}"
    );
}

#[test]
fn an_outbox_password_needs_a_url_of_its_own_naming_a_user() {
    let error = load(
        "[[outboxes]]\ntable = \"a\"\ndatabase_password = \"pw-of-a\"\n\
         [[outboxes]]\ntable = \"b\"\ndatabase_url = \"mysql://maria/other\"",
        &[("OUTBOX_RELAY__OUTBOXES__1__DATABASE_PASSWORD", "pw-of-b")],
    )
    .unwrap_err();
    assert!(
        error.contains("outboxes[0] (a): database_password is set, but database_url is blank"),
        "{error}"
    );
    assert!(
        error.contains(
            "outboxes[1] (b): database_url = \"mysql://maria/other\" is invalid: a URL that \
             names the user"
        ),
        "{error}"
    );
    assert!(!error.contains("pw-of"), "{error}");
}

#[test]
fn a_bad_value_of_an_entry_from_the_environment_names_the_variable() {
    let error = load(
        "[[outboxes]]\ntable = \"a\"",
        &[("OUTBOX_RELAY__OUTBOXES__A__ORDERING", "global")],
    )
    .unwrap_err();
    assert!(
        error.contains("outboxes[0] (a): ordering: \"global\" is invalid")
            && error.ends_with("(from environment variable OUTBOX_RELAY__OUTBOXES__A__ORDERING)"),
        "{error}"
    );
}

#[test]
fn an_environment_variable_naming_no_outbox_is_rejected() {
    let error = load(
        "[[outboxes]]\ntable = \"a\"",
        &[
            ("OUTBOX_RELAY__OUTBOXES__1__DATABASE_URL", "mysql://x@y/z"),
            ("OUTBOX_RELAY__OUTBOXES__ORDERS__TABLE", "o"),
        ],
    )
    .unwrap_err();
    assert!(
        error.contains("environment variable OUTBOX_RELAY__OUTBOXES__1__DATABASE_URL: names no [[outboxes]] entry (\"1\"); the entries are: 0 (a)"),
        "{error}"
    );
    assert!(
        error.contains("OUTBOX_RELAY__OUTBOXES__ORDERS__TABLE"),
        "{error}"
    );
}

#[test]
fn header_columns_and_column_placeholders_become_the_columns_a_claim_reads() {
    let config = load(
        r#"
[[outboxes]]
name = "orders"
table = "outbox"
exchange = "outbox.{aggregatetype}"
routing_key = "outbox.event.{aggregatetype}"
content_type = "application/avro"
content_type_column = "ctype"
[outboxes.header_columns]
tenant = "tenant_id"
attempt = { column = "attempt", type = "integer" }
[[outboxes.routes]]
column = "region"
pattern = "eu.#"
exchange = "eu.events"
"#,
        &[],
    )
    .unwrap();
    let orders = &config.outboxes[0];
    let reads: Vec<(&str, outbox_core::ValueKind)> = orders
        .columns
        .extra
        .iter()
        .map(|read| (read.column.as_str(), read.kind))
        .collect();
    use outbox_core::ValueKind::{Integer, Text};
    assert_eq!(
        reads,
        [
            ("aggregatetype", Text),
            ("region", Text),
            ("attempt", Integer),
            ("tenant_id", Text),
            ("ctype", Text)
        ]
    );
    assert_eq!(orders.routing.extra.reads().len(), 5);
    assert_eq!(
        orders.routing.content_type.as_deref(),
        Some("application/avro")
    );
}

#[test]
fn header_columns_that_shadow_the_relays_headers_or_have_no_type_are_refused() {
    let error = load(
        r#"
[amqp.header_columns]
outbox_id = "id"
room_id = "room"
flag = { column = "flag", type = "bool" }
t = { column = "Bad Column" }
"#,
        &[],
    )
    .unwrap_err();
    for expected in [
        "amqp.header_columns.outbox_id",
        "amqp.header_columns.room_id",
        "amqp.header_columns.flag.type",
        "\"bool\" is not a type; accepted: text, integer, boolean, uuid, timestamp",
        "amqp.header_columns.t",
    ] {
        assert!(
            error.contains(expected),
            "missing {expected:?} in:\n{error}"
        );
    }
}

#[test]
fn the_worker_field_names_each_outbox_unless_relay_name_is_set() {
    let two = "[[outboxes]]\nname = \"orders\"\ntable = \"orders_outbox\"\n\
               [[outboxes]]\nname = \"rooms\"\ntable = \"room_outbox\"";
    let config = load(two, &[]).unwrap();
    let workers: Vec<String> = config
        .outboxes
        .iter()
        .map(|outbox| outbox.relay_options(&config.relay).name)
        .collect();
    assert_eq!(workers, ["orders", "rooms"]);
    assert_eq!(config.relay.name, "orders", "the first outbox's");
    let named = load(&format!("[relay]\nname = \"legacy\"\n{two}"), &[]).unwrap();
    assert_eq!(named.outboxes[1].relay_options(&named.relay).name, "legacy");
}
