//! `outbox-relay`: see the library crate `outbox_cli`.

/// mimalloc, not glibc's malloc: see the workspace's Cargo.toml.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    outbox_cli::main()
}
