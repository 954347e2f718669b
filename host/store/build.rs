//! `sqlx::migrate!` embeds the migration files it finds when the crate is
//! compiled; a migration added later is not a change to any of this crate's
//! files, so without this an incremental build would keep serving the old set
//! (sqlx's documented remedy: rerun when the directories change).
fn main() {
    println!("cargo:rerun-if-changed=../../migrations/sqlite");
    println!("cargo:rerun-if-changed=../../migrations/postgres");
}
