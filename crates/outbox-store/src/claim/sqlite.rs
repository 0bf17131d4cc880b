//! The claim on SQLite: one `UPDATE … RETURNING` over the candidates, outside any
//! explicit transaction. The statement runs under the database's write lock, which
//! serialises claims (no row locks, no claim lock).

use super::{Claim, Leased};
use sea_orm::{DatabaseConnection, DbErr};

pub(super) async fn claim(db: &DatabaseConnection, claim: &Claim<'_>) -> Result<Leased, DbErr> {
    let statement = claim.lease_returning();
    Leased::run_returning(db, statement, claim.reads).await
}
