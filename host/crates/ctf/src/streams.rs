//! The stream files of one recording: bounded in descriptors and memory,
//! written in whole packets, committed before the region is told.
//!
//! - **Descriptors**: at most [`Limits::open_files`] stream files are open
//!   at once; the least recently used one is flushed and closed when
//!   another is needed, and reopened (append, relative to its directory's
//!   descriptor) when its channel has a packet again. A region with 4096
//!   channels costs 64 descriptors, not 4096.
//! - **Memory**: every open file has a buffer of
//!   `clamp(buffer_total / open_files, 64 KiB, 1 MiB)`, so a recording
//!   buffers at most [`Limits::buffer_total`] bytes however many channels
//!   the guest declares (it was 1 MiB per channel: 4 GiB for 4096).
//! - **Crash consistency**: packets handed over are *pending* until
//!   [`StreamFiles::commit`] has written them (write(2) returned: the page
//!   cache keeps them if the recorder is killed); only then does the
//!   engine hand their sub-buffers back to the writer. A failed write (a
//!   full disk) is undone with [`StreamFiles::rollback`]: every file is
//!   cut back to its last committed packet, so the trace holds whole
//!   packets only and babeltrace2 still reads it, while the packets that
//!   did not make it stay in the region.
//! - **Size limit**: with [`Limits::max_bytes`], packets that would take
//!   the recording past it are refused ([`StreamFiles::accepts`]); the
//!   reader counts their events as lost.

use std::fs::File;
use std::io::{self, BufWriter, Seek, SeekFrom, Write};

use crate::outdir::OutDir;

/// What one recording may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Stream files open at once.
    pub open_files: usize,
    /// Bytes of write buffers across the open files.
    pub buffer_total: usize,
    /// Bytes of stream files the recording may write (None: no limit).
    pub max_bytes: Option<u64>,
    /// Disk space set aside at the start and given back when a write
    /// fails, so the final metadata and sidecar fit on a full disk (0:
    /// none, e.g. a drain of bytes in memory).
    pub reserve_bytes: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            open_files: 64,
            buffer_total: 16 << 20,
            max_bytes: None,
            reserve_bytes: 1 << 20,
        }
    }
}

const MIN_BUFFER: usize = 64 << 10;
const MAX_BUFFER: usize = 1 << 20;

/// What the stream files cost and did (the sidecar's `resources`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StreamStats {
    /// Buffer per open file, bytes.
    pub buffer_per_file: u64,
    /// Most stream files open at once.
    pub max_open_files: u64,
    /// Files closed to make room for another (reopened later).
    pub evictions: u64,
    /// Bytes committed to stream files.
    pub bytes_committed: u64,
    /// Packets refused by the size limit.
    pub packets_over_limit: u64,
    /// Bytes of packets refused by the size limit.
    pub bytes_over_limit: u64,
}

/// One stream file.
struct Stream {
    dir: OutDir,
    name: String,
    out: Option<BufWriter<File>>,
    /// File length up to the last committed packet.
    committed: u64,
    /// Bytes handed over since the last commit.
    pending: u64,
    last_use: u64,
}

/// The stream files of one recording, one slot per channel.
pub struct StreamFiles {
    limits: Limits,
    buffer: usize,
    slots: Vec<Option<Stream>>,
    /// Channels whose file is open.
    open: Vec<u32>,
    tick: u64,
    stats: StreamStats,
}

impl StreamFiles {
    pub fn new(limits: Limits, nr_channels: u32) -> StreamFiles {
        let open_files = limits.open_files.max(1);
        let per_file = limits.buffer_total / open_files.min(nr_channels.max(1) as usize);
        let buffer = per_file.clamp(MIN_BUFFER, MAX_BUFFER);
        StreamFiles {
            limits: Limits {
                open_files,
                ..limits
            },
            buffer,
            slots: (0..nr_channels).map(|_| None).collect(),
            open: Vec::new(),
            tick: 0,
            stats: StreamStats {
                buffer_per_file: buffer as u64,
                ..StreamStats::default()
            },
        }
    }

    pub fn stats(&self) -> &StreamStats {
        &self.stats
    }

    /// Whether channel `chan` has a file.
    pub fn has(&self, chan: u32) -> bool {
        self.slot(chan).is_some()
    }

    fn slot(&self, chan: u32) -> Option<&Stream> {
        self.slots.get(chan as usize)?.as_ref()
    }

    /// Bytes committed and pending.
    fn total(&self) -> u64 {
        let pending: u64 = self.slots.iter().flatten().map(|s| s.pending).sum();
        self.stats.bytes_committed.saturating_add(pending)
    }

    /// Whether a packet of `len` bytes fits the size limit; counts it if
    /// not.
    pub fn accepts(&mut self, len: usize) -> bool {
        let Some(max) = self.limits.max_bytes else {
            return true;
        };
        if self.total().saturating_add(len as u64) <= max {
            return true;
        }
        self.stats.packets_over_limit += 1;
        self.stats.bytes_over_limit += len as u64;
        false
    }

    /// Creates channel `chan`'s file `name` in `dir` (it must not exist).
    pub fn create(&mut self, chan: u32, dir: &OutDir, name: &str) -> io::Result<()> {
        self.make_room()?;
        let file = dir.create_file(name)?;
        self.slots[chan as usize] = Some(Stream {
            dir: dir.clone(),
            name: name.to_string(),
            out: Some(BufWriter::with_capacity(self.buffer, file)),
            committed: 0,
            pending: 0,
            last_use: self.tick,
        });
        self.opened(chan);
        Ok(())
    }

    /// Adopts channel `chan`'s existing file `name` in `dir`, `len` bytes
    /// of whole packets (a resumed recording appends to it).
    pub fn adopt(&mut self, chan: u32, dir: &OutDir, name: &str, len: u64) {
        self.slots[chan as usize] = Some(Stream {
            dir: dir.clone(),
            name: name.to_string(),
            out: None,
            committed: len,
            pending: 0,
            last_use: 0,
        });
    }

    fn opened(&mut self, chan: u32) {
        self.open.push(chan);
        self.stats.max_open_files = self.stats.max_open_files.max(self.open.len() as u64);
    }

    /// Closes the least recently used open file if no slot is free.
    fn make_room(&mut self) -> io::Result<()> {
        if self.open.len() < self.limits.open_files {
            return Ok(());
        }
        let (i, &chan) = self
            .open
            .iter()
            .enumerate()
            .min_by_key(|(_, &c)| self.slots[c as usize].as_ref().map_or(0, |s| s.last_use))
            .expect("open files exist when the limit is reached");
        let s = self.slots[chan as usize].as_mut().expect("open slot");
        if let Some(mut out) = s.out.take() {
            out.flush()?;
        }
        self.open.swap_remove(i);
        self.stats.evictions += 1;
        Ok(())
    }

    /// Appends a packet to channel `chan`'s file (created before).
    pub fn write(&mut self, chan: u32, bytes: &[u8]) -> io::Result<()> {
        self.tick += 1;
        let closed = self.slot(chan).is_some_and(|s| s.out.is_none());
        if closed {
            self.make_room()?;
            let s = self.slots[chan as usize].as_mut().expect("has a file");
            let file = s.dir.open_append(&s.name)?;
            s.out = Some(BufWriter::with_capacity(self.buffer, file));
            self.opened(chan);
        }
        let s = self.slots[chan as usize].as_mut().expect("has a file");
        s.last_use = self.tick;
        s.pending += bytes.len() as u64;
        s.out.as_mut().expect("open").write_all(bytes)
    }

    /// Writes every pending packet to its file (write(2) returned).
    pub fn commit(&mut self) -> io::Result<()> {
        for s in self.slots.iter_mut().flatten() {
            if s.pending == 0 {
                continue;
            }
            if let Some(out) = s.out.as_mut() {
                out.flush()?;
            }
            s.committed += s.pending;
            self.stats.bytes_committed += s.pending;
            s.pending = 0;
        }
        Ok(())
    }

    /// Undoes everything since the last commit: buffers are dropped
    /// unwritten and every file is cut back to its last committed packet.
    /// Returns the first error met while cutting (the files it could not
    /// cut are named in it).
    pub fn rollback(&mut self) -> io::Result<()> {
        let mut first_err = None;
        for s in self.slots.iter_mut().flatten() {
            if s.pending == 0 {
                continue;
            }
            let file = match s.out.take() {
                // into_parts: drop the buffer without writing it.
                Some(out) => Ok(out.into_parts().0),
                None => s.dir.open_rw(&s.name),
            };
            // Cut, and write on from there (a file we created is not
            // O_APPEND: its offset must come back too).
            let cut = file.and_then(|mut f| {
                f.set_len(s.committed)?;
                f.seek(SeekFrom::Start(s.committed))?;
                Ok(f)
            });
            match cut {
                Ok(f) => s.out = Some(BufWriter::with_capacity(self.buffer, f)),
                Err(e) => {
                    let path = s.dir.join(&s.name).display().to_string();
                    first_err.get_or_insert(io::Error::new(
                        e.kind(),
                        format!("cannot cut {path} back to {} bytes: {e}", s.committed),
                    ));
                }
            }
            s.pending = 0;
        }
        self.open = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.as_ref().is_some_and(|s| s.out.is_some()))
            .map(|(c, _)| c as u32)
            .collect();
        first_err.map_or(Ok(()), Err)
    }

    /// Commits and closes every file.
    pub fn close_all(&mut self) -> io::Result<()> {
        self.commit()?;
        for s in self.slots.iter_mut().flatten() {
            if let Some(mut out) = s.out.take() {
                out.flush()?;
            }
        }
        self.open.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outdir::OutputPolicy;

    fn root(tmp: &tempfile::TempDir) -> OutDir {
        OutDir::root(&tmp.path().join("o"), &OutputPolicy::default()).unwrap()
    }

    #[test]
    fn many_channels_share_a_few_descriptors_and_bounded_buffers() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = root(&tmp);
        let limits = Limits {
            open_files: 4,
            buffer_total: 1 << 20,
            ..Limits::default()
        };
        let mut s = StreamFiles::new(limits, 4096);
        for c in 0..64u32 {
            s.create(c, &dir, &format!("c{c}")).unwrap();
            s.write(c, &[c as u8; 100]).unwrap();
        }
        for c in (0..64u32).rev() {
            s.write(c, &[c as u8; 100]).unwrap();
        }
        s.commit().unwrap();
        assert_eq!(s.stats().max_open_files, 4);
        assert_eq!(s.stats().buffer_per_file, 256 << 10);
        assert!(s.stats().evictions > 100);
        s.close_all().unwrap();
        for c in 0..64u32 {
            let b = std::fs::read(tmp.path().join(format!("o/c{c}"))).unwrap();
            assert_eq!(b, vec![c as u8; 200]);
        }
    }

    #[test]
    fn rollback_cuts_back_to_the_last_commit() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = root(&tmp);
        let limits = Limits {
            open_files: 1,
            ..Limits::default()
        };
        let mut s = StreamFiles::new(limits, 2);
        s.create(0, &dir, "a").unwrap();
        s.write(0, b"whole").unwrap();
        s.commit().unwrap();
        s.write(0, b"partial").unwrap();
        s.create(1, &dir, "b").unwrap(); // evicts a: "partial" reaches the file
        s.write(1, b"x").unwrap();
        assert_eq!(
            std::fs::read(tmp.path().join("o/a")).unwrap(),
            b"wholepartial"
        );
        s.rollback().unwrap();
        assert_eq!(std::fs::read(tmp.path().join("o/a")).unwrap(), b"whole");
        assert_eq!(std::fs::read(tmp.path().join("o/b")).unwrap(), b"");
        s.write(0, b"again").unwrap();
        s.close_all().unwrap();
        assert_eq!(
            std::fs::read(tmp.path().join("o/a")).unwrap(),
            b"wholeagain"
        );
    }

    #[test]
    fn the_size_limit_refuses_and_counts() {
        let mut s = StreamFiles::new(
            Limits {
                max_bytes: Some(250),
                ..Limits::default()
            },
            1,
        );
        assert!(s.accepts(200));
        s.stats.bytes_committed = 200;
        assert!(!s.accepts(100));
        assert!(s.accepts(50));
        assert_eq!(
            (s.stats().packets_over_limit, s.stats().bytes_over_limit),
            (1, 100)
        );
    }
}
