//! What a counter file holds: a decimal count and a newline, as the kernel's show functions
//! print it. Anything else (a driver that prints garbage, a torn read) is refused with the
//! text, which the source reports once per file.

/// The count in `bytes`, or the text (trimmed, lossy UTF-8) when it is not one.
pub fn parse_counter(bytes: &[u8]) -> Result<u64, String> {
    let text = String::from_utf8_lossy(bytes);
    text.trim()
        .parse::<u64>()
        .map_err(|_| text.trim_end_matches('\n').to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_garbage() {
        assert_eq!(parse_counter(b"1234\n"), Ok(1234));
        assert_eq!(parse_counter(b" 18446744073709551615 \n"), Ok(u64::MAX));
        assert_eq!(
            parse_counter(b"18446744073709551616\n"),
            Err("18446744073709551616".into())
        );
        assert_eq!(parse_counter(b"N/A\n"), Err("N/A".into()));
        assert_eq!(parse_counter(b"-1\n"), Err("-1".into()));
        assert_eq!(parse_counter(b""), Err(String::new()));
        assert_eq!(parse_counter(b"\xff7\n"), Err("\u{fffd}7".into()));
    }
}
