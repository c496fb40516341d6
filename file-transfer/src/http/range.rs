//! Single-range `Range: bytes=...` requests (RFC 9110 section 14).

/// What to send for a `Range` header value and a file size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RangeAnswer {
    /// Send the whole file (no header, a header we do not support, or several ranges).
    Full,
    /// Send bytes `start..=end` with 206.
    Partial {
        /// First byte.
        start: u64,
        /// Last byte, inclusive.
        end: u64,
    },
    /// Send 416 with `Content-Range: bytes */size`.
    Unsatisfiable,
}

/// Interprets a `Range` header. Syntactically invalid values and multi-range requests are
/// ignored (the whole file is sent), as the HTTP semantics allow; a well-formed single range
/// that names no byte of the file is unsatisfiable.
pub(crate) fn parse(header: Option<&str>, size: u64) -> RangeAnswer {
    let Some(value) = header else { return RangeAnswer::Full };
    let Some(spec) = value.trim().strip_prefix("bytes=") else { return RangeAnswer::Full };
    if spec.contains(',') {
        return RangeAnswer::Full;
    }
    let Some((first, last)) = spec.trim().split_once('-') else { return RangeAnswer::Full };
    let (first, last) = (first.trim(), last.trim());
    let number = |text: &str| -> Option<u64> {
        if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        // Digits only: a parse failure can only be an overflow, i.e. "very large".
        Some(text.parse::<u64>().unwrap_or(u64::MAX))
    };
    if first.is_empty() {
        // Suffix range: the last N bytes.
        let Some(suffix) = number(last) else { return RangeAnswer::Full };
        if suffix == 0 || size == 0 {
            return RangeAnswer::Unsatisfiable;
        }
        return RangeAnswer::Partial { start: size.saturating_sub(suffix), end: size - 1 };
    }
    let Some(start) = number(first) else { return RangeAnswer::Full };
    let end = if last.is_empty() {
        u64::MAX
    } else {
        match number(last) {
            Some(end) if end >= start => end,
            _ => return RangeAnswer::Full,
        }
    };
    if start >= size {
        return RangeAnswer::Unsatisfiable;
    }
    RangeAnswer::Partial { start, end: end.min(size - 1) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use RangeAnswer::*;

    #[test]
    fn single_ranges() {
        assert_eq!(parse(Some("bytes=0-4"), 10), Partial { start: 0, end: 4 });
        assert_eq!(parse(Some("bytes=5-"), 10), Partial { start: 5, end: 9 });
        assert_eq!(parse(Some("bytes=-3"), 10), Partial { start: 7, end: 9 });
        assert_eq!(parse(Some("bytes=-30"), 10), Partial { start: 0, end: 9 });
        assert_eq!(parse(Some("bytes=8-100"), 10), Partial { start: 8, end: 9 });
        assert_eq!(parse(Some("bytes=9-9"), 10), Partial { start: 9, end: 9 });
        assert_eq!(
            parse(Some("bytes=0-99999999999999999999999"), 10),
            Partial { start: 0, end: 9 }
        );
    }

    #[test]
    fn range_outside_the_file_is_unsatisfiable() {
        assert_eq!(parse(Some("bytes=10-"), 10), Unsatisfiable);
        assert_eq!(parse(Some("bytes=10-20"), 10), Unsatisfiable);
        assert_eq!(parse(Some("bytes=-0"), 10), Unsatisfiable);
        assert_eq!(parse(Some("bytes=0-"), 0), Unsatisfiable);
        assert_eq!(parse(Some("bytes=-5"), 0), Unsatisfiable);
    }

    #[test]
    fn invalid_or_multiple_ranges_fall_back_to_the_whole_file() {
        for value in [
            "",
            "bytes=",
            "bytes=-",
            "bytes=a-b",
            "bytes=5-2",
            "items=0-1",
            "bytes=0-1,3-4",
            "bytes=+1-2",
        ] {
            assert_eq!(parse(Some(value), 10), Full, "{value}");
        }
        assert_eq!(parse(None, 10), Full);
    }

    proptest::proptest! {
        #[test]
        fn any_header_gives_a_range_inside_the_file(value in "\\PC{0,40}", size in 0u64..1_000) {
            if let Partial { start, end } = parse(Some(&value), size) {
                proptest::prop_assert!(start <= end && end < size);
            }
        }

        #[test]
        fn well_formed_ranges_are_honoured(start in 0u64..2_000, len in 0u64..2_000, size in 1u64..1_000) {
            let header = format!("bytes={start}-{}", start + len);
            let answer = parse(Some(&header), size);
            if start >= size {
                proptest::prop_assert_eq!(answer, Unsatisfiable);
            } else {
                proptest::prop_assert_eq!(answer, Partial { start, end: (start + len).min(size - 1) });
            }
        }
    }
}
