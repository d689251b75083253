//! The memory allocator of rlft's programs (the `rlft` binary and the examples).
//!
//! A training step allocates and frees the same few hundred tensor buffers again and again.
//! glibc's allocator returns freed memory at the top of its heap to the OS and takes it back on
//! the next step, page fault by page fault: on the quickstart this costs about a fifth of the
//! run. [`Allocator`] is mimalloc with purging of freed memory turned off, so a process keeps
//! the memory of its largest step (as PyTorch's caching allocator does). A trainer of your own
//! gets the same by declaring it:
//!
//! ```no_run
//! #[global_allocator]
//! static GLOBAL: rlft::alloc::Allocator = rlft::alloc::Allocator;
//! ```

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicBool, Ordering};

/// mimalloc, never purging freed memory (see the module docs).
pub struct Allocator;

/// mimalloc's `mi_option_purge_delay` (milliseconds before freed memory is returned, 1000 by
/// default; −1: never), by its position in `mi_option_e` of the bundled mimalloc 3 header: the
/// Rust bindings do not name it.
const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
/// `mi_option_os_tag`, three places further, whose default (100) no neighbour shares: the
/// numbering is checked with it before anything is changed, so that another numbering of the
/// enum leaves every option as it is instead of changing the wrong one.
const OS_TAG: libmimalloc_sys::mi_option_t = 18;
const OS_TAG_DEFAULT: std::ffi::c_long = 100;

static TUNED: AtomicBool = AtomicBool::new(false);

/// Sets the option once. Every allocation passes here, so the common case is one read; only
/// the first calls write the flag.
fn tune() {
    if !TUNED.load(Ordering::Relaxed) && !TUNED.swap(true, Ordering::Relaxed) {
        // SAFETY: option calls take plain integers and do not allocate.
        unsafe {
            if libmimalloc_sys::mi_option_get(OS_TAG) == OS_TAG_DEFAULT {
                libmimalloc_sys::mi_option_set(PURGE_DELAY, -1);
            }
        }
    }
}

/// Whether purging is off, i.e. the option was found and set.
pub fn purging_off() -> bool {
    tune();
    // SAFETY: as in `tune`.
    unsafe { libmimalloc_sys::mi_option_get(PURGE_DELAY) == -1 }
}

// SAFETY: every call is forwarded unchanged to mimalloc's allocator.
unsafe impl GlobalAlloc for Allocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        tune();
        unsafe { mimalloc::MiMalloc.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        tune();
        unsafe { mimalloc::MiMalloc.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn purging_is_turned_off() {
        // The option's number matches the bundled header: its default was found and replaced.
        assert!(super::purging_off());
    }
}
