//! The stream's task: reads the replication connection ahead into the buffer, answers keepalives, reports
//! the acknowledged flush position, and ends after `streamIdleReleaseMs` without a tick, on SIGTERM, or on an
//! error (which the next tick sees, and starts the stream again). Spawned by the stream (`stream`) when it opens
//! one; it shares only the buffer (`buffer::Shared`) with it, so it depends on neither the stream nor the ticks.

use super::buffer::{Ended, Shared};
use super::decode::Decoder;
use super::position::Lsn;
use super::wire::{server_error, Wire, WireError};
use crate::source::SourceError;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the stream reports its position even when nothing changed: well inside the server's
/// `wal_sender_timeout` (60 s by default), so a stream paused on a full buffer is never cut off.
const STATUS_EVERY: Duration = Duration::from_secs(10);

/// A server that has answered nothing for this long (each periodic report asks for an answer) is gone: a
/// network that drops a connection silently would otherwise leave the stream waiting for TCP to notice, for
/// many minutes, while ticks answer empty.
const SILENCE: Duration = Duration::from_secs(45);

/// The stream's task: reads, reports, and ends as [`Ended`] says.
pub(super) async fn run(mut wire: Wire, shared: Arc<Shared>, mut decoder: Decoder, idle: Duration, slot: String) {
    let ended = match pump(&mut wire, &shared, &mut decoder, idle).await {
        Ok(ended) => ended,
        Err(e) => Ended::Failed(e),
    };
    match &ended {
        Ended::Idle => {
            tracing::info!(slot = %slot, "closed the stream of replication slot {slot} after {} ms without a tick: another instance may take the slot", idle.as_millis())
        }
        Ended::Shutdown => {
            tracing::info!(slot = %slot, "closed the stream of replication slot {slot}: the process is stopping")
        }
        Ended::Failed(_) => {}
    }
    shared.lock().ended = Some(ended);
    shared.changed.notify_waiters();
    wire.close().await;
}

async fn pump(wire: &mut Wire, shared: &Shared, decoder: &mut Decoder, idle: Duration) -> Result<Ended, SourceError> {
    let stream_error = |e: WireError| match e {
        WireError::Server { code, message } => {
            SourceError::Unavailable(format!("PostgreSQL: {message} (SQLSTATE {code})"))
        }
        WireError::Broken(m) | WireError::Misconfigured(m) => SourceError::Unavailable(m),
    };
    let mut term = Box::pin(crate::shutdown::signal());
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut reported: Option<Lsn> = None;
    let mut last_status = Instant::now();
    let mut last_heard = Instant::now();
    let mut reply_due = false;
    let mut events = Vec::new();
    loop {
        let (flush, reply, paused, idle_for) = {
            let mut b = shared.lock();
            if b.full() {
                if let Some(d) = b.delivered {
                    b.trim(d);
                }
            }
            b.paused = b.full();
            (b.flush, std::mem::take(&mut b.reply_wanted), b.paused, b.last_used.elapsed())
        };
        if idle_for > idle {
            return Ok(Ended::Idle);
        }
        if paused {
            // Not listening: the silence is ours.
            last_heard = Instant::now();
        }
        if last_heard.elapsed() > SILENCE {
            return Err(SourceError::Unavailable(format!(
                "the server sent nothing on the replication stream for {} s, though asked to: the connection is gone",
                SILENCE.as_secs()
            )));
        }
        let periodic = last_status.elapsed() >= STATUS_EVERY;
        if reported != Some(flush) || reply || reply_due || periodic {
            wire.status(flush, reply || periodic).await.map_err(stream_error)?;
            (reported, last_status, reply_due) = (Some(flush), Instant::now(), false);
        }
        tokio::select! {
            m = wire.read(), if !paused => {
                let mut m = m.map_err(stream_error)?;
                last_heard = Instant::now();
                events.clear();
                let mut sizes = Vec::new();
                let mut keepalive = None;
                for _ in 0..4096 {
                    match m.tag {
                        b'd' => match m.body.first() {
                            Some(b'w') if m.body.len() >= 25 => {
                                let at = Lsn(u64::from_be_bytes(m.body[1..9].try_into().unwrap_or_default()));
                                let before = events.len();
                                decoder.feed(at, &m.body[25..], &mut events)?;
                                sizes.extend(std::iter::repeat_n(m.body.len() - 25, events.len() - before));
                            }
                            Some(b'k') if m.body.len() >= 18 => {
                                let end = Lsn(u64::from_be_bytes(m.body[1..9].try_into().unwrap_or_default()));
                                keepalive = Some(keepalive.map_or(end, |k: Lsn| k.max(end)));
                                reply_due |= m.body[17] == 1;
                            }
                            _ => return Err(SourceError::Unavailable("the server sent an unreadable replication message".into())),
                        },
                        b'E' => return Err(stream_error(server_error(&m.body))),
                        b'c' => return Err(SourceError::Unavailable("the server ended the replication stream".into())),
                        _ => {}
                    }
                    match wire.next_buffered().map_err(stream_error)? {
                        Some(next) => m = next,
                        None => break,
                    }
                }
                let mut b = shared.lock();
                for (event, size) in events.drain(..).zip(sizes) {
                    b.push(event, size);
                }
                if let Some(k) = keepalive {
                    b.keepalive_end = b.keepalive_end.max(k);
                }
                b.last_end = b.last_end.max(decoder.last_end);
                b.open = decoder.open();
                b.shape_changed |= decoder.shape_changed;
                drop(b);
                shared.changed.notify_waiters();
            }
            () = shared.wake.notified() => {}
            _ = tick.tick() => {}
            () = &mut term => return Ok(Ended::Shutdown),
        }
    }
}
