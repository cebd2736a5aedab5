//! The process's allocator and how soon it gives freed memory back.
//!
//! mimalloc rather than glibc's malloc: a burst of pods is a stream of short-lived JSON trees,
//! on which glibc spent about a quarter of the controller's CPU and kept freed memory resident in
//! per-thread arenas. Built without transparent huge pages (`no_thp`): with them, each 2 MiB page
//! touched counts whole in the resident set (+40% peak RSS in `kuryr bench`). The
//! `system-allocator` feature leaves glibc's in place, for heap profilers that hook malloc.

#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// How long mimalloc keeps pages that no longer hold anything before it gives them back to the
/// kernel, in milliseconds. Its v3 series waits a second: pages a burst freed stayed resident
/// while the next objects were allocated elsewhere, and the controller's peak RSS with 10,000
/// pods was 82-89 MiB against 75-79 with 10 ms (`kuryr bench --scale pods10k`, same CPU within
/// the runs' spread). 10 ms was mimalloc v2's default.
const PURGE_DELAY_MS: std::ffi::c_long = 10;

/// `mi_option_purge_delay` in the mimalloc v3 that libmimalloc-sys 0.1.49 builds (its Rust
/// bindings do not name it; the dependency is pinned for that); the test below checks the index
/// against the option's default.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Applies [`PURGE_DELAY_MS`] as mimalloc's default: a delay the environment set at start-up
/// (`MIMALLOC_PURGE_DELAY`, or its older name `MIMALLOC_RESET_DELAY`) is kept.
pub fn tune() {
    if cfg!(feature = "system-allocator") {
        return;
    }
    // SAFETY: writes one of mimalloc's option slots (a plain store, only if the environment did
    // not set it); mimalloc reads it at each purge, so it takes effect from the next one on.
    unsafe { libmimalloc_sys::mi_option_set_default(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PURGE_DELAY_ENV: &str = "MIMALLOC_PURGE_DELAY";

    /// The option index is mimalloc's purge delay: its default (1,000 ms in v3) is not the
    /// default of any neighbouring option. Fails when a mimalloc upgrade moves or re-defaults
    /// the option: then check the index against its `mimalloc.h`. One test, since [`tune`]
    /// changes the process's allocator.
    #[test]
    fn tune_sets_mimallocs_purge_delay() {
        if std::env::var_os(PURGE_DELAY_ENV).is_some() {
            eprintln!("skipped: {PURGE_DELAY_ENV} is set in this environment");
            return;
        }
        // SAFETY: reads one of mimalloc's option slots.
        let read = || unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        assert_eq!(read(), 1000, "mimalloc's own default");
        tune();
        let tuned = if cfg!(feature = "system-allocator") {
            1000
        } else {
            PURGE_DELAY_MS
        };
        assert_eq!(read(), tuned);
    }
}
