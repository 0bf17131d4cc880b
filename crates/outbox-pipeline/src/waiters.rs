//! [`Waiters`]: callers waiting for an actor to reach a point (drained, stopped, swept).

use actix::ResponseFuture;
use tokio::sync::oneshot;

/// The callers an actor answers all at once when it reaches a point: a drain or stop
/// request answered once done, or the sweep requests a sweep serves. A caller whose actor
/// stops without answering gets `T::default()`.
#[derive(Debug)]
pub(crate) struct Waiters<T = ()> {
    senders: Vec<oneshot::Sender<T>>,
}

impl<T> Default for Waiters<T> {
    fn default() -> Self {
        Self {
            senders: Vec::new(),
        }
    }
}

impl<T: Clone + Default + Send + 'static> Waiters<T> {
    /// One more caller; the returned future is a handler's response to it.
    pub(crate) fn wait(&mut self) -> ResponseFuture<T> {
        let (sender, answer) = oneshot::channel();
        self.senders.push(sender);
        Box::pin(async move { answer.await.unwrap_or_default() })
    }

    /// True when nobody waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.senders.is_empty()
    }

    /// Adds the callers of `other`.
    pub(crate) fn join(&mut self, other: Waiters<T>) {
        self.senders.extend(other.senders);
    }

    /// Answers every caller with `value`; nobody waits afterwards.
    pub(crate) fn answer(&mut self, value: T) {
        for sender in self.senders.drain(..) {
            let _ = sender.send(value.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[actix_rt::test]
    async fn every_caller_gets_the_answer_and_a_dropped_one_the_default() {
        let mut waiters = Waiters::<u32>::default();
        let (first, second) = (waiters.wait(), waiters.wait());
        assert!(!waiters.is_empty());
        waiters.answer(7);
        assert!(waiters.is_empty());
        assert_eq!((first.await, second.await), (7, 7));
        let mut dropped = Waiters::<u32>::default();
        let unanswered = dropped.wait();
        drop(dropped);
        assert_eq!(unanswered.await, 0);
    }
}
