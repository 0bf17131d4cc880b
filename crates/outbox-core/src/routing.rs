//! Which exchange and routing key an event is published with (docs/design.md#publishing).

use thiserror::Error;

/// The longest routing key AMQP carries (a `shortstr`).
pub const MAX_ROUTING_KEY_BYTES: usize = 255;

/// A routing problem of one event or of the settings.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RoutingError {
    /// The template names a placeholder other than `{event_type}` and `{room_id}`.
    #[error("unknown placeholder {placeholder:?} in routing key template {template:?}; accepted: {{event_type}}, {{room_id}}")]
    UnknownPlaceholder {
        /// The template as written.
        template: String,
        /// The offending placeholder.
        placeholder: String,
    },
    /// The template has a `{` without a matching `}`.
    #[error("unclosed '{{' in routing key template {template:?}")]
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
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    EventType,
    RoomId,
}

/// A routing key template such as `"{event_type}"` or `"rooms.{room_id}"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutingKeyTemplate {
    pieces: Vec<Piece>,
}

impl RoutingKeyTemplate {
    /// Parses a template; only `{event_type}` and `{room_id}` are placeholders.
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
            pieces.push(match &after[..close] {
                "event_type" => Piece::EventType,
                "room_id" => Piece::RoomId,
                other => {
                    return Err(RoutingError::UnknownPlaceholder {
                        template: template.to_owned(),
                        placeholder: format!("{{{other}}}"),
                    })
                }
            });
            rest = &after[close + 1..];
        }
        if !rest.is_empty() {
            pieces.push(Piece::Text(rest.to_owned()));
        }
        Ok(Self { pieces })
    }

    /// Renders the key for one event.
    pub fn render(&self, event_type: &str, room_id: &str) -> Result<String, RoutingError> {
        let mut key = String::new();
        for piece in &self.pieces {
            key.push_str(match piece {
                Piece::Text(text) => text,
                Piece::EventType => event_type,
                Piece::RoomId => room_id,
            });
        }
        if key.len() > MAX_ROUTING_KEY_BYTES {
            return Err(RoutingError::KeyTooLong {
                length: key.len(),
                key_start: key.chars().take(40).collect(),
            });
        }
        Ok(key)
    }
}

/// One `[[amqp.routes]]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// Topic-style pattern over `event_type`: `*` one word, `#` zero or more words.
    pub event_type: String,
    /// Exchange for matching events.
    pub exchange: String,
    /// Routing key for matching events; the default template when absent.
    pub routing_key: Option<RoutingKeyTemplate>,
}

/// Picks exchange and routing key per event: the first matching route, else the defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Router {
    /// `amqp.exchange`.
    pub exchange: String,
    /// `amqp.routing_key`.
    pub routing_key: RoutingKeyTemplate,
    /// `amqp.routes`, in file order.
    pub routes: Vec<Route>,
}

impl Router {
    /// Exchange and routing key of one event.
    pub fn route(&self, event_type: &str, room_id: &str) -> Result<(&str, String), RoutingError> {
        let route = self
            .routes
            .iter()
            .find(|route| topic_matches(&route.event_type, event_type));
        let exchange = route.map_or(self.exchange.as_str(), |route| route.exchange.as_str());
        let template = route
            .and_then(|route| route.routing_key.as_ref())
            .unwrap_or(&self.routing_key);
        Ok((exchange, template.render(event_type, room_id)?))
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
        let error = RoutingKeyTemplate::parse("{tenant}").unwrap_err();
        assert!(error.to_string().contains("{tenant}"), "{error}");
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

    #[test]
    fn the_first_matching_route_wins() {
        let router = Router {
            exchange: "room.events".into(),
            routing_key: RoutingKeyTemplate::parse("{event_type}").unwrap(),
            routes: vec![
                Route {
                    event_type: "room.member.*".into(),
                    exchange: "im.members".into(),
                    routing_key: Some(RoutingKeyTemplate::parse("{room_id}").unwrap()),
                },
                Route {
                    event_type: "room.#".into(),
                    exchange: "im.rooms".into(),
                    routing_key: None,
                },
            ],
        };
        assert_eq!(
            router.route("room.member.joined", "r1").unwrap(),
            ("im.members", "r1".to_owned())
        );
        assert_eq!(
            router.route("room.created", "r1").unwrap(),
            ("im.rooms", "room.created".to_owned())
        );
        assert_eq!(
            router.route("message.sent", "r1").unwrap(),
            ("room.events", "message.sent".to_owned())
        );
    }
}
