//! `last_error` trimming.

/// The size of the `last_error` column, in bytes.
pub const MAX_ERROR_BYTES: usize = 512;

/// Trims surrounding white space and cuts `error` to at most [`MAX_ERROR_BYTES`] bytes,
/// on a UTF-8 character boundary (the original worker could split a character,
/// which PostgreSQL then rejected along with the whole status update).
pub fn trim_error(error: &str) -> String {
    let trimmed = error.trim();
    if trimmed.len() <= MAX_ERROR_BYTES {
        return trimmed.to_owned();
    }
    let mut end = MAX_ERROR_BYTES;
    while !trimmed.is_char_boundary(end) {
        end -= 1;
    }
    trimmed[..end].trim_end().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_errors_are_only_trimmed() {
        assert_eq!(trim_error("  broker said no \n"), "broker said no");
    }

    #[test]
    fn long_multibyte_error_is_cut_on_a_char_boundary() {
        // 200 three-byte characters: 600 bytes.
        let error = "€".repeat(200);
        let cut = trim_error(&error);
        assert!(cut.len() <= MAX_ERROR_BYTES);
        assert_eq!(cut.len(), 510, "170 whole characters fit");
        assert!(cut.chars().all(|c| c == '€'));
    }

    #[test]
    fn exactly_the_limit_is_kept_whole() {
        let error = "x".repeat(MAX_ERROR_BYTES);
        assert_eq!(trim_error(&error).len(), MAX_ERROR_BYTES);
    }
}
