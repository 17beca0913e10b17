//! Synor Compute's money, apart from HTTP and the engine (DESIGN.md,
//! "Workspace and seams"):
//!
//! - `store`: the database (SQLite or Postgres, one schema through sqlx
//!   migrations), API keys and provider workers' records;
//! - `ledger`: the double-entry ledger: accounts, holds, settlement
//!   exactly once, recovery of a stopped server's holds, the audit;
//! - `market`: the spot market: prices, the order book, contracts.
//!
//! The server drives them; nothing here knows of requests, models or
//! workers' sockets.

pub mod ledger;
pub mod market;
pub mod store;
