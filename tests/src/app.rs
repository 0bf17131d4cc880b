//! The test rig: one call gives a test its outbox table, its exchange and queue, the
//! settings for both and a running relay ([`TestApp::on`] … [`AppBuilder::spawn`]); one
//! call takes it all down again ([`TestApp::teardown`]).

use crate::relay::InProcessRelay;
use crate::{assert_every_event_delivered, seed, unique_name, Backend, TestBroker, TestDatabase};
use outbox_relay::settings::{Config, Settings};
use outbox_store::{NewEvent, TableName};
use std::time::Duration;

/// Settings for a relay on `database` and `broker`, fast enough for tests, adjusted by
/// `adjust`.
pub fn test_settings(
    database: &TestDatabase,
    broker: &TestBroker,
    adjust: impl FnOnce(&mut Settings),
) -> Settings {
    settings_on(&database.url, &database.table, broker, adjust)
}

/// [`test_settings`] for a table on a database the test set up itself (`url`).
pub fn settings_on(
    url: &str,
    table: &TableName,
    broker: &TestBroker,
    adjust: impl FnOnce(&mut Settings),
) -> Settings {
    let mut settings = Settings::default();
    settings.database.url = url.to_owned();
    settings.database.table = table.as_str().to_owned();
    settings.database.migrate_on_start = false;
    settings.amqp.url = broker.url.clone();
    settings.amqp.exchange = broker.exchange.clone();
    settings.relay.node_id = unique_name("node");
    settings.relay.poll_interval = "100ms".into();
    settings.relay.publish_timeout = "3s".into();
    settings.metrics.listen = "".into();
    adjust(&mut settings);
    settings
}

/// [`test_settings`], validated as the binary would.
pub fn test_config(
    database: &TestDatabase,
    broker: &TestBroker,
    adjust: impl FnOnce(&mut Settings),
) -> Config {
    validate(test_settings(database, broker, adjust))
}

fn validate(settings: Settings) -> Config {
    settings
        .validate()
        .unwrap_or_else(|errors| panic!("test settings are invalid: {errors:?}"))
}

/// What one test runs against: a fresh table, a fresh exchange with a queue the test
/// reads, the settings for both, and (once started) a relay in the test's actix system.
pub struct TestApp {
    /// The test's outbox table.
    pub database: TestDatabase,
    /// The test's exchange and the consumer of its queue.
    pub broker: TestBroker,
    /// The settings of the relay, also for running the binary on the same table.
    pub settings: Settings,
    /// The same, validated: what the in-process relay runs with.
    pub config: Config,
    /// The in-process relay, while it runs.
    relay: Option<InProcessRelay>,
}

/// A change a test makes to its settings or config.
type Adjust<'a, T> = Box<dyn FnOnce(&mut T) + 'a>;

/// How [`TestApp::on`] sets a test up; [`AppBuilder::spawn`] or [`AppBuilder::build`]
/// makes it.
#[must_use = "nothing is set up until `spawn` or `build`"]
pub struct AppBuilder<'a> {
    backend: Backend,
    binding: &'a str,
    adjust_settings: Vec<Adjust<'a, Settings>>,
    adjust_config: Vec<Adjust<'a, Config>>,
    events: &'a [NewEvent],
}

impl<'a> AppBuilder<'a> {
    /// The queue's binding key on the test's exchange (default `"#"`: everything).
    pub fn binding(mut self, binding: &'a str) -> Self {
        self.binding = binding;
        self
    }

    /// Changes the settings (after the test defaults of [`test_settings`]).
    pub fn settings(mut self, adjust: impl FnOnce(&mut Settings) + 'a) -> Self {
        self.adjust_settings.push(Box::new(adjust));
        self
    }

    /// Changes the validated config, for what the settings cannot express in a test.
    pub fn config(mut self, adjust: impl FnOnce(&mut Config) + 'a) -> Self {
        self.adjust_config.push(Box::new(adjust));
        self
    }

    /// Events inserted before the relay starts (a backlog).
    pub fn seeded(mut self, events: &'a [NewEvent]) -> Self {
        self.events = events;
        self
    }

    /// Table, exchange, queue and settings, seeded; no relay yet ([`TestApp::start`], or
    /// run the binary with [`TestApp::settings`]).
    pub async fn build(self) -> TestApp {
        let database = TestDatabase::new(self.backend).await;
        let broker = TestBroker::new(self.binding).await;
        let settings = test_settings(&database, &broker, |settings| {
            for adjust in self.adjust_settings {
                adjust(settings);
            }
        });
        let mut config = validate(settings.clone());
        for adjust in self.adjust_config {
            adjust(&mut config);
        }
        seed(&database, self.events).await;
        TestApp {
            database,
            broker,
            settings,
            config,
            relay: None,
        }
    }

    /// [`AppBuilder::build`], with the relay started.
    pub async fn spawn(self) -> TestApp {
        let mut app = self.build().await;
        app.start().await;
        app
    }
}

impl TestApp {
    /// Begins setting up a test on `backend`.
    pub fn on<'a>(backend: Backend) -> AppBuilder<'a> {
        AppBuilder {
            backend,
            binding: "#",
            adjust_settings: Vec::new(),
            adjust_config: Vec::new(),
            events: &[],
        }
    }

    /// Starts the in-process relay with [`TestApp::config`].
    pub async fn start(&mut self) {
        assert!(self.relay.is_none(), "the relay is already running");
        self.relay = Some(InProcessRelay::start(&self.config).await);
    }

    /// Shuts the in-process relay down gracefully, as on SIGTERM.
    pub async fn stop(&mut self) {
        self.relay
            .take()
            .expect("the relay is not running")
            .stop()
            .await;
    }

    /// The app's settings, changed by `adjust`: another node on the same table, or another
    /// way to reach the same services.
    pub fn settings_with(&self, adjust: impl FnOnce(&mut Settings)) -> Settings {
        let mut settings = self.settings.clone();
        adjust(&mut settings);
        settings
    }

    /// [`TestApp::settings_with`], validated.
    pub fn config_with(&self, adjust: impl FnOnce(&mut Settings)) -> Config {
        validate(self.settings_with(adjust))
    }

    /// Waits (30 s at most) until every one of `events` arrived and the queue settled (so a
    /// late duplicate is counted too), checks that each room's first deliveries came in id
    /// order, and prints the count of duplicates for `test`; returns that count.
    pub async fn expect_every_event(&self, test: &str, events: &[NewEvent]) -> usize {
        self.broker
            .wait_for_each(events, Duration::from_secs(30))
            .await;
        let received = self.broker.drain(Duration::from_secs(30)).await;
        // Names the first event still missing, if any.
        let duplicates = assert_every_event_delivered(&received, events);
        println!(
            "{test}: {} deliveries for {} events, {duplicates} duplicates",
            received.len(),
            events.len()
        );
        duplicates
    }

    /// [`TestApp::expect_every_event`], and no duplicate: for a run with no crash, where
    /// the docs promise none.
    pub async fn expect_every_event_once(&self, test: &str, events: &[NewEvent]) {
        let duplicates = self.expect_every_event(test, events).await;
        assert_eq!(
            duplicates, 0,
            "{test}: {duplicates} duplicate deliveries, where the docs promise none"
        );
    }

    /// Stops the relay if it still runs, then deletes the exchange (the queue goes with
    /// it) and the table. Call at the end of a passing test; after a failing one the
    /// database's and the broker's drop guards do the same.
    pub async fn teardown(mut self) {
        if self.relay.is_some() {
            self.stop().await;
        }
        self.broker.close().await;
        self.database.drop_table().await;
    }
}
