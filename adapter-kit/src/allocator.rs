//! The global allocator of the `wasm32` guests: per-size free lists in front of talc,
//! instead of wasi-libc's dlmalloc.
//!
//! A guest allocates and frees a lot per call: serde_json builds a `Value` tree of a
//! webhook body (a `String` per key and value, `BTreeMap` nodes) and drops it again, and
//! the component model's argument copy (`cabi_realloc`) goes through the same allocator.
//! wasi-libc's dlmalloc, which Rust's `System` allocator calls on `wasm32-wasip2`, was
//! about 9 % of a 2 KB webhook call in the `perf` profile, and talc alone still 12 %
//! (BENCHMARKS.md, adapter runtime, 2026-12-05 session 5). Almost all of those blocks
//! are small and of a few sizes, so [`SizeClassCache`] keeps freed blocks of up to
//! 256 bytes on one free list per 16-byte size class and hands them out again: an
//! allocation is then a pop, a free a push. Larger blocks, over-aligned ones, and small
//! ones beyond [`MAX_CACHED_BYTES`] of cached memory go to talc.
//!
//! Every adapter that links this crate (`use sluice_adapter_kit as _;`) gets it, as it
//! gets [`crate::memcmp`]. Native builds keep the platform's allocator (the golden tests
//! and the native benchmark are unchanged); the native tests below drive the cache over
//! `std::alloc::System`.
//!
//! Why the `unsafe` is sound:
//!
//! - *No concurrent or re-entrant use.* The cache's state sits in an `UnsafeCell` that
//!   is declared `Sync` only on `wasm32` without the `atomics` feature, the same condition
//!   under which talc's own `TalcSyncCell` is sound (talc checks it at compile time): one
//!   thread, no signals, and the host runs one call at a time on a store. No method holds
//!   a reference to the state while it calls talc, and talc never calls the global
//!   allocator, so no two borrows of the state ever overlap.
//! - *Every block is big and aligned enough.* A block on the list of class `c` was
//!   allocated from talc with `class_layout(c)`: `16 × (c + 1)` bytes, 16-aligned. A
//!   request lands in class `c` only with a size of at most `16 × (c + 1)` and an
//!   alignment of at most 16, so any block of the class satisfies it; a free block holds
//!   the next pointer in its first word (16 bytes ≥ a pointer, suitably aligned).
//! - *Blocks return where they came from.* `GlobalAlloc` callers free and reallocate with
//!   the layout they allocated with (its contract), which maps to the same class, so a
//!   block goes back to its own list, or to talc with the layout talc gave it out with.
//! - *Memory stays the host's to cap.* The cache never grows memory itself; talc grows it
//!   with `memory.grow`, and every growth passes the host's memory limiter.

use core::alloc::{GlobalAlloc, Layout};
use core::cell::UnsafeCell;
use core::ptr;

/// The size-class width and the alignment of every cached block.
const CLASS_BYTES: usize = 16;
/// Classes of 16, 32, …, 256 bytes.
const CLASSES: usize = 16;
/// At most this much freed memory waits on the lists; more goes back to talc, so a
/// guest that frees many small blocks and then needs large ones can still have them.
pub const MAX_CACHED_BYTES: usize = 256 << 10;

/// Free lists of small blocks in front of a backing allocator (see the module's
/// documentation).
pub struct SizeClassCache<A> {
    backing: A,
    state: UnsafeCell<Lists>,
}

struct Lists {
    /// The first free block of each class (null: none); each free block's first word
    /// points at the next.
    heads: [*mut u8; CLASSES],
    cached_bytes: usize,
}

// SAFETY: only where the guest is single-threaded without signal handlers (see the
// module's documentation, "No concurrent or re-entrant use").
#[cfg(all(target_arch = "wasm32", not(target_feature = "atomics")))]
unsafe impl<A: Sync> Sync for SizeClassCache<A> {}

impl<A: GlobalAlloc> SizeClassCache<A> {
    pub const fn new(backing: A) -> Self {
        SizeClassCache {
            backing,
            state: UnsafeCell::new(Lists {
                heads: [ptr::null_mut(); CLASSES],
                cached_bytes: 0,
            }),
        }
    }

    /// Memory waiting on the free lists now.
    pub fn cached_bytes(&self) -> usize {
        // SAFETY: a read of a plain field; no `&mut` to the state outlives a method call
        // (module documentation).
        unsafe { (*self.state.get()).cached_bytes }
    }
}

/// The class that serves `layout`, if a cached block can.
fn class_of(layout: Layout) -> Option<usize> {
    if layout.align() > CLASS_BYTES || layout.size() > CLASSES * CLASS_BYTES {
        return None;
    }
    // `GlobalAlloc` is never asked for zero bytes; `saturating_sub` keeps it total.
    Some(layout.size().saturating_sub(1) / CLASS_BYTES)
}

fn class_size(class: usize) -> usize {
    (class + 1) * CLASS_BYTES
}

/// The layout every block of `class` is allocated from the backing allocator with.
fn class_layout(class: usize) -> Layout {
    // SAFETY: the alignment is a power of two and the size (at most 256) is far from
    // overflowing `isize` when rounded up to it.
    unsafe { Layout::from_size_align_unchecked(class_size(class), CLASS_BYTES) }
}

impl<A: GlobalAlloc> SizeClassCache<A> {
    /// Takes the first block off `class`'s list, if there is one.
    unsafe fn pop(&self, class: usize) -> *mut u8 {
        // SAFETY: no other reference to the state is live (module documentation).
        let lists = unsafe { &mut *self.state.get() };
        let head = lists.heads[class];
        if !head.is_null() {
            // SAFETY: a free block of the list holds the next one's address in its first
            // word, written by `push`; the block is 16-aligned and at least 16 bytes.
            lists.heads[class] = unsafe { head.cast::<*mut u8>().read() };
            lists.cached_bytes -= class_size(class);
        }
        head
    }

    /// Puts a freed block of `class` on its list, unless the cache is full.
    unsafe fn push(&self, class: usize, block: *mut u8) -> bool {
        // SAFETY: no other reference to the state is live (module documentation).
        let lists = unsafe { &mut *self.state.get() };
        let size = class_size(class);
        if lists.cached_bytes + size > MAX_CACHED_BYTES {
            return false;
        }
        // SAFETY: the block was allocated with `class_layout(class)` (16-aligned, at
        // least 16 bytes) and its owner just gave it up, so its first word is ours.
        unsafe { block.cast::<*mut u8>().write(lists.heads[class]) };
        lists.heads[class] = block;
        lists.cached_bytes += size;
        true
    }
}

// SAFETY: every block handed out is at least as large and as aligned as asked (module
// documentation, "Every block is big and aligned enough") and goes back to where it
// came from ("Blocks return where they came from").
unsafe impl<A: GlobalAlloc> GlobalAlloc for SizeClassCache<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let Some(class) = class_of(layout) else {
            // SAFETY: the caller's layout, passed on as it came.
            return unsafe { self.backing.alloc(layout) };
        };
        // SAFETY: see `pop`; then the backing allocator with a non-zero-sized layout.
        unsafe {
            let block = self.pop(class);
            if block.is_null() {
                self.backing.alloc(class_layout(class))
            } else {
                block
            }
        }
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        match class_of(layout) {
            // SAFETY: the block came from `alloc` with this layout, so from this class.
            Some(class) => unsafe {
                if !self.push(class, block) {
                    self.backing.dealloc(block, class_layout(class));
                }
            },
            // SAFETY: the block came from the backing allocator with this layout.
            None => unsafe { self.backing.dealloc(block, layout) },
        }
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `realloc`'s contract: `new_size`, rounded up to the (valid) alignment,
        // does not overflow `isize`.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        match (class_of(layout), class_of(new_layout)) {
            // SAFETY: a block of the backing allocator, resized by it.
            (None, None) => unsafe { self.backing.realloc(block, layout, new_size) },
            // The block is already big enough for any size of its class.
            (Some(old), Some(new)) if old == new => block,
            // SAFETY: a new block for the new layout, the contents copied (the smaller of
            // the two sizes, both blocks hold that much), the old one freed with its layout.
            _ => unsafe {
                let moved = self.alloc(new_layout);
                if !moved.is_null() {
                    ptr::copy_nonoverlapping(block, moved, layout.size().min(new_size));
                    self.dealloc(block, layout);
                }
                moved
            },
        }
    }
}

#[cfg(all(target_arch = "wasm32", not(target_feature = "atomics")))]
#[global_allocator]
static ALLOCATOR: SizeClassCache<talc::wasm::WasmDynamicTalc> =
    SizeClassCache::new(talc::wasm::new_wasm_dynamic_allocator());

#[cfg(test)]
mod tests {
    use super::*;
    use std::alloc::System;

    fn layout(size: usize, align: usize) -> Layout {
        Layout::from_size_align(size, align).unwrap()
    }

    #[test]
    fn a_freed_small_block_is_handed_out_again_for_its_class() {
        let cache = SizeClassCache::new(System);
        unsafe {
            let a = cache.alloc(layout(20, 8));
            cache.dealloc(a, layout(20, 8));
            assert_eq!(cache.cached_bytes(), 32);
            // 17..=32 bytes share the class of 20.
            let b = cache.alloc(layout(32, 1));
            assert_eq!(a, b);
            assert_eq!(cache.cached_bytes(), 0);
            let c = cache.alloc(layout(17, 16));
            assert_ne!(b, c);
            cache.dealloc(b, layout(32, 1));
            cache.dealloc(c, layout(17, 16));
        }
    }

    /// Live blocks of every small size and alignment are aligned, as large as asked and
    /// never overlap, also when they come off the lists.
    #[test]
    fn live_blocks_are_aligned_sized_and_disjoint() {
        let cache = SizeClassCache::new(System);
        for round in 0..2u8 {
            let mut live = Vec::new();
            for size in 1..=300 {
                for align in [1, 2, 4, 8, 16, 32] {
                    let l = layout(size, align);
                    let block = unsafe { cache.alloc(l) };
                    assert!(!block.is_null());
                    assert_eq!(block as usize % align, 0, "size {size} align {align}");
                    let fill = (live.len() % 251) as u8 ^ round;
                    unsafe { block.write_bytes(fill, size) };
                    live.push((block, l, fill));
                }
            }
            for &(block, l, fill) in &live {
                let bytes = unsafe { std::slice::from_raw_parts(block, l.size()) };
                assert!(bytes.iter().all(|&b| b == fill), "a block was overwritten");
            }
            for (block, l, _) in live {
                unsafe { cache.dealloc(block, l) };
            }
        }
    }

    #[test]
    fn realloc_keeps_the_contents_across_classes_and_to_and_from_large_blocks() {
        let cache = SizeClassCache::new(System);
        let mut size = 3;
        let mut block = unsafe { cache.alloc(layout(size, 4)) };
        unsafe { block.write_bytes(0xA5, size) };
        for new_size in [5, 16, 17, 200, 256, 257, 4096, 300, 100, 12, 2] {
            block = unsafe { cache.realloc(block, layout(size, 4), new_size) };
            assert!(!block.is_null());
            assert_eq!(block as usize % 4, 0);
            let kept = size.min(new_size);
            let bytes = unsafe { std::slice::from_raw_parts(block, kept) };
            assert!(bytes.iter().all(|&b| b == 0xA5), "{size} -> {new_size}");
            unsafe { block.write_bytes(0xA5, new_size) };
            size = new_size;
        }
        unsafe { cache.dealloc(block, layout(size, 4)) };
    }

    /// Freed memory beyond the bound goes back to the backing allocator.
    #[test]
    fn the_cache_holds_at_most_its_bound() {
        let cache = SizeClassCache::new(System);
        let l = layout(256, 16);
        let blocks: Vec<_> = (0..2 * MAX_CACHED_BYTES / 256)
            .map(|_| unsafe { cache.alloc(l) })
            .collect();
        for block in blocks {
            unsafe { cache.dealloc(block, l) };
        }
        assert_eq!(cache.cached_bytes(), MAX_CACHED_BYTES);
    }

    #[test]
    fn large_and_over_aligned_requests_bypass_the_lists() {
        let cache = SizeClassCache::new(System);
        for l in [layout(257, 8), layout(64, 32), layout(8192, 16)] {
            let block = unsafe { cache.alloc(l) };
            assert_eq!(block as usize % l.align(), 0);
            unsafe { cache.dealloc(block, l) };
            assert_eq!(cache.cached_bytes(), 0);
        }
    }
}
