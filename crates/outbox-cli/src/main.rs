//! `outbox-relay`: see the library crate `outbox_cli`.

fn main() -> std::process::ExitCode {
    outbox_cli::main()
}
