//! [`Confirms`]: one channel's publisher confirms, read so that every `basic.return`
//! reaches its own message before that message is called published.
//!
//! With `mandatory`, RabbitMQ sends an unroutable message's `basic.return` before the
//! `basic.ack` that covers it, but a return carries no delivery tag and one ack may cover
//! several messages (`multiple`). lapin (4.12) hands a waiting return to the first confirm
//! it resolves after the return arrived, and it resolves an ack's confirms in a hash map's
//! order: the return often comes with another message's confirm, the carrier. So returns
//! are matched by message id (the event id), and a message's own confirm is only decided
//! once every carrier that could hold its return has been read:
//!
//! 1. **Barrier.** lapin resolves all the confirms of one ack frame while it holds its
//!    acknowledgement lock, and `Channel::wait_for_confirms` takes that lock on its first
//!    poll: once that poll returns, the frame that resolved our confirm is fully done, and
//!    so is every earlier one (the carrier resolves in our ack's frame or an earlier one).
//! 2. **Hand-offs.** A confirm can resolve before `basic_publish` hands it to us (a fast
//!    broker on loopback); the publishes handed off at the barrier are waited for. Each is
//!    read once as it is handed over ([`Ticket::handed`]), so one resolved early is read
//!    then.
//! 3. **Harvest.** Every confirm resolved since is known: its waker ([`SlotWaker`]) noted
//!    it. Those not yet read by their owners are read now, their returns noted, and their
//!    results kept for their owners.
//!
//! Then the message's own id was returned or it was not ([`Confirms::settle`]).

use lapin::{Channel, Confirmation, PublisherConfirm};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Wake, Waker};

/// The confirms of one confirm-mode channel and the returns read from them.
#[derive(Debug, Default)]
pub(crate) struct Confirms {
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    /// Slots whose confirm woke since the last harvest (a leaf lock: taken by lapin's I/O
    /// thread while it resolves confirms, so never held while waiting for anything).
    woken: Mutex<Vec<u64>>,
    /// Signalled whenever a hand-off ends (handed over or failed).
    handed: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct State {
    next: u64,
    /// Publishes whose confirm is in hand, by sequence number.
    slots: HashMap<u64, Slot>,
    /// Publishes whose `basic_publish` is under way: their confirm is not in hand yet (few,
    /// and a settle waits for them; kept apart so it need not walk every slot in flight).
    handing: BTreeSet<u64>,
    /// Ids of returned messages whose owners have not asked yet.
    returned: HashSet<String>,
}

enum Slot {
    /// In hand, not yet read by its owner.
    Waiting {
        confirm: PublisherConfirm,
        waker: Arc<SlotWaker>,
        event_id: String,
        /// Its owner gave up (a publish timeout): read only for a return it may carry.
        orphan: bool,
    },
    /// Read before its owner asked (by a harvest, or as it was handed); kept for its
    /// owner. Boxed: a returned message is large, and most slots never get here.
    Read(Box<lapin::Result<Confirmation>>),
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Slot::Waiting { .. } => "Waiting",
            Slot::Read(_) => "Read",
        })
    }
}

/// Most returns noted at once; beyond, the notes are dropped (a note whose owner timed out
/// would otherwise stay for good).
const MAX_RETURNED: usize = 10_000;

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl State {
    /// Notes the return `result` carries, if any; a return without a message id (not one
    /// of ours) counts as `carrier`'s own, as lapin gave it.
    fn note(&mut self, carrier: &str, result: &lapin::Result<Confirmation>) {
        let message = match result {
            Ok(Confirmation::Ack(Some(message)) | Confirmation::Nack(Some(message))) => message,
            _ => return,
        };
        if self.returned.len() >= MAX_RETURNED {
            self.returned.clear();
        }
        let id = message.delivery.properties.message_id().as_ref();
        self.returned
            .insert(id.map_or_else(|| carrier.to_owned(), |id| id.to_string()));
    }
}

impl Confirms {
    /// Before `basic_publish`: a slot for its confirm.
    pub(crate) fn begin(&self) -> Ticket {
        let mut state = self.shared.state();
        let seq = state.next;
        state.next += 1;
        state.handing.insert(seq);
        Ticket {
            shared: Arc::clone(&self.shared),
            seq: Some(seq),
        }
    }

    /// After `tracked` resolved: waits until every confirm that could carry its message's
    /// return has been read (module documentation), then says whether `event_id` was
    /// returned.
    pub(crate) async fn settle(&self, channel: &Channel, event_id: &str) -> bool {
        // 1. Barrier: the first poll takes lapin's acknowledgement lock; what it waits
        // for afterwards (the last publish's confirm) is not wanted, so it is dropped.
        let _ = futures_lite::future::poll_once(channel.wait_for_confirms()).await;
        // 2. The hand-offs under way now end (each reads its confirm as it is handed).
        let handing: Vec<u64> = self.shared.state().handing.iter().copied().collect();
        for seq in handing {
            loop {
                let ended = self.shared.handed.notified();
                tokio::pin!(ended);
                ended.as_mut().enable();
                if !self.shared.state().handing.contains(&seq) {
                    break;
                }
                ended.await;
            }
        }
        // 3. Harvest.
        let woken = std::mem::take(
            &mut *self
                .shared
                .woken
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        );
        let mut state = self.shared.state();
        for seq in woken {
            let Some(Slot::Waiting {
                confirm,
                waker,
                event_id,
                orphan,
            }) = state.slots.get_mut(&seq)
            else {
                continue;
            };
            let slot_waker = Waker::from(Arc::clone(waker));
            let Poll::Ready(result) = Pin::new(confirm).poll(&mut Context::from_waker(&slot_waker))
            else {
                continue;
            };
            let (carrier, orphan) = (std::mem::take(event_id), *orphan);
            state.note(&carrier, &result);
            match orphan {
                true => {
                    state.slots.remove(&seq);
                }
                false => {
                    state.slots.insert(seq, Slot::Read(Box::new(result)));
                    slot_waker.wake();
                }
            }
        }
        state.returned.remove(event_id)
    }
}

/// A publish's slot while `basic_publish` runs; dropped without [`Ticket::handed`] (the
/// hand-off failed), it frees the slot.
pub(crate) struct Ticket {
    shared: Arc<Shared>,
    seq: Option<u64>,
}

impl Ticket {
    /// `basic_publish` gave `confirm` for `event_id`: read once now (it may have resolved
    /// already), then awaited through the returned [`Tracked`].
    pub(crate) fn handed(mut self, mut confirm: PublisherConfirm, event_id: &str) -> Tracked {
        let seq = self.seq.take().expect("a ticket is handed once");
        let waker = Arc::new(SlotWaker {
            seq,
            shared: Arc::downgrade(&self.shared),
            owner: Mutex::new(None),
        });
        {
            let mut state = self.shared.state();
            let slot_waker = Waker::from(Arc::clone(&waker));
            let slot = match Pin::new(&mut confirm).poll(&mut Context::from_waker(&slot_waker)) {
                Poll::Ready(result) => {
                    state.note(event_id, &result);
                    Slot::Read(Box::new(result))
                }
                Poll::Pending => Slot::Waiting {
                    confirm,
                    waker,
                    event_id: event_id.to_owned(),
                    orphan: false,
                },
            };
            state.slots.insert(seq, slot);
            state.handing.remove(&seq);
        }
        self.shared.handed.notify_waiters();
        Tracked {
            shared: Arc::clone(&self.shared),
            seq,
            done: false,
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let Some(seq) = self.seq.take() {
            self.shared.state().handing.remove(&seq);
            self.shared.handed.notify_waiters();
        }
    }
}

/// A publish's confirm, read through its channel's [`Confirms`] (the carrier of another
/// message's return notes it as it is read).
pub(crate) struct Tracked {
    shared: Arc<Shared>,
    seq: u64,
    done: bool,
}

impl Future for Tracked {
    type Output = lapin::Result<Confirmation>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let seq = self.seq;
        let shared = Arc::clone(&self.shared);
        let mut state = shared.state();
        let result = match state.slots.get_mut(&seq) {
            Some(Slot::Waiting {
                confirm,
                waker,
                event_id,
                ..
            }) => {
                waker.set_owner(cx.waker());
                let slot_waker = Waker::from(Arc::clone(waker));
                match Pin::new(confirm).poll(&mut Context::from_waker(&slot_waker)) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(result) => {
                        let carrier = std::mem::take(event_id);
                        state.note(&carrier, &result);
                        result
                    }
                }
            }
            Some(Slot::Read(_)) => match state.slots.remove(&seq) {
                Some(Slot::Read(result)) => *result,
                _ => unreachable!("the slot was read"),
            },
            // Not reachable: a Tracked exists once its slot was handed, and only it
            // removes the slot.
            None => Err(lapin::ErrorKind::FutureCompleted.into()),
        };
        state.slots.remove(&seq);
        drop(state);
        self.done = true;
        Poll::Ready(result)
    }
}

impl Drop for Tracked {
    /// An abandoned confirm (a publish timeout) stays to be read for a return it may
    /// carry; one already read is forgotten.
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut state = self.shared.state();
        match state.slots.get_mut(&self.seq) {
            Some(Slot::Waiting { orphan, .. }) => *orphan = true,
            _ => {
                state.slots.remove(&self.seq);
            }
        }
    }
}

/// The waker lapin holds for a slot's confirm: notes the slot as woken for the next
/// harvest, then wakes the slot's owner.
struct SlotWaker {
    seq: u64,
    shared: Weak<Shared>,
    owner: Mutex<Option<Waker>>,
}

impl SlotWaker {
    fn set_owner(&self, waker: &Waker) {
        let mut owner = self
            .owner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if !owner.as_ref().is_some_and(|known| known.will_wake(waker)) {
            *owner = Some(waker.clone());
        }
    }
}

impl Wake for SlotWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if let Some(shared) = self.shared.upgrade() {
            shared
                .woken
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .push(self.seq);
        }
        let owner = self
            .owner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        if let Some(owner) = owner {
            owner.wake();
        }
    }
}
