//! What a counter file holds: a decimal count and a newline, as the kernel's show functions
//! print it. Anything else (a driver that prints garbage, a torn read) is refused with the
//! text, which the source reports once per file.

/// The count in `bytes`, or the text (trimmed, lossy UTF-8) when it is not one.
pub fn parse_counter(bytes: &[u8]) -> Result<u64, String> {
    // The common case without building a string: digits between ASCII blanks (the agent
    // parses hundreds of these a second).
    let digits = bytes.trim_ascii();
    if !digits.is_empty() && digits.len() <= 19 && digits.iter().all(u8::is_ascii_digit) {
        // At most 19 digits: below 10^19, no overflow.
        return Ok(digits
            .iter()
            .fold(0u64, |n, d| n * 10 + u64::from(d - b'0')));
    }
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
        assert_eq!(parse_counter(b"0\n"), Ok(0));
        assert_eq!(
            parse_counter(b"9999999999999999999\n"),
            Ok(9_999_999_999_999_999_999)
        );
        assert_eq!(parse_counter(b"18446744073709551615\n"), Ok(u64::MAX));
        assert_eq!(parse_counter(b"12\n\n"), Ok(12));
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
