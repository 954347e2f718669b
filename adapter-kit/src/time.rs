//! Report timestamps → milliseconds since the Unix epoch (UTC), without a clock or a
//! time zone database: civil date arithmetic and the few zone abbreviations PSP reports
//! print.

/// `YYYY-MM-DD HH:MM:SS` (or with `T`, optionally ending in `Z`) at `offset_minutes`
/// east of UTC → Unix millis. None when the text is not such a timestamp.
pub fn unix_millis(text: &str, offset_minutes: i64) -> Option<i64> {
    let text = text.trim().trim_end_matches('Z');
    let (date, time) = text.split_once([' ', 'T'])?;
    let mut d = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (year, month, day) = (d.next()??, d.next()??, d.next()??);
    let mut t = time.splitn(3, ':').map(|p| p.parse::<i64>().ok());
    let (hour, minute, second) = (t.next()??, t.next()??, t.next().unwrap_or(Some(0))?);
    let valid = (1..=12).contains(&month)
        && (1..=31).contains(&day)
        && (0..24).contains(&hour)
        && (0..60).contains(&minute)
        && (0..61).contains(&second);
    if !valid {
        return None;
    }
    let days = days_from_civil(year, month, day);
    let seconds = days * 86_400 + hour * 3_600 + minute * 60 + second - offset_minutes * 60;
    seconds.checked_mul(1000)
}

/// Minutes east of UTC of a zone abbreviation as PSP reports print them (`CET`, `BST`,
/// `UTC`, ...), or of a numeric offset (`+02:00`, `-0500`). None when unknown.
pub fn zone_offset_minutes(zone: &str) -> Option<i64> {
    let zone = zone.trim();
    let known = [
        ("UTC", 0),
        ("GMT", 0),
        ("Z", 0),
        ("WET", 0),
        ("WEST", 60),
        ("BST", 60),
        ("CET", 60),
        ("CEST", 120),
        ("EET", 120),
        ("EEST", 180),
        ("MSK", 180),
        ("IST", 330),
        ("SGT", 480),
        ("HKT", 480),
        ("JST", 540),
        ("AEST", 600),
        ("AEDT", 660),
        ("EST", -300),
        ("EDT", -240),
        ("CST", -360),
        ("CDT", -300),
        ("MST", -420),
        ("MDT", -360),
        ("PST", -480),
        ("PDT", -420),
    ];
    if let Some((_, minutes)) = known.iter().find(|(name, _)| *name == zone) {
        return Some(*minutes);
    }
    let (sign, rest) = match zone.as_bytes().first()? {
        b'+' => (1, &zone[1..]),
        b'-' => (-1, &zone[1..]),
        _ => return None,
    };
    let digits: String = rest.chars().filter(|c| *c != ':').collect();
    if digits.len() != 4 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let hours: i64 = digits[..2].parse().ok()?;
    let minutes: i64 = digits[2..].parse().ok()?;
    Some(sign * (hours * 60 + minutes))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_in_a_zone_become_utc_millis() {
        assert_eq!(unix_millis("1970-01-01 00:00:00", 0), Some(0));
        // 2013-06-03 11:26:49 CET = 10:26:49 UTC.
        assert_eq!(
            unix_millis("2013-06-03 11:26:49", zone_offset_minutes("CET").unwrap()),
            Some(1_370_255_209_000)
        );
        assert_eq!(
            unix_millis("2024-02-29T12:00:00Z", 0),
            Some(1_709_208_000_000)
        );
        assert_eq!(zone_offset_minutes("+05:30"), Some(330));
        assert_eq!(zone_offset_minutes("-0500"), Some(-300));
        assert_eq!(zone_offset_minutes("Mars/Olympus"), None);
        assert_eq!(unix_millis("2013-13-01 00:00:00", 0), None);
        assert_eq!(unix_millis("yesterday", 0), None);
    }
}
