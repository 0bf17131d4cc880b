//! The reference pages of the book, generated from the code's own definitions: the
//! settings from their declarations (`src/settings/shape.rs`: keys, types, doc comments)
//! and defaults (`Settings::default()`), the commands from clap, the metrics from the
//! instruments' descriptions. The pages are committed under docs/reference/; this test
//! fails when they differ from what the code generates. `UPDATE_REFERENCE=1 cargo test -p
//! outbox-relay --test reference` writes them anew.

use clap::CommandFactory as _;
use outbox_relay::cli::Cli;
use outbox_relay::settings::{Field, LogFormat, Settings, ENV_PREFIX};
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn book() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/reference")
}

/// Compares `page` with the committed file, or writes it with `UPDATE_REFERENCE=1`.
fn check(name: &str, page: &str) {
    let path = book().join(name);
    if std::env::var_os("UPDATE_REFERENCE").is_some() {
        std::fs::write(&path, page).expect("reference page written");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == page,
        "docs/reference/{name} differs from what the code generates: run \
         `UPDATE_REFERENCE=1 cargo test -p outbox-relay --test reference` and commit it"
    );
}

// ---------------------------------------------------------------------------------------
// Settings

/// A struct of shape.rs: its fields in declaration order.
struct Declared {
    fields: Vec<DeclaredField>,
}

struct DeclaredField {
    /// As written in the file (serde's `rename`, else the field's name).
    key: String,
    ty: syn::Type,
    doc: String,
}

fn declarations() -> BTreeMap<String, Declared> {
    let source = include_str!("../src/settings/shape.rs");
    let file = syn::parse_file(source).expect("shape.rs parses");
    let mut structs = BTreeMap::new();
    for item in file.items {
        let syn::Item::Struct(item) = item else {
            continue;
        };
        let syn::Fields::Named(named) = item.fields else {
            continue;
        };
        let fields = named
            .named
            .into_iter()
            .map(|field| DeclaredField {
                key: serde_rename(&field.attrs)
                    .unwrap_or_else(|| field.ident.as_ref().unwrap().to_string()),
                doc: doc_text(&field.attrs),
                ty: field.ty,
            })
            .collect();
        structs.insert(item.ident.to_string(), Declared { fields });
    }
    structs
}

fn doc_text(attrs: &[syn::Attribute]) -> String {
    let lines: Vec<String> = attrs
        .iter()
        .filter(|attr| attr.path().is_ident("doc"))
        .filter_map(|attr| match &attr.meta {
            syn::Meta::NameValue(nv) => match &nv.value {
                syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(text),
                    ..
                }) => Some(text.value().trim().to_owned()),
                _ => None,
            },
            _ => None,
        })
        .collect();
    // Intra-doc links read as plain code in a table: [`X::y`] → `X::y`.
    lines.join(" ").replace("[`", "`").replace("`]", "`")
}

fn serde_rename(attrs: &[syn::Attribute]) -> Option<String> {
    let mut rename = None;
    for attr in attrs.iter().filter(|attr| attr.path().is_ident("serde")) {
        let _ = attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("rename") {
                rename = Some(meta.value()?.parse::<syn::LitStr>()?.value());
            } else if meta.input.peek(syn::Token![=]) {
                let _: syn::Expr = meta.value()?.parse()?;
            }
            Ok(())
        });
    }
    rename
}

/// The last segment of a type path and its generic arguments' types.
fn segments(ty: &syn::Type) -> (String, Vec<syn::Type>) {
    let syn::Type::Path(path) = ty else {
        panic!("a settings field of an unexpected type: {}", quote(ty));
    };
    let last = path.path.segments.last().expect("a type name");
    let args: Vec<syn::Type> = match &last.arguments {
        syn::PathArguments::AngleBracketed(args) => args
            .args
            .iter()
            .filter_map(|arg| match arg {
                syn::GenericArgument::Type(ty) => Some(ty.clone()),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    (last.ident.to_string(), args)
}

fn quote(ty: &syn::Type) -> String {
    match ty {
        syn::Type::Path(path) => path
            .path
            .segments
            .iter()
            .map(|s| s.ident.to_string())
            .collect::<Vec<_>>()
            .join("::"),
        _ => "?".into(),
    }
}

/// What `Field<T>` accepts, as the settings spell it.
fn accepted<T: DeserializeOwned>() -> String {
    match Field::<T>::new("\u{1}").parsed() {
        Err(accepted) => accepted.to_owned(),
        Ok(_) => unreachable!("a control character is never a valid setting"),
    }
}

/// The type column for a leaf field. An unknown type fails the test: teach it here.
fn type_text(ty: &syn::Type) -> String {
    let (name, args) = segments(ty);
    match (name.as_str(), args.as_slice()) {
        ("String", _) => "text".into(),
        ("i64", _) => "integer".into(),
        ("bool", _) => "boolean".into(),
        ("Option", [inner]) => type_text(inner),
        ("Vec", [inner]) => format!("list of {}", type_text(inner)),
        ("BTreeMap", [_, value]) => format!("table of {}", type_text(value)),
        ("HeaderColumnSettings", _) => "column name, or `{ column, type }`".into(),
        ("Field", [inner]) => match segments(inner).0.as_str() {
            "Span" => "duration (`250ms`, `30s`, `5m`)".into(),
            "RetryStrategy" => accepted::<outbox_core::RetryStrategy>(),
            "Ordering" => accepted::<outbox_core::Ordering>(),
            "PublishedRows" => accepted::<outbox_core::PublishedRows>(),
            "LogFormat" => accepted::<LogFormat>(),
            "SocketAddr" => "address and port (`127.0.0.1:9187`), or `\"\"`: off".into(),
            other => panic!("Field<{other}>: say in tests/reference.rs what it accepts"),
        },
        (other, _) => {
            panic!("a settings field of type {other}: say in tests/reference.rs how to show it")
        }
    }
}

/// A section's structs: a field whose type is a struct of shape.rs is a table of its own.
fn section_of<'a>(
    ty: &syn::Type,
    structs: &'a BTreeMap<String, Declared>,
) -> Option<(&'a Declared, bool, String)> {
    let (name, args) = segments(ty);
    match (name.as_str(), args.as_slice()) {
        ("Vec" | "Option", [inner]) => {
            section_of(inner, structs).map(|(declared, _, name)| (declared, true, name))
        }
        _ => structs.get(&name).map(|declared| (declared, false, name)),
    }
}

fn default_text(value: Option<&toml::Value>) -> String {
    match value {
        None => "none".into(),
        Some(toml::Value::String(text)) if text.is_empty() => "`\"\"`".into(),
        Some(value) => format!("`{}`", value.to_string().replace('|', "\\|")),
    }
}

struct Row {
    key: String,
    ty: String,
    default: String,
    env: String,
    meaning: String,
}

fn walk(
    declared: &Declared,
    path: &[String],
    defaults: Option<&toml::Value>,
    structs: &BTreeMap<String, Declared>,
    sections: &mut Vec<(String, Vec<Row>)>,
    env_path: &str,
) {
    let title = if path.is_empty() {
        "Top level".to_owned()
    } else {
        format!("`[{}]`", path.join("."))
    };
    let mut rows = Vec::new();
    let mut nested = Vec::new();
    for field in &declared.fields {
        let value = defaults.and_then(|table| table.get(&field.key));
        let mut key_path = path.to_vec();
        key_path.push(field.key.clone());
        let env = format!("{env_path}{}", field.key.to_ascii_uppercase());
        if let Some((inner, many, name)) = section_of(&field.ty, structs) {
            nested.push((
                inner,
                key_path,
                value.cloned(),
                many,
                name,
                env,
                field.doc.clone(),
            ));
            continue;
        }
        rows.push(Row {
            key: format!("`{}`", key_path.join(".")),
            ty: type_text(&field.ty),
            default: default_text(value),
            env: format!("`{env}`"),
            meaning: field.doc.replace('|', "\\|"),
        });
    }
    if !rows.is_empty() {
        sections.push((title, rows));
    }
    for (inner, key_path, value, many, name, env, doc) in nested {
        if many {
            // An array of tables: the defaults of one entry, the environment by position.
            let entry = entry_defaults(&name);
            let title = format!("`[[{}]]`", key_path.join("."));
            let mut entry_sections = Vec::new();
            walk(
                inner,
                &key_path,
                Some(&entry),
                structs,
                &mut entry_sections,
                &format!("{env}__<entry>__"),
            );
            for (index, (section_title, rows)) in entry_sections.into_iter().enumerate() {
                let title = if index == 0 {
                    // Its doc comment, without the section's name it may start with.
                    let doc = doc.trim_start_matches(title.as_str());
                    format!("{title}\n\n{}", doc.trim_start_matches([';', ' ']))
                } else {
                    section_title
                };
                sections.push((title, rows));
            }
        } else {
            walk(
                inner,
                &key_path,
                value.as_ref(),
                structs,
                sections,
                &format!("{env}__"),
            );
        }
    }
}

/// The defaults of one entry of an array of tables.
fn entry_defaults(name: &str) -> toml::Value {
    use outbox_relay::settings::{OutboxSettings, RouteSettings};
    match name {
        "OutboxSettings" => toml::Value::try_from(OutboxSettings::default()).unwrap(),
        "RouteSettings" => toml::Value::try_from(RouteSettings::default()).unwrap(),
        other => panic!("[[…]] of {other}: say in tests/reference.rs what its defaults are"),
    }
}

fn settings_page() -> String {
    let structs = declarations();
    let defaults = toml::Value::try_from(Settings::default()).expect("the defaults serialise");
    let mut sections = Vec::new();
    walk(
        &structs["Settings"],
        &[],
        Some(&defaults),
        &structs,
        &mut sections,
        ENV_PREFIX,
    );
    let mut page = String::from(
        "# Settings reference\n\n\
         Generated from the settings' declarations (`crates/outbox-relay/src/settings/shape.rs`) \
         and their defaults; a test fails when this page and the code differ. How settings \
         load, layer and validate: [Configuration](../configuration.md).\n\n\
         Every key can be set in the settings file or in the environment: \
         `OUTBOX_RELAY__<SECTION>__<KEY>`, and for an entry of `[[outboxes]]` \
         `OUTBOX_RELAY__OUTBOXES__<position or name>__<KEY>`.\n",
    );
    for (title, rows) in sections {
        let _ = write!(page, "\n## {title}\n\n| key | type | default | environment | meaning |\n|---|---|---|---|---|\n");
        for row in rows {
            let _ = writeln!(
                page,
                "| {} | {} | {} | {} | {} |",
                row.key, row.ty, row.default, row.env, row.meaning
            );
        }
    }
    page
}

#[test]
fn the_settings_reference_is_what_the_declarations_say() {
    check("settings.md", &settings_page());
}

// ---------------------------------------------------------------------------------------
// Commands

fn command_sections(command: &mut clap::Command, path: &str, page: &mut String) {
    let name = if path.is_empty() {
        command.get_name().to_owned()
    } else {
        format!("{path} {}", command.get_name())
    };
    // The values of environment variables set where the page is generated stay out of it.
    *command = command.clone().mut_args(|arg| arg.hide_env_values(true));
    let help = command.render_long_help().to_string();
    let _ = write!(page, "\n## `{name}`\n\n```text\n{}\n```\n", help.trim_end());
    let mut subcommands: Vec<clap::Command> = command
        .get_subcommands()
        .filter(|sub| sub.get_name() != "help")
        .cloned()
        .collect();
    for sub in &mut subcommands {
        command_sections(sub, &name, page);
    }
}

fn commands_page() -> String {
    let mut command = Cli::command().term_width(100);
    command.build();
    let mut page = String::from(
        "# Commands reference\n\n\
         Every command's `--help`, generated from the command line's definitions (clap); a \
         test fails when this page and the code differ. A guide to the commands: \
         [Commands](../commands.md).\n",
    );
    command_sections(&mut command, "", &mut page);
    page
}

#[test]
fn the_commands_reference_is_what_clap_says() {
    check("commands.md", &commands_page());
}

// ---------------------------------------------------------------------------------------
// Metrics

/// Records what the instruments describe.
#[derive(Default)]
struct Descriptions(std::sync::Mutex<Vec<(String, &'static str, String, String)>>);

impl Descriptions {
    fn push(
        &self,
        kind: &'static str,
        key: metrics::KeyName,
        unit: Option<metrics::Unit>,
        help: metrics::SharedString,
    ) {
        let unit = unit
            .map(|unit| unit.as_str().to_owned())
            .unwrap_or_default();
        self.0
            .lock()
            .unwrap()
            .push((key.as_str().to_owned(), kind, unit, help.to_string()));
    }
}

impl metrics::Recorder for Descriptions {
    fn describe_counter(
        &self,
        key: metrics::KeyName,
        unit: Option<metrics::Unit>,
        help: metrics::SharedString,
    ) {
        self.push("counter", key, unit, help);
    }
    fn describe_gauge(
        &self,
        key: metrics::KeyName,
        unit: Option<metrics::Unit>,
        help: metrics::SharedString,
    ) {
        self.push("gauge", key, unit, help);
    }
    fn describe_histogram(
        &self,
        key: metrics::KeyName,
        unit: Option<metrics::Unit>,
        help: metrics::SharedString,
    ) {
        self.push("histogram", key, unit, help);
    }
    fn register_counter(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        metrics::Counter::noop()
    }
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }
    fn register_histogram(
        &self,
        _: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        metrics::Histogram::noop()
    }
}

fn metrics_page() -> String {
    let recorder = Descriptions::default();
    metrics::with_local_recorder(&recorder, outbox_relay::endpoint::describe_metrics);
    let mut described = recorder.0.into_inner().unwrap();
    described.sort();
    described.dedup();
    let mut page = String::from(
        "# Metrics reference\n\n\
         Every series `/metrics` serves besides the standard `process_*` ones, generated from \
         the instruments' own descriptions; a test fails when this page and the code differ. \
         Every series carries the label `node_id`; the relay's own carry `outbox` too. Alerts \
         and the dashboard: [Metrics and alerts](../metrics.md).\n\n\
         | name | type | unit | meaning |\n|---|---|---|---|\n",
    );
    for (name, kind, unit, help) in described {
        let unit = if unit.is_empty() {
            "-".to_owned()
        } else {
            unit
        };
        let _ = writeln!(
            page,
            "| `{name}` | {kind} | {unit} | {} |",
            help.replace('|', "\\|")
        );
    }
    page
}

#[test]
fn the_metrics_reference_is_what_the_instruments_describe() {
    check("metrics.md", &metrics_page());
}
