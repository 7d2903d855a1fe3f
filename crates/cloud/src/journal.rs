//! The framing and file handling of the cloud's append-only journal (see [`crate::state`]
//! for what the records mean and when the journal is compacted).
//!
//! A record is a 12-byte header and a payload:
//!
//! ```text
//! len: u32 LE | crc32(payload): u32 LE | crc32(the first 8 header bytes): u32 LE | payload
//! ```
//!
//! The header has its own checksum so that a damaged length is recognised as damage rather
//! than trusted. Records are appended one `write` at a time and fdatasync'd before the next
//! one starts, so a crash can only damage the last record. Reading therefore tells the two
//! cases apart by what follows the first bad record: nothing valid after it is a torn
//! append (dropped: it was never acknowledged); a valid record after it means the middle of
//! the file is corrupt, which is refused. Payloads are JSON text, whose bytes are never
//! below 0x20 unescaped and lengths are capped at [`MAX_RECORD`] (below 0x20202020), so a
//! payload cannot contain something that passes for a whole record.

use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Header bytes before each payload.
pub const HEADER: usize = 12;

/// The largest payload accepted (256 MiB).
pub const MAX_RECORD: usize = 1 << 28;

/// Why the journal could not be used.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// Reading or writing failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A record that is not the last one is damaged.
    #[error(
        "{path}: corrupt cloud journal: record {index} at byte {offset} is damaged ({reason}) \
         but a valid record follows at byte {next_valid}; refusing to guess which changes \
         survived (restore the data directory, or remove the journal to go back to the last \
         snapshot and lose the changes made since)"
    )]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The damaged record's position (0 is the header record).
        index: usize,
        /// Its byte offset.
        offset: usize,
        /// What is wrong with it.
        reason: &'static str,
        /// Where the next intact record starts.
        next_valid: usize,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> JournalError + '_ {
    move |source| JournalError::Io {
        path: path.to_owned(),
        source,
    }
}

/// `payload` framed as one record.
pub fn frame(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    let hcrc = crc32fast::hash(&out[..8]);
    out.extend_from_slice(&hcrc.to_le_bytes());
    out.extend_from_slice(payload);
    out
}

fn le(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

/// The record at `off`: its payload and where the next one starts.
fn record_at(b: &[u8], off: usize) -> Result<(&[u8], usize), &'static str> {
    let rest = &b[off..];
    if rest.len() < HEADER {
        return Err("incomplete header");
    }
    if crc32fast::hash(&rest[..8]) != le(rest, 8) {
        return Err("header checksum mismatch");
    }
    let len = le(rest, 0) as usize;
    if len > MAX_RECORD {
        return Err("length over the limit");
    }
    if rest.len() - HEADER < len {
        return Err("incomplete payload");
    }
    let payload = &rest[HEADER..HEADER + len];
    if crc32fast::hash(payload) != le(rest, 4) {
        return Err("payload checksum mismatch");
    }
    Ok((payload, off + HEADER + len))
}

/// The intact records of a journal's content.
#[derive(Debug)]
pub struct Scan<'a> {
    /// Payloads in order.
    pub records: Vec<&'a [u8]>,
    /// Bytes up to the end of the last intact record.
    pub valid_len: usize,
    /// Whether bytes after `valid_len` were dropped as a torn last append.
    pub torn: bool,
}

/// Splits `bytes` (the content of `path`) into records; see the module doc for how a torn
/// tail is told from corruption.
pub fn scan<'a>(path: &Path, bytes: &'a [u8]) -> Result<Scan<'a>, JournalError> {
    let mut records = Vec::new();
    let mut off = 0;
    while off < bytes.len() {
        match record_at(bytes, off) {
            Ok((p, next)) => {
                records.push(p);
                off = next;
            }
            Err(reason) => {
                if let Some(next_valid) =
                    (off + 1..bytes.len()).find(|p| record_at(bytes, *p).is_ok())
                {
                    return Err(JournalError::Corrupt {
                        path: path.to_owned(),
                        index: records.len(),
                        offset: off,
                        reason,
                        next_valid,
                    });
                }
                return Ok(Scan {
                    records,
                    valid_len: off,
                    torn: true,
                });
            }
        }
    }
    Ok(Scan {
        records,
        valid_len: off,
        torn: false,
    })
}

/// Reads the journal; `None` when there is none.
pub fn read(path: &Path) -> Result<Option<Vec<u8>>, JournalError> {
    match std::fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io(path)(e)),
    }
}

/// Replaces the journal with one holding `data`, atomically and durably (a temporary file,
/// fsync, rename, fsync of the directory), mode 0600.
pub fn replace(path: &Path, data: &[u8]) -> Result<(), JournalError> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io(&tmp))?;
        f.write_all(data).map_err(io(&tmp))?;
        f.sync_data().map_err(io(&tmp))?;
    }
    std::fs::rename(&tmp, path).map_err(io(path))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))
}

/// Writes `data` at `at`, the end of the journal's intact content (cutting off anything a
/// failed earlier append left behind), then fdatasyncs. The journal must exist: it is
/// created with its header record, durably, before anything is appended.
pub fn append(path: &Path, at: u64, data: &[u8]) -> Result<(), JournalError> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(io(path))?;
    if f.metadata().map_err(io(path))?.len() != at {
        f.set_len(at).map_err(io(path))?;
    }
    f.seek(SeekFrom::Start(at)).map_err(io(path))?;
    f.write_all(data).map_err(io(path))?;
    f.sync_data().map_err(io(path))
}

/// Cuts the journal to `len` bytes, durably (dropping a torn last record before appending).
pub fn truncate(path: &Path, len: u64) -> Result<(), JournalError> {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(io(path))?;
    f.set_len(len).map_err(io(path))?;
    f.sync_data().map_err(io(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn three() -> Vec<u8> {
        [&b"{\"a\":1}"[..], b"{\"b\":2}", b"{\"c\":3}"]
            .iter()
            .flat_map(|p| frame(p))
            .collect()
    }

    #[test]
    fn round_trip_and_torn_tail() {
        let p = Path::new("j");
        let b = three();
        let s = scan(p, &b).expect("ok");
        assert_eq!(s.records, [&b"{\"a\":1}"[..], b"{\"b\":2}", b"{\"c\":3}"]);
        assert!(!s.torn);
        // Every cut inside the last record drops just that record.
        let last = b.len() - (HEADER + 7);
        for cut in last + 1..b.len() {
            let s = scan(p, &b[..cut]).expect("torn");
            assert_eq!((s.records.len(), s.valid_len, s.torn), (2, last, true));
        }
        // A zero-filled tail (size grew, data never written) is torn too.
        let mut z = b.clone();
        z.extend_from_slice(&[0; 40]);
        let s = scan(p, &z).expect("torn");
        assert_eq!((s.records.len(), s.valid_len, s.torn), (3, b.len(), true));
    }

    #[test]
    fn damage_before_an_intact_record_is_refused() {
        let p = Path::new("j");
        for at in [0, 3, 9, HEADER + 2] {
            let mut b = three();
            b[at] ^= 0x40;
            let e = scan(p, &b).expect_err("corrupt");
            assert!(
                matches!(
                    e,
                    JournalError::Corrupt {
                        index: 0,
                        offset: 0,
                        ..
                    }
                ),
                "{e}"
            );
            assert!(e.to_string().contains("corrupt cloud journal"), "{e}");
        }
    }
}
