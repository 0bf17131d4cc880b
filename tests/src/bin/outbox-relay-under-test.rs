//! The `outbox-relay` binary, built inside the test package so its tests can run it.

fn main() -> std::process::ExitCode {
    outbox_relay::main()
}
