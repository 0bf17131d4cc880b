//! `outbox-relay`: see the library crate `outbox_relay`.

/// jemalloc: less of the relay's CPU in the allocator than glibc's (BENCHMARKS.md,
/// "jemalloc"), the same peak memory with large envelopes.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    outbox_relay::main()
}
