//! The brokers of `amqp.url` — one, or the nodes of a RabbitMQ cluster — and the order in
//! which the link tries them.

use std::hash::{BuildHasher, RandomState};

/// One broker the relay may connect to.
#[derive(Clone)]
pub struct BrokerUrl {
    /// The URL (may hold a password: never log it, use `redacted`). `amqps://` connects
    /// with TLS.
    pub url: String,
    /// The same URL with the password replaced, for messages.
    pub redacted: String,
}

// By hand, so the password in `url` cannot reach a log line through `{:?}`.
impl std::fmt::Debug for BrokerUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted)
    }
}

/// Which broker to try first: a connection round tries every broker once, in the order of
/// the list, beginning at a random one per process (so that nodes spread over the cluster)
/// and, after a connection, at the broker after the one connected to (so that the next
/// round, after that connection is lost, tries the others first).
#[derive(Debug)]
pub(crate) struct Rotation {
    /// How many brokers there are.
    len: usize,
    /// Where the next round begins.
    next: usize,
}

impl Rotation {
    /// A rotation over `len` brokers, beginning at a random one.
    pub(crate) fn new(len: usize) -> Self {
        // The standard library's per-process random hash keys: random enough to spread
        // nodes, without a dependency.
        let random = RandomState::new().hash_one(std::process::id());
        Self::starting_at(len, (random % len.max(1) as u64) as usize)
    }

    fn starting_at(len: usize, next: usize) -> Self {
        Self { len, next }
    }

    /// The indexes of one round, in the order to try them.
    pub(crate) fn round(&self) -> impl Iterator<Item = usize> {
        let (len, next) = (self.len, self.next);
        (0..len).map(move |step| (next + step) % len)
    }

    /// Broker `index` was connected to: the next round begins after it.
    pub(crate) fn connected(&mut self, index: usize) {
        self.next = (index + 1) % self.len.max(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_tries_every_broker_once_from_its_start() {
        let rotation = Rotation::starting_at(3, 1);
        assert_eq!(rotation.round().collect::<Vec<_>>(), vec![1, 2, 0]);
        assert_eq!(
            Rotation::new(1).round().collect::<Vec<_>>(),
            vec![0],
            "one URL: as before"
        );
    }

    #[test]
    fn after_a_connection_the_next_round_tries_the_others_first() {
        let mut rotation = Rotation::starting_at(3, 0);
        rotation.connected(0);
        assert_eq!(rotation.round().collect::<Vec<_>>(), vec![1, 2, 0]);
        rotation.connected(2);
        assert_eq!(rotation.round().collect::<Vec<_>>(), vec![0, 1, 2]);
    }

    #[test]
    fn the_first_broker_is_spread_over_the_list() {
        let firsts: std::collections::HashSet<usize> = (0..64)
            .map(|_| Rotation::new(3).round().next().unwrap())
            .collect();
        assert!(firsts.len() > 1, "always {firsts:?}");
    }
}
