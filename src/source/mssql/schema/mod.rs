//! Validation on first use: the catalog facts the sources read, and every check with the message that says
//! what to do. Pure functions of the facts, so each message is tested without a server.
//!
//! Three concerns, each a file: `facts` (what the catalog answered), `checks` (the table, its key and columns,
//! and the shape each source reads), `partition` (a rowversion source's partition column).

mod checks;
mod facts;
mod partition;

pub use checks::{
    change_tracking_database, change_tracking_shape, change_tracking_table, readable_table, rowversion_shape,
};
pub use facts::{ColumnFacts, DatabaseFacts, TableFacts};
pub use partition::{check_partition_column, inline_partition_warning, PartitionColumnFacts};

#[cfg(test)]
mod tests;
