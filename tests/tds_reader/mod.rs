//! Reads little-endian TDS fields off a byte slice: the reader both SQL Server wire taps (`tests/mssql_wire.rs`,
//! `tests/mssql_sink_wire/tap.rs`) decode requests with. Field layouts from MS-TDS.

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
    #[allow(dead_code)] // the sink tap reads no PLP values
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
}
