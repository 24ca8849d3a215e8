//! Reads TDS requests back from their bytes: the reader and the RPC parameter decoder both SQL Server wire taps
//! (`tests/mssql_wire.rs`, `tests/mssql_sink_wire/tap.rs`) use. Field layouts from MS-TDS.

/// The reviewed session batch (`tests/golden/mssql_session/session.sql`, its comment line dropped): both taps
/// refuse a connection whose first request is anything else (`src/db/mssql/session.rs`).
pub fn session_batch() -> String {
    let path = format!("{}/tests/golden/mssql_session/session.sql", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    text.lines().filter(|l| !l.starts_with("--")).collect::<Vec<_>>().join("\n")
}

/// A value of an RPC parameter, as the taps read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wire {
    Int(i64),
    Text(String),
    Bytes(Vec<u8>),
    Null,
}

/// Decodes an RPC request after its ALL_HEADERS block (which each tap reads its own way) as tiberius encodes
/// `sp_executesql`: the procedure id, then its parameters by name in order (MS-TDS 2.2.6.6). IntN, NVarChar and
/// VarBinary values, short or PLP; any other type is an error naming the parameter.
pub fn decode_rpc_after_headers(mut r: Reader<'_>) -> Result<(u16, Vec<(String, Wire)>), String> {
    if r.u16() != 0xFFFF {
        return Err("an RPC called by name".into());
    }
    let proc_id = r.u16();
    let _options = r.u16();
    let mut params = Vec::new();
    while !r.0.is_empty() {
        let name_len = r.u8() as usize;
        let name = r.utf16(name_len * 2);
        let _status = r.u8();
        let value = match r.u8() {
            0x26 => {
                let _max = r.u8();
                match r.u8() {
                    0 => Wire::Null,
                    4 => Wire::Int(i64::from(i32::from_le_bytes(r.take(4).try_into().expect("4")))),
                    8 => Wire::Int(i64::from_le_bytes(r.take(8).try_into().expect("8"))),
                    n => return Err(format!("{name}: IntN of {n} bytes")),
                }
            }
            0xE7 => {
                let max = r.u16();
                let _collation = r.take(5);
                r.var_bytes(max).map_or(Wire::Null, |b| {
                    let len = b.len();
                    Wire::Text(Reader(&b).utf16(len))
                })
            }
            0xA5 => {
                let max = r.u16();
                r.var_bytes(max).map_or(Wire::Null, Wire::Bytes)
            }
            other => return Err(format!("{name}: parameter type 0x{other:02X}, which neither tap reads")),
        };
        params.push((name, value));
    }
    Ok((proc_id, params))
}

/// Reads little-endian fields off a byte slice.
#[derive(Debug)]
pub struct Reader<'a>(pub &'a [u8]);

impl Reader<'_> {
    pub fn take(&mut self, n: usize) -> &[u8] {
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        head
    }
    pub fn u8(&mut self) -> u8 {
        self.take(1)[0]
    }
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take(2).try_into().expect("2 bytes"))
    }
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take(4).try_into().expect("4 bytes"))
    }
    pub fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take(8).try_into().expect("8 bytes"))
    }
    pub fn utf16(&mut self, bytes: usize) -> String {
        let units: Vec<u16> = self.take(bytes).chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
        String::from_utf16(&units).expect("UTF-16")
    }
    /// A PLP value (MS-TDS 2.2.5.2.3): total length (or unknown), then chunks up to a zero terminator.
    pub fn plp(&mut self) -> Option<Vec<u8>> {
        if self.u64() == u64::MAX {
            return None;
        }
        let mut out = Vec::new();
        while !self.0.is_empty() {
            let chunk = self.u32() as usize;
            if chunk == 0 {
                break;
            }
            out.extend_from_slice(self.take(chunk));
        }
        Some(out)
    }
    /// A variable-length value of declared maximum `max`: PLP when `max` is 0xFFFF, else a u16 length (0xFFFF:
    /// null) and the bytes.
    pub fn var_bytes(&mut self, max: u16) -> Option<Vec<u8>> {
        if max == 0xFFFF {
            return self.plp();
        }
        match self.u16() {
            0xFFFF => None,
            n => Some(self.take(n as usize).to_vec()),
        }
    }
}
