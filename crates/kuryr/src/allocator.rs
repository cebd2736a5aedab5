//! The process's allocator and how soon it gives freed memory back.
//!
//! jemalloc rather than glibc's malloc: a burst of pods is a stream of short-lived JSON trees,
//! on which glibc spent about a quarter of the controller's CPU and kept freed memory resident in
//! per-thread arenas. One arena, and freed pages given back to the kernel 100 ms after they
//! emptied (jemalloc's default waits 10 s): at the peak of a 10,000-pod burst the controller's
//! resident heap was twice its live bytes with mimalloc (peak RSS 60-67 MiB) and 52-57 MiB with
//! this, at the same CPU. Giving them back at once (0 ms) held 49-52 MiB but cost a 300-pod
//! burst about a tenth of its pods/s; 1 s held 58-60 MiB (docs/benchmarks.md). Transparent huge pages stay off (jemalloc's default): each 2 MiB page
//! touched would count whole in the resident set. The `system-allocator` feature leaves glibc's
//! in place, for heap profilers that hook malloc (or jemalloc's own, by LD_PRELOAD).

#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's start-up options, read once at its first allocation (`MALLOC_CONF` in the
/// environment, under jemalloc's prefixed name `_RJEM_MALLOC_CONF`, still overrides them). A C
/// `const char *`, as tikv-jemalloc-sys declares it.
#[cfg(not(feature = "system-allocator"))]
#[allow(non_upper_case_globals)]
#[unsafe(export_name = "_rjem_malloc_conf")]
pub static malloc_conf: Option<&'static std::ffi::c_char> =
    // SAFETY: the pointer is to the first byte of a static, NUL-terminated string.
    Some(unsafe { &*c"narenas:1,dirty_decay_ms:100,muzzy_decay_ms:0".as_ptr() });

#[cfg(all(test, not(feature = "system-allocator")))]
mod tests {
    use std::ffi::{CStr, c_void};

    /// Reads one of jemalloc's `opt.*` values through `mallctl`.
    fn opt<T: Default + Copy>(name: &CStr) -> T {
        let mut value = T::default();
        let mut len = std::mem::size_of::<T>();
        // SAFETY: `value` is a T of `len` bytes, what `mallctl` writes for the option read; no
        // new value is passed.
        let rc = unsafe {
            tikv_jemalloc_sys::mallctl(
                name.as_ptr(),
                (&raw mut value).cast::<c_void>(),
                &raw mut len,
                std::ptr::null_mut(),
                0,
            )
        };
        assert_eq!(rc, 0, "mallctl {name:?}");
        value
    }

    /// The options above are the ones in effect (the symbol jemalloc reads them from is the one
    /// exported): one arena, freed pages returned after 100 ms.
    #[test]
    fn jemalloc_runs_with_one_arena_and_a_short_decay() {
        if std::env::var_os("_RJEM_MALLOC_CONF").is_some() {
            eprintln!("skipped: _RJEM_MALLOC_CONF is set in this environment");
            return;
        }
        // Something allocated through the global allocator, so that jemalloc is initialised.
        let v = vec![1u8; 4096];
        assert_eq!(v.len(), 4096);
        assert_eq!(opt::<u32>(c"opt.narenas"), 1);
        assert_eq!(opt::<isize>(c"opt.dirty_decay_ms"), 100);
        assert_eq!(opt::<isize>(c"opt.muzzy_decay_ms"), 0);
    }
}
