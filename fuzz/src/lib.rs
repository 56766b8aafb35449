//! Helpers shared by the fuzz targets.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The system allocator, counting live bytes and their peak, so a target can assert that memory
/// stays bounded whatever the input says (a target installs it with `#[global_allocator]`).
pub struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static LARGEST: AtomicUsize = AtomicUsize::new(0);

fn grew(n: usize) {
    let live = LIVE.fetch_add(n, Ordering::Relaxed) + n;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

// SAFETY: every call is forwarded to `System` unchanged; only counters are updated around it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
            LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
            LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            grew(new_size);
            LARGEST.fetch_max(new_size, Ordering::Relaxed);
        }
        p
    }
}

/// Memory measured over one call: the peak of live bytes above what was live at the start, and
/// the largest single allocation.
#[derive(Debug, Clone, Copy)]
pub struct Measured {
    pub peak: usize,
    pub largest: usize,
}

/// Runs `f`, measuring its allocations (meaningful only with [`Counting`] installed, and on one
/// thread).
pub fn measure<T>(f: impl FnOnce() -> T) -> (T, Measured) {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    LARGEST.store(0, Ordering::Relaxed);
    let out = f();
    let peak = PEAK.load(Ordering::Relaxed).saturating_sub(base);
    let largest = LARGEST.load(Ordering::Relaxed);
    (out, Measured { peak, largest })
}

/// Splits `data` at the first `sep`: (before, after); all of it and nothing when absent.
pub fn split_once(data: &[u8], sep: u8) -> (&[u8], &[u8]) {
    match data.iter().position(|b| *b == sep) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[]),
    }
}

/// A reader handing out `data` in the chunk sizes given (round and round; 0 counts as 1), so
/// parsers see every split of their input.
pub struct Chunked<'a> {
    pub data: &'a [u8],
    pub sizes: Vec<usize>,
    pub i: usize,
}

impl<'a> Chunked<'a> {
    pub fn new(data: &'a [u8], sizes: &[u8]) -> Self {
        let sizes = if sizes.is_empty() {
            vec![usize::MAX]
        } else {
            sizes.iter().map(|s| usize::from(*s).max(1)).collect()
        };
        Self { data, sizes, i: 0 }
    }
}

impl std::io::Read for Chunked<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let want = self.sizes[self.i % self.sizes.len()];
        self.i += 1;
        let n = want.min(buf.len()).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}
