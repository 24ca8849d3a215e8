//! The pgoutput logical replication messages (protocol version 1), decoded from the bytes of one message: an
//! XLogData's payload on the stream, or a row of `pg_logical_slot_peek_binary_changes` with `"reader": "sql"`.
//!
//! Layouts from PostgreSQL's "Logical Replication Message Formats" (protocol.sgml) and
//! `src/backend/replication/logical/proto.c`; every integer is big-endian, strings are NUL-terminated.
//! Messages of later protocol versions (streaming, two-phase) never reach us: we ask for version 1.

use super::position::Lsn;

/// PostgreSQL's epoch (2000-01-01) in Unix seconds: a replication message's time (a commit's, a standby status
/// update's clock) counts microseconds from it.
pub(super) const POSTGRES_EPOCH: i64 = 946_684_800;

/// A column value in a tuple.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Null,
    /// An unchanged TOAST-ed value: the update did not touch it, and the WAL does not carry it.
    Unchanged,
    /// The value in the type's text output form.
    Text(String),
}

/// A relation's columns as the WAL describes it at that point of the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    pub id: u32,
    pub namespace: String,
    pub name: String,
    /// `d` default, `n` nothing, `f` full, `i` index.
    pub replica_identity: u8,
    pub columns: Vec<Column>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    pub name: String,
    /// Part of the replica identity.
    pub key: bool,
    pub type_oid: u32,
    pub type_modifier: i32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Begin {
        final_lsn: Lsn,
        commit_time: i64,
        xid: u32,
    },
    Commit {
        commit_lsn: Lsn,
        end_lsn: Lsn,
        commit_time: i64,
    },
    Relation(Relation),
    Insert {
        relation: u32,
        new: Vec<Value>,
    },
    /// `old` is the replica identity (`K`) or the whole old row (`O`, REPLICA IDENTITY FULL), when sent.
    Update {
        relation: u32,
        old: Option<(OldKind, Vec<Value>)>,
        new: Vec<Value>,
    },
    Delete {
        relation: u32,
        old: (OldKind, Vec<Value>),
    },
    Truncate {
        relations: Vec<u32>,
        cascade: bool,
        restart_identity: bool,
    },
    /// Origin, Type and logical Message messages: nothing a change depends on.
    Other(u8),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OldKind {
    /// Only the replica identity columns (the others are null).
    Key,
    /// Every column (REPLICA IDENTITY FULL).
    Row,
}

/// Bytes that are not a pgoutput message: a bug on one side or the other, never data to skip.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("undecodable pgoutput message ({0})")]
pub struct DecodeError(String);

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.at.checked_add(n).filter(|e| *e <= self.bytes.len());
        let end = end.ok_or_else(|| DecodeError(format!("{} bytes needed at offset {}", n, self.at)))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(self.take(2)?.try_into().expect("2 bytes")))
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    fn i32(&mut self) -> Result<i32, DecodeError> {
        Ok(self.u32()? as i32)
    }
    fn i64(&mut self) -> Result<i64, DecodeError> {
        Ok(self.u64()? as i64)
    }
    fn string(&mut self) -> Result<String, DecodeError> {
        let rest = &self.bytes[self.at..];
        let nul = rest.iter().position(|b| *b == 0).ok_or_else(|| DecodeError("unterminated string".into()))?;
        let s = std::str::from_utf8(&rest[..nul]).map_err(|_| DecodeError("a name that is not UTF-8".into()))?;
        self.at += nul + 1;
        Ok(s.to_string())
    }
    fn tuple(&mut self) -> Result<Vec<Value>, DecodeError> {
        let n = self.u16()?;
        (0..n)
            .map(|_| match self.u8()? {
                b'n' => Ok(Value::Null),
                b'u' => Ok(Value::Unchanged),
                b't' => {
                    let len = self.i32()?;
                    let len = usize::try_from(len).map_err(|_| DecodeError(format!("column length {len}")))?;
                    let text = std::str::from_utf8(self.take(len)?)
                        .map_err(|_| DecodeError("a text value that is not UTF-8; use a UTF8 database".into()))?;
                    Ok(Value::Text(text.to_string()))
                }
                other => Err(DecodeError(format!("column kind {:?}", other as char))),
            })
            .collect()
    }
    fn old(&mut self, kind: u8) -> Result<(OldKind, Vec<Value>), DecodeError> {
        let kind = match kind {
            b'K' => OldKind::Key,
            b'O' => OldKind::Row,
            other => return Err(DecodeError(format!("old tuple kind {:?}", other as char))),
        };
        Ok((kind, self.tuple()?))
    }
    fn done(self) -> Result<(), DecodeError> {
        match self.bytes.len() - self.at {
            0 => Ok(()),
            n => Err(DecodeError(format!("{n} bytes left over"))),
        }
    }
}

pub fn decode(bytes: &[u8]) -> Result<Message, DecodeError> {
    let mut r = Reader { bytes, at: 0 };
    let message = match r.u8()? {
        b'B' => Message::Begin { final_lsn: Lsn(r.u64()?), commit_time: r.i64()?, xid: r.u32()? },
        b'C' => {
            let _flags = r.u8()?;
            Message::Commit { commit_lsn: Lsn(r.u64()?), end_lsn: Lsn(r.u64()?), commit_time: r.i64()? }
        }
        b'R' => {
            let id = r.u32()?;
            let namespace = r.string()?;
            let name = r.string()?;
            let replica_identity = r.u8()?;
            let n = r.u16()?;
            let columns = (0..n)
                .map(|_| {
                    Ok(Column { key: r.u8()? & 1 == 1, name: r.string()?, type_oid: r.u32()?, type_modifier: r.i32()? })
                })
                .collect::<Result<_, DecodeError>>()?;
            // An empty namespace is pg_catalog (proto.c, logicalrep_write_namespace).
            let namespace = if namespace.is_empty() { "pg_catalog".to_string() } else { namespace };
            Message::Relation(Relation { id, namespace, name, replica_identity, columns })
        }
        b'I' => {
            let relation = r.u32()?;
            match r.u8()? {
                b'N' => Message::Insert { relation, new: r.tuple()? },
                other => return Err(DecodeError(format!("insert tuple kind {:?}", other as char))),
            }
        }
        b'U' => {
            let relation = r.u32()?;
            let (old, new) = match r.u8()? {
                b'N' => (None, r.tuple()?),
                kind => {
                    let old = r.old(kind)?;
                    match r.u8()? {
                        b'N' => (Some(old), r.tuple()?),
                        other => return Err(DecodeError(format!("update new tuple kind {:?}", other as char))),
                    }
                }
            };
            Message::Update { relation, old, new }
        }
        b'D' => {
            let relation = r.u32()?;
            let kind = r.u8()?;
            Message::Delete { relation, old: r.old(kind)? }
        }
        b'T' => {
            let n = r.u32()?;
            let options = r.u8()?;
            let relations = (0..n).map(|_| r.u32()).collect::<Result<_, _>>()?;
            Message::Truncate { relations, cascade: options & 1 == 1, restart_identity: options & 2 == 2 }
        }
        kind @ (b'O' | b'Y' | b'M') => {
            // Read no further: their fields do not matter here.
            return Ok(Message::Other(kind));
        }
        other => return Err(DecodeError(format!("message kind {:?}", other as char))),
    };
    r.done()?;
    Ok(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tuple(values: &[Option<&str>]) -> Vec<u8> {
        let mut b = (values.len() as u16).to_be_bytes().to_vec();
        for v in values {
            match v {
                None => b.push(b'n'),
                Some("\u{0}u") => b.push(b'u'),
                Some(t) => {
                    b.push(b't');
                    b.extend((t.len() as i32).to_be_bytes());
                    b.extend(t.as_bytes());
                }
            }
        }
        b
    }

    #[test]
    fn decodes_begin_commit_and_a_relation() {
        let mut b = vec![b'B'];
        b.extend(0x10_0000_0020u64.to_be_bytes());
        b.extend(5_000_000i64.to_be_bytes());
        b.extend(745u32.to_be_bytes());
        assert_eq!(decode(&b), Ok(Message::Begin { final_lsn: Lsn(0x10_0000_0020), commit_time: 5_000_000, xid: 745 }));

        let mut c = vec![b'C', 0];
        c.extend(32u64.to_be_bytes());
        c.extend(80u64.to_be_bytes());
        c.extend(7i64.to_be_bytes());
        assert_eq!(decode(&c), Ok(Message::Commit { commit_lsn: Lsn(32), end_lsn: Lsn(80), commit_time: 7 }));

        let mut r = vec![b'R'];
        r.extend(16384u32.to_be_bytes());
        r.extend(b"public\0order items\0d");
        r.extend(2u16.to_be_bytes());
        r.push(1);
        r.extend(b"id\0");
        r.extend(20u32.to_be_bytes());
        r.extend((-1i32).to_be_bytes());
        r.push(0);
        r.extend("Ünïcödé\0".as_bytes());
        r.extend(1700u32.to_be_bytes());
        r.extend(((30 << 16 | 10) + 4i32).to_be_bytes());
        let Ok(Message::Relation(rel)) = decode(&r) else { panic!("a relation") };
        assert_eq!(
            (rel.id, rel.namespace.as_str(), rel.name.as_str(), rel.replica_identity),
            (16384, "public", "order items", b'd')
        );
        assert_eq!(rel.columns.len(), 2);
        assert!(rel.columns[0].key && !rel.columns[1].key);
        assert_eq!((rel.columns[1].name.as_str(), rel.columns[1].type_oid), ("Ünïcödé", 1700));
    }

    #[test]
    fn decodes_changes_with_nulls_unchanged_toast_and_old_rows() {
        let mut i = vec![b'I'];
        i.extend(9u32.to_be_bytes());
        i.push(b'N');
        i.extend(tuple(&[Some("1"), None, Some("")]));
        assert_eq!(
            decode(&i),
            Ok(Message::Insert {
                relation: 9,
                new: vec![Value::Text("1".into()), Value::Null, Value::Text(String::new())]
            })
        );

        let mut u = vec![b'U'];
        u.extend(9u32.to_be_bytes());
        u.push(b'O');
        u.extend(tuple(&[Some("1"), Some("big")]));
        u.push(b'N');
        u.extend(tuple(&[Some("1"), Some("\u{0}u")]));
        assert_eq!(
            decode(&u),
            Ok(Message::Update {
                relation: 9,
                old: Some((OldKind::Row, vec![Value::Text("1".into()), Value::Text("big".into())])),
                new: vec![Value::Text("1".into()), Value::Unchanged],
            })
        );

        let mut d = vec![b'D'];
        d.extend(9u32.to_be_bytes());
        d.push(b'K');
        d.extend(tuple(&[Some("1"), None]));
        assert_eq!(
            decode(&d),
            Ok(Message::Delete { relation: 9, old: (OldKind::Key, vec![Value::Text("1".into()), Value::Null]) })
        );

        let mut t = vec![b'T'];
        t.extend(2u32.to_be_bytes());
        t.push(3);
        t.extend(9u32.to_be_bytes());
        t.extend(10u32.to_be_bytes());
        assert_eq!(decode(&t), Ok(Message::Truncate { relations: vec![9, 10], cascade: true, restart_identity: true }));
    }

    #[test]
    fn refuses_what_is_not_a_whole_message() {
        let mut i = vec![b'I'];
        i.extend(9u32.to_be_bytes());
        i.push(b'N');
        i.extend(tuple(&[Some("12345")]));
        for cut in 1..i.len() {
            assert!(decode(&i[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = i.clone();
        long.push(0);
        assert!(decode(&long).is_err());
        assert!(decode(b"Zzz").is_err());
        assert!(decode(b"").is_err());
    }
}
