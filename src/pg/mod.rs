//! PostgreSQL, as every part of onceflow that talks to it needs it: the PostgreSQL sink, the
//! HTTP sink's deduplication, the outbox relay and `onceflow reconcile`.
//!
//! * connecting: the connection settings of a URL (TLS as its `sslmode` says, [`tls`]), and a
//!   client opened with its connection task;
//! * [`PgError`], what can go wrong, and its [`Class`]: what a database error means for the
//!   call that met it;
//! * the tables kept beside the user's (the inbox, its origins, the deletion markers): their
//!   names and DDL, creating them when missing, removing expired rows;
//! * reading an inbox: which messages it holds, and where each came from;
//! * how a consumed record becomes a row of a PostgreSQL output and a message of its inbox:
//!   what the sink writes, and what reconcile expects to find.

mod connect;
mod error;
mod inbox;
mod row;
mod tables;
pub mod tls;

pub(crate) use connect::{AbortOnDrop, client_config, open};
pub use error::{Class, PgError};
pub(crate) use error::{class_of, class_of_sqlstate, describe};
pub(crate) use inbox::InboxReader;
pub(crate) use row::Mapping;
pub use row::RecordError;
pub(crate) use tables::{
    cleanup_inbox, cleanup_inbox_and_origins, cleanup_tombstones, ensure_origins, ensure_tables,
    ident, origins_table, qualified, tombstones_table,
};
