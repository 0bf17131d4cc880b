//! A least-privilege role (docs/security.md#database-privileges): with `migrate` run by
//! the table's owner, a relay whose role has only `SELECT, INSERT, UPDATE, DELETE` on the
//! outbox and its companion tables delivers every event; `check-config` and `run` name a
//! privilege it lacks (exit code 2) instead of the first claim failing.

use outbox_tests::output::{stderr, stdout};
use outbox_tests::{room_events, run_binary, unique_name, Backend, RelayProcess, TestApp};
use std::time::Duration;

/// A role of the test's database that may only read and write the outbox's rows, dropped
/// on drop (also when the test fails first).
struct RelayRole {
    name: String,
    password: String,
    admin_url: String,
    backend: Backend,
    /// What to revoke before the role can be dropped.
    tables: Vec<String>,
}

impl RelayRole {
    /// Creates the role and grants it the statements of docs/security.md#database-privileges.
    async fn create(backend: Backend, admin_url: &str, table: &str) -> Self {
        let name = unique_name("relay_role");
        let password = "Role-pw-2c81".to_owned();
        let tables: Vec<String> = ["", "_lock", "_migrations"]
            .iter()
            .map(|suffix| format!("{table}{suffix}"))
            .collect();
        let grantee = Self::grantee(backend, &name);
        let mut statements = match backend {
            Backend::Postgres => vec![format!("CREATE ROLE {name} LOGIN PASSWORD '{password}'")],
            _ => vec![format!("CREATE USER {grantee} IDENTIFIED BY '{password}'")],
        };
        for table in &tables {
            statements.push(format!(
                "GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO {grantee}"
            ));
        }
        if backend == Backend::Postgres {
            statements.push(format!(
                "GRANT USAGE ON SEQUENCE {table}_id_seq TO {grantee}"
            ));
        }
        run(admin_url, &statements).await;
        Self {
            name,
            password,
            admin_url: admin_url.to_owned(),
            backend,
            tables,
        }
    }

    fn grantee(backend: Backend, name: &str) -> String {
        match backend {
            Backend::Postgres => name.to_owned(),
            _ => format!("'{name}'@'%'"),
        }
    }

    /// `admin_url` with this role's login.
    fn url(&self) -> String {
        let mut url = url::Url::parse(&self.admin_url).expect("a URL");
        url.set_username(&self.name).unwrap();
        url.set_password(Some(&self.password)).unwrap();
        url.into()
    }

    /// Takes `privilege` on `table` away.
    async fn revoke(&self, privilege: &str, table: &str) {
        let grantee = Self::grantee(self.backend, &self.name);
        run(
            &self.admin_url,
            &[format!("REVOKE {privilege} ON {table} FROM {grantee}")],
        )
        .await;
    }
}

impl Drop for RelayRole {
    fn drop(&mut self) {
        let grantee = Self::grantee(self.backend, &self.name);
        let mut statements: Vec<String> = match self.backend {
            Backend::Postgres => self
                .tables
                .iter()
                .map(|table| format!("REVOKE ALL ON {table} FROM {grantee}"))
                .chain([format!(
                    "REVOKE ALL ON SEQUENCE {}_id_seq FROM {grantee}",
                    self.tables[0]
                )])
                .collect(),
            _ => Vec::new(),
        };
        statements.push(match self.backend {
            Backend::Postgres => format!("DROP ROLE IF EXISTS {}", self.name),
            _ => format!("DROP USER IF EXISTS {grantee}"),
        });
        let url = self.admin_url.clone();
        // Off the test's runtime, which may be unwinding.
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Runtime::new().expect("a runtime");
            runtime.block_on(async {
                if let Ok(db) = outbox_store::connect(&url, 1)
                    .await
                    .map(outbox_store::Pool::into_connection)
                {
                    for sql in statements {
                        let _ = sea_orm::ConnectionTrait::execute_unprepared(&db, &sql).await;
                    }
                    let _ = db.close().await;
                }
            });
        })
        .join();
    }
}

/// Runs `statements` as the administrator of `url`.
async fn run(url: &str, statements: &[String]) {
    let db = outbox_store::connect(url, 1)
        .await
        .expect("database")
        .into_connection();
    for sql in statements {
        sea_orm::ConnectionTrait::execute_unprepared(&db, sql)
            .await
            .unwrap_or_else(|error| panic!("{sql}: {error}"));
    }
    let _ = db.close().await;
}

async fn a_dml_only_role_relays_and_a_missing_privilege_is_named(backend: Backend) {
    const EVENTS: usize = 300;
    let events = room_events("least", EVENTS, 10);
    // The test's table is migrated by its owner (the administrator) already.
    let app = TestApp::on(backend)
        .settings(|settings| settings.log.format = "json".into())
        .seeded(&events)
        .build()
        .await;
    let table = app.database.table.as_str().to_owned();
    let role = RelayRole::create(backend, &app.settings.database.url, &table).await;
    let settings = app.settings_with(|settings| {
        settings.database.url = role.url();
        // The owner migrated already: with nothing to apply, the role starts all the same.
        settings.database.migrate_on_start = true;
    });

    let output = run_binary(crate::RELAY, &settings, &["check-config"]);
    let out = outbox_tests::output::succeeded("check-config as the DML role", &output);
    assert!(
        out.contains("fits the mapping and the role's privileges"),
        "{out}"
    );

    let relay = RelayProcess::spawn(crate::RELAY, &settings);
    // Least privilege changes nothing of what the relay promises: no duplicates either.
    app.expect_every_event_once(&format!("{backend:?}: a DML-only role"), &events)
        .await;
    relay.stop(Duration::from_secs(5)).await;

    role.revoke("UPDATE", &table).await;
    let output = run_binary(crate::RELAY, &settings, &["check-config"]);
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(2), "{}\n{err}", stdout(&output));
    let qualified = match backend {
        Backend::Postgres => format!("public.{table}"),
        _ => format!("test.{table}"),
    };
    let grantee = RelayRole::grantee(backend, &role.name);
    for says in [
        format!("outbox {table}: role {grantee} lacks UPDATE on {qualified}"),
        format!("GRANT UPDATE ON {qualified} TO {grantee}"),
    ] {
        assert!(err.contains(&says), "says {says:?}: {err}");
    }
    assert!(!err.contains(&role.password), "{err}");
    // `run` refuses the same at start, before any claim.
    let mut relay = RelayProcess::spawn(crate::RELAY, &settings);
    let status = relay.wait(Duration::from_secs(15)).await;
    let log = relay.log_text();
    assert_eq!(status.code(), Some(2), "{log}");
    assert!(log.contains("lacks UPDATE on"), "{log}");
    let _ = std::fs::remove_file(&relay.log);
    drop(role);
    app.teardown().await;
}
outbox_tests::per_backend!(a_dml_only_role_relays_and_a_missing_privilege_is_named: postgres, mariadb);
