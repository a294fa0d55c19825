//! HTTP `Retry-After` values as hints (RFC 9110 §10.2.3).

use std::time::{Duration, SystemTime};

use persevere::Hint;

/// Reads an HTTP `Retry-After` header value as a [`Hint::After`]: either delta-seconds
/// (`"120"`) or an HTTP-date (`"Wed, 21 Oct 2015 07:28:00 GMT"`), which is measured from `now`
/// (a date in the past means "now"). Returns `None` for anything else, so the schedule applies.
///
/// ```
/// use std::time::{Duration, SystemTime, UNIX_EPOCH};
/// use persevere::Hint;
/// use persevere_driver::retry_after;
///
/// let now = UNIX_EPOCH + Duration::from_secs(1_445_412_400); // 07:26:40 GMT
/// assert_eq!(retry_after("120", now), Some(Hint::After(Duration::from_secs(120))));
/// assert_eq!(retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now), Some(Hint::After(Duration::from_secs(80))));
/// assert_eq!(retry_after("soon", now), None);
/// ```
pub fn retry_after(value: &str, now: SystemTime) -> Option<Hint> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // More digits than u64 holds is still "a very long time": saturate, never fail.
        let seconds = value.parse::<u64>().unwrap_or(u64::MAX);
        return Some(Hint::After(Duration::from_secs(seconds)));
    }
    let date = httpdate::parse_http_date(value).ok()?;
    Some(Hint::After(date.duration_since(now).unwrap_or(Duration::ZERO)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    #[test]
    fn b6_retry_after_parses_seconds_and_dates_and_refuses_the_rest() {
        let now = UNIX_EPOCH + Duration::from_secs(1_445_412_480); // 07:28:00 GMT
        assert_eq!(retry_after(" 0 ", now), Some(Hint::After(Duration::ZERO)));
        assert_eq!(retry_after("99999999999999999999999", now), Some(Hint::After(Duration::from_secs(u64::MAX))));
        assert_eq!(retry_after("Wed, 21 Oct 2015 07:27:00 GMT", now), Some(Hint::After(Duration::ZERO)));
        assert_eq!(retry_after("Wed, 21 Oct 2015 07:28:05 GMT", now), Some(Hint::After(Duration::from_secs(5))));
        for bad in ["", "-5", "1.5", "tomorrow", "Wed, 21 Oct 2015"] {
            assert_eq!(retry_after(bad, now), None, "{bad:?}");
        }
    }
}
