//! A start against a migrated PostgreSQL table logs none of the server's notices about
//! `IF NOT EXISTS` / `IF EXISTS` statements it skipped.

use outbox_tests::{http_get, Backend, RelayProcess, TestApp};
use std::time::Duration;

#[actix_rt::test]
async fn a_start_on_a_migrated_postgres_table_logs_no_skipping_notice() {
    // TestApp's table is migrated already: `migrate_on_start` finds every step recorded.
    let app = TestApp::on(Backend::Postgres).build().await;
    let mut settings = app.settings.clone();
    settings.database.migrate_on_start = true;
    settings.metrics.listen = "127.0.0.1:0".into();
    settings.log.format = "json".into();
    let relay = RelayProcess::spawn(crate::RELAY, &settings);
    let address = relay.metrics_address().await;
    outbox_tests::eventually("/readyz 200", Duration::from_secs(30), || async {
        http_get(address, "/readyz").await.0 == 200
    })
    .await;
    let log = relay.log_text();
    relay.stop(Duration::from_secs(10)).await;
    for notice in ["skipping", "already exists", "does not exist"] {
        assert!(
            !log.contains(notice),
            "a server notice ({notice:?}) in the log:\n{log}"
        );
    }
    app.teardown().await;
}
