//! Which rows are too big for one content header frame, worked out apart from the relay:
//! the properties as lapin writes them on the wire, in the frame RabbitMQ measures against
//! its `frame_max`.

use super::Planned;
use lapin::types::AMQPValue;
use lapin::BasicProperties;

/// RabbitMQ's default `frame_max`, which the test broker keeps: one content header frame,
/// and so a message's properties, must fit in it.
pub(super) const FRAME_MAX: usize = 131_072;

/// Around `FRAME_MAX`, a row within this many bytes may go either way: the properties the
/// test builds could differ from the relay's by a field it adds, and such a row is neither
/// clearly over nor clearly under.
const UNSURE: usize = 64;

/// A content header frame's bytes besides the properties (with their flags): type,
/// channel and size (7), class, weight and body size (12), the end octet (1). RabbitMQ
/// refuses a frame whose whole size is over `frame_max` (`frame_too_large`).
const FRAME_AROUND_PROPERTIES: usize = 7 + 12 + 1;

/// Where a row stands against `FRAME_MAX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fits {
    /// Clearly under: it must be published (unless something else makes it dead).
    Yes,
    /// Clearly over: it must be dead, naming `frame_max`.
    No,
    /// Too close to call: published, or dead naming `frame_max`.
    Unsure,
}

impl Planned {
    /// Marks a row that could be published as dead when its message's properties (its
    /// headers and the relay's own) would not fit in one frame; `node_id` the relay's.
    pub(super) fn check_frame(&mut self, node_id: &str) {
        let Ok((_, table)) = &self.expect else {
            return;
        };
        let mut headers = table.clone();
        for (name, value) in [
            ("room_id", AMQPValue::LongString(self.room.clone().into())),
            ("outbox_id", AMQPValue::LongLongInt(0)),
            ("retry_count", AMQPValue::LongInt(0)),
            ("node_id", AMQPValue::LongString(node_id.into())),
        ] {
            headers.insert(name.into(), value);
        }
        let properties = BasicProperties::default()
            .with_message_id(self.event_id.as_str().into())
            .with_type(self.event_type.as_str().into())
            .with_content_type("application/json".into())
            .with_delivery_mode(2)
            .with_timestamp(0)
            .with_app_id("outbox-relay".into())
            .with_headers(headers);
        let bytes = frame_bytes(&properties);
        self.fits = match bytes {
            _ if bytes + UNSURE <= FRAME_MAX => Fits::Yes,
            _ if bytes > FRAME_MAX + UNSURE => Fits::No,
            _ => Fits::Unsure,
        };
        if self.fits == Fits::No {
            self.expect = Err(vec![format!(
                "above the broker's frame_max of {FRAME_MAX} bytes"
            )]);
        }
    }
}

/// The bytes of the content header frame carrying `properties`, as lapin encodes it.
fn frame_bytes(properties: &BasicProperties) -> usize {
    let encoded = cookie_factory::gen_simple(
        lapin::protocol::basic::gen_properties(properties),
        Vec::new(),
    )
    .expect("properties encode");
    encoded.len() + FRAME_AROUND_PROPERTIES
}
