//! [`Scheduler`]: decides when the Fetcher claims.

use crate::fetcher::{Tick, TickReport};
use actix::prelude::*;
use std::time::Duration;
use tracing::warn;

/// "Claim again": outcomes were written (freeing capacity and unblocking keys), or the
/// database announced inserts.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct Wake;

/// Stops the ticks (first step of a shutdown).
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct StopTicking;

/// Sends [`Tick`] at start, every `poll_interval`, at once again while claims come back full
/// (drain mode), and on [`Wake`]. One Tick at a time: ticks that fall due while a claim
/// runs are folded into one follow-up.
pub struct Scheduler {
    /// Where ticks go.
    fetcher: Recipient<Tick>,
    /// Fallback cadence when nothing else wakes the relay.
    poll_interval: Duration,
    /// A Tick is awaiting its report.
    claiming: bool,
    /// Another Tick fell due meanwhile.
    again: bool,
}

impl Scheduler {
    /// A scheduler ticking `fetcher`.
    pub fn new(fetcher: Recipient<Tick>, poll_interval: Duration) -> Self {
        Self {
            fetcher,
            poll_interval,
            claiming: false,
            again: false,
        }
    }

    fn tick(&mut self, ctx: &mut Context<Self>) {
        if self.claiming {
            self.again = true;
            return;
        }
        self.claiming = true;
        self.again = false;
        self.fetcher
            .send(Tick)
            .into_actor(self)
            .map(|report, scheduler, ctx| {
                scheduler.claiming = false;
                match report {
                    Ok(TickReport { full: true, .. }) => scheduler.tick(ctx),
                    Ok(_) if scheduler.again => scheduler.tick(ctx),
                    Ok(_) => {}
                    Err(error) => {
                        warn!(%error, "fetcher is gone; scheduler stops");
                        ctx.stop();
                    }
                }
            })
            .spawn(ctx);
    }
}

impl Actor for Scheduler {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.tick(ctx);
        ctx.run_interval(self.poll_interval, |scheduler, ctx| scheduler.tick(ctx));
    }
}

impl Handler<Wake> for Scheduler {
    type Result = ();

    fn handle(&mut self, _: Wake, ctx: &mut Self::Context) {
        self.tick(ctx);
    }
}

impl Handler<StopTicking> for Scheduler {
    type Result = ();

    fn handle(&mut self, _: StopTicking, ctx: &mut Self::Context) {
        ctx.stop();
    }
}
