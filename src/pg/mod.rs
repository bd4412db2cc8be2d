//! The PostgreSQL client foundation beneath the claims store and the audit
//! trail: what both need to reach their database and keep at it.
//!
//! - `backoff`: the wait between retries after failures.
//! - `connect`: a connection as a target says, and a failure's text.
//! - `connection_string`: the one reader of PostgreSQL addresses
//!   (short forms, `postgres://` URLs, `key=value`), `%`-decoding included;
//!   `upstream_url`: the server and TLS parameters such an address names.
//! - `migration`: a shared schema's versioned migrations, each part's
//!   steps applied in one version order; `schema_client`: a connection to
//!   that schema, brought up to date or checked to be.
//! - `target`: where the database is ([`PgTarget`]), its TLS, schema and
//!   liveness bound; `credential`: its password, read at each connect;
//!   `dead_peer`: the keepalive settings that bound a partition.

pub mod backoff;
pub mod connect;
pub mod connection_string;
pub mod credential;
pub mod dead_peer;
pub mod migration;
pub mod schema_client;
pub mod target;
pub mod upstream_url;

pub use backoff::Backoff;
pub use connection_string::ConnectionStringError;
pub use credential::PASSWORD_COMMAND_TIMEOUT;
pub use migration::{Migration, SchemaMigrations};
pub use schema_client::{connect_schema, SchemaAccess, SchemaError};
pub use target::{PgTarget, TargetError, DEFAULT_LIVENESS_BOUND, DEFAULT_SCHEMA};
pub use upstream_url::{address_of, upstream_addr, url_tls_params};
