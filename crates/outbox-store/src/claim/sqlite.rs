//! The claim on SQLite: one `UPDATE … RETURNING` over the candidates, outside any
//! explicit transaction. The statement runs under the database's write lock, which
//! serialises claims (no row locks, no claim lock).

use super::lease_returning;
use crate::dialect::{Dialect, Params};
use crate::row::ClaimedRow;
use crate::store::SeaOrmStore;
use chrono::Utc;
use outbox_core::ClaimRequest;
use sea_orm::{DbErr, FromQueryResult};

pub(super) async fn claim(
    store: &SeaOrmStore,
    request: &ClaimRequest,
) -> Result<Vec<ClaimedRow>, DbErr> {
    let mut params = Params::new(Dialect::Sqlite);
    let sql = lease_returning(
        Dialect::Sqlite,
        store.table(),
        &mut params,
        Utc::now(),
        request,
    );
    ClaimedRow::find_by_statement(params.statement(sql))
        .all(store.connection())
        .await
}
