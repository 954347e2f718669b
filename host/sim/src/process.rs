//! Process-wide settings of the `sluice-sim` binary that make it faster
//! without changing what a seed does: nothing here is seen by the gateway's
//! code, and a seed's trace is the same with or without them.
//!
//! - **SQLite's allocator.** The bundled SQLite allocates through its own
//!   `sqlite3_mem_methods`, by default glibc's `malloc` behind a global mutex
//!   that keeps memory statistics nobody reads: with the Rust side on mimalloc,
//!   SQLite's `malloc`, `free` and that mutex were most of the rest of the
//!   allocator's share of the profile. [`sqlite_on_mimalloc`] hands SQLite
//!   mimalloc and turns the statistics off. Only the allocator changes; SQLite
//!   runs the same statements with the same results.
//! - **Scheduling.** Every statement is a hand-off to the connection's worker
//!   thread and back, on the same core. [`batch_scheduling`] makes the calling
//!   thread `SCHED_BATCH` (threads it starts inherit it): a thread woken by the
//!   other one then waits for it to block instead of preempting it, so a
//!   statement's rows and its result are handed over in one switch rather than
//!   one switch each. The order of a seed's futures is decided by the seed
//!   (one runtime thread per seed), never by the kernel's scheduler.

use std::os::raw::{c_int, c_void};

use libsqlite3_sys as ffi;

unsafe extern "C" fn sqlite_malloc(size: c_int) -> *mut c_void {
    // SAFETY: mimalloc's malloc accepts any size; SQLite never asks for a
    // negative one (it is an `int` in SQLite's interface only).
    unsafe { libmimalloc_sys::mi_malloc(usize::try_from(size).unwrap_or(0)) }
}

unsafe extern "C" fn sqlite_free(block: *mut c_void) {
    // SAFETY: SQLite frees only blocks these methods allocated.
    unsafe { libmimalloc_sys::mi_free(block) }
}

unsafe extern "C" fn sqlite_realloc(block: *mut c_void, size: c_int) -> *mut c_void {
    // SAFETY: as above: a block of these methods, a non-negative size.
    unsafe { libmimalloc_sys::mi_realloc(block, usize::try_from(size).unwrap_or(0)) }
}

unsafe extern "C" fn sqlite_size(block: *mut c_void) -> c_int {
    // SAFETY: SQLite asks the size of its own live blocks only.
    let size = unsafe { libmimalloc_sys::mi_usable_size(block) };
    c_int::try_from(size).unwrap_or(c_int::MAX)
}

unsafe extern "C" fn sqlite_roundup(size: c_int) -> c_int {
    // SAFETY: a pure function of its argument.
    let rounded = unsafe { libmimalloc_sys::mi_good_size(usize::try_from(size).unwrap_or(0)) };
    c_int::try_from(rounded).unwrap_or(size)
}

unsafe extern "C" fn sqlite_init(_: *mut c_void) -> c_int {
    ffi::SQLITE_OK
}

unsafe extern "C" fn sqlite_shutdown(_: *mut c_void) {}

/// SQLite allocates through mimalloc, without its memory statistics. Must
/// run before the process opens its first SQLite connection (SQLite accepts
/// the configuration only before it initialises); later, or refused, it
/// changes nothing and says so.
pub fn sqlite_on_mimalloc() {
    let methods = ffi::sqlite3_mem_methods {
        xMalloc: Some(sqlite_malloc),
        xFree: Some(sqlite_free),
        xRealloc: Some(sqlite_realloc),
        xSize: Some(sqlite_size),
        xRoundup: Some(sqlite_roundup),
        xInit: Some(sqlite_init),
        xShutdown: Some(sqlite_shutdown),
        pAppData: std::ptr::null_mut(),
    };
    // SAFETY: `sqlite3_config` is called before any connection exists (the
    // binary's first act) and copies the methods it is given.
    let malloc = unsafe { ffi::sqlite3_config(ffi::SQLITE_CONFIG_MALLOC, &methods) };
    // SAFETY: as above; the flag is an `int`.
    let stats = unsafe { ffi::sqlite3_config(ffi::SQLITE_CONFIG_MEMSTATUS, 0 as c_int) };
    if malloc != ffi::SQLITE_OK || stats != ffi::SQLITE_OK {
        eprintln!("sluice-sim: SQLite keeps its own allocator (sqlite3_config: {malloc}, {stats})");
    }
}

/// The calling thread, and every thread it starts from now on, is scheduled
/// `SCHED_BATCH` (no wake-up preemption). Where that is refused, nothing
/// changes but speed.
pub fn batch_scheduling() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread; `param` outlives the call.
    let done = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
    if done != 0 {
        tracing::debug!("SCHED_BATCH refused: {}", std::io::Error::last_os_error());
    }
}
