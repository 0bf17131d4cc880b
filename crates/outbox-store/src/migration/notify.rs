//! PostgreSQL's insert trigger `<table>_notify`, which NOTIFYs a relay that LISTENs
//! (`database.notify = true`): `migrate` creates it, makes it NOTIFY only a sleeping
//! relay, and leaves it disabled, because an enabled trigger costs every producer's
//! insert whether a relay LISTENs or not; [`enable_notify`] enables it where a relay
//! LISTENs. Why: docs/decisions/0042-producers-pay-nothing-by-default.md.

use super::{lock, online, unlock, Context, PlannedStep};
use crate::dialect::{Dialect, Params};
use crate::error::Error;
use crate::sql::TableName;
use sea_orm::{ConnectionTrait, DatabaseConnection};

/// The migration that creates the insert trigger.
pub(super) const CREATE_NOTIFY: &str = "m20261202_000003_create_room_outbox_notify";

/// The migration that leaves the insert trigger disabled.
pub(super) const DISABLE_NOTIFY: &str = "m20261206_000010_disable_room_outbox_notify";

/// The name `migrate` reports for [`enable_notify`]: not recorded, since it follows the
/// settings of the day (`database.notify`), not the table's history.
pub const ENABLE_NOTIFY: &str = "enable_room_outbox_notify";

/// The comment on the insert trigger [`disable_notify`] disabled: it tells a DBA who
/// finds a disabled trigger why, and how it comes back. (No quote in it: it goes into the
/// statement as a literal.)
pub(super) const LEFT_DISABLED: &str = "outbox-relay: NOTIFYs a relay that LISTENs; \
     disabled by migrate, as it costs every insert; migrate enables it where \
     database.notify = true";

/// What [`enable_notify`] locks (`migrate --dry-run`).
const ENABLE_LOCKS: &str = "SHARE ROW EXCLUSIVE on the table for ENABLE TRIGGER: milliseconds; at most 100 ms waiting for the lock, retried";

/// PostgreSQL: NOTIFY the channel named after the table once per INSERT statement (not
/// per row), delivered at commit; the relay LISTENs and claims at once. Other backends
/// keep polling.
pub(super) fn create_notify(cx: &Context<'_>) -> Result<Vec<String>, Error> {
    let t = cx.table;
    if cx.dialect != Dialect::Postgres {
        return Ok(Vec::new());
    }
    let notify = t.notify_trigger();
    let mut statements = vec![
        format!(
            "CREATE OR REPLACE FUNCTION {notify}() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN PERFORM pg_notify('{t}', ''); RETURN NULL; END $$"
        ),
        format!("DROP TRIGGER IF EXISTS {notify} ON {t}"),
        format!(
            "CREATE TRIGGER {notify} AFTER INSERT ON {t} \
             FOR EACH STATEMENT EXECUTE FUNCTION {notify}()"
        ),
    ];
    if cx.adopting {
        // Adopting a live table: no relay can claim before the finishing step has numbered
        // the rows and built the indexes, so a NOTIFY would wake nobody; but every
        // NOTIFYing commit holds a lock through its flush, so while the backfill and the
        // index builds keep the disk busy the producers' commits would take turns behind
        // each slow flush (BENCHMARKS.md, "Adopting a live table"). [`disable_notify`]
        // keeps it so, and [`enable_notify`] enables it for a relay that LISTENs once the
        // adoption has finished.
        statements.push(format!("ALTER TABLE {t} DISABLE TRIGGER {notify}"));
        statements.push(format!(
            "COMMENT ON TRIGGER {notify} ON {t} IS '{}'",
            online::DISABLED_UNTIL_FINISHED
        ));
    }
    Ok(statements)
}

/// PostgreSQL: the insert trigger NOTIFYs only while a relay sleeps. Its `WHEN` tries
/// the wake lock ([`TableName::wake_lock`]) in shared mode: that
/// fails only while a relay holds it, which a relay does while it waits on its LISTEN
/// connection with nothing to claim, and lets go when woken. A producer's commit that
/// NOTIFYs takes a cluster-wide lock through its flush, so NOTIFYing commits take turns
/// instead of sharing flushes (group commit); with no relay asleep, or none running, a
/// producer's insert pays one shared lock, held to its commit, and NOTIFYs nothing. The
/// trigger is replaced as it is: missing stays missing, disabled stays disabled, its
/// comment (an adoption under way) is kept. Why: docs/design/wake-ups.md#notify-only-a-sleeping-relay.
pub(super) fn wake_sleepers(cx: &Context<'_>) -> Result<Vec<String>, Error> {
    let t = cx.table;
    if cx.dialect != Dialect::Postgres {
        return Ok(Vec::new());
    }
    let notify = t.notify_trigger();
    let key = t.wake_lock();
    Ok(vec![on_the_trigger(
        t,
        &format!(
            "DROP TRIGGER {notify} ON {t}; \
             CREATE TRIGGER {notify} AFTER INSERT ON {t} FOR EACH STATEMENT \
             WHEN (NOT pg_try_advisory_xact_lock_shared({key})) EXECUTE FUNCTION {notify}(); \
             IF state = 'D' THEN ALTER TABLE {t} DISABLE TRIGGER {notify}; END IF; \
             IF note IS NOT NULL THEN EXECUTE format('COMMENT ON TRIGGER {notify} ON {t} IS %L', note); END IF;"
        ),
    )])
}

/// A PL/pgSQL block that reads the table's insert trigger's state (`state`, its
/// `tgenabled`) and comment (`note`), then runs `body`; nothing when there is no trigger.
fn on_the_trigger(t: &TableName, body: &str) -> String {
    let notify = t.notify_trigger();
    format!(
        "DO $do$ DECLARE state \"char\"; note text; BEGIN \
         SELECT tgenabled, obj_description(oid, 'pg_trigger') INTO state, note FROM pg_trigger \
         WHERE tgrelid = '{t}'::regclass AND tgname = '{notify}'; \
         IF NOT FOUND THEN RETURN; END IF; \
         {body} END $do$"
    )
}

/// PostgreSQL: the insert trigger disabled. Even when it NOTIFYs nobody, an enabled
/// statement trigger costs every producer's insert a share of its commits/s
/// (BENCHMARKS.md#what-the-relay-costs-producers), and a relay that does
/// not LISTEN needs none: it probes. A trigger disabled already keeps its comment (an
/// operator's reason), except the adoption's, which says it waits for the adoption to
/// finish. [`enable_notify`] enables it where a relay LISTENs.
pub(super) fn disable_notify(cx: &Context<'_>) -> Result<Vec<String>, Error> {
    let t = cx.table;
    if cx.dialect != Dialect::Postgres {
        return Ok(Vec::new());
    }
    let notify = t.notify_trigger();
    Ok(vec![on_the_trigger(
        t,
        &format!(
            "IF state <> 'D' THEN ALTER TABLE {t} DISABLE TRIGGER {notify}; END IF; \
             IF state <> 'D' OR note = '{until_finished}' THEN \
             COMMENT ON TRIGGER {notify} ON {t} IS '{LEFT_DISABLED}'; END IF;",
            until_finished = online::DISABLED_UNTIL_FINISHED,
        ),
    )])
}

/// The statements that enable the insert trigger and drop its comment.
fn enable_statements(table: &TableName) -> Vec<String> {
    let notify = table.notify_trigger();
    vec![
        format!("ALTER TABLE {table} ENABLE TRIGGER {notify}"),
        format!("COMMENT ON TRIGGER {notify} ON {table} IS NULL"),
    ]
}

/// The insert trigger's state: `None` when there is none (or not on PostgreSQL), else
/// whether it is enabled and its comment.
async fn trigger_state<C: ConnectionTrait>(
    db: &C,
    table: &TableName,
) -> Result<Option<(bool, Option<String>)>, Error> {
    if Dialect::of(db) != Dialect::Postgres {
        return Ok(None);
    }
    let mut params = Params::new(Dialect::Postgres);
    let (relation, name) = (
        params.bind(table.as_str()),
        params.bind(table.notify_trigger()),
    );
    let row = db
        .query_one(params.statement(format!(
            "SELECT tgenabled <> 'D' AS enabled, obj_description(oid, 'pg_trigger') AS note \
             FROM pg_trigger WHERE tgrelid = to_regclass({relation}) AND tgname = {name}"
        )))
        .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    Ok(Some((
        row.try_get::<bool>("", "enabled")?,
        row.try_get::<Option<String>>("", "note")?,
    )))
}

/// Whether [`enable_notify`] has something to enable in a trigger of this state: one that
/// exists and is disabled, unless it still carries the comment of an adoption whose
/// migrations have not all run ([`disable_notify`] replaces it before the finishing step).
fn to_enable(state: Option<(bool, Option<String>)>) -> bool {
    matches!(state, Some((false, note)) if note.as_deref() != Some(online::DISABLED_UNTIL_FINISHED))
}

/// PostgreSQL, for a relay that LISTENs (`database.notify = true`): enables the table's
/// insert trigger that `migrate` left disabled (or an operator disabled), under the
/// migration lock, waiting at most 100 ms at a time for the table lock and retried.
/// `true` when this call enabled it; `false` when it was enabled already, there is none
/// (a table `migrate` has not run on), an adoption's migrations have not all run on it,
/// or the backend has no trigger.
pub async fn enable_notify(db: &DatabaseConnection, table: &TableName) -> Result<bool, Error> {
    if !to_enable(trigger_state(db, table).await?) {
        return Ok(false);
    }
    online::retry_lock_timeouts(table, ENABLE_NOTIFY, || async {
        let txn = lock(db, table).await?;
        let enabled = async {
            if !to_enable(trigger_state(&txn, table).await?) {
                return Ok::<_, Error>(false);
            }
            for statement in enable_statements(table) {
                txn.execute_unprepared(&statement).await?;
            }
            Ok(true)
        }
        .await;
        unlock(txn, table, enabled).await
    })
    .await
}

/// What [`enable_notify`] would do after the steps `planned` (`migrate --dry-run` of a
/// relay that LISTENs): the step when the trigger is disabled now, or the planned steps
/// leave it so.
pub async fn plan_enable_notify(
    db: &DatabaseConnection,
    table: &TableName,
    planned: &[PlannedStep],
) -> Result<Option<PlannedStep>, Error> {
    if Dialect::of(db) != Dialect::Postgres {
        return Ok(None);
    }
    let state = trigger_state(db, table).await?;
    let planned_step = |name: &str| planned.iter().any(|step| step.name == name);
    let disabled_by_plan =
        planned_step(DISABLE_NOTIFY) && (state.is_some() || planned_step(CREATE_NOTIFY));
    Ok((disabled_by_plan || to_enable(state)).then(|| PlannedStep {
        name: ENABLE_NOTIFY,
        statements: enable_statements(table),
        locks: ENABLE_LOCKS,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::columns::Columns;

    /// A migration that has shipped must not change.
    #[test]
    fn the_wake_sleepers_block_is_as_shipped() {
        let t = TableName::parse("room_outbox").unwrap();
        let cx = Context {
            dialect: Dialect::Postgres,
            table: &t,
            columns: &Columns::default(),
            shape: None,
            adopting: false,
        };
        let (notify, key) = (t.notify_trigger(), t.wake_lock());
        let shipped = format!(
            "DO $do$ DECLARE state \"char\"; note text; BEGIN \
             SELECT tgenabled, obj_description(oid, 'pg_trigger') INTO state, note FROM pg_trigger \
             WHERE tgrelid = '{t}'::regclass AND tgname = '{notify}'; \
             IF NOT FOUND THEN RETURN; END IF; \
             DROP TRIGGER {notify} ON {t}; \
             CREATE TRIGGER {notify} AFTER INSERT ON {t} FOR EACH STATEMENT \
             WHEN (NOT pg_try_advisory_xact_lock_shared({key})) EXECUTE FUNCTION {notify}(); \
             IF state = 'D' THEN ALTER TABLE {t} DISABLE TRIGGER {notify}; END IF; \
             IF note IS NOT NULL THEN EXECUTE format('COMMENT ON TRIGGER {notify} ON {t} IS %L', note); END IF; \
             END $do$"
        );
        assert_eq!(wake_sleepers(&cx).unwrap(), [shipped]);
        let disable = &disable_notify(&cx).unwrap()[0];
        assert!(disable.starts_with("DO $do$ DECLARE state"), "{disable}");
        assert!(
            disable.contains("IF state <> 'D' THEN ALTER TABLE room_outbox DISABLE TRIGGER room_outbox_notify; END IF;"),
            "{disable}"
        );
        assert!(disable.ends_with("END IF; END $do$"), "{disable}");
    }
}
