//! One CPU's ring-buffer pages, as the kernel lays them out (ivtrace-tracefs's
//! [`PageBuilder`]), written to an unnamed file in the output directory
//! until the container is assembled.
//!
//! Time only goes forward in a CPU's buffer (trace-cmd reads deltas): a
//! record earlier than the previous one is written at the previous one's
//! time and counted. Losses are carried as the kernel carries them: the
//! next page says events were missed before it and stores how many.

use std::fs::File;
use std::io::{self, BufWriter, Write};

use ivtrace_ctf::OutDir;

use ivtrace_tracefs::format::HeaderPage;
use ivtrace_tracefs::page::{record_space, PageBuilder};

use crate::dat::{CpuData, PAGE_SIZE};

/// What one CPU's buffer holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct CpuStats {
    pub cpu: u32,
    pub events: u64,
    /// Events lost (carried as missed events before the page after them).
    pub lost: u64,
    /// Records larger than a page (left out, counted in `lost` too).
    pub too_big: u64,
    /// Records earlier than the one before them, written at its time.
    pub clamped: u64,
    pub pages: u64,
    pub first_ts: Option<u64>,
    pub last_ts: u64,
}

/// One CPU's buffer being written.
pub struct CpuPages {
    file: BufWriter<File>,
    page: Option<PageBuilder>,
    /// Losses the next page announces.
    missed: u64,
    pub stats: CpuStats,
}

impl CpuPages {
    /// A buffer for `cpu`, its pages in an unnamed file in `dir`.
    pub fn new(dir: &OutDir, cpu: u32) -> io::Result<CpuPages> {
        Ok(CpuPages {
            file: BufWriter::with_capacity(256 << 10, dir.create_unnamed()?),
            page: None,
            missed: 0,
            stats: CpuStats {
                cpu,
                ..CpuStats::default()
            },
        })
    }

    /// `n` events lost here (before the next record).
    pub fn lost(&mut self, n: u64) {
        self.missed = self.missed.saturating_add(n);
        self.stats.lost = self.stats.lost.saturating_add(n);
    }

    fn flush_page(&mut self) -> io::Result<()> {
        if let Some(p) = self.page.take() {
            self.file.write_all(&p.finish())?;
            self.stats.pages += 1;
        }
        Ok(())
    }

    /// Appends record `rec` at time `ts` (nanoseconds of the file's clock).
    pub fn record(&mut self, ts: u64, rec: &[u8]) -> io::Result<()> {
        let data = PAGE_SIZE as usize - HeaderPage::default().data_offset;
        if record_space(0, rec.len(), false) + 8 > data {
            self.stats.too_big += 1;
            self.lost(1);
            return Ok(());
        }
        let ts = if ts < self.stats.last_ts {
            self.stats.clamped += 1;
            self.stats.last_ts
        } else {
            ts
        };
        let full = self
            .page
            .as_ref()
            .is_some_and(|p| self.missed > 0 || !p.fits(ts, rec.len()));
        if full {
            self.flush_page()?;
        }
        let missed = std::mem::take(&mut self.missed);
        let page = self.page.get_or_insert_with(|| {
            let p = PageBuilder::new(HeaderPage::default(), PAGE_SIZE as usize, ts);
            if missed > 0 {
                p.missed(missed)
            } else {
                p
            }
        });
        page.record(ts, rec, false);
        self.stats.events += 1;
        self.stats.first_ts.get_or_insert(ts);
        self.stats.last_ts = ts;
        Ok(())
    }

    /// The last page written (and an empty one carrying losses after the
    /// last record); the pages' file for the container.
    pub fn finish(mut self) -> io::Result<(CpuData, CpuStats)> {
        self.flush_page()?;
        if self.missed > 0 {
            let ts = self.stats.last_ts;
            let p = PageBuilder::new(HeaderPage::default(), PAGE_SIZE as usize, ts);
            self.file.write_all(&p.missed(self.missed).finish())?;
            self.stats.pages += 1;
        }
        let file = self.file.into_inner().map_err(|e| e.into_error())?;
        let len = self.stats.pages * PAGE_SIZE as u64;
        let data = CpuData {
            cpu: self.stats.cpu,
            file,
            len,
        };
        Ok((data, self.stats))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ivtrace_tracefs::page::walk;
    use std::io::{Read, Seek, SeekFrom};

    #[test]
    fn records_fill_pages_and_losses_mark_the_next_page() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = OutDir::root(tmp.path(), &Default::default()).unwrap();
        let mut c = CpuPages::new(&dir, 1).unwrap();
        for i in 0..500u64 {
            if i == 300 {
                c.lost(7);
            }
            c.record(1_000 + i * 10, &[i as u8; 30]).unwrap();
        }
        c.record(100, &[0; 30]).unwrap(); // earlier: clamped
        c.record(6_000, &vec![0u8; 5000]).unwrap(); // larger than a page
        c.lost(2);
        let (mut data, stats) = c.finish().unwrap();
        assert_eq!((stats.events, stats.clamped, stats.too_big), (501, 1, 1));
        assert_eq!(stats.lost, 7 + 1 + 2);
        let mut bytes = Vec::new();
        data.file.seek(SeekFrom::Start(0)).unwrap();
        data.file.read_to_end(&mut bytes).unwrap();
        assert_eq!(bytes.len() as u64, data.len);
        let (mut seen, mut missed, mut last) = (0u64, Vec::new(), 0u64);
        for page in bytes.chunks(PAGE_SIZE as usize) {
            let before = seen;
            let info = walk(page, &HeaderPage::default(), |ts, rec| {
                assert!(ts >= last);
                last = ts;
                assert_eq!(rec.len(), 32);
                seen += 1;
            });
            assert!(!info.malformed);
            if let Some(n) = info.missed {
                missed.push((before, n));
            }
        }
        assert_eq!(seen, 501);
        assert_eq!(missed, [(300, 7), (501, 3)]);
    }
}
