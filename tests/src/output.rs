//! What a finished run of the binary printed.

use std::process::Output;

/// Its standard output, as text.
pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Its standard error, as text.
pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Asserts that `output` is a success (naming `what` and showing both streams if not);
/// its standard output.
pub fn succeeded(what: &str, output: &Output) -> String {
    assert!(
        output.status.success(),
        "{what}: {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        stdout(output),
        stderr(output)
    );
    stdout(output)
}
