//! [`Flight`]: the one task that carries a Publisher's publishes from hand-off to confirm.
//!
//! Why one task and not one per publish: every confirm (and every hand-off) is resolved on
//! lapin's I/O thread, and waking a task from another thread costs the actor's thread a
//! trip through the runtime's inject queue and a wake-up of its driver. Publishes of one
//! claim are handed off and confirmed in bursts: in one task, a burst wakes it once, and
//! only the publishes whose promise resolved are polled (`FuturesUnordered`).
//! docs/design/publishing.md#the-publisher-and-its-flight says how the Publisher uses it.

use futures_util::stream::{FuturesUnordered, StreamExt};
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// One publish, from hand-off to its end.
type Leg<T> = Pin<Box<dyn Future<Output = T>>>;

/// The task and the way in. Dropping it abandons every publish still in it.
pub(crate) struct Flight<T> {
    legs: mpsc::UnboundedSender<Leg<T>>,
    task: JoinHandle<()>,
}

impl<T: 'static> Flight<T> {
    /// Starts the task on the current actix runtime: each publish's output goes to
    /// `landed`, in the order they end.
    pub(crate) fn start(landed: mpsc::UnboundedSender<T>) -> Self {
        let (legs, mut boarding) = mpsc::unbounded_channel::<Leg<T>>();
        let mut flying = FuturesUnordered::new();
        let task = actix_rt::spawn(std::future::poll_fn(move |cx| {
            let mut open = true;
            loop {
                match boarding.poll_recv(cx) {
                    Poll::Ready(Some(leg)) => flying.push(leg),
                    Poll::Ready(None) => {
                        open = false;
                        break;
                    }
                    Poll::Pending => break,
                }
            }
            // `FuturesUnordered` polls only the publishes that were woken, and yields
            // (waking this task again) after a bounded number of them.
            while let Poll::Ready(Some(output)) = flying.poll_next_unpin(cx) {
                if landed.send(output).is_err() {
                    return Poll::Ready(()); // the Publisher is gone
                }
            }
            if !open && flying.is_empty() {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        }));
        Self { legs, task }
    }

    /// Adds a publish to the flight.
    pub(crate) fn launch(&self, leg: impl Future<Output = T> + 'static) {
        // Fails only once the task was aborted: the publish is abandoned with it.
        let _ = self.legs.send(Box::pin(leg));
    }
}

impl<T> Drop for Flight<T> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::sync::oneshot;

    #[actix_rt::test]
    async fn each_publish_lands_when_it_ends_not_in_launch_order() {
        let (landed, mut landings) = mpsc::unbounded_channel();
        let flight = Flight::start(landed);
        let (first_done, first) = oneshot::channel::<()>();
        flight.launch(async move {
            let _ = first.await;
            1
        });
        flight.launch(async { 2 });
        let next = tokio::time::timeout(Duration::from_secs(5), landings.recv()).await;
        assert_eq!(next.expect("a landing within 5 s"), Some(2));
        first_done.send(()).expect("the first publish is waiting");
        let next = tokio::time::timeout(Duration::from_secs(5), landings.recv()).await;
        assert_eq!(next.expect("a landing within 5 s"), Some(1));
    }

    #[actix_rt::test]
    async fn dropping_the_flight_abandons_what_is_in_it() {
        let (landed, mut landings) = mpsc::unbounded_channel::<u32>();
        let flight = Flight::start(landed);
        let (_never, waiting) = oneshot::channel::<()>();
        flight.launch(async move {
            let _ = waiting.await;
            1
        });
        drop(flight);
        // The task, aborted, drops its sender: the stream ends without a landing.
        let end = tokio::time::timeout(Duration::from_secs(5), landings.recv()).await;
        assert_eq!(end.expect("the stream ends within 5 s"), None);
    }
}
