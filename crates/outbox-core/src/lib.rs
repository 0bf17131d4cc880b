//! The outbox-relay domain, free of I/O.
//!
//! Layout:
//! - [`backoff`]: the jittered wait before retrying a lost database or broker ([`Backoff`]).
//! - [`fields`]: columns read beyond the mapping, for routing, headers and a content type
//!   ([`ExtraColumns`]).
//! - [`record`]: an outbox row as the relay sees it ([`OutboxRecord`]) and its [`Status`].
//! - [`options`]: the relay's validated options ([`RelayOptions`], [`Ordering`]).
//! - [`retry`]: what happens to a failed event ([`RetryPolicy`] → [`FailureDecision`]).
//! - [`routing`]: exchange and routing key of an event ([`Router`]).
//! - [`error_text`]: `last_error` trimming ([`trim_error`]).
//! - [`outcome`]: what a publish attempt came to ([`OutcomeKind`]) and a flush of them ([`MarkBatch`]).
//! - [`trace`]: the W3C trace context a producer put in a row's headers ([`traceparent`]).
//! - [`ports`]: the traits through which the relay reaches the world: [`OutboxStore`] (the
//!   database), [`InsertFeed`] (its announcements of new rows), [`EventPublisher`] (the broker).

pub mod backoff;
pub mod error_text;
pub mod fields;
pub mod options;
pub mod outcome;
pub mod ports;
pub mod record;
pub mod retry;
pub mod routing;
pub mod trace;

pub use backoff::Backoff;
pub use error_text::{trim_error, MAX_ERROR_BYTES};
pub use fields::{ColumnRead, ColumnValue, ExtraColumns, HeaderColumn, ValueKind};
pub use options::{Ordering, PublishedRows, RelayOptions};
pub use outcome::{Failure, MarkBatch, OutcomeKind};
pub use ports::{
    Backlog, ClaimRequest, Claimed, Confirm, EventPublisher, FailingEvent, Holding, InsertFeed,
    NodeHold, OutboxStats, OutboxStore, PublishError, PurgeTarget, StoreError, TableSize,
};
pub use record::{OutboxRecord, Status};
pub use retry::{FailureDecision, RetryPolicy, RetryStrategy};
pub use routing::{Route, RouteField, Router, RoutingError, RoutingKeyTemplate};
pub use trace::traceparent;
