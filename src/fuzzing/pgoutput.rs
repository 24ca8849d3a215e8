//! pgoutput, the logical replication stream's message format: decoded, re-encoded as PostgreSQL writes it.

use crate::source::postgres_logical::pgoutput::{self, Message, OldKind, Value as PgValue};

/// The pgoutput decoder: a message it decodes, encoded again as PostgreSQL's `proto.c` writes it, decodes to the
/// same message.
pub fn pgoutput(data: &[u8]) {
    let Ok(message) = pgoutput::decode(data) else { return };
    let bytes = encode_pgoutput(&message);
    assert_eq!(pgoutput::decode(&bytes).as_ref(), Ok(&message), "re-encoded as {bytes:?}");
}

fn encode_pgoutput(message: &Message) -> Vec<u8> {
    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend(s.as_bytes());
        out.push(0);
    }
    fn tuple(out: &mut Vec<u8>, values: &[PgValue]) {
        out.extend(u16::try_from(values.len()).expect("at most u16 columns decode").to_be_bytes());
        for value in values {
            match value {
                PgValue::Null => out.push(b'n'),
                PgValue::Unchanged => out.push(b'u'),
                PgValue::Text(text) => {
                    out.push(b't');
                    out.extend(i32::try_from(text.len()).expect("decoded lengths fit").to_be_bytes());
                    out.extend(text.as_bytes());
                }
            }
        }
    }
    fn old(out: &mut Vec<u8>, (kind, values): &(OldKind, Vec<PgValue>)) {
        out.push(match kind {
            OldKind::Key => b'K',
            OldKind::Row => b'O',
        });
        tuple(out, values);
    }
    let mut out = Vec::new();
    match message {
        Message::Begin { final_lsn, commit_time, xid } => {
            out.push(b'B');
            out.extend(final_lsn.0.to_be_bytes());
            out.extend(commit_time.to_be_bytes());
            out.extend(xid.to_be_bytes());
        }
        Message::Commit { commit_lsn, end_lsn, commit_time } => {
            out.extend([b'C', 0]);
            out.extend(commit_lsn.0.to_be_bytes());
            out.extend(end_lsn.0.to_be_bytes());
            out.extend(commit_time.to_be_bytes());
        }
        Message::Relation(relation) => {
            out.push(b'R');
            out.extend(relation.id.to_be_bytes());
            string(&mut out, &relation.namespace);
            string(&mut out, &relation.name);
            out.push(relation.replica_identity);
            out.extend(u16::try_from(relation.columns.len()).expect("at most u16 columns decode").to_be_bytes());
            for column in &relation.columns {
                out.push(u8::from(column.key));
                string(&mut out, &column.name);
                out.extend(column.type_oid.to_be_bytes());
                out.extend(column.type_modifier.to_be_bytes());
            }
        }
        Message::Insert { relation, new } => {
            out.push(b'I');
            out.extend(relation.to_be_bytes());
            out.push(b'N');
            tuple(&mut out, new);
        }
        Message::Update { relation, old: before, new } => {
            out.push(b'U');
            out.extend(relation.to_be_bytes());
            if let Some(before) = before {
                old(&mut out, before);
            }
            out.push(b'N');
            tuple(&mut out, new);
        }
        Message::Delete { relation, old: before } => {
            out.push(b'D');
            out.extend(relation.to_be_bytes());
            old(&mut out, before);
        }
        Message::Truncate { relations, cascade, restart_identity } => {
            out.push(b'T');
            out.extend(u32::try_from(relations.len()).expect("at most u32 relations decode").to_be_bytes());
            out.push(u8::from(*cascade) | (u8::from(*restart_identity) << 1));
            for relation in relations {
                out.extend(relation.to_be_bytes());
            }
        }
        Message::Other(kind) => out.push(*kind),
    }
    out
}
