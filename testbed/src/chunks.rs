//! Reading a source's backfill chunks directly, as the source tests do: `backfill_chunk` with no live changes
//! handed over before the chunk (`ChunkRequest::live` is `Null`), answering its rows. A source that cannot
//! place the chunk now (`ChunkRead::Later`) is an error here, with its reason.

use sql_pseudo_trigger::source::{ChunkRead, ChunkRequest, Fetched, Filter, Position, Source, SourceError};

/// See the module docs.
#[async_trait::async_trait]
pub trait ChunkRows {
    /// Up to `limit` rows after key position `after`, up to `upto` when re-reading, of the backfill bounded by
    /// `bound`.
    async fn chunk_rows(
        &self,
        bound: &Position,
        after: &Position,
        upto: Option<&Position>,
        filter: Option<&Filter>,
        limit: usize,
    ) -> Result<Fetched, SourceError>;
}

#[async_trait::async_trait]
impl<S: Source + ?Sized> ChunkRows for S {
    async fn chunk_rows(
        &self,
        bound: &Position,
        after: &Position,
        upto: Option<&Position>,
        filter: Option<&Filter>,
        limit: usize,
    ) -> Result<Fetched, SourceError> {
        let live = Position::Null;
        match self.backfill_chunk(ChunkRequest { bound, after, upto, filter, limit, live: &live }).await? {
            ChunkRead::Rows(fetched) => Ok(fetched),
            ChunkRead::Later(why) => Err(SourceError::Unavailable(format!("no chunk now: {why}"))),
        }
    }
}
