//! A steady producer for tests that watch a relay at work (the dashboard, `top`): a few
//! events every tick, until dropped.

use crate::{event, TestDatabase};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// Inserts `per_tick` events (rooms `room-0`…) every `tick` on the test's actix system;
/// stops when dropped (an insert under way still commits) or [`Load::stop`]ped.
pub struct Load {
    running: Rc<AtomicBool>,
    inserted: Rc<AtomicU64>,
    task: Option<actix_rt::task::JoinHandle<()>>,
}

impl Load {
    /// Starts inserting into `database`'s table.
    pub fn start(database: &TestDatabase, per_tick: usize, tick: Duration) -> Self {
        Self::named("load", database, per_tick, tick)
    }

    /// [`Load::start`], its event ids beginning with `prefix` (one per load on a table).
    pub fn named(prefix: &str, database: &TestDatabase, per_tick: usize, tick: Duration) -> Self {
        let prefix = prefix.to_owned();
        let running = Rc::new(AtomicBool::new(true));
        let inserted = Rc::new(AtomicU64::new(0));
        let (db, table) = (database.db().clone(), database.table.clone());
        let (going, count) = (Rc::clone(&running), Rc::clone(&inserted));
        let task = actix_rt::spawn(async move {
            let mut ticks = tokio::time::interval(tick);
            let mut n = 0_u64;
            while going.load(Ordering::SeqCst) {
                ticks.tick().await;
                let events: Vec<_> = (0..per_tick)
                    .map(|i| event(&format!("{prefix}-{n:06}-{i}"), &format!("room-{i}")))
                    .collect();
                outbox_store::insert_events(&db, &table, &events)
                    .await
                    .expect("the load's insert");
                count.fetch_add(events.len() as u64, Ordering::SeqCst);
                n += 1;
            }
        });
        Self {
            running,
            inserted,
            task: Some(task),
        }
    }

    /// Stops inserting, once the insert under way committed: every event it inserted is in
    /// the table when this returns.
    pub async fn stop(mut self) {
        self.running.store(false, Ordering::SeqCst);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }

    /// Events inserted so far.
    pub fn inserted(&self) -> u64 {
        self.inserted.load(Ordering::SeqCst)
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.running.store(false, Ordering::SeqCst);
    }
}
