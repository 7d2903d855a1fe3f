//! The write-ahead log of the embedded store.
//!
//! A fixed-size file, zero-filled once when created, written from the start after every
//! checkpoint. Appending an entry overwrites blocks that already exist, so making it durable
//! costs one `fdatasync` of data only: no file-size or extent change, no filesystem journal
//! commit. This is what makes a group commit cheap.
//!
//! Entry: `magic u32 | payload_len u32 | crc32(payload) u32 | payload`, with
//! payload `epoch u64 | base_revision i64 | compacted i64 | count u32 | count × (revision i64,
//! len u32, record)`. The epoch is bumped by each checkpoint and stored in the database, so
//! entries left from an earlier cycle are never replayed; `base_revision` must equal the
//! revision reached so far, so replay stops at the first gap. A torn or stale tail fails its
//! checksum or these checks and ends the replay: it was never acknowledged.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::{Result, Revision, StorageError};

const MAGIC: u32 = 0x4b57_414c; // "KWAL"
const ENTRY_HEADER: usize = 12;
const PAYLOAD_HEADER: usize = 8 + 8 + 8 + 4;

/// One group commit as logged.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Entry {
    pub epoch: u64,
    /// The store's revision before this entry.
    pub base_revision: Revision,
    /// A compaction this entry records (0: none).
    pub compacted: Revision,
    /// (revision, encoded record) for each write, in revision order.
    pub records: Vec<(Revision, Vec<u8>)>,
}

impl Entry {
    /// Bytes this entry takes in the log.
    pub fn encoded_len(&self) -> usize {
        ENTRY_HEADER
            + PAYLOAD_HEADER
            + self
                .records
                .iter()
                .map(|(_, r)| 8 + 4 + r.len())
                .sum::<usize>()
    }

    fn encode(&self) -> Vec<u8> {
        let mut payload = Vec::with_capacity(self.encoded_len() - ENTRY_HEADER);
        payload.extend_from_slice(&self.epoch.to_be_bytes());
        payload.extend_from_slice(&self.base_revision.to_be_bytes());
        payload.extend_from_slice(&self.compacted.to_be_bytes());
        // Batches are bounded far below 4 G records and 4 GiB per record.
        payload.extend_from_slice(&(self.records.len() as u32).to_be_bytes());
        for (rev, rec) in &self.records {
            payload.extend_from_slice(&rev.to_be_bytes());
            payload.extend_from_slice(&(rec.len() as u32).to_be_bytes());
            payload.extend_from_slice(rec);
        }
        let mut out = Vec::with_capacity(ENTRY_HEADER + payload.len());
        out.extend_from_slice(&MAGIC.to_be_bytes());
        out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        out.extend_from_slice(&crc32fast::hash(&payload).to_be_bytes());
        out.extend_from_slice(&payload);
        out
    }

    /// Decodes the entry at the start of `buf`; `None` when there is no valid entry there.
    /// Returns the entry and its length.
    fn decode(buf: &[u8]) -> Option<(Entry, usize)> {
        let u32_at = |b: &[u8], i: usize| -> Option<u32> {
            Some(u32::from_be_bytes(b.get(i..i + 4)?.try_into().ok()?))
        };
        let i64_at = |b: &[u8], i: usize| -> Option<i64> {
            Some(i64::from_be_bytes(b.get(i..i + 8)?.try_into().ok()?))
        };
        if u32_at(buf, 0)? != MAGIC {
            return None;
        }
        let len = u32_at(buf, 4)? as usize;
        let crc = u32_at(buf, 8)?;
        let payload = buf.get(ENTRY_HEADER..ENTRY_HEADER.checked_add(len)?)?;
        if crc32fast::hash(payload) != crc {
            return None;
        }
        let epoch = i64_at(payload, 0)? as u64;
        let base_revision = i64_at(payload, 8)?;
        let compacted = i64_at(payload, 16)?;
        let count = u32_at(payload, 24)? as usize;
        let mut records = Vec::with_capacity(count.min(1 << 16));
        let mut at = PAYLOAD_HEADER;
        for _ in 0..count {
            let rev = i64_at(payload, at)?;
            let rlen = u32_at(payload, at + 8)? as usize;
            let start = at + 12;
            let rec = payload.get(start..start.checked_add(rlen)?)?;
            records.push((rev, rec.to_vec()));
            at = start + rlen;
        }
        Some((
            Entry {
                epoch,
                base_revision,
                compacted,
                records,
            },
            ENTRY_HEADER + len,
        ))
    }
}

/// The log file and the write position in it.
pub(crate) struct Wal {
    file: File,
    capacity: u64,
    pos: u64,
}

impl Wal {
    /// Opens (creating and zero-filling if needed) the log and reads every entry that is
    /// valid from its start. The caller decides which of them to replay.
    pub fn open(path: &Path, capacity: u64) -> Result<(Wal, Vec<Entry>)> {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        let len = file.metadata()?.len();
        let mut buf = Vec::with_capacity(len as usize);
        file.read_to_end(&mut buf)?;
        let entries = Self::scan(&buf);
        drop(buf);
        if len < capacity {
            // New (or smaller than asked): extend with zeros once, so appends never change
            // the file's size.
            file.seek(SeekFrom::End(0))?;
            let zeros = vec![0u8; 1 << 20];
            let mut left = capacity - len;
            while left > 0 {
                let n = left.min(zeros.len() as u64) as usize;
                file.write_all(&zeros[..n])?;
                left -= n as u64;
            }
            file.sync_all()?;
            if let Some(parent) = path.parent() {
                // Make the new file's directory entry durable too.
                File::open(parent)?.sync_all()?;
            }
        }
        let capacity = capacity.max(len);
        Ok((
            Wal {
                file,
                capacity,
                pos: 0,
            },
            entries,
        ))
    }

    fn scan(buf: &[u8]) -> Vec<Entry> {
        let mut out = Vec::new();
        let mut at = 0;
        while let Some((e, n)) = buf.get(at..).and_then(Entry::decode) {
            out.push(e);
            at += n;
        }
        out
    }

    /// Whether an entry of `len` bytes still fits before the end of the file.
    pub fn fits(&self, len: usize) -> bool {
        self.pos + len as u64 + ENTRY_HEADER as u64 <= self.capacity
    }

    /// Fraction of the log in use.
    pub fn used(&self) -> f64 {
        self.pos as f64 / self.capacity as f64
    }

    /// The log's size in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Appends an entry and makes it durable. Also writes an invalid header after it, so a
    /// stale entry of the previous cycle that happens to follow is never read as the next.
    pub fn append(&mut self, entry: &Entry) -> Result<()> {
        let mut buf = entry.encode();
        if !self.fits(buf.len()) {
            return Err(StorageError::Database(format!(
                "write-ahead log entry of {} bytes does not fit",
                buf.len()
            )));
        }
        buf.extend_from_slice(&[0u8; ENTRY_HEADER]);
        self.file.write_all_at(&buf, self.pos)?;
        self.file.sync_data()?;
        self.pos += (buf.len() - ENTRY_HEADER) as u64;
        Ok(())
    }

    /// Starts writing from the beginning again; called after a checkpoint made every entry
    /// so far redundant.
    pub fn reset(&mut self) {
        self.pos = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(epoch: u64, base: Revision, n: usize) -> Entry {
        Entry {
            epoch,
            base_revision: base,
            compacted: 0,
            records: (0..n)
                .map(|i| (base + 1 + i as i64, vec![i as u8; 10 + i]))
                .collect(),
        }
    }

    #[test]
    fn append_and_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wal");
        {
            let (mut wal, entries) = Wal::open(&path, 64 * 1024).unwrap();
            assert!(entries.is_empty());
            wal.append(&entry(1, 1, 3)).unwrap();
            wal.append(&entry(1, 4, 2)).unwrap();
        }
        let (mut wal, entries) = Wal::open(&path, 64 * 1024).unwrap();
        assert_eq!(entries, vec![entry(1, 1, 3), entry(1, 4, 2)]);
        // After a reset the new entry overwrites the first and the rest is cut off.
        wal.reset();
        wal.append(&entry(2, 6, 1)).unwrap();
        let (_, entries) = Wal::open(&path, 64 * 1024).unwrap();
        assert_eq!(entries, vec![entry(2, 6, 1)]);
    }

    #[test]
    fn torn_entries_end_the_log() {
        let good = entry(1, 1, 2).encode();
        let mut buf = good.clone();
        buf.extend_from_slice(&entry(1, 3, 2).encode());
        let full = Wal::scan(&buf);
        assert_eq!(full.len(), 2);
        for cut in good.len()..buf.len() {
            assert_eq!(Wal::scan(&buf[..cut]).len(), 1, "cut at {cut}");
        }
        for i in good.len()..buf.len() {
            let mut b = buf.clone();
            b[i] ^= 0x40;
            assert_eq!(Wal::scan(&b).len(), 1, "flip at {i}");
        }
    }
}
