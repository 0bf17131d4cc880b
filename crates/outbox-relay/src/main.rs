//! `outbox-relay`: see the library crate `outbox_relay`.

/// jemalloc: less of the relay's CPU in the allocator than glibc's, the same peak memory
/// with large envelopes (docs/decisions/0020-jemalloc-allocator.md).
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    outbox_relay::main()
}
