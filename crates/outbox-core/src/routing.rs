//! Which exchange and routing key an event is published with (docs/design/publishing.md).

use thiserror::Error;

/// The longest routing key AMQP carries (a `shortstr`).
pub const MAX_ROUTING_KEY_BYTES: usize = 255;

/// A routing problem of one event or of the settings.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RoutingError {
    /// The template names a placeholder that is neither a field nor a column name.
    #[error("unknown placeholder {placeholder:?} in template {template:?}; accepted: {{event_type}}, {{key}} (or {{room_id}}), or {{column}} naming a column of the table (lowercase letters, digits and '_')")]
    UnknownPlaceholder {
        /// The template as written.
        template: String,
        /// The offending placeholder.
        placeholder: String,
    },
    /// The template has a `{` without a matching `}`.
    #[error("unclosed '{{' in template {template:?}")]
    Unclosed {
        /// The template as written.
        template: String,
    },
    /// The rendered key is longer than AMQP allows.
    #[error("routing key of {length} bytes exceeds the AMQP limit of 255: {key_start:?}…")]
    KeyTooLong {
        /// Length of the rendered key.
        length: usize,
        /// Its first characters, for the error message.
        key_start: String,
    },
    /// A column the routing needs is NULL in this row.
    #[error("routing needs column {column}, which is NULL in this row")]
    NullColumn {
        /// The column.
        column: String,
    },
}

/// What a placeholder or a route's pattern reads of an event.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RouteField {
    /// `{event_type}`: the mapped event type (AMQP `type`).
    EventType,
    /// `{key}` (or `{room_id}`): the mapped ordering key.
    Key,
    /// `{name}`: any other column of the table, read as text.
    Column(String),
}

impl RouteField {
    /// The field a placeholder's name stands for; `None` when it is no plain column name.
    fn named(name: &str) -> Option<Self> {
        match name {
            "event_type" => Some(RouteField::EventType),
            "key" | "room_id" => Some(RouteField::Key),
            column if is_column_name(column) => Some(RouteField::Column(column.to_owned())),
            _ => None,
        }
    }
}

/// `[a-z_][a-z0-9_]{0,62}`: a name spliced into SQL unquoted (the store checks it against
/// the table at start).
fn is_column_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some('a'..='z' | '_'))
        && name.len() <= 63
        && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_'))
}

/// The values of one event that templates and routes read.
pub struct EventFields<'a> {
    /// The event type.
    pub event_type: &'a str,
    /// The ordering key.
    pub key: &'a str,
    /// A column's text (`None`: NULL, or not read).
    pub column: &'a dyn Fn(&str) -> Option<&'a str>,
}

impl<'a> EventFields<'a> {
    /// The value of `field`.
    fn get(&self, field: &RouteField) -> Result<&'a str, RoutingError> {
        match field {
            RouteField::EventType => Ok(self.event_type),
            RouteField::Key => Ok(self.key),
            RouteField::Column(column) => {
                (self.column)(column).ok_or_else(|| RoutingError::NullColumn {
                    column: column.clone(),
                })
            }
        }
    }

    /// Fields with no extra column (tests, tools).
    pub fn of(event_type: &'a str, key: &'a str) -> Self {
        Self {
            event_type,
            key,
            column: &|_| None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Field(RouteField),
}

/// A template such as `"{event_type}"`, `"rooms.{key}"` or `"outbox.event.{aggregatetype}"`
/// (a routing key, or an exchange).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutingKeyTemplate {
    pieces: Vec<Piece>,
}

impl RoutingKeyTemplate {
    /// Parses a template: `{event_type}`, `{key}` (or `{room_id}`), and `{column}` for any
    /// other column of the table.
    pub fn parse(template: &str) -> Result<Self, RoutingError> {
        let mut pieces = Vec::new();
        let mut rest = template;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                pieces.push(Piece::Text(rest[..open].to_owned()));
            }
            let after = &rest[open + 1..];
            let close = after.find('}').ok_or_else(|| RoutingError::Unclosed {
                template: template.to_owned(),
            })?;
            let name = &after[..close];
            let field =
                RouteField::named(name).ok_or_else(|| RoutingError::UnknownPlaceholder {
                    template: template.to_owned(),
                    placeholder: format!("{{{name}}}"),
                })?;
            pieces.push(Piece::Field(field));
            rest = &after[close + 1..];
        }
        if !rest.is_empty() {
            pieces.push(Piece::Text(rest.to_owned()));
        }
        Ok(Self { pieces })
    }

    /// The template's text when it has no placeholder (a fixed exchange).
    pub fn fixed(&self) -> Option<&str> {
        match self.pieces.as_slice() {
            [] => Some(""),
            [Piece::Text(text)] => Some(text),
            _ => None,
        }
    }

    /// The columns its placeholders name (beyond the event type and key).
    pub fn columns(&self) -> impl Iterator<Item = &str> {
        self.pieces.iter().filter_map(|piece| match piece {
            Piece::Field(RouteField::Column(column)) => Some(column.as_str()),
            _ => None,
        })
    }

    /// Renders the template for one event.
    pub fn render_fields(&self, fields: &EventFields<'_>) -> Result<String, RoutingError> {
        let mut key = String::new();
        for piece in &self.pieces {
            match piece {
                Piece::Text(text) => key.push_str(text),
                Piece::Field(field) => key.push_str(fields.get(field)?),
            }
        }
        if key.len() > MAX_ROUTING_KEY_BYTES {
            return Err(RoutingError::KeyTooLong {
                length: key.len(),
                key_start: key.chars().take(40).collect(),
            });
        }
        Ok(key)
    }

    /// Renders the key for an event with no extra column.
    pub fn render(&self, event_type: &str, key: &str) -> Result<String, RoutingError> {
        self.render_fields(&EventFields::of(event_type, key))
    }
}

/// The template as settings write it (`{room_id}` reads back as `{key}`).
impl std::fmt::Display for RoutingKeyTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for piece in &self.pieces {
            match piece {
                Piece::Text(text) => f.write_str(text)?,
                Piece::Field(RouteField::EventType) => f.write_str("{event_type}")?,
                Piece::Field(RouteField::Key) => f.write_str("{key}")?,
                Piece::Field(RouteField::Column(column)) => write!(f, "{{{column}}}")?,
            }
        }
        Ok(())
    }
}

/// One `[[amqp.routes]]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// What the pattern is matched against: the event type (`event_type = "…"`), or a
    /// column (`column = "aggregatetype"`, `pattern = "…"`).
    pub field: RouteField,
    /// Topic-style pattern: `*` one word, `#` zero or more words.
    pub pattern: String,
    /// Exchange for matching events (a template).
    pub exchange: RoutingKeyTemplate,
    /// Routing key for matching events; the default template when absent.
    pub routing_key: Option<RoutingKeyTemplate>,
}

/// Picks exchange and routing key per event: the first matching route, else the defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Router {
    /// `amqp.exchange` (a template).
    pub exchange: RoutingKeyTemplate,
    /// `amqp.routing_key`.
    pub routing_key: RoutingKeyTemplate,
    /// `amqp.routes`, in file order.
    pub routes: Vec<Route>,
}

impl Router {
    /// A router with a fixed exchange and no routes.
    pub fn new(exchange: &str, routing_key: RoutingKeyTemplate) -> Self {
        Self {
            exchange: RoutingKeyTemplate {
                pieces: vec![Piece::Text(exchange.to_owned())],
            },
            routing_key,
            routes: Vec::new(),
        }
    }

    /// Exchange and routing key of one event with no extra column.
    pub fn route(&self, event_type: &str, key: &str) -> Result<(String, String), RoutingError> {
        self.route_fields(&EventFields::of(event_type, key))
    }

    /// Exchange and routing key of one event. A route whose column is NULL does not match.
    pub fn route_fields(&self, fields: &EventFields<'_>) -> Result<(String, String), RoutingError> {
        let route = self.routes.iter().find(|route| {
            fields
                .get(&route.field)
                .is_ok_and(|value| topic_matches(&route.pattern, value))
        });
        let exchange = route.map_or(&self.exchange, |route| &route.exchange);
        let template = route
            .and_then(|route| route.routing_key.as_ref())
            .unwrap_or(&self.routing_key);
        Ok((
            exchange.render_fields(fields)?,
            template.render_fields(fields)?,
        ))
    }

    /// Every column its templates and routes read (each once, in order).
    pub fn columns(&self) -> Vec<&str> {
        let mut columns: Vec<&str> = Vec::new();
        let templates = std::iter::once(&self.exchange)
            .chain(std::iter::once(&self.routing_key))
            .chain(self.routes.iter().flat_map(|route| {
                std::iter::once(&route.exchange).chain(route.routing_key.iter())
            }));
        for template in templates {
            for column in template.columns() {
                if !columns.contains(&column) {
                    columns.push(column);
                }
            }
        }
        for route in &self.routes {
            if let RouteField::Column(column) = &route.field {
                if !columns.contains(&column.as_str()) {
                    columns.push(column);
                }
            }
        }
        columns
    }
}

/// AMQP topic matching of `pattern` against the dot-separated words of `value`.
pub fn topic_matches(pattern: &str, value: &str) -> bool {
    let pattern: Vec<&str> = pattern.split('.').collect();
    let words: Vec<&str> = value.split('.').collect();
    matches_words(&pattern, &words)
}

fn matches_words(pattern: &[&str], words: &[&str]) -> bool {
    match pattern.split_first() {
        None => words.is_empty(),
        Some((&"#", rest)) => (0..=words.len()).any(|skip| matches_words(rest, &words[skip..])),
        Some((head, rest)) => match words.split_first() {
            Some((word, remaining)) => {
                (*head == "*" || head == word) && matches_words(rest, remaining)
            }
            None => false,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_patterns_match_like_rabbitmq() {
        assert!(topic_matches("room.member.*", "room.member.joined"));
        assert!(!topic_matches("room.member.*", "room.member.joined.late"));
        assert!(topic_matches("room.#", "room"));
        assert!(topic_matches("room.#", "room.a.b.c"));
        assert!(topic_matches("#.created", "room.created"));
        assert!(!topic_matches("room.*", "chat.created"));
        assert!(topic_matches("#", "anything.at.all"));
    }

    #[test]
    fn templates_render_both_placeholders() {
        let template = RoutingKeyTemplate::parse("rooms.{room_id}.{event_type}").unwrap();
        assert_eq!(
            template.render("message.sent", "r42").unwrap(),
            "rooms.r42.message.sent"
        );
    }

    #[test]
    fn unknown_placeholders_are_rejected() {
        let error = RoutingKeyTemplate::parse("{Tenant}").unwrap_err();
        assert!(error.to_string().contains("{Tenant}"), "{error}");
        assert!(RoutingKeyTemplate::parse("{room_id").is_err());
    }

    #[test]
    fn overlong_keys_are_an_error() {
        let template = RoutingKeyTemplate::parse("{room_id}").unwrap();
        let error = template.render("t", &"r".repeat(300)).unwrap_err();
        assert!(matches!(
            error,
            RoutingError::KeyTooLong { length: 300, .. }
        ));
    }

    fn template(text: &str) -> RoutingKeyTemplate {
        RoutingKeyTemplate::parse(text).unwrap()
    }

    #[test]
    fn the_first_matching_route_wins() {
        let router = Router {
            routes: vec![
                Route {
                    field: RouteField::EventType,
                    pattern: "room.member.*".into(),
                    exchange: template("im.members"),
                    routing_key: Some(template("{room_id}")),
                },
                Route {
                    field: RouteField::EventType,
                    pattern: "room.#".into(),
                    exchange: template("im.rooms"),
                    routing_key: None,
                },
            ],
            ..Router::new("room.events", template("{event_type}"))
        };
        assert_eq!(
            router.route("room.member.joined", "r1").unwrap(),
            ("im.members".to_owned(), "r1".to_owned())
        );
        assert_eq!(
            router.route("room.created", "r1").unwrap(),
            ("im.rooms".to_owned(), "room.created".to_owned())
        );
        assert_eq!(
            router.route("message.sent", "r1").unwrap(),
            ("room.events".to_owned(), "message.sent".to_owned())
        );
    }

    #[test]
    fn any_column_routes_like_debeziums_route_by_field() {
        let router = Router {
            exchange: template("outbox.{aggregatetype}"),
            routes: vec![Route {
                field: RouteField::Column("aggregatetype".into()),
                pattern: "customer".into(),
                exchange: template("customers"),
                routing_key: Some(template("{key}.{tenant}")),
            }],
            ..Router::new("", template("outbox.event.{aggregatetype}"))
        };
        assert_eq!(router.columns(), ["aggregatetype", "tenant"]);
        let order = |name: &str| match name {
            "aggregatetype" => Some("order"),
            _ => None,
        };
        let fields = EventFields {
            event_type: "OrderCreated",
            key: "o-1",
            column: &order,
        };
        assert_eq!(
            router.route_fields(&fields).unwrap(),
            ("outbox.order".to_owned(), "outbox.event.order".to_owned())
        );
        let customer = |name: &str| match name {
            "aggregatetype" => Some("customer"),
            "tenant" => Some("acme"),
            _ => None,
        };
        let fields = EventFields {
            column: &customer,
            ..fields
        };
        assert_eq!(
            router.route_fields(&fields).unwrap(),
            ("customers".to_owned(), "o-1.acme".to_owned())
        );
        let null = |_: &str| None;
        let fields = EventFields {
            column: &null,
            ..fields
        };
        assert_eq!(
            router.route_fields(&fields).unwrap_err(),
            RoutingError::NullColumn {
                column: "aggregatetype".into()
            }
        );
    }

    #[test]
    fn key_is_the_neutral_name_of_room_id() {
        let key = template("k.{key}");
        assert_eq!(key, template("k.{room_id}"));
        assert_eq!(key.render("t", "o-1").unwrap(), "k.o-1");
        assert_eq!(template("orders").fixed(), Some("orders"));
        assert_eq!(template("o.{aggregatetype}").fixed(), None);
    }
}
